/*
 * Offset planning over residency intervals (placement.h).
 *
 * The greedy strategies share one placer: intervals are taken in the
 * strategy's order and each goes to the lowest offset at which it collides
 * with none of the already placed intervals it overlaps in time (TensorFlow
 * Lite's greedy offset calculation; its GPU delegate also tries several
 * orders and keeps the best). What differs is the order:
 *  - by size: largest first, so that big blocks claim the low addresses and
 *    small ones fill the holes between them;
 *  - by breadth: the instants with the most live bytes decide first, as they
 *    are the ones that set the arena size;
 *  - by area: most bytes x time first.
 * Finding the lowest gap is a scan of the placed intervals in address order
 * that skips those the new one does not meet in time: quadratic in the worst
 * case, a few milliseconds for the few thousand intervals of an iteration.
 * The skyline strategies place along the top of what is placed instead
 * (placement_skyline.c).
 */
#include <stdbool.h>
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/types.h"
#include "placement_internal.h"

const char *cap_place_strategy_name(cap_place_strategy_t s) {
  switch (s) {
  case CAP_PLACE_BY_SIZE:
    return "size";
  case CAP_PLACE_BY_BREADTH:
    return "breadth";
  case CAP_PLACE_BY_AREA:
    return "area";
  case CAP_PLACE_SKYLINE_LENGTH:
    return "skyline-length";
  case CAP_PLACE_SKYLINE_AREA:
    return "skyline-area";
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

/* The placed intervals are kept in address order (an insertion into a
 * sorted array), so that finding the lowest gap for the next one is one
 * scan that skips those it does not meet in time. */
typedef struct placer {
  const cap_interval_t *iv;
  const uint64_t *size; /* aligned bytes */
  uint32_t n;
  uint64_t *offset;
  bool *placed;
  bool *taken;          /* this interval's block was taken over (share) */
  uint32_t *by_addr;    /* placed intervals by offset */
  uint32_t n_placed;
  uint32_t shared;
  uint64_t arena;
} placer_t;

/* Whether placed interval j meets interval i, or i's tie, in time. */
static bool meets(const placer_t *pl, uint32_t i, uint32_t tie, uint32_t j) {
  return overlap_in_time(&pl->iv[i], &pl->iv[j]) ||
         (tie != CAP_NONE && overlap_in_time(&pl->iv[tie], &pl->iv[j]));
}

/* Whether [off, off + size) is clear of every placed interval that meets i
 * in time, `except` aside. */
static bool fits_at(const placer_t *pl, uint32_t i, uint64_t off,
                    uint64_t size, uint32_t except) {
  for (uint32_t k = 0; k < pl->n_placed; k++) {
    uint32_t j = pl->by_addr[k];
    if (pl->offset[j] >= off + size)
      break;
    if (j != except && off < pl->offset[j] + pl->size[j] &&
        meets(pl, i, CAP_NONE, j))
      return false;
  }
  return true;
}

/* The lowest offset where interval i (and its tie) meets nothing placed. */
static uint64_t lowest_gap(const placer_t *pl, uint32_t i, uint32_t tie) {
  uint64_t off = 0, size = pl->size[i];
  for (uint32_t k = 0; k < pl->n_placed; k++) {
    uint32_t j = pl->by_addr[k];
    if (pl->offset[j] >= off + size)
      break; /* the gap below j fits */
    uint64_t top = pl->offset[j] + pl->size[j];
    if (top > off && meets(pl, i, tie, j))
      off = top;
  }
  return off;
}

static void mark_placed(placer_t *pl, uint32_t i, uint64_t off) {
  pl->offset[i] = off;
  pl->placed[i] = true;
  uint32_t k = pl->n_placed++;
  while (k > 0 && pl->offset[pl->by_addr[k - 1]] > off) {
    pl->by_addr[k] = pl->by_addr[k - 1];
    k--;
  }
  pl->by_addr[k] = i;
  if (off + pl->size[i] > pl->arena)
    pl->arena = off + pl->size[i];
}

/* Place interval i, and the interval tied to it (same_as) at the same
 * offset: the neighbours are those of either. */
static void place_one(placer_t *pl, uint32_t i) {
  if (pl->placed[i])
    return; /* placed with its tie */
  uint32_t tie = pl->iv[i].same_as;
  uint64_t size = pl->size[i], off;
  uint32_t s = pl->iv[i].share;
  if (s != CAP_NONE && tie == CAP_NONE && pl->placed[s] && !pl->taken[s] &&
      size <= pl->size[s] && fits_at(pl, i, pl->offset[s], size, s)) {
    pl->taken[s] = true;
    pl->shared++;
    off = pl->offset[s];
  } else {
    off = lowest_gap(pl, i, tie);
  }
  mark_placed(pl, i, off);
  if (tie != CAP_NONE)
    mark_placed(pl, tie, off);
}

/* --- orders --------------------------------------------------------------- */

typedef struct by_size {
  uint64_t rank; /* sorts first, ascending */
  uint64_t size;
  int64_t start;
  uint32_t i;
} by_size_t;

/* Lower rank first, then larger; ties: earlier start, then lower index
 * (deterministic). */
static int cmp_by_size(const void *a, const void *b) {
  const by_size_t *x = a, *y = b;
  if (x->rank != y->rank)
    return x->rank < y->rank ? -1 : 1;
  if (x->size != y->size)
    return x->size < y->size ? 1 : -1;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  return (x->i > y->i) - (x->i < y->i);
}

/* order[0..n) = the intervals by rank[i] (NULL: all equal), then size. */
static void sort_order(const cap_interval_t *iv, const uint64_t *size,
                       const uint64_t *rank, uint32_t n, uint32_t *order,
                       by_size_t *keys) {
  for (uint32_t i = 0; i < n; i++)
    keys[i] = (by_size_t){rank ? rank[i] : 0, size[i], iv[i].start, i};
  qsort(keys, n, sizeof *keys, cmp_by_size);
  for (uint32_t k = 0; k < n; k++)
    order[k] = keys[k].i;
}

/* The instants that matter: live bytes only grow where an interval starts. */
typedef struct instants {
  int64_t *t;       /* distinct starts, ascending */
  uint64_t *live;   /* aligned bytes live at t[k] */
  uint32_t m;
} instants_t;

int cap__cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* First k with t[k] >= x (m if none). */
uint32_t cap__lower_bound(const int64_t *t, uint32_t m, int64_t x) {
  uint32_t lo = 0, hi = m;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (t[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Live bytes at every start: +size where an interval starts, -size at the
 * first instant at or after its end, and a prefix sum. */
static int instants_build(const cap_interval_t *iv, const uint64_t *size,
                          uint32_t n, instants_t *in) {
  size_t m1 = (size_t)n + 1;
  in->t = malloc(m1 * sizeof *in->t);
  in->live = calloc(m1, sizeof *in->live);
  int64_t *delta = calloc(m1, sizeof *delta);
  if (!in->t || !in->live || !delta) {
    free(delta);
    return CAP_ENOMEM;
  }
  for (uint32_t i = 0; i < n; i++)
    in->t[i] = iv[i].start;
  qsort(in->t, n, sizeof *in->t, cap__cmp_i64);
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; i++)
    if (m == 0 || in->t[m - 1] != in->t[i])
      in->t[m++] = in->t[i];
  in->m = m;
  for (uint32_t i = 0; i < n; i++) {
    delta[cap__lower_bound(in->t, m, iv[i].start)] += (int64_t)size[i];
    delta[cap__lower_bound(in->t, m, iv[i].end)] -= (int64_t)size[i];
  }
  int64_t live = 0;
  for (uint32_t k = 0; k < m; k++) {
    live += delta[k];
    in->live[k] = (uint64_t)live;
  }
  free(delta);
  return 0;
}

static void instants_free(instants_t *in) {
  free(in->t);
  free(in->live);
}

typedef struct by_live {
  uint64_t live;
  uint32_t k;
} by_live_t;

static int cmp_by_live(const void *a, const void *b) {
  const by_live_t *x = a, *y = b;
  if (x->live != y->live)
    return x->live < y->live ? 1 : -1;
  return (x->k > y->k) - (x->k < y->k);
}

/* Greedy by breadth (TensorFlow Lite): instants in order of live bytes,
 * most first; at each, its still unplaced intervals largest first. An
 * interval is thus taken at the best-ranked instant it spans: its rank is a
 * range minimum over the instants, answered by a sparse table. */
static int order_by_breadth(const cap_interval_t *iv, const uint64_t *size,
                            uint32_t n, const instants_t *in, uint32_t *order,
                            by_size_t *keys) {
  uint32_t m = in->m, levels = 1;
  while ((1u << levels) <= m)
    levels++;
  by_live_t *bl = malloc((m ? m : 1) * sizeof *bl);
  uint32_t *table = malloc((size_t)levels * (m ? m : 1) * sizeof *table);
  uint64_t *rank = malloc((n ? n : 1) * sizeof *rank);
  if (!bl || !table || !rank) {
    free(bl);
    free(table);
    free(rank);
    return CAP_ENOMEM;
  }
  for (uint32_t k = 0; k < m; k++)
    bl[k] = (by_live_t){in->live[k], k};
  qsort(bl, m, sizeof *bl, cmp_by_live);
  for (uint32_t r = 0; r < m; r++)
    table[bl[r].k] = r; /* level 0: the rank of instant k */
  for (uint32_t l = 1; l < levels; l++)
    for (uint32_t k = 0; k + (1u << l) <= m; k++) {
      uint32_t a = table[(size_t)(l - 1) * m + k];
      uint32_t b = table[(size_t)(l - 1) * m + k + (1u << (l - 1))];
      table[(size_t)l * m + k] = a < b ? a : b;
    }
  for (uint32_t i = 0; i < n; i++) {
    uint32_t lo = cap__lower_bound(in->t, m, iv[i].start);
    uint32_t hi = cap__lower_bound(in->t, m, iv[i].end); /* instants [lo, hi) */
    uint32_t l = 0;
    while ((2u << l) <= hi - lo)
      l++;
    uint32_t a = table[(size_t)l * m + lo];
    uint32_t b = table[(size_t)l * m + hi - (1u << l)];
    rank[i] = a < b ? a : b;
  }
  sort_order(iv, size, rank, n, order, keys);
  free(bl);
  free(table);
  free(rank);
  return 0;
}

/* --- entry points --------------------------------------------------------- */

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

/* Bytes x time, largest first: the rank is its complement, as rank sorts
 * ascending. (Size and time are each below 2^63; their product is taken
 * in double, exact enough to order by.) */
static int order_by_area(const cap_interval_t *iv, const uint64_t *size,
                         uint32_t n, uint32_t *order, by_size_t *keys) {
  uint64_t *rank = malloc((n ? n : 1) * sizeof *rank);
  if (!rank)
    return CAP_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    double area = (double)size[i] * (double)(iv[i].end - iv[i].start);
    rank[i] = area >= 0x1p64 ? 0 : UINT64_MAX - (uint64_t)area;
  }
  sort_order(iv, size, rank, n, order, keys);
  free(rank);
  return 0;
}

static int place_skyline(const cap_interval_t *iv, const uint64_t *size,
                         uint32_t n, cap_place_strategy_t s,
                         cap_placement_t *out) {
  uint64_t *offset = calloc(n ? n : 1, sizeof *offset), arena = 0;
  uint32_t shared = 0;
  int rc = offset ? cap__place_skyline(iv, size, n, s, offset, &arena, &shared)
                  : CAP_ENOMEM;
  if (rc) {
    free(offset);
    return rc;
  }
  *out = (cap_placement_t){.offsets = offset, .n = n, .arena_bytes = arena,
                           .strategy = s, .shared = shared};
  return 0;
}

static int place_with(const cap_interval_t *iv, const uint64_t *size,
                      uint32_t n, const instants_t *in, cap_place_strategy_t s,
                      cap_placement_t *out) {
  if (s == CAP_PLACE_SKYLINE_LENGTH || s == CAP_PLACE_SKYLINE_AREA)
    return place_skyline(iv, size, n, s, out);
  size_t m = n ? n : 1;
  placer_t pl = {.iv = iv, .size = size, .n = n};
  uint32_t *order = malloc(m * sizeof *order);
  by_size_t *keys = malloc(m * sizeof *keys);
  pl.by_addr = malloc(m * sizeof *pl.by_addr);
  pl.offset = calloc(m, sizeof *pl.offset);
  pl.placed = calloc(m, sizeof *pl.placed);
  pl.taken = calloc(m, sizeof *pl.taken);
  int rc = order && keys && pl.by_addr && pl.offset && pl.placed && pl.taken
               ? 0
               : CAP_ENOMEM;
  if (!rc) {
    if (s == CAP_PLACE_BY_SIZE)
      sort_order(iv, size, NULL, n, order, keys);
    else if (s == CAP_PLACE_BY_AREA)
      rc = order_by_area(iv, size, n, order, keys);
    else
      rc = order_by_breadth(iv, size, n, in, order, keys);
  }
  for (uint32_t k = 0; !rc && k < n; k++)
    place_one(&pl, order[k]);
  free(order);
  free(keys);
  free(pl.by_addr);
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
  instants_t in = {0};
  if (!size)
    return CAP_ENOMEM;
  for (uint32_t i = 0; i < n; i++)
    size[i] = align_up(iv[i].bytes, alignment);
  rc = instants_build(iv, size, n, &in);

  if (rc) {
    /* out of memory */
  } else if (s != CAP_PLACE_BEST) {
    rc = place_with(iv, size, n, &in, s, out);
  } else {
    for (int k = 0; k < CAP_PLACE_N_STRATEGIES && !rc; k++) {
      cap_placement_t trial;
      rc = place_with(iv, size, n, &in, (cap_place_strategy_t)k, &trial);
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
  /* The peak counts every interval, a shared pair twice: sharing is what
   * can bring an arena below it. */
  for (uint32_t k = 0; !rc && k < in.m; k++)
    if (in.live[k] > out->peak_bytes)
      out->peak_bytes = in.live[k];
  if (rc)
    cap_placement_close(out);
  instants_free(&in);
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
