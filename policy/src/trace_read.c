/*
 * Reader for `capuchin-trace 1` (tests/data/traces/FORMAT.md).
 *
 * The reader only tokenises: it checks bytes, field counts, numbers and the
 * order of record kinds, and hands each record to the profile builder, which
 * validates it against what came before (the daemon's tracker relies on the
 * same checks). Builder messages get the file and line put in front. The
 * buffer is never assumed NUL-terminated; each line is copied into a scratch
 * buffer that is.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "capuchin/error.h"
#include "capuchin/trace.h"

#define MAX_LINE (16u << 20)      /* bytes in one line */
#define MAX_FILE (UINT64_C(1) << 30) /* bytes cap_trace_load reads */

typedef enum { ST_META, ST_TENSORS, ST_OPS, ST_FREES } state_t;

typedef struct reader {
  const char *name;
  uint64_t line;
  char *err;
  size_t err_len;
  cap_profile_t *p;
  state_t state;
  char *scratch; /* current line, NUL-terminated, spaces turned into NULs */
  size_t scratch_cap;
  char **tok;
  uint32_t n_tok, tok_cap;
  uint32_t *ids; /* an op's inputs then outputs */
  uint32_t ids_cap;
} reader_t;

static int failf(reader_t *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int failf(reader_t *r, int code, const char *fmt, ...) {
  if (!r->err || !r->err_len)
    return code;
  int n = snprintf(r->err, r->err_len, "%s:%" PRIu64 ": ", r->name, r->line);
  if (n >= 0 && (size_t)n < r->err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + n, r->err_len - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return code;
}

static int builder_fail(reader_t *r, int rc) {
  return failf(r, rc, "%s", cap_profile_error(r->p));
}

/* Unsigned decimal: 0, CAP_EPARSE (not a number) or CAP_ERANGE. */
static int parse_u64(const char *s, uint64_t *out) {
  if (!*s)
    return CAP_EPARSE;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9')
      return CAP_EPARSE;
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10)
      return CAP_ERANGE;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

static int parse_i64(const char *s, int64_t *out) {
  bool neg = *s == '-';
  uint64_t v;
  int rc = parse_u64(s + neg, &v);
  if (rc)
    return rc;
  if (v > (uint64_t)INT64_MAX)
    return CAP_ERANGE;
  *out = neg ? -(int64_t)v : (int64_t)v;
  return 0;
}

static int num_fail(reader_t *r, int rc, const char *what, const char *tok) {
  if (rc == CAP_ERANGE)
    return failf(r, rc, "%s: number %.40s%s out of range", what, tok,
                 strlen(tok) > 40 ? "..." : "");
  return failf(r, rc, "%s: '%.40s%s' is not a decimal number", what, tok,
               strlen(tok) > 40 ? "..." : "");
}

static int parse_id(reader_t *r, const char *what, const char *tok,
                    uint32_t *out) {
  uint64_t v;
  int rc = parse_u64(tok, &v);
  if (rc)
    return num_fail(r, rc, what, tok);
  if (v >= CAP_PROFILE_MAX_IDS)
    return failf(r, CAP_ERANGE, "%s: id %" PRIu64 " beyond 2^31", what, v);
  *out = (uint32_t)v;
  return 0;
}

static int parse_time(reader_t *r, const char *what, const char *tok,
                      int64_t *out) {
  int rc = parse_i64(tok, out);
  return rc ? num_fail(r, rc, what, tok) : 0;
}

/* Copy line [s, s+n) into scratch and split it at single spaces. */
static int tokenise(reader_t *r, const char *s, size_t n) {
  if (n == 0)
    return failf(r, CAP_EPARSE, "empty line");
  if (n >= MAX_LINE)
    return failf(r, CAP_ERANGE, "line longer than %u bytes", MAX_LINE);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' || (c > 0x20 && c < 0x7f))
      continue;
    if (c == 0)
      return failf(r, CAP_EPARSE, "NUL byte at column %zu", i + 1);
    if (c == '\r')
      return failf(r, CAP_EPARSE,
                   "carriage return at column %zu (lines end in \\n only)",
                   i + 1);
    return failf(r, CAP_EPARSE,
                 "byte 0x%02x at column %zu (traces are printable ASCII)", c,
                 i + 1);
  }
  if (n + 1 > r->scratch_cap) {
    size_t cap = r->scratch_cap ? r->scratch_cap : 256;
    while (cap < n + 1)
      cap *= 2;
    char *ns = realloc(r->scratch, cap);
    if (!ns)
      return failf(r, CAP_ENOMEM, "out of memory");
    r->scratch = ns;
    r->scratch_cap = cap;
  }
  memcpy(r->scratch, s, n);
  r->scratch[n] = '\0';
  r->n_tok = 0;
  char *p = r->scratch;
  for (;;) {
    char *sp = strchr(p, ' ');
    if (sp)
      *sp = '\0';
    if (!*p)
      return failf(r, CAP_EPARSE,
                   "empty field at column %zu (fields are separated by one "
                   "space)",
                   (size_t)(p - r->scratch) + 1);
    if (r->n_tok == r->tok_cap) {
      uint32_t cap = r->tok_cap ? r->tok_cap * 2 : 16;
      char **nt = realloc(r->tok, cap * sizeof *nt);
      if (!nt)
        return failf(r, CAP_ENOMEM, "out of memory");
      r->tok = nt;
      r->tok_cap = cap;
    }
    r->tok[r->n_tok++] = p;
    if (!sp)
      break;
    p = sp + 1;
  }
  return 0;
}

static int read_header(reader_t *r) {
  static const char magic[] = "capuchin-trace";
  if (r->n_tok == 2 && strcmp(r->tok[0], magic) == 0) {
    if (strcmp(r->tok[1], "1") == 0)
      return 0;
    return failf(r, CAP_EVERSION,
                 "unsupported trace version '%.20s' (this reader knows 1)",
                 r->tok[1]);
  }
  return failf(r, CAP_EPARSE, "bad header: expected 'capuchin-trace 1'");
}

static int read_meta(reader_t *r) {
  if (r->n_tok < 2)
    return failf(r, CAP_EPARSE, "meta: expected at least one key=value");
  for (uint32_t i = 1; i < r->n_tok; i++) {
    char *kv = r->tok[i];
    char *eq = strchr(kv, '=');
    if (!eq || eq == kv || !eq[1])
      return failf(r, CAP_EPARSE, "meta: '%.40s' is not key=value", kv);
    *eq = '\0';
    int rc = cap_profile_set_meta(r->p, kv, eq + 1);
    if (rc)
      return builder_fail(r, rc);
  }
  return 0;
}

static int read_tensor(reader_t *r) {
  if (r->n_tok != 4)
    return failf(r, CAP_EPARSE,
                 "tensor: expected 'tensor <id> <bytes> <kind>', got %" PRIu32
                 " fields",
                 r->n_tok);
  uint32_t id;
  uint64_t bytes;
  int rc = parse_id(r, "tensor", r->tok[1], &id);
  if (rc)
    return rc;
  if ((rc = parse_u64(r->tok[2], &bytes)))
    return num_fail(r, rc, "tensor bytes", r->tok[2]);
  cap_tensor_kind_t kind;
  const char *k = r->tok[3];
  if (strcmp(k, "param") == 0)
    kind = CAP_KIND_PARAM;
  else if (strcmp(k, "input") == 0)
    kind = CAP_KIND_INPUT;
  else if (strcmp(k, "activation") == 0)
    kind = CAP_KIND_ACTIVATION;
  else
    return failf(r, CAP_EPARSE,
                 "tensor %" PRIu32
                 ": unknown kind '%.40s' (param, input or activation)",
                 id, k);
  rc = cap_profile_add_tensor(r->p, id, bytes, kind);
  return rc ? builder_fail(r, rc) : 0;
}

/* Parse "-" or "a,b,c" into r->ids from index *n on. */
static int parse_list(reader_t *r, uint32_t seq, const char *what, char *s,
                      uint32_t *n) {
  if (strcmp(s, "-") == 0)
    return 0;
  for (;;) {
    char *comma = strchr(s, ',');
    if (comma)
      *comma = '\0';
    if (!*s)
      return failf(r, CAP_EPARSE, "op %" PRIu32 ": %s: empty tensor id", seq,
                   what);
    if (*n >= CAP_PROFILE_MAX_OP_TENSORS)
      return failf(r, CAP_ERANGE, "op %" PRIu32 ": more than %u tensors", seq,
                   (unsigned)CAP_PROFILE_MAX_OP_TENSORS);
    if (*n == r->ids_cap) {
      uint32_t cap = r->ids_cap ? r->ids_cap * 2 : 64;
      uint32_t *ni = realloc(r->ids, cap * sizeof *ni);
      if (!ni)
        return failf(r, CAP_ENOMEM, "out of memory");
      r->ids = ni;
      r->ids_cap = cap;
    }
    char what_id[64];
    snprintf(what_id, sizeof what_id, "op %" PRIu32 ": %s", seq, what);
    int rc = parse_id(r, what_id, s, &r->ids[*n]);
    if (rc)
      return rc;
    (*n)++;
    if (!comma)
      return 0;
    s = comma + 1;
  }
}

static int read_op(reader_t *r) {
  if (r->n_tok != 7)
    return failf(r, CAP_EPARSE,
                 "op: expected 'op <seq> <start_ns> <end_ns> <name> <inputs> "
                 "<outputs>', got %" PRIu32 " fields",
                 r->n_tok);
  uint32_t seq;
  int64_t start, end;
  int rc = parse_id(r, "op", r->tok[1], &seq);
  if (rc)
    return rc;
  char what[48];
  snprintf(what, sizeof what, "op %" PRIu32 ": start_ns", seq);
  if ((rc = parse_time(r, what, r->tok[2], &start)))
    return rc;
  snprintf(what, sizeof what, "op %" PRIu32 ": end_ns", seq);
  if ((rc = parse_time(r, what, r->tok[3], &end)))
    return rc;
  uint32_t n_in = 0, n_all;
  if ((rc = parse_list(r, seq, "inputs", r->tok[5], &n_in)))
    return rc;
  n_all = n_in;
  if ((rc = parse_list(r, seq, "outputs", r->tok[6], &n_all)))
    return rc;
  /* r->ids is NULL until some op lists a tensor. */
  const uint32_t *in = n_in ? r->ids : NULL;
  const uint32_t *outs = n_all > n_in ? r->ids + n_in : NULL;
  rc = cap_profile_add_op(r->p, seq, start, end, r->tok[4], in, n_in, outs,
                          n_all - n_in);
  return rc ? builder_fail(r, rc) : 0;
}

static int read_free(reader_t *r) {
  if (r->n_tok != 3)
    return failf(r, CAP_EPARSE,
                 "free: expected 'free <t_ns> <tensor-id>', got %" PRIu32
                 " fields",
                 r->n_tok);
  int64_t t;
  uint32_t id;
  int rc = parse_time(r, "free: t_ns", r->tok[1], &t);
  if (rc || (rc = parse_id(r, "free: tensor", r->tok[2], &id)))
    return rc;
  rc = cap_profile_add_free(r->p, t, id);
  return rc ? builder_fail(r, rc) : 0;
}

/* Record kinds come in file order: meta, tensor, op, free. */
static int read_record(reader_t *r) {
  const char *kind = r->tok[0];
  state_t want;
  int (*fn)(reader_t *);
  if (strcmp(kind, "meta") == 0) {
    want = ST_META;
    fn = read_meta;
  } else if (strcmp(kind, "tensor") == 0) {
    want = ST_TENSORS;
    fn = read_tensor;
  } else if (strcmp(kind, "op") == 0) {
    want = ST_OPS;
    fn = read_op;
  } else if (strcmp(kind, "free") == 0) {
    want = ST_FREES;
    fn = read_free;
  } else {
    return failf(r, CAP_EPARSE,
                 "unknown record '%.32s' (meta, tensor, op or free)", kind);
  }
  if (want < r->state) {
    static const char *const names[] = {"meta", "tensor", "op", "free"};
    return failf(r, CAP_EPARSE, "%s line after %s lines", names[want],
                 names[r->state]);
  }
  r->state = want;
  return fn(r);
}

int cap_trace_parse(const char *buf, size_t len, const char *name,
                    cap_profile_t **out, char *err, size_t err_len) {
  if (err && err_len)
    err[0] = '\0';
  if (out)
    *out = NULL;
  reader_t r = {.name = name ? name : "trace", .line = 1, .err = err,
                .err_len = err_len, .state = ST_META};
  if (!out || (!buf && len))
    return failf(&r, CAP_EINVAL, "invalid argument");
  int rc = 0;
  r.p = cap_profile_create();
  if (!r.p)
    return failf(&r, CAP_ENOMEM, "out of memory");
  if (len == 0) {
    rc = failf(&r, CAP_EPARSE, "empty file (expected 'capuchin-trace 1')");
    goto out_destroy;
  }
  size_t pos = 0;
  for (; pos < len; r.line++) {
    const char *nl = memchr(buf + pos, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - (buf + pos)) : len - pos;
    if ((rc = tokenise(&r, buf + pos, n)))
      goto out_destroy;
    rc = r.line == 1 ? read_header(&r) : read_record(&r);
    if (rc)
      goto out_destroy;
    pos += n + (nl != NULL);
  }
  r.line--; /* finish's complaints belong to the last line */
  if ((rc = cap_profile_finish(r.p))) {
    builder_fail(&r, rc);
    goto out_destroy;
  }
  *out = r.p;
  r.p = NULL;
out_destroy:
  cap_profile_destroy(r.p);
  free(r.scratch);
  free(r.tok);
  free(r.ids);
  return rc;
}

int cap_trace_load(const char *path, cap_profile_t **out, char *err,
                   size_t err_len) {
  if (out)
    *out = NULL;
  if (err && err_len)
    err[0] = '\0';
  if (!path || !out)
    return CAP_EINVAL;
  const char *base = strrchr(path, '/');
  base = base && base[1] ? base + 1 : path;
  int rc = 0;
  char *buf = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    if (err && err_len)
      snprintf(err, err_len, "%s: cannot open: %s", base, strerror(e));
    return e == ENOENT ? CAP_ENOENT : CAP_EIO;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    if (err && err_len)
      snprintf(err, err_len, "%s: not a regular file", base);
    rc = CAP_EIO;
    goto out_close;
  }
  if ((uint64_t)st.st_size > MAX_FILE) {
    if (err && err_len)
      snprintf(err, err_len, "%s: larger than %" PRIu64 " bytes", base,
               MAX_FILE);
    rc = CAP_ERANGE;
    goto out_close;
  }
  size_t size = (size_t)st.st_size;
  buf = malloc(size ? size : 1);
  if (!buf) {
    if (err && err_len)
      snprintf(err, err_len, "%s: out of memory", base);
    rc = CAP_ENOMEM;
    goto out_close;
  }
  size_t got = fread(buf, 1, size, f);
  if (got != size || ferror(f)) {
    if (err && err_len)
      snprintf(err, err_len, "%s: read error", base);
    rc = CAP_EIO;
    goto out_free;
  }
  rc = cap_trace_parse(buf, size, base, out, err, err_len);
out_free:
  free(buf);
out_close:
  fclose(f);
  return rc;
}
