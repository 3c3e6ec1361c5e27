/*
 * swap-all: PyTorch's torch.autograd.graph.save_on_cpu. Every activation
 * saved for backward (accessed in forward and again in backward) is copied
 * to host memory by the pack hook on the compute stream, so the op after it
 * waits for the copy, and copied back by the unpack hook when backward needs
 * it, on demand, with nothing prefetched. The copy-out happens after the
 * access that precedes the tensor's longest idle gap. The budget does not
 * change what it does: a user turns it on and gets what it gives.
 */
#include "capuchin/error.h"
#include "planners.h"

int cap__plan_swap_all(const cap_profile_t *p, const cap_plan_config_t *cfg,
                       cap_plan_t **out) {
  cap_plan_t *plan = cap_plan_create("swap-all", cfg->budget_bytes);
  if (!plan)
    return CAP_ENOMEM;
  uint32_t bwd = cap__backward_start(p);
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    const cap_tensor_t *ct = &p->tensors[t];
    if (ct->kind != CAP_KIND_ACTIVATION || !cap__evictable(p, cfg, t))
      continue;
    const uint32_t *acc = p->access_ops + ct->access_off;
    /* Saved for backward: touched on both sides of the boundary (with no
     * backward op in the profile, every multi-access activation). */
    if (bwd < p->n_ops && !(acc[0] < bwd && acc[ct->n_accesses - 1] >= bwd))
      continue;
    uint32_t best = 0;
    int64_t best_gap = -1;
    for (uint32_t k = 1; k < ct->n_accesses; k++) {
      int64_t gap = p->ops[acc[k]].start_ns - p->ops[acc[k - 1]].end_ns;
      if (gap > best_gap) {
        best_gap = gap;
        best = k;
      }
    }
    int rc = cap_plan_add_swap(plan, t, best, CAP_NONE, 0, CAP_ACTION_SYNC_OUT);
    if (rc) {
      cap_plan_destroy(plan);
      return rc;
    }
  }
  *out = plan;
  return 0;
}
