/*
 * The window bound (capuchin/bound.h): for ops i < j of the profile, bytes
 * that must be off the device when op i starts and back before op j.
 *
 * THE ARGUMENT, in the simulator's model (sim.c, docs/plan-semantics.md).
 * Fix op i and a plan within budget B. When op i starts, the device holds
 * the untracked persistent bytes, every tensor op i names, every tensor
 * the plan may not evict that is still needed, and every evictable tensor
 * A_i (alive: persistent, or first accessed before i; needed again after
 * i) the plan has not taken off. So the bytes of A_i off the device then
 * are at least base_i + bytes(A_i) - B, and of those whose next access
 * comes by op j, at least Y = base_i + bytes(A_i, next access <= j) - B.
 * Each of them is back by its next access, by one of two ways:
 *  - a swap-in, whose copy starts after op i starts (a copy allocates its
 *    tensor when it starts, and this one was not on the device then) and
 *    ends before op j starts: swap-ins run one at a time at h2d_gbps at
 *    most, so they need (swapped bytes) / h2d of the window's time;
 *  - a replay, on the compute stream inside the window. A list that
 *    restores T runs T's producer and, for every input the framework has
 *    freed by then, that input's producer (a freed input must be produced
 *    in the list), and so on: the closure costs at least the durations of
 *    its ops. A tensor with no producer (a parameter, an input) cannot be
 *    replayed at all.
 * The simulator keeps every op's duration and every gap of the trace, so
 * the window lasts D (its unmanaged length) plus the plan's stalls and
 * replays in it (E, all of it extra time): D + E >= swapped / h2d, and
 * E >= the replays' cost. Replayed bytes are cheapest when their closure
 * is the producer alone: then one replay of op p restores all p's outputs
 * for dur(p), at least dur(p) / (bytes of p's outputs) per byte, the
 * smallest such rate r over the window's tensors. Restoring y bytes that
 * way costs at least r * y, so
 *     E >= min over y in [0, cheap] of max(r * y, (Y - y) / h2d - D),
 * unless some tensor with a longer closure is replayed (costs at least the
 * smallest such closure, c): then E >= max(c, (Y - replayable) / h2d - D).
 * The smaller of the two bounds E in that window, and the plan's extra
 * time is at least its extra time in any window: the largest over (i, j).
 *
 * What it leaves out keeps it a bound: copies in the other direction
 * (duplex sharing only slows swap-ins), replay temporaries, the memory a
 * swap-in needs before its copy, inputs written in place before a replay.
 */
#include "capuchin/bound.h"

#include <math.h>
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin_internal.h" /* cap__may_evict */

/* An evictable tensor alive at the window's first op. */
typedef struct {
  uint32_t next_op; /* its next access */
  uint32_t tensor;
  uint32_t slot; /* that access in p->access_ops */
} entry_t;

/* Replay cost of a tensor at one of its accesses, computed once. */
enum { RC_UNKNOWN = 0, RC_NONE, RC_PRODUCER, RC_CLOSURE };

typedef struct {
  const cap_profile_t *p;
  int64_t *unmanaged_start; /* op start on the unmanaged timeline */
  uint8_t *rc_kind;         /* per access slot: RC_* */
  int64_t *rc_ns;           /* per access slot: the closure's duration */
  uint32_t *visit;          /* per op: generation of the last closure */
  uint32_t gen;
  uint32_t *stack;
  uint32_t *named; /* per tensor: op + 1 when op names it */
  entry_t *entries;
} ctx_t;

static int cmp_entry(const void *a, const void *b) {
  const entry_t *x = a, *y = b;
  if (x->next_op != y->next_op)
    return x->next_op < y->next_op ? -1 : 1;
  return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

static int64_t op_ns(const cap_profile_t *p, uint32_t o) {
  return p->ops[o].end_ns - p->ops[o].start_ns;
}

/* Whether input x of a replayed op is gone by the start of op b: freed by
 * the framework, so that a list must produce it again. */
static bool freed_by(const cap_profile_t *p, uint32_t x, uint32_t b) {
  const cap_tensor_t *t = &p->tensors[x];
  return !cap_tensor_is_resident(t) && t->free_ns <= p->ops[b].start_ns;
}

/* Least cost of a list that restores tensor t for its access at op b
 * (access slot s): the closure of t's producer over freed inputs. */
static void replay_cost(ctx_t *c, uint32_t t, uint32_t b, uint32_t s) {
  const cap_profile_t *p = c->p;
  uint32_t prod = p->tensors[t].producer_op;
  c->rc_kind[s] = RC_NONE;
  if (prod == CAP_NONE)
    return;
  c->gen++;
  uint32_t n_stack = 0, n_ops = 0;
  int64_t ns = 0;
  c->stack[n_stack++] = prod;
  c->visit[prod] = c->gen;
  while (n_stack) {
    uint32_t o = c->stack[--n_stack];
    ns += op_ns(p, o);
    n_ops++;
    const cap_op_t *op = &p->ops[o];
    const uint32_t *in = cap_op_inputs(p, op);
    for (uint32_t k = 0; k < op->n_in; k++) {
      if (!freed_by(p, in[k], b))
        continue;
      uint32_t q = p->tensors[in[k]].producer_op;
      if (q == CAP_NONE)
        return; /* nothing can produce it again */
      if (c->visit[q] != c->gen) {
        c->visit[q] = c->gen;
        c->stack[n_stack++] = q;
      }
    }
  }
  c->rc_kind[s] = n_ops == 1 ? RC_PRODUCER : RC_CLOSURE;
  c->rc_ns[s] = ns;
}

/* Bytes written by op o: what one replay of it restores at most. */
static uint64_t output_bytes(const cap_profile_t *p, uint32_t o) {
  const cap_op_t *op = &p->ops[o];
  const uint32_t *out = cap_op_outputs(p, op);
  uint64_t sum = 0;
  for (uint32_t k = 0; k < op->n_out; k++)
    sum += p->tensors[out[k]].bytes;
  return sum;
}

/* E's bound for one window (see the top of the file); ns. */
static double window_extra(double y_off, double d, double h2d, double rate,
                           double cheap, double c_min, double replayable) {
  double swap_all = y_off / h2d - d;
  if (swap_all <= 0)
    return 0;
  double a; /* no long closure replayed */
  if (!(cheap > 0) || !isfinite(rate))
    a = swap_all;
  else {
    double lim = cheap < y_off ? cheap : y_off;
    double y = swap_all / (rate + 1 / h2d); /* r y = (Y - y) / h2d - D */
    if (y <= lim)
      a = rate * y;
    else
      a = fmax(rate * lim, (y_off - lim) / h2d - d);
  }
  if (isfinite(c_min)) {
    double b = fmax(c_min, (y_off - replayable) / h2d - d);
    if (b < a)
      a = b;
  }
  return a;
}

/* Evictable tensors alive at op i and needed after it, into c->entries;
 * base: the bytes op i needs on the device whatever the plan does; total:
 * base and those tensors. */
static uint32_t alive_at(ctx_t *c, uint32_t i, bool evict_persistent,
                         uint64_t *base, uint64_t *total) {
  const cap_profile_t *p = c->p;
  const cap_op_t *op = &p->ops[i];
  uint64_t b = cap_profile_untracked_bytes(p);
  for (uint32_t k = 0; k < op->n_in + op->n_out; k++) {
    uint32_t t = k < op->n_in ? cap_op_inputs(p, op)[k]
                              : cap_op_outputs(p, op)[k - op->n_in];
    if (c->named[t] != i + 1) {
      c->named[t] = i + 1;
      b += p->tensors[t].bytes;
    }
  }
  uint32_t n = 0;
  uint64_t movable = 0;
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    const cap_tensor_t *x = &p->tensors[t];
    if (c->named[t] == i + 1 || x->n_accesses == 0 || x->bytes == 0)
      continue;
    const uint32_t *acc = p->access_ops + x->access_off;
    if (!cap_tensor_is_resident(x) && acc[0] > i)
      continue;                          /* not created yet */
    uint32_t next = cap_profile_accesses_before(p, t, i + 1);
    if (next == x->n_accesses)
      continue; /* not needed again: a plan may release it */
    if (!cap__may_evict(x, evict_persistent)) {
      b += x->bytes;
      continue;
    }
    c->entries[n++] = (entry_t){acc[next], t, x->access_off + next};
    movable += x->bytes;
  }
  *base = b;
  *total = b + movable;
  return n;
}

static void bound_from(ctx_t *c, uint32_t i, uint64_t budget,
                       bool evict_persistent, double h2d,
                       cap_window_bound_t *best) {
  const cap_profile_t *p = c->p;
  uint64_t base, total;
  uint32_t n = alive_at(c, i, evict_persistent, &base, &total);
  if (total <= budget)
    return;
  qsort(c->entries, n, sizeof *c->entries, cmp_entry);
  uint64_t prefix = base;
  double rate = INFINITY, cheap = 0, c_min = INFINITY, replayable = 0;
  for (uint32_t k = 0; k < n; k++) {
    const entry_t *e = &c->entries[k];
    uint64_t bytes = p->tensors[e->tensor].bytes;
    prefix += bytes;
    if (c->rc_kind[e->slot] == RC_UNKNOWN)
      replay_cost(c, e->tensor, e->next_op, e->slot);
    if (c->rc_kind[e->slot] == RC_PRODUCER) {
      uint32_t prod = p->tensors[e->tensor].producer_op;
      double r = (double)c->rc_ns[e->slot] / (double)output_bytes(p, prod);
      if (r < rate)
        rate = r;
      cheap += (double)bytes;
      replayable += (double)bytes;
    } else if (c->rc_kind[e->slot] == RC_CLOSURE) {
      if ((double)c->rc_ns[e->slot] < c_min)
        c_min = (double)c->rc_ns[e->slot];
      replayable += (double)bytes;
    }
    if (k + 1 < n && c->entries[k + 1].next_op == e->next_op)
      continue; /* the window ends before op e->next_op: all of them */
    if (prefix <= budget)
      continue;
    double y_off = (double)(prefix - budget);
    int64_t window = c->unmanaged_start[e->next_op] - c->unmanaged_start[i];
    double extra = window_extra(y_off, (double)window, h2d, rate, cheap, c_min,
                                replayable);
    /* at an absurd bandwidth the bound leaves int64_t: keep it there */
    int64_t ns = extra < (double)CAP_PROFILE_MAX_NS ? (int64_t)floor(extra)
                                                    : CAP_PROFILE_MAX_NS;
    if (ns > best->extra_ns) {
      *best = (cap_window_bound_t){ns, i, e->next_op, window, prefix - budget};
    }
  }
}

int cap_window_bound(const cap_profile_t *p, uint64_t budget_bytes,
                     bool evict_persistent, double h2d_gbps,
                     cap_window_bound_t *out) {
  if (!p || !out || !p->finished || !(h2d_gbps > 0))
    return CAP_EINVAL;
  *out = (cap_window_bound_t){0, CAP_NONE, CAP_NONE, 0, 0};
  ctx_t c = {.p = p};
  c.unmanaged_start =
      malloc(((size_t)p->n_ops + 1) * sizeof *c.unmanaged_start);
  c.rc_kind = calloc((size_t)p->n_accesses + 1, 1);
  c.rc_ns = malloc(((size_t)p->n_accesses + 1) * sizeof *c.rc_ns);
  c.visit = calloc((size_t)p->n_ops + 1, sizeof *c.visit);
  c.stack = malloc(((size_t)p->n_ops + 1) * sizeof *c.stack);
  c.named = calloc((size_t)p->n_tensors + 1, sizeof *c.named);
  c.entries = malloc(((size_t)p->n_tensors + 1) * sizeof *c.entries);
  int rc = 0;
  if (!c.unmanaged_start || !c.rc_kind || !c.rc_ns || !c.visit || !c.stack ||
      !c.named || !c.entries) {
    rc = CAP_ENOMEM;
    goto out_free;
  }
  /* the simulator's unmanaged timeline: durations and gaps of the trace */
  int64_t cur = 0, prev_end = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    int64_t gap = p->ops[i].start_ns - prev_end;
    cur += gap > 0 ? gap : 0;
    c.unmanaged_start[i] = cur;
    cur += op_ns(p, i);
    prev_end = p->ops[i].end_ns;
  }
  for (uint32_t i = 0; i < p->n_ops; i++)
    bound_from(&c, i, budget_bytes, evict_persistent, h2d_gbps, out);
out_free:
  free(c.unmanaged_start);
  free(c.rc_kind);
  free(c.rc_ns);
  free(c.visit);
  free(c.stack);
  free(c.named);
  free(c.entries);
  return rc;
}
