/*
 * The local search under the simulator (improve.c) on plans written by
 * hand, where the move that helps is known.
 */
#include <string.h>

#include "../../../policy/src/capuchin_internal.h"
#include "../../../policy/src/planners.h"
#include "cap_test.h"
#include "capuchin/error.h"
#include "fixtures.h"

static void test_late_prefetch_moves_earlier(void) {
  /* one_big: A (100 MB) made at op 0, read again by op 14 (12.02 ms); B
   * (80 MB) lives over ops 4..7. A swapped, its prefetch triggered by op
   * 13 (11.02 ms): the 1.8 ms copy lands 0.8 ms late. Leaving A on the
   * device would put A and B together (182 MB, over the plan's 102 MB
   * peak); triggering at op 12 (10.02 ms) instead lands in time and holds
   * A over op 12 only, no higher than the plan's peak. */
  cap_profile_t *p = one_big(3, 3, 6, 1000 * US, 10 * US);
  REQUIRE(p);
  REQUIRE(p->n_ops == 15);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 200 * MB);
  cap_sim_result_t base;
  REQUIRE(cap_sim_run(p, NULL, &cfg.bw, &base) == 0);
  cap_plan_t *plan = cap_plan_create("capuchin", cfg.budget_bytes);
  REQUIRE(plan);
  uint32_t tt, ta;
  REQUIRE(cap__trigger_name(p, 13, 1, &tt, &ta));
  REQUIRE(cap_plan_add_swap(plan, 1, 1, tt, ta, 0) == 0);
  REQUIRE(cap__plan_predict(plan, p, &cfg.bw) == 0);
  int64_t late = plan->predicted_iter_ns - base.iter_ns;
  CHECK(late > 700 * US && late < 900 * US);
  uint64_t peak = plan->predicted_peak_bytes;
  CHECK_EQ(peak, 102 * MB);
  REQUIRE(cap__plan_improve(plan, p, &cfg, 64) == 0);
  REQUIRE(plan->n_actions == 1);
  const cap_action_t *a = &plan->actions[0];
  CHECK_EQ(a->method, CAP_METHOD_SWAP);
  CHECK_EQ(cap_profile_access_op(p, a->prefetch_tensor, a->prefetch_access),
           12);
  CHECK_EQ(plan->predicted_iter_ns, base.iter_ns);
  CHECK_EQ(plan->predicted_peak_bytes, peak);
  CHECK_EQ(cap_plan_validate(plan, p, NULL, 0), 0);
  cap_sim_result_close(&base);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_late_prefetch_moves_earlier);
  return TEST_SUMMARY();
}
