/*
 * Two real clients (sim backend) and a real daemon: jobs that report one
 * device UUID share its memory, jobs on two UUIDs do not, and a job whose
 * budget is cut gives the device memory back (its arenas trimmed, its
 * tensors evicted where they must) before the other job is given any:
 * the newcomer is welcomed only after the first job's next iteration
 * boundary, where it trims and confirms.
 */
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/client.h"
#include "client_impl.h" /* cap__dev_held: the device memory a job holds */
#include "testclient.h"

#define MIB (1ull << 20)
#define DEVICE_BYTES (256 * MIB)
#define REQUEST_BYTES (200 * MIB)
#define UUID_ONE "SIM-11111111-1111-4111-8111-111111111111"
#define UUID_TWO "SIM-22222222-2222-4222-8222-222222222222"

/* The job: a 1 MiB weight, then a chain of four 8 MiB activations. */
enum { NT = 5, NOPS = 4 };

static cap_client_t *open_job(const char *sock, const char *name,
                              const char *uuid, uint32_t connect_ms) {
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.socket_path = sock;
  cfg.job_name = name;
  cfg.budget_bytes = REQUEST_BYTES;
  cfg.sim_device_bytes = DEVICE_BYTES;
  cfg.sim_device_uuid = uuid;
  cfg.connect_timeout_ms = connect_ms;
  cap_client_t *c = NULL;
  if (cap_client_create(&cfg, &c) != 0)
    return NULL;
  uint32_t id;
  void *w;
  if (cap_client_register(c, MIB, CAP_KIND_PARAM, &id, &w) != 0) {
    cap_client_destroy(c);
    return NULL;
  }
  return c;
}

static void run_iter(cap_client_t *c) {
  CHECK_EQ(cap_client_iteration_begin(c), 0);
  for (uint32_t t = 1; t < NT; t++) {
    uint32_t id;
    CHECK_EQ(cap_client_declare(c, 8 * MIB, &id), 0);
  }
  for (uint32_t s = 0; s < NOPS; s++) {
    uint32_t in = s, out = s + 1;
    void *pin, *pout;
    CHECK_EQ(cap_client_op_begin(c, "op", &in, 1, &out, 1, &pin, &pout), 0);
    cap_client_compute(c, 200000);
    CHECK_EQ(cap_client_op_end(c), 0);
  }
  for (uint32_t t = 1; t < NT; t++)
    cap_client_free(c, t);
  CHECK_EQ(cap_client_iteration_end(c, NULL), 0);
}

static bool connected(cap_client_t *c) {
  cap_client_stats_t st;
  cap_client_get_stats(c, &st);
  return st.connected;
}

static bool wait_connected(cap_client_t *c, int ms) {
  for (int i = 0; i < ms / 10 && !connected(c); i++)
    usleep(10000);
  return connected(c);
}

static uint64_t budget_of(cap_client_t *c) {
  cap_client_stats_t st;
  cap_client_get_stats(c, &st);
  return st.budget_bytes;
}

static void test_one_uuid_shares_after_the_cut_is_given_back(void) {
  tc_daemon_t d;
  const char *extra[] = {"--budget-ack-timeout-ms", "600000", NULL};
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  /* Every failure below still stops the daemon (its ack timeout is long:
   * left running it would hold the test's output open). */
  cap_client_t *a = open_job(d.sock, "job-a", UUID_ONE, 10000), *b = NULL;
  CHECK(a && connected(a));
  if (!a || !connected(a))
    goto out;
  for (int i = 0; i < 3; i++)
    run_iter(a);
  CHECK_EQ(budget_of(a), REQUEST_BYTES); /* alone on the device */
  uint64_t held_before = cap__dev_held(a->dev);
  CHECK(held_before > REQUEST_BYTES / 2); /* the budget's arena, taken */

  /* b arrives on the same device; a, idle, has not given anything back. */
  b = open_job(d.sock, "job-b", UUID_ONE, 0);
  CHECK(b != NULL);
  if (!b)
    goto out;
  usleep(500000);
  CHECK(!connected(b));

  /* a's next iteration boundaries put its cut in force. */
  uint64_t share_a = REQUEST_BYTES;
  for (int i = 0; i < 200 && share_a == REQUEST_BYTES; i++) {
    CHECK(!connected(b)); /* not before a's cut is in force */
    usleep(10000);
    CHECK_EQ(cap_client_iteration_begin(a), 0);
    share_a = budget_of(a);
    if (share_a == REQUEST_BYTES)
      CHECK_EQ(cap_client_iteration_end(a, NULL), 0);
  }
  uint64_t held_after = cap__dev_held(a->dev);
  printf("a: budget %llu -> %llu, device bytes held %llu -> %llu\n",
         (unsigned long long)REQUEST_BYTES, (unsigned long long)share_a,
         (unsigned long long)held_before, (unsigned long long)held_after);
  CHECK(share_a < REQUEST_BYTES);
  CHECK(held_after <= share_a);
  CHECK_EQ(cap_client_iteration_end(a, NULL), 0);

  /* Only now b is welcomed, with the rest of the device. */
  bool b_in = wait_connected(b, 10000);
  CHECK(b_in);
  if (!b_in)
    goto out;
  run_iter(b);
  uint64_t share_b = budget_of(b);
  printf("b: welcomed with %llu\n", (unsigned long long)share_b);
  CHECK(share_b < REQUEST_BYTES);
  CHECK(share_a + share_b <= DEVICE_BYTES);
  CHECK(cap__dev_held(b->dev) <= share_b);
  run_iter(a); /* a goes on under its share */
  CHECK(cap__dev_held(a->dev) <= share_a);
  CHECK(tc_daemon_log_contains(&d, "confirmed"));
out:
  cap_client_destroy(b);
  cap_client_destroy(a);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

static void test_two_uuids_do_not_share(void) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, NULL) == 0);
  cap_client_t *a = open_job(d.sock, "job-a", UUID_ONE, 10000);
  REQUIRE(a);
  run_iter(a);
  cap_client_t *b = open_job(d.sock, "job-b", UUID_TWO, 10000);
  REQUIRE(b);
  CHECK(connected(b)); /* welcomed at once: nobody has to give way */
  run_iter(b);
  run_iter(a);
  CHECK_EQ(budget_of(a), REQUEST_BYTES);
  CHECK_EQ(budget_of(b), REQUEST_BYTES);
  cap_client_destroy(b);
  cap_client_destroy(a);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

int main(void) {
  RUN_TEST(test_one_uuid_shares_after_the_cut_is_given_back);
  RUN_TEST(test_two_uuids_do_not_share);
  return TEST_SUMMARY();
}
