/*
 * cap_plan_refine: Capuchin's feedback (section 4.3). A prefetch measured
 * late by stall_ns moves its in-trigger to the latest access of another
 * tensor whose op starts at least stall_ns + cfg->feedback_step_ns before
 * the current trigger's op (on the profile's timeline), but never to or
 * before the evicted-access, where the tensor has not been swapped out yet.
 *
 * An earlier prefetch holds its device memory longer. A move is kept only
 * if the simulated plan stays within the budget (or within its own peak,
 * when that was already higher): a refinement that fixes a stall by going
 * over the budget trades a small delay for on-demand evictions, which cost
 * far more. All moves are tried at once first, as the common case; when
 * together they do not fit, each is tried alone, the longest stall first.
 */
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin_internal.h"

typedef struct move {
  uint32_t action;
  int64_t stall_ns;
  uint32_t old_tensor, old_access; /* trigger before the move */
  uint32_t new_tensor, new_access; /* trigger after it */
} move_t;

static int find_swap(const cap_plan_t *plan, const cap_feedback_t *f) {
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->tensor == f->tensor && a->evict_after_access + 1 == f->back_access &&
        a->method == CAP_METHOD_SWAP)
      return (int)i;
  }
  return -1;
}

bool cap__earlier_trigger(const cap_profile_t *p, const cap_action_t *a,
                            int64_t stall_ns, int64_t step_ns, uint32_t *tt,
                            uint32_t *ta) {
  uint32_t evict_op =
      cap_profile_access_op(p, a->tensor, a->evict_after_access);
  uint32_t back_op =
      cap_profile_access_op(p, a->tensor, a->evict_after_access + 1);
  uint32_t cur = back_op;
  if (a->prefetch_tensor != CAP_NONE) {
    uint32_t t =
        cap_profile_access_op(p, a->prefetch_tensor, a->prefetch_access);
    if (t != CAP_NONE && t > evict_op && t <= back_op)
      cur = t;
  }
  int64_t want = p->ops[cur].start_ns - stall_ns - step_ns;
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
  for (uint32_t t = l; t-- > lo;)
    if (cap__trigger_name(p, t, a->tensor, tt, ta))
      return true;
  for (uint32_t t = lo; t < hi; t++)
    if (cap__trigger_name(p, t, a->tensor, tt, ta))
      return true;
  return false;
}

static void set_trigger(cap_plan_t *plan, const move_t *m, bool moved) {
  cap_action_t *a = &plan->actions[m->action];
  a->prefetch_tensor = moved ? m->new_tensor : m->old_tensor;
  a->prefetch_access = moved ? m->new_access : m->old_access;
}

/* Simulate plan; *fits says whether its peak stays within limit, and the
 * plan's predictions become the simulated ones when it does. */
static int check(cap_plan_t *plan, const cap_profile_t *p,
                 const cap_bandwidth_t *bw, uint64_t limit, bool *fits) {
  cap_sim_result_t r = {0};
  int rc = cap_sim_run(p, plan, bw, &r);
  if (rc)
    return rc;
  *fits = r.peak_bytes <= limit;
  if (*fits) {
    plan->predicted_iter_ns = r.iter_ns;
    plan->predicted_peak_bytes = r.peak_bytes;
  }
  cap_sim_result_close(&r);
  return 0;
}

static int by_stall_desc(const void *x, const void *y) {
  const move_t *a = x, *b = y;
  if (a->stall_ns != b->stall_ns)
    return a->stall_ns > b->stall_ns ? -1 : 1;
  return (a->action > b->action) - (a->action < b->action);
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
  move_t *mv = malloc(((size_t)n_fb + 1) * sizeof *mv);
  if (!mv)
    return CAP_ENOMEM;
  uint32_t n_mv = 0;
  for (uint32_t i = 0; i < n_fb; i++) {
    if (fb[i].stall_ns == 0)
      continue;
    uint32_t ai = (uint32_t)find_swap(plan, &fb[i]);
    const cap_action_t *a = &plan->actions[ai];
    move_t m = {
        ai, fb[i].stall_ns, a->prefetch_tensor, a->prefetch_access, CAP_NONE,
        0};
    if (cap__earlier_trigger(p, a, fb[i].stall_ns, step, &m.new_tensor,
                        &m.new_access) &&
        (m.new_tensor != m.old_tensor || m.new_access != m.old_access))
      mv[n_mv++] = m;
  }

  int rc = 0;
  int64_t old_iter_ns = plan->predicted_iter_ns;
  uint64_t old_peak = plan->predicted_peak_bytes;
  if (n_mv) {
    /* The plan may already be over the budget (the smallest peak of an
     * infeasible budget): then no move may raise it further. */
    cap_sim_result_t before = {0};
    if ((rc = cap_sim_run(p, plan, &cfg->bw, &before)))
      goto out_free;
    uint64_t limit = before.peak_bytes > cfg->budget_bytes ? before.peak_bytes
                                                           : cfg->budget_bytes;
    cap_sim_result_close(&before);
    bool fits = false;
    for (uint32_t i = 0; i < n_mv; i++)
      set_trigger(plan, &mv[i], true);
    if ((rc = check(plan, p, &cfg->bw, limit, &fits)))
      goto out_restore;
    uint32_t kept = n_mv;
    if (!fits) {
      for (uint32_t i = 0; i < n_mv; i++)
        set_trigger(plan, &mv[i], false);
      qsort(mv, n_mv, sizeof *mv, by_stall_desc);
      kept = 0;
      for (uint32_t i = 0; i < n_mv; i++) {
        set_trigger(plan, &mv[i], true);
        if ((rc = check(plan, p, &cfg->bw, limit, &fits)))
          goto out_restore;
        if (fits)
          kept++;
        else
          set_trigger(plan, &mv[i], false);
      }
    }
    if (kept)
      plan->version++;
  }
  free(mv);
  return 0;
out_restore:
  for (uint32_t i = 0; i < n_mv; i++)
    set_trigger(plan, &mv[i], false);
  plan->predicted_iter_ns = old_iter_ns;
  plan->predicted_peak_bytes = old_peak;
out_free:
  free(mv);
  return rc;
}
