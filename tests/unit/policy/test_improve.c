/*
 * The local search under the simulator (improve.c) on plans written by
 * hand, where the move that helps is known.
 */
#include <string.h>

#include "../../../policy/src/capuchin_internal.h"
#include "../../../policy/src/planners.h"
#include "cap_test.h"
#include "capuchin/error.h"
#include "fixtures.h"

/* The unmanaged run of p (*base), the config for budget (*cfg) and an
 * empty plan to write by hand; NULL when p does not simulate. */
static cap_plan_t *start(const cap_profile_t *p, uint64_t budget,
                         cap_plan_config_t *cfg, cap_sim_result_t *base) {
  cap_plan_config_init(cfg, budget);
  if (cap_sim_run(p, NULL, &cfg->bw, base) != 0)
    return NULL;
  return cap_plan_create("capuchin", budget);
}

/* The improved plan must still be valid; then everything goes. */
static void finish(cap_plan_t *plan, cap_profile_t *p, cap_sim_result_t *base) {
  CHECK_EQ(cap_plan_validate(plan, p, NULL, 0), 0);
  cap_sim_result_close(base);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_late_prefetch_moves_earlier(void) {
  /* one_big: A (100 MB) made at op 0, read again by op 14 (12.02 ms); B
   * (80 MB) lives over ops 4..7. A swapped, its prefetch triggered by op
   * 13 (11.02 ms): the 1.8 ms copy lands 0.8 ms late. Leaving A on the
   * device would put A and B together (182 MB, over the plan's 102 MB
   * peak); triggering at op 12 (10.02 ms) instead lands in time and holds
   * A over op 12 only, no higher than the plan's peak. */
  cap_profile_t *p = one_big(3, 3, 6, 1000 * US, 10 * US);
  REQUIRE(p);
  REQUIRE(p->n_ops == 15);
  cap_plan_config_t cfg;
  cap_sim_result_t base;
  cap_plan_t *plan = start(p, 200 * MB, &cfg, &base);
  REQUIRE(plan);
  uint32_t tt, ta;
  REQUIRE(cap__trigger_name(p, 13, 1, &tt, &ta));
  REQUIRE(cap_plan_add_swap(plan, 1, 1, tt, ta, 0) == 0);
  REQUIRE(cap__plan_predict(plan, p, &cfg.bw) == 0);
  int64_t late = plan->predicted_iter_ns - base.iter_ns;
  CHECK(late > 700 * US && late < 900 * US);
  uint64_t peak = plan->predicted_peak_bytes;
  CHECK_EQ(peak, 102 * MB);
  REQUIRE(cap__plan_improve(plan, p, &cfg, 64) == 0);
  REQUIRE(plan->n_actions == 1);
  const cap_action_t *a = &plan->actions[0];
  CHECK_EQ(a->method, CAP_METHOD_SWAP);
  CHECK_EQ(cap_profile_access_op(p, a->prefetch_tensor, a->prefetch_access),
           12);
  CHECK_EQ(plan->predicted_iter_ns, base.iter_ns);
  CHECK_EQ(plan->predicted_peak_bytes, peak);
  finish(plan, p, &base);
}

/* A batch norm's output N, made in place by a relu_, and the clone C of
 * its value before the relu_ (kept for the relu's backward), as in
 * mobilenet_v2; D (200 MB) forces both off the device:
 *   op0 bn X -> N (1000 us), op1 clone N -> C, op2 relu_ N, op3 conv N
 *   -> Y, op4 Y -> D, op5 D, op6 D -> E, op7 reads N, E -> G, op8 reads C,
 *   G -> H (100 us each but op0).
 * Each tensor alone replays the batch norm: N [op0, op2] at op7 (1100 us),
 * C [op0, op1] at op8 (1100 us). One list [op0, op1, op2] at op7 restores
 * both (1200 us): C is back one op early, still below D's stretch. */
static cap_profile_t *bn_clone(void) {
  fx_t f = {cap_profile_create(), 0, 0};
  enum { X, W, N, C, Y, D, E, G, H };
  fx_tensor(&f, X, 10 * MB, CAP_KIND_INPUT);
  fx_tensor(&f, W, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, N, 50 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, C, 50 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, Y, 1 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, D, 200 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, E, 1 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, G, 1 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, H, 1 * MB, CAP_KIND_ACTIVATION);
  uint32_t xw[] = {X, W}, n = N, c = C, nw[] = {N, W}, y = Y, d = D, e = E,
           ne[] = {N, E}, g = G, cg[] = {C, G}, h = H;
  int64_t t = 0;
  fx_op(&f, t, t + 1000 * US, "aten.cudnn_batch_norm.default", xw, 2, &n, 1);
  t += 1000 * US;
  fx_op(&f, t, t + 100 * US, "aten.clone.default", &n, 1, &c, 1);
  t += 100 * US;
  fx_op(&f, t, t + 100 * US, "aten.relu_.default", &n, 1, &n, 1);
  t += 100 * US;
  fx_op(&f, t, t + 100 * US, "aten.convolution.default", nw, 2, &y, 1);
  t += 100 * US;
  fx_op(&f, t, t + 100 * US, "aten.mul.Tensor", &y, 1, &d, 1);
  t += 100 * US;
  fx_free(&f, t, Y);
  fx_op(&f, t, t + 100 * US, "aten.mul.Tensor", &d, 1, &d, 1);
  t += 100 * US;
  fx_op(&f, t, t + 100 * US, "aten.sum.default", &d, 1, &e, 1);
  t += 100 * US;
  fx_free(&f, t, D);
  fx_op(&f, t, t + 100 * US, "aten.convolution_backward.default", ne, 2, &g, 1);
  t += 100 * US;
  fx_free(&f, t, N);
  fx_free(&f, t, E);
  fx_op(&f, t, t + 100 * US, "aten.threshold_backward.default", cg, 2, &h, 1);
  t += 100 * US;
  fx_free(&f, t, C);
  fx_free(&f, t, G);
  fx_free(&f, t, H);
  return fx_finish(&f);
}

static void test_replays_share_lineage(void) {
  cap_profile_t *p = bn_clone();
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_sim_result_t base;
  cap_plan_t *plan = start(p, 250 * MB, &cfg, &base);
  REQUIRE(plan);
  uint32_t n_list[] = {0, 2}, c_list[] = {0, 1};
  REQUIRE(cap_plan_add_recompute(plan, 2, 4, n_list, 2) == 0); /* N */
  REQUIRE(cap_plan_add_recompute(plan, 3, 1, c_list, 2) == 0); /* C */
  REQUIRE(cap_plan_validate(plan, p, NULL, 0) == 0);
  REQUIRE(cap__plan_predict(plan, p, &cfg.bw) == 0);
  CHECK_EQ(plan->predicted_iter_ns - base.iter_ns, 2200 * US);
  uint64_t peak = plan->predicted_peak_bytes;
  CHECK(peak <= cfg.budget_bytes);
  REQUIRE(cap__plan_improve(plan, p, &cfg, 64) == 0);
  CHECK_EQ(plan->predicted_iter_ns - base.iter_ns, 1200 * US);
  CHECK(plan->predicted_peak_bytes <= peak);
  const cap_action_t *a = &plan->actions[0];
  CHECK_EQ(a->tensor, 2);
  CHECK_EQ(a->n_recompute, 3);
  finish(plan, p, &base);
}

/* Y (100 MB, 2 ms to make) and X (100 MB, 10 us) are made one after the
 * other; D (170 MB) then needs both off the device (budget 260 MB):
 *   op0 Y = mm W (2 ms), op1 X = relu W, op2 reads Y, op3 2 ms on W,
 *   op4 D = mul W, op5-6 read D, op7 2 ms on W, op8 reads Y, op9 reads X.
 * Swapping X (copy 2.01-3.82 ms) and replaying Y costs 2 ms at op8; Y
 * swapped behind X's copy would free its memory only at 5.6 ms, inside
 * D's stretch (4.02-4.32 ms). Exchanged, Y's copy (2.03-3.84 ms) ends
 * before D, both prefetches fit in op7, and X replays in 10 us. */
static cap_profile_t *swap_or_replay(void) {
  fx_t f = {cap_profile_create(), 0, 0};
  enum { W, X, Y, D, T2, T3, T5, T6, T7, T8, T9 };
  fx_tensor(&f, W, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, X, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, Y, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, D, 170 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = T2; i <= T9; i++)
    fx_tensor(&f, i, 1 * MB, CAP_KIND_ACTIVATION);
  uint32_t w = W, x = X, y = Y, d = D, t2 = T2, t3 = T3, t5 = T5, t6 = T6,
           t7 = T7, t8 = T8, t9 = T9;
  fx_op(&f, 0, 2000 * US, "aten.mm.default", &w, 1, &y, 1);
  fx_op(&f, 2000 * US, 2010 * US, "aten.relu.default", &w, 1, &x, 1);
  fx_op(&f, 2010 * US, 2020 * US, "aten.add.Tensor", &y, 1, &t2, 1);
  fx_free(&f, 2020 * US, T2);
  fx_op(&f, 2020 * US, 4020 * US, "aten.mul.Tensor", &w, 1, &t3, 1);
  fx_free(&f, 4020 * US, T3);
  fx_op(&f, 4020 * US, 4120 * US, "aten.mul.Tensor", &w, 1, &d, 1);
  fx_op(&f, 4120 * US, 4220 * US, "aten.mul.Tensor", &d, 1, &t5, 1);
  fx_free(&f, 4220 * US, T5);
  fx_op(&f, 4220 * US, 4320 * US, "aten.mul.Tensor", &d, 1, &t6, 1);
  fx_free(&f, 4320 * US, D);
  fx_free(&f, 4320 * US, T6);
  fx_op(&f, 4320 * US, 6320 * US, "aten.mul.Tensor", &w, 1, &t7, 1);
  fx_free(&f, 6320 * US, T7);
  fx_op(&f, 6320 * US, 6330 * US, "aten.add.Tensor", &y, 1, &t8, 1);
  fx_free(&f, 6330 * US, Y);
  fx_free(&f, 6330 * US, T8);
  fx_op(&f, 6330 * US, 6340 * US, "aten.add.Tensor", &x, 1, &t9, 1);
  fx_free(&f, 6340 * US, X);
  fx_free(&f, 6340 * US, T9);
  return fx_finish(&f);
}

static void test_swap_exchanged_for_replay(void) {
  cap_profile_t *p = swap_or_replay();
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_sim_result_t base;
  cap_plan_t *plan = start(p, 260 * MB, &cfg, &base);
  REQUIRE(plan);
  CHECK(base.peak_bytes > cfg.budget_bytes);
  uint32_t tt, ta, y_list[] = {0};
  REQUIRE(cap__trigger_name(p, 7, 1, &tt, &ta));
  REQUIRE(cap_plan_add_swap(plan, 1, 1, tt, ta, 0) == 0);      /* X */
  REQUIRE(cap_plan_add_recompute(plan, 2, 2, y_list, 1) == 0); /* Y */
  REQUIRE(cap_plan_validate(plan, p, NULL, 0) == 0);
  REQUIRE(cap__plan_predict(plan, p, &cfg.bw) == 0);
  CHECK_EQ(plan->predicted_iter_ns - base.iter_ns, 2000 * US);
  uint64_t peak = plan->predicted_peak_bytes;
  CHECK(peak <= cfg.budget_bytes);
  REQUIRE(cap__plan_improve(plan, p, &cfg, 64) == 0);
  CHECK_EQ(plan->predicted_iter_ns - base.iter_ns, 10 * US);
  CHECK(plan->predicted_peak_bytes <= peak);
  for (uint32_t i = 0; i < plan->n_actions; i++)
    CHECK_EQ(plan->actions[i].method, plan->actions[i].tensor == 1
                                          ? CAP_METHOD_RECOMPUTE
                                          : CAP_METHOD_SWAP);
  finish(plan, p, &base);
}

/* A (100 MB) is made in 10 us and read again only at op6; D and E (150
 * MB each) fill the budget (160 MB) from op2 to op5, so A's prefetch can
 * start only when E is freed, and the budget leaves no room to keep it:
 *   op0 A = relu W (10 us), op1 2 ms on W, op2 D = mul W, op3 reads D,
 *   op4 E = mul W, op5 reads E, op6 reads A (100 us each but op0, op1).
 * Swapped, A's copy back (1.8 ms) runs on demand at op6; replayed, it
 * costs op0's 10 us. */
static cap_profile_t *late_swap(void) {
  fx_t f = {cap_profile_create(), 0, 0};
  enum { W, A, D, E, T1, T3, T5, T6 };
  fx_tensor(&f, W, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, A, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, D, 150 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, E, 150 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = T1; i <= T6; i++)
    fx_tensor(&f, i, 1 * MB, CAP_KIND_ACTIVATION);
  uint32_t w = W, a = A, d = D, e = E, t1 = T1, t3 = T3, t5 = T5, t6 = T6;
  fx_op(&f, 0, 10 * US, "aten.relu.default", &w, 1, &a, 1);
  fx_op(&f, 10 * US, 2010 * US, "aten.mul.Tensor", &w, 1, &t1, 1);
  fx_free(&f, 2010 * US, T1);
  fx_op(&f, 2010 * US, 2110 * US, "aten.mul.Tensor", &w, 1, &d, 1);
  fx_op(&f, 2110 * US, 2210 * US, "aten.sum.default", &d, 1, &t3, 1);
  fx_free(&f, 2210 * US, D);
  fx_free(&f, 2210 * US, T3);
  fx_op(&f, 2210 * US, 2310 * US, "aten.mul.Tensor", &w, 1, &e, 1);
  fx_op(&f, 2310 * US, 2410 * US, "aten.sum.default", &e, 1, &t5, 1);
  fx_free(&f, 2410 * US, E);
  fx_free(&f, 2410 * US, T5);
  fx_op(&f, 2410 * US, 2510 * US, "aten.add.Tensor", &a, 1, &t6, 1);
  fx_free(&f, 2510 * US, A);
  fx_free(&f, 2510 * US, T6);
  return fx_finish(&f);
}

static void test_late_swap_replayed(void) {
  cap_profile_t *p = late_swap();
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_sim_result_t base;
  cap_plan_t *plan = start(p, 160 * MB, &cfg, &base);
  REQUIRE(plan);
  CHECK(base.peak_bytes > cfg.budget_bytes);
  REQUIRE(cap_plan_add_swap(plan, 1, 1, CAP_NONE, 0, 0) == 0); /* on demand */
  REQUIRE(cap_plan_validate(plan, p, NULL, 0) == 0);
  REQUIRE(cap__plan_predict(plan, p, &cfg.bw) == 0);
  CHECK(plan->predicted_iter_ns - base.iter_ns > 1700 * US);
  uint64_t peak = plan->predicted_peak_bytes;
  CHECK(peak <= cfg.budget_bytes);
  REQUIRE(cap__plan_improve(plan, p, &cfg, 64) == 0);
  REQUIRE(plan->n_actions == 1);
  const cap_action_t *a = &plan->actions[0];
  CHECK_EQ(a->method, CAP_METHOD_RECOMPUTE);
  CHECK_EQ(a->n_recompute, 1);
  CHECK_EQ(plan->predicted_iter_ns - base.iter_ns, 10 * US);
  CHECK(plan->predicted_peak_bytes <= peak);
  finish(plan, p, &base);
}

/* As in bert_base's MLPs: A (100 MB, 2 ms to make, a fc1 output) and B =
 * gelu(A) (100 MB) both dropped, while C (100 MB, 10 us from the weights,
 * another layer's GELU output) stays on the device across D's stretch
 * (budget 260 MB: two of A, B, C must be off the device there):
 *   op0 A = mm W (2 ms), op1 B = gelu A, op2 C = relu W, op3 D = mul W,
 *   op4 reads D, op5 reads C, op6 reads B, op7 reads A (10 us or 100 us).
 * B's list must replay op0 (A is dropped): 2.01 ms. Keeping A instead, B's
 * list is op1 alone, and C dropped in its place replays in 10 us: no
 * higher at the peak, 2 ms faster. No single change does it: keeping A
 * alone goes over the peak, dropping C alone only adds a replay. */
/* The last read of x at *t: a 100 us sum into the small tensor out, then
 * both freed. */
static void last_read(fx_t *f, int64_t *t, uint32_t x, uint32_t out) {
  fx_op(f, *t, *t + 100 * US, "aten.sum.default", &x, 1, &out, 1);
  *t += 100 * US;
  fx_free(f, *t, x);
  fx_free(f, *t, out);
}

/* An op of length len on the weight W (tensor 0) at *t, its small output
 * out freed after. */
static void op_on_w(fx_t *f, int64_t *t, int64_t len, uint32_t out) {
  uint32_t w = 0;
  fx_op(f, *t, *t + len, "aten.mul.Tensor", &w, 1, &out, 1);
  *t += len;
  fx_free(f, *t, out);
}

static cap_profile_t *fc_gelu(void) {
  fx_t f = {cap_profile_create(), 0, 0};
  enum { W, A, B, C, D, T4, T5, T6, T7 };
  fx_tensor(&f, W, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, A, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, B, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, C, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, D, 150 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = T4; i <= T7; i++)
    fx_tensor(&f, i, 1 * MB, CAP_KIND_ACTIVATION);
  uint32_t w = W, a = A, b = B, c = C, d = D;
  fx_op(&f, 0, 2000 * US, "aten.mm.default", &w, 1, &a, 1);
  fx_op(&f, 2000 * US, 2010 * US, "aten.gelu.default", &a, 1, &b, 1);
  fx_op(&f, 2010 * US, 2020 * US, "aten.relu.default", &w, 1, &c, 1);
  fx_op(&f, 2020 * US, 2120 * US, "aten.mul.Tensor", &w, 1, &d, 1);
  int64_t t = 2120 * US;
  last_read(&f, &t, D, T4);
  last_read(&f, &t, C, T5);
  last_read(&f, &t, B, T6);
  last_read(&f, &t, A, T7);
  return fx_finish(&f);
}

/* plan, written by hand for p over the budget unmanaged (base), before the
 * trade move (its lists valid, before_ns slower than base, within the
 * budget) and after it (after_ns slower, no higher at its peak, A, tensor 1,
 * on the device after its access a_k). */
static void check_trade(cap_plan_t *plan, const cap_profile_t *p,
                        const cap_plan_config_t *cfg,
                        const cap_sim_result_t *base, uint32_t a_k,
                        int64_t before_ns, int64_t after_ns) {
  CHECK(base->peak_bytes > cfg->budget_bytes);
  REQUIRE(cap_plan_validate(plan, p, NULL, 0) == 0);
  REQUIRE(cap__plan_predict(plan, p, &cfg->bw) == 0);
  CHECK_EQ(plan->predicted_iter_ns - base->iter_ns, before_ns);
  uint64_t peak = plan->predicted_peak_bytes;
  CHECK(peak <= cfg->budget_bytes);
  REQUIRE(cap__trade_replays(plan, p, cfg, 16) == 0);
  CHECK_EQ(plan->predicted_iter_ns - base->iter_ns, after_ns);
  CHECK(plan->predicted_peak_bytes <= peak);
  CHECK_EQ(cap__find_action(plan, 1, a_k), CAP_NONE);
}

static void test_replay_traded_for_cheap_drop(void) {
  cap_profile_t *p = fc_gelu();
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_sim_result_t base;
  cap_plan_t *plan = start(p, 260 * MB, &cfg, &base);
  REQUIRE(plan);
  uint32_t a_list[] = {0}, b_list[] = {0, 1};
  REQUIRE(cap_plan_add_recompute(plan, 1, 2, a_list, 1) == 0); /* A */
  REQUIRE(cap_plan_add_recompute(plan, 2, 1, b_list, 2) == 0); /* B */
  REQUIRE(cap_plan_validate(plan, p, NULL, 0) == 0);
  REQUIRE(cap__plan_predict(plan, p, &cfg.bw) == 0);
  /* the local search alone finds nothing better */
  cap_plan_t *searched = cap_plan_clone(plan);
  REQUIRE(searched);
  REQUIRE(cap__plan_improve(searched, p, &cfg, 64) == 0);
  CHECK_EQ(searched->predicted_iter_ns, plan->predicted_iter_ns);
  cap_plan_destroy(searched);
  check_trade(plan, p, &cfg, &base, 2, 2010 * US, 20 * US);
  uint32_t bi = cap__find_action(plan, 2, 1), ci = cap__find_action(plan, 3, 1);
  REQUIRE(bi != CAP_NONE && ci != CAP_NONE);
  CHECK_EQ(plan->actions[bi].n_recompute, 1); /* gelu alone */
  CHECK_EQ(plan->actions[ci].method, CAP_METHOD_RECOMPUTE);
  finish(plan, p, &base);
}

/* A costly matrix product A (1.5 ms) and a cheap chain X1 = relu(W), X2 =
 * neg(X1) (10 us each, 100 MB each), all live at the peak (op 4, D);
 * long ops (3 ms on W) give copies time: before the peak, after it, and
 * before X1's read; a short op (100 us) comes just before X2's read:
 *   op0 A = mm W (1.5 ms), op1 X1, op2 X2 = neg X1, op3 long, op4 D = mul
 *   W, op5 reads D, op6 long, op7 short, op8 reads X2, op9 long, op10
 *   reads X1, op11 reads A. */
static cap_profile_t *late_source(void) {
  fx_t f = {cap_profile_create(), 0, 0};
  enum { W, A, X1, X2, D, T3, T5, T6, T7, T8, T9, T10, T11 };
  fx_tensor(&f, W, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, A, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, X1, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, X2, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, D, 201 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = T3; i <= T11; i++)
    fx_tensor(&f, i, 4096, CAP_KIND_ACTIVATION);
  uint32_t w = W, a = A, x1 = X1, x2 = X2, d = D;
  fx_op(&f, 0, 1500 * US, "aten.mm.default", &w, 1, &a, 1);
  fx_op(&f, 1500 * US, 1510 * US, "aten.relu.default", &w, 1, &x1, 1);
  fx_op(&f, 1510 * US, 1520 * US, "aten.neg.default", &x1, 1, &x2, 1);
  int64_t t = 1520 * US;
  op_on_w(&f, &t, 3000 * US, T3);
  fx_op(&f, t, t + 100 * US, "aten.mul.Tensor", &w, 1, &d, 1);
  t += 100 * US;
  last_read(&f, &t, D, T5);
  op_on_w(&f, &t, 3000 * US, T6);
  op_on_w(&f, &t, 100 * US, T7);
  last_read(&f, &t, X2, T8);
  op_on_w(&f, &t, 3000 * US, T9);
  last_read(&f, &t, X1, T10);
  last_read(&f, &t, A, T11);
  return fx_finish(&f);
}

/* The plan drops A and X1. The only tensor to drop in A's place is X2,
 * whose source X1 the plan has off the device when X2 comes back: its list
 * replays X1 too, which brings X1 back for its own read, so the trade costs
 * 20 us instead of 1.5 ms, at the same peak. */
static void test_replay_traded_for_drop_of_dropped_source(void) {
  cap_profile_t *p = late_source();
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_sim_result_t base;
  cap_plan_t *plan = start(p, 310 * MB, &cfg, &base);
  REQUIRE(plan);
  uint32_t a_list[] = {0}, x1_list[] = {1};
  REQUIRE(cap_plan_add_recompute(plan, 1, 1, a_list, 1) == 0);  /* A */
  REQUIRE(cap_plan_add_recompute(plan, 2, 2, x1_list, 1) == 0); /* X1 */
  check_trade(plan, p, &cfg, &base, 1, 1510 * US, 20 * US);
  uint32_t xi = cap__find_action(plan, 3, 1);
  REQUIRE(xi != CAP_NONE);
  CHECK_EQ(plan->actions[xi].n_recompute, 2); /* relu, then neg */
  finish(plan, p, &base);
}

/* The plan drops A (1.5 ms to replay) and swaps X1, its prefetch issued at
 * op 9. Dropping X2 in A's place needs X1 back for X2's list at op 8: its
 * prefetch, moved to op 7, comes 1.7 ms late, slower than A's replay.
 * Started that much earlier (op 6, after the peak), it is on time: the
 * trade costs X2's 10 us replay, at the same peak. */
static void test_trade_moves_late_prefetch_earlier(void) {
  cap_profile_t *p = late_source();
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_sim_result_t base;
  cap_plan_t *plan = start(p, 310 * MB, &cfg, &base);
  REQUIRE(plan);
  uint32_t tt, ta, a_list[] = {0};
  REQUIRE(cap__trigger_name(p, 9, 2, &tt, &ta));
  REQUIRE(cap_plan_add_recompute(plan, 1, 1, a_list, 1) == 0); /* A */
  REQUIRE(cap_plan_add_swap(plan, 2, 2, tt, ta, 0) == 0);      /* X1 */
  check_trade(plan, p, &cfg, &base, 1, 1500 * US, 10 * US);
  uint32_t xi = cap__find_action(plan, 3, 1), si = cap__find_action(plan, 2, 2);
  REQUIRE(xi != CAP_NONE && si != CAP_NONE);
  CHECK_EQ(plan->actions[xi].method, CAP_METHOD_RECOMPUTE);
  CHECK(cap_profile_access_op(p, plan->actions[si].prefetch_tensor,
                              plan->actions[si].prefetch_access) <= 6);
  finish(plan, p, &base);
}

int main(void) {
  RUN_TEST(test_late_prefetch_moves_earlier);
  RUN_TEST(test_replays_share_lineage);
  RUN_TEST(test_swap_exchanged_for_replay);
  RUN_TEST(test_late_swap_replayed);
  RUN_TEST(test_replay_traded_for_cheap_drop);
  RUN_TEST(test_replay_traded_for_drop_of_dropped_source);
  RUN_TEST(test_trade_moves_late_prefetch_earlier);
  return TEST_SUMMARY();
}
