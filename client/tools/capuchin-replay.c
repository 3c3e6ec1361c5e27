/*
 * capuchin-replay: drive libcapuchin-client with a recorded trace instead of
 * a framework.
 *
 *   capuchin-replay --trace FILE [--iterations N] [--budget BYTES|N%]
 *                   [--socket PATH] [--backend sim|cuda] [--time-scale X]
 *                   [--no-daemon] [--json] [--verify sample|full]
 *                   [--job NAME] [--device-uuid UUID] [--fail-recompute N]
 *                   [--fail-alloc N] [--op-times FILE]
 *
 * Each op "runs" for its measured duration (sim: on the backend clock,
 * scaled by X: wall time = trace time * X; cuda: a kernel). Every tensor is
 * filled with a pattern derived from its id and the iteration it was
 * written in, and checked at every later access, so a swap or a recompute
 * that loses or corrupts data is counted as an integrity mismatch.
 * --verify sample (default) writes and checks one 8-byte word per 64 KiB
 * plus the first and last word of each tensor; full checks every word.
 *
 * --op-times FILE: per op and iteration, where the host's time went (a
 * tab-separated table: iteration, mode, op, name, then ns from the
 * iteration's start to op begin, in cap_client_op_begin (restores, waits
 * for memory), in the op's body (integrity work and compute: on cuda the
 * host waits for the device in the checks, so late copies show here), in
 * cap_client_op_end (evictions)). Comparing a guided iteration with the
 * measured one shows what the plan cost and where.
 *
 * Exit status: 0 when every iteration ran with zero mismatches and no
 * errors, 1 when mismatches or op errors were counted, 2 when the client
 * could not be opened or the daemon found no plan for the budget (the
 * message names the smallest budget that has one, as capuchin-sim does),
 * 64 for bad arguments.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/client.h"
#include "capuchin/error.h"
#include "capuchin/profile.h"
#include "capuchin/trace.h"

typedef struct replay {
  cap_client_t *c;
  const cap_profile_t *p;
  uint32_t *id_of;       /* trace tensor id -> client id */
  uint32_t *seed_iter;   /* iteration each tensor was last written in */
  uint32_t *written;     /* iteration each tensor was last written in, as
                            seen by this process (0: never) */
  uint32_t iteration;
  int64_t mismatches;    /* this iteration */
  int64_t errors;        /* op errors this iteration */
  char first_error[256]; /* what the first of them was, "" when none */
  int fail_recompute_at; /* fault injection: fail the N-th callback */
  int recompute_calls;
  bool full;
  FILE *op_times; /* --op-times, or NULL */
  int64_t *op_t;  /* this iteration's 4 host times per op */
} replay_t;

static uint64_t seed_of(uint32_t id, uint32_t iter) {
  return ((uint64_t)id << 32) ^ (uint64_t)iter ^ 0x9e3779b97f4a7c15ull;
}

/* Count an error of this iteration; the first one's reason goes into the
 * iteration table. */
static void note_error(replay_t *r, const char *what, uint32_t n, int rc) {
  r->errors++;
  if (!r->first_error[0])
    snprintf(r->first_error, sizeof r->first_error, "%s %u: %s: %s", what, n,
             cap_strerror(rc), cap_client_last_error(r->c));
  if (getenv("CAPUCHIN_REPLAY_DEBUG"))
    fprintf(stderr, "capuchin-replay: %s %u: %s (%s)\n", what, n,
            cap_strerror(rc), cap_client_last_error(r->c));
}

static void usage(FILE *f) {
  fprintf(f, "usage: capuchin-replay --trace FILE [--iterations N] "
             "[--budget BYTES|N%%]\n"
             "                       [--socket PATH] [--backend sim|cuda] "
             "[--time-scale X]\n"
             "                       [--no-daemon] [--json] [--verify "
             "sample|full] [--job NAME]\n"
             "                       [--device-uuid UUID] [--plan FILE] "
             "[--op-times FILE]\n");
}

/* A plan written by capuchin-sim --emit-plan for this trace, installed at
 * the next iteration (a plan from the daemon replaces it). */
static int load_plan_file(cap_client_t *c, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "capuchin-replay: %s: %s\n", path, strerror(errno));
    return CAP_EIO;
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 1 << 16;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return CAP_ENOMEM;
      }
      buf = nb;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0)
      break;
  }
  int rc = ferror(f) ? CAP_EIO : 0;
  fclose(f);
  if (!rc)
    rc = cap_client_load_plan_json(c, buf, len);
  if (rc < 0)
    fprintf(stderr, "capuchin-replay: %s: %s\n", path,
            rc == CAP_EPARSE ? cap_client_last_error(c) : cap_strerror(rc));
  free(buf);
  return rc;
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  if (!s || !*s || *s == '-')
    return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end)
    return -1;
  *out = v;
  return 0;
}

/* The recompute callback: op seq of the trace re-run. Its inputs must hold
 * what they held when the op first ran; its outputs get the pattern of the
 * iteration the tensor was written in. */
static int on_recompute(void *user, uint32_t seq, const char *name,
                        const uint32_t *in_ids, void *const *in_ptrs,
                        uint32_t n_in, const uint32_t *out_ids,
                        void *const *out_ptrs, uint32_t n_out) {
  replay_t *r = user;
  (void)name;
  r->recompute_calls++;
  if (r->fail_recompute_at && r->recompute_calls == r->fail_recompute_at)
    return -1;
  if (seq >= r->p->n_ops)
    return -1;
  const cap_op_t *op = &r->p->ops[seq];
  for (uint32_t i = 0; i < n_in; i++) {
    uint32_t id = in_ids[i];
    if (id >= r->p->n_tensors)
      return -1;
    const cap_tensor_t *t = &r->p->tensors[id];
    int64_t bad = cap_client_pattern_check(r->c, in_ptrs[i], t->bytes,
                                           seed_of(id, r->seed_iter[id]));
    if (bad > 0)
      r->mismatches += bad;
  }
  for (uint32_t i = 0; i < n_out; i++) {
    uint32_t id = out_ids[i];
    if (id >= r->p->n_tensors)
      return -1;
    cap_client_pattern_fill(r->c, out_ptrs[i], r->p->tensors[id].bytes,
                            seed_of(id, r->seed_iter[id]));
  }
  return cap_client_compute(r->c, op->end_ns - op->start_ns);
}

typedef struct row {
  cap_iter_stats_t st;
  int64_t predicted_ns;
  uint64_t budget_bytes;
  int64_t mismatches, errors;
  char first_error[256];
  uint32_t prev_plan_version; /* of the row before: notes print once */
} row_t;

/* s as the inside of a JSON string. */
static void json_str(const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      printf("\\u%04x", (unsigned char)*s);
    else
      putchar(*s);
  }
}

static void print_row(const row_t *w, bool json, bool first, double scale) {
  const cap_iter_stats_t *s = &w->st;
  (void)scale;
  if (json) {
    printf("%s\n  {\"iteration\":%u,\"mode\":\"%s\",\"time_ns\":%" PRId64
           ",\"peak_bytes\":%" PRIu64 ",\"bytes_out\":%" PRIu64
           ",\"bytes_in\":%" PRIu64
           ",\"recomputed_ops\":%u,\"stall_ns\":%" PRId64
           ",\"plan_version\":%u,\"mismatches\":%" PRId64 ",\"errors\":%" PRId64
           ",\"evictions\":%u,\"fallbacks\":%u,\"dropped_records\":%" PRIu64
           ",\"predicted_ns\":%" PRId64 ",\"budget_bytes\":%" PRIu64
           ",\"lru_evictions\":%u,\"budget_waits\":%u"
           ",\"placed_allocs\":%u,\"placement_misses\":%u",
           first ? "[" : ",", s->iteration, cap_client_mode_name(s->mode),
           s->time_ns, s->peak_bytes, s->bytes_out, s->bytes_in,
           s->recomputed_ops, s->stall_ns, s->plan_version, w->mismatches,
           w->errors, s->evictions, s->fallbacks, s->dropped_records,
           w->predicted_ns, w->budget_bytes, s->lru_evictions, s->budget_waits,
           s->placed_allocs, s->placement_misses);
    if (w->first_error[0]) {
      printf(",\"first_error\":\"");
      json_str(w->first_error);
      putchar('"');
    }
    if (s->refused_actions || s->plan_note[0]) {
      printf(",\"refused_actions\":%u,\"plan_note\":\"", s->refused_actions);
      json_str(s->plan_note);
      putchar('"');
    }
    putchar('}');
  } else {
    if (first)
      printf("%4s %-8s %10s %10s %10s %10s %6s %9s %4s %10s %10s\n", "iter",
             "mode", "time_ms", "peak_MiB", "out_MiB", "in_MiB", "recomp",
             "stall_ms", "plan", "mismatches", "pred_ms");
    printf("%4u %-8s %10.2f %10.1f %10.1f %10.1f %6u %9.2f %4u %10" PRId64
           " %10.2f%s\n",
           s->iteration, cap_client_mode_name(s->mode), s->time_ns / 1e6,
           s->peak_bytes / 1048576.0, s->bytes_out / 1048576.0,
           s->bytes_in / 1048576.0, s->recomputed_ops, s->stall_ns / 1e6,
           s->plan_version, w->mismatches, w->predicted_ns / 1e6,
           w->errors ? "  (errors)" : "");
    if (s->refused_actions && s->plan_version != w->prev_plan_version)
      printf("     %u actions swapped instead; the first: %s\n",
             s->refused_actions, s->plan_note);
    if (w->errors)
      printf("     first error: %s\n", w->first_error);
    if (s->placement_misses)
      printf("     placement: %u allocations at their planned address, %u "
             "found it taken\n", s->placed_allocs, s->placement_misses);
  }
  fflush(stdout);
}

/* The daemon as the user should hear of it: connected, off, unreachable
 * (nobody answered), or what it said when it refused or closed. */
static const char *daemon_state(const cap_client_stats_t *st, bool no_daemon,
                                char *buf, size_t len) {
  if (no_daemon)
    return "off";
  if (st->connected)
    return "connected";
  if (!st->daemon_message[0])
    return "unreachable";
  snprintf(buf, len, "refused the session: \"%s\"", st->daemon_message);
  return buf;
}

/* The iteration's per-op host times (--op-times), relative to its first
 * op's begin; ops that failed to begin (their times unset) are left out. */
static void write_op_times(replay_t *r, cap_mode_t mode) {
  const cap_profile_t *p = r->p;
  int64_t t0 = p->n_ops ? r->op_t[0] : 0;
  for (uint32_t s = 0; s < p->n_ops; s++) {
    const int64_t *t = r->op_t + 4 * (size_t)s;
    if (t[1] == 0 || t[3] == 0)
      continue;
    fprintf(r->op_times,
            "%u\t%s\t%u\t%s\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64
            "\n",
            r->iteration, cap_client_mode_name(mode), s, p->ops[s].name,
            t[0] - t0, t[1] - t[0], t[2] - t[1], t[3] - t[2]);
  }
  memset(r->op_t, 0, 4 * (size_t)p->n_ops * sizeof *r->op_t);
}

static int run_iteration(replay_t *r, row_t *row) {
  cap_client_t *c = r->c;
  const cap_profile_t *p = r->p;
  int rc = cap_client_iteration_begin(c);
  if (rc < 0)
    return rc;
  r->iteration++;
  r->mismatches = 0;
  r->errors = 0;
  r->first_error[0] = '\0';
  /* Tensors in trace-id order, so that client ids equal trace ids:
   * persistent ones once (in the first iteration), activations every
   * iteration (allocated at their first access). */
  for (uint32_t id = 0; id < p->n_tensors; id++) {
    const cap_tensor_t *t = &p->tensors[id];
    uint32_t cid;
    if (t->kind != CAP_KIND_ACTIVATION) {
      if (r->iteration > 1)
        continue;
      void *dev = NULL;
      rc = cap_client_register(c, t->bytes, t->kind, &cid, &dev);
      if (rc == 0) {
        r->seed_iter[id] = 0;
        cap_client_pattern_fill(c, dev, t->bytes, seed_of(id, 0));
      }
    } else {
      rc = cap_client_declare(c, t->bytes, &cid);
    }
    if (rc < 0) {
      fprintf(stderr, "capuchin-replay: tensor %u: %s (%s)\n", id,
              cap_strerror(rc), cap_client_last_error(c));
      return rc;
    }
    r->id_of[id] = cid;
    if (cid != id) {
      fprintf(stderr, "capuchin-replay: tensor %u got client id %u\n", id, cid);
      return CAP_ESTATE;
    }
  }
  static void *ptrs[2 * 65536];
  uint32_t fi = 0;
  for (uint32_t s = 0; s < p->n_ops; s++) {
    const cap_op_t *op = &p->ops[s];
    const uint32_t *in = cap_op_inputs(p, op), *out = cap_op_outputs(p, op);
    if (op->n_in > 65536 || op->n_out > 65536)
      return CAP_ERANGE;
    void **in_ptrs = ptrs, **out_ptrs = ptrs + op->n_in;
    int64_t *t4 = r->op_t ? r->op_t + 4 * (size_t)s : NULL;
    if (t4)
      t4[0] = cap_client_now_ns(c);
    rc = cap_client_op_begin(c, op->name, in, op->n_in, out, op->n_out,
                             in_ptrs, out_ptrs);
    if (rc < 0) {
      /* The job carries on: count it, and rewrite what the op writes. */
      note_error(r, "op", s, rc);
      continue;
    }
    int64_t t_begin = cap_client_now_ns(c);
    if (t4)
      t4[1] = t_begin;
    for (uint32_t i = 0; i < op->n_in; i++) {
      uint32_t id = in[i];
      if (p->tensors[id].kind == CAP_KIND_ACTIVATION &&
          r->written[id] != r->iteration) {
        /* Read before any op of this iteration wrote it (state carried
         * across iterations, like BatchNorm's running statistics, or made
         * outside the traced ops): it starts here. */
        r->seed_iter[id] = r->iteration;
        r->written[id] = r->iteration;
        cap_client_pattern_fill(c, in_ptrs[i], p->tensors[id].bytes,
                                seed_of(id, r->iteration));
        continue;
      }
      int64_t bad = cap_client_pattern_check(c, in_ptrs[i], p->tensors[id].bytes,
                                             seed_of(id, r->seed_iter[id]));
      if (bad > 0)
        r->mismatches += bad;
    }
    for (uint32_t i = 0; i < op->n_out; i++) {
      uint32_t id = out[i];
      r->seed_iter[id] = r->iteration;
      r->written[id] = r->iteration;
      cap_client_pattern_fill(c, out_ptrs[i], p->tensors[id].bytes,
                              seed_of(id, r->iteration));
    }
    /* The op runs for its measured duration, the integrity work included. */
    int64_t left = (op->end_ns - op->start_ns) - (cap_client_now_ns(c) - t_begin);
    if (left > 0)
      cap_client_compute(c, left);
    if (t4)
      t4[2] = cap_client_now_ns(c);
    cap_client_op_end(c);
    if (t4)
      t4[3] = cap_client_now_ns(c);
    /* Frees due before the next op starts. */
    int64_t until = s + 1 < p->n_ops ? p->ops[s + 1].start_ns : INT64_MAX;
    while (fi < p->n_frees && p->frees[fi].t_ns <= until) {
      rc = cap_client_free(c, p->frees[fi].tensor);
      if (rc < 0) {
        note_error(r, "free of tensor", p->frees[fi].tensor, rc);
      }
      fi++;
    }
  }
  while (fi < p->n_frees)
    cap_client_free(c, p->frees[fi++].tensor);
  /* Activations the trace never frees (running statistics) end with the
   * iteration here, so that the next iteration declares them afresh. */
  for (uint32_t id = 0; id < p->n_tensors; id++)
    if (p->tensors[id].kind == CAP_KIND_ACTIVATION)
      (void)cap_client_free(c, id); /* swapped-out or dropped leftovers */
  row->predicted_ns = cap_client_plan_predicted_ns(c);
  {
    cap_client_stats_t cs;
    cap_client_get_stats(c, &cs);
    row->budget_bytes = cs.budget_bytes;
  }
  rc = cap_client_iteration_end(c, &row->st);
  if (r->op_times && rc == 0)
    write_op_times(r, row->st.mode);
  row->mismatches = r->mismatches;
  row->errors = r->errors;
  memcpy(row->first_error, r->first_error, sizeof row->first_error);
  return rc;
}

int main(int argc, char **argv) {
  const char *trace = NULL, *budget_s = NULL, *socket = NULL, *backend = NULL,
             *job = NULL, *verify = "sample", *device_uuid = NULL,
             *plan_file = NULL, *op_times = NULL;
  uint64_t iterations = 6;
  double scale = 1.0;
  bool no_daemon = false, json = false;
  int fail_recompute = 0, fail_alloc = 0;
  enum {
    O_TRACE = 1,
    O_ITER,
    O_BUDGET,
    O_SOCKET,
    O_BACKEND,
    O_SCALE,
    O_NODAEMON,
    O_JSON,
    O_VERIFY,
    O_JOB,
    O_UUID,
    O_FAILREC,
    O_FAILALLOC,
    O_PLAN,
    O_OPTIMES,
    O_HELP
  };
  static const struct option opts[] = {
      {"trace", required_argument, 0, O_TRACE},
      {"iterations", required_argument, 0, O_ITER},
      {"budget", required_argument, 0, O_BUDGET},
      {"socket", required_argument, 0, O_SOCKET},
      {"backend", required_argument, 0, O_BACKEND},
      {"time-scale", required_argument, 0, O_SCALE},
      {"no-daemon", no_argument, 0, O_NODAEMON},
      {"json", no_argument, 0, O_JSON},
      {"verify", required_argument, 0, O_VERIFY},
      {"job", required_argument, 0, O_JOB},
      {"device-uuid", required_argument, 0, O_UUID},
      {"fail-recompute", required_argument, 0, O_FAILREC},
      {"fail-alloc", required_argument, 0, O_FAILALLOC},
      {"plan", required_argument, 0, O_PLAN},
      {"op-times", required_argument, 0, O_OPTIMES},
      {"help", no_argument, 0, O_HELP},
      {0, 0, 0, 0}};
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    uint64_t v;
    char *end;
    switch (o) {
    case O_TRACE:
      trace = optarg;
      break;
    case O_ITER:
      if (parse_u64(optarg, &iterations) < 0 || iterations == 0 ||
          iterations > 1000000) {
        fprintf(stderr, "capuchin-replay: --iterations: need 1..1000000\n");
        return 64;
      }
      break;
    case O_BUDGET:
      budget_s = optarg;
      break;
    case O_SOCKET:
      socket = optarg;
      break;
    case O_BACKEND:
      if (strcmp(optarg, "sim") && strcmp(optarg, "cuda")) {
        fprintf(stderr, "capuchin-replay: --backend: sim or cuda\n");
        return 64;
      }
      backend = optarg;
      break;
    case O_SCALE:
      errno = 0;
      scale = strtod(optarg, &end);
      if (errno || *end || !(scale > 0) || scale > 1e6) {
        fprintf(stderr, "capuchin-replay: --time-scale: a positive number\n");
        return 64;
      }
      break;
    case O_NODAEMON:
      no_daemon = true;
      break;
    case O_JSON:
      json = true;
      break;
    case O_VERIFY:
      if (strcmp(optarg, "sample") && strcmp(optarg, "full")) {
        fprintf(stderr, "capuchin-replay: --verify: sample or full\n");
        return 64;
      }
      verify = optarg;
      break;
    case O_JOB:
      job = optarg;
      break;
    case O_UUID:
      device_uuid = optarg;
      break;
    case O_FAILREC:
      if (parse_u64(optarg, &v) < 0 || v > 1000000)
        return usage(stderr), 64;
      fail_recompute = (int)v;
      break;
    case O_FAILALLOC:
      if (parse_u64(optarg, &v) < 0 || v > 100000000)
        return usage(stderr), 64;
      fail_alloc = (int)v;
      break;
    case O_PLAN:
      plan_file = optarg;
      break;
    case O_OPTIMES:
      op_times = optarg;
      break;
    case O_HELP:
      usage(stdout);
      return 0;
    default:
      fprintf(stderr, "capuchin-replay: unknown or incomplete option '%s'\n",
              argv[optind - 1]);
      usage(stderr);
      return 64;
    }
  }
  if (!trace || optind != argc) {
    usage(stderr);
    return 64;
  }
  char err[512];
  cap_profile_t *p = NULL;
  int rc = cap_trace_load(trace, &p, err, sizeof err);
  if (rc < 0) {
    /* The reader names the file by its last component; the user gave a
     * path, and that is what they can act on. */
    const char *base = strrchr(trace, '/');
    base = base && base[1] ? base + 1 : trace;
    size_t n = strlen(base);
    if (base != trace && strncmp(err, base, n) == 0 && err[n] == ':')
      fprintf(stderr, "capuchin-replay: %s%s\n", trace, err + n);
    else
      fprintf(stderr, "capuchin-replay: %s\n", err);
    return 64;
  }
  uint64_t budget = 0;
  if (budget_s) {
    size_t n = strlen(budget_s);
    if (n > 1 && budget_s[n - 1] == '%') {
      char *end;
      errno = 0;
      double pct = strtod(budget_s, &end);
      if (errno || end != budget_s + n - 1 || !(pct > 0) || pct > 1000) {
        fprintf(stderr, "capuchin-replay: --budget: BYTES or N%%\n");
        cap_profile_destroy(p);
        return 64;
      }
      budget = cap_profile_budget_pct(p, pct);
    } else if (parse_u64(budget_s, &budget) < 0 || budget == 0) {
      fprintf(stderr, "capuchin-replay: --budget: BYTES or N%%\n");
      cap_profile_destroy(p);
      return 64;
    }
  }

  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  char jobname[128];
  snprintf(jobname, sizeof jobname, "replay-%s", p->model && *p->model ? p->model : "trace");
  cfg.job_name = job ? job : jobname;
  cfg.socket_path = socket;
  cfg.budget_bytes = budget;
  cfg.backend = backend;
  cfg.time_scale = scale;
  cfg.sim_device_uuid = device_uuid;
  cfg.no_daemon = no_daemon;
  {
    /* Swaps need about what the unmanaged peak exceeds the budget by. */
    cap_curve_t curve = {0};
    if (budget && cap_curve_compute(p, &curve) == 0 && curve.peak_bytes > budget)
      cfg.host_pool_bytes = (curve.peak_bytes - budget) + (curve.peak_bytes - budget) / 4;
    cap_curve_close(&curve);
  }
  cfg.connect_timeout_ms = no_daemon ? 0 : 2000;
  cap_client_t *c = NULL;
  rc = cap_client_create(&cfg, &c);
  if (rc < 0) {
    fprintf(stderr, "capuchin-replay: cannot open the client (%s backend): %s\n",
            backend ? backend : "default", cap_strerror(rc));
    cap_profile_destroy(p);
    return 2;
  }
  replay_t r = {0};
  r.c = c;
  r.p = p;
  r.full = strcmp(verify, "full") == 0;
  r.fail_recompute_at = fail_recompute;
  r.id_of = calloc(p->n_tensors ? p->n_tensors : 1, sizeof *r.id_of);
  r.seed_iter = calloc(p->n_tensors ? p->n_tensors : 1, sizeof *r.seed_iter);
  r.written = calloc(p->n_tensors ? p->n_tensors : 1, sizeof *r.written);
  if (!r.id_of || !r.seed_iter || !r.written) {
    fprintf(stderr, "capuchin-replay: out of memory\n");
    rc = CAP_ENOMEM;
    goto out;
  }
  if (op_times) {
    r.op_t = calloc(4 * (size_t)(p->n_ops ? p->n_ops : 1), sizeof *r.op_t);
    r.op_times = fopen(op_times, "w");
    if (!r.op_t || !r.op_times) {
      fprintf(stderr, "capuchin-replay: --op-times %s: %s\n", op_times,
              r.op_t ? strerror(errno) : "out of memory");
      rc = 64;
      goto out;
    }
    fprintf(r.op_times,
            "iteration\tmode\top\tname\tstart_ns\tbegin_ns\tbody_ns\tend_ns\n");
  }
  if (r.full)
    setenv("CAPUCHIN_VERIFY", "full", 1);
  cap_client_set_recompute(c, on_recompute, &r);
  if (fail_alloc)
    cap_client_fault_alloc(c, (uint32_t)fail_alloc, false);

  if (!json) {
    cap_client_stats_t st;
    cap_client_get_stats(c, &st);
    char said[300];
    printf("# %s: %u ops, %u tensors, budget %.1f MiB, backend %s, daemon %s\n",
           p->model && *p->model ? p->model : trace, p->n_ops, p->n_tensors,
           budget ? budget / 1048576.0 : st.budget_bytes / 1048576.0,
           st.backend, daemon_state(&st, no_daemon, said, sizeof said));
  }
  int64_t total_mm = 0, total_err = 0;
  int status = 0;
  uint32_t prev_version = 0;
  /* How long a measured iteration waits for its plan: 3 s, as a data
   * loader's pause; longer where planning is slow (sanitizer builds). */
  uint32_t plan_wait_ms = 3000;
  const char *wait_env = getenv("CAPUCHIN_REPLAY_PLAN_WAIT_MS");
  uint64_t wait_v;
  if (wait_env && parse_u64(wait_env, &wait_v) == 0 && wait_v <= 600000)
    plan_wait_ms = (uint32_t)wait_v;
  bool infeasible = false;
  for (uint64_t i = 0; i < iterations; i++) {
    row_t row = {0};
    row.prev_plan_version = prev_version;
    rc = run_iteration(&r, &row);
    if (rc < 0) {
      fprintf(stderr, "capuchin-replay: iteration %" PRIu64 ": %s (%s)\n",
              i + 1, cap_strerror(rc), cap_client_last_error(c));
      status = 1;
      break;
    }
    total_mm += row.mismatches;
    total_err += row.errors;
    print_row(&row, json, i == 0, scale);
    prev_version = row.st.plan_version;
    /* A plan from a file names this job's tensors: it goes in once the
     * first iteration has declared them. */
    if (i == 0 && plan_file && (rc = load_plan_file(c, plan_file)) < 0) {
      status = 1;
      break;
    }
    /* Give the daemon a moment to plan after the measured iteration, as a
     * framework's data loader would. */
    if (row.st.mode == CAP_MODE_MEASURED)
      cap_client_wait_plan(c, row.st.plan_version, plan_wait_ms);
    cap_client_stats_t cs;
    cap_client_get_stats(c, &cs);
    if (cs.min_budget_bytes) {
      /* Running on would only repeat passive iterations that do not fit:
       * say what budget would work and stop, as capuchin-sim does. */
      uint64_t asked = budget ? budget : cs.budget_bytes;
      fprintf(stderr,
              "capuchin-replay: no plan fits the budget of %" PRIu64
              " bytes (%.1f MiB); the smallest feasible budget is %" PRIu64
              " bytes (%.1f MiB) (daemon: %s)\n",
              asked, asked / 1048576.0, cs.min_budget_bytes,
              cs.min_budget_bytes / 1048576.0, cs.daemon_message);
      infeasible = true;
      break;
    }
  }
  if (json)
    printf("\n]\n");
  {
    cap_client_stats_t cs;
    cap_client_get_stats(c, &cs);
    char said[300];
    fprintf(stderr,
            "capuchin-replay: %u iterations; daemon %s, %u reconnects; plan "
            "v%u; %" PRIu64 " evictions, %" PRIu64 " fallbacks\n",
            cs.iterations, daemon_state(&cs, no_daemon, said, sizeof said),
            cs.reconnects, cs.plan_version, cs.evictions, cs.fallbacks);
  }
  if (total_mm || total_err) {
    fprintf(stderr, "capuchin-replay: %" PRId64 " integrity mismatches, %" PRId64
                    " op errors\n", total_mm, total_err);
    status = 1;
  }
  if (infeasible)
    status = 2;
  rc = status;
out:
  cap_client_destroy(c);
  free(r.id_of);
  free(r.seed_iter);
  free(r.written);
  free(r.op_t);
  if (r.op_times && fclose(r.op_times) != 0 && rc == 0)
    rc = 1;
  cap_profile_destroy(p);
  return rc < 0 ? 1 : rc;
}
