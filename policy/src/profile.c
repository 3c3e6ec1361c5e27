/*
 * The profile builder: validates each record as it arrives (the trace reader
 * and the daemon's tracker both feed it), then derives access lists, lineage
 * and the memory-curve peak at finish. Every check runs before any state
 * changes, so a rejected record leaves the profile as it was.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin/profile.h"

/* Per-tensor scratch kept only while building. */
typedef struct tstate {
  int64_t first_start_ns; /* start of its first access, -1 before it */
  int64_t last_end_ns;    /* end of its last access so far */
  uint32_t last_op;       /* last op that accessed it (dedupes one op) */
  uint32_t mark;          /* op seq whose inputs list it (both-sides test) */
} tstate_t;

/* Op names repeat (aten.view.default thousands of times): intern them in
 * chunks that never move, so cap_op_t.name stays valid while arrays grow. */
typedef struct chunk {
  struct chunk *next;
  size_t used, cap;
  char data[];
} chunk_t;

typedef struct impl {
  char err[512];
  uint32_t cap_tensors, cap_ops, cap_op_tensors, cap_frees, cap_meta;
  tstate_t *ts;
  uint32_t cap_ts;
  uint64_t total_bytes; /* every tensor, to bound sums */
  int64_t last_op_start_ns;
  int64_t last_free_ns;
  bool have_iter_ns;
  chunk_t *chunks;
  const char **names; /* intern table, open addressing */
  uint32_t names_cap, names_n;
} impl_t;

#define IMPL(p) ((impl_t *)(p)->impl)

static int fail(cap_profile_t *p, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(cap_profile_t *p, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(IMPL(p)->err, sizeof IMPL(p)->err, fmt, ap);
  va_end(ap);
  return code;
}

/* Grow *arr (elements of size elem) to hold at least need; caps and sizes
 * are uint32_t and need <= CAP_PROFILE_MAX_IDS, so doubling cannot wrap. */
static int grow(void **arr, uint32_t *cap, uint32_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  uint64_t ncap = *cap ? *cap : 16;
  while (ncap < need)
    ncap *= 2;
  if (ncap > UINT32_MAX)
    ncap = UINT32_MAX;
  if (ncap > SIZE_MAX / elem)
    return CAP_ENOMEM;
  void *n = realloc(*arr, (size_t)ncap * elem);
  if (!n)
    return CAP_ENOMEM;
  *arr = n;
  *cap = (uint32_t)ncap;
  return 0;
}

cap_profile_t *cap_profile_create(void) {
  cap_profile_t *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  impl_t *im = calloc(1, sizeof *im);
  if (!im) {
    free(p);
    return NULL;
  }
  im->last_op_start_ns = 0;
  im->last_free_ns = 0;
  p->impl = im;
  p->model = "";
  p->iter_ns = 0;
  return p;
}

static void free_scratch(impl_t *im) {
  free(im->ts);
  im->ts = NULL;
  im->cap_ts = 0;
  free(im->names);
  im->names = NULL;
  im->names_cap = im->names_n = 0;
}

void cap_profile_destroy(cap_profile_t *p) {
  if (!p)
    return;
  impl_t *im = IMPL(p);
  if (im) {
    free_scratch(im);
    chunk_t *c = im->chunks;
    while (c) {
      chunk_t *next = c->next;
      free(c);
      c = next;
    }
    free(im);
  }
  for (uint32_t i = 0; i < p->n_meta; i++) {
    free(p->meta[i].key);
    free(p->meta[i].value);
  }
  free(p->meta);
  free(p->tensors);
  free(p->ops);
  free(p->op_tensors);
  free(p->access_ops);
  free(p->frees);
  free(p);
}

const char *cap_profile_error(const cap_profile_t *p) {
  if (!p || !p->impl)
    return "no profile";
  return IMPL(p)->err;
}

static int check_open(cap_profile_t *p) {
  if (p->finished)
    return fail(p, CAP_ESTATE, "profile already finished");
  return 0;
}

/* Printable ASCII without spaces: what a trace field may hold. */
static bool is_token(const char *s, size_t *len_out) {
  size_t n = 0;
  for (; s[n]; n++) {
    unsigned char c = (unsigned char)s[n];
    if (c <= 0x20 || c >= 0x7f || n >= CAP_PROFILE_MAX_NAME)
      return false;
  }
  *len_out = n;
  return n > 0;
}

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

static char *pool_copy(impl_t *im, const char *s, size_t n) {
  chunk_t *c = im->chunks;
  if (!c || c->cap - c->used < n + 1) {
    size_t cap = n + 1 > 16384 ? n + 1 : 16384;
    chunk_t *nc = malloc(sizeof *nc + cap);
    if (!nc)
      return NULL;
    nc->next = im->chunks;
    nc->used = 0;
    nc->cap = cap;
    im->chunks = nc;
    c = nc;
  }
  char *d = c->data + c->used;
  memcpy(d, s, n);
  d[n] = '\0';
  c->used += n + 1;
  return d;
}

static const char *intern(impl_t *im, const char *s, size_t n) {
  if ((uint64_t)(im->names_n + 1) * 2 > im->names_cap) {
    uint32_t ncap = im->names_cap ? im->names_cap * 2 : 256;
    const char **nt = calloc(ncap, sizeof *nt);
    if (!nt)
      return NULL;
    for (uint32_t i = 0; i < im->names_cap; i++) {
      const char *e = im->names[i];
      if (!e)
        continue;
      uint32_t j = (uint32_t)fnv1a(e, strlen(e)) & (ncap - 1);
      while (nt[j])
        j = (j + 1) & (ncap - 1);
      nt[j] = e;
    }
    free(im->names);
    im->names = nt;
    im->names_cap = ncap;
  }
  uint32_t j = (uint32_t)fnv1a(s, n) & (im->names_cap - 1);
  while (im->names[j]) {
    if (strcmp(im->names[j], s) == 0)
      return im->names[j];
    j = (j + 1) & (im->names_cap - 1);
  }
  const char *d = pool_copy(im, s, n);
  if (!d)
    return NULL;
  im->names[j] = d;
  im->names_n++;
  return d;
}

/* Strict unsigned decimal; false on anything else or overflow. */
static bool parse_u64(const char *s, uint64_t *out) {
  if (!*s)
    return false;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9')
      return false;
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

static const char *const numeric_keys[] = {"peak_bytes", "resident_bytes",
                                           "iter_ns", "plain_iter_ns",
                                           "batch"};

int cap_profile_set_meta(cap_profile_t *p, const char *key, const char *value) {
  if (!p || !key || !value)
    return CAP_EINVAL;
  int rc = check_open(p);
  if (rc)
    return rc;
  impl_t *im = IMPL(p);
  size_t klen, vlen;
  if (!is_token(key, &klen))
    return fail(p, CAP_EPARSE, "meta: bad key (need 1-%d printable bytes)",
                CAP_PROFILE_MAX_NAME);
  for (size_t i = 0; i < klen; i++) {
    char c = key[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
      return fail(p, CAP_EPARSE, "meta: bad character in key '%s'", key);
  }
  if (!is_token(value, &vlen))
    return fail(p, CAP_EPARSE,
                "meta %s: bad value (need 1-%d printable bytes, no spaces)",
                key, CAP_PROFILE_MAX_NAME);
  if (cap_profile_meta(p, key))
    return fail(p, CAP_EPARSE, "meta %s: duplicate key", key);
  if (p->n_meta >= CAP_PROFILE_MAX_META)
    return fail(p, CAP_ERANGE, "meta %s: more than %d meta entries", key,
                CAP_PROFILE_MAX_META);
  uint64_t num = 0;
  bool numeric = false;
  for (size_t i = 0; i < sizeof numeric_keys / sizeof *numeric_keys; i++) {
    if (strcmp(key, numeric_keys[i]) == 0) {
      numeric = true;
      if (!parse_u64(value, &num) || num >= (uint64_t)CAP_PROFILE_MAX_NS)
        return fail(p, CAP_ERANGE,
                    "meta %s: '%s' is not a decimal integer below 2^62", key,
                    value);
    }
  }
  if (grow((void **)&p->meta, &im->cap_meta, p->n_meta + 1, sizeof *p->meta))
    return fail(p, CAP_ENOMEM, "meta %s: out of memory", key);
  char *k = malloc(klen + 1), *v = malloc(vlen + 1);
  if (!k || !v) {
    free(k);
    free(v);
    return fail(p, CAP_ENOMEM, "meta %s: out of memory", key);
  }
  memcpy(k, key, klen + 1);
  memcpy(v, value, vlen + 1);
  p->meta[p->n_meta].key = k;
  p->meta[p->n_meta].value = v;
  p->n_meta++;
  if (numeric) {
    if (strcmp(key, "peak_bytes") == 0)
      p->meta_peak_bytes = num;
    else if (strcmp(key, "resident_bytes") == 0)
      p->resident_bytes = num;
    else if (strcmp(key, "iter_ns") == 0) {
      p->iter_ns = (int64_t)num;
      im->have_iter_ns = true;
    }
  }
  if (strcmp(key, "model") == 0)
    p->model = v;
  return 0;
}

const char *cap_profile_meta(const cap_profile_t *p, const char *key) {
  if (!p || !key)
    return NULL;
  for (uint32_t i = 0; i < p->n_meta; i++)
    if (strcmp(p->meta[i].key, key) == 0)
      return p->meta[i].value;
  return NULL;
}

static const char *kind_name(cap_tensor_kind_t k) {
  switch (k) {
  case CAP_KIND_PARAM:
    return "param";
  case CAP_KIND_INPUT:
    return "input";
  case CAP_KIND_ACTIVATION:
    return "activation";
  }
  return "?";
}

int cap_profile_add_tensor(cap_profile_t *p, uint32_t id, uint64_t bytes,
                           cap_tensor_kind_t kind) {
  if (!p)
    return CAP_EINVAL;
  int rc = check_open(p);
  if (rc)
    return rc;
  impl_t *im = IMPL(p);
  if (id < p->n_tensors)
    return fail(p, CAP_EPARSE, "tensor %" PRIu32 ": duplicate tensor id", id);
  if (id >= CAP_PROFILE_MAX_IDS)
    return fail(p, CAP_ERANGE, "tensor %" PRIu32 ": id beyond 2^31", id);
  if (id != p->n_tensors)
    return fail(p, CAP_EPARSE,
                "tensor %" PRIu32 ": ids must be dense, expected %" PRIu32, id,
                p->n_tensors);
  if ((unsigned)kind > CAP_KIND_ACTIVATION)
    return fail(p, CAP_EPARSE, "tensor %" PRIu32 ": unknown kind %d", id,
                (int)kind);
  if (bytes > CAP_PROFILE_MAX_TENSOR_BYTES)
    return fail(p, CAP_ERANGE,
                "tensor %" PRIu32 ": %" PRIu64 " bytes is beyond 2^48", id,
                bytes);
  /* 2^31 tensors of 2^48 bytes would overflow the sums the curve takes. */
  if (im->total_bytes + bytes > (uint64_t)CAP_PROFILE_MAX_NS)
    return fail(p, CAP_ERANGE,
                "tensor %" PRIu32 ": total tensor bytes beyond 2^62", id);
  if (grow((void **)&p->tensors, &im->cap_tensors, p->n_tensors + 1,
           sizeof *p->tensors))
    return fail(p, CAP_ENOMEM, "tensor %" PRIu32 ": out of memory", id);
  if (grow((void **)&im->ts, &im->cap_ts, p->n_tensors + 1, sizeof *im->ts))
    return fail(p, CAP_ENOMEM, "tensor %" PRIu32 ": out of memory", id);
  im->total_bytes += bytes;
  cap_tensor_t *t = &p->tensors[id];
  memset(t, 0, sizeof *t);
  t->bytes = bytes;
  t->kind = kind;
  t->producer_op = CAP_NONE;
  t->free_ns = -1;
  im->ts[id] = (tstate_t){.first_start_ns = -1, .last_end_ns = -1,
                          .last_op = CAP_NONE, .mark = CAP_NONE};
  p->n_tensors++;
  return 0;
}

int cap_profile_set_no_evict(cap_profile_t *p, uint32_t id) {
  if (!p)
    return CAP_EINVAL;
  int rc = check_open(p);
  if (rc)
    return rc;
  if (id >= p->n_tensors)
    return fail(p, CAP_EPARSE, "no_evict: unknown tensor id %" PRIu32, id);
  p->tensors[id].no_evict = true;
  return 0;
}

/* In-place by PyTorch's naming: the operator (between namespace and
 * overload) ends in '_' ("aten.add_.Tensor", "aten._foreach_add_.List");
 * dunders are in-place only as "__i*__" ("aten.__iand__.Tensor"). */
static bool name_is_inplace(const char *name) {
  const char *op = strchr(name, '.');
  op = op ? op + 1 : name;
  const char *end = strchr(op, '.');
  size_t n = end ? (size_t)(end - op) : strlen(op);
  if (n < 2 || op[n - 1] != '_')
    return false;
  if (n >= 4 && op[0] == '_' && op[1] == '_' && op[n - 2] == '_')
    return op[2] == 'i';
  return true;
}

static int check_op_tensors(cap_profile_t *p, uint32_t seq, const char *side,
                            const uint32_t *ids, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    uint32_t t = ids[i];
    if (t >= p->n_tensors)
      return fail(p, CAP_EPARSE, "op %" PRIu32 ": unknown tensor id %" PRIu32,
                  seq, t);
    if (p->tensors[t].free_ns >= 0)
      return fail(p, CAP_EPARSE,
                  "op %" PRIu32 ": %s tensor %" PRIu32
                  " was freed at %" PRId64 " ns",
                  seq, side, t, p->tensors[t].free_ns);
  }
  return 0;
}

int cap_profile_add_op(cap_profile_t *p, uint32_t seq, int64_t start_ns,
                       int64_t end_ns, const char *name, const uint32_t *in,
                       uint32_t n_in, const uint32_t *out, uint32_t n_out) {
  if (!p)
    return CAP_EINVAL;
  int rc = check_open(p);
  if (rc)
    return rc;
  impl_t *im = IMPL(p);
  if (seq < p->n_ops)
    return fail(p, CAP_EPARSE, "op %" PRIu32 ": duplicate op seq", seq);
  if (seq >= CAP_PROFILE_MAX_IDS)
    return fail(p, CAP_ERANGE, "op %" PRIu32 ": seq beyond 2^31", seq);
  if (seq != p->n_ops)
    return fail(p, CAP_EPARSE,
                "op %" PRIu32 ": seqs must be dense, expected %" PRIu32, seq,
                p->n_ops);
  size_t nlen;
  if (!name || !is_token(name, &nlen))
    return fail(p, CAP_EPARSE,
                "op %" PRIu32 ": bad name (need 1-%d printable bytes)", seq,
                CAP_PROFILE_MAX_NAME);
  if (start_ns < 0 || end_ns < 0)
    return fail(p, CAP_ERANGE, "op %" PRIu32 ": negative time", seq);
  if (start_ns >= CAP_PROFILE_MAX_NS || end_ns >= CAP_PROFILE_MAX_NS)
    return fail(p, CAP_ERANGE, "op %" PRIu32 ": time beyond 2^62 ns", seq);
  if (end_ns < start_ns)
    return fail(p, CAP_EPARSE,
                "op %" PRIu32 ": ends at %" PRId64 " before it starts at %" PRId64,
                seq, end_ns, start_ns);
  if (start_ns < im->last_op_start_ns)
    return fail(p, CAP_EPARSE,
                "op %" PRIu32 ": starts at %" PRId64
                ", before the previous op's start %" PRId64,
                seq, start_ns, im->last_op_start_ns);
  if ((n_in && !in) || (n_out && !out))
    return fail(p, CAP_EINVAL, "op %" PRIu32 ": NULL tensor list", seq);
  if ((uint64_t)n_in + n_out > CAP_PROFILE_MAX_OP_TENSORS)
    return fail(p, CAP_ERANGE, "op %" PRIu32 ": more than %u tensors", seq,
                (unsigned)CAP_PROFILE_MAX_OP_TENSORS);
  if ((uint64_t)p->n_op_tensors + n_in + n_out >= CAP_PROFILE_MAX_IDS)
    return fail(p, CAP_ERANGE, "op %" PRIu32 ": op tensor lists beyond 2^31",
                seq);
  if ((rc = check_op_tensors(p, seq, "input", in, n_in)) ||
      (rc = check_op_tensors(p, seq, "output", out, n_out)))
    return rc;
  if (grow((void **)&p->ops, &im->cap_ops, p->n_ops + 1, sizeof *p->ops) ||
      /* +1: op_tensors is never NULL once an op exists, so that
       * cap_op_inputs() never offsets a NULL pointer. */
      grow((void **)&p->op_tensors, &im->cap_op_tensors,
           p->n_op_tensors + n_in + n_out + 1, sizeof *p->op_tensors))
    return fail(p, CAP_ENOMEM, "op %" PRIu32 ": out of memory", seq);
  const char *iname = intern(im, name, nlen);
  if (!iname)
    return fail(p, CAP_ENOMEM, "op %" PRIu32 ": out of memory", seq);

  /* Validated: now record. Inputs first, so that an output that is also an
   * input (in-place or view) is seen as both-sides and not as created. */
  cap_op_t *op = &p->ops[seq];
  op->start_ns = start_ns;
  op->end_ns = end_ns;
  op->name = iname;
  op->in_off = p->n_op_tensors;
  op->n_in = n_in;
  op->out_off = p->n_op_tensors + n_in;
  op->n_out = n_out;
  op->flags = name_is_inplace(iname) ? CAP_OP_INPLACE : 0;
  if (n_in)
    memcpy(p->op_tensors + op->in_off, in, n_in * sizeof *in);
  if (n_out)
    memcpy(p->op_tensors + op->out_off, out, n_out * sizeof *out);
  p->n_op_tensors += n_in + n_out;
  bool both = false;
  for (uint32_t i = 0; i < n_in; i++) {
    tstate_t *s = &im->ts[in[i]];
    s->mark = seq;
    if (s->last_op != seq) {
      if (s->first_start_ns < 0)
        s->first_start_ns = start_ns;
      s->last_op = seq;
      p->tensors[in[i]].n_accesses++;
      p->n_accesses++;
    }
    s->last_end_ns = end_ns;
  }
  for (uint32_t i = 0; i < n_out; i++) {
    cap_tensor_t *t = &p->tensors[out[i]];
    tstate_t *s = &im->ts[out[i]];
    if (s->mark == seq)
      both = true;
    if (s->last_op != seq) {
      if (s->first_start_ns < 0) {
        s->first_start_ns = start_ns;
        if (t->kind == CAP_KIND_ACTIVATION)
          t->producer_op = seq;
      }
      s->last_op = seq;
      t->n_accesses++;
      p->n_accesses++;
    }
    s->last_end_ns = end_ns;
  }
  if (both && !(op->flags & CAP_OP_INPLACE))
    op->flags |= CAP_OP_VIEW;
  im->last_op_start_ns = start_ns;
  p->n_ops++;
  return 0;
}

int cap_profile_add_free(cap_profile_t *p, int64_t t_ns, uint32_t tensor) {
  if (!p)
    return CAP_EINVAL;
  int rc = check_open(p);
  if (rc)
    return rc;
  impl_t *im = IMPL(p);
  if (tensor >= p->n_tensors)
    return fail(p, CAP_EPARSE, "free: unknown tensor id %" PRIu32, tensor);
  const cap_tensor_t *t = &p->tensors[tensor];
  const tstate_t *s = &im->ts[tensor];
  if (t->kind != CAP_KIND_ACTIVATION)
    return fail(p, CAP_EPARSE,
                "free: tensor %" PRIu32 " is a %s, which is never freed",
                tensor, kind_name(t->kind));
  if (t->free_ns >= 0)
    return fail(p, CAP_EPARSE,
                "free: double free of tensor %" PRIu32
                " (first freed at %" PRId64 " ns)",
                tensor, t->free_ns);
  if (t_ns < 0)
    return fail(p, CAP_ERANGE, "free: tensor %" PRIu32 ": negative time",
                tensor);
  if (t_ns >= CAP_PROFILE_MAX_NS)
    return fail(p, CAP_ERANGE, "free: tensor %" PRIu32 ": time beyond 2^62 ns",
                tensor);
  if (t_ns < im->last_free_ns)
    return fail(p, CAP_EPARSE,
                "free: tensor %" PRIu32 " at %" PRId64
                " ns, before the previous free at %" PRId64 " ns",
                tensor, t_ns, im->last_free_ns);
  if (s->first_start_ns < 0)
    return fail(p, CAP_EPARSE,
                "free: tensor %" PRIu32 " is freed but no op accessed it",
                tensor);
  if (t_ns < s->last_end_ns)
    return fail(p, CAP_EPARSE,
                "free: tensor %" PRIu32 " at %" PRId64
                " ns, before its last access ends at %" PRId64 " ns",
                tensor, t_ns, s->last_end_ns);
  if (p->n_frees >= CAP_PROFILE_MAX_IDS)
    return fail(p, CAP_ERANGE, "free: more than 2^31 frees");
  if (grow((void **)&p->frees, &im->cap_frees, p->n_frees + 1,
           sizeof *p->frees))
    return fail(p, CAP_ENOMEM, "free: out of memory");
  p->frees[p->n_frees++] = (cap_free_t){.t_ns = t_ns, .tensor = tensor};
  p->tensors[tensor].free_ns = t_ns;
  im->last_free_ns = t_ns;
  return 0;
}

/* Bytes of the tensors on the device all along (cap_tensor_is_resident). */
static uint64_t resident_tensor_bytes(const cap_profile_t *p) {
  uint64_t sum = 0;
  for (uint32_t t = 0; t < p->n_tensors; t++)
    if (cap_tensor_is_resident(&p->tensors[t]))
      sum += p->tensors[t].bytes;
  return sum;
}

uint64_t cap_profile_untracked_bytes(const cap_profile_t *p) {
  uint64_t tracked = resident_tensor_bytes(p);
  return p->persistent_bytes > tracked ? p->persistent_bytes - tracked : 0;
}

int cap_profile_finish(cap_profile_t *p) {
  if (!p)
    return CAP_EINVAL;
  int rc = check_open(p);
  if (rc)
    return rc;
  impl_t *im = IMPL(p);
  if (p->n_ops == 0)
    return fail(p, CAP_EPARSE, "profile has no ops");
  int64_t last_end = 0;
  for (uint32_t i = 0; i < p->n_ops; i++)
    if (p->ops[i].end_ns > last_end)
      last_end = p->ops[i].end_ns;
  if (im->have_iter_ns && p->iter_ns < last_end)
    return fail(p, CAP_EPARSE,
                "meta iter_ns=%" PRId64
                " is before the last op ends at %" PRId64 " ns",
                p->iter_ns, last_end);

  uint32_t *acc = malloc((p->n_accesses ? p->n_accesses : 1) * sizeof *acc);
  if (!acc)
    return fail(p, CAP_ENOMEM, "finish: out of memory");
  uint32_t off = 0;
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    p->tensors[t].access_off = off;
    off += p->tensors[t].n_accesses;
    im->ts[t].last_op = CAP_NONE;
  }
  /* Fill in op order, so each list is ascending; n_accesses recounts. */
  for (uint32_t t = 0; t < p->n_tensors; t++)
    p->tensors[t].n_accesses = 0;
  for (uint32_t o = 0; o < p->n_ops; o++) {
    const cap_op_t *op = &p->ops[o];
    const uint32_t *ids = p->op_tensors + op->in_off; /* in then out */
    for (uint32_t i = 0; i < op->n_in + op->n_out; i++) {
      uint32_t t = ids[i];
      if (im->ts[t].last_op == o)
        continue;
      im->ts[t].last_op = o;
      cap_tensor_t *ct = &p->tensors[t];
      acc[ct->access_off + ct->n_accesses++] = o;
    }
  }
  free(p->access_ops);
  p->access_ops = acc;

  uint64_t resident = resident_tensor_bytes(p);
  p->persistent_bytes =
      p->resident_bytes > resident ? p->resident_bytes : resident;
  if (!im->have_iter_ns)
    p->iter_ns = last_end;

  p->finished = true; /* cap_curve_compute wants a finished profile */
  cap_curve_t c;
  rc = cap_curve_compute(p, &c);
  if (rc) {
    p->finished = false;
    return fail(p, rc, "finish: memory curve: %s",
                rc == CAP_ENOMEM ? "out of memory" : "failed");
  }
  p->peak_bytes = c.peak_bytes;
  p->peak_t_ns = c.peak_t_ns;
  cap_curve_close(&c);
  free_scratch(im);
  im->err[0] = '\0';
  return 0;
}

uint32_t cap_profile_access_op(const cap_profile_t *p, uint32_t t,
                               uint32_t k) {
  if (!p || !p->finished || t >= p->n_tensors || k == 0 ||
      k > p->tensors[t].n_accesses)
    return CAP_NONE;
  return p->access_ops[p->tensors[t].access_off + k - 1];
}

uint32_t cap_profile_accesses_before(const cap_profile_t *p, uint32_t t,
                                     uint32_t op) {
  if (!p || !p->finished || t >= p->n_tensors)
    return 0;
  const uint32_t *a = p->access_ops + p->tensors[t].access_off;
  uint32_t lo = 0, hi = p->tensors[t].n_accesses;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (a[mid] < op)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

uint32_t cap_profile_access_index(const cap_profile_t *p, uint32_t t,
                                  uint32_t op) {
  if (!p || !p->finished || t >= p->n_tensors)
    return 0;
  uint32_t i = cap_profile_accesses_before(p, t, op);
  if (i >= p->tensors[t].n_accesses)
    return 0;
  return p->access_ops[p->tensors[t].access_off + i] == op ? i + 1 : 0;
}

bool cap_profile_written_in_place(const cap_profile_t *p, uint32_t t,
                                  uint32_t from, uint32_t to) {
  if (!p || !p->finished || t >= p->n_tensors)
    return false;
  const cap_tensor_t *ct = &p->tensors[t];
  const uint32_t *a = p->access_ops + ct->access_off;
  for (uint32_t i = cap_profile_accesses_before(p, t, from);
       i < ct->n_accesses && a[i] < to; i++) {
    const cap_op_t *o = &p->ops[a[i]];
    if (!(o->flags & CAP_OP_INPLACE))
      continue;
    const uint32_t *out = cap_op_outputs(p, o);
    for (uint32_t j = 0; j < o->n_out; j++)
      if (out[j] == t)
        return true;
  }
  return false;
}

uint32_t cap_profile_multi_access_tensors(const cap_profile_t *p) {
  uint32_t n = 0;
  if (!p)
    return 0;
  for (uint32_t t = 0; t < p->n_tensors; t++)
    n += p->tensors[t].n_accesses > 1;
  return n;
}

bool cap_profile_equal(const cap_profile_t *a, const cap_profile_t *b) {
  if (!a || !b || !a->finished || !b->finished)
    return false;
  if (a->n_tensors != b->n_tensors || a->n_ops != b->n_ops ||
      a->n_op_tensors != b->n_op_tensors || a->n_accesses != b->n_accesses ||
      a->n_frees != b->n_frees || a->n_meta != b->n_meta)
    return false;
  for (uint32_t i = 0; i < a->n_tensors; i++) {
    const cap_tensor_t *x = &a->tensors[i], *y = &b->tensors[i];
    if (x->bytes != y->bytes || x->kind != y->kind ||
        x->producer_op != y->producer_op || x->free_ns != y->free_ns ||
        x->access_off != y->access_off || x->n_accesses != y->n_accesses ||
        x->no_evict != y->no_evict)
      return false;
  }
  for (uint32_t i = 0; i < a->n_ops; i++) {
    const cap_op_t *x = &a->ops[i], *y = &b->ops[i];
    if (x->start_ns != y->start_ns || x->end_ns != y->end_ns ||
        strcmp(x->name, y->name) != 0 || x->in_off != y->in_off ||
        x->n_in != y->n_in || x->out_off != y->out_off ||
        x->n_out != y->n_out || x->flags != y->flags)
      return false;
  }
  if (a->n_op_tensors &&
      memcmp(a->op_tensors, b->op_tensors,
             a->n_op_tensors * sizeof *a->op_tensors) != 0)
    return false;
  if (a->n_accesses &&
      memcmp(a->access_ops, b->access_ops,
             a->n_accesses * sizeof *a->access_ops) != 0)
    return false;
  for (uint32_t i = 0; i < a->n_frees; i++)
    if (a->frees[i].t_ns != b->frees[i].t_ns ||
        a->frees[i].tensor != b->frees[i].tensor)
      return false;
  for (uint32_t i = 0; i < a->n_meta; i++)
    if (strcmp(a->meta[i].key, b->meta[i].key) != 0 ||
        strcmp(a->meta[i].value, b->meta[i].value) != 0)
      return false;
  return a->persistent_bytes == b->persistent_bytes &&
         a->peak_bytes == b->peak_bytes && a->peak_t_ns == b->peak_t_ns &&
         a->iter_ns == b->iter_ns && a->meta_peak_bytes == b->meta_peak_bytes &&
         a->resident_bytes == b->resident_bytes &&
         strcmp(a->model, b->model) == 0;
}
