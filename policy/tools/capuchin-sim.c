/*
 * capuchin-sim: inspect a trace, plan it for a memory budget with any
 * planner, simulate the plans, and re-check a plan file.
 *
 *   capuchin-sim --trace FILE --info [--json]
 *   capuchin-sim --trace FILE --budget BYTES|N% [--policy NAME|all]
 *                [--h2d-gbps G] [--d2h-gbps G] [--duplex-gbps G]
 *                [--evict-persistent] [--placement] [--json] [--emit-plan FILE]
 *   capuchin-sim --trace FILE --check-plan FILE [bandwidths] [--json]
 *
 * Exit status: 0 on success; 1 when the trace or plan cannot be read or a
 * re-simulated plan differs from what it predicts; 2 when no requested
 * planner fits the budget (the message names the smallest peak reached);
 * 64 (EX_USAGE) on bad arguments.
 *
 * Structure, for whoever adds options: every option is one row in
 * `options[]` and one case in parse_args() filling `sim_args_t`; main()
 * loads the trace once and dispatches on the mode (cmd_info() here).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include <time.h>

#include "capuchin/bound.h"
#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/plan.h"
#include "capuchin/planner.h"
#include "capuchin/profile.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"

#define EXIT_USAGE 64 /* sysexits.h EX_USAGE */
#define EXIT_INFEASIBLE 2

typedef struct sim_args {
  const char *trace; /* --trace FILE */
  bool info;         /* --info: print the trace summary */
  bool json;         /* --json: one JSON object instead of text */
  const char *budget;     /* --budget BYTES|N% (as given) */
  uint64_t budget_bytes;  /* absolute, when not a percentage */
  double budget_pct;      /* > 0 for N% */
  const char *policy;     /* --policy NAME|all (default capuchin) */
  cap_bandwidth_t bw;     /* --h2d-gbps, --d2h-gbps, --duplex-gbps */
  bool evict_persistent;  /* --evict-persistent */
  const char *emit_plan;  /* --emit-plan FILE */
  const char *check_plan; /* --check-plan FILE */
  bool placement;         /* --placement */
} sim_args_t;

enum {
  OPT_TRACE = 256,
  OPT_INFO,
  OPT_JSON,
  OPT_HELP,
  OPT_BUDGET,
  OPT_POLICY,
  OPT_H2D,
  OPT_D2H,
  OPT_DUPLEX,
  OPT_EVICT_PERSISTENT,
  OPT_EMIT_PLAN,
  OPT_CHECK_PLAN,
  OPT_PLACEMENT,
};

static const struct option options[] = {
    {"trace", required_argument, NULL, OPT_TRACE},
    {"info", no_argument, NULL, OPT_INFO},
    {"json", no_argument, NULL, OPT_JSON},
    {"help", no_argument, NULL, OPT_HELP},
    {"budget", required_argument, NULL, OPT_BUDGET},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"h2d-gbps", required_argument, NULL, OPT_H2D},
    {"d2h-gbps", required_argument, NULL, OPT_D2H},
    {"duplex-gbps", required_argument, NULL, OPT_DUPLEX},
    {"evict-persistent", no_argument, NULL, OPT_EVICT_PERSISTENT},
    {"emit-plan", required_argument, NULL, OPT_EMIT_PLAN},
    {"check-plan", required_argument, NULL, OPT_CHECK_PLAN},
    {"placement", no_argument, NULL, OPT_PLACEMENT},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f) {
  fputs("usage: capuchin-sim --trace FILE --info [--json]\n"
        "       capuchin-sim --trace FILE --budget BYTES|N% [--policy NAME|all]\n"
        "                    [--h2d-gbps 55.1] [--d2h-gbps 55.1] [--duplex-gbps 85.8]\n"
        "                    [--evict-persistent] [--placement] [--json]\n"
        "                    [--emit-plan FILE]\n"
        "       capuchin-sim --trace FILE --check-plan FILE [--json] [bandwidths]\n"
        "\n"
        "  --trace FILE         a capuchin-trace 1 file (one measured iteration)\n"
        "  --info               print the trace summary: model, ops, tensors,\n"
        "                       persistent and peak bytes, iteration time, accesses\n"
        "  --budget BYTES|N%    device memory the plan may use: absolute bytes, or\n"
        "                       the persistent bytes plus N % of the activation peak\n"
        "  --policy NAME|all    capuchin (default), swap-all, vdnn, checkpoint-sqrt,\n"
        "                       dtr, passive-lru, or all of them\n"
        "  --h2d-gbps G         host-to-device bandwidth, GB/s (default 55.1)\n"
        "  --d2h-gbps G         device-to-host bandwidth, GB/s (default 55.1)\n"
        "  --duplex-gbps G      both directions at once, total GB/s (default 85.8)\n"
        "  --evict-persistent   let planners evict params and inputs too\n"
        "  --placement          plan with placement: an address for every block,\n"
        "                       persistent bytes + arena within the budget\n"
        "  --emit-plan FILE     write the plan as JSON (the capuchin plan with all)\n"
        "  --check-plan FILE    re-simulate a plan written by --emit-plan; exit 1\n"
        "                       if its peak or iteration time differs, or its\n"
        "                       placement misses a block or two blocks collide\n"
        "  --json               print one JSON object instead of text\n"
        "  --help               print this help\n"
        "\n"
        "exit status: 0 ok, 1 unreadable input or a plan that does not re-check,\n"
        "2 no plan fits the budget, 64 bad arguments\n",
        f);
}

static int usage_error(const char *fmt, const char *arg) {
  fputs("capuchin-sim: ", stderr);
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  usage(stderr);
  return EXIT_USAGE;
}

/* A positive finite number of GB/s. */
static bool parse_gbps(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || !isfinite(v) || !(v > 0) || v > 1e6)
    return false;
  *out = v;
  return true;
}

/* BYTES (decimal integer, at least 1) or N% (0 < N <= 1000). */
static bool parse_budget(const char *s, sim_args_t *a) {
  size_t n = strlen(s);
  if (n == 0)
    return false;
  if (s[n - 1] == '%') {
    char *end;
    double v = strtod(s, &end);
    if (end != s + n - 1 || !isfinite(v) || !(v > 0) || v > 1000 ||
        !(s[0] >= '0' && s[0] <= '9'))
      return false;
    a->budget_pct = v;
    return true;
  }
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    unsigned d = (unsigned)(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
  }
  if (v == 0)
    return false;
  a->budget_bytes = v;
  return true;
}

/* 0 to go on, or the exit status to end with. */
static int parse_args(int argc, char **argv, sim_args_t *a) {
  opterr = 0; /* our messages, not getopt's */
  int c;
  while ((c = getopt_long(argc, argv, ":", options, NULL)) != -1) {
    switch (c) {
    case OPT_TRACE:
      a->trace = optarg;
      break;
    case OPT_INFO:
      a->info = true;
      break;
    case OPT_JSON:
      a->json = true;
      break;
    case OPT_BUDGET:
      a->budget = optarg;
      if (!parse_budget(optarg, a))
        return usage_error("bad --budget '%s' (want BYTES or N%%)", optarg);
      break;
    case OPT_POLICY: {
      bool known = !strcmp(optarg, "all");
      for (size_t i = 0; !known && cap_planner_names[i]; i++)
        known = !strcmp(optarg, cap_planner_names[i]);
      if (!known)
        return usage_error("unknown policy '%s'", optarg);
      a->policy = optarg;
      break;
    }
    case OPT_H2D:
    case OPT_D2H:
    case OPT_DUPLEX: {
      double *dst = c == OPT_H2D   ? &a->bw.h2d_gbps
                    : c == OPT_D2H ? &a->bw.d2h_gbps
                                   : &a->bw.duplex_gbps;
      if (!parse_gbps(optarg, dst))
        return usage_error("bad bandwidth '%s' (want GB/s > 0)", optarg);
      break;
    }
    case OPT_EVICT_PERSISTENT:
      a->evict_persistent = true;
      break;
    case OPT_EMIT_PLAN:
      a->emit_plan = optarg;
      break;
    case OPT_CHECK_PLAN:
      a->check_plan = optarg;
      break;
    case OPT_PLACEMENT:
      a->placement = true;
      break;
    case OPT_HELP:
      usage(stdout);
      exit(0);
    case ':':
      return usage_error("option %s needs a value", argv[optind - 1]);
    default:
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  if (!a->trace)
    return usage_error("%s", "--trace FILE is required");
  int modes = a->info + (a->budget != NULL) + (a->check_plan != NULL);
  if (modes == 0)
    return usage_error("%s", "nothing to do: give --info, --budget or --check-plan");
  if (modes > 1)
    return usage_error("%s", "--info, --budget and --check-plan are separate modes");
  if ((a->policy || a->emit_plan || a->evict_persistent || a->placement) &&
      !a->budget)
    return usage_error("%s", "--policy, --emit-plan, --evict-persistent and --placement need --budget");
  return 0;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }
static double ms(int64_t ns) { return (double)ns / 1e6; }

/* JSON string; meta values are printable ASCII, so only " and \ need it. */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fputc('\\', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

static int cmd_info(const sim_args_t *a, const cap_profile_t *p) {
  uint32_t kinds[3] = {0};
  for (uint32_t t = 0; t < p->n_tensors; t++)
    kinds[p->tensors[t].kind]++;
  uint32_t multi = cap_profile_multi_access_tensors(p);
  uint64_t transient = cap_profile_transient_peak(p);
  uint64_t sig = cap_profile_signature(p);
  if (a->json) {
    printf("{\"model\":");
    json_str(stdout, p->model);
    printf(",\"ops\":%" PRIu32 ",\"tensors\":%" PRIu32
           ",\"param_tensors\":%" PRIu32 ",\"input_tensors\":%" PRIu32
           ",\"activation_tensors\":%" PRIu32,
           p->n_ops, p->n_tensors, kinds[CAP_KIND_PARAM],
           kinds[CAP_KIND_INPUT], kinds[CAP_KIND_ACTIVATION]);
    printf(",\"persistent_bytes\":%" PRIu64 ",\"peak_bytes\":%" PRIu64
           ",\"peak_t_ns\":%" PRId64 ",\"transient_peak_bytes\":%" PRIu64,
           p->persistent_bytes, p->peak_bytes, p->peak_t_ns, transient);
    printf(",\"meta_peak_bytes\":%" PRIu64 ",\"resident_bytes\":%" PRIu64
           ",\"untracked_bytes\":%" PRIu64,
           p->meta_peak_bytes, p->resident_bytes,
           cap_profile_untracked_bytes(p));
    printf(",\"iter_ns\":%" PRId64 ",\"accesses\":%" PRIu32
           ",\"multi_access_tensors\":%" PRIu32 ",\"frees\":%" PRIu32
           ",\"signature\":\"%016" PRIx64 "\"}\n",
           p->iter_ns, p->n_accesses, multi, p->n_frees, sig);
  } else {
    printf("model                 %s\n", *p->model ? p->model : "(unnamed)");
    printf("ops                   %" PRIu32 "\n", p->n_ops);
    printf("tensors               %" PRIu32 " (%" PRIu32 " param, %" PRIu32
           " input, %" PRIu32 " activation)\n",
           p->n_tensors, kinds[CAP_KIND_PARAM], kinds[CAP_KIND_INPUT],
           kinds[CAP_KIND_ACTIVATION]);
    printf("persistent            %.1f MiB (%.1f MiB in no tensor)\n",
           mib(p->persistent_bytes), mib(cap_profile_untracked_bytes(p)));
    printf("peak                  %.1f MiB at %.3f ms\n", mib(p->peak_bytes),
           ms(p->peak_t_ns));
    printf("transient peak        %.1f MiB\n", mib(transient));
    if (p->meta_peak_bytes)
      printf("measured peak         %.1f MiB (curve %+.2f %%)\n",
             mib(p->meta_peak_bytes),
             ((double)p->peak_bytes - (double)p->meta_peak_bytes) * 100.0 /
                 (double)p->meta_peak_bytes);
    printf("iteration             %.3f ms\n", ms(p->iter_ns));
    printf("accesses              %" PRIu32 "\n", p->n_accesses);
    printf("multi-access tensors  %" PRIu32 "\n", multi);
    printf("signature             %016" PRIx64 "\n", sig);
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "capuchin-sim: cannot write output\n");
    return 1;
  }
  return 0;
}

/* --- planning -------------------------------------------------------------- */

typedef struct result {
  const char *policy;
  int rc; /* 0 feasible, CAP_EINFEASIBLE, or an error */
  cap_sim_result_t sim;
  double plan_ms;
  uint64_t arena_bytes;      /* placement: the arena (0: no placement) */
  uint64_t outside_bytes;    /* placement: persistent bytes outside it */
  uint64_t placed_peak_bytes;/* placement: live peak of the blocks */
} result_t;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void print_results(const sim_args_t *a, uint64_t budget,
                          const cap_profile_t *p, int64_t base_ns,
                          const cap_window_bound_t *wb, const result_t *r,
                          size_t n) {
  if (a->json) {
    printf("{\"trace\":");
    json_str(stdout, a->trace);
    printf(",\"budget_bytes\":%" PRIu64 ",\"window_bound_ns\":%" PRId64
           ",\"results\":[",
           budget, wb->extra_ns);
    for (size_t i = 0; i < n; i++) {
      const cap_sim_result_t *s = &r[i].sim;
      printf("%s{\"policy\":", i ? "," : "");
      json_str(stdout, r[i].policy);
      printf(",\"feasible\":%s,\"peak_bytes\":%" PRIu64 ",\"iter_ns\":%" PRId64
             ",\"overhead_pct\":%.3f,\"swap_out_bytes\":%" PRIu64
             ",\"swap_in_bytes\":%" PRIu64 ",\"recompute_ns\":%" PRId64
             ",\"stall_ns\":%" PRId64 ",\"room_wait_ns\":%" PRId64
             ",\"plan_ms\":%.3f",
             r[i].rc == 0 ? "true" : "false", s->peak_bytes, s->iter_ns,
             100.0 * (double)(s->iter_ns - base_ns) / (double)base_ns,
             s->swap_out_bytes, s->swap_in_bytes, s->recompute_ns, s->stall_ns,
             s->room_wait_ns, r[i].plan_ms);
      if (r[i].arena_bytes)
        printf(",\"arena_bytes\":%" PRIu64 ",\"outside_arena_bytes\":%" PRIu64
               ",\"placed_peak_bytes\":%" PRIu64,
               r[i].arena_bytes, r[i].outside_bytes, r[i].placed_peak_bytes);
      putchar('}');
    }
    printf("]}\n");
    return;
  }
  printf("trace %s (%s): unmanaged %.3f ms, peak %.1f MiB, persistent %.1f MiB\n",
         a->trace, *p->model ? p->model : "unnamed", ms(base_ns),
         mib(p->peak_bytes), mib(p->persistent_bytes));
  printf("budget %.1f MiB (%" PRIu64 " bytes)\n\n", mib(budget), budget);
  printf("%-16s %-8s %10s %10s %9s %9s %9s %10s %9s %8s\n", "policy", "fits",
         "peak MiB", "iter ms", "overhd %", "out MiB", "in MiB", "recomp ms",
         "stall ms", "plan ms");
  for (size_t i = 0; i < n; i++) {
    const cap_sim_result_t *s = &r[i].sim;
    printf("%-16s %-8s %10.1f %10.3f %9.1f %9.1f %9.1f %10.3f %9.3f %8.2f\n",
           r[i].policy, r[i].rc == 0 ? "yes" : "NO", mib(s->peak_bytes),
           ms(s->iter_ns), 100.0 * (double)(s->iter_ns - base_ns) / (double)base_ns,
           mib(s->swap_out_bytes), mib(s->swap_in_bytes), ms(s->recompute_ns),
           ms(s->stall_ns), r[i].plan_ms);
  }
  for (size_t i = 0; i < n; i++) {
    if (!r[i].arena_bytes)
      continue;
    printf("%-16s placement: %.1f MiB outside + %.1f MiB arena = %.1f MiB",
           r[i].policy, mib(r[i].outside_bytes), mib(r[i].arena_bytes),
           mib(r[i].outside_bytes + r[i].arena_bytes));
    if (r[i].placed_peak_bytes)
      printf(" (arena / live peak %.4f)",
             (double)r[i].arena_bytes / (double)r[i].placed_peak_bytes);
    putchar('\n');
  }
  if (wb->extra_ns > 0)
    printf("\nno plan costs less than %.3f ms (%.1f %%) at this budget: at "
           "least %.1f MiB must be off the device when op %" PRIu32
           " (%s) starts and back by op %" PRIu32 " (%s), %.3f ms later "
           "unmanaged (window bound)\n",
           ms(wb->extra_ns), 100.0 * (double)wb->extra_ns / (double)base_ns,
           mib(wb->off_bytes), wb->from_op, p->ops[wb->from_op].name, wb->to_op,
           p->ops[wb->to_op].name, ms(wb->window_ns));
}

static int write_plan(const char *path, const cap_plan_t *plan,
                      const char *trace) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "capuchin-sim: cannot write %s\n", path);
    return 1;
  }
  int rc = cap_plan_write_json(f, plan, trace);
  if (fclose(f) != 0 || rc) {
    fprintf(stderr, "capuchin-sim: cannot write %s\n", path);
    return 1;
  }
  return 0;
}

static int cmd_plan(const sim_args_t *a, const cap_profile_t *p) {
  cap_plan_config_t cfg;
  uint64_t budget = a->budget_pct > 0 ? cap_profile_budget_pct(p, a->budget_pct)
                                      : a->budget_bytes;
  cap_plan_config_init(&cfg, budget);
  cfg.bw = a->bw;
  cfg.evict_persistent = a->evict_persistent;
  const char *policy = a->policy ? a->policy : "capuchin";
  bool all = !strcmp(policy, "all");
  size_t n = 0;
  while (cap_planner_names[n])
    n++;
  result_t res[16];
  size_t nres = 0;
  cap_plan_t *emit = NULL;
  int status = 0;
  cap_sim_result_t base;
  if (cap_sim_run(p, NULL, &cfg.bw, &base)) {
    fprintf(stderr, "capuchin-sim: cannot simulate the trace\n");
    return 1;
  }
  cap_window_bound_t wb;
  if (cap_window_bound(p, budget, cfg.evict_persistent, cfg.bw.h2d_gbps, &wb)) {
    fprintf(stderr, "capuchin-sim: cannot bound the budget's cost\n");
    cap_sim_result_close(&base);
    return 1;
  }
  for (size_t i = 0; i < n && nres < sizeof res / sizeof *res; i++) {
    if (!all && strcmp(policy, cap_planner_names[i]))
      continue;
    result_t *r = &res[nres];
    memset(r, 0, sizeof *r);
    r->policy = cap_planner_names[i];
    cap_plan_t *plan = NULL;
    double t0 = now_ms();
    if (a->placement) {
      cap_plan_placement_t pp;
      r->rc = cap_plan_compute_placed(p, r->policy, &cfg, &plan, &pp);
      r->arena_bytes = pp.placement.arena_bytes;
      r->outside_bytes = pp.persistent_bytes;
      r->placed_peak_bytes = pp.placement.peak_bytes;
      cap_plan_placement_close(&pp);
    } else {
      r->rc = cap_plan_compute(p, r->policy, &cfg, &plan);
    }
    r->plan_ms = now_ms() - t0;
    if (r->rc && r->rc != CAP_EINFEASIBLE) {
      fprintf(stderr, "capuchin-sim: %s: %s\n", r->policy, cap_strerror(r->rc));
      cap_plan_destroy(plan);
      status = 1;
      continue;
    }
    if (cap_sim_run(p, plan, &cfg.bw, &r->sim)) {
      fprintf(stderr, "capuchin-sim: %s: cannot simulate its plan\n", r->policy);
      cap_plan_destroy(plan);
      status = 1;
      continue;
    }
    nres++;
    if (a->emit_plan && !emit && (!all || !strcmp(r->policy, "capuchin")))
      emit = plan;
    else
      cap_plan_destroy(plan);
  }
  print_results(a, budget, p, base.iter_ns, &wb, res, nres);
  if (a->emit_plan && emit && write_plan(a->emit_plan, emit, a->trace))
    status = 1;
  if (a->emit_plan && !emit && !status) {
    fprintf(stderr, "capuchin-sim: no plan to write to %s\n", a->emit_plan);
    status = 1;
  }
  /* Impossible budget: none of the requested planners fits. */
  bool any = false;
  uint64_t best = UINT64_MAX;
  const char *best_policy = NULL;
  for (size_t i = 0; i < nres; i++) {
    any |= res[i].rc == 0;
    /* With placement a plan needs its arena and what stays outside it:
     * aligned blocks can need more than the live bytes. */
    uint64_t need = res[i].arena_bytes
                        ? res[i].outside_bytes + res[i].arena_bytes
                        : res[i].sim.peak_bytes;
    if (need < best) {
      best = need;
      best_policy = res[i].policy;
    }
  }
  if (!status && !any && best_policy) {
    uint64_t floor_bytes = cap_plan_min_budget(p, &cfg);
    fprintf(stderr,
            "capuchin-sim: no plan fits the budget of %" PRIu64
            " bytes (%.1f MiB); the smallest feasible peak found is %" PRIu64
            " bytes (%.1f MiB, %s%s); no plan can fit below %" PRIu64
            " bytes (%.1f MiB: an op's own tensors plus the persistent "
            "bytes%s, %.1f MiB of them resident before the iteration in no "
            "tensor)\n",
            budget, mib(budget), best, mib(best), best_policy,
            a->placement ? ", with its placement's aligned blocks" : "",
            floor_bytes, mib(floor_bytes),
            cfg.evict_persistent ? " that cannot be off the device then" : "",
            mib(cap_profile_untracked_bytes(p)));
    status = EXIT_INFEASIBLE;
  }
  for (size_t i = 0; i < nres; i++)
    cap_sim_result_close(&res[i].sim);
  cap_sim_result_close(&base);
  cap_plan_destroy(emit);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "capuchin-sim: cannot write output\n");
    return 1;
  }
  return status;
}

/* --- re-checking a plan file ----------------------------------------------- */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (n < cap)
      break;
    if (cap >= ((size_t)1 << 30)) { /* a plan file of a GiB is not a plan */
      free(buf);
      buf = NULL;
      break;
    }
    char *nb = realloc(buf, cap * 2);
    if (!nb) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = nb;
    cap *= 2;
  }
  if (buf && ferror(f)) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *len = n;
  return buf;
}

static int cmd_check(const sim_args_t *a, const cap_profile_t *p) {
  size_t len = 0;
  char *buf = read_file(a->check_plan, &len);
  if (!buf) {
    fprintf(stderr, "capuchin-sim: cannot read %s\n", a->check_plan);
    return 1;
  }
  char err[512];
  cap_plan_t *plan = NULL;
  int rc = cap_plan_read_json(buf, len, &plan, err, sizeof err);
  free(buf);
  if (rc) {
    fprintf(stderr, "capuchin-sim: %s: %s\n", a->check_plan, err);
    return 1;
  }
  if (cap_plan_validate(plan, p, err, sizeof err) ||
      cap_plan_check_placement(plan, p, &a->bw, err, sizeof err)) {
    fprintf(stderr, "capuchin-sim: %s: not a plan for %s: %s\n", a->check_plan,
            a->trace, err);
    cap_plan_destroy(plan);
    return 1;
  }
  result_t r;
  memset(&r, 0, sizeof r);
  r.policy = plan->policy;
  cap_sim_result_t base;
  if (cap_sim_run(p, NULL, &a->bw, &base) ||
      cap_sim_run(p, plan, &a->bw, &r.sim)) {
    fprintf(stderr, "capuchin-sim: cannot simulate %s\n", a->check_plan);
    cap_sim_result_close(&base);
    cap_plan_destroy(plan);
    return 1;
  }
  r.rc = r.sim.peak_bytes <= plan->budget_bytes ? 0 : CAP_EINFEASIBLE;
  r.arena_bytes = plan->arena_bytes;
  if (plan->n_blocks)
    r.outside_bytes = cap_plan_outside_arena(plan, p);
  /* the plan may evict anything: the bound for plans that may */
  cap_window_bound_t wb;
  if (cap_window_bound(p, plan->budget_bytes, true, a->bw.h2d_gbps, &wb)) {
    fprintf(stderr, "capuchin-sim: cannot bound the budget's cost\n");
    cap_sim_result_close(&base);
    cap_sim_result_close(&r.sim);
    cap_plan_destroy(plan);
    return 1;
  }
  print_results(a, plan->budget_bytes, p, base.iter_ns, &wb, &r, 1);
  int status = 0;
  if ((plan->predicted_peak_bytes &&
       plan->predicted_peak_bytes != r.sim.peak_bytes) ||
      (plan->predicted_iter_ns && plan->predicted_iter_ns != r.sim.iter_ns)) {
    fprintf(stderr,
            "capuchin-sim: %s predicts peak %" PRIu64 " bytes and %" PRId64
            " ns; re-simulated: %" PRIu64 " bytes and %" PRId64 " ns\n",
            a->check_plan, plan->predicted_peak_bytes, plan->predicted_iter_ns,
            r.sim.peak_bytes, r.sim.iter_ns);
    status = 1;
  } else if (!a->json) {
    printf("\nplan re-checked: peak and iteration time as predicted\n");
  }
  cap_sim_result_close(&r.sim);
  cap_sim_result_close(&base);
  cap_plan_destroy(plan);
  if (fflush(stdout) != 0 || ferror(stdout))
    return 1;
  return status;
}

int main(int argc, char **argv) {
  sim_args_t a = {0};
  a.bw = CAP_BANDWIDTH_H100;
  int rc = parse_args(argc, argv, &a);
  if (rc)
    return rc;
  char err[1024];
  cap_profile_t *p = NULL;
  if (cap_trace_load(a.trace, &p, err, sizeof err) != 0) {
    fprintf(stderr, "capuchin-sim: %s\n", err);
    return 1;
  }
  rc = 1;
  if (a.info)
    rc = cmd_info(&a, p);
  else if (a.check_plan)
    rc = cmd_check(&a, p);
  else
    rc = cmd_plan(&a, p);
  cap_profile_destroy(p);
  return rc;
}
