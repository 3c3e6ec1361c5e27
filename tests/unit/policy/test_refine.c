/*
 * cap_plan_refine: a measured prefetch stall moves that swap's in-trigger to
 * an access of another tensor at least stall + feedback step earlier, bumps
 * the version, and leaves everything else alone; feedback naming no swap of
 * the plan is refused without touching the plan.
 */
#include <string.h>

#include "cap_test.h"
#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "fixtures.h"

static cap_plan_t *hidden_swap_plan(cap_profile_t **pp, cap_plan_config_t *cfg) {
  *pp = one_big(5, 5, 5, 1000 * US, 10 * US);
  if (!*pp)
    return NULL;
  cap_plan_config_init(cfg, 120 * MB);
  cap_plan_t *plan = NULL;
  if (cap_plan_compute(*pp, "capuchin", cfg, &plan) != 0 || !plan ||
      plan->n_actions != 1 || plan->actions[0].method != CAP_METHOD_SWAP ||
      plan->actions[0].prefetch_tensor == CAP_NONE) {
    cap_plan_destroy(plan);
    return NULL;
  }
  return plan;
}

static uint32_t trigger_op(const cap_profile_t *p, const cap_action_t *a) {
  return cap_profile_access_op(p, a->prefetch_tensor, a->prefetch_access);
}

static void test_moves_trigger_earlier(void) {
  cap_profile_t *p;
  cap_plan_config_t cfg;
  cap_plan_t *plan = hidden_swap_plan(&p, &cfg);
  REQUIRE(plan);
  const cap_action_t *a = &plan->actions[0];
  uint32_t before = trigger_op(p, a);
  int64_t t_before = p->ops[before].start_ns;
  cap_feedback_t fb = {a->tensor, a->evict_after_access + 1, 1500 * US};
  CHECK_EQ(cap_plan_refine(plan, p, &fb, 1, &cfg), 0);
  CHECK_EQ(plan->version, 2);
  uint32_t after = trigger_op(p, &plan->actions[0]);
  CHECK(after != CAP_NONE);
  CHECK(after < before);
  CHECK(p->ops[after].start_ns <= t_before - 1500 * US - cfg.feedback_step_ns);
  CHECK(plan->actions[0].prefetch_tensor != plan->actions[0].tensor);
  /* still a valid plan, still within the budget in the simulator */
  char err[256];
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_sim_result_t r;
  memset(&r, 0, sizeof r);
  CHECK_EQ(cap_sim_run(p, plan, &cfg.bw, &r), 0);
  CHECK(r.peak_bytes <= cfg.budget_bytes);
  CHECK_EQ(r.stall_ns, 0);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_clamps_after_evicted_access(void) {
  cap_profile_t *p;
  cap_plan_config_t cfg;
  cap_plan_t *plan = hidden_swap_plan(&p, &cfg);
  REQUIRE(plan);
  const cap_action_t *a = &plan->actions[0];
  /* a stall longer than the whole iteration: the earliest possible
   * trigger is the op right after the evicted-access */
  cap_feedback_t fb = {a->tensor, a->evict_after_access + 1, 1000000 * US};
  CHECK_EQ(cap_plan_refine(plan, p, &fb, 1, &cfg), 0);
  uint32_t evict_op = cap_profile_access_op(p, a->tensor, a->evict_after_access);
  CHECK_EQ(trigger_op(p, &plan->actions[0]), evict_op + 1);
  char err[256];
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_zero_stall_keeps_trigger(void) {
  cap_profile_t *p;
  cap_plan_config_t cfg;
  cap_plan_t *plan = hidden_swap_plan(&p, &cfg);
  REQUIRE(plan);
  cap_action_t before = plan->actions[0];
  cap_feedback_t fb = {before.tensor, before.evict_after_access + 1, 0};
  CHECK_EQ(cap_plan_refine(plan, p, &fb, 1, &cfg), 0);
  CHECK_EQ(plan->version, 2);
  CHECK_EQ(plan->actions[0].prefetch_tensor, before.prefetch_tensor);
  CHECK_EQ(plan->actions[0].prefetch_access, before.prefetch_access);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_unknown_feedback_refused(void) {
  cap_profile_t *p;
  cap_plan_config_t cfg;
  cap_plan_t *plan = hidden_swap_plan(&p, &cfg);
  REQUIRE(plan);
  cap_action_t before = plan->actions[0];
  cap_feedback_t fb[2] = {{before.tensor, before.evict_after_access + 1, 500 * US},
                          {2 /* B: not swapped */, 2, 500 * US}};
  CHECK_EQ(cap_plan_refine(plan, p, fb, 2, &cfg), CAP_EINVAL);
  /* nothing applied, not even the valid first entry */
  CHECK_EQ(plan->version, 1);
  CHECK_EQ(plan->actions[0].prefetch_access, before.prefetch_access);
  cap_feedback_t wrong_access = {before.tensor, before.evict_after_access, 500 * US};
  CHECK_EQ(cap_plan_refine(plan, p, &wrong_access, 1, &cfg), CAP_EINVAL);
  cap_feedback_t bad_id = {9999, 2, 500 * US};
  CHECK_EQ(cap_plan_refine(plan, p, &bad_id, 1, &cfg), CAP_EINVAL);
  cap_feedback_t negative = {before.tensor, before.evict_after_access + 1, -1};
  CHECK_EQ(cap_plan_refine(plan, p, &negative, 1, &cfg), CAP_EINVAL);
  CHECK_EQ(cap_plan_refine(NULL, p, &negative, 1, &cfg), CAP_EINVAL);
  CHECK_EQ(cap_plan_refine(plan, p, NULL, 1, &cfg), CAP_EINVAL);
  CHECK_EQ(plan->version, 1);
  /* no feedback at all is a refinement that changes nothing */
  CHECK_EQ(cap_plan_refine(plan, p, NULL, 0, &cfg), 0);
  CHECK_EQ(plan->version, 2);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_moves_trigger_earlier);
  RUN_TEST(test_clamps_after_evicted_access);
  RUN_TEST(test_zero_stall_keeps_trigger);
  RUN_TEST(test_unknown_feedback_refused);
  return TEST_SUMMARY();
}
