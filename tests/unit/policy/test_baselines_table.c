/*
 * The policy table as a test: on every vendored trace at 80/60/50/40/30 % of
 * the activation peak, capuchin is feasible wherever any baseline is, and its
 * simulated iteration is no slower than the best feasible baseline's (0.5 %
 * tolerance). tests/bench/bench_policies prints the same table.
 */
#include "cap_test.h"

#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"

static const char *const traces[] = {
    "resnet50", "vgg16", "inception_v3", "mobilenet_v2",
    "bert_base", "bert_large", "gpt2_small",
};
static const double pcts[] = {80, 60, 50, 40, 30};

static void test_capuchin_beats_baselines(void) {
  for (size_t ti = 0; ti < sizeof traces / sizeof *traces; ti++) {
    char rel[64], err[512];
    snprintf(rel, sizeof rel, "traces/%s.trace", traces[ti]);
    cap_profile_t *p = NULL;
    REQUIRE(cap_trace_load(cap_test_data(rel), &p, err, sizeof err) == 0);
    for (size_t bi = 0; bi < sizeof pcts / sizeof *pcts; bi++) {
      cap_plan_config_t cfg;
      cap_plan_config_init(&cfg, cap_profile_budget_pct(p, pcts[bi]));
      int64_t cap_iter = -1, best = -1;
      const char *best_name = NULL;
      for (size_t pi = 0; cap_planner_names[pi]; pi++) {
        cap_plan_t *plan = NULL;
        int rc = cap_plan_compute(p, cap_planner_names[pi], &cfg, &plan);
        CHECK(rc == 0 || rc == CAP_EINFEASIBLE);
        if (rc == 0 && plan) {
          if (!strcmp(cap_planner_names[pi], "capuchin"))
            cap_iter = plan->predicted_iter_ns;
          else if (best < 0 || plan->predicted_iter_ns < best) {
            best = plan->predicted_iter_ns;
            best_name = cap_planner_names[pi];
          }
        }
        cap_plan_destroy(plan);
      }
      printf("%-13s %3.0f %%: capuchin %.3f ms, best baseline %.3f ms (%s)\n",
             traces[ti], pcts[bi], cap_iter / 1e6, best / 1e6,
             best_name ? best_name : "none fits");
      if (best >= 0) {
        if (cap_iter < 0)
          fprintf(stderr, "%s %.0f %%: %s fits, capuchin does not\n", traces[ti],
                  pcts[bi], best_name);
        CHECK(cap_iter >= 0);
        if (cap_iter >= 0 && (double)cap_iter > (double)best * 1.005)
          fprintf(stderr, "%s %.0f %%: capuchin %lld ns, %s %lld ns\n", traces[ti],
                  pcts[bi], (long long)cap_iter, best_name, (long long)best);
        CHECK(cap_iter < 0 || (double)cap_iter <= (double)best * 1.005);
      }
    }
    cap_profile_destroy(p);
  }
}

int main(void) {
  RUN_TEST(test_capuchin_beats_baselines);
  return TEST_SUMMARY();
}
