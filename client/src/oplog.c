/*
 * The op log: every op of an iteration with its inputs and outputs, kept
 * for the next iteration as the lineage recompute lists replay.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

int cap__oplog_add(cap__oplog_t *l, const char *name, const uint32_t *in,
                   uint32_t n_in, const uint32_t *out, uint32_t n_out) {
  if (l->n_ops == l->cap_ops) {
    uint32_t n = l->cap_ops ? l->cap_ops * 2 : 1024;
    cap__oplog_op_t *ops = realloc(l->ops, (size_t)n * sizeof *ops);
    if (!ops)
      return CAP_ENOMEM;
    l->ops = ops;
    l->cap_ops = n;
  }
  uint32_t need = n_in + n_out;
  if (l->cap_ids - l->n_ids < need) {
    uint32_t n = l->cap_ids ? l->cap_ids : 4096;
    while (n - l->n_ids < need)
      n *= 2;
    uint32_t *ids = realloc(l->ids, (size_t)n * sizeof *ids);
    if (!ids)
      return CAP_ENOMEM;
    l->ids = ids;
    l->cap_ids = n;
  }
  cap__oplog_op_t *op = &l->ops[l->n_ops++];
  op->name = name;
  op->off = l->n_ids;
  op->n_in = n_in;
  op->n_out = n_out;
  op->adopted_bytes = 0;
  if (n_in)
    memcpy(l->ids + l->n_ids, in, n_in * sizeof *in);
  if (n_out)
    memcpy(l->ids + l->n_ids + n_in, out, n_out * sizeof *out);
  l->n_ids += need;
  return 0;
}

int cap__oplog_free(cap__oplog_t *l, uint32_t tensor) {
  if (l->n_frees == l->cap_frees) {
    uint32_t n = l->cap_frees ? l->cap_frees * 2 : 256;
    cap__oplog_free_t *f = realloc(l->frees, (size_t)n * sizeof *f);
    if (!f)
      return CAP_ENOMEM;
    l->frees = f;
    l->cap_frees = n;
  }
  l->frees[l->n_frees++] = (cap__oplog_free_t){tensor, l->n_ops};
  return 0;
}

void cap__oplog_reset(cap__oplog_t *l) {
  l->n_ops = 0;
  l->n_ids = 0;
  l->n_frees = 0;
}

void cap__oplog_close(cap__oplog_t *l) {
  free(l->ops);
  free(l->ids);
  free(l->frees);
  memset(l, 0, sizeof *l);
}

int cap__oplog_profile(const cap_client_t *c, const cap__oplog_t *l,
                       cap_profile_t **out) {
  cap_profile_t *p = cap_profile_create();
  if (!p)
    return CAP_ENOMEM;
  int rc = 0;
  for (uint32_t i = 0; i < c->n_tensors && rc == 0; i++)
    rc = cap_profile_add_tensor(p, i, c->tensors[i].bytes,
                                (cap_tensor_kind_t)c->tensors[i].kind);
  uint32_t fi = 0;
  for (uint32_t i = 0; i < l->n_ops && rc == 0; i++) {
    for (; fi < l->n_frees && l->frees[fi].before <= i && rc == 0; fi++)
      rc = cap_profile_add_free(p, 10 * (int64_t)i, l->frees[fi].tensor);
    const cap__oplog_op_t *op = &l->ops[i];
    if (rc == 0)
      rc = cap_profile_add_op(p, i, 10 * (int64_t)i + 2, 10 * (int64_t)i + 6,
                              op->name, l->ids + op->off, op->n_in,
                              l->ids + op->off + op->n_in, op->n_out);
  }
  for (; fi < l->n_frees && rc == 0; fi++)
    rc = cap_profile_add_free(p, 10 * (int64_t)l->n_ops, l->frees[fi].tensor);
  if (rc == 0)
    rc = cap_profile_finish(p);
  if (rc) {
    cap_profile_destroy(p);
    return rc;
  }
  *out = p;
  return 0;
}
