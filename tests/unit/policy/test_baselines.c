/*
 * The planner registry and the baselines: every planner's plan on every
 * trace is valid, re-simulates to what the planner reported, and fits the
 * budget whenever the planner says it is feasible; the baselines behave as
 * published (save_on_cpu costs several iterations on resnet50, vDNN and
 * swap-all move bytes, checkpointing and DTR recompute, passive LRU swaps
 * synchronously on demand).
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
static const double pcts[] = {80, 50, 30};

static cap_profile_t *load(const char *name) {
  char rel[64], err[512];
  snprintf(rel, sizeof rel, "traces/%s.trace", name);
  cap_profile_t *p = NULL;
  if (cap_trace_load(cap_test_data(rel), &p, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return NULL;
  }
  return p;
}

static void test_registry(void) {
  const char *want[] = {"capuchin", "swap-all", "vdnn", "checkpoint-sqrt",
                        "dtr", "passive-lru"};
  size_t n = 0;
  while (cap_planner_names[n])
    n++;
  CHECK_EQ(n, 6);
  for (size_t i = 0; i < n && i < 6; i++)
    CHECK_STR(cap_planner_names[i], want[i]);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 12345);
  CHECK_EQ(cfg.budget_bytes, 12345);
  CHECK(cfg.bw.h2d_gbps == 55.1 && cfg.bw.d2h_gbps == 55.1 &&
        cfg.bw.duplex_gbps == 85.8);
  CHECK(!cfg.evict_persistent);
  CHECK(cfg.trigger_margin_ns > 0 && cfg.feedback_step_ns > 0);

  cap_profile_t *p = load("vgg16");
  REQUIRE(p);
  cap_plan_t *plan = (cap_plan_t *)1;
  CHECK_EQ(cap_plan_compute(p, "no-such-planner", &cfg, &plan), CAP_ENOENT);
  CHECK(plan == NULL);
  CHECK_EQ(cap_plan_compute(p, NULL, &cfg, &plan), CAP_EINVAL);
  CHECK_EQ(cap_plan_compute(p, "dtr", &cfg, NULL), CAP_EINVAL);
  cap_plan_config_t bad = cfg;
  bad.bw.h2d_gbps = 0;
  CHECK_EQ(cap_plan_compute(p, "dtr", &bad, &plan), CAP_EINVAL);
  /* A budget below the persistent bytes fits no plan of any planner. */
  cap_plan_config_init(&cfg, p->persistent_bytes / 2);
  for (size_t i = 0; cap_planner_names[i]; i++) {
    int rc = cap_plan_compute(p, cap_planner_names[i], &cfg, &plan);
    CHECK_EQ(rc, CAP_EINFEASIBLE);
    if (plan) {
      CHECK(plan->predicted_peak_bytes > cfg.budget_bytes);
      cap_plan_destroy(plan);
    }
  }
  cap_profile_destroy(p);
}

/* The conformance check every planner passes on every trace and budget. */
static void test_every_planner_checked_by_sim(void) {
  for (size_t ti = 0; ti < sizeof traces / sizeof *traces; ti++) {
    cap_profile_t *p = load(traces[ti]);
    REQUIRE(p);
    for (size_t bi = 0; bi < sizeof pcts / sizeof *pcts; bi++) {
      cap_plan_config_t cfg;
      cap_plan_config_init(&cfg, cap_profile_budget_pct(p, pcts[bi]));
      for (size_t pi = 0; cap_planner_names[pi]; pi++) {
        const char *name = cap_planner_names[pi];
        cap_plan_t *plan = NULL;
        int rc = cap_plan_compute(p, name, &cfg, &plan);
        if (rc != 0 && rc != CAP_EINFEASIBLE) {
          fprintf(stderr, "%s %s %.0f%%: %s\n", traces[ti], name, pcts[bi],
                  cap_strerror(rc));
          CHECK(0);
          continue;
        }
        REQUIRE(plan);
        CHECK_STR(plan->policy, name);
        CHECK_EQ(plan->budget_bytes, cfg.budget_bytes);
        char err[256];
        if (cap_plan_validate(plan, p, err, sizeof err)) {
          fprintf(stderr, "%s %s: %s\n", traces[ti], name, err);
          CHECK(0);
        }
        cap_sim_result_t r;
        REQUIRE(cap_sim_run(p, plan, &cfg.bw, &r) == 0);
        CHECK_EQ(r.peak_bytes, plan->predicted_peak_bytes);
        CHECK_EQ(r.iter_ns, plan->predicted_iter_ns);
        if (rc == 0)
          CHECK(r.peak_bytes <= cfg.budget_bytes);
        else
          CHECK(r.peak_bytes > cfg.budget_bytes);
        /* No plan makes the iteration faster than unmanaged. */
        CHECK(r.iter_ns >= p->ops[p->n_ops - 1].end_ns);
        cap_sim_result_close(&r);
        cap_plan_destroy(plan);
      }
    }
    cap_profile_destroy(p);
  }
}

static void test_published_shapes(void) {
  cap_profile_t *p = load("resnet50");
  REQUIRE(p);
  int64_t base = p->ops[p->n_ops - 1].end_ns;
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, cap_profile_budget_pct(p, 50));
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;

  /* save_on_cpu: several times the iteration, every swap synchronous and on
   * demand, the peak far below the budget. */
  CHECK_EQ(cap_plan_compute(p, "swap-all", &cfg, &plan), 0);
  REQUIRE(plan);
  CHECK(plan->predicted_iter_ns > 3 * base);
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    CHECK(plan->actions[i].method == CAP_METHOD_SWAP);
    CHECK(plan->actions[i].flags & CAP_ACTION_SYNC_OUT);
    CHECK(plan->actions[i].prefetch_tensor == CAP_NONE);
  }
  CHECK(plan->n_actions > 100);
  cap_plan_destroy(plan);

  /* vDNN: swaps with prefetches at heavy layers, nothing recomputed. */
  cap_plan_compute(p, "vdnn", &cfg, &plan);
  REQUIRE(plan);
  uint32_t prefetched = 0;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    CHECK(a->method == CAP_METHOD_SWAP);
    if (a->prefetch_tensor != CAP_NONE) {
      uint32_t op = cap_profile_access_op(p, a->prefetch_tensor, a->prefetch_access);
      CHECK(strstr(p->ops[op].name, "convolution") || strstr(p->ops[op].name, "mm"));
      prefetched++;
    }
  }
  CHECK(prefetched > plan->n_actions / 2);
  REQUIRE(cap_sim_run(p, plan, &cfg.bw, &r) == 0);
  CHECK(r.swap_in_bytes > 0 && r.swap_in_bytes == r.swap_out_bytes);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);

  /* Checkpointing: recompute only, and cheaper than swapping everything. */
  CHECK_EQ(cap_plan_compute(p, "checkpoint-sqrt", &cfg, &plan), 0);
  REQUIRE(plan);
  for (uint32_t i = 0; i < plan->n_actions; i++)
    CHECK(plan->actions[i].method == CAP_METHOD_RECOMPUTE);
  REQUIRE(cap_sim_run(p, plan, &cfg.bw, &r) == 0);
  CHECK(r.recompute_ns > 0 && r.swap_out_bytes == 0);
  /* About one forward pass replayed: less than the unmanaged iteration. */
  CHECK(r.recompute_ns < base);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);

  /* DTR: recompute only, within budget at 50 %. */
  CHECK_EQ(cap_plan_compute(p, "dtr", &cfg, &plan), 0);
  REQUIRE(plan);
  for (uint32_t i = 0; i < plan->n_actions; i++)
    CHECK(plan->actions[i].method == CAP_METHOD_RECOMPUTE);
  CHECK(plan->n_actions > 0);
  cap_plan_destroy(plan);

  /* Passive LRU: synchronous on-demand swaps; a lower budget costs more. */
  CHECK_EQ(cap_plan_compute(p, "passive-lru", &cfg, &plan), 0);
  REQUIRE(plan);
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    CHECK(plan->actions[i].flags & CAP_ACTION_SYNC_OUT);
    CHECK(plan->actions[i].prefetch_tensor == CAP_NONE);
  }
  int64_t t50 = plan->predicted_iter_ns;
  cap_plan_destroy(plan);
  cap_plan_config_init(&cfg, cap_profile_budget_pct(p, 30));
  CHECK_EQ(cap_plan_compute(p, "passive-lru", &cfg, &plan), 0);
  REQUIRE(plan);
  CHECK(plan->predicted_iter_ns > t50);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_registry);
  RUN_TEST(test_every_planner_checked_by_sim);
  RUN_TEST(test_published_shapes);
  return TEST_SUMMARY();
}
