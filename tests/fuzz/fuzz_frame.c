/*
 * libFuzzer driver for the frame decoder (proto/include/capuchin/frame.h).
 *
 * Input: byte 0 seeds the chunk sizes, the rest is the byte stream a peer
 * sends. The stream is fed to a decoder in chunks of 1..64 bytes (so partial
 * headers and payloads are exercised), every whole message is taken out and
 * checked:
 *   - it passes cap_frame_validate() again;
 *   - it re-encodes, and the re-encoded frame decodes to the same bytes;
 *   - the conversions accept it (Plan -> cap_plan_t -> Plan, Feedback ->
 *     cap_feedback_t[], AccessBatch ops iterate to the counts the message
 *     declares);
 * and the decoder's allocation accounting returns to zero at the end.
 * Small limits (64 KiB frames, 1 MiB of unpacked data) make the limits
 * reachable. Any violation aborts, which libFuzzer reports as a finding.
 *
 * Seeds: tests/fuzz/corpus/frame/, written by
 *   CAP_FRAME_CORPUS_OUT=tests/fuzz/corpus/frame <build>/bin/proto_test_frame
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/frame.h"
#include "capuchin/proto.h"

#define FUZZ_CHECK(cond)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_frame: %s:%d: check failed: %s\n", __FILE__,       \
              __LINE__, #cond);                                                \
      abort();                                                                 \
    }                                                                          \
  } while (0)

static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(*len ? *len : 1);
  FUZZ_CHECK(b);
  FUZZ_CHECK(protobuf_c_message_pack(m, b) == *len);
  return b;
}

static void check_message(const Capuchin__Envelope *env,
                          const cap_frame_limits_t *lim) {
  char err[256];
  FUZZ_CHECK(cap_frame_validate(env, lim, err, sizeof err) == 0);

  /* Re-encode and decode again: the same message. */
  uint8_t *frame;
  size_t flen;
  FUZZ_CHECK(cap_frame_encode_alloc(env, 0, &frame, &flen) == 0);
  cap_frame_decoder_t *d2 = cap_frame_decoder_create(NULL);
  FUZZ_CHECK(d2);
  FUZZ_CHECK(cap_frame_decoder_feed(d2, frame, flen) == 0);
  Capuchin__Envelope *again = NULL;
  FUZZ_CHECK(cap_frame_decoder_next(d2, &again, err, sizeof err) == 1);
  size_t la, lb;
  uint8_t *a = pack(&env->base, &la), *b = pack(&again->base, &lb);
  FUZZ_CHECK(la == lb && memcmp(a, b, la) == 0);
  free(a);
  free(b);
  cap_frame_decoder_release(d2, again);
  FUZZ_CHECK(cap_frame_decoder_allocated(d2) == 0);
  cap_frame_decoder_destroy(d2);
  free(frame);

  switch (env->msg_case) {
  case CAPUCHIN__ENVELOPE__MSG_PLAN: {
    cap_plan_t *plan = NULL;
    int rc = cap_proto_plan_from_msg(env->plan, lim, &plan, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == CAP_ENOMEM);
    if (rc == 0) {
      FUZZ_CHECK(plan->n_actions == env->plan->n_actions);
      Capuchin__Plan *m = NULL;
      FUZZ_CHECK(cap_proto_plan_to_msg(plan, &m) == 0);
      FUZZ_CHECK(m->n_actions == env->plan->n_actions);
      cap_proto_msg_free(m);
    }
    cap_plan_destroy(plan);
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_FEEDBACK: {
    cap_feedback_t *fb = NULL;
    uint32_t n = 0;
    FUZZ_CHECK(cap_proto_feedback_from_msg(env->feedback, &fb, &n) == 0);
    FUZZ_CHECK(n == env->feedback->n_stalls);
    free(fb);
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH: {
    const Capuchin__AccessBatch *m = env->access_batch;
    cap_proto_op_iter_t it;
    cap_proto_op_view_t op;
    size_t ops = 0, tensors = 0;
    cap_proto_op_iter_init(&it, m);
    while (cap_proto_op_iter_next(&it, &op)) {
      FUZZ_CHECK(op.name && op.end_ns >= op.start_ns && op.start_ns >= 0);
      for (uint32_t i = 0; i < op.n_in; i++)
        FUZZ_CHECK(op.in[i] < lim->max_tensor_id);
      for (uint32_t i = 0; i < op.n_out; i++)
        FUZZ_CHECK(op.out[i] < lim->max_tensor_id);
      if (ops >= m->n_ops)
        tensors += (size_t)op.n_in + op.n_out;
      ops++;
    }
    FUZZ_CHECK(ops == m->n_ops + m->n_op_seq);
    FUZZ_CHECK(tensors == m->n_tensors);
    break;
  }
  default:
    break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint32_t seed = data[0] * 2654435761u + 1;
  data++;
  size--;

  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  lim.max_frame_bytes = 64 << 10;
  lim.max_buffer_bytes = 0; /* follows max_frame_bytes */
  lim.max_alloc_bytes = 1 << 20;
  cap_frame_decoder_t *d = cap_frame_decoder_create(&lim);
  FUZZ_CHECK(d);
  cap_frame_limits_t used;
  memcpy(&used, &lim, sizeof used);
  used.max_buffer_bytes = 2 * used.max_frame_bytes + (64u << 10);

  size_t off = 0;
  while (off < size) {
    seed ^= seed << 13;
    seed ^= seed >> 17;
    seed ^= seed << 5;
    size_t chunk = 1 + seed % 64;
    if (chunk > size - off)
      chunk = size - off;
    int rc = cap_frame_decoder_feed(d, data + off, chunk);
    off += chunk;
    if (rc < 0) {
      FUZZ_CHECK(rc == CAP_E2BIG || rc == CAP_EPROTO || rc == CAP_EQUOTA ||
                 rc == CAP_ENOMEM);
      FUZZ_CHECK(cap_frame_decoder_error(d) == rc);
      break;
    }
    for (;;) {
      Capuchin__Envelope *env = NULL;
      char err[256] = "";
      rc = cap_frame_decoder_next(d, &env, err, sizeof err);
      if (rc == 0)
        break;
      if (rc == 1) {
        check_message(env, &used);
        cap_frame_decoder_release(d, env);
        continue;
      }
      /* Every refusal names its reason. */
      FUZZ_CHECK(err[0] != '\0');
      if (cap_frame_decoder_error(d))
        break;
      FUZZ_CHECK(rc == CAP_EPARSE || rc == CAP_EINVAL || rc == CAP_ERANGE ||
                 rc == CAP_EPROTO || rc == CAP_EQUOTA);
    }
    if (cap_frame_decoder_error(d))
      break;
  }
  FUZZ_CHECK(cap_frame_decoder_allocated(d) == 0);
  cap_frame_decoder_destroy(d);
  return 0;
}
