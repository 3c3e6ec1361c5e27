/*
 * cap_plan_fall_back: the next plan version after the client reported
 * actions it could not carry out (docs/plan-semantics.md, "What the
 * executor does when a condition fails anyway"). The client already swaps
 * those tensors; the daemon's next version says so, so that the plan, its
 * predictions and every later refinement describe what really runs.
 */
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin_internal.h"
#include "planners.h"

static uint32_t find_action(const cap_plan_t *plan, const cap_action_key_t *k) {
  for (uint32_t i = 0; i < plan->n_actions; i++)
    if (plan->actions[i].tensor == k->tensor &&
        plan->actions[i].evict_after_access == k->evict_after_access)
      return i;
  return CAP_NONE;
}

/* Remove the actions marked in drop[] (their list ops stay in the pool,
 * unused). */
static void remove_marked(cap_plan_t *plan, const uint8_t *drop) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < plan->n_actions; i++)
    if (!drop[i])
      plan->actions[n++] = plan->actions[i];
  plan->n_actions = n;
}

int cap_plan_fall_back(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_action_key_t *keys, uint32_t n_keys,
                       const cap_plan_config_t *cfg) {
  if (!plan || !p || !cfg || !p->finished || (n_keys && !keys))
    return CAP_EINVAL;
  cap_plan_t *next = cap_plan_clone(plan);
  uint8_t *drop = calloc((size_t)plan->n_actions + 1, 1);
  uint8_t *swapped = calloc((size_t)plan->n_actions + 1, 1);
  int rc = CAP_ENOMEM;
  if (!next || !drop || !swapped)
    goto out;
  bool changed = false;
  for (uint32_t k = 0; k < n_keys; k++) {
    uint32_t ai = find_action(next, &keys[k]);
    if (ai == CAP_NONE || drop[ai] || swapped[ai])
      continue;
    cap_action_t *a = &next->actions[ai];
    changed = true;
    if (a->method != CAP_METHOD_RECOMPUTE || cap_action_is_release(a)) {
      drop[ai] = 1; /* nothing to swap instead: keep the tensor */
      continue;
    }
    a->method = CAP_METHOD_SWAP;
    a->recompute_off = a->n_recompute = 0;
    a->flags = 0;
    a->prefetch_tensor = CAP_NONE;
    a->prefetch_access = 0;
    uint64_t bytes = p->tensors[a->tensor].bytes;
    uint32_t tt, ta;
    if (cap__earlier_trigger(p, a, cap_copy_ns(bytes, cfg->bw.h2d_gbps),
                             cfg->trigger_margin_ns, &tt, &ta)) {
      a->prefetch_tensor = tt;
      a->prefetch_access = ta;
    }
    swapped[ai] = 1;
  }
  if (!changed) {
    rc = 0;
    goto out;
  }
  remove_marked(next, drop);
  /* lists that counted on a swapped tensor being recomputed (merged into
   * theirs) still produce it; make the plan explicit again all the same */
  if ((rc = cap__plan_make_explicit(next, p, NULL)) ||
      (rc = cap_plan_validate(next, p, NULL, 0)) ||
      (rc = cap__plan_predict(next, p, &cfg->bw)))
    goto out;
  if (next->predicted_peak_bytes > plan->budget_bytes &&
      next->predicted_peak_bytes > plan->predicted_peak_bytes) {
    /* the just-in-time prefetches hold memory longer than the recomputes
     * did: fetch those on demand instead */
    for (uint32_t i = 0; i < next->n_actions; i++)
      for (uint32_t k = 0; k < n_keys; k++)
        if (next->actions[i].tensor == keys[k].tensor &&
            next->actions[i].evict_after_access == keys[k].evict_after_access &&
            next->actions[i].method == CAP_METHOD_SWAP) {
          next->actions[i].prefetch_tensor = CAP_NONE;
          next->actions[i].prefetch_access = 0;
        }
    if ((rc = cap__plan_predict(next, p, &cfg->bw)))
      goto out;
  }
  next->version = plan->version + 1;
  /* swap the contents: the caller's pointer stays valid */
  cap_plan_t tmp = *plan;
  *plan = *next;
  *next = tmp;
  rc = 0;
out:
  cap_plan_destroy(next);
  free(drop);
  free(swapped);
  return rc;
}
