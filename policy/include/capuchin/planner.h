/*
 * Planners: Capuchin's (Algorithms 1 and 2 of Peng et al., ASPLOS 2020) and
 * the baselines users pick instead, all judged by the same simulator.
 */
#ifndef CAPUCHIN_PLANNER_H
#define CAPUCHIN_PLANNER_H

#include <stdbool.h>
#include <stdint.h>

#include "capuchin/plan.h"
#include "capuchin/profile.h"
#include "capuchin/sim.h"

typedef struct cap_plan_config {
  uint64_t budget_bytes;
  cap_bandwidth_t bw;
  bool evict_persistent;     /* may param/input tensors be evicted too */
  /* Capuchin plans each prefetch to land at least this long before its
   * back-access starts (profile timeline), so that timing noise does not
   * turn a just-in-time copy into a stall; larger holds memory longer. */
  int64_t trigger_margin_ns;
  /* cap_plan_refine moves a late prefetch's in-trigger to an access of
   * another tensor at least (measured stall + this) earlier. */
  int64_t feedback_step_ns;
} cap_plan_config_t;

/* Defaults: H100 bandwidths, no persistent eviction, margins as tuned. */
void cap_plan_config_init(cap_plan_config_t *cfg, uint64_t budget_bytes);

/* A floor under every plan's peak for p under cfg: the largest sum, over
 * the ops, of an op's own inputs and outputs plus the persistent bytes
 * that cannot be off the device during it (all without persistent
 * eviction; with it, those marked no_evict, those not accessed yet or no
 * longer, and the resident bytes no tensor accounts for). No plan fits a
 * smaller budget; capuchin finds one at most budgets above it (with
 * stalls, near it). 0 when out of memory. */
uint64_t cap_plan_min_budget(const cap_profile_t *p, const cap_plan_config_t *cfg);

/* Names of all planners, NULL-terminated: "capuchin", "swap-all", "vdnn",
 * "checkpoint-sqrt", "dtr", "passive-lru". */
extern const char *const cap_planner_names[];

/* Compute a plan with the named planner. Returns 0 with a plan whose
 * simulated peak fits the budget; CAP_EINFEASIBLE when none fits, with *out
 * set to the plan of the smallest peak reached (its predicted_peak_bytes says
 * how small); CAP_ENOENT for an unknown name. *out is the caller's. */
int cap_plan_compute(const cap_profile_t *p, const char *planner,
                     const cap_plan_config_t *cfg, cap_plan_t **out);

/* Measured stall of one prefetch: the back-access of `tensor` at access
 * `back_access` waited stall_ns for its swap-in. */
typedef struct cap_feedback {
  uint32_t tensor;
  uint32_t back_access;
  int64_t stall_ns;
} cap_feedback_t;

/* Move the in-triggers of late prefetches earlier (Capuchin's feedback). A
 * move is kept only where the simulated plan stays within cfg->budget_bytes
 * (or within its own peak, if that is higher). When a trigger moved,
 * plan->version goes up by one and the plan's predictions become those of
 * the refined plan; otherwise the plan is as it was. Returns 0; CAP_EINVAL,
 * with the plan untouched, for feedback that names no swap action of the
 * plan; CAP_ENOMEM. */
int cap_plan_refine(cap_plan_t *plan, const cap_profile_t *p,
                    const cap_feedback_t *fb, uint32_t n_fb,
                    const cap_plan_config_t *cfg);

/* A plan action named by what it evicts: tensor after access
 * evict_after_access (unique within a plan). */
typedef struct cap_action_key {
  uint32_t tensor;
  uint32_t evict_after_access;
} cap_action_key_t;

/* The client could not carry out these actions (a recompute list whose
 * input was missing, a release the iteration outlived) and swaps those
 * tensors instead for the rest of the job: make the plan say so. A recompute
 * becomes a swap whose prefetch is triggered to land just in time with idle
 * copy engines (cfg->trigger_margin_ns early), on demand when that does not
 * fit the budget; a failed release or swap is dropped (the tensor stays).
 * The plan is then made explicit again, validated and simulated;
 * plan->version goes up by one when anything changed. Keys that name no
 * action of the plan are ignored (an older version's). Returns 0,
 * CAP_EINVAL, or CAP_ENOMEM with the plan untouched. */
int cap_plan_fall_back(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_action_key_t *keys, uint32_t n_keys,
                       const cap_plan_config_t *cfg);

#endif /* CAPUCHIN_PLANNER_H */
