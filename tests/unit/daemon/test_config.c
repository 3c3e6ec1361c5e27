/* capuchind options: byte counts, setters, config files with line numbers. */
#include <unistd.h>

#include "cap_test.h"
#include "daemon_internal.h"

static void test_parse_bytes(void) {
  uint64_t v = 0;
  CHECK(cap_daemon_parse_bytes("1234", &v) == 0 && v == 1234);
  CHECK(cap_daemon_parse_bytes("16G", &v) == 0 && v == (16ull << 30));
  CHECK(cap_daemon_parse_bytes("512MiB", &v) == 0 && v == (512ull << 20));
  CHECK(cap_daemon_parse_bytes("", &v) != 0);
  CHECK(cap_daemon_parse_bytes("-5", &v) != 0);
  CHECK(cap_daemon_parse_bytes("12Q", &v) != 0);
  CHECK(cap_daemon_parse_bytes("99999999999999999999", &v) == CAP_ERANGE);
  CHECK(cap_daemon_parse_bytes("20000000T", &v) == CAP_ERANGE);
}

static void test_defaults_and_set(void) {
  cap_daemon_config_t c;
  setenv("CAPUCHIN_SOCKET", "/tmp/x/cap.sock", 1);
  cap_daemon_config_init(&c);
  CHECK_STR(c.socket_path, "/tmp/x/cap.sock");
  unsetenv("CAPUCHIN_SOCKET");
  cap_daemon_config_init(&c);
  if (geteuid() == 0)
    CHECK_STR(c.socket_path, "/run/capuchin/capuchind.sock");
  char err[256];
  CHECK(cap_daemon_config_set(&c, "allow-uid", "1000", err, sizeof err) == 0);
  CHECK(cap_daemon_config_set(&c, "allow-uid", "1000", err, sizeof err) == 0);
  CHECK(cap_daemon_config_set(&c, "allow-uid", "1001", err, sizeof err) == 0);
  CHECK_EQ(c.n_allow_uids, 2);
  CHECK(cap_daemon_config_set(&c, "allow-uid", "x", err, sizeof err) ==
        CAP_EINVAL);
  CHECK(strstr(err, "allow-uid") != NULL);
  CHECK(cap_daemon_config_set(&c, "log-level", "debug", err, sizeof err) == 0);
  CHECK_EQ(c.log_level, CAP_LOG_DEBUG);
  CHECK(cap_daemon_config_set(&c, "max-sessions", "0", err, sizeof err) ==
        CAP_ERANGE);
  CHECK(cap_daemon_config_set(&c, "nonsense", "1", err, sizeof err) ==
        CAP_ENOENT);
  CHECK(cap_daemon_config_set(&c, "gpu-memory", "80G", err, sizeof err) == 0);
  CHECK_EQ(c.gpu_memory_bytes, 80ull << 30);
  /* One device's size. */
  CHECK(cap_daemon_config_set(&c, "gpu-memory", "3:40G", err, sizeof err) == 0);
  CHECK_EQ(c.gpu_memory_dev[3], 40ull << 30);
  CHECK_EQ(c.gpu_memory_bytes, 80ull << 30);
  CHECK(cap_daemon_config_set(&c, "gpu-memory", "64:1G", err, sizeof err) ==
        CAP_ERANGE);
  CHECK(cap_daemon_config_set(&c, "gpu-memory", ":1G", err, sizeof err) ==
        CAP_EINVAL);
  /* Hostile-client bounds. */
  CHECK_EQ(c.handshake_timeout_ms, 10000);
  CHECK(cap_daemon_config_set(&c, "idle-timeout-ms", "5", err, sizeof err) ==
        CAP_ERANGE);
  CHECK_EQ(c.budget_ack_timeout_ms, 30000);
  CHECK(cap_daemon_config_set(&c, "budget-ack-timeout-ms", "250", err,
                              sizeof err) == 0);
  CHECK_EQ(c.budget_ack_timeout_ms, 250);
  CHECK_EQ(c.idle_timeout_ms, 60000); /* the neighbours keep theirs */
  CHECK_EQ(c.handshake_timeout_ms, 10000);
  CHECK(cap_daemon_config_set(&c, "db-mode", "0644", err, sizeof err) ==
        CAP_EINVAL);
  CHECK(cap_daemon_config_set(&c, "db-mode", "0660", err, sizeof err) == 0);
  CHECK_EQ(c.db_mode, 0660);
  CHECK_EQ(c.evict_persistent, CAP_EVICT_PERSISTENT_AUTO);
  CHECK(cap_daemon_config_set(&c, "evict-persistent", "yes", err, sizeof err) == 0);
  CHECK_EQ(c.evict_persistent, CAP_EVICT_PERSISTENT_YES);
  CHECK(cap_daemon_config_set(&c, "evict-persistent", "no", err, sizeof err) == 0);
  CHECK_EQ(c.evict_persistent, CAP_EVICT_PERSISTENT_NO);
  CHECK(cap_daemon_config_set(&c, "evict-persistent", "maybe", err,
                              sizeof err) == CAP_EINVAL);
  CHECK(strstr(err, "auto, yes or no") != NULL);
  CHECK(c.placement);
  CHECK(cap_daemon_config_set(&c, "placement", "off", err, sizeof err) == 0);
  CHECK(!c.placement);
  CHECK(cap_daemon_config_set(&c, "placement", "yes", err, sizeof err) == 0);
  CHECK(c.placement);
  CHECK(cap_daemon_config_set(&c, "placement", "sometimes", err, sizeof err) ==
        CAP_EINVAL);
  CHECK(strstr(err, "yes or no") != NULL);
  CHECK(c.alloc_headroom_pct == 0);
  CHECK(cap_daemon_config_set(&c, "alloc-headroom", "2.5%", err, sizeof err) == 0);
  CHECK(c.alloc_headroom_pct == 2.5);
  CHECK(cap_daemon_config_set(&c, "alloc-headroom", "0", err, sizeof err) == 0);
  CHECK(c.alloc_headroom_pct == 0);
  CHECK(cap_daemon_config_set(&c, "alloc-headroom", "60", err, sizeof err) ==
        CAP_ERANGE);
  CHECK(cap_daemon_config_set(&c, "alloc-headroom", "x%", err, sizeof err) ==
        CAP_ERANGE);
}

static void test_config_file(void) {
  char path[] = "/tmp/capd-conf-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const char *text = "# capuchind\n"
                     "max-sessions = 7   # trailing comment\n"
                     "\n"
                     "allow-gid=44\n"
                     "gpu-memory = 1G\n"
                     "max-tensors = many\n";
  REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  cap_daemon_config_t c;
  cap_daemon_config_init(&c);
  char err[512];
  CHECK(cap_daemon_config_load(&c, path, err, sizeof err) != 0);
  CHECK(strstr(err, ":6: max-tensors") != NULL);
  CHECK_EQ(c.max_sessions, 7);
  CHECK_EQ(c.n_allow_gids, 1);
  CHECK_EQ(c.gpu_memory_bytes, 1ull << 30);
  FILE *f = fopen(path, "w");
  fprintf(f, "no equals sign\n");
  fclose(f);
  CHECK(cap_daemon_config_load(&c, path, err, sizeof err) == CAP_EPARSE);
  CHECK(strstr(err, ":1:") != NULL);
  unlink(path);
  CHECK(cap_daemon_config_load(&c, path, err, sizeof err) == CAP_ENOENT);
}

int main(void) {
  RUN_TEST(test_parse_bytes);
  RUN_TEST(test_defaults_and_set);
  RUN_TEST(test_config_file);
  return TEST_SUMMARY();
}
