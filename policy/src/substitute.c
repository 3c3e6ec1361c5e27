/*
 * A late swap exchanged for the eviction of a tensor needed later
 * (Belady's rule, as a local-search move on the final plan).
 *
 * Where many tensors must be off the device at one op and all come back
 * just after it (vgg16 at 50 %: 467 MiB of gradients over the first
 * convolutions' backward, all read by the optimizer's first foreach op),
 * the prefetches cannot be hidden; which tensors are off decides how long
 * the next ops wait. Evicting instead a tensor whose next access is later
 * (that layer's weight, read by the optimizer's next op, with
 * `--evict-persistent`) gives its copy that much more time. For each late
 * swap X, the latest first: a tensor Y at least as large, resident across
 * X's whole time off the device in one of its access gaps that ends after
 * X's back-access, not evicted there yet, is swapped in that gap instead
 * of X (the prefetch just in time on idle engines, or issued at the op
 * before its back-access), the plan made explicit and simulated; kept when
 * faster, no higher at its peak, and valid. A second pass on what is still
 * late also takes a Y that leaves the device after X's eviction.
 */
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"
#include "planners.h"

#define SUBST_PARTNERS 2u /* partners tried per late swap, latest back first */

typedef struct {
  uint32_t tensor, k; /* evict after access k */
  uint32_t back;      /* its back-access op */
} partner_t;

/* Whether plan already evicts tensor y after access k. */
static bool evicted_at(const cap_plan_t *plan, uint32_t y, uint32_t k) {
  for (uint32_t i = 0; i < plan->n_actions; i++)
    if (plan->actions[i].tensor == y && plan->actions[i].evict_after_access == k)
      return true;
  return false;
}

/* Up to SUBST_PARTNERS tensors that may stand in for swap x (evicted after
 * op out, back at op back), the latest back-access first. */
static uint32_t find_partners(const cap_plan_t *plan, const cap_profile_t *p,
                              const cap_plan_config_t *cfg, uint32_t x,
                              uint32_t out, uint32_t back, bool later,
                              partner_t best[SUBST_PARTNERS]) {
  uint32_t n = 0;
  uint64_t bytes = p->tensors[x].bytes;
  for (uint32_t y = 0; y < p->n_tensors; y++) {
    const cap_tensor_t *t = &p->tensors[y];
    if (y == x || t->bytes < bytes || !cap__evictable(p, cfg, y))
      continue;
    /* the access gap (a, b) of y that holds [out, back] inside it */
    for (uint32_t k = 1; k < t->n_accesses; k++) {
      uint32_t a = p->access_ops[t->access_off + k - 1];
      uint32_t b = p->access_ops[t->access_off + k];
      /* later: y leaves after x would (x then stays until y leaves),
       * but still before x's back-access */
      if (b <= back || (later ? a <= out || a + 1 >= back : a > out))
        continue;
      if (evicted_at(plan, y, k))
        break;
      partner_t c = {y, k, b};
      /* sorted: the latest back-access first, the smaller tensor on a tie */
      uint32_t pos = n;
      while (pos > 0 && (c.back > best[pos - 1].back ||
                         (c.back == best[pos - 1].back &&
                          t->bytes < p->tensors[best[pos - 1].tensor].bytes)))
        pos--;
      if (pos < SUBST_PARTNERS) {
        uint32_t last = n < SUBST_PARTNERS ? n : SUBST_PARTNERS - 1;
        for (uint32_t i = last; i > pos; i--)
          best[i] = best[i - 1];
        best[pos] = c;
        if (n < SUBST_PARTNERS)
          n++;
      }
      break;
    }
  }
  return n;
}

static int substitute(cap_plan_t *plan, const cap_profile_t *p,
                      const cap_plan_config_t *cfg, bool later,
                      uint32_t max_sims) {
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
    /* indices stay valid: a kept change rewrites one action in place */
    const cap_action_t *xa = &plan->actions[l[i].action];
    uint32_t x = xa->tensor;
    uint32_t out = cap_profile_access_op(p, x, xa->evict_after_access);
    uint32_t back = cap_profile_access_op(p, x, xa->evict_after_access + 1);
    if (out == CAP_NONE || back == CAP_NONE)
      continue;
    partner_t pt[SUBST_PARTNERS];
    uint32_t np = find_partners(plan, p, cfg, x, out, back, later, pt);
    /* each partner with its prefetch just in time on idle engines, then
     * issued at the op before its back-access (the copy queued behind the
     * others late there, which still gains the time to that op) */
    for (uint32_t j = 0; j < 2 * np && sims < max_sims && !rc; j++) {
      cap_plan_t *next = cap_plan_clone(plan);
      if (!next) {
        rc = CAP_ENOMEM;
        break;
      }
      cap_action_t *a = &next->actions[l[i].action];
      a->tensor = pt[j / 2].tensor;
      a->evict_after_access = pt[j / 2].k;
      a->flags = 0;
      a->prefetch_tensor = CAP_NONE;
      a->prefetch_access = 0;
      uint32_t tt, ta;
      int64_t lead =
          j % 2 ? 1 : cap_copy_ns(p->tensors[a->tensor].bytes, cfg->bw.h2d_gbps);
      if (cap__earlier_trigger(p, a, lead, j % 2 ? 0 : cfg->trigger_margin_ns,
                               &tt, &ta)) {
        a->prefetch_tensor = tt;
        a->prefetch_access = ta;
      }
      bool kept = false;
      rc = cap__plan_make_explicit(next, p, NULL);
      if (rc) {
        cap_plan_destroy(next);
        if (rc == CAP_EINVAL)
          rc = 0; /* a list that cannot run as written: refused */
      } else {
        sims++;
        rc = cap__keep_if_faster(plan, next, p, &cfg->bw, limit, &kept);
      }
      if (kept)
        break;
    }
  }
  free(l);
  return rc;
}

/* First partners off the device over the late swap's whole time off; then,
 * on what is still late, partners that leave after it would have (the
 * swap's tensor stays until then): the simulator weighs the memory. */
int cap__substitute_late(cap_plan_t *plan, const cap_profile_t *p,
                         const cap_plan_config_t *cfg, uint32_t max_sims) {
  int rc = substitute(plan, p, cfg, false, max_sims);
  return rc ? rc : substitute(plan, p, cfg, true, max_sims);
}
