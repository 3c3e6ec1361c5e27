/*
 * Placement under the framework's allocator (capuchin/framework_alloc.h):
 * which of the plan's blocks an allocation the framework makes is, from
 * what the client knows without being told, and its memory from the same
 * code that places and allocates the client's own tensors in model 1 (the
 * region through placement.c, the rest through evict.c's cap__alloc_for).
 *
 * The framework allocates an op's outputs while the op runs, before it
 * reports the op and adopts them. So a first touch is recognised by where
 * the iteration is: the outputs the op about to be reported adopts take,
 * in order, the ids the first iteration's declarations took
 * (cap_client_declare), so the op's n-th allocation of the next such
 * tensor's size is that tensor. A restore is recognised by the client
 * itself asking for the memory.
 */
#include "capuchin/framework_alloc.h"
#include "client_impl.h"

int cap_client_set_framework_placement(cap_client_t *c, bool on) {
  if (!c || !c->fw_alloc)
    return CAP_EINVAL;
  c->fw_placement = on;
  return 0;
}

/* The tensor an allocation of `bytes` will be adopted as, when it has the
 * size of the next declaration this op has not claimed yet (it claims it:
 * the framework adopts an op's outputs in the order it allocated them;
 * claims start again at each op) and the plan places that tensor's first
 * touch; CAP_NONE otherwise (a workspace, a shape that changed, a tensor
 * the plan did not place). */
static uint32_t first_touch_of(cap_client_t *c, uint64_t bytes) {
  if (!c->in_iter || c->op_open || c->fw_calling)
    return CAP_NONE; /* (what a callback of the client's allocates) */
  if (c->fw_iter != c->iteration || c->fw_op != c->op_seq) {
    c->fw_iter = c->iteration;
    c->fw_op = c->op_seq;
    c->fw_next_decl = c->transient_decl;
  }
  uint32_t k =
      c->fw_next_decl > c->transient_decl ? c->fw_next_decl : c->transient_decl;
  if (k >= c->n_transient_ids)
    return CAP_NONE;
  uint32_t id = c->transient_ids[k];
  const cap__tensor_t *t = &c->tensors[id];
  if (t->state != CAP__T_UNUSED || t->bytes != bytes)
    return CAP_NONE;
  c->fw_next_decl = k + 1;
  return cap__placement_has(c, id, CAP_RESIDENCY_FIRST_TOUCH, CAP_NONE)
             ? id
             : CAP_NONE;
}

int cap_client_framework_alloc(cap_client_t *c, uint64_t bytes, void **dev) {
  if (!c || !dev)
    return CAP_EINVAL;
  *dev = NULL;
  int rc = CAP_ENOENT;
  if (c->fw_want.on && c->fw_want.bytes == bytes) {
    c->fw_want.on = false; /* one allocation per ask */
    rc = cap__placed_alloc_unshared(c, c->fw_want.id, c->fw_want.kind,
                                    c->fw_want.action, dev);
  } else {
    uint32_t id = first_touch_of(c, bytes);
    if (id != CAP_NONE)
      rc = cap__placed_alloc_unshared(c, id, CAP_RESIDENCY_FIRST_TOUCH,
                                      CAP_NONE, dev);
  }
  /* Not placed: the budget's room, then the room the placement leaves
   * free. Nothing is evicted synchronously (the framework's tensors are
   * its own to give up), but swap-outs in flight are waited for. */
  if (rc < 0 && (rc = cap__alloc_for(c, bytes, dev, false)) < 0)
    return rc;
  cap__note_peak(c);
  atomic_fetch_add_explicit(&c->fw_lent, 1, memory_order_relaxed);
  return 0;
}

int cap_client_framework_free(cap_client_t *c, void *dev) {
  if (!c || !dev)
    return CAP_EINVAL;
  if (!cap__dev_owns(c->dev, dev))
    return CAP_ENOENT;
  cap__dev_free(c->dev, dev);
  atomic_fetch_sub_explicit(&c->fw_lent, 1, memory_order_relaxed);
  atomic_store_explicit(&c->ctr.device_bytes, cap__dev_in_use(c->dev),
                        memory_order_relaxed);
  return 0;
}

uint64_t cap_client_framework_lent(cap_client_t *c) {
  return c ? atomic_load_explicit(&c->fw_lent, memory_order_relaxed) : 0;
}
