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
  if (n_in)
    memcpy(l->ids + l->n_ids, in, n_in * sizeof *in);
  if (n_out)
    memcpy(l->ids + l->n_ids + n_in, out, n_out * sizeof *out);
  l->n_ids += need;
  return 0;
}

void cap__oplog_close(cap__oplog_t *l) {
  free(l->ops);
  free(l->ids);
  memset(l, 0, sizeof *l);
}
