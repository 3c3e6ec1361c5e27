/*
 * Plan JSON: every planner's plan survives write + read unchanged and
 * re-simulates to the same peak and iteration time; the reader refuses
 * everything outside the schema with a message naming the byte.
 */
#include "cap_test.h"

#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"

static bool same_plan(const cap_plan_t *a, const cap_plan_t *b) {
  if (a->n_actions != b->n_actions || a->budget_bytes != b->budget_bytes ||
      strcmp(a->policy, b->policy) || a->version != b->version ||
      a->predicted_iter_ns != b->predicted_iter_ns ||
      a->predicted_peak_bytes != b->predicted_peak_bytes)
    return false;
  for (uint32_t i = 0; i < a->n_actions; i++) {
    const cap_action_t *x = &a->actions[i], *y = &b->actions[i];
    if (x->tensor != y->tensor || x->evict_after_access != y->evict_after_access ||
        x->method != y->method || x->flags != y->flags ||
        x->prefetch_tensor != y->prefetch_tensor ||
        x->prefetch_access != y->prefetch_access ||
        x->n_recompute != y->n_recompute)
      return false;
    if (x->n_recompute &&
        memcmp(cap_action_recompute_ops(a, x), cap_action_recompute_ops(b, y),
               x->n_recompute * sizeof(uint32_t)))
      return false;
  }
  if (a->n_blocks != b->n_blocks || a->arena_bytes != b->arena_bytes)
    return false;
  for (uint32_t i = 0; i < a->n_blocks; i++) {
    const cap_block_t *x = &a->blocks[i], *y = &b->blocks[i];
    if (x->tensor != y->tensor || x->kind != y->kind || x->action != y->action ||
        x->offset != y->offset || x->bytes != y->bytes ||
        x->start_ns != y->start_ns || x->end_ns != y->end_ns ||
        x->share != y->share || x->same_as != y->same_as)
      return false;
  }
  return true;
}

/* Write plan as JSON to memory and read it back into *back. */
static int json_round_trip(const cap_plan_t *plan, const char *trace,
                           cap_plan_t **back, char *err, size_t err_len) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f)
    return CAP_ENOMEM;
  int rc = cap_plan_write_json(f, plan, trace);
  if (fclose(f) != 0 && rc == 0)
    rc = CAP_EIO;
  if (rc == 0)
    rc = cap_plan_read_json(buf, len, back, err, err_len);
  free(buf);
  return rc;
}

static void test_round_trip_all_planners(void) {
  char err[512];
  cap_profile_t *p = NULL;
  REQUIRE(cap_trace_load(cap_test_data("traces/resnet50.trace"), &p, err,
                         sizeof err) == 0);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, cap_profile_budget_pct(p, 50));
  for (size_t i = 0; cap_planner_names[i]; i++) {
    cap_plan_t *plan = NULL;
    int rc = cap_plan_compute(p, cap_planner_names[i], &cfg, &plan);
    CHECK(rc == 0 || rc == CAP_EINFEASIBLE);
    if (!plan)
      continue;
    cap_plan_t *back = NULL;
    rc = json_round_trip(plan, "resnet50.trace", &back, err, sizeof err);
    if (rc)
      fprintf(stderr, "%s: %s\n", cap_planner_names[i], err);
    CHECK_EQ(rc, 0);
    if (back) {
      CHECK(same_plan(plan, back));
      cap_sim_result_t r;
      REQUIRE(cap_sim_run(p, back, &cfg.bw, &r) == 0);
      CHECK_EQ(r.peak_bytes, plan->predicted_peak_bytes);
      CHECK_EQ(r.iter_ns, plan->predicted_iter_ns);
      cap_sim_result_close(&r);
    }
    cap_plan_destroy(back);
    cap_plan_destroy(plan);
  }
  cap_profile_destroy(p);
}

/* A plan with a placement keeps every block (with persistent eviction, so
 * that tied blocks and every kind but a temporary appear). */
static void test_round_trip_placement(void) {
  char err[512];
  cap_profile_t *p = NULL;
  REQUIRE(cap_trace_load(cap_test_data("traces/bert_large.trace"), &p, err,
                         sizeof err) == 0);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, cap_profile_budget_pct(p, 50));
  cfg.evict_persistent = true;
  cap_plan_t *plan = NULL, *back = NULL;
  cap_plan_placement_t pp;
  REQUIRE(cap_plan_compute_placed(p, "capuchin", &cfg, &plan, &pp) == 0);
  REQUIRE(plan->n_blocks > 0);
  bool kinds[5] = {0}, tied = false, shared = false;
  for (uint32_t i = 0; i < plan->n_blocks; i++) {
    kinds[plan->blocks[i].kind] = true;
    tied |= plan->blocks[i].same_as != CAP_NONE;
    shared |= plan->blocks[i].share != CAP_NONE;
  }
  CHECK(kinds[CAP_RESIDENCY_FIRST_TOUCH] && kinds[CAP_RESIDENCY_SWAPPED_IN] &&
        kinds[CAP_RESIDENCY_PERSISTENT]);
  CHECK(tied && shared);
  REQUIRE(json_round_trip(plan, "bert_large.trace", &back, err, sizeof err) == 0);
  CHECK(same_plan(plan, back));
  CHECK(cap_plan_validate(back, p, err, sizeof err) == 0);
  cap_plan_destroy(back);
  cap_plan_destroy(plan);
  cap_plan_placement_close(&pp);
  cap_profile_destroy(p);
}

static void test_minimal_and_escapes(void) {
  char err[256];
  const char *ok = " {\"trace\":\"a\\\"b\\\\c\\u0041\",\"budget_bytes\":18446744073709551615,"
                   "\"policy\":\"capuchin\",\"actions\":[\n"
                   "{\"method\":\"recompute\",\"recompute_ops\":[0, 4 ,7],"
                   "\"evict_after_access\":2,\"tensor\":3},"
                   "{\"tensor\":1,\"evict_after_access\":1,\"method\":\"swap\","
                   "\"prefetch_at\":{\"access\":2,\"tensor\":9},\"sync_out\":false},"
                   "{\"tensor\":2,\"evict_after_access\":3,\"method\":\"swap\","
                   "\"prefetch_at\":null,\"sync_out\":true},"
                   "{\"tensor\":5,\"evict_after_access\":4,\"method\":\"recompute\","
                   "\"recompute_ops\":[]}]}\n";
  cap_plan_t *plan = NULL;
  int rc = cap_plan_read_json(ok, strlen(ok), &plan, err, sizeof err);
  if (rc)
    fprintf(stderr, "%s\n", err);
  REQUIRE(rc == 0);
  CHECK_EQ(plan->n_actions, 4);
  CHECK(plan->budget_bytes == UINT64_MAX);
  CHECK_STR(plan->policy, "capuchin");
  CHECK_EQ(plan->version, 1);
  CHECK_EQ(plan->actions[0].method, CAP_METHOD_RECOMPUTE);
  CHECK_EQ(plan->actions[0].n_recompute, 3);
  CHECK_EQ(cap_action_recompute_ops(plan, &plan->actions[0])[2], 7);
  CHECK_EQ(plan->actions[1].prefetch_tensor, 9);
  CHECK_EQ(plan->actions[1].prefetch_access, 2);
  CHECK_EQ(plan->actions[1].flags, 0);
  CHECK_EQ(plan->actions[2].prefetch_tensor, CAP_NONE);
  CHECK_EQ(plan->actions[2].flags, CAP_ACTION_SYNC_OUT);
  CHECK(cap_action_is_release(&plan->actions[3]));
  CHECK(!cap_action_is_release(&plan->actions[0]));
  /* written back, a release reads the same */
  cap_plan_t *again = NULL;
  CHECK_EQ(json_round_trip(plan, "a", &again, err, sizeof err), 0);
  CHECK(again && same_plan(plan, again));
  cap_plan_destroy(again);
  cap_plan_destroy(plan);
}

static void test_malformed(void) {
  static const struct {
    const char *json, *want;
  } bad[] = {
      {"", "expected '{'"},
      {"[]", "expected '{'"},
      {"{\"trace\":\"t\",\"budget_bytes\":1,\"policy\":\"p\"}", "needs"},
      {"{\"trace\":\"t\",\"budget_bytes\":1,\"policy\":\"p\",\"actions\":[]} x",
       "trailing"},
      {"{\"trace\":\"t\",\"trace\":\"u\"}", "duplicate"},
      {"{\"trace\":\"t\",\"budget_bytes\":-1}", "non-negative"},
      {"{\"trace\":\"t\",\"budget_bytes\":1.5}", "integer"},
      {"{\"trace\":\"t\",\"budget_bytes\":01}", "leading zero"},
      {"{\"trace\":\"t\",\"budget_bytes\":18446744073709551616}", "too large"},
      {"{\"trace\":\"t\",\"bogus\":1}", "unknown key"},
      {"{\"trace\":\"t\001\"}", "control"},
      {"{\"trace\":\"t", "unterminated"},
      {"{\"trace\":\"\\x\"}", "bad escape"},
      {"{\"trace\":\"\\u00e9\"}", "ASCII"},
      {"{\"version\":0}", "version"},
      {"{\"actions\":[{\"tensor\":1}]}", "needs"},
      {"{\"actions\":[{\"tensor\":1,\"evict_after_access\":0}]}", "at least 1"},
      {"{\"actions\":[{\"tensor\":4294967295}]}", "out of range"},
      {"{\"actions\":[{\"method\":\"teleport\"}]}", "unknown method"},
      {"{\"actions\":[{\"tensor\":1,\"evict_after_access\":1,\"method\":\"recompute\"}]}",
       "needs recompute_ops"},
      {"{\"actions\":[{\"tensor\":1,\"evict_after_access\":1,\"method\":\"recompute\","
       "\"recompute_ops\":[1],\"sync_out\":true}]}",
       "swap fields"},
      {"{\"actions\":[{\"tensor\":1,\"evict_after_access\":1,\"method\":\"swap\","
       "\"recompute_ops\":[1]}]}",
       "with recompute_ops"},
      {"{\"actions\":[{\"tensor\":1,\"evict_after_access\":1,\"method\":\"swap\","
       "\"prefetch_at\":{\"tensor\":2}}]}",
       "prefetch_at needs"},
      {"{\"actions\":[{\"tensor\":1,\"evict_after_access\":1,\"method\":\"swap\","
       "\"sync_out\":1}]}",
       "true or false"},
      {"{\"actions\":[{\"tensor\":1,\"evict_after_access\":1,\"method\":\"swap\"}",
       "expected"},
      {"{\"placement\":{\"blocks\":[]}}", "placement needs"},
      {"{\"placement\":{\"arena_bytes\":1,\"blocks\":[],\"x\":1}}",
       "unknown key \"x\" in placement"},
      {"{\"placement\":{\"arena_bytes\":1,\"blocks\":[{\"tensor\":1}]}}",
       "a block needs"},
      {"{\"placement\":{\"arena_bytes\":1,\"blocks\":[{\"kind\":\"lost\"}]}}",
       "unknown block kind"},
      {"{\"placement\":{\"arena_bytes\":1,\"blocks\":[{\"tensor\":1,"
       "\"kind\":\"first_touch\",\"action\":null,\"offset\":0,\"bytes\":1,"
       "\"start_ns\":5,\"end_ns\":5,\"share\":null,\"same_as\":null}]}}",
       "end after it starts"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char err[256] = "";
    cap_plan_t *plan = (cap_plan_t *)1;
    int rc = cap_plan_read_json(bad[i].json, strlen(bad[i].json), &plan, err,
                                sizeof err);
    if (rc != CAP_EPARSE || plan != NULL || !strstr(err, bad[i].want) ||
        !strstr(err, "byte ")) {
      fprintf(stderr, "case %zu: rc %d err \"%s\" (want \"%s\")\n", i, rc, err,
              bad[i].want);
      CHECK(0);
    }
  }
  /* Every prefix of a good plan is refused, never crashes. */
  const char *good = "{\"trace\":\"t\",\"budget_bytes\":10,\"policy\":\"p\",\"actions\":"
                     "[{\"tensor\":1,\"evict_after_access\":1,\"method\":\"swap\","
                     "\"prefetch_at\":{\"tensor\":2,\"access\":1}}]}";
  for (size_t n = 0; n < strlen(good); n++) {
    cap_plan_t *plan = NULL;
    CHECK_EQ(cap_plan_read_json(good, n, &plan, NULL, 0), CAP_EPARSE);
    CHECK(plan == NULL);
  }
  cap_plan_t *plan = NULL;
  CHECK_EQ(cap_plan_read_json(good, strlen(good), &plan, NULL, 0), 0);
  cap_plan_destroy(plan);
}

int main(void) {
  RUN_TEST(test_round_trip_all_planners);
  RUN_TEST(test_round_trip_placement);
  RUN_TEST(test_minimal_and_escapes);
  RUN_TEST(test_malformed);
  return TEST_SUMMARY();
}
