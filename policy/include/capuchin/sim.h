/*
 * Discrete-event simulator of one iteration under a plan: a compute stream
 * running the profile's ops in order with their measured durations and gaps,
 * a D2H and an H2D copy engine (each serialising its own copies, the two
 * overlapping up to the duplex bandwidth), recompute ops inserted before
 * back-accesses, and device memory accounted as DESIGN.md says.
 */
#ifndef CAPUCHIN_SIM_H
#define CAPUCHIN_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "capuchin/plan.h"
#include "capuchin/profile.h"

/* Measured host<->device copy bandwidths, GB/s (1e9 bytes per second). */
typedef struct cap_bandwidth {
  double h2d_gbps;
  double d2h_gbps;
  double duplex_gbps; /* both directions at once, in total */
} cap_bandwidth_t;

/* The H100 figures of tests/data/traces/FORMAT.md: the defaults of the
 * planner, the tools and the client's sim backend. */
#define CAP_BANDWIDTH_H100 ((cap_bandwidth_t){55.1, 55.1, 85.8})

/* The copy engines' duplex model, one for the simulator here and the
 * client's sim backend (internal to Capuchin): the rates, GB/s, of a D2H
 * and an H2D copy running at once. Each runs at its own bandwidth when the
 * two fit the duplex bandwidth together; otherwise they share it max-min
 * fairly: each gets min(own, duplex/2), and what one leaves of its half
 * goes to the other, so the two add up to the duplex bandwidth. A copy
 * running alone runs at its own bandwidth. A duplex of 0: no limit. */
void cap__duplex_share(const cap_bandwidth_t *bw, double *d2h_gbps,
                       double *h2d_gbps);

typedef struct cap_sim_prefetch {
  uint32_t action; /* index into plan->actions */
  int64_t late_ns; /* how long the back-access waited for it; 0 if on time */
} cap_sim_prefetch_t;

typedef struct cap_sim_result {
  int64_t iter_ns;      /* end of the last op on the compute stream */
  uint64_t peak_bytes;  /* device bytes, persistent included */
  int64_t peak_t_ns;
  uint64_t swap_out_bytes;
  uint64_t swap_in_bytes;
  int64_t recompute_ns; /* compute time spent replaying ops */
  int64_t stall_ns;     /* compute stream waiting on copies */
  int64_t room_wait_ns; /* of which allocations waiting for room */
  cap_sim_prefetch_t *prefetches; /* one per swap action, in action order */
  uint32_t n_prefetches;
  cap_curve_t curve; /* device bytes over the simulated iteration */
} cap_sim_result_t;

/* Simulate `plan` (NULL: unmanaged) on profile p. The plan must be valid for
 * p (cap_plan_validate). An allocation that would take the device over the
 * plan's budget_bytes (when not 0) waits for the running swap-outs first
 * (docs/plan-semantics.md, "Waiting for room"). Fills *out; release with
 * cap_sim_result_close. */
int cap_sim_run(const cap_profile_t *p, const cap_plan_t *plan,
                const cap_bandwidth_t *bw, cap_sim_result_t *out);
void cap_sim_result_close(cap_sim_result_t *r);

/* One stay of a transient tensor on the device: from its allocation to its
 * eviction or free, in the simulator's time (an H2D copy holds its memory
 * from the copy's start, a D2H until the copy ends). A tensor still there
 * at the end of the iteration stays until iter_ns. Persistent tensors have
 * none unless the plan evicts one: then one from 0 to its eviction, and
 * one for each return. */
typedef struct cap_residency {
  uint32_t tensor;
  cap_residency_kind_t kind;
  int64_t start_ns, end_ns; /* [start_ns, end_ns), start_ns < end_ns is not
                               guaranteed: a list's temporary may be made
                               and dropped at one instant */
  uint64_t bytes;
  uint32_t action;   /* the plan action that brought it back (swap-in,
                        recompute, a list's temporary), CAP_NONE for a first
                        touch or a persistent tensor's first stay */
  uint32_t first_op; /* the op being prepared or run when it was allocated */
  uint32_t last_op;  /* the last op started when it was given back */
  bool copied_out;   /* given back when a D2H copy of it ended */
} cap_residency_t;

/* cap_sim_run that also returns every residency interval of the iteration
 * in *res (n_res of them, in order of allocation; free() it). */
int cap_sim_residency(const cap_profile_t *p, const cap_plan_t *plan,
                      const cap_bandwidth_t *bw, cap_sim_result_t *out,
                      cap_residency_t **res, uint32_t *n_res);

/* Copy time of `bytes` at `gbps`, rounded up to whole nanoseconds. */
int64_t cap_copy_ns(uint64_t bytes, double gbps);

#endif /* CAPUCHIN_SIM_H */
