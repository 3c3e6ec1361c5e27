/*
 * Shared GPU budgets (issue 4, item 6): two jobs on one device whose
 * requests add up to more than it has get shares that add up to at most it
 * (never below their persistent bytes), each with a plan for its share; when
 * one leaves, the other gets its full budget back with a new plan. Both the
 * device total from Hello and --gpu-memory set the capacity.
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
  CHECK_EQ(tc_daemon_stop(&d), 0);
  if (!cap_test_failed_checks)
    tc_daemon_cleanup(&d);
  else
    fprintf(stderr, "log: %s\n", d.log);
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

int main(void) {
  char err[256];
  if (cap_trace_load(cap_test_data("traces/resnet50.trace"), &P, err,
                     sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  RUN_TEST(test_shares_from_hello_device_total);
  RUN_TEST(test_shares_from_gpu_memory_option);
  cap_profile_destroy(P);
  return TEST_SUMMARY();
}
