/*
 * Framing and validation: every message type round-trips through encode and
 * decode (whole, byte by byte, random splits); truncated, oversized,
 * zero-length and random frames, invalid enums, out-of-range ids, missing
 * fields, embedded NULs and allocation bombs are each refused with an error
 * code and a message, never a crash.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cap_test.h"
#include "capuchin/frame.h"
#include "proto_samples.h"

/* Deterministic PRNG (xorshift64*), so failures reproduce. */
static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rng(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}

/* Packed bytes of a message (malloc'd). */
static uint8_t *pack_msg(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(*len ? *len : 1);
  protobuf_c_message_pack(m, b);
  return b;
}

/* env and got pack to the same bytes: nothing was lost or changed. */
static int same_message(const Capuchin__Envelope *env,
                        const Capuchin__Envelope *got) {
  size_t la, lb;
  uint8_t *a = pack_msg(&env->base, &la);
  uint8_t *b = pack_msg(&got->base, &lb);
  int same = la == lb && memcmp(a, b, la) == 0;
  free(a);
  free(b);
  return same;
}

/* A frame around an arbitrary payload. */
static uint8_t *raw_frame(const void *payload, uint32_t n, size_t *len) {
  uint8_t *f = malloc(4 + (size_t)n);
  f[0] = (uint8_t)(n >> 24), f[1] = (uint8_t)(n >> 16);
  f[2] = (uint8_t)(n >> 8), f[3] = (uint8_t)n;
  if (n)
    memcpy(f + 4, payload, n);
  *len = 4 + (size_t)n;
  return f;
}

/* Encode env with protobuf-c alone (no validation) as a frame. */
static uint8_t *frame_of(const Capuchin__Envelope *env, size_t *len) {
  size_t n;
  uint8_t *p = pack_msg(&env->base, &n);
  uint8_t *f = raw_frame(p, (uint32_t)n, len);
  free(p);
  return f;
}

/* Decode one frame with a fresh decoder; returns next()'s code and, when it
 * is not 1, leaves the message in err. */
static int decode_one(const uint8_t *f, size_t len,
                      const cap_frame_limits_t *lim, char *err, size_t elen) {
  cap_frame_decoder_t *d = cap_frame_decoder_create(lim);
  if (!d)
    return -1000;
  err[0] = '\0';
  int rc = cap_frame_decoder_feed(d, f, len);
  Capuchin__Envelope *env = NULL;
  if (rc == 0)
    rc = cap_frame_decoder_next(d, &env, err, elen);
  else
    (void)cap_frame_decoder_next(d, &env, err, elen);
  cap_frame_decoder_release(d, env);
  if (cap_frame_decoder_allocated(d) != 0)
    rc = -2000; /* a leak in the capped allocator's accounting */
  cap_frame_decoder_destroy(d);
  return rc;
}

/* A BudgetAck must name the budget it confirms. */
static void test_budget_ack_rules(void) {
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_BUDGET_ACK);
  char err[256] = "";
  CHECK_EQ(cap_frame_validate(&s.env, NULL, err, sizeof err), 0);
  s.budget_ack.budget_bytes = 0;
  CHECK_EQ(cap_frame_validate(&s.env, NULL, err, sizeof err), CAP_ERANGE);
  s.budget_ack.budget_bytes = 1;
  s.budget_ack.has_device_bytes = 0;
  CHECK_EQ(cap_frame_validate(&s.env, NULL, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "device_bytes") != NULL);
}

static void test_roundtrip_each_type(void) {
  for (int k = 1; k <= SAMPLE_COUNT; k++) {
    sample_t s;
    sample_fill(&s, k);
    char err[256] = "";
    REQUIRE(cap_frame_validate(&s.env, NULL, err, sizeof err) == 0);
    uint8_t *buf = NULL;
    size_t len = 0;
    REQUIRE(cap_frame_encode_alloc(&s.env, 0, &buf, &len) == 0);
    CHECK_EQ(len, cap_frame_size(&s.env));
    CHECK_EQ(((size_t)buf[0] << 24 | (size_t)buf[1] << 16 |
              (size_t)buf[2] << 8 | buf[3]),
             len - 4);

    cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
    REQUIRE(d);
    CHECK_EQ(cap_frame_decoder_feed(d, buf, len), 0);
    Capuchin__Envelope *got = NULL;
    int rc = cap_frame_decoder_next(d, &got, err, sizeof err);
    if (rc != 1)
      fprintf(stderr, "type %d: %d %s\n", k, rc, err);
    CHECK_EQ(rc, 1);
    if (got) {
      CHECK_EQ(got->msg_case, k);
      CHECK(same_message(&s.env, got));
      CHECK_STR(cap_frame_msg_name(got), cap_frame_msg_name(&s.env));
      CHECK(cap_frame_decoder_allocated(d) > 0);
    }
    cap_frame_decoder_release(d, got);
    CHECK_EQ(cap_frame_decoder_allocated(d), 0);
    Capuchin__Envelope *none = (Capuchin__Envelope *)&s; /* overwritten */
    CHECK_EQ(cap_frame_decoder_next(d, &none, err, sizeof err), 0);
    CHECK(none == NULL);
    CHECK_EQ(cap_frame_decoder_buffered(d), 0);
    cap_frame_decoder_destroy(d);
    free(buf);
  }
}

/* Spot checks of decoded values, beyond the byte comparison. */
static void test_decoded_fields(void) {
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_HELLO);
  uint8_t *buf;
  size_t len;
  REQUIRE(cap_frame_encode_alloc(&s.env, 0, &buf, &len) == 0);
  cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
  REQUIRE(cap_frame_decoder_feed(d, buf, len) == 0);
  Capuchin__Envelope *got;
  char err[256];
  REQUIRE(cap_frame_decoder_next(d, &got, err, sizeof err) == 1);
  CHECK_STR(got->hello->job_name, "resnet50-train");
  CHECK_STR(got->hello->device_name, "NVIDIA H100 80GB HBM3");
  CHECK_STR(got->hello->device_uuid, "GPU-6a0f3c2e-5b1d-4e8f-9a7c-3d2b1e0f4a5c");
  CHECK(got->hello->has_acks_budget && got->hello->acks_budget);
  CHECK(got->hello->h2d_gbps == 55.1 && got->hello->duplex_gbps == 85.8);
  CHECK(got->hello->has_model_signature &&
        got->hello->model_signature == 0x9e3779b97f4a7c15ull);
  CHECK_EQ(got->hello->device_total_bytes, 85899345920ll);
  cap_frame_decoder_release(d, got);
  cap_frame_decoder_destroy(d);
  free(buf);
}

/* All sample frames back to back in one stream. */
static uint8_t *all_frames(size_t *len) {
  uint8_t *buf = NULL;
  size_t cap = 0;
  *len = 0;
  for (int k = 1; k <= SAMPLE_COUNT; k++) {
    sample_t s;
    sample_fill(&s, k);
    if (cap_frame_append(&s.env, 0, &buf, len, &cap) != 0)
      return NULL;
  }
  return buf;
}

/* Feed stream in chunks from chunk(); every message must come out, in order,
 * equal to its sample. */
static void stream_in_chunks(size_t (*chunk)(void)) {
  size_t len;
  uint8_t *stream = all_frames(&len);
  REQUIRE(stream);
  cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
  REQUIRE(d);
  int seen = 0;
  size_t off = 0;
  char err[256];
  while (off < len) {
    size_t n = chunk();
    if (n > len - off)
      n = len - off;
    REQUIRE(cap_frame_decoder_feed(d, stream + off, n) == 0);
    off += n;
    Capuchin__Envelope *got;
    int rc;
    while ((rc = cap_frame_decoder_next(d, &got, err, sizeof err)) == 1) {
      seen++;
      sample_t s;
      sample_fill(&s, seen);
      CHECK_EQ(got->msg_case, seen);
      CHECK(same_message(&s.env, got));
      cap_frame_decoder_release(d, got);
    }
    CHECK_EQ(rc, 0);
  }
  CHECK_EQ(seen, SAMPLE_COUNT);
  CHECK_EQ(cap_frame_decoder_buffered(d), 0);
  CHECK_EQ(cap_frame_decoder_allocated(d), 0);
  cap_frame_decoder_destroy(d);
  free(stream);
}

static size_t one_byte(void) { return 1; }
static size_t random_chunk(void) { return 1 + rng() % 97; }
static size_t everything(void) { return SIZE_MAX; }

static void test_stream_byte_by_byte(void) { stream_in_chunks(one_byte); }
static void test_stream_random_chunks(void) {
  for (int i = 0; i < 50; i++)
    stream_in_chunks(random_chunk);
}
static void test_stream_at_once(void) { stream_in_chunks(everything); }

/* The stream ends mid-frame: the decoder waits for more, never yields. */
static void test_truncated_stream_waits(void) {
  for (int k = 1; k <= SAMPLE_COUNT; k++) {
    sample_t s;
    sample_fill(&s, k);
    uint8_t *buf;
    size_t len;
    REQUIRE(cap_frame_encode_alloc(&s.env, 0, &buf, &len) == 0);
    for (size_t cut = 0; cut < len; cut++) {
      cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
      CHECK_EQ(cap_frame_decoder_feed(d, buf, cut), 0);
      Capuchin__Envelope *got;
      char err[64];
      CHECK_EQ(cap_frame_decoder_next(d, &got, err, sizeof err), 0);
      CHECK(got == NULL);
      CHECK_EQ(cap_frame_decoder_buffered(d), cut);
      CHECK_EQ(cap_frame_decoder_allocated(d), 0);
      cap_frame_decoder_destroy(d);
    }
    free(buf);
  }
}

/* A frame whose payload is cut and whose header says so. The message sits in
 * a length-delimited field of the envelope, so any cut breaks that field and
 * must be refused, with a message. */
static void test_truncated_payload_rejected(void) {
  int refused = 0, total = 0;
  for (int k = 1; k <= SAMPLE_COUNT; k++) {
    sample_t s;
    sample_fill(&s, k);
    size_t plen;
    uint8_t *p = pack_msg(&s.env.base, &plen);
    for (size_t cut = 1; cut < plen; cut++) {
      size_t flen;
      uint8_t *f = raw_frame(p, (uint32_t)cut, &flen);
      char err[256];
      int rc = decode_one(f, flen, NULL, err, sizeof err);
      CHECK(rc == CAP_EPARSE || rc == CAP_EINVAL || rc == CAP_ERANGE ||
            rc == CAP_EPROTO);
      if (rc < 0) {
        refused++;
        CHECK(err[0] != '\0');
      }
      total++;
      free(f);
    }
    free(p);
  }
  printf("    truncated payloads: %d of %d refused\n", refused, total);
  CHECK_EQ(refused, total);
}

static void test_oversized_refused_from_header(void) {
  /* 16 MiB + 1, header only: refused without buffering or allocating. */
  uint32_t n = CAP_FRAME_DEFAULT_MAX_BYTES + 1;
  uint8_t h[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8),
                  (uint8_t)n};
  cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
  CHECK_EQ(cap_frame_decoder_feed(d, h, 2), 0);
  CHECK_EQ(cap_frame_decoder_feed(d, h + 2, 2), CAP_E2BIG);
  CHECK_EQ(cap_frame_decoder_buffered(d), 2); /* the 2 bytes before */
  Capuchin__Envelope *got;
  char err[256];
  CHECK_EQ(cap_frame_decoder_next(d, &got, err, sizeof err), CAP_E2BIG);
  CHECK(strstr(err, "16777217") != NULL);
  /* Sticky: the stream is out of sync. */
  CHECK_EQ(cap_frame_decoder_feed(d, "x", 1), CAP_E2BIG);
  CHECK_EQ(cap_frame_decoder_error(d), CAP_E2BIG);
  cap_frame_decoder_destroy(d);

  /* 0xffffffff and a custom limit: 100 passes, 101 does not. */
  uint8_t big[4] = {0xff, 0xff, 0xff, 0xff};
  d = cap_frame_decoder_create(NULL);
  CHECK_EQ(cap_frame_decoder_feed(d, big, 4), CAP_E2BIG);
  cap_frame_decoder_destroy(d);

  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  lim.max_frame_bytes = 100;
  lim.max_buffer_bytes = 0; /* follows max_frame_bytes */
  Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
  char reason[200];
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  env.msg_case = CAPUCHIN__ENVELOPE__MSG_BYE;
  env.bye = &bye;
  bye.reason = reason;
  for (size_t rl = 90; rl <= 100; rl++) {
    memset(reason, 'r', rl);
    reason[rl] = '\0';
    size_t payload = cap_frame_size(&env) - 4;
    uint8_t *f;
    size_t flen;
    int erc = cap_frame_encode_alloc(&env, 100, &f, &flen);
    if (payload > 100) {
      CHECK_EQ(erc, CAP_E2BIG);
      f = frame_of(&env, &flen);
    } else {
      CHECK_EQ(erc, 0);
    }
    int rc = decode_one(f, flen, &lim, err, sizeof err);
    CHECK_EQ(rc, payload > 100 ? CAP_E2BIG : 1);
    free(f);
  }
}

static void test_zero_length_refused(void) {
  uint8_t z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
  CHECK_EQ(cap_frame_decoder_feed(d, z, 4), CAP_EPROTO);
  Capuchin__Envelope *got;
  char err[128];
  CHECK_EQ(cap_frame_decoder_next(d, &got, err, sizeof err), CAP_EPROTO);
  CHECK(strstr(err, "zero-length") != NULL);
  CHECK_EQ(cap_frame_decoder_feed(d, z, 8), CAP_EPROTO);
  cap_frame_decoder_destroy(d);

  /* A zero-length frame after a good one: the good one was checked and
   * buffered; the bad header is refused as soon as it is complete. */
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN_ACK);
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  REQUIRE(cap_frame_append(&s.env, 0, &buf, &len, &cap) == 0);
  d = cap_frame_decoder_create(NULL);
  CHECK_EQ(cap_frame_decoder_feed(d, buf, len), 0);
  CHECK_EQ(cap_frame_decoder_feed(d, z, 4), CAP_EPROTO);
  cap_frame_decoder_destroy(d);
  free(buf);

  /* The encoder never writes one. */
  Capuchin__Envelope empty = CAPUCHIN__ENVELOPE__INIT;
  uint8_t out[16];
  size_t n;
  CHECK_EQ(cap_frame_encode(&empty, out, sizeof out, &n), CAP_EINVAL);
  CHECK_EQ(cap_frame_encode_alloc(&empty, 0, &buf, &n), CAP_EINVAL);
  empty.msg_case = CAPUCHIN__ENVELOPE__MSG_HELLO; /* case set, no message */
  CHECK_EQ(cap_frame_encode(&empty, out, sizeof out, &n), CAP_EINVAL);
  CHECK_EQ(cap_frame_encode(NULL, out, sizeof out, &n), CAP_EINVAL);
}

/* Random payloads with valid headers, and random byte streams: every result
 * is a validated message or an error code; nothing leaks. */
static void test_random_frames(void) {
  int accepted = 0;
  uint8_t payload[512];
  for (int i = 0; i < 20000; i++) {
    uint32_t n = 1 + (uint32_t)(rng() % sizeof payload);
    for (uint32_t j = 0; j < n; j++)
      payload[j] = (uint8_t)rng();
    /* Half the time start with a plausible envelope field tag. */
    if (i & 1)
      payload[0] = (uint8_t)(((1 + rng() % 13) << 3) | 2);
    size_t flen;
    uint8_t *f = raw_frame(payload, n, &flen);
    char err[256];
    int rc = decode_one(f, flen, NULL, err, sizeof err);
    CHECK(rc == 1 || rc == CAP_EPARSE || rc == CAP_EINVAL ||
          rc == CAP_ERANGE || rc == CAP_EPROTO || rc == CAP_EQUOTA);
    if (rc == 1)
      accepted++;
    free(f);
  }
  printf("    random frames: %d of 20000 accepted as valid\n", accepted);

  /* Arbitrary streams in random chunks. */
  for (int i = 0; i < 2000; i++) {
    cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
    uint8_t bytes[300];
    size_t n = 1 + rng() % sizeof bytes;
    for (size_t j = 0; j < n; j++)
      bytes[j] = (uint8_t)rng();
    /* Small lengths so frames complete. */
    bytes[0] = bytes[1] = 0;
    size_t off = 0;
    while (off < n) {
      size_t c = 1 + rng() % 16;
      if (c > n - off)
        c = n - off;
      int rc = cap_frame_decoder_feed(d, bytes + off, c);
      off += c;
      if (rc < 0) {
        CHECK(rc == CAP_E2BIG || rc == CAP_EPROTO);
        break;
      }
      Capuchin__Envelope *got;
      char err[128];
      while ((rc = cap_frame_decoder_next(d, &got, err, sizeof err)) != 0) {
        if (rc == 1) {
          CHECK(cap_frame_validate(got, NULL, err, sizeof err) == 0);
          cap_frame_decoder_release(d, got);
        } else if (rc == CAP_E2BIG || rc == CAP_EPROTO) {
          if (cap_frame_decoder_error(d))
            break;
        }
      }
    }
    CHECK_EQ(cap_frame_decoder_allocated(d), 0);
    cap_frame_decoder_destroy(d);
  }
}

/* Encode env (bypassing validation), decode, expect code and err text. */
static void expect_refused(const Capuchin__Envelope *env,
                           const cap_frame_limits_t *lim, int code,
                           const char *needle) {
  size_t flen;
  uint8_t *f = frame_of(env, &flen);
  char err[256];
  int rc = decode_one(f, flen, lim, err, sizeof err);
  if (rc != code || !strstr(err, needle))
    fprintf(stderr, "  expected %s '%s', got %s '%s'\n", cap_err_name(code),
            needle, cap_err_name(rc), err);
  CHECK_EQ(rc, code);
  CHECK(strstr(err, needle) != NULL);
  /* cap_frame_validate() agrees on the local message. */
  CHECK_EQ(cap_frame_validate(env, lim, err, sizeof err), code);
  free(f);
}

static void test_invalid_enums(void) {
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_TENSOR_DECL);
  s.decl.kind = (Capuchin__TensorKind)7;
  expect_refused(&s.env, NULL, CAP_ERANGE, "kind 7");
  s.decl.kind = (Capuchin__TensorKind)-1;
  expect_refused(&s.env, NULL, CAP_ERANGE, "kind -1");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.act1.method = (Capuchin__Method)3;
  expect_refused(&s.env, NULL, CAP_ERANGE, "actions[1]: method 3");
  s.act1.method = CAPUCHIN__METHOD__METHOD_UNSPECIFIED;
  expect_refused(&s.env, NULL, CAP_ERANGE, "method 0");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ITERATION_END);
  s.iter_end.mode = (Capuchin__Mode)4;
  expect_refused(&s.env, NULL, CAP_ERANGE, "mode 4");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.d_kind[2] = (Capuchin__TensorKind)3;
  expect_refused(&s.env, NULL, CAP_ERANGE, "decl_kind[2] = 3");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.act0.has_flags = 1, s.act0.flags = 0x6;
  expect_refused(&s.env, NULL, CAP_ERANGE, "unknown flags 0x6");
}

static void test_out_of_range_ids(void) {
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_TENSOR_DECL);
  s.decl.id = 1u << 31;
  expect_refused(&s.env, NULL, CAP_ERANGE, "id 2147483648");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_OP_RECORD);
  s.op_out[0] = UINT32_MAX;
  expect_refused(&s.env, NULL, CAP_ERANGE, "outputs[0] = 4294967295");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_OP_RECORD);
  s.op.seq = 1u << 31;
  expect_refused(&s.env, NULL, CAP_ERANGE, "seq 2147483648");

  /* Configured limits. */
  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  lim.max_tensor_id = 1000;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_FREE);
  s.free_.tensor = 999;
  char err[256];
  CHECK_EQ(cap_frame_validate(&s.env, &lim, err, sizeof err), 0);
  s.free_.tensor = 1000;
  expect_refused(&s.env, &lim, CAP_ERANGE, "tensor 1000 out of range");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.c_tensors[6] = 1u << 31;
  expect_refused(&s.env, NULL, CAP_ERANGE, "tensors[6]");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.c_name[1] = 2;
  expect_refused(&s.env, NULL, CAP_ERANGE, "op_name[1] = 2 out of range");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.f_tensor[1] = 1u << 31;
  expect_refused(&s.env, NULL, CAP_ERANGE, "free_tensor[1]");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.batch_op1.outputs[1] = 1u << 31;
  expect_refused(&s.env, NULL, CAP_ERANGE, "outputs[1]");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.act0.prefetch_tensor = 1u << 31;
  expect_refused(&s.env, NULL, CAP_ERANGE, "prefetch_tensor");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.act2.recompute_ops[2] = 1u << 31;
  expect_refused(&s.env, NULL, CAP_ERANGE, "recompute_ops[2]");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.act0.evict_after_access = 0;
  expect_refused(&s.env, NULL, CAP_ERANGE, "evict_after_access 0");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_FEEDBACK);
  s.stall1.back_access = 1;
  expect_refused(&s.env, NULL, CAP_ERANGE, "stalls[1]: back_access 1");
}

static void test_bad_values(void) {
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_HELLO);
  s.hello.h2d_gbps = NAN;
  expect_refused(&s.env, NULL, CAP_ERANGE, "h2d_gbps");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_HELLO);
  s.hello.duplex_gbps = -1.0;
  expect_refused(&s.env, NULL, CAP_ERANGE, "duplex_gbps");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_HELLO);
  s.hello.d2h_gbps = INFINITY;
  expect_refused(&s.env, NULL, CAP_ERANGE, "d2h_gbps");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_HELLO);
  s.hello.has_pid = 0;
  expect_refused(&s.env, NULL, CAP_EINVAL, "missing pid");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_HELLO);
  s.hello.job_name = "";
  expect_refused(&s.env, NULL, CAP_EINVAL, "job_name is empty");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_HELLO);
  s.hello.backend = NULL;
  expect_refused(&s.env, NULL, CAP_EINVAL, "missing backend");

  static char longname[5000];
  memset(longname, 'a', sizeof longname - 1);
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_OP_RECORD);
  s.op.name = longname;
  expect_refused(&s.env, NULL, CAP_ERANGE, "name longer than 4096");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_OP_RECORD);
  s.op.end_ns = s.op.start_ns - 1;
  expect_refused(&s.env, NULL, CAP_ERANGE, "before start_ns");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_FREE);
  s.free_.t_ns = -5;
  expect_refused(&s.env, NULL, CAP_ERANGE, "t_ns -5 is negative");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ITERATION_END);
  s.iter_end.stall_ns = -1;
  expect_refused(&s.env, NULL, CAP_ERANGE, "stall_ns -1");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.c_start[2] = -1;
  expect_refused(&s.env, NULL, CAP_ERANGE, "start_ns -1");

  /* Inconsistent batches. */
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.batch.n_op_end_ns = 2;
  expect_refused(&s.env, NULL, CAP_EPROTO, "op columns differ");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.batch.n_tensors = 6;
  expect_refused(&s.env, NULL, CAP_EPROTO, "tensors holds 6");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.c_n_in[0] = UINT32_MAX; /* sum overflows 32 bits */
  expect_refused(&s.env, NULL, CAP_ERANGE, "inputs");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.batch.n_free_tensor = 1;
  expect_refused(&s.env, NULL, CAP_EPROTO, "free columns differ");

  /* Inconsistent plan actions. */
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.act2.n_recompute_ops = 0; /* a release (plan.h): well formed */
  {
    char err[256] = "";
    CHECK_EQ(cap_frame_validate(&s.env, NULL, err, sizeof err), 0);
  }
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.act0.n_recompute_ops = 3, s.act0.recompute_ops = s.rec_ops;
  expect_refused(&s.env, NULL, CAP_EPROTO, "swap with recompute_ops");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.act0.has_prefetch_access = 0;
  expect_refused(&s.env, NULL, CAP_EPROTO, "must come together");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.plan.policy = "a-policy-name-of-32-bytes-------";
  expect_refused(&s.env, NULL, CAP_ERANGE, "policy longer than 31");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  s.plan.version = 0;
  expect_refused(&s.env, NULL, CAP_ERANGE, "version 0");

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ERROR);
  s.error.code = 3;
  expect_refused(&s.env, NULL, CAP_ERANGE, "code 3 is not negative");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_WELCOME);
  s.welcome.has_plan_reused = 0;
  expect_refused(&s.env, NULL, CAP_EINVAL, "missing plan_reused");
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ITERATION_END);
  s.iter_end.iteration = 0;
  expect_refused(&s.env, NULL, CAP_ERANGE, "iteration 0");

  /* Counts over max_items. */
  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  lim.max_items = 2;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  expect_refused(&s.env, &lim, CAP_ERANGE, "3 actions, more than the limit");
  lim.max_items = 0; /* default */
  lim.max_op_tensors = 3;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  expect_refused(&s.env, &lim, CAP_ERANGE, "op[0]: 3 inputs + 1 outputs");
}

/* An envelope carrying only a field this build does not know: protobuf-c
 * accepts it, the validator refuses it. */
static void test_unknown_message(void) {
  uint8_t p2[] = {0x98, 0x06, 0x01}; /* field 99, varint, value 1 */
  size_t flen;
  uint8_t *f = raw_frame(p2, sizeof p2, &flen);
  char err[256];
  CHECK_EQ(decode_one(f, flen, NULL, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "no message set") != NULL);
  free(f);
  /* A tag of field number 0 written as a non-canonical varint: protobuf-c
   * keeps it as an unknown field, the validator refuses it (found by
   * fuzz_frame: re-encoded, it would be a frame no decoder accepts). */
  /* Envelope.plan_ack = {version: 1, <tag 0 as 80 00>: 0} */
  uint8_t p3b[] = {(10 << 3) | 2, 5, 0x08, 0x01, 0x80, 0x00, 0x00};
  f = raw_frame(p3b, sizeof p3b, &flen);
  CHECK_EQ(decode_one(f, flen, NULL, err, sizeof err), CAP_EPROTO);
  CHECK(strstr(err, "field number 0") != NULL);
  free(f);
  /* Unknown fields with proper numbers (a newer peer) are kept. */
  /* Envelope.plan_ack = {version: 1, field 31: 5} */
  uint8_t p4full[] = {(10 << 3) | 2, 5, 0x08, 0x01, 0xf8, 0x01, 0x05};
  f = raw_frame(p4full, sizeof p4full, &flen);
  CHECK_EQ(decode_one(f, flen, NULL, err, sizeof err), 1);
  free(f);
  /* Garbage that is not protobuf at all. */
  uint8_t junk[] = {0xff, 0xff, 0xff};
  f = raw_frame(junk, sizeof junk, &flen);
  CHECK_EQ(decode_one(f, flen, NULL, err, sizeof err), CAP_EPARSE);
  CHECK(strstr(err, "not a valid Envelope") != NULL);
  free(f);
}

/* A NUL inside a string on the wire would silently cut it. */
static void test_embedded_nul_refused(void) {
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ERROR);
  s.error.message = "abcXdef";
  size_t flen;
  uint8_t *f = frame_of(&s.env, &flen);
  uint8_t *x = memchr(f, 'X', flen);
  REQUIRE(x);
  char err[256];
  CHECK_EQ(decode_one(f, flen, NULL, err, sizeof err), 1);
  *x = '\0';
  CHECK_EQ(decode_one(f, flen, NULL, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "message contains a NUL byte") != NULL);
  free(f);

  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH);
  s.names[1] = "aten.t.Xdefault";
  f = frame_of(&s.env, &flen);
  x = memchr(f, 'X', flen);
  REQUIRE(x);
  *x = '\0';
  CHECK_EQ(decode_one(f, flen, NULL, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "names[1] contains a NUL") != NULL);
  free(f);
}

/* A packed column of one-byte varints unpacks to 4-8 bytes per entry; a
 * repeated empty sub-message to a whole struct. The allocation cap stops
 * both, and the decoder goes on with the next frame. */
static void test_allocation_cap(void) {
  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  lim.max_alloc_bytes = 64 << 10;

  /* AccessBatch{iteration, tensors = 20000 x 1-byte varints}, by hand. */
  size_t n = 20000;
  size_t plen = 0;
  uint8_t *p = malloc(n + 64);
  uint8_t inner[32];
  size_t il = 0;
  inner[il++] = (1 << 3) | 0, inner[il++] = 1;   /* iteration = 1 */
  inner[il++] = (10 << 3) | 2;                   /* tensors, packed */
  uint32_t v = (uint32_t)n;
  while (v >= 0x80) {
    inner[il++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  inner[il++] = (uint8_t)v;
  size_t body = il + n;
  p[plen++] = (5 << 3) | 2; /* Envelope.access_batch */
  v = (uint32_t)body;
  while (v >= 0x80) {
    p[plen++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[plen++] = (uint8_t)v;
  memcpy(p + plen, inner, il);
  plen += il;
  memset(p + plen, 7, n);
  plen += n;
  size_t flen;
  uint8_t *f = raw_frame(p, (uint32_t)plen, &flen);
  char err[256];
  CHECK_EQ(decode_one(f, flen, &lim, err, sizeof err), CAP_EQUOTA);
  CHECK(strstr(err, "allowed to unpack") != NULL);
  /* With the default cap it unpacks, then fails validation (no ops list
   * these 20000 tensors). */
  CHECK_EQ(decode_one(f, flen, NULL, err, sizeof err), CAP_EPROTO);
  free(f);
  free(p);

  /* 1 MiB of empty OpRecords (2 bytes each on the wire, ~100 unpacked):
   * refused under the default 64 MiB cap, with nothing left allocated. */
  size_t nops = (1u << 20) / 2;
  size_t inner_len = 2 + nops * 2;
  p = malloc(inner_len + 16);
  plen = 0;
  p[plen++] = (5 << 3) | 2;
  v = (uint32_t)inner_len;
  while (v >= 0x80) {
    p[plen++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[plen++] = (uint8_t)v;
  p[plen++] = (1 << 3) | 0, p[plen++] = 1;
  for (size_t i = 0; i < nops; i++)
    p[plen++] = (2 << 3) | 2, p[plen++] = 0;
  f = raw_frame(p, (uint32_t)plen, &flen);
  int rc = decode_one(f, flen, NULL, err, sizeof err);
  CHECK(rc == CAP_EQUOTA || rc == CAP_EINVAL);
  printf("    1 MiB of empty OpRecords: %s (%s)\n", cap_err_name(rc), err);
  free(f);
  free(p);

  /* Messages held by the caller count: with a cap that fits about three
   * Plans, holding them makes the next one fail; releasing lets it pass. */
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_PLAN);
  uint8_t *one;
  size_t one_len;
  REQUIRE(cap_frame_encode_alloc(&s.env, 0, &one, &one_len) == 0);
  cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
  REQUIRE(cap_frame_decoder_feed(d, one, one_len) == 0);
  Capuchin__Envelope *got;
  REQUIRE(cap_frame_decoder_next(d, &got, err, sizeof err) == 1);
  size_t per = cap_frame_decoder_allocated(d);
  cap_frame_decoder_release(d, got);
  cap_frame_decoder_destroy(d);

  lim.max_alloc_bytes = 3 * per + per / 2;
  d = cap_frame_decoder_create(&lim);
  Capuchin__Envelope *held[4] = {0};
  int ok = 0;
  for (int i = 0; i < 4; i++) {
    REQUIRE(cap_frame_decoder_feed(d, one, one_len) == 0);
    rc = cap_frame_decoder_next(d, &held[i], err, sizeof err);
    if (rc == 1)
      ok++;
    else
      CHECK_EQ(rc, CAP_EQUOTA);
  }
  CHECK_EQ(ok, 3);
  CHECK(held[3] == NULL);
  cap_frame_decoder_release(d, held[0]);
  REQUIRE(cap_frame_decoder_feed(d, one, one_len) == 0);
  CHECK_EQ(cap_frame_decoder_next(d, &held[0], err, sizeof err), 1);
  for (int i = 0; i < 4; i++)
    cap_frame_decoder_release(d, held[i]);
  CHECK_EQ(cap_frame_decoder_allocated(d), 0);
  cap_frame_decoder_destroy(d);
  free(one);
}

/* Every allocation protobuf-c makes can fail (the cap set just below what
 * a message needs, at every step): the result is CAP_EQUOTA or the message,
 * never a crash, and nothing stays allocated. */
static void test_allocation_failure_at_every_point(void) {
  for (int k = 1; k <= SAMPLE_COUNT; k++) {
    sample_t s;
    sample_fill(&s, k);
    uint8_t *f;
    size_t flen;
    REQUIRE(cap_frame_encode_alloc(&s.env, 0, &f, &flen) == 0);
    cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
    REQUIRE(cap_frame_decoder_feed(d, f, flen) == 0);
    Capuchin__Envelope *got;
    char err[256];
    REQUIRE(cap_frame_decoder_next(d, &got, err, sizeof err) == 1);
    size_t need = cap_frame_decoder_allocated(d);
    cap_frame_decoder_release(d, got);
    cap_frame_decoder_destroy(d);

    /* protobuf-c's peak during unpack (scratch for scanning fields) can be
     * above what the message holds afterwards; below the peak every cap
     * fails, from it on every cap succeeds. */
    cap_frame_limits_t lim;
    cap_frame_limits_init(&lim);
    size_t first_ok = 0;
    for (size_t cap = 1; cap <= 2 * need + 4096; cap++) {
      lim.max_alloc_bytes = cap;
      int rc = decode_one(f, flen, &lim, err, sizeof err);
      if (first_ok == 0 && rc == 1)
        first_ok = cap;
      CHECK_EQ(rc, first_ok ? 1 : CAP_EQUOTA);
      if (first_ok && cap > first_ok + 64)
        break;
    }
    CHECK(first_ok >= need);
    free(f);
  }
}

/* Feeding without draining is bounded too. */
static void test_buffer_quota(void) {
  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  lim.max_frame_bytes = 1024;
  lim.max_buffer_bytes = 4096;
  cap_frame_decoder_t *d = cap_frame_decoder_create(&lim);
  REQUIRE(d);
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_WELCOME);
  uint8_t *f;
  size_t flen;
  REQUIRE(cap_frame_encode_alloc(&s.env, 0, &f, &flen) == 0);
  int rc = 0;
  size_t fed = 0;
  while (rc == 0 && fed < 10000) {
    rc = cap_frame_decoder_feed(d, f, flen);
    fed += flen;
  }
  CHECK_EQ(rc, CAP_EQUOTA);
  CHECK(cap_frame_decoder_buffered(d) <= 4096);
  cap_frame_decoder_destroy(d);
  free(f);
  /* Inconsistent limits: a buffer that cannot hold one frame. */
  lim.max_buffer_bytes = 1000;
  CHECK(cap_frame_decoder_create(&lim) == NULL);
}

static void test_encode_errors(void) {
  sample_t s;
  sample_fill(&s, CAPUCHIN__ENVELOPE__MSG_HELLO);
  size_t need = cap_frame_size(&s.env);
  uint8_t small[8];
  size_t n = 0;
  CHECK_EQ(cap_frame_encode(&s.env, small, sizeof small, &n), CAP_ENOMEM);
  CHECK_EQ(n, need);
  uint8_t *big = malloc(need);
  CHECK_EQ(cap_frame_encode(&s.env, big, need, &n), 0);
  CHECK_EQ(n, need);
  uint8_t *alloc;
  CHECK_EQ(cap_frame_encode_alloc(&s.env, need - 5, &alloc, &n), CAP_E2BIG);
  CHECK_EQ(cap_frame_encode_alloc(&s.env, need - 4, &alloc, &n), 0);
  CHECK(memcmp(alloc, big, need) == 0);
  free(alloc);
  /* Append grows and keeps earlier frames. */
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  for (int i = 0; i < 100; i++)
    CHECK_EQ(cap_frame_append(&s.env, 0, &buf, &len, &cap), 0);
  CHECK_EQ(len, 100 * need);
  CHECK(memcmp(buf + 99 * need, big, need) == 0);
  free(buf);
  free(big);
  CHECK_STR(cap_frame_msg_name(&s.env), "hello");
  Capuchin__Envelope empty = CAPUCHIN__ENVELOPE__INIT;
  CHECK_STR(cap_frame_msg_name(&empty), "none");
  char err[128];
  CHECK_EQ(cap_frame_validate(&empty, NULL, err, sizeof err), CAP_EINVAL);
  CHECK_EQ(cap_frame_validate(NULL, NULL, err, sizeof err), CAP_EINVAL);
}

/* A whole frame of the maximum size, fed in 64 KiB reads, decodes; the
 * decoder's buffer is given back afterwards. */
static void test_large_frame(void) {
  size_t n = 3u << 20; /* 3 Mi tensors in one compact op */
  uint32_t *tensors = malloc(n * sizeof *tensors);
  for (size_t i = 0; i < n; i++)
    tensors[i] = (uint32_t)(i * 2654435761u) & 0x7fffffffu;
  Capuchin__AccessBatch b = CAPUCHIN__ACCESS_BATCH__INIT;
  b.has_iteration = 1, b.iteration = 9;
  char *names[] = {"aten._foreach_add_.List"};
  uint32_t seq = 0, nm = 0, nin = (uint32_t)(n / 2), nout = (uint32_t)(n - n / 2);
  int64_t t0 = 0, t1 = 5;
  b.n_names = 1, b.names = names;
  b.n_op_seq = b.n_op_start_ns = b.n_op_end_ns = 1;
  b.n_op_name = b.n_op_n_in = b.n_op_n_out = 1;
  b.op_seq = &seq, b.op_start_ns = &t0, b.op_end_ns = &t1, b.op_name = &nm;
  b.op_n_in = &nin, b.op_n_out = &nout;
  b.n_tensors = n, b.tensors = tensors;
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  env.msg_case = CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH;
  env.access_batch = &b;
  uint8_t *f;
  size_t flen;
  REQUIRE(cap_frame_encode_alloc(&env, 0, &f, &flen) == 0);
  CHECK(flen > (8u << 20) && flen <= (16u << 20) + 4);

  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  lim.max_op_tensors = (uint32_t)n;
  cap_frame_decoder_t *d = cap_frame_decoder_create(&lim);
  Capuchin__Envelope *got = NULL;
  char err[256];
  int rc = 0;
  for (size_t off = 0; off < flen; off += 65536) {
    size_t c = flen - off < 65536 ? flen - off : 65536;
    REQUIRE(cap_frame_decoder_feed(d, f + off, c) == 0);
    rc = cap_frame_decoder_next(d, &got, err, sizeof err);
    if (rc != 0)
      break;
  }
  CHECK_EQ(rc, 1);
  if (got) {
    CHECK_EQ(got->access_batch->n_tensors, n);
    CHECK(memcmp(got->access_batch->tensors, tensors, n * 4) == 0);
  }
  cap_frame_decoder_release(d, got);
  CHECK_EQ(cap_frame_decoder_allocated(d), 0);
  cap_frame_decoder_destroy(d);
  free(f);
  free(tensors);
}

/* With CAP_FRAME_CORPUS_OUT=DIR, write the seed corpus of
 * tests/fuzz/fuzz_frame.c into DIR: byte 0 seeds the fuzzer's chunk sizes,
 * then one frame of each message type, and one stream of all of them. */
static int write_seed(const char *dir, const char *name, int first,
                      int last) {
  uint8_t *buf = malloc(1);
  size_t len = 1, cap = 1;
  buf[0] = (uint8_t)(17 * first); /* chunk-size seed */
  for (int k = first; k <= last; k++) {
    sample_t s;
    sample_fill(&s, k);
    if (cap_frame_append(&s.env, 0, &buf, &len, &cap) != 0)
      return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.bin", dir, name);
  FILE *f = fopen(path, "wb");
  int bad = !f || fwrite(buf, 1, len, f) != len;
  if (f && fclose(f) != 0)
    bad = 1;
  free(buf);
  if (bad) {
    fprintf(stderr, "%s: cannot write\n", path);
    return 1;
  }
  printf("wrote %s (%zu bytes)\n", path, len);
  return 0;
}

static int write_corpus(const char *dir) {
  for (int k = 1; k <= SAMPLE_COUNT; k++) {
    sample_t s;
    sample_fill(&s, k);
    if (write_seed(dir, cap_frame_msg_name(&s.env), k, k))
      return 1;
  }
  return write_seed(dir, "all_messages", 1, SAMPLE_COUNT);
}

int main(void) {
  const char *corpus = getenv("CAP_FRAME_CORPUS_OUT");
  if (corpus)
    return write_corpus(corpus);
  RUN_TEST(test_roundtrip_each_type);
  RUN_TEST(test_budget_ack_rules);
  RUN_TEST(test_decoded_fields);
  RUN_TEST(test_stream_byte_by_byte);
  RUN_TEST(test_stream_random_chunks);
  RUN_TEST(test_stream_at_once);
  RUN_TEST(test_truncated_stream_waits);
  RUN_TEST(test_truncated_payload_rejected);
  RUN_TEST(test_oversized_refused_from_header);
  RUN_TEST(test_zero_length_refused);
  RUN_TEST(test_random_frames);
  RUN_TEST(test_invalid_enums);
  RUN_TEST(test_out_of_range_ids);
  RUN_TEST(test_bad_values);
  RUN_TEST(test_unknown_message);
  RUN_TEST(test_embedded_nul_refused);
  RUN_TEST(test_allocation_cap);
  RUN_TEST(test_allocation_failure_at_every_point);
  RUN_TEST(test_buffer_quota);
  RUN_TEST(test_encode_errors);
  RUN_TEST(test_large_frame);
  return TEST_SUMMARY();
}
