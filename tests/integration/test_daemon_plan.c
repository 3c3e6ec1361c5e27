/*
 * capuchind end to end: a test client replays the
 * resnet50 trace as a measured iteration and gets a feasible plan for 50 %
 * within 1 s; the plan and profile are in the store and capuchin-query lists
 * them; feedback with stalls gives plan v2 with an earlier trigger; a second
 * job with the same signature gets the plan without measuring; a job whose
 * first measured iteration matches reuses it; a client that leaves
 * mid-iteration leaves no profile behind; SIGTERM stops cleanly.
 */
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"
#include "store.h"
#include "testclient.h"

static tc_daemon_t D;
static cap_profile_t *P;
static uint64_t BUDGET;
static cap_plan_t *PLAN1;

/* The daemon's database, read-only; NULL (and why, on stderr) when it
 * will not open. */
static cap_store_t *open_store(void) {
  cap_store_t *s = NULL;
  if (cap_store_open(D.db, CAP_STORE_READONLY, &s) != 0)
    fprintf(stderr, "store: %s\n", cap_store_last_error());
  return s;
}

static long long count(const char *sql) {
  cap_store_t *s = open_store();
  if (!s)
    return -1;
  sqlite3_stmt *st = NULL;
  long long n = -1;
  if (sqlite3_prepare_v2(cap_store_db(s), sql, -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  cap_store_close(s);
  return n;
}

/* Iterations are stored off the loop, in order but not before the plan
 * that a later frame triggers is pushed: wait for the row to land. */
static long long count_at_least(const char *sql, long long want,
                                int timeout_ms) {
  long long n = count(sql);
  for (int waited = 0; n < want && waited < timeout_ms; waited += 20) {
    usleep(20 * 1000);
    n = count(sql);
  }
  return n;
}

static void test_measured_plan_within_1s(void) {
  tc_t c;
  REQUIRE(tc_connect(&c, D.sock) == 0);
  tc_hello_args_t a = {.job = "resnet50-a", .budget_bytes = BUDGET,
                       .persistent_bytes = P->resident_bytes};
  tc_welcome_t w;
  REQUIRE(tc_hello(&c, &a, &w, 10000) == 0);
  CHECK(w.job_id > 0);
  CHECK_EQ(w.budget_bytes, BUDGET);
  CHECK(!w.plan_reused);
  REQUIRE(tc_send_iteration(&c, P, 1, true, 256) == 0);
  uint64_t t0 = tc_now_ms();
  cap_plan_t *plan = tc_wait_plan(&c, TC_PLAN_WAIT_MS);
  uint64_t ms = tc_now_ms() - t0;
  REQUIRE(plan != NULL);
  printf("plan v%u with %u actions after %llu ms (predicted peak %llu, "
         "budget %llu)\n",
         plan->version, plan->n_actions, (unsigned long long)ms,
         (unsigned long long)plan->predicted_peak_bytes,
         (unsigned long long)BUDGET);
  CHECK(ms <= TC_PLAN_LIMIT_MS);
  CHECK_EQ(plan->version, 1);
  CHECK_EQ(plan->budget_bytes, BUDGET);
  char err[256] = "";
  CHECK(cap_plan_validate(plan, P, err, sizeof err) == 0);
  cap_sim_result_t r;
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  REQUIRE(cap_sim_run(P, plan, &bw, &r) == 0);
  CHECK(r.peak_bytes <= BUDGET); /* feasible, checked independently */
  if (r.peak_bytes > BUDGET)
    fprintf(stderr, "simulated peak %llu over budget %llu\n",
            (unsigned long long)r.peak_bytes, (unsigned long long)BUDGET);
  cap_sim_result_close(&r);
  PLAN1 = plan;

  /* Stored: profile and plan, found by signature and budget. */
  cap_store_t *s = open_store();
  REQUIRE(s != NULL);
  int64_t prof = 0, pl = 0;
  uint64_t sig = cap_profile_signature(P);
  CHECK(cap_store_profile_find(s, sig, &prof) == 0);
  CHECK(cap_store_plan_find(s, sig, BUDGET, NULL, 0.2, &pl, NULL) == 0);
  cap_plan_t *stored = NULL;
  CHECK(cap_store_plan_load(s, pl, &stored, NULL, NULL) == 0);
  if (stored)
    CHECK_EQ(stored->n_actions, plan->n_actions);
  cap_plan_destroy(stored);
  cap_store_close(s);

  /* capuchin-query lists it. */
  char out[65536];
  const char *argv[] = {CAP_BIN_DIR "/capuchin-query", "--db", D.db,
                        "--format", "json", "plans", NULL};
  int rc = tc_run_capture(argv, out, sizeof out);
  CHECK_EQ(rc, 0);
  char budget[32];
  snprintf(budget, sizeof budget, "%llu", (unsigned long long)BUDGET);
  CHECK(strstr(out, budget) != NULL);
  CHECK(strstr(out, "capuchin") != NULL);
  if (rc != 0 || !strstr(out, budget))
    fprintf(stderr, "capuchin-query said: %.500s\n", out);

  /* Feedback: the first swap with a prefetch trigger was late. */
  uint32_t ai = CAP_NONE;
  for (uint32_t i = 0; i < plan->n_actions && ai == CAP_NONE; i++)
    if (plan->actions[i].method == CAP_METHOD_SWAP &&
        plan->actions[i].prefetch_tensor != CAP_NONE)
      ai = i;
  REQUIRE(ai != CAP_NONE);
  const cap_action_t *act = &plan->actions[ai];
  uint32_t trig1 =
      cap_profile_access_op(P, act->prefetch_tensor, act->prefetch_access);
  cap_feedback_t fb = {.tensor = act->tensor,
                       .back_access = act->evict_after_access + 1,
                       .stall_ns = 2000000};
  /* Iteration 2 ran guided under v1 (and is stored) before its feedback. */
  REQUIRE(tc_send_iteration_end(&c, 2, P->iter_ns + 2000000, false, false, 1,
                                2000000) == 0);
  CHECK(count_at_least("SELECT count(*) FROM iterations", 2, 5000) >= 2);
  Capuchin__Feedback *fm = NULL;
  REQUIRE(cap_proto_feedback_to_msg(1, 2, &fb, 1, &fm) == 0);
  REQUIRE(tc_send_msg(&c, fm) == 0);
  cap_proto_msg_free(fm);
  cap_plan_t *v2 = tc_wait_plan(&c, TC_PLAN_WAIT_MS);
  REQUIRE(v2 != NULL);
  CHECK_EQ(v2->version, 2);
  bool earlier = false;
  for (uint32_t i = 0; i < v2->n_actions; i++) {
    const cap_action_t *b = &v2->actions[i];
    if (b->tensor != act->tensor || b->method != CAP_METHOD_SWAP)
      continue;
    uint32_t trig2 = b->prefetch_tensor == CAP_NONE
                         ? CAP_NONE
                         : cap_profile_access_op(P, b->prefetch_tensor,
                                                 b->prefetch_access);
    printf("tensor %u: trigger op %u -> %u\n", act->tensor, trig1, trig2);
    earlier = trig2 != CAP_NONE && trig2 < trig1;
  }
  CHECK(earlier);
  CHECK(count_at_least("SELECT count(*) FROM plans WHERE version = 2", 1, 5000) >= 1);

  /* The refinement is a trial: two guided iterations under v2, both slower
   * than v1's, bring v1's triggers back as v3, and refinement stops. */
  REQUIRE(tc_send_iteration_end(&c, 3, P->iter_ns + 5000000, false, false, 2,
                                0) == 0);
  REQUIRE(tc_send_iteration_end(&c, 4, P->iter_ns + 4000000, false, false, 2,
                                0) == 0);
  cap_plan_t *v3 = tc_wait_plan(&c, TC_PLAN_WAIT_MS);
  REQUIRE(v3 != NULL);
  CHECK_EQ(v3->version, 3);
  CHECK_EQ(v3->n_actions, plan->n_actions);
  bool restored = v3->n_actions == plan->n_actions;
  for (uint32_t i = 0; restored && i < v3->n_actions; i++)
    restored =
        v3->actions[i].tensor == plan->actions[i].tensor &&
        v3->actions[i].prefetch_tensor == plan->actions[i].prefetch_tensor &&
        v3->actions[i].prefetch_access == plan->actions[i].prefetch_access;
  CHECK(restored);
  REQUIRE(tc_send_iteration_end(&c, 5, P->iter_ns + 2000000, false, false, 3,
                                2000000) == 0);
  REQUIRE(cap_proto_feedback_to_msg(3, 5, &fb, 1, &fm) == 0);
  REQUIRE(tc_send_msg(&c, fm) == 0);
  cap_proto_msg_free(fm);
  cap_plan_t *v4 = tc_wait_plan(&c, 1500);
  CHECK(v4 == NULL); /* feedback no longer refines */
  cap_plan_destroy(v4);
  cap_plan_destroy(v3);
  cap_plan_destroy(v2);
  /* Every iteration's measurements are stored. */
  CHECK(count_at_least("SELECT count(*) FROM iterations", 2, 5000) >= 2);
  Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
  tc_send_msg(&c, &bye);
  CHECK(tc_wait_closed(&c, 5000));
  tc_close(&c);
}

static void test_reuse_by_hello_signature(void) {
  long long plans_before = count("SELECT count(*) FROM plans");
  tc_t c;
  REQUIRE(tc_connect(&c, D.sock) == 0);
  tc_hello_args_t a = {.job = "resnet50-rank1", .budget_bytes = BUDGET,
                       .signature = cap_profile_signature(P)};
  tc_welcome_t w;
  REQUIRE(tc_hello(&c, &a, &w, 10000) == 0);
  CHECK(w.plan_reused);
  /* The plan comes without a single op sent. */
  cap_plan_t *plan = tc_wait_plan(&c, 5000);
  REQUIRE(plan != NULL);
  CHECK(plan->version >= 1);
  CHECK(cap_plan_validate(plan, P, NULL, 0) == 0);
  CHECK_EQ(plan->budget_bytes, BUDGET);
  cap_plan_destroy(plan);
  CHECK_EQ(count("SELECT count(*) FROM plans"), plans_before);
  tc_close(&c);
}

static void test_reuse_profile_for_other_budget(void) {
  /* Same model, a budget no plan was made for: planned from the stored
   * profile at once, still without measuring. */
  long long plans_before = count("SELECT count(*) FROM plans");
  uint64_t budget = cap_profile_budget_pct(P, 70);
  tc_t c;
  REQUIRE(tc_connect(&c, D.sock) == 0);
  tc_hello_args_t a = {.job = "resnet50-70pct", .budget_bytes = budget,
                       .signature = cap_profile_signature(P)};
  tc_welcome_t w;
  REQUIRE(tc_hello(&c, &a, &w, 10000) == 0);
  CHECK(w.plan_reused);
  cap_plan_t *plan = tc_wait_plan(&c, TC_PLAN_WAIT_MS);
  REQUIRE(plan != NULL);
  CHECK_EQ(plan->budget_bytes, budget);
  CHECK(plan->predicted_peak_bytes <= budget);
  CHECK(cap_plan_validate(plan, P, NULL, 0) == 0);
  cap_plan_destroy(plan);
  CHECK_EQ(count("SELECT count(*) FROM plans"), plans_before + 1);
  tc_close(&c);
}

static void test_reuse_by_measured_signature(void) {
  long long plans_before = count("SELECT count(*) FROM plans");
  long long profiles_before = count("SELECT count(*) FROM profiles");
  tc_t c;
  REQUIRE(tc_connect(&c, D.sock) == 0);
  tc_hello_args_t a = {.job = "resnet50-restart", .budget_bytes = BUDGET};
  tc_welcome_t w;
  REQUIRE(tc_hello(&c, &a, &w, 10000) == 0);
  CHECK(!w.plan_reused);
  REQUIRE(tc_send_iteration(&c, P, 1, true, 100) == 0);
  cap_plan_t *plan = tc_wait_plan(&c, TC_PLAN_WAIT_MS);
  REQUIRE(plan != NULL);
  CHECK(cap_plan_validate(plan, P, NULL, 0) == 0);
  cap_plan_destroy(plan);
  /* Nothing new computed or stored: the stored profile and plan served. */
  CHECK_EQ(count("SELECT count(*) FROM plans"), plans_before);
  CHECK_EQ(count("SELECT count(*) FROM profiles"), profiles_before);
  tc_close(&c);
}

static void test_disconnect_mid_iteration(void) {
  long long profiles_before = count("SELECT count(*) FROM profiles");
  tc_t c;
  REQUIRE(tc_connect(&c, D.sock) == 0);
  tc_hello_args_t a = {.job = "leaves-early", .budget_bytes = BUDGET};
  REQUIRE(tc_hello(&c, &a, NULL, 10000) == 0);
  /* Declarations and the first half of the ops, then gone. */
  cap_proto_batch_t *b = cap_proto_batch_create();
  cap_proto_batch_reset(b, 1);
  for (uint32_t t = 0; t < P->n_tensors; t++)
    cap_proto_batch_add_decl(b, t, P->tensors[t].bytes, P->tensors[t].kind);
  for (uint32_t i = 0; i < P->n_ops / 2; i++) {
    const cap_op_t *op = &P->ops[i];
    cap_proto_batch_add_op(b, i, op->start_ns, op->end_ns, op->name,
                           cap_op_inputs(P, op), op->n_in,
                           cap_op_outputs(P, op), op->n_out);
  }
  REQUIRE(tc_flush_batch(&c, b) == 0);
  cap_proto_batch_destroy(b);
  usleep(200000);
  tc_close(&c);
  uint64_t deadline = tc_now_ms() + 10000;
  while (!tc_daemon_log_contains(&D, "left during iteration 1") &&
         tc_now_ms() < deadline)
    usleep(20000);
  CHECK(tc_daemon_log_contains(&D, "left during iteration 1"));
  usleep(200000);
  CHECK_EQ(count("SELECT count(*) FROM profiles"), profiles_before);
  CHECK_EQ(count("SELECT count(*) FROM profiles WHERE complete = 1"),
           profiles_before);
}

int main(void) {
  char err[256];
  if (cap_trace_load(cap_test_data("traces/resnet50.trace"), &P, err,
                     sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  BUDGET = cap_profile_budget_pct(P, 50);
  if (tc_daemon_start(&D, NULL, NULL) != 0) {
    fprintf(stderr, "capuchind did not start; log %s\n", D.log);
    return 1;
  }
  struct stat st;
  if (stat(D.sock, &st) == 0)
    CHECK_EQ(st.st_mode & 0777, 0660);
  RUN_TEST(test_measured_plan_within_1s);
  RUN_TEST(test_reuse_by_hello_signature);
  RUN_TEST(test_reuse_by_measured_signature);
  RUN_TEST(test_reuse_profile_for_other_budget);
  RUN_TEST(test_disconnect_mid_iteration);
  CHECK_EQ(tc_daemon_stop(&D), 0);
  CHECK(access(D.sock, F_OK) != 0); /* socket removed on a clean stop */
  cap_plan_destroy(PLAN1);
  cap_profile_destroy(P);
  if (cap_test_failed)
    fprintf(stderr, "daemon log kept in %s\n", D.log);
  else
    tc_daemon_cleanup(&D);
  return TEST_SUMMARY();
}
