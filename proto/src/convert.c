/*
 * Policy types <-> wire messages. Messages built here are malloc'd trees laid
 * out exactly as protobuf-c's unpacker lays them out, so one call
 * (protobuf_c_message_free_unpacked with the system allocator) frees them.
 */
#include <stdlib.h>
#include <string.h>

#include "capuchin/proto.h"
#include "proto_internal.h"

void cap_proto_msg_free(void *msg) {
  if (msg)
    protobuf_c_message_free_unpacked(msg, NULL);
}

static const ProtobufCFieldDescriptor *
envelope_field_for(const ProtobufCMessageDescriptor *desc) {
  for (unsigned i = 0; i < capuchin__envelope__descriptor.n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &capuchin__envelope__descriptor.fields[i];
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && f->descriptor == desc)
      return f;
  }
  return NULL;
}

int cap_proto_envelope_set(Capuchin__Envelope *env, void *msg) {
  if (!env || !msg)
    return CAP_EINVAL;
  const ProtobufCMessage *m = msg;
  const ProtobufCFieldDescriptor *f = envelope_field_for(m->descriptor);
  if (!f)
    return CAP_EINVAL;
  env->msg_case = (Capuchin__Envelope__MsgCase)f->id;
  *(void **)((char *)env + f->offset) = msg;
  return 0;
}

void *cap_proto_envelope_get(const Capuchin__Envelope *env) {
  if (!env || env->msg_case == CAPUCHIN__ENVELOPE__MSG__NOT_SET)
    return NULL;
  for (unsigned i = 0; i < capuchin__envelope__descriptor.n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &capuchin__envelope__descriptor.fields[i];
    if (f->id == (uint32_t)env->msg_case)
      return *(void *const *)((const char *)env + f->offset);
  }
  return NULL;
}

int cap_proto_error_frame(int code, const char *message, uint8_t **out,
                          size_t *out_len) {
  if (code >= 0)
    return CAP_EINVAL;
  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  char text[4097];
  const char *src = message ? message : cap_strerror(code);
  size_t n = strlen(src);
  if (n > lim.max_name_len)
    n = lim.max_name_len;
  if (n > sizeof text - 1)
    n = sizeof text - 1;
  memcpy(text, src, n);
  text[n] = '\0';
  Capuchin__Error e = CAPUCHIN__ERROR__INIT;
  e.has_code = 1;
  e.code = code;
  e.message = text;
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  env.msg_case = CAPUCHIN__ENVELOPE__MSG_ERROR;
  env.error = &e;
  return cap_frame_encode_alloc(&env, 0, out, out_len);
}

/* --- Plans ----------------------------------------------------------------- */

/* The rules cap_frame_validate applies to a received PlanAction, applied to
 * a cap_action_t before it is sent. */
static bool action_ok(const cap_plan_t *plan, const cap_action_t *a) {
  const uint32_t lim = 1u << 31;
  if (a->tensor >= lim || a->evict_after_access < 1 ||
      a->evict_after_access >= lim || (a->flags & ~(uint32_t)CAP_ACTION_SYNC_OUT))
    return false;
  switch (a->method) {
  case CAP_METHOD_SWAP:
    if (a->n_recompute)
      return false;
    if (a->prefetch_tensor != CAP_NONE &&
        (a->prefetch_tensor >= lim || a->prefetch_access < 1 ||
         a->prefetch_access >= lim))
      return false;
    return true;
  case CAP_METHOD_RECOMPUTE:
    if (a->recompute_off > plan->n_recompute_ops ||
        a->n_recompute > plan->n_recompute_ops - a->recompute_off)
      return false;
    for (uint32_t j = 0; j < a->n_recompute; j++)
      if (plan->recompute_ops[a->recompute_off + j] >= lim)
        return false;
    return true;
  default:
    return false;
  }
}

/* Block kinds cross the wire as their cap_residency_kind_t values. */
_Static_assert((int)CAPUCHIN__BLOCK_KIND__BLOCK_FIRST_TOUCH == (int)CAP_RESIDENCY_FIRST_TOUCH &&
                   (int)CAPUCHIN__BLOCK_KIND__BLOCK_SWAPPED_IN == (int)CAP_RESIDENCY_SWAPPED_IN &&
                   (int)CAPUCHIN__BLOCK_KIND__BLOCK_RECOMPUTED == (int)CAP_RESIDENCY_RECOMPUTED &&
                   (int)CAPUCHIN__BLOCK_KIND__BLOCK_TEMPORARY == (int)CAP_RESIDENCY_TEMPORARY &&
                   (int)CAPUCHIN__BLOCK_KIND__BLOCK_PERSISTENT == (int)CAP_RESIDENCY_PERSISTENT,
               "BlockKind and cap_residency_kind_t must agree");

int cap_proto_plan_to_msg(const cap_plan_t *plan, Capuchin__Plan **out) {
  *out = NULL;
  if (!plan || plan->policy[0] == '\0' ||
      memchr(plan->policy, '\0', sizeof plan->policy) == NULL ||
      plan->predicted_iter_ns < 0 || plan->version == 0 ||
      (plan->n_actions && !plan->actions))
    return CAP_EINVAL;
  for (uint32_t i = 0; i < plan->n_actions; i++)
    if (!action_ok(plan, &plan->actions[i]))
      return CAP_EINVAL;

  int rc = CAP_ENOMEM;
  Capuchin__Plan *m = malloc(sizeof *m);
  if (!m)
    return CAP_ENOMEM;
  capuchin__plan__init(m);
  m->has_version = 1;
  m->version = plan->version;
  m->has_budget_bytes = 1;
  m->budget_bytes = plan->budget_bytes;
  m->policy = strdup(plan->policy);
  if (!m->policy)
    goto out_free;
  m->has_predicted_iter_ns = 1;
  m->predicted_iter_ns = plan->predicted_iter_ns;
  m->has_predicted_peak_bytes = 1;
  m->predicted_peak_bytes = plan->predicted_peak_bytes;
  if (plan->n_actions) {
    m->actions = calloc(plan->n_actions, sizeof *m->actions);
    if (!m->actions)
      goto out_free;
  }
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    Capuchin__PlanAction *pa = malloc(sizeof *pa);
    if (!pa)
      goto out_free;
    capuchin__plan_action__init(pa);
    m->actions[m->n_actions++] = pa; /* owned by m from here on */
    pa->has_tensor = 1;
    pa->tensor = a->tensor;
    pa->has_evict_after_access = 1;
    pa->evict_after_access = a->evict_after_access;
    pa->has_method = 1;
    pa->method = a->method == CAP_METHOD_SWAP
                     ? CAPUCHIN__METHOD__METHOD_SWAP
                     : CAPUCHIN__METHOD__METHOD_RECOMPUTE;
    if (a->flags) {
      pa->has_flags = 1;
      pa->flags = a->flags;
    }
    if (a->method == CAP_METHOD_SWAP && a->prefetch_tensor != CAP_NONE) {
      pa->has_prefetch_tensor = pa->has_prefetch_access = 1;
      pa->prefetch_tensor = a->prefetch_tensor;
      pa->prefetch_access = a->prefetch_access;
    }
    if (a->method == CAP_METHOD_RECOMPUTE && a->n_recompute) {
      pa->recompute_ops = malloc((size_t)a->n_recompute * sizeof(uint32_t));
      if (!pa->recompute_ops)
        goto out_free;
      memcpy(pa->recompute_ops, cap_action_recompute_ops(plan, a),
             (size_t)a->n_recompute * sizeof(uint32_t));
      pa->n_recompute_ops = a->n_recompute;
    }
  }
  if (plan->n_blocks) {
    m->blocks = calloc(plan->n_blocks, sizeof *m->blocks);
    if (!m->blocks)
      goto out_free;
    m->has_arena_bytes = 1;
    m->arena_bytes = plan->arena_bytes;
  }
  for (uint32_t i = 0; i < plan->n_blocks; i++) {
    const cap_block_t *b = &plan->blocks[i];
    Capuchin__PlanBlock *pb = malloc(sizeof *pb);
    if (!pb)
      goto out_free;
    capuchin__plan_block__init(pb);
    m->blocks[m->n_blocks++] = pb;
    pb->has_tensor = pb->has_kind = pb->has_offset = pb->has_bytes = 1;
    pb->has_start_ns = pb->has_end_ns = 1;
    pb->tensor = b->tensor;
    pb->kind = (Capuchin__BlockKind)b->kind;
    pb->offset = b->offset;
    pb->bytes = b->bytes;
    pb->start_ns = b->start_ns;
    pb->end_ns = b->end_ns;
    if (b->action != CAP_NONE) {
      pb->has_action = 1;
      pb->action = b->action;
    }
    if (b->share != CAP_NONE) {
      pb->has_share = 1;
      pb->share = b->share;
    }
    if (b->same_as != CAP_NONE) {
      pb->has_same_as = 1;
      pb->same_as = b->same_as;
    }
  }
  *out = m;
  return 0;

out_free:
  cap_proto_msg_free(m);
  return rc;
}

int cap_proto_plan_from_msg(const Capuchin__Plan *msg,
                            const cap_frame_limits_t *lim, cap_plan_t **out,
                            char *err, size_t err_len) {
  *out = NULL;
  if (!msg)
    return cap__proto_fail(err, err_len, CAP_EINVAL, "plan: no message");
  /* The same checks as for a received frame (the message may have been
   * built or modified locally). */
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  env.msg_case = CAPUCHIN__ENVELOPE__MSG_PLAN;
  env.plan = (Capuchin__Plan *)msg;
  int rc = cap_frame_validate(&env, lim, err, err_len);
  if (rc < 0)
    return rc;
  if (msg->n_actions > UINT32_MAX)
    return cap__proto_fail(err, err_len, CAP_ERANGE, "plan: too many actions");

  cap_plan_t *plan = cap_plan_create(msg->policy, msg->budget_bytes);
  if (!plan)
    goto out_nomem;
  plan->version = msg->version;
  plan->predicted_iter_ns = msg->has_predicted_iter_ns ? msg->predicted_iter_ns : 0;
  plan->predicted_peak_bytes =
      msg->has_predicted_peak_bytes ? msg->predicted_peak_bytes : 0;
  for (size_t i = 0; i < msg->n_actions; i++) {
    const Capuchin__PlanAction *a = msg->actions[i];
    uint32_t flags = a->has_flags ? a->flags : 0;
    if (a->method == CAPUCHIN__METHOD__METHOD_SWAP) {
      rc = cap_plan_add_swap(plan, a->tensor, a->evict_after_access,
                             a->has_prefetch_tensor ? a->prefetch_tensor : CAP_NONE,
                             a->has_prefetch_access ? a->prefetch_access : 0, flags);
    } else {
      rc = cap_plan_add_recompute(plan, a->tensor, a->evict_after_access,
                                  a->recompute_ops, (uint32_t)a->n_recompute_ops);
      if (rc == 0)
        plan->actions[plan->n_actions - 1].flags = flags;
    }
    if (rc == CAP_ENOMEM)
      goto out_nomem;
    if (rc < 0) {
      /* validate() accepted what the plan container refuses: report it
       * rather than drop the action silently. */
      cap_plan_destroy(plan);
      return cap__proto_fail(err, err_len, rc, "plan: actions[%zu]: %s", i,
                             cap_strerror(rc));
    }
  }
  if (msg->n_blocks > UINT32_MAX) {
    cap_plan_destroy(plan);
    return cap__proto_fail(err, err_len, CAP_ERANGE, "plan: too many blocks");
  }
  if (msg->n_blocks) {
    plan->blocks = malloc(msg->n_blocks * sizeof *plan->blocks);
    if (!plan->blocks)
      goto out_nomem;
    plan->n_blocks = (uint32_t)msg->n_blocks;
    plan->arena_bytes = msg->arena_bytes;
  }
  for (size_t i = 0; i < msg->n_blocks; i++) {
    const Capuchin__PlanBlock *b = msg->blocks[i];
    plan->blocks[i] = (cap_block_t){
        .tensor = b->tensor, .kind = (cap_residency_kind_t)b->kind,
        .action = b->has_action ? b->action : CAP_NONE,
        .offset = b->offset, .bytes = b->bytes,
        .start_ns = b->start_ns, .end_ns = b->end_ns,
        .share = b->has_share ? b->share : CAP_NONE,
        .same_as = b->has_same_as ? b->same_as : CAP_NONE};
  }
  *out = plan;
  return 0;

out_nomem:
  cap_plan_destroy(plan);
  return cap__proto_fail(err, err_len, CAP_ENOMEM, "plan: out of memory");
}

/* --- Feedback ---------------------------------------------------------------- */

int cap_proto_feedback_to_msg(uint32_t plan_version, uint64_t iteration,
                              const cap_feedback_t *fb, uint32_t n,
                              Capuchin__Feedback **out) {
  *out = NULL;
  if (plan_version == 0 || (n && !fb))
    return CAP_EINVAL;
  for (uint32_t i = 0; i < n; i++)
    if (fb[i].tensor >= (1u << 31) || fb[i].back_access < 2 ||
        fb[i].stall_ns < 0)
      return CAP_EINVAL;
  Capuchin__Feedback *m = malloc(sizeof *m);
  if (!m)
    return CAP_ENOMEM;
  capuchin__feedback__init(m);
  m->has_plan_version = 1;
  m->plan_version = plan_version;
  m->has_iteration = 1;
  m->iteration = iteration;
  if (n) {
    m->stalls = calloc(n, sizeof *m->stalls);
    if (!m->stalls)
      goto out_free;
  }
  for (uint32_t i = 0; i < n; i++) {
    Capuchin__PrefetchStall *s = malloc(sizeof *s);
    if (!s)
      goto out_free;
    capuchin__prefetch_stall__init(s);
    m->stalls[m->n_stalls++] = s;
    s->has_tensor = s->has_back_access = s->has_stall_ns = 1;
    s->tensor = fb[i].tensor;
    s->back_access = fb[i].back_access;
    s->stall_ns = fb[i].stall_ns;
  }
  *out = m;
  return 0;

out_free:
  cap_proto_msg_free(m);
  return CAP_ENOMEM;
}

int cap_proto_feedback_from_msg(const Capuchin__Feedback *msg,
                                cap_feedback_t **out, uint32_t *n) {
  *out = NULL;
  *n = 0;
  if (!msg)
    return CAP_EINVAL;
  if (msg->n_stalls > UINT32_MAX)
    return CAP_ERANGE;
  if (msg->n_stalls == 0)
    return 0;
  cap_feedback_t *fb = malloc(msg->n_stalls * sizeof *fb);
  if (!fb)
    return CAP_ENOMEM;
  for (size_t i = 0; i < msg->n_stalls; i++) {
    const Capuchin__PrefetchStall *s = msg->stalls[i];
    if (!s || s->back_access < 2 || s->stall_ns < 0) {
      free(fb);
      return CAP_EINVAL;
    }
    fb[i].tensor = s->tensor;
    fb[i].back_access = s->back_access;
    fb[i].stall_ns = s->stall_ns;
  }
  *out = fb;
  *n = (uint32_t)msg->n_stalls;
  return 0;
}
