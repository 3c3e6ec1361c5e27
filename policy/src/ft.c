/*
 * Swap timing: free time (FT) of an eviction gap and the copy-engine
 * bookings that make swaps chosen earlier delay the ones chosen later.
 *
 * FT = SwapInStart - SwapOutEnd, SwapOutEnd = evicted-access end + swap-out
 * time, SwapInStart = back-access start - swap-in time (DESIGN.md). A swap
 * is hidden when, with the copy engines already busy with the swaps chosen
 * before it, its D2H can still run after the evicted-access and its H2D can
 * still end by the back-access (minus the trigger margin) after the D2H.
 */
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"

/* --- engine ---------------------------------------------------------------- */

int cap__engine_init(cap__engine_t *e, uint32_t n) {
  memset(e, 0, sizeof *e);
  size_t words = (size_t)n / 64 + 1;
  e->n = n;
  e->bits = calloc(words, sizeof *e->bits);
  e->sum = calloc(words / 64 + 1, sizeof *e->sum);
  e->first_start = calloc((size_t)n + 1, sizeof *e->first_start);
  e->last_end = calloc((size_t)n + 1, sizeof *e->last_end);
  if (!e->bits || !e->sum || !e->first_start || !e->last_end) {
    cap__engine_close(e);
    return CAP_ENOMEM;
  }
  return 0;
}

void cap__engine_close(cap__engine_t *e) {
  free(e->bits);
  free(e->sum);
  free(e->first_start);
  free(e->last_end);
  memset(e, 0, sizeof *e);
}

static inline int hibit(uint64_t w) { return 63 - __builtin_clzll(w); }
static inline int lobit(uint64_t w) { return __builtin_ctzll(w); }

uint32_t cap__engine_prev(const cap__engine_t *e, uint32_t k) {
  if (e->n == 0)
    return CAP_NONE;
  if (k >= e->n)
    k = e->n - 1;
  size_t w = k / 64;
  uint64_t m = e->bits[w] & (k % 64 == 63 ? ~0ull : ((1ull << (k % 64 + 1)) - 1));
  if (m)
    return (uint32_t)(w * 64 + (size_t)hibit(m));
  /* previous non-empty word via the summary */
  if (w == 0)
    return CAP_NONE;
  size_t sw = (w - 1) / 64;
  uint64_t sm = e->sum[sw] & (((w - 1) % 64 == 63) ? ~0ull
                                                    : ((1ull << ((w - 1) % 64 + 1)) - 1));
  for (;;) {
    if (sm) {
      size_t ww = sw * 64 + (size_t)hibit(sm);
      return (uint32_t)(ww * 64 + (size_t)hibit(e->bits[ww]));
    }
    if (sw == 0)
      return CAP_NONE;
    sm = e->sum[--sw];
  }
}

uint32_t cap__engine_next(const cap__engine_t *e, uint32_t k) {
  if (k == CAP_NONE || k + 1 >= e->n)
    return CAP_NONE;
  k++;
  size_t w = k / 64;
  uint64_t m = e->bits[w] & ~((1ull << (k % 64)) - 1);
  if (m)
    return (uint32_t)(w * 64 + (size_t)lobit(m));
  size_t words = (size_t)e->n / 64 + 1;
  size_t nw = w + 1;
  if (nw >= words)
    return CAP_NONE;
  size_t sw = nw / 64;
  size_t nsum = words / 64 + 1;
  uint64_t sm = e->sum[sw] & ~((1ull << (nw % 64)) - 1);
  for (;;) {
    if (sm) {
      size_t ww = sw * 64 + (size_t)lobit(sm);
      return (uint32_t)(ww * 64 + (size_t)lobit(e->bits[ww]));
    }
    if (++sw >= nsum)
      return CAP_NONE;
    sm = e->sum[sw];
  }
}

void cap__engine_book(cap__engine_t *e, uint32_t k, int64_t start,
                      int64_t end) {
  size_t w = k / 64;
  if (e->bits[w] & (1ull << (k % 64))) {
    if (end > e->last_end[k])
      e->last_end[k] = end;
    return;
  }
  e->bits[w] |= 1ull << (k % 64);
  e->sum[w / 64] |= 1ull << (w % 64);
  e->first_start[k] = start;
  e->last_end[k] = end;
}

/* --- free time ------------------------------------------------------------- */

int64_t cap__ft_standalone(const cap__ctx_t *c, const cap__gap_t *g) {
  uint64_t bytes = c->p->tensors[g->tensor].bytes;
  int64_t so = cap_copy_ns(bytes, c->d2h_gbps);
  int64_t si = cap_copy_ns(bytes, c->h2d_gbps);
  return (c->op_start[g->b] - si) - (c->op_end[g->a] + so);
}

#define CASCADE_MAX 32 /* later D2H keys a new copy may push back */

/* How high a pushed-back swap-out may leave memory: the target, or with
 * loose push-back the current peak (never a new peak). */
static int64_t push_limit(const cap__ctx_t *c) {
  int64_t m = cap__memtree_max_all(&c->mem);
  return c->loose_push && m > c->target ? m : c->target;
}

/* Slot on the D2H queue for a copy of len ns issued at the end of op a:
 * after every copy issued at or before a. Copies issued later are pushed
 * back (FIFO); that is refused when it would make one of them end after
 * its own hidden swap-in must start, or reach too far. */
static bool d2h_slot(const cap__ctx_t *c, uint32_t a, int64_t len,
                     int64_t *start) {
  int64_t s = c->op_end[a];
  uint32_t prev = cap__engine_prev(&c->d2h, a);
  if (prev != CAP_NONE && c->d2h.last_end[prev] > s)
    s = c->d2h.last_end[prev];
  int64_t e = s + len;
  uint32_t k = cap__engine_next(&c->d2h, a);
  for (int steps = 0; k != CAP_NONE && e > c->d2h.first_start[k]; steps++) {
    if (steps >= CASCADE_MAX || !c->push_back)
      return false;
    int64_t delta = e - c->d2h.first_start[k];
    for (uint32_t ci = c->d2h_head[k]; ci != CAP_NONE; ci = c->ch[ci].d2h_next) {
      const cap__choice_t *ch = &c->ch[ci];
      if (ch->trig_op != CAP_NONE && ch->out_end + delta > ch->in_start)
        return false;
      /* its tensor leaves later: that may fill memory up to the target
       * or the current peak, not beyond */
      uint32_t lo = cap__op_at_or_after(c, ch->out_end + delta);
      if (lo > ch->save_hi)
        lo = ch->save_hi;
      if (lo > ch->save_lo &&
          cap__memtree_max(&c->mem, ch->save_lo, lo) +
                  (int64_t)c->p->tensors[c->gaps[ch->gap].tensor].bytes >
              push_limit(c))
        return false; /* would make a new peak */
    }
    e = c->d2h.last_end[k] + delta;
    k = cap__engine_next(&c->d2h, k);
  }
  *start = s;
  return true;
}

bool cap__ft_eval(const cap__ctx_t *c, const cap__gap_t *g, bool hidden,
                  cap__swap_eval_t *ev) {
  uint64_t bytes = c->p->tensors[g->tensor].bytes;
  int64_t so = cap_copy_ns(bytes, c->d2h_gbps);
  int64_t si = cap_copy_ns(bytes, c->h2d_gbps);
  memset(ev, 0, sizeof *ev);
  if (!d2h_slot(c, g->a, so, &ev->out_start))
    return false;
  ev->out_end = ev->out_start + so;
  uint32_t so_op = cap__op_at_or_after(c, ev->out_end);
  if (so_op <= g->a)
    so_op = g->a + 1;
  if (so_op >= g->b)
    return false; /* still copying out at the back-access: saves nothing */
  ev->save_lo = so_op;
  if (hidden) {
    int64_t deadline = c->op_start[g->b] - c->cfg->trigger_margin_ns;
    int64_t st;
    uint32_t t = cap__trigger_find(c, g->tensor, so_op, g->b, si, deadline, &st);
    if (t == CAP_NONE)
      return false;
    ev->trig_op = t;
    ev->in_start = st;
    ev->in_end = st + si;
    ev->save_hi = cap__op_at_or_after(c, st);
    if (ev->save_hi > g->b)
      ev->save_hi = g->b;
    if (ev->save_hi <= ev->save_lo)
      return false;
    /* Not inside a memory peak: from the prefetch's start the tensor is
     * back, and the ops that then run must be within the target. */
    if (cap__memtree_max(&c->mem, ev->save_hi, g->b) > c->target)
      return false;
    ev->ft_ns = st - ev->out_end;
    ev->stall_ns = 0;
    return true;
  }
  /* On demand: issued when the back-access is reached, after the copies
   * already queued then; the compute stream waits for it. The stall shifts
   * every later op, so it takes no time from later bookings. */
  int64_t st = c->op_start[g->b];
  if (st < ev->out_end)
    st = ev->out_end;
  uint32_t prev = cap__engine_prev(&c->h2d, g->b);
  if (prev != CAP_NONE && c->h2d.last_end[prev] > st)
    st = c->h2d.last_end[prev];
  ev->trig_op = CAP_NONE;
  ev->in_start = st;
  ev->in_end = st + si;
  ev->save_hi = g->b;
  ev->ft_ns = st - ev->out_end;
  ev->stall_ns = ev->in_end - c->op_start[g->b];
  return true;
}

void cap__ft_commit(cap__ctx_t *c, const cap__gap_t *g,
                    const cap__swap_eval_t *ev, uint32_t ci) {
  /* push back the copies issued after g->a that the new one overlaps */
  int64_t e = ev->out_end;
  uint32_t k = cap__engine_next(&c->d2h, g->a);
  while (k != CAP_NONE && e > c->d2h.first_start[k]) {
    int64_t delta = e - c->d2h.first_start[k];
    for (uint32_t j = c->d2h_head[k]; j != CAP_NONE; j = c->ch[j].d2h_next) {
      cap__choice_t *ch = &c->ch[j];
      ch->out_end += delta;
      uint32_t lo = cap__op_at_or_after(c, ch->out_end);
      if (lo > ch->save_hi)
        lo = ch->save_hi;
      if (lo > ch->save_lo) {
        uint64_t bytes = c->p->tensors[c->gaps[ch->gap].tensor].bytes;
        cap__memtree_add(&c->mem, ch->save_lo, lo, (int64_t)bytes);
        ch->save_lo = lo;
      }
    }
    c->d2h.first_start[k] += delta;
    c->d2h.last_end[k] += delta;
    e = c->d2h.last_end[k];
    k = cap__engine_next(&c->d2h, k);
  }
  cap__engine_book(&c->d2h, g->a, ev->out_start, ev->out_end);
  /* append to the key's FIFO list */
  c->ch[ci].d2h_next = CAP_NONE;
  uint32_t *pp = &c->d2h_head[g->a];
  while (*pp != CAP_NONE)
    pp = &c->ch[*pp].d2h_next;
  *pp = ci;
  if (ev->trig_op != CAP_NONE)
    cap__engine_book(&c->h2d, ev->trig_op, ev->in_start, ev->in_end);
}
