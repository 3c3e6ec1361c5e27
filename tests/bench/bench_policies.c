/*
 * Every planner on every vendored trace at 80/60/50/40/30 % of the
 * activation peak: simulated overhead against the unmanaged iteration, peak,
 * and planning time. Then planning time against profile size on synthetic
 * profiles (up to 100 000 ops) with the growth rate.
 *
 *   bench_policies [--traces DIR] [--policy NAME] [--no-synthetic]
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"
#include "bench_time.h"

static const char *const traces[] = {
    "resnet50", "vgg16", "inception_v3", "mobilenet_v2",
    "bert_base", "bert_large", "gpt2_small",
};
static const double pcts[] = {80, 60, 50, 40, 30};

/* A synthetic training iteration of n ops: a chain of `layers` forward ops
 * (each producing an activation read by the next and by its backward op),
 * the backward chain in reverse, with gradient temporaries. */
static cap_profile_t *synthetic(uint32_t n_ops) {
  uint32_t layers = n_ops / 2;
  cap_profile_t *p = cap_profile_create();
  if (!p)
    return NULL;
  /* tensors: 0 input, 1..layers weights, then activations, then grads */
  uint32_t id = 0;
  int rc = cap_profile_add_tensor(p, id++, 1 << 20, CAP_KIND_INPUT);
  for (uint32_t l = 0; l < layers && !rc; l++)
    rc = cap_profile_add_tensor(p, id++, 1 << 16, CAP_KIND_PARAM);
  uint32_t act0 = id;
  for (uint32_t l = 0; l < layers && !rc; l++)
    rc = cap_profile_add_tensor(p, id++, (uint64_t)(1 + l % 7) << 20,
                                CAP_KIND_ACTIVATION);
  uint32_t grad0 = id;
  for (uint32_t l = 0; l < layers && !rc; l++)
    rc = cap_profile_add_tensor(p, id++, (uint64_t)(1 + l % 5) << 20,
                                CAP_KIND_ACTIVATION);
  int64_t t = 0;
  uint32_t seq = 0;
  for (uint32_t l = 0; l < layers && !rc; l++) {
    uint32_t in[2] = {l ? act0 + l - 1 : 0, 1 + l}, out[1] = {act0 + l};
    int64_t d = 20000 + (l % 11) * 3000;
    rc = cap_profile_add_op(p, seq++, t, t + d,
                            l % 3 ? "aten.relu.default" : "aten.convolution.default",
                            in, 2, out, 1);
    t += d + 1000;
  }
  for (uint32_t j = 0; j < layers && !rc; j++) {
    uint32_t l = layers - 1 - j;
    uint32_t in[3] = {act0 + l, 1 + l, j ? grad0 + l + 1 : act0 + layers - 1};
    uint32_t out[1] = {grad0 + l};
    int64_t d = 40000 + (l % 13) * 3000;
    rc = cap_profile_add_op(p, seq++, t, t + d,
                            "aten.convolution_backward.default", in, 3, out, 1);
    t += d + 1000;
    /* free the activation and the previous gradient after use */
    if (!rc)
      rc = cap_profile_add_free(p, t - 500, act0 + l);
    if (!rc && j)
      rc = cap_profile_add_free(p, t - 400, grad0 + l + 1);
  }
  if (!rc)
    rc = cap_profile_add_free(p, t, grad0);
  if (!rc)
    rc = cap_profile_finish(p);
  if (rc) {
    fprintf(stderr, "synthetic: %s\n", cap_profile_error(p));
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

int main(int argc, char **argv) {
  const char *dir = CAP_SOURCE_DIR "/tests/data/traces";
  const char *only = NULL;
  int synth = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--traces") && i + 1 < argc)
      dir = argv[++i];
    else if (!strcmp(argv[i], "--policy") && i + 1 < argc)
      only = argv[++i];
    else if (!strcmp(argv[i], "--no-synthetic"))
      synth = 0;
    else {
      fprintf(stderr, "usage: %s [--traces DIR] [--policy NAME] [--no-synthetic]\n",
              argv[0]);
      return 64;
    }
  }
  printf("%-14s %-16s %4s %9s %9s %9s %9s\n", "trace", "policy", "pct",
         "overhead%", "peak_MiB", "budgetMiB", "plan_ms");
  for (size_t ti = 0; ti < sizeof traces / sizeof *traces; ti++) {
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/%s.trace", dir, traces[ti]);
    cap_profile_t *p = NULL;
    if (cap_trace_load(path, &p, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
    cap_sim_result_t base;
    if (cap_sim_run(p, NULL, &bw, &base))
      return 1;
    for (size_t bi = 0; bi < sizeof pcts / sizeof *pcts; bi++) {
      cap_plan_config_t cfg;
      cap_plan_config_init(&cfg, cap_profile_budget_pct(p, pcts[bi]));
      /* Capuchin against the best feasible baseline. */
      double cap_ovh = -1, best_ovh = -1;
      const char *best_name = NULL;
      for (size_t pi = 0; cap_planner_names[pi]; pi++) {
        if (only && strcmp(only, cap_planner_names[pi]))
          continue;
        cap_plan_t *plan = NULL;
        double t0 = now_ms();
        int rc = cap_plan_compute(p, cap_planner_names[pi], &cfg, &plan);
        double ms = now_ms() - t0;
        if (rc && rc != CAP_EINFEASIBLE) {
          printf("%-14s %-16s %4.0f %9s %9s %9.0f %9.2f  (%s)\n", traces[ti],
                 cap_planner_names[pi], pcts[bi], "-", "-",
                 cfg.budget_bytes / 1048576.0, ms, cap_strerror(rc));
          continue;
        }
        double ovh = 100.0 * (double)(plan->predicted_iter_ns - base.iter_ns) /
                     (double)base.iter_ns;
        if (rc == 0 && !strcmp(cap_planner_names[pi], "capuchin"))
          cap_ovh = ovh;
        else if (rc == 0 && (best_ovh < 0 || ovh < best_ovh)) {
          best_ovh = ovh;
          best_name = cap_planner_names[pi];
        }
        printf("%-14s %-16s %4.0f %9.1f %9.0f %9.0f %9.2f%s\n", traces[ti],
               cap_planner_names[pi], pcts[bi], ovh,
               plan->predicted_peak_bytes / 1048576.0,
               cfg.budget_bytes / 1048576.0, ms,
               rc == CAP_EINFEASIBLE ? "  infeasible" : "");
        cap_plan_destroy(plan);
        fflush(stdout);
      }
      if (!only) {
        const char *verdict =
            best_name == NULL  ? (cap_ovh >= 0 ? "ok (no baseline fits)" : "none fits")
            : cap_ovh < 0      ? "CAPUCHIN INFEASIBLE"
            : cap_ovh <= best_ovh + 0.5 ? "ok"
                                        : "CAPUCHIN SLOWER";
        char c[32] = "-", b[32] = "-";
        if (cap_ovh >= 0)
          snprintf(c, sizeof c, "%.1f %%", cap_ovh);
        if (best_ovh >= 0)
          snprintf(b, sizeof b, "%.1f %%", best_ovh);
        printf("%-14s %-16s %4.0f  capuchin %s vs best baseline %s (%s): %s\n",
               traces[ti], "=>", pcts[bi], c, b, best_name ? best_name : "-",
               verdict);
      }
    }
    cap_sim_result_close(&base);
    cap_profile_destroy(p);
  }
  if (!synth)
    return 0;
  printf("\nplanning time vs profile size (synthetic chain, 50 %%)\n");
  printf("%-16s %8s %10s %8s\n", "policy", "ops", "plan_ms", "growth");
  const uint32_t sizes[] = {12500, 25000, 50000, 100000};
  const char *pols[] = {"capuchin", "checkpoint-sqrt", "dtr", "passive-lru"};
  for (size_t pi = 0; pi < sizeof pols / sizeof *pols; pi++) {
    if (only && strcmp(only, pols[pi]))
      continue;
    double prev = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
      cap_profile_t *p = synthetic(sizes[si]);
      if (!p)
        return 1;
      cap_plan_config_t cfg;
      cap_plan_config_init(&cfg, cap_profile_budget_pct(p, 50));
      cap_plan_t *plan = NULL;
      double t0 = now_ms();
      int rc = cap_plan_compute(p, pols[pi], &cfg, &plan);
      double ms = now_ms() - t0;
      char growth[32] = "-";
      if (prev > 0)
        snprintf(growth, sizeof growth, "n^%.2f", log(ms / prev) / log(2.0));
      printf("%-16s %8u %10.1f %8s%s\n", pols[pi], sizes[si], ms, growth,
             rc == 0 ? "" : rc == CAP_EINFEASIBLE ? "  infeasible" : cap_strerror(rc));
      fflush(stdout);
      prev = ms;
      cap_plan_destroy(plan);
      cap_profile_destroy(p);
    }
  }
  return 0;
}
