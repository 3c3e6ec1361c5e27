/*
 * Recompute candidates: the op list that restores an evicted tensor before
 * its back-access, its cost, and MSPS (memory saving per second = bytes
 * freed / recompute time) for ranking (Capuchin, section 4.4).
 *
 * The list is rebuilt against the choices made so far, which is the paper's
 * iterative update: once a tensor is chosen for eviction it is no longer a
 * resident source for the others, whose lists (and costs) then grow or
 * become impossible; the planner re-ranks lazily, re-evaluating a candidate
 * when it reaches the top of the queue.
 *
 * Correctness rules (FORMAT.md, DESIGN.md, cap_plan_validate): the value to
 * restore is the producer's output after every later write up to the
 * evicted-access, so the producer and those writes are replayed in order;
 * every replayed op must read what it read when it first ran, so an input is
 * either restored earlier in the list (at the version that op read) or
 * resident at the back-access and not written since that op ran. Inputs
 * already freed are restored through their own lineage (a chain, as
 * checkpointing does). A source the plan evicts, or a replayed op that
 * would also rewrite a tensor the plan evicts, makes the list invalid here:
 * those cases would change when that tensor comes back. Views are near-free
 * ops and need no special case.
 */
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"

#define RC_MAX_OPS 64u /* longest list considered */
/* FAIL(why): the list cannot be built; `why` documents the rule. */
#define FAIL(why) return CAP_ENOENT

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Live at b (born before it, not yet freed) but evicted by the plan. */
static bool evicted_at(const cap__ctx_t *c, uint32_t x, uint32_t b) {
  const cap_profile_t *p = c->p;
  const cap_tensor_t *t = &p->tensors[x];
  if (t->n_accesses == 0 || p->access_ops[t->access_off] >= b ||
      c->live_end[x] <= b)
    return false;
  return !cap__resident_at(c, x, b);
}

int cap__rc_build(cap__ctx_t *c, const cap__gap_t *g, int64_t *cost_ns,
                  int64_t *extra_bytes) {
  const cap_profile_t *p = c->p;
  uint32_t T = g->tensor, b = g->b;
  /* g may end early (a list running inside the gap reads T and restores it
   * there); the plan still names the real back-access, and every input must
   * keep its value until then (cap_plan_validate) */
  uint32_t b_real = p->access_ops[p->tensors[T].access_off + g->k];
  if (p->tensors[T].producer_op == CAP_NONE)
    FAIL("no lineage");
  int64_t fetch_ns = 0;
  uint32_t gen = ++c->gen;
  if (gen == 0) { /* wrapped: reset marks */
    for (uint32_t x = 0; x < p->n_tensors; x++)
      c->mark[x] = 0;
    for (uint32_t i = 0; i < c->n_ops; i++)
      c->opmark[i] = 0;
    gen = c->gen = 1;
  }
  c->list.n = c->stack.n = c->stack_ver.n = c->touched.n = c->restored.n = 0;
  c->mark[T] = gen;
  c->mark_ver[T] = cap__version_before(c, T, g->a + 1);
  if (cap__u32vec_push(&c->stack, T) || cap__u32vec_push(&c->stack_ver, c->mark_ver[T]))
    return CAP_ENOMEM;

  while (c->stack.n) {
    uint32_t x = c->stack.v[--c->stack.n];
    uint32_t v = c->stack_ver.v[--c->stack_ver.n];
    uint32_t prod = p->tensors[x].producer_op;
    if (prod == CAP_NONE || prod >= b)
      FAIL("no lineage before the back-access");
    const uint32_t *mods = c->mods + c->mod_off[x];
    /* a tensor first written in place (its producer also reads it) has no
     * value to rebuild from */
    if (c->mod_off[x + 1] > c->mod_off[x] && mods[0] == prod)
      FAIL("produced in place");
    for (uint32_t s = 0; s <= v; s++) {
      uint32_t o = s == 0 ? prod : mods[s - 1];
      if (c->opmark[o] == gen)
        continue;
      c->opmark[o] = gen;
      if (c->list.n >= RC_MAX_OPS)
        FAIL("list too long");
      if (cap__u32vec_push(&c->list, o))
        return CAP_ENOMEM;
      const cap_op_t *op = &p->ops[o];
      const uint32_t *in = cap_op_inputs(p, op);
      for (uint32_t j = 0; j < op->n_in; j++) {
        uint32_t y = in[j];
        if (y == x && s > 0)
          continue; /* the write chain of x itself */
        uint32_t need = cap__version_before(c, y, o);
        if (c->mark[y] == gen) {
          if (c->mark_ver[y] != need)
            FAIL("needed at two versions");
          continue;
        }
        bool written = cap__written_between(c, y, o, b_real);
        if (cap__resident_at(c, y, b)) {
          if (written)
            FAIL("source written in place since");
          if (cap__u32vec_push(&c->touched, y))
            return CAP_ENOMEM;
          continue;
        }
        uint32_t ci = cap__evicting_choice(c, y, b);
        if (ci != CAP_NONE && c->ch[ci].release)
          FAIL("source released after its last access");
        if (ci != CAP_NONE && c->ch[ci].method == CAP_METHOD_RECOMPUTE) {
          /* dropped by the plan: its own list restores it here, at the
           * version it was evicted at */
          const cap__gap_t *yg = &c->gaps[c->ch[ci].gap];
          if (written || cap__version_before(c, y, yg->a + 1) != need)
            FAIL("nested source written in place since");
          if (cap__u32vec_push(&c->touched, y) ||
              cap__u32vec_push(&c->restored, ci))
            return CAP_ENOMEM;
          continue;
        }
        if (ci != CAP_NONE) {
          /* swapped out: usable as is once its prefetch has landed, else
           * fetched on demand here (the simulator issues its H2D copy
           * then), which the compute stream waits for */
          const cap__choice_t *yc = &c->ch[ci];
          const cap__gap_t *yg = &c->gaps[yc->gap];
          if (written || cap__version_before(c, y, yg->a + 1) != need)
            FAIL("swapped source written in place since");
          if (cap__u32vec_push(&c->touched, y))
            return CAP_ENOMEM;
          if (yc->trig_op != CAP_NONE && yc->save_hi <= b &&
              yc->in_end <= c->op_start[b])
            continue;
          if (c->no_fetch)
            FAIL("swapped source, no on-demand fetch");
          /* an H2D copy issued before its D2H has ended would block the
           * whole H2D queue behind it */
          if (yc->out_end > c->op_start[b])
            FAIL("swapped source still copying out");
          int64_t st = c->op_start[b];
          uint32_t prev = cap__engine_prev(&c->h2d, b);
          if (prev != CAP_NONE && c->h2d.last_end[prev] > st)
            st = c->h2d.last_end[prev];
          fetch_ns += st - c->op_start[b] +
                      cap_copy_ns(p->tensors[y].bytes, c->h2d_gbps);
          if (cap__u32vec_push(&c->restored, ci))
            return CAP_ENOMEM;
          continue;
        }
        if (evicted_at(c, y, b) || p->tensors[y].producer_op == CAP_NONE)
          FAIL("source has no lineage");
        /* freed before the back-access: restore it in the list too */
        c->mark[y] = gen;
        c->mark_ver[y] = need;
        if (cap__u32vec_push(&c->stack, y) || cap__u32vec_push(&c->stack_ver, need))
          return CAP_ENOMEM;
      }
    }
  }

  c->n_sources_restored = c->restored.n;
  if (c->list.n > 1)
    qsort(c->list.v, c->list.n, sizeof *c->list.v, cmp_u32);
  int64_t cost = 0, extra = 0;
  for (uint32_t i = 0; i < c->list.n; i++) {
    const cap_op_t *op = &p->ops[c->list.v[i]];
    cost += op->end_ns - op->start_ns;
    const uint32_t *out = cap_op_outputs(p, op);
    const uint32_t *in = cap_op_inputs(p, op);
    for (uint32_t j = 0; j < op->n_out; j++) {
      uint32_t z = out[j];
      bool inplace = false;
      for (uint32_t k = 0; k < op->n_in && !inplace; k++)
        inplace = in[k] == z;
      if (cap__u32vec_push(&c->touched, z))
        return CAP_ENOMEM;
      if (inplace || z == T)
        continue;
      uint32_t zi = cap__evicting_choice(c, z, b);
      /* a released output is a temporary of the replay like any other */
      if (zi != CAP_NONE && c->ch[zi].method == CAP_METHOD_RECOMPUTE &&
          !c->ch[zi].release) {
        /* the replay brings a dropped tensor back for good */
        if (cap__u32vec_push(&c->restored, zi))
          return CAP_ENOMEM;
        continue;
      }
      if (c->mark[z] == gen && c->mark_ver[z] == UINT32_MAX)
        continue; /* counted already */
      /* the replay allocates every output afresh, released at its end */
      extra += (int64_t)p->tensors[z].bytes;
      c->mark[z] = gen;
      c->mark_ver[z] = UINT32_MAX;
    }
  }
  *cost_ns = cost + fetch_ns;
  /* The replay runs before op b allocates its own new outputs and its
   * temporaries are gone when b starts: the estimate of op b only grows by
   * what the replay holds beyond those. */
  extra -= c->born[b];
  *extra_bytes = extra > 0 ? extra : 0;
  return 0;
}

int cap__rc_register(cap__ctx_t *c, uint32_t b) {
  for (uint32_t i = 0; i < c->touched.n; i++)
    if (cap__u32vec_push(&c->uses[c->touched.v[i]], b))
      return CAP_ENOMEM;
  return 0;
}

int64_t cap__rc_saved(const cap__ctx_t *c, uint32_t b) {
  int64_t saved = 0;
  for (uint32_t i = c->n_sources_restored; i < c->restored.n; i++) {
    const cap__choice_t *r = &c->ch[c->restored.v[i]];
    if (r->method == CAP_METHOD_RECOMPUTE && !r->release &&
        r->save_lo <= b && c->gaps[r->gap].b > b)
      saved += r->cost_ns;
  }
  return saved;
}
