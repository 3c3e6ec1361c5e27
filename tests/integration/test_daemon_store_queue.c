/*
 * Issue 10, defect 3: every IterationEnd queued one store task in the
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

/* The flooding client (a child process): Hello, then N_FRAMES unmanaged
 * IterationEnds written as fast as the socket takes them, then Bye. */
static void flood(const char *sock) {
  tc_t c;
  tc_welcome_t w;
  tc_hello_args_t ha = {.job = "flood", .budget_bytes = 1u << 30};
  if (tc_connect(&c, sock) != 0 || tc_hello(&c, &ha, &w, 20000) != 0)
    _exit(2);
  size_t cap = (size_t)N_FRAMES * 48, len = 0;
  uint8_t *buf = malloc(cap);
  for (uint32_t i = 1; i <= N_FRAMES; i++) {
    Capuchin__IterationEnd e = CAPUCHIN__ITERATION_END__INIT;
    e.has_iteration = e.has_iter_ns = e.has_peak_bytes = e.has_bytes_out =
        e.has_bytes_in = e.has_stall_ns = e.has_measured = e.has_incomplete =
            e.has_mode = 1;
    e.iteration = i;
    e.iter_ns = 1000;
    e.mode = CAPUCHIN__MODE__MODE_PASSIVE;
    Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
    cap_proto_envelope_set(&env, &e);
    uint8_t *f = NULL;
    size_t n = 0;
    if (cap_frame_encode_alloc(&env, 0, &f, &n) != 0 || len + n > cap)
      _exit(3);
    memcpy(buf + len, f, n);
    len += n;
    free(f);
  }
  if (tc_send_raw(&c, buf, len) != 0)
    _exit(4);
  Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
  tc_send_msg(&c, &bye);
  tc_wait_closed(&c, 600000);
  _exit(0);
}

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
    flood(d.sock);
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
