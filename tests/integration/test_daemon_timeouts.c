/*
 * A connection counted against max-sessions from accept
 * and no timer ever closed it, so connections that send nothing locked real
 * jobs out. Now: Hello within handshake-timeout-ms of accept, and a frame
 * once begun finished within idle-timeout-ms; a session between frames (a
 * job between iterations) is never cut and needs no keep-alive.
 */
#include <sys/resource.h>
#include <sys/wait.h>

#include "cap_test.h"
#include "testclient.h"

#define MAX_SESSIONS 8

static const char *const extra[] = {
    "--max-sessions", "8", "--handshake-timeout-ms", "500",
    "--idle-timeout-ms", "1000", NULL};

/* Alive and reading: an ack of a plan never sent is answered with an
 * Error that says so (and the session is closed). */

static void test_silent_connections_are_closed(void) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  tc_t silent[MAX_SESSIONS], c;
  for (int i = 0; i < MAX_SESSIONS; i++)
    REQUIRE(tc_connect(&silent[i], d.sock) == 0);
  /* The daemon took them all: a real job is refused at first. */
  tc_welcome_t w;
  tc_hello_args_t ha = {.job = "real", .budget_bytes = 1u << 30};
  uint64_t t0 = tc_now_ms();
  bool welcomed = false;
  bool refused_once = false;
  while (!welcomed && tc_now_ms() - t0 < 30000) {
    REQUIRE(tc_connect(&c, d.sock) == 0);
    welcomed = tc_hello(&c, &ha, &w, 20000) == 0;
    if (!welcomed) {
      refused_once = true;
      CHECK(strstr(c.last_error, "too many sessions") != NULL);
      tc_close(&c);
      usleep(100 * 1000);
    }
  }
  CHECK(refused_once);
  CHECK(welcomed);
  printf("a real job was welcomed %llu ms after %d silent connections "
         "(handshake-timeout-ms 500)\n",
         (unsigned long long)(tc_now_ms() - t0), MAX_SESSIONS);
  for (int i = 0; i < MAX_SESSIONS; i++) {
    CHECK(tc_wait_closed(&silent[i], 20000));
    CHECK_EQ(silent[i].last_error_code, CAP_ETIMEDOUT);
    tc_close(&silent[i]);
  }
  CHECK(strstr(silent[0].last_error, "no hello within 500 ms") != NULL);
  if (welcomed)
    tc_close(&c);
  CHECK_EQ(tc_daemon_stop(&d), 0);
  if (!cap_test_failed_checks)
    tc_daemon_cleanup(&d);
  else
    fprintf(stderr, "log: %s\n", d.log);
}

static void test_idle_mid_frame_is_closed_between_frames_is_not(void) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  tc_t between, mid;
  tc_welcome_t w;
  tc_hello_args_t ha = {.job = "between-iterations", .budget_bytes = 1u << 30};
  REQUIRE(tc_connect(&between, d.sock) == 0);
  REQUIRE(tc_hello(&between, &ha, &w, 20000) == 0);
  ha.job = "stops-mid-frame";
  REQUIRE(tc_connect(&mid, d.sock) == 0);
  REQUIRE(tc_hello(&mid, &ha, &w, 20000) == 0);
  /* Two bytes of a length prefix, then nothing. */
  static const uint8_t half[2] = {0, 0};
  CHECK(tc_send_raw(&mid, half, sizeof half) == 0);
  CHECK(tc_wait_closed(&mid, 20000));
  CHECK_EQ(mid.last_error_code, CAP_ETIMEDOUT);
  printf("mid-frame: %s\n", mid.last_error);
  CHECK(strstr(mid.last_error, "incomplete") != NULL);
  /* Three idle timeouts between frames: still there. */
  usleep(3000 * 1000);
  CHECK(tc_session_answers(&between));
  tc_close(&between);
  tc_close(&mid);
  CHECK_EQ(tc_daemon_stop(&d), 0);
  if (!cap_test_failed_checks)
    tc_daemon_cleanup(&d);
  else
    fprintf(stderr, "log: %s\n", d.log);
}

/* A client refused at the fd limit got a bare EOF and nothing was
 * logged. Run in a child whose hard limit is 48 descriptors (the daemon
 * inherits it and cannot raise it): silent connections pile up until the
 * daemon refuses one, which must come with an Error naming the limit. */
static void fd_limit_child(void) {
  struct rlimit rl = {.rlim_cur = 48, .rlim_max = 48};
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
    _exit(77);
  tc_daemon_t d;
  const char *args[] = {"--max-sessions", "1000", NULL};
  if (tc_daemon_start(&d, NULL, args) != 0)
    _exit(3);
  tc_t c[40];
  int n = 0, bare = 0, worded = 0;
  for (; n < 40 && !worded && !bare; n++) {
    if (tc_connect(&c[n], d.sock) != 0)
      break;
    /* An accepted session stays open; a refused one gets its answer. */
    if (tc_wait_closed(&c[n], 300)) {
      if (c[n].last_error_code == CAP_EQUOTA &&
          strstr(c[n].last_error, "open files"))
        worded = 1;
      else
        bare = 1;
      printf("connection %d: %s\n", n,
             c[n].last_error[0] ? c[n].last_error : "(bare EOF)");
      fflush(stdout);
    }
  }
  bool logged = tc_daemon_log_contains(&d, "too many open files");
  for (int i = 0; i < n; i++)
    tc_close(&c[i]);
  tc_daemon_stop(&d);
  if (worded && !bare && logged)
    tc_daemon_cleanup(&d);
  else
    fprintf(stderr, "log: %s\n", d.log);
  _exit(worded && !bare && logged ? 0 : 1);
}

static void test_fd_limit_refusal_is_worded(void) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0)
    fd_limit_child();
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 77));
}

int main(void) {
  RUN_TEST(test_silent_connections_are_closed);
  RUN_TEST(test_idle_mid_frame_is_closed_between_frames_is_not);
  RUN_TEST(test_fd_limit_refusal_is_worded);
  return TEST_SUMMARY();
}
