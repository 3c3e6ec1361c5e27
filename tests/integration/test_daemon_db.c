/*
 * A database file capuchind must not touch: one that is not an SQLite
 * database, and one whose user_version is newer than this build
 * understands. Each gives a clear error naming the
 * file, a non-zero exit status, and leaves the file byte-for-byte as it was.
 * Also: bad command-line arguments exit 64 with usage.
 */
#include <sqlite3.h>
#include <sys/stat.h>

#include "cap_test.h"
#include "store.h"
#include "testclient.h"

static char dir[] = "/tmp/capd-test-XXXXXX";

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static void refused(const char *db, const char *what) {
  size_t n0 = 0, n1 = 0;
  char *before = slurp(db, &n0);
  REQUIRE(before != NULL);
  char sock[300], out[8192];
  snprintf(sock, sizeof sock, "%s/capuchind.sock", dir);
  const char *argv[] = {CAP_BIN_DIR "/capuchind", "--socket", sock, "--db",
                        db, NULL};
  int rc = tc_run_capture(argv, out, sizeof out);
  printf("exit %d: %s", rc, out);
  CHECK(rc != 0);
  CHECK(strstr(out, db) != NULL);
  CHECK(strstr(out, what) != NULL);
  char *after = slurp(db, &n1);
  CHECK(after != NULL && n0 == n1 && memcmp(before, after, n0) == 0);
  char wal[400];
  snprintf(wal, sizeof wal, "%s-wal", db);
  /* A database in WAL mode is read through its -wal: SQLite may create an
   * empty one even for the read-only check. Nothing may be written to it. */
  struct stat wst;
  CHECK(stat(wal, &wst) != 0 || wst.st_size == 0);
  CHECK(access(sock, F_OK) != 0); /* never listened */
  free(before);
  free(after);
}

static void test_not_a_database(void) {
  char db[300];
  snprintf(db, sizeof db, "%s/notes.db", dir);
  FILE *f = fopen(db, "w");
  REQUIRE(f != NULL);
  for (int i = 0; i < 200; i++)
    fprintf(f, "this is a text file, line %d, not a database\n", i);
  fclose(f);
  refused(db, "not");
}

static void test_newer_schema(void) {
  char db[300];
  snprintf(db, sizeof db, "%s/future.db", dir);
  sqlite3 *h = NULL;
  REQUIRE(sqlite3_open(db, &h) == SQLITE_OK);
  char sql[128];
  snprintf(sql, sizeof sql,
           "CREATE TABLE t(x); PRAGMA user_version = %d;",
           CAP_STORE_SCHEMA_VERSION + 7);
  CHECK(sqlite3_exec(h, sql, NULL, NULL, NULL) == SQLITE_OK);
  sqlite3_close(h);
  refused(db, "version");
}

/* A database damaged inside (a page overwritten) keeps
 * a readable header. The start-up check read only user_version, switching
 * to WAL then rewrote the damaged file's header, and the daemon stayed up
 * refusing every job with "database disk image is malformed". */
static void test_damaged_page(void) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, NULL) == 0);
  tc_t c;
  tc_welcome_t w;
  tc_hello_args_t ha = {.job = "before-the-damage", .budget_bytes = 1u << 30};
  REQUIRE(tc_connect(&c, d.sock) == 0);
  REQUIRE(tc_hello(&c, &ha, &w, 20000) == 0);
  tc_close(&c);
  usleep(200 * 1000);
  CHECK_EQ(tc_daemon_stop(&d), 0); /* checkpoints: all in the main file */
  struct stat st;
  REQUIRE(stat(d.db, &st) == 0);
  REQUIRE(st.st_size >= 4 * 4096);
  /* Page 3's b-tree header: an invalid page type, then garbage. */
  FILE *f = fopen(d.db, "r+b");
  REQUIRE(f != NULL);
  fseek(f, 2 * 4096, SEEK_SET);
  for (int i = 0; i < 64; i++)
    fputc(0x55, f);
  fclose(f);
  /* Started as a service would be: it exits at once, never READY (before
   * the fix it came up). Then run to completion: message and file. */
  size_t n0 = 0, n1 = 0;
  char *before = slurp(d.db, &n0);
  tc_daemon_t d2;
  bool up = tc_daemon_start(&d2, d.dir, NULL) == 0;
  CHECK(!up);
  if (up) {
    tc_daemon_stop(&d2);
  } else {
    char *after = slurp(d.db, &n1);
    CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(after);
    refused(d.db, "damaged");
  }
  free(before);
  tc_daemon_cleanup(&d);
}

/* The database and its -wal/-shm are created 0600
 * whatever the umask (or with --db-mode, 0640/0660 for the service's group),
 * and one made world-readable before loses the other users' access. */
static void test_database_mode(void) {
  mode_t old = umask(0);
  tc_daemon_t d;
  int rc = tc_daemon_start(&d, NULL, NULL);
  umask(old);
  REQUIRE(rc == 0);
  tc_t c;
  tc_welcome_t w;
  tc_hello_args_t ha = {.job = "private", .budget_bytes = 1u << 30};
  REQUIRE(tc_connect(&c, d.sock) == 0);
  REQUIRE(tc_hello(&c, &ha, &w, 20000) == 0);
  const char *sfx[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char p[400];
    struct stat st;
    snprintf(p, sizeof p, "%s%s", d.db, sfx[i]);
    CHECK(stat(p, &st) == 0);
    printf("%s: %04o\n", p, (unsigned)(st.st_mode & 0777));
    CHECK_EQ(st.st_mode & 0777, 0600);
  }
  tc_close(&c);
  CHECK_EQ(tc_daemon_stop(&d), 0);

  /* Made 0666 by hand: the next start takes the others' bits away. */
  CHECK(chmod(d.db, 0666) == 0);
  tc_daemon_t d2;
  REQUIRE(tc_daemon_start(&d2, d.dir, NULL) == 0);
  struct stat st;
  CHECK(stat(d.db, &st) == 0 && (st.st_mode & 0777) == 0660);
  CHECK(tc_daemon_log_contains(&d2, "readable by every local user"));
  CHECK_EQ(tc_daemon_stop(&d2), 0);
  tc_daemon_cleanup(&d);

  /* --db-mode 0660: the group shares it (the systemd unit's capuchin). */
  old = umask(077);
  const char *extra[] = {"--db-mode", "0660", NULL};
  rc = tc_daemon_start(&d, NULL, extra);
  umask(old);
  REQUIRE(rc == 0);
  CHECK(stat(d.db, &st) == 0 && (st.st_mode & 0777) == 0660);
  CHECK_EQ(tc_daemon_stop(&d), 0);
  tc_daemon_cleanup(&d);
}

/* An empty file is a new database, not "schema version 0 is
 * older": capuchin-query says so, and capuchind initialises it. */
static void test_empty_file(void) {
  tc_daemon_t d;
  char sub[300];
  snprintf(sub, sizeof sub, "%s/empty", dir);
  REQUIRE(mkdir(sub, 0700) == 0);
  char db[400], out[4096];
  snprintf(db, sizeof db, "%s/capuchin.db", sub);
  FILE *f = fopen(db, "w");
  REQUIRE(f != NULL);
  fclose(f);
  const char *q[] = {CAP_BIN_DIR "/capuchin-query", "--db", db, "jobs", NULL};
  int rc = tc_run_capture(q, out, sizeof out);
  printf("capuchin-query on an empty file: exit %d: %s", rc, out);
  CHECK(strstr(out, "empty database") != NULL);
  CHECK(strstr(out, "older") == NULL);
  REQUIRE(tc_daemon_start(&d, sub, NULL) == 0);
  CHECK_EQ(tc_daemon_stop(&d), 0);
  CHECK_EQ(tc_run_capture(q, out, sizeof out), 0);
}

static void test_bad_arguments(void) {
  char out[4096];
  const char *a1[] = {CAP_BIN_DIR "/capuchind", "--no-such-option", NULL};
  CHECK_EQ(tc_run_capture(a1, out, sizeof out), 64);
  CHECK(strstr(out, "usage") != NULL);
  const char *a2[] = {CAP_BIN_DIR "/capuchind", "--gpu-memory", "lots", NULL};
  CHECK_EQ(tc_run_capture(a2, out, sizeof out), 64);
  CHECK(strstr(out, "gpu-memory") != NULL);
  const char *a3[] = {CAP_BIN_DIR "/capuchind", "--log-level", "loud", NULL};
  CHECK_EQ(tc_run_capture(a3, out, sizeof out), 64);
}

int main(void) {
  if (!mkdtemp(dir))
    return 1;
  RUN_TEST(test_not_a_database);
  RUN_TEST(test_newer_schema);
  RUN_TEST(test_damaged_page);
  RUN_TEST(test_database_mode);
  RUN_TEST(test_empty_file);
  RUN_TEST(test_bad_arguments);
  if (!cap_test_failed) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
      fprintf(stderr, "cannot remove %s\n", dir);
  }
  return TEST_SUMMARY();
}
