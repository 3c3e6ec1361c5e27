/*
 * A lower bound on what any plan must cost at a budget, from one window of
 * the iteration (window_bound.c explains the argument), in milliseconds and
 * with no solver: capuchin-sim prints it under its table, so that a user
 * sees how much of a plan's cost any plan would pay at that budget.
 *
 * A window is two ops: so many bytes must be off the device when the first
 * starts that bringing them back by the second makes the compute stream
 * wait (an optimizer step that reads every gradient, then every weight).
 * tests/tools/lower_bound_tight.py's forced copies are the same argument
 * inside the linear program, with a MILP for the replays, at the
 * likeliest ops; this one tries every op, with the cheapest replay rate
 * instead of the MILP: lower on most budgets, higher where the likeliest op
 * is not the worst (bert_large at 30 % with persistent eviction: 22.59
 * against 20.11 % of the iteration, op 3332's pinch rather than 3336's).
 */
#ifndef CAPUCHIN_BOUND_H
#define CAPUCHIN_BOUND_H

#include <stdbool.h>
#include <stdint.h>

#include "capuchin/profile.h"

typedef struct cap_window_bound {
  /* No plan's simulated iteration is shorter than the unmanaged one plus
   * this (ns); 0 when no window forces a cost. */
  int64_t extra_ns;
  /* The window that forces it: tensors must be off the device when op
   * from_op starts and back by op to_op; CAP_NONE when extra_ns is 0. */
  uint32_t from_op, to_op;
  int64_t window_ns;  /* from from_op's start to to_op's, unmanaged */
  uint64_t off_bytes; /* at least this many bytes off at from_op */
} cap_window_bound_t;

/* The bound for plans within budget_bytes that evict what the planner may
 * (evict_persistent as in cap_plan_config_t), with swap-ins at h2d_gbps
 * (GB/s) at most. CAP_EINVAL for a bad argument, CAP_ENOMEM. */
int cap_window_bound(const cap_profile_t *p, uint64_t budget_bytes,
                     bool evict_persistent, double h2d_gbps,
                     cap_window_bound_t *out);

#endif /* CAPUCHIN_BOUND_H */
