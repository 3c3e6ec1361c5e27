/*
 * Placement: an address for every block of device memory a plan uses, fixed
 * before the iteration runs (the offset planning of static-graph runtimes,
 * here over a whole training iteration with its evictions and restores).
 *
 * The input is a list of *residency intervals*: a block of `bytes` that is
 * live from `start` to `end` (half-open, any monotonic clock: the simulator's
 * nanoseconds, or event numbers). A tensor that is evicted and brought back
 * has one interval per stay on the device. The output is an offset per
 * interval in one arena such that no two intervals that overlap in time
 * overlap in bytes. The arena can never be smaller than the peak of live
 * bytes; the ratio of the two is the plan's fragmentation.
 */
#ifndef CAPUCHIN_PLACEMENT_H
#define CAPUCHIN_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cap_interval {
  int64_t start, end; /* live in [start, end); start < end */
  uint64_t bytes;     /* > 0 */
  /* In-place sharing (MXNet's memory sharing): the interval whose block this
   * one may take over, or CAP_NONE. The caller sets it only where that is
   * correct: this is an output of the op that is the other's last use, and
   * the op may write its output over that input. The two then overlap in
   * time (during the op) but may share bytes; at most one interval takes
   * over any block. */
  uint32_t share;
  /* The interval that must sit at the same offset, or CAP_NONE: the two
   * stays of a tensor that lives across the iteration's boundary (its last
   * interval of one iteration is its first of the next). */
  uint32_t same_as;
} cap_interval_t;

typedef enum {
  CAP_PLACE_BY_SIZE = 0,    /* largest first, each at the lowest offset that
                               fits among the placed intervals it overlaps */
  CAP_PLACE_BY_BREADTH = 1, /* instants with the most live bytes first; at
                               each, its unplaced intervals largest first */
  CAP_PLACE_BY_AREA = 2,    /* most bytes x time first: a long-lived block
                               claims its address before short ones that
                               would leave it no hole (vgg16's 392-784 MiB
                               activations) */
  CAP_PLACE_SKYLINE_LENGTH = 3, /* along the skyline (the top of what is
                               placed, over time cut at every start and
                               end): its lowest stretch takes the block
                               within it that spans the most cuts, or rises
                               to a neighbour where none fits (bert_large's
                               gradients, made in the backward pass, go
                               where its activations were) */
  CAP_PLACE_SKYLINE_AREA = 4, /* the same, most bytes x cuts spanned first */
  CAP_PLACE_BEST = 5,       /* every strategy above, the smallest arena */
} cap_place_strategy_t;

#define CAP_PLACE_N_STRATEGIES 5 /* the strategies CAP_PLACE_BEST tries */

/* Name of a strategy ("size", "breadth", "area", "skyline-length",
 * "skyline-area", "best"), NULL if unknown. */
const char *cap_place_strategy_name(cap_place_strategy_t s);

typedef struct cap_placement {
  uint64_t *offsets;        /* one per interval, multiples of the alignment */
  uint32_t n;
  uint64_t arena_bytes;     /* max of offset + aligned bytes */
  uint64_t peak_bytes;      /* most aligned bytes live at one instant, a
                               shared pair counted twice: only sharing can
                               bring the arena below it */
  cap_place_strategy_t strategy; /* the one that produced the offsets */
  uint32_t shared;          /* intervals that took over another's block */
} cap_placement_t;

/* Place n intervals. Sizes are rounded up to `alignment` (a power of two;
 * 0 means 256, the CUDA allocation granularity), and so are offsets. Fills
 * *out (release it with cap_placement_close). Returns 0, CAP_EINVAL for a
 * bad interval (start >= end, bytes 0, share or same_as out of range or
 * itself, same_as not mutual, two tied intervals that overlap in time or
 * differ in size) or strategy, CAP_ENOMEM. */
int cap_place(const cap_interval_t *iv, uint32_t n, cap_place_strategy_t s,
              uint64_t alignment, cap_placement_t *out);
void cap_placement_close(cap_placement_t *pl);

/* Check offsets against intervals: returns 0 when no two intervals that
 * overlap in time overlap in bytes (a shared pair excepted) and tied
 * intervals (same_as) sit at one offset, else CAP_EINVAL with the first
 * offending pair in *a < *b. `alignment` as in
 * cap_place. */
int cap_placement_check(const cap_interval_t *iv, uint32_t n,
                        const uint64_t *offsets, uint64_t alignment,
                        uint32_t *a, uint32_t *b);

/* --- A plan's placement ----------------------------------------------------
 * The residency intervals of every transient tensor under a plan, as the
 * simulator runs it (cap_sim_residency: a swapped or dropped tensor has one
 * interval before its eviction and one from its prefetch or recompute on,
 * a recompute list's temporaries their own), and an offset for each. An
 * elementwise op's output may take over the block of an input whose last
 * use is that op and whose data nobody reads after it (freed or dropped, not
 * swapped out). */

#include "capuchin/plan.h"
#include "capuchin/planner.h"
#include "capuchin/profile.h"
#include "capuchin/sim.h"

typedef struct cap_plan_placement {
  cap_residency_t *intervals; /* what the simulator saw, allocation order */
  cap_interval_t *blocks;     /* what was placed: blocks[i] for intervals[i]
                                 (times widened to at least 1 ns, sharing
                                 and ties set) */
  uint32_t n;
  cap_placement_t placement;  /* offsets[i] for intervals[i] */
  uint64_t persistent_bytes;  /* outside the arena */
} cap_plan_placement_t;

/* Simulate plan (NULL: unmanaged) on p and place its intervals with
 * strategy s. The device memory the plan needs is then persistent_bytes +
 * placement.arena_bytes. Returns 0, or what cap_sim_run or cap_place
 * returned. */
int cap_plan_place(const cap_profile_t *p, const cap_plan_t *plan,
                   const cap_bandwidth_t *bw, cap_place_strategy_t s,
                   cap_plan_placement_t *out);
void cap_plan_placement_close(cap_plan_placement_t *pp);

/* Give plan the blocks of placement pp (cap_plan_set_blocks). */
int cap_plan_attach_placement(cap_plan_t *plan, const cap_plan_placement_t *pp);

/* The device bytes a placed plan keeps outside its arena: the profile's
 * persistent bytes, less the weights the plan evicts (their first blocks,
 * CAP_RESIDENCY_PERSISTENT, are in the arena). persistent_bytes for a plan
 * without blocks. */
uint64_t cap_plan_outside_arena(const cap_plan_t *plan, const cap_profile_t *p);

/* Check a plan's blocks: within its arena, tied blocks at one offset, and no
 * two that meet in time meeting in bytes (a shared pair excepted). Returns
 * 0, or CAP_EINVAL with a message naming the two tensors and when. */
int cap_plan_check_blocks(const cap_plan_t *plan, char *err, size_t err_len);

/* Check a plan's blocks against the iteration it makes: simulate it and
 * find, for every residency interval, the block of the same tensor, kind and
 * action whose stay covers it; then cap_plan_check_blocks. A plan without
 * blocks passes. Returns 0, CAP_EINVAL with a message, or what the
 * simulator returned. */
int cap_plan_check_placement(const cap_plan_t *plan, const cap_profile_t *p,
                             const cap_bandwidth_t *bw, char *err,
                             size_t err_len);

/* Plan so that the placement fits: cap_plan_compute with the named planner,
 * then cap_plan_place (best strategy); while persistent_bytes + arena
 * exceeds cfg->budget_bytes, plan again aiming that much lower (the planner
 * evicts more or restores later), a few times at most. Returns 0 with *plan
 * and *placement whose need fits the budget, the placement attached to the
 * plan and plan->budget_bytes the budget asked for (the planner may have
 * aimed lower);
 * CAP_EINFEASIBLE when no plan's placement fits, with the last plan and its
 * placement (the smallest need reached in placement->persistent_bytes +
 * arena); what cap_plan_compute returned otherwise. Both outputs are the
 * caller's. */
int cap_plan_compute_placed(const cap_profile_t *p, const char *planner,
                            const cap_plan_config_t *cfg, cap_plan_t **plan,
                            cap_plan_placement_t *placement);

/* Whether the op of this ATen name may write its output over an input
 * (elementwise: every output element depends on the same element of the
 * input only). */
bool cap_op_may_share_input(const char *aten_name);

#endif /* CAPUCHIN_PLACEMENT_H */
