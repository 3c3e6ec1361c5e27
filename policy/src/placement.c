/*
 * Offset planning over residency intervals (placement.h).
 *
 * Both strategies share one placer: intervals are taken in the strategy's
 * order and each goes to the lowest offset at which it collides with none
 * of the already placed intervals it overlaps in time (TensorFlow Lite's
 * greedy offset calculation; its GPU delegate also tries several orders and
 * keeps the best). What differs is the order:
 *  - by size: largest first, so that big blocks claim the low addresses and
 *    small ones fill the holes between them;
 *  - by breadth: the instants with the most live bytes decide first, as they
 *    are the ones that set the arena size.
 * Finding the placed intervals that overlap one is a scan over all placed
 * ones: quadratic, a few milliseconds for the few thousand intervals of a
 * real iteration.
 */
#include <stdbool.h>
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/types.h"

const char *cap_place_strategy_name(cap_place_strategy_t s) {
  switch (s) {
  case CAP_PLACE_BY_SIZE:
    return "size";
  case CAP_PLACE_BY_BREADTH:
    return "breadth";
  case CAP_PLACE_BEST:
    return "best";
  }
  return NULL;
}

static bool overlap_in_time(const cap_interval_t *a, const cap_interval_t *b) {
  return a->start < b->end && b->start < a->end;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

/* --- the shared placer ---------------------------------------------------- */

/* qsort has no context argument: sort keys travel with the indices. */
typedef struct by_offset {
  uint64_t offset;
  uint32_t i;
} by_offset_t;

static int cmp_by_offset(const void *a, const void *b) {
  const by_offset_t *x = a, *y = b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

typedef struct placer {
  const cap_interval_t *iv;
  const uint64_t *size; /* aligned bytes */
  uint32_t n;
  uint64_t *offset;
  bool *placed;
  bool *taken;          /* this interval's block was taken over (share) */
  by_offset_t *near;    /* scratch: placed intervals overlapping the current */
  uint32_t shared;
  uint64_t arena;
} placer_t;

/* Whether [off, off + size) is clear of every neighbour but `except`. */
static bool fits_at(const placer_t *pl, uint32_t n_near, uint64_t off,
                    uint64_t size, uint32_t except) {
  for (uint32_t k = 0; k < n_near; k++) {
    uint32_t j = pl->near[k].i;
    if (j != except && off < pl->offset[j] + pl->size[j] &&
        pl->offset[j] < off + size)
      return false;
  }
  return true;
}

/* Place interval i, and the interval tied to it (same_as) at the same
 * offset: the neighbours are those of either. */
static void place_one(placer_t *pl, uint32_t i) {
  if (pl->placed[i])
    return; /* placed with its tie */
  uint32_t tie = pl->iv[i].same_as;
  uint32_t n_near = 0;
  for (uint32_t j = 0; j < pl->n; j++)
    if (pl->placed[j] && (overlap_in_time(&pl->iv[i], &pl->iv[j]) ||
                          (tie != CAP_NONE &&
                           overlap_in_time(&pl->iv[tie], &pl->iv[j]))))
      pl->near[n_near++] = (by_offset_t){pl->offset[j], j};

  uint64_t size = pl->size[i], off = 0;
  uint32_t s = pl->iv[i].share;
  if (s != CAP_NONE && tie == CAP_NONE && pl->placed[s] && !pl->taken[s] &&
      size <= pl->size[s] && fits_at(pl, n_near, pl->offset[s], size, s)) {
    pl->taken[s] = true;
    pl->shared++;
    off = pl->offset[s];
  } else {
    /* Neighbours by address; the lowest gap between them that fits. */
    qsort(pl->near, n_near, sizeof *pl->near, cmp_by_offset);
    for (uint32_t k = 0; k < n_near; k++) {
      uint32_t j = pl->near[k].i;
      if (pl->offset[j] >= off + size)
        break; /* the gap below j fits */
      uint64_t top = pl->offset[j] + pl->size[j];
      if (top > off)
        off = top;
    }
  }
  pl->offset[i] = off;
  pl->placed[i] = true;
  if (tie != CAP_NONE) {
    pl->offset[tie] = off;
    pl->placed[tie] = true;
  }
  if (off + size > pl->arena)
    pl->arena = off + size;
}

/* --- orders --------------------------------------------------------------- */

typedef struct by_size {
  uint64_t size;
  int64_t start;
  uint32_t i;
} by_size_t;

/* Larger first; ties: earlier start, then lower index (deterministic). */
static int cmp_by_size(const void *a, const void *b) {
  const by_size_t *x = a, *y = b;
  if (x->size != y->size)
    return x->size < y->size ? 1 : -1;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  return (x->i > y->i) - (x->i < y->i);
}

/* Sort order[0..n) (interval indices) largest first, through `keys`. */
static void sort_by_size(const cap_interval_t *iv, const uint64_t *size,
                         uint32_t *order, uint32_t n, by_size_t *keys) {
  for (uint32_t k = 0; k < n; k++)
    keys[k] = (by_size_t){size[order[k]], iv[order[k]].start, order[k]};
  qsort(keys, n, sizeof *keys, cmp_by_size);
  for (uint32_t k = 0; k < n; k++)
    order[k] = keys[k].i;
}

typedef struct instant {
  int64_t t;
  uint64_t live; /* aligned bytes live at t */
} instant_t;

static int cmp_instant_by_live(const void *a, const void *b) {
  const instant_t *x = a, *y = b;
  if (x->live != y->live)
    return x->live < y->live ? 1 : -1;
  return (x->t > y->t) - (x->t < y->t);
}

/* Live bytes only grow at a start, so the starts are the instants that
 * matter. `order` doubles as the scratch list of one instant's intervals. */
static void order_by_breadth(const cap_interval_t *iv, const uint64_t *size,
                             uint32_t n, uint32_t *order, by_size_t *keys,
                             instant_t *inst, bool *queued) {
  for (uint32_t i = 0; i < n; i++) {
    inst[i].t = iv[i].start;
    inst[i].live = 0;
    for (uint32_t j = 0; j < n; j++)
      if (iv[j].start <= iv[i].start && iv[i].start < iv[j].end)
        inst[i].live += size[j];
  }
  qsort(inst, n, sizeof *inst, cmp_instant_by_live);
  uint32_t done = 0;
  for (uint32_t k = 0; k < n && done < n; k++) {
    if (k && inst[k].t == inst[k - 1].t && inst[k].live == inst[k - 1].live)
      continue; /* the same instant again (several intervals start there) */
    uint32_t first = done;
    for (uint32_t j = 0; j < n; j++)
      if (!queued[j] && iv[j].start <= inst[k].t && inst[k].t < iv[j].end) {
        queued[j] = true;
        order[done++] = j;
      }
    sort_by_size(iv, size, order + first, done - first, keys);
  }
}

/* --- entry points --------------------------------------------------------- */

/* Counting every interval, a shared pair twice: sharing is what can bring
 * an arena below this peak. */
static uint64_t peak_live(const cap_interval_t *iv, const uint64_t *size,
                          uint32_t n) {
  uint64_t peak = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t live = 0;
    for (uint32_t j = 0; j < n; j++)
      if (iv[j].start <= iv[i].start && iv[i].start < iv[j].end)
        live += size[j];
    if (live > peak)
      peak = live;
  }
  return peak;
}

static int valid(const cap_interval_t *iv, uint32_t n, uint64_t alignment) {
  if ((n && !iv) || (alignment & (alignment - 1)))
    return CAP_EINVAL;
  for (uint32_t i = 0; i < n; i++) {
    if (iv[i].start >= iv[i].end || !iv[i].bytes ||
        (iv[i].share != CAP_NONE && (iv[i].share >= n || iv[i].share == i)))
      return CAP_EINVAL;
    uint32_t t = iv[i].same_as;
    if (t != CAP_NONE &&
        (t >= n || t == i || iv[t].same_as != i || iv[t].bytes != iv[i].bytes ||
         overlap_in_time(&iv[i], &iv[t])))
      return CAP_EINVAL;
  }
  return 0;
}

static int place_with(const cap_interval_t *iv, const uint64_t *size,
                      uint32_t n, cap_place_strategy_t s, cap_placement_t *out) {
  size_t m = n ? n : 1;
  placer_t pl = {.iv = iv, .size = size, .n = n};
  uint32_t *order = malloc(m * sizeof *order);
  by_size_t *keys = malloc(m * sizeof *keys);
  instant_t *inst = malloc(m * sizeof *inst);
  bool *queued = calloc(m, sizeof *queued);
  pl.near = malloc(m * sizeof *pl.near);
  pl.offset = calloc(m, sizeof *pl.offset);
  pl.placed = calloc(m, sizeof *pl.placed);
  pl.taken = calloc(m, sizeof *pl.taken);
  int rc = order && keys && inst && queued && pl.near && pl.offset &&
                   pl.placed && pl.taken
               ? 0
               : CAP_ENOMEM;
  if (!rc) {
    if (s == CAP_PLACE_BY_SIZE) {
      for (uint32_t i = 0; i < n; i++)
        order[i] = i;
      sort_by_size(iv, size, order, n, keys);
    } else {
      order_by_breadth(iv, size, n, order, keys, inst, queued);
    }
    for (uint32_t k = 0; k < n; k++)
      place_one(&pl, order[k]);
  }
  free(order);
  free(keys);
  free(inst);
  free(queued);
  free(pl.near);
  free(pl.placed);
  free(pl.taken);
  if (rc) {
    free(pl.offset);
    return rc;
  }
  *out = (cap_placement_t){.offsets = pl.offset, .n = n,
                           .arena_bytes = pl.arena, .strategy = s,
                           .shared = pl.shared};
  return 0;
}

int cap_place(const cap_interval_t *iv, uint32_t n, cap_place_strategy_t s,
              uint64_t alignment, cap_placement_t *out) {
  if (!out)
    return CAP_EINVAL;
  *out = (cap_placement_t){0};
  if (!alignment)
    alignment = 256;
  int rc = valid(iv, n, alignment);
  if (rc || (unsigned)s > CAP_PLACE_BEST)
    return rc ? rc : CAP_EINVAL;
  uint64_t *size = malloc((n ? n : 1) * sizeof *size);
  if (!size)
    return CAP_ENOMEM;
  for (uint32_t i = 0; i < n; i++)
    size[i] = align_up(iv[i].bytes, alignment);

  if (s != CAP_PLACE_BEST) {
    rc = place_with(iv, size, n, s, out);
  } else {
    for (int k = 0; k < CAP_PLACE_N_STRATEGIES && !rc; k++) {
      cap_placement_t trial;
      rc = place_with(iv, size, n, (cap_place_strategy_t)k, &trial);
      if (rc)
        break;
      if (!out->offsets || trial.arena_bytes < out->arena_bytes) {
        cap_placement_close(out);
        *out = trial;
      } else {
        cap_placement_close(&trial);
      }
    }
  }
  if (!rc)
    out->peak_bytes = peak_live(iv, size, n);
  else
    cap_placement_close(out);
  free(size);
  return rc;
}

void cap_placement_close(cap_placement_t *pl) {
  if (!pl)
    return;
  free(pl->offsets);
  *pl = (cap_placement_t){0};
}

int cap_placement_check(const cap_interval_t *iv, uint32_t n,
                        const uint64_t *offsets, uint64_t alignment,
                        uint32_t *a, uint32_t *b) {
  if (!alignment)
    alignment = 256;
  int rc = valid(iv, n, alignment);
  if (rc || (n && !offsets))
    return rc ? rc : CAP_EINVAL;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t j = i + 1; j < n; j++) {
      if (iv[i].same_as == j && offsets[i] != offsets[j]) {
        if (a)
          *a = i;
        if (b)
          *b = j;
        return CAP_EINVAL;
      }
      if (!overlap_in_time(&iv[i], &iv[j]))
        continue;
      uint64_t si = align_up(iv[i].bytes, alignment);
      uint64_t sj = align_up(iv[j].bytes, alignment);
      /* One took over the other's block: same offset, within it. (Two
       * takers of one block overlap each other and are caught there.) */
      if (offsets[i] == offsets[j] && ((iv[i].share == j && si <= sj) ||
                                       (iv[j].share == i && sj <= si)))
        continue;
      if (offsets[i] < offsets[j] + sj && offsets[j] < offsets[i] + si) {
        if (a)
          *a = i;
        if (b)
          *b = j;
        return CAP_EINVAL;
      }
    }
  return 0;
}
