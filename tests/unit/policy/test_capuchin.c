/*
 * The Capuchin planner on small hand-built profiles whose right answer is
 * known: a swap that hides, a recompute where a swap cannot hide, an input
 * written in place that forbids replaying its reader, an impossible budget,
 * persistent tensors only when allowed, a greedy choice undone by planning
 * again without it, the copy engine given to the tensor costliest to
 * replay, and every plan checked by the validator and the simulator;
 * and, on a bundled trace, the last moves run on the runner-up too.
 */
#include <string.h>

#include "cap_test.h"
#include "capuchin/trace.h"
#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "fixtures.h"

/* Plan with capuchin and check the plan against the validator and an
 * independent simulation. */
static int plan_checked(const cap_profile_t *p, const cap_plan_config_t *cfg,
                        cap_plan_t **out, cap_sim_result_t *r) {
  int rc = cap_plan_compute(p, "capuchin", cfg, out);
  if (!*out)
    return rc;
  char err[256];
  int v = cap_plan_validate(*out, p, err, sizeof err);
  if (v)
    fprintf(stderr, "invalid plan: %s\n", err);
  CHECK_EQ(v, 0);
  memset(r, 0, sizeof *r);
  CHECK_EQ(cap_sim_run(p, *out, &cfg->bw, r), 0);
  CHECK_EQ(r->peak_bytes, (*out)->predicted_peak_bytes);
  CHECK_EQ(r->iter_ns, (*out)->predicted_iter_ns);
  if (rc == 0)
    CHECK(r->peak_bytes <= cfg->budget_bytes);
  return rc;
}

static void test_fits_unmanaged(void) {
  cap_profile_t *p = one_big(5, 5, 5, 1000 * US, 10 * US);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 200 * MB);
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  CHECK_EQ(plan->n_actions, 0);
  CHECK_STR(plan->policy, "capuchin");
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_swap_hidden(void) {
  /* 5 ms on each side of the peak; 100 MB take about 2.3 ms each way */
  cap_profile_t *p = one_big(5, 5, 5, 1000 * US, 10 * US);
  REQUIRE(p);
  cap_sim_result_t base;
  memset(&base, 0, sizeof base);
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  REQUIRE(cap_sim_run(p, NULL, &bw, &base) == 0);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 120 * MB);
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  REQUIRE(plan->n_actions == 1);
  const cap_action_t *a = &plan->actions[0];
  CHECK_EQ(a->tensor, 1);
  CHECK_EQ(a->evict_after_access, 1);
  CHECK_EQ(a->method, CAP_METHOD_SWAP);
  CHECK(a->prefetch_tensor != CAP_NONE); /* prefetched, not on demand */
  CHECK_EQ(r.stall_ns, 0);
  CHECK_EQ(r.iter_ns, base.iter_ns); /* fully hidden */
  CHECK_EQ(r.swap_out_bytes, 100 * MB);
  CHECK(r.peak_bytes <= 120 * MB);
  cap_sim_result_close(&r);
  cap_sim_result_close(&base);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_recompute_when_swap_cannot_hide(void) {
  /* 300 us stretches: a 100 MB swap (2.3 ms each way) cannot relieve the
   * peak, but the 10 us producer can be replayed */
  cap_profile_t *p = one_big(3, 3, 3, 100 * US, 10 * US);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 120 * MB);
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  REQUIRE(plan->n_actions == 1);
  const cap_action_t *a = &plan->actions[0];
  CHECK_EQ(a->method, CAP_METHOD_RECOMPUTE);
  REQUIRE(a->n_recompute == 1);
  CHECK_EQ(cap_action_recompute_ops(plan, a)[0], 0);
  CHECK_EQ(r.recompute_ns, 10 * US);
  CHECK_EQ(r.stall_ns, 0);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_exposed_swap_cheaper_than_recompute(void) {
  /* the swap-out hides before the peak, the swap-in cannot (nothing runs
   * between the peak and the back-access); replaying the 20 ms producer
   * costs far more than waiting about 2 ms for the swap-in */
  cap_profile_t *p = one_big(5, 3, 0, 1000 * US, 20000 * US);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 120 * MB);
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  REQUIRE(plan->n_actions == 1);
  CHECK_EQ(plan->actions[0].method, CAP_METHOD_SWAP);
  CHECK_EQ(r.recompute_ns, 0);
  CHECK(r.stall_ns > 0 && r.stall_ns < 5000 * US);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* X (50 MB) = op0(W); A (100 MB) = op1(X); op2 = relu_(X) in place, then
 * X dies; op3 makes a 60 MB temporary (the peak, 100 us: no swap of A can
 * relieve it); op4 reads A. Replaying op1 needs X as op1 read it, before
 * the in-place write: only a list that rebuilds X first (op0, op1) is
 * correct. */
static void test_inplace_input_not_replayed(void) {
  fx_t f = {cap_profile_create(), 0, 0};
  uint32_t W = 0, X = 1, A = 2;
  fx_tensor(&f, W, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, X, 50 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, A, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, 3, 60 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, 4, 1 * MB, CAP_KIND_ACTIVATION);
  fx_op(&f, 0, 10 * US, "aten.mm.default", &W, 1, &X, 1);
  fx_op(&f, 10 * US, 20 * US, "aten.mm.default", &X, 1, &A, 1);
  fx_op(&f, 20 * US, 30 * US, "aten.relu_.default", &X, 1, &X, 1);
  fx_free(&f, 30 * US, X);
  uint32_t s = 3;
  fx_op(&f, 30 * US, 130 * US, "aten.mul.Tensor", &W, 1, &s, 1);
  fx_free(&f, 130 * US, 3);
  uint32_t o = 4;
  fx_op(&f, 130 * US, 140 * US, "aten.add.Tensor", &A, 1, &o, 1);
  fx_free(&f, 140 * US, A);
  fx_free(&f, 140 * US, o);
  cap_profile_t *p = fx_finish(&f);
  REQUIRE(p);
  cap_plan_config_t cfg;
  /* the peak is 161 MB; the replay itself needs W, X and A (151 MB) */
  cap_plan_config_init(&cfg, 160 * MB);
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  REQUIRE(plan->n_actions == 1);
  const cap_action_t *a = &plan->actions[0];
  CHECK_EQ(a->tensor, A);
  CHECK_EQ(a->method, CAP_METHOD_RECOMPUTE);
  REQUIRE(a->n_recompute == 2);
  CHECK_EQ(cap_action_recompute_ops(plan, a)[0], 0);
  CHECK_EQ(cap_action_recompute_ops(plan, a)[1], 1);
  CHECK_EQ(r.recompute_ns, 20 * US);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_infeasible_reports_smallest_peak(void) {
  cap_profile_t *p = one_big(5, 5, 5, 1000 * US, 10 * US);
  REQUIRE(p);
  cap_plan_config_t cfg;
  /* the last op needs A, W and its output on the device: 102 MB */
  cap_plan_config_init(&cfg, 90 * MB);
  cap_plan_t *plan = NULL;
  CHECK_EQ(cap_plan_compute(p, "capuchin", &cfg, &plan), CAP_EINFEASIBLE);
  REQUIRE(plan);
  CHECK(plan->predicted_peak_bytes > 90 * MB);
  CHECK(plan->predicted_peak_bytes <= 102 * MB); /* A evicted where it can */
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* A 200 MB weight used at the first and the last op only; ten 2 ms ops in
 * between, the middle three making 50 MB temporaries (the peak: 251 MB).
 * The budget (220 MB) fits only if the weight leaves the device. */
static const uint32_t Wb = 0, Ws = 1; /* big_weight()'s two weights */

/* no_evict marks Wb as one the framework cannot give up; untracked bytes
 * were resident before the iteration in no tensor (a workspace). */
static cap_profile_t *big_weight(bool no_evict, uint64_t untracked) {
  fx_t f = {cap_profile_create(), 0, 0};
  fx_tensor(&f, Wb, 200 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, Ws, 1 * MB, CAP_KIND_PARAM);
  for (uint32_t i = 0; i < 12; i++)
    fx_tensor(&f, 2 + i, i >= 5 && i <= 7 ? 50 * MB : 1 * MB,
              CAP_KIND_ACTIVATION);
  int64_t t = 0;
  uint32_t o = 2;
  fx_op(&f, t, t + 10 * US, "aten.mm.default", &Wb, 1, &o, 1);
  t += 10 * US;
  fx_free(&f, t, o);
  for (uint32_t i = 0; i < 10; i++) {
    o = 3 + i;
    fx_op(&f, t, t + 2000 * US, "aten.mul.Tensor", &Ws, 1, &o, 1);
    t += 2000 * US;
    fx_free(&f, t, o);
  }
  o = 13;
  fx_op(&f, t, t + 10 * US, "aten.mm.default", &Wb, 1, &o, 1);
  t += 10 * US;
  fx_free(&f, t, o);
  if (no_evict && !f.err)
    f.err = cap_profile_set_no_evict(f.p, Wb);
  char resident[32];
  snprintf(resident, sizeof resident, "%" PRIu64, 201 * MB + untracked);
  if (untracked && !f.err)
    f.err = cap_profile_set_meta(f.p, "resident_bytes", resident);
  return fx_finish(&f);
}

static void test_persistent_only_when_allowed(void) {
  cap_profile_t *p = big_weight(false, 0);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 220 * MB);
  cap_plan_t *plan = NULL;
  CHECK_EQ(cap_plan_compute(p, "capuchin", &cfg, &plan), CAP_EINFEASIBLE);
  if (plan)
    CHECK_EQ(plan->n_actions, 0);
  cap_plan_destroy(plan);
  plan = NULL;
  cfg.evict_persistent = true;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  REQUIRE(plan->n_actions == 1);
  CHECK_EQ(plan->actions[0].tensor, Wb);
  CHECK_EQ(plan->actions[0].method, CAP_METHOD_SWAP);
  CHECK(plan->actions[0].prefetch_tensor != CAP_NONE);
  CHECK_EQ(r.stall_ns, 0);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* The same weight, but the framework cannot give it up (a storage NumPy
 * shares): with persistent eviction no planner may evict it, capuchin
 * reports the budget infeasible, and the validator rejects a plan that
 * evicts it, which it accepts for the unmarked profile. */
static void test_no_evict_persistent(void) {
  cap_profile_t *p = big_weight(true, 0), *q = big_weight(false, 0);
  REQUIRE(p && q);
  CHECK(p->tensors[Wb].no_evict);
  CHECK(!p->tensors[Ws].no_evict);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 220 * MB);
  cfg.evict_persistent = true;
  /* Wb counts at every op when it cannot leave, else only at its own; Ws
   * counts at the first mm, before its first access (a plan evicts after
   * an access), and at the last, after its last (and it has no later one
   * to come back for). */
  CHECK_EQ(cap_plan_min_budget(p, &cfg), (uint64_t)251 * MB);
  CHECK_EQ(cap_plan_min_budget(q, &cfg), (uint64_t)202 * MB);
  char err[256];
  for (size_t i = 0; cap_planner_names[i]; i++) {
    cap_plan_t *plan = NULL;
    int rc = cap_plan_compute(p, cap_planner_names[i], &cfg, &plan);
    CHECK(rc == 0 || rc == CAP_EINFEASIBLE);
    if (!strcmp(cap_planner_names[i], "capuchin"))
      CHECK_EQ(rc, CAP_EINFEASIBLE);
    for (uint32_t k = 0; plan && k < plan->n_actions; k++)
      CHECK(plan->actions[k].tensor != Wb);
    if (plan)
      CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
    cap_plan_destroy(plan);
  }
  cap_plan_t *bad = cap_plan_create("capuchin", 220 * MB);
  REQUIRE(bad);
  CHECK_EQ(cap_plan_add_swap(bad, Wb, 1, CAP_NONE, 0, 0), 0);
  CHECK_EQ(cap_plan_validate(bad, q, err, sizeof err), 0);
  CHECK(cap_plan_validate(bad, p, err, sizeof err) != 0);
  CHECK(strstr(err, "no_evict") != NULL);
  cap_plan_destroy(bad);
  cap_profile_destroy(q);
  cap_profile_destroy(p);
}

/* Bytes resident before the iteration that no tensor accounts for never
 * leave, with persistent eviction too: the floor counts them, and the
 * planner meets that floor exactly (Wb swapped out around the muls). */
static void test_floor_counts_untracked(void) {
  cap_profile_t *p = big_weight(false, 30 * MB);
  REQUIRE(p);
  CHECK_EQ(cap_profile_untracked_bytes(p), (uint64_t)30 * MB);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 232 * MB);
  cfg.evict_persistent = true;
  CHECK_EQ(cap_plan_min_budget(p, &cfg), (uint64_t)232 * MB);
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  CHECK(r.peak_bytes <= 232 * MB);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  plan = NULL;
  cfg.budget_bytes = 232 * MB - 1;
  CHECK_EQ(cap_plan_compute(p, "capuchin", &cfg, &plan), CAP_EINFEASIBLE);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* The gradient pattern: G is read last by the optimizer (op 1) but freed
 * only at zero_grad (4 ms), across op 2's 150 MB temporary. Releasing G
 * after its last access costs nothing and is the only way under 350 MB
 * (T is read by the very next op, no gap to evict it over). */
static void test_release_lingering_gradient(void) {
  fx_t f = {cap_profile_create(), 0, 0};
  uint32_t W = 0, M = 1, G = 2, T = 3;
  fx_tensor(&f, W, 100 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, M, 100 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, G, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, T, 150 * MB, CAP_KIND_ACTIVATION);
  uint32_t gm[] = {G, M};
  fx_op(&f, 0, 1000 * US, "aten.mm.default", &W, 1, &G, 1);
  fx_op(&f, 1000 * US, 2000 * US, "aten._foreach_add_.List", gm, 2, NULL, 0);
  fx_op(&f, 2000 * US, 3000 * US, "aten.mm.default", &W, 1, &T, 1);
  fx_op(&f, 3000 * US, 4000 * US, "aten.sum.default", &T, 1, NULL, 0);
  fx_free(&f, 4000 * US, T);
  fx_free(&f, 4000 * US, G);
  cap_profile_t *p = fx_finish(&f);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 350 * MB);
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  REQUIRE(plan->n_actions == 1);
  CHECK_EQ(plan->actions[0].tensor, G);
  CHECK_EQ(plan->actions[0].evict_after_access, 2);
  CHECK(cap_action_is_release(&plan->actions[0]));
  CHECK_EQ(r.iter_ns, 4000 * US);
  CHECK_EQ(r.peak_bytes, 350 * MB);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  /* Below what the ops themselves need: infeasible, releases or not. */
  cfg.budget_bytes = 340 * MB;
  CHECK_EQ(cap_plan_compute(p, "capuchin", &cfg, &plan), CAP_EINFEASIBLE);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_replan_without_costly_replay(void) {
  /* W (param) makes A (100 MB, 10 us), B and C (60 MB, 5.5 us each); op 3
   * makes a 150 MB temporary: the peak, 100 MB over the budget. A, B and C
   * are read again at ops 4, 5, 6. Copies are far too slow to hide, so only
   * replays relieve op 3: A alone (10 us) or B and C (11 us). By memory
   * saving per second the greedy takes B, then C (each 10.9 MB/us against
   * A's 10), and pruning can undo neither. Banned from replaying B, it
   * takes C then A, and pruning undoes C: A alone, 1 us faster. */
  fx_t f = {cap_profile_create(), 0, 0};
  uint32_t w = 0, a = 1, b = 2, c = 3, big = 4, o[3] = {5, 6, 7};
  fx_tensor(&f, w, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, a, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, b, 60 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, c, 60 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, big, 150 * MB, CAP_KIND_ACTIVATION);
  for (int i = 0; i < 3; i++)
    fx_tensor(&f, o[i], 1 * MB, CAP_KIND_ACTIVATION);
  fx_op(&f, 0, 10 * US, "aten.mm.default", &w, 1, &a, 1);
  fx_op(&f, 10 * US, 15500, "aten.mm.default", &w, 1, &b, 1);
  fx_op(&f, 15500, 21 * US, "aten.mm.default", &w, 1, &c, 1);
  fx_op(&f, 21 * US, 31 * US, "aten.mm.default", &w, 1, &big, 1);
  fx_free(&f, 31 * US, big);
  uint32_t reads[3] = {a, b, c};
  for (int i = 0; i < 3; i++) {
    int64_t t = (31 + 10 * i) * US;
    fx_op(&f, t, t + 10 * US, "aten.relu.default", &reads[i], 1, &o[i], 1);
    fx_free(&f, t + 10 * US, reads[i]);
    fx_free(&f, t + 10 * US, o[i]);
  }
  cap_profile_t *p = fx_finish(&f);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, (1 + 100 + 60 + 60 + 150 - 100) * MB);
  cfg.bw = (cap_bandwidth_t){0.001, 0.001, 0.002};
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  REQUIRE(plan->n_actions == 1);
  CHECK_EQ(plan->actions[0].tensor, a);
  CHECK_EQ(plan->actions[0].method, CAP_METHOD_RECOMPUTE);
  CHECK_EQ(r.recompute_ns, 10 * US);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* X (100 MB) is made by a 10 us op from W, then Y (99 MB) by a 1 ms op;
 * four 0.5 ms ops, then op 6 (3.01 ms) makes a 200 MB temporary: the peak,
 * 199 MB over the budget, so both must leave. Six 0.5 ms ops later op 13
 * reads Y and op 14 reads X. A 100 MB copy takes 1.8 ms at 55.1 GB/s: the
 * D2H engine can take one of them out before the peak, not both. */
static cap_profile_t *one_copy_before_peak(void) {
  fx_t f = {cap_profile_create(), 0, 0};
  uint32_t w = 0, x = 1, y = 2, big = 3;
  fx_tensor(&f, w, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, x, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, y, 99 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, big, 200 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = 0; i < 12; i++) /* ten temporaries, the readers' outputs */
    fx_tensor(&f, 4 + i, 1 * MB, CAP_KIND_ACTIVATION);
  fx_op(&f, 0, 10 * US, "aten.mm.default", &w, 1, &x, 1);
  fx_op(&f, 10 * US, 1010 * US, "aten.mm.default", &w, 1, &y, 1);
  int64_t t = 1010 * US;
  uint32_t tmp = 4;
  for (int i = 0; i < 11; i++, t += 500 * US) {
    if (i == 4) { /* op 6, the peak: 1 ms */
      fx_op(&f, t, t + 1000 * US, "aten.mm.default", &w, 1, &big, 1);
      fx_free(&f, t + 1000 * US, big);
      t += 500 * US;
      continue;
    }
    fx_op(&f, t, t + 500 * US, "aten.mul.Tensor", &w, 1, &tmp, 1);
    fx_free(&f, t + 500 * US, tmp++);
  }
  uint32_t reads[2] = {y, x};
  for (int i = 0; i < 2; i++, t += 10 * US) {
    fx_op(&f, t, t + 10 * US, "aten.relu.default", &reads[i], 1, &tmp, 1);
    fx_free(&f, t + 10 * US, reads[i]);
    fx_free(&f, t + 10 * US, tmp++);
  }
  return fx_finish(&f);
}

static void test_copy_engine_to_costliest_replay(void) {
  /* By free time X's swap comes first, and Y's, queued behind it, would
   * free its memory after the peak has begun: Y is replayed (1 ms). Given
   * first to the tensor costliest to replay per byte, the D2H engine takes
   * Y and X is replayed (10 us). That also needs the copy booked at the
   * full 55.1 GB/s (it ends at 2.81 ms): at the 42.9 GB/s each direction
   * gets while both run it would end at 3.32 ms, after the peak has begun,
   * but the forward pass runs no prefetch. */
  cap_profile_t *p = one_copy_before_peak();
  REQUIRE(p);
  cap_curve_t cv;
  REQUIRE(cap_curve_compute(p, &cv) == 0);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, cv.peak_bytes - 199 * MB);
  cap_curve_close(&cv);
  cap_sim_result_t base;
  REQUIRE(cap_sim_run(p, NULL, &cfg.bw, &base) == 0);
  cap_plan_t *plan = NULL;
  cap_sim_result_t r;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  REQUIRE(plan->n_actions == 2);
  for (uint32_t i = 0; i < 2; i++) /* Y (tensor 2) swapped, X replayed */
    CHECK_EQ(plan->actions[i].method, plan->actions[i].tensor == 2
                                          ? CAP_METHOD_SWAP
                                          : CAP_METHOD_RECOMPUTE);
  CHECK_EQ(r.stall_ns, 0);
  CHECK_EQ(r.recompute_ns, 10 * US);
  CHECK_EQ(r.iter_ns, base.iter_ns + 10 * US);
  cap_sim_result_close(&base);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_bad_arguments(void) {
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 1);
  cap_plan_t *plan = NULL;
  CHECK_EQ(cap_plan_compute(NULL, "capuchin", &cfg, &plan), CAP_EINVAL);
  cap_profile_t *p = cap_profile_create(); /* not finished */
  REQUIRE(p);
  CHECK_EQ(cap_plan_compute(p, "capuchin", &cfg, &plan), CAP_EINVAL);
  CHECK(plan == NULL);
  cap_profile_destroy(p);
}

/* A swap-out that outlasts the op after its evicted-access: a1 (8 MiB, the
 * copy takes 152 us) leaves after op1, op2 lasts 39 us, and op3 needs the
 * room. The greedy books the swap's memory from op4 on and has nothing left
 * for op3; the plan fits because op3's allocation waits for the copy
 * (docs/plan-semantics.md), 112 us, sooner than a swap whose next op waits
 * for it (CAP_ACTION_SYNC_OUT: 152 us; the only way before allocations
 * waited). (The install test's consumer model under load; 23 of 200 random
 * timings of it found no plan before.) Op0 takes 344 us: replaying a1
 * would cost more than its copy, and the plan keeps the swap. */
static void test_late_swap_out_fits(void) {
  static const char trace[] = "capuchin-trace 1\n"
                              "meta model=consumer\n"
                              "tensor 0 1048576 param\n"
                              "tensor 1 8388608 activation\n"
                              "tensor 2 8388608 activation\n"
                              "tensor 3 8388608 activation\n"
                              "tensor 4 8388608 activation\n"
                              "tensor 5 1048576 activation\n"
                              "tensor 6 1048576 activation\n"
                              "op 0 1000 345040 aten::mul 0 1\n"
                              "op 1 346040 3292610 aten::mul 1 2\n"
                              "op 2 3293610 3332441 aten::relu_ 2 2\n"
                              "op 3 3333441 4450027 aten::mul 2 3\n"
                              "op 4 4450027 9216016 aten::mul 3 4\n"
                              "op 5 9217016 12396906 aten::mul 4 5\n"
                              "op 6 13372306 13407758 aten::mul 5,1 6\n"
                              "free 4450518 2\n"
                              "free 9217442 3\n"
                              "free 12398160 4\n"
                              "free 13407858 1\n"
                              "free 13407858 5\n"
                              "free 13407858 6\n";
  cap_profile_t *p = NULL;
  char err[256];
  REQUIRE(cap_trace_parse(trace, sizeof trace - 1, "late", &p, err,
                          sizeof err) == 0);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 20 * 1048576);
  cap_plan_t *plan = NULL;
  CHECK_EQ(cap_plan_compute(p, "capuchin", &cfg, &plan), 0);
  REQUIRE(plan);
  CHECK(plan->predicted_peak_bytes <= cfg.budget_bytes);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  uint32_t swap = CAP_NONE;
  for (uint32_t i = 0; i < plan->n_actions; i++)
    if (plan->actions[i].tensor == 1 &&
        plan->actions[i].method == CAP_METHOD_SWAP)
      swap = i;
  REQUIRE(swap != CAP_NONE);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &cfg.bw, &r) == 0);
  CHECK(r.room_wait_ns > 0);
  CHECK(r.peak_bytes <= cfg.budget_bytes);
  int64_t waited = r.iter_ns;
  cap_sim_result_close(&r);
  /* the compute stream waiting for the copy right after op1 fits too, but
   * waits longer */
  plan->actions[swap].flags |= CAP_ACTION_SYNC_OUT;
  REQUIRE(cap_sim_run(p, plan, &cfg.bw, &r) == 0);
  CHECK(r.peak_bytes <= cfg.budget_bytes);
  CHECK(r.iter_ns > waited);
  CHECK_EQ(r.room_wait_ns, 0);
  cap_sim_result_close(&r);
  /* without the wait for room (no budget: nothing to wait for) the plan
   * goes over the budget at op3 */
  plan->actions[swap].flags &= ~CAP_ACTION_SYNC_OUT;
  plan->budget_bytes = 0;
  REQUIRE(cap_sim_run(p, plan, &cfg.bw, &r) == 0);
  CHECK(r.peak_bytes > cfg.budget_bytes);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* The planned overhead over unmanaged, %, of trace at budget bytes (with
 * persistent tensors evictable when evict_persistent), into *pct (100
 * when no plan comes back); the plan checked by plan_checked. */
static void planned_overhead(const char *trace, uint64_t budget,
                             bool evict_persistent, double *pct) {
  *pct = 100.0;
  cap_profile_t *p = NULL;
  char err[256];
  REQUIRE(cap_trace_load(cap_test_data(trace), &p, err, sizeof err) == 0);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, budget);
  cfg.evict_persistent = evict_persistent;
  cap_sim_result_t base, r;
  memset(&base, 0, sizeof base);
  memset(&r, 0, sizeof r);
  REQUIRE(cap_sim_run(p, NULL, &cfg.bw, &base) == 0);
  cap_plan_t *plan = NULL;
  CHECK_EQ(plan_checked(p, &cfg, &plan, &r), 0);
  REQUIRE(plan);
  *pct = 100.0 * (double)(r.iter_ns - base.iter_ns) / (double)base.iter_ns;
  printf("%s at %llu bytes%s: %.2f %% over unmanaged\n", trace,
         (unsigned long long)budget,
         evict_persistent ? ", persistent tensors evictable" : "", *pct);
  cap_sim_result_close(&r);
  cap_sim_result_close(&base);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* Plans the moves after the search must reach, each at the lower bound's
 * budget: the overhead % over the unmanaged iteration must stay under
 * `under`. Each fails without the move it names. */
static const struct {
  const char *move, *trace;
  uint64_t budget;
  bool evict_persistent;
  double under;
} reached[] = {
    /* The last moves (substitution, polish, exchange, group, trade) are
     * local searches, run on the best searched plan and on the runner-up:
     * on mobilenet_v2 at 50 % the best searched plan ends them at 8.08 %,
     * the runner-up at 7.79 %; the planner keeps the faster. */
    {"the last moves on the runner-up", "traces/mobilenet_v2.trace",
     2568439524u, false, 7.9},
    /* bert_base at 50 %: 0.81 % with one round of the last moves, 0.74 %
     * with a second (the exchange, the trigger polish and the trade again
     * on what the room pass changed). */
    {"a second round", "traces/bert_base.trace", 2906604500u, false, 0.78},
    /* inception_v3 at 80 %: four concatenations of 54 MiB are replayed,
     * 42 us each; dropping one of 86 MiB (67 us) makes room for two of
     * them, which none of them alone pays for. 0.34 % without the trade of
     * pairs, 0.31 % with. */
    {"the trade of pairs", "traces/inception_v3.trace", 5289626144u, false,
     0.33},
    /* mobilenet_v2 at 40 %: 10.64 % with the trades the estimate of each
     * op's bytes accepts, 10.46 % with the near trade too, whose drops may
     * leave some of the kept bytes uncovered, the simulator judging. */
    {"the near trade", "traces/mobilenet_v2.trace", 2068066550u, false, 10.55},
    /* inception_v3 at 60 %: keeping the first convolution's 338 MiB output
     * instead of replaying it (0.75 ms) needs max_pool2d's output dropped
     * and its indices, swapped, replayed with it: their copy leaves the D2H
     * queue and later swaps finish before the memory peak. 3.54 % without
     * the swaps riding along, 3.19 % with. */
    {"the near trade's ride-along", "traces/inception_v3.trace", 4032053864u,
     false, 3.35},
    /* bert_base at 30 % with persistent tensors evictable, near its floor:
     * the compute stream waits 13.7 ms for copies queued at the memory
     * peak. Swaps cheaper to replay than to copy out, replayed instead,
     * shorten the queues: 22.3 % without, 14.8 % with. */
    {"swaps replayed off the queues", "traces/bert_base.trace", 2094421560u,
     true, 18.0},
    /* mobilenet_v2 at 30 %: the trade using the room with four times the
     * tries, once more on a copy of the plan as it came to the trades,
     * ends on another plan: 16.97 % without it, 15.58 % with. */
    {"the deeper trade", "traces/mobilenet_v2.trace", 1567693576u, false, 16.3},
};

static void test_moves_reach(void) {
  for (size_t i = 0; i < sizeof reached / sizeof *reached; i++) {
    double pct;
    planned_overhead(reached[i].trace, reached[i].budget,
                     reached[i].evict_persistent, &pct);
    if (!(pct < reached[i].under))
      printf("%s: %.2f %%, not under %.2f %%\n", reached[i].move, pct,
             reached[i].under);
    CHECK(pct < reached[i].under);
  }
}

int main(void) {
  RUN_TEST(test_fits_unmanaged);
  RUN_TEST(test_swap_hidden);
  RUN_TEST(test_recompute_when_swap_cannot_hide);
  RUN_TEST(test_exposed_swap_cheaper_than_recompute);
  RUN_TEST(test_inplace_input_not_replayed);
  RUN_TEST(test_infeasible_reports_smallest_peak);
  RUN_TEST(test_persistent_only_when_allowed);
  RUN_TEST(test_no_evict_persistent);
  RUN_TEST(test_floor_counts_untracked);
  RUN_TEST(test_release_lingering_gradient);
  RUN_TEST(test_replan_without_costly_replay);
  RUN_TEST(test_copy_engine_to_costliest_replay);
  RUN_TEST(test_bad_arguments);
  RUN_TEST(test_late_swap_out_fits);
  RUN_TEST(test_moves_reach);
  return TEST_SUMMARY();
}
