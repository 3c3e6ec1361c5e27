/*
 * BFC allocator over fake addresses: split and merge, best fit, alignment,
 * budget and arena limits, fragmentation figures, a failing source, fault
 * injection, and a randomized run checked against a reference model.
 */
#include "bfc.h"
#include "faultsim.h"

#include "cap_test.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- a fake arena source: never dereferenced addresses ---- */

#define MAX_ARENAS 4096
typedef struct {
  uintptr_t next;          /* next base to hand out */
  size_t refuse_above;     /* refuse requests larger than this (0: never) */
  bool refuse_all;
  int calls, refusals;
  struct { uintptr_t base; size_t bytes; bool live; } arenas[MAX_ARENAS];
  int n;
} fake_src;

static int fake_alloc(void *ctx, size_t bytes, void **base) {
  fake_src *f = ctx;
  f->calls++;
  if (f->refuse_all || (f->refuse_above && bytes > f->refuse_above) || f->n >= MAX_ARENAS) {
    f->refusals++;
    return CAP_ENOMEM;
  }
  f->arenas[f->n].base = f->next;
  f->arenas[f->n].bytes = bytes;
  f->arenas[f->n].live = true;
  f->n++;
  *base = (void *)f->next;
  /* leave a gap so that arenas are never adjacent (no cross-arena merge) */
  f->next += ((bytes + 4095) & ~(uintptr_t)4095) + 65536;
  return 0;
}

static void fake_free(void *ctx, void *base, size_t bytes) {
  fake_src *f = ctx;
  for (int i = 0; i < f->n; i++)
    if (f->arenas[i].live && f->arenas[i].base == (uintptr_t)base) {
      CHECK_EQ(f->arenas[i].bytes, bytes);
      f->arenas[i].live = false;
      return;
    }
  CHECK(!"fake_free: unknown arena");
}

static void fake_init(fake_src *f) {
  memset(f, 0, sizeof *f);
  f->next = (uintptr_t)0x7f0000000000ull;
}

static int live_arenas(const fake_src *f) {
  int n = 0;
  for (int i = 0; i < f->n; i++)
    n += f->arenas[i].live;
  return n;
}

static cap_bfc_t *make(fake_src *f, uint64_t budget, uint64_t initial, uint64_t split_min) {
  cap_bfc_config_t cfg;
  cap_bfc_config_init(&cfg);
  cfg.budget_bytes = budget;
  if (initial)
    cfg.initial_arena_bytes = initial;
  if (split_min)
    cfg.split_min_bytes = split_min;
  cap_bfc_source_t src = {fake_alloc, fake_free, f};
  cap_bfc_t *a = NULL;
  int rc = cap_bfc_create(&cfg, &src, &a);
  CHECK_EQ(rc, 0);
  return a;
}

#define U(p) ((uintptr_t)(p))

static void test_rounding_alignment(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 0, 1 << 20, 0);
  REQUIRE(a);
  size_t sizes[] = {1, 255, 256, 257, 1000, 4096, 65537};
  void *p[7];
  for (int i = 0; i < 7; i++) {
    CHECK_EQ(cap_bfc_alloc(a, sizes[i], &p[i]), 0);
    CHECK_EQ(U(p[i]) % 256, 0);
    CHECK_EQ(cap_bfc_chunk_bytes(a, p[i]), (sizes[i] + 255) / 256 * 256);
  }
  cap_bfc_stats_t st;
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.in_use_bytes, 256 + 256 + 256 + 512 + 1024 + 4096 + 65792);
  CHECK_EQ(st.requested_bytes, 1 + 255 + 256 + 257 + 1000 + 4096 + 65537);
  CHECK_EQ(st.arenas, 1);
  CHECK_EQ(st.arena_bytes, 1 << 20);
  CHECK_EQ(st.live_allocs, 7);
  /* consecutive allocations from one fresh arena are packed in order */
  for (int i = 1; i < 7; i++)
    CHECK_EQ(U(p[i]), U(p[i - 1]) + cap_bfc_chunk_bytes(a, p[i - 1]));
  void *z = (void *)1;
  CHECK_EQ(cap_bfc_alloc(a, 0, &z), CAP_EINVAL);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
  CHECK_EQ(live_arenas(&f), 0);
}

static void test_split_merge(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 0, 65536, 0);
  REQUIRE(a);
  void *A, *B, *C;
  REQUIRE(cap_bfc_alloc(a, 1024, &A) == 0);
  REQUIRE(cap_bfc_alloc(a, 2048, &B) == 0);
  REQUIRE(cap_bfc_alloc(a, 4096, &C) == 0);
  CHECK_EQ(U(A), f.arenas[0].base);
  CHECK_EQ(U(B), U(A) + 1024);
  CHECK_EQ(U(C), U(A) + 3072);
  cap_bfc_stats_t st;
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.largest_free_bytes, 65536 - 7168);
  CHECK_EQ(st.free_bytes, 65536 - 7168);
  CHECK(st.fragmentation == 0.0);

  CHECK_EQ(cap_bfc_free(a, B), 0); /* hole of 2048 between A and C */
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.free_bytes, 65536 - 5120);
  CHECK_EQ(st.largest_free_bytes, 65536 - 7168);
  double want = 1.0 - (double)(65536 - 7168) / (double)(65536 - 5120);
  CHECK(st.fragmentation > want - 1e-12 && st.fragmentation < want + 1e-12);

  CHECK_EQ(cap_bfc_free(a, A), 0); /* merges with the hole after it */
  CHECK_EQ(cap_bfc_validate(a), 0);
  void *D;
  REQUIRE(cap_bfc_alloc(a, 3072, &D) == 0); /* fits the merged 3072 exactly */
  CHECK_EQ(U(D), U(A));
  CHECK_EQ(cap_bfc_free(a, D), 0);
  CHECK_EQ(cap_bfc_free(a, C), 0); /* merges both sides: one free arena */
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.largest_free_bytes, 65536);
  CHECK_EQ(st.in_use_bytes, 0);
  CHECK(st.fragmentation == 0.0);
  /* freeing twice, or something never allocated, is refused */
  CHECK_EQ(cap_bfc_free(a, C), CAP_EINVAL);
  CHECK_EQ(cap_bfc_free(a, (void *)(U(A) + 256)), CAP_EINVAL);
  CHECK_EQ(cap_bfc_free(a, NULL), 0);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
}

static void test_best_fit(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 0, 1 << 20, 0);
  REQUIRE(a);
  /* holes (in address order): 4096, 1024, 2048, 1024, separated by guards */
  size_t holes[] = {4096, 1024, 2048, 1024};
  void *h[4], *g[4];
  for (int i = 0; i < 4; i++) {
    REQUIRE(cap_bfc_alloc(a, holes[i], &h[i]) == 0);
    REQUIRE(cap_bfc_alloc(a, 256, &g[i]) == 0);
  }
  for (int i = 0; i < 4; i++)
    CHECK_EQ(cap_bfc_free(a, h[i]), 0);
  CHECK_EQ(cap_bfc_validate(a), 0);
  void *p;
  REQUIRE(cap_bfc_alloc(a, 1000, &p) == 0);
  CHECK_EQ(U(p), U(h[1])); /* smallest fitting hole, lowest address of the two */
  void *q;
  REQUIRE(cap_bfc_alloc(a, 900, &q) == 0);
  CHECK_EQ(U(q), U(h[3])); /* the other 1024 hole */
  void *r;
  REQUIRE(cap_bfc_alloc(a, 1500, &r) == 0);
  CHECK_EQ(U(r), U(h[2])); /* 2048 beats 4096 */
  void *s;
  REQUIRE(cap_bfc_alloc(a, 512, &s) == 0);
  CHECK_EQ(U(s), U(r) + 1536); /* remainder of the 2048 hole (512) */
  void *t;
  REQUIRE(cap_bfc_alloc(a, 3000, &t) == 0);
  CHECK_EQ(U(t), U(h[0]));
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
}

static void test_split_threshold(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 0, 1 << 20, 1024);
  REQUIRE(a);
  void *h, *g, *p;
  REQUIRE(cap_bfc_alloc(a, 1536, &h) == 0);
  REQUIRE(cap_bfc_alloc(a, 256, &g) == 0);
  CHECK_EQ(cap_bfc_free(a, h), 0);
  REQUIRE(cap_bfc_alloc(a, 1024, &p) == 0); /* remainder 512 < 1024: no split */
  CHECK_EQ(U(p), U(h));
  CHECK_EQ(cap_bfc_chunk_bytes(a, p), 1536);
  cap_bfc_stats_t st;
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.in_use_bytes, 1536 + 256);
  CHECK_EQ(st.requested_bytes, 1024 + 256);
  CHECK_EQ(cap_bfc_free(a, p), 0);
  REQUIRE(cap_bfc_alloc(a, 256, &p) == 0); /* remainder 1280 >= 1024: split */
  CHECK_EQ(cap_bfc_chunk_bytes(a, p), 256);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
}

static void test_budget(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 10000, 4096, 0); /* arena limit follows: 10240 */
  REQUIRE(a);
  void *p, *q, *r;
  CHECK_EQ(cap_bfc_alloc(a, 8192, &p), 0);
  CHECK(cap_bfc_fits(a, 1792));
  CHECK(!cap_bfc_fits(a, 2049));
  CHECK_EQ(cap_bfc_alloc(a, 4096, &q), CAP_EBUDGET);
  CHECK_EQ(cap_bfc_alloc(a, 1792, &q), 0);
  CHECK_EQ(cap_bfc_alloc(a, 1, &r), CAP_EBUDGET);
  cap_bfc_stats_t st;
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.budget_failures, 2);
  CHECK_EQ(st.in_use_bytes, 9984);
  CHECK(st.arena_bytes <= 10240);
  CHECK_EQ(cap_bfc_free(a, p), 0);
  CHECK_EQ(cap_bfc_alloc(a, 4096, &p), 0); /* room again after a free */
  /* lowering the budget below what is in use refuses new allocations */
  cap_bfc_set_budget(a, 4096);
  CHECK_EQ(cap_bfc_alloc(a, 256, &r), CAP_EBUDGET);
  CHECK_EQ(cap_bfc_free(a, p), 0);
  CHECK_EQ(cap_bfc_free(a, q), 0);
  CHECK_EQ(cap_bfc_alloc(a, 4096, &r), 0);
  CHECK_EQ(cap_bfc_alloc(a, 256, &p), CAP_EBUDGET);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
}

static void test_fragmentation_failure(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 16384, 16384, 0);
  REQUIRE(a);
  void *p[4];
  for (int i = 0; i < 4; i++)
    REQUIRE(cap_bfc_alloc(a, 4096, &p[i]) == 0);
  CHECK_EQ(cap_bfc_free(a, p[0]), 0);
  CHECK_EQ(cap_bfc_free(a, p[2]), 0);
  cap_bfc_stats_t st;
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.free_bytes, 8192);
  CHECK_EQ(st.largest_free_bytes, 4096);
  CHECK(st.fragmentation > 0.4999 && st.fragmentation < 0.5001);
  void *q;
  CHECK(!cap_bfc_fits(a, 8192));
  CHECK_EQ(cap_bfc_alloc(a, 8192, &q), CAP_EBUDGET); /* budget ok, no chunk */
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.fragmentation_failures, 1);
  CHECK_EQ(st.arenas, 1);
  CHECK_EQ(cap_bfc_free(a, p[1]), 0); /* 0..12287 free and merged */
  CHECK_EQ(cap_bfc_alloc(a, 8192, &q), 0);
  CHECK_EQ(U(q), U(p[0]));
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
}

/* The same fragmentation, relieved past the arena limit: one more arena of
 * just the request, the bytes in use still within the budget. */
static void test_beyond_arena_limit(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 16384, 16384, 0);
  REQUIRE(a);
  void *p[4], *o, *q;
  for (int i = 0; i < 4; i++)
    REQUIRE(cap_bfc_alloc(a, 4096, &p[i]) == 0);
  CHECK_EQ(cap_bfc_free(a, p[0]), 0);
  CHECK_EQ(cap_bfc_free(a, p[2]), 0);
  CHECK_EQ(cap_bfc_alloc(a, 8192, &o), CAP_EBUDGET);
  CHECK_EQ(cap_bfc_alloc_beyond_limit(a, 8192, 0, &o), 0);
  cap_bfc_stats_t st;
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.arenas, 2);
  CHECK_EQ(st.arena_bytes, 16384 + 8192);
  CHECK_EQ(st.overflow_arenas, 1);
  CHECK_EQ(st.overflow_bytes, 8192);
  CHECK_EQ(st.in_use_bytes, 16384);
  /* never past the budget itself, but for bytes in use that hold nothing
   * (a sub-allocator's free room), and no further */
  CHECK_EQ(cap_bfc_alloc_beyond_limit(a, 256, 0, &q), CAP_EBUDGET);
  CHECK_EQ(cap_bfc_alloc_beyond_limit(a, 512, 256, &q), CAP_EBUDGET);
  CHECK_EQ(cap_bfc_alloc_beyond_limit(a, 256, 256, &q), 0);
  CHECK_EQ(cap_bfc_free(a, q), 0);
  /* a free chunk that fits is used, no arena taken */
  CHECK_EQ(cap_bfc_free(a, p[1]), 0);
  CHECK_EQ(cap_bfc_alloc_beyond_limit(a, 4096, 0, &q), 0);
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.arenas, 2);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
}

/* Fragmentation relief: 8 chunks of 1 KiB, the odd ones free (4 KiB free,
 * none bigger than 1 KiB). A 3 KiB request needs one in-use chunk freed
 * between two free ones; a pinned chunk (not movable) bounds the run. */
static const void *g_pinned;

static const void *g_heavy; /* weight 10 instead of 1 */

static uint32_t movable_except_pinned(void *ctx, const void *ptr) {
  int *calls = ctx;
  (*calls)++;
  return ptr == g_pinned ? 0 : ptr == g_heavy ? 10 : 1;
}

static void test_find_window(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 8192, 8192, 0);
  REQUIRE(a);
  void *p[8];
  for (int i = 0; i < 8; i++)
    REQUIRE(cap_bfc_alloc(a, 1024, &p[i]) == 0);
  for (int i = 1; i < 8; i += 2)
    CHECK_EQ(cap_bfc_free(a, p[i]), 0);
  void *q, *out[8];
  int calls = 0;
  CHECK_EQ(cap_bfc_alloc(a, 3072, &q), CAP_EBUDGET);
  /* a 1 KiB request fits as is: nothing to evict */
  CHECK_EQ(cap_bfc_find_window(a, 1024, movable_except_pinned, &calls, out, 8), 0);
  g_pinned = NULL;
  int n = cap_bfc_find_window(a, 3072, movable_except_pinned, &calls, out, 8);
  CHECK_EQ(n, 1);
  CHECK(calls > 0);
  /* p[2] (between free 1 and 3) is the first cheapest run */
  CHECK_EQ(U(out[0]), U(p[2]));
  /* with p[2] and p[4] pinned, the run must be p[5..7]: p[6] */
  g_pinned = p[2];
  n = cap_bfc_find_window(a, 3072, movable_except_pinned, &calls, out, 8);
  CHECK_EQ(n, 1);
  CHECK_EQ(U(out[0]), U(p[4]));
  /* p[2] made ten times dearer: p[4] is the cheapest run now */
  g_pinned = NULL;
  g_heavy = p[2];
  n = cap_bfc_find_window(a, 3072, movable_except_pinned, &calls, out, 8);
  CHECK_EQ(n, 1);
  CHECK_EQ(U(out[0]), U(p[4]));
  g_heavy = NULL;
  /* 5 KiB: three in-use chunks at least, fewer than max_out refused */
  g_pinned = NULL;
  n = cap_bfc_find_window(a, 5120, movable_except_pinned, &calls, out, 8);
  CHECK_EQ(n, 2);
  CHECK_EQ(cap_bfc_find_window(a, 5120, movable_except_pinned, &calls, out, 1),
           CAP_ENOENT);
  /* freeing the run makes the allocation succeed */
  for (int i = 0; i < n; i++)
    CHECK_EQ(cap_bfc_free(a, out[i]), 0);
  CHECK_EQ(cap_bfc_alloc(a, 5120, &q), 0);
  /* bigger than the arena: no run */
  CHECK_EQ(cap_bfc_find_window(a, 16384, movable_except_pinned, &calls, out, 8),
           CAP_ENOENT);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
}

static void test_growth_and_trim(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_config_t cfg;
  cap_bfc_config_init(&cfg);
  cfg.initial_arena_bytes = 65536;
  cfg.max_arena_bytes = 262144;
  cap_bfc_source_t src = {fake_alloc, fake_free, &f};
  cap_bfc_t *a = NULL;
  REQUIRE(cap_bfc_create(&cfg, &src, &a) == 0);
  void *p, *q, *r, *s;
  REQUIRE(cap_bfc_alloc(a, 60000, &p) == 0); /* arena 1: 64 KiB */
  REQUIRE(cap_bfc_alloc(a, 60000, &q) == 0); /* arena 2: 128 KiB */
  CHECK_EQ(f.n, 2);
  CHECK_EQ(f.arenas[0].bytes, 65536);
  CHECK_EQ(f.arenas[1].bytes, 131072);
  REQUIRE(cap_bfc_alloc(a, 100000, &r) == 0); /* 70 KiB left in arena 2: arena 3, 256 KiB */
  CHECK_EQ(f.n, 3);
  CHECK_EQ(f.arenas[2].bytes, 262144);
  REQUIRE(cap_bfc_alloc(a, 1 << 20, &s) == 0); /* bigger than max: its own arena */
  CHECK_EQ(f.arenas[3].bytes, 1 << 20);
  cap_bfc_stats_t st;
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.arenas, 4);
  CHECK_EQ(st.arena_bytes, 65536 + 131072 + 262144 + (1 << 20));
  CHECK_EQ(cap_bfc_trim(a), 0);
  CHECK_EQ(cap_bfc_free(a, s), 0);
  CHECK_EQ(cap_bfc_free(a, p), 0);
  CHECK_EQ(cap_bfc_trim(a), 65536 + (1 << 20));
  CHECK_EQ(live_arenas(&f), 2);
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.arenas, 2);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
  CHECK_EQ(live_arenas(&f), 0);
}

/* What keeps the emptiest arena from going back: its live allocations. */
static void test_emptiest_arena(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_config_t cfg;
  cap_bfc_config_init(&cfg);
  cfg.initial_arena_bytes = 65536;
  cfg.max_arena_bytes = 262144;
  cap_bfc_source_t src = {fake_alloc, fake_free, &f};
  cap_bfc_t *a = NULL;
  REQUIRE(cap_bfc_create(&cfg, &src, &a) == 0);
  void *out[4];
  CHECK_EQ(cap_bfc_emptiest_arena(a, out, 4), CAP_ENOENT); /* no arena */
  void *p, *q, *r;
  REQUIRE(cap_bfc_alloc(a, 65536, &p) == 0); /* fills arena 1: 64 KiB */
  REQUIRE(cap_bfc_alloc(a, 1000, &q) == 0);  /* arena 2: 128 KiB */
  REQUIRE(cap_bfc_alloc(a, 2000, &r) == 0);  /* arena 2 */
  CHECK_EQ(cap_bfc_emptiest_arena(a, out, 4), 2); /* 3 KiB in arena 2 */
  CHECK(out[0] == q && out[1] == r);          /* in address order */
  CHECK_EQ(cap_bfc_emptiest_arena(a, out, 1), CAP_ENOENT); /* too many */
  CHECK_EQ(cap_bfc_free(a, q), 0);
  CHECK_EQ(cap_bfc_free(a, r), 0);
  CHECK_EQ(cap_bfc_emptiest_arena(a, out, 4), 0); /* arena 2 is free */
  CHECK_EQ(cap_bfc_trim(a), 131072);
  CHECK_EQ(cap_bfc_emptiest_arena(a, out, 4), 1);
  CHECK(out[0] == p);
  cap_bfc_destroy(a);
}

static void test_source_failure(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 0, 1 << 20, 0);
  REQUIRE(a);
  f.refuse_above = 300000;
  void *p;
  REQUIRE(cap_bfc_alloc(a, 200000, &p) == 0); /* 1 MiB, 512 KiB refused; 256 KiB */
  CHECK_EQ(f.refusals, 2);
  CHECK_EQ(f.arenas[0].bytes, 262144);
  f.refuse_all = true;
  void *q = NULL;
  CHECK_EQ(cap_bfc_alloc(a, 200000, &q), CAP_ENOMEM);
  CHECK(q == NULL);
  cap_bfc_stats_t st;
  cap_bfc_stats(a, &st);
  CHECK(st.source_failures >= 3);
  CHECK_EQ(st.live_allocs, 1);
  CHECK_EQ(cap_bfc_validate(a), 0);
  f.refuse_all = false;
  CHECK_EQ(cap_bfc_alloc(a, 200000, &q), 0);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
}

static void test_faultsim_arena(void) {
  fake_src f;
  fake_init(&f);
  cap_bfc_t *a = make(&f, 0, 65536, 0);
  REQUIRE(a);
  cap_faultsim_reset();
  cap_faultsim_arm(CAP_FAULT_BFC_ARENA, 2, 1); /* the second arena request */
  void *p, *q, *r;
  CHECK_EQ(cap_bfc_alloc(a, 65536, &p), 0);
  CHECK_EQ(cap_bfc_alloc(a, 256, &q), CAP_ENOMEM);
  CHECK_EQ(cap_faultsim_injected(CAP_FAULT_BFC_ARENA), 1);
  CHECK_EQ(f.calls, 1); /* the source was never asked */
  CHECK_EQ(cap_bfc_alloc(a, 256, &r), 0);
  CHECK_EQ(cap_bfc_validate(a), 0);
  /* fail every request from now on */
  cap_faultsim_arm(CAP_FAULT_BFC_ARENA, 1, -1);
  for (int i = 0; i < 3; i++)
    CHECK_EQ(cap_bfc_alloc(a, 1 << 20, &q), CAP_ENOMEM);
  CHECK_EQ(cap_faultsim_injected(CAP_FAULT_BFC_ARENA), 4);
  cap_faultsim_reset();
  CHECK_EQ(cap_bfc_alloc(a, 1 << 20, &q), 0);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_destroy(a);
}

/* The fault points count calls exactly: fail the 3rd call from now and the
 * one after it, then never again; disarm; fail forever. */
static void test_faultsim_counting(void) {
  cap_faultsim_reset();
  bool got[8];
  cap_faultsim_arm(CAP_FAULT_CLIENT_ALLOC, 3, 2);
  for (int i = 0; i < 8; i++)
    got[i] = cap_faultsim_step(CAP_FAULT_CLIENT_ALLOC);
  bool want[8] = {false, false, true, true, false, false, false, false};
  for (int i = 0; i < 8; i++)
    CHECK_EQ(got[i], want[i]);
  CHECK_EQ(cap_faultsim_injected(CAP_FAULT_CLIENT_ALLOC), 2);
  CHECK(!cap_faultsim_step(CAP_FAULT_DEVICE_ALLOC)); /* other points untouched */
  cap_faultsim_arm(CAP_FAULT_CLIENT_ALLOC, 1, -1);
  for (int i = 0; i < 100; i++)
    CHECK(cap_faultsim_step(CAP_FAULT_CLIENT_ALLOC));
  cap_faultsim_arm(CAP_FAULT_CLIENT_ALLOC, 0, 0); /* disarm */
  CHECK(!cap_faultsim_step(CAP_FAULT_CLIENT_ALLOC));
  CHECK_EQ(cap_faultsim_injected(CAP_FAULT_CLIENT_ALLOC), 102);
  cap_faultsim_reset();
  CHECK_EQ(cap_faultsim_injected(CAP_FAULT_CLIENT_ALLOC), 0);
  CHECK(!cap_faultsim_step(CAP_FAULT_COUNT)); /* out of range: never fails */
}

/* ---- randomized run against a reference model ---- */

typedef struct { uintptr_t addr; size_t bytes; } iv;

static uint64_t rng_state = 0x853c49e6748fea9bull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static int iv_cmp(const void *x, const void *y) {
  const iv *a = x, *b = y;
  return a->addr < b->addr ? -1 : a->addr > b->addr;
}

/* The free gaps of every live arena given the live allocations: with complete
 * coalescing these are exactly the allocator's free chunks. Best fit is the
 * gap minimizing (size, addr) among those >= want; 0 if none. */
static uintptr_t ref_best_fit(const fake_src *f, iv *live, int n, size_t want, size_t *largest) {
  qsort(live, (size_t)n, sizeof *live, iv_cmp);
  uintptr_t best = 0;
  size_t best_bytes = SIZE_MAX;
  *largest = 0;
  for (int k = 0; k < f->n; k++) {
    if (!f->arenas[k].live)
      continue;
    uintptr_t at = f->arenas[k].base, end = at + f->arenas[k].bytes;
    for (int i = 0; i <= n; i++) {
      uintptr_t next = end;
      if (i < n) {
        if (live[i].addr < at || live[i].addr >= end)
          continue;
        next = live[i].addr;
      }
      size_t gap = (size_t)(next - at);
      if (gap > *largest)
        *largest = gap;
      if (gap >= want && (gap < best_bytes || (gap == best_bytes && at < best))) {
        best = at;
        best_bytes = gap;
      }
      if (i < n)
        at = live[i].addr + live[i].bytes;
    }
  }
  return best;
}

static void test_random_vs_reference(void) {
  fake_src f;
  fake_init(&f);
  const uint64_t budget = 48ull << 20;
  cap_bfc_config_t cfg;
  cap_bfc_config_init(&cfg);
  cfg.budget_bytes = budget;
  cfg.initial_arena_bytes = 4 << 20;
  cfg.max_arena_bytes = 16 << 20;
  cap_bfc_source_t src = {fake_alloc, fake_free, &f};
  cap_bfc_t *a = NULL;
  REQUIRE(cap_bfc_create(&cfg, &src, &a) == 0);
  enum { MAXLIVE = 2000 };
  static iv live[MAXLIVE], scratch[MAXLIVE];
  int n = 0;
  uint64_t in_use = 0, peak = 0;
  long ok = 0, budget_fail = 0, frag_fail = 0, mismatches = 0;
  for (int step = 0; step < 30000; step++) {
    bool do_alloc = n == 0 || (n < MAXLIVE && rnd() % 100 < 55);
    if (do_alloc) {
      size_t bytes;
      uint64_t r = rnd() % 100;
      if (r < 50)
        bytes = 1 + rnd() % 4096;
      else if (r < 90)
        bytes = 1 + rnd() % (256 << 10);
      else
        bytes = 1 + rnd() % (6 << 20);
      size_t rounded = (bytes + 255) & ~(size_t)255;
      memcpy(scratch, live, (size_t)n * sizeof *live);
      size_t largest;
      uintptr_t predict = ref_best_fit(&f, scratch, n, rounded, &largest);
      int arenas_before = f.n;
      void *p = NULL;
      int rc = cap_bfc_alloc(a, bytes, &p);
      if (in_use + rounded > budget) {
        CHECK_EQ(rc, CAP_EBUDGET);
        budget_fail++;
        continue;
      }
      if (rc == CAP_EBUDGET) {
        /* only legitimate when no gap fits and the arena limit is reached */
        if (predict != 0)
          mismatches++;
        frag_fail++;
        continue;
      }
      REQUIRE(rc == 0);
      ok++;
      if (f.n == arenas_before) {
        if (U(p) != predict)
          mismatches++;
      } else {
        CHECK(predict == 0);
        CHECK_EQ(U(p), f.arenas[f.n - 1].base);
      }
      CHECK_EQ(U(p) % 256, 0);
      CHECK_EQ(cap_bfc_chunk_bytes(a, p), rounded);
      live[n].addr = U(p);
      live[n].bytes = rounded;
      n++;
      in_use += rounded;
      if (in_use > peak)
        peak = in_use;
    } else {
      int i = (int)(rnd() % (uint64_t)n);
      CHECK_EQ(cap_bfc_free(a, (void *)live[i].addr), 0);
      in_use -= live[i].bytes;
      live[i] = live[--n];
    }
    if (step % 500 == 0) {
      CHECK_EQ(cap_bfc_validate(a), 0);
      cap_bfc_stats_t st;
      cap_bfc_stats(a, &st);
      CHECK_EQ(st.in_use_bytes, in_use);
      CHECK_EQ(st.peak_in_use_bytes, peak);
      CHECK_EQ(st.live_allocs, n);
      CHECK(st.arena_bytes <= budget);
      memcpy(scratch, live, (size_t)n * sizeof *live);
      size_t largest;
      ref_best_fit(&f, scratch, n, SIZE_MAX, &largest);
      CHECK_EQ(st.largest_free_bytes, largest);
      double frag = st.free_bytes ? 1.0 - (double)largest / (double)st.free_bytes : 0.0;
      CHECK(st.fragmentation > frag - 1e-9 && st.fragmentation < frag + 1e-9);
    }
  }
  /* no two live allocations overlap, and each lies inside one arena */
  memcpy(scratch, live, (size_t)n * sizeof *live);
  qsort(scratch, (size_t)n, sizeof *scratch, iv_cmp);
  for (int i = 1; i < n; i++)
    CHECK(scratch[i - 1].addr + scratch[i - 1].bytes <= scratch[i].addr);
  CHECK_EQ(mismatches, 0);
  CHECK(ok > 10000);
  CHECK(budget_fail > 0);
  printf("random: %ld allocations, %ld over budget, %ld fragmentation failures, %d arenas\n",
         ok, budget_fail, frag_fail, f.n);
  for (int i = 0; i < n; i++)
    CHECK_EQ(cap_bfc_free(a, (void *)live[i].addr), 0);
  CHECK_EQ(cap_bfc_validate(a), 0);
  cap_bfc_stats_t st;
  cap_bfc_stats(a, &st);
  CHECK_EQ(st.in_use_bytes, 0);
  CHECK_EQ(st.free_bytes, st.arena_bytes);
  size_t biggest = 0;
  for (int i = 0; i < f.n; i++)
    if (f.arenas[i].live && f.arenas[i].bytes > biggest)
      biggest = f.arenas[i].bytes;
  CHECK_EQ(st.largest_free_bytes, biggest); /* each arena one free chunk again */
  CHECK_EQ(cap_bfc_trim(a), st.arena_bytes);
  CHECK_EQ(live_arenas(&f), 0);
  cap_bfc_destroy(a);
}

int main(void) {
  RUN_TEST(test_rounding_alignment);
  RUN_TEST(test_split_merge);
  RUN_TEST(test_best_fit);
  RUN_TEST(test_split_threshold);
  RUN_TEST(test_budget);
  RUN_TEST(test_fragmentation_failure);
  RUN_TEST(test_beyond_arena_limit);
  RUN_TEST(test_find_window);
  RUN_TEST(test_growth_and_trim);
  RUN_TEST(test_emptiest_arena);
  RUN_TEST(test_source_failure);
  RUN_TEST(test_faultsim_arena);
  RUN_TEST(test_faultsim_counting);
  RUN_TEST(test_random_vs_reference);
  return TEST_SUMMARY();
}
