/*
 * In-trigger choice (Capuchin, section 4.3): the prefetch of an evicted
 * tensor starts when the op of an access of another tensor starts. Scan back
 * from SwapInStart = back-access start - margin - swap-in time to the latest
 * such op whose start is a time the H2D queue is free for the whole copy.
 * Starting as late as possible keeps the tensor off the device over as much
 * of the gap as possible, so the prefetch does not land inside the memory
 * peak it was evicted to relieve; the margin absorbs timing noise, and
 * measured lateness moves triggers further back (cap_plan_refine).
 */
#include "capuchin_internal.h"

#define TRIGGER_MAX_STEPS 64

bool cap__trigger_name(const cap_profile_t *p, uint32_t t, uint32_t x,
                       uint32_t *tensor, uint32_t *access) {
  const cap_op_t *o = &p->ops[t];
  const uint32_t *ts = p->op_tensors + o->in_off;
  for (uint32_t i = 0; i < o->n_in; i++)
    if (ts[i] != x) {
      *tensor = ts[i];
      *access = cap_profile_access_index(p, ts[i], t);
      return *access != 0;
    }
  ts = p->op_tensors + o->out_off;
  for (uint32_t i = 0; i < o->n_out; i++)
    if (ts[i] != x) {
      *tensor = ts[i];
      *access = cap_profile_access_index(p, ts[i], t);
      return *access != 0;
    }
  return false;
}

static bool names_other(const cap_profile_t *p, uint32_t t, uint32_t x) {
  const cap_op_t *o = &p->ops[t];
  const uint32_t *ts = p->op_tensors + o->in_off;
  for (uint32_t i = 0; i < o->n_in; i++)
    if (ts[i] != x)
      return true;
  ts = p->op_tensors + o->out_off;
  for (uint32_t i = 0; i < o->n_out; i++)
    if (ts[i] != x)
      return true;
  return false;
}

uint32_t cap__trigger_find(const cap__ctx_t *c, uint32_t x, uint32_t so_op,
                           uint32_t b, int64_t len_ns, int64_t deadline,
                           int64_t *start) {
  const cap__engine_t *e = &c->h2d;
  uint32_t limit = b; /* candidate ops are < limit */
  /* Each step moves before one queued copy or one op; a prefetch that has
   * to go back further than this would hold its memory for long anyway. */
  for (int steps = 0; steps < TRIGGER_MAX_STEPS; steps++) {
    uint32_t t = cap__op_at_or_before(c, deadline - len_ns, limit);
    if (t == CAP_NONE || t < so_op)
      return CAP_NONE;
    int64_t st = c->op_start[t];
    uint32_t prev = cap__engine_prev(e, t);
    if (prev != CAP_NONE && e->last_end[prev] > st) {
      /* queued behind a copy issued at or before t */
      st = e->last_end[prev];
      if (st + len_ns > deadline) {
        /* must go before that copy */
        deadline = e->first_start[prev];
        limit = prev;
        continue;
      }
    }
    uint32_t next = cap__engine_next(e, t);
    if (next != CAP_NONE && st + len_ns > e->first_start[next]) {
      /* would push a later-issued copy back: end before it starts */
      deadline = e->first_start[next];
      limit = t;
      if (st != c->op_start[t])
        limit = prev == CAP_NONE ? t : prev;
      continue;
    }
    if (!names_other(c->p, t, x)) {
      limit = t;
      continue;
    }
    *start = st;
    return t;
  }
  return CAP_NONE;
}
