/*
 * Bad input: each malformed, oversized or
 * out-of-order frame, unknown message, out-of-range id and an iteration
 * with millions of accesses beyond the session quota gets an Error frame
 * naming the problem and its session closed; a bystander session in the
 * middle of its measured iteration carries on and gets its plan, and what
 * was stored before is still there.
 */
#include "cap_test.h"
#include "capuchin/trace.h"
#include "store.h"
#include "testclient.h"

static tc_daemon_t D;
static cap_profile_t *P;

static void hello(tc_t *c, const char *job) {
  tc_hello_args_t a = {.job = job, .budget_bytes = 1ull << 34};
  if (tc_hello(c, &a, NULL, 10000) != 0)
    fprintf(stderr, "hello failed for %s\n", job);
}

/* Expect an Error with code and a message containing what, then a close. */
static void expect_error(tc_t *c, int code, const char *what,
                         const char *name) {
  Capuchin__Envelope *env = tc_wait(c, CAPUCHIN__ENVELOPE__MSG_ERROR, 10000);
  if (!env) {
    fprintf(stderr, "%s: no Error frame\n", name);
    CHECK(env != NULL);
    return;
  }
  printf("%-22s -> %s: %s\n", name, cap_err_name(env->error->code),
         env->error->message);
  if (code)
    CHECK_EQ(env->error->code, code);
  CHECK(strstr(env->error->message, what) != NULL);
  tc_release(c, env);
  CHECK(tc_wait_closed(c, 10000));
}

static void raw_case(const char *name, const void *bytes, size_t len,
                     bool say_hello, int code, const char *what) {
  tc_t c;
  if (tc_connect(&c, D.sock) != 0) {
    CHECK(!"connect");
    return;
  }
  if (say_hello)
    hello(&c, name);
  tc_send_raw(&c, bytes, len);
  expect_error(&c, code, what, name);
  tc_close(&c);
}

static void test_bad_frames(void) {
  static const uint8_t garbage[] = {0, 0, 0, 10, 0xff, 0xff, 0xff, 0xff, 0xff,
                                    0xff, 0xff, 0xff, 0xff, 0xff};
  raw_case("garbage payload", garbage, sizeof garbage, true, CAP_EPARSE,
           "bad frame");
  static const uint8_t huge[] = {0x7f, 0xff, 0xff, 0xff, 1, 2, 3};
  raw_case("oversized frame", huge, sizeof huge, false, CAP_E2BIG, "maximum");
  static const uint8_t zero[] = {0, 0, 0, 0};
  raw_case("zero-length frame", zero, sizeof zero, true, CAP_EPROTO,
           "zero-length");
  /* An envelope holding only field 99 (a message this build does not know). */
  static const uint8_t unknown[] = {0, 0, 0, 3, 0x98, 0x06, 0x01};
  raw_case("unknown message", unknown, sizeof unknown, true, 0, "");
}

static void test_out_of_order(void) {
  tc_t c;
  REQUIRE(tc_connect(&c, D.sock) == 0);
  Capuchin__TensorDecl td = CAPUCHIN__TENSOR_DECL__INIT;
  td.has_id = td.has_bytes = td.has_kind = 1;
  td.bytes = 64;
  tc_send_msg(&c, &td);
  expect_error(&c, CAP_EPROTO, "expected hello first", "decl before hello");
  tc_close(&c);

  REQUIRE(tc_connect(&c, D.sock) == 0);
  hello(&c, "second-hello");
  tc_hello_args_t a = {.job = "again", .budget_bytes = 1ull << 30};
  CHECK(tc_hello(&c, &a, NULL, 5000) != 0); /* no second Welcome... */
  printf("%-22s -> %s: %s\n", "second hello", cap_err_name(c.last_error_code),
         c.last_error); /* ...but an Error */
  CHECK_EQ(c.last_error_code, CAP_EPROTO);
  CHECK(strstr(c.last_error, "already said hello") != NULL);
  CHECK(tc_wait_closed(&c, 10000));
  tc_close(&c);

  REQUIRE(tc_connect(&c, D.sock) == 0);
  hello(&c, "sends-welcome");
  Capuchin__Welcome w = CAPUCHIN__WELCOME__INIT;
  w.has_protocol_version = w.has_session_id = w.has_job_id = 1;
  w.has_budget_bytes = w.has_plan_reused = 1;
  w.protocol_version = CAP_PROTO_VERSION;
  w.session_id = w.job_id = 1;
  tc_send_msg(&c, &w);
  expect_error(&c, CAP_EPROTO, "unexpected welcome", "welcome from client");
  tc_close(&c);

  REQUIRE(tc_connect(&c, D.sock) == 0);
  hello(&c, "skips-seq");
  Capuchin__TensorDecl d0 = CAPUCHIN__TENSOR_DECL__INIT;
  d0.has_id = d0.has_bytes = d0.has_kind = 1;
  d0.bytes = 64;
  tc_send_msg(&c, &d0);
  uint32_t ids[] = {0};
  Capuchin__OpRecord op = CAPUCHIN__OP_RECORD__INIT;
  op.has_seq = op.has_start_ns = op.has_end_ns = 1;
  op.seq = 5;
  op.end_ns = 10;
  op.name = "aten.relu.default";
  op.n_inputs = 1;
  op.inputs = ids;
  tc_send_msg(&c, &op);
  expect_error(&c, CAP_EPROTO, "op seq 5 out of order", "op seq skipped");
  tc_close(&c);

  REQUIRE(tc_connect(&c, D.sock) == 0);
  hello(&c, "iteration-goes-back");
  tc_send_iteration_end(&c, 3, 1000, false, false, 0, 0);
  tc_send_iteration_end(&c, 2, 1000, false, false, 0, 0);
  expect_error(&c, CAP_EPROTO, "after iteration 3 ended", "iteration back");
  tc_close(&c);
}

static void test_hello_out_of_range(void) {
  /* Finite and positive, so the frame is valid; no link is this slow. */
  tc_t c;
  REQUIRE(tc_connect(&c, D.sock) == 0);
  Capuchin__Hello h = CAPUCHIN__HELLO__INIT;
  h.has_protocol_version = h.has_pid = h.has_device_index = 1;
  h.has_device_total_bytes = h.has_budget_bytes = 1;
  h.has_h2d_gbps = h.has_d2h_gbps = h.has_duplex_gbps = 1;
  h.protocol_version = CAP_PROTO_VERSION;
  h.job_name = "slow-link";
  h.pid = 1;
  h.device_name = "sim";
  h.device_total_bytes = 1ull << 34;
  h.budget_bytes = 1ull << 33;
  h.h2d_gbps = 1e-300;
  h.d2h_gbps = h.duplex_gbps = 50;
  h.backend = "sim";
  tc_send_msg(&c, &h);
  expect_error(&c, CAP_ERANGE, "h2d_gbps", "bandwidth 1e-300");
  tc_close(&c);

  /* The floor, 1 MB/s, is taken (the PyTorch adapter's tests model a sim
   * link of 2 MB/s); just below it is not. */
  REQUIRE(tc_connect(&c, D.sock) == 0);
  h.job_name = "slowest-link";
  h.h2d_gbps = h.d2h_gbps = h.duplex_gbps = 0.001;
  tc_send_msg(&c, &h);
  CHECK(tc_wait_welcome(&c, NULL, 10000) == 0);
  tc_close(&c);
  REQUIRE(tc_connect(&c, D.sock) == 0);
  h.h2d_gbps = 0.0009;
  tc_send_msg(&c, &h);
  expect_error(&c, CAP_ERANGE, "h2d_gbps", "bandwidth 0.0009");
  tc_close(&c);

  REQUIRE(tc_connect(&c, D.sock) == 0);
  h.h2d_gbps = 50;
  h.d2h_gbps = h.duplex_gbps = 50;
  h.protocol_version = 99;
  tc_send_msg(&c, &h);
  expect_error(&c, CAP_EVERSION, "protocol version 99", "protocol version");
  tc_close(&c);
}

static void test_ids_out_of_range(void) {
  tc_t c;
  REQUIRE(tc_connect(&c, D.sock) == 0);
  hello(&c, "bad-ids");
  cap_proto_batch_t *b = cap_proto_batch_create();
  cap_proto_batch_reset(b, 1);
  cap_proto_batch_add_decl(b, 0, 4096, CAP_KIND_PARAM);
  cap_proto_batch_add_decl(b, 1, 4096, CAP_KIND_ACTIVATION);
  uint32_t in[] = {0}, out[] = {99999};
  cap_proto_batch_add_op(b, 0, 0, 10, "aten.relu.default", in, 1, out, 1);
  tc_flush_batch(&c, b);
  cap_proto_batch_destroy(b);
  expect_error(&c, CAP_ERANGE, "unknown tensor id 99999", "unknown tensor id");
  tc_close(&c);

  REQUIRE(tc_connect(&c, D.sock) == 0);
  hello(&c, "decl-gap");
  Capuchin__TensorDecl td = CAPUCHIN__TENSOR_DECL__INIT;
  td.has_id = td.has_bytes = td.has_kind = 1;
  td.id = 7;
  td.bytes = 64;
  tc_send_msg(&c, &td);
  expect_error(&c, CAP_EPROTO, "declared out of order", "tensor id gap");
  tc_close(&c);
}

static void test_access_quota(void) {
  /* The daemon runs with --max-accesses-per-iteration 1000000; this client
   * reports 3 million. */
  tc_t c;
  REQUIRE(tc_connect(&c, D.sock) == 0);
  hello(&c, "access-flood");
  enum { FANIN = 1000, OPS_PER_BATCH = 50, OPS = 3000 };
  static uint32_t in[FANIN];
  cap_proto_batch_t *b = cap_proto_batch_create();
  cap_proto_batch_reset(b, 1);
  for (uint32_t t = 0; t < FANIN + 1; t++)
    cap_proto_batch_add_decl(b, t, 256, CAP_KIND_ACTIVATION);
  for (uint32_t t = 0; t < FANIN; t++)
    in[t] = t;
  uint32_t out[] = {FANIN};
  bool sent_all = true;
  for (uint32_t i = 0; i < OPS; i++) {
    cap_proto_batch_add_op(b, i, i * 10, i * 10 + 5, "aten.cat.default", in,
                           FANIN, out, 1);
    if ((i + 1) % OPS_PER_BATCH == 0) {
      if (tc_flush_batch(&c, b) != 0) {
        sent_all = false; /* closed on us: expected once over quota */
        break;
      }
      cap_proto_batch_reset(b, 1);
    }
  }
  cap_proto_batch_destroy(b);
  (void)sent_all;
  expect_error(&c, CAP_EQUOTA, "accesses (session quota)", "access flood");
  tc_close(&c);
}

static void test_bystander_and_store_unaffected(void) {
  /* Stored before the bad clients came: still there. */
  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(D.db, CAP_STORE_READONLY, &s) == 0);
  int64_t pl = 0;
  CHECK(cap_store_plan_find(s, cap_profile_signature(P),
                            cap_profile_budget_pct(P, 50), NULL, 0.2, &pl,
                            NULL) == 0);
  cap_store_close(s);
}

int main(void) {
  char err[256];
  if (cap_trace_load(cap_test_data("traces/resnet50.trace"), &P, err,
                     sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  const char *extra[] = {"--max-accesses-per-iteration", "1000000", NULL};
  if (tc_daemon_start(&D, NULL, extra) != 0) {
    fprintf(stderr, "capuchind did not start\n");
    return 1;
  }
  /* A job that stored its profile and plan before. */
  tc_t first, by;
  tc_hello_args_t a = {.job = "stored-first",
                       .budget_bytes = cap_profile_budget_pct(P, 50)};
  if (tc_connect(&first, D.sock) != 0 || tc_hello(&first, &a, NULL, 10000) ||
      tc_send_iteration(&first, P, 1, true, 256) != 0) {
    fprintf(stderr, "first job failed\n");
    return 1;
  }
  cap_plan_t *p1 = tc_wait_plan(&first, TC_PLAN_WAIT_MS);
  CHECK(p1 != NULL);
  cap_plan_destroy(p1);
  tc_close(&first);
  /* A bystander halfway through its measured iteration while the bad
   * clients come and go. */
  a.job = "bystander";
  if (tc_connect(&by, D.sock) != 0 || tc_hello(&by, &a, NULL, 10000)) {
    fprintf(stderr, "bystander failed\n");
    return 1;
  }
  cap_proto_batch_t *b = cap_proto_batch_create();
  cap_proto_batch_reset(b, 1);
  for (uint32_t t = 0; t < P->n_tensors; t++)
    cap_proto_batch_add_decl(b, t, P->tensors[t].bytes, P->tensors[t].kind);
  uint32_t half = P->n_ops / 2;
  for (uint32_t i = 0; i < half; i++) {
    const cap_op_t *op = &P->ops[i];
    cap_proto_batch_add_op(b, i, op->start_ns, op->end_ns, op->name,
                           cap_op_inputs(P, op), op->n_in,
                           cap_op_outputs(P, op), op->n_out);
  }
  tc_flush_batch(&by, b);

  RUN_TEST(test_bad_frames);
  RUN_TEST(test_out_of_order);
  RUN_TEST(test_hello_out_of_range);
  RUN_TEST(test_ids_out_of_range);
  RUN_TEST(test_access_quota);

  /* The bystander finishes its iteration and is planned as if alone. */
  cap_proto_batch_reset(b, 1);
  for (uint32_t i = half; i < P->n_ops; i++) {
    const cap_op_t *op = &P->ops[i];
    cap_proto_batch_add_op(b, i, op->start_ns, op->end_ns, op->name,
                           cap_op_inputs(P, op), op->n_in,
                           cap_op_outputs(P, op), op->n_out);
  }
  for (uint32_t i = 0; i < P->n_frees; i++)
    cap_proto_batch_add_free(b, P->frees[i].t_ns, P->frees[i].tensor);
  tc_flush_batch(&by, b);
  cap_proto_batch_destroy(b);
  tc_send_iteration_end(&by, 1, P->iter_ns, true, false, 0, 0);
  cap_plan_t *pb = tc_wait_plan(&by, TC_PLAN_WAIT_MS);
  CHECK(pb != NULL);
  if (pb)
    CHECK(cap_plan_validate(pb, P, NULL, 0) == 0);
  cap_plan_destroy(pb);
  CHECK(!by.eof);
  tc_close(&by);
  RUN_TEST(test_bystander_and_store_unaffected);
  CHECK_EQ(tc_daemon_stop(&D), 0); /* and it never crashed */
  cap_profile_destroy(P);
  if (cap_test_failed)
    fprintf(stderr, "daemon log kept in %s\n", D.log);
  else
    tc_daemon_cleanup(&D);
  return TEST_SUMMARY();
}
