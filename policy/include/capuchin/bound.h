/*
 * A lower bound on what any plan must cost, from one window of the
 * iteration (window_bound.c explains the argument).
 *
 * tools/lower_bound.py's linear program bounds a plan's cost over the whole
 * iteration, but checks memory only at up to a few hundred ops (bins of
 * consecutive over-budget ops), so it misses the windows where a few ops
 * force tensors off the device that must be back a moment later: an
 * optimizer step that reads every gradient, then every parameter. This
 * bound looks at every such window exactly, with no solver; the larger of
 * the two is a bound too.
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
  uint64_t off_bytes; /* at least this many bytes off at from_op */
} cap_window_bound_t;

/* The bound for plans within budget_bytes that evict what the planner may
 * (evict_persistent as in cap_plan_config_t), with swap-ins at h2d_gbps
 * (GB/s) at most. CAP_EINVAL for a bad argument, CAP_ENOMEM. */
int cap_window_bound(const cap_profile_t *p, uint64_t budget_bytes,
                     bool evict_persistent, double h2d_gbps,
                     cap_window_bound_t *out);

#endif /* CAPUCHIN_BOUND_H */
