/*
 * Socket activation (deploy/capuchind.socket): systemd binds the socket and
 * starts capuchind with it as descriptor 3 (LISTEN_PID, LISTEN_FDS). The
 * daemon must serve on that descriptor, not bind its own, and must leave
 * the path to systemd when it stops.
 */
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "cap_test.h"
#include "testclient.h"

static void test_inherited_socket(void) {
  char dir[] = "/tmp/capd-act-XXXXXX";
  REQUIRE(mkdtemp(dir) != NULL);
  char sock[64], db[64], logf[64];
  snprintf(sock, sizeof sock, "%s/act.sock", dir);
  snprintf(db, sizeof db, "%s/d.db", dir);
  snprintf(logf, sizeof logf, "%s/d.log", dir);

  /* What systemd does for the socket unit. */
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(lfd >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
  REQUIRE(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0);
  REQUIRE(listen(lfd, 16) == 0);

  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (lfd != 3) {
      dup2(lfd, 3);
      close(lfd);
    }
    char p[32];
    snprintf(p, sizeof p, "%d", (int)getpid());
    setenv("LISTEN_PID", p, 1);
    setenv("LISTEN_FDS", "1", 1);
    /* --socket names a path the daemon must not bind: the inherited
     * descriptor wins */
    char other[256];
    snprintf(other, sizeof other, "%s/unused.sock", dir);
    execl(CAP_BIN_DIR "/capuchind", "capuchind", "--socket", other, "--db", db,
          "--log-file", logf, "--log-level", "debug", (char *)NULL);
    _exit(127);
  }
  close(lfd);

  tc_t c;
  int rc = -1;
  /* the socket exists before the daemon is ready: connecting queues */
  for (int i = 0; i < 100 && rc != 0; i++) {
    rc = tc_connect(&c, sock);
    if (rc != 0)
      usleep(50000);
  }
  REQUIRE(rc == 0);
  tc_hello_args_t h = {.job = "activated", .budget_bytes = 1ull << 30};
  tc_welcome_t w = {0};
  CHECK(tc_hello(&c, &h, &w, 10000) == 0);
  CHECK(w.job_id > 0);
  tc_close(&c);

  struct stat st;
  char unused[256];
  snprintf(unused, sizeof unused, "%s/unused.sock", dir);
  CHECK(stat(unused, &st) != 0); /* it did not bind its own */

  kill(pid, SIGTERM);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(stat(sock, &st) == 0); /* systemd's to remove, not the daemon's */

  unlink(sock);
  unlink(logf);
  char f[256];
  const char *sfx[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    snprintf(f, sizeof f, "%s%s", db, sfx[i]);
    unlink(f);
  }
  rmdir(dir);
}

int main(void) {
  RUN_TEST(test_inherited_socket);
  return TEST_SUMMARY();
}
