/*
 * Swap timing internals of the Capuchin planner (ft.c, trigger.c,
 * candidates.c): the op-space memory tree against brute force, the copy
 * engine's booked-key index, free time computed by hand, two swaps
 * contending for the copy engines, and the in-trigger choice with its
 * margin.
 */
#include <stdlib.h>
#include <string.h>

#include "../../../policy/src/capuchin_internal.h"
#include "cap_test.h"
#include "capuchin/error.h"

#define MB (1000u * 1000u)
#define US 1000

static void test_memtree_brute_force(void) {
  srand(7);
  for (int trial = 0; trial < 100; trial++) {
    uint32_t n = 1 + (uint32_t)(rand() % 70);
    int64_t v[80], b[80];
    for (uint32_t i = 0; i < n; i++)
      b[i] = v[i] = rand() % 1000;
    cap__memtree_t t;
    REQUIRE(cap__memtree_init(&t, v, n) == 0);
    for (int op = 0; op < 100; op++) {
      uint32_t lo = (uint32_t)rand() % n, hi = lo + (uint32_t)rand() % (n - lo + 1);
      int64_t d = rand() % 41 - 20;
      cap__memtree_add(&t, lo, hi, d);
      for (uint32_t i = lo; i < hi; i++)
        b[i] += d;
      int64_t mx = INT64_MIN;
      for (uint32_t i = 0; i < n; i++)
        mx = b[i] > mx ? b[i] : mx;
      CHECK_EQ(cap__memtree_max_all(&t), mx);
      uint32_t ql = (uint32_t)rand() % n, qh = ql + 1 + (uint32_t)rand() % (n - ql);
      int64_t m = INT64_MIN;
      for (uint32_t i = ql; i < qh; i++)
        m = b[i] > m ? b[i] : m;
      CHECK_EQ(cap__memtree_max(&t, ql, qh), m);
      int64_t x = rand() % 1000;
      uint32_t f = CAP_NONE, l = CAP_NONE;
      for (uint32_t i = 0; i < n; i++)
        if (b[i] > x) {
          if (f == CAP_NONE)
            f = i;
          l = i;
        }
      CHECK_EQ(cap__memtree_first_above(&t, x), f);
      CHECK_EQ(cap__memtree_last_above(&t, x), l);
    }
    CHECK_EQ(cap__memtree_max(&t, 3, 3), INT64_MIN);
    cap__memtree_close(&t);
  }
}

static void test_engine_keys(void) {
  cap__engine_t e;
  REQUIRE(cap__engine_init(&e, 5000) == 0);
  CHECK_EQ(cap__engine_prev(&e, 4999), CAP_NONE);
  CHECK_EQ(cap__engine_next(&e, 0), CAP_NONE);
  cap__engine_book(&e, 3, 10, 20);
  cap__engine_book(&e, 64, 30, 40);
  cap__engine_book(&e, 4200, 50, 60);
  cap__engine_book(&e, 64, 40, 45); /* second copy at key 64 */
  CHECK_EQ(cap__engine_prev(&e, 2), CAP_NONE);
  CHECK_EQ(cap__engine_prev(&e, 3), 3);
  CHECK_EQ(cap__engine_prev(&e, 63), 3);
  CHECK_EQ(cap__engine_prev(&e, 64), 64);
  CHECK_EQ(cap__engine_prev(&e, 4199), 64);
  CHECK_EQ(cap__engine_prev(&e, 4999), 4200);
  CHECK_EQ(cap__engine_next(&e, 3), 64);
  CHECK_EQ(cap__engine_next(&e, 64), 4200);
  CHECK_EQ(cap__engine_next(&e, 4200), CAP_NONE);
  CHECK_EQ(e.first_start[64], 30);
  CHECK_EQ(e.last_end[64], 45);
  cap__engine_close(&e);
}

/* A (100 MB) and C (100 MB) both written by op 0 and read again by the last
 * op; between them n_idle ops of idle_ns on a 1 MB temporary each. */
static cap_profile_t *two_big(uint32_t n_idle, int64_t idle_ns) {
  cap_profile_t *p = cap_profile_create();
  int rc = cap_profile_add_tensor(p, 0, 1 * MB, CAP_KIND_PARAM);
  rc = rc ? rc : cap_profile_add_tensor(p, 1, 100 * MB, CAP_KIND_ACTIVATION);
  rc = rc ? rc : cap_profile_add_tensor(p, 2, 100 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = 0; i <= n_idle && !rc; i++)
    rc = cap_profile_add_tensor(p, 3 + i, 1 * MB, CAP_KIND_ACTIVATION);
  uint32_t w = 0, ac[2] = {1, 2};
  int64_t t = 0;
  uint32_t seq = 0;
  rc = rc ? rc : cap_profile_add_op(p, seq++, t, t + 10 * US, "aten.mm.default", &w, 1, ac, 2);
  t += 10 * US;
  for (uint32_t i = 0; i < n_idle && !rc; i++) {
    uint32_t s = 3 + i;
    rc = cap_profile_add_op(p, seq++, t, t + idle_ns, "aten.mul.Tensor", &w, 1, &s, 1);
    t += idle_ns;
    rc = rc ? rc : cap_profile_add_free(p, t, s);
  }
  uint32_t last = 3 + n_idle;
  rc = rc ? rc : cap_profile_add_op(p, seq++, t, t + 10 * US, "aten.add.Tensor", ac, 2, &last, 1);
  t += 10 * US;
  rc = rc ? rc : cap_profile_add_free(p, t, 1);
  rc = rc ? rc : cap_profile_add_free(p, t, 2);
  rc = rc ? rc : cap_profile_add_free(p, t, last);
  rc = rc ? rc : cap_profile_finish(p);
  if (rc) {
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

static const cap__gap_t *gap_of(const cap__ctx_t *c, uint32_t tensor) {
  for (uint32_t i = 0; i < c->n_gaps; i++)
    if (c->gaps[i].tensor == tensor)
      return &c->gaps[i];
  return NULL;
}

static void test_free_time_by_hand(void) {
  cap_profile_t *p = two_big(8, 1000 * US); /* 8 ms idle */
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 50 * MB);
  cap__ctx_t c;
  REQUIRE(cap__ctx_init(&c, p, &cfg) == 0);
  c.target = 50 * MB;
  /* both directions busy at once run at duplex/2 = 42.9 GB/s */
  CHECK(c.h2d_gbps > 42.89 && c.h2d_gbps < 42.91);
  const cap__gap_t *g = gap_of(&c, 1);
  REQUIRE(g);
  CHECK_EQ(g->a, 0);
  CHECK_EQ(g->b, 9);
  int64_t copy = cap_copy_ns(100 * MB, c.d2h_gbps); /* 2331003 ns */
  CHECK_EQ(copy, 2331003);
  /* FT = (back-access start - swap-in) - (evicted-access end + swap-out) */
  CHECK_EQ(cap__ft_standalone(&c, g), (8010 * US - copy) - (10 * US + copy));
  cap__ctx_close(&c);
  cap_profile_destroy(p);
}

static void test_two_swaps_contend(void) {
  /* 8 ms idle: one 100 MB swap (2.33 ms each way) hides; a second one,
   * queued behind the first on both engines, cannot */
  cap_profile_t *p = two_big(8, 1000 * US);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 50 * MB);
  cap__ctx_t c;
  REQUIRE(cap__ctx_init(&c, p, &cfg) == 0);
  c.target = INT64_MAX / 4; /* engines only: no memory limit on triggers */
  c.push_back = true;
  const cap__gap_t *ga = gap_of(&c, 1), *gc = gap_of(&c, 2);
  REQUIRE(ga && gc);
  CHECK(cap__ft_standalone(&c, ga) > 0);
  CHECK(cap__ft_standalone(&c, gc) > 0); /* each alone would hide */
  cap__swap_eval_t ev;
  REQUIRE(cap__ft_eval(&c, ga, true, &ev));
  CHECK_EQ(ev.out_start, 10 * US); /* right after the evicted-access */
  CHECK_EQ(ev.out_end, 10 * US + cap_copy_ns(100 * MB, c.d2h_gbps));
  CHECK(ev.in_end <= c.op_start[ga->b] - cfg.trigger_margin_ns);
  CHECK(ev.trig_op > 0 && ev.trig_op < ga->b);
  cap__choice_t ch = {.gap = (uint32_t)(ga - c.gaps), .method = CAP_METHOD_SWAP,
                      .trig_op = ev.trig_op, .save_lo = ev.save_lo,
                      .save_hi = ev.save_hi, .in_end = ev.in_end,
                      .in_start = ev.in_start, .out_end = ev.out_end};
  c.ch = calloc(4, sizeof *c.ch);
  REQUIRE(c.ch);
  c.cap_ch = 4;
  c.ch[c.n_ch++] = ch;
  cap__ft_commit(&c, ga, &ev, 0);
  /* the second queues behind the first: its swap-out ends 2 copies after
   * the op, its swap-in must end before the first's starts */
  cap__swap_eval_t ev2;
  bool hidden2 = cap__ft_eval(&c, gc, true, &ev2);
  CHECK(!hidden2);
  /* on demand it is possible, and its exposed time is the whole swap-in */
  REQUIRE(cap__ft_eval(&c, gc, false, &ev2));
  CHECK_EQ(ev2.out_start, ev.out_end);
  CHECK(ev2.stall_ns >= cap_copy_ns(100 * MB, c.h2d_gbps));
  cap__ctx_close(&c);
  cap_profile_destroy(p);
}

static void test_trigger_latest_before_deadline(void) {
  cap_profile_t *p = two_big(8, 1000 * US);
  REQUIRE(p);
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, 50 * MB);
  cap__ctx_t c;
  REQUIRE(cap__ctx_init(&c, p, &cfg) == 0);
  int64_t len = cap_copy_ns(100 * MB, c.h2d_gbps), st = -1;
  /* back-access is op 9 at 8.01 ms: latest op start <= 8.01 ms - len */
  uint32_t t = cap__trigger_find(&c, 1, 1, 9, len, c.op_start[9], &st);
  CHECK_EQ(t, 6); /* op 6 starts at 5.01 ms, op 7 at 6.01 ms > 5.68 ms */
  CHECK_EQ(st, c.op_start[6]);
  /* a 1 ms margin moves it one op earlier */
  t = cap__trigger_find(&c, 1, 1, 9, len, c.op_start[9] - 1000 * US, &st);
  CHECK_EQ(t, 5);
  /* not before the swap-out has ended (so_op) */
  t = cap__trigger_find(&c, 1, 7, 9, len, c.op_start[9], &st);
  CHECK_EQ(t, CAP_NONE);
  /* the in-trigger names another tensor's access of that op */
  uint32_t tt, ta;
  REQUIRE(cap__trigger_name(p, 6, 1, &tt, &ta));
  CHECK(tt != 1);
  CHECK_EQ(cap_profile_access_op(p, tt, ta), 6);
  cap__ctx_close(&c);
  cap_profile_destroy(p);
}

int main(void) {
  RUN_TEST(test_memtree_brute_force);
  RUN_TEST(test_engine_keys);
  RUN_TEST(test_free_time_by_hand);
  RUN_TEST(test_two_swaps_contend);
  RUN_TEST(test_trigger_latest_before_deadline);
  return TEST_SUMMARY();
}
