/*
 * The simulator on small hand-built profiles whose answers are worked out by
 * hand in the comments. Bandwidths are 1 GB/s = 1 byte/ns so that a copy of
 * N bytes takes N ns.
 */
#include "cap_test.h"

#include "capuchin/error.h"
#include "capuchin/plan.h"
#include "capuchin/profile.h"
#include "capuchin/sim.h"

#define N CAP_NONE

typedef struct {
  int64_t s, e;
  uint32_t in[4], n_in;
  uint32_t out[4], n_out;
  const char *name;
} op_spec_t;

static cap_profile_t *build(const uint64_t *bytes, const cap_tensor_kind_t *kind,
                            uint32_t n_t, const op_spec_t *ops, uint32_t n_ops,
                            const int64_t (*frees)[2], uint32_t n_frees) {
  cap_profile_t *p = cap_profile_create();
  if (!p)
    return NULL;
  for (uint32_t i = 0; i < n_t; i++)
    if (cap_profile_add_tensor(p, i, bytes[i], kind[i]))
      goto fail;
  for (uint32_t i = 0; i < n_ops; i++)
    if (cap_profile_add_op(p, i, ops[i].s, ops[i].e,
                           ops[i].name ? ops[i].name : "aten.mm.default",
                           ops[i].in, ops[i].n_in, ops[i].out, ops[i].n_out))
      goto fail;
  for (uint32_t i = 0; i < n_frees; i++)
    if (cap_profile_add_free(p, frees[i][0], (uint32_t)frees[i][1]))
      goto fail;
  if (cap_profile_finish(p))
    goto fail;
  return p;
fail:
  fprintf(stderr, "build: %s\n", cap_profile_error(p));
  cap_profile_destroy(p);
  return NULL;
}

static const cap_bandwidth_t BW1 = {1.0, 1.0, 2.0}; /* no duplex limit */

/* Bytes on the simulated curve at time t. */
static uint64_t mem_at(const cap_sim_result_t *r, int64_t t) {
  uint64_t b = 0;
  for (uint32_t i = 0; i < r->curve.n_points && r->curve.points[i].t_ns <= t; i++)
    b = r->curve.points[i].bytes;
  return b;
}

/*
 * Tensors: 0 P param 100 B; 1 A activation (a_bytes); 2 B activation 10 B.
 * op0 [0,100]      -> A            (A access 1)
 * op1 [100,200]  A -> B            (A access 2: evicted-access; D2H 200..)
 * op2 [200,1500] B                 (B access 2)
 * op3 [1500,1600] P                (P access 1: the in-trigger, H2D 1500..)
 * op4 [1600,2500] B                (B access 3)
 * op5 [2500,2600] A                (A access 3: back-access)
 * free B at 2500, A at 2600.
 */
static cap_profile_t *single_swap_profile(uint64_t a_bytes) {
  uint64_t bytes[] = {100, a_bytes, 10};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION,
                              CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {0, 100, {0}, 0, {1}, 1, NULL},       {100, 200, {1}, 1, {2}, 1, NULL},
      {200, 1500, {2}, 1, {0}, 0, NULL},    {1500, 1600, {0}, 1, {0}, 0, NULL},
      {1600, 2500, {2}, 1, {0}, 0, NULL},   {2500, 2600, {1}, 1, {0}, 0, NULL},
  };
  int64_t frees[][2] = {{2500, 2}, {2600, 1}};
  return build(bytes, kind, 3, ops, 6, frees, 2);
}

static void test_unmanaged_matches_curve(void) {
  cap_profile_t *p = single_swap_profile(1000);
  REQUIRE(p);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, NULL, &BW1, &r) == 0);
  CHECK_EQ(r.iter_ns, 2600);
  CHECK_EQ(r.peak_bytes, p->peak_bytes);
  CHECK_EQ(r.peak_bytes, 1110);
  CHECK_EQ(r.peak_t_ns, 100);
  CHECK_EQ(r.stall_ns, 0);
  CHECK_EQ(r.n_prefetches, 0);
  CHECK_EQ(mem_at(&r, 2599), 1100);
  CHECK_EQ(mem_at(&r, 2600), 100);
  cap_sim_result_close(&r);
  cap_profile_destroy(p);
}

/* D2H 200..1200 and H2D 1500..2500 end exactly when op5 starts: no stall.
 * Memory: A released at 1200 (swap-out end), allocated again at 1500
 * (swap-in start). */
static void test_single_swap_hidden_exactly(void) {
  cap_profile_t *p = single_swap_profile(1000);
  REQUIRE(p);
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_swap(plan, 1, 2, 0, 1, 0), 0);
  char err[256];
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(r.iter_ns, 2600);
  CHECK_EQ(r.stall_ns, 0);
  CHECK_EQ(r.swap_out_bytes, 1000);
  CHECK_EQ(r.swap_in_bytes, 1000);
  CHECK_EQ(r.recompute_ns, 0);
  REQUIRE(r.n_prefetches == 1);
  CHECK_EQ(r.prefetches[0].action, 0);
  CHECK_EQ(r.prefetches[0].late_ns, 0);
  CHECK_EQ(mem_at(&r, 1199), 1110); /* held while the D2H copy runs */
  CHECK_EQ(mem_at(&r, 1200), 110);  /* released when it ends */
  CHECK_EQ(mem_at(&r, 1499), 110);
  CHECK_EQ(mem_at(&r, 1500), 1110); /* allocated when the H2D starts */
  CHECK_EQ(mem_at(&r, 2500), 1100); /* B freed */
  CHECK_EQ(mem_at(&r, 2600), 100);
  CHECK_EQ(r.peak_bytes, 1110);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* 1001 bytes: D2H 200..1201, H2D 1500..2501, op5 waits 1 ns; everything
 * after it (the free of A at its end) moves by 1 ns. */
static void test_single_swap_one_ns_late(void) {
  cap_profile_t *p = single_swap_profile(1001);
  REQUIRE(p);
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_swap(plan, 1, 2, 0, 1, 0), 0);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(r.iter_ns, 2601);
  CHECK_EQ(r.stall_ns, 1);
  REQUIRE(r.n_prefetches == 1);
  CHECK_EQ(r.prefetches[0].late_ns, 1);
  CHECK_EQ(mem_at(&r, 1200), 1111);
  CHECK_EQ(mem_at(&r, 1201), 110);
  CHECK_EQ(mem_at(&r, 2600), 1101); /* op5 runs 2501..2601 */
  CHECK_EQ(mem_at(&r, 2601), 100);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* On demand (no in-trigger): the H2D starts at op5's ready time 2500 and
 * takes 1000 ns, all of it a stall. */
static void test_swap_on_demand(void) {
  cap_profile_t *p = single_swap_profile(1000);
  REQUIRE(p);
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_swap(plan, 1, 2, N, 0, 0), 0);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(r.iter_ns, 3600);
  CHECK_EQ(r.stall_ns, 1000);
  CHECK_EQ(r.prefetches[0].late_ns, 1000);
  CHECK_EQ(mem_at(&r, 2499), 110);
  CHECK_EQ(mem_at(&r, 2500), 1100); /* B freed at 2500 while A comes back in */
  CHECK_EQ(r.peak_bytes, 1110);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* save_on_cpu: the copy runs on the compute stream. D2H 200..1200, op2 waits
 * for it (1000 ns stall) and everything after moves by 1000. The swap-in is
 * on demand: ready 3500, H2D 3500..4500, another 1000 ns. */
static void test_sync_swap_out(void) {
  cap_profile_t *p = single_swap_profile(1000);
  REQUIRE(p);
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_swap(plan, 1, 2, N, 0, CAP_ACTION_SYNC_OUT), 0);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(r.iter_ns, 4600);
  CHECK_EQ(r.stall_ns, 2000);
  CHECK_EQ(mem_at(&r, 1200), 110);
  CHECK_EQ(mem_at(&r, 3499), 110);
  CHECK_EQ(mem_at(&r, 3500), 1100); /* B freed at op4's end, A allocated */
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/*
 * Two swaps contending for the copy engines. Tensors: 0 P param 100; 1 A
 * 1000; 2 C 1000; 3 B 10. op0 [0,100] -> A,C; op1 [100,200] A,C -> B (both
 * evicted after it); op2 [200,1500] B; op3 [1500,1600] P (both prefetched
 * here); op4 [1600,2500] B; op5 [2500,2600] A,C.
 * D2H: A 200..1200, C 1200..2200 (serialised behind A).
 * H2D: A 1500..2500; C queued behind A and its D2H ends at 2200: 2500..3500.
 * The duplex limit is off (2 GB/s). op5 waits for C: late 1000 (A: 0).
 */
static void test_two_swaps_contend(void) {
  uint64_t bytes[] = {100, 1000, 1000, 10};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION,
                              CAP_KIND_ACTIVATION, CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {0, 100, {0}, 0, {1, 2}, 2, NULL},    {100, 200, {1, 2}, 2, {3}, 1, NULL},
      {200, 1500, {3}, 1, {0}, 0, NULL},    {1500, 1600, {0}, 1, {0}, 0, NULL},
      {1600, 2500, {3}, 1, {0}, 0, NULL},   {2500, 2600, {1, 2}, 2, {0}, 0, NULL},
  };
  int64_t frees[][2] = {{2500, 3}, {2600, 1}, {2600, 2}};
  cap_profile_t *p = build(bytes, kind, 4, ops, 6, frees, 3);
  REQUIRE(p);
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_swap(plan, 1, 2, 0, 1, 0), 0);
  CHECK_EQ(cap_plan_add_swap(plan, 2, 2, 0, 1, 0), 0);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  REQUIRE(r.n_prefetches == 2);
  CHECK_EQ(r.prefetches[0].late_ns, 0);
  CHECK_EQ(r.prefetches[1].late_ns, 1000);
  CHECK_EQ(r.stall_ns, 1000);
  CHECK_EQ(r.iter_ns, 3600);
  CHECK_EQ(mem_at(&r, 1200), 1110);  /* A out */
  CHECK_EQ(mem_at(&r, 1500), 2110);  /* A back in */
  CHECK_EQ(mem_at(&r, 2200), 1110);  /* C out */
  CHECK_EQ(mem_at(&r, 2500), 2100);  /* C in, B freed (at op4's end, 2500) */
  CHECK_EQ(r.peak_bytes, 2110);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/*
 * Duplex limiting. Tensors: 0 P param 10; 1 X 1000; 2 A 1000.
 * op0 [0,100] -> X,A; op1 [100,1200] A; op2 [1200,1300] P; op3 [1300,2300] X;
 * op4 [2300,2400] A. X evicted after op0 (D2H 100..1100 alone), prefetched
 * at op2 (1200); A evicted after op1 (D2H from 1200), on demand.
 * From 1200 both engines copy 1000 B; h2d = d2h = 1, duplex 1: each gets
 * 0.5 B/ns, both end at 3200. op3 (ready 1300) waits 1900 -> 3200..4200.
 * op4 ready 4200: A's H2D alone, 4200..5200 (late 1000); op4 5200..5300.
 */
static cap_profile_t *duplex_profile(void) {
  uint64_t bytes[] = {10, 1000, 1000};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION,
                              CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {0, 100, {0}, 0, {1, 2}, 2, NULL},  {100, 1200, {2}, 1, {0}, 0, NULL},
      {1200, 1300, {0}, 1, {0}, 0, NULL}, {1300, 2300, {1}, 1, {0}, 0, NULL},
      {2300, 2400, {2}, 1, {0}, 0, NULL},
  };
  int64_t frees[][2] = {{2300, 1}, {2400, 2}};
  return build(bytes, kind, 3, ops, 5, frees, 2);
}

static void test_duplex_limit(void) {
  cap_profile_t *p = duplex_profile();
  REQUIRE(p);
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_swap(plan, 1, 1, 0, 1, 0), 0);
  CHECK_EQ(cap_plan_add_swap(plan, 2, 2, N, 0, 0), 0);
  char err[256];
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_bandwidth_t bw = {1.0, 1.0, 1.0};
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &bw, &r) == 0);
  REQUIRE(r.n_prefetches == 2);
  CHECK_EQ(r.prefetches[0].late_ns, 1900);
  CHECK_EQ(r.prefetches[1].late_ns, 1000);
  CHECK_EQ(r.stall_ns, 2900);
  CHECK_EQ(r.iter_ns, 5300);
  CHECK_EQ(mem_at(&r, 1100), 1010); /* X out */
  CHECK_EQ(mem_at(&r, 1200), 2010); /* X in starts */
  CHECK_EQ(mem_at(&r, 3199), 2010);
  CHECK_EQ(mem_at(&r, 3200), 1010); /* A's D2H ends at 3200 */
  CHECK_EQ(mem_at(&r, 4200), 1010); /* X freed at op3's end, A in starts */
  cap_sim_result_close(&r);

  /* Without the duplex limit both copies take 1000 ns: X in at 2200 (op3
   * waits 900, runs 2200..3200), A out at 2200; op4 ready 3200, A in
   * 3200..4200, op4 4200..4300. */
  cap_bandwidth_t free_bw = {1.0, 1.0, 2.0};
  REQUIRE(cap_sim_run(p, plan, &free_bw, &r) == 0);
  CHECK_EQ(r.prefetches[0].late_ns, 900);
  CHECK_EQ(r.prefetches[1].late_ns, 1000);
  CHECK_EQ(r.iter_ns, 4300);
  cap_sim_result_close(&r);

  /* Asymmetric fair share: h2d 1, d2h 0.25, duplex 1. Alone: X out
   * 100..4100 (1000 B at 0.25). op1 ends 1200: A's D2H queues behind X.
   * op2 at 1200 triggers X's H2D, which waits for X's D2H (4100).
   * op3 ready 1300 waits. At 4100 X's D2H ends, X in starts (h2d) and A out
   * starts (d2h): both busy, d2h keeps 0.25 (under half of duplex), h2d gets
   * the rest, 0.75. X in: 1000/0.75 = 1333.33 -> ends 5434 (rounded up);
   * op3 5434..6434. Until 5434 A out moved 0.25*1334 = 333.5 B, 666.5 left
   * alone at 0.25: 2666 ns -> ends 8100. op4 ready 6434, A in on demand
   * waits for A's D2H: 8100..9100; op4 9100..9200. */
  cap_bandwidth_t asym = {1.0, 0.25, 1.0};
  REQUIRE(cap_sim_run(p, plan, &asym, &r) == 0);
  CHECK_EQ(r.prefetches[0].late_ns, 5434 - 1300);
  CHECK_EQ(r.prefetches[1].late_ns, 9100 - 6434);
  CHECK_EQ(r.iter_ns, 9200);
  CHECK_EQ(mem_at(&r, 8099), 1010);
  CHECK_EQ(mem_at(&r, 8100), 1010); /* A out ends and A in starts at 8100 */
  CHECK_EQ(r.peak_bytes, 2010);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/*
 * Recompute chain. Tensors: 0 P param 10; 1 X 100; 2 Y 200; 3 Z 50.
 * op0 [0,100] P -> X; op1 [100,300] X -> Y; op2 [300,400] Y -> Z;
 * op3 [400,1000] Z; op4 [1000,1100] Y,Z; op5 [1100,1200] X.
 * Plan: X dropped after access 2 (op1), list [op0]; Y dropped after access
 * 2 (op2), list [op0, op1].
 * op4 ready 1000: replay op0 1000..1100 (restores X: the plan dropped it),
 * op1 1100..1300 (restores Y); op4 1300..1400; op5 finds X resident,
 * 1400..1500. recompute 300 ns. Memory: 10, +X 110 @0, +Y 310 @100,
 * -X 210 @300, +Z 260 @300 (same ns: 260), -Y 60 @400, +X 160 @1000,
 * +Y 360 @1100. Frees Y,Z at 1100 (op4's end: 1400), X at 1200 (1500).
 */
static cap_profile_t *chain_profile(void) {
  uint64_t bytes[] = {10, 100, 200, 50};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION,
                              CAP_KIND_ACTIVATION, CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {0, 100, {0}, 1, {1}, 1, NULL},      {100, 300, {1}, 1, {2}, 1, NULL},
      {300, 400, {2}, 1, {3}, 1, NULL},    {400, 1000, {3}, 1, {0}, 0, NULL},
      {1000, 1100, {2, 3}, 2, {0}, 0, NULL}, {1100, 1200, {1}, 1, {0}, 0, NULL},
  };
  int64_t frees[][2] = {{1100, 2}, {1100, 3}, {1200, 1}};
  return build(bytes, kind, 4, ops, 6, frees, 3);
}

static void test_recompute_chain(void) {
  cap_profile_t *p = chain_profile();
  REQUIRE(p);
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  uint32_t lx[] = {0}, ly[] = {0, 1};
  CHECK_EQ(cap_plan_add_recompute(plan, 1, 2, lx, 1), 0);
  CHECK_EQ(cap_plan_add_recompute(plan, 2, 2, ly, 2), 0);
  char err[256];
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(r.recompute_ns, 300);
  CHECK_EQ(r.iter_ns, 1500);
  CHECK_EQ(r.stall_ns, 0);
  CHECK_EQ(r.swap_out_bytes, 0);
  CHECK_EQ(mem_at(&r, 0), 110);
  CHECK_EQ(mem_at(&r, 100), 310);
  CHECK_EQ(mem_at(&r, 300), 260);
  CHECK_EQ(mem_at(&r, 400), 60);
  CHECK_EQ(mem_at(&r, 1000), 160);
  CHECK_EQ(mem_at(&r, 1100), 360);
  CHECK_EQ(mem_at(&r, 1400), 110);
  CHECK_EQ(mem_at(&r, 1500), 10);
  CHECK_EQ(r.peak_bytes, 360);
  CHECK_EQ(r.peak_t_ns, 1100);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);

  /* Only Y dropped: replaying op0 makes a temporary X (X is resident), which
   * is released when the list ends. @1000: 60 + X 100 + temp X 100 = 260,
   * @1100: +Y 460, @1300: -temp 360. */
  plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_recompute(plan, 2, 2, ly, 2), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(mem_at(&r, 400), 160);
  CHECK_EQ(mem_at(&r, 1000), 260);
  CHECK_EQ(mem_at(&r, 1100), 460);
  CHECK_EQ(mem_at(&r, 1300), 360);
  CHECK_EQ(r.peak_bytes, 460);
  CHECK_EQ(r.iter_ns, 1500);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);

  /* Y's list without op0 while X is dropped: the replay of op1 needs X,
   * and nothing is restored implicitly (no nested run of X's own list):
   * the plan is invalid, and the simulator refuses it too. */
  plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  uint32_t ly1[] = {1};
  CHECK_EQ(cap_plan_add_recompute(plan, 1, 2, lx, 1), 0);
  CHECK_EQ(cap_plan_add_recompute(plan, 2, 2, ly1, 1), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "op 1 (aten.mm.default) needs tensor 1, dropped by the plan") !=
        NULL);
  cap_plan_fault_t f;
  CHECK_EQ(cap_plan_walk(plan, p, &f), CAP_EINVAL);
  CHECK_EQ(f.action, 1);
  CHECK_EQ(f.source, 1);
  CHECK_EQ(f.by, 0);
  CHECK_EQ(f.since_op, 1);
  CHECK_EQ(f.lack, CAP_LACK_DROPPED);
  CHECK_EQ(cap_sim_run(p, plan, &BW1, &r), CAP_EINVAL);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/*
 * Release after the last access. Tensors: 0 P param 100; 1 G activation
 * 1000 (a gradient the optimizer reads last at op1); 2 Y activation 50;
 * 3 W activation 500.
 * op0 [0,100]     -> G      op1 [100,200] G -> Y
 * op2 [200,300]   -> W      op3 [300,400] W, Y
 * free G, W, Y at 400.
 * Unmanaged: @0 1100, @100 1150, @200 1650, @400 100.
 * G released after access 2: @200 650; peak 1150 at 100, no time lost.
 */
static cap_profile_t *release_profile(void) {
  uint64_t bytes[] = {100, 1000, 50, 500};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION,
                              CAP_KIND_ACTIVATION, CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {0, 100, {0}, 0, {1}, 1, NULL},
      {100, 200, {1}, 1, {2}, 1, NULL},
      {200, 300, {0}, 0, {3}, 1, NULL},
      {300, 400, {3, 2}, 2, {0}, 0, NULL},
  };
  int64_t frees[][2] = {{400, 1}, {400, 2}, {400, 3}};
  return build(bytes, kind, 4, ops, 4, frees, 3);
}

static void test_release(void) {
  cap_profile_t *p = release_profile();
  REQUIRE(p);
  char err[256];
  cap_sim_result_t r;
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_release(plan, 1, 2), 0);
  CHECK(cap_action_is_release(&plan->actions[0]));
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(mem_at(&r, 150), 1150);
  CHECK_EQ(mem_at(&r, 200), 650);
  CHECK_EQ(mem_at(&r, 400), 100);
  CHECK_EQ(r.peak_bytes, 1150);
  CHECK_EQ(r.peak_t_ns, 100);
  CHECK_EQ(r.iter_ns, 400);
  CHECK_EQ(r.recompute_ns, 0);
  CHECK_EQ(r.swap_out_bytes, 0);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);

  /* Not at the last access: there is a back-access that needs the data. */
  plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_release(plan, 1, 1), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "last access is 2") != NULL);
  CHECK_EQ(cap_sim_run(p, plan, &BW1, &r), CAP_EINVAL);
  cap_plan_destroy(plan);

  /* A parameter outlives the iteration: never released. */
  plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_release(plan, 0, 0), CAP_EINVAL); /* no access 0 */
  cap_plan_destroy(plan);

  /* A recompute list may not read what the plan released: Y dropped after
   * op1 and rebuilt by replaying op1 before op3 would read G. */
  plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  uint32_t ly[] = {1};
  CHECK_EQ(cap_plan_add_release(plan, 1, 2), 0);
  CHECK_EQ(cap_plan_add_recompute(plan, 2, 1, ly, 1), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "needs tensor 1, released by the plan (after op 1)") !=
        NULL);
  CHECK_EQ(cap_sim_run(p, plan, &BW1, &r), CAP_EINVAL);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* A parameter has no free: releasing it after its last access would lose
 * the next iteration's value. */
static void test_release_persistent_refused(void) {
  uint64_t bytes[] = {100, 10};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {0, 100, {0}, 1, {1}, 1, NULL},
      {100, 200, {1}, 1, {0}, 0, NULL},
  };
  int64_t frees[][2] = {{200, 1}};
  cap_profile_t *p = build(bytes, kind, 2, ops, 2, frees, 1);
  REQUIRE(p);
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_release(plan, 0, 1), 0);
  char err[256];
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "outlives") != NULL);
  cap_sim_result_t r;
  CHECK_EQ(cap_sim_run(p, plan, &BW1, &r), CAP_EINVAL);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/* Gaps between ops are kept: a stall before an op moves the ones after it
 * by the same amount, gaps intact. */
static void test_gaps_kept(void) {
  uint64_t bytes[] = {10, 1000, 10};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION,
                              CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {5, 100, {0}, 0, {1}, 1, NULL},     {150, 200, {1}, 1, {2}, 1, NULL},
      {260, 300, {2}, 1, {0}, 0, NULL},   {370, 400, {1}, 1, {0}, 0, NULL},
      {480, 500, {0}, 1, {0}, 0, NULL},
  };
  int64_t frees[][2] = {{300, 2}, {450, 1}};
  cap_profile_t *p = build(bytes, kind, 3, ops, 5, frees, 2);
  REQUIRE(p);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, NULL, &BW1, &r) == 0);
  CHECK_EQ(r.iter_ns, 500);
  cap_sim_result_close(&r);
  /* A out 200..1200 (SYNC: op2 ready 260 waits until 1200, +940), op2
   * 1200..1240, op3 ready 1310: A in on demand 1310..2310 (+1000), op3
   * 2310..2340, free of A at 450 (gap after op3, +50): 2390, op4 ready
   * 2420..2440. */
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  CHECK_EQ(cap_plan_add_swap(plan, 1, 2, N, 0, CAP_ACTION_SYNC_OUT), 0);
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(r.iter_ns, 2440);
  CHECK_EQ(r.stall_ns, 1940);
  CHECK_EQ(mem_at(&r, 2389), 1010);
  CHECK_EQ(mem_at(&r, 2390), 10);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_copy_ns(void) {
  CHECK_EQ(cap_copy_ns(0, 55.1), 0);
  CHECK_EQ(cap_copy_ns(551, 55.1), 10);
  CHECK_EQ(cap_copy_ns(552, 55.1), 11);
  CHECK_EQ(cap_copy_ns(1000, 1.0), 1000);
  CHECK_EQ(cap_copy_ns(1001, 2.0), 501);
  CHECK_EQ(cap_copy_ns(UINT64_C(1) << 30, 55.1), 19487148);
}

static void test_invalid_plans(void) {
  cap_profile_t *p = chain_profile();
  REQUIRE(p);
  char err[256];
  cap_sim_result_t r;
  cap_plan_t *plan = cap_plan_create("test", 0);
  REQUIRE(plan);
  /* X has three accesses: evicting after the third has no back-access. */
  CHECK_EQ(cap_plan_add_swap(plan, 1, 3, N, 0, 0), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "back-access") != NULL);
  CHECK_EQ(cap_sim_run(p, plan, &BW1, &r), CAP_EINVAL);
  cap_plan_destroy(plan);

  plan = cap_plan_create("test", 0);
  CHECK_EQ(cap_plan_add_swap(plan, 99, 1, N, 0, 0), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "unknown tensor") != NULL);
  CHECK_EQ(cap_sim_run(p, plan, &BW1, &r), CAP_EINVAL);
  cap_plan_destroy(plan);

  /* In-trigger before the eviction: Y evicted after op2, trigger X access 1
   * (op0). */
  plan = cap_plan_create("test", 0);
  CHECK_EQ(cap_plan_add_swap(plan, 2, 2, 1, 1, 0), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "in-trigger") != NULL);
  CHECK_EQ(cap_sim_run(p, plan, &BW1, &r), CAP_EINVAL);
  cap_plan_destroy(plan);

  /* A list that does not end with the tensor's producer. */
  plan = cap_plan_create("test", 0);
  uint32_t l0[] = {0};
  CHECK_EQ(cap_plan_add_recompute(plan, 2, 2, l0, 1), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "does not produce") != NULL);
  CHECK_EQ(cap_sim_run(p, plan, &BW1, &r), CAP_EINVAL);
  cap_plan_destroy(plan);

  /* Params have no lineage. */
  plan = cap_plan_create("test", 0);
  CHECK_EQ(cap_plan_add_recompute(plan, 0, 1, l0, 1), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  cap_plan_destroy(plan);

  /* Two actions for the same eviction. */
  plan = cap_plan_create("test", 0);
  CHECK_EQ(cap_plan_add_swap(plan, 1, 1, N, 0, 0), 0);
  CHECK_EQ(cap_plan_add_swap(plan, 1, 1, N, 0, 0), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "both evict") != NULL);
  cap_plan_destroy(plan);

  CHECK_EQ(cap_plan_add_swap(NULL, 1, 1, N, 0, 0), CAP_EINVAL);
  cap_plan_destroy(NULL);
  cap_profile_destroy(p);
}

/* Recompute must not replay an op whose input was modified in place since,
 * and must replay every in-place write of the tensor itself. Tensors: 0 P;
 * 1 X 100; 2 Y 100. op0 [0,10] P -> X; op1 [10,20] X -> X (relu_, in
 * place); op2 [20,30] X -> Y; op3 [30,40] Y; op4 [40,50] X,Y. */
static void test_inplace_rules(void) {
  uint64_t bytes[] = {10, 100, 100};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION,
                              CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {0, 10, {0}, 1, {1}, 1, "aten.convolution.default"},
      {10, 20, {1}, 1, {1}, 1, "aten.relu_.default"},
      {20, 30, {1}, 1, {2}, 1, "aten.mm.default"},
      {30, 40, {2}, 1, {0}, 0, "aten.mm.default"},
      {40, 50, {1, 2}, 2, {0}, 0, "aten.mm.default"},
  };
  int64_t frees[][2] = {{50, 1}, {50, 2}};
  cap_profile_t *p = build(bytes, kind, 3, ops, 5, frees, 2);
  REQUIRE(p);
  REQUIRE(p->ops[1].flags & CAP_OP_INPLACE);
  char err[256];
  cap_plan_t *plan = cap_plan_create("test", 0);
  /* X dropped after op2: the list [op0] misses relu_. */
  uint32_t bad[] = {0}, good[] = {0, 1}, relu_only[] = {1};
  CHECK_EQ(cap_plan_add_recompute(plan, 1, 3, bad, 1), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  CHECK(strstr(err, "op 1 writes") != NULL);
  cap_plan_destroy(plan);
  plan = cap_plan_create("test", 0);
  CHECK_EQ(cap_plan_add_recompute(plan, 1, 3, relu_only, 1), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), CAP_EINVAL);
  cap_plan_destroy(plan);
  plan = cap_plan_create("test", 0);
  CHECK_EQ(cap_plan_add_recompute(plan, 1, 3, good, 2), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(r.recompute_ns, 20);
  CHECK_EQ(r.iter_ns, 70);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  /* Y dropped after op3, replay op2 alone: its input X was modified in
   * place by relu_ before op2 ran, not after: fine. */
  plan = cap_plan_create("test", 0);
  uint32_t ly[] = {2};
  CHECK_EQ(cap_plan_add_recompute(plan, 2, 2, ly, 1), 0);
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

/*
 * An allocation that does not fit the plan's budget waits for the running
 * swap-outs (docs/plan-semantics.md), as the client's allocator does.
 * Tensors: 0 P param 100; 1 A 1000; 2 B 10; 3 C 500.
 * op0 [0,100] -> A     op1 [100,200] A -> B (A swapped out after: D2H
 * 200..1200)           op2 [200,300] B -> C (C first touched: 500 more)
 * op3 [300,1500] C     op4 [1500,1600] A (on demand)
 * free B at 300, C at 1500, A at 1600.
 * At op2's start the device holds P, A (its copy runs), B: 1110, and C
 * needs 500. Budget 1200: op2 waits for A's copy to end at 1200 (a stall
 * of 1000), then 610; op3 runs 1300..2500, A comes back 2500..3500 (1000
 * more), op4 ends at 3600; the peak is 1110, at 100. Without a budget
 * (0) nothing waits: 1610 at 200, and op4 waits only for its copy
 * (1500..2500). Budget 1610: it fits, nothing waits.
 */
static cap_profile_t *room_profile(void) {
  uint64_t bytes[] = {100, 1000, 10, 500};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION,
                              CAP_KIND_ACTIVATION, CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {0, 100, {0}, 0, {1}, 1, NULL},     {100, 200, {1}, 1, {2}, 1, NULL},
      {200, 300, {2}, 1, {3}, 1, NULL},   {300, 1500, {3}, 1, {0}, 0, NULL},
      {1500, 1600, {1}, 1, {0}, 0, NULL},
  };
  int64_t frees[][2] = {{300, 2}, {1500, 3}, {1600, 1}};
  return build(bytes, kind, 4, ops, 5, frees, 3);
}

static void test_wait_for_room(void) {
  cap_profile_t *p = room_profile();
  REQUIRE(p);
  const struct {
    uint64_t budget;
    int64_t iter, stall, room_wait;
    uint64_t peak;
  } cases[] = {
      {1200, 3600, 2000, 1000, 1110},
      {0, 2600, 1000, 0, 1610},
      {1610, 2600, 1000, 0, 1610},
      /* more than any wait can free: it waits for all of it and goes over */
      {500, 3600, 2000, 1000, 1110},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cap_plan_t *plan = cap_plan_create("test", cases[i].budget);
    REQUIRE(plan);
    CHECK_EQ(cap_plan_add_swap(plan, 1, 2, N, 0, 0), 0);
    cap_sim_result_t r;
    REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
    CHECK_EQ(r.iter_ns, cases[i].iter);
    CHECK_EQ(r.stall_ns, cases[i].stall);
    CHECK_EQ(r.room_wait_ns, cases[i].room_wait);
    CHECK_EQ(r.peak_bytes, cases[i].peak);
    CHECK_EQ(r.prefetches[0].late_ns, 1000);
    cap_sim_result_close(&r);
    cap_plan_destroy(plan);
  }
  cap_profile_destroy(p);
}

/*
 * A recompute list's allocations wait for room too. Tensors: 0 P param
 * 100; 1 X 10; 2 Y 50; 3 A 1000.
 * op0 [0,100] -> X, Y  op1 [100,200] -> A  op2 [200,300] A, X, Y (A
 * swapped out after it: D2H 300..1300; X dropped)
 * op3 [300,400] X (X's list, op0, runs first: X, and a temporary Y)
 * op4 [400,500] A, Y (A on demand)      free X at 400, A and Y at 500.
 * Budget 1160, the peak at 100: at 300 the device holds P, Y and A
 * (copying): 1150, and the list needs 60: it waits for the copy until
 * 1300 (210 then), replays op0 1300..1400 (the temporary goes: 160), op3
 * runs 1400..1500; A comes back 1500..2500, op4 runs 2500..2600.
 */
static void test_list_waits_for_room(void) {
  uint64_t bytes[] = {100, 10, 50, 1000};
  cap_tensor_kind_t kind[] = {CAP_KIND_PARAM, CAP_KIND_ACTIVATION,
                              CAP_KIND_ACTIVATION, CAP_KIND_ACTIVATION};
  op_spec_t ops[] = {
      {0, 100, {0}, 0, {1, 2}, 2, NULL},      {100, 200, {0}, 0, {3}, 1, NULL},
      {200, 300, {3, 1, 2}, 3, {0}, 0, NULL}, {300, 400, {1}, 1, {0}, 0, NULL},
      {400, 500, {3, 2}, 2, {0}, 0, NULL},
  };
  int64_t frees[][2] = {{400, 1}, {500, 2}, {500, 3}};
  cap_profile_t *p = build(bytes, kind, 4, ops, 5, frees, 3);
  REQUIRE(p);
  cap_plan_t *plan = cap_plan_create("test", 1160);
  REQUIRE(plan);
  uint32_t list[] = {0};
  CHECK_EQ(cap_plan_add_swap(plan, 3, 2, N, 0, 0), 0);
  CHECK_EQ(cap_plan_add_recompute(plan, 1, 2, list, 1), 0);
  char err[256];
  CHECK_EQ(cap_plan_validate(plan, p, err, sizeof err), 0);
  cap_sim_result_t r;
  REQUIRE(cap_sim_run(p, plan, &BW1, &r) == 0);
  CHECK_EQ(r.room_wait_ns, 1000);
  CHECK_EQ(r.recompute_ns, 100);
  CHECK_EQ(r.iter_ns, 2600);
  CHECK_EQ(r.stall_ns, 2000);
  CHECK_EQ(r.peak_bytes, 1160);
  CHECK_EQ(mem_at(&r, 1299), 1150);
  CHECK_EQ(mem_at(&r, 1300), 210);
  CHECK_EQ(mem_at(&r, 1400), 160);
  cap_sim_result_close(&r);
  cap_plan_destroy(plan);
  cap_profile_destroy(p);
}

static void test_clone(void) {
  cap_plan_t *plan = cap_plan_create("a-very-long-policy-name-that-does-not-fit", 42);
  REQUIRE(plan);
  CHECK_EQ(strlen(plan->policy), sizeof plan->policy - 1);
  uint32_t l[] = {3, 4, 5};
  for (uint32_t i = 0; i < 100; i++) {
    CHECK_EQ(cap_plan_add_recompute(plan, i, 1, l, 3), 0);
    CHECK_EQ(cap_plan_add_swap(plan, i, 2, 7, 1, CAP_ACTION_SYNC_OUT), 0);
  }
  cap_plan_t *c = cap_plan_clone(plan);
  REQUIRE(c);
  CHECK_EQ(c->n_actions, 200);
  CHECK_EQ(c->n_recompute_ops, 300);
  CHECK_EQ(c->budget_bytes, 42);
  CHECK_EQ(cap_action_recompute_ops(c, &c->actions[198])[2], 5);
  CHECK_EQ(c->actions[199].flags, CAP_ACTION_SYNC_OUT);
  CHECK_EQ(cap_plan_add_swap(c, 1, 1, N, 0, 0), 0);
  CHECK_EQ(plan->n_actions, 200);
  cap_plan_destroy(c);
  cap_plan_destroy(plan);
}

int main(void) {
  RUN_TEST(test_copy_ns);
  RUN_TEST(test_unmanaged_matches_curve);
  RUN_TEST(test_single_swap_hidden_exactly);
  RUN_TEST(test_single_swap_one_ns_late);
  RUN_TEST(test_swap_on_demand);
  RUN_TEST(test_sync_swap_out);
  RUN_TEST(test_two_swaps_contend);
  RUN_TEST(test_duplex_limit);
  RUN_TEST(test_recompute_chain);
  RUN_TEST(test_gaps_kept);
  RUN_TEST(test_release);
  RUN_TEST(test_release_persistent_refused);
  RUN_TEST(test_invalid_plans);
  RUN_TEST(test_inplace_rules);
  RUN_TEST(test_wait_for_room);
  RUN_TEST(test_list_waits_for_room);
  RUN_TEST(test_clone);
  return TEST_SUMMARY();
}
