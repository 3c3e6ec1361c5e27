/*
 * Best-fit with coalescing over arenas (TensorFlow's BFC allocator, reduced to
 * what a budgeted tensor allocator needs). See bfc.h for the policy.
 */
#include "bfc.h"
#include "faultsim.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct arena arena;
typedef struct chunk chunk;

struct chunk {
  uintptr_t addr;
  size_t bytes;           /* chunk size, multiple of 256 */
  size_t requested;       /* caller's size when in use */
  uint64_t requested_cost; /* scratch of cap_bfc_find_window */
  chunk *prev, *next;     /* address neighbours within the arena */
  chunk *bin_prev, *bin_next;
  arena *arena;
  int bin;                /* -1 when in use */
  bool in_use;
};

struct arena {
  uintptr_t base;
  size_t bytes;
  chunk *first;
  arena *next;
};

typedef struct {
  chunk *head, *tail; /* ascending (bytes, addr) */
  size_t count;
} bin_list;

/* In-use chunks by address: open addressing, linear probing, backward-shift
 * deletion (no tombstones), so lookups stay short however long it runs. */
typedef struct {
  chunk **slots;
  size_t cap; /* power of two */
  size_t count;
} chunk_map;

struct cap_bfc {
  pthread_mutex_t mu;
  cap_bfc_config_t cfg;
  bool arena_limit_follows_budget;
  cap_bfc_source_t src;
  arena *arenas;
  bin_list bins[CAP_BFC_BINS];
  chunk_map map;
  uint64_t next_arena_bytes;
  cap_bfc_stats_t st; /* counters; derived fields filled by cap_bfc_stats */
};

static size_t round_up(size_t n) {
  return (n + CAP_BFC_GRANULE - 1) & ~(size_t)(CAP_BFC_GRANULE - 1);
}

static int bin_of(size_t bytes) {
  size_t units = bytes / CAP_BFC_GRANULE; /* >= 1 */
  int b = 0;
  while (units > 1 && b < CAP_BFC_BINS - 1) {
    units >>= 1;
    b++;
  }
  return b;
}

/* ---- address map ---- */

static size_t hash_addr(uintptr_t a, size_t cap) {
  uint64_t x = (uint64_t)a >> 8; /* granule-aligned */
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x & (cap - 1);
}

static int map_grow(chunk_map *m) {
  size_t ncap = m->cap ? m->cap * 2 : 256;
  chunk **ns = calloc(ncap, sizeof *ns);
  if (!ns)
    return CAP_ENOMEM;
  for (size_t i = 0; i < m->cap; i++) {
    chunk *c = m->slots[i];
    if (!c)
      continue;
    size_t j = hash_addr(c->addr, ncap);
    while (ns[j])
      j = (j + 1) & (ncap - 1);
    ns[j] = c;
  }
  free(m->slots);
  m->slots = ns;
  m->cap = ncap;
  return 0;
}

static int map_put(chunk_map *m, chunk *c) {
  if ((m->count + 1) * 2 > m->cap) {
    int rc = map_grow(m);
    if (rc)
      return rc;
  }
  size_t j = hash_addr(c->addr, m->cap);
  while (m->slots[j])
    j = (j + 1) & (m->cap - 1);
  m->slots[j] = c;
  m->count++;
  return 0;
}

static size_t map_find_slot(const chunk_map *m, uintptr_t addr) {
  if (!m->cap)
    return SIZE_MAX;
  size_t j = hash_addr(addr, m->cap);
  while (m->slots[j]) {
    if (m->slots[j]->addr == addr)
      return j;
    j = (j + 1) & (m->cap - 1);
  }
  return SIZE_MAX;
}

static void map_remove_slot(chunk_map *m, size_t i) {
  size_t mask = m->cap - 1;
  m->slots[i] = NULL;
  m->count--;
  /* Backward-shift: move later entries of the probe run into the hole when
   * their home slot is not between the hole and themselves. */
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    chunk *c = m->slots[j];
    if (!c)
      break;
    size_t home = hash_addr(c->addr, m->cap);
    bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
    if (movable) {
      m->slots[i] = c;
      m->slots[j] = NULL;
      i = j;
    }
  }
}

/* ---- bins ---- */

static bool chunk_less(const chunk *a, const chunk *b) {
  return a->bytes < b->bytes || (a->bytes == b->bytes && a->addr < b->addr);
}

static void bin_insert(cap_bfc_t *a, chunk *c) {
  int b = bin_of(c->bytes);
  bin_list *l = &a->bins[b];
  c->bin = b;
  /* Chunks of one bin differ in size by under 2x; walk from the end that is
   * closer in size (large ones usually come from the tail). */
  chunk *after = l->tail;
  while (after && chunk_less(c, after))
    after = after->bin_prev;
  c->bin_prev = after;
  c->bin_next = after ? after->bin_next : l->head;
  if (c->bin_next)
    c->bin_next->bin_prev = c;
  else
    l->tail = c;
  if (after)
    after->bin_next = c;
  else
    l->head = c;
  l->count++;
}

static void bin_remove(cap_bfc_t *a, chunk *c) {
  bin_list *l = &a->bins[c->bin];
  if (c->bin_prev)
    c->bin_prev->bin_next = c->bin_next;
  else
    l->head = c->bin_next;
  if (c->bin_next)
    c->bin_next->bin_prev = c->bin_prev;
  else
    l->tail = c->bin_prev;
  c->bin_prev = c->bin_next = NULL;
  c->bin = -1;
  l->count--;
}

/* Smallest free chunk of at least `bytes`, lowest address among equals. */
static chunk *best_fit(cap_bfc_t *a, size_t bytes) {
  for (int b = bin_of(bytes); b < CAP_BFC_BINS; b++) {
    const bin_list *l = &a->bins[b];
    if (!l->tail || l->tail->bytes < bytes)
      continue; /* nothing in this bin is big enough */
    for (chunk *c = l->head; c; c = c->bin_next)
      if (c->bytes >= bytes)
        return c;
  }
  return NULL;
}

/* ---- arenas ---- */

/* unused: bytes in use that hold nothing (cap_bfc_alloc_beyond_limit). */
static bool budget_allows(const cap_bfc_t *a, size_t rounded, uint64_t unused) {
  uint64_t used = a->st.in_use_bytes - (unused < a->st.in_use_bytes ? unused
                                                                     : a->st.in_use_bytes);
  return !a->cfg.budget_bytes || used + rounded <= a->cfg.budget_bytes;
}

/* Take a new arena big enough for `rounded` within `limit` arena bytes (0:
 * none). 0, CAP_EBUDGET when the limit leaves no room, or the source's
 * error. */
static int grow(cap_bfc_t *a, size_t rounded, uint64_t limit) {
  uint64_t want = a->next_arena_bytes;
  if (want < rounded)
    want = rounded;
  if (limit) {
    uint64_t left = limit > a->st.arena_bytes ? limit - a->st.arena_bytes : 0;
    left &= ~(uint64_t)(CAP_BFC_GRANULE - 1);
    if (left < rounded)
      return CAP_EBUDGET;
    if (want > left)
      want = left;
  }
  arena *ar = calloc(1, sizeof *ar);
  chunk *c = calloc(1, sizeof *c);
  if (!ar || !c) {
    free(ar);
    free(c);
    return CAP_ENOMEM;
  }
  if (cap_faultsim_step(CAP_FAULT_BFC_ARENA)) {
    a->st.source_failures++;
    free(ar);
    free(c);
    return CAP_ENOMEM;
  }
  void *base = NULL;
  int rc;
  /* A refused request is retried smaller, down to the request itself
   * (the device may have room for less than the doubling schedule asks). */
  for (;;) {
    rc = a->src.alloc(a->src.ctx, (size_t)want, &base);
    if (rc == 0)
      break;
    a->st.source_failures++;
    if (want == rounded)
      break;
    want = round_up((size_t)(want / 2));
    if (want < rounded)
      want = rounded;
  }
  if (rc != 0 || ((uintptr_t)base & (CAP_BFC_GRANULE - 1))) {
    if (rc == 0) { /* misaligned base: the source broke its contract */
      a->src.free(a->src.ctx, base, (size_t)want);
      rc = CAP_EINVAL;
    }
    free(ar);
    free(c);
    return rc < 0 ? rc : CAP_ENOMEM;
  }
  ar->base = (uintptr_t)base;
  ar->bytes = (size_t)want;
  ar->first = c;
  ar->next = a->arenas;
  a->arenas = ar;
  c->addr = ar->base;
  c->bytes = ar->bytes;
  c->arena = ar;
  bin_insert(a, c);
  a->st.arena_bytes += want;
  a->st.arenas++;
  if (want >= a->next_arena_bytes) {
    uint64_t n = a->next_arena_bytes * 2;
    a->next_arena_bytes = n > a->cfg.max_arena_bytes ? a->cfg.max_arena_bytes : n;
  }
  return 0;
}

/* ---- public ---- */

void cap_bfc_config_init(cap_bfc_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->initial_arena_bytes = 64ull << 20;
  cfg->max_arena_bytes = 1ull << 30;
  cfg->split_min_bytes = CAP_BFC_GRANULE;
}

int cap_bfc_create(const cap_bfc_config_t *cfg, const cap_bfc_source_t *src,
                   cap_bfc_t **out) {
  if (!out || !src || !src->alloc || !src->free)
    return CAP_EINVAL;
  cap_bfc_t *a = calloc(1, sizeof *a);
  if (!a)
    return CAP_ENOMEM;
  if (cfg)
    a->cfg = *cfg;
  else
    cap_bfc_config_init(&a->cfg);
  cap_bfc_config_t def;
  cap_bfc_config_init(&def);
  if (!a->cfg.initial_arena_bytes)
    a->cfg.initial_arena_bytes = def.initial_arena_bytes;
  if (!a->cfg.max_arena_bytes)
    a->cfg.max_arena_bytes = def.max_arena_bytes;
  if (a->cfg.split_min_bytes < CAP_BFC_GRANULE)
    a->cfg.split_min_bytes = CAP_BFC_GRANULE;
  a->cfg.initial_arena_bytes = round_up((size_t)a->cfg.initial_arena_bytes);
  a->cfg.max_arena_bytes = round_up((size_t)a->cfg.max_arena_bytes);
  if (a->cfg.initial_arena_bytes > a->cfg.max_arena_bytes)
    a->cfg.max_arena_bytes = a->cfg.initial_arena_bytes;
  a->arena_limit_follows_budget = a->cfg.arena_limit_bytes == 0;
  if (a->arena_limit_follows_budget)
    a->cfg.arena_limit_bytes = a->cfg.budget_bytes ? round_up((size_t)a->cfg.budget_bytes) : 0;
  a->next_arena_bytes = a->cfg.initial_arena_bytes;
  a->src = *src;
  if (pthread_mutex_init(&a->mu, NULL) != 0) {
    free(a);
    return CAP_ENOMEM;
  }
  *out = a;
  return 0;
}

void cap_bfc_destroy(cap_bfc_t *a) {
  if (!a)
    return;
  arena *ar = a->arenas;
  while (ar) {
    arena *nx = ar->next;
    chunk *c = ar->first;
    while (c) {
      chunk *cn = c->next;
      free(c);
      c = cn;
    }
    a->src.free(a->src.ctx, (void *)ar->base, ar->bytes);
    free(ar);
    ar = nx;
  }
  free(a->map.slots);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

/* beyond_limit: when no free chunk fits, take an arena of just the request
 * even past the arena limit (the bytes in use still keep to the budget). */
static int alloc(cap_bfc_t *a, size_t bytes, void **ptr, bool beyond_limit,
                 uint64_t unused) {
  if (!a || !ptr || bytes == 0 || bytes > SIZE_MAX / 2)
    return CAP_EINVAL;
  size_t rounded = round_up(bytes);
  int rc = 0;
  pthread_mutex_lock(&a->mu);
  if (!budget_allows(a, rounded, unused)) {
    a->st.budget_failures++;
    rc = CAP_EBUDGET;
    goto out_unlock;
  }
  chunk *c = best_fit(a, rounded);
  if (!c) {
    uint64_t limit = a->cfg.arena_limit_bytes;
    if (beyond_limit && limit)
      limit = a->st.arena_bytes + rounded;
    rc = grow(a, rounded, limit);
    if (rc) {
      if (rc == CAP_EBUDGET) {
        a->st.budget_failures++;
        a->st.fragmentation_failures++;
      }
      goto out_unlock;
    }
    if (beyond_limit && a->st.arena_bytes > a->cfg.arena_limit_bytes) {
      a->st.overflow_arenas++;
      a->st.overflow_bytes += rounded;
    }
    c = best_fit(a, rounded);
  }
  /* Reserve the map slot first so that nothing below can fail. */
  if ((a->map.count + 1) * 2 > a->map.cap && (rc = map_grow(&a->map)) != 0)
    goto out_unlock;
  chunk *rest = NULL;
  if (c->bytes - rounded >= a->cfg.split_min_bytes) {
    rest = calloc(1, sizeof *rest);
    if (!rest) {
      rc = CAP_ENOMEM;
      goto out_unlock;
    }
  }
  bin_remove(a, c);
  if (rest) {
    rest->addr = c->addr + rounded;
    rest->bytes = c->bytes - rounded;
    rest->arena = c->arena;
    rest->prev = c;
    rest->next = c->next;
    if (c->next)
      c->next->prev = rest;
    c->next = rest;
    c->bytes = rounded;
    bin_insert(a, rest);
  }
  c->in_use = true;
  c->requested = bytes;
  map_put(&a->map, c); /* capacity reserved above */
  a->st.in_use_bytes += c->bytes;
  a->st.requested_bytes += bytes;
  if (a->st.in_use_bytes > a->st.peak_in_use_bytes)
    a->st.peak_in_use_bytes = a->st.in_use_bytes;
  a->st.live_allocs++;
  a->st.allocs++;
  *ptr = (void *)c->addr;
out_unlock:
  pthread_mutex_unlock(&a->mu);
  return rc;
}

int cap_bfc_alloc(cap_bfc_t *a, size_t bytes, void **ptr) {
  return alloc(a, bytes, ptr, false, 0);
}

int cap_bfc_alloc_beyond_limit(cap_bfc_t *a, size_t bytes, uint64_t unused_bytes,
                               void **ptr) {
  return alloc(a, bytes, ptr, true, unused_bytes);
}

int cap_bfc_free(cap_bfc_t *a, void *ptr) {
  if (!ptr)
    return 0;
  if (!a)
    return CAP_EINVAL;
  pthread_mutex_lock(&a->mu);
  size_t slot = map_find_slot(&a->map, (uintptr_t)ptr);
  if (slot == SIZE_MAX) {
    pthread_mutex_unlock(&a->mu);
    return CAP_EINVAL;
  }
  chunk *c = a->map.slots[slot];
  map_remove_slot(&a->map, slot);
  a->st.in_use_bytes -= c->bytes;
  a->st.requested_bytes -= c->requested;
  a->st.live_allocs--;
  a->st.frees++;
  c->in_use = false;
  c->requested = 0;
  /* Coalesce with free neighbours so that free space stays in as few
   * chunks as possible. */
  chunk *n = c->next;
  if (n && !n->in_use) {
    bin_remove(a, n);
    c->bytes += n->bytes;
    c->next = n->next;
    if (n->next)
      n->next->prev = c;
    free(n);
  }
  chunk *p = c->prev;
  if (p && !p->in_use) {
    bin_remove(a, p);
    p->bytes += c->bytes;
    p->next = c->next;
    if (c->next)
      c->next->prev = p;
    free(c);
    c = p;
  }
  bin_insert(a, c);
  pthread_mutex_unlock(&a->mu);
  return 0;
}

size_t cap_bfc_chunk_bytes(cap_bfc_t *a, const void *ptr) {
  if (!a || !ptr)
    return 0;
  pthread_mutex_lock(&a->mu);
  size_t slot = map_find_slot(&a->map, (uintptr_t)ptr);
  size_t n = slot == SIZE_MAX ? 0 : a->map.slots[slot]->bytes;
  pthread_mutex_unlock(&a->mu);
  return n;
}

bool cap_bfc_fits(cap_bfc_t *a, size_t bytes) {
  if (!a || bytes == 0 || bytes > SIZE_MAX / 2)
    return false;
  size_t rounded = round_up(bytes);
  pthread_mutex_lock(&a->mu);
  bool ok = budget_allows(a, rounded, 0);
  if (ok && !best_fit(a, rounded)) {
    uint64_t left = 0;
    if (!a->cfg.arena_limit_bytes)
      left = UINT64_MAX;
    else if (a->cfg.arena_limit_bytes > a->st.arena_bytes)
      left = (a->cfg.arena_limit_bytes - a->st.arena_bytes) & ~(uint64_t)(CAP_BFC_GRANULE - 1);
    ok = left >= rounded;
  }
  pthread_mutex_unlock(&a->mu);
  return ok;
}

int cap_bfc_find_window(cap_bfc_t *a, size_t bytes,
                        uint32_t (*weight)(void *ctx, const void *ptr),
                        void *ctx, void **out, size_t max_out) {
  if (!a || !bytes || !weight)
    return CAP_EINVAL;
  size_t need = round_up(bytes);
  pthread_mutex_lock(&a->mu);
  chunk *best_lo = NULL, *best_hi = NULL;
  uint64_t best_cost = UINT64_MAX;
  size_t best_n = 0;
  for (arena *ar = a->arenas; ar && best_cost; ar = ar->next) {
    /* Two pointers over the arena's chunks: [lo, hi] holds only free and
     * movable chunks; shrink from the left while it stays big enough (a
     * smaller run never costs more: costs are not negative). */
    chunk *lo = ar->first;
    size_t span = 0, n_used = 0;
    uint64_t cost = 0;
    for (chunk *hi = ar->first; hi; hi = hi->next) {
      uint32_t w = hi->in_use ? weight(ctx, (void *)hi->addr) : 0;
      if (hi->in_use && !w) {
        lo = hi->next;
        span = 0;
        cost = 0;
        n_used = 0;
        continue;
      }
      /* the chunk's cost is kept in it while it is in the run */
      hi->requested_cost = (uint64_t)hi->bytes * w;
      span += hi->bytes;
      cost += hi->requested_cost;
      n_used += hi->in_use;
      while (lo != hi && span - lo->bytes >= need) {
        span -= lo->bytes;
        cost -= lo->requested_cost;
        n_used -= lo->in_use;
        lo = lo->next;
      }
      if (span >= need && cost < best_cost) {
        best_cost = cost;
        best_lo = lo;
        best_hi = hi;
        best_n = n_used;
      }
    }
  }
  int rc;
  if (!best_lo || best_n > max_out) {
    rc = CAP_ENOENT;
  } else {
    rc = 0;
    for (chunk *c = best_lo;; c = c->next) {
      if (c->in_use)
        out[rc++] = (void *)c->addr;
      if (c == best_hi)
        break;
    }
  }
  pthread_mutex_unlock(&a->mu);
  return rc;
}

void cap_bfc_set_budget(cap_bfc_t *a, uint64_t budget_bytes) {
  if (!a)
    return;
  pthread_mutex_lock(&a->mu);
  a->cfg.budget_bytes = budget_bytes;
  if (a->arena_limit_follows_budget)
    a->cfg.arena_limit_bytes = budget_bytes ? round_up((size_t)budget_bytes) : 0;
  pthread_mutex_unlock(&a->mu);
}

uint64_t cap_bfc_trim(cap_bfc_t *a) {
  if (!a)
    return 0;
  uint64_t freed = 0;
  pthread_mutex_lock(&a->mu);
  arena **pp = &a->arenas;
  while (*pp) {
    arena *ar = *pp;
    chunk *c = ar->first;
    if (!c->in_use && !c->next) {
      bin_remove(a, c);
      free(c);
      *pp = ar->next;
      a->src.free(a->src.ctx, (void *)ar->base, ar->bytes);
      a->st.arena_bytes -= ar->bytes;
      a->st.arenas--;
      freed += ar->bytes;
      free(ar);
    } else {
      pp = &ar->next;
    }
  }
  pthread_mutex_unlock(&a->mu);
  return freed;
}

int cap_bfc_emptiest_arena(cap_bfc_t *a, void **out, size_t max_out) {
  if (!a || (!out && max_out))
    return CAP_EINVAL;
  pthread_mutex_lock(&a->mu);
  arena *best = NULL;
  uint64_t best_used = UINT64_MAX;
  for (arena *ar = a->arenas; ar; ar = ar->next) {
    uint64_t used = 0;
    for (chunk *c = ar->first; c; c = c->next)
      used += c->in_use ? c->bytes : 0;
    if (used < best_used) {
      best = ar;
      best_used = used;
    }
  }
  int n = best ? 0 : CAP_ENOENT;
  for (chunk *c = best ? best->first : NULL; c; c = c->next) {
    if (!c->in_use)
      continue;
    if ((size_t)n == max_out) {
      n = CAP_ENOENT;
      break;
    }
    out[n++] = (void *)c->addr;
  }
  pthread_mutex_unlock(&a->mu);
  return n;
}

void cap_bfc_stats(cap_bfc_t *a, cap_bfc_stats_t *st) {
  memset(st, 0, sizeof *st);
  if (!a)
    return;
  pthread_mutex_lock(&a->mu);
  *st = a->st;
  st->free_bytes = a->st.arena_bytes - a->st.in_use_bytes;
  for (int b = CAP_BFC_BINS - 1; b >= 0; b--)
    if (a->bins[b].tail) {
      st->largest_free_bytes = a->bins[b].tail->bytes;
      break;
    }
  st->fragmentation =
      st->free_bytes ? 1.0 - (double)st->largest_free_bytes / (double)st->free_bytes : 0.0;
  st->budget_bytes = a->cfg.budget_bytes;
  st->arena_limit_bytes = a->cfg.arena_limit_bytes;
  pthread_mutex_unlock(&a->mu);
}

void cap_bfc_reset_peak(cap_bfc_t *a) {
  if (!a)
    return;
  pthread_mutex_lock(&a->mu);
  a->st.peak_in_use_bytes = a->st.in_use_bytes;
  pthread_mutex_unlock(&a->mu);
}

int cap_bfc_validate(cap_bfc_t *a) {
  if (!a)
    return CAP_EINVAL;
  int rc = 0;
  pthread_mutex_lock(&a->mu);
  uint64_t arena_bytes = 0, in_use = 0, requested = 0, live = 0, free_chunks = 0;
  uint32_t narenas = 0;
  for (arena *ar = a->arenas; ar; ar = ar->next) {
    narenas++;
    arena_bytes += ar->bytes;
    uintptr_t at = ar->base;
    chunk *prev = NULL;
    for (chunk *c = ar->first; c; prev = c, c = c->next) {
      if (c->addr != at || c->prev != prev || c->arena != ar || c->bytes == 0 ||
          c->bytes % CAP_BFC_GRANULE)
        rc = CAP_ECORRUPT;
      if (prev && !prev->in_use && !c->in_use)
        rc = CAP_ECORRUPT; /* missed coalescing */
      if (c->in_use) {
        in_use += c->bytes;
        requested += c->requested;
        live++;
        size_t s = map_find_slot(&a->map, c->addr);
        if (s == SIZE_MAX || a->map.slots[s] != c || c->bin != -1)
          rc = CAP_ECORRUPT;
      } else {
        free_chunks++;
        if (c->bin != bin_of(c->bytes) || map_find_slot(&a->map, c->addr) != SIZE_MAX)
          rc = CAP_ECORRUPT;
      }
      at += c->bytes;
    }
    if (at != ar->base + ar->bytes)
      rc = CAP_ECORRUPT;
  }
  uint64_t binned = 0;
  for (int b = 0; b < CAP_BFC_BINS; b++) {
    size_t n = 0;
    chunk *prev = NULL;
    for (chunk *c = a->bins[b].head; c; prev = c, c = c->bin_next) {
      n++;
      if (c->in_use || c->bin != b || c->bin_prev != prev || (prev && !chunk_less(prev, c)))
        rc = CAP_ECORRUPT;
    }
    if (n != a->bins[b].count || a->bins[b].tail != prev)
      rc = CAP_ECORRUPT;
    binned += n;
  }
  if (binned != free_chunks || arena_bytes != a->st.arena_bytes || narenas != a->st.arenas ||
      in_use != a->st.in_use_bytes || requested != a->st.requested_bytes ||
      live != a->st.live_allocs || live != a->map.count)
    rc = CAP_ECORRUPT;
  pthread_mutex_unlock(&a->mu);
  return rc;
}
