/*
 * Capuchin planner context: op-space memory, live ranges, in-place writes
 * and the eviction candidates (every gap between two consecutive accesses
 * of an evictable tensor).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"

/* --- segment tree: range add, range max ----------------------------------- */

static void mt_build(cap__memtree_t *t, uint32_t node, uint32_t lo, uint32_t hi,
                     const int64_t *v) {
  t->lz[node] = 0;
  if (hi - lo == 1) {
    t->mx[node] = v[lo];
    return;
  }
  uint32_t mid = lo + (hi - lo) / 2;
  mt_build(t, 2 * node, lo, mid, v);
  mt_build(t, 2 * node + 1, mid, hi, v);
  t->mx[node] = t->mx[2 * node] > t->mx[2 * node + 1] ? t->mx[2 * node]
                                                      : t->mx[2 * node + 1];
}

int cap__memtree_init(cap__memtree_t *t, const int64_t *vals, uint32_t n) {
  memset(t, 0, sizeof *t);
  if (n == 0)
    return 0;
  t->mx = malloc(4 * (size_t)n * sizeof *t->mx);
  t->lz = malloc(4 * (size_t)n * sizeof *t->lz);
  if (!t->mx || !t->lz) {
    cap__memtree_close(t);
    return CAP_ENOMEM;
  }
  t->n = n;
  mt_build(t, 1, 0, n, vals);
  return 0;
}

void cap__memtree_close(cap__memtree_t *t) {
  free(t->mx);
  free(t->lz);
  memset(t, 0, sizeof *t);
}

static void mt_add(cap__memtree_t *t, uint32_t node, uint32_t lo, uint32_t hi,
                   uint32_t a, uint32_t b, int64_t d) {
  if (b <= lo || hi <= a)
    return;
  if (a <= lo && hi <= b) {
    t->mx[node] += d;
    t->lz[node] += d;
    return;
  }
  uint32_t mid = lo + (hi - lo) / 2;
  mt_add(t, 2 * node, lo, mid, a, b, d);
  mt_add(t, 2 * node + 1, mid, hi, a, b, d);
  int64_t m = t->mx[2 * node] > t->mx[2 * node + 1] ? t->mx[2 * node]
                                                    : t->mx[2 * node + 1];
  t->mx[node] = m + t->lz[node];
}

void cap__memtree_add(cap__memtree_t *t, uint32_t lo, uint32_t hi,
                      int64_t delta) {
  if (hi > t->n)
    hi = t->n;
  if (lo >= hi || delta == 0)
    return;
  mt_add(t, 1, 0, t->n, lo, hi, delta);
}

/* Max over [a, b) within node's range [lo, hi), which [a, b) overlaps
 * without covering it; a child is entered only when the range cuts it (the
 * planner asks hundreds of thousands of these on a long profile). */
static int64_t mt_max(const cap__memtree_t *t, uint32_t node, uint32_t lo,
                      uint32_t hi, uint32_t a, uint32_t b) {
  uint32_t mid = lo + (hi - lo) / 2;
  int64_t m = INT64_MIN;
  if (a < mid)
    m = a <= lo && mid <= b ? t->mx[2 * node]
                            : mt_max(t, 2 * node, lo, mid, a, b);
  if (b > mid) {
    int64_t r = mid >= a && hi <= b ? t->mx[2 * node + 1]
                                    : mt_max(t, 2 * node + 1, mid, hi, a, b);
    if (r > m)
      m = r;
  }
  return m + t->lz[node];
}

int64_t cap__memtree_max(const cap__memtree_t *t, uint32_t lo, uint32_t hi) {
  if (hi > t->n)
    hi = t->n;
  if (lo >= hi)
    return INT64_MIN;
  if (lo == 0 && hi == t->n)
    return t->mx[1];
  return mt_max(t, 1, 0, t->n, lo, hi);
}

static uint32_t mt_first(const cap__memtree_t *t, uint32_t node, uint32_t lo,
                         uint32_t hi, int64_t x, bool last) {
  if (t->mx[node] <= x)
    return CAP_NONE;
  if (hi - lo == 1)
    return lo;
  uint32_t mid = lo + (hi - lo) / 2;
  x -= t->lz[node];
  uint32_t r = last ? mt_first(t, 2 * node + 1, mid, hi, x, last)
                    : mt_first(t, 2 * node, lo, mid, x, last);
  if (r != CAP_NONE)
    return r;
  return last ? mt_first(t, 2 * node, lo, mid, x, last)
              : mt_first(t, 2 * node + 1, mid, hi, x, last);
}

uint32_t cap__memtree_first_above(const cap__memtree_t *t, int64_t x) {
  return t->n ? mt_first(t, 1, 0, t->n, x, false) : CAP_NONE;
}

uint32_t cap__memtree_last_above(const cap__memtree_t *t, int64_t x) {
  return t->n ? mt_first(t, 1, 0, t->n, x, true) : CAP_NONE;
}

/* --- small helpers --------------------------------------------------------- */

int cap__u32vec_push(cap__u32vec_t *v, uint32_t x) {
  if (v->n == v->cap) {
    uint32_t cap = v->cap ? v->cap * 2 : 8;
    uint32_t *n = realloc(v->v, (size_t)cap * sizeof *n);
    if (!n)
      return CAP_ENOMEM;
    v->v = n;
    v->cap = cap;
  }
  v->v[v->n++] = x;
  return 0;
}

uint32_t cap__op_at_or_after(const cap__ctx_t *c, int64_t t) {
  uint32_t lo = 0, hi = c->n_ops;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (c->op_start[mid] < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

uint32_t cap__op_at_or_before(const cap__ctx_t *c, int64_t t, uint32_t limit) {
  uint32_t lo = 0, hi = limit < c->n_ops ? limit : c->n_ops;
  /* first op in [0, hi) with start > t */
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (c->op_start[mid] <= t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo == 0 ? CAP_NONE : lo - 1;
}


bool cap__resident_at(const cap__ctx_t *c, uint32_t x, uint32_t b) {
  const cap_profile_t *p = c->p;
  const cap_tensor_t *t = &p->tensors[x];
  if (t->n_accesses == 0)
    return false;
  if (p->access_ops[t->access_off] >= b || c->live_end[x] <= b)
    return false;
  /* the gap containing b: accesses i-1 (< b) and i (>= b) */
  uint32_t i = cap_profile_accesses_before(p, x, b);
  if (i == 0)
    return true;
  /* after the last access (i == n_accesses): live until its free unless
   * released */
  return c->gap_state[t->access_off + i - 1] == GAP_FREE;
}

uint32_t cap__evicting_choice(const cap__ctx_t *c, uint32_t x, uint32_t b) {
  const cap_profile_t *p = c->p;
  const cap_tensor_t *t = &p->tensors[x];
  if (t->n_accesses == 0 || p->access_ops[t->access_off] >= b ||
      c->live_end[x] <= b)
    return CAP_NONE;
  uint32_t i = cap_profile_accesses_before(p, x, b);
  if (i == 0 || c->gap_state[t->access_off + i - 1] == GAP_FREE)
    return CAP_NONE;
  return c->slot_choice[t->access_off + i - 1];
}

uint32_t cap__first_use(const cap__ctx_t *c, uint32_t x, uint32_t a,
                        uint32_t b) {
  const cap__u32vec_t *u = &c->uses[x];
  uint32_t best = CAP_NONE;
  for (uint32_t i = 0; i < u->n; i++)
    if (u->v[i] > a && u->v[i] <= b && (best == CAP_NONE || u->v[i] < best))
      best = u->v[i];
  return best;
}

uint32_t cap__version_before(const cap__ctx_t *c, uint32_t x, uint32_t op) {
  const uint32_t *m = c->mods + c->mod_off[x];
  uint32_t lo = 0, hi = c->mod_off[x + 1] - c->mod_off[x];
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (m[mid] < op)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

bool cap__written_between(const cap__ctx_t *c, uint32_t x, uint32_t lo,
                          uint32_t hi) {
  return cap__version_before(c, x, hi) > cap__version_before(c, x, lo);
}

/* --- context --------------------------------------------------------------- */

static bool evictable_kind(const cap__ctx_t *c, const cap_tensor_t *t) {
  return cap__may_evict(t, c->cfg->evict_persistent);
}

/* Whether tensor x stays allocated for at least one op after its last
 * access (c->live_end must be set), so that a release frees something. A
 * persistent tensor never qualifies: the next iteration needs its value. */
static bool releasable(const cap__ctx_t *c, uint32_t x) {
  const cap_tensor_t *t = &c->p->tensors[x];
  if (cap_tensor_is_resident(t) || t->n_accesses == 0)
    return false;
  uint32_t last = c->p->access_ops[t->access_off + t->n_accesses - 1];
  return c->live_end[x] > last + 1;
}

int cap__ctx_init(cap__ctx_t *c, const cap_profile_t *p,
                  const cap_plan_config_t *cfg) {
  memset(c, 0, sizeof *c);
  c->p = p;
  c->cfg = cfg;
  uint32_t n = p->n_ops, nt = p->n_tensors;
  c->n_ops = n;
  int rc = CAP_ENOMEM;
  c->op_start = malloc(((size_t)n + 1) * sizeof *c->op_start);
  c->op_end = malloc(((size_t)n + 1) * sizeof *c->op_end);
  c->live_end = malloc(((size_t)nt + 1) * sizeof *c->live_end);
  c->base_mem = calloc((size_t)n + 1, sizeof *c->base_mem);
  c->born = calloc((size_t)n + 1, sizeof *c->born);
  c->mod_off = calloc((size_t)nt + 1, sizeof *c->mod_off);
  c->gap_state = calloc((size_t)p->n_accesses + 1, 1);
  c->slot_choice = calloc((size_t)p->n_accesses + 1, sizeof *c->slot_choice);
  c->uses = calloc((size_t)nt + 1, sizeof *c->uses);
  c->mark = calloc((size_t)nt + 1, sizeof *c->mark);
  c->mark_ver = calloc((size_t)nt + 1, sizeof *c->mark_ver);
  c->opmark = calloc((size_t)n + 1, sizeof *c->opmark);
  c->d2h_head = malloc(((size_t)n + 1) * sizeof *c->d2h_head);
  if (!c->op_start || !c->op_end || !c->live_end || !c->base_mem || !c->born ||
      !c->mod_off || !c->gap_state || !c->slot_choice || !c->uses || !c->mark || !c->mark_ver ||
      !c->opmark || !c->d2h_head)
    goto out_fail;
  for (uint32_t i = 0; i <= n; i++)
    c->d2h_head[i] = CAP_NONE;
  for (uint32_t i = 0; i < n; i++) {
    c->op_start[i] = p->ops[i].start_ns;
    c->op_end[i] = p->ops[i].end_ns;
  }

  /* Live ranges and the unmanaged op-space curve, as cap_curve_compute
   * counts it: persistent bytes plus each freed activation from the start
   * of its first access to its free (a free at an op's start time comes
   * first). */
  int64_t *diff = c->base_mem;
  uint32_t n_gaps = 0;
  for (uint32_t x = 0; x < nt; x++) {
    const cap_tensor_t *t = &p->tensors[x];
    c->live_end[x] = n;
    if (t->n_accesses == 0)
      continue;
    if (t->kind == CAP_KIND_ACTIVATION && t->free_ns >= 0) {
      uint32_t first = p->access_ops[t->access_off];
      uint32_t end = cap__op_at_or_after(c, t->free_ns);
      if (end < first + 1)
        end = first + 1; /* freed inside its only op: held during it */
      c->live_end[x] = end;
      diff[first] += (int64_t)t->bytes;
      c->born[first] += (int64_t)t->bytes;
      diff[end] -= (int64_t)t->bytes;
    }
    if (evictable_kind(c, t) && t->n_accesses > 1)
      n_gaps += t->n_accesses - 1;
    if (releasable(c, x))
      n_gaps++;
  }
  int64_t run = (int64_t)p->persistent_bytes;
  for (uint32_t i = 0; i < n; i++) {
    run += diff[i];
    diff[i] = run;
  }

  /* Writes after the producer (in-place ops and out= ops), per tensor,
   * counted op by op so that an op with thousands of outputs (a fused
   * optimizer step) costs its size, not its size squared. */
  for (uint32_t o = 0; o < n; o++) {
    const cap_op_t *op = &p->ops[o];
    if (op->flags & CAP_OP_VIEW)
      continue;
    const uint32_t *out = cap_op_outputs(p, op);
    for (uint32_t j = 0; j < op->n_out; j++)
      if (p->tensors[out[j]].producer_op != o || (op->flags & CAP_OP_INPLACE))
        c->mod_off[out[j] + 1]++;
  }
  for (uint32_t x = 0; x < nt; x++)
    c->mod_off[x + 1] += c->mod_off[x];
  c->mods = malloc(((size_t)c->mod_off[nt] + 1) * sizeof *c->mods);
  c->gaps = malloc(((size_t)n_gaps + 1) * sizeof *c->gaps);
  c->gap_key = malloc(((size_t)n_gaps + 1) * sizeof *c->gap_key);
  c->no_hidden = calloc((size_t)n_gaps + 1, 1);
  if (!c->mods || !c->gaps || !c->gap_key || !c->no_hidden)
    goto out_fail;
  for (uint32_t i = 0; i <= n_gaps; i++)
    c->gap_key[i] = HUGE_VAL; /* not evaluated yet: ranks first */
  {
    /* fill in op order: each tensor's list comes out ascending */
    uint32_t *w = malloc(((size_t)nt + 1) * sizeof *w);
    if (!w)
      goto out_fail;
    for (uint32_t x = 0; x < nt; x++)
      w[x] = c->mod_off[x];
    for (uint32_t o = 0; o < n; o++) {
      const cap_op_t *op = &p->ops[o];
      if (op->flags & CAP_OP_VIEW)
        continue;
      const uint32_t *out = cap_op_outputs(p, op);
      for (uint32_t j = 0; j < op->n_out; j++)
        if (p->tensors[out[j]].producer_op != o || (op->flags & CAP_OP_INPLACE))
          c->mods[w[out[j]]++] = o;
    }
    free(w);
  }
  for (uint32_t x = 0; x < nt; x++) {
    const cap_tensor_t *t = &p->tensors[x];
    const uint32_t *acc = p->access_ops + t->access_off;
    if (!evictable_kind(c, t) || t->n_accesses < 2)
      continue;
    for (uint32_t k = 1; k < t->n_accesses; k++) {
      /* only gaps with at least one op between the two accesses free
       * anything */
      if (acc[k] <= acc[k - 1] + 1)
        continue;
      c->gaps[c->n_gaps++] = (cap__gap_t){x, k, acc[k - 1], acc[k]};
    }
  }
  for (uint32_t x = 0; x < nt; x++) {
    const cap_tensor_t *t = &p->tensors[x];
    if (!releasable(c, x))
      continue;
    uint32_t last = p->access_ops[t->access_off + t->n_accesses - 1];
    c->gaps[c->n_gaps + c->n_tails++] =
        (cap__gap_t){x, t->n_accesses, last, c->live_end[x]};
  }

  rc = cap__memtree_init(&c->mem, c->base_mem, n);
  if (rc)
    goto out_fail;
  rc = cap__engine_init(&c->d2h, n);
  if (rc)
    goto out_fail;
  rc = cap__engine_init(&c->h2d, n);
  if (rc)
    goto out_fail;

  /* Book copies at the rate each direction keeps while the other runs too
   * (max-min fair share of the duplex bandwidth), so that a swap found
   * hidden stays hidden when copies overlap. */
  double h = cfg->bw.h2d_gbps, d = cfg->bw.d2h_gbps, dup = cfg->bw.duplex_gbps;
  c->h2d_gbps = h;
  c->d2h_gbps = d;
  if (dup > 0 && h + d > dup) {
    double half = dup / 2;
    double rh = h < half ? h : half, rd = d < half ? d : half;
    c->h2d_gbps = h < dup - rd ? h : dup - rd;
    c->d2h_gbps = d < dup - rh ? d : dup - rh;
  }
  return 0;

out_fail:
  cap__ctx_close(c);
  return rc;
}

void cap__ctx_close(cap__ctx_t *c) {
  if (c->uses)
    for (uint32_t x = 0; x < c->p->n_tensors; x++)
      free(c->uses[x].v);
  free(c->uses);
  free(c->op_start);
  free(c->op_end);
  free(c->live_end);
  free(c->base_mem);
  free(c->born);
  free(c->mod_off);
  free(c->mods);
  free(c->gap_state);
  free(c->slot_choice);
  free(c->restored.v);
  free(c->gaps);
  free(c->gap_key);
  free(c->no_hidden);
  free(c->ch);
  free(c->rc_ops);
  free(c->mark);
  free(c->mark_ver);
  free(c->opmark);
  free(c->d2h_head);
  free(c->list.v);
  free(c->stack.v);
  free(c->stack_ver.v);
  free(c->touched.v);
  cap__memtree_close(&c->mem);
  cap__engine_close(&c->d2h);
  cap__engine_close(&c->h2d);
  memset(c, 0, sizeof *c);
}
