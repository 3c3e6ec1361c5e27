/*
 * Internal entry points of the planners behind cap_plan_compute (planner.c)
 * and helpers the baselines share (baseline_common.c).
 *
 * A planner returns a plan for cfg->budget_bytes (or its best attempt); the
 * dispatcher validates it, simulates it, fills predicted_iter_ns and
 * predicted_peak_bytes and decides feasibility, so every planner is judged
 * by the same simulator at the same budget.
 */
#ifndef CAPUCHIN_PLANNERS_H
#define CAPUCHIN_PLANNERS_H

#include <stdbool.h>
#include <stdint.h>

#include "capuchin/plan.h"
#include "capuchin/planner.h"
#include "capuchin/profile.h"

typedef int (*cap__planner_fn)(const cap_profile_t *p,
                               const cap_plan_config_t *cfg, cap_plan_t **out);

/* Capuchin (capuchin.c, owned by the planner module). */
int cap__plan_capuchin(const cap_profile_t *p, const cap_plan_config_t *cfg,
                       cap_plan_t **out);
/* Baselines (baseline_*.c). */
int cap__plan_swap_all(const cap_profile_t *p, const cap_plan_config_t *cfg,
                       cap_plan_t **out);
int cap__plan_vdnn(const cap_profile_t *p, const cap_plan_config_t *cfg,
                   cap_plan_t **out);
int cap__plan_checkpoint_sqrt(const cap_profile_t *p,
                              const cap_plan_config_t *cfg, cap_plan_t **out);
int cap__plan_dtr(const cap_profile_t *p, const cap_plan_config_t *cfg,
                  cap_plan_t **out);
int cap__plan_passive_lru(const cap_profile_t *p, const cap_plan_config_t *cfg,
                          cap_plan_t **out);
/* Like passive-lru, but evicting the tensor whose next access comes last
 * (Belady's rule): Capuchin's plan of last resort near the floor. */
int cap__plan_belady(const cap_profile_t *p, const cap_plan_config_t *cfg,
                     cap_plan_t **out);

/* --- shared by the baselines (baseline_common.c) -------------------------- */

/* Seq of the first op of the backward pass: the first op whose name
 * contains "backward"; p->n_ops when there is none. */
uint32_t cap__backward_start(const cap_profile_t *p);

/* Heavy layers in vDNN's sense: convolutions and matrix products
 * (convolution, mm, addmm, bmm, baddbmm, matmul, linear; forward or
 * backward). */
bool cap__op_is_heavy(const cap_profile_t *p, uint32_t op);

/* May a plan evict tensor t? Activations that are freed during the
 * iteration always; params and inputs only with cfg->evict_persistent;
 * never-freed activations never (profile.h, cap_tensor_is_resident). */
bool cap__evictable(const cap_profile_t *p, const cap_plan_config_t *cfg,
                    uint32_t t);

/* Last op at or before `op` that writes tensor t (lists it as an output and
 * is not a view), or CAP_NONE. */
uint32_t cap__last_writer(const cap_profile_t *p, uint32_t t, uint32_t op);

/* Scratch for cap__lineage; zero it before first use, close after. */
typedef struct cap__lineage {
  uint32_t *mark; /* per tensor: == gen when needed */
  uint32_t gen;
  uint32_t *ops; /* the list built, ascending op seqs */
  uint32_t n_ops, cap_ops;
  uint32_t n_tensors;
} cap__lineage_t;

void cap__lineage_close(cap__lineage_t *l);

/* Replay list that restores tensor t, evicted after op evict_op, just before
 * op back_op: the last op writing t at or before evict_op, every earlier
 * writer of t back to its producer, and the same for every input of a
 * replayed op that will not hold its original value at back_op: one that is
 * `gone` (gone[x] != 0: the plan will have it off the device then), freed
 * before back_op starts, or written in place between the replayed op and
 * back_op. The list is in execution order and satisfies cap_plan_validate.
 * Returns 0 with l->ops/l->n_ops, CAP_ENOENT when t cannot be rebuilt (a
 * needed tensor has no producer) or the list would exceed max_ops, or
 * CAP_ENOMEM. */
int cap__lineage(cap__lineage_t *l, const cap_profile_t *p, uint32_t t,
                 uint32_t evict_op, uint32_t back_op, const uint8_t *gone,
                 uint32_t max_ops);

/* Append n op seqs to the plan's pool of recompute lists; *off is where
 * they start (plan.c). */
int cap__plan_append_ops(cap_plan_t *plan, const uint32_t *ops, uint32_t n,
                         uint32_t *off);

/* Index of the action evicting tensor after its access k, CAP_NONE when
 * the plan has none (plan.c). */
uint32_t cap__find_action(const cap_plan_t *plan, uint32_t tensor, uint32_t k);

/* Action ai's recompute list := the n ops given (plan.c). */
int cap__plan_set_list(cap_plan_t *plan, uint32_t ai, const uint32_t *ops,
                       uint32_t n);

/* Action ai's list := the sorted union of its list and action bi's, at
 * most max_ops long; CAP_ENOENT when that adds nothing or is longer
 * (plan.c). */
int cap__plan_merge_lists(cap_plan_t *plan, uint32_t ai, uint32_t bi,
                          uint32_t max_ops);

/* The profile's time of the ops action a replays (0 for a swap or a
 * release), ns (plan.c). */
int64_t cap__replay_ns(const cap_plan_t *plan, const cap_profile_t *p,
                       const cap_action_t *a);

/* Simulate plan on p and make its predicted_iter_ns and
 * predicted_peak_bytes the simulator's (planner.c). 0 or cap_sim_run's
 * error, the plan unchanged then. */
int cap__plan_predict(cap_plan_t *plan, const cap_profile_t *p,
                      const cap_bandwidth_t *bw);
/* cap__plan_predict that also hands over the simulation (close it with
 * cap_sim_result_close; nothing to close on error). */
int cap__plan_predict_result(cap_plan_t *plan, const cap_profile_t *p,
                             const cap_bandwidth_t *bw, cap_sim_result_t *r);

/* Mend a plan so that every recompute list runs exactly as written
 * (cap_plan_walk): a swapped-out source gets its prefetch issued at the
 * back-access that needs it, a list lacking another source is rebuilt from
 * the lineage with what is off the device recomputed inside it, and a
 * tensor that cannot be rebuilt is swapped instead (plan_walk.c). Sets
 * *n_repairs (may be NULL) to the number of faults mended. Returns 0 or
 * CAP_ENOMEM. */
int cap__plan_make_explicit(cap_plan_t *plan, const cap_profile_t *p,
                            uint32_t *n_repairs);

#endif /* CAPUCHIN_PLANNERS_H */
