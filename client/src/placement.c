/*
 * Carrying out a plan's placement (docs/placement.md): the blocks of the
 * installed plan found in O(1) by what makes them, and an allocation that
 * has a block taken at its planned offset in the region. A block whose
 * bytes are still held waits for the copy that holds them (a swap-out
 * still reading its tensor), or, held by a tensor the plan expected gone,
 * is a miss: the allocation goes to the allocator, and the region's own
 * check keeps the two apart.
 */
#include <stdio.h>
#include <stdlib.h>

#include "bfc.h"
#include "client_impl.h"

static uint32_t key_hash(uint32_t tensor, uint32_t kind, uint32_t action) {
  uint64_t h = ((uint64_t)tensor << 32 | action) * 0x9e3779b97f4a7c15ull;
  return (uint32_t)(h >> 32) ^ kind * 0x85ebca6bu;
}

static uint32_t lookup(const cap__xplan_t *x, uint32_t tensor, uint32_t kind,
                       uint32_t action) {
  if (!x->block_mask)
    return CAP_NONE;
  for (uint32_t h = key_hash(tensor, kind, action) & x->block_mask;;
       h = (h + 1) & x->block_mask) {
    uint32_t b = x->block_of[h];
    if (b == CAP_NONE)
      return CAP_NONE;
    const cap_block_t *bl = &x->plan->blocks[b];
    if (bl->tensor == tensor && (uint32_t)bl->kind == kind && bl->action == action)
      return b;
  }
}

/* The region in one piece. When no hole is that big (the tensors still on
 * the device, weights mostly, sit where earlier iterations left them), they
 * go to the host once, the region is made first, and they come back on
 * demand around it: a one-time cost per installed placement. */
/* The tensors living in the region (weights the last plan brought back,
 * tensors kept across the iteration's boundary) go to the host, and the
 * region back to the allocator: a plan without placement, or one whose
 * arena is larger, needs the room. */
static int close_region(cap_client_t *c) {
  if (!cap__dev_has_region(c->dev))
    return 0;
  cap__reap(c, true);
  for (uint32_t id = 0; id < c->n_tensors; id++) {
    const cap__tensor_t *t = &c->tensors[id];
    int rc;
    if (t->state == CAP__T_DEVICE && t->dev && cap__dev_in_region(c->dev, t->dev) &&
        (rc = cap__swap_out(c, id, CAP_NONE, true)) < 0)
      return rc;
  }
  cap__dev_region_close(c->dev);
  return 0;
}

static int open_region(cap_client_t *c, const cap__xplan_t *x) {
  uint64_t bytes = x->plan->arena_bytes;
  int rc = cap__dev_region_open(c->dev, bytes);
  if (rc == CAP_ESTATE) { /* a smaller one still has tensors in it */
    if ((rc = close_region(c)) < 0)
      return rc;
    rc = cap__dev_region_open(c->dev, bytes);
  }
  if (rc != CAP_EBUDGET)
    return rc;
  cap__reap(c, true);
  /* Weights the plan evicts live in the arena (their first block starts
   * the iteration): they leave the allocator first, and come back into
   * their blocks at their first access. */
  for (uint32_t b = 0; b < x->plan->n_blocks; b++) {
    const cap_block_t *bl = &x->plan->blocks[b];
    if (bl->kind != CAP_RESIDENCY_PERSISTENT || bl->tensor >= c->n_tensors)
      continue;
    const cap__tensor_t *t = &c->tensors[bl->tensor];
    if (t->state == CAP__T_DEVICE && !t->pinned && !t->framework &&
        (rc = cap__swap_out(c, bl->tensor, CAP_NONE, true)) < 0)
      return rc;
  }
  if (!cap__dev_budget_has_room(c->dev, bytes))
    return CAP_EBUDGET;
  rc = cap__dev_region_open(c->dev, bytes);
  if (rc != CAP_EBUDGET)
    return rc;
  for (uint32_t id = 0; id < c->n_tensors; id++) {
    const cap__tensor_t *t = &c->tensors[id];
    if (t->state == CAP__T_DEVICE && !t->pinned && !t->framework &&
        (rc = cap__swap_out(c, id, CAP_NONE, true)) < 0)
      return rc;
  }
  return cap__dev_region_open(c->dev, bytes);
}

/* Why the arena did not fit, in what a user can act on: what was in use
 * against the budget, by the tensors the client tracks (weights and
 * optimizer state, the rest) and by memory no tracked tensor holds (a
 * framework's workspaces, tensors made outside the steps). */
static void refusal_note(cap_client_t *c, cap__xplan_t *x, int rc) {
  uint64_t persistent = 0, other = 0;
  for (uint32_t id = 0; id < c->n_tensors; id++) {
    const cap__tensor_t *t = &c->tensors[id];
    if (t->dev && (t->state == CAP__T_DEVICE || t->state == CAP__T_IN ||
                   t->state == CAP__T_OUT))
      *(t->persistent ? &persistent : &other) += t->bytes;
  }
  uint64_t in_use = cap__dev_in_use(c->dev), tracked = persistent + other;
  snprintf(x->note, sizeof x->note,
           "placement refused: no room for its arena of %llu bytes (%s: "
           "budget %llu, in use %llu: persistent tensors %llu, others %llu, "
           "untracked %llu); tensors come from the allocator",
           (unsigned long long)x->plan->arena_bytes, cap_strerror(rc),
           (unsigned long long)c->budget_bytes, (unsigned long long)in_use,
           (unsigned long long)persistent, (unsigned long long)other,
           (unsigned long long)(in_use > tracked ? in_use - tracked : 0));
}

int cap__placement_index(cap_client_t *c, cap__xplan_t *x) {
  const cap_plan_t *plan = x->plan;
  if (!plan->n_blocks || (c->fw_alloc && !c->fw_placement))
    return close_region(c); /* nothing placed, or the framework places its
                               tensors (unless its allocator is routed here,
                               framework_alloc.c): the room goes back */
  uint32_t cap = 16;
  while (cap < 2 * plan->n_blocks)
    cap *= 2;
  x->block_of = malloc((size_t)cap * sizeof *x->block_of);
  if (!x->block_of)
    return CAP_ENOMEM;
  for (uint32_t i = 0; i < cap; i++)
    x->block_of[i] = CAP_NONE;
  x->block_mask = cap - 1;
  for (uint32_t b = 0; b < plan->n_blocks; b++) {
    const cap_block_t *bl = &plan->blocks[b];
    uint32_t h = key_hash(bl->tensor, bl->kind, bl->action) & x->block_mask;
    while (x->block_of[h] != CAP_NONE)
      h = (h + 1) & x->block_mask;
    x->block_of[h] = b;
  }
  int rc = open_region(c, x);
  if (rc < 0) {
    /* The plan still runs; its tensors come from the allocator. */
    if (!x->note[0])
      refusal_note(c, x, rc);
    free(x->block_of);
    x->block_of = NULL;
    x->block_mask = 0;
  }
  return 0;
}

/* An output that may take over its input's block (placement.h, `share`):
 * the block is held by that input, an input of the op being begun. */
static bool takes_over(const cap_client_t *c, const cap_block_t *bl,
                       const void *busy) {
  if (bl->share == CAP_NONE || !busy)
    return false;
  uint32_t x = c->x.plan->blocks[bl->share].tensor;
  if (x >= c->n_tensors || c->tensors[x].dev != busy)
    return false;
  /* Nobody may read the input after this op: not a swap-out the plan makes
   * here, nor one the client makes instead of a recompute that failed. */
  const cap__slot_t *s = cap__slot_at(&c->x, x, c->tensors[x].n_access + 1);
  if (s && s->evict != CAP_NONE &&
      (c->x.plan->actions[s->evict].method == CAP_METHOD_SWAP ||
       c->x.fallback[s->evict]))
    return false;
  for (uint32_t i = 0; i < c->op_n_in; i++)
    if (c->op_in[i] == x)
      return true;
  return false;
}

bool cap__placement_has(const cap_client_t *c, uint32_t id,
                         cap_residency_kind_t kind, uint32_t action) {
  return c->mode == CAP_MODE_GUIDED && lookup(&c->x, id, kind, action) != CAP_NONE;
}

int cap__placement_drop(cap_client_t *c) {
  free(c->x.block_of);
  c->x.block_of = NULL;
  c->x.block_mask = 0;
  return close_region(c);
}

/* may_share: an output may take over its input's block (only while the
 * client begins the op, which lists the input). */
static int placed(cap_client_t *c, uint32_t id, cap_residency_kind_t kind,
                  uint32_t action, bool may_share, void **p) {
  if (c->mode != CAP_MODE_GUIDED)
    return CAP_ENOENT;
  uint32_t b = lookup(&c->x, id, kind, action);
  if (b == CAP_NONE)
    return CAP_ENOENT;
  const cap_block_t *bl = &c->x.plan->blocks[b];
  const cap__tensor_t *t = &c->tensors[id];
  uint64_t len = (bl->bytes + CAP_BFC_GRANULE - 1) & ~(uint64_t)(CAP_BFC_GRANULE - 1);
  if (t->bytes > bl->bytes) {
    c->it.placement_misses++;
    return CAP_ENOENT;
  }
  for (;;) {
    void *busy = NULL;
    int rc = cap__dev_region_take(c->dev, bl->offset, len, p, &busy);
    if (rc == CAP_EAGAIN && may_share && takes_over(c, bl, busy))
      rc = cap__dev_region_share(c->dev, bl->offset, len, p);
    if (rc == 0) {
      c->it.placed_allocs++;
      return 0;
    }
    if (rc != CAP_EAGAIN || !cap__retire_wait_dev(c, busy))
      break;
  }
  c->it.placement_misses++;
  return CAP_ENOENT;
}

int cap__placed_alloc(cap_client_t *c, uint32_t id, cap_residency_kind_t kind,
                      uint32_t action, void **p) {
  return placed(c, id, kind, action, true, p);
}

int cap__placed_alloc_unshared(cap_client_t *c, uint32_t id,
                               cap_residency_kind_t kind, uint32_t action,
                               void **p) {
  return placed(c, id, kind, action, false, p);
}
