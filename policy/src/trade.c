/*
 * A costly replay traded for cheap drops of tensors the plan leaves on the
 * device.
 *
 * The greedy weighs each eviction alone and the local search changes one
 * action at a time. On the transformers the greedy drops both the input of
 * a GELU (an addmm output, 0.4 ms to replay) and its output, while the last
 * layer's GELU output (35 us to replay from its input) stays on the device
 * across the memory peak: bert_base at 50 %. No single change helps:
 * keeping the addmm output raises the peak, dropping the other GELU output
 * only adds a replay.
 *
 * So, for the costliest replays Y: keeping Y's tensor on the device (every
 * other list that replays part of Y's list rebuilt from its lineage, what
 * is off the device added back by cap__plan_make_explicit) is simulated,
 * and what that saves ranks them. Then, the largest saving first, the ops
 * where Y's bytes would take the plan over its peak are found (each op's
 * device bytes from the simulator's residencies, up to where another list
 * brings Y's tensor back), and gaps the plan leaves on the device across
 * them, cheapest to replay per byte first, with their sources on the device
 * when they would replay, are dropped instead, while their replays cost
 * less than what Y saves: first gaps that span all those ops until their
 * bytes cover Y's, else gaps that relieve each op by its excess; a few such
 * sets are tried. A change is kept when the simulator finds it faster, no
 * higher at its peak, and valid.
 *
 * Two more kinds of trade, on short profiles, in the planner's second
 * round of its last moves (capuchin.c):
 * - Pairs of the costliest replays kept on the device together, for drops
 *   that cost less than both (trade_pairs): on inception_v3 at 80 %, one
 *   concatenation of 86 MiB dropped (67 us) makes room for two of 54 MiB
 *   (42 us each), which none of them alone pays for.
 * - The near trade (cap__trade_replays_near), on a copy of the plan, the
 *   faster plan winning. The estimate of each op's bytes cannot see the
 *   copy queues move: a drop in place of a swap frees the D2H queue, and
 *   later swaps finish sooner. Its drops may leave a quarter of the kept
 *   bytes uncovered, the simulator judging, and each takes along the swaps
 *   of its op's other outputs (ride_along): on inception_v3 at 60 %,
 *   max_pool2d's output dropped with its swapped indices, one replay
 *   restoring both, frees 83 MiB of the D2H queue, and five later swaps
 *   (96 MiB) finish before the memory peak instead of after it: the first
 *   convolution's 338 MiB output stays on the device, 3.54 -> 3.19 %.
 * In every trade, in place, each leads some plans down slower paths
 * (bench_bound: the slack 11 plans slower, the ride 4; the pairs resnet50
 * at 40 % 7.8 -> 8.1 %).
 */
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"
#include "planners.h"

#define TRADE_MAX 8u  /* drops traded for one replay */
#define TRADE_LATE_ROUNDS 8u /* simulations per trade, short profiles */
#define TRADE_SETS 3u /* sets of drops tried for one replay */
#define TRADE_KEPT_MAX 2u   /* replays one trade keeps: one, or a pair */
#define TRADE_PAIR_TRIES 8u /* pairs of replays a pass tries, short profiles   \
                             */
/* the near trade's drops may leave 1/TRADE_SLACK_DIV of the bytes uncovered */
#define TRADE_SLACK_DIV 4u

/* How a trade pass works (trade_to). */
enum {
  TRADE_ROOM = 1,  /* changes kept up to the budget, not the plan's peak */
  TRADE_PAIRS = 2, /* pairs of replays too (trade_pairs) */
  TRADE_NEAR = 4   /* slack, drops with their siblings' swaps, pairs */
};

/* Whether two sorted op lists share an op. */
static bool lists_meet(const uint32_t *a, uint32_t na, const uint32_t *b,
                       uint32_t nb) {
  for (uint32_t i = 0, j = 0; i < na && j < nb;) {
    if (a[i] == b[j])
      return true;
    if (a[i] < b[j])
      i++;
    else
      j++;
  }
  return false;
}

/* Every gap of an evictable tensor that plan leaves on the device and that
 * has a lineage (cap__lineage_ns: sources taken as on the device), cheapest
 * to replay per byte first. */
static int resident_gaps(const cap_plan_t *plan, const cap_profile_t *p,
                         const cap_plan_config_t *cfg, cap__lineage_t *lin,
                         cap__item_t **out, uint32_t *n_out) {
  uint32_t n = 0, cap = 0;
  cap__item_t *v = NULL;
  int rc = 0;
  for (uint32_t t = 0; t < p->n_tensors && !rc; t++) {
    const cap_tensor_t *ct = &p->tensors[t];
    if (ct->producer_op == CAP_NONE || !cap__evictable(p, cfg, t))
      continue;
    for (uint32_t k = 1; k < ct->n_accesses && !rc; k++) {
      const cap_action_t gap = {.tensor = t, .evict_after_access = k};
      int64_t ns;
      if (cap_profile_access_op(p, t, k + 1) <
              cap_profile_access_op(p, t, k) + 2 ||
          cap__find_action(plan, t, k) != CAP_NONE)
        continue;
      rc = cap__lineage_ns(lin, p, &gap, &ns);
      if (rc || ns < 0)
        continue;
      if (n == cap) {
        cap = cap ? cap * 2 : 256;
        cap__item_t *nv = realloc(v, (size_t)cap * sizeof *nv);
        if (!nv) {
          rc = CAP_ENOMEM;
          break;
        }
        v = nv;
      }
      v[n++] = (cap__item_t){(double)ns / (double)ct->bytes, ns, t, k};
    }
  }
  if (rc) {
    free(v);
    return rc;
  }
  if (n) /* qsort wants a pointer even for nothing */
    qsort(v, n, sizeof *v, cap__cmp_item);
  *out = v;
  *n_out = n;
  return 0;
}

/* Whether every source of the list in lin (an input no earlier op of it
 * writes) is on the device under plan at op b, where the list runs, or
 * coming back by a prefetch issued before: a drop whose sources the plan has
 * off the device otherwise would replay or fetch them too
 * (cap__plan_make_explicit), at a cost the lineage does not show. */
static bool sources_stay(const cap_plan_t *plan, const cap_profile_t *p,
                         const cap__lineage_t *lin, uint32_t b) {
  for (uint32_t i = 0; i < lin->n_ops; i++) {
    const cap_op_t *o = &p->ops[lin->ops[i]];
    const uint32_t *in = cap_op_inputs(p, o);
    for (uint32_t j = 0; j < o->n_in; j++) {
      bool made = false;
      for (uint32_t q = 0; q < i && !made; q++) {
        const cap_op_t *w = &p->ops[lin->ops[q]];
        const uint32_t *out = cap_op_outputs(p, w);
        for (uint32_t m = 0; m < w->n_out && !made; m++)
          made = out[m] == in[j];
      }
      uint32_t k = cap_profile_accesses_before(p, in[j], b);
      uint32_t ai = made || !k ? CAP_NONE : cap__find_action(plan, in[j], k);
      if (ai == CAP_NONE)
        continue;
      /* a swap whose prefetch is issued before op b is coming back */
      const cap_action_t *a = &plan->actions[ai];
      if (a->method != CAP_METHOD_SWAP || a->prefetch_tensor == CAP_NONE ||
          cap_profile_access_op(p, a->prefetch_tensor, a->prefetch_access) >= b)
        return false;
    }
  }
  return true;
}

/* The swaps of next that evict the other outputs of the op that makes
 * x's tensor, across x's next access, replayed instead: one replay of the
 * op restores them all (max_pool2d's output and indices), and their
 * copies leave the D2H queue, so later swaps finish sooner. */
static int ride_along(cap_plan_t *next, const cap_profile_t *p,
                      cap__lineage_t *lin, const cap__item_t *x) {
  uint32_t op = p->tensors[x->tensor].producer_op;
  if (op == CAP_NONE)
    return 0;
  uint32_t xa = cap_profile_access_op(p, x->tensor, x->k),
           xb = cap_profile_access_op(p, x->tensor, x->k + 1);
  const cap_op_t *o = &p->ops[op];
  const uint32_t *out = cap_op_outputs(p, o);
  int rc = 0;
  for (uint32_t m = 0; m < o->n_out && !rc; m++) {
    const cap_tensor_t *s = &p->tensors[out[m]];
    for (uint32_t k = 1; out[m] != x->tensor && k < s->n_accesses && !rc; k++) {
      if (cap_profile_access_op(p, out[m], k) >= xb ||
          cap_profile_access_op(p, out[m], k + 1) <= xa)
        continue;
      uint32_t ai = cap__find_action(next, out[m], k);
      if (ai == CAP_NONE || next->actions[ai].method != CAP_METHOD_SWAP)
        continue;
      int64_t ns;
      rc = cap__lineage_ns(lin, p, &next->actions[ai], &ns);
      if (!rc && ns >= 0)
        rc = cap__set_replay(next, ai, lin);
    }
  }
  return rc;
}

/* The replays ys[0 .. n_y) of plan kept on the device (n_y at most
 * TRADE_KEPT_MAX), the gaps xs[0 .. nx) dropped, in a copy; kept (plan holds
 * it) when the simulator accepts it. *gain: how much faster the copy ran (0
 * when it cannot run as written). */
static int try_trade(cap_plan_t *plan, const cap_profile_t *p,
                     const cap_plan_config_t *cfg, cap__lineage_t *lin,
                     const cap__item_t *const *ys, uint32_t n_y,
                     const cap__item_t *const *xs, uint32_t nx, uint64_t limit,
                     bool ride, int64_t *gain) {
  *gain = 0;
  cap_plan_t *next = cap_plan_clone(plan);
  if (!next)
    return CAP_ENOMEM;
  /* the actions go, the others keep their order (copies are issued in
   * action order); their list ops stay in the pool, unused */
  uint32_t w = 0;
  for (uint32_t i = 0; i < next->n_actions; i++) {
    const cap_action_t *a = &next->actions[i];
    bool gone = false;
    for (uint32_t q = 0; q < n_y && !gone; q++)
      gone = a->tensor == ys[q]->tensor && a->evict_after_access == ys[q]->k;
    if (!gone)
      next->actions[w++] = *a;
  }
  next->n_actions = w;
  const cap_action_t *y[TRADE_KEPT_MAX]; /* the kept replays, in plan */
  for (uint32_t q = 0; q < n_y; q++)
    y[q] = &plan->actions[cap__find_action(plan, ys[q]->tensor, ys[q]->k)];
  int rc = 0;
  for (uint32_t i = 0; i < next->n_actions && !rc; i++) {
    const cap_action_t *a = &next->actions[i];
    if (a->method != CAP_METHOD_RECOMPUTE || cap_action_is_release(a))
      continue;
    bool meets = false;
    for (uint32_t q = 0; q < n_y && !meets; q++)
      meets =
          lists_meet(cap_action_recompute_ops(next, a), a->n_recompute,
                     cap_action_recompute_ops(plan, y[q]), y[q]->n_recompute);
    if (!meets)
      continue;
    int64_t ns;
    rc = cap__lineage_ns(lin, p, a, &ns);
    if (!rc && ns >= 0)
      rc = cap__set_replay(next, i, lin);
  }
  for (uint32_t i = 0; i < nx && !rc; i++) {
    const cap_action_t gap = {.tensor = xs[i]->tensor,
                              .evict_after_access = xs[i]->k};
    int64_t ns;
    rc = cap__lineage_ns(lin, p, &gap, &ns);
    if (!rc)
      rc = cap_plan_add_recompute(next, xs[i]->tensor, xs[i]->k, lin->ops,
                                  lin->n_ops);
    if (!rc && ride)
      rc = ride_along(next, p, lin, xs[i]);
  }
  /* its new swaps' prefetches (a source a drop needs, on demand) may come
   * late behind others: moved earlier a few times on short profiles */
  int64_t before = plan->predicted_iter_ns, first_ns = before;
  bool kept;
  if (!rc)
    rc = cap__plan_make_explicit(next, p, NULL);
  if (!rc)
    rc = cap__take_with_earlier_prefetches(
        plan, next, p, cfg, limit,
        p->n_ops < CAP__SMALL_OPS ? TRADE_LATE_ROUNDS : 1, &first_ns, &kept);
  *gain = before - first_ns;
  cap_plan_destroy(next);
  return rc == CAP_ENOENT || rc == CAP_EINVAL ? 0 : rc;
}

/* Device bytes while each op runs under plan (its residencies, by the ops
 * they span), into mem[0 .. n_ops); the residencies in *res_out (the old
 * ones freed), *n_out of them. */
static int op_bytes(const cap_plan_t *plan, const cap_profile_t *p,
                    const cap_bandwidth_t *bw, int64_t *mem,
                    cap_residency_t **res_out, uint32_t *n_out) {
  cap_sim_result_t r;
  cap_residency_t *res = NULL;
  uint32_t n_res = 0;
  free(*res_out);
  *res_out = NULL;
  int rc = cap_sim_residency(p, plan, bw, &r, &res, &n_res);
  if (rc)
    return rc;
  memset(mem, 0, ((size_t)p->n_ops + 1) * sizeof *mem);
  /* persistent tensors the plan never evicts have no residency */
  uint8_t *seen = calloc((size_t)p->n_tensors + 1, 1);
  if (!seen) {
    free(res);
    cap_sim_result_close(&r);
    return CAP_ENOMEM;
  }
  for (uint32_t i = 0; i < n_res; i++)
    seen[res[i].tensor] = 1;
  for (uint32_t t = 0; t < p->n_tensors; t++)
    if (!seen[t] && cap_tensor_is_resident(&p->tensors[t]))
      mem[0] += (int64_t)p->tensors[t].bytes;
  mem[p->n_ops] -= mem[0];
  free(seen);
  for (uint32_t i = 0; i < n_res; i++) {
    uint32_t lo = res[i].first_op, hi = res[i].last_op;
    if (lo == CAP_NONE || hi == CAP_NONE || hi < lo || lo >= p->n_ops)
      continue;
    mem[lo] += (int64_t)res[i].bytes;
    mem[(hi < p->n_ops ? hi : p->n_ops - 1) + 1] -= (int64_t)res[i].bytes;
  }
  int64_t top = 0;
  for (uint32_t o = 0; o < p->n_ops; o++) {
    mem[o] += o ? mem[o - 1] : 0;
    top = mem[o] > top ? mem[o] : top;
  }
  /* what the simulator counts beyond the tensors (the profile's resident
   * bytes over its persistent tensors): its peak is the reference */
  for (uint32_t o = 0; top < (int64_t)r.peak_bytes && o < p->n_ops; o++)
    mem[o] += (int64_t)r.peak_bytes - top;
  *res_out = res;
  *n_out = n_res;
  cap_sim_result_close(&r);
  return 0;
}

/* The first op after op a at which tensor t is on the device again under
 * the plan whose residencies are res (b when none before). */
static uint32_t back_on_device(const cap_residency_t *res, uint32_t n_res,
                               uint32_t t, uint32_t a, uint32_t b) {
  for (uint32_t i = 0; i < n_res; i++)
    if (res[i].tensor == t && res[i].first_op > a && res[i].first_op < b)
      b = res[i].first_op;
  return b;
}

/* Whether tensor t is one of ys[0 .. n_y). */
static bool among(const cap__item_t *const *ys, uint32_t n_y, uint32_t t) {
  for (uint32_t q = 0; q < n_y; q++)
    if (ys[q]->tensor == t)
      return true;
  return false;
}

/* Gaps from xs (cheapest to replay per byte first) to drop in place of the
 * replays ys[0 .. n_y) kept on the device: need[o] for o in [h_lo, h_hi]
 * is how far their bytes would take op o over the limit, and each gap
 * taken frees its bytes over the ops it spans, until no op is over; a gap
 * is taken when it spans an op still over (span_all: every op in [h_lo,
 * h_hi]), no action of plan evicts it, its sources stay (sources_stay; any
 * source when any_source), and the replays taken cost less than `gain`,
 * what keeping ys saves. The first gaps of the `set` sets before (skip)
 * are left out. *n picks in pick, 0 when they do not cover. need is used
 * up. */
static int pick_drops(const cap_plan_t *plan, const cap_profile_t *p,
                      cap__lineage_t *lin, const cap__item_t *xs, uint32_t nx,
                      const cap__item_t *const *ys, uint32_t n_y, int64_t gain,
                      int64_t *need, uint32_t h_lo, uint32_t h_hi,
                      bool span_all, bool any_source, int64_t slack,
                      uint32_t *skip, uint32_t set, const cap__item_t **pick,
                      uint32_t *n) {
  int64_t ns = 0;
  bool over = true;
  *n = 0;
  for (uint32_t j = 0; j < nx && over && *n < TRADE_MAX; j++) {
    bool skipped = false;
    for (uint32_t q = 0; q < set; q++)
      skipped |= skip[q] == j;
    uint32_t xa = cap_profile_access_op(p, xs[j].tensor, xs[j].k);
    uint32_t xb = cap_profile_access_op(p, xs[j].tensor, xs[j].k + 1);
    uint32_t lo = xa + 1 > h_lo ? xa + 1 : h_lo,
             hi = xb - 1 < h_hi ? xb - 1 : h_hi;
    bool helps = false;
    for (uint32_t o = lo; o <= hi && lo <= hi && !helps; o++)
      helps = need[o - h_lo] > 0;
    if (skipped || !helps || (span_all && (lo > h_lo || hi < h_hi)) ||
        among(ys, n_y, xs[j].tensor) || ns + xs[j].ns >= gain ||
        cap__find_action(plan, xs[j].tensor, xs[j].k) != CAP_NONE)
      continue;
    const cap_action_t gap = {.tensor = xs[j].tensor,
                              .evict_after_access = xs[j].k};
    int64_t x_ns;
    int rc = cap__lineage_ns(lin, p, &gap, &x_ns);
    if (rc)
      return rc;
    if (x_ns < 0 || (!any_source && !sources_stay(plan, p, lin, xb)))
      continue;
    if (!*n)
      skip[set] = j;
    ns += xs[j].ns;
    pick[(*n)++] = &xs[j];
    for (uint32_t o = lo; o <= hi; o++)
      need[o - h_lo] -= (int64_t)p->tensors[xs[j].tensor].bytes;
    over = false;
    for (uint32_t o = h_lo; o <= h_hi && !over; o++)
      over = need[o - h_lo] > slack;
  }
  if (over)
    *n = 0;
  return 0;
}

/* The costliest replays of plan (at most max_tries) in ys[0 .. *ny), each
 * with what keeping its tensor on the device saves, simulated (a list may
 * replay another's lineage anyway), the largest first. A change that fits
 * as it is stays. */
static int rank_by_gain(cap_plan_t *plan, const cap_profile_t *p,
                        const cap_plan_config_t *cfg, cap__lineage_t *lin,
                        uint32_t max_tries, uint64_t limit, cap__item_t *ys,
                        uint32_t *ny) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->method != CAP_METHOD_RECOMPUTE || cap_action_is_release(a))
      continue;
    int64_t ns = cap__replay_ns(plan, p, a);
    ys[n++] = (cap__item_t){-(double)ns, ns, a->tensor, a->evict_after_access};
  }
  qsort(ys, n, sizeof *ys, cap__cmp_item);
  n = n < max_tries ? n : max_tries;
  int rc = 0;
  for (uint32_t i = 0; i < n && !rc; i++) {
    const cap__item_t *y = &ys[i];
    uint32_t yi = cap__find_action(plan, y->tensor, y->k);
    ys[i].ns = 0;
    if (yi != CAP_NONE && plan->actions[yi].method == CAP_METHOD_RECOMPUTE)
      rc =
          try_trade(plan, p, cfg, lin, &y, 1, NULL, 0, limit, false, &ys[i].ns);
    ys[i].key = -(double)ys[i].ns;
  }
  qsort(ys, n, sizeof *ys, cap__cmp_item);
  *ny = n;
  return rc;
}

/* Whether y is still a replay of plan. */
static bool still_replayed(const cap_plan_t *plan, const cap__item_t *y) {
  uint32_t yi = cap__find_action(plan, y->tensor, y->k);
  return yi != CAP_NONE && plan->actions[yi].method == CAP_METHOD_RECOMPUTE &&
         !cap_action_is_release(&plan->actions[yi]);
}

/* What a trade works with: the lineages, the gaps it may drop, each op's
 * device bytes under the plan and the residencies they come from, and
 * room for the excess of the ops over the limit. */
typedef struct {
  cap__lineage_t lin;
  cap__item_t *xs;
  uint32_t nx;
  int64_t *mem, *need, *add;
  cap_residency_t *res;
  uint32_t n_res;
  const cap__item_t **pick;
  unsigned how; /* TRADE_* */
} trade_ctx_t;

/* The replays ys[0 .. n_y) of plan kept on the device, saving `gain`, for
 * drops that make room for them (pick_drops); *kept when the simulator
 * accepted one set (t->mem and t->res then follow the plan). */
static int trade_for(cap_plan_t *plan, const cap_profile_t *p,
                     const cap_plan_config_t *cfg, trade_ctx_t *t,
                     const cap__item_t *const *ys, uint32_t n_y, int64_t gain,
                     uint64_t limit, bool *kept) {
  *kept = false;
  /* the ops, while the tensors are off the device (another list may bring
   * one back before its own), that their bytes would take over the limit */
  uint32_t ya[TRADE_KEPT_MAX], yb[TRADE_KEPT_MAX], lo = CAP_NONE, hi = 0;
  for (uint32_t q = 0; q < n_y; q++) {
    ya[q] = cap_profile_access_op(p, ys[q]->tensor, ys[q]->k);
    yb[q] =
        back_on_device(t->res, t->n_res, ys[q]->tensor, ya[q],
                       cap_profile_access_op(p, ys[q]->tensor, ys[q]->k + 1));
    lo = lo == CAP_NONE || ya[q] + 1 < lo ? ya[q] + 1 : lo;
    hi = yb[q] > hi + 1 ? yb[q] - 1 : hi;
  }
  for (uint32_t o = lo; o <= hi; o++)
    t->add[o] = 0;
  for (uint32_t q = 0; q < n_y; q++)
    for (uint32_t o = ya[q] + 1; o < yb[q]; o++)
      t->add[o] += (int64_t)p->tensors[ys[q]->tensor].bytes;
  uint32_t h_lo = CAP_NONE, h_hi = 0;
  for (uint32_t o = lo; o <= hi; o++)
    if (t->add[o] && t->mem[o] + t->add[o] > (int64_t)limit) {
      h_lo = h_lo == CAP_NONE ? o : h_lo;
      h_hi = o;
    }
  if (h_lo == CAP_NONE)
    return 0;
  /* a few sets of drops, each without the first of the one before: gaps
   * that span every op over first, then any that relieve some. Then the
   * same with drops whose sources the plan has off the device: their
   * lists replay those too, but merged with the sources' own lists (one
   * replay restores both) they often cost little more, which the lineage
   * does not show and the simulator does: mobilenet_v2's batch-norm
   * outputs whose convolution outputs are dropped, 40 % 11.88 -> 10.74.
   * Tried after the strict sets, not among them: tried first, they take
   * some plans down slower paths (bert_base at 50 % 2.09 against 1.85 %).
   * Short profiles only: on bert_large they cost 15 % of its planning
   * time for 1 % faster plans. */
  int64_t slack = 0;
  for (uint32_t q = 0; q < n_y && (t->how & TRADE_NEAR); q++)
    slack += (int64_t)(p->tensors[ys[q]->tensor].bytes / TRADE_SLACK_DIV);
  int rc = 0, n_modes = p->n_ops < CAP__SMALL_OPS ? 4 : 2;
  for (int mode = 0; mode < n_modes && !rc && !*kept; mode++) {
    bool span_all = !(mode & 1), any_source = mode >= 2;
    uint32_t skip[TRADE_SETS], n;
    for (uint32_t set = 0; set < TRADE_SETS && !rc && !*kept; set++) {
      for (uint32_t o = h_lo; o <= h_hi; o++)
        t->need[o - h_lo] = t->mem[o] + t->add[o] - (int64_t)limit;
      rc = pick_drops(plan, p, &t->lin, t->xs, t->nx, ys, n_y, gain, t->need,
                      h_lo, h_hi, span_all, any_source, slack, skip, set,
                      t->pick, &n);
      if (rc || !n)
        break;
      int64_t before = plan->predicted_iter_ns, g;
      rc = try_trade(plan, p, cfg, &t->lin, ys, n_y, t->pick, n, limit,
                     (t->how & TRADE_NEAR) != 0, &g);
      *kept = !rc && plan->predicted_iter_ns < before;
    }
  }
  if (*kept) /* it moved */
    rc = op_bytes(plan, p, &cfg->bw, t->mem, &t->res, &t->n_res);
  return rc;
}

/* Pairs of the ranked replays ys[0 .. ny) kept on the device together, for
 * drops that cost less than both: at most TRADE_PAIR_TRIES pairs whose
 * times off the device overlap, by rank. */
static int trade_pairs(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg, trade_ctx_t *t,
                       const cap__item_t *ys, uint32_t ny, uint64_t limit) {
  int rc = 0;
  uint32_t tried = 0;
  for (uint32_t i = 0; i < ny && tried < TRADE_PAIR_TRIES && !rc; i++)
    for (uint32_t j = i + 1; j < ny && tried < TRADE_PAIR_TRIES && !rc; j++) {
      const cap__item_t *pair[TRADE_KEPT_MAX] = {&ys[i], &ys[j]};
      if (!still_replayed(plan, pair[0]) || !still_replayed(plan, pair[1]))
        continue;
      uint32_t a0 = cap_profile_access_op(p, ys[i].tensor, ys[i].k),
               b0 = cap_profile_access_op(p, ys[i].tensor, ys[i].k + 1),
               a1 = cap_profile_access_op(p, ys[j].tensor, ys[j].k),
               b1 = cap_profile_access_op(p, ys[j].tensor, ys[j].k + 1);
      if (a0 >= b1 || a1 >= b0)
        continue;
      tried++;
      /* what keeping both saves, simulated: it may fit as it is */
      int64_t before = plan->predicted_iter_ns, gain;
      rc = try_trade(plan, p, cfg, &t->lin, pair, 2, NULL, 0, limit, false,
                     &gain);
      bool kept = plan->predicted_iter_ns < before;
      if (!rc && !kept && gain > 0)
        rc = trade_for(plan, p, cfg, t, pair, 2, gain, limit, &kept);
      else if (!rc && kept)
        rc = op_bytes(plan, p, &cfg->bw, t->mem, &t->res, &t->n_res);
    }
  return rc;
}

/* The move with changes kept up to limit at their peak. */
static int trade_to(cap_plan_t *plan, const cap_profile_t *p,
                    const cap_plan_config_t *cfg, uint32_t max_tries,
                    uint64_t limit, unsigned how) {
  trade_ctx_t t = {.how = how};
  uint32_t ny = 0;
  size_t n_ops = (size_t)p->n_ops + 1;
  cap__item_t *ys = malloc(((size_t)plan->n_actions + 1) * sizeof *ys);
  t.pick = malloc(TRADE_MAX * sizeof *t.pick);
  t.mem = malloc(n_ops * sizeof *t.mem);
  t.need = malloc(n_ops * sizeof *t.need);
  t.add = malloc(n_ops * sizeof *t.add);
  int rc = ys && t.pick && t.mem && t.need && t.add ? 0 : CAP_ENOMEM;
  if (!rc)
    rc = resident_gaps(plan, p, cfg, &t.lin, &t.xs, &t.nx);
  if (!rc)
    rc = rank_by_gain(plan, p, cfg, &t.lin, max_tries, limit, ys, &ny);
  if (!rc)
    rc = op_bytes(plan, p, &cfg->bw, t.mem, &t.res, &t.n_res);
  for (uint32_t i = 0; i < ny && ys[i].ns > 0 && !rc; i++) {
    const cap__item_t *y = &ys[i];
    bool kept;
    if (still_replayed(plan, y))
      rc = trade_for(plan, p, cfg, &t, &y, 1, y->ns, limit, &kept);
  }
  if (!rc && (how & (TRADE_PAIRS | TRADE_NEAR)) && p->n_ops < CAP__SMALL_OPS)
    rc = trade_pairs(plan, p, cfg, &t, ys, ny, limit);
  cap__lineage_close(&t.lin);
  free(t.xs);
  free(ys);
  free(t.pick);
  free(t.mem);
  free(t.need);
  free(t.add);
  free(t.res);
  return rc;
}

/* A trade pass on a plan that fits (trade_to). */
static int trade(cap_plan_t *plan, const cap_profile_t *p,
                 const cap_plan_config_t *cfg, uint32_t max_tries,
                 unsigned how) {
  if (plan->predicted_peak_bytes > cfg->budget_bytes)
    return 0;
  return trade_to(
      plan, p, cfg, max_tries,
      how & TRADE_ROOM ? cfg->budget_bytes : plan->predicted_peak_bytes, how);
}

int cap__trade_replays(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg, uint32_t max_tries) {
  return trade(plan, p, cfg, max_tries, 0);
}

int cap__trade_replays_room(cap_plan_t *plan, const cap_profile_t *p,
                            const cap_plan_config_t *cfg, uint32_t max_tries) {
  return trade(plan, p, cfg, max_tries, TRADE_ROOM);
}

int cap__trade_replays_pairs(cap_plan_t *plan, const cap_profile_t *p,
                             const cap_plan_config_t *cfg, uint32_t max_tries) {
  return trade(plan, p, cfg, max_tries, TRADE_PAIRS);
}

int cap__trade_replays_room_pairs(cap_plan_t *plan, const cap_profile_t *p,
                                  const cap_plan_config_t *cfg,
                                  uint32_t max_tries) {
  return trade(plan, p, cfg, max_tries, TRADE_ROOM | TRADE_PAIRS);
}

int cap__trade_replays_near(cap_plan_t *plan, const cap_profile_t *p,
                            const cap_plan_config_t *cfg, uint32_t max_tries) {
  return trade(plan, p, cfg, max_tries, TRADE_NEAR);
}
