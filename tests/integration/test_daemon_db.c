/*
 * A database file capuchind must not touch (issue 4, "Bad input and
 * faults"): one that is not an SQLite database, and one whose user_version is
 * newer than this build understands. Each gives a clear error naming the
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
  CHECK(access(wal, F_OK) != 0);
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
  RUN_TEST(test_bad_arguments);
  if (!cap_test_failed) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
      fprintf(stderr, "cannot remove %s\n", dir);
  }
  return TEST_SUMMARY();
}
