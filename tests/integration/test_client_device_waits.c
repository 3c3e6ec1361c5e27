/*
 * The measured iteration's recorded timeline stays in op order whatever
 * the client waited for. Where ops run on a device (the cuda backend), an
 * op that waits for a copy on the device holds no host time: the client
 * counts the device's estimated wait as a stall but must not take it out
 * of the host's clock, or later ops are recorded before earlier ones. The
 * first run on a GPU did that: the daemon refused every measured iteration
 * ("start_ns ... before the previous op's") and never planned.
 *
 * Here (real client on the sim backend, real daemon) the measured
 * iteration notes such a device wait of 50 ms between two 2 ms ops, and a
 * host wait of 5 ms inside an op that took no such time; the daemon must
 * take the iteration and send a plan, and both waits count as stalls.
 *
 * The second test is the framework's device timeline
 * (cap_client_set_device_timeline): a GPU job's adapter times each op on
 * the device and spends host time between ops that the device does not
 * (the first GPU runs recorded ResNet-50's 60 ms step as 155 ms, and the
 * plans counted on that time to hide copies). With it on, the stored
 * profile's ops lie end to end, the host's time between them left out.
 */
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/client.h"
#include "capuchin/framework.h"
#include "client_impl.h" /* cap__note_wait: the waits a device backend notes */
#include "testclient.h"

#define MIB (1ull << 20)
#define MS INT64_C(1000000)

/* An op that runs for 2 ms; wait_ns > 0: a wait noted inside it. */
static void op(cap_client_t *c, const char *name, uint32_t in, uint32_t out,
               int64_t wait_ns, bool host) {
  CHECK_EQ(cap_client_op_begin(c, name, &in, 1, &out, 1, NULL, NULL), 0);
  CHECK_EQ(cap_client_compute(c, 2 * MS), 0);
  if (wait_ns)
    cap__note_wait(c, wait_ns, host);
  CHECK_EQ(cap_client_op_end(c), 0);
}

/* One iteration; returns whether it was the measured one. */
static bool run_iter(cap_client_t *c, uint32_t w) {
  uint32_t t[4];
  CHECK_EQ(cap_client_iteration_begin(c), 0);
  bool measured = c->recording;
  for (int i = 0; i < 4; i++)
    CHECK_EQ(cap_client_declare(c, MIB, &t[i]), 0);
  /* Op c waited 50 ms on the device for a late copy (no host time), op d
   * 5 ms on the host that the clock did not see (op d must keep its
   * place after op c). */
  op(c, "aten.a", w, t[0], 0, false);
  op(c, "aten.b", t[0], t[1], 0, false);
  op(c, "aten.c", t[1], t[2], measured ? 50 * MS : 0, false);
  op(c, "aten.d", t[2], t[3], measured ? 5 * MS : 0, true);
  for (int i = 0; i < 4; i++)
    CHECK_EQ(cap_client_free(c, t[i]), 0);
  CHECK_EQ(cap_client_iteration_end(c, NULL), 0);
  return measured;
}

/* The stored profile's op times (ns), in op order; the number of ops. */
static int stored_ops(const char *db_path, int64_t start[], int64_t end[],
                      int max) {
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  int n = 0;
  if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(
          db,
          "SELECT start_ns, end_ns FROM profile_ops WHERE profile_id ="
          " (SELECT MAX(profile_id) FROM profile_ops) ORDER BY seq",
          -1, &st, NULL) == SQLITE_OK)
    while (n < max && sqlite3_step(st) == SQLITE_ROW) {
      start[n] = sqlite3_column_int64(st, 0);
      end[n] = sqlite3_column_int64(st, 1);
      n++;
    }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

/* A sim client's config for job `name` of daemon d. */
static void sim_config(cap_client_config_t *cfg, const tc_daemon_t *d,
                       const char *name) {
  cap_client_config_init(cfg);
  cfg->backend = "sim";
  cfg->socket_path = d->sock;
  cfg->job_name = name;
  cfg->budget_bytes = 64 * MIB;
  cfg->connect_timeout_ms = 10000;
}

static void test_device_waits_keep_the_timeline(void) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, NULL) == 0);
  cap_client_config_t cfg;
  sim_config(&cfg, &d, "device-waits");
  cap_client_t *c = NULL;
  REQUIRE(cap_client_create(&cfg, &c) == 0);
  uint32_t w = CAP_NONE;
  REQUIRE(cap_client_register(c, MIB, CAP_KIND_PARAM, &w, NULL) == 0);
  cap_client_stats_t st = {0};
  int64_t noted = 0;
  for (int it = 0; it < 40 && !st.plan_version; it++) {
    noted += run_iter(c, w) ? 55 * MS : 0;
    usleep(50000);
    cap_client_get_stats(c, &st);
  }
  CHECK(st.plan_version > 0);
  CHECK_EQ(st.reconnects, 0);
  CHECK(noted > 0);
  CHECK(st.stall_ns >= noted);
  CHECK(!tc_daemon_log_contains(&d, "before the previous op"));
  /* Ops a, b, c took 2 ms each at least: the device's wait in c is not
   * taken out of the host's clock (it would put c's end near 0). */
  int64_t start[4], end[4];
  CHECK_EQ(stored_ops(d.db, start, end, 4), 4);
  CHECK(end[2] >= 5 * MS);
  for (int i = 1; i < 4; i++)
    CHECK(start[i] >= start[i - 1]);
  cap_client_destroy(c);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

/* Framework memory for the sim backend: plain host memory. */
static int fw_alloc(void *user, uint32_t id, uint64_t bytes, void **dev) {
  (void)user, (void)id;
  *dev = malloc(bytes);
  return *dev ? 0 : -1;
}

static void fw_release(void *user, uint32_t id, void *dev, uint64_t bytes) {
  (void)user, (void)id, (void)bytes;
  free(dev);
}

/* A framework job whose measured iteration runs 4 ops of 2 ms (device
 * time, as the adapter reports it), each after 20 ms of host time, and
 * frees each op's input after it; device_timeline as given. The stored
 * profile's op times (ns) in start[] and end[]. */
static void framework_job(bool device_timeline, int64_t start[4],
                          int64_t end[4]) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, NULL) == 0);
  cap_client_config_t cfg;
  sim_config(&cfg, &d, device_timeline ? "device-timeline" : "host-timeline");
  cfg.framework_memory = true;
  cap_client_t *c = NULL;
  REQUIRE(cap_client_create(&cfg, &c) == 0);
  REQUIRE(cap_client_set_framework_memory(c, fw_alloc, fw_release, NULL) == 0);
  CHECK_EQ(cap_client_set_device_timeline(NULL, true), CAP_EINVAL);
  CHECK_EQ(cap_client_set_device_timeline(c, device_timeline), 0);
  cap_client_stats_t st = {0};
  for (int it = 0; it < 40 && !st.plan_version; it++) {
    REQUIRE(cap_client_iteration_begin(c) == 0);
    void *mem[5];
    uint32_t t[5];
    for (int i = 0; i < 5; i++) {
      mem[i] = malloc(MIB);
      REQUIRE(mem[i]);
    }
    CHECK_EQ(cap_client_adopt(c, MIB, mem[0], &t[0]), 0);
    for (int i = 0; i < 4; i++) {
      usleep(20000); /* the host's own work between ops */
      CHECK_EQ(cap_client_adopt(c, MIB, mem[i + 1], &t[i + 1]), 0);
      CHECK_EQ(cap_client_op_run(c, "aten.f", &t[i], 1, &t[i + 1], 1, 2 * MS),
               0);
      CHECK_EQ(cap_client_free(c, t[i]), 0);
      free(mem[i]);
    }
    CHECK_EQ(cap_client_free(c, t[4]), 0);
    free(mem[4]);
    CHECK_EQ(cap_client_iteration_end(c, NULL), 0);
    usleep(50000);
    cap_client_get_stats(c, &st);
  }
  CHECK(st.plan_version > 0); /* the daemon took the measured iteration */
  CHECK(!tc_daemon_log_contains(&d, "before the previous op"));
  CHECK_EQ(stored_ops(d.db, start, end, 4), 4);
  cap_client_destroy(c);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

static void test_device_timeline_leaves_host_time_out(void) {
  int64_t start[4], end[4];
  /* On: each op starts where the one before ended and lasts its 2 ms (a
   * descheduled thread can add to it, never take from it; the host's
   * 20 ms gaps would put the last op's end past 80 ms). */
  framework_job(true, start, end);
  CHECK(start[0] >= 0 && start[0] < 10 * MS);
  for (int i = 0; i < 4; i++) {
    CHECK(end[i] - start[i] >= 2 * MS);
    if (i)
      CHECK_EQ(start[i], end[i - 1]);
  }
  CHECK(end[3] - start[0] < 40 * MS);
  /* Off: the host's clock, gaps included. */
  framework_job(false, start, end);
  for (int i = 1; i < 4; i++)
    CHECK(start[i] - end[i - 1] >= 15 * MS);
}

int main(void) {
  RUN_TEST(test_device_waits_keep_the_timeline);
  RUN_TEST(test_device_timeline_leaves_host_time_out);
  return TEST_SUMMARY();
}
