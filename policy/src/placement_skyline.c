/*
 * Skyline placement (placement.h, CAP_PLACE_SKYLINE_*): the time axis is
 * cut at every start and end into segments, each with a level, the top of
 * what has been placed over it. Repeatedly the lowest run of segments of one
 * level (the valley) takes the best block whose lifetime lies inside it, at
 * that level; where none fits, the valley rises to its lower neighbour and
 * the room under it is given up. This packs the way the iteration's memory
 * grows and shrinks (TelaMalloc, ASPLOS 2023, also places along such a
 * contour), where first-fit leaves what no greedy order fills: on
 * bert_large at 60 % with persistent eviction, the 4 MiB gradients made in
 * the backward pass piled above the 1 MiB activations that die as they are
 * made, 7.5 % over the peak of live bytes by size, 1.7 % along the skyline.
 *
 * Time is a circle (the iteration repeats), so that a weight's two tied
 * stays, one from the iteration's start and one to its end, are one arc
 * round the end. A block and the one that takes it over (share) are one
 * block over both lifetimes.
 *
 * The skyline is a circular list of runs; a placement splits the valley in
 * at most three, a rise merges it with a neighbour. Blocks not yet placed
 * are listed by the segment their arc starts at, so that a valley looks
 * only at the blocks that start inside it.
 */
#include <stdbool.h>
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin/types.h"
#include "placement_internal.h"

typedef struct run {
  uint32_t from, width; /* segments [from, from + width), mod segs */
  uint32_t prev, next;  /* around the circle */
  uint64_t level;       /* the top of what is placed over them */
} run_t;

typedef struct sky {
  const cap_interval_t *iv;
  const uint64_t *size; /* aligned bytes */
  uint32_t n;
  int64_t *t;           /* distinct starts and ends, ascending */
  uint32_t segs;        /* segment k is [t[k], t[k + 1]) */
  uint32_t *lo, *hi;    /* per interval: its segments [lo, hi) */
  uint32_t *root;       /* per interval: the block it is placed with */
  uint32_t *next;       /* per interval: the next one in its root's list */
  uint32_t *glo, *ghi;  /* per root: the segments of its whole list */
  uint32_t *from, *len; /* per block: its arc of segments (make_arcs) */
  double *weight;       /* per block: its claim to a valley, most first */
  uint32_t *first;      /* segment s's unplaced blocks: by_start[first[s]..
                           first[s] + count[s]) */
  uint32_t *count;
  uint32_t *by_start;   /* blocks by the segment their arcs start at */
  uint32_t *pos;        /* per block: where in by_start */
  uint32_t *skip;       /* per segment: one at or before the next busy one */
  struct run *runs;     /* the skyline; at most 1 + 2 per block */
  uint32_t n_runs, head;
} sky_t;

static bool overlap(const cap_interval_t *a, const cap_interval_t *b) {
  return a->start < b->end && b->start < a->end;
}

/* --- blocks: intervals placed as one -------------------------------------- */

/* Whether i's list can join s's: no two of them meet in time but i and s
 * (the check lets only a taker and its source share bytes). */
static bool may_join(const sky_t *k, uint32_t i, uint32_t s) {
  for (uint32_t a = k->root[s]; a != CAP_NONE; a = k->next[a])
    for (uint32_t b = k->root[i]; b != CAP_NONE; b = k->next[b])
      if (!(a == s && b == i) && overlap(&k->iv[a], &k->iv[b]))
        return false;
  return true;
}

/* i takes over s's block: i's list joins s's. Takers are never larger than
 * their source, so a list's root is its largest interval. */
static void join(sky_t *k, uint32_t i, uint32_t s) {
  uint32_t ri = k->root[i], rs = k->root[s], last = rs;
  while (k->next[last] != CAP_NONE)
    last = k->next[last];
  k->next[last] = ri;
  for (uint32_t b = ri; b != CAP_NONE; b = k->next[b])
    k->root[b] = rs;
  if (k->glo[ri] < k->glo[rs])
    k->glo[rs] = k->glo[ri];
  if (k->ghi[ri] > k->ghi[rs])
    k->ghi[rs] = k->ghi[ri];
}

/* Every share that is correct to take (neither side tied, the taker no
 * larger, each block taken once) is taken: the two are one block. */
static uint32_t join_shares(sky_t *k, bool *taken) {
  uint32_t shared = 0;
  for (uint32_t i = 0; i < k->n; i++) {
    uint32_t s = k->iv[i].share;
    if (s == CAP_NONE || taken[s] || k->iv[i].same_as != CAP_NONE ||
        k->iv[s].same_as != CAP_NONE || k->size[i] > k->size[s] ||
        k->root[i] == k->root[s] || !may_join(k, i, s))
      continue;
    taken[s] = true;
    join(k, i, s);
    shared++;
  }
  return shared;
}

/* A root that is placed as a block: a tied pair is one, its lower index. */
static bool is_block(const sky_t *k, uint32_t r) {
  return k->root[r] == r && k->iv[r].same_as > r;
}

/* --- time ------------------------------------------------------------------ */

static void cut_time(sky_t *k) {
  uint32_t n = k->n, m = 0;
  for (uint32_t i = 0; i < n; i++) {
    k->t[2 * i] = k->iv[i].start;
    k->t[2 * i + 1] = k->iv[i].end;
  }
  qsort(k->t, 2 * (size_t)n, sizeof *k->t, cap__cmp_i64);
  for (uint32_t j = 0; j < 2 * n; j++)
    if (m == 0 || k->t[m - 1] != k->t[j])
      k->t[m++] = k->t[j];
  k->segs = m ? m - 1 : 0;
  for (uint32_t i = 0; i < n; i++) {
    k->lo[i] = k->glo[i] = cap__lower_bound(k->t, m, k->iv[i].start);
    k->hi[i] = k->ghi[i] = cap__lower_bound(k->t, m, k->iv[i].end);
  }
}

/* Time is a circle, as the iteration repeats: a block's segments are the
 * arc from its start for its length. A tied pair is the arc from its later
 * stay's start round to its earlier stay's end: exactly its two stays when
 * those reach the iteration's ends, as a weight's do (evicted after the
 * iteration starts, back until it ends), and more otherwise, never less. */
static void make_arcs(sky_t *k, cap_place_strategy_t how) {
  for (uint32_t r = 0; r < k->n; r++) {
    uint32_t tie = k->iv[r].same_as;
    if (!is_block(k, r))
      continue;
    if (tie == CAP_NONE) {
      k->from[r] = k->glo[r];
      k->len[r] = k->ghi[r] - k->glo[r];
    } else {
      uint32_t a = k->iv[r].start < k->iv[tie].start ? r : tie;
      uint32_t b = a == r ? tie : r;
      k->from[r] = k->lo[b];
      k->len[r] = k->segs - k->lo[b] + k->hi[a];
    }
    /* Length in segments, not in time: a block that spans many allocations
     * and frees is the one the most others must fit around. */
    k->weight[r] = how == CAP_PLACE_SKYLINE_AREA
                       ? (double)k->len[r] * (double)k->size[r]
                       : (double)k->len[r];
  }
}

/* The blocks by the segment where their arcs start. */
static void index_starts(sky_t *k) {
  uint32_t segs = k->segs, *first = k->first;
  for (uint32_t r = 0; r < k->n; r++)
    if (is_block(k, r))
      k->count[k->from[r]]++;
  for (uint32_t s = 0; s < segs; s++)
    first[s + 1] = first[s] + k->count[s];
  for (uint32_t s = 0; s <= segs; s++)
    k->skip[s] = s < segs && !k->count[s] ? s + 1 : s;
  uint32_t *fill = k->count; /* counts again once every block is in */
  for (uint32_t s = 0; s < segs; s++)
    fill[s] = 0;
  for (uint32_t r = 0; r < k->n; r++)
    if (is_block(k, r)) {
      uint32_t s = k->from[r];
      k->pos[r] = first[s] + fill[s]++;
      k->by_start[k->pos[r]] = r;
    }
}

/* --- the skyline ------------------------------------------------------------ */

/* Whether block x claims the valley before block y: more weight, then
 * larger, then the lower index (deterministic). */
static bool before(const sky_t *k, uint32_t x, uint32_t y) {
  if (y == CAP_NONE)
    return true;
  if (k->weight[x] != k->weight[y])
    return k->weight[x] > k->weight[y];
  if (k->size[x] != k->size[y])
    return k->size[x] > k->size[y];
  return x < y;
}

/* The first segment at or after s (segs if none) that still starts the
 * arc of an unplaced block: empty ones are skipped, their links shortened
 * on the way (path halving). */
static uint32_t busy_from(sky_t *k, uint32_t s) {
  while (k->skip[s] != s) {
    k->skip[s] = k->skip[k->skip[s]];
    s = k->skip[s];
  }
  return s;
}

/* The best of the unplaced blocks whose arcs start in segments [lo, hi),
 * at least `d0` segments into a valley of `width`, and lie within it. */
static uint32_t best_in(sky_t *k, uint32_t lo, uint32_t hi, uint32_t d0,
                        uint32_t width, uint32_t best) {
  for (uint32_t s = busy_from(k, lo); s < hi; s = busy_from(k, s + 1)) {
    uint32_t d = d0 + (s - lo);
    for (uint32_t j = k->first[s]; j < k->first[s] + k->count[s]; j++) {
      uint32_t r = k->by_start[j];
      if ((width == k->segs || d + k->len[r] <= width) &&
          before(k, r, best))
        best = r;
    }
  }
  return best;
}

/* The best unplaced block whose arc lies in the valley of `width` segments
 * from segment `from` (the whole circle if width is segs), in two pieces
 * where it wraps round. CAP_NONE if none fits. */
static uint32_t best_for(sky_t *k, uint32_t from, uint32_t width) {
  uint32_t segs = k->segs, end = from + width;
  uint32_t best = best_in(k, from, end < segs ? end : segs, 0, width,
                          CAP_NONE);
  if (end > segs)
    best = best_in(k, 0, end - segs, segs - from, width, best);
  return best;
}

/* Block r leaves its segment's list of unplaced blocks. */
static void unlist(sky_t *k, uint32_t r) {
  uint32_t s = k->from[r], last = k->first[s] + --k->count[s];
  uint32_t moved = k->by_start[last];
  k->by_start[k->pos[r]] = moved;
  k->pos[moved] = k->pos[r];
  if (!k->count[s])
    k->skip[s] = s + 1;
}

static void settle(sky_t *k, uint32_t r, uint64_t level, uint64_t *offset) {
  uint32_t tie = k->iv[r].same_as;
  unlist(k, r);
  for (uint32_t b = r; b != CAP_NONE; b = k->next[b])
    offset[b] = level;
  if (tie != CAP_NONE)
    offset[tie] = level;
}

/* The skyline as a circular list of runs: segments [from, from + width)
 * (mod segs) at one level. */
static uint32_t run_new(sky_t *k, uint32_t from, uint32_t width,
                        uint64_t level) {
  uint32_t x = k->n_runs++;
  k->runs[x] = (run_t){.from = from, .width = width, .level = level,
                       .prev = x, .next = x};
  return x;
}

static void run_insert_after(sky_t *k, uint32_t at, uint32_t x) {
  run_t *r = k->runs;
  r[x].prev = at;
  r[x].next = r[at].next;
  r[r[at].next].prev = x;
  r[at].next = x;
}

/* The lowest run, grown over its neighbours of the same level: the valley.
 * Among equally low runs, the one that starts first (deterministic). */
static uint32_t valley(sky_t *k) {
  run_t *r = k->runs;
  uint32_t v = k->head;
  for (uint32_t x = r[v].next; x != k->head; x = r[x].next)
    if (r[x].level < r[v].level ||
        (r[x].level == r[v].level && r[x].from < r[v].from))
      v = x;
  for (uint32_t side = 0; side < 2; side++)
    for (;;) {
      uint32_t x = side ? r[v].next : r[v].prev;
      if (x == v || r[x].level != r[v].level)
        break;
      if (!side)
        r[v].from = r[x].from;
      r[v].width += r[x].width;
      r[r[x].prev].next = r[x].next; /* unlink x */
      r[r[x].next].prev = r[x].prev;
      if (k->head == x)
        k->head = v;
    }
  return v;
}

/* Block b goes into valley v at its level: v splits into what lies before
 * the block (if anything), the block, and what lies after. */
static void fill(sky_t *k, uint32_t v, uint32_t b) {
  run_t *r = k->runs;
  uint32_t segs = k->segs, from = r[v].from, width = r[v].width;
  uint32_t d = (k->from[b] + segs - from) % segs, len = k->len[b];
  uint64_t level = r[v].level;
  if (width == segs) { /* the whole circle: one run is left, after it */
    d = 0;
    from = k->from[b];
  }
  r[v].from = k->from[b];
  r[v].width = len;
  r[v].level = level + k->size[b];
  if (d + len < width)
    run_insert_after(k, v, run_new(k, (from + d + len) % segs,
                                   width - d - len, level));
  if (d > 0)
    run_insert_after(k, r[v].prev, run_new(k, from, d, level));
}

/* Place every block: the lowest valley takes its best block or, if none
 * fits, rises to its lower neighbour. When the valley is the whole circle
 * every block fits, so this ends. */
static void place_all(sky_t *k, uint64_t *offset) {
  uint32_t left = 0;
  for (uint32_t r = 0; r < k->n; r++)
    left += is_block(k, r);
  k->head = run_new(k, 0, k->segs, 0);
  while (left) {
    uint32_t v = valley(k);
    run_t *r = k->runs;
    uint32_t b = best_for(k, r[v].from, r[v].width);
    if (b != CAP_NONE) {
      settle(k, b, r[v].level, offset);
      fill(k, v, b);
      left--;
      continue;
    }
    uint64_t before_v = r[r[v].prev].level, after_v = r[r[v].next].level;
    r[v].level = before_v < after_v ? before_v : after_v;
  }
}

int cap__place_skyline(const cap_interval_t *iv, const uint64_t *size,
                       uint32_t n, cap_place_strategy_t s, uint64_t *offset,
                       uint64_t *arena, uint32_t *shared) {
  size_t m = n ? n : 1;
  sky_t k = {.iv = iv, .size = size, .n = n};
  k.t = malloc(2 * m * sizeof *k.t);
  k.lo = malloc(m * sizeof *k.lo);
  k.hi = malloc(m * sizeof *k.hi);
  k.root = malloc(m * sizeof *k.root);
  k.next = malloc(m * sizeof *k.next);
  k.glo = malloc(m * sizeof *k.glo);
  k.ghi = malloc(m * sizeof *k.ghi);
  k.from = malloc(m * sizeof *k.from);
  k.len = malloc(m * sizeof *k.len);
  k.weight = malloc(m * sizeof *k.weight);
  k.first = calloc(2 * m + 1, sizeof *k.first);
  k.count = calloc(2 * m, sizeof *k.count);
  k.by_start = malloc(m * sizeof *k.by_start);
  k.pos = malloc(m * sizeof *k.pos);
  k.skip = malloc((2 * m + 1) * sizeof *k.skip);
  k.runs = malloc((2 * m + 1) * sizeof *k.runs);
  bool *taken = calloc(m, sizeof *taken);
  int rc = k.t && k.lo && k.hi && k.root && k.next && k.glo && k.ghi && k.from && k.len && k.weight &&
                   k.first && k.count && k.by_start && k.pos && k.skip && k.runs && taken
               ? 0
               : CAP_ENOMEM;
  if (!rc) {
    for (uint32_t i = 0; i < n; i++) {
      k.root[i] = i;
      k.next[i] = CAP_NONE;
    }
    cut_time(&k);
    *shared = join_shares(&k, taken);
    make_arcs(&k, s);
    index_starts(&k);
    place_all(&k, offset);
    *arena = 0;
    for (uint32_t i = 0; i < n; i++)
      if (offset[i] + size[i] > *arena)
        *arena = offset[i] + size[i];
  }
  free(k.t);
  free(k.lo);
  free(k.hi);
  free(k.root);
  free(k.next);
  free(k.glo);
  free(k.ghi);
  free(k.from);
  free(k.len);
  free(k.weight);
  free(k.first);
  free(k.count);
  free(k.by_start);
  free(k.pos);
  free(k.skip);
  free(k.runs);
  free(taken);
  return rc;
}
