/*
 * The planner registry: defaults, names, and cap_plan_compute, which runs
 * the named planner and then judges its plan with the simulator, so that
 * every planner's feasibility means the same thing.
 */
#include "capuchin/planner.h"

#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin/sim.h"
#include "planners.h"

void cap_plan_config_init(cap_plan_config_t *cfg, uint64_t budget_bytes) {
  if (!cfg)
    return;
  memset(cfg, 0, sizeof *cfg);
  cfg->budget_bytes = budget_bytes;
  cfg->bw = CAP_BANDWIDTH_H100;
  cfg->evict_persistent = false;
  /* Capuchin starts a prefetch this much before the latest moment that
   * would hide it: a few small kernels' worth, so that op-time jitter does
   * not turn a just-in-time copy into a stall. */
  cfg->trigger_margin_ns = 20000;
  /* A late prefetch's trigger moves by its measured stall plus this. */
  cfg->feedback_step_ns = 20000;
}

const char *const cap_planner_names[] = {
    "capuchin", "swap-all", "vdnn", "checkpoint-sqrt", "dtr", "passive-lru",
    NULL,
};

static const cap__planner_fn planner_fns[] = {
    cap__plan_capuchin,        cap__plan_swap_all, cap__plan_vdnn,
    cap__plan_checkpoint_sqrt, cap__plan_dtr,      cap__plan_passive_lru,
};

/* The ops strictly between which tensor x may be off the device although
 * persistent, under the plan semantics: with persistent eviction, unless
 * no_evict, between its first access and its last (a plan evicts it only
 * after an access and brings it back for the next; it never releases it).
 * false when there are none. */
static bool off_span(const cap_profile_t *p, const cap_plan_config_t *cfg,
                     uint32_t x, uint32_t *first, uint32_t *last) {
  const cap_tensor_t *t = &p->tensors[x];
  if (!cfg->evict_persistent || !cap_tensor_is_resident(t) || t->no_evict ||
      t->n_accesses < 2)
    return false;
  const uint32_t *acc = p->access_ops + t->access_off;
  *first = acc[0];
  *last = acc[t->n_accesses - 1];
  return true;
}

/* Every op needs its own inputs and outputs on the device at once, on top
 * of the persistent bytes that cannot be off the device then: all of them
 * without persistent eviction; with it, those marked no_evict, those not
 * accessed yet or no longer, and what persistent_bytes holds beyond the
 * tensors (resident before the iteration, no tensor of the profile). */
uint64_t cap_plan_min_budget(const cap_profile_t *p, const cap_plan_config_t *cfg) {
  if (!p || !cfg)
    return 0;
  /* off[i]: persistent bytes that may be off the device during op i, but
   * for op i's own (added back below); a difference array over the ops
   * strictly between a tensor's first and last access */
  int64_t *off = calloc((size_t)p->n_ops + 1, sizeof *off);
  if (!off)
    return 0; /* no floor known */
  uint32_t first, last;
  for (uint32_t x = 0; x < p->n_tensors; x++) {
    if (!off_span(p, cfg, x, &first, &last))
      continue;
    off[first + 1] += (int64_t)p->tensors[x].bytes;
    off[last] -= (int64_t)p->tensors[x].bytes;
  }
  uint64_t best = 0;
  int64_t relievable = 0;
  const uint32_t *ts = p->op_tensors;
  for (uint32_t o = 0; o < p->n_ops; o++) {
    relievable += off[o];
    const cap_op_t *op = &p->ops[o];
    uint64_t sum = p->persistent_bytes - (uint64_t)relievable;
    uint32_t n = op->n_in + op->n_out;
    for (uint32_t i = 0; i < n; i++) {
      uint32_t x = i < op->n_in ? ts[op->in_off + i] : ts[op->out_off + i - op->n_in];
      /* (persistent tensors first: an optimizer step lists thousands) */
      if (cap_tensor_is_resident(&p->tensors[x]) &&
          !(off_span(p, cfg, x, &first, &last) && first < o && o < last))
        continue;
      bool dup = false;
      for (uint32_t j = 0; j < i && !dup; j++)
        dup = (j < op->n_in ? ts[op->in_off + j] : ts[op->out_off + j - op->n_in]) == x;
      if (!dup)
        sum += p->tensors[x].bytes;
    }
    if (sum > best)
      best = sum;
  }
  free(off);
  return best;
}

int cap__plan_predict_result(cap_plan_t *plan, const cap_profile_t *p,
                             const cap_bandwidth_t *bw, cap_sim_result_t *r) {
  int rc = cap_sim_run(p, plan, bw, r);
  if (rc)
    return rc;
  plan->predicted_iter_ns = r->iter_ns;
  plan->predicted_peak_bytes = r->peak_bytes;
  return 0;
}

int cap__plan_predict(cap_plan_t *plan, const cap_profile_t *p,
                      const cap_bandwidth_t *bw) {
  cap_sim_result_t r;
  int rc = cap__plan_predict_result(plan, p, bw, &r);
  if (!rc)
    cap_sim_result_close(&r);
  return rc;
}

int cap_plan_compute(const cap_profile_t *p, const char *planner,
                     const cap_plan_config_t *cfg, cap_plan_t **out) {
  if (!out)
    return CAP_EINVAL;
  *out = NULL;
  if (!p || !p->finished || !planner || !cfg)
    return CAP_EINVAL;
  if (!(cfg->bw.h2d_gbps > 0) || !(cfg->bw.d2h_gbps > 0) ||
      !(cfg->bw.duplex_gbps > 0))
    return CAP_EINVAL;
  size_t i = 0;
  while (cap_planner_names[i] && strcmp(cap_planner_names[i], planner) != 0)
    i++;
  if (!cap_planner_names[i])
    return CAP_ENOENT;

  cap_plan_t *plan = NULL;
  int rc = planner_fns[i](p, cfg, &plan);
  if (rc && rc != CAP_EINFEASIBLE) {
    cap_plan_destroy(plan);
    return rc;
  }
  if (!plan)
    return CAP_EINVAL;
  plan->budget_bytes = cfg->budget_bytes;
  if (strcmp(plan->policy, planner) != 0) {
    memset(plan->policy, 0, sizeof plan->policy);
    strncpy(plan->policy, planner, sizeof plan->policy - 1);
  }
  /* Every list must run as written (cap_plan_walk): mend what a planner
   * left implicit. A planner that emits an otherwise invalid plan has a
   * bug: refuse it rather than hand the daemon or the client something
   * they cannot execute. */
  rc = cap__plan_make_explicit(plan, p, NULL);
  if (!rc)
    rc = cap_plan_validate(plan, p, NULL, 0);
  if (rc)
    goto out_destroy;
  rc = cap__plan_predict(plan, p, &cfg->bw);
  if (rc)
    goto out_destroy;
  *out = plan;
  return plan->predicted_peak_bytes <= cfg->budget_bytes ? 0 : CAP_EINFEASIBLE;

out_destroy:
  cap_plan_destroy(plan);
  return rc;
}
