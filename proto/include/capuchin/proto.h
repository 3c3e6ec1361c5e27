/*
 * Conversions between the policy library's types and the wire messages,
 * shared by the daemon and the client so that both sides agree byte for
 * byte: plans (cap_plan_t <-> Plan), feedback (cap_feedback_t <->
 * Feedback), a builder for compact AccessBatch frames (the client's reporter
 * thread) and an iterator over the ops of a received batch (the daemon's
 * tracker), plus small helpers for envelopes and Error frames.
 *
 * Messages built here (the *_to_msg functions) are malloc'd trees; free them
 * with cap_proto_msg_free(). Messages from a decoder are released with
 * cap_frame_decoder_release() instead. All functions are reentrant; a
 * cap_proto_batch_t belongs to one thread at a time.
 */
#ifndef CAPUCHIN_PROTO_H
#define CAPUCHIN_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capuchin/frame.h"
#include "capuchin/plan.h"
#include "capuchin/planner.h"
#include "capuchin/profile.h"

/* Free a message tree built by a cap_proto_*_to_msg function. NULL: no-op. */
void cap_proto_msg_free(void *msg);

/* Point env at msg (any message of the envelope's oneof, e.g. a
 * Capuchin__Hello *) and set msg_case from msg's descriptor. CAP_EINVAL if
 * msg is no message of the oneof. env does not own msg. */
int cap_proto_envelope_set(Capuchin__Envelope *env, void *msg);

/* The message an envelope carries (NULL when none); the caller knows its type
 * from env->msg_case. */
void *cap_proto_envelope_get(const Capuchin__Envelope *env);

/* One frame carrying Error{code, message} into a malloc'd buffer (*out, the
 * caller frees). code must be a negative CAP_E* code; message NULL means
 * cap_strerror(code); it is cut to fit the default limits. */
int cap_proto_error_frame(int code, const char *message, uint8_t **out,
                          size_t *out_len);

/* --- Plans ------------------------------------------------------------------ */

/* Plan message for plan (version, budget, policy, predictions, every action
 * with its recompute ops). Checks the plan's own consistency on the way
 * (methods, ids < 2^31, k >= 1, recompute ranges inside recompute_ops,
 * prefetch only for swaps): CAP_EINVAL with nothing allocated when it fails.
 * *out is freed with cap_proto_msg_free(). */
int cap_proto_plan_to_msg(const cap_plan_t *plan, Capuchin__Plan **out);

/* cap_plan_t for a received Plan message, checking every range on the way
 * in (lim NULL: defaults; the same checks as cap_frame_validate plus those of
 * cap_proto_plan_to_msg). Without a profile it cannot check that tensors and
 * accesses exist: the client calls cap_plan_validate() with its profile
 * before executing. *out is the caller's (cap_plan_destroy). Returns 0,
 * CAP_EINVAL / CAP_ERANGE / CAP_EPROTO with a message in err, or
 * CAP_ENOMEM. */
int cap_proto_plan_from_msg(const Capuchin__Plan *msg,
                            const cap_frame_limits_t *lim, cap_plan_t **out,
                            char *err, size_t err_len);

/* --- Feedback --------------------------------------------------------------- */

/* Feedback message for n stalls measured under plan_version in iteration.
 * CAP_EINVAL for an entry out of range. Free with cap_proto_msg_free(). */
int cap_proto_feedback_to_msg(uint32_t plan_version, uint64_t iteration,
                              const cap_feedback_t *fb, uint32_t n,
                              Capuchin__Feedback **out);

/* Copy a (validated) Feedback message's stalls into a malloc'd array *out
 * (NULL when n is 0) of *n entries, ready for cap_plan_refine(). */
int cap_proto_feedback_from_msg(const Capuchin__Feedback *msg,
                                cap_feedback_t **out, uint32_t *n);

/* --- AccessBatch builder (sender) --------------------------------------------
 * Accumulates declarations, ops and frees in the compact column form of
 * AccessBatch, interning op names per batch. Typical reporter loop:
 *   cap_proto_batch_reset(b, iteration);
 *   while (records) { add...; if (cap_proto_batch_bytes(b) > limit) flush; }
 *   cap_proto_batch_append_frame(b, 0, &buf, &len, &cap); send; reset.
 * The add functions check their arguments (CAP_ERANGE: id/seq >= 2^31,
 * negative time, end < start; CAP_EINVAL: bad kind, name empty, longer than
 * the default max_name_len or holding a NUL) so a batch built here always
 * passes cap_frame_validate() with default limits. */
typedef struct cap_proto_batch cap_proto_batch_t;

cap_proto_batch_t *cap_proto_batch_create(void);
void cap_proto_batch_destroy(cap_proto_batch_t *b); /* NULL is a no-op */
/* Empty the batch (keeping its memory) and set the iteration it belongs to. */
void cap_proto_batch_reset(cap_proto_batch_t *b, uint64_t iteration);
int cap_proto_batch_add_decl(cap_proto_batch_t *b, uint32_t id, uint64_t bytes,
                             cap_tensor_kind_t kind);
int cap_proto_batch_add_op(cap_proto_batch_t *b, uint32_t seq,
                           int64_t start_ns, int64_t end_ns, const char *name,
                           const uint32_t *in, uint32_t n_in,
                           const uint32_t *out, uint32_t n_out);
int cap_proto_batch_add_free(cap_proto_batch_t *b, int64_t t_ns,
                             uint32_t tensor);
/* A declared tensor no plan may evict (AccessBatch.no_evict). */
int cap_proto_batch_add_no_evict(cap_proto_batch_t *b, uint32_t tensor);
/* Records the ring dropped (sent as AccessBatch.dropped). */
void cap_proto_batch_set_dropped(cap_proto_batch_t *b, uint64_t dropped);
/* Records held: declarations + ops + frees + no_evict marks. */
size_t cap_proto_batch_records(const cap_proto_batch_t *b);
/* Upper bound of the payload size the batch encodes to now (flush before it
 * nears the peer's max_frame_bytes). */
size_t cap_proto_batch_bytes(const cap_proto_batch_t *b);
/* Append the batch as one frame to a growable buffer (as cap_frame_append);
 * CAP_E2BIG if it exceeds max_frame_bytes (0: default). The batch is kept. */
int cap_proto_batch_append_frame(const cap_proto_batch_t *b,
                                 size_t max_frame_bytes, uint8_t **buf,
                                 size_t *len, size_t *cap);

/* --- AccessBatch reader (receiver) ------------------------------------------
 * Iterates over the ops of a batch that passed cap_frame_validate(): first
 * the full OpRecords, then the compact ones, pointing into the message (no
 * copy; valid while the message is). */
typedef struct cap_proto_op_view {
  uint32_t seq;
  int64_t start_ns;
  int64_t end_ns;
  const char *name;
  const uint32_t *in; /* n_in tensor ids */
  uint32_t n_in;
  const uint32_t *out; /* n_out tensor ids */
  uint32_t n_out;
} cap_proto_op_view_t;

typedef struct cap_proto_op_iter {
  const Capuchin__AccessBatch *batch;
  size_t next;       /* index over ops then op_seq */
  size_t tensor_off; /* position in batch->tensors */
} cap_proto_op_iter_t;

void cap_proto_op_iter_init(cap_proto_op_iter_t *it,
                            const Capuchin__AccessBatch *batch);
/* Fill *op with the next op; false at the end. */
bool cap_proto_op_iter_next(cap_proto_op_iter_t *it, cap_proto_op_view_t *op);

#endif /* CAPUCHIN_PROTO_H */
