/*
 * Shared budgets must not trust what one client says.
 * (a) With gpu-memory unset the device's capacity was the smallest total any
 * session declared, so a client claiming a 1 MiB device cut a co-located
 * job's budget to its floor. Now a claim far from the others is logged and
 * ignored (and one far above them cannot undo a cut either).
 * (b) After a budget cut, feedback still refined the old plan and pushed it
 * at the old budget. Every plan a session gets after a cut fits the cut.
 */
#include "cap_test.h"
#include "capuchin/trace.h"
#include "testclient.h"

static cap_profile_t *P;

/* Budgets of the Plans and BudgetUpdates that arrive within timeout_ms:
 * the smallest and largest (0 when none), and the last Plan. */
typedef struct seen {
  uint64_t min, max;
  uint32_t n_plans, n_updates;
  cap_plan_t *plan;
} seen_t;

static void watch(tc_t *c, int timeout_ms, seen_t *s) {
  uint64_t deadline = tc_now_ms() + (uint64_t)timeout_ms;
  while (tc_now_ms() < deadline) {
    Capuchin__Envelope *env = tc_recv(c, 100);
    if (!env) {
      if (c->eof)
        return;
      continue;
    }
    uint64_t b = 0;
    if (env->msg_case == CAPUCHIN__ENVELOPE__MSG_PLAN) {
      b = env->plan->budget_bytes;
      s->n_plans++;
      cap_plan_destroy(s->plan);
      s->plan = NULL;
      cap_proto_plan_from_msg(env->plan, NULL, &s->plan, NULL, 0);
    } else if (env->msg_case == CAPUCHIN__ENVELOPE__MSG_BUDGET_UPDATE) {
      b = env->budget_update->budget_bytes;
      s->n_updates++;
    }
    tc_release(c, env);
    if (b && (!s->min || b < s->min))
      s->min = b;
    if (b > s->max)
      s->max = b;
  }
}

static void finish(tc_daemon_t *d) {
  CHECK_EQ(tc_daemon_finish(d, cap_test_failed_checks), 0);
}

static void test_claims_far_from_the_others_are_ignored(void) {
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, NULL) == 0);
  uint64_t req = cap_profile_budget_pct(P, 100);
  tc_t a, h;
  tc_welcome_t w;
  tc_hello_args_t ha = {.job = "honest", .budget_bytes = req,
                        .device_total_bytes = 80ull << 30,
                        .persistent_bytes = P->persistent_bytes};
  REQUIRE(tc_connect(&a, d.sock) == 0);
  REQUIRE(tc_hello(&a, &ha, &w, 20000) == 0);
  CHECK_EQ(w.budget_bytes, req);
  REQUIRE(tc_send_iteration(&a, P, 1, true, 512) == 0);
  seen_t sa = {0};
  watch(&a, 3000, &sa);
  CHECK_EQ(sa.min, req); /* its plan, at its budget */

  /* An authorised client claims the same device has 1 MiB. */
  tc_hello_args_t hh = {.job = "liar", .budget_bytes = 1u << 20,
                        .device_total_bytes = 1u << 20};
  REQUIRE(tc_connect(&h, d.sock) == 0);
  REQUIRE(tc_hello(&h, &hh, &w, 20000) == 0);
  seen_t s2 = {0};
  watch(&a, 2000, &s2);
  printf("honest job: budget %llu; after the 1 MiB claim: %u plans, %u "
         "budget updates (smallest %llu)\n",
         (unsigned long long)req, s2.n_plans, s2.n_updates,
         (unsigned long long)s2.min);
  CHECK_EQ(s2.n_plans + s2.n_updates, 0); /* its budget did not move */
  CHECK(tc_daemon_log_contains(&d, "claim ignored"));
  tc_close(&h);
  cap_plan_destroy(sa.plan);
  cap_plan_destroy(s2.plan);

  /* Two honest jobs whose requests do not fit are cut; a third claiming a
   * huge device does not undo the cut. */
  tc_t b, big;
  uint64_t total = req + req / 2;
  tc_close(&a);
  usleep(300 * 1000);
  ha.device_total_bytes = total;
  ha.job = "honest-1";
  REQUIRE(tc_connect(&a, d.sock) == 0);
  REQUIRE(tc_hello(&a, &ha, &w, 20000) == 0);
  ha.job = "honest-2";
  REQUIRE(tc_connect(&b, d.sock) == 0);
  REQUIRE(tc_hello(&b, &ha, &w, 20000) == 0);
  uint64_t share_b = w.budget_bytes;
  CHECK(share_b < req);
  tc_hello_args_t hb = {.job = "boaster", .budget_bytes = 1u << 20,
                        .device_total_bytes = 1ull << 50};
  REQUIRE(tc_connect(&big, d.sock) == 0);
  REQUIRE(tc_hello(&big, &hb, &w, 20000) == 0);
  seen_t s3 = {0};
  watch(&b, 2000, &s3);
  CHECK(s3.max <= share_b); /* nothing above its share */
  tc_close(&big);
  tc_close(&b);
  tc_close(&a);
  cap_plan_destroy(s3.plan);
  finish(&d);
}

static void test_plans_after_a_cut_fit_the_cut(void) {
  uint64_t budget = cap_profile_budget_pct(P, 50);
  char arg[32];
  snprintf(arg, sizeof arg, "%llu", (unsigned long long)budget);
  const char *extra[] = {"--gpu-memory", arg, NULL};
  tc_daemon_t d;
  REQUIRE(tc_daemon_start(&d, NULL, extra) == 0);
  tc_t a, b;
  tc_welcome_t w;
  tc_hello_args_t ha = {.job = "cut", .budget_bytes = budget,
                        .persistent_bytes = P->persistent_bytes};
  REQUIRE(tc_connect(&a, d.sock) == 0);
  REQUIRE(tc_hello(&a, &ha, &w, 20000) == 0);
  REQUIRE(tc_send_iteration(&a, P, 1, true, 512) == 0);
  cap_plan_t *v1 = tc_wait_plan(&a, TC_PLAN_WAIT_MS);
  REQUIRE(v1 != NULL);
  CHECK_EQ(v1->budget_bytes, budget);

  /* A second job whose floor leaves the first one too little for any
   * plan: its budget is cut and no plan fits. */
  tc_hello_args_t hb = {.job = "big-floor", .budget_bytes = budget,
                        .persistent_bytes =
                            budget - P->persistent_bytes - (1u << 20)};
  REQUIRE(tc_connect(&b, d.sock) == 0);
  REQUIRE(tc_hello(&b, &hb, &w, 20000) == 0);
  seen_t s = {0};
  watch(&a, 3000, &s);
  uint64_t cut = s.min;
  printf("budget %llu cut to %llu (%u plans, %u budget updates)\n",
         (unsigned long long)budget, (unsigned long long)cut, s.n_plans,
         s.n_updates);
  CHECK(cut > 0 && cut < budget);

  /* Feedback on v1, which is still what the client runs. */
  uint32_t ai = CAP_NONE;
  for (uint32_t i = 0; i < v1->n_actions && ai == CAP_NONE; i++)
    if (v1->actions[i].method == CAP_METHOD_SWAP &&
        v1->actions[i].prefetch_tensor != CAP_NONE)
      ai = i;
  REQUIRE(ai != CAP_NONE);
  cap_feedback_t fb = {.tensor = v1->actions[ai].tensor,
                       .back_access = v1->actions[ai].evict_after_access + 1,
                       .stall_ns = 2000000};
  for (uint32_t it = 2; it <= 3; it++) {
    REQUIRE(tc_send_iteration_end(&a, it, P->iter_ns + 2000000, false, false,
                                  1, 2000000) == 0);
    Capuchin__Feedback *fm = NULL;
    REQUIRE(cap_proto_feedback_to_msg(1, it, &fb, 1, &fm) == 0);
    REQUIRE(tc_send_msg(&a, fm) == 0);
    cap_proto_msg_free(fm);
  }
  seen_t s2 = {0};
  watch(&a, 3000, &s2);
  printf("after feedback on v1: %u plans, budgets %llu..%llu\n", s2.n_plans,
         (unsigned long long)s2.min, (unsigned long long)s2.max);
  CHECK(s2.max <= cut); /* no plan for the old budget */

  /* The other job leaves: the whole budget and a plan for it come back. */
  tc_close(&b);
  seen_t s3 = {0};
  watch(&a, 5000, &s3);
  CHECK_EQ(s3.max, budget);
  if (s3.plan)
    CHECK_EQ(s3.plan->budget_bytes, budget);
  tc_close(&a);
  cap_plan_destroy(v1);
  cap_plan_destroy(s.plan);
  cap_plan_destroy(s2.plan);
  cap_plan_destroy(s3.plan);
  finish(&d);
}

int main(void) {
  char err[256];
  if (cap_trace_load(cap_test_data("traces/resnet50.trace"), &P, err,
                     sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  RUN_TEST(test_claims_far_from_the_others_are_ignored);
  RUN_TEST(test_plans_after_a_cut_fit_the_cut);
  cap_profile_destroy(P);
  return TEST_SUMMARY();
}
