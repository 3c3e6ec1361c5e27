/*
 * cap_client_load_plan_json: a plan brought by the job as the JSON bytes
 * capuchin-sim --emit-plan writes. A malformed one is refused with where
 * and why; a good one is installed at the next iteration boundary and
 * carried out; the bytes need no terminating NUL.
 */
#include <stdlib.h>
#include <string.h>

#include "cap_test.h"
#include "capuchin/client.h"

#define KIB (UINT64_C(1) << 10)

/* a (id 1) is written by op0, read by op1 and op2: the plan swaps it out
 * after access 2 (op1) and brings it back on demand for op2. */
static const char plan_json[] =
    "{\"trace\":\"t\",\"budget_bytes\":0,\"policy\":\"by-hand\","
    "\"version\":5,\"predicted_iter_ns\":1234,\"actions\":[{\"tensor\":1,"
    "\"evict_after_access\":2,\"method\":\"swap\",\"prefetch_at\":null}]}";

static int iteration(cap_client_t *c, uint32_t w, cap_iter_stats_t *st) {
  uint32_t a = CAP_NONE, b = CAP_NONE, x = CAP_NONE;
  int rc = cap_client_iteration_begin(c);
  rc = rc ? rc : cap_client_declare(c, 64 * KIB, &a);
  rc = rc ? rc : cap_client_declare(c, 64 * KIB, &b);
  rc = rc ? rc : cap_client_declare(c, 64 * KIB, &x);
  const uint32_t ops[3][2] = {{w, a}, {a, b}, {a, x}};
  for (int i = 0; i < 3 && rc == 0; i++) {
    rc = cap_client_op_begin(c, "aten::add", &ops[i][0], 1, &ops[i][1], 1,
                             NULL, NULL);
    /* Time for the swap-out to finish before a's back-access. */
    rc = rc ? rc : cap_client_compute(c, 2000000);
    rc = rc ? rc : cap_client_op_end(c);
  }
  rc = rc ? rc : cap_client_free(c, a);
  rc = rc ? rc : cap_client_free(c, b);
  rc = rc ? rc : cap_client_free(c, x);
  return rc ? rc : cap_client_iteration_end(c, st);
}

static void test_load_plan_json(void) {
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.no_daemon = true;
  cfg.time_scale = 1.0;
  cap_client_t *c = NULL;
  REQUIRE(cap_client_create(&cfg, &c) == 0);
  uint32_t w;
  CHECK_EQ(cap_client_register(c, 64 * KIB, CAP_KIND_PARAM, &w, NULL), 0);

  CHECK_EQ(cap_client_load_plan_json(NULL, plan_json, sizeof plan_json - 1),
           CAP_EINVAL);
  CHECK_EQ(cap_client_load_plan_json(c, NULL, 0), CAP_EINVAL);
  static const char bad[] = "{\"trace\":\"t\",\"budget_bytes\":,}";
  CHECK_EQ(cap_client_load_plan_json(c, bad, sizeof bad - 1), CAP_EPARSE);
  CHECK(strstr(cap_client_last_error(c), "plan JSON: byte 28") != NULL);
  /* Cut short: the length is honoured, not a NUL. */
  CHECK_EQ(cap_client_load_plan_json(c, plan_json, sizeof plan_json - 3),
           CAP_EPARSE);

  cap_iter_stats_t st;
  CHECK_EQ(iteration(c, w, &st), 0);
  CHECK_EQ(st.plan_version, 0);
  CHECK_EQ(st.bytes_out, 0);

  /* From a buffer with no NUL after the plan. */
  size_t n = sizeof plan_json - 1;
  char *buf = malloc(n);
  REQUIRE(buf);
  memcpy(buf, plan_json, n);
  CHECK_EQ(cap_client_load_plan_json(c, buf, n), 0);
  free(buf);
  CHECK_EQ(cap_client_plan_predicted_ns(c), 0); /* until the boundary */
  CHECK_EQ(iteration(c, w, &st), 0);
  CHECK_EQ(st.mode, CAP_MODE_GUIDED);
  CHECK_EQ(st.plan_version, 5);
  CHECK_EQ(st.evictions, 1);
  CHECK_EQ(st.bytes_out, 64 * KIB);
  /* In again for op2 unless the swap-out was still running (then the
   * device copy is kept): how far the copy got is the scheduler's. */
  CHECK(st.bytes_in == 0 || st.bytes_in == 64 * KIB);
  CHECK_EQ(cap_client_plan_predicted_ns(c), 1234);
  cap_client_destroy(c);
}

int main(void) {
  RUN_TEST(test_load_plan_json);
  return TEST_SUMMARY();
}
