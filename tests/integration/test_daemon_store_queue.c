/*
 * Every IterationEnd queued one store task in the
 * thread pool that also registers Hellos and plans, so 400 000 IterationEnd
 * frames from one client made another client's Hello wait 34 s. Now a
 * session's queued rows are bounded (its input waits for the store beyond
 * max-queued-store-rows) and the rows are written by one task at a time in
 * batches: the other client's Hello is answered at once, and every row the
 * flood sent is stored.
 */
#include <sqlite3.h>
#include <sys/wait.h>

#include "cap_test.h"
#include "testclient.h"

#define N_FRAMES 300000u

static long long count_rows(const char *db, const char *job) {
  sqlite3 *h = NULL;
  long long n = -1;
  if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(h,
                           "SELECT count(*) FROM iterations JOIN jobs ON "
                           "jobs.id = iterations.job_id WHERE jobs.name = ?",
                           -1, &st, NULL) == SQLITE_OK) {
      sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
      if (sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return n;
}

static void test_flood_does_not_delay_hello(void) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, NULL) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0)
    tc_flood_iteration_ends(d.sock, "flood", N_FRAMES);
  /* Let the flood get going: the daemon has read a good part of it. */
  for (int i = 0; i < 100 && !tc_daemon_log_contains(&d, "'flood' welcomed");
       i++)
    usleep(50 * 1000);
  usleep(1500 * 1000);
  tc_t c;
  tc_welcome_t w;
  tc_hello_args_t ha = {.job = "bystander", .budget_bytes = 1u << 30};
  uint64_t t0 = tc_now_ms();
  REQUIRE(tc_connect(&c, d.sock) == 0);
  CHECK(tc_hello(&c, &ha, &w, 120000) == 0);
  uint64_t ms = tc_now_ms() - t0;
  printf("Hello answered in %llu ms while one client sent %u IterationEnd "
         "frames\n", (unsigned long long)ms, N_FRAMES);
  CHECK(ms < 5000); /* 34 s before; a few ms now, 5 s for a loaded CI */
  printf("the flood's input was %spaused for the store\n",
         tc_daemon_log_contains(&d, "wait for the store") ? "" : "never ");
  Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
  tc_send_msg(&c, &bye);
  tc_close(&c);
  int st = 0;
  CHECK(waitpid(child, &st, 0) == child);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK_EQ(tc_daemon_stop(&d), 0);
  long long rows = count_rows(d.db, "flood");
  printf("%lld of %u rows stored\n", rows, N_FRAMES);
  CHECK_EQ(rows, (long long)N_FRAMES);
  if (!cap_test_failed_checks)
    tc_daemon_cleanup(&d);
  else
    fprintf(stderr, "log: %s\n", d.log);
}

int main(void) {
  RUN_TEST(test_flood_does_not_delay_hello);
  return TEST_SUMMARY();
}
