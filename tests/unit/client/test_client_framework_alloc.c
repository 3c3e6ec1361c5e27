/*
 * Placement under the framework's allocator (capuchin/framework_alloc.h):
 * the test plays PyTorch with a CUDAPluggableAllocator routed to the client
 * (python/src/torch_alloc.c). For each op it allocates the outputs as the
 * allocator's alloc would (cap_client_framework_alloc), writes them, adopts
 * them and reports the op (op_run); a storage goes back through the
 * allocator's free (cap_client_framework_free) when its last reference
 * does: after its last op, or when the client releases it. The memory the
 * client asks for to bring a tensor back is allocated the same way, as the
 * adapter's torch.empty would.
 *
 * Ops (64 KiB tensors; w, a 64 KiB weight, was allocated outside the client):
 *   op0 a = w + 1   op1 b = a * 2 (with a 32 KiB workspace)   op2 c = b + 3
 *   op3 d = a + c
 * b is freed after op2, a, c and d after op3.
 * Plan: a swapped out after op1 (its access 2), back at c's access 1 (op2);
 * or dropped there and recomputed (op0 replayed) when op3 needs it.
 * Placement (offsets in KiB, arena 256): b 0, c 64, a 128, a's swap-in or
 * recompute 192, d 0 (b's block: b is gone by then).
 */
#include <stdio.h>
#include <string.h>

#include "cap_test.h"
#include "capuchin/client.h"
#include "capuchin/framework.h"
#include "capuchin/framework_alloc.h"

#define KIB (UINT64_C(1) << 10)
#define T (64 * KIB)
#define WS (32 * KIB)
#define BUDGET (T + 256 * KIB + 64 * KIB)

enum { W, A, B, C, D, N_IDS };

static const char plan_fmt[] =
    "{\"trace\":\"t\",\"budget_bytes\":0,\"policy\":\"by-hand\",\"version\":3,"
    "\"predicted_iter_ns\":1000,\"actions\":[%s],"
    "\"placement\":{\"arena_bytes\":%llu,\"blocks\":["
    "%s,%s,%s,%s,%s]}}";
/* a's action: swapped out, or dropped and op0 replayed for it. */
static const char swap_a[] =
    "{\"tensor\":1,\"evict_after_access\":2,\"method\":\"swap\","
    "\"prefetch_at\":{\"tensor\":3,\"access\":1}}";
static const char recompute_a[] =
    "{\"tensor\":1,\"evict_after_access\":2,\"method\":\"recompute\","
    "\"recompute_ops\":[0]}";
static const char block_fmt[] =
    "{\"tensor\":%d,\"kind\":\"%s\",\"action\":%s,\"offset\":%llu,"
    "\"bytes\":%llu,\"start_ns\":0,\"end_ns\":100,\"share\":null,"
    "\"same_as\":null}";

/* The framework: the client, and each tensor's storage. */
typedef struct fw {
  cap_client_t *c;
  uint8_t *p[N_IDS];
  uint32_t id[N_IDS];
  uint32_t allocs, releases, recomputes;
} fw_t;

static int fw_alloc(void *user, uint32_t id, uint64_t bytes, void **dev) {
  fw_t *f = user;
  (void)id;
  f->allocs++;
  return cap_client_framework_alloc(f->c, bytes, dev) == 0 ? 0 : -1;
}

/* The client let go of an evicted tensor's storage: its last reference. */
static void fw_release(void *user, uint32_t id, void *dev, uint64_t bytes) {
  fw_t *f = user;
  (void)id;
  (void)bytes;
  f->releases++;
  CHECK_EQ(cap_client_framework_free(f->c, dev), 0);
}

static void *out_alloc(fw_t *f, uint64_t bytes) {
  void *p = NULL;
  CHECK_EQ(cap_client_framework_alloc(f->c, bytes, &p), 0);
  return p;
}

/* Replays op0 (a = w + 1: the fill op() gave a) into the memory the
 * client allocated through fw_alloc, as the adapter does: the replayed op
 * makes its own output (the size of d, the next op's), copied into the
 * client's and freed. */
static int fw_recompute(void *user, uint32_t seq, const char *name,
                        const uint32_t *in_ids, void *const *in_ptrs,
                        uint32_t n_in, const uint32_t *out_ids,
                        void *const *out_ptrs, uint32_t n_out) {
  fw_t *f = user;
  (void)name, (void)in_ids, (void)in_ptrs, (void)out_ids;
  if (seq != 0 || n_in != 1 || n_out != 1)
    return -1;
  f->recomputes++;
  void *own = out_alloc(f, T);
  if (!own)
    return -1;
  memset(own, 0xa1, T);
  memcpy(out_ptrs[0], own, T);
  CHECK_EQ(cap_client_framework_free(f->c, own), 0);
  return 0;
}

/* Allocate output x of `bytes`, fill it, adopt it and report the op. */
static int op(fw_t *f, const char *name, int x, uint64_t bytes, const int *in,
              uint32_t n_in, uint8_t fill) {
  uint32_t ids[2];
  (void)cap_client_make_room(f->c);
  f->p[x] = out_alloc(f, bytes);
  if (!f->p[x])
    return CAP_ENOMEM;
  memset(f->p[x], fill, bytes);
  int rc = cap_client_adopt(f->c, bytes, f->p[x], &f->id[x]);
  for (uint32_t i = 0; i < n_in; i++)
    ids[i] = f->id[in[i]];
  return rc ? rc : cap_client_op_run(f->c, name, ids, n_in, &f->id[x], 1, 1000);
}

/* Tensor x's storage goes (its last reference), then the adapter reports
 * the free before the next op. */
static void drop(fw_t *f, int x) {
  void *p = NULL;
  if (cap_client_tensor_resident(f->c, f->id[x]) == 1 &&
      cap_client_acquire(f->c, f->id[x], &p) == 0)
    CHECK_EQ(cap_client_framework_free(f->c, p), 0);
  CHECK_EQ(cap_client_free(f->c, f->id[x]), 0);
}

static bool overlaps(const void *p, uint64_t n, const void *q, uint64_t m) {
  const uint8_t *x = p, *y = q;
  return x < y + m && y < x + n;
}

/* One iteration; c_bytes is what op2 allocates for c (T as planned). *ws
 * and *a_in get the workspace's and a's address after its swap-in. */
static int iteration(fw_t *f, uint64_t c_bytes, uint8_t **ws, uint8_t **a_in,
                     cap_iter_stats_t *st) {
  static const int in_w[] = {W}, in_a[] = {A}, in_b[] = {B}, in_ac[] = {A, C};
  int rc = cap_client_iteration_begin(f->c);
  rc = rc ? rc : op(f, "add", A, T, in_w, 1, 0xa1);
  if (rc == 0) { /* op1's workspace lives and dies inside it */
    *ws = out_alloc(f, WS);
    rc = op(f, "mul", B, T, in_a, 1, 0xb2);
    CHECK(!*ws || cap_client_framework_free(f->c, *ws) == 0);
  }
  rc = rc ? rc : op(f, "add", C, c_bytes, in_b, 1, 0xc3);
  if (rc == 0)
    drop(f, B);
  if (rc == 0 && c_bytes != T) { /* another shape: the plan no longer fits */
    rc = cap_client_diverged(f->c);
    *a_in = NULL;
  } else if (rc == 0) {
    /* The unpack hook brings a back before op3. */
    void *p = NULL;
    rc = cap_client_acquire(f->c, f->id[A], &p);
    *a_in = p;
    CHECK(p && ((uint8_t *)p)[0] == 0xa1 && ((uint8_t *)p)[T - 1] == 0xa1);
    rc = rc ? rc : op(f, "add", D, T, in_ac, 2, 0xd4);
    if (rc == 0)
      drop(f, D);
  }
  if (rc == 0) {
    drop(f, A);
    drop(f, C);
  }
  return rc ? rc : cap_client_iteration_end(f->c, st);
}

static void load_plan(cap_client_t *c, uint64_t arena, bool recompute) {
  static const struct {
    int tensor;
    const char *kind, *action;
    unsigned off;
  } b[5] = {{A, "first_touch", "null", 128},
            {B, "first_touch", "null", 0},
            {C, "first_touch", "null", 64},
            {A, NULL, "0", 192}, /* a's return: the action's */
            {D, "first_touch", "null", 0}};
  char blocks[5][256], json[2048];
  for (int i = 0; i < 5; i++)
    snprintf(blocks[i], sizeof blocks[i], block_fmt, b[i].tensor,
             b[i].kind   ? b[i].kind
             : recompute ? "recomputed"
                         : "swapped_in",
             b[i].action, (unsigned long long)(b[i].off * KIB),
             (unsigned long long)T);
  snprintf(json, sizeof json, plan_fmt, recompute ? recompute_a : swap_a,
           (unsigned long long)arena, blocks[0], blocks[1], blocks[2],
           blocks[3], blocks[4]);
  REQUIRE(cap_client_load_plan_json(c, json, strlen(json)) == 0);
}

static uint8_t weight[T];

/* A framework-memory client on the sim backend, placement routed to it,
 * the weight adopted and the first (unguided) iteration run. */
static void start(fw_t *f) {
  memset(f, 0, sizeof *f);
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.no_daemon = true;
  cfg.time_scale = 1.0;
  cfg.framework_memory = true;
  cfg.budget_bytes = BUDGET;
  REQUIRE(cap_client_create(&cfg, &f->c) == 0);
  REQUIRE(cap_client_set_framework_memory(f->c, fw_alloc, fw_release, f) == 0);
  REQUIRE(cap_client_set_framework_placement(f->c, true) == 0);
  cap_client_set_recompute(f->c, fw_recompute, f);
  REQUIRE(cap_client_adopt_persistent(f->c, T, CAP_KIND_PARAM, weight,
                                      &f->id[W]) == 0);
  f->p[W] = weight;
  uint8_t *ws, *a_in;
  cap_iter_stats_t st;
  CHECK_EQ(iteration(f, T, &ws, &a_in, &st), 0);
  CHECK_EQ(st.mode, CAP_MODE_PASSIVE);
  CHECK_EQ(st.placed_allocs, 0);
  CHECK_EQ(cap_client_framework_lent(f->c), 0);
}

/* What the job uses once an iteration is over: the weight only (nothing
 * counted twice, nothing left behind). */
static void check_in_use(fw_t *f) {
  cap_client_stats_t s;
  cap_client_get_stats(f->c, &s);
  CHECK_EQ(s.device_bytes, T);
  CHECK_EQ(cap_client_framework_lent(f->c), 0);
}

/* recompute: a is dropped and op0 replayed for it, instead of swapped. */
static void planned_allocations_take_their_blocks(bool recompute) {
  fw_t f;
  start(&f);
  load_plan(f.c, 256 * KIB, recompute);
  for (int it = 0; it < 2; it++) {
    uint8_t *ws = NULL, *a_in = NULL;
    cap_iter_stats_t st;
    int rc = iteration(&f, T, &ws, &a_in, &st);
    if (rc)
      fprintf(stderr, "iteration: %s\n", cap_client_last_error(f.c));
    REQUIRE(rc == 0);
    CHECK_EQ(st.mode, CAP_MODE_GUIDED);
    CHECK_EQ(st.op_errors, 0);
    /* b sits at offset 0: the region's base. */
    uint8_t *base = f.p[B];
    CHECK(f.p[A] == base + 128 * KIB);
    CHECK(f.p[C] == base + 64 * KIB);
    CHECK(a_in == base + 192 * KIB);
    CHECK(f.p[D] == base);
    CHECK_EQ(st.placed_allocs, 5);
    CHECK_EQ(st.placement_misses, 0);
    CHECK_EQ(st.evictions, 1);
    CHECK_EQ(st.recomputed_ops, recompute ? 1 : 0);
    /* The workspace, which no block places, came from the allocator,
     * clear of the region. */
    CHECK(ws && !overlaps(ws, WS, base, 256 * KIB));
    CHECK(st.peak_bytes <= BUDGET);
    check_in_use(&f);
  }
  CHECK_EQ(f.recomputes, recompute ? 2 : 0);
  cap_client_destroy(f.c);
}

static void test_planned_allocations_take_their_blocks(void) {
  planned_allocations_take_their_blocks(false);
}

static void test_a_recompute_takes_its_block(void) {
  planned_allocations_take_their_blocks(true);
}

static void test_a_size_that_differs_is_not_placed(void) {
  fw_t f;
  start(&f);
  load_plan(f.c, 256 * KIB, false);
  uint8_t *ws = NULL, *a_in = NULL;
  cap_iter_stats_t st;
  /* c comes out larger than planned: it is not c's block's, and comes
   * from the allocator (here from the region's room, the budget having
   * none beside it) clear of b's block, live then. */
  REQUIRE(iteration(&f, T + 32 * KIB, &ws, &a_in, &st) == 0);
  CHECK_EQ(st.placed_allocs, 2); /* a and b */
  CHECK_EQ(st.placement_misses, 0);
  CHECK(!overlaps(f.p[C], T + 32 * KIB, f.p[B], T));
  check_in_use(&f);
  /* The next iteration, back to the planned shapes, is placed again. */
  REQUIRE(iteration(&f, T, &ws, &a_in, &st) == 0);
  CHECK_EQ(st.mode, CAP_MODE_GUIDED);
  CHECK_EQ(st.placed_allocs, 5);
  CHECK_EQ(st.placement_misses, 0);
  check_in_use(&f);
  cap_client_destroy(f.c);
}

static void test_an_arena_that_does_not_fit_is_refused(void) {
  fw_t f;
  start(&f);
  load_plan(f.c, BUDGET, false); /* with the weight, past the budget */
  for (int it = 0; it < 2; it++) {
    uint8_t *ws = NULL, *a_in = NULL;
    cap_iter_stats_t st;
    REQUIRE(iteration(&f, T, &ws, &a_in, &st) == 0);
    CHECK_EQ(st.mode, CAP_MODE_GUIDED); /* the plan runs, unplaced */
    CHECK(strstr(st.plan_note, "placement refused") != NULL);
    /* and says what was in use against which budget */
    char want[64];
    snprintf(want, sizeof want, "budget %llu, in use ",
             (unsigned long long)BUDGET);
    CHECK(strstr(st.plan_note, want) != NULL);
    CHECK(strstr(st.plan_note, "persistent tensors ") != NULL);
    CHECK_EQ(st.placed_allocs, 0);
    CHECK_EQ(st.placement_misses, 0);
    CHECK_EQ(st.evictions, 1);
    CHECK_EQ(st.op_errors, 0);
    CHECK(a_in != NULL);
    CHECK(st.peak_bytes <= BUDGET);
    check_in_use(&f);
  }
  cap_client_destroy(f.c);
}

static void test_memory_from_elsewhere_is_not_the_clients(void) {
  fw_t f;
  start(&f);
  CHECK_EQ(cap_client_framework_free(f.c, weight), CAP_ENOENT);
  CHECK_EQ(cap_client_framework_free(f.c, NULL), CAP_EINVAL);
  cap_client_destroy(f.c);
}

int main(void) {
  RUN_TEST(test_planned_allocations_take_their_blocks);
  RUN_TEST(test_a_recompute_takes_its_block);
  RUN_TEST(test_a_size_that_differs_is_not_placed);
  RUN_TEST(test_an_arena_that_does_not_fit_is_refused);
  RUN_TEST(test_memory_from_elsewhere_is_not_the_clients);
  return TEST_SUMMARY();
}
