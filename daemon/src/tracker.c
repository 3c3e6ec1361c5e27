/*
 * The tracker: assembles the iteration a client reports (declarations, ops
 * with their accesses, frees) into flat arrays, checking each record as it
 * arrives so that a bad one is refused with a message naming it, and every
 * per-session quota is enforced before memory is spent. The profile itself
 * is built from the arrays off the loop (cap__iter_records_build), through
 * the same cap_profile_* builder the trace reader uses.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_internal.h"

#define GROW(arr, n, cap, need, type)                                          \
  do {                                                                         \
    if ((need) > (cap)) {                                                      \
      size_t nc__ = (cap) ? (size_t)(cap) * 2 : 64;                            \
      while (nc__ < (size_t)(need))                                            \
        nc__ *= 2;                                                             \
      type *na__ = realloc((arr), nc__ * sizeof(type));                        \
      if (!na__)                                                               \
        return CAP_ENOMEM;                                                     \
      (arr) = na__;                                                            \
      (cap) = nc__;                                                            \
    }                                                                          \
  } while (0)

void cap__tracker_init(cap__tracker_t *t, const cap__tracker_limits_t *lim) {
  memset(t, 0, sizeof *t);
  t->lim = *lim;
}

void cap__iter_records_free(cap__iter_records_t *r) {
  if (!r)
    return;
  free(r->t_bytes);
  free(r->t_kind);
  free(r->ops);
  free(r->op_tensors);
  for (uint32_t i = 0; i < r->n_names; i++)
    free(r->names[i]);
  free(r->names);
  free(r->frees);
  free(r->no_evict);
  memset(r, 0, sizeof *r);
}

static void reset_iteration(cap__tracker_t *t) {
  /* Keep the arrays' memory for the next iteration, drop the names. */
  for (uint32_t i = 0; i < t->rec.n_names; i++)
    free(t->rec.names[i]);
  t->rec.n_names = 0;
  t->name_bytes = 0;
  t->rec.n_ops = 0;
  t->rec.n_op_tensors = 0;
  t->rec.n_frees = 0;
  t->rec.n_no_evict = 0;
  if (t->name_slots)
    memset(t->name_slots, 0, t->n_slots * sizeof *t->name_slots);
  t->active = false;
  t->iter_known = false;
  t->dropped = 0;
  t->last_start_ns = 0;
}

void cap__tracker_close(cap__tracker_t *t) {
  free(t->t_bytes);
  free(t->t_kind);
  cap__iter_records_free(&t->rec);
  free(t->name_slots);
  memset(t, 0, sizeof *t);
}

void cap__tracker_discard(cap__tracker_t *t) { reset_iteration(t); }

int cap__tracker_decl(cap__tracker_t *t, uint32_t id, uint64_t bytes,
                      uint32_t kind, char *err, size_t err_len) {
  if (id < t->n_tensors) {
    if (t->t_bytes[id] == bytes && t->t_kind[id] == kind)
      return 0; /* the same declaration again (a later iteration) */
    snprintf(err, err_len,
             "tensor %" PRIu32 " redeclared as %" PRIu64
             " bytes kind %u (was %" PRIu64 " bytes kind %u)",
             id, bytes, kind, t->t_bytes[id], (unsigned)t->t_kind[id]);
    return CAP_EPROTO;
  }
  if (id != t->n_tensors) {
    snprintf(err, err_len,
             "tensor id %" PRIu32 " declared out of order (next id is %" PRIu32
             ")",
             id, t->n_tensors);
    return CAP_EPROTO;
  }
  if (t->n_tensors >= t->lim.max_tensors) {
    snprintf(err, err_len, "more than %" PRIu32 " tensors (session quota)",
             t->lim.max_tensors);
    return CAP_EQUOTA;
  }
  if (t->n_tensors == t->cap_tensors) {
    uint32_t nc = t->cap_tensors ? t->cap_tensors * 2 : 256;
    uint64_t *nb = realloc(t->t_bytes, nc * sizeof *nb);
    if (!nb)
      return CAP_ENOMEM;
    t->t_bytes = nb;
    uint8_t *nk = realloc(t->t_kind, nc);
    if (!nk)
      return CAP_ENOMEM;
    t->t_kind = nk;
    t->cap_tensors = nc;
  }
  t->t_bytes[t->n_tensors] = bytes;
  t->t_kind[t->n_tensors] = (uint8_t)kind;
  t->n_tensors++;
  return 0;
}

int cap__tracker_begin(cap__tracker_t *t, uint64_t iteration, char *err,
                       size_t err_len) {
  if (iteration != 0 && iteration <= t->last_ended) {
    snprintf(err, err_len,
             "records for iteration %" PRIu64 " after iteration %" PRIu64
             " ended",
             iteration, t->last_ended);
    return CAP_EPROTO;
  }
  if (t->active) {
    if (iteration == 0)
      return 0;
    if (t->iter_known && iteration != t->iteration) {
      snprintf(err, err_len,
               "records for iteration %" PRIu64 " while iteration %" PRIu64
               " is in progress",
               iteration, t->iteration);
      return CAP_EPROTO;
    }
  }
  t->active = true;
  if (iteration != 0) {
    t->iteration = iteration;
    t->iter_known = true;
  }
  return 0;
}

static uint32_t name_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* Index of name in rec.names, adding it when new. A new name counts against
 * the session's name quota: names are the one record whose size the client
 * chooses, so without it one op could carry megabytes of them. */
static int intern(cap__tracker_t *t, const char *name, uint32_t *out,
                  char *err, size_t err_len) {
  if (t->rec.n_names * 2 >= t->n_slots) {
    uint32_t ns = t->n_slots ? t->n_slots * 2 : 256;
    uint32_t *slots = calloc(ns, sizeof *slots);
    if (!slots)
      return CAP_ENOMEM;
    for (uint32_t i = 0; i < t->rec.n_names; i++) {
      uint32_t h = name_hash(t->rec.names[i]) & (ns - 1);
      while (slots[h])
        h = (h + 1) & (ns - 1);
      slots[h] = i + 1;
    }
    free(t->name_slots);
    t->name_slots = slots;
    t->n_slots = ns;
  }
  uint32_t h = name_hash(name) & (t->n_slots - 1);
  while (t->name_slots[h]) {
    uint32_t idx = t->name_slots[h] - 1;
    if (strcmp(t->rec.names[idx], name) == 0) {
      *out = idx;
      return 0;
    }
    h = (h + 1) & (t->n_slots - 1);
  }
  size_t len = strlen(name) + 1;
  if (t->rec.n_names >= t->lim.max_names ||
      t->name_bytes + len > t->lim.max_name_bytes) {
    snprintf(err, err_len,
             "iteration %" PRIu64 ": more than %" PRIu32
             " distinct op names or %" PRIu64 " bytes of them (session quota)",
             t->iteration, t->lim.max_names, t->lim.max_name_bytes);
    return CAP_EQUOTA;
  }
  GROW(t->rec.names, t->rec.n_names, t->rec.cap_names, t->rec.n_names + 1,
       char *);
  char *copy = malloc(len);
  if (!copy)
    return CAP_ENOMEM;
  memcpy(copy, name, len);
  t->name_bytes += len;
  t->rec.names[t->rec.n_names] = copy;
  t->name_slots[h] = ++t->rec.n_names;
  *out = t->rec.n_names - 1;
  return 0;
}

static int add_op(cap__tracker_t *t, uint32_t seq, int64_t start_ns,
                  int64_t end_ns, uint32_t name, const uint32_t *in,
                  uint32_t n_in, const uint32_t *out, uint32_t n_out,
                  char *err, size_t err_len) {
  cap__iter_records_t *r = &t->rec;
  if (seq != r->n_ops) {
    snprintf(err, err_len, "op seq %" PRIu32 " out of order (expected %" PRIu32
             ")", seq, r->n_ops);
    return CAP_EPROTO;
  }
  if (r->n_ops >= t->lim.max_ops) {
    snprintf(err, err_len,
             "iteration %" PRIu64 ": more than %" PRIu32
             " ops (session quota)",
             t->iteration, t->lim.max_ops);
    return CAP_EQUOTA;
  }
  uint64_t n = (uint64_t)n_in + n_out;
  if (r->n_op_tensors + n > t->lim.max_accesses) {
    snprintf(err, err_len,
             "iteration %" PRIu64 ": more than %" PRIu64
             " accesses (session quota)",
             t->iteration, t->lim.max_accesses);
    return CAP_EQUOTA;
  }
  if (start_ns < t->last_start_ns) {
    snprintf(err, err_len,
             "op %" PRIu32 ": start_ns %" PRId64
             " before the previous op's %" PRId64,
             seq, start_ns, t->last_start_ns);
    return CAP_EPROTO;
  }
  if (end_ns < start_ns) {
    snprintf(err, err_len, "op %" PRIu32 ": end_ns %" PRId64
             " before start_ns %" PRId64, seq, end_ns, start_ns);
    return CAP_ERANGE;
  }
  uint32_t nt = t->n_tensors;
  for (uint32_t i = 0; i < n_in; i++)
    if (in[i] >= nt) {
      snprintf(err, err_len,
               "op %" PRIu32 ": unknown tensor id %" PRIu32 " (%" PRIu32
               " declared)",
               seq, in[i], nt);
      return CAP_ERANGE;
    }
  for (uint32_t i = 0; i < n_out; i++)
    if (out[i] >= nt) {
      snprintf(err, err_len,
               "op %" PRIu32 ": unknown tensor id %" PRIu32 " (%" PRIu32
               " declared)",
               seq, out[i], nt);
      return CAP_ERANGE;
    }
  GROW(r->ops, r->n_ops, r->cap_ops, r->n_ops + 1, cap__tracker_op_t);
  GROW(r->op_tensors, r->n_op_tensors, r->cap_op_tensors, r->n_op_tensors + n,
       uint32_t);
  cap__tracker_op_t *op = &r->ops[r->n_ops++];
  op->start_ns = start_ns;
  op->end_ns = end_ns;
  op->name = name;
  op->ten_off = (uint32_t)r->n_op_tensors;
  op->n_in = n_in;
  op->n_out = n_out;
  if (n_in)
    memcpy(r->op_tensors + r->n_op_tensors, in, n_in * sizeof *in);
  if (n_out)
    memcpy(r->op_tensors + r->n_op_tensors + n_in, out, n_out * sizeof *out);
  r->n_op_tensors += n;
  t->last_start_ns = start_ns;
  return 0;
}

int cap__tracker_op(cap__tracker_t *t, const cap_proto_op_view_t *op,
                    char *err, size_t err_len) {
  uint32_t name;
  int rc = cap__tracker_begin(t, 0, err, err_len);
  if (rc)
    return rc;
  if ((rc = intern(t, op->name, &name, err, err_len)) != 0)
    return rc;
  return add_op(t, op->seq, op->start_ns, op->end_ns, name, op->in, op->n_in,
                op->out, op->n_out, err, err_len);
}

int cap__tracker_free(cap__tracker_t *t, int64_t t_ns, uint32_t tensor,
                      char *err, size_t err_len) {
  int rc = cap__tracker_begin(t, 0, err, err_len);
  if (rc)
    return rc;
  if (tensor >= t->n_tensors) {
    snprintf(err, err_len, "free: unknown tensor id %" PRIu32 " (%" PRIu32
             " declared)", tensor, t->n_tensors);
    return CAP_ERANGE;
  }
  cap__iter_records_t *r = &t->rec;
  if (r->n_frees >= t->lim.max_tensors) {
    snprintf(err, err_len, "iteration %" PRIu64 ": more than %" PRIu32
             " frees (session quota)", t->iteration, t->lim.max_tensors);
    return CAP_EQUOTA;
  }
  GROW(r->frees, r->n_frees, r->cap_frees, r->n_frees + 1, cap_free_t);
  r->frees[r->n_frees].t_ns = t_ns;
  r->frees[r->n_frees].tensor = tensor;
  r->n_frees++;
  return 0;
}

/* Declared tensor id may not be evicted by plans made from this iteration. */
static int no_evict(cap__tracker_t *t, uint32_t id, char *err, size_t err_len) {
  cap__iter_records_t *r = &t->rec;
  if (id >= t->n_tensors) {
    snprintf(err, err_len, "no_evict: tensor %" PRIu32 " not declared (%" PRIu32
             " declared)", id, t->n_tensors);
    return CAP_EPROTO;
  }
  /* A client sends each id once per iteration; more is a misbehaving one. */
  if (r->n_no_evict >= t->lim.max_tensors) {
    snprintf(err, err_len, "iteration %" PRIu64 ": more than %" PRIu32
             " no_evict marks (session quota)", t->iteration, t->lim.max_tensors);
    return CAP_EQUOTA;
  }
  GROW(r->no_evict, r->n_no_evict, r->cap_no_evict, r->n_no_evict + 1,
       uint32_t);
  r->no_evict[r->n_no_evict++] = id;
  return 0;
}

int cap__tracker_batch(cap__tracker_t *t, const Capuchin__AccessBatch *b,
                       uint64_t *accesses, char *err, size_t err_len) {
  int rc = 0;
  uint32_t *name_map = NULL;
  /* Declarations first, as the protocol orders them. */
  for (size_t i = 0; i < b->n_decl_id; i++)
    if ((rc = cap__tracker_decl(t, b->decl_id[i], b->decl_bytes[i],
                                (uint32_t)b->decl_kind[i], err, err_len)))
      return rc;
  if ((rc = cap__tracker_begin(t, b->iteration, err, err_len)) != 0)
    return rc;
  for (size_t i = 0; i < b->n_no_evict; i++)
    if ((rc = no_evict(t, b->no_evict[i], err, err_len)))
      return rc;
  uint64_t before = t->rec.n_op_tensors;
  for (size_t i = 0; i < b->n_ops; i++) {
    const Capuchin__OpRecord *o = b->ops[i];
    uint32_t name;
    if ((rc = intern(t, o->name, &name, err, err_len)) != 0)
      goto out;
    if ((rc = add_op(t, o->seq, o->start_ns, o->end_ns, name, o->inputs,
                     (uint32_t)o->n_inputs, o->outputs, (uint32_t)o->n_outputs,
                     err, err_len)))
      goto out;
  }
  if (b->n_op_seq) {
    /* Each batch name is interned once, not once per op, and only when an
     * op uses it: names in the table that no op names cost nothing. */
    name_map = malloc((b->n_names ? b->n_names : 1) * sizeof *name_map);
    if (!name_map) {
      rc = CAP_ENOMEM;
      goto out;
    }
    for (size_t i = 0; i < b->n_names; i++)
      name_map[i] = UINT32_MAX;
    size_t off = 0;
    for (size_t i = 0; i < b->n_op_seq; i++) {
      uint32_t n_in = b->op_n_in[i], n_out = b->op_n_out[i];
      uint32_t *name = &name_map[b->op_name[i]]; /* index validated */
      if (*name == UINT32_MAX &&
          (rc = intern(t, b->names[b->op_name[i]], name, err, err_len)) != 0)
        goto out;
      /* A batch whose ops name no tensor has no tensors array at all:
       * NULL + 0 is undefined behaviour (UBSan aborts on it). */
      const uint32_t *ten = b->tensors ? b->tensors + off : NULL;
      if ((rc = add_op(t, b->op_seq[i], b->op_start_ns[i], b->op_end_ns[i],
                       *name, ten, n_in, ten ? ten + n_in : NULL, n_out, err,
                       err_len)))
        goto out;
      off += (size_t)n_in + n_out;
    }
  }
  for (size_t i = 0; i < b->n_free_t_ns; i++)
    if ((rc = cap__tracker_free(t, b->free_t_ns[i], b->free_tensor[i], err,
                                err_len)))
      goto out;
  if (b->has_dropped)
    t->dropped += b->dropped;
out:
  free(name_map);
  if (accesses)
    *accesses = t->rec.n_op_tensors - before;
  return rc;
}

int cap__tracker_end(cap__tracker_t *t, uint64_t iteration,
                     cap__iter_records_t *out, char *err, size_t err_len) {
  int rc = cap__tracker_begin(t, iteration, err, err_len);
  if (rc)
    return rc;
  memset(out, 0, sizeof *out);
  if (t->rec.n_ops) {
    /* Hand the records over and snapshot the declarations. */
    *out = t->rec;
    memset(&t->rec, 0, sizeof t->rec);
    out->n_tensors = t->n_tensors;
    out->t_bytes = malloc((t->n_tensors ? t->n_tensors : 1) * sizeof(uint64_t));
    out->t_kind = malloc(t->n_tensors ? t->n_tensors : 1);
    if (!out->t_bytes || !out->t_kind) {
      cap__iter_records_free(out);
      reset_iteration(t);
      t->last_ended = iteration;
      return CAP_ENOMEM;
    }
    if (t->n_tensors) { /* ops may name no tensor: nothing declared yet */
      memcpy(out->t_bytes, t->t_bytes, t->n_tensors * sizeof(uint64_t));
      memcpy(out->t_kind, t->t_kind, t->n_tensors);
    }
  }
  reset_iteration(t);
  t->last_ended = iteration;
  return 0;
}

static int cmp_free(const void *a, const void *b) {
  const cap_free_t *x = a, *y = b;
  if (x->t_ns != y->t_ns)
    return x->t_ns < y->t_ns ? -1 : 1;
  return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

int cap__iter_records_build(cap__iter_records_t *r, const char *const *meta,
                            cap_profile_t **out, char *err, size_t err_len) {
  *out = NULL;
  cap_profile_t *p = cap_profile_create();
  if (!p)
    return CAP_ENOMEM;
  int rc = 0;
  for (uint32_t i = 0; i < r->n_tensors; i++)
    if ((rc = cap_profile_add_tensor(p, i, r->t_bytes[i],
                                     (cap_tensor_kind_t)r->t_kind[i])))
      goto out_error;
  for (uint32_t i = 0; i < r->n_no_evict; i++)
    if ((rc = cap_profile_set_no_evict(p, r->no_evict[i])))
      goto out_error;
  for (uint32_t i = 0; i < r->n_ops; i++) {
    const cap__tracker_op_t *o = &r->ops[i];
    const uint32_t *ten = r->op_tensors + o->ten_off;
    if ((rc = cap_profile_add_op(p, i, o->start_ns, o->end_ns,
                                 r->names[o->name], ten, o->n_in,
                                 ten + o->n_in, o->n_out)))
      goto out_error;
  }
  if (r->n_frees > 1) /* an iteration may free nothing: frees is NULL */
    qsort(r->frees, r->n_frees, sizeof *r->frees, cmp_free);
  for (uint32_t i = 0; i < r->n_frees; i++)
    if ((rc = cap_profile_add_free(p, r->frees[i].t_ns, r->frees[i].tensor)))
      goto out_error;
  for (uint32_t i = 0; meta && meta[i] && meta[i + 1]; i += 2)
    if ((rc = cap_profile_set_meta(p, meta[i], meta[i + 1])))
      goto out_error;
  if ((rc = cap_profile_finish(p)))
    goto out_error;
  *out = p;
  return 0;
out_error:
  snprintf(err, err_len, "measured iteration: %s", cap_profile_error(p));
  cap_profile_destroy(p);
  return rc;
}
