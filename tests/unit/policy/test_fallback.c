/*
 * cap_plan_fall_back: actions the client could not carry out become swaps
 * (a recompute) or go (a release), in a new version that is valid, explicit
 * and simulated; keys naming nothing leave the plan alone.
 */
#include <string.h>

#include "cap_test.h"
#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin/trace.h"

static cap_profile_t *load(void) {
  cap_profile_t *p = NULL;
  char err[256];
  if (cap_trace_load(cap_test_data("traces/resnet50.trace"), &p, err,
                     sizeof err) != 0)
    return NULL;
  return p;
}

static uint32_t find(const cap_plan_t *plan, bool release) {
  for (uint32_t i = 0; i < plan->n_actions; i++)
    if (plan->actions[i].method == CAP_METHOD_RECOMPUTE &&
        cap_action_is_release(&plan->actions[i]) == release)
      return i;
  return CAP_NONE;
}

static void test_fall_back(void) {
  cap_profile_t *p = load();
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, cap_profile_budget_pct(p, 40));
  cap_plan_t *plan = NULL;
  REQUIRE(cap_plan_compute(p, "capuchin", &cfg, &plan) == 0);
  uint32_t rc_i = find(plan, false), rel_i = find(plan, true);
  REQUIRE(rc_i != CAP_NONE && rel_i != CAP_NONE);
  cap_action_key_t keys[3] = {
      {plan->actions[rc_i].tensor, plan->actions[rc_i].evict_after_access},
      {plan->actions[rel_i].tensor, plan->actions[rel_i].evict_after_access},
      {1u << 30, 1}, /* an older version's action: ignored */
  };
  uint32_t n_before = plan->n_actions;

  CHECK_EQ(cap_plan_fall_back(plan, p, keys, 3, &cfg), 0);
  CHECK_EQ(plan->version, 2);
  CHECK_EQ(plan->n_actions, n_before - 1); /* the release went */
  bool swapped = false, released = false;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->tensor == keys[0].tensor &&
        a->evict_after_access == keys[0].evict_after_access)
      swapped = a->method == CAP_METHOD_SWAP && a->n_recompute == 0;
    if (a->tensor == keys[1].tensor &&
        a->evict_after_access == keys[1].evict_after_access)
      released = true;
  }
  CHECK(swapped);
  CHECK(!released);
  char err[512];
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  CHECK(plan->predicted_iter_ns > 0);
  CHECK(plan->predicted_peak_bytes > 0);

  /* Again with the same keys: they name no recompute or release any more,
   * only the swap, which goes too (the tensor stays). */
  CHECK_EQ(cap_plan_fall_back(plan, p, keys, 1, &cfg), 0);
  CHECK_EQ(plan->version, 3);
  CHECK_EQ(plan->n_actions, n_before - 2);

  /* Nothing to do: the version stays. */
  CHECK_EQ(cap_plan_fall_back(plan, p, keys + 2, 1, &cfg), 0);
  CHECK_EQ(plan->version, 3);
  CHECK_EQ(cap_plan_fall_back(NULL, p, keys, 1, &cfg), CAP_EINVAL);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_fall_back);
  return TEST_SUMMARY();
}
