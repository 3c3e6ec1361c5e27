/*
 * The swap-outs after an op are issued in action order, as the simulator
 * issues them (docs/plan-semantics.md), not in the order the op names its
 * tensors. Each copy direction is FIFO, so the order decides which copy
 * waits behind which: op 0 makes X (8 MiB) then Y (64 KiB), the plan swaps
 * out Y (action 0) and X (action 1) after it, and op 1's output needs Y's
 * memory. Y first, op 1 waits at most for Y's 0.66 ms copy; X first, it
 * waits for X's 84 ms one (0.1 GB/s). Both come back by prefetches that
 * op 2 triggers, in time for op 3.
 */
#include <stdio.h>
#include <string.h>

#include "cap_test.h"
#include "capuchin/client.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define MS INT64_C(1000000)

static int op(cap_client_t *c, const uint32_t *in, uint32_t n_in,
              const uint32_t *out, uint32_t n_out, int64_t ns) {
  int rc = cap_client_op_begin(c, "aten::op", in, n_in, out, n_out, NULL, NULL);
  rc = rc ? rc : cap_client_compute(c, ns);
  return rc ? rc : cap_client_op_end(c);
}

/* op0: w -> x, y   op1: w -> z (z freed)   op2: w   op3: x, y */
static int iteration(cap_client_t *c, uint32_t w, cap_iter_stats_t *st) {
  uint32_t x = CAP_NONE, y = CAP_NONE, z = CAP_NONE;
  int rc = cap_client_iteration_begin(c);
  rc = rc ? rc : cap_client_declare(c, 8 * MIB, &x);
  rc = rc ? rc : cap_client_declare(c, 64 * KIB, &y);
  rc = rc ? rc : cap_client_declare(c, 64 * KIB, &z);
  uint32_t xy[2] = {x, y};
  rc = rc ? rc : op(c, &w, 1, xy, 2, 1 * MS);
  rc = rc ? rc : op(c, &w, 1, &z, 1, 1 * MS);
  rc = rc ? rc : cap_client_free(c, z);
  rc = rc ? rc : op(c, &w, 1, NULL, 0, 250 * MS);
  rc = rc ? rc : op(c, xy, 2, NULL, 0, 1 * MS);
  rc = rc ? rc : cap_client_free(c, x);
  rc = rc ? rc : cap_client_free(c, y);
  return rc ? rc : cap_client_iteration_end(c, st);
}

static const char plan[] =
    "{\"trace\":\"t\",\"budget_bytes\":0,\"policy\":\"by-hand\",\"version\":1,"
    "\"predicted_iter_ns\":253000000,\"actions\":["
    "{\"tensor\":2,\"evict_after_access\":1,\"method\":\"swap\","
    "\"prefetch_at\":{\"tensor\":0,\"access\":3}},"
    "{\"tensor\":1,\"evict_after_access\":1,\"method\":\"swap\","
    "\"prefetch_at\":{\"tensor\":0,\"access\":3}}]}";

/* The guided iteration's stall, ns; -1 when it did not run as planned. */
static int64_t guided_stall(void) {
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.no_daemon = true;
  cfg.time_scale = 1.0;
  cfg.sim_d2h_gbps = cfg.sim_h2d_gbps = 0.1;
  cfg.sim_duplex_gbps = 0.2;
  cfg.budget_bytes = 1 * MIB + 8 * MIB + 64 * KIB + 32 * KIB;
  cap_client_t *c = NULL;
  uint32_t w = CAP_NONE;
  if (cap_client_create(&cfg, &c) != 0 ||
      cap_client_register(c, 1 * MIB, CAP_KIND_PARAM, &w, NULL) != 0 ||
      w != 0) {
    CHECK(!"client set up");
    cap_client_destroy(c);
    return -1;
  }
  cap_iter_stats_t st;
  CHECK_EQ(iteration(c, w, &st), 0); /* measured, unguided */
  int rc = cap_client_load_plan_json(c, plan, strlen(plan));
  CHECK_EQ(rc, 0);
  rc = rc ? rc : iteration(c, w, &st);
  if (rc)
    fprintf(stderr, "iteration: %s\n", cap_client_last_error(c));
  CHECK_EQ(rc, 0);
  CHECK_EQ(st.mode, CAP_MODE_GUIDED);
  CHECK_EQ(st.op_errors, 0);
  CHECK_EQ(st.fallbacks, 0);
  CHECK_EQ(st.lru_evictions, 0);
  CHECK_EQ(st.evictions, 2);
  CHECK(st.peak_bytes <= cfg.budget_bytes);
  cap_client_destroy(c);
  return rc || st.mode != CAP_MODE_GUIDED ? -1 : st.stall_ns;
}

static void test_swap_outs_after_an_op_go_in_action_order(void) {
  /* X first would stall at least X's 84 ms copy; Y first at most Y's
   * 0.66 ms one plus what the copy threads lose on a loaded machine:
   * half of X's copy must hold in one of three tries. */
  int64_t best = -1;
  for (int i = 0; i < 3; i++) {
    int64_t s = guided_stall();
    fprintf(stderr, "try %d: guided iteration stalled %.2f ms\n", i + 1,
            (double)s / 1e6);
    if (s >= 0 && (best < 0 || s < best))
      best = s;
    if (best >= 0 && best < 42 * MS)
      break;
  }
  CHECK(best >= 0);
  CHECK(best < 42 * MS);
}

int main(void) {
  RUN_TEST(test_swap_outs_after_an_op_go_in_action_order);
  return TEST_SUMMARY();
}
