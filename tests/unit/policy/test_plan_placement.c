/*
 * A plan's placement (cap_plan_place): in-place sharing offered only where
 * it is correct, on small profiles built here, and on every bundled trace
 * under the capuchin planner a valid placement whose live peak is the
 * simulator's.
 */
#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/planner.h"
#include "capuchin/trace.h"
#include "capuchin/types.h"

#include "cap_test.h"

#define MiB (1ull << 20)

/* op0 makes x; op1 (`op1_name`) reads x and makes y; op2 reads y (and x
 * too when x_lives_on) and makes z. */
static cap_profile_t *chain(const char *op1_name, bool x_lives_on) {
  cap_profile_t *p = cap_profile_create();
  if (!p)
    return NULL;
  uint32_t x = 0, y = 1, z = 2, in2[2] = {y, x};
  int rc = cap_profile_add_tensor(p, x, MiB, CAP_KIND_ACTIVATION);
  rc = rc ? rc : cap_profile_add_tensor(p, y, MiB, CAP_KIND_ACTIVATION);
  rc = rc ? rc : cap_profile_add_tensor(p, z, MiB, CAP_KIND_ACTIVATION);
  rc = rc ? rc : cap_profile_add_op(p, 0, 0, 10, "aten.mm.default", NULL, 0, &x, 1);
  rc = rc ? rc : cap_profile_add_op(p, 1, 20, 30, op1_name, &x, 1, &y, 1);
  if (!x_lives_on)
    rc = rc ? rc : cap_profile_add_free(p, 31, x);
  rc = rc ? rc : cap_profile_add_op(p, 2, 40, 50, "aten.sum.default", in2,
                                    x_lives_on ? 2 : 1, &z, 1);
  if (x_lives_on)
    rc = rc ? rc : cap_profile_add_free(p, 51, x);
  rc = rc ? rc : cap_profile_add_free(p, 52, y);
  rc = rc ? rc : cap_profile_add_free(p, 60, z);
  rc = rc ? rc : cap_profile_finish(p);
  if (rc) {
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

static void place_chain(const char *op1, bool x_lives_on, uint32_t want_shared,
                        uint64_t want_arena, uint64_t want_peak) {
  cap_profile_t *p = chain(op1, x_lives_on);
  REQUIRE(p);
  const cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  for (int s = 0; s <= CAP_PLACE_BEST; s++) {
    cap_plan_placement_t pp;
    REQUIRE(cap_plan_place(p, NULL, &bw, (cap_place_strategy_t)s, &pp) == 0);
    CHECK_EQ(pp.n, 3);
    /* By area y (the longest) is placed before x, whose block it could
     * have taken: sharing happens only when the input is placed first. */
    if (s != CAP_PLACE_BY_AREA)
      CHECK_EQ(pp.placement.shared, want_shared);
    CHECK_EQ(pp.placement.arena_bytes, want_arena);
    CHECK_EQ(pp.placement.peak_bytes, want_peak);
    CHECK(cap_placement_check(pp.blocks, pp.n, pp.placement.offsets, 0, NULL,
                              NULL) == 0);
    cap_plan_placement_close(&pp);
  }
  cap_profile_destroy(p);
}

static void test_sharing_where_correct(void) {
  /* relu is x's last use and x is freed before op2: y takes x's block, and
   * z (alive with y) sits above. x and y overlap during relu, y and z
   * during op2: a peak of 2 MiB either way. */
  place_chain("aten.relu.default", false, 1, 2 * MiB, 2 * MiB);
}

static void test_sharing_refused_when_input_lives_on(void) {
  /* op2 reads x again: y must not overwrite it. x, y, z all live at op2. */
  place_chain("aten.relu.default", true, 0, 3 * MiB, 3 * MiB);
}

static void test_sharing_refused_for_non_elementwise(void) {
  /* A matrix product reads every input element for each output one. */
  place_chain("aten.mm.default", false, 0, 2 * MiB, 2 * MiB);
  CHECK(cap_op_may_share_input("aten.relu.default"));
  CHECK(cap_op_may_share_input("aten.add.Tensor"));
  CHECK(cap_op_may_share_input("threshold_backward"));
  CHECK(!cap_op_may_share_input("aten.addmm.default"));
  CHECK(!cap_op_may_share_input("aten.relu_"));
  CHECK(!cap_op_may_share_input(NULL));
}

/* The client gives memory back between ops: x, freed while op1 runs (t 25
 * of [20, 40)), holds its block until op1's end, so that nothing the
 * client allocates during op1 (a prefetch, a recompute) can be placed over
 * it; z, made by op2, may take its bytes. */
static void test_free_during_an_op_holds_to_its_end(void) {
  /* op0 makes x and w; op1 reads w, makes y; x (last read by op0) is freed
   * at 25, while op1 runs; op2 reads y, makes z. */
  cap_profile_t *p = cap_profile_create();
  REQUIRE(p);
  uint32_t x = 0, w = 1, y = 2, z = 3, xw[2] = {x, w};
  int rc = 0;
  for (uint32_t t = 0; t < 4 && rc == 0; t++)
    rc = cap_profile_add_tensor(p, t, MiB, CAP_KIND_ACTIVATION);
  rc = rc ? rc : cap_profile_add_op(p, 0, 0, 10, "aten.mm.default", NULL, 0, xw, 2);
  rc = rc ? rc : cap_profile_add_op(p, 1, 20, 40, "aten.mm.default", &w, 1, &y, 1);
  rc = rc ? rc : cap_profile_add_free(p, 25, x);
  rc = rc ? rc : cap_profile_add_free(p, 45, w);
  rc = rc ? rc : cap_profile_add_op(p, 2, 50, 60, "aten.mm.default", &y, 1, &z, 1);
  rc = rc ? rc : cap_profile_add_free(p, 70, y);
  rc = rc ? rc : cap_profile_add_free(p, 71, z);
  rc = rc ? rc : cap_profile_finish(p);
  REQUIRE(rc == 0);
  const cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  cap_plan_placement_t pp;
  REQUIRE(cap_plan_place(p, NULL, &bw, CAP_PLACE_BEST, &pp) == 0);
  REQUIRE(pp.n == 4);
  for (uint32_t i = 0; i < pp.n; i++)
    if (pp.intervals[i].tensor == x) {
      CHECK_EQ(pp.intervals[i].start_ns, 0);
      CHECK_EQ(pp.intervals[i].end_ns, 40); /* not 25 */
    }
  /* x, w and y live together in op1; z takes x's (or w's) bytes. */
  CHECK_EQ(pp.placement.arena_bytes, 3 * MiB);
  cap_plan_placement_close(&pp);
  cap_profile_destroy(p);
}

/* Every bundled trace, unmanaged and under the capuchin plan at 50 %: the
 * placement passes the check, its live peak is the simulator's peak minus
 * what stays outside the arena (up to the 256-byte rounding of each
 * interval and instantaneous temporaries), and the best arena is within
 * 3 % of that peak. */
static void test_traces(void) {
  const char *traces[] = {"resnet50",  "vgg16",      "inception_v3", "mobilenet_v2",
                          "bert_base", "bert_large", "gpt2_small"};
  const cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  for (size_t ti = 0; ti < sizeof traces / sizeof *traces; ti++) {
    char rel[64], err[256];
    snprintf(rel, sizeof rel, "traces/%s.trace", traces[ti]);
    cap_profile_t *p = NULL;
    REQUIRE(cap_trace_load(cap_test_data(rel), &p, err, sizeof err) == 0);
    cap_plan_config_t cfg;
    cap_plan_config_init(&cfg, cap_profile_budget_pct(p, 50));
    cap_plan_t *plan = NULL;
    int rc = cap_plan_compute(p, "capuchin", &cfg, &plan);
    CHECK(rc == 0 || rc == CAP_EINFEASIBLE);
    for (int k = 0; k < 2; k++) {
      const cap_plan_t *pl = k ? plan : NULL;
      if (k && !plan)
        continue;
      cap_sim_result_t sim;
      REQUIRE(cap_sim_run(p, pl, &bw, &sim) == 0);
      cap_plan_placement_t pp;
      REQUIRE(cap_plan_place(p, pl, &bw, CAP_PLACE_BEST, &pp) == 0);
      uint32_t a = 0, b = 0;
      rc = cap_placement_check(pp.blocks, pp.n, pp.placement.offsets, 0, &a, &b);
      if (rc)
        fprintf(stderr, "%s: intervals %u and %u collide\n", traces[ti], a, b);
      CHECK(rc == 0);
      uint64_t live = sim.peak_bytes - pp.persistent_bytes;
      /* A list temporary made and dropped within one nanosecond (a
       * zero-length replayed op) nets to nothing on the simulator's curve
       * but needs its block for that instant: placement counts it. */
      uint64_t slack = (uint64_t)pp.n * 256;
      for (uint32_t i = 0; i < pp.n; i++)
        if (pp.intervals[i].end_ns <= pp.intervals[i].start_ns)
          slack += pp.intervals[i].bytes;
      CHECK(pp.placement.peak_bytes >= live);
      if (pp.placement.peak_bytes > live + slack)
        fprintf(stderr, "%s %s: placement peak %llu, simulated %llu, slack %llu\n",
                traces[ti], k ? "plan" : "unmanaged",
                (unsigned long long)pp.placement.peak_bytes,
                (unsigned long long)live, (unsigned long long)slack);
      CHECK(pp.placement.peak_bytes <= live + slack);
      CHECK(pp.placement.arena_bytes <= pp.placement.peak_bytes * 103 / 100);
      cap_sim_result_close(&sim);
      cap_plan_placement_close(&pp);
    }
    cap_plan_destroy(plan);
    cap_profile_destroy(p);
  }
}

/* Planning with placement on every bundled trace at 50 % (with persistent
 * eviction where nothing fits without): persistent + arena within the
 * budget, blocks that validate and cover every stay the simulator sees. */
static void test_planning_with_placement(void) {
  const char *traces[] = {"resnet50",  "vgg16",      "inception_v3", "mobilenet_v2",
                          "bert_base", "bert_large", "gpt2_small"};
  for (size_t ti = 0; ti < sizeof traces / sizeof *traces; ti++) {
    char rel[64], err[512];
    snprintf(rel, sizeof rel, "traces/%s.trace", traces[ti]);
    cap_profile_t *p = NULL;
    REQUIRE(cap_trace_load(cap_test_data(rel), &p, err, sizeof err) == 0);
    uint64_t budget = cap_profile_budget_pct(p, 50);
    int rc = CAP_EINFEASIBLE;
    for (int e = 0; e < 2 && rc; e++) {
      cap_plan_config_t cfg;
      cap_plan_config_init(&cfg, budget);
      cfg.evict_persistent = e;
      cap_plan_t *plan = NULL;
      cap_plan_placement_t pp;
      rc = cap_plan_compute_placed(p, "capuchin", &cfg, &plan, &pp);
      if (!rc) {
        CHECK(pp.persistent_bytes + pp.placement.arena_bytes <= budget);
        CHECK_EQ(plan->budget_bytes, budget);
        CHECK_EQ(plan->n_blocks, pp.n);
        CHECK_EQ(plan->arena_bytes, pp.placement.arena_bytes);
        rc = cap_plan_validate(plan, p, err, sizeof err);
        if (!rc)
          rc = cap_plan_check_placement(plan, p, &cfg.bw, err, sizeof err);
        if (rc)
          fprintf(stderr, "%s: %s\n", traces[ti], err);
        CHECK(rc == 0);
      }
      cap_plan_destroy(plan);
      cap_plan_placement_close(&pp);
    }
    if (rc)
      fprintf(stderr, "%s: no placed plan at 50 %%\n", traces[ti]);
    CHECK(rc == 0);
    cap_profile_destroy(p);
  }
}

/* A measured iteration of resnet50 (capuchin-replay at 40 %, under load,
 * exported from the daemon's store): the best plan peaks at 2395.9 MiB,
 * 9.6 MiB under the budget, and its arena's fragmentation puts the need 1
 * MiB over. Lowering the aim from the budget by that excess gave the same
 * plan every round, and the daemon found no plan; lowered from the plan's
 * peak, the next plan fits. */
static void test_placement_over_a_plan_under_its_aim(void) {
  char err[512];
  cap_profile_t *p = NULL;
  REQUIRE(cap_trace_load(cap_test_data("measured/resnet50_40pct_loaded.trace"),
                         &p, err, sizeof err) == 0);
  const uint64_t budget = 2522383836; /* 40 % of the bundled trace */
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, budget);
  cap_plan_t *plan = NULL;
  cap_plan_placement_t pp;
  CHECK_EQ(cap_plan_compute_placed(p, "capuchin", &cfg, &plan, &pp), 0);
  REQUIRE(plan);
  CHECK(pp.persistent_bytes + pp.placement.arena_bytes <= budget);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_plan_destroy(plan);
  cap_plan_placement_close(&pp);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_sharing_where_correct);
  RUN_TEST(test_sharing_refused_when_input_lives_on);
  RUN_TEST(test_sharing_refused_for_non_elementwise);
  RUN_TEST(test_free_during_an_op_holds_to_its_end);
  RUN_TEST(test_traces);
  RUN_TEST(test_planning_with_placement);
  RUN_TEST(test_placement_over_a_plan_under_its_aim);
  return TEST_SUMMARY();
}
