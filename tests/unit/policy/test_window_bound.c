/*
 * The window bound (capuchin/bound.h): exact values on hand-built windows
 * (a parameter that must leave and come back, a tensor its producer can
 * replay, one whose replay needs a freed input produced again), and, on a
 * bundled trace, never above what the planner's plans cost.
 */
#include "cap_test.h"
#include "capuchin/bound.h"
#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"
#include "fixtures.h"

#define GBPS 1.0 /* one byte per ns: copy times read as bytes */

/* An optimizer tail: op 0 W -> X, op 1 X -> G (X dies), op 2 reads G and
 * updates M in place (G dies), op 3 updates W from M. 100 bytes each. */
static cap_profile_t *optimizer_tail(void) {
  fx_t f = {cap_profile_create(), 0, 0};
  uint32_t W = 0, M = 1, X = 2, G = 3, gm[] = {G, M}, mw[] = {M, W};
  fx_tensor(&f, W, 100, CAP_KIND_PARAM);
  fx_tensor(&f, M, 100, CAP_KIND_PARAM);
  fx_tensor(&f, X, 100, CAP_KIND_ACTIVATION);
  fx_tensor(&f, G, 100, CAP_KIND_ACTIVATION);
  fx_op(&f, 0, 10, "aten.mm.default", &W, 1, &X, 1);
  fx_op(&f, 10, 20, "aten.mm.default", &X, 1, &G, 1);
  fx_free(&f, 20, X);
  fx_op(&f, 20, 30, "aten._foreach_add_.List", gm, 2, &M, 1);
  fx_free(&f, 30, G);
  fx_op(&f, 30, 40, "aten._foreach_add_.List", mw, 2, &W, 1);
  return fx_finish(&f);
}

/* Whether the bound at `budget` is the window `want`, field by field;
 * says what differs. */
static bool window_is(const cap_profile_t *p, uint64_t budget,
                      bool evict_persistent, cap_window_bound_t want) {
  cap_window_bound_t b;
  int rc = cap_window_bound(p, budget, evict_persistent, GBPS, &b);
  bool same = rc == 0 && b.extra_ns == want.extra_ns &&
              b.from_op == want.from_op && b.to_op == want.to_op &&
              b.window_ns == want.window_ns && b.off_bytes == want.off_bytes;
  if (!same)
    fprintf(stderr,
            "window bound: rc %d, %" PRId64 " ns from op %u to %u (%" PRId64
            " ns), %" PRIu64 " bytes off; want %" PRId64 " ns from op %u to "
            "%u (%" PRId64 " ns), %" PRIu64 " bytes\n",
            rc, b.extra_ns, b.from_op, b.to_op, b.window_ns, b.off_bytes,
            want.extra_ns, want.from_op, want.to_op, want.window_ns,
            want.off_bytes);
  return same;
}

static void test_optimizer_tail(void) {
  cap_profile_t *p = optimizer_tail();
  REQUIRE(p);
  cap_window_bound_t b;
  /* At op 1 (X and G, 200 bytes) a 250-byte budget leaves room for one of
   * W and M: 150 bytes off, back by op 3, 20 ns later: 130 ns of waiting,
   * parameters having no producer to replay. */
  CHECK(window_is(p, 250, true, (cap_window_bound_t){130, 1, 3, 20, 150}));
  /* with room for everything no window costs anything */
  CHECK_EQ(cap_window_bound(p, 400, true, GBPS, &b), 0);
  CHECK_EQ(b.extra_ns, 0);
  CHECK_EQ(b.from_op, CAP_NONE);
  /* twice the bandwidth: 75 ns of copying in a 20 ns window */
  CHECK_EQ(cap_window_bound(p, 250, true, 2 * GBPS, &b), 0);
  CHECK_EQ(b.extra_ns, 55);
  /* a bandwidth so small the wait leaves int64_t: the largest time */
  CHECK_EQ(cap_window_bound(p, 250, true, 1e-18, &b), 0);
  CHECK_EQ(b.extra_ns, CAP_PROFILE_MAX_NS);
  CHECK_EQ(cap_window_bound(NULL, 250, true, GBPS, &b), CAP_EINVAL);
  CHECK_EQ(cap_window_bound(p, 250, true, 0, &b), CAP_EINVAL);
  cap_profile_destroy(p);
}

/* Op 0 (100 ns) produces T from W; op 1 writes Z (200 bytes), which dies
 * at once; op 2 reads T. With producer_input_freed, W is an activation
 * that op s makes and that dies after op 0, so replaying T means running
 * op s again too. */
static cap_profile_t *replayable(bool producer_input_freed) {
  fx_t f = {cap_profile_create(), 0, 0};
  uint32_t W = 0, T = 1, Z = 2, U = 3;
  fx_tensor(&f, W, 10,
            producer_input_freed ? CAP_KIND_ACTIVATION : CAP_KIND_PARAM);
  fx_tensor(&f, T, 100, CAP_KIND_ACTIVATION);
  fx_tensor(&f, Z, 200, CAP_KIND_ACTIVATION);
  fx_tensor(&f, U, 10, CAP_KIND_ACTIVATION);
  int64_t t = 0;
  if (producer_input_freed) {
    fx_op(&f, t, t + 5, "aten.empty.memory_format", NULL, 0, &W, 1);
    t += 5;
  }
  fx_op(&f, t, t + 100, "aten.mm.default", &W, 1, &T, 1);
  t += 100;
  if (producer_input_freed)
    fx_free(&f, t, W);
  fx_op(&f, t, t + 10, "aten.ones.default", NULL, 0, &Z, 1);
  t += 10;
  fx_free(&f, t, Z);
  fx_op(&f, t, t + 10, "aten.relu.default", &T, 1, &U, 1);
  t += 10;
  fx_free(&f, t, T);
  fx_free(&f, t, U);
  return fx_finish(&f);
}

static void test_replay(void) {
  /* Z and T need 300 bytes: 50 off within the 10 ns of op 1. Swapped, 50
   * bytes take 50 ns; replayed, op 0 restores them at 1 ns a byte. Best
   * mix: 20 replayed, 30 swapped, 20 ns either way. */
  cap_profile_t *p = replayable(false);
  REQUIRE(p);
  CHECK(window_is(p, 250, false, (cap_window_bound_t){20, 1, 2, 10, 50}));
  cap_profile_destroy(p);
  /* W is freed before T's next access: a replay must make W again (105 ns
   * in all), dearer than swapping the 50 bytes (40 ns beyond the window) */
  p = replayable(true);
  REQUIRE(p);
  CHECK(window_is(p, 250, false, (cap_window_bound_t){40, 2, 3, 10, 50}));
  cap_profile_destroy(p);
}

/* On vgg16, whose optimizer step needs every gradient after the first
 * layer's backward: the bound never exceeds a plan's cost (the planner's
 * at every budget and mode it finds one), never falls as the budget
 * shrinks, and at 50 % is above zero. */
static void test_below_plans(void) {
  cap_profile_t *p = NULL;
  char err[256];
  REQUIRE(cap_trace_load(cap_test_data("traces/vgg16.trace"), &p, err,
                         sizeof err) == 0);
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  cap_sim_result_t base = {0};
  REQUIRE(cap_sim_run(p, NULL, &bw, &base) == 0);
  static const double pcts[] = {80, 60, 50, 45, 40};
  for (int ep = 0; ep < 2; ep++) {
    int64_t prev = 0;
    for (size_t i = 0; i < sizeof pcts / sizeof *pcts; i++) {
      uint64_t budget = cap_profile_budget_pct(p, pcts[i]);
      cap_window_bound_t b;
      CHECK_EQ(cap_window_bound(p, budget, ep, bw.h2d_gbps, &b), 0);
      CHECK(b.extra_ns >= prev);
      prev = b.extra_ns;
      if (pcts[i] == 50)
        CHECK(b.extra_ns > 0);
      cap_plan_config_t cfg;
      cap_plan_config_init(&cfg, budget);
      cfg.evict_persistent = ep;
      cap_plan_t *plan = NULL;
      int rc = cap_plan_compute(p, "capuchin", &cfg, &plan);
      if (rc == 0) {
        cap_sim_result_t r = {0};
        CHECK_EQ(cap_sim_run(p, plan, &bw, &r), 0);
        if (r.peak_bytes <= budget && r.iter_ns - base.iter_ns < b.extra_ns)
          fprintf(stderr,
                  "vgg16 at %.0f %%%s: plan %" PRId64 " ns over, bound %" PRId64
                  "\n",
                  pcts[i], ep ? " evicting persistent" : "",
                  r.iter_ns - base.iter_ns, b.extra_ns);
        CHECK(r.peak_bytes > budget || r.iter_ns - base.iter_ns >= b.extra_ns);
        cap_sim_result_close(&r);
      } else {
        CHECK_EQ(rc, CAP_EINFEASIBLE);
      }
      cap_plan_destroy(plan);
    }
  }
  cap_sim_result_close(&base);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_optimizer_tail);
  RUN_TEST(test_replay);
  RUN_TEST(test_below_plans);
  return TEST_SUMMARY();
}
