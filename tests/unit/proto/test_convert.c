/*
 * Conversions shared by the daemon and the client: cap_plan_t <-> Plan over
 * a real encode/decode, feedback, the AccessBatch builder and iterator, Error
 * frames and envelope helpers. Also prints the ingest rate of compact access
 * records through encode + decode + iterate (informative, not asserted).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cap_test.h"
#include "capuchin/proto.h"

/* Encode env, decode it with a fresh decoder; the caller releases *got
 * through *dec and destroys *dec. */
static int through_wire(const Capuchin__Envelope *env, cap_frame_decoder_t **dec,
                        Capuchin__Envelope **got) {
  uint8_t *buf;
  size_t len;
  int rc = cap_frame_encode_alloc(env, 0, &buf, &len);
  if (rc < 0)
    return rc;
  *dec = cap_frame_decoder_create(NULL);
  char err[256] = "";
  rc = cap_frame_decoder_feed(*dec, buf, len);
  if (rc == 0)
    rc = cap_frame_decoder_next(*dec, got, err, sizeof err);
  if (rc != 1)
    fprintf(stderr, "through_wire: %s %s\n", cap_err_name(rc), err);
  free(buf);
  return rc;
}

static cap_plan_t *sample_plan(void) {
  cap_plan_t *p = cap_plan_create("capuchin", 3ull << 30);
  if (!p)
    return NULL;
  p->version = 4;
  p->predicted_iter_ns = 41234567;
  p->predicted_peak_bytes = (3ull << 30) - 12345;
  uint32_t ops1[] = {10, 11, 12};
  uint32_t ops2[] = {40};
  if (cap_plan_add_swap(p, 5, 1, 17, 3, 0) ||
      cap_plan_add_recompute(p, 6, 2, ops1, 3) ||
      cap_plan_add_swap(p, 7, 3, CAP_NONE, 0, CAP_ACTION_SYNC_OUT) ||
      cap_plan_add_recompute(p, 2147483647u, 1, ops2, 1) ||
      cap_plan_add_release(p, 8, 4) ||
      cap_plan_add_swap(p, 0, 2147483647u - 1, 2147483647u, 2147483647u - 1, 0)) {
    cap_plan_destroy(p);
    return NULL;
  }
  /* A placement: tensor 5 first touched, swapped in by action 0 where 6's
   * first stay was; 6 handed its block to 9; weight 0 crosses the boundary. */
  const cap_block_t blocks[] = {
      {5, CAP_RESIDENCY_FIRST_TOUCH, CAP_NONE, 0, 4096, 0, 100, CAP_NONE, CAP_NONE},
      {6, CAP_RESIDENCY_FIRST_TOUCH, CAP_NONE, 4096, 512, 10, 50, CAP_NONE, CAP_NONE},
      {9, CAP_RESIDENCY_FIRST_TOUCH, CAP_NONE, 4096, 256, 40, 90, 1, CAP_NONE},
      {5, CAP_RESIDENCY_SWAPPED_IN, 0, 0, 4096, 300, 400, CAP_NONE, CAP_NONE},
      {0, CAP_RESIDENCY_PERSISTENT, CAP_NONE, 8192, 64, 0, 20, CAP_NONE, 5},
      {0, CAP_RESIDENCY_SWAPPED_IN, 5, 8192, 64, 350, 500, CAP_NONE, 4},
  };
  if (cap_plan_set_blocks(p, blocks, 6, 8192 + 64)) {
    cap_plan_destroy(p);
    return NULL;
  }
  return p;
}

static void check_plans_equal(const cap_plan_t *a, const cap_plan_t *b) {
  CHECK_EQ(a->version, b->version);
  CHECK_EQ(a->budget_bytes, b->budget_bytes);
  CHECK_STR(a->policy, b->policy);
  CHECK_EQ(a->predicted_iter_ns, b->predicted_iter_ns);
  CHECK_EQ(a->predicted_peak_bytes, b->predicted_peak_bytes);
  REQUIRE(a->n_actions == b->n_actions);
  for (uint32_t i = 0; i < a->n_actions; i++) {
    const cap_action_t *x = &a->actions[i], *y = &b->actions[i];
    CHECK_EQ(x->tensor, y->tensor);
    CHECK_EQ(x->evict_after_access, y->evict_after_access);
    CHECK_EQ(x->method, y->method);
    CHECK_EQ(x->flags, y->flags);
    CHECK_EQ(x->prefetch_tensor, y->prefetch_tensor);
    CHECK_EQ(x->prefetch_access, y->prefetch_access);
    REQUIRE(x->n_recompute == y->n_recompute);
    for (uint32_t j = 0; j < x->n_recompute; j++)
      CHECK_EQ(cap_action_recompute_ops(a, x)[j], cap_action_recompute_ops(b, y)[j]);
  }
  CHECK_EQ(a->arena_bytes, b->arena_bytes);
  REQUIRE(a->n_blocks == b->n_blocks);
  for (uint32_t i = 0; i < a->n_blocks; i++) {
    const cap_block_t *x = &a->blocks[i], *y = &b->blocks[i];
    CHECK(x->tensor == y->tensor && x->kind == y->kind && x->action == y->action &&
          x->offset == y->offset && x->bytes == y->bytes &&
          x->start_ns == y->start_ns && x->end_ns == y->end_ns &&
          x->share == y->share && x->same_as == y->same_as);
  }
}

/* A received plan's blocks are checked like its actions. */
static void test_plan_blocks_checked(void) {
  cap_plan_t *p = sample_plan();
  REQUIRE(p);
  static const struct {
    int field;
    const char *want;
  } bad[] = {
      {0, "action 9 of 6"},  {1, "outside the arena"}, {2, "not after its start"},
      {3, "names block 17"}, {4, "kind 7"},           {5, "without arena_bytes"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    Capuchin__Plan *m = NULL;
    REQUIRE(cap_proto_plan_to_msg(p, &m) == 0);
    Capuchin__PlanBlock *b = m->blocks[3];
    switch (bad[k].field) {
    case 0: b->action = 9; break;
    case 1: b->offset = m->arena_bytes; break;
    case 2: b->end_ns = b->start_ns; break;
    case 3: b->has_share = 1; b->share = 17; break;
    case 4: b->kind = (Capuchin__BlockKind)7; break;
    case 5: m->has_arena_bytes = 0; break;
    }
    cap_plan_t *q = NULL;
    char err[256] = "";
    CHECK(cap_proto_plan_from_msg(m, NULL, &q, err, sizeof err) < 0);
    CHECK(q == NULL);
    if (!strstr(err, bad[k].want)) {
      fprintf(stderr, "case %zu: \"%s\" (want \"%s\")\n", k, err, bad[k].want);
      CHECK(0);
    }
    cap_proto_msg_free(m);
  }
  cap_plan_destroy(p);
}

static void test_plan_round_trip(void) {
  cap_plan_t *p = sample_plan();
  REQUIRE(p);
  Capuchin__Plan *m;
  REQUIRE(cap_proto_plan_to_msg(p, &m) == 0);
  CHECK_EQ(m->n_actions, 6);
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  REQUIRE(cap_proto_envelope_set(&env, m) == 0);
  CHECK_EQ(env.msg_case, CAPUCHIN__ENVELOPE__MSG_PLAN);
  CHECK(cap_proto_envelope_get(&env) == m);

  cap_frame_decoder_t *d = NULL;
  Capuchin__Envelope *got = NULL;
  REQUIRE(through_wire(&env, &d, &got) == 1);
  cap_plan_t *q = NULL;
  char err[256];
  int rc = cap_proto_plan_from_msg(got->plan, NULL, &q, err, sizeof err);
  if (rc)
    fprintf(stderr, "%s\n", err);
  REQUIRE(rc == 0);
  check_plans_equal(p, q);
  /* And back again: the same message bytes. */
  Capuchin__Plan *m2;
  REQUIRE(cap_proto_plan_to_msg(q, &m2) == 0);
  size_t l1 = protobuf_c_message_get_packed_size(&m->base);
  size_t l2 = protobuf_c_message_get_packed_size(&m2->base);
  CHECK_EQ(l1, l2);
  uint8_t *b1 = malloc(l1), *b2 = malloc(l2);
  protobuf_c_message_pack(&m->base, b1);
  protobuf_c_message_pack(&m2->base, b2);
  CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
  free(b1);
  free(b2);
  cap_proto_msg_free(m2);
  cap_plan_destroy(q);
  cap_frame_decoder_release(d, got);
  cap_frame_decoder_destroy(d);
  cap_proto_msg_free(m);
  cap_plan_destroy(p);

  /* An empty plan (nothing to evict) round-trips too. */
  p = cap_plan_create("swap-all", 1);
  REQUIRE(cap_proto_plan_to_msg(p, &m) == 0);
  REQUIRE(cap_proto_plan_from_msg(m, NULL, &q, err, sizeof err) == 0);
  check_plans_equal(p, q);
  cap_plan_destroy(q);
  cap_proto_msg_free(m);
  cap_plan_destroy(p);
}

static void test_plan_to_msg_rejects(void) {
  Capuchin__Plan *m = (Capuchin__Plan *)1;
  cap_plan_t *p = sample_plan();
  REQUIRE(p);
  p->actions[1].method = (cap_method_t)0;
  CHECK_EQ(cap_proto_plan_to_msg(p, &m), CAP_EINVAL);
  CHECK(m == NULL);
  cap_plan_destroy(p);

  p = sample_plan();
  p->actions[0].tensor = 1u << 31;
  CHECK_EQ(cap_proto_plan_to_msg(p, &m), CAP_EINVAL);
  cap_plan_destroy(p);

  p = sample_plan();
  p->actions[1].n_recompute = p->n_recompute_ops + 1; /* past the pool */
  CHECK_EQ(cap_proto_plan_to_msg(p, &m), CAP_EINVAL);
  cap_plan_destroy(p);

  p = sample_plan();
  p->actions[0].flags = 0x80;
  CHECK_EQ(cap_proto_plan_to_msg(p, &m), CAP_EINVAL);
  cap_plan_destroy(p);

  p = sample_plan();
  p->version = 0;
  CHECK_EQ(cap_proto_plan_to_msg(p, &m), CAP_EINVAL);
  cap_plan_destroy(p);

  p = cap_plan_create("", 10);
  CHECK_EQ(cap_proto_plan_to_msg(p, &m), CAP_EINVAL);
  cap_plan_destroy(p);
  CHECK_EQ(cap_proto_plan_to_msg(NULL, &m), CAP_EINVAL);
}

static void test_plan_from_msg_rejects(void) {
  cap_plan_t *p = sample_plan();
  Capuchin__Plan *m;
  REQUIRE(cap_proto_plan_to_msg(p, &m) == 0);
  cap_plan_t *q = (cap_plan_t *)1;
  char err[256];

  m->actions[2]->has_prefetch_tensor = 1; /* prefetch_access missing */
  CHECK_EQ(cap_proto_plan_from_msg(m, NULL, &q, err, sizeof err), CAP_EPROTO);
  CHECK(q == NULL);
  CHECK(strstr(err, "actions[2]") != NULL);
  m->actions[2]->has_prefetch_tensor = 0;

  m->actions[3]->tensor = 1u << 31;
  CHECK_EQ(cap_proto_plan_from_msg(m, NULL, &q, err, sizeof err), CAP_ERANGE);
  m->actions[3]->tensor = 3;

  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  lim.max_tensor_id = 100;
  CHECK_EQ(cap_proto_plan_from_msg(m, &lim, &q, err, sizeof err), CAP_ERANGE);
  CHECK(strstr(err, "actions[4]: tensor") != NULL ||
        strstr(err, "prefetch_tensor") != NULL);

  m->has_version = 0;
  CHECK_EQ(cap_proto_plan_from_msg(m, NULL, &q, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "missing version") != NULL);
  m->has_version = 1;

  CHECK_EQ(cap_proto_plan_from_msg(m, NULL, &q, err, sizeof err), 0);
  cap_plan_destroy(q);
  CHECK_EQ(cap_proto_plan_from_msg(NULL, NULL, &q, err, sizeof err), CAP_EINVAL);
  cap_proto_msg_free(m);
  cap_plan_destroy(p);
}

static void test_feedback_round_trip(void) {
  cap_feedback_t fb[3] = {{5, 2, 1000}, {9, 7, 0}, {2147483647u, 3, INT64_MAX}};
  Capuchin__Feedback *m;
  REQUIRE(cap_proto_feedback_to_msg(3, 12, fb, 3, &m) == 0);
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  REQUIRE(cap_proto_envelope_set(&env, m) == 0);
  cap_frame_decoder_t *d;
  Capuchin__Envelope *got;
  REQUIRE(through_wire(&env, &d, &got) == 1);
  CHECK_EQ(got->feedback->plan_version, 3);
  CHECK_EQ(got->feedback->iteration, 12);
  cap_feedback_t *out;
  uint32_t n;
  REQUIRE(cap_proto_feedback_from_msg(got->feedback, &out, &n) == 0);
  REQUIRE(n == 3);
  for (int i = 0; i < 3; i++) {
    CHECK_EQ(out[i].tensor, fb[i].tensor);
    CHECK_EQ(out[i].back_access, fb[i].back_access);
    CHECK_EQ(out[i].stall_ns, fb[i].stall_ns);
  }
  free(out);
  cap_frame_decoder_release(d, got);
  cap_frame_decoder_destroy(d);
  cap_proto_msg_free(m);

  /* Empty feedback is valid; bad entries are refused. */
  REQUIRE(cap_proto_feedback_to_msg(1, 1, NULL, 0, &m) == 0);
  REQUIRE(cap_proto_feedback_from_msg(m, &out, &n) == 0);
  CHECK(out == NULL && n == 0);
  cap_proto_msg_free(m);
  cap_feedback_t bad = {1, 1, 5}; /* back_access 1 cannot follow an eviction */
  CHECK_EQ(cap_proto_feedback_to_msg(1, 1, &bad, 1, &m), CAP_EINVAL);
  bad.back_access = 2, bad.stall_ns = -1;
  CHECK_EQ(cap_proto_feedback_to_msg(1, 1, &bad, 1, &m), CAP_EINVAL);
  CHECK_EQ(cap_proto_feedback_to_msg(0, 1, fb, 1, &m), CAP_EINVAL);
}

static void test_envelope_helpers(void) {
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
  CHECK_EQ(cap_proto_envelope_set(&env, &bye), 0);
  CHECK_EQ(env.msg_case, CAPUCHIN__ENVELOPE__MSG_BYE);
  CHECK(cap_proto_envelope_get(&env) == &bye);
  Capuchin__BudgetUpdate bu = CAPUCHIN__BUDGET_UPDATE__INIT;
  CHECK_EQ(cap_proto_envelope_set(&env, &bu), 0);
  CHECK_EQ(env.msg_case, CAPUCHIN__ENVELOPE__MSG_BUDGET_UPDATE);
  /* Not a message of the oneof. */
  Capuchin__PlanAction a = CAPUCHIN__PLAN_ACTION__INIT;
  CHECK_EQ(cap_proto_envelope_set(&env, &a), CAP_EINVAL);
  Capuchin__Envelope inner = CAPUCHIN__ENVELOPE__INIT;
  CHECK_EQ(cap_proto_envelope_set(&env, &inner), CAP_EINVAL);
  CHECK_EQ(env.msg_case, CAPUCHIN__ENVELOPE__MSG_BUDGET_UPDATE);
  Capuchin__Envelope empty = CAPUCHIN__ENVELOPE__INIT;
  CHECK(cap_proto_envelope_get(&empty) == NULL);

  uint8_t *f;
  size_t len;
  REQUIRE(cap_proto_error_frame(CAP_EQUOTA, NULL, &f, &len) == 0);
  cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
  Capuchin__Envelope *got;
  char err[128];
  REQUIRE(cap_frame_decoder_feed(d, f, len) == 0);
  REQUIRE(cap_frame_decoder_next(d, &got, err, sizeof err) == 1);
  CHECK_EQ(got->msg_case, CAPUCHIN__ENVELOPE__MSG_ERROR);
  CHECK_EQ(got->error->code, CAP_EQUOTA);
  CHECK_STR(got->error->message, cap_strerror(CAP_EQUOTA));
  cap_frame_decoder_release(d, got);
  free(f);
  /* A very long message is cut to what the peer accepts. */
  char *longmsg = malloc(10000);
  memset(longmsg, 'e', 9999);
  longmsg[9999] = '\0';
  REQUIRE(cap_proto_error_frame(CAP_EPROTO, longmsg, &f, &len) == 0);
  REQUIRE(cap_frame_decoder_feed(d, f, len) == 0);
  REQUIRE(cap_frame_decoder_next(d, &got, err, sizeof err) == 1);
  CHECK_EQ(strlen(got->error->message), 4096);
  cap_frame_decoder_release(d, got);
  free(f);
  free(longmsg);
  CHECK_EQ(cap_proto_error_frame(0, "x", &f, &len), CAP_EINVAL);
  cap_frame_decoder_destroy(d);
}

/* Builder -> frame -> decoder -> iterator gives back every record. */
static void test_batch_round_trip(void) {
  cap_proto_batch_t *b = cap_proto_batch_create();
  REQUIRE(b);
  cap_proto_batch_reset(b, 5);
  CHECK_EQ(cap_proto_batch_add_decl(b, 0, 1024, CAP_KIND_PARAM), 0);
  CHECK_EQ(cap_proto_batch_add_decl(b, 1, 4096, CAP_KIND_INPUT), 0);
  CHECK_EQ(cap_proto_batch_add_decl(b, 2, 8192, CAP_KIND_ACTIVATION), 0);
  const char *names[] = {"aten.convolution.default", "aten.relu_.default",
                         "aten.view.default"};
  enum { NOPS = 1000 };
  uint32_t in[4], out[2];
  for (uint32_t i = 0; i < NOPS; i++) {
    uint32_t nin = i % 5, nout = 1 + i % 2;
    for (uint32_t j = 0; j < nin; j++)
      in[j] = (i * 7 + j) % 3000;
    for (uint32_t j = 0; j < nout; j++)
      out[j] = i + j;
    CHECK_EQ(cap_proto_batch_add_op(b, i, 100 * i, 100 * i + 50, names[i % 3],
                                    in, nin, out, nout), 0);
  }
  CHECK_EQ(cap_proto_batch_add_free(b, 99, 2), 0);
  cap_proto_batch_set_dropped(b, 7);
  CHECK_EQ(cap_proto_batch_records(b), 3 + NOPS + 1);

  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  REQUIRE(cap_proto_batch_append_frame(b, 0, &buf, &len, &cap) == 0);
  CHECK(len - 4 <= cap_proto_batch_bytes(b));
  printf("    %d ops: %zu bytes on the wire, estimate %zu\n", NOPS, len,
         cap_proto_batch_bytes(b));

  cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
  REQUIRE(cap_frame_decoder_feed(d, buf, len) == 0);
  Capuchin__Envelope *got;
  char err[256];
  REQUIRE(cap_frame_decoder_next(d, &got, err, sizeof err) == 1);
  const Capuchin__AccessBatch *m = got->access_batch;
  CHECK_EQ(m->iteration, 5);
  CHECK_EQ(m->dropped, 7);
  CHECK_EQ(m->n_names, 3); /* interned once per batch */
  CHECK_EQ(m->n_decl_id, 3);
  CHECK_EQ(m->decl_kind[1], CAPUCHIN__TENSOR_KIND__TENSOR_KIND_INPUT);
  CHECK_EQ(m->decl_bytes[2], 8192);
  CHECK_EQ(m->n_free_t_ns, 1);
  CHECK_EQ(m->free_t_ns[0], 99);
  CHECK_EQ(m->free_tensor[0], 2);
  cap_proto_op_iter_t it;
  cap_proto_op_iter_init(&it, m);
  cap_proto_op_view_t op;
  uint32_t i = 0;
  while (cap_proto_op_iter_next(&it, &op)) {
    uint32_t nin = i % 5, nout = 1 + i % 2;
    CHECK_EQ(op.seq, i);
    CHECK_EQ(op.start_ns, 100 * (int64_t)i);
    CHECK_EQ(op.end_ns, 100 * (int64_t)i + 50);
    CHECK_STR(op.name, names[i % 3]);
    CHECK_EQ(op.n_in, nin);
    CHECK_EQ(op.n_out, nout);
    for (uint32_t j = 0; j < nin && j < op.n_in; j++)
      CHECK_EQ(op.in[j], (i * 7 + j) % 3000);
    for (uint32_t j = 0; j < nout && j < op.n_out; j++)
      CHECK_EQ(op.out[j], i + j);
    i++;
  }
  CHECK_EQ(i, NOPS);
  cap_frame_decoder_release(d, got);

  /* Reset empties it; the next batch carries only its own names. */
  cap_proto_batch_reset(b, 6);
  CHECK_EQ(cap_proto_batch_records(b), 0);
  CHECK_EQ(cap_proto_batch_add_op(b, 0, 0, 1, "aten.mm.default", NULL, 0, out, 1), 0);
  len = 0;
  REQUIRE(cap_proto_batch_append_frame(b, 0, &buf, &len, &cap) == 0);
  REQUIRE(cap_frame_decoder_feed(d, buf, len) == 0);
  REQUIRE(cap_frame_decoder_next(d, &got, err, sizeof err) == 1);
  CHECK_EQ(got->access_batch->n_names, 1);
  CHECK_STR(got->access_batch->names[0], "aten.mm.default");
  CHECK_EQ(got->access_batch->has_dropped, 0);
  cap_frame_decoder_release(d, got);
  cap_frame_decoder_destroy(d);

  /* Arguments the peer would refuse are refused here. */
  CHECK_EQ(cap_proto_batch_add_decl(b, 1u << 31, 1, CAP_KIND_PARAM), CAP_ERANGE);
  CHECK_EQ(cap_proto_batch_add_decl(b, 1, 1, (cap_tensor_kind_t)9), CAP_EINVAL);
  CHECK_EQ(cap_proto_batch_add_op(b, 1, 10, 9, "x", NULL, 0, NULL, 0), CAP_ERANGE);
  CHECK_EQ(cap_proto_batch_add_op(b, 1, -1, 9, "x", NULL, 0, NULL, 0), CAP_ERANGE);
  CHECK_EQ(cap_proto_batch_add_op(b, 1u << 31, 0, 9, "x", NULL, 0, NULL, 0), CAP_ERANGE);
  CHECK_EQ(cap_proto_batch_add_op(b, 1, 0, 9, "", NULL, 0, NULL, 0), CAP_EINVAL);
  CHECK_EQ(cap_proto_batch_add_op(b, 1, 0, 9, NULL, NULL, 0, NULL, 0), CAP_EINVAL);
  uint32_t badid = 1u << 31;
  CHECK_EQ(cap_proto_batch_add_op(b, 1, 0, 9, "x", &badid, 1, NULL, 0), CAP_ERANGE);
  CHECK_EQ(cap_proto_batch_add_free(b, -1, 0), CAP_ERANGE);
  CHECK_EQ(cap_proto_batch_add_free(b, 0, badid), CAP_ERANGE);
  CHECK_EQ(cap_proto_batch_records(b), 1);

  /* A batch over the frame limit is refused by the encoder. */
  len = 0;
  CHECK_EQ(cap_proto_batch_append_frame(b, 8, &buf, &len, &cap), CAP_E2BIG);
  CHECK_EQ(len, 0);
  free(buf);
  cap_proto_batch_destroy(b);
  cap_proto_batch_destroy(NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A whole iteration's worth of access records (250k ops x 4 tensors) through
 * the builder, the encoder, the decoder and the iterator. */
static void test_batch_throughput(void) {
  enum { NOPS = 250000 };
  cap_proto_batch_t *b = cap_proto_batch_create();
  REQUIRE(b);
  char names[64][32];
  for (int i = 0; i < 64; i++)
    snprintf(names[i], sizeof names[i], "aten.op%d.default", i);
  double t0 = now_s();
  cap_proto_batch_reset(b, 1);
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  size_t frames = 0;
  for (uint32_t i = 0; i < NOPS; i++) {
    uint32_t in[3] = {i % 5000, (i + 1) % 5000, 100000 + i};
    uint32_t out[1] = {100000 + i + 1};
    REQUIRE(cap_proto_batch_add_op(b, i, 1000 * (int64_t)i,
                                   1000 * (int64_t)i + 700, names[i % 64], in,
                                   3, out, 1) == 0);
    if (cap_proto_batch_bytes(b) > (4u << 20)) {
      REQUIRE(cap_proto_batch_append_frame(b, 0, &buf, &len, &cap) == 0);
      frames++;
      cap_proto_batch_reset(b, 1);
    }
  }
  REQUIRE(cap_proto_batch_append_frame(b, 0, &buf, &len, &cap) == 0);
  frames++;
  double t1 = now_s();

  cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
  uint64_t accesses = 0, ops = 0;
  size_t off = 0;
  char err[256];
  while (off < len) {
    size_t c = len - off < 65536 ? len - off : 65536;
    REQUIRE(cap_frame_decoder_feed(d, buf + off, c) == 0);
    off += c;
    Capuchin__Envelope *got;
    int rc;
    while ((rc = cap_frame_decoder_next(d, &got, err, sizeof err)) == 1) {
      cap_proto_op_iter_t it;
      cap_proto_op_view_t op;
      cap_proto_op_iter_init(&it, got->access_batch);
      while (cap_proto_op_iter_next(&it, &op)) {
        ops++;
        accesses += op.n_in + op.n_out;
      }
      cap_frame_decoder_release(d, got);
    }
    REQUIRE(rc == 0);
  }
  double t2 = now_s();
  CHECK_EQ(ops, NOPS);
  CHECK_EQ(accesses, 4ull * NOPS);
  printf("    %u ops, %llu access records, %zu frames, %.1f bytes/access\n",
         (unsigned)NOPS, (unsigned long long)accesses, frames,
         (double)len / (double)accesses);
  printf("    build+encode %.0f ms (%.1f M accesses/s), decode+validate+"
         "iterate %.0f ms (%.1f M accesses/s)\n",
         (t1 - t0) * 1e3, (double)accesses / (t1 - t0) / 1e6, (t2 - t1) * 1e3,
         (double)accesses / (t2 - t1) / 1e6);
  cap_frame_decoder_destroy(d);
  free(buf);
  cap_proto_batch_destroy(b);
}

int main(void) {
  RUN_TEST(test_plan_round_trip);
  RUN_TEST(test_plan_blocks_checked);
  RUN_TEST(test_plan_to_msg_rejects);
  RUN_TEST(test_plan_from_msg_rejects);
  RUN_TEST(test_feedback_round_trip);
  RUN_TEST(test_envelope_helpers);
  RUN_TEST(test_batch_round_trip);
  RUN_TEST(test_batch_throughput);
  return TEST_SUMMARY();
}
