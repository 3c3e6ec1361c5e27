/*
 * cap_plan_refine: Capuchin's feedback (section 4.3). A prefetch measured
 * late by stall_ns moves its in-trigger to the latest access of another
 * tensor whose op starts at least stall_ns + cfg->feedback_step_ns before
 * the current trigger's op (on the profile's timeline), but never to or
 * before the evicted-access, where the tensor has not been swapped out yet.
 */
#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin_internal.h"

static int find_swap(const cap_plan_t *plan, const cap_feedback_t *f) {
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->tensor == f->tensor && a->evict_after_access + 1 == f->back_access &&
        a->method == CAP_METHOD_SWAP)
      return (int)i;
  }
  return -1;
}

int cap_plan_refine(cap_plan_t *plan, const cap_profile_t *p,
                    const cap_feedback_t *fb, uint32_t n_fb,
                    const cap_plan_config_t *cfg) {
  if (!plan || !p || !cfg || !p->finished || (n_fb && !fb))
    return CAP_EINVAL;
  if (plan->n_actions > (uint32_t)INT32_MAX)
    return CAP_ERANGE;
  /* Check everything first: a refused call leaves the plan as it was. */
  for (uint32_t i = 0; i < n_fb; i++) {
    if (fb[i].stall_ns < 0 || fb[i].tensor >= p->n_tensors)
      return CAP_EINVAL;
    int ai = find_swap(plan, &fb[i]);
    if (ai < 0)
      return CAP_EINVAL;
    const cap_action_t *a = &plan->actions[ai];
    if (cap_profile_access_op(p, a->tensor, a->evict_after_access + 1) ==
        CAP_NONE)
      return CAP_EINVAL;
  }
  int64_t step = cfg->feedback_step_ns > 0 ? cfg->feedback_step_ns : 0;
  for (uint32_t i = 0; i < n_fb; i++) {
    if (fb[i].stall_ns == 0)
      continue;
    cap_action_t *a = &plan->actions[find_swap(plan, &fb[i])];
    uint32_t evict_op = cap_profile_access_op(p, a->tensor, a->evict_after_access);
    uint32_t back_op = cap_profile_access_op(p, a->tensor, a->evict_after_access + 1);
    uint32_t cur = back_op;
    if (a->prefetch_tensor != CAP_NONE) {
      uint32_t t = cap_profile_access_op(p, a->prefetch_tensor, a->prefetch_access);
      if (t != CAP_NONE && t > evict_op && t <= back_op)
        cur = t;
    }
    int64_t want = p->ops[cur].start_ns - fb[i].stall_ns - step;
    /* latest op in (evict_op, cur) starting at or before `want` that names
     * another tensor; the earliest such op when none starts that early */
    uint32_t lo = evict_op + 1, hi = cur; /* ops [lo, hi) */
    uint32_t l = lo, r = hi;
    while (l < r) { /* first op in [lo, hi) with start > want */
      uint32_t mid = l + (r - l) / 2;
      if (p->ops[mid].start_ns <= want)
        l = mid + 1;
      else
        r = mid;
    }
    uint32_t chosen = CAP_NONE, tt = 0, ta = 0;
    for (uint32_t t = l; t-- > lo;)
      if (cap__trigger_name(p, t, a->tensor, &tt, &ta)) {
        chosen = t;
        break;
      }
    if (chosen == CAP_NONE)
      for (uint32_t t = lo; t < hi; t++)
        if (cap__trigger_name(p, t, a->tensor, &tt, &ta)) {
          chosen = t;
          break;
        }
    if (chosen == CAP_NONE)
      continue; /* already at the earliest possible trigger */
    a->prefetch_tensor = tt;
    a->prefetch_access = ta;
  }
  plan->version++;
  return 0;
}
