/*
 * Shared GPU budgets: two jobs on one device whose requests add up to more
 * than it has get shares that add up to at most it (never below their
 * persistent bytes), each with a plan for its share; when one leaves, the
 * other gets its full budget back with a new plan. Both the device total
 * from Hello and --gpu-memory set the capacity. Jobs are on one device when
 * they report one UUID; a job whose budget is cut holds the others back
 * until it confirms (BudgetAck) or budget-ack-timeout-ms passes.
 */
#include "cap_test.h"
#include "capuchin/trace.h"
#include "testclient.h"

static cap_profile_t *P;

/* Wait for a Plan or BudgetUpdate; returns the budget it carries (0 none). */
static uint64_t wait_budget(tc_t *c, cap_plan_t **plan_out, int timeout_ms) {
  uint64_t deadline = tc_now_ms() + (uint64_t)timeout_ms;
  while (tc_now_ms() < deadline) {
    Capuchin__Envelope *env = tc_recv(c, 200);
    if (!env) {
      if (c->eof)
        return 0;
      continue;
    }
    uint64_t b = 0;
    if (env->msg_case == CAPUCHIN__ENVELOPE__MSG_PLAN) {
      b = env->plan->budget_bytes;
      if (plan_out)
        cap_proto_plan_from_msg(env->plan, NULL, plan_out, NULL, 0);
    } else if (env->msg_case == CAPUCHIN__ENVELOPE__MSG_BUDGET_UPDATE) {
      b = env->budget_update->budget_bytes;
    }
    tc_release(c, env);
    if (b)
      return b;
  }
  return 0;
}

static void run_shares(const char *const *extra, uint64_t hello_total,
                       uint64_t capacity) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  uint64_t req = cap_profile_budget_pct(P, 100);
  tc_t a, b;
  REQUIRE(tc_connect(&a, d.sock) == 0);
  tc_hello_args_t ha = {.job = "job-a", .budget_bytes = req,
                        .device_total_bytes = hello_total};
  tc_welcome_t wa, wb;
  REQUIRE(tc_hello(&a, &ha, &wa, 10000) == 0);
  CHECK_EQ(wa.budget_bytes, req); /* alone: all it asked for */
  REQUIRE(tc_send_iteration(&a, P, 1, true, 512) == 0);
  cap_plan_t *pa = NULL;
  CHECK_EQ(wait_budget(&a, &pa, 10000), req);
  cap_plan_destroy(pa);
  pa = NULL;

  /* Job b arrives on the same device: both are cut. */
  REQUIRE(tc_connect(&b, d.sock) == 0);
  tc_hello_args_t hb = {.job = "job-b", .budget_bytes = req,
                        .device_total_bytes = hello_total,
                        .persistent_bytes = P->persistent_bytes};
  REQUIRE(tc_hello(&b, &hb, &wb, 10000) == 0);
  uint64_t share_a = wait_budget(&a, &pa, 10000);
  printf("capacity %llu, requests %llu each: shares %llu + %llu\n",
         (unsigned long long)capacity, (unsigned long long)req,
         (unsigned long long)share_a, (unsigned long long)wb.budget_bytes);
  CHECK(share_a > 0 && share_a < req);
  CHECK(wb.budget_bytes < req);
  CHECK(share_a + wb.budget_bytes <= capacity);
  CHECK(share_a >= P->persistent_bytes);
  CHECK(wb.budget_bytes >= P->persistent_bytes);
  if (pa) {
    CHECK_EQ(pa->budget_bytes, share_a);
    CHECK(pa->predicted_peak_bytes <= share_a);
    CHECK(cap_plan_validate(pa, P, NULL, 0) == 0);
    cap_plan_destroy(pa);
    pa = NULL;
  } else {
    CHECK(!"job a got no plan for its share");
  }
  /* b measures and is planned for its share. */
  REQUIRE(tc_send_iteration(&b, P, 1, true, 512) == 0);
  cap_plan_t *pb = NULL;
  CHECK_EQ(wait_budget(&b, &pb, 10000), wb.budget_bytes);
  if (pb)
    CHECK(pb->predicted_peak_bytes <= wb.budget_bytes);
  cap_plan_destroy(pb);

  /* b leaves: a gets its whole request back. */
  Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
  tc_send_msg(&b, &bye);
  tc_close(&b);
  CHECK_EQ(wait_budget(&a, &pa, 10000), req);
  if (pa)
    CHECK_EQ(pa->budget_bytes, req);
  cap_plan_destroy(pa);
  tc_close(&a);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

static void test_shares_from_hello_device_total(void) {
  uint64_t req = cap_profile_budget_pct(P, 100);
  uint64_t total = 2 * req - 2 * (req - P->persistent_bytes) * 3 / 10;
  run_shares(NULL, total, total);
}

static void test_shares_from_gpu_memory_option(void) {
  uint64_t req = cap_profile_budget_pct(P, 100);
  uint64_t cap = 2 * req - 2 * (req - P->persistent_bytes) * 3 / 10;
  char arg[32];
  snprintf(arg, sizeof arg, "%llu", (unsigned long long)cap);
  const char *extra[] = {"--gpu-memory", arg, NULL};
  run_shares(extra, 80ull << 30, cap);
}

#define UUID_A "GPU-0a0a0a0a-0000-4000-8000-00000000000a"
#define UUID_B "GPU-0b0b0b0b-0000-4000-8000-00000000000b"

/* A device two requests of `req` do not fit in. */
static uint64_t tight_total(uint64_t req) {
  return 2 * req - 2 * (req - P->persistent_bytes) * 3 / 10;
}

/* A job on device `uuid` asking for all it needs, confirming cuts. */
static tc_hello_args_t job_on(const char *job, const char *uuid) {
  uint64_t req = cap_profile_budget_pct(P, 100);
  return (tc_hello_args_t){.job = job, .budget_bytes = req,
                           .device_total_bytes = tight_total(req),
                           .persistent_bytes = P->persistent_bytes,
                           .device_uuid = uuid, .acks_budget = true};
}

static void send_budget_ack(tc_t *c, uint64_t budget, uint64_t held) {
  Capuchin__BudgetAck ba = CAPUCHIN__BUDGET_ACK__INIT;
  ba.has_budget_bytes = ba.has_device_bytes = 1;
  ba.budget_bytes = budget;
  ba.device_bytes = held;
  CHECK_EQ(tc_send_msg(c, &ba), 0);
}

/* Same ordinal, same name, two UUIDs: two devices, nobody is cut. */
static void test_different_uuids_do_not_share(void) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, NULL) == 0);
  uint64_t req = cap_profile_budget_pct(P, 100);
  tc_t a, b;
  tc_welcome_t wa, wb;
  tc_hello_args_t ha = job_on("job-a", UUID_A), hb = job_on("job-b", UUID_B);
  REQUIRE(tc_connect(&a, d.sock) == 0);
  REQUIRE(tc_hello(&a, &ha, &wa, 10000) == 0);
  REQUIRE(tc_connect(&b, d.sock) == 0);
  REQUIRE(tc_hello(&b, &hb, &wb, 10000) == 0);
  CHECK_EQ(wa.budget_bytes, req);
  CHECK_EQ(wb.budget_bytes, req);
  CHECK(wa.wants_budget_ack && wb.wants_budget_ack);
  CHECK_EQ(wait_budget(&a, NULL, 1000), 0); /* a is not cut */
  tc_close(&a);
  tc_close(&b);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

/* One UUID: b's Hello cuts a at once, but b is welcomed (given memory)
 * only when a says it holds no more than its share; an ack over the share
 * does not count. */
static void test_cut_waits_for_confirmation(void) {
  tc_daemon_t d;
  const char *extra[] = {"--budget-ack-timeout-ms", "600000", NULL};
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  uint64_t req = cap_profile_budget_pct(P, 100), total = tight_total(req);
  tc_t a, b;
  tc_welcome_t wa, wb;
  tc_hello_args_t ha = job_on("job-a", UUID_A), hb = job_on("job-b", UUID_A);
  REQUIRE(tc_connect(&a, d.sock) == 0);
  REQUIRE(tc_hello(&a, &ha, &wa, 10000) == 0);
  CHECK_EQ(wa.budget_bytes, req);
  REQUIRE(tc_connect(&b, d.sock) == 0);
  REQUIRE(tc_send_hello(&b, &hb) == 0);
  uint64_t share_a = wait_budget(&a, NULL, 10000);
  CHECK(share_a > 0 && share_a < req);
  CHECK_EQ(tc_wait_welcome(&b, NULL, 500), -1); /* a has not confirmed */
  send_budget_ack(&a, share_a, share_a + (1u << 20));
  CHECK_EQ(tc_wait_welcome(&b, NULL, 500), -1); /* still over its share */
  send_budget_ack(&a, share_a, share_a - 4096);
  REQUIRE(tc_wait_welcome(&b, &wb, 10000) == 0);
  printf("capacity %llu: a cut to %llu, b welcomed with %llu\n",
         (unsigned long long)total, (unsigned long long)share_a,
         (unsigned long long)wb.budget_bytes);
  CHECK(wb.budget_bytes > 0 && wb.budget_bytes < req);
  CHECK(share_a + wb.budget_bytes <= total);
  CHECK(tc_daemon_log_contains(&d, "confirmed"));
  tc_close(&a);
  tc_close(&b);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

/* A job that never confirms holds the others back only until
 * budget-ack-timeout-ms. */
static void test_unconfirmed_cut_times_out(void) {
  tc_daemon_t d;
  const char *extra[] = {"--budget-ack-timeout-ms", "300", NULL};
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  uint64_t req = cap_profile_budget_pct(P, 100);
  tc_t a, b;
  tc_welcome_t wa, wb;
  tc_hello_args_t ha = job_on("job-a", UUID_A), hb = job_on("job-b", UUID_A);
  REQUIRE(tc_connect(&a, d.sock) == 0);
  REQUIRE(tc_hello(&a, &ha, &wa, 10000) == 0);
  REQUIRE(tc_connect(&b, d.sock) == 0);
  REQUIRE(tc_hello(&b, &hb, &wb, 20000) == 0);
  CHECK(wb.budget_bytes < req);
  CHECK(tc_daemon_log_contains(&d, "did not confirm its budget cut"));
  tc_close(&a);
  tc_close(&b);
  CHECK_EQ(tc_daemon_finish(&d, cap_test_failed_checks), 0);
}

int main(void) {
  char err[256];
  if (cap_trace_load(cap_test_data("traces/resnet50.trace"), &P, err,
                     sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  RUN_TEST(test_shares_from_hello_device_total);
  RUN_TEST(test_shares_from_gpu_memory_option);
  RUN_TEST(test_different_uuids_do_not_share);
  RUN_TEST(test_cut_waits_for_confirmation);
  RUN_TEST(test_unconfirmed_cut_times_out);
  cap_profile_destroy(P);
  return TEST_SUMMARY();
}
