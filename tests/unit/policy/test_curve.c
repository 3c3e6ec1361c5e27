/*
 * The memory curve: hand-built profiles with hand-computed curves, then
 * every real trace against a brute-force evaluation of the same rule.
 */
#include "cap_test.h"
#include "capuchin/error.h"
#include "capuchin/profile.h"
#include "capuchin/trace.h"

/*  t:   0     10    20    30    40    50
 *  op0 [bn_]  op1 [conv]  op2 [relu]  op3 [mm]  op4 [sum]
 *  a (50):  born 10 (op1), freed 30
 *  b (200): born 20 (op2), freed 40
 *  c (300): born 30 (op3), freed 50
 *  s (7):   BatchNorm stat, in-place at op0, never freed: persistent */
static cap_profile_t *build(const char *resident) {
  cap_profile_t *p = cap_profile_create();
  if (!p)
    return NULL;
  uint32_t s[] = {5}, in1[] = {1, 0}, a[] = {2}, b[] = {3}, in3[] = {3, 0},
           c[] = {4};
  int rc = 0;
  if (resident)
    rc |= cap_profile_set_meta(p, "resident_bytes", resident);
  rc |= cap_profile_add_tensor(p, 0, 1000, CAP_KIND_PARAM);
  rc |= cap_profile_add_tensor(p, 1, 100, CAP_KIND_INPUT);
  rc |= cap_profile_add_tensor(p, 2, 50, CAP_KIND_ACTIVATION);
  rc |= cap_profile_add_tensor(p, 3, 200, CAP_KIND_ACTIVATION);
  rc |= cap_profile_add_tensor(p, 4, 300, CAP_KIND_ACTIVATION);
  rc |= cap_profile_add_tensor(p, 5, 7, CAP_KIND_ACTIVATION);
  rc |= cap_profile_add_op(p, 0, 0, 10, "aten.add_.Tensor", s, 1, s, 1);
  rc |= cap_profile_add_op(p, 1, 10, 20, "aten.convolution.default", in1, 2,
                           a, 1);
  rc |= cap_profile_add_op(p, 2, 20, 30, "aten.relu.default", a, 1, b, 1);
  rc |= cap_profile_add_op(p, 3, 30, 40, "aten.mm.default", in3, 2, c, 1);
  rc |= cap_profile_add_op(p, 4, 40, 50, "aten.sum.default", c, 1, NULL, 0);
  rc |= cap_profile_add_free(p, 30, 2);
  rc |= cap_profile_add_free(p, 40, 3);
  rc |= cap_profile_add_free(p, 50, 4);
  if (rc || cap_profile_finish(p)) {
    fprintf(stderr, "build: %s\n", cap_profile_error(p));
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

static void test_hand_built(void) {
  cap_profile_t *p = build(NULL);
  REQUIRE(p);
  /* No resident_bytes: params + inputs + the never-freed stat. */
  CHECK_EQ(p->persistent_bytes, 1000 + 100 + 7);
  cap_curve_t c;
  REQUIRE(cap_curve_compute(p, &c) == 0);
  /* At 30, a's free comes before c's birth: 1107+200+300, not +50 more. */
  static const cap_curve_point_t want[] = {
      {0, 1107}, {10, 1157}, {20, 1357}, {30, 1607}, {40, 1407}, {50, 1107},
  };
  CHECK_EQ(c.n_points, 6);
  for (uint32_t i = 0; i < c.n_points && i < 6; i++) {
    CHECK_EQ(c.points[i].t_ns, want[i].t_ns);
    CHECK_EQ(c.points[i].bytes, want[i].bytes);
  }
  CHECK_EQ(c.peak_bytes, 1607);
  CHECK_EQ(c.peak_t_ns, 30);
  CHECK_EQ(p->peak_bytes, 1607);
  CHECK_EQ(p->peak_t_ns, 30);
  CHECK_EQ(cap_profile_transient_peak(p), 500);
  CHECK_EQ(cap_profile_budget_pct(p, 50.0), 1107 + 250);
  CHECK_EQ(cap_profile_budget_pct(p, 100.0), 1607);
  CHECK_EQ(cap_profile_budget_pct(p, 200.0), 2107);
  cap_curve_close(&c);
  CHECK(c.points == NULL && c.n_points == 0);
  cap_curve_close(&c); /* twice is fine */
  cap_profile_destroy(p);
}

/* resident_bytes above the tensor sum (allocator rounding, workspaces)
 * becomes the base; below it, the tensor sum wins. */
static void test_resident_bytes(void) {
  cap_profile_t *p = build("2000");
  REQUIRE(p);
  CHECK_EQ(p->persistent_bytes, 2000);
  CHECK_EQ(p->peak_bytes, 2500);
  CHECK_EQ(p->peak_t_ns, 30);
  CHECK_EQ(cap_profile_transient_peak(p), 500);
  cap_profile_destroy(p);
  p = build("10");
  REQUIRE(p);
  CHECK_EQ(p->persistent_bytes, 1107);
  CHECK_EQ(p->peak_bytes, 1607);
  cap_profile_destroy(p);
}

/* The peak reached twice is reported at its first time; an activation
 * born at t=0 merges into the first point. */
static void test_first_peak_and_t0(void) {
  cap_profile_t *p = cap_profile_create();
  REQUIRE(p);
  uint32_t x[] = {0}, y[] = {1};
  CHECK_EQ(cap_profile_add_tensor(p, 0, 100, CAP_KIND_ACTIVATION), 0);
  CHECK_EQ(cap_profile_add_tensor(p, 1, 100, CAP_KIND_ACTIVATION), 0);
  CHECK_EQ(cap_profile_add_op(p, 0, 0, 5, "aten.empty.memory_format", NULL, 0,
                              x, 1),
           0);
  CHECK_EQ(cap_profile_add_op(p, 1, 20, 25, "aten.empty.memory_format", NULL,
                              0, y, 1),
           0);
  CHECK_EQ(cap_profile_add_free(p, 10, 0), 0);
  CHECK_EQ(cap_profile_add_free(p, 30, 1), 0);
  REQUIRE(cap_profile_finish(p) == 0);
  cap_curve_t c;
  REQUIRE(cap_curve_compute(p, &c) == 0);
  CHECK_EQ(c.n_points, 4);
  CHECK_EQ(c.points[0].t_ns, 0);
  CHECK_EQ(c.points[0].bytes, 100);
  CHECK_EQ(c.points[3].t_ns, 30);
  CHECK_EQ(c.points[3].bytes, 0);
  CHECK_EQ(c.peak_bytes, 100);
  CHECK_EQ(c.peak_t_ns, 0);
  CHECK_EQ(cap_profile_budget_pct(p, 0.0), 0);
  cap_curve_close(&c);
  cap_profile_destroy(p);

  cap_profile_t *u = cap_profile_create();
  REQUIRE(u);
  CHECK_EQ(cap_curve_compute(u, &c), CAP_EINVAL); /* not finished */
  CHECK_EQ(cap_curve_compute(NULL, &c), CAP_EINVAL);
  cap_profile_destroy(u);
}

/* Live bytes at time t by the definition, with no sorting or sweeping:
 * persistent + freed activations born at or before t and freed after t. */
static uint64_t live_at(const cap_profile_t *p, int64_t t) {
  uint64_t b = p->persistent_bytes;
  for (uint32_t i = 0; i < p->n_tensors; i++) {
    const cap_tensor_t *ct = &p->tensors[i];
    if (cap_tensor_is_resident(ct))
      continue;
    int64_t born = p->ops[cap_profile_access_op(p, i, 1)].start_ns;
    if (born <= t && ct->free_ns > t)
      b += ct->bytes;
  }
  return b;
}

static uint64_t curve_at(const cap_curve_t *c, int64_t t) {
  uint64_t b = c->points[0].bytes;
  for (uint32_t i = 0; i < c->n_points && c->points[i].t_ns <= t; i++)
    b = c->points[i].bytes;
  return b;
}

static void test_traces_match_brute_force(void) {
  static const char *const names[] = {"resnet50", "vgg16", "mobilenet_v2",
                                      "gpt2_small"};
  for (size_t n = 0; n < sizeof names / sizeof *names; n++) {
    char rel[64], err[256];
    snprintf(rel, sizeof rel, "traces/%s.trace", names[n]);
    cap_profile_t *p = NULL;
    REQUIRE(cap_trace_load(cap_test_data(rel), &p, err, sizeof err) == 0);
    cap_curve_t c;
    REQUIRE(cap_curve_compute(p, &c) == 0);
    uint64_t peak = 0;
    int64_t peak_t = -1;
    int bad = 0;
    /* The curve changes only at op starts and frees: check all of them. */
    for (uint32_t o = 0; o < p->n_ops; o++) {
      int64_t t = p->ops[o].start_ns;
      uint64_t want = live_at(p, t);
      if (curve_at(&c, t) != want)
        bad++;
      if (want > peak) {
        peak = want;
        peak_t = t;
      }
    }
    for (uint32_t f = 0; f < p->n_frees; f++) {
      int64_t t = p->frees[f].t_ns;
      if (curve_at(&c, t) != live_at(p, t))
        bad++;
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(c.peak_bytes, peak);
    CHECK_EQ(c.peak_t_ns, peak_t);
    for (uint32_t i = 1; i < c.n_points; i++)
      CHECK(c.points[i].t_ns > c.points[i - 1].t_ns);
    cap_curve_close(&c);
    cap_profile_destroy(p);
  }
}

int main(void) {
  RUN_TEST(test_hand_built);
  RUN_TEST(test_resident_bytes);
  RUN_TEST(test_first_peak_and_t0);
  RUN_TEST(test_traces_match_brute_force);
  return TEST_SUMMARY();
}
