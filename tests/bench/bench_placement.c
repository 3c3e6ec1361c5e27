/*
 * Placement benchmark: every bundled trace at 80/60/50/40/30 % under the
 * capuchin planner planning with placement (cap_plan_compute_placed, with
 * persistent eviction where nothing fits without it), the plan it emits
 * placed again by each strategy: the arena it needs, the plan's peak of
 * live transient bytes, their ratio (the fragmentation of the plan) and the
 * time to place (median of 5). "fits" says whether what stays outside the
 * arena plus the arena is within the budget.
 *
 * Then planning with placement (cap_plan_compute_placed) against aiming a
 * fixed 6 % under the budget (the daemon's alloc-headroom default before
 * placement): the simulated overhead of each over the unmanaged iteration,
 * and whether persistent + arena fits the budget.
 *
 *   bench_placement [--quick]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/planner.h"
#include "capuchin/trace.h"
#include "bench_time.h"

static const char *const traces[] = {"resnet50",     "vgg16",     "inception_v3",
                                     "mobilenet_v2", "bert_base", "bert_large",
                                     "gpt2_small"};
static const double pcts[] = {80, 60, 50, 40, 30};

static cap_plan_t *plan_at(const cap_profile_t *p, double pct, bool *evict) {
  for (int e = 0; e < 2; e++) {
    cap_plan_config_t cfg;
    cap_plan_config_init(&cfg, cap_profile_budget_pct(p, pct));
    cfg.evict_persistent = e;
    cap_plan_t *plan = NULL;
    cap_plan_placement_t pp;
    int rc = cap_plan_compute_placed(p, "capuchin", &cfg, &plan, &pp);
    cap_plan_placement_close(&pp);
    if (rc == 0) {
      *evict = e;
      return plan;
    }
    cap_plan_destroy(plan);
  }
  return NULL;
}

static double overhead_pct(const cap_profile_t *p, const cap_plan_t *plan) {
  const cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  cap_sim_result_t base, r;
  if (cap_sim_run(p, NULL, &bw, &base) || cap_sim_run(p, plan, &bw, &r))
    return -1;
  double o = 100.0 * (double)(r.iter_ns - base.iter_ns) / (double)base.iter_ns;
  cap_sim_result_close(&base);
  cap_sim_result_close(&r);
  return o;
}

static void planning_table(void) {
  printf("\nplanning with placement: overhead %% (fits?) aiming 6 %% under the "
         "budget | planning the arena into the budget\n");
  printf("%-13s %4s %18s %18s\n", "trace", "pct", "headroom 6 %", "placed");
  for (size_t ti = 0; ti < sizeof traces / sizeof *traces; ti++) {
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/tests/data/traces/%s.trace", CAP_SOURCE_DIR,
             traces[ti]);
    cap_profile_t *p = NULL;
    if (cap_trace_load(path, &p, err, sizeof err))
      continue;
    for (size_t pi = 0; pi < sizeof pcts / sizeof *pcts; pi++) {
      char cell[2][32];
      for (int way = 0; way < 2; way++) {
        snprintf(cell[way], sizeof cell[way], "no plan");
        for (int e = 0; e < 2; e++) {
          uint64_t budget = cap_profile_budget_pct(p, pcts[pi]);
          cap_plan_config_t cfg;
          cap_plan_config_init(&cfg, way ? budget : budget - budget * 6 / 100);
          cfg.evict_persistent = e;
          cap_plan_t *plan = NULL;
          cap_plan_placement_t pp = {0};
          int rc = way ? cap_plan_compute_placed(p, "capuchin", &cfg, &plan, &pp)
                       : cap_plan_compute(p, "capuchin", &cfg, &plan);
          if (!rc && !way)
            rc = cap_plan_place(p, plan, &cfg.bw, CAP_PLACE_BEST, &pp);
          if (!rc) {
            bool fits = pp.persistent_bytes + pp.placement.arena_bytes <= budget;
            snprintf(cell[way], sizeof cell[way], "%.2f %s%s",
                     overhead_pct(p, plan), fits ? "yes" : "NO", e ? " ep" : "");
          }
          cap_plan_destroy(plan);
          cap_plan_placement_close(&pp);
          if (!rc)
            break;
        }
      }
      printf("%-13s %4.0f %18s %18s\n", traces[ti], pcts[pi], cell[0], cell[1]);
    }
    cap_profile_destroy(p);
  }
}

int main(int argc, char **argv) {
  int runs = argc > 1 && strcmp(argv[1], "--quick") == 0 ? 1 : 5;
  const cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  printf("%-13s %4s %-14s %10s %10s %7s %8s %5s %6s\n", "trace", "pct",
         "strategy", "arena MiB", "peak MiB", "ratio", "place ms", "fits",
         "shared");
  for (size_t ti = 0; ti < sizeof traces / sizeof *traces; ti++) {
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/tests/data/traces/%s.trace", CAP_SOURCE_DIR,
             traces[ti]);
    cap_profile_t *p = NULL;
    if (cap_trace_load(path, &p, err, sizeof err)) {
      fprintf(stderr, "%s: %s\n", path, err);
      return 1;
    }
    for (size_t pi = 0; pi < sizeof pcts / sizeof *pcts; pi++) {
      bool evict = false;
      cap_plan_t *plan = plan_at(p, pcts[pi], &evict);
      if (!plan) {
        printf("%-13s %4.0f %-14s %10s\n", traces[ti], pcts[pi], "-", "no plan");
        continue;
      }
      for (int s = 0; s <= CAP_PLACE_BEST; s++) {
        double t[16];
        cap_plan_placement_t pp = {0};
        int rc = 0;
        for (int r = 0; r < runs && !rc; r++) {
          cap_plan_placement_close(&pp);
          double t0 = now_ms();
          rc = cap_plan_place(p, plan, &bw, (cap_place_strategy_t)s, &pp);
          t[r] = now_ms() - t0;
        }
        if (rc) {
          printf("%-13s %4.0f %-14s error %s\n", traces[ti], pcts[pi],
                 cap_place_strategy_name(s), cap_strerror(rc));
          continue;
        }
        qsort(t, (size_t)runs, sizeof *t, cmp_d);
        const cap_placement_t *pl = &pp.placement;
        bool fits = pp.persistent_bytes + pl->arena_bytes <=
                    cap_profile_budget_pct(p, pcts[pi]);
        printf("%-13s %4.0f %-14s %10.1f %10.1f %7.4f %8.2f %5s %6u%s\n",
               traces[ti], pcts[pi], cap_place_strategy_name(s),
               pl->arena_bytes / 1048576.0, pl->peak_bytes / 1048576.0,
               pl->peak_bytes ? (double)pl->arena_bytes / pl->peak_bytes : 1.0,
               t[runs / 2], fits ? "yes" : "NO", pl->shared,
               evict ? "  (evict-persistent)" : "");
        cap_plan_placement_close(&pp);
      }
      cap_plan_destroy(plan);
    }
    cap_profile_destroy(p);
  }
  planning_table();
  return 0;
}
