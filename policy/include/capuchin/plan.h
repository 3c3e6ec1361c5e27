/*
 * A plan: per-tensor eviction actions for one profile and budget
 * (DESIGN.md, "Plan semantics"). Shared by the simulator, the planners, the
 * daemon (stores and sends it) and the client (executes it).
 */
#ifndef CAPUCHIN_PLAN_H
#define CAPUCHIN_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "capuchin/profile.h"

typedef enum {
  CAP_METHOD_SWAP = 1,      /* D2H to pinned host memory, H2D back */
  CAP_METHOD_RECOMPUTE = 2, /* drop, replay lineage ops before back-access */
} cap_method_t;

/* cap_action_t.flags */
#define CAP_ACTION_SYNC_OUT 0x1u /* swap-out runs on the compute stream: the
                                    next op waits for it (save_on_cpu, LRU) */

/* A release is a recompute action with an empty list whose evicted-access
 * is the tensor's last one: there is no back-access, so its memory is given
 * back as soon as that op ends instead of at the framework's free (PyTorch
 * keeps gradients until zero_grad, the optimizer step reads them last).
 * Only tensors freed within the iteration may be released; no recompute
 * list may read one after its release. */
typedef struct cap_action {
  uint32_t tensor;
  uint32_t evict_after_access; /* k >= 1; the back-access is k + 1 (none
                                  for a release) */
  cap_method_t method;
  uint32_t flags;              /* CAP_ACTION_* */
  /* swap: the prefetch starts when op of access prefetch_access of tensor
   * prefetch_tensor starts; prefetch_tensor == CAP_NONE: on demand at the
   * back-access. */
  uint32_t prefetch_tensor;
  uint32_t prefetch_access;
  /* recompute: op seqs replayed in order just before the back-access, the
   * last producing `tensor`: plan->recompute_ops[recompute_off ..
   * recompute_off + n_recompute). */
  uint32_t recompute_off;
  uint32_t n_recompute;
} cap_action_t;

/* How a block of device memory came to hold a tensor. */
typedef enum {
  CAP_RESIDENCY_FIRST_TOUCH = 0, /* allocated at its first access */
  CAP_RESIDENCY_SWAPPED_IN = 1,  /* brought back by a prefetch or on demand */
  CAP_RESIDENCY_RECOMPUTED = 2,  /* restored by a recompute list */
  CAP_RESIDENCY_TEMPORARY = 3,   /* a recompute list's intermediate, kept
                                    until the list ends */
  CAP_RESIDENCY_PERSISTENT = 4,  /* a persistent tensor the plan evicts: on
                                    the device since before the iteration */
} cap_residency_kind_t;

/* "first_touch", "swapped_in", "recomputed", "temporary", "persistent";
 * NULL for an unknown kind. */
const char *cap_residency_kind_name(cap_residency_kind_t k);

/* A block of the plan's placement: where in the arena one stay of a tensor
 * on the device lives (placement.h). The client finds the block of an
 * allocation by what makes it: the tensor's first touch, the swap-in or the
 * recompute of an action, a list's temporary, or a persistent tensor's
 * stay from the iteration's start. */
typedef struct cap_block {
  uint32_t tensor;
  cap_residency_kind_t kind;
  uint32_t action;  /* see cap_residency_t.action */
  uint64_t offset;  /* from the arena's base */
  uint64_t bytes;
  int64_t start_ns, end_ns; /* predicted stay, [start_ns, end_ns) */
  uint32_t share;   /* the block whose bytes this one takes over during the
                       op that is the other's last use, or CAP_NONE */
  uint32_t same_as; /* the block at the same offset across the iteration's
                       boundary, or CAP_NONE */
} cap_block_t;

typedef struct cap_plan {
  uint32_t version;      /* 1 for a new plan, +1 for each refinement */
  /* The job's budget the plan was made for, persistent bytes included:
   * what the client enforces while the plan is in force. The planner may
   * have aimed lower (the daemon's alloc-headroom), and a plan that found
   * no way under it keeps it all the same (the planner's CAP_EINFEASIBLE:
   * predicted_peak_bytes above budget_bytes). */
  uint64_t budget_bytes;
  char policy[32];       /* planner name ("capuchin", "swap-all", ...) */
  cap_action_t *actions;
  uint32_t n_actions;
  uint32_t cap_actions;
  uint32_t *recompute_ops;
  uint32_t n_recompute_ops;
  uint32_t cap_recompute_ops;
  /* What the simulator predicted for this plan (0 when not simulated). */
  int64_t predicted_iter_ns;
  uint64_t predicted_peak_bytes;
  /* Placement (none when n_blocks is 0): the transient tensors' blocks in
   * one arena of arena_bytes, beside the persistent tensors that stay. */
  cap_block_t *blocks;
  uint32_t n_blocks;
  uint64_t arena_bytes;
} cap_plan_t;

cap_plan_t *cap_plan_create(const char *policy, uint64_t budget_bytes);
void cap_plan_destroy(cap_plan_t *plan); /* NULL is a no-op */
cap_plan_t *cap_plan_clone(const cap_plan_t *plan);

/* Replace the plan's placement by a copy of blocks[0..n) (n 0: none). */
int cap_plan_set_blocks(cap_plan_t *plan, const cap_block_t *blocks,
                        uint32_t n, uint64_t arena_bytes);

int cap_plan_add_swap(cap_plan_t *plan, uint32_t tensor, uint32_t evict_after,
                      uint32_t prefetch_tensor, uint32_t prefetch_access,
                      uint32_t flags);
/* n_ops == 0 (ops may be NULL) adds a release. */
int cap_plan_add_recompute(cap_plan_t *plan, uint32_t tensor,
                           uint32_t evict_after, const uint32_t *ops,
                           uint32_t n_ops);
/* Release tensor after its last access (see cap_action_t). */
static inline int cap_plan_add_release(cap_plan_t *plan, uint32_t tensor,
                                       uint32_t last_access) {
  return cap_plan_add_recompute(plan, tensor, last_access, NULL, 0);
}

static inline bool cap_action_is_release(const cap_action_t *a) {
  return a->method == CAP_METHOD_RECOMPUTE && a->n_recompute == 0;
}

/* The action's recompute list (NULL for a swap or a release). */
static inline const uint32_t *cap_action_recompute_ops(const cap_plan_t *plan,
                                                       const cap_action_t *a) {
  if (a->n_recompute == 0 || !plan->recompute_ops)
    return NULL;
  return plan->recompute_ops + a->recompute_off;
}

/* Check every action against the profile: tensor ids, access indices (a
 * back-access must exist, except for a release at the last access of a
 * tensor freed within the iteration), triggers that precede the
 * back-access, recompute lists whose ops exist, run before the back-access,
 * end with the tensor's producer and replay every write up to the
 * evicted-access; then walk the plan (cap_plan_walk) so that every list can
 * run exactly as written. Returns 0 or CAP_EINVAL with a message in err. */
int cap_plan_validate(const cap_plan_t *plan, const cap_profile_t *p, char *err,
                      size_t err_len);

/* Why a recompute list cannot run as written (cap_plan_walk). */
typedef enum {
  CAP_LACK_NONE = 0,
  CAP_LACK_DROPPED,  /* the plan dropped the source; the list does not
                        recompute it first */
  CAP_LACK_SWAPPED,  /* swapped out, its prefetch not issued by then */
  CAP_LACK_FREED,    /* the framework freed it before the back-access */
  CAP_LACK_RELEASED, /* the plan released it after its last access */
  CAP_LACK_UNBORN,   /* not created yet */
  CAP_LACK_WRITTEN,  /* written in place since the listed op first ran */
} cap_lack_t;

/* The first recompute action that cannot run as written. */
typedef struct cap_plan_fault {
  uint32_t action;   /* index in plan->actions; CAP_NONE: no fault */
  uint32_t op;       /* the listed op that cannot run */
  uint32_t source;   /* the input it lacks */
  uint32_t by;       /* the action that took the source off the device, or
                        CAP_NONE (freed, written) */
  uint32_t since_op; /* the op after which the source left the device */
  cap_lack_t lack;
} cap_plan_fault_t;

/* Walk the plan over the profile op by op, exactly as the client executes
 * it (docs/plan-semantics.md), and check that every recompute list that
 * runs finds each input of each listed op produced earlier in the list, or
 * on the device (resident, or coming back by a prefetch issued by an op
 * before the back-access) and unmodified since. Nothing is restored implicitly.
 * Expects a plan that passed the static checks (cap_plan_validate calls
 * this after them). Returns 0, CAP_EINVAL with *fault (may be NULL) set, or
 * CAP_ENOMEM. */
int cap_plan_walk(const cap_plan_t *plan, const cap_profile_t *p,
                  cap_plan_fault_t *fault);
/* "dropped by the plan and not recomputed earlier in the list", ... */
const char *cap_lack_name(cap_lack_t lack);
/* One line naming the action, the tensor, the listed op, the source and the
 * reason; returns what snprintf returns. */
int cap_plan_fault_format(const cap_plan_t *plan, const cap_profile_t *p,
                          const cap_plan_fault_t *f, char *buf, size_t len);

/* JSON form (capuchin-sim --emit-plan):
 * {"trace":…, "budget_bytes":…, "policy":…, "actions":[{"tensor":ID,
 *  "evict_after_access":K, "method":"swap", "prefetch_at":{"tensor":ID,
 *  "access":K}} | {…, "method":"recompute", "recompute_ops":[seq, …]}]} */
int cap_plan_write_json(FILE *f, const cap_plan_t *plan, const char *trace);
int cap_plan_read_json(const char *buf, size_t len, cap_plan_t **out,
                       char *err, size_t err_len);

#endif /* CAPUCHIN_PLAN_H */
