/*
 * vdnn: vDNN (Rhu et al., MICRO 2016), its static policy over heavy layers
 * (vDNN_conv, with matrix products as the transformers' heavy layers). In
 * forward, each activation that a heavy layer reads and backward needs again
 * is offloaded to host memory once its last forward use ends, and the next
 * layer waits for the offload (vDNN synchronises its memory stream at each
 * layer boundary so that the buffer can be released); in backward it is
 * prefetched one layer ahead: the copy starts when the heavy layer before
 * its back-access starts, and the back-access waits for it.
 * The budget does not change the plan (vDNN_dyn only chooses between this
 * and not offloading, and no budget here fits without offloading).
 */
#include "capuchin/error.h"
#include "planners.h"

/* Name an access at op: its first input or output with an access there. */
static bool trigger_at(const cap_profile_t *p, uint32_t op, uint32_t *tensor,
                       uint32_t *access) {
  const cap_op_t *o = &p->ops[op];
  const uint32_t *in = cap_op_inputs(p, o), *outs = cap_op_outputs(p, o);
  for (uint32_t j = 0; j < o->n_in + o->n_out; j++) {
    uint32_t x = j < o->n_in ? in[j] : outs[j - o->n_in];
    uint32_t k = cap_profile_access_index(p, x, op);
    if (k) {
      *tensor = x;
      *access = k;
      return true;
    }
  }
  return false;
}

int cap__plan_vdnn(const cap_profile_t *p, const cap_plan_config_t *cfg,
                   cap_plan_t **out) {
  cap_plan_t *plan = cap_plan_create("vdnn", cfg->budget_bytes);
  if (!plan)
    return CAP_ENOMEM;
  uint32_t bwd = cap__backward_start(p);
  int rc = 0;
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    const cap_tensor_t *ct = &p->tensors[t];
    if (ct->kind != CAP_KIND_ACTIVATION || !cap__evictable(p, cfg, t))
      continue;
    const uint32_t *acc = p->access_ops + ct->access_off;
    /* k: number of forward accesses; the tensor must be read by a heavy
     * forward layer and accessed again in backward. */
    uint32_t k = 0;
    bool heavy_input = false;
    while (k < ct->n_accesses && acc[k] < bwd) {
      const cap_op_t *o = &p->ops[acc[k]];
      const uint32_t *in = cap_op_inputs(p, o);
      if (cap__op_is_heavy(p, acc[k]))
        for (uint32_t j = 0; j < o->n_in && !heavy_input; j++)
          heavy_input = in[j] == t;
      k++;
    }
    if (!heavy_input || k == 0 || k >= ct->n_accesses)
      continue;
    uint32_t evict_op = acc[k - 1], back_op = acc[k];
    /* One layer ahead: the nearest heavy op before the back-access. */
    uint32_t trig = CAP_NONE;
    for (uint32_t op = back_op; op-- > evict_op + 1;)
      if (cap__op_is_heavy(p, op)) {
        trig = op;
        break;
      }
    uint32_t tt = CAP_NONE, ta = 0;
    if (trig != CAP_NONE && !trigger_at(p, trig, &tt, &ta))
      tt = CAP_NONE;
    rc = cap_plan_add_swap(plan, t, k, tt, tt == CAP_NONE ? 0 : ta,
                           CAP_ACTION_SYNC_OUT);
    if (rc)
      break;
  }
  if (rc) {
    cap_plan_destroy(plan);
    return rc;
  }
  *out = plan;
  return 0;
}
