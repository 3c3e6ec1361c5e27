/*
 * Authorisation by SO_PEERCRED: a client running under a
 * uid that is neither the daemon's, root, nor allowed gets an Error frame
 * (CAP_EPERM) and is logged; after the config file allows that uid and the
 * daemon gets SIGHUP, the same client is welcomed. Also: the socket is mode
 * 0660 and systemd's READY=1 arrives (the harness waits for it). Needs root
 * to run a client under another uid: skipped (77) otherwise.
 */
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "cap_test.h"
#include "testclient.h"

#define OTHER_UID 65534
#define OTHER_GID 65534

/* In a child under OTHER_UID: 0 welcomed, 1 refused with EPERM, 2 other. */
static int client_as_other(const char *sock) {
  pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setgid(OTHER_GID) != 0 ||
        setuid(OTHER_UID) != 0)
      _exit(3);
    tc_t c;
    if (tc_connect(&c, sock) != 0)
      _exit(4);
    tc_hello_args_t a = {.job = "other-uid", .budget_bytes = 1u << 30};
    tc_welcome_t w;
    if (tc_hello(&c, &a, &w, 10000) == 0)
      _exit(0);
    if (c.last_error_code == CAP_EPERM && strstr(c.last_error, "65534") &&
        tc_wait_closed(&c, 5000))
      _exit(1);
    fprintf(stderr, "child: error %d '%s'\n", c.last_error_code, c.last_error);
    _exit(2);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_refused_then_allowed_by_sighup(void) {
  tc_daemon_t d;
  char dir[] = "/tmp/capd-test-XXXXXX";
  REQUIRE(mkdtemp(dir) != NULL);
  chmod(dir, 0755);
  char conf[300];
  snprintf(conf, sizeof conf, "%s/capuchind.conf", dir);
  FILE *f = fopen(conf, "w");
  REQUIRE(f != NULL);
  fprintf(f, "# no extra uids yet\nlog-level = debug\n");
  fclose(f);
  const char *extra[] = {"--config", conf, NULL};
  REQUIRE(tc_daemon_start(&d, dir, extra) == 0);
  struct stat st;
  REQUIRE(stat(d.sock, &st) == 0);
  CHECK_EQ(st.st_mode & 0777, 0660);
  /* Let the other uid reach the socket file so that the daemon itself, not
   * the file mode, has to refuse it. */
  chmod(d.sock, 0666);

  CHECK_EQ(client_as_other(d.sock), 1);
  CHECK(tc_daemon_log_contains(&d, "uid 65534 gid 65534 is not allowed"));

  /* The daemon's own uid is always allowed. */
  tc_t c;
  REQUIRE(tc_connect(&c, d.sock) == 0);
  tc_hello_args_t a = {.job = "own-uid", .budget_bytes = 1u << 30};
  CHECK(tc_hello(&c, &a, NULL, 10000) == 0);
  tc_close(&c);

  f = fopen(conf, "w");
  REQUIRE(f != NULL);
  fprintf(f, "log-level = debug\nallow-uid = %d\n", OTHER_UID);
  fclose(f);
  kill(d.pid, SIGHUP);
  uint64_t deadline = tc_now_ms() + 10000;
  while (!tc_daemon_log_contains(&d, "config reloaded (1 allowed uids") &&
         tc_now_ms() < deadline)
    usleep(20000);
  CHECK(tc_daemon_log_contains(&d, "config reloaded (1 allowed uids"));
  CHECK_EQ(client_as_other(d.sock), 0);
  CHECK_EQ(tc_daemon_stop(&d), 0);
  if (!cap_test_failed_checks)
    tc_daemon_cleanup(&d);
  else
    fprintf(stderr, "log: %s\n", d.log);
}

static void test_allow_gid_option(void) {
  tc_daemon_t d;
  char gid[16];
  snprintf(gid, sizeof gid, "%d", OTHER_GID);
  const char *extra[] = {"--allow-gid", gid, NULL};
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  chmod(d.sock, 0666);
  CHECK_EQ(client_as_other(d.sock), 0);
  CHECK_EQ(tc_daemon_stop(&d), 0);
  tc_daemon_cleanup(&d);
}

int main(void) {
  if (geteuid() != 0) {
    printf("skipped: needs root to run a client under another uid\n");
    return 77;
  }
  RUN_TEST(test_refused_then_allowed_by_sighup);
  RUN_TEST(test_allow_gid_option);
  return TEST_SUMMARY();
}
