/*
 * capuchind's operator surface: SIGHUP reopens the log
 * file (logrotate moved it away), SIGINT stops cleanly (exit 0, socket
 * removed, sessions told Bye), --max-sessions refuses the connection over
 * the limit with an Error frame while the others carry on.
 */
#include <signal.h>

#include "cap_test.h"
#include "testclient.h"

static bool file_contains(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f)
    return false;
  char line[4096];
  bool found = false;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

static bool wait_contains(const char *path, const char *needle) {
  uint64_t deadline = tc_now_ms() + 10000;
  while (tc_now_ms() < deadline) {
    if (file_contains(path, needle))
      return true;
    usleep(20000);
  }
  return false;
}

static void test_log_reopen_sigint_max_sessions(void) {
  char dir[] = "/tmp/capd-test-XXXXXX";
  REQUIRE(mkdtemp(dir) != NULL);
  char logf[300], rotated[300];
  snprintf(logf, sizeof logf, "%s/daemon.log", dir);
  snprintf(rotated, sizeof rotated, "%s/daemon.log.1", dir);
  const char *extra[] = {"--log-file", logf, "--max-sessions", "1", NULL};
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, dir, extra) == 0);
  CHECK(wait_contains(logf, "listening on"));

  tc_t a, b;
  REQUIRE(tc_connect(&a, d.sock) == 0);
  tc_hello_args_t h = {.job = "first", .budget_bytes = 1ull << 30};
  CHECK(tc_hello(&a, &h, NULL, 10000) == 0);
  REQUIRE(tc_connect(&b, d.sock) == 0);
  h.job = "second";
  CHECK(tc_hello(&b, &h, NULL, 5000) != 0);
  CHECK_EQ(b.last_error_code, CAP_EQUOTA);
  CHECK(strstr(b.last_error, "too many sessions") != NULL);
  CHECK(tc_wait_closed(&b, 5000));
  tc_close(&b);

  /* logrotate: move the file away, SIGHUP, a new file appears. */
  REQUIRE(rename(logf, rotated) == 0);
  kill(d.pid, SIGHUP);
  CHECK(wait_contains(logf, "config reloaded"));
  CHECK(!file_contains(rotated, "config reloaded"));

  /* SIGINT: the session is told Bye, the daemon exits 0. */
  kill(d.pid, SIGINT);
  Capuchin__Envelope *env = tc_wait(&a, CAPUCHIN__ENVELOPE__MSG_BYE, 10000);
  CHECK(env != NULL);
  if (env)
    tc_release(&a, env);
  tc_close(&a);
  uint64_t deadline = tc_now_ms() + 30000;
  int st = 0;
  pid_t r = 0;
  while ((r = waitpid(d.pid, &st, WNOHANG)) == 0 && tc_now_ms() < deadline)
    usleep(10000);
  CHECK(r == d.pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  if (r == d.pid)
    d.pid = 0;
  CHECK(access(d.sock, F_OK) != 0);
  CHECK(file_contains(logf, "SIGINT received"));
  if (!cap_test_failed_checks)
    tc_daemon_cleanup(&d);
  else
    fprintf(stderr, "logs in %s\n", dir);
}

int main(void) {
  RUN_TEST(test_log_reopen_sigint_max_sessions);
  return TEST_SUMMARY();
}
