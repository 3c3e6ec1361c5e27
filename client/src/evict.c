/*
 * Evictions: swap-outs (planned, or synchronous on demand), and making room
 * for an allocation that does not fit: finished copies first, then running
 * swap-outs, then a window of neighbours (fragmentation) or the least
 * recently used tensor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

int cap__swap_out(cap_client_t *c, uint32_t id, uint32_t action, bool sync) {
  cap__tensor_t *t = &c->tensors[id];
  void *host = NULL;
  cap__ev_t *ev = NULL;
  int rc = cap__host_alloc(c->dev, t->bytes, &host);
  if (rc < 0)
    return rc;
  rc = cap__copy_d2h(c->dev, host, t->dev, t->bytes, &ev);
  if (rc < 0)
    goto out_free_host;
  if (sync) {
    int64_t t0 = cap__now_ns(c->dev);
    rc = cap__ev_sync(c->dev, ev);
    cap__note_wait(c, cap__now_ns(c->dev) - t0, true);
    cap__ev_release(c->dev, ev);
    if (rc < 0)
      goto out_free_host;
    cap__tmem_free(c, id, t->dev);
    t->dev = NULL;
    t->host = host;
    t->state = CAP__T_HOST;
    atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c->dev));
  } else {
    rc = cap__retire_push(c, ev, t->dev, NULL, 0, id,
                          t->framework ? id : CAP_NONE);
    if (rc < 0) {
      cap__ev_sync(c->dev, ev);
      cap__ev_release(c->dev, ev);
      goto out_free_host;
    }
    t->host = host;
    t->state = CAP__T_OUT;
  }
  t->out_action = action;
  t->prefetch_due = 0;
  t->gone_op = c->op_seq ? c->op_seq - 1 : 0;
  c->it.bytes_out += t->bytes;
  c->it.evictions++;
  atomic_fetch_add(&c->ctr.bytes_out, t->bytes);
  atomic_fetch_add(&c->ctr.evictions, 1);
  return 0;
out_free_host:
  cap__host_free(c->dev, host, t->bytes);
  return rc;
}

/* Passive mode: swap out the least recently used evictable tensor
 * synchronously. false when none is left. */
static bool evict_lru(cap_client_t *c) {
  uint32_t best = CAP_NONE;
  uint64_t best_lru = UINT64_MAX;
  /* Transient tensors first; persistent ones (weights, optimizer state)
   * only when nothing else is left, e.g. an optimizer op whose own tensors
   * fill the budget: the job goes on rather than fail. */
  for (int pass = 0; pass < 2 && best == CAP_NONE; pass++) {
    for (uint32_t i = 0; i < c->n_tensors; i++) {
      const cap__tensor_t *t = &c->tensors[i];
      if (t->state == CAP__T_DEVICE && t->persistent == pass && !t->pinned &&
          t->lru < best_lru) {
        best = i;
        best_lru = t->lru;
      }
    }
  }
  if (best == CAP_NONE)
    return false;
  if (cap__swap_out(c, best, CAP_NONE, true) != 0)
    return false;
  c->it.lru_evictions++;
  return true;
}

/* Fragmentation: the budget has room but no free chunk is big enough.
 * Swap out the few tensors that sit between free chunks (the cheapest run,
 * cap_bfc_find_window) instead of LRU victims that may lie anywhere. */
typedef struct {
  const void *ptr;
  uint32_t id;
  uint32_t weight; /* 1 least recently used .. 16 most */
  uint64_t lru;
} dev_owner_t;

static int owner_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const dev_owner_t *)a)->ptr;
  uintptr_t y = (uintptr_t)((const dev_owner_t *)b)->ptr;
  return x < y ? -1 : x > y;
}

typedef struct {
  dev_owner_t *v;
  uint32_t n;
} owners_t;

static const dev_owner_t *owner_of(const owners_t *o, const void *ptr) {
  dev_owner_t key = {ptr, 0, 0, 0};
  return bsearch(&key, o->v, o->n, sizeof *o->v, owner_cmp);
}

static int lru_cmp(const void *a, const void *b) {
  uint64_t x = ((const dev_owner_t *)a)->lru, y = ((const dev_owner_t *)b)->lru;
  return x < y ? -1 : x > y;
}

/* Bytes weighted by recency: a run of cold tensors beats a slightly
 * smaller run of tensors the next ops are likely to read. */
static uint32_t owner_weight(void *ctx, const void *ptr) {
  const dev_owner_t *w = owner_of(ctx, ptr);
  return w ? w->weight : 0;
}

#define DEFRAG_MAX 64u /* tensors one window may evict */

/* in_region: a window of the placement's region (for what the plan did
 * not place, when no hole of the region is big enough), else of the
 * allocator. */
static bool evict_window(cap_client_t *c, uint64_t bytes, bool in_region) {
  owners_t o = {malloc((c->n_tensors ? c->n_tensors : 1) * sizeof *o.v), 0};
  if (!o.v)
    return false;
  for (uint32_t i = 0; i < c->n_tensors; i++) {
    const cap__tensor_t *t = &c->tensors[i];
    if (t->state == CAP__T_DEVICE && !t->pinned && t->dev)
      o.v[o.n++] = (dev_owner_t){t->dev, i, 0, t->lru};
  }
  /* recency rank -> weight 1..16 */
  qsort(o.v, o.n, sizeof *o.v, lru_cmp);
  for (uint32_t i = 0; i < o.n; i++)
    o.v[i].weight = 1 + (uint32_t)((uint64_t)i * 16 / (o.n ? o.n : 1));
  qsort(o.v, o.n, sizeof *o.v, owner_cmp);
  void *win[DEFRAG_MAX];
  int n = in_region ? cap__dev_region_find_window(c->dev, bytes, owner_weight,
                                                  &o, win, DEFRAG_MAX)
                    : cap__dev_find_window(c->dev, bytes, owner_weight, &o,
                                           win, DEFRAG_MAX);
  bool ok = n > 0;
  for (int i = 0; i < n && ok; i++) {
    const dev_owner_t *w = owner_of(&o, win[i]);
    ok = w && cap__swap_out(c, w->id, CAP_NONE, true) == 0;
    if (ok)
      c->it.lru_evictions++;
  }
  free(o.v);
  return ok;
}

/* Device bytes in use now, and the iteration's and the job's peaks. */
uint64_t cap__note_peak(cap_client_t *c) {
  uint64_t used = cap__dev_in_use(c->dev);
  atomic_store_explicit(&c->ctr.device_bytes, used, memory_order_relaxed);
  if (used > c->it.peak_bytes) {
    c->it.peak_bytes = used;
    c->it.peak_op = c->op_seq;
  }
  if (used > atomic_load_explicit(&c->ctr.peak_bytes, memory_order_relaxed))
    atomic_store_explicit(&c->ctr.peak_bytes, used, memory_order_relaxed);
  return used;
}

void cap__note_over(cap_client_t *c) {
  uint64_t used = cap__note_peak(c);
  if (c->budget_bytes && used > c->budget_bytes)
    c->it.over_budget_allocs++;
}

int cap__alloc_for(cap_client_t *c, uint64_t bytes, void **p, bool may_evict) {
  for (;;) {
    int rc = cap__dev_alloc(c->dev, bytes, p);
    if (rc == 0) {
      cap__note_peak(c);
      return 0;
    }
    if (rc != CAP_EBUDGET) {
      cap__set_error(c, "allocation of %llu bytes failed: %s",
                     (unsigned long long)bytes, cap_strerror(rc));
      return rc;
    }
    /* What the plan did not place may use the room its placement leaves
     * free now (the region's own check keeps it from any live block). */
    if (cap__dev_region_take_any(c->dev, bytes, p) == 0) {
      cap__note_peak(c);
      return 0;
    }
    /* Memory that finished copies hold comes back first, then memory that
     * running swap-outs will release, and only then do we swap out more. */
    uint32_t before = c->n_retire;
    cap__reap(c, false);
    if (c->n_retire != before)
      continue;
    if (cap__retire_wait_one(c))
      continue;
    if (may_evict && cap__dev_has_region(c->dev) && evict_window(c, bytes, true))
      continue;
    if (may_evict && cap__dev_budget_has_room(c->dev, bytes) &&
        evict_window(c, bytes, false))
      continue;
    if (may_evict && evict_lru(c))
      continue;
    if (may_evict && cap__dev_use_has_room(c->dev, bytes) &&
        cap__dev_alloc_beyond_arena(c->dev, bytes, p) == 0) {
      /* Fragmentation with nothing left to move (the op's own tensors
       * hold the holes apart, in the allocator or in the region): rather
       * than fail the op, one more arena past the budget's; the bytes in
       * use still keep to the budget. */
      c->it.fallbacks++;
      atomic_fetch_add(&c->ctr.fallbacks, 1);
      cap__note_peak(c);
      return 0;
    }
    cap__set_error(c, "allocation of %llu bytes does not fit the budget of "
                      "%llu bytes (%llu in use)",
                   (unsigned long long)bytes,
                   (unsigned long long)c->budget_bytes,
                   (unsigned long long)cap__dev_in_use(c->dev));
    return CAP_EBUDGET;
  }
}

/* --- A budget cut ------------------------------------------------------------
 * Another job on the device waits for what a cut takes from this one (the
 * daemon hands it over once told, BudgetAck), so a cut must give device
 * memory back, not only cap what is allocated next. Free arenas go back
 * first; while the job still holds more than its budget, the tensors in the
 * emptiest arena are swapped out (as PyTorch's allocator frees its cached
 * blocks, but evicting what it must) and that arena goes back too. */

static uint32_t device_owner(const cap_client_t *c, const void *ptr) {
  for (uint32_t i = 0; i < c->n_tensors; i++)
    if (c->tensors[i].state == CAP__T_DEVICE && c->tensors[i].dev == ptr)
      return c->tensors[i].pinned ? CAP_NONE : i;
  return CAP_NONE;
}

static uint64_t give_back(cap_client_t *c, uint64_t budget) {
  cap__reap(c, true); /* swap-outs in flight hold their memory until done */
  uint64_t held = cap__dev_trim(c->dev);
  if (held > budget) {
    cap__placement_drop(c); /* the region is one allocation no tensor owns */
    held = cap__dev_trim(c->dev);
  }
  size_t max = (size_t)c->n_tensors + 1;
  void **ptrs = malloc(max * sizeof *ptrs);
  while (ptrs && held > budget) {
    int n = cap__dev_emptiest_arena(c->dev, ptrs, max);
    for (int i = 0; i < n; i++) {
      uint32_t id = device_owner(c, ptrs[i]);
      if (id == CAP_NONE || cap__swap_out(c, id, CAP_NONE, true) != 0)
        goto out; /* what cannot move keeps its arena */
    }
    uint64_t now = cap__dev_trim(c->dev);
    if (n <= 0 || now >= held)
      break;
    held = now;
  }
out:
  free(ptrs);
  return cap__dev_held(c->dev);
}

void cap__put_budget(cap_client_t *c, uint64_t budget) {
  bool cut = budget < c->budget_bytes;
  c->budget_bytes = budget;
  atomic_store(&c->ctr.budget_bytes, budget);
  cap__dev_set_budget(c->dev, budget);
  uint64_t held = cut ? give_back(c, budget) : cap__dev_held(c->dev);
  atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c->dev));
  pthread_mutex_lock(&c->mu);
  c->budget_changes++;
  c->ack_budget = budget;
  c->ack_held = held;
  pthread_mutex_unlock(&c->mu);
  cap__reporter_wake(c);
}
