/*
 * Capuchin against the lower bound (issue 11, "Done when").
 *
 *   bench_bound [--bound FILE] [--traces DIR] [--before FILE] [--reach FILE]
 *               [--jsonl]
 *
 * The bound is the LP of tools/lower_bound.py (it needs scipy, so it is
 * computed once and committed as tests/data/lower_bound_results.jsonl: one
 * JSON object per trace, mode and budget). For every row the planner runs
 * at the same budget in bytes and the same mode (--evict-persistent or
 * not); the table gives the bound's overhead, capuchin's simulated
 * overhead and their ratio, per trace and budget, in both modes. One more
 * column per trace and mode plans at the floor + 5 % of the activations
 * (the smallest budget at which the bound says a plan can exist, plus a
 * margin): a plan must exist there.
 *
 * --before FILE takes an earlier run's --jsonl output and adds the issue's
 * target per cell: at most halfway between that run's overhead and the
 * bound. --jsonl prints one JSON object per cell instead of the table.
 *
 * --reach FILE takes a tighter lower bound in the bound's format
 * (tests/tools/lower_bound_tight.py, committed as
 * tests/data/lower_bound_tight_results.jsonl) and counts the cells where it
 * lies above a target: there no plan at all can meet it, however good the
 * planner.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_time.h"
#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"
#include "json_field.h"

#define MAX_CELLS 256
#define FLOOR_PCT -1.0 /* pct of the floor + 5 % cell */

typedef struct cell {
  char trace[64]; /* file name, "resnet50.trace" */
  bool evict_persistent;
  double pct;
  uint64_t budget_bytes;
  bool bound_feasible;
  double bound_pct; /* the bound's overhead, % of the unmanaged iteration */
  /* capuchin at this budget */
  bool feasible;
  double cap_pct;
  uint64_t peak_bytes;
  double plan_ms;
  /* --before: that run's capuchin overhead (NAN: none or infeasible) */
  double before_pct;
  bool have_before;
  /* --reach: the tighter bound's extra time (NAN: none), and what it is of
   * the unmanaged iteration capuchin's overhead is measured against */
  double reach_ns;
  double reach_pct;
} cell_t;

static int cmp_cell(const void *a, const void *b) {
  const cell_t *x = a, *y = b;
  int c = strcmp(x->trace, y->trace);
  if (c)
    return c;
  if (x->evict_persistent != y->evict_persistent)
    return x->evict_persistent ? 1 : -1;
  return x->pct > y->pct ? -1 : x->pct < y->pct;
}

/* Read the bound's rows (all but 100 %, where nothing is evicted), and one
 * floor + 5 % cell per trace and mode. */
static int read_bound(const char *path, cell_t *cells, size_t *n) {
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    return -1;
  }
  char line[4096];
  *n = 0;
  while (fgets(line, sizeof line, f) && *n + 2 <= MAX_CELLS) {
    cell_t c;
    memset(&c, 0, sizeof c);
    char mode[32], status[32];
    double pct, budget, floor_b, peak, persistent, lb = NAN;
    if (!cap_json_field(line, "trace", NULL, c.trace, sizeof c.trace) ||
        !cap_json_field(line, "mode", NULL, mode, sizeof mode) ||
        !cap_json_field(line, "status", NULL, status, sizeof status) ||
        !cap_json_field(line, "pct", &pct, NULL, 0) ||
        !cap_json_field(line, "budget_bytes", &budget, NULL, 0) ||
        !cap_json_field(line, "min_budget_bytes", &floor_b, NULL, 0) ||
        !cap_json_field(line, "peak_bytes", &peak, NULL, 0) ||
        !cap_json_field(line, "persistent_bytes", &persistent, NULL, 0)) {
      fprintf(stderr, "%s: a row without the fields this bench reads\n", path);
      fclose(f);
      return -1;
    }
    cap_json_field(line, "lb_overhead_pct", &lb, NULL, 0);
    c.evict_persistent = !strcmp(mode, "evict-persistent");
    c.before_pct = NAN;
    c.reach_ns = NAN;
    c.reach_pct = NAN;
    if (pct >= 100)
      continue;
    c.pct = pct;
    c.budget_bytes = (uint64_t)budget;
    c.bound_feasible = !strcmp(status, "optimal");
    c.bound_pct = lb;
    cells[(*n)++] = c;
    /* the floor + 5 % cell, once per trace and mode */
    bool seen = false;
    for (size_t i = 0; i + 1 < *n && !seen; i++)
      seen = cells[i].pct == FLOOR_PCT && !strcmp(cells[i].trace, c.trace) &&
             cells[i].evict_persistent == c.evict_persistent;
    if (!seen) {
      c.pct = FLOOR_PCT;
      c.budget_bytes = (uint64_t)(floor_b + 0.05 * (peak - persistent));
      c.bound_feasible = true;
      c.bound_pct = NAN; /* the file has no bound at this budget */
      cells[(*n)++] = c;
    }
  }
  fclose(f);
  qsort(cells, *n, sizeof *cells, cmp_cell);
  return 0;
}

/* Call attach(line, cells, n) for every line of the file at path. */
static int each_line(const char *path, cell_t *cells, size_t n,
                     void (*attach)(const char *, cell_t *, size_t)) {
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    return -1;
  }
  char line[4096];
  while (fgets(line, sizeof line, f))
    attach(line, cells, n);
  fclose(f);
  return 0;
}

/* An earlier run's overhead (a line of its --jsonl output), to its cell. */
static void attach_before(const char *line, cell_t *cells, size_t n) {
  char trace[64];
  double ep, pct, feasible, cap;
  if (!cap_json_field(line, "trace", NULL, trace, sizeof trace) ||
      !cap_json_field(line, "evict_persistent", &ep, NULL, 0) ||
      !cap_json_field(line, "pct", &pct, NULL, 0) ||
      !cap_json_field(line, "feasible", &feasible, NULL, 0) ||
      !cap_json_field(line, "capuchin_pct", &cap, NULL, 0))
    return;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(cells[i].trace, trace) &&
        cells[i].evict_persistent == (ep != 0) && cells[i].pct == pct) {
      cells[i].have_before = true;
      cells[i].before_pct = feasible != 0 ? cap : NAN;
    }
}

/* The tighter bound's extra time (--reach, a line in the bound's format), to
 * the cell of the same trace, mode and budget. */
static void attach_reach(const char *line, cell_t *cells, size_t n) {
  char trace[64], mode[32];
  double budget, extra;
  if (!cap_json_field(line, "trace", NULL, trace, sizeof trace) ||
      !cap_json_field(line, "mode", NULL, mode, sizeof mode) ||
      !cap_json_field(line, "budget_bytes", &budget, NULL, 0) ||
      !cap_json_field(line, "extra_ns", &extra, NULL, 0))
    return; /* no bound: infeasible there */
  bool ep = !strcmp(mode, "evict-persistent");
  for (size_t i = 0; i < n; i++)
    if (!strcmp(cells[i].trace, trace) && cells[i].evict_persistent == ep &&
        cells[i].pct != FLOOR_PCT && cells[i].budget_bytes == (uint64_t)budget)
      cells[i].reach_ns = extra;
}

static int plan_cell(const cap_profile_t *p, int64_t free_iter, cell_t *c) {
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, c->budget_bytes);
  cfg.evict_persistent = c->evict_persistent;
  cap_plan_t *plan = NULL;
  double t0 = now_ms();
  int rc = cap_plan_compute(p, "capuchin", &cfg, &plan);
  c->plan_ms = now_ms() - t0;
  if (rc && rc != CAP_EINFEASIBLE) {
    fprintf(stderr, "%s: %s\n", c->trace, cap_strerror(rc));
    cap_plan_destroy(plan);
    return rc;
  }
  cap_sim_result_t r;
  memset(&r, 0, sizeof r);
  rc = cap_sim_run(p, plan, &cfg.bw, &r);
  cap_plan_destroy(plan);
  if (rc)
    return rc;
  c->peak_bytes = r.peak_bytes;
  c->feasible = r.peak_bytes <= c->budget_bytes;
  /* the files' percentages are of the LP's unmanaged iteration (the ops'
   * span); a plan's extra time at least reach_ns is this much of ours */
  c->reach_pct = 100.0 * c->reach_ns / (double)free_iter;
  c->cap_pct = 100.0 * (double)(r.iter_ns - free_iter) / (double)free_iter;
  cap_sim_result_close(&r);
  return 0;
}

/* Ratio capuchin / bound where the bound costs something. */
static double ratio(const cell_t *c) {
  if (!c->feasible || !c->bound_feasible || !(c->bound_pct > 0.005))
    return NAN;
  return c->cap_pct / c->bound_pct;
}

/* The target for a cell: at most halfway from the earlier run to
 * the bound (where the earlier run found no plan, any plan meets it). */
static bool meets_halfway(const cell_t *c) {
  if (!c->have_before || !c->bound_feasible || isnan(c->bound_pct))
    return true;
  if (!c->feasible)
    return false;
  if (isnan(c->before_pct))
    return true;
  return c->cap_pct <= (c->before_pct + c->bound_pct) / 2 + 0.005;
}

/* The cell's name as the notes give it: "vgg16 80 % EP". */
static void cell_name(const cell_t *c, char *buf, size_t len) {
  int k = (int)strcspn(c->trace, ".");
  snprintf(buf, len, "%.*s %.0f %%%s", k, c->trace, c->pct,
           c->evict_persistent ? " EP" : "");
}

/* One target against the tighter bound (--reach): the cells that meet it,
 * those where no plan can (the tighter bound above it), and the others,
 * named with what they need. want(c) is the target's overhead, NAN where
 * the cell has none. */
static void reach_line(const cell_t *cells, size_t n, const char *what,
                       double (*want)(const cell_t *), size_t need) {
  size_t met = 0, out = 0, open = 0;
  char names[4096] = "";
  for (size_t i = 0; i < n; i++) {
    const cell_t *c = &cells[i];
    double w = want(c);
    if (isnan(w))
      continue;
    if (c->feasible && c->cap_pct <= w) {
      met++;
    } else if (c->reach_pct > w) {
      out++;
    } else {
      open++;
      char name[96], item[192];
      cell_name(c, name, sizeof name);
      snprintf(item, sizeof item, "%s%s %.3f, needs %.3f (no plan under %.3f)",
               open > 1 ? "; " : "", name, c->cap_pct, w, c->reach_pct);
      strncat(names, item, sizeof names - strlen(names) - 1);
    }
  }
  printf("%s: met in %zu cells, out of reach of any plan in %zu (--reach above "
         "it), open in %zu",
         what, met, out, open);
  if (need)
    printf("; a median there needs %zu, at most %zu can", need, met + open);
  printf("\n");
  if (open)
    printf("  open: %s\n", names);
}

static double want_ratio(const cell_t *c) {
  return isnan(ratio(c)) || isnan(c->reach_pct) ? NAN : 1.5 * c->bound_pct;
}

static double want_halfway(const cell_t *c) {
  if (!c->have_before || c->pct == FLOOR_PCT || !c->bound_feasible ||
      isnan(c->bound_pct) || isnan(c->reach_pct))
    return NAN;
  if (isnan(c->before_pct)) /* none before: any plan meets it */
    return INFINITY;
  return (c->before_pct + c->bound_pct) / 2 + 0.005;
}

static void print_reach(const cell_t *cells, size_t n, size_t nq,
                        bool have_before) {
  reach_line(cells, n, "1.5x the bound", want_ratio, nq / 2 + 1);
  if (have_before)
    reach_line(cells, n, "halfway", want_halfway, 0);
}

static void fmt_cell(const cell_t *c, char *buf, size_t len) {
  char bound[16], cap[16], r[16];
  if (!c->bound_feasible)
    snprintf(bound, sizeof bound, "inf");
  else if (isnan(c->bound_pct))
    snprintf(bound, sizeof bound, "ok");
  else
    snprintf(bound, sizeof bound, "%.2f", c->bound_pct);
  if (c->feasible)
    snprintf(cap, sizeof cap, "%.2f", c->cap_pct);
  else
    snprintf(cap, sizeof cap, "%s", c->bound_feasible ? "-" : "none");
  double q = ratio(c);
  if (isnan(q))
    r[0] = '\0';
  else
    snprintf(r, sizeof r, " (%.1fx)", q);
  snprintf(buf, len, "%s / %s%s%s", bound, cap, r,
           meets_halfway(c) ? "" : " !");
}

static void print_table(const cell_t *cells, size_t n, bool have_before,
                        bool have_reach) {
  printf("overhead %% of the unmanaged iteration: bound / capuchin (ratio)%s;\n"
         "inf: no plan can exist; -: capuchin finds none although one may;\n"
         "floor+5%%: the bound's smallest feasible budget + 5 %% of the "
         "activations (ok: a plan exists there)\n\n",
         have_before ? ", ! misses halfway to the bound from --before" : "");
  for (int ep = 0; ep < 2; ep++) {
    printf("%s\n| trace | 80 | 60 | 50 | 40 | 30 | floor+5%% |\n"
           "| --- | --- | --- | --- | --- | --- | --- |\n",
           ep ? "with --evict-persistent:" : "default:");
    for (size_t i = 0; i < n;) {
      if (cells[i].evict_persistent != (ep != 0)) {
        i++;
        continue;
      }
      char name[64];
      snprintf(name, sizeof name, "%s", cells[i].trace);
      char *dot = strrchr(name, '.');
      if (dot)
        *dot = '\0';
      printf("| %s |", name);
      size_t j = i;
      for (; j < n && !strcmp(cells[j].trace, cells[i].trace) &&
             cells[j].evict_persistent == cells[i].evict_persistent;
           j++) {
        char buf[64];
        fmt_cell(&cells[j], buf, sizeof buf);
        printf(" %s |", buf);
      }
      printf("\n");
      i = j;
    }
    printf("\n");
  }
  double *q = malloc(n * sizeof *q);
  size_t nq = 0, n_bound = 0, n_feasible = 0, n_half = 0, n_half_of = 0;
  double ms_max = 0;
  for (size_t i = 0; i < n; i++) {
    const cell_t *c = &cells[i];
    if (c->bound_feasible) {
      n_bound++;
      n_feasible += c->feasible;
    }
    if (q && !isnan(ratio(c)))
      q[nq++] = ratio(c);
    if (c->have_before && c->pct != FLOOR_PCT && c->bound_feasible) {
      n_half_of++;
      n_half += meets_halfway(c);
    }
    if (c->plan_ms > ms_max)
      ms_max = c->plan_ms;
  }
  printf("feasible: %zu of the %zu cells where the bound is\n", n_feasible, n_bound);
  if (nq) {
    qsort(q, nq, sizeof *q, cmp_d);
    double med = nq % 2 ? q[nq / 2] : (q[nq / 2 - 1] + q[nq / 2]) / 2;
    printf(
        "ratio over the %zu cells where the bound is above zero: median %.2fx, "
        "worst %.2fx\n",
        nq, med, q[nq - 1]);
  }
  if (have_before)
    printf("halfway from --before to the bound: %zu of %zu cells\n", n_half,
           n_half_of);
  if (have_reach)
    print_reach(cells, n, nq, have_before);
  printf("slowest plan: %.0f ms\n", ms_max);
  free(q);
}

static void print_jsonl(const cell_t *cells, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const cell_t *c = &cells[i];
    printf("{\"trace\": \"%s\", \"evict_persistent\": %d, \"pct\": %.1f, "
           "\"budget_bytes\": %" PRIu64 ", \"bound_feasible\": %d, "
           "\"bound_pct\": %.3f, \"feasible\": %d, \"capuchin_pct\": %.3f, "
           "\"peak_bytes\": %" PRIu64 ", \"plan_ms\": %.1f}\n",
           c->trace, c->evict_persistent, c->pct, c->budget_bytes,
           c->bound_feasible, isnan(c->bound_pct) ? -1.0 : c->bound_pct,
           c->feasible, c->cap_pct, c->peak_bytes, c->plan_ms);
  }
}

int main(int argc, char **argv) {
  const char *bound = CAP_SOURCE_DIR "/tests/data/lower_bound_results.jsonl";
  const char *dir = CAP_SOURCE_DIR "/tests/data/traces";
  const char *before = NULL, *reach = NULL;
  bool jsonl = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bound") && i + 1 < argc)
      bound = argv[++i];
    else if (!strcmp(argv[i], "--traces") && i + 1 < argc)
      dir = argv[++i];
    else if (!strcmp(argv[i], "--before") && i + 1 < argc)
      before = argv[++i];
    else if (!strcmp(argv[i], "--reach") && i + 1 < argc)
      reach = argv[++i];
    else if (!strcmp(argv[i], "--jsonl"))
      jsonl = true;
    else {
      fprintf(stderr,
              "usage: %s [--bound FILE] [--traces DIR] [--before FILE] "
              "[--reach FILE] [--jsonl]\n",
              argv[0]);
      return 64;
    }
  }
  static cell_t cells[MAX_CELLS];
  size_t n;
  if (read_bound(bound, cells, &n) ||
      (before && each_line(before, cells, n, attach_before)) ||
      (reach && each_line(reach, cells, n, attach_reach)))
    return 1;
  for (size_t i = 0; i < n;) {
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/%s", dir, cells[i].trace);
    cap_profile_t *p = NULL;
    if (cap_trace_load(path, &p, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
    cap_sim_result_t base;
    memset(&base, 0, sizeof base);
    if (cap_sim_run(p, NULL, &bw, &base)) {
      cap_profile_destroy(p);
      return 1;
    }
    int64_t free_iter = base.iter_ns;
    cap_sim_result_close(&base);
    size_t j = i;
    for (; j < n && !strcmp(cells[j].trace, cells[i].trace); j++)
      if (plan_cell(p, free_iter, &cells[j])) {
        cap_profile_destroy(p);
        return 1;
      }
    cap_profile_destroy(p);
    i = j;
  }
  if (jsonl)
    print_jsonl(cells, n);
  else
    print_table(cells, n, before != NULL, reach != NULL);
  return 0;
}
