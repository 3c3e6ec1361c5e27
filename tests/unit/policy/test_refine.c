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

#define MB (1000u * 1000u)
#define US 1000

/* Profile builder shorthand. */
typedef struct {
  cap_profile_t *p;
  uint32_t seq;
  int err;
} fx_t;

static void fx_tensor(fx_t *f, uint32_t id, uint64_t bytes, cap_tensor_kind_t k) {
  if (!f->err)
    f->err = cap_profile_add_tensor(f->p, id, bytes, k);
}

static void fx_op(fx_t *f, int64_t start, int64_t end, const char *name,
                  const uint32_t *in, uint32_t n_in, const uint32_t *out,
                  uint32_t n_out) {
  if (!f->err)
    f->err = cap_profile_add_op(f->p, f->seq++, start, end, name, in, n_in, out,
                                n_out);
}

static void fx_free(fx_t *f, int64_t t, uint32_t id) {
  if (!f->err)
    f->err = cap_profile_add_free(f->p, t, id);
}

static cap_profile_t *fx_finish(fx_t *f) {
  if (!f->err)
    f->err = cap_profile_finish(f->p);
  if (f->err) {
    fprintf(stderr, "fixture: %s\n", cap_profile_error(f->p));
    cap_profile_destroy(f->p);
    return NULL;
  }
  return f->p;
}

/* W (param, 1 MB) produces A (100 MB) at op 0 in op0_ns. Then n_pre ops,
 * then op B (80 MB) and n_mid ops reading it, then B dies and n_post ops
 * run, then the last op reads A again; every other op takes step_ns and
 * writes a 1 MB temporary that dies at once. The peak (A + B, 182 MB) is in
 * the middle stretch; the last op itself needs 102 MB. A swap-out holds its
 * memory until the copy ends and a swap-in from its start (2 ms or so for
 * 100 MB), so a swap relieves the middle only if the stretches around it
 * are long enough. */
static cap_profile_t *one_big(uint32_t n_pre, uint32_t n_mid, uint32_t n_post,
                              int64_t step_ns, int64_t op0_ns) {
  fx_t f = {cap_profile_create(), 0, 0};
  uint32_t W = 0, A = 1, B = 2, next = 3;
  fx_tensor(&f, W, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, A, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, B, 80 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = 0; i < n_pre + n_mid + n_post + 1; i++)
    fx_tensor(&f, 3 + i, 1 * MB, CAP_KIND_ACTIVATION);
  int64_t t = 0;
  fx_op(&f, t, t + op0_ns, "aten.mm.default", &W, 1, &A, 1);
  t += op0_ns;
  for (uint32_t i = 0; i < n_pre + n_mid + n_post; i++) {
    if (i == n_pre) {
      fx_op(&f, t, t + 10 * US, "aten.mm.default", &W, 1, &B, 1);
      t += 10 * US;
    }
    uint32_t s = next++;
    fx_op(&f, t, t + step_ns, "aten.mul.Tensor", i >= n_pre && i < n_pre + n_mid ? &B : &W,
          1, &s, 1);
    t += step_ns;
    fx_free(&f, t, s);
    if (i + 1 == n_pre + n_mid)
      fx_free(&f, t, B);
  }
  uint32_t in[2] = {A, W}, last = next;
  fx_op(&f, t, t + 10 * US, "aten.mm_backward.default", in, 2, &last, 1);
  t += 10 * US;
  fx_free(&f, t, A);
  fx_free(&f, t, last);
  return fx_finish(&f);
}


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
