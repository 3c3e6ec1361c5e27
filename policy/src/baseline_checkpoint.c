/*
 * checkpoint-sqrt: Chen et al., "Training Deep Nets with Sublinear Memory
 * Cost" (2016). The forward pass is cut into about sqrt(n) segments of equal
 * op count. Tensors that cross a segment boundary in forward (segment
 * inputs: the checkpoints) stay; every other activation that backward needs
 * is dropped after its last forward use and recomputed in backward by
 * replaying its segment from the checkpoints, once per segment: the replay
 * list ends at the tensor's last writer and restores every dropped tensor
 * it produces on the way (DESIGN.md plan semantics). An op is never replayed
 * over an input modified in place since it ran (cap__lineage goes further
 * back instead, or keeps the tensor). The budget does not change the plan.
 */
#include <math.h>
#include <stdlib.h>

#include "capuchin/error.h"
#include "planners.h"

int cap__plan_checkpoint_sqrt(const cap_profile_t *p,
                              const cap_plan_config_t *cfg, cap_plan_t **out) {
  cap_plan_t *plan = cap_plan_create("checkpoint-sqrt", cfg->budget_bytes);
  uint8_t *gone = calloc((size_t)(p->n_tensors ? p->n_tensors : 1), 1);
  uint32_t *kfwd = calloc((size_t)(p->n_tensors ? p->n_tensors : 1), sizeof *kfwd);
  cap__lineage_t lin = {0};
  int rc = 0;
  if (!plan || !gone || !kfwd) {
    rc = CAP_ENOMEM;
    goto out;
  }
  uint32_t bwd = cap__backward_start(p);
  uint32_t n_fwd = bwd ? bwd : 1;
  uint32_t n_seg = (uint32_t)ceil(sqrt((double)n_fwd));
  if (n_seg == 0)
    n_seg = 1;
#define SEG(op) ((uint32_t)((uint64_t)(op) * n_seg / n_fwd))
  /* Which tensors to drop: produced in forward, used again in backward,
   * every forward use inside the producer's segment. */
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    const cap_tensor_t *ct = &p->tensors[t];
    if (ct->kind != CAP_KIND_ACTIVATION || !cap__evictable(p, cfg, t) ||
        ct->producer_op == CAP_NONE || ct->producer_op >= bwd)
      continue;
    const uint32_t *acc = p->access_ops + ct->access_off;
    uint32_t k = 0;
    bool crosses = false;
    while (k < ct->n_accesses && acc[k] < bwd) {
      crosses |= SEG(acc[k]) != SEG(ct->producer_op);
      k++;
    }
    if (crosses || k == 0 || k >= ct->n_accesses)
      continue;
    gone[t] = 1;
    kfwd[t] = k;
  }
  uint32_t max_ops = 4 * (n_fwd / n_seg + 1) + 64;
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    if (!gone[t])
      continue;
    const cap_tensor_t *ct = &p->tensors[t];
    const uint32_t *acc = p->access_ops + ct->access_off;
    uint32_t evict_op = acc[kfwd[t] - 1], back_op = acc[kfwd[t]];
    rc = cap__lineage(&lin, p, t, evict_op, back_op, gone, max_ops);
    if (rc == CAP_ENOENT) {
      /* Cannot be rebuilt correctly: keep it. Lists built so far that
       * counted it as dropped replay its producer; they stay correct. */
      gone[t] = 0;
      rc = 0;
      continue;
    }
    if (rc)
      goto out;
    rc = cap_plan_add_recompute(plan, t, kfwd[t], lin.ops, lin.n_ops);
    if (rc)
      goto out;
  }
#undef SEG
out:
  cap__lineage_close(&lin);
  free(gone);
  free(kfwd);
  if (rc) {
    cap_plan_destroy(plan);
    return rc;
  }
  *out = plan;
  return 0;
}
