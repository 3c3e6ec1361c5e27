/*
 * AccessBatch in its compact column form: a builder for the sender (the
 * client's reporter thread appends records and flushes frames) and an
 * iterator for the receiver (the daemon's tracker walks the ops in place).
 * Column arrays are packed varints on the wire, so a whole iteration costs a
 * few bytes per access and no allocation per record on either side.
 */
#include <stdlib.h>
#include <string.h>

#include "capuchin/proto.h"
#include "proto_internal.h"

#define TENSOR_LIMIT (1u << 31)
#define NAME_MAX_LEN 4096 /* cap_frame_limits_init()'s max_name_len */
#define OP_TENSORS_MAX 65536 /* ... and max_op_tensors */

struct cap_proto_batch {
  uint64_t iteration;
  uint64_t dropped;

  size_t n_ops, cap_ops;
  uint32_t *op_seq;
  int64_t *op_start_ns;
  int64_t *op_end_ns;
  uint32_t *op_name;
  uint32_t *op_n_in;
  uint32_t *op_n_out;

  size_t n_tensors, cap_tensors;
  uint32_t *tensors;

  size_t n_decls, cap_decls;
  uint32_t *decl_id;
  uint64_t *decl_bytes;
  Capuchin__TensorKind *decl_kind;

  size_t n_frees, cap_frees;
  int64_t *free_t_ns;
  uint32_t *free_tensor;

  size_t n_no_evict, cap_no_evict;
  uint32_t *no_evict;

  /* Per-batch name table and its index (open addressing, index + 1 per
   * slot, 0 = empty, at most half full). */
  size_t n_names, cap_names;
  char **names;
  uint32_t *slots;
  size_t n_slots;

  size_t bytes; /* upper bound of the packed payload */
};

/* Varint bounds used for the size estimate. */
#define V32 5u
#define V64 10u
/* Per packed column: tag + length prefix. */
#define COLUMN_OVERHEAD (2u + V64)

cap_proto_batch_t *cap_proto_batch_create(void) {
  cap_proto_batch_t *b = calloc(1, sizeof *b);
  if (!b)
    return NULL;
  cap_proto_batch_reset(b, 0);
  return b;
}

static void free_names(cap_proto_batch_t *b) {
  for (size_t i = 0; i < b->n_names; i++)
    free(b->names[i]);
  b->n_names = 0;
  if (b->slots)
    memset(b->slots, 0, b->n_slots * sizeof *b->slots);
}

void cap_proto_batch_destroy(cap_proto_batch_t *b) {
  if (!b)
    return;
  free_names(b);
  free(b->names);
  free(b->slots);
  free(b->op_seq);
  free(b->op_start_ns);
  free(b->op_end_ns);
  free(b->op_name);
  free(b->op_n_in);
  free(b->op_n_out);
  free(b->tensors);
  free(b->decl_id);
  free(b->decl_bytes);
  free(b->decl_kind);
  free(b->free_t_ns);
  free(b->free_tensor);
  free(b->no_evict);
  free(b);
}

void cap_proto_batch_reset(cap_proto_batch_t *b, uint64_t iteration) {
  free_names(b);
  b->iteration = iteration;
  b->dropped = 0;
  b->n_ops = b->n_tensors = b->n_decls = b->n_frees = b->n_no_evict = 0;
  /* Envelope tag + length, iteration, dropped, and every column's prefix. */
  b->bytes = 1 + V32 + 2 * (1 + V64) + 16 * COLUMN_OVERHEAD;
}

/* Grow each of the nptr arrays (element sizes in sizes[]) from *cap to hold
 * need entries. On failure nothing is lost: arrays already grown keep their
 * old contents and the caller's count is unchanged. */
static int grow(size_t *cap, size_t need, void **ptrs[], const size_t sizes[],
                int nptr) {
  if (need <= *cap)
    return 0;
  size_t ncap = *cap ? *cap : 256;
  while (ncap < need) {
    if (ncap > SIZE_MAX / 16)
      return CAP_ENOMEM;
    ncap *= 2;
  }
  for (int i = 0; i < nptr; i++) {
    void *p = realloc(*ptrs[i], ncap * sizes[i]);
    if (!p)
      return CAP_ENOMEM;
    *ptrs[i] = p;
  }
  *cap = ncap;
  return 0;
}

static uint64_t hash_name(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 1099511628211ull;
  }
  return h;
}

static int rehash(cap_proto_batch_t *b, size_t nslots) {
  uint32_t *slots = calloc(nslots, sizeof *slots);
  if (!slots)
    return CAP_ENOMEM;
  for (size_t i = 0; i < b->n_names; i++) {
    size_t j = hash_name(b->names[i], strlen(b->names[i])) & (nslots - 1);
    while (slots[j])
      j = (j + 1) & (nslots - 1);
    slots[j] = (uint32_t)i + 1;
  }
  free(b->slots);
  b->slots = slots;
  b->n_slots = nslots;
  return 0;
}

/* Index of name in the batch's table, adding it if new. */
static int intern(cap_proto_batch_t *b, const char *name, size_t len,
                  uint32_t *idx) {
  if (b->n_slots == 0 || 2 * (b->n_names + 1) > b->n_slots) {
    int rc = rehash(b, b->n_slots ? 2 * b->n_slots : 256);
    if (rc < 0)
      return rc;
  }
  size_t j = hash_name(name, len) & (b->n_slots - 1);
  while (b->slots[j]) {
    const char *s = b->names[b->slots[j] - 1];
    if (strncmp(s, name, len) == 0 && s[len] == '\0') {
      *idx = b->slots[j] - 1;
      return 0;
    }
    j = (j + 1) & (b->n_slots - 1);
  }
  if (b->n_names == b->cap_names) {
    size_t ncap = b->cap_names ? 2 * b->cap_names : 64;
    char **nn = realloc(b->names, ncap * sizeof *nn);
    if (!nn)
      return CAP_ENOMEM;
    b->names = nn;
    b->cap_names = ncap;
  }
  char *copy = malloc(len + 1);
  if (!copy)
    return CAP_ENOMEM;
  memcpy(copy, name, len);
  copy[len] = '\0';
  b->names[b->n_names] = copy;
  *idx = (uint32_t)b->n_names++;
  b->slots[j] = *idx + 1;
  b->bytes += 1 + V32 + len;
  return 0;
}

int cap_proto_batch_add_decl(cap_proto_batch_t *b, uint32_t id, uint64_t bytes,
                             cap_tensor_kind_t kind) {
  if (id >= TENSOR_LIMIT)
    return CAP_ERANGE;
  if (kind != CAP_KIND_PARAM && kind != CAP_KIND_INPUT &&
      kind != CAP_KIND_ACTIVATION)
    return CAP_EINVAL;
  void **ptrs[] = {(void **)&b->decl_id, (void **)&b->decl_bytes,
                   (void **)&b->decl_kind};
  const size_t sizes[] = {sizeof *b->decl_id, sizeof *b->decl_bytes,
                          sizeof *b->decl_kind};
  int rc = grow(&b->cap_decls, b->n_decls + 1, ptrs, sizes, 3);
  if (rc < 0)
    return rc;
  b->decl_id[b->n_decls] = id;
  b->decl_bytes[b->n_decls] = bytes;
  b->decl_kind[b->n_decls] = (Capuchin__TensorKind)kind;
  b->n_decls++;
  b->bytes += V32 + V64 + 1;
  return 0;
}

int cap_proto_batch_add_op(cap_proto_batch_t *b, uint32_t seq,
                           int64_t start_ns, int64_t end_ns, const char *name,
                           const uint32_t *in, uint32_t n_in,
                           const uint32_t *out, uint32_t n_out) {
  if (seq >= TENSOR_LIMIT || start_ns < 0 || end_ns < start_ns)
    return CAP_ERANGE;
  if (!name || (n_in && !in) || (n_out && !out))
    return CAP_EINVAL;
  size_t len = strnlen(name, NAME_MAX_LEN + 1);
  if (len == 0 || len > NAME_MAX_LEN)
    return CAP_EINVAL;
  if (n_in > OP_TENSORS_MAX || n_out > OP_TENSORS_MAX - n_in)
    return CAP_ERANGE;
  for (uint32_t i = 0; i < n_in; i++)
    if (in[i] >= TENSOR_LIMIT)
      return CAP_ERANGE;
  for (uint32_t i = 0; i < n_out; i++)
    if (out[i] >= TENSOR_LIMIT)
      return CAP_ERANGE;

  void **optrs[] = {(void **)&b->op_seq,  (void **)&b->op_start_ns,
                    (void **)&b->op_end_ns, (void **)&b->op_name,
                    (void **)&b->op_n_in, (void **)&b->op_n_out};
  const size_t osizes[] = {sizeof(uint32_t), sizeof(int64_t), sizeof(int64_t),
                           sizeof(uint32_t), sizeof(uint32_t), sizeof(uint32_t)};
  int rc = grow(&b->cap_ops, b->n_ops + 1, optrs, osizes, 6);
  if (rc < 0)
    return rc;
  void **tptrs[] = {(void **)&b->tensors};
  const size_t tsizes[] = {sizeof(uint32_t)};
  rc = grow(&b->cap_tensors, b->n_tensors + n_in + n_out, tptrs, tsizes, 1);
  if (rc < 0)
    return rc;
  uint32_t idx;
  rc = intern(b, name, len, &idx);
  if (rc < 0)
    return rc;

  size_t i = b->n_ops++;
  b->op_seq[i] = seq;
  b->op_start_ns[i] = start_ns;
  b->op_end_ns[i] = end_ns;
  b->op_name[i] = idx;
  b->op_n_in[i] = n_in;
  b->op_n_out[i] = n_out;
  if (n_in)
    memcpy(b->tensors + b->n_tensors, in, n_in * sizeof *in);
  b->n_tensors += n_in;
  if (n_out)
    memcpy(b->tensors + b->n_tensors, out, n_out * sizeof *out);
  b->n_tensors += n_out;
  b->bytes += 4 * V32 + 2 * V64 + (size_t)(n_in + n_out) * V32;
  return 0;
}

int cap_proto_batch_add_free(cap_proto_batch_t *b, int64_t t_ns,
                             uint32_t tensor) {
  if (t_ns < 0 || tensor >= TENSOR_LIMIT)
    return CAP_ERANGE;
  void **ptrs[] = {(void **)&b->free_t_ns, (void **)&b->free_tensor};
  const size_t sizes[] = {sizeof *b->free_t_ns, sizeof *b->free_tensor};
  int rc = grow(&b->cap_frees, b->n_frees + 1, ptrs, sizes, 2);
  if (rc < 0)
    return rc;
  b->free_t_ns[b->n_frees] = t_ns;
  b->free_tensor[b->n_frees] = tensor;
  b->n_frees++;
  b->bytes += V64 + V32;
  return 0;
}

int cap_proto_batch_add_no_evict(cap_proto_batch_t *b, uint32_t tensor) {
  if (tensor >= TENSOR_LIMIT)
    return CAP_ERANGE;
  void **ptrs[] = {(void **)&b->no_evict};
  const size_t sizes[] = {sizeof *b->no_evict};
  int rc = grow(&b->cap_no_evict, b->n_no_evict + 1, ptrs, sizes, 1);
  if (rc < 0)
    return rc;
  b->no_evict[b->n_no_evict++] = tensor;
  b->bytes += V32;
  return 0;
}

void cap_proto_batch_set_dropped(cap_proto_batch_t *b, uint64_t dropped) {
  b->dropped = dropped;
}

size_t cap_proto_batch_records(const cap_proto_batch_t *b) {
  return b->n_decls + b->n_ops + b->n_frees + b->n_no_evict;
}

size_t cap_proto_batch_bytes(const cap_proto_batch_t *b) { return b->bytes; }

int cap_proto_batch_append_frame(const cap_proto_batch_t *b,
                                 size_t max_frame_bytes, uint8_t **buf,
                                 size_t *len, size_t *cap) {
  /* The message only borrows the builder's arrays for the encode. */
  Capuchin__AccessBatch m = CAPUCHIN__ACCESS_BATCH__INIT;
  m.has_iteration = 1;
  m.iteration = b->iteration;
  if (b->dropped) {
    m.has_dropped = 1;
    m.dropped = b->dropped;
  }
  m.n_names = b->n_names;
  m.names = b->names;
  m.n_op_seq = m.n_op_start_ns = m.n_op_end_ns = b->n_ops;
  m.n_op_name = m.n_op_n_in = m.n_op_n_out = b->n_ops;
  m.op_seq = b->op_seq;
  m.op_start_ns = b->op_start_ns;
  m.op_end_ns = b->op_end_ns;
  m.op_name = b->op_name;
  m.op_n_in = b->op_n_in;
  m.op_n_out = b->op_n_out;
  m.n_tensors = b->n_tensors;
  m.tensors = b->tensors;
  m.n_decl_id = m.n_decl_bytes = m.n_decl_kind = b->n_decls;
  m.decl_id = b->decl_id;
  m.decl_bytes = b->decl_bytes;
  m.decl_kind = b->decl_kind;
  m.n_free_t_ns = m.n_free_tensor = b->n_frees;
  m.free_t_ns = b->free_t_ns;
  m.free_tensor = b->free_tensor;
  m.n_no_evict = b->n_no_evict;
  m.no_evict = b->no_evict;
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  env.msg_case = CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH;
  env.access_batch = &m;
  return cap_frame_append(&env, max_frame_bytes, buf, len, cap);
}

/* --- Reader ------------------------------------------------------------------ */

void cap_proto_op_iter_init(cap_proto_op_iter_t *it,
                            const Capuchin__AccessBatch *batch) {
  it->batch = batch;
  it->next = 0;
  it->tensor_off = 0;
}

bool cap_proto_op_iter_next(cap_proto_op_iter_t *it, cap_proto_op_view_t *op) {
  const Capuchin__AccessBatch *b = it->batch;
  if (it->next < b->n_ops) {
    const Capuchin__OpRecord *r = b->ops[it->next++];
    op->seq = r->seq;
    op->start_ns = r->start_ns;
    op->end_ns = r->end_ns;
    op->name = r->name;
    op->in = r->inputs;
    op->n_in = (uint32_t)r->n_inputs;
    op->out = r->outputs;
    op->n_out = (uint32_t)r->n_outputs;
    return true;
  }
  size_t i = it->next - b->n_ops;
  if (i >= b->n_op_seq)
    return false;
  /* Validated batches always hold enough; stop rather than read past a
   * column if this one was not validated. */
  if (i >= b->n_op_start_ns || i >= b->n_op_end_ns || i >= b->n_op_name ||
      i >= b->n_op_n_in || i >= b->n_op_n_out || b->op_name[i] >= b->n_names ||
      it->tensor_off > b->n_tensors)
    return false;
  uint32_t n_in = b->op_n_in[i], n_out = b->op_n_out[i];
  if ((uint64_t)n_in + n_out > b->n_tensors - it->tensor_off)
    return false;
  it->next++;
  op->seq = b->op_seq[i];
  op->start_ns = b->op_start_ns[i];
  op->end_ns = b->op_end_ns[i];
  op->name = b->names[b->op_name[i]];
  op->in = b->tensors + it->tensor_off;
  op->n_in = n_in;
  op->out = b->tensors + it->tensor_off + n_in;
  op->n_out = n_out;
  it->tensor_off += (size_t)n_in + n_out;
  return true;
}
