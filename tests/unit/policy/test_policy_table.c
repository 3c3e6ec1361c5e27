/*
 * The policy table: for each vendored trace and budgets of
 * 80, 60, 50, 40 and 30 % (cap_profile_budget_pct), every planner's plan is
 * valid and checked by the simulator to stay within its budget when it
 * says it fits; `capuchin` is feasible wherever any baseline is, and its
 * simulated iteration time is no worse than the best feasible baseline's
 * (0.5 % tolerance). tests/bench/bench_policies prints the same table.
 *
 * CAP_TABLE_TRACES=resnet50,vgg16 limits the traces (for slow sanitizer
 * builds); by default the whole table runs.
 */
#include <stdlib.h>
#include <string.h>

#include "cap_test.h"
#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"

static const char *const traces[] = {"resnet50",     "vgg16",     "inception_v3",
                                     "mobilenet_v2", "bert_base", "bert_large",
                                     "gpt2_small"};
static const double pcts[] = {80, 60, 50, 40, 30};

static bool selected(const char *name) {
  const char *sel = getenv("CAP_TABLE_TRACES");
  if (!sel || !*sel)
    return true;
  size_t n = strlen(name);
  for (const char *s = sel; *s;) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (len == n && !strncmp(s, name, n))
      return true;
    s += len + (e ? 1 : 0);
  }
  return false;
}

/* Plans with `policy`, checks the plan, returns its result code and the
 * simulated iteration time in *iter (-1 when infeasible). */
static int check_policy(const cap_profile_t *p, const char *trace,
                        const char *policy, const cap_plan_config_t *cfg,
                        int64_t *iter, uint64_t *peak) {
  cap_plan_t *plan = NULL;
  int rc = cap_plan_compute(p, policy, cfg, &plan);
  *iter = -1;
  *peak = 0;
  CHECK(rc == 0 || rc == CAP_EINFEASIBLE);
  if (!plan) {
    fprintf(stderr, "%s %s: no plan (%s)\n", trace, policy, cap_err_name(rc));
    CHECK(plan != NULL);
    return rc;
  }
  char err[256];
  int v = cap_plan_validate(plan, p, err, sizeof err);
  if (v)
    fprintf(stderr, "%s %s: invalid plan: %s\n", trace, policy, err);
  CHECK_EQ(v, 0);
  cap_sim_result_t r;
  memset(&r, 0, sizeof r);
  int s = cap_sim_run(p, plan, &cfg->bw, &r);
  CHECK_EQ(s, 0);
  if (s == 0) {
    /* the simulator, run again on the plan, agrees with what the planner
     * reported, and a feasible plan stays within the budget */
    CHECK_EQ(r.peak_bytes, plan->predicted_peak_bytes);
    CHECK_EQ(r.iter_ns, plan->predicted_iter_ns);
    if (rc == 0) {
      if (r.peak_bytes > cfg->budget_bytes)
        fprintf(stderr, "%s %s: peak %llu over budget %llu\n", trace, policy,
                (unsigned long long)r.peak_bytes,
                (unsigned long long)cfg->budget_bytes);
      CHECK(r.peak_bytes <= cfg->budget_bytes);
      *iter = r.iter_ns;
    } else {
      CHECK(r.peak_bytes > cfg->budget_bytes);
    }
    *peak = r.peak_bytes;
    cap_sim_result_close(&r);
  }
  cap_plan_destroy(plan);
  return rc;
}

static void test_table(void) {
  printf("%-13s %4s %12s %12s %-16s\n", "trace", "bud", "capuchin", "best base",
         "(policy)");
  int points = 0;
  for (size_t i = 0; i < sizeof traces / sizeof traces[0]; i++) {
    if (!selected(traces[i]))
      continue;
    char rel[128], err[256];
    snprintf(rel, sizeof rel, "traces/%s.trace", traces[i]);
    cap_profile_t *p = NULL;
    int rc = cap_trace_load(cap_test_data(rel), &p, err, sizeof err);
    if (rc)
      fprintf(stderr, "%s\n", err);
    CHECK_EQ(rc, 0);
    if (rc)
      continue;
    for (size_t j = 0; j < sizeof pcts / sizeof pcts[0]; j++) {
      cap_plan_config_t cfg;
      cap_plan_config_init(&cfg, cap_profile_budget_pct(p, pcts[j]));
      int64_t cap_iter, best = -1;
      uint64_t cap_peak, peak;
      const char *best_name = "-";
      check_policy(p, traces[i], "capuchin", &cfg, &cap_iter, &cap_peak);
      for (int k = 0; cap_planner_names[k]; k++) {
        if (!strcmp(cap_planner_names[k], "capuchin"))
          continue;
        int64_t it;
        check_policy(p, traces[i], cap_planner_names[k], &cfg, &it, &peak);
        if (it >= 0 && (best < 0 || it < best)) {
          best = it;
          best_name = cap_planner_names[k];
        }
      }
      double base = (double)p->iter_ns;
      char a[32], b[32];
      if (cap_iter >= 0)
        snprintf(a, sizeof a, "%+.1f%%", 100.0 * (cap_iter - base) / base);
      else
        snprintf(a, sizeof a, "X(%.2fGB)", cap_peak / 1e9);
      if (best >= 0)
        snprintf(b, sizeof b, "%+.1f%%", 100.0 * (best - base) / base);
      else
        snprintf(b, sizeof b, "X");
      bool ok = best < 0 || (cap_iter >= 0 && (double)cap_iter <= best * 1.005);
      printf("%-13s %3.0f%% %12s %12s %-16s%s\n", traces[i], pcts[j], a, b,
             best_name, ok ? "" : "  <-- capuchin behind");
      fflush(stdout);
      if (best >= 0)
        CHECK(cap_iter >= 0); /* feasible wherever a baseline is */
      if (best >= 0 && cap_iter >= 0)
        CHECK((double)cap_iter <= (double)best * 1.005);
      points++;
    }
    cap_profile_destroy(p);
  }
  CHECK(points > 0);
}

int main(void) {
  RUN_TEST(test_table);
  return TEST_SUMMARY();
}
