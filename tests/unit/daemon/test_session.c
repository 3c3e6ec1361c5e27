/*
 * Sessions without sockets: frames fed straight into cap__session_feed (in
 * one piece and byte by byte), a fake transport collecting what the daemon
 * sends, off-loop work run on a private loop with a temporary database. Also
 * the tracker's own checks and quotas.
 */
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/trace.h"
#include "daemon_internal.h"

typedef struct fake {
  bool closed;
  uint8_t *out;
  size_t out_len, out_cap;
} fake_t;

static int fake_send(void *ctx, uint8_t *frame, size_t len) {
  fake_t *f = ctx;
  if (f->out_len + len > f->out_cap) {
    f->out_cap = (f->out_len + len) * 2;
    f->out = realloc(f->out, f->out_cap);
  }
  memcpy(f->out + f->out_len, frame, len);
  f->out_len += len;
  free(frame);
  return 0;
}
static void fake_close(void *ctx) { ((fake_t *)ctx)->closed = true; }
static const cap__session_io_t fake_io = {.send = fake_send,
                                          .close = fake_close};

static cap_daemon_t D;
static uv_loop_t loop;
static char db[64];
static cap_profile_t *P;

/* Message cases the daemon sent, in order (up to n). */
static int sent(fake_t *f, int *cases, int n, Capuchin__Envelope **last_plan,
                cap_frame_decoder_t *dec) {
  cap_frame_decoder_feed(dec, f->out, f->out_len);
  f->out_len = 0;
  int k = 0;
  Capuchin__Envelope *env;
  while (cap_frame_decoder_next(dec, &env, NULL, 0) == 1) {
    if (k < n)
      cases[k++] = (int)env->msg_case;
    if (env->msg_case == CAPUCHIN__ENVELOPE__MSG_PLAN && last_plan && !*last_plan)
      *last_plan = env;
    else
      cap_frame_decoder_release(dec, env);
  }
  return k;
}

static void append_hello(uint8_t **buf, size_t *len, size_t *cap,
                         uint64_t budget) {
  Capuchin__Hello h = CAPUCHIN__HELLO__INIT;
  h.has_protocol_version = h.has_pid = h.has_device_index = 1;
  h.has_device_total_bytes = h.has_budget_bytes = 1;
  h.has_h2d_gbps = h.has_d2h_gbps = h.has_duplex_gbps = 1;
  h.has_persistent_bytes = 1;
  h.protocol_version = CAP_PROTO_VERSION;
  h.job_name = "unit";
  h.pid = 1;
  h.device_name = "sim";
  h.device_total_bytes = 80ull << 30;
  h.budget_bytes = budget;
  h.h2d_gbps = h.d2h_gbps = 55.1;
  h.duplex_gbps = 85.8;
  h.backend = "sim";
  h.persistent_bytes = P->resident_bytes;
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  cap_proto_envelope_set(&env, &h);
  cap_frame_append(&env, 0, buf, len, cap);
}

static void append_iteration(uint8_t **buf, size_t *len, size_t *cap) {
  cap_proto_batch_t *b = cap_proto_batch_create();
  cap_proto_batch_reset(b, 1);
  for (uint32_t t = 0; t < P->n_tensors; t++)
    cap_proto_batch_add_decl(b, t, P->tensors[t].bytes, P->tensors[t].kind);
  for (uint32_t i = 0; i < P->n_ops; i++) {
    const cap_op_t *op = &P->ops[i];
    cap_proto_batch_add_op(b, i, op->start_ns, op->end_ns, op->name,
                           cap_op_inputs(P, op), op->n_in,
                           cap_op_outputs(P, op), op->n_out);
  }
  for (uint32_t i = 0; i < P->n_frees; i++)
    cap_proto_batch_add_free(b, P->frees[i].t_ns, P->frees[i].tensor);
  cap_proto_batch_append_frame(b, 0, buf, len, cap);
  cap_proto_batch_destroy(b);
  Capuchin__IterationEnd e = CAPUCHIN__ITERATION_END__INIT;
  e.has_iteration = e.has_iter_ns = e.has_peak_bytes = e.has_bytes_out = 1;
  e.has_bytes_in = e.has_stall_ns = e.has_measured = e.has_incomplete = 1;
  e.has_mode = 1;
  e.iteration = 1;
  e.iter_ns = P->iter_ns;
  e.measured = 1;
  e.mode = CAPUCHIN__MODE__MODE_MEASURED;
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  cap_proto_envelope_set(&env, &e);
  cap_frame_append(&env, 0, buf, len, cap);
}

static void run_stream(size_t step, uint64_t budget) {
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  append_hello(&buf, &len, &cap, budget);
  append_iteration(&buf, &len, &cap);
  fake_t f = {0};
  cap__session_t *s = cap__session_create(&D, &fake_io, &f, 1, 0, 0);
  REQUIRE(s != NULL);
  for (size_t off = 0; off < len; off += step) {
    cap__session_feed(s, buf + off, len - off < step ? len - off : step);
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(!f.closed);
  cap_frame_decoder_t *dec = cap_frame_decoder_create(NULL);
  int cases[8];
  Capuchin__Envelope *plan = NULL;
  int n = sent(&f, cases, 8, &plan, dec);
  CHECK(n >= 2);
  CHECK_EQ(cases[0], CAPUCHIN__ENVELOPE__MSG_WELCOME);
  CHECK(plan != NULL);
  if (plan) {
    cap_plan_t *p = NULL;
    CHECK(cap_proto_plan_from_msg(plan->plan, NULL, &p, NULL, 0) == 0);
    if (p) {
      CHECK_EQ(p->budget_bytes, budget);
      CHECK(cap_plan_validate(p, P, NULL, 0) == 0);
    }
    cap_plan_destroy(p);
    cap_frame_decoder_release(dec, plan);
  }
  CHECK(s->profile != NULL);
  if (s->profile)
    CHECK_EQ(cap_profile_signature(s->profile), cap_profile_signature(P));
  cap__session_detach(s);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(D.sessions == NULL);
  cap_frame_decoder_destroy(dec);
  free(f.out);
  free(buf);
}

static void test_whole_stream(void) {
  run_stream((size_t)1 << 30, cap_profile_budget_pct(P, 50));
}

static void test_byte_by_byte(void) {
  run_stream(1, cap_profile_budget_pct(P, 60));
}

static void test_error_closes_and_frees(void) {
  fake_t f = {0};
  cap__session_t *s = cap__session_create(&D, &fake_io, &f, 1, 0, 0);
  static const uint8_t junk[] = {0, 0, 0, 2, 0xff, 0xff};
  cap__session_feed(s, junk, sizeof junk);
  CHECK(f.closed);
  cap_frame_decoder_t *dec = cap_frame_decoder_create(NULL);
  int cases[4];
  CHECK_EQ(sent(&f, cases, 4, NULL, dec), 1);
  CHECK_EQ(cases[0], CAPUCHIN__ENVELOPE__MSG_ERROR);
  /* More input after the error is ignored. */
  cap__session_feed(s, junk, sizeof junk);
  CHECK_EQ(f.out_len, 0);
  cap__session_detach(s);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(D.sessions == NULL);
  cap_frame_decoder_destroy(dec);
  free(f.out);
}

static void test_tracker_rules(void) {
  cap__tracker_limits_t lim = {.max_accesses = 8, .max_ops = 3,
                               .max_tensors = 3, .max_names = 4,
                               .max_name_bytes = 64};
  cap__tracker_t t;
  cap__tracker_init(&t, &lim);
  char err[256];
  CHECK(cap__tracker_decl(&t, 0, 10, 0, err, sizeof err) == 0);
  CHECK(cap__tracker_decl(&t, 0, 10, 0, err, sizeof err) == 0); /* again */
  CHECK(cap__tracker_decl(&t, 0, 11, 0, err, sizeof err) == CAP_EPROTO);
  CHECK(strstr(err, "redeclared") != NULL);
  CHECK(cap__tracker_decl(&t, 2, 10, 2, err, sizeof err) == CAP_EPROTO);
  CHECK(cap__tracker_decl(&t, 1, 10, 2, err, sizeof err) == 0);
  CHECK(cap__tracker_decl(&t, 2, 10, 2, err, sizeof err) == 0);
  CHECK(cap__tracker_decl(&t, 3, 10, 2, err, sizeof err) == CAP_EQUOTA);
  uint32_t in[] = {0, 1}, out[] = {2};
  cap_proto_op_view_t op = {.seq = 0, .start_ns = 10, .end_ns = 20,
                            .name = "a", .in = in, .n_in = 2, .out = out,
                            .n_out = 1};
  CHECK(cap__tracker_op(&t, &op, err, sizeof err) == 0);
  op.seq = 1;
  op.start_ns = 5;
  CHECK(cap__tracker_op(&t, &op, err, sizeof err) == CAP_EPROTO);
  CHECK(strstr(err, "before the previous") != NULL);
  op.start_ns = 30;
  op.end_ns = 40;
  CHECK(cap__tracker_op(&t, &op, err, sizeof err) == 0);
  op.seq = 2;
  CHECK(cap__tracker_op(&t, &op, err, sizeof err) == CAP_EQUOTA); /* 9 > 8 */
  CHECK(strstr(err, "accesses (session quota)") != NULL);
  CHECK(cap__tracker_free(&t, 50, 9, err, sizeof err) == CAP_ERANGE);
  CHECK(cap__tracker_free(&t, 50, 2, err, sizeof err) == 0);
  cap__iter_records_t r;
  CHECK(cap__tracker_end(&t, 1, &r, err, sizeof err) == 0);
  CHECK_EQ(r.n_ops, 2);
  CHECK_EQ(r.n_tensors, 3);
  CHECK_EQ(r.n_frees, 1);
  cap__iter_records_free(&r);
  CHECK(cap__tracker_begin(&t, 1, err, sizeof err) == CAP_EPROTO);
  CHECK(cap__tracker_begin(&t, 2, err, sizeof err) == 0);
  CHECK(cap__tracker_begin(&t, 3, err, sizeof err) == CAP_EPROTO);
  cap__tracker_close(&t);
}

/* A batch's name table is interned only where an op
 * uses it, and what is interned counts against the name quota. */
static void test_tracker_names(void) {
  cap__tracker_limits_t lim = {.max_accesses = 64, .max_ops = 64,
                               .max_tensors = 8, .max_names = 3,
                               .max_name_bytes = 16};
  cap__tracker_t t;
  cap__tracker_init(&t, &lim);
  char err[256];
  char *names[] = {"unused-1", "conv", "unused-2", "relu", "a-name-too-long"};
  uint32_t seq[] = {0, 1, 2}, nm[] = {1, 3, 1}, zero[] = {0, 0, 0};
  int64_t t0[] = {0, 10, 20}, t1[] = {5, 15, 25};
  Capuchin__AccessBatch b = CAPUCHIN__ACCESS_BATCH__INIT;
  b.iteration = 1;
  b.n_names = 5;
  b.names = names;
  b.n_op_seq = b.n_op_start_ns = b.n_op_end_ns = b.n_op_name = b.n_op_n_in =
      b.n_op_n_out = 3;
  b.op_seq = seq;
  b.op_start_ns = t0;
  b.op_end_ns = t1;
  b.op_name = nm;
  b.op_n_in = b.op_n_out = zero;
  CHECK(cap__tracker_batch(&t, &b, NULL, err, sizeof err) == 0);
  CHECK_EQ(t.rec.n_names, 2); /* conv, relu */
  CHECK_EQ(t.name_bytes, 10);
  /* 16 bytes: "a-name-too-long" (16 with its NUL) does not fit beside. */
  uint32_t seq2[] = {3}, nm2[] = {4};
  int64_t t02[] = {30}, t12[] = {35};
  b.n_op_seq = b.n_op_start_ns = b.n_op_end_ns = b.n_op_name = b.n_op_n_in =
      b.n_op_n_out = 1;
  b.op_seq = seq2;
  b.op_start_ns = t02;
  b.op_end_ns = t12;
  b.op_name = nm2;
  CHECK(cap__tracker_batch(&t, &b, NULL, err, sizeof err) == CAP_EQUOTA);
  CHECK(strstr(err, "op names") != NULL);
  /* A new iteration starts from no names. */
  cap__iter_records_t r;
  CHECK(cap__tracker_end(&t, 1, &r, err, sizeof err) == 0);
  cap__iter_records_free(&r);
  CHECK_EQ(t.name_bytes, 0);
  cap__tracker_close(&t);
}

int main(void) {
  char err[512];
  if (cap_trace_load(cap_test_data("traces/resnet50.trace"), &P, err,
                     sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  cap_daemon_config_t cfg;
  cap_daemon_config_init(&cfg);
  snprintf(db, sizeof db, "/tmp/capd-unit-%ld.db", (long)getpid());
  snprintf(cfg.db_path, sizeof cfg.db_path, "%s", db);
  cap__log_set_level(CAP_LOG_WARN);
  uv_loop_init(&loop);
  if (cap__daemon_init_core(&D, &loop, &cfg, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  RUN_TEST(test_whole_stream);
  RUN_TEST(test_byte_by_byte);
  RUN_TEST(test_error_closes_and_frees);
  RUN_TEST(test_tracker_rules);
  RUN_TEST(test_tracker_names);
  cap__daemon_close_core(&D);
  uv_loop_close(&loop);
  cap_profile_destroy(P);
  char p[96];
  unlink(db);
  snprintf(p, sizeof p, "%s-wal", db);
  unlink(p);
  snprintf(p, sizeof p, "%s-shm", db);
  unlink(p);
  return TEST_SUMMARY();
}
