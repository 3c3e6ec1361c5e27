/*
 * A weight the framework cannot give up (cap_client_set_evictable false,
 * as the PyTorch adapter does for a storage NumPy shares) reaches the
 * daemon's profile and store marked no_evict, also where the store already
 * holds the model's profile from a job that could give it up, and the plan,
 * made with persistent eviction under a budget that needs one weight out,
 * evicts the other weight and never that one.
 *
 * The job (real client, sim backend, framework memory; real daemon): two
 * 32 MiB weights W0 and W1, read by the first op and the last; between
 * them six ops each make a 48 MiB temporary. Peak 64 + 48 + 1 MiB; the
 * budget, 96 MiB, fits once either weight is out.
 */
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/client.h"
#include "capuchin/framework.h"
#include "client_impl.h" /* c->x.plan: the plan the daemon sent */
#include "fake_framework.h"
#include "testclient.h"

#define MIB (1ull << 20)
#define N_MID 6

/* An op of the job: its output adopted from fresh framework memory. */
static uint32_t run_op(cap_client_t *c, fake_fw_t *f, const uint32_t *in,
                       uint32_t n_in, uint64_t out_bytes) {
  uint32_t out = CAP_NONE;
  void *o = fake_fw_new(f, out_bytes);
  CHECK(o != NULL);
  if (!o)
    return CAP_NONE;
  CHECK_EQ(cap_client_adopt(c, out_bytes, o, &out), 0);
  CHECK_EQ(cap_client_op_run(c, "aten.mm.default", in, n_in, &out, 1, 2000000),
           0);
  return out;
}

static void drop(cap_client_t *c, fake_fw_t *f, uint32_t id) {
  void *p = cap_client_tensor_ptr(c, id);
  CHECK_EQ(cap_client_free(c, id), 0);
  fake_fw_drop(f, p);
}

static void run_iter(cap_client_t *c, fake_fw_t *f, const uint32_t w[2]) {
  CHECK_EQ(cap_client_iteration_begin(c), 0);
  uint32_t a = run_op(c, f, w, 2, MIB);
  for (int i = 0; i < N_MID; i++)
    drop(c, f, run_op(c, f, &a, 1, 48 * MIB));
  drop(c, f, run_op(c, f, w, 2, MIB));
  drop(c, f, a);
  CHECK_EQ(cap_client_iteration_end(c, NULL), 0);
}

static int64_t no_evict_of(const char *db_path, uint32_t tensor) {
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  int64_t v = -1;
  if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(db,
                         "SELECT no_evict FROM profile_tensors WHERE tensor = ?1"
                         " ORDER BY profile_id DESC LIMIT 1",
                         -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_int64(st, 1, tensor);
    if (sqlite3_step(st) == SQLITE_ROW)
      v = sqlite3_column_int64(st, 0);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

/* One job on the daemon: W1 evictable or not. Checks the marks stored
 * and, where W1 is marked, that the plan evicts W0 and never W1. */
static void run_job(const tc_daemon_t *d, bool w1_evictable) {
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.framework_memory = true;
  cfg.socket_path = d->sock;
  cfg.job_name = "no-evict";
  cfg.budget_bytes = 96 * MIB;
  cfg.connect_timeout_ms = 10000;
  cap_client_t *c = NULL;
  fake_fw_t f = {0};
  uint32_t w[2];
  CHECK_EQ(cap_client_create(&cfg, &c), 0);
  if (!c)
    return;
  REQUIRE(cap_client_set_framework_memory(c, fake_fw_alloc, fake_fw_release,
                                          &f) == 0);
  for (int i = 0; i < 2; i++) {
    void *p = fake_fw_new(&f, 32 * MIB);
    REQUIRE(p);
    REQUIRE(cap_client_adopt_persistent(c, 32 * MIB, CAP_KIND_PARAM, p,
                                        &w[i]) == 0);
  }
  REQUIRE(cap_client_set_evictable(c, w[0], true) == 0);
  REQUIRE(cap_client_set_evictable(c, w[1], w1_evictable) == 0);
  cap_client_stats_t st = {0};
  for (int it = 0; it < 40 && !st.plan_version; it++) {
    run_iter(c, &f, w);
    usleep(50000);
    cap_client_get_stats(c, &st);
  }
  CHECK(st.plan_version > 0);
  CHECK_EQ(no_evict_of(d->db, w[0]), 0);
  CHECK_EQ(no_evict_of(d->db, w[1]), w1_evictable ? 0 : 1);
  const cap_plan_t *plan = c->x.plan;
  CHECK(plan != NULL);
  bool on_w0 = false, on_w1 = false;
  for (uint32_t i = 0; plan && i < plan->n_actions; i++) {
    on_w0 |= plan->actions[i].tensor == w[0];
    on_w1 |= plan->actions[i].tensor == w[1];
  }
  if (!w1_evictable) {
    CHECK(on_w0);
    CHECK(!on_w1);
  }
  cap_client_destroy(c);
  while (f.n_live)
    fake_fw_drop(&f, f.live[0]);
}

static void test_no_evict_reaches_the_plan(void) {
  tc_daemon_t d;
  const char *extra[] = {"--evict-persistent", "yes", NULL};
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  run_job(&d, false);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

/* The same model stored before with W1 evictable (its profile found by
 * signature, its plans in the store): the marks reach the stored profile
 * and the plan is made again. */
static void test_no_evict_on_a_stored_profile(void) {
  tc_daemon_t d;
  const char *extra[] = {"--evict-persistent", "yes", NULL};
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  run_job(&d, true);
  run_job(&d, false);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

int main(void) {
  RUN_TEST(test_no_evict_reaches_the_plan);
  RUN_TEST(test_no_evict_on_a_stored_profile);
  return TEST_SUMMARY();
}
