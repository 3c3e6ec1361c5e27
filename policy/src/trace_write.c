/*
 * Writer for `capuchin-trace 1`: the inverse of trace_read.c. Records are
 * written in the reader's order (header, one meta line, tensors, ops,
 * frees), so cap_trace_parse() rebuilds an equal profile.
 */
#include <inttypes.h>
#include <stdio.h>

#include "capuchin/error.h"
#include "capuchin/trace.h"

static const char *const kind_names[] = {"param", "input", "activation"};

static void write_list(FILE *f, const uint32_t *ids, uint32_t n) {
  if (n == 0) {
    fputc('-', f);
    return;
  }
  for (uint32_t i = 0; i < n; i++)
    fprintf(f, i ? ",%" PRIu32 : "%" PRIu32, ids[i]);
}

int cap_trace_write(FILE *f, const cap_profile_t *p) {
  if (!f || !p || !p->finished)
    return CAP_EINVAL;
  fputs("capuchin-trace 1\n", f);
  if (p->n_meta) {
    fputs("meta", f);
    for (uint32_t i = 0; i < p->n_meta; i++)
      fprintf(f, " %s=%s", p->meta[i].key, p->meta[i].value);
    fputc('\n', f);
  }
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    const cap_tensor_t *ct = &p->tensors[t];
    if ((unsigned)ct->kind > CAP_KIND_ACTIVATION)
      return CAP_EINVAL;
    fprintf(f, "tensor %" PRIu32 " %" PRIu64 " %s\n", t, ct->bytes,
            kind_names[ct->kind]);
  }
  for (uint32_t o = 0; o < p->n_ops; o++) {
    const cap_op_t *op = &p->ops[o];
    fprintf(f, "op %" PRIu32 " %" PRId64 " %" PRId64 " %s ", o, op->start_ns,
            op->end_ns, op->name);
    write_list(f, cap_op_inputs(p, op), op->n_in);
    fputc(' ', f);
    write_list(f, cap_op_outputs(p, op), op->n_out);
    fputc('\n', f);
  }
  for (uint32_t i = 0; i < p->n_frees; i++)
    fprintf(f, "free %" PRId64 " %" PRIu32 "\n", p->frees[i].t_ns,
            p->frees[i].tensor);
  if (fflush(f) != 0 || ferror(f))
    return CAP_EIO;
  return 0;
}
