/*
 * The profile: one measured training iteration (tensors, ops, accesses,
 * frees, meta). The trace reader (trace.h) and the daemon's tracker both
 * build it through the builder below, so every planner sees one model.
 *
 * Vocabulary (DESIGN.md): tensor ids are dense from 0 in creation order;
 * access k (1-based) of tensor T is the k-th op, in execution order, that
 * lists T as an input or an output (an op listing T on both sides is one
 * access). Times are integer nanoseconds from the iteration's start.
 */
#ifndef CAPUCHIN_PROFILE_H
#define CAPUCHIN_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CAP_NONE UINT32_MAX /* "no tensor / no op" in uint32_t id fields */

typedef enum {
  CAP_KIND_PARAM = 0,      /* weights, optimizer state: live all iteration */
  CAP_KIND_INPUT = 1,      /* the batch: live all iteration */
  CAP_KIND_ACTIVATION = 2, /* activations, gradients, temporaries */
} cap_tensor_kind_t;

typedef struct cap_tensor {
  uint64_t bytes;
  cap_tensor_kind_t kind;
  uint32_t producer_op; /* lineage: seq of the op whose output first created
                           the tensor; CAP_NONE for param/input/never-output */
  int64_t free_ns;      /* time of its `free` line; -1 when never freed */
  uint32_t access_off;  /* accesses: p->access_ops[access_off + k - 1] */
  uint32_t n_accesses;
} cap_tensor_t;

/* cap_op_t.flags */
#define CAP_OP_INPLACE 0x1u /* ATen name ends in '_' before the overload */
#define CAP_OP_VIEW 0x2u    /* lists a tensor on both sides without being in-place */

typedef struct cap_op {
  int64_t start_ns; /* reads its inputs here */
  int64_t end_ns;   /* writes its outputs here */
  const char *name; /* ATen operator name, owned by the profile */
  uint32_t in_off;  /* inputs: p->op_tensors[in_off .. in_off + n_in) */
  uint32_t n_in;
  uint32_t out_off; /* outputs: p->op_tensors[out_off .. out_off + n_out) */
  uint32_t n_out;
  uint32_t flags; /* CAP_OP_* */
} cap_op_t;

typedef struct cap_free {
  int64_t t_ns;
  uint32_t tensor;
} cap_free_t;

typedef struct cap_meta_kv {
  char *key;
  char *value;
} cap_meta_kv_t;

typedef struct cap_profile {
  cap_tensor_t *tensors; /* indexed by tensor id */
  uint32_t n_tensors;
  cap_op_t *ops; /* indexed by op seq, execution order */
  uint32_t n_ops;
  uint32_t *op_tensors; /* inputs and outputs of all ops, see cap_op_t */
  uint32_t n_op_tensors;
  uint32_t *access_ops; /* per-tensor access lists (op seqs, ascending) */
  uint32_t n_accesses;  /* total accesses over all tensors */
  cap_free_t *frees;    /* sorted by time */
  uint32_t n_frees;
  cap_meta_kv_t *meta; /* every meta key=value, in file order */
  uint32_t n_meta;

  /* Derived by cap_profile_finish(). */
  const char *model;         /* meta "model", or "" */
  uint64_t meta_peak_bytes;  /* meta "peak_bytes" (allocator peak), 0 if absent */
  uint64_t resident_bytes;   /* meta "resident_bytes", 0 if absent */
  int64_t iter_ns;           /* meta "iter_ns", else end of the last op */
  uint64_t persistent_bytes; /* bytes of param and input tensors */
  bool finished;

  void *impl; /* builder state, private */
} cap_profile_t;

/* --- Builder --------------------------------------------------------------
 * create, then add tensors (ids dense from 0, in order), ops (seqs dense from
 * 0, in order, times not going backwards), frees (sorted by time), meta in any
 * order, then finish. Each add checks its record against what came before and
 * returns CAP_EPARSE/CAP_ERANGE/CAP_ENOMEM with a message in
 * cap_profile_error(); finish checks the whole and derives access lists,
 * lineage and the meta fields above. Single-threaded. */
cap_profile_t *cap_profile_create(void);
void cap_profile_destroy(cap_profile_t *p); /* NULL is a no-op */
int cap_profile_set_meta(cap_profile_t *p, const char *key, const char *value);
int cap_profile_add_tensor(cap_profile_t *p, uint32_t id, uint64_t bytes,
                           cap_tensor_kind_t kind);
int cap_profile_add_op(cap_profile_t *p, uint32_t seq, int64_t start_ns,
                       int64_t end_ns, const char *name, const uint32_t *in,
                       uint32_t n_in, const uint32_t *out, uint32_t n_out);
int cap_profile_add_free(cap_profile_t *p, int64_t t_ns, uint32_t tensor);
int cap_profile_finish(cap_profile_t *p);
/* Message for the last failed builder call ("op 17: unknown tensor id 99999"). */
const char *cap_profile_error(const cap_profile_t *p);

/* --- Queries on a finished profile ---------------------------------------- */
static inline const uint32_t *cap_op_inputs(const cap_profile_t *p,
                                            const cap_op_t *op) {
  return p->op_tensors + op->in_off;
}
static inline const uint32_t *cap_op_outputs(const cap_profile_t *p,
                                             const cap_op_t *op) {
  return p->op_tensors + op->out_off;
}
/* Op seq of access k (1-based) of tensor t; CAP_NONE when out of range. */
uint32_t cap_profile_access_op(const cap_profile_t *p, uint32_t t, uint32_t k);
/* Which access of tensor t op seq is (1-based), 0 if op does not access t. */
uint32_t cap_profile_access_index(const cap_profile_t *p, uint32_t t,
                                  uint32_t op);
/* Bytes the model needs on top of persistent_bytes at its peak (activation
 * peak of the memory curve); the base for "N %" budgets. */
uint64_t cap_profile_transient_peak(const cap_profile_t *p);
/* Budget for "N %": persistent bytes + pct/100 of the transient peak. */
uint64_t cap_profile_budget_pct(const cap_profile_t *p, double pct);
/* Model signature: a 64-bit hash of op names, tensor sizes and kinds, and the
 * access pattern; equal for the same model and batch on any run. */
uint64_t cap_profile_signature(const cap_profile_t *p);
/* Number of tensors with more than one access. */
uint32_t cap_profile_multi_access_tensors(const cap_profile_t *p);

/* --- Memory curve ----------------------------------------------------------
 * Bytes live over the unmanaged iteration: persistent bytes plus every
 * activation from the start of its first access to its free. */
typedef struct cap_curve_point {
  int64_t t_ns;
  uint64_t bytes; /* live from t_ns until the next point */
} cap_curve_point_t;

typedef struct cap_curve {
  cap_curve_point_t *points;
  uint32_t n_points;
  uint64_t peak_bytes;
  int64_t peak_t_ns;
} cap_curve_t;

int cap_curve_compute(const cap_profile_t *p, cap_curve_t *out);
void cap_curve_close(cap_curve_t *c); /* frees points; safe on zeroed */

#endif /* CAPUCHIN_PROFILE_H */
