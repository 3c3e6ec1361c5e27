/*
 * The JSON form of a plan (capuchin-sim --emit-plan): a writer, and a strict
 * reader that accepts exactly what the writer's schema allows, so that a
 * plan file can be re-simulated anywhere (capuchin-sim --check-plan).
 *
 * {"trace":STR, "budget_bytes":N, "policy":STR, "version":N,
 *  "predicted_iter_ns":N, "predicted_peak_bytes":N,
 *  "actions":[{"tensor":ID, "evict_after_access":K, "method":"swap",
 *              "prefetch_at":{"tensor":ID,"access":K}|null, "sync_out":BOOL}
 *           | {"tensor":ID, "evict_after_access":K, "method":"recompute",
 *              "recompute_ops":[SEQ, ...]}]}
 * and, when the plan has a placement,
 *  "placement":{"arena_bytes":N,
 *               "blocks":[{"tensor":ID, "kind":KIND, "action":I|null,
 *                          "offset":N, "bytes":N, "start_ns":N, "end_ns":N,
 *                          "share":I|null, "same_as":I|null}, ...]}
 * with KIND one of cap_residency_kind_name's names.
 * An empty "recompute_ops" at the tensor's last access is a release
 * (plan.h). "trace", "budget_bytes", "policy" and "actions" are required; "version",
 * the predictions and "sync_out" are optional. Unknown or repeated keys,
 * wrong types, negative or fractional numbers, values out of range and
 * trailing bytes are errors that name the byte offset.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin/plan.h"

/* --- writer ---------------------------------------------------------------- */

static void put_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c; c++) {
    if (*c == '"' || *c == '\\')
      fprintf(f, "\\%c", *c);
    else if (*c < 0x20)
      fprintf(f, "\\u%04x", *c);
    else
      fputc(*c, f);
  }
  fputc('"', f);
}

static void put_index(FILE *f, uint32_t i) {
  if (i == CAP_NONE)
    fputs("null", f);
  else
    fprintf(f, "%" PRIu32, i);
}

int cap_plan_write_json(FILE *f, const cap_plan_t *plan, const char *trace) {
  if (!f || !plan)
    return CAP_EINVAL;
  fputs("{\"trace\":", f);
  put_str(f, trace);
  fprintf(f, ",\"budget_bytes\":%" PRIu64 ",\"policy\":", plan->budget_bytes);
  put_str(f, plan->policy);
  fprintf(f, ",\"version\":%" PRIu32, plan->version);
  if (plan->predicted_iter_ns > 0 || plan->predicted_peak_bytes > 0)
    fprintf(f, ",\"predicted_iter_ns\":%" PRId64 ",\"predicted_peak_bytes\":%" PRIu64,
            plan->predicted_iter_ns, plan->predicted_peak_bytes);
  fputs(",\"actions\":[", f);
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    fprintf(f, "%s\n{\"tensor\":%" PRIu32 ",\"evict_after_access\":%" PRIu32,
            i ? "," : "", a->tensor, a->evict_after_access);
    if (a->method == CAP_METHOD_SWAP) {
      fputs(",\"method\":\"swap\",\"prefetch_at\":", f);
      if (a->prefetch_tensor == CAP_NONE)
        fputs("null", f);
      else
        fprintf(f, "{\"tensor\":%" PRIu32 ",\"access\":%" PRIu32 "}",
                a->prefetch_tensor, a->prefetch_access);
      if (a->flags & CAP_ACTION_SYNC_OUT)
        fputs(",\"sync_out\":true", f);
    } else {
      fputs(",\"method\":\"recompute\",\"recompute_ops\":[", f);
      const uint32_t *ops = a->n_recompute ? cap_action_recompute_ops(plan, a) : NULL;
      for (uint32_t k = 0; k < a->n_recompute; k++)
        fprintf(f, "%s%" PRIu32, k ? "," : "", ops[k]);
      fputc(']', f);
    }
    fputc('}', f);
  }
  fputc(']', f);
  if (plan->n_blocks) {
    fprintf(f, ",\n\"placement\":{\"arena_bytes\":%" PRIu64 ",\"blocks\":[",
            plan->arena_bytes);
    for (uint32_t i = 0; i < plan->n_blocks; i++) {
      const cap_block_t *b = &plan->blocks[i];
      fprintf(f, "%s\n{\"tensor\":%" PRIu32 ",\"kind\":\"%s\",\"action\":",
              i ? "," : "", b->tensor, cap_residency_kind_name(b->kind));
      put_index(f, b->action);
      fprintf(f, ",\"offset\":%" PRIu64 ",\"bytes\":%" PRIu64
                 ",\"start_ns\":%" PRId64 ",\"end_ns\":%" PRId64 ",\"share\":",
              b->offset, b->bytes, b->start_ns, b->end_ns);
      put_index(f, b->share);
      fputs(",\"same_as\":", f);
      put_index(f, b->same_as);
      fputc('}', f);
    }
    fputs("]}", f);
  }
  fputs("}\n", f);
  return ferror(f) ? CAP_EIO : 0;
}

/* --- reader ---------------------------------------------------------------- */

typedef struct {
  const char *buf;
  size_t len, pos;
  char *err;
  size_t err_len;
  int rc;
} rd_t;

static int rd_fail(rd_t *r, const char *fmt, ...) {
  if (r->rc)
    return r->rc;
  r->rc = CAP_EPARSE;
  if (r->err && r->err_len) {
    int n = snprintf(r->err, r->err_len, "plan JSON: byte %zu: ", r->pos);
    if (n >= 0 && (size_t)n < r->err_len) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(r->err + n, r->err_len - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return r->rc;
}

static void ws(rd_t *r) {
  while (r->pos < r->len && (r->buf[r->pos] == ' ' || r->buf[r->pos] == '\t' ||
                             r->buf[r->pos] == '\n' || r->buf[r->pos] == '\r'))
    r->pos++;
}

static bool peek(rd_t *r, char c) {
  ws(r);
  return r->pos < r->len && r->buf[r->pos] == c;
}

static int expect(rd_t *r, char c) {
  if (!peek(r, c))
    return rd_fail(r, "expected '%c'", c);
  r->pos++;
  return 0;
}

static bool lit(rd_t *r, const char *word) {
  ws(r);
  size_t n = strlen(word);
  if (r->len - r->pos >= n && memcmp(r->buf + r->pos, word, n) == 0) {
    r->pos += n;
    return true;
  }
  return false;
}

/* A string into out (NUL-terminated, at most cap-1 bytes). Escapes are
 * decoded; \u escapes outside ASCII are refused (no plan string needs
 * them). */
static int str(rd_t *r, char *out, size_t cap) {
  if (expect(r, '"'))
    return r->rc;
  size_t n = 0;
  while (r->pos < r->len) {
    unsigned char c = (unsigned char)r->buf[r->pos++];
    if (c == '"') {
      out[n] = '\0';
      return 0;
    }
    if (c < 0x20)
      return rd_fail(r, "control character in string");
    if (c == '\\') {
      if (r->pos >= r->len)
        break;
      char e = r->buf[r->pos++];
      switch (e) {
      case '"': c = '"'; break;
      case '\\': c = '\\'; break;
      case '/': c = '/'; break;
      case 'b': c = '\b'; break;
      case 'f': c = '\f'; break;
      case 'n': c = '\n'; break;
      case 'r': c = '\r'; break;
      case 't': c = '\t'; break;
      case 'u': {
        unsigned v = 0;
        for (int i = 0; i < 4; i++) {
          if (r->pos >= r->len)
            return rd_fail(r, "truncated \\u escape");
          char h = r->buf[r->pos++];
          v <<= 4;
          if (h >= '0' && h <= '9')
            v |= (unsigned)(h - '0');
          else if (h >= 'a' && h <= 'f')
            v |= (unsigned)(h - 'a' + 10);
          else if (h >= 'A' && h <= 'F')
            v |= (unsigned)(h - 'A' + 10);
          else
            return rd_fail(r, "bad \\u escape");
        }
        if (v == 0 || v > 0x7f)
          return rd_fail(r, "\\u escape outside printable ASCII");
        c = (unsigned char)v;
        break;
      }
      default:
        return rd_fail(r, "bad escape '\\%c'", e);
      }
    }
    if (n + 1 >= cap)
      return rd_fail(r, "string too long");
    out[n++] = (char)c;
  }
  return rd_fail(r, "unterminated string");
}

/* A non-negative integer no larger than max. */
static int num(rd_t *r, uint64_t max, uint64_t *out) {
  ws(r);
  size_t start = r->pos;
  uint64_t v = 0;
  while (r->pos < r->len && r->buf[r->pos] >= '0' && r->buf[r->pos] <= '9') {
    unsigned d = (unsigned)(r->buf[r->pos] - '0');
    if (v > (UINT64_MAX - d) / 10)
      return rd_fail(r, "number too large");
    v = v * 10 + d;
    r->pos++;
  }
  if (r->pos == start)
    return rd_fail(r, "expected a non-negative integer");
  if (r->pos - start > 1 && r->buf[start] == '0')
    return rd_fail(r, "leading zero");
  if (r->pos < r->len && (r->buf[r->pos] == '.' || r->buf[r->pos] == 'e' ||
                          r->buf[r->pos] == 'E'))
    return rd_fail(r, "expected an integer");
  if (v > max)
    return rd_fail(r, "value %" PRIu64 " out of range (max %" PRIu64 ")", v, max);
  *out = v;
  return 0;
}

/* Object iteration: call first with *first = true. Returns 1 with the key
 * in key (and the ':' consumed), 0 at '}', or the error. */
static int next_key(rd_t *r, bool *first, char *key, size_t cap) {
  if (*first) {
    if (expect(r, '{'))
      return r->rc;
    *first = false;
    if (peek(r, '}')) {
      r->pos++;
      return 0;
    }
  } else {
    if (peek(r, '}')) {
      r->pos++;
      return 0;
    }
    if (expect(r, ','))
      return r->rc;
  }
  if (str(r, key, cap) || expect(r, ':'))
    return r->rc;
  return 1;
}

enum {
  K_TENSOR = 1 << 0,
  K_EVICT = 1 << 1,
  K_METHOD = 1 << 2,
  K_PREFETCH = 1 << 3,
  K_SYNC = 1 << 4,
  K_OPS = 1 << 5,
};

static int seen(rd_t *r, unsigned *mask, unsigned bit, const char *key) {
  if (*mask & bit)
    return rd_fail(r, "duplicate key \"%s\"", key);
  *mask |= bit;
  return 0;
}

static int read_action(rd_t *r, cap_plan_t *plan, uint32_t **ops,
                       uint32_t *cap_ops) {
  bool first = true;
  char key[64], method[16] = "";
  unsigned got = 0;
  uint64_t tensor = 0, evict = 0, pt = CAP_NONE, pa = 0;
  bool sync = false;
  uint32_t n_ops = 0;
  int k;
  while ((k = next_key(r, &first, key, sizeof key)) == 1) {
    if (!strcmp(key, "tensor")) {
      if (seen(r, &got, K_TENSOR, key) || num(r, UINT32_MAX - 1, &tensor))
        return r->rc;
    } else if (!strcmp(key, "evict_after_access")) {
      if (seen(r, &got, K_EVICT, key) || num(r, UINT32_MAX - 1, &evict))
        return r->rc;
      if (evict == 0)
        return rd_fail(r, "evict_after_access must be at least 1");
    } else if (!strcmp(key, "method")) {
      if (seen(r, &got, K_METHOD, key) || str(r, method, sizeof method))
        return r->rc;
      if (strcmp(method, "swap") && strcmp(method, "recompute"))
        return rd_fail(r, "unknown method \"%s\"", method);
    } else if (!strcmp(key, "prefetch_at")) {
      if (seen(r, &got, K_PREFETCH, key))
        return r->rc;
      if (lit(r, "null")) {
        pt = CAP_NONE;
        continue;
      }
      bool f2 = true;
      char k2[32];
      unsigned got2 = 0;
      int kk;
      while ((kk = next_key(r, &f2, k2, sizeof k2)) == 1) {
        if (!strcmp(k2, "tensor")) {
          if (seen(r, &got2, K_TENSOR, k2) || num(r, UINT32_MAX - 1, &pt))
            return r->rc;
        } else if (!strcmp(k2, "access")) {
          if (seen(r, &got2, K_EVICT, k2) || num(r, UINT32_MAX - 1, &pa))
            return r->rc;
          if (pa == 0)
            return rd_fail(r, "access must be at least 1");
        } else {
          return rd_fail(r, "unknown key \"%s\" in prefetch_at", k2);
        }
      }
      if (kk < 0)
        return r->rc;
      if (got2 != (K_TENSOR | K_EVICT))
        return rd_fail(r, "prefetch_at needs \"tensor\" and \"access\"");
    } else if (!strcmp(key, "sync_out")) {
      if (seen(r, &got, K_SYNC, key))
        return r->rc;
      if (lit(r, "true"))
        sync = true;
      else if (lit(r, "false"))
        sync = false;
      else
        return rd_fail(r, "sync_out must be true or false");
    } else if (!strcmp(key, "recompute_ops")) {
      if (seen(r, &got, K_OPS, key) || expect(r, '['))
        return r->rc;
      if (peek(r, ']')) {
        r->pos++;
        continue;
      }
      for (;;) {
        uint64_t v;
        if (num(r, UINT32_MAX - 1, &v))
          return r->rc;
        if (n_ops == *cap_ops) {
          uint32_t c = *cap_ops ? *cap_ops * 2 : 64;
          uint32_t *n = realloc(*ops, (size_t)c * sizeof *n);
          if (!n)
            return r->rc = CAP_ENOMEM;
          *ops = n;
          *cap_ops = c;
        }
        (*ops)[n_ops++] = (uint32_t)v;
        if (peek(r, ',')) {
          r->pos++;
          continue;
        }
        if (expect(r, ']'))
          return r->rc;
        break;
      }
    } else {
      return rd_fail(r, "unknown key \"%s\" in action", key);
    }
  }
  if (k < 0)
    return r->rc;
  if ((got & (K_TENSOR | K_EVICT | K_METHOD)) != (K_TENSOR | K_EVICT | K_METHOD))
    return rd_fail(r, "action needs \"tensor\", \"evict_after_access\" and \"method\"");
  int rc;
  if (!strcmp(method, "swap")) {
    if (got & K_OPS)
      return rd_fail(r, "swap action with recompute_ops");
    rc = cap_plan_add_swap(plan, (uint32_t)tensor, (uint32_t)evict, (uint32_t)pt,
                           (uint32_t)pa, sync ? CAP_ACTION_SYNC_OUT : 0);
  } else {
    if (got & (K_PREFETCH | K_SYNC))
      return rd_fail(r, "recompute action with swap fields");
    if (!(got & K_OPS))
      return rd_fail(r, "recompute action needs recompute_ops ([] for a "
                        "release after the last access)");
    rc = cap_plan_add_recompute(plan, (uint32_t)tensor, (uint32_t)evict, *ops,
                                n_ops);
  }
  if (rc)
    return r->rc = rc;
  return 0;
}

/* An index or null (CAP_NONE). */
static int index_or_null(rd_t *r, uint32_t *out) {
  uint64_t v;
  if (lit(r, "null")) {
    *out = CAP_NONE;
    return 0;
  }
  if (num(r, UINT32_MAX - 1, &v))
    return r->rc;
  *out = (uint32_t)v;
  return 0;
}

static int read_block(rd_t *r, cap_block_t *b) {
  enum { B_TENSOR = 1, B_KIND = 2, B_ACTION = 4, B_OFFSET = 8, B_BYTES = 16,
         B_START = 32, B_END = 64, B_SHARE = 128, B_SAME = 256, B_ALL = 511 };
  bool first = true;
  char key[32], kind[32];
  unsigned got = 0;
  uint64_t v;
  int k;
  while ((k = next_key(r, &first, key, sizeof key)) == 1) {
    if (!strcmp(key, "tensor")) {
      if (seen(r, &got, B_TENSOR, key) || num(r, UINT32_MAX - 1, &v))
        return r->rc;
      b->tensor = (uint32_t)v;
    } else if (!strcmp(key, "kind")) {
      if (seen(r, &got, B_KIND, key) || str(r, kind, sizeof kind))
        return r->rc;
      int kk = 0;
      while (cap_residency_kind_name((cap_residency_kind_t)kk) &&
             strcmp(cap_residency_kind_name((cap_residency_kind_t)kk), kind))
        kk++;
      if (!cap_residency_kind_name((cap_residency_kind_t)kk))
        return rd_fail(r, "unknown block kind \"%s\"", kind);
      b->kind = (cap_residency_kind_t)kk;
    } else if (!strcmp(key, "action")) {
      if (seen(r, &got, B_ACTION, key) || index_or_null(r, &b->action))
        return r->rc;
    } else if (!strcmp(key, "offset")) {
      if (seen(r, &got, B_OFFSET, key) || num(r, UINT64_MAX, &b->offset))
        return r->rc;
    } else if (!strcmp(key, "bytes")) {
      if (seen(r, &got, B_BYTES, key) || num(r, UINT64_MAX, &b->bytes))
        return r->rc;
    } else if (!strcmp(key, "start_ns")) {
      if (seen(r, &got, B_START, key) || num(r, INT64_MAX, &v))
        return r->rc;
      b->start_ns = (int64_t)v;
    } else if (!strcmp(key, "end_ns")) {
      if (seen(r, &got, B_END, key) || num(r, INT64_MAX, &v))
        return r->rc;
      b->end_ns = (int64_t)v;
    } else if (!strcmp(key, "share")) {
      if (seen(r, &got, B_SHARE, key) || index_or_null(r, &b->share))
        return r->rc;
    } else if (!strcmp(key, "same_as")) {
      if (seen(r, &got, B_SAME, key) || index_or_null(r, &b->same_as))
        return r->rc;
    } else {
      return rd_fail(r, "unknown key \"%s\" in block", key);
    }
  }
  if (k < 0)
    return r->rc;
  if (got != B_ALL)
    return rd_fail(r, "a block needs tensor, kind, action, offset, bytes, "
                      "start_ns, end_ns, share and same_as");
  if (b->end_ns <= b->start_ns)
    return rd_fail(r, "a block must end after it starts");
  return 0;
}

static int read_placement(rd_t *r, cap_plan_t *plan) {
  bool first = true, got_arena = false, got_blocks = false;
  char key[32];
  uint64_t arena = 0;
  cap_block_t *blocks = NULL;
  uint32_t n = 0, cap = 0;
  int k;
  while ((k = next_key(r, &first, key, sizeof key)) == 1) {
    if (!strcmp(key, "arena_bytes")) {
      if (got_arena) {
        rd_fail(r, "duplicate key \"%s\"", key);
        break;
      }
      got_arena = true;
      if (num(r, UINT64_MAX, &arena))
        break;
    } else if (!strcmp(key, "blocks")) {
      if (got_blocks) {
        rd_fail(r, "duplicate key \"%s\"", key);
        break;
      }
      got_blocks = true;
      if (expect(r, '['))
        break;
      if (peek(r, ']')) {
        r->pos++;
        continue;
      }
      for (;;) {
        if (n == cap) {
          uint32_t c = cap ? cap * 2 : 256;
          cap_block_t *nb = realloc(blocks, (size_t)c * sizeof *nb);
          if (!nb) {
            r->rc = CAP_ENOMEM;
            break;
          }
          blocks = nb;
          cap = c;
        }
        if (read_block(r, &blocks[n]))
          break;
        n++;
        if (peek(r, ',')) {
          r->pos++;
          continue;
        }
        expect(r, ']');
        break;
      }
      if (r->rc)
        break;
    } else {
      rd_fail(r, "unknown key \"%s\" in placement", key);
      break;
    }
  }
  if (!r->rc && (!got_arena || !got_blocks))
    rd_fail(r, "placement needs \"arena_bytes\" and \"blocks\"");
  if (!r->rc) {
    int rc = cap_plan_set_blocks(plan, blocks, n, arena);
    if (rc)
      r->rc = rc;
  }
  free(blocks);
  return r->rc;
}

int cap_plan_read_json(const char *buf, size_t len, cap_plan_t **out,
                       char *err, size_t err_len) {
  if (err && err_len)
    err[0] = '\0';
  if (!out)
    return CAP_EINVAL;
  *out = NULL;
  if (!buf)
    return CAP_EINVAL;
  rd_t r = {buf, len, 0, err, err_len, 0};
  cap_plan_t *plan = cap_plan_create("", 0);
  uint32_t *ops = NULL, cap_ops = 0;
  if (!plan)
    return CAP_ENOMEM;
  enum { T_TRACE = 1, T_BUDGET = 2, T_POLICY = 4, T_ACTIONS = 8, T_VERSION = 16,
         T_ITER = 32, T_PEAK = 64, T_PLACEMENT = 128 };
  unsigned got = 0;
  bool first = true;
  char key[64];
  int k;
  while ((k = next_key(&r, &first, key, sizeof key)) == 1) {
    uint64_t v;
    if (!strcmp(key, "trace")) {
      char trace[4096];
      if (seen(&r, &got, T_TRACE, key) || str(&r, trace, sizeof trace))
        break;
    } else if (!strcmp(key, "budget_bytes")) {
      if (seen(&r, &got, T_BUDGET, key) || num(&r, UINT64_MAX, &v))
        break;
      plan->budget_bytes = v;
    } else if (!strcmp(key, "policy")) {
      if (seen(&r, &got, T_POLICY, key) ||
          str(&r, plan->policy, sizeof plan->policy))
        break;
    } else if (!strcmp(key, "version")) {
      if (seen(&r, &got, T_VERSION, key) || num(&r, UINT32_MAX, &v))
        break;
      if (v == 0) {
        rd_fail(&r, "version must be at least 1");
        break;
      }
      plan->version = (uint32_t)v;
    } else if (!strcmp(key, "predicted_iter_ns")) {
      if (seen(&r, &got, T_ITER, key) || num(&r, INT64_MAX, &v))
        break;
      plan->predicted_iter_ns = (int64_t)v;
    } else if (!strcmp(key, "predicted_peak_bytes")) {
      if (seen(&r, &got, T_PEAK, key) || num(&r, UINT64_MAX, &v))
        break;
      plan->predicted_peak_bytes = v;
    } else if (!strcmp(key, "actions")) {
      if (seen(&r, &got, T_ACTIONS, key) || expect(&r, '['))
        break;
      if (peek(&r, ']')) {
        r.pos++;
        continue;
      }
      for (;;) {
        if (read_action(&r, plan, &ops, &cap_ops))
          break;
        if (peek(&r, ',')) {
          r.pos++;
          continue;
        }
        expect(&r, ']');
        break;
      }
      if (r.rc)
        break;
    } else if (!strcmp(key, "placement")) {
      if (seen(&r, &got, T_PLACEMENT, key) || read_placement(&r, plan))
        break;
    } else {
      rd_fail(&r, "unknown key \"%s\"", key);
      break;
    }
  }
  if (!r.rc && k == 0) {
    ws(&r);
    if (r.pos != r.len)
      rd_fail(&r, "trailing bytes after the plan");
    else if ((got & (T_TRACE | T_BUDGET | T_POLICY | T_ACTIONS)) !=
             (T_TRACE | T_BUDGET | T_POLICY | T_ACTIONS))
      rd_fail(&r, "plan needs \"trace\", \"budget_bytes\", \"policy\" and \"actions\"");
  }
  free(ops);
  if (r.rc) {
    cap_plan_destroy(plan);
    return r.rc;
  }
  *out = plan;
  return 0;
}
