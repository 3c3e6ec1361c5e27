/*
 * Helpers the baseline planners share: where backward starts, which ops are
 * heavy layers, which tensors a plan may evict, and lineage closures for
 * recompute lists.
 */
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "planners.h"

uint32_t cap__backward_start(const cap_profile_t *p) {
  for (uint32_t i = 0; i < p->n_ops; i++)
    if (p->ops[i].name && strstr(p->ops[i].name, "backward"))
      return i;
  return p->n_ops;
}

bool cap__op_is_heavy(const cap_profile_t *p, uint32_t op) {
  const char *n = p->ops[op].name;
  if (!n)
    return false;
  return strstr(n, "convolution") || strstr(n, ".mm.") || strstr(n, "addmm") ||
         strstr(n, "bmm") || strstr(n, "matmul") || strstr(n, "linear");
}

bool cap__evictable(const cap_profile_t *p, const cap_plan_config_t *cfg,
                    uint32_t t) {
  const cap_tensor_t *ct = &p->tensors[t];
  if (ct->bytes == 0 || ct->n_accesses < 2 || ct->no_evict)
    return false;
  if (ct->kind == CAP_KIND_ACTIVATION)
    return ct->free_ns >= 0;
  return cfg && cfg->evict_persistent;
}

static bool lists(const uint32_t *v, uint32_t n, uint32_t x) {
  for (uint32_t i = 0; i < n; i++)
    if (v[i] == x)
      return true;
  return false;
}

/* Does op write tensor t? A view op lists its base on both sides without
 * changing it; it writes only the tensors it creates. */
static bool writes(const cap_profile_t *p, uint32_t op, uint32_t t) {
  const cap_op_t *o = &p->ops[op];
  if ((o->flags & CAP_OP_VIEW) && p->tensors[t].producer_op != op)
    return false;
  return lists(cap_op_outputs(p, o), o->n_out, t);
}

uint32_t cap__last_writer(const cap_profile_t *p, uint32_t t, uint32_t op) {
  const cap_tensor_t *ct = &p->tensors[t];
  const uint32_t *acc = p->access_ops + ct->access_off;
  for (uint32_t k = ct->n_accesses; k-- > 0;)
    if (acc[k] <= op && writes(p, acc[k], t))
      return acc[k];
  return CAP_NONE;
}

void cap__lineage_close(cap__lineage_t *l) {
  if (!l)
    return;
  free(l->mark);
  free(l->ops);
  memset(l, 0, sizeof *l);
}

static int push_op(cap__lineage_t *l, uint32_t op) {
  if (l->n_ops == l->cap_ops) {
    uint32_t cap = l->cap_ops ? l->cap_ops * 2 : 64;
    uint32_t *n = realloc(l->ops, (size_t)cap * sizeof *n);
    if (!n)
      return CAP_ENOMEM;
    l->ops = n;
    l->cap_ops = cap;
  }
  l->ops[l->n_ops++] = op;
  return 0;
}

int cap__lineage(cap__lineage_t *l, const cap_profile_t *p, uint32_t t,
                 uint32_t evict_op, uint32_t back_op, const uint8_t *gone,
                 uint32_t max_ops) {
  if (l->n_tensors != p->n_tensors) {
    free(l->mark);
    l->mark = calloc((size_t)(p->n_tensors ? p->n_tensors : 1), sizeof *l->mark);
    if (!l->mark)
      return CAP_ENOMEM;
    l->n_tensors = p->n_tensors;
    l->gen = 0;
  }
  if (++l->gen == 0) { /* wrapped: start the marks afresh */
    memset(l->mark, 0, (size_t)p->n_tensors * sizeof *l->mark);
    l->gen = 1;
  }
  l->n_ops = 0;
  uint32_t start = cap__last_writer(p, t, evict_op);
  if (start == CAP_NONE || p->tensors[t].producer_op == CAP_NONE)
    return CAP_ENOENT;
  const int64_t back_start = p->ops[back_op].start_ns;
  uint32_t needed = 1;
  l->mark[t] = l->gen;
  for (uint32_t s = start + 1; s-- > 0 && needed;) {
    const cap_op_t *o = &p->ops[s];
    const uint32_t *out = cap_op_outputs(p, o), *in = cap_op_inputs(p, o);
    bool hit = false;
    for (uint32_t j = 0; j < o->n_out && !hit; j++)
      hit = l->mark[out[j]] == l->gen && writes(p, s, out[j]);
    if (!hit)
      continue;
    if (l->n_ops >= max_ops)
      return CAP_ENOENT;
    int rc = push_op(l, s);
    if (rc)
      return rc;
    for (uint32_t j = 0; j < o->n_out; j++)
      if (l->mark[out[j]] == l->gen && p->tensors[out[j]].producer_op == s) {
        l->mark[out[j]] = 0;
        needed--;
      }
    for (uint32_t j = 0; j < o->n_in; j++) {
      uint32_t x = in[j];
      if (l->mark[x] == l->gen || lists(out, o->n_out, x))
        continue;
      const cap_tensor_t *xt = &p->tensors[x];
      bool ok = !(gone && gone[x]) &&
                (cap_tensor_is_resident(xt) || xt->free_ns > back_start) &&
                !cap_profile_written_in_place(p, x, s, back_op);
      if (ok)
        continue;
      if (xt->producer_op == CAP_NONE || xt->producer_op >= s)
        return CAP_ENOENT;
      l->mark[x] = l->gen;
      needed++;
    }
  }
  if (needed)
    return CAP_ENOENT;
  /* Built backwards: put it in execution order. */
  for (uint32_t i = 0, j = l->n_ops - 1; i < j; i++, j--) {
    uint32_t tmp = l->ops[i];
    l->ops[i] = l->ops[j];
    l->ops[j] = tmp;
  }
  return 0;
}
