/*
 * One plan semantics (docs/plan-semantics.md): each former failure of the
 * planner, simulator and executor disagreeing is a small hand-made job here.
 * Each plan is judged twice, by the policy library (cap_plan_validate, then
 * cap_sim_run) and by the client executing it on the sim backend without a
 * daemon; the verdicts must agree, and an executor that refuses says why.
 *
 * The job: W a weight, activations A..G (ids 1..7), 8 MiB each.
 *   op0: W -> A      op1: A -> B      op2: B -> C      op3: C -> D
 *   op4: D, B -> E   op5: E, A -> F   op6: F, C -> G
 * B's back-access is op4, A's op5, C's op6. In the "freed" job op5 reads E
 * alone and A is freed right after op2.
 */
#include <stdlib.h>
#include <string.h>

#include "cap_test.h"
#include "capuchin/client.h"
#include "capuchin/plan.h"
#include "capuchin/sim.h"
#include "client_impl.h" /* cap__client_load_plan: a plan without JSON */

#define MIB (1u << 20)
/* Setup that cannot go on when it fails (REQUIRE is for void tests). */
#define MUST(cond)                                                             \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: MUST failed: %s\n", __FILE__, __LINE__, #cond);  \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)
enum { NT = 8, NOPS = 7 };
#define OP_NS 200000 /* 0.2 ms of trace time per op */

typedef struct job_spec {
  uint32_t in[NOPS][2];
  uint32_t n_in[NOPS];
  bool a_freed_early; /* A freed after op2 (and op5 does not read it) */
} job_spec_t;

static const job_spec_t normal_job = {
    {{0}, {1}, {2}, {3}, {4, 2}, {5, 1}, {6, 3}}, {1, 1, 1, 1, 2, 2, 2}, false};
static const job_spec_t freed_job = {
    {{0}, {1}, {2}, {3}, {4, 2}, {5}, {6, 3}}, {1, 1, 1, 1, 2, 1, 2}, true};

static uint64_t tensor_bytes(uint32_t id) { return id == 0 ? MIB : 8 * MIB; }

/* Frees: A after op2 in the freed job, everything else after op6. */
static int64_t free_time(const job_spec_t *j, uint32_t id) {
  if (id == 1 && j->a_freed_early)
    return 3 * OP_NS;
  return NOPS * OP_NS;
}

static cap_profile_t *profile_of(const job_spec_t *j) {
  cap_profile_t *p = cap_profile_create();
  MUST(p);
  for (uint32_t t = 0; t < NT; t++)
    MUST(cap_profile_add_tensor(p, t, tensor_bytes(t),
                                   t ? CAP_KIND_ACTIVATION : CAP_KIND_PARAM) ==
            0);
  for (uint32_t s = 0; s < NOPS; s++) {
    uint32_t out = s + 1;
    char name[16];
    snprintf(name, sizeof name, "op.%u", s);
    MUST(cap_profile_add_op(p, s, (int64_t)s * OP_NS, (int64_t)(s + 1) * OP_NS,
                               name, j->in[s], j->n_in[s], &out, 1) == 0);
  }
  /* frees sorted by time: A first when it goes early */
  if (j->a_freed_early)
    MUST(cap_profile_add_free(p, free_time(j, 1), 1) == 0);
  for (uint32_t t = 1; t < NT; t++)
    if (!(t == 1 && j->a_freed_early))
      MUST(cap_profile_add_free(p, free_time(j, t), t) == 0);
  MUST(cap_profile_finish(p) == 0);
  return p;
}

/* --- the policy library's verdict ----------------------------------------- */

static bool policy_accepts(const cap_plan_t *plan, const cap_profile_t *p,
                           char *why, size_t len) {
  why[0] = '\0';
  if (cap_plan_validate(plan, p, why, len) != 0)
    return false;
  cap_sim_result_t r;
  int rc = cap_sim_run(p, plan, &CAP_BANDWIDTH_H100, &r);
  CHECK_EQ(rc, 0); /* validated: the simulator must run it */
  cap_sim_result_close(&r);
  return rc == 0;
}

/* --- the executor's verdict ------------------------------------------------ */

typedef struct run {
  cap_client_t *c;
  const job_spec_t *j;
  uint32_t iter;
  uint32_t seed_iter[NT];
  int64_t mismatches;
} run_t;

static uint64_t seed(uint32_t id, uint32_t it) { return ((uint64_t)id << 32) | it; }

static int recompute_cb(void *user, uint32_t seq, const char *name,
                        const uint32_t *in_ids, void *const *in_ptrs,
                        uint32_t n_in, const uint32_t *out_ids,
                        void *const *out_ptrs, uint32_t n_out) {
  run_t *r = user;
  (void)seq;
  (void)name;
  for (uint32_t i = 0; i < n_in; i++)
    r->mismatches += cap_client_pattern_check(
        r->c, in_ptrs[i], tensor_bytes(in_ids[i]),
        seed(in_ids[i], r->seed_iter[in_ids[i]]));
  for (uint32_t i = 0; i < n_out; i++)
    cap_client_pattern_fill(r->c, out_ptrs[i], tensor_bytes(out_ids[i]),
                            seed(out_ids[i], r->seed_iter[out_ids[i]]));
  return 0;
}

static void run_iteration(run_t *r, cap_iter_stats_t *st, bool free_a_late) {
  cap_client_t *c = r->c;
  const job_spec_t *j = r->j;
  MUST(cap_client_iteration_begin(c) == 0);
  r->iter++;
  for (uint32_t t = 1; t < NT; t++) {
    uint32_t id;
    MUST(cap_client_declare(c, tensor_bytes(t), &id) == 0);
    MUST(id == t);
  }
  bool a_freed = false;
  static const char *names[NOPS] = {"op.0", "op.1", "op.2", "op.3",
                                    "op.4", "op.5", "op.6"};
  for (uint32_t s = 0; s < NOPS; s++) {
    void *in[2], *out[1];
    uint32_t o = s + 1;
    if (cap_client_op_begin(c, names[s], j->in[s], j->n_in[s], &o, 1, in, out) ==
        0) {
      for (uint32_t i = 0; i < j->n_in[s]; i++) {
        uint32_t id = j->in[s][i];
        r->mismatches += cap_client_pattern_check(c, in[i], tensor_bytes(id),
                                                  seed(id, r->seed_iter[id]));
      }
      r->seed_iter[o] = r->iter;
      cap_client_pattern_fill(c, out[0], tensor_bytes(o), seed(o, r->iter));
      cap_client_compute(c, OP_NS);
      MUST(cap_client_op_end(c) == 0);
    }
    if (j->a_freed_early && !free_a_late &&
        free_time(j, 1) <= (int64_t)(s + 1) * OP_NS && !a_freed) {
      CHECK_EQ(cap_client_free(c, 1), 0);
      a_freed = true;
    }
  }
  for (uint32_t t = 1; t < NT; t++)
    if (!(t == 1 && a_freed))
      cap_client_free(c, t);
  MUST(cap_client_iteration_end(c, st) == 0);
}

/* Iteration 1 passive (the lineage), iteration 2 guided by the plan. The
 * client walks the plan over iteration 1 when it installs it and swaps
 * instead what cannot run as written (refused_actions, plan_note); what
 * only iteration 2 breaks (log_differs: A freed late in iteration 1) fails
 * when the list runs (op_errors, first_error). Either is a refusal. */
static bool executor_accepts(const job_spec_t *j, const cap_plan_t *plan,
                             bool log_differs, char *why, size_t len) {
  run_t r;
  memset(&r, 0, sizeof r);
  r.j = j;
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.budget_bytes = 256 * MIB;
  cfg.time_scale = 0.05;
  cfg.no_daemon = true;
  MUST(cap_client_create(&cfg, &r.c) == 0);
  cap_client_set_recompute(r.c, recompute_cb, &r);
  uint32_t w;
  void *wp;
  MUST(cap_client_register(r.c, tensor_bytes(0), CAP_KIND_PARAM, &w, &wp) == 0);
  cap_client_pattern_fill(r.c, wp, tensor_bytes(0), seed(0, 0));
  cap_iter_stats_t st;
  run_iteration(&r, &st, log_differs);
  CHECK_EQ(st.op_errors, 0);
  MUST(cap__client_load_plan(r.c, plan) == 0);
  run_iteration(&r, &st, false);
  CHECK_EQ(st.mode, CAP_MODE_GUIDED);
  if (st.mode != CAP_MODE_GUIDED)
    fprintf(stderr, "  the plan was not installed: %s\n",
            cap_client_last_error(r.c));
  snprintf(why, len, "%s", st.op_errors ? st.first_error : st.plan_note);
  bool ok = st.op_errors == 0 && st.refused_actions == 0 && r.mismatches == 0;
  if (!ok && r.mismatches && st.op_errors == 0)
    fprintf(stderr, "  %lld mismatches without an error\n",
            (long long)r.mismatches);
  cap_client_destroy(r.c);
  return ok;
}

/* Both must give `expect`; a refusal must say `reason`. */
static void judge_run(const char *what, const job_spec_t *j,
                      const cap_plan_t *plan, bool log_differs, bool expect,
                      const char *reason) {
  cap_profile_t *p = profile_of(j);
  char pw[512], xw[512];
  bool pv = policy_accepts(plan, p, pw, sizeof pw);
  bool xv = executor_accepts(j, plan, log_differs, xw, sizeof xw);
  fprintf(stderr, "%-44s policy %-7s executor %-7s\n", what,
          pv ? "accepts" : "refuses", xv ? "runs" : "fails");
  if (!pv)
    fprintf(stderr, "    policy:   %s\n", pw);
  if (!xv)
    fprintf(stderr, "    executor: %s\n", xw);
  CHECK_EQ(pv, expect);
  CHECK_EQ(xv, expect);
  if (!expect) {
    CHECK(strstr(pw, reason) != NULL);
    CHECK(strstr(xw, reason) != NULL);
  }
  cap_profile_destroy(p);
}

static void judge(const char *what, const job_spec_t *j, const cap_plan_t *plan,
                  bool expect, const char *reason) {
  judge_run(what, j, plan, false, expect, reason);
}

/* B's list reads A, which the plan dropped: without A's op in B's list the
 * plan counts on an implicit nested restore. */
static void test_nested_dropped_source(void) {
  cap_plan_t *plan = cap_plan_create("test", 256 * MIB);
  uint32_t la[] = {0}, lb[] = {1};
  MUST(cap_plan_add_recompute(plan, 1, 2, la, 1) == 0); /* A after op1 */
  MUST(cap_plan_add_recompute(plan, 2, 2, lb, 1) == 0); /* B after op2 */
  judge("dropped source, implicit", &normal_job, plan, false,
        "op 1 (op.1) needs tensor 1, dropped by the plan");
  cap_plan_destroy(plan);

  /* Explicit: B's list recomputes A first, which restores A for good (its
   * own list does not run at op5). */
  plan = cap_plan_create("test", 256 * MIB);
  uint32_t lb2[] = {0, 1};
  MUST(cap_plan_add_recompute(plan, 1, 2, la, 1) == 0);
  MUST(cap_plan_add_recompute(plan, 2, 2, lb2, 2) == 0);
  judge("dropped source, recomputed in the list", &normal_job, plan, true, "");
  cap_plan_destroy(plan);
}

/* B's list reads A, which the plan swapped out with its prefetch only at
 * A's own back-access (op5), after B's (op4). */
static void test_swapped_source(void) {
  cap_plan_t *plan = cap_plan_create("test", 256 * MIB);
  uint32_t lb[] = {1};
  MUST(cap_plan_add_swap(plan, 1, 2, CAP_NONE, 0, 0) == 0); /* on demand */
  MUST(cap_plan_add_recompute(plan, 2, 2, lb, 1) == 0);
  judge("swapped source, fetched at its own access", &normal_job, plan, false,
        "op 1 (op.1) needs tensor 1, swapped out, with no prefetch issued by "
        "then");
  cap_plan_destroy(plan);

  /* Explicit: A's prefetch is triggered when op3 starts (C's access 2). */
  plan = cap_plan_create("test", 256 * MIB);
  MUST(cap_plan_add_swap(plan, 1, 2, 3, 2, 0) == 0);
  MUST(cap_plan_add_recompute(plan, 2, 2, lb, 1) == 0);
  judge("swapped source, prefetched before", &normal_job, plan, true, "");
  cap_plan_destroy(plan);

  /* A prefetch triggered by the back-access op itself is issued as that op
   * starts, after its recompute lists: too late for them. */
  plan = cap_plan_create("test", 256 * MIB);
  MUST(cap_plan_add_swap(plan, 1, 2, 4, 2, 0) == 0); /* D's access 2: op4 */
  MUST(cap_plan_add_recompute(plan, 2, 2, lb, 1) == 0);
  judge("swapped source, prefetched by the back-access", &normal_job, plan,
        false,
        "op 1 (op.1) needs tensor 1, swapped out, with no prefetch issued by "
        "then");
  cap_plan_destroy(plan);
}

/* B's list reads A, which the framework freed after op2. */
static void test_freed_source(void) {
  cap_plan_t *plan = cap_plan_create("test", 256 * MIB);
  uint32_t lb[] = {1};
  MUST(cap_plan_add_recompute(plan, 2, 2, lb, 1) == 0);
  judge("freed source", &freed_job, plan, false,
        "op 1 (op.1) needs tensor 1, freed by the framework");
  /* The last iteration freed A late, so the plan looked right when it was
   * installed; this one frees A early: the executor's own check at the
   * list says the same. */
  judge_run("freed source, only in this iteration", &freed_job, plan, true,
            false, "op 1 (op.1) needs tensor 1, freed by the framework");
  cap_plan_destroy(plan);

  /* Explicit: A is recomputed inside the list as a temporary (the executor
   * once lost it between the two listed ops). */
  plan = cap_plan_create("test", 256 * MIB);
  uint32_t lb2[] = {0, 1};
  MUST(cap_plan_add_recompute(plan, 2, 2, lb2, 2) == 0);
  judge("freed source, recomputed in the list", &freed_job, plan, true, "");
  cap_plan_destroy(plan);
}

int main(void) {
  RUN_TEST(test_nested_dropped_source);
  RUN_TEST(test_swapped_source);
  RUN_TEST(test_freed_source);
  return TEST_SUMMARY();
}
