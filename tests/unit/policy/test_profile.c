/*
 * The profile builder used directly, as the daemon's tracker uses it:
 * records one by one, interleaved, with bad records rejected and the
 * profile left as it was, so that the build can go on.
 */
#include "cap_test.h"
#include "capuchin/error.h"
#include "capuchin/profile.h"
#include "capuchin/trace.h"

static const uint32_t none[1] = {0};

/* A small model: w (param), x (input), a = mm(x, w), a = relu_(a),
 * v = view(a), s = sum(v); a and s freed. */
static cap_profile_t *build_small(void) {
  cap_profile_t *p = cap_profile_create();
  if (!p)
    return NULL;
  uint32_t in0[] = {1, 0}, out0[] = {2};
  uint32_t a[] = {2};
  uint32_t s[] = {3};
  int rc = 0;
  rc |= cap_profile_set_meta(p, "model", "small");
  rc |= cap_profile_add_tensor(p, 0, 4096, CAP_KIND_PARAM);
  rc |= cap_profile_add_tensor(p, 1, 1024, CAP_KIND_INPUT);
  rc |= cap_profile_add_tensor(p, 2, 2048, CAP_KIND_ACTIVATION);
  rc |= cap_profile_add_op(p, 0, 100, 200, "aten.mm.default", in0, 2, out0, 1);
  rc |= cap_profile_add_op(p, 1, 200, 250, "aten.relu_.default", a, 1, a, 1);
  rc |= cap_profile_add_op(p, 2, 250, 251, "aten.view.default", a, 1, a, 1);
  /* tracker style: a tensor declared between ops */
  rc |= cap_profile_add_tensor(p, 3, 4, CAP_KIND_ACTIVATION);
  rc |= cap_profile_add_op(p, 3, 260, 300, "aten.sum.default", a, 1, s, 1);
  rc |= cap_profile_add_free(p, 300, 2);
  rc |= cap_profile_add_op(p, 4, 300, 310, "aten.neg.default", s, 1, none, 0);
  rc |= cap_profile_add_free(p, 320, 3);
  rc |= cap_profile_set_meta(p, "peak_bytes", "7200"); /* meta any time */
  if (rc || cap_profile_finish(p)) {
    fprintf(stderr, "build_small: %s\n", cap_profile_error(p));
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

static void test_builder_derives(void) {
  cap_profile_t *p = build_small();
  REQUIRE(p);
  CHECK_STR(p->model, "small");
  CHECK_STR(cap_profile_meta(p, "model"), "small");
  CHECK(cap_profile_meta(p, "batch") == NULL);
  CHECK_EQ(p->meta_peak_bytes, 7200);
  CHECK_EQ(p->iter_ns, 310); /* no iter_ns meta: end of the last op */
  CHECK_EQ(p->persistent_bytes, 4096 + 1024);
  CHECK_EQ(p->peak_bytes, 5120 + 2048 + 4);
  CHECK_EQ(p->peak_t_ns, 260);
  CHECK_EQ(cap_profile_transient_peak(p), 2052);
  CHECK_EQ(cap_profile_budget_pct(p, 50.0), 5120 + 1026);
  /* Accesses: a is accessed by ops 0,1,2,3 (relu_ lists it twice: one). */
  CHECK_EQ(p->tensors[2].n_accesses, 4);
  CHECK_EQ(cap_profile_access_op(p, 2, 1), 0);
  CHECK_EQ(cap_profile_access_op(p, 2, 4), 3);
  CHECK_EQ(cap_profile_access_op(p, 2, 5), CAP_NONE);
  CHECK_EQ(cap_profile_access_op(p, 2, 0), CAP_NONE);
  CHECK_EQ(cap_profile_access_op(p, 99, 1), CAP_NONE);
  CHECK_EQ(cap_profile_access_index(p, 2, 3), 4);
  CHECK_EQ(cap_profile_access_index(p, 2, 4), 0);
  CHECK_EQ(cap_profile_access_index(p, 3, 4), 2);
  CHECK_EQ(cap_profile_accesses_before(p, 2, 0), 0);
  CHECK_EQ(cap_profile_accesses_before(p, 2, 2), 2);
  CHECK_EQ(cap_profile_accesses_before(p, 2, 4), 4); /* none left */
  CHECK_EQ(cap_profile_accesses_before(p, 3, 4), 1);
  /* a is written in place by relu_ (op 1) only: the view (op 2) is not. */
  CHECK(cap_profile_written_in_place(p, 2, 0, 2));
  CHECK(cap_profile_written_in_place(p, 2, 1, 2));
  CHECK(!cap_profile_written_in_place(p, 2, 0, 1));
  CHECK(!cap_profile_written_in_place(p, 2, 2, 5));
  CHECK(!cap_profile_written_in_place(p, 3, 0, 5));
  CHECK(!cap_profile_written_in_place(p, 99, 0, 5));
  CHECK_EQ(p->n_accesses, 1 + 1 + 4 + 2);
  CHECK_EQ(cap_profile_multi_access_tensors(p), 2);
  /* Lineage and flags. */
  CHECK_EQ(p->tensors[2].producer_op, 0);
  CHECK_EQ(p->tensors[3].producer_op, 3);
  CHECK_EQ(p->tensors[0].producer_op, CAP_NONE);
  CHECK_EQ(p->ops[0].flags, 0);
  CHECK_EQ(p->ops[1].flags, CAP_OP_INPLACE);
  CHECK_EQ(p->ops[2].flags, CAP_OP_VIEW);
  CHECK_EQ(p->ops[3].flags, 0);
  CHECK_EQ(cap_op_inputs(p, &p->ops[0])[0], 1);
  CHECK_EQ(cap_op_inputs(p, &p->ops[0])[1], 0);
  CHECK_EQ(cap_op_outputs(p, &p->ops[0])[0], 2);
  CHECK_EQ(p->tensors[2].free_ns, 300);
  CHECK_EQ(p->tensors[0].free_ns, -1);
  /* Finished: no more records. */
  CHECK_EQ(cap_profile_add_tensor(p, 4, 1, CAP_KIND_ACTIVATION), CAP_ESTATE);
  CHECK_EQ(cap_profile_finish(p), CAP_ESTATE);
  CHECK_EQ(cap_profile_set_meta(p, "x", "y"), CAP_ESTATE);
  cap_profile_destroy(p);
  cap_profile_destroy(NULL);
}

static void test_inplace_names(void) {
  static const struct {
    const char *name;
    bool inplace;
  } names[] = {
      {"aten.add_.Tensor", true},       {"aten._foreach_add_.List", true},
      {"aten.relu_.default", true},     {"aten.add.Tensor", false},
      {"aten._foreach_add.List", false}, {"aten.__iand__.Tensor", true},
      {"aten.__and__.Tensor", false},   {"aten.zero_", true},
      {"aten.t.default", false},        {"_", false},
  };
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    cap_profile_t *p = cap_profile_create();
    REQUIRE(p);
    uint32_t t[] = {0};
    CHECK_EQ(cap_profile_add_tensor(p, 0, 8, CAP_KIND_ACTIVATION), 0);
    CHECK_EQ(cap_profile_add_op(p, 0, 0, 1, names[i].name, t, 1, t, 1), 0);
    CHECK_EQ(cap_profile_finish(p), 0);
    uint32_t want = names[i].inplace ? CAP_OP_INPLACE : CAP_OP_VIEW;
    if (p->ops[0].flags != want)
      fprintf(stderr, "%s: flags %u\n", names[i].name, p->ops[0].flags);
    CHECK_EQ(p->ops[0].flags, want);
    CHECK_EQ(p->tensors[0].producer_op, CAP_NONE); /* both sides: not created */
    cap_profile_destroy(p);
  }
}

/* Each bad record fails with a message and leaves the profile unchanged;
 * the build then goes on and finishes equal to a clean build. */
static void test_bad_records_leave_profile_unchanged(void) {
  cap_profile_t *p = cap_profile_create();
  REQUIRE(p);
  uint32_t in0[] = {1, 0}, out0[] = {2}, bad[] = {1, 99999}, a[] = {2};
  CHECK_EQ(cap_profile_add_tensor(p, 0, 4096, CAP_KIND_PARAM), 0);
  CHECK_EQ(cap_profile_add_tensor(p, 0, 4096, CAP_KIND_PARAM), CAP_EPARSE);
  CHECK(strstr(cap_profile_error(p), "duplicate tensor id"));
  CHECK_EQ(cap_profile_add_tensor(p, 5, 1, CAP_KIND_PARAM), CAP_EPARSE);
  CHECK_EQ(cap_profile_add_tensor(p, UINT32_MAX, 1, CAP_KIND_PARAM),
           CAP_ERANGE);
  CHECK_EQ(cap_profile_add_tensor(p, 1, 1, (cap_tensor_kind_t)7), CAP_EPARSE);
  CHECK_EQ(cap_profile_add_tensor(p, 1, UINT64_MAX, CAP_KIND_INPUT),
           CAP_ERANGE);
  CHECK_EQ(cap_profile_add_tensor(p, 1, 1024, CAP_KIND_INPUT), 0);
  CHECK_EQ(cap_profile_add_tensor(p, 2, 2048, CAP_KIND_ACTIVATION), 0);
  CHECK_EQ(p->n_tensors, 3);

  CHECK_EQ(cap_profile_add_op(p, 0, 100, 200, "aten.mm.default", bad, 2, out0,
                              1),
           CAP_EPARSE);
  CHECK_STR(cap_profile_error(p), "op 0: unknown tensor id 99999");
  CHECK_EQ(cap_profile_add_op(p, 0, 200, 100, "aten.mm.default", in0, 2, out0,
                              1),
           CAP_EPARSE);
  CHECK_EQ(cap_profile_add_op(p, 0, -1, 100, "aten.mm.default", in0, 2, out0,
                              1),
           CAP_ERANGE);
  CHECK_EQ(cap_profile_add_op(p, 0, 0, INT64_MAX, "aten.mm.default", in0, 2,
                              out0, 1),
           CAP_ERANGE);
  CHECK_EQ(cap_profile_add_op(p, 0, 100, 200, "bad name", in0, 2, out0, 1),
           CAP_EPARSE);
  CHECK_EQ(cap_profile_add_op(p, 0, 100, 200, "", in0, 2, out0, 1),
           CAP_EPARSE);
  CHECK_EQ(cap_profile_add_op(p, 0, 100, 200, NULL, in0, 2, out0, 1),
           CAP_EPARSE);
  CHECK_EQ(cap_profile_add_op(p, 0, 100, 200, "x", NULL, 2, out0, 1),
           CAP_EINVAL);
  CHECK_EQ(cap_profile_add_op(p, 1, 100, 200, "x", in0, 2, out0, 1),
           CAP_EPARSE);
  CHECK_EQ(p->n_ops, 0);
  CHECK_EQ(p->n_op_tensors, 0);
  CHECK_EQ(p->n_accesses, 0);
  CHECK_EQ(p->tensors[2].n_accesses, 0);
  CHECK_EQ(cap_profile_add_free(p, 5, 2), CAP_EPARSE); /* not yet accessed */

  CHECK_EQ(cap_profile_add_op(p, 0, 100, 200, "aten.mm.default", in0, 2, out0,
                              1),
           0);
  CHECK_EQ(cap_profile_add_op(p, 1, 99, 250, "aten.relu_.default", a, 1, a,
                              1),
           CAP_EPARSE); /* starts before op 0 */
  CHECK(strstr(cap_profile_error(p), "before the previous op's start"));
  CHECK_EQ(cap_profile_add_free(p, 150, 2), CAP_EPARSE); /* during op 0 */
  CHECK_EQ(cap_profile_add_free(p, 300, 0), CAP_EPARSE); /* a param */
  CHECK_EQ(cap_profile_add_free(p, 300, 3), CAP_EPARSE); /* unknown */
  CHECK_EQ(cap_profile_add_free(p, -1, 2), CAP_ERANGE);
  CHECK_EQ(p->n_frees, 0);
  CHECK_EQ(cap_profile_add_free(p, 300, 2), 0);
  CHECK_EQ(cap_profile_add_free(p, 300, 2), CAP_EPARSE); /* double */
  CHECK(strstr(cap_profile_error(p), "double free of tensor 2"));
  /* An op naming a freed tensor. */
  CHECK_EQ(cap_profile_add_op(p, 1, 300, 310, "aten.neg.default", a, 1, none,
                              0),
           CAP_EPARSE);
  CHECK(strstr(cap_profile_error(p), "was freed at 300"));

  CHECK_EQ(cap_profile_set_meta(p, "peak_bytes", "-1"), CAP_ERANGE);
  CHECK_EQ(cap_profile_set_meta(p, "iter_ns", "99999999999999999999"),
           CAP_ERANGE);
  CHECK_EQ(cap_profile_set_meta(p, "bad key", "v"), CAP_EPARSE);
  CHECK_EQ(cap_profile_set_meta(p, "k", ""), CAP_EPARSE);
  CHECK_EQ(cap_profile_set_meta(p, "k", "a b"), CAP_EPARSE);
  CHECK_EQ(cap_profile_set_meta(p, "k", "\xff"), CAP_EPARSE);
  CHECK_EQ(cap_profile_set_meta(p, "model", "m"), 0);
  CHECK_EQ(cap_profile_set_meta(p, "model", "n"), CAP_EPARSE);
  CHECK_EQ(p->n_meta, 1);
  CHECK_EQ(cap_profile_set_meta(p, "iter_ns", "150"), 0);
  CHECK_EQ(cap_profile_finish(p), CAP_EPARSE); /* iter_ns before op end */
  CHECK(!p->finished);
  cap_profile_destroy(p);

  cap_profile_t *e = cap_profile_create();
  REQUIRE(e);
  CHECK_EQ(cap_profile_finish(e), CAP_EPARSE);
  CHECK_STR(cap_profile_error(e), "profile has no ops");
  cap_profile_destroy(e);
  CHECK_EQ(cap_profile_finish(NULL), CAP_EINVAL);
}

/* The builder's profile writes as a trace that reads back equal, and
 * the signature depends on structure, not on times or meta. */
static void test_equal_and_signature(void) {
  cap_profile_t *p = build_small(), *q = build_small();
  REQUIRE(p && q);
  CHECK(cap_profile_equal(p, q));
  CHECK_EQ(cap_profile_signature(p), cap_profile_signature(q));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  REQUIRE(f);
  CHECK_EQ(cap_trace_write(f, p), 0);
  fclose(f);
  cap_profile_t *r = NULL;
  char err[256];
  CHECK_EQ(cap_trace_parse(buf, len, "small.trace", &r, err, sizeof err), 0);
  CHECK(r && cap_profile_equal(p, r));
  free(buf);
  cap_profile_destroy(r);

  /* Same structure, other times and meta: same signature, not equal. */
  cap_profile_t *s = cap_profile_create();
  REQUIRE(s);
  uint32_t in0[] = {1, 0}, out0[] = {2}, a[] = {2}, sm[] = {3};
  cap_profile_add_tensor(s, 0, 4096, CAP_KIND_PARAM);
  cap_profile_add_tensor(s, 1, 1024, CAP_KIND_INPUT);
  cap_profile_add_tensor(s, 2, 2048, CAP_KIND_ACTIVATION);
  cap_profile_add_tensor(s, 3, 4, CAP_KIND_ACTIVATION);
  cap_profile_add_op(s, 0, 0, 90, "aten.mm.default", in0, 2, out0, 1);
  cap_profile_add_op(s, 1, 90, 95, "aten.relu_.default", a, 1, a, 1);
  cap_profile_add_op(s, 2, 95, 96, "aten.view.default", a, 1, a, 1);
  cap_profile_add_op(s, 3, 96, 99, "aten.sum.default", a, 1, sm, 1);
  cap_profile_add_op(s, 4, 99, 100, "aten.neg.default", sm, 1, none, 0);
  cap_profile_set_meta(s, "device", "other");
  CHECK_EQ(cap_profile_finish(s), 0);
  CHECK_EQ(cap_profile_signature(s), cap_profile_signature(p));
  CHECK(!cap_profile_equal(s, p));
  cap_profile_destroy(s);

  /* One tensor size different: other signature. */
  cap_profile_t *t = cap_profile_create();
  REQUIRE(t);
  cap_profile_add_tensor(t, 0, 4096, CAP_KIND_PARAM);
  cap_profile_add_tensor(t, 1, 1024, CAP_KIND_INPUT);
  cap_profile_add_tensor(t, 2, 2049, CAP_KIND_ACTIVATION);
  cap_profile_add_tensor(t, 3, 4, CAP_KIND_ACTIVATION);
  cap_profile_add_op(t, 0, 0, 90, "aten.mm.default", in0, 2, out0, 1);
  cap_profile_add_op(t, 1, 90, 95, "aten.relu_.default", a, 1, a, 1);
  cap_profile_add_op(t, 2, 95, 96, "aten.view.default", a, 1, a, 1);
  cap_profile_add_op(t, 3, 96, 99, "aten.sum.default", a, 1, sm, 1);
  cap_profile_add_op(t, 4, 99, 100, "aten.neg.default", sm, 1, none, 0);
  CHECK_EQ(cap_profile_finish(t), 0);
  CHECK(cap_profile_signature(t) != cap_profile_signature(p));
  cap_profile_destroy(t);
  cap_profile_destroy(p);
  cap_profile_destroy(q);
}

/* Many ops with the same names: names are interned and stay valid while
 * the arrays grow (checked under ASan). */
static void test_many_records(void) {
  cap_profile_t *p = cap_profile_create();
  REQUIRE(p);
  const uint32_t n = 20000;
  REQUIRE(cap_profile_add_tensor(p, 0, 64, CAP_KIND_PARAM) == 0);
  for (uint32_t i = 1; i <= n; i++) {
    uint32_t in[] = {i - 1}, out[] = {i};
    char name[32];
    snprintf(name, sizeof name, "aten.op%u.default", i % 7);
    REQUIRE(cap_profile_add_tensor(p, i, 128, CAP_KIND_ACTIVATION) == 0);
    REQUIRE(cap_profile_add_op(p, i - 1, (int64_t)i * 10, (int64_t)i * 10 + 5,
                               name, in, 1, out, 1) == 0);
    if (i >= 2)
      REQUIRE(cap_profile_add_free(p, (int64_t)i * 10 + 5, i - 1) == 0);
  }
  REQUIRE(cap_profile_finish(p) == 0);
  CHECK_EQ(p->n_ops, n);
  CHECK_STR(p->ops[0].name, "aten.op1.default");
  CHECK_STR(p->ops[n - 1].name, "aten.op1.default"); /* 20000 % 7 */
  CHECK(p->ops[7].name == p->ops[0].name); /* interned */
  /* At most two activations live at once (chain, freed one op later); the
   * last one is never freed, so it counts as persistent. */
  CHECK_EQ(p->persistent_bytes, 64 + 128);
  CHECK_EQ(p->peak_bytes, 64 + 128 + 256);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_builder_derives);
  RUN_TEST(test_inplace_names);
  RUN_TEST(test_bad_records_leave_profile_unchanged);
  RUN_TEST(test_equal_and_signature);
  RUN_TEST(test_many_records);
  return TEST_SUMMARY();
}
