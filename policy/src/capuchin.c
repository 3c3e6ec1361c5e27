/*
 * The Capuchin planner (Peng et al., ASPLOS 2020, Algorithms 1 and 2).
 *
 * Round after round, until the simulated peak fits the budget:
 *  1. Swaps, in order of largest free time, while they can be hidden: each
 *     is booked on the copy engines (FIFO, duplex-limited rates), so a swap
 *     chosen later sees the engines busy with the earlier ones, and gets the
 *     latest in-trigger that still brings it back in time without landing
 *     inside the over-budget region.
 *  2. What is still over the target is covered by the cheaper of recompute
 *     (ranked by MSPS, re-evaluated lazily as choices change the lineage
 *     sources: the iterative update) and exposed swap time.
 *  Only candidates whose freed range still covers an op over the target are
 *  taken, so the over-budget region drives every choice; passes repeat
 *  while they add choices. The op-space estimate (capuchin_internal.h) is
 *  updated incrementally; the simulator then checks the plan, and where it
 *  disagrees the target is lowered by the difference for the next round.
 *  A fitting plan is then pruned: costly choices it turns out not to need
 *  are undone and the result simulated again.
 *
 * Improvements over the paper's single greedy pass, all judged by the same
 * simulator: a small portfolio of orders (paper order, MSPS weighted by how
 * much of the over-budget region a choice covers, one ranking for swaps and
 * recomputes, aiming a little under the budget, stricter or looser pushing
 * back of queued swap-outs, copies booked at each direction's full rate,
 * hidden swaps given first to the tensors costliest to replay, replays
 * ranked by their cost beyond the lists they make unnecessary) whose best
 * simulated plan wins; several evictions per tensor (every access gap is a
 * candidate); nested restores (a replay may use a source the plan drops or
 * swaps, and brings it back); a local search under the simulator on the
 * best three plans (improve.c); the winning order run again without the
 * best plan's costliest replays.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"
#include "planners.h"

#define MAX_ROUNDS 12
#define PORTFOLIO_FULL_OPS 20000u /* profiles up to this run every variant */
#define IMPROVE_TRIES 64u /* replays the local search tries as swaps */
/* Profiles under CAP__SMALL_OPS get TRIES_OPS / n_ops times the tries (up
 * to 4x) and the search repeated while it helps. */
#define TRIES_OPS 4000u
#define SEARCH_MIN_TRIES 16u /* the search is not repeated with fewer */
#define POLISH_SIMS 64u /* simulations of the last pass on late prefetches */
#define SUBST_SIMS 32u /* simulations of the late-swap substitution */
#define MANY_TRIES 16u /* replays, and swaps, each exchange pass tries */
#define MANY_PASSES 3u /* its passes, each with a search after */
#define POLISH_PASSES 6u /* rounds of that pass, each with a search after */
#define TRADE_TRIES 16u /* replays each trade pass tries */
#define TRADE_PASSES 3u /* its passes, each with a search after */
/* the room trade once more with TRADE_DEEP times the tries (trade_and_room) */
#define TRADE_DEEP 4u
#define QUEUED_TRIES 32u /* swaps each pass off the queues tries */
#define QUEUED_PASSES 3u /* its passes, each with a search after */
#define GROUP_OPS 8u     /* multi-output ops the group move replays whole */
/* plans stalling at least 1/STALL_REPLAN_DIV of their iteration are planned
 * again with waits for room (cap__plan_capuchin) */
#define STALL_REPLAN_DIV 1000

static int push_choice(cap__ctx_t *c, const cap__choice_t *ch) {
  if (c->n_ch == c->cap_ch) {
    uint32_t cap = c->cap_ch ? c->cap_ch * 2 : 64;
    cap__choice_t *n = realloc(c->ch, (size_t)cap * sizeof *n);
    if (!n)
      return CAP_ENOMEM;
    c->ch = n;
    c->cap_ch = cap;
  }
  c->ch[c->n_ch++] = *ch;
  return 0;
}

static int take_swap(cap__ctx_t *c, uint32_t gi, const cap__gap_t *g,
                     const cap__swap_eval_t *ev) {
  cap__choice_t ch = {.gap = gi,
                      .method = CAP_METHOD_SWAP,
                      .trig_op = ev->trig_op,
                      .save_lo = ev->save_lo,
                      .save_hi = ev->save_hi,
                      .in_end = ev->in_end,
                      .in_start = ev->in_start,
                      .out_end = ev->out_end,
                      .cost_ns = ev->stall_ns};
  int rc = push_choice(c, &ch);
  if (rc)
    return rc;
  cap__ft_commit(c, g, ev, c->n_ch - 1);
  c->slot_choice[c->p->tensors[g->tensor].access_off + g->k - 1] = c->n_ch - 1;
  c->gap_state[c->p->tensors[g->tensor].access_off + g->k - 1] = GAP_SWAP;
  cap__memtree_add(&c->mem, ev->save_lo, ev->save_hi,
                   -(int64_t)c->p->tensors[g->tensor].bytes);
  return 0;
}

/* Take the recompute of gap gi whose list is in c->list. */
static int take_recompute(cap__ctx_t *c, uint32_t gi, const cap__gap_t *g,
                          int64_t cost, int64_t extra) {
  if (c->n_rc_ops + c->list.n > c->cap_rc_ops) {
    uint32_t cap = c->cap_rc_ops ? c->cap_rc_ops : 256;
    while (cap < c->n_rc_ops + c->list.n)
      cap *= 2;
    uint32_t *n = realloc(c->rc_ops, (size_t)cap * sizeof *n);
    if (!n)
      return CAP_ENOMEM;
    c->rc_ops = n;
    c->cap_rc_ops = cap;
  }
  cap__choice_t ch = {.gap = gi,
                      .method = CAP_METHOD_RECOMPUTE,
                      .trig_op = CAP_NONE,
                      .rc_off = c->n_rc_ops,
                      .rc_n = c->list.n,
                      .save_lo = g->a + 1,
                      .save_hi = g->b,
                      .extra_bytes = extra,
                      .cost_ns = cost};
  int rc = push_choice(c, &ch);
  if (rc)
    return rc;
  memcpy(c->rc_ops + c->n_rc_ops, c->list.v, c->list.n * sizeof *c->list.v);
  c->n_rc_ops += c->list.n;
  rc = cap__rc_register(c, g->b);
  if (rc)
    return rc;
  c->gap_state[c->p->tensors[g->tensor].access_off + g->k - 1] = GAP_RECOMPUTE;
  c->slot_choice[c->p->tensors[g->tensor].access_off + g->k - 1] = c->n_ch - 1;
  /* tensors this replay brings back stay from op b on */
  for (uint32_t i = 0; i < c->restored.n; i++) {
    cap__choice_t *r = &c->ch[c->restored.v[i]];
    if (r->save_hi > g->b) {
      cap__memtree_add(&c->mem, g->b, r->save_hi,
                       (int64_t)c->p->tensors[c->gaps[r->gap].tensor].bytes);
      r->save_hi = g->b;
    }
  }
  cap__memtree_add(&c->mem, g->a + 1, g->b,
                   -(int64_t)c->p->tensors[g->tensor].bytes);
  cap__memtree_add(&c->mem, g->b, g->b + 1, extra);
  return 0;
}

/* Release every tail still held over an op above the target: it costs
 * nothing (the tensor is never read again). A tail that a chosen recompute
 * list reads stays, and a later list may not read a released tensor
 * (cap__rc_build). */
static int take_releases(cap__ctx_t *c, int64_t target) {
  for (uint32_t i = 0; i < c->n_tails; i++) {
    uint32_t gi = c->n_gaps + i;
    const cap__gap_t *g = &c->gaps[gi];
    uint32_t slot = c->p->tensors[g->tensor].access_off + g->k - 1;
    if (c->gap_state[slot] != GAP_FREE ||
        cap__memtree_max(&c->mem, g->a + 1, g->b) <= target ||
        cap__first_use(c, g->tensor, g->a, g->b) != CAP_NONE)
      continue;
    cap__choice_t ch = {.gap = gi,
                        .method = CAP_METHOD_RECOMPUTE,
                        .trig_op = CAP_NONE,
                        .save_lo = g->a + 1,
                        .save_hi = g->b,
                        .release = true};
    int rc = push_choice(c, &ch);
    if (rc)
      return rc;
    c->gap_state[slot] = GAP_RECOMPUTE;
    c->slot_choice[slot] = c->n_ch - 1;
    cap__memtree_add(&c->mem, g->a + 1, g->b,
                     -(int64_t)c->p->tensors[g->tensor].bytes);
  }
  return 0;
}

static bool gap_free(const cap__ctx_t *c, const cap__gap_t *g) {
  return c->gap_state[c->p->tensors[g->tensor].access_off + g->k - 1] ==
         GAP_FREE;
}

/* Gap gi as far as an eviction can reach now: a chosen recompute list that
 * reads the tensor inside the gap brings it back there. False when nothing
 * is left to free. */
static bool eff_gap(const cap__ctx_t *c, uint32_t gi, cap__gap_t *eg) {
  *eg = c->gaps[gi];
  if (!gap_free(c, eg))
    return false;
  uint32_t u = cap__first_use(c, eg->tensor, eg->a, eg->b);
  if (u != CAP_NONE)
    eg->b = u;
  return eg->b > eg->a + 1;
}

/* --- phase 1: hidden swaps by free time ------------------------------------ */

typedef struct {
  double rank; /* descending: the order phase 1 tries the gaps in */
  int64_t ft;
  uint32_t gi;
} ft_key_t;

static int cmp_ft(const void *a, const void *b) {
  const ft_key_t *x = a, *y = b;
  if (x->rank != y->rank)
    return x->rank > y->rank ? -1 : 1;
  if (x->ft != y->ft)
    return x->ft > y->ft ? -1 : 1;
  return x->gi < y->gi ? -1 : x->gi > y->gi;
}

static int phase_swaps(cap__ctx_t *c, const ft_key_t *order, uint32_t n,
                       int64_t target) {
  for (uint32_t i = 0; i < n; i++) {
    if (cap__memtree_max_all(&c->mem) <= target)
      return 0;
    if (order[i].ft <= 0)
      continue; /* cannot be hidden even with idle engines */
    cap__gap_t eg;
    const cap__gap_t *g = &eg;
    if (c->no_hidden[order[i].gi] || !eff_gap(c, order[i].gi, &eg))
      continue;
    if (cap__memtree_max(&c->mem, g->a + 1, g->b) <= target)
      continue;
    cap__swap_eval_t ev;
    if (!cap__ft_eval(c, g, true, &ev)) {
      /* the engines only get busier: it will not be hidden later either */
      c->no_hidden[order[i].gi] = 1;
      continue;
    }
    if (cap__memtree_max(&c->mem, ev.save_lo, ev.save_hi) <= target)
      continue;
    int rc = take_swap(c, order[i].gi, g, &ev);
    if (rc)
      return rc;
  }
  return 0;
}

/* --- phase 2: recompute by MSPS, or exposed swaps ------------------------- */

typedef struct {
  double key;
  uint32_t gi;
} heap_ent_t;

typedef struct {
  heap_ent_t *v;
  uint32_t n, cap;
} heap_t;

static int heap_push(heap_t *h, double key, uint32_t gi) {
  if (h->n == h->cap) {
    uint32_t cap = h->cap ? h->cap * 2 : 256;
    heap_ent_t *n = realloc(h->v, (size_t)cap * sizeof *n);
    if (!n)
      return CAP_ENOMEM;
    h->v = n;
    h->cap = cap;
  }
  uint32_t i = h->n++;
  while (i > 0) {
    uint32_t par = (i - 1) / 2;
    if (h->v[par].key >= key)
      break;
    h->v[i] = h->v[par];
    i = par;
  }
  h->v[i] = (heap_ent_t){key, gi};
  return 0;
}

static heap_ent_t heap_pop(heap_t *h) {
  heap_ent_t top = h->v[0], last = h->v[--h->n];
  uint32_t i = 0;
  for (;;) {
    uint32_t l = 2 * i + 1, r = l + 1, m = i;
    double mk = last.key;
    if (l < h->n && h->v[l].key > mk) {
      m = l;
      mk = h->v[l].key;
    }
    if (r < h->n && h->v[r].key > mk)
      m = r;
    if (m == i)
      break;
    h->v[i] = h->v[m];
    i = m;
  }
  if (h->n)
    h->v[i] = last;
  return top;
}

typedef struct {
  cap__gap_t g; /* effective gap */
  bool ok;
  bool swap;
  cap__swap_eval_t ev;
  int64_t cost, extra;
  uint32_t lo, hi;
} opt_t;

/* Best way to evict gap gi now: hidden swap (free), else the cheaper of
 * recompute and exposed swap. Leaves the recompute list in c->list when
 * that is the choice. */
static int eval_gap(cap__ctx_t *c, uint32_t gi, int64_t target, opt_t *o) {
  memset(o, 0, sizeof *o);
  if (!eff_gap(c, gi, &o->g))
    return 0;
  const cap__gap_t *g = &o->g;
  cap__swap_eval_t ev;
  /* a hidden swap is free, but only worth it if what it frees is still
   * over the target (a swap-out queued behind others may free too late) */
  if (cap__ft_eval(c, g, true, &ev) &&
      cap__memtree_max(&c->mem, ev.save_lo, ev.save_hi) > target) {
    *o = (opt_t){*g, true, true, ev, 0, 0, ev.save_lo, ev.save_hi};
    return 0;
  }
  int64_t cost, extra;
  int rc = cap__rc_build(c, g, &cost, &extra);
  if (rc == CAP_ENOMEM)
    return rc;
  /* what the replay costs beyond the lists it makes unnecessary */
  if (rc == 0 && c->share_lineage) {
    cost -= cap__rc_saved(c, g->b);
    if (cost < 0)
      cost = 0;
  }
  /* an exposed swap costs at least its swap-in: skip it when the replay
   * is cheaper anyway */
  bool have_swap = false;
  if (rc != 0 || cost > cap_copy_ns(c->p->tensors[g->tensor].bytes, c->h2d_gbps))
    have_swap = cap__ft_eval(c, g, false, &ev) &&
                cap__memtree_max(&c->mem, ev.save_lo, ev.save_hi) > target;
  /* A replay's temporaries must not make its back-access a new peak, nor
   * may the tensors it brings back early (nested restores) go over. */
  if (rc == 0 && extra > 0 &&
      cap__memtree_max(&c->mem, g->b, g->b + 1) + extra > target)
    rc = CAP_ENOENT;
  for (uint32_t i = 0; rc == 0 && i < c->restored.n; i++) {
    const cap__choice_t *r = &c->ch[c->restored.v[i]];
    if (r->save_hi > g->b &&
        cap__memtree_max(&c->mem, g->b, r->save_hi) +
                (int64_t)c->p->tensors[c->gaps[r->gap].tensor].bytes >
            target)
      rc = CAP_ENOENT;
  }
  if (rc == 0 && (!have_swap || cost <= ev.stall_ns)) {
    *o = (opt_t){*g, true, false, ev, cost, extra, g->a + 1, g->b};
    return 0;
  }
  if (have_swap)
    *o = (opt_t){*g, true, true, ev, ev.stall_ns, 0, ev.save_lo, ev.save_hi};
  return 0;
}

/* Ranking key: MSPS, weighted by the share of the over-target region the
 * freed range covers. Bytes freed outside that region buy nothing now; a
 * tensor idle across the whole region relieves every op in it (what DTR's
 * staleness term approximates). */
static double rank_key(const cap__ctx_t *c, const opt_t *o, uint64_t bytes,
                       int64_t target) {
  double msps = cap__msps(bytes, o->cost);
  if (!c->weigh_cover)
    return msps;
  uint32_t f = cap__memtree_first_above(&c->mem, target);
  uint32_t l = cap__memtree_last_above(&c->mem, target);
  if (f == CAP_NONE)
    return 0;
  uint32_t lo = o->lo > f ? o->lo : f, hi = o->hi < l + 1 ? o->hi : l + 1;
  if (hi <= lo)
    return 0;
  return msps * (double)(hi - lo) / (double)(l + 1 - f);
}

static int phase_rank(cap__ctx_t *c, int64_t target) {
  heap_t h = {0};
  int rc = 0;
  const cap_profile_t *p = c->p;
  /* Lazy greedy: each gap enters with the key it had when last evaluated
   * (costs only grow as choices accumulate, so that is an upper bound; a
   * gap never evaluated enters first) and is evaluated again only when it
   * reaches the top. */
  for (uint32_t gi = 0; gi < c->n_gaps; gi++) {
    const cap__gap_t *g = &c->gaps[gi];
    if (c->gap_key[gi] <= 0 || !gap_free(c, g) ||
        cap__memtree_max(&c->mem, g->a + 1, g->b) <= target)
      continue;
    rc = heap_push(&h, c->gap_key[gi], gi);
    if (rc)
      goto out_free;
  }
  while (h.n && cap__memtree_max_all(&c->mem) > target) {
    heap_ent_t e = heap_pop(&h);
    const cap__gap_t *g = &c->gaps[e.gi];
    if (cap__memtree_max(&c->mem, g->a + 1, g->b) <= target)
      continue;
    opt_t o;
    rc = eval_gap(c, e.gi, target, &o);
    if (rc)
      goto out_free;
    if (!o.ok)
      continue; /* not now; may be later (another target, other choices) */
    if (cap__memtree_max(&c->mem, o.lo, o.hi) <= target)
      continue;
    double key = rank_key(c, &o, p->tensors[g->tensor].bytes, target);
    c->gap_key[e.gi] = key;
    if (key < e.key * (1 - 1e-9) && h.n && key < h.v[0].key) {
      /* its cost grew since it was ranked: rank it again */
      rc = heap_push(&h, key, e.gi);
      if (rc)
        goto out_free;
      continue;
    }
    rc = o.swap ? take_swap(c, e.gi, &o.g, &o.ev)
                : take_recompute(c, e.gi, &o.g, o.cost, o.extra);
    if (rc)
      goto out_free;
  }
out_free:
  free(h.v);
  return rc;
}

/* --- pruning ---------------------------------------------------------------
 * The greedy takes choices against the over-budget region as it was when
 * each was taken, and later rounds aim under the budget: some of the costly
 * ones end up unnecessary. Undo them, costliest first, wherever the
 * estimate stays within `target` without them. Undoing an eviction only
 * keeps a tensor on the device longer, so every other action stays valid
 * (a list that expected it dropped finds it resident). */
typedef struct {
  int64_t cost;
  uint32_t ci;
} cost_key_t;

static int cmp_cost(const void *a, const void *b) {
  const cost_key_t *x = a, *y = b;
  if (x->cost != y->cost)
    return x->cost > y->cost ? -1 : 1;
  return x->ci < y->ci ? -1 : x->ci > y->ci;
}

static int prune(cap__ctx_t *c, int64_t target, uint32_t *n_pruned) {
  *n_pruned = 0;
  cost_key_t *keys = malloc(((size_t)c->n_ch + 1) * sizeof *keys);
  if (!keys)
    return CAP_ENOMEM;
  uint32_t n = 0;
  for (uint32_t i = 0; i < c->n_ch; i++)
    if (!c->ch[i].pruned && c->ch[i].cost_ns > 0)
      keys[n++] = (cost_key_t){c->ch[i].cost_ns, i};
  qsort(keys, n, sizeof *keys, cmp_cost);
  for (uint32_t i = 0; i < n; i++) {
    cap__choice_t *ch = &c->ch[keys[i].ci];
    const cap__gap_t *g = &c->gaps[ch->gap];
    int64_t bytes = (int64_t)c->p->tensors[g->tensor].bytes;
    if (ch->save_hi > ch->save_lo &&
        cap__memtree_max(&c->mem, ch->save_lo, ch->save_hi) + bytes > target)
      continue;
    cap__memtree_add(&c->mem, ch->save_lo, ch->save_hi, bytes);
    if (ch->method == CAP_METHOD_RECOMPUTE)
      cap__memtree_add(&c->mem, g->b, g->b + 1, -ch->extra_bytes);
    ch->pruned = true;
    (*n_pruned)++;
  }
  free(keys);
  return 0;
}

/* --- plan ------------------------------------------------------------------ */

static int build_plan(const cap__ctx_t *c, cap_plan_t **out) {
  const cap_profile_t *p = c->p;
  cap_plan_t *plan = cap_plan_create("capuchin", c->plan_budget);
  if (!plan)
    return CAP_ENOMEM;
  int rc = 0;
  for (uint32_t i = 0; i < c->n_ch && !rc; i++) {
    const cap__choice_t *ch = &c->ch[i];
    const cap__gap_t *g = &c->gaps[ch->gap];
    if (ch->pruned)
      continue;
    if (ch->method == CAP_METHOD_SWAP) {
      uint32_t tt = CAP_NONE, ta = 0;
      if (ch->trig_op != CAP_NONE &&
          !cap__trigger_name(p, ch->trig_op, g->tensor, &tt, &ta))
        tt = CAP_NONE, ta = 0;
      rc = cap_plan_add_swap(plan, g->tensor, g->k, tt, ta, 0);
    } else if (ch->release) {
      rc = cap_plan_add_release(plan, g->tensor, g->k);
    } else {
      rc = cap_plan_add_recompute(plan, g->tensor, g->k, c->rc_ops + ch->rc_off,
                                  ch->rc_n);
    }
  }
  /* The choices count on sources that other choices evicted (a list may
   * read a tensor the plan dropped or swapped, as long as it comes back):
   * make the plan say how each comes back. */
  if (!rc)
    rc = cap__plan_make_explicit(plan, p, NULL);
  if (rc) {
    cap_plan_destroy(plan);
    return rc;
  }
  *out = plan;
  return 0;
}


/* One run of the algorithm with one set of choices; the planner runs a
 * few (see below) and keeps the best simulated plan. */
typedef struct variant {
  /* Run phase 1 (hidden swaps in order of free time) before the MSPS
   * ranking, as Capuchin does; false ranks swaps and recomputes together. */
  bool swaps_first;
  /* A swap-out may push swap-outs issued after it back on the D2H engine
   * (it is queued ahead of them) when that keeps them useful. */
  bool push_back;
  /* The first round's target as a fraction of the budget above the
   * persistent bytes: < 1 aims under the budget, leaving room for what the
   * estimate misses. */
  double aim;
  /* Rank by MSPS times the share of the over-budget region the freed range
   * covers, rather than by MSPS alone. */
  bool weigh_cover;
  /* Swap-outs that were pushed back may hold memory up to the current peak,
   * not only up to the target. */
  bool loose_push;
  /* Recompute lists may not fetch sources the plan swapped out (on
   * demand, before the list runs). No variant sets it today. */
  bool no_fetch;
  /* Book copies at each direction's own bandwidth rather than at its share
   * of the duplex bandwidth: optimistic where the other direction is idle. */
  bool full_rate;
  /* Phase 1 tries first the gaps whose replay costs the most per byte
   * (no lineage: first of all), not the largest free time: the copy
   * engines' time then goes where recompute would cost most. */
  bool costly_first;
  /* A replay that brings back dropped tensors whose own lists then never
   * run is ranked by its cost beyond those lists (cap__rc_saved). */
  bool share_lineage;
} variant_t;

static bool better(const cap_plan_t *a, const cap_plan_t *b, uint64_t budget) {
  if (!b)
    return true;
  bool fa = a->predicted_peak_bytes <= budget, fb = b->predicted_peak_bytes <= budget;
  if (fa != fb)
    return fa;
  if (fa)
    return a->predicted_iter_ns < b->predicted_iter_ns;
  return a->predicted_peak_bytes < b->predicted_peak_bytes;
}

/* An eviction the greedy may not choose: tensor evicted after access k. */
typedef struct ban {
  uint32_t tensor, k;
} ban_t;

/* The budget the plans built carry (cap__ctx_t.plan_budget): the job's when
 * an allocation may wait for room in it, 0 when none may. */
static uint64_t plan_budget(const cap_plan_config_t *cfg, bool waits) {
  return waits ? cfg->budget_bytes : 0;
}

static int run_variant(const cap_profile_t *p, const cap_plan_config_t *cfg,
                       bool waits, const variant_t *v, const ban_t *bans,
                       uint32_t n_bans, cap_plan_t **out) {
  cap__ctx_t c;
  int rc = cap__ctx_init(&c, p, cfg);
  if (rc)
    return rc;
  c.plan_budget = plan_budget(cfg, waits);
  /* a dead ranking key keeps a gap out of the ranking, no_hidden out of
   * the hidden swaps */
  for (uint32_t gi = 0; gi < c.n_gaps && n_bans; gi++)
    for (uint32_t j = 0; j < n_bans; j++)
      if (c.gaps[gi].tensor == bans[j].tensor && c.gaps[gi].k == bans[j].k) {
        c.gap_key[gi] = 0;
        c.no_hidden[gi] = 1;
      }
  c.push_back = v->push_back;
  c.weigh_cover = v->weigh_cover;
  c.loose_push = v->loose_push;
  c.no_fetch = v->no_fetch;
  c.share_lineage = v->share_lineage;
  if (v->full_rate) {
    c.d2h_gbps = cfg->bw.d2h_gbps;
    c.h2d_gbps = cfg->bw.h2d_gbps;
  }
  cap_plan_t *best = NULL, *plan = NULL;
  ft_key_t *order = malloc(((size_t)c.n_gaps + 1) * sizeof *order);
  if (!order) {
    rc = CAP_ENOMEM;
    goto out_close;
  }
  uint32_t n_order = 0;
  for (uint32_t gi = 0; gi < c.n_gaps; gi++) {
    int64_t ft = cap__ft_standalone(&c, &c.gaps[gi]);
    double rank = 0;
    if (v->costly_first && ft > 0) {
      int64_t cost, extra;
      rc = cap__rc_build(&c, &c.gaps[gi], &cost, &extra);
      if (rc == CAP_ENOMEM)
        goto out_free;
      uint64_t bytes = c.p->tensors[c.gaps[gi].tensor].bytes;
      rank = rc ? HUGE_VAL : (double)cost / (double)(bytes + 1);
      rc = 0;
    }
    order[n_order++] = (ft_key_t){rank, ft, gi};
  }
  qsort(order, n_order, sizeof *order, cmp_ft);

  int64_t budget = cfg->budget_bytes > (uint64_t)INT64_MAX
                       ? INT64_MAX
                       : (int64_t)cfg->budget_bytes;
  int64_t floor_mem = (int64_t)p->persistent_bytes;
  int64_t target = budget;
  if (v->aim < 1.0)
    target = floor_mem + (int64_t)((double)(budget - floor_mem) * v->aim);
  for (int round = 0; round < MAX_ROUNDS; round++) {
    uint32_t before = c.n_ch;
    c.target = target;
    /* each pass can unblock choices the previous one refused (a copy that
     * may now be pushed back, a region now lower): repeat while it helps */
    for (int pass = 0; pass < 4 && cap__memtree_max_all(&c.mem) > target;
         pass++) {
      uint32_t n0 = c.n_ch;
      rc = take_releases(&c, target);
      if (rc)
        goto out_free;
      if (v->swaps_first) {
        rc = phase_swaps(&c, order, n_order, target);
        if (rc)
          goto out_free;
      }
      if (cap__memtree_max_all(&c.mem) > target) {
        rc = phase_rank(&c, target);
        if (rc)
          goto out_free;
      }
      if (c.n_ch == n0)
        break;
    }
    if (round > 0 && c.n_ch == before)
      break; /* nothing more to evict: the smallest peak is reached */
    rc = build_plan(&c, &plan);
    if (rc)
      goto out_free;
    rc = cap__plan_predict(plan, p, &cfg->bw);
    if (rc)
      goto out_free;
    if (better(plan, best, cfg->budget_bytes)) {
      cap_plan_destroy(best);
      best = plan;
    } else {
      cap_plan_destroy(plan);
    }
    plan = NULL;
    if (best->predicted_peak_bytes <= cfg->budget_bytes)
      break;
    /* The simulator saw more than the estimate: aim lower by the
     * difference. */
    int64_t over = (int64_t)best->predicted_peak_bytes - budget;
    int64_t est = cap__memtree_max_all(&c.mem);
    int64_t next = (est < target ? est : target) - over;
    if (next >= target)
      next = target - 1;
    target = next;
  }
  if (best && best->predicted_peak_bytes <= cfg->budget_bytes) {
    uint32_t n_pruned;
    rc = prune(&c, target < budget ? target : budget, &n_pruned);
    if (rc)
      goto out_free;
    if (n_pruned) {
      rc = build_plan(&c, &plan);
      if (rc)
        goto out_free;
      rc = cap__plan_predict(plan, p, &cfg->bw);
      if (rc)
        goto out_free;
      if (better(plan, best, cfg->budget_bytes)) {
        cap_plan_destroy(best);
        best = plan;
      } else {
        cap_plan_destroy(plan);
      }
      plan = NULL;
    }
  }
  if (!best) {
    rc = build_plan(&c, &best);
    if (rc)
      goto out_free;
    rc = cap__plan_predict(best, p, &cfg->bw);
    if (rc)
      goto out_free;
  }
  *out = best;
  best = NULL;

out_free:
  cap_plan_destroy(plan);
  cap_plan_destroy(best);
  free(order);
out_close:
  cap__ctx_close(&c);
  return rc;
}

/* The paper's greedy is one order of choices among several reasonable ones,
 * and which works best depends on the model and the budget (a
 * copy-engine-bound CNN at 30 % wants recompute early, a transformer at 80 %
 * wants hidden swaps only). Each run costs a few simulations, so the
 * planner runs a small fixed portfolio and keeps the plan the simulator
 * rates best: feasible first, then the shortest iteration. A field left
 * out of an entry is false. */
static const variant_t variants[] = {
    /* Capuchin: hidden swaps by FT, then MSPS */
    {.swaps_first = true, .push_back = true, .aim = 1.0, .weigh_cover = false,
     .loose_push = true},
    /* copies at full rate: in the forward pass no prefetch shares the
     * duplex bandwidth, and the shared rate leaves a fifth of the D2H
     * engine unbooked (the simulator checks what the optimism costs);
     * MSPS weighted by coverage */
    {.swaps_first = true, .push_back = true, .aim = 1.0, .weigh_cover = true,
     .loose_push = true, .full_rate = true},
    /* ... plain MSPS, a replay ranked by its cost beyond the lists of the
     * dropped tensors it brings back as well (cap__rc_saved) */
    {.swaps_first = true, .push_back = true, .aim = 1.0, .weigh_cover = false,
     .loose_push = true, .full_rate = true, .share_lineage = true},
    /* the copy engines' time to the tensors costliest to replay per byte
     * (a transformer's matrix products) rather than to the longest gaps */
    {.swaps_first = true, .push_back = true, .aim = 1.0, .weigh_cover = true,
     .loose_push = true, .full_rate = true, .costly_first = true},
    /* one ranking for swaps and recomputes */
    {.swaps_first = false, .push_back = true, .aim = 1.0, .weigh_cover = true,
     .loose_push = true},
    /* one ranking, plain MSPS, push back within the target */
    {.swaps_first = false, .push_back = true, .aim = 1.0, .weigh_cover = false,
     .loose_push = false},
    /* aim a little under the budget */
    {.swaps_first = true, .push_back = true, .aim = 0.97, .weigh_cover = true,
     .loose_push = true},
    /* one ranking, under the budget, no push back, plain MSPS */
    {.swaps_first = false, .push_back = false, .aim = 0.97, .weigh_cover = false,
     .loose_push = true},
};


/* The greedy books a swap's memory as freed once its copy out ends; when
 * that is after the ops that need the room (the op after the
 * evicted-access is shorter than the copy), no choice is left to cover
 * them and the plan misses the budget. A swap whose next op may not start
 * before its copy ends (CAP_ACTION_SYNC_OUT: a stall, an exposed swap)
 * frees the memory in time. Try that on the late swap-outs first, then on
 * the others, keeping each one that lowers the simulated peak, until the plan fits. */
#define RESCUE_MAX_TRIES 64u

static int rescue_late_swap_outs(const cap_profile_t *p,
                                 const cap_plan_config_t *cfg,
                                 cap_plan_t *plan) {
  uint32_t tries = 0;
  for (uint32_t pass = 0; pass < 2; pass++) {
    for (uint32_t i = 0; i < plan->n_actions && tries < RESCUE_MAX_TRIES &&
                         plan->predicted_peak_bytes > cfg->budget_bytes;
         i++) {
      cap_action_t *a = &plan->actions[i];
      if (a->method != CAP_METHOD_SWAP || (a->flags & CAP_ACTION_SYNC_OUT))
        continue;
      uint64_t bytes = p->tensors[a->tensor].bytes;
      uint32_t op = cap_profile_access_op(p, a->tensor, a->evict_after_access);
      /* late: the copy outlasts the op after the evicted-access; pass 0
       * takes those, pass 1 any swap */
      int64_t out_end = p->ops[op].end_ns + cap_copy_ns(bytes, cfg->bw.d2h_gbps);
      bool late = op + 2 >= p->n_ops || out_end > p->ops[op + 2].start_ns;
      if (pass == 0 && !late)
        continue;
      tries++;
      uint64_t peak = plan->predicted_peak_bytes;
      int64_t iter = plan->predicted_iter_ns;
      a->flags |= CAP_ACTION_SYNC_OUT;
      int rc = cap__plan_predict(plan, p, &cfg->bw);
      if (rc)
        return rc;
      if (plan->predicted_peak_bytes >= peak) { /* no help: undo */
        a->flags &= ~CAP_ACTION_SYNC_OUT;
        plan->predicted_peak_bytes = peak;
        plan->predicted_iter_ns = iter;
      }
    }
  }
  return 0;
}

/* Portfolio plans after the best that are searched: every fitting one on
 * profiles under CAP__SMALL_OPS (the search's end point depends more on
 * where it starts than the portfolio's ranking says: resnet50 at 50 % went
 * from 5.88 % to 5.38 % when all were searched), the next two on longer
 * ones, for their planning time. */
#define RUNNERS_UP 8u /* at least the portfolio's variants but the best */
#define RUNNERS_UP_LONG 2u

/* The portfolio at one configuration: *out is the best plan found, fitting
 * or not, runners[] the next best that fit, best first, NULL where none
 * (0, or an error with all NULL). */
static int plan_portfolio(const cap_profile_t *p, const cap_plan_config_t *cfg,
                          bool waits, cap_plan_t **out,
                          cap_plan_t *runners[RUNNERS_UP],
                          size_t *best_variant) {
  *out = NULL;
  for (uint32_t r = 0; r < RUNNERS_UP; r++)
    runners[r] = NULL;
  *best_variant = 0;
  /* Below the floor no variant can succeed: one run finds the smallest
   * peak it can reach. */
  size_t n_variants = sizeof variants / sizeof variants[0];
  /* Each run is linear-ish in the profile; very long profiles get fewer
   * runs so that planning stays within seconds (at least the first two,
   * the paper's order and the full-rate, coverage-weighted form). */
  if (p->n_ops > PORTFOLIO_FULL_OPS) {
    size_t k = (size_t)((uint64_t)n_variants * PORTFOLIO_FULL_OPS / p->n_ops);
    n_variants = k < 2 ? 2 : k;
  }
  if (cap_plan_min_budget(p, cfg) > cfg->budget_bytes)
    n_variants = 1;
  uint32_t n_runners = p->n_ops < CAP__SMALL_OPS ? RUNNERS_UP : RUNNERS_UP_LONG;
  cap_plan_t *best = NULL;
  /* the unmanaged iteration: no plan runs faster */
  cap_sim_result_t base;
  memset(&base, 0, sizeof base);
  int rc = cap_sim_run(p, NULL, &cfg->bw, &base);
  if (rc)
    return rc;
  int64_t free_iter = base.iter_ns;
  cap_sim_result_close(&base);
  for (size_t i = 0; i < n_variants; i++) {
    cap_plan_t *plan = NULL;
    rc = run_variant(p, cfg, waits, &variants[i], NULL, 0, &plan);
    if (rc)
      break;
    if (better(plan, best, cfg->budget_bytes)) {
      cap_plan_t *t = best;
      best = plan;
      plan = t;
      *best_variant = i;
    }
    /* the displaced plan (or this one) into the runners, best first */
    for (uint32_t r = 0; plan && r < n_runners; r++)
      if (better(plan, runners[r], cfg->budget_bytes)) {
        cap_plan_t *t = runners[r];
        runners[r] = plan;
        plan = t;
      }
    cap_plan_destroy(plan);
    /* a fitting plan that costs nothing cannot be beaten */
    if (best->predicted_peak_bytes <= cfg->budget_bytes &&
        best->predicted_iter_ns <= free_iter)
      break;
  }
  if (!rc && best->predicted_peak_bytes > cfg->budget_bytes)
    rc = rescue_late_swap_outs(p, cfg, best);

  for (uint32_t r = 0; r < RUNNERS_UP; r++)
    if (rc || (runners[r] &&
               runners[r]->predicted_peak_bytes > cfg->budget_bytes)) {
      cap_plan_destroy(runners[r]);
      runners[r] = NULL;
    }
  if (rc) {
    cap_plan_destroy(best);
    return rc;
  }
  *out = best;
  return 0;
}

/* Keep the better of *best and alt (feasible first, then the shorter
 * iteration); the other is destroyed. */
static void keep_better(cap_plan_t **best, cap_plan_t *alt, uint64_t budget) {
  if (better(alt, *best, budget)) {
    cap_plan_destroy(*best);
    *best = alt;
  } else {
    cap_plan_destroy(alt);
  }
}

/* The greedy commits to its cheapest-looking replay one at a time; a costly
 * one it took early can crowd out a cheaper set it never saw. Run the
 * winning variant again with the best plan's costliest replays banned, one
 * at a time (a ban that wins stays for the next), and keep what the
 * simulator finds faster. With search_tries, each plan found so is searched
 * first (search_repeated): the search's end point is what counts, and the
 * greedy's best start is not always the search's (inception_v3 at 30 %:
 * 12.31 % -> 11.80 %, mobilenet_v2 at 30 %: 18.65 % -> 18.14 %). */
#define REPLAN_TRIES 4u

static int search_repeated(cap_plan_t *plan, const cap_profile_t *p,
                           const cap_plan_config_t *cfg, uint32_t tries);

static int replan_without(const cap_profile_t *p, const cap_plan_config_t *cfg,
                          bool waits, const variant_t *v, uint32_t search_tries,
                          cap_plan_t **best) {
  ban_t bans[REPLAN_TRIES], tried[REPLAN_TRIES];
  uint32_t n_bans = 0, n_tries = REPLAN_TRIES;
  /* each try is a whole run of the greedy: fewer on long profiles */
  if (p->n_ops > PORTFOLIO_FULL_OPS)
    n_tries = (uint32_t)((uint64_t)n_tries * PORTFOLIO_FULL_OPS / p->n_ops);
  int rc = 0;
  for (uint32_t t = 0; t < n_tries && !rc; t++) {
    /* the costliest replay of the current best not banned yet */
    const cap_plan_t *b = *best;
    int64_t top = 0;
    ban_t pick = {CAP_NONE, 0};
    for (uint32_t i = 0; i < b->n_actions; i++) {
      const cap_action_t *a = &b->actions[i];
      int64_t cost = cap__replay_ns(b, p, a);
      bool banned = false;
      for (uint32_t j = 0; j < t; j++)
        banned |= tried[j].tensor == a->tensor &&
                  tried[j].k == a->evict_after_access;
      if (!banned && cost > top) {
        top = cost;
        pick = (ban_t){a->tensor, a->evict_after_access};
      }
    }
    if (pick.tensor == CAP_NONE)
      break;
    tried[t] = bans[n_bans++] = pick;
    cap_plan_t *alt = NULL;
    rc = run_variant(p, cfg, waits, v, bans, n_bans, &alt);
    if (!rc && search_tries)
      rc = search_repeated(alt, p, cfg, search_tries);
    if (rc) {
      cap_plan_destroy(alt);
      break;
    }
    if (better(alt, *best, cfg->budget_bytes)) {
      cap_plan_destroy(*best);
      *best = alt;
    } else {
      cap_plan_destroy(alt);
      n_bans--; /* that ban did not help: lift it */
    }
  }
  return rc;
}

/* The local search with `tries`, then (on profiles under CAP__SMALL_OPS)
 * again with half as many each time while a pass finds something: a kept
 * change opens others (a merged replay, an exchanged swap move the copies
 * and the memory the next moves see). */
static int search_repeated(cap_plan_t *plan, const cap_profile_t *p,
                           const cap_plan_config_t *cfg, uint32_t tries) {
  int rc = 0;
  for (uint32_t t = tries; !rc && t > 0; t /= 2) {
    int64_t before = plan->predicted_iter_ns;
    rc = cap__plan_improve(plan, p, cfg, t);
    if (plan->predicted_iter_ns >= before || t / 2 < SEARCH_MIN_TRIES ||
        p->n_ops >= CAP__SMALL_OPS)
      break;
  }
  return rc;
}

/* Simulations the late-swap substitution may run: fewer on long
 * profiles, as for the search's tries. */
static uint32_t subst_sims(const cap_profile_t *p) {
  if (p->n_ops <= PORTFOLIO_FULL_OPS)
    return SUBST_SIMS;
  uint32_t n = (uint32_t)((uint64_t)SUBST_SIMS * PORTFOLIO_FULL_OPS / p->n_ops);
  return n ? n : 1;
}

/* Replays a trade pass tries: fewer on long profiles, as for the
 * search's tries. */
static uint32_t trade_tries(const cap_profile_t *p) {
  if (p->n_ops < CAP__SMALL_OPS)
    return TRADE_TRIES;
  uint32_t n = (uint32_t)((uint64_t)TRADE_TRIES * CAP__SMALL_OPS / p->n_ops);
  return n ? n : 1;
}

/* Passes of a move (exchange_many.c, trade.c) on plan, at most n_passes:
 * each that keeps a change is followed by the search, on what it moved,
 * and by another pass. */
static int move_passes(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg,
                       int (*move)(cap_plan_t *, const cap_profile_t *,
                                   const cap_plan_config_t *, uint32_t),
                       uint32_t tries, uint32_t n_passes) {
  int rc = 0;
  for (uint32_t pass = 0; !rc && pass < n_passes; pass++) {
    int64_t before = plan->predicted_iter_ns;
    rc = move(plan, p, cfg, tries);
    if (rc || plan->predicted_iter_ns >= before)
      break;
    rc = cap__plan_improve(plan, p, cfg, IMPROVE_TRIES);
  }
  return rc;
}

/* The trade passes of `move` (trade.c) on plan, trade_n tries each, then
 * the room the plan leaves under the budget (improve.c), room_tries tries. */
static int trade_then_room(cap_plan_t *plan, const cap_profile_t *p,
                           const cap_plan_config_t *cfg,
                           int (*move)(cap_plan_t *, const cap_profile_t *,
                                       const cap_plan_config_t *, uint32_t),
                           uint32_t trade_n, uint32_t room_tries) {
  int rc = move_passes(plan, p, cfg, move, trade_n, TRADE_PASSES);
  return rc ? rc : cap__plan_use_room(plan, p, cfg, room_tries);
}

/* trade_then_room on copy (taken over; NULL: out of memory), and the
 * faster of it and *best in *best. */
static int trade_copy(cap_plan_t **best, cap_plan_t *copy,
                      const cap_profile_t *p, const cap_plan_config_t *cfg,
                      int (*move)(cap_plan_t *, const cap_profile_t *,
                                  const cap_plan_config_t *, uint32_t),
                      uint32_t trade_n, uint32_t room_tries) {
  if (!copy)
    return CAP_ENOMEM;
  int rc = trade_then_room(copy, p, cfg, move, trade_n, room_tries);
  if (rc) {
    cap_plan_destroy(copy);
    return rc;
  }
  keep_better(best, copy, cfg->budget_bytes);
  return 0;
}

/* The last moves: costly replays traded for cheap drops of what stays on
 * the device (trade.c), the same way as the exchange; on long profiles
 * too, with fewer tries (cheap where it finds nothing: bert_large at 50 %
 * keeps its planning time). Then the room the plan leaves under the
 * budget (improve.c): every move before keeps only changes no higher at
 * the peak than the plan they change (using the room earlier takes them
 * down other paths, some slower); half the tries on long profiles, none
 * over PORTFOLIO_FULL_OPS (each try simulates: 0.7 s more on 100 000
 * ops). On short profiles the same again on a copy, the trade also using
 * the room, and the faster plan wins: each way wins on some plans
 * (bert_base at 50 % 2.09 against 1.85 % with the room, resnet50 at 30 %
 * 13.21 against 13.41 without). With `near`, short profiles only, the
 * trades keep pairs of replays too, and once more on a copy of the winner
 * the near trade (cap__trade_replays_near) makes trades the estimate would
 * not, the simulator judging; the faster plan wins. On short profiles, the
 * trade using the room once more on a copy of the plan as it came, with
 * TRADE_DEEP times the tries: a pass that tries more replays keeps other
 * trades first and ends elsewhere, faster on some plans and slower on
 * others (mobilenet_v2 at 30 % 16.97 -> 15.58 %, inception_v3 at 60 % 3.19
 * -> 3.33 % when it replaced the other passes), so it is one more way, and
 * the faster plan wins (bench_bound: 26 of the 75 plans faster, 3 slower,
 * the later moves taking another path). */
static int trade_and_room(cap_plan_t **best, const cap_profile_t *p,
                          const cap_plan_config_t *cfg, uint32_t tries,
                          bool near) {
  if (p->n_ops > PORTFOLIO_FULL_OPS)
    return 0;
  if (p->n_ops >= CAP__SMALL_OPS)
    return trade_then_room(*best, p, cfg, cap__trade_replays, trade_tries(p),
                           tries / 2);
  uint32_t n = trade_tries(p);
  int (*room)(cap_plan_t *, const cap_profile_t *, const cap_plan_config_t *,
              uint32_t) =
      near ? cap__trade_replays_room_pairs : cap__trade_replays_room;
  cap_plan_t *alt = cap_plan_clone(*best);
  cap_plan_t *deep = cap_plan_clone(*best);
  int rc = alt && deep ? 0 : CAP_ENOMEM;
  if (!rc)
    rc = trade_then_room(*best, p, cfg,
                         near ? cap__trade_replays_pairs : cap__trade_replays,
                         n, tries);
  if (rc) {
    cap_plan_destroy(alt);
    cap_plan_destroy(deep);
    return rc;
  }
  rc = trade_copy(best, alt, p, cfg, room, n, tries);
  if (!rc)
    rc = trade_copy(best, deep, p, cfg, room, n * TRADE_DEEP, tries);
  else
    cap_plan_destroy(deep);
  if (!rc && near)
    rc = trade_copy(best, cap_plan_clone(*best), p, cfg,
                    cap__trade_replays_near, n, tries);
  return rc;
}

/* The moves after the search, on *planp (the best plan or the runner-up;
 * the last move may replace it); the group move only with `group`. */
static int last_moves(cap_plan_t **planp, const cap_profile_t *p,
                      const cap_plan_config_t *cfg, uint32_t tries,
                      bool group) {
  cap_plan_t *plan = *planp;
  /* late swaps for evictions of tensors needed later (substitute.c):
   * cheap, so on every profile (bert_large's optimizer stalls) */
  int rc = cap__substitute_late(plan, p, cfg, subst_sims(p));
  /* the plan may come from a search with few tries for its late
   * prefetches; a kept trigger moves the others' lateness: again while it
   * helps */
  for (uint32_t pass = 0;
       !rc && p->n_ops < CAP__SMALL_OPS && pass < POLISH_PASSES; pass++) {
    int64_t before = plan->predicted_iter_ns;
    rc = cap__polish_triggers(plan, p, cfg, POLISH_SIMS);
    if (plan->predicted_iter_ns >= before)
      break;
    /* the moved prefetches change what the search's moves see */
    if (!rc)
      rc = search_repeated(plan, p, cfg, tries / 4);
  }
  /* replays and swaps exchanged one or several for one (exchange_many.c),
   * last: every pass before keeps its path (a plan made faster earlier
   * may end slower); each change is kept only when faster, and each pass
   * that keeps one is followed by the search, on what it moved, and by
   * another pass */
  if (!rc && p->n_ops < CAP__SMALL_OPS)
    rc = move_passes(plan, p, cfg, cap__exchange_many, MANY_TRIES, MANY_PASSES);
  /* multi-output ops replayed whole (group.c), last: the passes above,
   * run on its plan instead, can end slower. Short profiles only. */
  if (!rc && group && p->n_ops < CAP__SMALL_OPS)
    rc = cap__group_replays(plan, p, cfg, GROUP_OPS, tries / 4);
  if (!rc)
    rc = trade_and_room(planp, p, cfg, tries, false);
  /* the room pass takes back the costliest replays it can: what is left
   * to exchange, to start earlier and to trade differs. A second round of
   * those, on short profiles (bench_bound: 18 of 84 plans faster, none
   * slower, for 20-28 % more planning time; two more rounds: 5 more,
   * 0.01-2 % faster, for 10 % more), its trade with pairs and the near
   * trade (bench_bound: 9 more plans faster, none slower; in the first
   * round as well, some slower).
   * trade_and_room may have replaced the plan: *planp, not plan, from
   * here. */
  if (!rc && p->n_ops < CAP__SMALL_OPS) {
    /* a plan that still waits long for its copies (near the floor):
     * swaps replayed to shorten the queues (exchange_many.c; bench_bound:
     * bert_base at 30 % EP 22.3 -> 14.8 %, 9 plans faster, none slower;
     * in the first round too, 3 plans slower) */
    rc = move_passes(*planp, p, cfg, cap__replay_queued_swaps, QUEUED_TRIES,
                     QUEUED_PASSES);
    if (!rc)
      rc = move_passes(*planp, p, cfg, cap__exchange_many, MANY_TRIES,
                       MANY_PASSES);
    if (!rc)
      rc = cap__polish_triggers(*planp, p, cfg, POLISH_SIMS);
    if (!rc)
      rc = trade_and_room(planp, p, cfg, tries, true);
  }
  return rc;
}

/* The whole planner at one configuration: the portfolio, Belady's plan
 * where the portfolio finds none above the floor, the local search on the
 * best plan and, with a quarter of the tries each, on the portfolio's next
 * RUNNERS_UP (RUNNERS_UP_LONG on long profiles; the search may take one of
 * them further), each repeated while it finds something, then the winning
 * variant again without the costliest replays, then the last moves on the
 * best plan and on the next. *out is the best plan,
 * fitting or not (0, or an error with *out NULL). */
static int plan_at(const cap_profile_t *p, const cap_plan_config_t *cfg,
                   bool waits, cap_plan_t **out) {
  cap_plan_t *best = NULL, *alt = NULL, *runners[RUNNERS_UP];
  *out = NULL;
  size_t bv;
  int rc = plan_portfolio(p, cfg, waits, &best, runners, &bv);
  if (rc)
    return rc;
  /* Near the floor the greedy's estimate runs out of choices before the
   * plan fits. Any budget above the floor has a plan that swaps, with the
   * compute stream waiting, whatever is not needed now: take the one that
   * evicts the tensor needed again last (Belady's rule). */
  if (best->predicted_peak_bytes > cfg->budget_bytes &&
      cap_plan_min_budget(p, cfg) <= cfg->budget_bytes) {
    rc = cap__plan_belady(p, cfg, &alt);
    if (!rc) {
      alt->budget_bytes = plan_budget(cfg, waits);
      rc = cap__plan_make_explicit(alt, p, NULL);
    }
    if (!rc)
      rc = cap__plan_predict(alt, p, &cfg->bw);
    if (!rc)
      keep_better(&best, alt, cfg->budget_bytes);
    else
      cap_plan_destroy(alt);
  }
  /* each try simulates the whole plan: fewer on long profiles */
  uint32_t tries = IMPROVE_TRIES;
  if (p->n_ops > PORTFOLIO_FULL_OPS)
    tries = (uint32_t)((uint64_t)tries * PORTFOLIO_FULL_OPS / p->n_ops);
  else if (p->n_ops < CAP__SMALL_OPS)
    tries = (uint32_t)((uint64_t)tries * TRIES_OPS / (p->n_ops + 1));
  if (tries > 4 * IMPROVE_TRIES)
    tries = 4 * IMPROVE_TRIES;
  if (!rc)
    rc = search_repeated(best, p, cfg, tries);
  /* the search of a runner-up is the dearest part of planning bert_large */
  uint32_t n_runners = p->n_ops < CAP__SMALL_OPS ? RUNNERS_UP : RUNNERS_UP_LONG;
  cap_plan_t *second = NULL; /* the best searched plan after best */
  for (uint32_t r = 0; r < RUNNERS_UP; r++) {
    if (!rc && runners[r] && r < n_runners) {
      rc = search_repeated(runners[r], p, cfg, tries / 4);
      if (!rc) {
        cap_plan_t *loser = runners[r];
        if (better(loser, best, cfg->budget_bytes)) {
          loser = best;
          best = runners[r];
        }
        keep_better(&second, loser, cfg->budget_bytes);
        runners[r] = NULL;
      }
    }
    cap_plan_destroy(runners[r]);
  }
  if (!rc && best->predicted_peak_bytes <= cfg->budget_bytes) {
    int64_t before = best->predicted_iter_ns;
    rc = replan_without(p, cfg, waits, &variants[bv],
                        p->n_ops < CAP__SMALL_OPS ? tries / 4 : 0, &best);
    /* a plan found again has not been searched yet */
    if (!rc && best->predicted_iter_ns < before)
      rc = search_repeated(best, p, cfg, tries / 2);
  }
  if (!rc)
    rc = last_moves(&best, p, cfg, tries, true);
  /* The last moves are local searches: where they end depends on where
   * they start, and the runner-up often ends faster than the best
   * (inception_v3 at 30 %: 11.06 % -> 10.70 %, mobilenet_v2 at 50 %: 8.08 %
   * -> 7.79 %). Only the runner-up, for planning time; short profiles only,
   * where the moves run; without the group move, which changed none of the
   * 84 plans of bench_bound there and costs a sixth of resnet50's planning
   * at 50 %. */
  if (!rc && second && p->n_ops < CAP__SMALL_OPS &&
      second->predicted_peak_bytes <= cfg->budget_bytes) {
    rc = last_moves(&second, p, cfg, tries, false);
    if (!rc) {
      keep_better(&best, second, cfg->budget_bytes);
      second = NULL;
    }
  }
  cap_plan_destroy(second);
  if (rc) {
    cap_plan_destroy(best);
    return rc;
  }
  *out = best;
  return 0;
}

/* The planner in one mode (waits: plans that may let an allocation wait
 * for room, plan_budget in capuchin_internal.h), with and without
 * persistent eviction: *out is the best plan, fitting or not. */
static int plan_modes(const cap_profile_t *p, const cap_plan_config_t *cfg,
                      bool waits, cap_plan_t **out) {
  cap_plan_t *best = NULL, *alt = NULL;
  *out = NULL;
  int rc = plan_at(p, cfg, waits, &best);
  /* Allowing persistent tensors to leave can never force a worse plan, but
   * the greedy, offered them, may take a worse path: plan exactly as
   * without them too and keep the better. */
  cap_plan_config_t pinned = *cfg;
  pinned.evict_persistent = false;
  if (!rc && cfg->evict_persistent &&
      cap_plan_min_budget(p, &pinned) <= cfg->budget_bytes) {
    rc = plan_at(p, &pinned, waits, &alt);
    if (!rc)
      keep_better(&best, alt, cfg->budget_bytes);
    /* the pinned plan may win: its late swaps may now become evictions of
     * persistent tensors needed later (a layer's weight for its gradient) */
    if (!rc)
      rc = cap__substitute_late(best, p, cfg, subst_sims(p));
    if (!rc && p->n_ops < CAP__SMALL_OPS)
      rc = cap__polish_triggers(best, p, cfg, POLISH_SIMS);
  }
  if (rc) {
    cap_plan_destroy(best);
    return rc;
  }
  *out = best;
  return 0;
}

/* The plan predicted with its budget: an allocation may wait for room.
 * *stall_ns (when not NULL): how long its compute stream stalls. */
static int predict_at_budget(cap_plan_t *plan, const cap_profile_t *p,
                             const cap_plan_config_t *cfg, int64_t *stall_ns) {
  plan->budget_bytes = cfg->budget_bytes;
  cap_sim_result_t r;
  int rc = cap__plan_predict_result(plan, p, &cfg->bw, &r);
  if (rc)
    return rc;
  if (stall_ns)
    *stall_ns = r.stall_ns;
  cap_sim_result_close(&r);
  return 0;
}

int cap__plan_capuchin(const cap_profile_t *p, const cap_plan_config_t *cfg,
                       cap_plan_t **out) {
  if (!p || !cfg || !out || !p->finished)
    return CAP_EINVAL;
  *out = NULL;
  cap_plan_t *best = NULL, *alt = NULL;
  /* First plans that never make an allocation wait for room (sim.h): a
   * plan that fits so is predicted the same either way, and the search,
   * offered waits from the start, ends on slower plans (bench_bound: 35 of
   * the 75 feasible plans slower, inception_v3 at 50 % 5.63 -> 6.26 %, 13
   * faster). Then, where that plan stalls the compute stream anyway or
   * does not fit (near the floor, but above it: below, nothing fits),
   * plans that may wait, and the faster wins (10 plans faster, none slower:
   * bert_base at 30 % with persistent eviction 14.8 -> 11.7 %, mobilenet_v2 at
   * its floor + 5 % 142.7 -> 71.7 %). A stall under a thousandth of the
   * iteration is not worth it (mobilenet_v2 at 60 %: 4 us), and neither are
   * long profiles: on bert_large the second planner would double its planning
   * time, and changed none of its plans. */
  int64_t stall = 0;
  int rc = plan_modes(p, cfg, false, &best);
  if (!rc)
    rc = predict_at_budget(best, p, cfg, &stall);
  if (!rc && p->n_ops < CAP__SMALL_OPS &&
      cap_plan_min_budget(p, cfg) <= cfg->budget_bytes &&
      ((stall > 0 && stall >= best->predicted_iter_ns / STALL_REPLAN_DIV) ||
       best->predicted_peak_bytes > cfg->budget_bytes)) {
    rc = plan_modes(p, cfg, true, &alt);
    if (!rc)
      rc = predict_at_budget(alt, p, cfg, NULL);
    if (!rc)
      keep_better(&best, alt, cfg->budget_bytes);
    else
      cap_plan_destroy(alt);
  }
  if (rc) {
    cap_plan_destroy(best);
    return rc;
  }
  *out = best;
  return best->predicted_peak_bytes <= cfg->budget_bytes ? 0 : CAP_EINFEASIBLE;
}
