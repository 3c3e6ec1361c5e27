/*
 * Who owns a tensor's device memory (DESIGN.md, "Two ways a framework holds
 * memory"). The executor asks here for a tensor's memory and gives it back
 * here; a tensor the client allocated goes to and from the budgeted BFC
 * allocator (model 1), one the framework adopted to and from the
 * framework's callbacks (model 2, capuchin/framework.h). Nothing else in
 * the executor tells the two apart.
 */
#include <stdio.h>
#include <string.h>

#include "client_impl.h"

int cap__tmem_alloc(cap_client_t *c, uint32_t id, void **p, bool may_evict) {
  const cap__tensor_t *t = &c->tensors[id];
  /* Why it is allocated, from its state: a first touch, or a swap-in (of a
   * weight the plan's placement moved out at install: into its first
   * block; whoever allocates, the client or the framework's allocator). */
  if (t->state == CAP__T_HOST)
    return cap__tmem_alloc_as(c, id,
                              t->out_action == CAP_NONE && t->persistent
                                  ? CAP_RESIDENCY_PERSISTENT
                                  : CAP_RESIDENCY_SWAPPED_IN,
                              t->out_action, p, may_evict);
  return cap__tmem_alloc_as(c, id, CAP_RESIDENCY_FIRST_TOUCH, CAP_NONE, p,
                            may_evict);
}

int cap__tmem_alloc_as(cap_client_t *c, uint32_t id, cap_residency_kind_t kind,
                       uint32_t action, void **p, bool may_evict) {
  cap__tensor_t *t = &c->tensors[id];
  uint64_t bytes = t->bytes ? t->bytes : 1;
  if (!t->framework) {
    /* At its planned address when the plan places it, else the allocator. */
    if (cap__placed_alloc(c, id, kind, action, p) == 0) {
      cap__note_peak(c);
      return 0;
    }
    return cap__alloc_for(c, bytes, p, may_evict);
  }
  /* A prefetch (may_evict false) keeps to the budget or waits for its
   * access. The access itself cannot evict what the framework holds, but it
   * can wait for the swap-outs in flight to give their memory back (an
   * unpack whose prefetch found no room, a weight brought back before the
   * op that reads it, a recompute's outputs); past that it allocates
   * regardless rather than fail the op. Either keeps the room that
   * make_room made for the outputs the framework has yet to allocate for
   * the coming op: they are allocated regardless of the budget. */
  uint64_t need = bytes + cap__fw_outputs_to_come(c);
  if (!may_evict && !cap__dev_budget_has_room(c->dev, need)) {
    cap__reap(c, false);
    if (!cap__dev_budget_has_room(c->dev, need))
      return CAP_EBUDGET;
  } else if (may_evict) {
    (void)cap__fw_wait_room(c, need);
  }
  void *dev = NULL;
  /* Should the framework's allocator be the client's (framework_alloc.c),
   * the memory it asks for now is this restore's block. */
  c->fw_want = (struct cap__fw_want){true, id, action, kind, bytes};
  c->fw_calling++;
  int rc = c->fw_alloc(c->fw_user, id, bytes, &dev);
  c->fw_calling--;
  c->fw_want.on = false;
  if (rc < 0 || !dev) {
    cap__set_error(c, "tensor %u: the framework could not allocate %llu bytes",
                   id, (unsigned long long)bytes);
    return CAP_ENOMEM;
  }
  t->lent = cap__dev_owns(c->dev, dev);
  if (!t->lent)
    cap__dev_track_framework(c->dev, bytes, true);
  cap__note_over(c);
  *p = dev;
  return 0;
}

void cap__tmem_free(cap_client_t *c, uint32_t id, void *p) {
  if (!p)
    return;
  cap__tensor_t *t = &c->tensors[id];
  if (!t->framework) {
    cap__dev_free(c->dev, p);
    return;
  }
  uint64_t bytes = t->bytes ? t->bytes : 1;
  if (!t->lent)
    cap__dev_track_framework(c->dev, bytes, false);
  cap__fw_release(c, id, p, bytes);
}

void cap__fw_release(cap_client_t *c, uint32_t id, void *dev, uint64_t bytes) {
  c->fw_calling++;
  c->fw_release(c->fw_user, id, dev, bytes);
  c->fw_calling--;
}
