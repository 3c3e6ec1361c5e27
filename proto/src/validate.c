/*
 * Field-by-field validation of an unpacked Envelope. protobuf-c checks wire
 * syntax only: it stores any integer in an enum field, keeps strings with a
 * NUL inside (terminated early), and accepts any count and any value. Every
 * rule of capuchin.proto's comments is enforced here, so that the daemon and
 * the client only ever see messages they can use without further checks.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "capuchin/frame.h"
#include "capuchin/plan.h"
#include "proto_internal.h"

typedef struct vctx {
  const cap_frame_limits_t *lim;
  cap__strlen_fn wire_len;
  void *wire_ctx;
  char *err;
  size_t err_len;
  const char *msg; /* message being checked, for error text */
} vctx_t;

#define FAIL(c, code, ...)                                                     \
  fail_at((c), (code), __VA_ARGS__)

__attribute__((format(printf, 3, 4))) static int
fail_at(const vctx_t *c, int code, const char *fmt, ...) {
  if (c->err && c->err_len > 0) {
    int n = snprintf(c->err, c->err_len, "%s: ", c->msg);
    if (n >= 0 && (size_t)n < c->err_len) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(c->err + n, c->err_len - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return code;
}

/* A required optional field: has_<f> must be set. */
#define NEED(c, m, f)                                                          \
  do {                                                                         \
    if (!(m)->has_##f)                                                         \
      return FAIL(c, CAP_EINVAL, "missing " #f);                               \
  } while (0)

#define NEED_PTR(c, m, f)                                                      \
  do {                                                                         \
    if (!(m)->f)                                                               \
      return FAIL(c, CAP_EINVAL, "missing " #f);                               \
  } while (0)

#define CHECK_RC(expr)                                                         \
  do {                                                                         \
    int rc__ = (expr);                                                         \
    if (rc__ < 0)                                                              \
      return rc__;                                                             \
  } while (0)

/* s: NULL-able string; what: field name; nonempty: must have >= 1 byte;
 * maxlen: bound in bytes. */
static int check_str(const vctx_t *c, const char *s, const char *what,
                     bool required, bool nonempty, size_t maxlen) {
  if (!s) {
    if (required)
      return FAIL(c, CAP_EINVAL, "missing %s", what);
    return 0;
  }
  size_t n = strnlen(s, maxlen + 1);
  if (n > maxlen)
    return FAIL(c, CAP_ERANGE, "%s longer than %zu bytes", what, maxlen);
  if (c->wire_len && c->wire_len(s, c->wire_ctx) != n)
    return FAIL(c, CAP_EINVAL, "%s contains a NUL byte", what);
  if (nonempty && n == 0)
    return FAIL(c, CAP_EINVAL, "%s is empty", what);
  return 0;
}

static int check_name(const vctx_t *c, const char *s, const char *what) {
  return check_str(c, s, what, true, true, c->lim->max_name_len);
}

static int check_count(const vctx_t *c, size_t n, const char *what) {
  if (n > c->lim->max_items)
    return FAIL(c, CAP_ERANGE, "%zu %s, more than the limit of %u", n, what,
                c->lim->max_items);
  return 0;
}

static int check_tensor(const vctx_t *c, uint32_t id, const char *what) {
  if (id >= c->lim->max_tensor_id)
    return FAIL(c, CAP_ERANGE, "%s %u out of range (limit %u)", what, id,
                c->lim->max_tensor_id);
  return 0;
}

static int check_tensors(const vctx_t *c, const uint32_t *ids, size_t n,
                         const char *what) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] >= c->lim->max_tensor_id)
      return FAIL(c, CAP_ERANGE, "%s[%zu] = %u out of range (limit %u)", what,
                  i, ids[i], c->lim->max_tensor_id);
  return 0;
}

static int check_ns(const vctx_t *c, int64_t t, const char *what) {
  if (t < 0)
    return FAIL(c, CAP_ERANGE, "%s %lld is negative", what, (long long)t);
  return 0;
}

static int check_gbps(const vctx_t *c, double v, const char *what) {
  /* 1e6 GB/s is far beyond any link; it keeps swap-time arithmetic sane. */
  if (!isfinite(v) || !(v > 0.0) || v > 1e6)
    return FAIL(c, CAP_ERANGE, "%s %g not in (0, 1e6]", what, v);
  return 0;
}

static int check_kind(const vctx_t *c, int kind, const char *what) {
  if (kind != CAPUCHIN__TENSOR_KIND__TENSOR_KIND_PARAM &&
      kind != CAPUCHIN__TENSOR_KIND__TENSOR_KIND_INPUT &&
      kind != CAPUCHIN__TENSOR_KIND__TENSOR_KIND_ACTIVATION)
    return FAIL(c, CAP_ERANGE, "%s %d is not a tensor kind", what, kind);
  return 0;
}

static int check_op_times(const vctx_t *c, int64_t start, int64_t end,
                          const char *what, size_t i) {
  if (start < 0)
    return FAIL(c, CAP_ERANGE, "%s[%zu]: start_ns %lld is negative", what, i,
                (long long)start);
  if (end < start)
    return FAIL(c, CAP_ERANGE, "%s[%zu]: end_ns %lld before start_ns %lld",
                what, i, (long long)end, (long long)start);
  return 0;
}

/* --- Messages ------------------------------------------------------------- */

static int v_hello(vctx_t *c, const Capuchin__Hello *m) {
  NEED(c, m, protocol_version);
  if (m->protocol_version == 0)
    return FAIL(c, CAP_ERANGE, "protocol_version 0");
  CHECK_RC(check_name(c, m->job_name, "job_name"));
  NEED(c, m, pid);
  if (m->pid == 0)
    return FAIL(c, CAP_ERANGE, "pid 0");
  NEED(c, m, device_index);
  CHECK_RC(check_name(c, m->device_name, "device_name"));
  NEED(c, m, device_total_bytes);
  if (m->device_total_bytes == 0)
    return FAIL(c, CAP_ERANGE, "device_total_bytes 0");
  NEED(c, m, budget_bytes);
  if (m->budget_bytes == 0)
    return FAIL(c, CAP_ERANGE, "budget_bytes 0");
  NEED(c, m, h2d_gbps);
  CHECK_RC(check_gbps(c, m->h2d_gbps, "h2d_gbps"));
  NEED(c, m, d2h_gbps);
  CHECK_RC(check_gbps(c, m->d2h_gbps, "d2h_gbps"));
  NEED(c, m, duplex_gbps);
  CHECK_RC(check_gbps(c, m->duplex_gbps, "duplex_gbps"));
  CHECK_RC(check_name(c, m->backend, "backend"));
  if (m->device_uuid)
    CHECK_RC(check_name(c, m->device_uuid, "device_uuid"));
  return 0;
}

static int v_welcome(vctx_t *c, const Capuchin__Welcome *m) {
  NEED(c, m, protocol_version);
  if (m->protocol_version == 0)
    return FAIL(c, CAP_ERANGE, "protocol_version 0");
  NEED(c, m, session_id);
  if (m->session_id == 0)
    return FAIL(c, CAP_ERANGE, "session_id 0");
  NEED(c, m, job_id);
  if (m->job_id == 0)
    return FAIL(c, CAP_ERANGE, "job_id 0");
  NEED(c, m, budget_bytes);
  NEED(c, m, plan_reused);
  return 0;
}

static int v_tensor_decl(vctx_t *c, const Capuchin__TensorDecl *m) {
  NEED(c, m, id);
  CHECK_RC(check_tensor(c, m->id, "id"));
  NEED(c, m, bytes);
  NEED(c, m, kind);
  return check_kind(c, (int)m->kind, "kind");
}

static int v_op_record(vctx_t *c, const Capuchin__OpRecord *m,
                       const char *what, size_t i) {
  if (!m->has_seq || !m->has_start_ns || !m->has_end_ns)
    return FAIL(c, CAP_EINVAL, "%s[%zu]: missing %s", what, i,
                !m->has_seq ? "seq" : !m->has_start_ns ? "start_ns" : "end_ns");
  if (m->seq >= c->lim->max_op_seq)
    return FAIL(c, CAP_ERANGE, "%s[%zu]: seq %u out of range (limit %u)", what,
                i, m->seq, c->lim->max_op_seq);
  CHECK_RC(check_op_times(c, m->start_ns, m->end_ns, what, i));
  CHECK_RC(check_name(c, m->name, "name"));
  if (m->n_inputs > c->lim->max_op_tensors ||
      m->n_outputs > c->lim->max_op_tensors - m->n_inputs)
    return FAIL(c, CAP_ERANGE, "%s[%zu]: %zu inputs + %zu outputs, limit %u",
                what, i, m->n_inputs, m->n_outputs, c->lim->max_op_tensors);
  CHECK_RC(check_tensors(c, m->inputs, m->n_inputs, "inputs"));
  return check_tensors(c, m->outputs, m->n_outputs, "outputs");
}

static int v_access_batch(vctx_t *c, const Capuchin__AccessBatch *m) {
  NEED(c, m, iteration);
  CHECK_RC(check_count(c, m->n_ops, "ops"));
  for (size_t i = 0; i < m->n_ops; i++) {
    if (!m->ops[i])
      return FAIL(c, CAP_EINVAL, "ops[%zu] missing", i);
    CHECK_RC(v_op_record(c, m->ops[i], "ops", i));
  }

  /* Compact ops: every op_* column as long as op_seq. */
  size_t n = m->n_op_seq;
  CHECK_RC(check_count(c, n, "compact ops"));
  CHECK_RC(check_count(c, m->n_names, "names"));
  CHECK_RC(check_count(c, m->n_tensors, "tensors"));
  if (m->n_op_start_ns != n || m->n_op_end_ns != n || m->n_op_name != n ||
      m->n_op_n_in != n || m->n_op_n_out != n)
    return FAIL(c, CAP_EPROTO,
                "op columns differ in length (seq %zu, start %zu, end %zu, "
                "name %zu, n_in %zu, n_out %zu)",
                n, m->n_op_start_ns, m->n_op_end_ns, m->n_op_name,
                m->n_op_n_in, m->n_op_n_out);
  for (size_t i = 0; i < m->n_names; i++) {
    char what[32];
    snprintf(what, sizeof what, "names[%zu]", i);
    CHECK_RC(check_name(c, m->names[i], what));
  }
  uint64_t want_tensors = 0;
  for (size_t i = 0; i < n; i++) {
    if (m->op_seq[i] >= c->lim->max_op_seq)
      return FAIL(c, CAP_ERANGE, "op_seq[%zu] = %u out of range (limit %u)", i,
                  m->op_seq[i], c->lim->max_op_seq);
    CHECK_RC(check_op_times(c, m->op_start_ns[i], m->op_end_ns[i], "op", i));
    if (m->op_name[i] >= m->n_names)
      return FAIL(c, CAP_ERANGE, "op_name[%zu] = %u out of range (%zu names)",
                  i, m->op_name[i], m->n_names);
    uint64_t k = (uint64_t)m->op_n_in[i] + m->op_n_out[i];
    if (k > c->lim->max_op_tensors)
      return FAIL(c, CAP_ERANGE, "op[%zu]: %u inputs + %u outputs, limit %u",
                  i, m->op_n_in[i], m->op_n_out[i], c->lim->max_op_tensors);
    want_tensors += k;
  }
  if (want_tensors != m->n_tensors)
    return FAIL(c, CAP_EPROTO,
                "ops list %llu inputs and outputs but tensors holds %zu",
                (unsigned long long)want_tensors, m->n_tensors);
  CHECK_RC(check_tensors(c, m->tensors, m->n_tensors, "tensors"));

  size_t nd = m->n_decl_id;
  CHECK_RC(check_count(c, nd, "declarations"));
  if (m->n_decl_bytes != nd || m->n_decl_kind != nd)
    return FAIL(c, CAP_EPROTO,
                "decl columns differ in length (id %zu, bytes %zu, kind %zu)",
                nd, m->n_decl_bytes, m->n_decl_kind);
  CHECK_RC(check_tensors(c, m->decl_id, nd, "decl_id"));
  for (size_t i = 0; i < nd; i++)
    if ((int)m->decl_kind[i] < 0 || (int)m->decl_kind[i] > 2)
      return FAIL(c, CAP_ERANGE, "decl_kind[%zu] = %d is not a tensor kind", i,
                  (int)m->decl_kind[i]);

  CHECK_RC(check_count(c, m->n_no_evict, "no_evict marks"));
  CHECK_RC(check_tensors(c, m->no_evict, m->n_no_evict, "no_evict"));

  size_t nf = m->n_free_t_ns;
  CHECK_RC(check_count(c, nf, "frees"));
  if (m->n_free_tensor != nf)
    return FAIL(c, CAP_EPROTO, "free columns differ in length (t_ns %zu, "
                "tensor %zu)", nf, m->n_free_tensor);
  for (size_t i = 0; i < nf; i++)
    if (m->free_t_ns[i] < 0)
      return FAIL(c, CAP_ERANGE, "free_t_ns[%zu] = %lld is negative", i,
                  (long long)m->free_t_ns[i]);
  return check_tensors(c, m->free_tensor, nf, "free_tensor");
}

static int v_free(vctx_t *c, const Capuchin__Free *m) {
  NEED(c, m, t_ns);
  CHECK_RC(check_ns(c, m->t_ns, "t_ns"));
  NEED(c, m, tensor);
  return check_tensor(c, m->tensor, "tensor");
}

static int v_iteration_end(vctx_t *c, const Capuchin__IterationEnd *m) {
  NEED(c, m, iteration);
  if (m->iteration == 0)
    return FAIL(c, CAP_ERANGE, "iteration 0 (the first is 1)");
  NEED(c, m, iter_ns);
  CHECK_RC(check_ns(c, m->iter_ns, "iter_ns"));
  NEED(c, m, peak_bytes);
  NEED(c, m, bytes_out);
  NEED(c, m, bytes_in);
  NEED(c, m, stall_ns);
  CHECK_RC(check_ns(c, m->stall_ns, "stall_ns"));
  NEED(c, m, measured);
  NEED(c, m, incomplete);
  NEED(c, m, mode);
  if (m->mode != CAPUCHIN__MODE__MODE_MEASURED &&
      m->mode != CAPUCHIN__MODE__MODE_GUIDED &&
      m->mode != CAPUCHIN__MODE__MODE_PASSIVE)
    return FAIL(c, CAP_ERANGE, "mode %d is not a mode", (int)m->mode);
  if (m->has_recompute_ns)
    CHECK_RC(check_ns(c, m->recompute_ns, "recompute_ns"));
  CHECK_RC(check_str(c, m->error, "error", false, false, c->lim->max_name_len));
  CHECK_RC(check_count(c, m->n_failed_actions, "failed_actions"));
  for (size_t i = 0; i < m->n_failed_actions; i++) {
    const Capuchin__ActionKey *a = m->failed_actions[i];
    if (!a || !a->has_tensor || !a->has_evict_after_access)
      return FAIL(c, CAP_EINVAL, "failed_actions[%zu]: missing %s", i,
                  !a ? "entry" : !a->has_tensor ? "tensor" : "evict_after_access");
    if (a->tensor >= c->lim->max_tensor_id)
      return FAIL(c, CAP_ERANGE, "failed_actions[%zu]: tensor %u out of range",
                  i, a->tensor);
    if (a->evict_after_access == 0)
      return FAIL(c, CAP_ERANGE, "failed_actions[%zu]: evict_after_access 0",
                  i);
  }
  return 0;
}

static int v_feedback(vctx_t *c, const Capuchin__Feedback *m) {
  NEED(c, m, plan_version);
  if (m->plan_version == 0)
    return FAIL(c, CAP_ERANGE, "plan_version 0");
  NEED(c, m, iteration);
  CHECK_RC(check_count(c, m->n_stalls, "stalls"));
  for (size_t i = 0; i < m->n_stalls; i++) {
    const Capuchin__PrefetchStall *s = m->stalls[i];
    if (!s || !s->has_tensor || !s->has_back_access || !s->has_stall_ns)
      return FAIL(c, CAP_EINVAL, "stalls[%zu]: missing %s", i,
                  !s                   ? "entry"
                  : !s->has_tensor     ? "tensor"
                  : !s->has_back_access ? "back_access"
                                        : "stall_ns");
    if (s->tensor >= c->lim->max_tensor_id)
      return FAIL(c, CAP_ERANGE, "stalls[%zu]: tensor %u out of range", i,
                  s->tensor);
    if (s->back_access < 2)
      return FAIL(c, CAP_ERANGE, "stalls[%zu]: back_access %u (must be >= 2)",
                  i, s->back_access);
    if (s->stall_ns < 0)
      return FAIL(c, CAP_ERANGE, "stalls[%zu]: stall_ns %lld is negative", i,
                  (long long)s->stall_ns);
  }
  return 0;
}

static int v_action(vctx_t *c, const Capuchin__PlanAction *a, size_t i) {
  if (!a)
    return FAIL(c, CAP_EINVAL, "actions[%zu] missing", i);
  if (!a->has_tensor || !a->has_evict_after_access || !a->has_method)
    return FAIL(c, CAP_EINVAL, "actions[%zu]: missing %s", i,
                !a->has_tensor               ? "tensor"
                : !a->has_evict_after_access ? "evict_after_access"
                                             : "method");
  if (a->tensor >= c->lim->max_tensor_id)
    return FAIL(c, CAP_ERANGE, "actions[%zu]: tensor %u out of range", i,
                a->tensor);
  /* k + 1 is the back-access and must be a valid access number too. */
  if (a->evict_after_access < 1 || a->evict_after_access >= c->lim->max_op_seq)
    return FAIL(c, CAP_ERANGE, "actions[%zu]: evict_after_access %u out of "
                "range", i, a->evict_after_access);
  if (a->has_flags && (a->flags & ~(uint32_t)CAP_ACTION_SYNC_OUT))
    return FAIL(c, CAP_ERANGE, "actions[%zu]: unknown flags 0x%x", i,
                a->flags & ~(uint32_t)CAP_ACTION_SYNC_OUT);
  if (a->has_prefetch_tensor != a->has_prefetch_access)
    return FAIL(c, CAP_EPROTO, "actions[%zu]: prefetch_tensor and "
                "prefetch_access must come together", i);
  switch (a->method) {
  case CAPUCHIN__METHOD__METHOD_SWAP:
    if (a->n_recompute_ops)
      return FAIL(c, CAP_EPROTO, "actions[%zu]: swap with recompute_ops", i);
    if (a->has_prefetch_tensor) {
      if (a->prefetch_tensor >= c->lim->max_tensor_id)
        return FAIL(c, CAP_ERANGE, "actions[%zu]: prefetch_tensor %u out of "
                    "range", i, a->prefetch_tensor);
      if (a->prefetch_access < 1 || a->prefetch_access >= c->lim->max_op_seq)
        return FAIL(c, CAP_ERANGE, "actions[%zu]: prefetch_access %u out of "
                    "range", i, a->prefetch_access);
    }
    return 0;
  case CAPUCHIN__METHOD__METHOD_RECOMPUTE:
    if (a->has_prefetch_tensor)
      return FAIL(c, CAP_EPROTO, "actions[%zu]: recompute with a prefetch", i);
    /* no ops: a release after the last access (plan.h) */
    CHECK_RC(check_count(c, a->n_recompute_ops, "recompute_ops"));
    for (size_t j = 0; j < a->n_recompute_ops; j++)
      if (a->recompute_ops[j] >= c->lim->max_op_seq)
        return FAIL(c, CAP_ERANGE, "actions[%zu]: recompute_ops[%zu] = %u out "
                    "of range", i, j, a->recompute_ops[j]);
    return 0;
  default:
    return FAIL(c, CAP_ERANGE, "actions[%zu]: method %d is not a method", i,
                (int)a->method);
  }
}

static int v_block(vctx_t *c, const Capuchin__Plan *m, size_t i) {
  const Capuchin__PlanBlock *b = m->blocks[i];
  if (!b)
    return FAIL(c, CAP_EINVAL, "blocks[%zu] missing", i);
  if (!b->has_tensor || !b->has_kind || !b->has_offset || !b->has_bytes ||
      !b->has_start_ns || !b->has_end_ns)
    return FAIL(c, CAP_EINVAL, "blocks[%zu]: missing a field (tensor, kind, "
                "offset, bytes, start_ns, end_ns)", i);
  if (b->tensor >= c->lim->max_tensor_id)
    return FAIL(c, CAP_ERANGE, "blocks[%zu]: tensor %u out of range", i,
                b->tensor);
  if ((int)b->kind < CAPUCHIN__BLOCK_KIND__BLOCK_FIRST_TOUCH ||
      (int)b->kind > CAPUCHIN__BLOCK_KIND__BLOCK_PERSISTENT)
    return FAIL(c, CAP_ERANGE, "blocks[%zu]: kind %d is not a kind", i,
                (int)b->kind);
  if (b->has_action && b->action >= m->n_actions)
    return FAIL(c, CAP_ERANGE, "blocks[%zu]: action %u of %zu", i, b->action,
                m->n_actions);
  if (b->bytes == 0 || b->offset > m->arena_bytes ||
      b->bytes > m->arena_bytes - b->offset)
    return FAIL(c, CAP_ERANGE, "blocks[%zu]: %llu+%llu outside the arena of "
                "%llu bytes", i, (unsigned long long)b->offset,
                (unsigned long long)b->bytes,
                (unsigned long long)m->arena_bytes);
  CHECK_RC(check_ns(c, b->start_ns, "blocks.start_ns"));
  if (b->end_ns <= b->start_ns)
    return FAIL(c, CAP_ERANGE, "blocks[%zu]: ends at %lld, not after its start "
                "at %lld", i, (long long)b->end_ns, (long long)b->start_ns);
  if ((b->has_share && b->share >= m->n_blocks) ||
      (b->has_same_as && b->same_as >= m->n_blocks))
    return FAIL(c, CAP_ERANGE, "blocks[%zu]: names block %u of %zu", i,
                b->has_share && b->share >= m->n_blocks ? b->share : b->same_as,
                m->n_blocks);
  return 0;
}

static int v_plan(vctx_t *c, const Capuchin__Plan *m) {
  NEED(c, m, version);
  if (m->version == 0)
    return FAIL(c, CAP_ERANGE, "version 0");
  NEED(c, m, budget_bytes);
  /* The policy name must fit cap_plan_t.policy with its NUL. */
  size_t pmax = sizeof(((cap_plan_t *)0)->policy) - 1;
  CHECK_RC(check_str(c, m->policy, "policy", true, true, pmax));
  if (m->has_predicted_iter_ns)
    CHECK_RC(check_ns(c, m->predicted_iter_ns, "predicted_iter_ns"));
  CHECK_RC(check_count(c, m->n_actions, "actions"));
  uint64_t total_ops = 0;
  for (size_t i = 0; i < m->n_actions; i++) {
    CHECK_RC(v_action(c, m->actions[i], i));
    total_ops += m->actions[i]->n_recompute_ops;
  }
  if (total_ops > c->lim->max_items)
    return FAIL(c, CAP_ERANGE, "%llu recompute ops in all, limit %u",
                (unsigned long long)total_ops, c->lim->max_items);
  CHECK_RC(check_count(c, m->n_blocks, "blocks"));
  if (m->n_blocks && !m->has_arena_bytes)
    return FAIL(c, CAP_EINVAL, "blocks without arena_bytes");
  for (size_t i = 0; i < m->n_blocks; i++)
    CHECK_RC(v_block(c, m, i));
  return 0;
}

static int v_plan_ack(vctx_t *c, const Capuchin__PlanAck *m) {
  NEED(c, m, version);
  if (m->version == 0)
    return FAIL(c, CAP_ERANGE, "version 0");
  return 0;
}

static int v_budget_ack(vctx_t *c, const Capuchin__BudgetAck *m) {
  NEED(c, m, budget_bytes);
  if (m->budget_bytes == 0)
    return FAIL(c, CAP_ERANGE, "budget_bytes 0");
  NEED(c, m, device_bytes);
  return 0;
}

static int v_error(vctx_t *c, const Capuchin__Error *m) {
  NEED(c, m, code);
  if (m->code >= 0)
    return FAIL(c, CAP_ERANGE, "code %d is not negative", m->code);
  return check_str(c, m->message, "message", true, false, c->lim->max_name_len);
}

static int v_bye(vctx_t *c, const Capuchin__Bye *m) {
  return check_str(c, m->reason, "reason", false, false, c->lim->max_name_len);
}

static int v_budget_update(vctx_t *c, const Capuchin__BudgetUpdate *m) {
  NEED(c, m, budget_bytes);
  if (m->has_min_budget_bytes && m->min_budget_bytes == 0)
    return FAIL(c, CAP_ERANGE, "min_budget_bytes must be > 0");
  return check_str(c, m->reason, "reason", false, false, c->lim->max_name_len);
}

/* protobuf-c keeps fields it does not know (a newer peer's additions) but
 * accepts a tag of field number 0 when it comes as a non-canonical varint,
 * which it would then re-encode as bytes no decoder accepts. Refuse such
 * tags in this message and every nested one. */
static int check_unknown_fields(const vctx_t *c, const ProtobufCMessage *m) {
  for (unsigned i = 0; i < m->n_unknown_fields; i++)
    if (m->unknown_fields[i].tag == 0)
      return FAIL(c, CAP_EPROTO, "field number 0 in %s", m->descriptor->short_name);
  const ProtobufCMessageDescriptor *desc = m->descriptor;
  for (unsigned f = 0; f < desc->n_fields; f++) {
    const ProtobufCFieldDescriptor *fd = &desc->fields[f];
    if (fd->type != PROTOBUF_C_TYPE_MESSAGE)
      continue;
    const char *base = (const char *)m;
    if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      if (*(const uint32_t *)(base + fd->quantifier_offset) != fd->id)
        continue;
    }
    if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + fd->quantifier_offset);
      ProtobufCMessage *const *arr =
          *(ProtobufCMessage *const *const *)(base + fd->offset);
      for (size_t k = 0; k < n; k++)
        if (arr[k])
          CHECK_RC(check_unknown_fields(c, arr[k]));
    } else {
      const ProtobufCMessage *sub =
          *(const ProtobufCMessage *const *)(base + fd->offset);
      if (sub)
        CHECK_RC(check_unknown_fields(c, sub));
    }
  }
  return 0;
}

int cap__frame_validate(const Capuchin__Envelope *env,
                        const cap_frame_limits_t *lim, cap__strlen_fn wire_len,
                        void *ctx, char *err, size_t err_len) {
  cap_frame_limits_t l;
  cap__frame_limits_resolve(lim, &l);
  vctx_t c = {&l, wire_len, ctx, err, err_len, "envelope"};
  if (!env)
    return FAIL(&c, CAP_EINVAL, "no envelope");
  c.msg = cap_frame_msg_name(env);
  CHECK_RC(check_unknown_fields(&c, &env->base));
  switch (env->msg_case) {
  case CAPUCHIN__ENVELOPE__MSG__NOT_SET:
    return FAIL(&c, CAP_EINVAL, "no message set (unknown or empty envelope)");
  case CAPUCHIN__ENVELOPE__MSG_HELLO:
    NEED_PTR(&c, env, hello);
    return v_hello(&c, env->hello);
  case CAPUCHIN__ENVELOPE__MSG_WELCOME:
    NEED_PTR(&c, env, welcome);
    return v_welcome(&c, env->welcome);
  case CAPUCHIN__ENVELOPE__MSG_TENSOR_DECL:
    NEED_PTR(&c, env, tensor_decl);
    return v_tensor_decl(&c, env->tensor_decl);
  case CAPUCHIN__ENVELOPE__MSG_OP_RECORD:
    NEED_PTR(&c, env, op_record);
    return v_op_record(&c, env->op_record, "op", 0);
  case CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH:
    NEED_PTR(&c, env, access_batch);
    return v_access_batch(&c, env->access_batch);
  case CAPUCHIN__ENVELOPE__MSG_FREE:
    NEED_PTR(&c, env, free);
    return v_free(&c, env->free);
  case CAPUCHIN__ENVELOPE__MSG_ITERATION_END:
    NEED_PTR(&c, env, iteration_end);
    return v_iteration_end(&c, env->iteration_end);
  case CAPUCHIN__ENVELOPE__MSG_FEEDBACK:
    NEED_PTR(&c, env, feedback);
    return v_feedback(&c, env->feedback);
  case CAPUCHIN__ENVELOPE__MSG_PLAN:
    NEED_PTR(&c, env, plan);
    return v_plan(&c, env->plan);
  case CAPUCHIN__ENVELOPE__MSG_PLAN_ACK:
    NEED_PTR(&c, env, plan_ack);
    return v_plan_ack(&c, env->plan_ack);
  case CAPUCHIN__ENVELOPE__MSG_ERROR:
    NEED_PTR(&c, env, error);
    return v_error(&c, env->error);
  case CAPUCHIN__ENVELOPE__MSG_BYE:
    NEED_PTR(&c, env, bye);
    return v_bye(&c, env->bye);
  case CAPUCHIN__ENVELOPE__MSG_BUDGET_UPDATE:
    NEED_PTR(&c, env, budget_update);
    return v_budget_update(&c, env->budget_update);
  case CAPUCHIN__ENVELOPE__MSG_BUDGET_ACK:
    NEED_PTR(&c, env, budget_ack);
    return v_budget_ack(&c, env->budget_ack);
  default:
    return FAIL(&c, CAP_EINVAL, "unknown message case %d", (int)env->msg_case);
  }
}

int cap_frame_validate(const Capuchin__Envelope *env,
                       const cap_frame_limits_t *lim, char *err,
                       size_t err_len) {
  return cap__frame_validate(env, lim, NULL, NULL, err, err_len);
}
