/*
 * cap_plan_refine: a measured prefetch stall moves that swap's in-trigger to
 * an access of another tensor at least stall + feedback step earlier, bumps
 * the version, and leaves everything else alone; a move that would take the
 * simulated plan over its budget is not made (alone or among others), and a
 * refinement that moves nothing leaves the version as it was;
 * feedback naming no swap of the plan is refused without touching the plan.
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

/* The refinement moved nothing: still version 1, with before's trigger. */
static void check_trigger_kept(const cap_plan_t *plan,
                               const cap_action_t *before) {
  CHECK_EQ(plan->version, 1);
  CHECK_EQ(plan->actions[0].prefetch_tensor, before->prefetch_tensor);
  CHECK_EQ(plan->actions[0].prefetch_access, before->prefetch_access);
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
   * trigger is the op right after the evicted-access (with room for it:
   * A back during the middle stretch needs more than 120 MB) */
  cap_feedback_t fb = {a->tensor, a->evict_after_access + 1, 1000000 * US};
  cfg.budget_bytes = 1000 * MB;
  CHECK_EQ(cap_plan_refine(plan, p, &fb, 1, &cfg), 0);
  uint32_t evict_op = cap_profile_access_op(p, a->tensor, a->evict_after_access);
  CHECK_EQ(trigger_op(p, &plan->actions[0]), evict_op + 1);
  char err[256];
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_move_over_budget_refused(void) {
  cap_profile_t *p;
  cap_plan_config_t cfg;
  cap_plan_t *plan = hidden_swap_plan(&p, &cfg);
  REQUIRE(plan);
  cap_action_t before = plan->actions[0];
  int64_t pred_iter = plan->predicted_iter_ns;
  uint64_t pred_peak = plan->predicted_peak_bytes;
  /* The same huge stall under the plan's own 120 MB: bringing A back
   * during B's stretch would need 182 MB, so the trigger stays. */
  cap_feedback_t fb = {before.tensor, before.evict_after_access + 1,
                       1000000 * US};
  CHECK_EQ(cap_plan_refine(plan, p, &fb, 1, &cfg), 0);
  check_trigger_kept(plan, &before); /* nothing moved: the same plan */
  CHECK_EQ(plan->predicted_iter_ns, pred_iter);
  CHECK_EQ(plan->predicted_peak_bytes, pred_peak);
  cap_sim_result_t r;
  memset(&r, 0, sizeof r);
  CHECK_EQ(cap_sim_run(p, plan, &cfg.bw, &r), 0);
  CHECK(r.peak_bytes <= cfg.budget_bytes);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* A and C (100 MB each) written first, then a 6 ms stretch, then B (150 MB)
 * read for 6 ms and freed, then an 8 ms stretch, then A and C read together.
 * Under 220 MB both must be out while B lives; both fit back after it. */
static cap_profile_t *two_around_b(uint32_t *after_b) {
  fx_t f = {cap_profile_create(), 0, 0};
  enum { W, A, C, B, T0 };
  const uint32_t n_pre = 6, n_mid = 6, n_post = 8;
  fx_tensor(&f, W, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, A, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, C, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, B, 150 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = 0; i <= n_pre + n_mid + n_post; i++)
    fx_tensor(&f, T0 + i, 1 * MB, CAP_KIND_ACTIVATION);
  uint32_t w = W, a = A, c = C, b = B, tmp = T0;
  int64_t t = 0;
  fx_op(&f, t, t + 10 * US, "aten.mm.default", &w, 1, &a, 1);
  t += 10 * US;
  fx_op(&f, t, t + 10 * US, "aten.mm.default", &w, 1, &c, 1);
  t += 10 * US;
  for (uint32_t i = 0; i < n_pre + n_mid + n_post; i++) {
    if (i == n_pre) {
      fx_op(&f, t, t + 10 * US, "aten.mm.default", &w, 1, &b, 1);
      t += 10 * US;
    }
    bool reads_b = i >= n_pre && i < n_pre + n_mid;
    fx_op(&f, t, t + 1000 * US, "aten.mul.Tensor", reads_b ? &b : &w, 1, &tmp,
          1);
    t += 1000 * US;
    fx_free(&f, t, tmp++);
    if (i + 1 == n_pre + n_mid) {
      fx_free(&f, t, B);
      *after_b = f.seq; /* first op of the post stretch */
    }
  }
  uint32_t in[3] = {A, C, W};
  fx_op(&f, t, t + 10 * US, "aten.add.Tensor", in, 3, &tmp, 1);
  t += 10 * US;
  fx_free(&f, t, A);
  fx_free(&f, t, C);
  fx_free(&f, t, tmp);
  return fx_finish(&f);
}

static void test_each_move_checked_alone(void) {
  uint32_t post = 0;
  cap_profile_t *p = two_around_b(&post);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 220 * MB);
  const uint32_t last = p->n_ops - 1;
  /* Both swapped out after their first access, prefetched at the temporary
   * of op last-3 (A) and op last-1 (C), in the post stretch. The trigger
   * names access 1 of the op's temporary, which is its only output. */
  cap_plan_t *plan = cap_plan_create("capuchin", cfg.budget_bytes);
  REQUIRE(plan);
  uint32_t ta = cap_op_outputs(p, &p->ops[last - 3])[0];
  uint32_t tc = cap_op_outputs(p, &p->ops[last - 1])[0];
  REQUIRE(cap_plan_add_swap(plan, 1 /* A */, 1, ta, 1, 0) == 0);
  REQUIRE(cap_plan_add_swap(plan, 2 /* C */, 1, tc, 1, 0) == 0);
  char err[256];
  REQUIRE(cap_plan_validate(plan, p, err, sizeof err) == 0);
  cap_sim_result_t r;
  memset(&r, 0, sizeof r);
  REQUIRE(cap_sim_run(p, plan, &cfg.bw, &r) == 0);
  REQUIRE(r.peak_bytes <= cfg.budget_bytes);
  cap_sim_result_close(&r);
  /* A late by 2 ms: its trigger moves within the post stretch and fits.
   * C late by far more than the iteration: only a trigger before B's
   * stretch would do, which goes over 220 MB. Together they do not fit;
   * alone, A's does and C's does not. */
  cap_feedback_t fb[2] = {{1, 2, 2000 * US}, {2, 2, 1000000 * US}};
  CHECK_EQ(cap_plan_refine(plan, p, fb, 2, &cfg), 0);
  CHECK_EQ(plan->version, 2);
  uint32_t a_trig = trigger_op(p, &plan->actions[0]);
  CHECK(a_trig < last - 3);
  CHECK(a_trig >= post);
  CHECK_EQ(plan->actions[1].prefetch_tensor, tc);
  CHECK_EQ(plan->actions[1].prefetch_access, 1);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  memset(&r, 0, sizeof r);
  CHECK_EQ(cap_sim_run(p, plan, &cfg.bw, &r), 0);
  CHECK(r.peak_bytes <= cfg.budget_bytes);
  /* the plan's predictions are the refined plan's */
  CHECK_EQ(plan->predicted_peak_bytes, r.peak_bytes);
  CHECK_EQ(plan->predicted_iter_ns, r.iter_ns);
  cap_sim_result_close(&r);
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
  check_trigger_kept(plan, &before);
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
  check_trigger_kept(plan, &before);
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
  CHECK_EQ(plan->version, 1);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_moves_trigger_earlier);
  RUN_TEST(test_clamps_after_evicted_access);
  RUN_TEST(test_move_over_budget_refused);
  RUN_TEST(test_each_move_checked_alone);
  RUN_TEST(test_zero_stall_keeps_trigger);
  RUN_TEST(test_unknown_feedback_refused);
  return TEST_SUMMARY();
}
