/*
 * Last pass over the late prefetches of the planner's final plan.
 *
 * The local search (improve.c) starts a late prefetch its lateness
 * earlier, but the H2D engine is a FIFO: a prefetch moved ahead of, or
 * behind, another one's start changes both, so the time a prefetch is late
 * is not monotonic in its trigger (bert_base at 40 %: a 12 MiB layer-norm
 * output is 0.25 ms late with its trigger, on time 5 ops earlier, late
 * again 3 ops earlier still). And the plan the planner returns may come
 * from a search that had fewer tries for this move. Here each late
 * prefetch, the latest first, tries a few advances around its lateness
 * (1, 2, 1/2, 4 and 1/4 of it) and keeps the first that the simulator
 * finds faster, no higher at its peak, and valid.
 */
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"
#include "planners.h"

static int cmp_late(const void *a, const void *b) {
  const cap__late_t *x = a, *y = b;
  if (x->late_ns != y->late_ns)
    return x->late_ns > y->late_ns ? -1 : 1;
  return x->action < y->action ? -1 : x->action > y->action;
}

int cap__late_swaps(const cap_plan_t *plan, const cap_profile_t *p,
                    const cap_bandwidth_t *bw, cap__late_t **out, uint32_t *n) {
  *out = NULL;
  *n = 0;
  cap__late_t *l = malloc((size_t)plan->n_actions * sizeof *l);
  if (!l)
    return CAP_ENOMEM;
  cap_sim_result_t r;
  int rc = cap_sim_run(p, plan, bw, &r);
  if (rc) {
    free(l);
    return rc;
  }
  uint32_t k = 0;
  for (uint32_t i = 0; i < r.n_prefetches; i++)
    if (r.prefetches[i].action < plan->n_actions &&
        r.prefetches[i].late_ns > 0 &&
        plan->actions[r.prefetches[i].action].method == CAP_METHOD_SWAP)
      l[k++] = (cap__late_t){r.prefetches[i].late_ns, r.prefetches[i].action};
  cap_sim_result_close(&r);
  qsort(l, k, sizeof *l, cmp_late);
  *out = l;
  *n = k;
  return 0;
}

int cap__try_earlier(cap_plan_t *plan, const cap_profile_t *p,
                     const cap_plan_config_t *cfg, uint32_t ai, int64_t lead,
                     uint64_t limit, bool *tried, bool *kept) {
  const cap_action_t *a = &plan->actions[ai];
  uint32_t tt, ta;
  *tried = *kept = false;
  if (!cap__earlier_trigger(p, a, lead, cfg->trigger_margin_ns, &tt, &ta) ||
      (tt == a->prefetch_tensor && ta == a->prefetch_access))
    return 0;
  cap_plan_t *next = cap_plan_clone(plan);
  if (!next)
    return CAP_ENOMEM;
  next->actions[ai].prefetch_tensor = tt;
  next->actions[ai].prefetch_access = ta;
  *tried = true;
  return cap__keep_if_faster(plan, next, p, &cfg->bw, limit, kept);
}

/* Advances tried, as fractions of the lateness: num / den. */
static const int64_t adv_num[] = {1, 2, 1, 4, 1};
static const int64_t adv_den[] = {1, 1, 2, 1, 4};
#define N_ADV (sizeof adv_num / sizeof adv_num[0])

int cap__polish_triggers(cap_plan_t *plan, const cap_profile_t *p,
                         const cap_plan_config_t *cfg, uint32_t max_sims) {
  if (plan->predicted_peak_bytes > cfg->budget_bytes || !plan->n_actions)
    return 0;
  uint64_t limit = plan->predicted_peak_bytes;
  cap__late_t *l;
  uint32_t n;
  int rc = cap__late_swaps(plan, p, &cfg->bw, &l, &n);
  if (rc)
    return rc;
  uint32_t sims = 0;
  for (uint32_t i = 0; i < n && sims < max_sims && !rc; i++) {
    for (uint32_t j = 0; j < N_ADV && sims < max_sims && !rc; j++) {
      bool tried, kept;
      rc = cap__try_earlier(plan, p, cfg, l[i].action,
                            l[i].late_ns * adv_num[j] / adv_den[j], limit,
                            &tried, &kept);
      sims += tried;
      if (kept)
        break;
    }
  }
  free(l);
  return rc;
}
