/*
 * Recompute lists of the Capuchin planner (msps.c): which ops restore an
 * evicted tensor, at what cost, and when replaying is not allowed.
 */
#include <stdlib.h>
#include <string.h>

#include "../../../policy/src/capuchin_internal.h"
#include "cap_test.h"
#include "capuchin/error.h"

#define MB (1000u * 1000u)
#define US 1000

/* op0: X = f(W) (10 us); op1: A = g(X) (20 us); op2: `mid` (in place on X
 * when x_inplace, else relu_(A) in place when a_inplace, else an op on W);
 * X dies after op2 unless keep_x; op3: 1 ms on W; op4 reads A (and X when
 * keep_x). */
static cap_profile_t *chain(bool x_inplace, bool a_inplace, bool keep_x) {
  cap_profile_t *p = cap_profile_create();
  int rc = cap_profile_add_tensor(p, 0, 1 * MB, CAP_KIND_PARAM);
  rc = rc ? rc : cap_profile_add_tensor(p, 1, 50 * MB, CAP_KIND_ACTIVATION);
  rc = rc ? rc : cap_profile_add_tensor(p, 2, 100 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = 3; i < 6 && !rc; i++)
    rc = cap_profile_add_tensor(p, i, 1 * MB, CAP_KIND_ACTIVATION);
  uint32_t W = 0, X = 1, A = 2, t3 = 3, t4 = 4, t5 = 5;
  rc = rc ? rc : cap_profile_add_op(p, 0, 0, 10 * US, "aten.mm.default", &W, 1, &X, 1);
  rc = rc ? rc : cap_profile_add_op(p, 1, 10 * US, 30 * US, "aten.mm.default", &X, 1, &A, 1);
  if (x_inplace)
    rc = rc ? rc : cap_profile_add_op(p, 2, 30 * US, 40 * US, "aten.add_.Tensor", &X, 1, &X, 1);
  else if (a_inplace)
    rc = rc ? rc : cap_profile_add_op(p, 2, 30 * US, 40 * US, "aten.relu_.default", &A, 1, &A, 1);
  else {
    rc = rc ? rc : cap_profile_add_op(p, 2, 30 * US, 40 * US, "aten.mul.Tensor", &W, 1, &t5, 1);
    rc = rc ? rc : cap_profile_add_free(p, 40 * US, t5);
  }
  if (!keep_x)
    rc = rc ? rc : cap_profile_add_free(p, 40 * US, X);
  rc = rc ? rc : cap_profile_add_op(p, 3, 40 * US, 1040 * US, "aten.mul.Tensor", &W, 1, &t3, 1);
  rc = rc ? rc : cap_profile_add_free(p, 1040 * US, t3);
  uint32_t in[2] = {A, X};
  rc = rc ? rc : cap_profile_add_op(p, 4, 1040 * US, 1050 * US, "aten.add.Tensor", in, keep_x ? 2 : 1, &t4, 1);
  rc = rc ? rc : cap_profile_add_free(p, 1050 * US, A);
  if (keep_x)
    rc = rc ? rc : cap_profile_add_free(p, 1050 * US, X);
  rc = rc ? rc : cap_profile_add_free(p, 1050 * US, t4);
  rc = rc ? rc : cap_profile_finish(p);
  if (rc) {
    fprintf(stderr, "fixture: %s\n", cap_profile_error(p));
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

static const cap__gap_t *last_gap_of(const cap__ctx_t *c, uint32_t tensor) {
  const cap__gap_t *g = NULL;
  for (uint32_t i = 0; i < c->n_gaps; i++)
    if (c->gaps[i].tensor == tensor)
      g = &c->gaps[i];
  return g;
}

static void test_chain_through_freed_source(void) {
  cap_profile_t *p = chain(false, false, false);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 100 * MB);
  cap__ctx_t c;
  REQUIRE(cap__ctx_init(&c, p, &cfg) == 0);
  const cap__gap_t *g = last_gap_of(&c, 2);
  REQUIRE(g);
  CHECK_EQ(g->a, 1);
  CHECK_EQ(g->b, 4);
  int64_t cost = -1, extra = -1;
  CHECK_EQ(cap__rc_build(&c, g, &cost, &extra), 0);
  /* X is gone by op 4: it is rebuilt first */
  REQUIRE(c.list.n == 2);
  CHECK_EQ(c.list.v[0], 0);
  CHECK_EQ(c.list.v[1], 1);
  CHECK_EQ(cost, 30 * US);
  CHECK(extra >= 0);
  /* MSPS ranks bytes freed per second of replay */
  CHECK(cap__msps(100 * MB, cost) > cap__msps(100 * MB, 2 * cost));
  cap__ctx_close(&c);
  cap_profile_destroy(p);
}

static void test_resident_source_used_as_is(void) {
  cap_profile_t *p = chain(false, false, true);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 100 * MB);
  cap__ctx_t c;
  REQUIRE(cap__ctx_init(&c, p, &cfg) == 0);
  const cap__gap_t *g = last_gap_of(&c, 2);
  REQUIRE(g);
  int64_t cost, extra;
  CHECK_EQ(cap__rc_build(&c, g, &cost, &extra), 0);
  REQUIRE(c.list.n == 1); /* X is still on the device, unchanged */
  CHECK_EQ(c.list.v[0], 1);
  CHECK_EQ(cost, 20 * US);
  cap__ctx_close(&c);
  cap_profile_destroy(p);
}

static void test_inplace_write_of_target_replayed(void) {
  cap_profile_t *p = chain(false, true, true);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 100 * MB);
  cap__ctx_t c;
  REQUIRE(cap__ctx_init(&c, p, &cfg) == 0);
  const cap__gap_t *g = last_gap_of(&c, 2); /* evicted after relu_ (op 2) */
  REQUIRE(g);
  CHECK_EQ(g->a, 2);
  int64_t cost, extra;
  CHECK_EQ(cap__rc_build(&c, g, &cost, &extra), 0);
  /* the value after the in-place relu_: producer, then the relu_ */
  REQUIRE(c.list.n == 2);
  CHECK_EQ(c.list.v[0], 1);
  CHECK_EQ(c.list.v[1], 2);
  cap__ctx_close(&c);
  cap_profile_destroy(p);
}

static void test_source_written_in_place_refused(void) {
  cap_profile_t *p = chain(true, false, true);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 100 * MB);
  cap__ctx_t c;
  REQUIRE(cap__ctx_init(&c, p, &cfg) == 0);
  const cap__gap_t *g = last_gap_of(&c, 2);
  REQUIRE(g);
  int64_t cost, extra;
  /* op 1 read X before add_ changed it; X is resident at op 4 in its new
   * value, so replaying op 1 would compute something else */
  CHECK_EQ(cap__rc_build(&c, g, &cost, &extra), CAP_ENOENT);
  cap__ctx_close(&c);
  cap_profile_destroy(p);
}

/* op0: (X, Z) = f(W) (1 ms, two outputs, as a batch norm's), op1: A =
 * g(X) (20 us), X freed after it, op2: 1 ms on W, op3 reads A, op4 reads
 * Z. With Z dropped after op0 (its list [op0], 1 ms), A's list at op3 runs
 * op0 again to rebuild X ([op0, op1], 1.02 ms), which brings Z back too:
 * Z is on the device at op4 and its own list never runs, so A's replay
 * costs only 20 us beyond it. */
static void test_saved_list_counted_once(void) {
  cap_profile_t *p = cap_profile_create();
  uint32_t W = 0, X = 1, Z = 2, A = 3, t2 = 4, t3 = 5, t4 = 6;
  uint32_t xz[] = {X, Z};
  int rc = cap_profile_add_tensor(p, W, 1 * MB, CAP_KIND_PARAM);
  rc = rc ? rc : cap_profile_add_tensor(p, X, 50 * MB, CAP_KIND_ACTIVATION);
  rc = rc ? rc : cap_profile_add_tensor(p, Z, 50 * MB, CAP_KIND_ACTIVATION);
  rc = rc ? rc : cap_profile_add_tensor(p, A, 100 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = 4; i < 7 && !rc; i++)
    rc = cap_profile_add_tensor(p, i, 1 * MB, CAP_KIND_ACTIVATION);
  rc = rc ? rc : cap_profile_add_op(p, 0, 0, 1000 * US,
                                    "aten.mm.default", &W, 1, xz, 2);
  rc = rc ? rc : cap_profile_add_op(p, 1, 1000 * US, 1020 * US,
                                    "aten.mm.default", &X, 1, &A, 1);
  rc = rc ? rc : cap_profile_add_free(p, 1020 * US, X);
  rc = rc ? rc : cap_profile_add_op(p, 2, 1020 * US, 2020 * US,
                                    "aten.mul.Tensor", &W, 1, &t2, 1);
  rc = rc ? rc : cap_profile_add_free(p, 2020 * US, t2);
  rc = rc ? rc : cap_profile_add_op(p, 3, 2020 * US, 2030 * US,
                                    "aten.relu.default", &A, 1, &t3, 1);
  rc = rc ? rc : cap_profile_add_free(p, 2030 * US, A);
  rc = rc ? rc : cap_profile_add_free(p, 2030 * US, t3);
  rc = rc ? rc : cap_profile_add_op(p, 4, 2030 * US, 2040 * US,
                                    "aten.relu.default", &Z, 1, &t4, 1);
  rc = rc ? rc : cap_profile_add_free(p, 2040 * US, Z);
  rc = rc ? rc : cap_profile_add_free(p, 2040 * US, t4);
  rc = rc ? rc : cap_profile_finish(p);
  REQUIRE(rc == 0);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 100 * MB);
  cap__ctx_t c;
  REQUIRE(cap__ctx_init(&c, p, &cfg) == 0);
  /* Z dropped after op0, as the planner's take_recompute records it */
  const cap__gap_t *gz = last_gap_of(&c, Z);
  REQUIRE(gz && gz->a == 0 && gz->b == 4);
  int64_t cost, extra;
  REQUIRE(cap__rc_build(&c, gz, &cost, &extra) == 0);
  CHECK_EQ(cost, 1000 * US);
  c.ch = malloc(sizeof *c.ch);
  REQUIRE(c.ch);
  c.ch[0] = (cap__choice_t){.gap = (uint32_t)(gz - c.gaps),
                            .method = CAP_METHOD_RECOMPUTE,
                            .trig_op = CAP_NONE,
                            .save_lo = gz->a + 1,
                            .save_hi = gz->b,
                            .cost_ns = cost};
  c.n_ch = c.cap_ch = 1;
  uint32_t slot = p->tensors[Z].access_off + gz->k - 1;
  c.gap_state[slot] = GAP_RECOMPUTE;
  c.slot_choice[slot] = 0;
  const cap__gap_t *ga = last_gap_of(&c, A);
  REQUIRE(ga && ga->a == 1 && ga->b == 3);
  REQUIRE(cap__rc_build(&c, ga, &cost, &extra) == 0);
  REQUIRE(c.list.n == 2);
  CHECK_EQ(cost, 1020 * US);
  CHECK_EQ(cap__rc_saved(&c, ga->b), 1000 * US);
  cap__ctx_close(&c);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_chain_through_freed_source);
  RUN_TEST(test_resident_source_used_as_is);
  RUN_TEST(test_inplace_write_of_target_replayed);
  RUN_TEST(test_source_written_in_place_refused);
  RUN_TEST(test_saved_list_counted_once);
  return TEST_SUMMARY();
}
