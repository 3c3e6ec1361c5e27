/*
 * kill -9 of capuchind during a burst of writes: clients keep registering
 * jobs, sending measured iterations and iteration reports while the daemon
 * is killed at a random moment. After a
 * restart on the same database it opens, passes an integrity check, and
 * every job a client was welcomed as and every plan a client received (a
 * plan is stored before it is pushed) is there; a new job with one of those
 * signatures gets the stored plan without measuring.
 */
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>

#include "cap_test.h"
#include "store.h"
#include "testclient.h"

#define MAX_JOBS 4096

static struct {
  uint64_t job_id;
  uint64_t signature;
  uint64_t budget;
  bool got_plan;
} jobs[MAX_JOBS];
static int n_jobs;

static cap_profile_t *synthetic(int i) {
  cap_profile_t *p = cap_profile_create();
  enum { N = 24 };
  cap_profile_add_tensor(p, 0, 1u << 20, CAP_KIND_PARAM);
  for (uint32_t j = 1; j <= N; j++)
    cap_profile_add_tensor(p, j, (uint64_t)(i + 1) * 4096u * j,
                           CAP_KIND_ACTIVATION);
  uint32_t seq = 0;
  int64_t t = 0;
  for (uint32_t j = 0; j < N; j++, t += 1000) {
    uint32_t in[2] = {0, j}, out[1] = {j + 1};
    cap_profile_add_op(p, seq++, t, t + 800, "aten.linear.default", in,
                       j ? 2 : 1, out, 1);
  }
  for (uint32_t j = N; j >= 1; j--, t += 1000) {
    uint32_t in[2] = {0, j};
    cap_profile_add_op(p, seq++, t, t + 800, "aten.mm.default", in, 2, NULL,
                       0);
  }
  t = 1000 * N;
  for (uint32_t j = N; j >= 1; j--, t += 1000)
    cap_profile_add_free(p, t + 900, j);
  if (cap_profile_finish(p) != 0) {
    fprintf(stderr, "synthetic profile: %s\n", cap_profile_error(p));
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

static void test_kill9_during_burst(void) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, NULL) == 0);
  int go[2];
  REQUIRE(pipe(go) == 0);
  pid_t daemon_pid = d.pid;
  pid_t killer = fork();
  if (killer == 0) {
    char x;
    close(go[1]);
    if (read(go[0], &x, 1) == 1) {
      srand((unsigned)getpid());
      usleep((useconds_t)(rand() % 300000));
      kill(daemon_pid, SIGKILL);
    }
    _exit(0);
  }
  close(go[0]);
  bool signalled = false;
  uint64_t deadline = tc_now_ms() + 60000;
  for (int i = 0; n_jobs < MAX_JOBS && tc_now_ms() < deadline; i++) {
    tc_t c;
    if (tc_connect(&c, d.sock) != 0)
      break;
    cap_profile_t *p = synthetic(i % 64);
    if (!p) {
      tc_close(&c);
      break;
    }
    uint64_t budget = cap_profile_budget_pct(p, 100) - (i % 3) * 4096;
    tc_hello_args_t a = {.job = "burst", .budget_bytes = budget};
    tc_welcome_t w;
    bool alive = tc_hello(&c, &a, &w, 5000) == 0;
    if (alive) {
      jobs[n_jobs].job_id = w.job_id;
      jobs[n_jobs].signature = cap_profile_signature(p);
      jobs[n_jobs].budget = budget;
      n_jobs++;
      if (tc_send_iteration(&c, p, 1, true, 16) == 0) {
        cap_plan_t *plan = tc_wait_plan(&c, 5000);
        if (plan)
          jobs[n_jobs - 1].got_plan = true;
        cap_plan_destroy(plan);
        /* Iteration reports: one store write each. */
        for (uint64_t it = 2; it < 12; it++)
          tc_send_iteration_end(&c, it, 1000000, false, false, 0, 0);
      }
    }
    cap_profile_destroy(p);
    tc_close(&c);
    if (!alive)
      break;
    if (n_jobs == 8 && !signalled) {
      signalled = write(go[1], "x", 1) == 1;
    }
  }
  close(go[1]);
  int st;
  waitpid(killer, &st, 0);
  /* The harness reaps the killed daemon. */
  int wst = 0;
  CHECK(waitpid(d.pid, &wst, 0) == d.pid && WIFSIGNALED(wst) &&
        WTERMSIG(wst) == SIGKILL);
  d.pid = 0;
  int plans = 0;
  for (int i = 0; i < n_jobs; i++)
    plans += jobs[i].got_plan;
  printf("killed after %d jobs welcomed, %d plans received\n", n_jobs, plans);
  CHECK(n_jobs >= 8);

  /* Restart on the same database. */
  tc_daemon_t d2;
  REQUIRE(tc_daemon_start(&d2, d.dir, NULL) == 0);
  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(d2.db, CAP_STORE_READONLY, &s) == 0);
  sqlite3_stmt *q = NULL;
  REQUIRE(sqlite3_prepare_v2(cap_store_db(s), "PRAGMA integrity_check", -1,
                             &q, NULL) == SQLITE_OK);
  REQUIRE(sqlite3_step(q) == SQLITE_ROW);
  CHECK_STR((const char *)sqlite3_column_text(q, 0), "ok");
  sqlite3_finalize(q);
  REQUIRE(sqlite3_prepare_v2(cap_store_db(s),
                             "SELECT count(*) FROM jobs WHERE id = ?", -1, &q,
                             NULL) == SQLITE_OK);
  int missing_jobs = 0, missing_plans = 0;
  for (int i = 0; i < n_jobs; i++) {
    sqlite3_bind_int64(q, 1, (sqlite3_int64)jobs[i].job_id);
    if (sqlite3_step(q) != SQLITE_ROW || sqlite3_column_int64(q, 0) != 1)
      missing_jobs++;
    sqlite3_reset(q);
    int64_t pl;
    if (jobs[i].got_plan &&
        cap_store_plan_find(s, jobs[i].signature, jobs[i].budget, NULL, 0.2,
                            &pl, NULL) != 0)
      missing_plans++;
  }
  sqlite3_finalize(q);
  cap_store_close(s);
  CHECK_EQ(missing_jobs, 0);
  CHECK_EQ(missing_plans, 0);

  /* The restarted daemon serves a committed plan by signature. */
  int last = -1;
  for (int i = 0; i < n_jobs; i++)
    if (jobs[i].got_plan)
      last = i;
  REQUIRE(last >= 0);
  tc_t c;
  REQUIRE(tc_connect(&c, d2.sock) == 0);
  tc_hello_args_t a = {.job = "after-restart", .budget_bytes = jobs[last].budget,
                       .signature = jobs[last].signature};
  tc_welcome_t w;
  REQUIRE(tc_hello(&c, &a, &w, 10000) == 0);
  CHECK(w.plan_reused);
  cap_plan_t *plan = tc_wait_plan(&c, 5000);
  CHECK(plan != NULL);
  cap_plan_destroy(plan);
  tc_close(&c);
  CHECK_EQ(tc_daemon_stop(&d2), 0);
  if (!cap_test_failed_checks) {
    tc_daemon_cleanup(&d2);
  } else {
    fprintf(stderr, "logs in %s\n", d2.dir);
  }
  if (d.notify_fd >= 0)
    close(d.notify_fd);
}

int main(void) {
  RUN_TEST(test_kill9_during_burst);
  return TEST_SUMMARY();
}
