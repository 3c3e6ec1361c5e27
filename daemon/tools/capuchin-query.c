/*
 * capuchin-query: read-only views of capuchind's database (jobs, profiles,
 * plans, iterations), the memory timeline of a plan as SVG, and a stored
 * profile exported back as a `capuchin-trace 1` file.
 *
 * Opens the database with SQLITE_OPEN_READONLY; WAL lets it run while the
 * daemon writes. Exit status: 0 ok, 1 an error (unknown id, bad file),
 * 64 usage, 66 the database cannot be opened.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/bound.h"
#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/plan.h"
#include "capuchin/profile.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"
#include "query_table.h"
#include "store.h"
#include "svg_placement.h"
#include "svg_timeline.h"

#define EX_USAGE 64
#define EX_NOINPUT 66

static const char usage_text[] =
    "usage: capuchin-query [--db PATH] [--format table|json|csv] COMMAND\n"
    "\n"
    "commands:\n"
    "  jobs                      jobs the daemon has seen\n"
    "  profiles                  stored profiles (measured iterations)\n"
    "  plans [--job ID]          stored plans, or those sent to job ID\n"
    "  plan ID                   every action of plan ID with the tensor's\n"
    "                            bytes and the predicted saving, and the\n"
    "                            least any plan costs at its budget\n"
    "  iterations JOB            measured vs predicted, per iteration\n"
    "  timeline PLAN --svg FILE  memory over the iteration, unmanaged vs\n"
    "                            planned, with the budget line\n"
    "  timeline PLAN --placement --svg FILE\n"
    "                            the arena's addresses over the iteration:\n"
    "                            each block of the plan's placement (placed\n"
    "                            now when the plan has none)\n"
    "  export-trace PROFILE [-o FILE]\n"
    "                            the profile as a capuchin-trace 1 file\n"
    "                            (stdout by default)\n"
    "\n"
    "options:\n"
    "  --db PATH       database (default: /var/lib/capuchin/capuchin.db as\n"
    "                  root, else $XDG_STATE_HOME/capuchin/capuchin.db)\n"
    "  --format F      table (default; MiB and ms), json (raw bytes and ns),\n"
    "                  csv (raw, RFC 4180)\n"
    "  -h, --help      this text\n";

static int usage(const char *fmt, const char *arg) {
  if (fmt) {
    fputs("capuchin-query: ", stderr);
    fprintf(stderr, fmt, arg ? arg : "");
    fputc('\n', stderr);
  }
  fputs(usage_text, stderr);
  return EX_USAGE;
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("capuchin-query: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

static bool parse_id(const char *s, int64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+')
    return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v <= 0)
    return false;
  *out = v;
  return true;
}

typedef struct ctx {
  cap_store_t *store;
  sqlite3 *db;
  cap_qfmt_t fmt;
} ctx_t;

static sqlite3_stmt *prepare(ctx_t *c, const char *sql) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(c->db, sql, -1, &st, NULL) != SQLITE_OK) {
    fail("query failed: %s", sqlite3_errmsg(c->db));
    return NULL;
  }
  return st;
}

/* Run sql (with ?1 bound to id when id > 0) into a table and print it. */
static int print_query(ctx_t *c, const cap_qcol_t *cols, int n_cols,
                       const char *sql, int64_t id) {
  int rc = 1;
  sqlite3_stmt *st = prepare(c, sql);
  cap_qtable_t *t = cap_qtable_create(cols, n_cols);
  if (!st || !t)
    goto out;
  if (id > 0)
    sqlite3_bind_int64(st, 1, id);
  if (cap_qtable_add_rows(t, st) != 0) {
    fail("query failed: %s", sqlite3_errmsg(c->db));
    goto out;
  }
  rc = cap_qtable_print(t, c->fmt, stdout) == 0 ? 0 : 1;
out:
  cap_qtable_destroy(t);
  sqlite3_finalize(st);
  return rc;
}

static bool row_exists(ctx_t *c, const char *table, int64_t id) {
  char sql[96];
  snprintf(sql, sizeof sql, "SELECT 1 FROM %s WHERE id = ?1", table);
  sqlite3_stmt *st = prepare(c, sql);
  if (!st)
    return false;
  sqlite3_bind_int64(st, 1, id);
  bool found = sqlite3_step(st) == SQLITE_ROW;
  sqlite3_finalize(st);
  return found;
}

#define TS(col) "strftime('%Y-%m-%dT%H:%M:%SZ', " col " / 1000, 'unixepoch')"

/* --- jobs, profiles, plans, iterations ------------------------------------ */

static int cmd_jobs(ctx_t *c) {
  static const cap_qcol_t cols[] = {
      {"id", NULL, CAP_QCOL_INT},
      {"name", NULL, CAP_QCOL_TEXT},
      {"hostname", "host", CAP_QCOL_TEXT},
      {"pid", NULL, CAP_QCOL_INT},
      {"uid", NULL, CAP_QCOL_INT},
      {"device", "gpu", CAP_QCOL_INT},
      {"requested_budget_bytes", "requested MiB", CAP_QCOL_BYTES},
      {"granted_budget_bytes", "granted MiB", CAP_QCOL_BYTES},
      {"started", NULL, CAP_QCOL_TEXT},
      {"ended", NULL, CAP_QCOL_TEXT},
      {"status", NULL, CAP_QCOL_TEXT},
      {"iterations", NULL, CAP_QCOL_INT},
      {"plans", NULL, CAP_QCOL_INT},
  };
  return print_query(
      c, cols, (int)(sizeof cols / sizeof cols[0]),
      "SELECT j.id, j.name, j.hostname, j.pid, j.uid, j.device,"
      " j.requested_budget_bytes, j.granted_budget_bytes, " TS(
          "j.started_ms") ", " TS("j.ended_ms") ", j.status,"
                                                " (SELECT count(*) FROM "
                                                "iterations i WHERE i.job_id = "
                                                "j.id),"
                                                " (SELECT count(*) FROM "
                                                "job_plans jp WHERE jp.job_id "
                                                "= j.id)"
                                                " FROM jobs j ORDER BY j.id",
      0);
}

static int cmd_profiles(ctx_t *c) {
  static const cap_qcol_t cols[] = {
      {"id", NULL, CAP_QCOL_INT},
      {"job_id", "job", CAP_QCOL_INT},
      {"signature", NULL, CAP_QCOL_TEXT},
      {"model", NULL, CAP_QCOL_TEXT},
      {"complete", NULL, CAP_QCOL_INT},
      {"tensors", NULL, CAP_QCOL_INT},
      {"ops", NULL, CAP_QCOL_INT},
      {"iter_ns", "iter ms", CAP_QCOL_NS},
      {"persistent_bytes", "persistent MiB", CAP_QCOL_BYTES},
      {"peak_bytes", "peak MiB", CAP_QCOL_BYTES},
      {"plans", NULL, CAP_QCOL_INT},
      {"created", NULL, CAP_QCOL_TEXT},
  };
  return print_query(
      c, cols, (int)(sizeof cols / sizeof cols[0]),
      "SELECT p.id, p.job_id, printf('%016llx', p.signature), p.model,"
      " p.complete, p.n_tensors, p.n_ops, p.iter_ns, p.persistent_bytes,"
      " CASE WHEN p.complete THEN p.persistent_bytes + p.transient_peak_bytes"
      " END,"
      " (SELECT count(*) FROM plans pl WHERE pl.profile_id = p.id), " TS(
          "p.created_ms") " FROM profiles p ORDER BY p.id",
      0);
}

static const cap_qcol_t plan_cols[] = {
    {"id", NULL, CAP_QCOL_INT},
    {"profile_id", "profile", CAP_QCOL_INT},
    {"job_id", "job", CAP_QCOL_INT},
    {"model", NULL, CAP_QCOL_TEXT},
    {"policy", NULL, CAP_QCOL_TEXT},
    {"version", NULL, CAP_QCOL_INT},
    {"budget_bytes", "budget MiB", CAP_QCOL_BYTES},
    {"predicted_iter_ns", "pred. iter ms", CAP_QCOL_NS},
    {"predicted_peak_bytes", "pred. peak MiB", CAP_QCOL_BYTES},
    {"actions", NULL, CAP_QCOL_INT},
    {"h2d_gbps", "H2D GB/s", CAP_QCOL_REAL},
    {"d2h_gbps", "D2H GB/s", CAP_QCOL_REAL},
    {"created", NULL, CAP_QCOL_TEXT},
};
#define PLAN_SELECT                                                            \
  "SELECT pl.id, pl.profile_id, pl.job_id, pr.model, pl.policy, pl.version,"   \
  " pl.budget_bytes, pl.predicted_iter_ns, pl.predicted_peak_bytes,"           \
  " pl.n_actions, pl.h2d_gbps, pl.d2h_gbps, " TS(                              \
      "pl.created_ms") " FROM plans pl JOIN profiles pr ON pr.id = "           \
                       "pl.profile_id"

static int cmd_plans(ctx_t *c, int64_t job) {
  if (job > 0 && !row_exists(c, "jobs", job))
    return fail("no job %" PRId64, job);
  return print_query(
      c, plan_cols, (int)(sizeof plan_cols / sizeof plan_cols[0]),
      job > 0 ? PLAN_SELECT " WHERE pl.job_id = ?1 OR pl.id IN"
                            " (SELECT plan_id FROM job_plans WHERE job_id = ?1)"
                            " ORDER BY pl.id"
              : PLAN_SELECT " ORDER BY pl.id",
      job);
}

static int cmd_iterations(ctx_t *c, int64_t job) {
  static const cap_qcol_t cols[] = {
      {"iteration", NULL, CAP_QCOL_INT},
      {"plan_id", "plan", CAP_QCOL_INT},
      {"plan_version", "ver", CAP_QCOL_INT},
      {"iter_ns", "iter ms", CAP_QCOL_NS},
      {"predicted_iter_ns", "pred. ms", CAP_QCOL_NS},
      {"iter_vs_predicted_pct", "vs pred.", CAP_QCOL_PCT},
      {"peak_bytes", "peak MiB", CAP_QCOL_BYTES},
      {"predicted_peak_bytes", "pred. peak MiB", CAP_QCOL_BYTES},
      {"stall_ns", "stall ms", CAP_QCOL_NS},
      {"stalls", NULL, CAP_QCOL_INT},
      {"swap_out_bytes", "out MiB", CAP_QCOL_BYTES},
      {"swap_in_bytes", "in MiB", CAP_QCOL_BYTES},
      {"recompute_ns", "recompute ms", CAP_QCOL_NS},
      {"op_errors", "errors", CAP_QCOL_INT},
      {"error", "first error", CAP_QCOL_TEXT},
  };
  if (!row_exists(c, "jobs", job))
    return fail("no job %" PRId64, job);
  return print_query(
      c, cols, (int)(sizeof cols / sizeof cols[0]),
      "SELECT i.iteration, i.plan_id, i.plan_version, i.iter_ns,"
      " pl.predicted_iter_ns,"
      " CASE WHEN pl.predicted_iter_ns > 0 THEN"
      "  100.0 * (i.iter_ns - pl.predicted_iter_ns) / pl.predicted_iter_ns END,"
      " i.peak_bytes, pl.predicted_peak_bytes, i.stall_ns, i.n_stalls,"
      " i.swap_out_bytes, i.swap_in_bytes, i.recompute_ns, i.op_errors,"
      " i.error"
      " FROM iterations i LEFT JOIN plans pl ON pl.id = i.plan_id"
      " WHERE i.job_id = ?1 ORDER BY i.iteration, i.id",
      job);
}

/* --- plan ID ------------------------------------------------------------- */

typedef struct loaded {
  cap_plan_t *plan;
  cap_profile_t *profile;
  int64_t profile_id;
  cap_bandwidth_t bw;
  bool bw_assumed; /* the plan stored none: the H100 figures */
} loaded_t;

static void loaded_close(loaded_t *l) {
  cap_plan_destroy(l->plan);
  cap_profile_destroy(l->profile);
}

static int load_plan(ctx_t *c, int64_t id, loaded_t *l) {
  memset(l, 0, sizeof *l);
  int rc = cap_store_plan_load(c->store, id, &l->plan, &l->profile_id, &l->bw);
  if (rc != 0) {
    if (rc == CAP_ENOENT)
      fail("no plan %" PRId64, id);
    else
      fail("%s", cap_store_last_error());
    return rc;
  }
  rc = cap_store_profile_load(c->store, l->profile_id, &l->profile, NULL);
  if (rc != 0) {
    fail("plan %" PRId64 ": profile %" PRId64 ": %s", id, l->profile_id,
         cap_store_last_error());
    loaded_close(l);
    return rc;
  }
  if (!(l->bw.h2d_gbps > 0) || !(l->bw.d2h_gbps > 0)) {
    l->bw = CAP_BANDWIDTH_H100;
    l->bw_assumed = true;
  }
  return 0;
}

static int cmd_plan(ctx_t *c, int64_t id) {
  enum {
    A_SEQ,
    A_TENSOR,
    A_BYTES,
    A_METHOD,
    A_EVICT,
    A_BACK,
    A_TRIGGER,
    A_OPS,
    A_OFF,
    A_OUT,
    A_IN,
    A_RECOMP,
    A_FT,
    A_OFFSET,
    A_N
  };
  static const cap_qcol_t cols[A_N] = {
      [A_SEQ] = {"action", NULL, CAP_QCOL_INT},
      [A_TENSOR] = {"tensor", NULL, CAP_QCOL_INT},
      [A_BYTES] = {"bytes", "MiB", CAP_QCOL_BYTES},
      [A_METHOD] = {"method", NULL, CAP_QCOL_TEXT},
      [A_EVICT] = {"evict_after_access", "evict after", CAP_QCOL_INT},
      [A_BACK] = {"back_access", "back", CAP_QCOL_INT},
      [A_TRIGGER] = {"prefetch_at", "prefetch at", CAP_QCOL_TEXT},
      [A_OPS] = {"recompute_ops", "recompute ops", CAP_QCOL_TEXT},
      [A_OFF] = {"saving_ns", "freed for ms", CAP_QCOL_NS},
      [A_OUT] = {"swap_out_ns", "out ms", CAP_QCOL_NS},
      [A_IN] = {"swap_in_ns", "in ms", CAP_QCOL_NS},
      [A_RECOMP] = {"recompute_ns", "recompute ms", CAP_QCOL_NS},
      [A_FT] = {"free_time_ns", "FT ms", CAP_QCOL_NS},
      [A_OFFSET] = {"return_offset_bytes", "back at MiB", CAP_QCOL_BYTES},
  };
  enum {
    S_ID,
    S_PROFILE,
    S_MODEL,
    S_POLICY,
    S_VERSION,
    S_BUDGET,
    S_PITER,
    S_PPEAK,
    S_UITER,
    S_UPEAK,
    S_NACT,
    S_SWAPB,
    S_RECB,
    S_ARENA,
    S_LEAST,
    S_N
  };
  static const cap_qcol_t scols[S_N] = {
      [S_ID] = {"plan", NULL, CAP_QCOL_INT},
      [S_PROFILE] = {"profile", NULL, CAP_QCOL_INT},
      [S_MODEL] = {"model", NULL, CAP_QCOL_TEXT},
      [S_POLICY] = {"policy", NULL, CAP_QCOL_TEXT},
      [S_VERSION] = {"version", NULL, CAP_QCOL_INT},
      [S_BUDGET] = {"budget_bytes", "budget MiB", CAP_QCOL_BYTES},
      [S_PITER] = {"predicted_iter_ns", "pred. iter ms", CAP_QCOL_NS},
      [S_PPEAK] = {"predicted_peak_bytes", "pred. peak MiB", CAP_QCOL_BYTES},
      [S_UITER] = {"unmanaged_iter_ns", "unmanaged ms", CAP_QCOL_NS},
      [S_UPEAK] = {"unmanaged_peak_bytes", "unmanaged peak MiB",
                   CAP_QCOL_BYTES},
      [S_NACT] = {"actions", NULL, CAP_QCOL_INT},
      [S_SWAPB] = {"swap_bytes", "swapped MiB", CAP_QCOL_BYTES},
      [S_RECB] = {"recompute_bytes", "recomputed MiB", CAP_QCOL_BYTES},
      [S_ARENA] = {"arena_bytes", "arena MiB", CAP_QCOL_BYTES},
      [S_LEAST] = {"least_extra_ns", "least extra ms", CAP_QCOL_NS},
  };
  loaded_t l;
  int rc = load_plan(c, id, &l);
  if (rc != 0)
    return 1;
  rc = 1;
  cap_qtable_t *t = cap_qtable_create(cols, A_N);
  cap_qtable_t *sum = cap_qtable_create(scols, S_N);
  char *buf = NULL;
  uint64_t *back_at = NULL;
  if (!t || !sum)
    goto out;
  const cap_profile_t *p = l.profile;
  const cap_plan_t *plan = l.plan;
  uint64_t swap_bytes = 0, rec_bytes = 0;
  /* With a placement: where each action's tensor comes back (the block its
   * swap-in or recompute makes). */
  if (plan->n_blocks && plan->n_actions) {
    back_at = malloc(plan->n_actions * sizeof *back_at);
    if (!back_at)
      goto out;
    for (uint32_t i = 0; i < plan->n_actions; i++)
      back_at[i] = UINT64_MAX;
    for (uint32_t i = 0; i < plan->n_blocks; i++) {
      const cap_block_t *b = &plan->blocks[i];
      if (b->action < plan->n_actions && b->tensor == plan->actions[b->action].tensor &&
          (b->kind == CAP_RESIDENCY_SWAPPED_IN || b->kind == CAP_RESIDENCY_RECOMPUTED))
        back_at[b->action] = b->offset;
    }
  }
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->tensor >= p->n_tensors) {
      fail("plan %" PRId64 ": action %u names tensor %u, profile has %u", id, i,
           a->tensor, p->n_tensors);
      goto out;
    }
    uint64_t bytes = p->tensors[a->tensor].bytes;
    uint32_t ev = cap_profile_access_op(p, a->tensor, a->evict_after_access);
    uint32_t back =
        cap_profile_access_op(p, a->tensor, a->evict_after_access + 1);
    if (cap_qtable_row(t) != 0)
      goto out;
    cap_qtable_set_int(t, A_SEQ, i);
    cap_qtable_set_int(t, A_TENSOR, a->tensor);
    cap_qtable_set_int(t, A_BYTES, (int64_t)bytes);
    cap_qtable_set_int(t, A_EVICT, a->evict_after_access);
    if (back != CAP_NONE)
      cap_qtable_set_int(t, A_BACK, a->evict_after_access + 1);
    if (back_at && back_at[i] != UINT64_MAX)
      cap_qtable_set_int(t, A_OFFSET, (int64_t)back_at[i]);
    int64_t off = -1;
    if (ev != CAP_NONE && back != CAP_NONE) {
      off = p->ops[back].start_ns - p->ops[ev].end_ns;
      cap_qtable_set_int(t, A_OFF, off);
    }
    if (a->method == CAP_METHOD_SWAP) {
      char trig[64];
      int64_t out_ns = cap_copy_ns(bytes, l.bw.d2h_gbps);
      int64_t in_ns = cap_copy_ns(bytes, l.bw.h2d_gbps);
      swap_bytes += bytes;
      cap_qtable_set_text(t, A_METHOD,
                          a->flags & CAP_ACTION_SYNC_OUT ? "swap (sync out)"
                                                         : "swap");
      if (a->prefetch_tensor == CAP_NONE)
        snprintf(trig, sizeof trig, "on demand");
      else
        snprintf(trig, sizeof trig, "tensor %u access %u", a->prefetch_tensor,
                 a->prefetch_access);
      cap_qtable_set_text(t, A_TRIGGER, trig);
      cap_qtable_set_int(t, A_OUT, out_ns);
      cap_qtable_set_int(t, A_IN, in_ns);
      if (off >= 0)
        cap_qtable_set_int(t, A_FT, off - out_ns - in_ns);
    } else {
      const uint32_t *ops = cap_action_recompute_ops(plan, a);
      int64_t rns = 0;
      size_t len = 0;
      free(buf);
      buf = malloc((size_t)a->n_recompute * 11 + 1);
      if (!buf)
        goto out;
      buf[0] = '\0';
      for (uint32_t k = 0; k < a->n_recompute; k++) {
        if (ops[k] < p->n_ops)
          rns += p->ops[ops[k]].end_ns - p->ops[ops[k]].start_ns;
        len += (size_t)sprintf(buf + len, k ? ",%u" : "%u", ops[k]);
      }
      rec_bytes += bytes;
      cap_qtable_set_text(t, A_METHOD,
                          cap_action_is_release(a) ? "release" : "recompute");
      cap_qtable_set_text(t, A_OPS, buf);
      cap_qtable_set_int(t, A_RECOMP, rns);
    }
  }
  if (cap_qtable_row(sum) != 0)
    goto out;
  cap_qtable_set_int(sum, S_ID, id);
  cap_qtable_set_int(sum, S_PROFILE, l.profile_id);
  cap_qtable_set_text(sum, S_MODEL, p->model);
  cap_qtable_set_text(sum, S_POLICY, plan->policy);
  cap_qtable_set_int(sum, S_VERSION, plan->version);
  cap_qtable_set_int(sum, S_BUDGET, (int64_t)plan->budget_bytes);
  cap_qtable_set_int(sum, S_PITER, plan->predicted_iter_ns);
  cap_qtable_set_int(sum, S_PPEAK, (int64_t)plan->predicted_peak_bytes);
  cap_qtable_set_int(sum, S_UITER, p->iter_ns);
  cap_qtable_set_int(
      sum, S_UPEAK,
      (int64_t)(p->persistent_bytes + cap_profile_transient_peak(p)));
  cap_qtable_set_int(sum, S_NACT, plan->n_actions);
  cap_qtable_set_int(sum, S_SWAPB, (int64_t)swap_bytes);
  cap_qtable_set_int(sum, S_RECB, (int64_t)rec_bytes);
  if (plan->n_blocks)
    cap_qtable_set_int(sum, S_ARENA, (int64_t)plan->arena_bytes);
  /* what no plan at this budget avoids, whatever it may evict */
  cap_window_bound_t wb;
  if (cap_window_bound(p, plan->budget_bytes, true, l.bw.h2d_gbps, &wb) != 0) {
    fail("plan %" PRId64 ": cannot bound its budget's cost", id);
    goto out;
  }
  cap_qtable_set_int(sum, S_LEAST, wb.extra_ns);

  switch (c->fmt) {
  case CAP_QFMT_TABLE:
    cap_qtable_print(sum, c->fmt, stdout);
    printf("\nleast extra: no plan at this budget runs less over the unmanaged "
           "iteration (window bound, capuchin/bound.h)\n"
           "saving: the tensor's bytes are off the device for \"freed for "
           "ms\"; FT = that time minus the swap-out and swap-in at %.1f/%.1f "
           "GB/s%s\n\n",
           l.bw.d2h_gbps, l.bw.h2d_gbps,
           l.bw_assumed ? " (assumed: the plan stored no bandwidths)" : "");
    rc = cap_qtable_print(t, c->fmt, stdout) == 0 ? 0 : 1;
    break;
  case CAP_QFMT_JSON:
    fputs("{\"plan\": ", stdout);
    cap_qtable_print_json_row(sum, 0, stdout);
    fputs(",\n \"actions\": ", stdout);
    rc = cap_qtable_print(t, c->fmt, stdout) == 0 ? 0 : 1;
    fputs("}\n", stdout);
    break;
  case CAP_QFMT_CSV: /* one table per CSV file: the actions */
    rc = cap_qtable_print(t, c->fmt, stdout) == 0 ? 0 : 1;
    break;
  }
out:
  free(buf);
  free(back_at);
  cap_qtable_destroy(t);
  cap_qtable_destroy(sum);
  loaded_close(&l);
  return rc;
}

/* --- timeline PLAN --svg FILE -------------------------------------------- */

static void mib(char *buf, size_t len, uint64_t bytes) {
  snprintf(buf, len, "%.0f MiB", (double)bytes / 1048576.0);
}

static int cmd_timeline(ctx_t *c, int64_t id, const char *svg) {
  loaded_t l;
  cap_curve_t um = {0};
  cap_sim_result_t sim;
  bool have_sim = false;
  FILE *f = NULL;
  int rc = 1;
  memset(&sim, 0, sizeof sim);
  if (load_plan(c, id, &l) != 0)
    return 1;
  char err[256];
  if (cap_plan_validate(l.plan, l.profile, err, sizeof err) != 0) {
    fail("plan %" PRId64 " is not valid for its profile: %s", id, err);
    goto out;
  }
  if (cap_curve_compute(l.profile, &um) != 0) {
    fail("plan %" PRId64 ": computing the memory curve failed", id);
    goto out;
  }
  int r = cap_sim_run(l.profile, l.plan, &l.bw, &sim);
  if (r != 0) {
    fail("plan %" PRId64 ": simulation failed: %s", id, cap_strerror(r));
    goto out;
  }
  have_sim = true;

  char title[256], sub[512], a[32], b[32], bud[32];
  uint32_t n_swap = 0, n_rec = 0, n_rel = 0;
  for (uint32_t i = 0; i < l.plan->n_actions; i++) {
    const cap_action_t *act = &l.plan->actions[i];
    *(act->method == CAP_METHOD_SWAP ? &n_swap
      : cap_action_is_release(act)   ? &n_rel
                                     : &n_rec) += 1;
  }
  mib(bud, sizeof bud, l.plan->budget_bytes);
  snprintf(title, sizeof title,
           "%s \xe2\x80\x94 plan %" PRId64 " (%s v%u), budget %s",
           l.profile->model[0] ? l.profile->model : "model", id, l.plan->policy,
           l.plan->version, bud);
  mib(a, sizeof a, um.peak_bytes);
  mib(b, sizeof b, sim.peak_bytes);
  double slow = l.profile->iter_ns > 0
                    ? 100.0 * (double)(sim.iter_ns - l.profile->iter_ns) /
                          (double)l.profile->iter_ns
                    : 0;
  snprintf(sub, sizeof sub,
           "unmanaged: peak %s, %.1f ms  \xc2\xb7  planned: peak %s, %.1f ms "
           "(%+.1f %%)  \xc2\xb7  %u swaps, %u recomputes, %u releases  "
           "\xc2\xb7  H2D %.1f / D2H %.1f GB/s%s",
           a, (double)l.profile->iter_ns / 1e6, b, (double)sim.iter_ns / 1e6,
           slow, n_swap, n_rec, n_rel, l.bw.h2d_gbps, l.bw.d2h_gbps,
           l.bw_assumed ? " (assumed)" : "");
  cap_svg_timeline_t tl = {
      .title = title,
      .subtitle = sub,
      .unmanaged = &um,
      .unmanaged_end_ns = l.profile->iter_ns,
      .planned = &sim.curve,
      .planned_end_ns = sim.iter_ns,
      .budget_bytes = l.plan->budget_bytes,
      .persistent_bytes = l.profile->persistent_bytes,
  };
  if (!(f = fopen(svg, "w"))) {
    fail("%s: %s", svg, strerror(errno));
    goto out;
  }
  r = cap_svg_timeline_write(f, &tl);
  if (fclose(f) != 0 || r != 0) {
    f = NULL;
    fail("%s: write failed", svg);
    goto out;
  }
  f = NULL;

  static const cap_qcol_t cols[] = {
      {"svg", NULL, CAP_QCOL_TEXT},
      {"plan", NULL, CAP_QCOL_INT},
      {"budget_bytes", "budget MiB", CAP_QCOL_BYTES},
      {"unmanaged_peak_bytes", "unmanaged peak MiB", CAP_QCOL_BYTES},
      {"unmanaged_iter_ns", "unmanaged ms", CAP_QCOL_NS},
      {"planned_peak_bytes", "planned peak MiB", CAP_QCOL_BYTES},
      {"planned_iter_ns", "planned ms", CAP_QCOL_NS},
      {"stall_ns", "stall ms", CAP_QCOL_NS},
  };
  cap_qtable_t *t =
      cap_qtable_create(cols, (int)(sizeof cols / sizeof cols[0]));
  if (!t || cap_qtable_row(t) != 0) {
    cap_qtable_destroy(t);
    goto out;
  }
  cap_qtable_set_text(t, 0, svg);
  cap_qtable_set_int(t, 1, id);
  cap_qtable_set_int(t, 2, (int64_t)l.plan->budget_bytes);
  cap_qtable_set_int(t, 3, (int64_t)um.peak_bytes);
  cap_qtable_set_int(t, 4, l.profile->iter_ns);
  cap_qtable_set_int(t, 5, (int64_t)sim.peak_bytes);
  cap_qtable_set_int(t, 6, sim.iter_ns);
  cap_qtable_set_int(t, 7, sim.stall_ns);
  rc = cap_qtable_print(t, c->fmt, stdout) == 0 ? 0 : 1;
  cap_qtable_destroy(t);
out:
  if (have_sim)
    cap_sim_result_close(&sim);
  cap_curve_close(&um);
  loaded_close(&l);
  return rc;
}

/* --- timeline PLAN --placement --svg FILE -------------------------------- */

static int cmd_placement(ctx_t *c, int64_t id, const char *svg) {
  loaded_t l;
  if (load_plan(c, id, &l) != 0)
    return 1;
  int rc = 1;
  FILE *f = NULL;
  char err[256];
  const cap_plan_t *plan = l.plan;
  bool placed_now = plan->n_blocks == 0;
  if (cap_plan_validate(plan, l.profile, err, sizeof err) != 0) {
    fail("plan %" PRId64 " is not valid for its profile: %s", id, err);
    goto out;
  }
  if (placed_now) { /* a plan from before placement: place it here */
    cap_plan_placement_t pp;
    int r = cap_plan_place(l.profile, plan, &l.bw, CAP_PLACE_BEST, &pp);
    if (!r)
      r = cap_plan_attach_placement(l.plan, &pp);
    cap_plan_placement_close(&pp);
    if (r) {
      fail("plan %" PRId64 ": placing it failed: %s", id, cap_strerror(r));
      goto out;
    }
  }
  uint64_t outside = cap_plan_outside_arena(plan, l.profile), live_peak = 0;
  int64_t end_ns = l.profile->iter_ns;
  cap_sim_result_t sim;
  if (cap_sim_run(l.profile, plan, &l.bw, &sim) == 0) {
    end_ns = sim.iter_ns;
    live_peak = sim.peak_bytes > outside ? sim.peak_bytes - outside : 0;
    cap_sim_result_close(&sim);
  }
  uint64_t room = plan->budget_bytes > outside ? plan->budget_bytes - outside : 0;
  char title[256], sub[512], a[32], b[32];
  mib(a, sizeof a, plan->arena_bytes);
  mib(b, sizeof b, live_peak);
  snprintf(title, sizeof title,
           "%s \xe2\x80\x94 plan %" PRId64 " (%s v%u): addresses over the "
           "iteration",
           l.profile->model[0] ? l.profile->model : "model", id, plan->policy,
           plan->version);
  snprintf(sub, sizeof sub,
           "%u blocks in an arena of %s for a live peak of %s (%.4f)  "
           "\xc2\xb7  %.0f MiB outside it (persistent)%s",
           plan->n_blocks, a, b,
           live_peak ? (double)plan->arena_bytes / (double)live_peak : 1.0,
           (double)outside / 1048576.0,
           placed_now ? "  \xc2\xb7  placed now: the stored plan has none" : "");
  cap_svg_placement_t pic = {.title = title, .subtitle = sub,
                             .blocks = plan->blocks, .n = plan->n_blocks,
                             .arena_bytes = plan->arena_bytes,
                             .room_bytes = room, .end_ns = end_ns};
  if (!plan->n_blocks) {
    fail("plan %" PRId64 " makes no block: nothing to draw", id);
    goto out;
  }
  if (!(f = fopen(svg, "w"))) {
    fail("%s: %s", svg, strerror(errno));
    goto out;
  }
  int r = cap_svg_placement_write(f, &pic);
  if (fclose(f) != 0 || r != 0) {
    fail("%s: write failed", svg);
    goto out;
  }
  static const cap_qcol_t cols[] = {
      {"svg", NULL, CAP_QCOL_TEXT},
      {"plan", NULL, CAP_QCOL_INT},
      {"blocks", NULL, CAP_QCOL_INT},
      {"arena_bytes", "arena MiB", CAP_QCOL_BYTES},
      {"live_peak_bytes", "live peak MiB", CAP_QCOL_BYTES},
      {"outside_bytes", "outside MiB", CAP_QCOL_BYTES},
      {"budget_bytes", "budget MiB", CAP_QCOL_BYTES},
      {"placed_now", "placed now", CAP_QCOL_INT},
  };
  cap_qtable_t *t = cap_qtable_create(cols, (int)(sizeof cols / sizeof cols[0]));
  if (!t || cap_qtable_row(t) != 0) {
    cap_qtable_destroy(t);
    goto out;
  }
  cap_qtable_set_text(t, 0, svg);
  cap_qtable_set_int(t, 1, id);
  cap_qtable_set_int(t, 2, plan->n_blocks);
  cap_qtable_set_int(t, 3, (int64_t)plan->arena_bytes);
  cap_qtable_set_int(t, 4, (int64_t)live_peak);
  cap_qtable_set_int(t, 5, (int64_t)outside);
  cap_qtable_set_int(t, 6, (int64_t)plan->budget_bytes);
  cap_qtable_set_int(t, 7, placed_now);
  rc = cap_qtable_print(t, c->fmt, stdout) == 0 ? 0 : 1;
  cap_qtable_destroy(t);
out:
  loaded_close(&l);
  return rc;
}

/* --- export-trace PROFILE ------------------------------------------------ */

static int cmd_export(ctx_t *c, int64_t id, const char *path) {
  cap_profile_t *p = NULL;
  int rc = cap_store_profile_load(c->store, id, &p, NULL);
  if (rc != 0)
    return fail("%s", cap_store_last_error());
  FILE *f = path ? fopen(path, "w") : stdout;
  if (!f) {
    fail("%s: %s", path, strerror(errno));
    cap_profile_destroy(p);
    return 1;
  }
  rc = cap_trace_write(f, p);
  if (fflush(f) != 0 || ferror(f))
    rc = CAP_EIO;
  if (path && fclose(f) != 0)
    rc = CAP_EIO;
  cap_profile_destroy(p);
  if (rc != 0)
    return fail("%s: writing the trace failed: %s", path ? path : "stdout",
                cap_strerror(rc));
  return 0;
}

/* --- main ---------------------------------------------------------------- */

int main(int argc, char **argv) {
  const char *db_path = NULL, *svg = NULL, *out = NULL;
  bool placement = false;
  char def_path[4096];
  int64_t job = 0;
  ctx_t c = {.fmt = CAP_QFMT_TABLE};
  static const struct option opts[] = {
      {"db", required_argument, NULL, 'd'},
      {"format", required_argument, NULL, 'f'},
      {"job", required_argument, NULL, 'j'},
      {"svg", required_argument, NULL, 's'},
      {"placement", no_argument, NULL, 'P'},
      {"output", required_argument, NULL, 'o'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  opterr = 0;
  int opt;
  while ((opt = getopt_long(argc, argv, ":ho:", opts, NULL)) != -1) {
    switch (opt) {
    case 'd':
      db_path = optarg;
      break;
    case 'f':
      if (strcmp(optarg, "table") == 0)
        c.fmt = CAP_QFMT_TABLE;
      else if (strcmp(optarg, "json") == 0)
        c.fmt = CAP_QFMT_JSON;
      else if (strcmp(optarg, "csv") == 0)
        c.fmt = CAP_QFMT_CSV;
      else
        return usage("unknown format '%s' (table, json or csv)", optarg);
      break;
    case 'j':
      if (!parse_id(optarg, &job))
        return usage("--job wants a positive job id, not '%s'", optarg);
      break;
    case 's':
      svg = optarg;
      break;
    case 'P':
      placement = true;
      break;
    case 'o':
      out = optarg;
      break;
    case 'h':
      fputs(usage_text, stdout);
      return 0;
    case ':':
      return usage("option %s needs a value", argv[optind - 1]);
    default:
      return usage("unknown option %s", argv[optind - 1]);
    }
  }
  if (optind >= argc)
    return usage("no command given", NULL);
  const char *cmd = argv[optind];
  int nargs = argc - optind - 1;
  char **args = argv + optind + 1;
  int64_t id = 0;

  /* Check the command line completely before touching the database. */
  bool needs_id = strcmp(cmd, "plan") == 0 || strcmp(cmd, "iterations") == 0 ||
                  strcmp(cmd, "timeline") == 0 ||
                  strcmp(cmd, "export-trace") == 0;
  bool known = needs_id || strcmp(cmd, "jobs") == 0 ||
               strcmp(cmd, "profiles") == 0 || strcmp(cmd, "plans") == 0;
  if (!known)
    return usage("unknown command '%s'", cmd);
  if (needs_id) {
    if (nargs != 1)
      return usage("'%s' takes one id", cmd);
    if (!parse_id(args[0], &id))
      return usage("not an id: '%s'", args[0]);
  } else if (nargs != 0) {
    return usage("unexpected argument '%s'", args[0]);
  }
  if (job && strcmp(cmd, "plans") != 0)
    return usage("--job applies to 'plans' only", NULL);
  if (strcmp(cmd, "timeline") == 0 && !svg)
    return usage("timeline needs --svg FILE", NULL);
  if (svg && strcmp(cmd, "timeline") != 0)
    return usage("--svg applies to 'timeline' only", NULL);
  if (placement && strcmp(cmd, "timeline") != 0)
    return usage("--placement applies to 'timeline' only", NULL);
  if (out && strcmp(cmd, "export-trace") != 0)
    return usage("-o applies to 'export-trace' only", NULL);

  if (!db_path) {
    if (cap_store_default_path(def_path, sizeof def_path) != 0) {
      fprintf(stderr, "capuchin-query: %s\n", cap_store_last_error());
      return EX_NOINPUT;
    }
    db_path = def_path;
  }
  if (cap_store_open(db_path, CAP_STORE_READONLY, &c.store) != 0) {
    fprintf(stderr, "capuchin-query: %s\n", cap_store_last_error());
    return EX_NOINPUT;
  }
  c.db = cap_store_db(c.store);

  int rc;
  if (strcmp(cmd, "jobs") == 0)
    rc = cmd_jobs(&c);
  else if (strcmp(cmd, "profiles") == 0)
    rc = cmd_profiles(&c);
  else if (strcmp(cmd, "plans") == 0)
    rc = cmd_plans(&c, job);
  else if (strcmp(cmd, "plan") == 0)
    rc = cmd_plan(&c, id);
  else if (strcmp(cmd, "iterations") == 0)
    rc = cmd_iterations(&c, id);
  else if (strcmp(cmd, "timeline") == 0)
    rc = placement ? cmd_placement(&c, id, svg) : cmd_timeline(&c, id, svg);
  else
    rc = cmd_export(&c, id, out);
  cap_store_close(c.store);
  if (fflush(stdout) != 0 && rc == 0)
    rc = fail("writing the output failed: %s", strerror(errno));
  return rc;
}
