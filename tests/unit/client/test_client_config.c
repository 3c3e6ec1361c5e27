/*
 * Client configuration: where the socket is looked for, which configs are
 * refused, and that a client with no daemon anywhere starts (passive) at
 * once and works.
 */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/client.h"

static void test_socket_path(void) {
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  char buf[256];
  cfg.socket_path = "/tmp/x.sock";
  setenv("CAPUCHIN_SOCKET", "/tmp/env.sock", 1);
  CHECK_EQ(cap_client_socket_path(&cfg, buf, sizeof buf), 0);
  CHECK_STR(buf, "/tmp/x.sock");
  cfg.socket_path = NULL;
  CHECK_EQ(cap_client_socket_path(&cfg, buf, sizeof buf), 0);
  CHECK_STR(buf, "/tmp/env.sock");
  unsetenv("CAPUCHIN_SOCKET");
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  CHECK_EQ(cap_client_socket_path(&cfg, buf, sizeof buf), 0);
  if (geteuid() == 0)
    CHECK_STR(buf, "/run/capuchin/capuchind.sock");
  else
    CHECK_STR(buf, "/run/user/4242/capuchin/capuchind.sock");
  CHECK_EQ(cap_client_socket_path(&cfg, buf, 8), CAP_ERANGE);
}

static void test_bad_configs(void) {
  cap_client_config_t cfg;
  cap_client_t *c = NULL;
  cap_client_config_init(&cfg);
  cfg.ring_records = 1000; /* not a power of two */
  CHECK_EQ(cap_client_create(&cfg, &c), CAP_EINVAL);
  cap_client_config_init(&cfg);
  cfg.backend = "tpu";
  CHECK_EQ(cap_client_create(&cfg, &c), CAP_EINVAL);
  cap_client_config_init(&cfg);
  cfg.time_scale = NAN;
  CHECK_EQ(cap_client_create(&cfg, &c), CAP_EINVAL);
  CHECK_EQ(cap_client_create(&cfg, NULL), CAP_EINVAL);
  CHECK(c == NULL);
  CHECK_STR(cap_client_mode_name(CAP_MODE_GUIDED), "guided");
}

static void test_no_daemon_anywhere(void) {
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.socket_path = "/nonexistent/capuchind.sock";
  cfg.connect_timeout_ms = 300;
  cfg.budget_bytes = 1 << 20;
  cap_client_t *c = NULL;
  REQUIRE(cap_client_create(&cfg, &c) == 0);
  cap_client_stats_t st;
  cap_client_get_stats(c, &st);
  CHECK(!st.connected);
  CHECK_STR(st.backend, "sim");
  CHECK_EQ(st.budget_bytes, 1 << 20);
  CHECK(st.h2d_gbps > 0);
  uint32_t a, b;
  void *pa, *pb;
  CHECK_EQ(cap_client_iteration_begin(c), 0);
  CHECK_EQ(cap_client_alloc(c, 600 << 10, &a, &pa), 0);
  /* The second does not fit next to the first: a is swapped out (LRU). */
  CHECK_EQ(cap_client_alloc(c, 600 << 10, &b, &pb), 0);
  CHECK(cap_client_tensor_ptr(c, a) == NULL);
  void *in[1];
  CHECK_EQ(cap_client_op_begin(c, "aten.read", &a, 1, NULL, 0, in, NULL), 0);
  CHECK(in[0] != NULL); /* back on the device, b swapped out instead */
  CHECK_EQ(cap_client_op_end(c), 0);
  cap_iter_stats_t it;
  CHECK_EQ(cap_client_iteration_end(c, &it), 0);
  CHECK_EQ(it.mode, CAP_MODE_PASSIVE);
  CHECK(it.peak_bytes <= 1 << 20);
  CHECK_EQ(it.evictions, 2);
  CHECK_EQ(it.bytes_in, 600 << 10);
  /* Far too big for the budget: an error, not a crash. */
  CHECK_EQ(cap_client_iteration_begin(c), 0);
  uint32_t big;
  CHECK_EQ(cap_client_alloc(c, 4 << 20, &big, NULL), CAP_EBUDGET);
  CHECK(cap_client_last_error(c)[0] != '\0');
  CHECK_EQ(cap_client_iteration_end(c, NULL), 0);
  cap_client_destroy(c);
}

int main(void) {
  RUN_TEST(test_socket_path);
  RUN_TEST(test_bad_configs);
  RUN_TEST(test_no_daemon_anywhere);
  return TEST_SUMMARY();
}
