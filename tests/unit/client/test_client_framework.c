/*
 * Framework-owned memory (capuchin/framework.h, DESIGN.md model 2): the
 * test plays the framework. It allocates every tensor itself (malloc, on
 * the sim backend the "device" is host memory), runs each op's kernel on
 * the pointers op begin returns, and frees a buffer only when the client
 * releases it, so ASan catches a client that reads memory it gave back.
 *
 * Ops (uint8 elementwise):
 *   op0 a = w + 1     op1 b = a * 2     op2 c = b + 3
 *   op3 d = a + c     op4 e = b + d
 * Plan: swap a after its access 2 (op1) with the prefetch at c's access 1
 * (op2), recompute b after its access 2 (op2) by replaying op1 at op4;
 * and an evict-persistent action on w that an adopted weight cannot obey.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cap_test.h"
#include "capuchin/client.h"
#include "capuchin/framework.h"
#include "fake_framework.h"

#define N 4096u

static const char plan_json[] =
    "{\"trace\":\"t\",\"budget_bytes\":0,\"policy\":\"by-hand\",\"version\":3,"
    "\"predicted_iter_ns\":0,\"actions\":["
    "{\"tensor\":0,\"evict_after_access\":1,\"method\":\"swap\","
    "\"prefetch_at\":null},"
    "{\"tensor\":1,\"evict_after_access\":2,\"method\":\"swap\","
    "\"prefetch_at\":{\"tensor\":3,\"access\":1}},"
    "{\"tensor\":2,\"evict_after_access\":2,\"method\":\"recompute\","
    "\"recompute_ops\":[1]}]}";

/* By-hand plans several tests share. a (tensor 0) swapped out after its
 * first access and brought back on demand: */
static const char swap_a_plan[] =
    "{\"trace\":\"t\",\"budget_bytes\":0,\"policy\":\"by-hand\","
    "\"version\":1,\"predicted_iter_ns\":0,\"actions\":[{\"tensor\":0,"
    "\"evict_after_access\":1,\"method\":\"swap\",\"prefetch_at\":null}]}";
/* a and b (tensors 0 and 1) swapped out after their first accesses, both
 * prefetched at c's (tensor 2's) first: */
static const char prefetch_a_b_plan[] =
    "{\"trace\":\"t\",\"budget_bytes\":0,\"policy\":\"by-hand\","
    "\"version\":1,\"predicted_iter_ns\":0,\"actions\":["
    "{\"tensor\":0,\"evict_after_access\":1,\"method\":\"swap\","
    "\"prefetch_at\":{\"tensor\":2,\"access\":1}},"
    "{\"tensor\":1,\"evict_after_access\":1,\"method\":\"swap\","
    "\"prefetch_at\":{\"tensor\":2,\"access\":1}}]}";

static void kernel(uint32_t seq, void *const *in, void *const *out) {
  const uint8_t *x = in[0], *y = in[1];
  uint8_t *o = out[0];
  for (uint32_t i = 0; i < N; i++) {
    switch (seq) {
    case 0: o[i] = (uint8_t)(x[i] + 1); break;
    case 1: o[i] = (uint8_t)(x[i] * 2); break;
    case 2: o[i] = (uint8_t)(x[i] + 3); break;
    default: o[i] = (uint8_t)(x[i] + y[i]); break;
    }
  }
}

static int recompute(void *user, uint32_t seq, const char *name,
                     const uint32_t *in_ids, void *const *in_ptrs,
                     uint32_t n_in, const uint32_t *out_ids,
                     void *const *out_ptrs, uint32_t n_out) {
  fake_fw_t *f = user;
  (void)name; (void)in_ids; (void)out_ids;
  if (seq != 1 || n_in != 1 || n_out != 1)
    return -1;
  f->recomputes++;
  kernel(seq, in_ptrs, out_ptrs);
  return 0;
}

/* A sim client without a daemon whose memory the fake framework f owns:
 * sim_fw_config's cfg, as the test set it further. NULL on failure. */
static void sim_fw_config(cap_client_config_t *cfg) {
  cap_client_config_init(cfg);
  cfg->backend = "sim";
  cfg->no_daemon = true;
  cfg->framework_memory = true;
}

static cap_client_t *sim_fw_client(const cap_client_config_t *cfg,
                                   fake_fw_t *f) {
  cap_client_t *c = NULL;
  CHECK_EQ(cap_client_create(cfg, &c), 0);
  if (c && cap_client_set_framework_memory(c, fake_fw_alloc, fake_fw_release,
                                           f) != 0) {
    CHECK(!"set_framework_memory");
    cap_client_destroy(c);
    c = NULL;
  }
  return c;
}

/* A weight of N bytes (byte i: i * mul + 5) the framework allocated,
 * adopted as persistent tensor *w: its memory, NULL on failure. */
static uint8_t *adopt_weight(cap_client_t *c, fake_fw_t *f, uint8_t mul,
                             uint32_t *w) {
  uint8_t *buf = fake_fw_new(f, N);
  if (!buf)
    return NULL;
  for (uint32_t i = 0; i < N; i++)
    buf[i] = (uint8_t)(i * mul + 5);
  if (cap_client_adopt_persistent(c, N, CAP_KIND_PARAM, buf, w) != 0) {
    fake_fw_drop(f, buf);
    return NULL;
  }
  return buf;
}

/* The framework frees tensor id: the client forgets it, and the framework
 * drops its memory unless the client has it out (no pointer). */
static void fw_free(cap_client_t *c, fake_fw_t *f, uint32_t id) {
  void *q = cap_client_tensor_ptr(c, id);
  CHECK_EQ(cap_client_free(c, id), 0);
  fake_fw_drop(f, q); /* (NULL: none to drop) */
}

/* Poll until no copy of the client is in flight (10 s at most). */
static void wait_copies(cap_client_t *c) {
  for (int spin = 0; spin < 100000 && cap_client_poll(c) > 0; spin++)
    nanosleep(&(struct timespec){0, 100000}, NULL);
}

/* One iteration as a framework runs it: it allocates each output before
 * the op (adopting it), holds the storages of a, b and d as autograd
 * would, and frees them at the end unless the client still has them.
 * ids[acquire] (a = 0, b = 1; NO_ACQUIRE: none) is brought back the way an
 * unpack hook does, before op3: autograd unpacks all of a node's saved
 * tensors before its first op, earlier than the op that reads one. */
#define NO_ACQUIRE 5u
static int iteration(cap_client_t *c, fake_fw_t *f, uint32_t w,
                     uint32_t acquire, uint8_t *e_out, cap_iter_stats_t *st) {
  static const char *names[5] = {"aten::add", "aten::mul", "aten::add",
                                 "aten::add", "aten::add"};
  uint32_t ids[5]; /* a b c d e */
  int rc = cap_client_iteration_begin(c);
  for (uint32_t k = 0; k < 5 && rc == 0; k++) {
    void *buf = fake_fw_new(f, N);
    if (!buf)
      return CAP_ENOMEM;
    rc = cap_client_adopt(c, N, buf, &ids[k]);
    if (rc < 0)
      break;
    if (acquire < k && k == 3) {
      void *p = NULL;
      rc = cap_client_acquire(c, ids[acquire], &p);
      if (rc < 0)
        break;
      CHECK(cap_client_tensor_resident(c, ids[acquire]) == 1);
    }
    uint32_t in[2];
    uint32_t n_in = 1;
    switch (k) {
    case 0: in[0] = w; break;
    case 1: in[0] = ids[0]; break;
    case 2: in[0] = ids[1]; break;
    case 3: in[0] = ids[0]; in[1] = ids[2]; n_in = 2; break;
    default: in[0] = ids[1]; in[1] = ids[3]; n_in = 2; break;
    }
    void *ip[2] = {NULL, NULL}, *op[1] = {NULL};
    rc = cap_client_op_begin(c, names[k], in, n_in, &ids[k], 1, ip, op);
    if (rc < 0)
      break;
    if (n_in == 1)
      ip[1] = ip[0];
    kernel(k, ip, op);
    rc = cap_client_compute(c, 200000); /* 0.2 ms: the copies overlap */
    rc = rc ? rc : cap_client_op_end(c);
  }
  if (rc == 0) {
    void *p = cap_client_tensor_ptr(c, ids[4]);
    CHECK(p != NULL);
    if (p)
      memcpy(e_out, p, N);
  }
  /* The framework frees what it still holds: the client's pointer is the
   * tensor's storage now (a prefetched or recomputed tensor has a new
   * one), unless the client has it out. */
  for (uint32_t k = 0; k < 5 && rc == 0; k++) {
    void *p = cap_client_tensor_ptr(c, ids[k]);
    rc = cap_client_free(c, ids[k]);
    if (p)
      fake_fw_drop(f, p);
  }
  return rc ? rc : cap_client_iteration_end(c, st);
}

static void expected(const uint8_t *w, uint8_t *e) {
  for (uint32_t i = 0; i < N; i++) {
    uint8_t a = (uint8_t)(w[i] + 1), b = (uint8_t)(a * 2),
            cc = (uint8_t)(b + 3), d = (uint8_t)(a + cc);
    e[i] = (uint8_t)(b + d);
  }
}

static void run(bool acquire_a) {
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.no_daemon = true;
  cfg.time_scale = 1.0;
  cfg.framework_memory = true;
  cfg.budget_bytes = 64 * N;
  cap_client_t *c = NULL;
  REQUIRE(cap_client_create(&cfg, &c) == 0);
  fake_fw_t f = {0};
  uint32_t w = 0;
  uint8_t *wbuf = fake_fw_new(&f, N);
  REQUIRE(wbuf);
  for (uint32_t i = 0; i < N; i++)
    wbuf[i] = (uint8_t)(i * 7 + 1);
  /* Adopting needs the callbacks first. */
  CHECK_EQ(cap_client_adopt_persistent(c, N, CAP_KIND_PARAM, wbuf, &w),
           CAP_ESTATE);
  CHECK_EQ(cap_client_set_framework_memory(c, NULL, fake_fw_release, &f),
           CAP_EINVAL);
  REQUIRE(cap_client_set_framework_memory(c, fake_fw_alloc, fake_fw_release,
                                          &f) == 0);
  REQUIRE(cap_client_adopt_persistent(c, N, CAP_KIND_PARAM, wbuf, &w) == 0);
  CHECK_EQ(w, 0);
  cap_client_set_recompute(c, recompute, &f);

  uint8_t want[N], got[N];
  expected(wbuf, want);
  cap_iter_stats_t st;
  CHECK_EQ(iteration(c, &f, w, NO_ACQUIRE, got, &st), 0);
  CHECK_EQ(st.mode, CAP_MODE_PASSIVE);
  CHECK(memcmp(got, want, N) == 0);
  CHECK_EQ(f.allocs, 0);
  CHECK_EQ(f.releases, 0);
  /* w, and the five tensors at the peak (all alive at op4). */
  CHECK_EQ(st.peak_bytes, 6 * N);
  CHECK(!cap_client_op_replayed(c, 1)); /* no plan */

  REQUIRE(cap_client_load_plan_json(c, plan_json, sizeof plan_json - 1) == 0);
  for (int it = 0; it < 3; it++) {
    f.allocs = f.releases = f.recomputes = 0;
    f.n_released_ids = 0;
    memset(got, 0, N);
    CHECK_EQ(iteration(c, &f, w, acquire_a ? 0 : NO_ACQUIRE, got, &st), 0);
    CHECK_EQ(st.mode, CAP_MODE_GUIDED);
    CHECK_EQ(st.plan_version, 3);
    CHECK(memcmp(got, want, N) == 0);
    /* a went out and came back through the framework's allocator; b was
     * dropped and recomputed into memory the framework gave. */
    CHECK_EQ(st.bytes_out, N);
    CHECK_EQ(st.bytes_in, N);
    CHECK_EQ(st.evictions, 2);
    CHECK_EQ(st.recomputed_ops, 1);
    CHECK_EQ(f.recomputes, 1);
    /* Only op1 is in a recompute list: only its arguments need keeping. */
    for (uint32_t seq = 0; seq < 6; seq++)
      CHECK_EQ(cap_client_op_replayed(c, seq), seq == 1);
    CHECK_EQ(f.allocs, 2);
    CHECK_EQ(f.releases, 2);
    bool rel_a = false, rel_b = false;
    for (uint32_t i = 0; i < f.n_released_ids; i++) {
      rel_a |= f.released_ids[i] == 1;
      rel_b |= f.released_ids[i] == 2;
    }
    CHECK(rel_a && rel_b);
    /* The weight's action is refused: kept, counted, said. */
    CHECK_EQ(st.fallbacks, 1);
    CHECK(strstr(st.plan_note, "persistent tensor 0") != NULL);
    CHECK(cap_client_tensor_resident(c, w) == 1);
    /* Tracked bytes: a and b were off the device for a while. */
    CHECK(st.peak_bytes <= 6 * N);
  }
  CHECK_EQ(cap_client_poll(c), 0);
  cap_client_stats_t cs;
  cap_client_get_stats(c, &cs);
  CHECK_EQ(cs.device_bytes, N); /* only the weight is left */
  cap_client_destroy(c);
  /* What the framework holds now is its weight alone. */
  CHECK_EQ(f.n_live, 1);
  fake_fw_drop(&f, wbuf);
}

/* b's list (op1) reads a, which the plan swaps out after op1 and
 * prefetches as op3 starts: valid for b's access at op4. The framework
 * unpacks b early, before op3 (an autograd node whose first op reads
 * another of its saved tensors): the list runs before a's prefetch is
 * issued. The client fetches a now (a stall) rather than fail the step,
 * and the iteration's note says so. */
static const char early_list_plan[] =
    "{\"trace\":\"t\",\"budget_bytes\":0,\"policy\":\"by-hand\",\"version\":2,"
    "\"predicted_iter_ns\":0,\"actions\":["
    "{\"tensor\":1,\"evict_after_access\":2,\"method\":\"swap\","
    "\"prefetch_at\":{\"tensor\":4,\"access\":1}},"
    "{\"tensor\":2,\"evict_after_access\":2,\"method\":\"recompute\","
    "\"recompute_ops\":[1]}]}";

static void test_framework_list_before_prefetch(void) {
  cap_client_config_t cfg;
  sim_fw_config(&cfg);
  cfg.budget_bytes = 64 * N;
  fake_fw_t f = {0};
  cap_client_t *c = sim_fw_client(&cfg, &f);
  REQUIRE(c);
  uint32_t w;
  uint8_t *wbuf = adopt_weight(c, &f, 3, &w);
  REQUIRE(wbuf);
  cap_client_set_recompute(c, recompute, &f);
  uint8_t want[N], got[N];
  expected(wbuf, want);
  cap_iter_stats_t st;
  CHECK_EQ(iteration(c, &f, w, NO_ACQUIRE, got, &st), 0);
  REQUIRE(cap_client_load_plan_json(c, early_list_plan,
                                    sizeof early_list_plan - 1) == 0);
  for (int it = 0; it < 2; it++) {
    memset(got, 0, N);
    int rc = iteration(c, &f, w, it == 0 ? 1 : NO_ACQUIRE, got, &st);
    if (rc < 0)
      fprintf(stderr, "  iteration %d: %s\n", it, cap_client_last_error(c));
    CHECK_EQ(rc, 0);
    CHECK_EQ(st.mode, CAP_MODE_GUIDED);
    CHECK_EQ(st.op_errors, 0u);
    CHECK_EQ(st.fallbacks, 0u);
    CHECK(memcmp(got, want, N) == 0);
    CHECK_EQ(st.recomputed_ops, 1u);
    CHECK_EQ(st.bytes_in, N);
    if (it == 0) /* fetched for the list, and said */
      CHECK(strstr(st.plan_note, "fetched tensor 1 for it") != NULL);
    else /* at its access, as planned: a's prefetch came first */
      CHECK(st.plan_note[0] == 0);
  }
  cap_client_destroy(c);
  CHECK_EQ(f.n_live, 1);
  fake_fw_drop(&f, wbuf);
}

/* The framework reports each op after running it (cap_client_op_run, as
 * PyTorch's dispatcher must) and, once, finds the iteration diverged before
 * its first op: the plan stays out of that iteration and comes back in the
 * next one. Iteration 0 runs without a plan. */
static void test_framework_op_run_and_diverged(void) {
  cap_client_config_t cfg;
  sim_fw_config(&cfg);
  fake_fw_t f = {0};
  cap_client_t *c = sim_fw_client(&cfg, &f);
  REQUIRE(c);
  CHECK_EQ(cap_client_diverged(c), CAP_ESTATE);
  CHECK_EQ(cap_client_op_run(c, "aten::x", NULL, 0, NULL, 0, -1), CAP_EINVAL);
  CHECK(!cap_client_copying(NULL, &f) && !cap_client_copying(c, NULL));
  for (int it = 0; it < 4; it++) {
    if (it == 1) /* after an iteration the plan's tensors exist */
      REQUIRE(cap_client_load_plan_json(c, swap_a_plan,
                                        sizeof swap_a_plan - 1) == 0);
    REQUIRE(cap_client_iteration_begin(c) == 0);
    CHECK_EQ(cap_client_mode(c), it == 0 ? CAP_MODE_PASSIVE : CAP_MODE_GUIDED);
    if (it == 2) {
      CHECK_EQ(cap_client_diverged(c), 0);
      CHECK_EQ(cap_client_mode(c), CAP_MODE_PASSIVE);
    }
    uint32_t a, b;
    uint8_t *pa = fake_fw_new(&f, N);
    REQUIRE(pa);
    memset(pa, 0x5a, N);
    CHECK_EQ(cap_client_adopt(c, N, pa, &a), 0);
    CHECK_EQ(a, 0);
    uint32_t rel0 = f.releases;
    CHECK_EQ(cap_client_op_run(c, "aten::fill_", NULL, 0, &a, 1, 1000), 0);
    uint8_t *pb = fake_fw_new(&f, N);
    REQUIRE(pb);
    CHECK_EQ(cap_client_adopt(c, N, pb, &b), 0);
    /* While a's swap-out runs (the only copy there is), the client still
     * holds a's memory and the framework must keep it; never b's. */
    int running = cap_client_poll(c);
    CHECK_EQ(cap_client_copying(c, pa), running > 0);
    CHECK(!cap_client_copying(c, pb));
    /* Poll until the swap-out has finished: then the framework has been
     * told it may drop a's memory, and a comes back through its allocator. */
    wait_copies(c);
    CHECK_EQ(cap_client_poll(c), 0);
    CHECK(!cap_client_copying(c, pa));
    CHECK_EQ(f.releases - rel0, it == 1 || it == 3 ? 1u : 0u);
    CHECK_EQ(cap_client_tensor_resident(c, a), it == 1 || it == 3 ? 0 : 1);
    void *p = NULL;
    CHECK_EQ(cap_client_acquire(c, a, &p), 0);
    CHECK(p != NULL && ((uint8_t *)p)[N - 1] == 0x5a);
    if (p)
      memcpy(pb, p, N);
    CHECK_EQ(cap_client_op_run(c, "aten::copy_", &a, 1, &b, 1, 1000), 0);
    cap_iter_stats_t st;
    for (uint32_t id = 0; id < 2; id++)
      fw_free(c, &f, id);
    CHECK_EQ(cap_client_iteration_end(c, &st), 0);
    CHECK_EQ(st.plan_version, it == 0 ? 0u : 1u);
    bool guided = it == 1 || it == 3;
    CHECK_EQ(st.evictions, guided ? 1u : 0u);
    CHECK_EQ(st.bytes_in, guided ? (uint64_t)N : 0u);
    if (it == 2)
      CHECK(strstr(st.plan_note, "left the plan's op sequence at op 0") != NULL);
  }
  cap_client_destroy(c);
  CHECK_EQ(f.n_live, 0);
}

/* One swap of tensor 0 after its first access, and a budget of 1.5
 * tensors: before the op that writes tensor 1 (which the framework
 * allocates before it reports the op), make_room waits for the swap-out to
 * release tensor 0; with the host pool capped below one tensor the
 * swap-out cannot start, the tensor stays on the device and the iteration
 * says why. */
static void budget_and_host_cap(bool capped) {
  cap_client_config_t cfg;
  sim_fw_config(&cfg);
  cfg.budget_bytes = N + N / 2;
  cfg.sim_d2h_gbps = cfg.sim_h2d_gbps = 0.001; /* 4 KiB: about 4 ms */
  cfg.host_pool_cap_bytes = capped ? N / 2 : 0;
  fake_fw_t f = {0};
  cap_client_t *c = sim_fw_client(&cfg, &f);
  REQUIRE(c);
  for (int it = 0; it < 2; it++) {
    if (it == 1)
      REQUIRE(cap_client_load_plan_json(c, swap_a_plan,
                                        sizeof swap_a_plan - 1) == 0);
    REQUIRE(cap_client_iteration_begin(c) == 0);
    uint32_t a, b;
    uint8_t *pa = fake_fw_new(&f, N);
    REQUIRE(pa);
    CHECK_EQ(cap_client_adopt(c, N, pa, &a), 0);
    CHECK_EQ(cap_client_op_run(c, "aten::fill_", NULL, 0, &a, 1, 1000), 0);
    /* The guided iteration knows from the first that the next op's output
     * takes N bytes: 1 tensor in use and 1 to come, 1.5 allowed, and only
     * the running swap-out helps. The first only looks at what is in use. */
    bool guided = it == 1, freed = guided && !capped;
    CHECK_EQ(cap_client_make_room(c), guided && capped ? 0 : 1);
    CHECK_EQ(cap_client_tensor_resident(c, a), freed ? 0 : 1);
    CHECK_EQ(f.releases, freed ? 1u : 0u);
    uint8_t *pb = fake_fw_new(&f, N);
    REQUIRE(pb);
    CHECK_EQ(cap_client_adopt(c, N, pb, &b), 0);
    void *p = NULL;
    CHECK_EQ(cap_client_acquire(c, a, &p), 0);
    CHECK_EQ(cap_client_op_run(c, "aten::copy_", &a, 1, &b, 1, 1000), 0);
    cap_iter_stats_t st;
    for (uint32_t id = 0; id < 2; id++)
      fw_free(c, &f, id);
    CHECK_EQ(cap_client_iteration_end(c, &st), 0);
    if (it == 1) {
      CHECK_EQ(st.evictions, capped ? 0u : 1u);
      CHECK_EQ(st.fallbacks, capped ? 1u : 0u);
      CHECK_EQ(st.budget_waits, capped ? 0u : 1u);
      if (capped)
        CHECK(strstr(st.plan_note, "host pool cap") != NULL);
    }
    f.releases = 0;
  }
  cap_client_destroy(c);
  CHECK_EQ(f.n_live, 0);
}

/* A framework that can give up a weight's memory (PyTorch resizes the
 * storage to 0 and back): the plan swaps weight w out after op0 and the
 * framework brings it back before op1 reads it, as it must before any op
 * that uses a weight. The weight goes through release and alloc like a
 * transient tensor and comes back with its bytes. */
static void test_framework_persistent_evictable(void) {
  cap_client_config_t cfg;
  sim_fw_config(&cfg);
  fake_fw_t f = {0};
  cap_client_t *c = sim_fw_client(&cfg, &f);
  REQUIRE(c);
  uint32_t w;
  uint8_t *wbuf = adopt_weight(c, &f, 13, &w);
  REQUIRE(wbuf);
  REQUIRE(cap_client_set_evictable(c, w, true) == 0);
  for (int it = 0; it < 2; it++) {
    if (it == 1)
      REQUIRE(cap_client_load_plan_json(c, swap_a_plan,
                                        sizeof swap_a_plan - 1) == 0);
    REQUIRE(cap_client_iteration_begin(c) == 0);
    uint32_t out[2];
    for (uint32_t k = 0; k < 2; k++) {
      void *p = NULL;
      CHECK_EQ(cap_client_acquire(c, w, &p), 0); /* before the op reads it */
      uint8_t *o = fake_fw_new(&f, N), *x = p;
      REQUIRE(o && x);
      for (uint32_t i = 0; i < N; i++)
        o[i] = (uint8_t)(x[i] + k);
      CHECK_EQ(cap_client_adopt(c, N, o, &out[k]), 0);
      CHECK_EQ(cap_client_op_run(c, "aten::add", &w, 1, &out[k], 1, 1000), 0);
      if (k == 0) { /* the swap-out finishes: the weight's memory goes */
        wait_copies(c);
        CHECK_EQ(cap_client_tensor_resident(c, w), it == 1 ? 0 : 1);
      }
    }
    const uint8_t *b = cap_client_tensor_ptr(c, out[1]);
    REQUIRE(b);
    bool same = true;
    for (uint32_t i = 0; i < N; i++)
      same &= b[i] == (uint8_t)(i * 13 + 5 + 1);
    CHECK(same);
    cap_iter_stats_t st;
    for (uint32_t k = 0; k < 2; k++)
      fw_free(c, &f, out[k]);
    CHECK_EQ(cap_client_iteration_end(c, &st), 0);
    CHECK_EQ(st.evictions, it == 1 ? 1u : 0u);
    CHECK_EQ(st.fallbacks, 0u);
    CHECK_EQ(f.releases, it == 1 ? 1u : 0u);
    CHECK_EQ(f.allocs, it == 1 ? 1u : 0u);
    f.releases = f.allocs = 0;
  }
  cap_client_destroy(c);
  CHECK_EQ(f.n_live, 1); /* the weight, in the memory the client asked for */
  while (f.n_live)
    fake_fw_drop(&f, f.live[0]);
}

/* Two prefetches triggered at the same access (c's first): the plan takes
 * a tensor's memory when its copy starts, and copies in run one at a time,
 * so the framework is asked for b's memory only once a's copy is done. */
static void test_framework_prefetch_queue(void) {
  cap_client_config_t cfg;
  sim_fw_config(&cfg);
  cfg.sim_d2h_gbps = cfg.sim_h2d_gbps = 0.001; /* 4 KiB: about 4 ms */
  fake_fw_t f = {0};
  cap_client_t *c = sim_fw_client(&cfg, &f);
  REQUIRE(c);
  for (int it = 0; it < 2; it++) {
    if (it == 1)
      REQUIRE(cap_client_load_plan_json(c, prefetch_a_b_plan,
                                        sizeof prefetch_a_b_plan - 1) == 0);
    REQUIRE(cap_client_iteration_begin(c) == 0);
    uint32_t id[4];
    void *buf[4];
    for (uint32_t k = 0; k < 3; k++) { /* a, b, c written */
      REQUIRE((buf[k] = fake_fw_new(&f, N)) != NULL);
      memset(buf[k], (int)k + 1, N);
      CHECK_EQ(cap_client_adopt(c, N, buf[k], &id[k]), 0);
      CHECK_EQ(cap_client_op_run(c, "aten::fill_", NULL, 0, &id[k], 1, 1000), 0);
      if (k == 1) /* a and b are out by c's access */
        wait_copies(c);
    }
    CHECK_EQ(f.allocs, it == 1 ? 1u : 0u); /* a's copy in; b's waits */
    for (int spin = 0; spin < 100000 && it == 1 && f.allocs < 2; spin++) {
      cap_client_poll(c);
      nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    CHECK_EQ(f.allocs, it == 1 ? 2u : 0u);
    void *pa = NULL, *pb = NULL;
    CHECK_EQ(cap_client_acquire(c, id[0], &pa), 0);
    CHECK_EQ(cap_client_acquire(c, id[1], &pb), 0);
    CHECK(pa && pb && ((uint8_t *)pa)[N - 1] == 1 && ((uint8_t *)pb)[0] == 2);
    REQUIRE((buf[3] = fake_fw_new(&f, N)) != NULL);
    CHECK_EQ(cap_client_adopt(c, N, buf[3], &id[3]), 0);
    CHECK_EQ(cap_client_op_run(c, "aten::add", id, 2, &id[3], 1, 1000), 0);
    cap_iter_stats_t st;
    for (uint32_t k = 0; k < 4; k++)
      fw_free(c, &f, id[k]);
    CHECK_EQ(cap_client_iteration_end(c, &st), 0);
    CHECK_EQ(st.bytes_in, it == 1 ? 2u * N : 0u);
    f.allocs = f.releases = 0;
  }
  cap_client_destroy(c);
  CHECK_EQ(f.n_live, 0);
}

/* A tensor brought back on demand between make_room and the op whose
 * outputs make_room made room for (PyTorch's adapter brings a weight back
 * before the op that reads it, an unpack its saved tensor) must not take
 * that room: the framework allocates the outputs regardless of the budget.
 * a and b are swapped out after their ops (copies of about 4 ms, one after
 * the other); before op2, which reads a and writes c, make_room needs room
 * for c (N of 2.5 N) and waits for a's swap-out only; bringing a back must
 * then wait for b's too, or c takes the iteration to 3 N. */
static void test_framework_restore_keeps_room(void) {
  cap_client_config_t cfg;
  sim_fw_config(&cfg);
  cfg.budget_bytes = 2 * N + N / 2;
  cfg.sim_d2h_gbps = cfg.sim_h2d_gbps = 0.001; /* 4 KiB: about 4 ms */
  fake_fw_t f = {0};
  cap_client_t *c = sim_fw_client(&cfg, &f);
  REQUIRE(c);
  static const char plan[] =
      "{\"trace\":\"t\",\"budget_bytes\":0,\"policy\":\"by-hand\","
      "\"version\":1,\"predicted_iter_ns\":0,\"actions\":["
      "{\"tensor\":0,\"evict_after_access\":1,\"method\":\"swap\","
      "\"prefetch_at\":null},"
      "{\"tensor\":1,\"evict_after_access\":1,\"method\":\"swap\","
      "\"prefetch_at\":null}]}";
  for (int it = 0; it < 2; it++) {
    if (it == 1)
      REQUIRE(cap_client_load_plan_json(c, plan, sizeof plan - 1) == 0);
    REQUIRE(cap_client_iteration_begin(c) == 0);
    uint32_t id[3];
    for (uint32_t k = 0; k < 2; k++) { /* a, b written */
      void *buf = fake_fw_new(&f, N);
      REQUIRE(buf);
      CHECK_EQ(cap_client_make_room(c), 1);
      CHECK_EQ(cap_client_adopt(c, N, buf, &id[k]), 0);
      CHECK_EQ(cap_client_op_run(c, "aten::fill_", NULL, 0, &id[k], 1, 1000),
               0);
    }
    CHECK_EQ(cap_client_make_room(c), 1);
    void *pa = NULL;
    CHECK_EQ(cap_client_acquire(c, id[0], &pa), 0);
    void *buf = fake_fw_new(&f, N);
    REQUIRE(buf);
    CHECK_EQ(cap_client_adopt(c, N, buf, &id[2]), 0);
    CHECK_EQ(cap_client_op_run(c, "aten::add", id, 1, &id[2], 1, 1000), 0);
    cap_iter_stats_t st;
    for (uint32_t k = 0; k < 3; k++)
      fw_free(c, &f, id[k]);
    CHECK_EQ(cap_client_iteration_end(c, &st), 0);
    if (it == 1) {
      CHECK_EQ(st.evictions, 2u);
      CHECK_EQ(st.fallbacks, 0u);
      CHECK(st.peak_bytes <= cfg.budget_bytes);
      CHECK_EQ(st.over_budget_allocs, 0u);
    } else { /* unplanned: all three at once, the last adoption over */
      CHECK_EQ(st.over_budget_allocs, 1u);
      CHECK_EQ(st.peak_op, 2u);
    }
    f.allocs = f.releases = 0;
  }
  cap_client_destroy(c);
  CHECK_EQ(f.n_live, 0);
}

/* The same room kept from a queued prefetch that starts between make_room
 * and the op: a and b come back by prefetches triggered at op2 (a's copy
 * first, b's queued behind it). Before op3, which writes d, make_room finds
 * room for d (a and c in use, 3.5 tensors allowed); a poll then finds a's
 * copy done and would start b's, which would leave d no room. b's prefetch
 * must not start: b comes back at its access instead (op4, after the
 * framework frees c and d). */
static void test_framework_prefetch_keeps_room(void) {
  cap_client_config_t cfg;
  sim_fw_config(&cfg);
  cfg.budget_bytes = 3 * N + N / 2;
  /* 4 KiB: about 41 ms, so that b's prefetch is queued behind a's however
   * late this thread runs */
  cfg.sim_d2h_gbps = cfg.sim_h2d_gbps = 0.0001;
  fake_fw_t f = {0};
  cap_client_t *c = sim_fw_client(&cfg, &f);
  REQUIRE(c);
  for (int it = 0; it < 2; it++) {
    if (it == 1)
      REQUIRE(cap_client_load_plan_json(c, prefetch_a_b_plan,
                                        sizeof prefetch_a_b_plan - 1) == 0);
    REQUIRE(cap_client_iteration_begin(c) == 0);
    uint32_t id[4]; /* a b c d */
    for (uint32_t k = 0; k < 4; k++) {
      if (k == 3) {
        /* a's copy in ends (the poll below reaps it); make_room, then a
         * poll as the adapter makes between ops */
        nanosleep(&(struct timespec){0, 150000000}, NULL);
        CHECK_EQ(cap_client_make_room(c), 1);
        (void)cap_client_poll(c);
      }
      void *buf = fake_fw_new(&f, N);
      REQUIRE(buf);
      if (k < 3)
        CHECK_EQ(cap_client_make_room(c), 1);
      CHECK_EQ(cap_client_adopt(c, N, buf, &id[k]), 0);
      uint32_t n_in = k == 3 ? 1 : 0; /* op3 reads a */
      CHECK_EQ(cap_client_op_run(c, "aten::fill_", id, n_in, &id[k], 1, 1000),
               0);
      if (k == 1) /* a and b are out by op2 */
        wait_copies(c);
    }
    for (uint32_t k = 2; k < 4; k++) /* the framework frees c and d */
      fw_free(c, &f, id[k]);
    void *pb = NULL;
    CHECK_EQ(cap_client_acquire(c, id[1], &pb), 0); /* op4 reads b */
    CHECK_EQ(cap_client_op_run(c, "aten::sum", &id[1], 1, NULL, 0, 1000), 0);
    cap_iter_stats_t st;
    for (uint32_t k = 0; k < 2; k++)
      fw_free(c, &f, id[k]);
    CHECK_EQ(cap_client_iteration_end(c, &st), 0);
    if (it == 1) {
      CHECK_EQ(st.evictions, 2u);
      CHECK_EQ(st.over_budget_allocs, 0u);
      CHECK(st.peak_bytes <= cfg.budget_bytes);
      CHECK_EQ(f.allocs, 2u); /* a's prefetch, b at its access */
    }
    f.allocs = f.releases = 0;
  }
  cap_client_destroy(c);
  CHECK_EQ(f.n_live, 0);
}

static void test_framework_make_room(void) { budget_and_host_cap(false); }
static void test_framework_host_pool_cap(void) { budget_and_host_cap(true); }

static void test_framework_memory_at_access(void) { run(false); }
static void test_framework_memory_acquire(void) { run(true); }

int main(void) {
  RUN_TEST(test_framework_memory_at_access);
  RUN_TEST(test_framework_memory_acquire);
  RUN_TEST(test_framework_list_before_prefetch);
  RUN_TEST(test_framework_op_run_and_diverged);
  RUN_TEST(test_framework_make_room);
  RUN_TEST(test_framework_restore_keeps_room);
  RUN_TEST(test_framework_prefetch_keeps_room);
  RUN_TEST(test_framework_persistent_evictable);
  RUN_TEST(test_framework_prefetch_queue);
  RUN_TEST(test_framework_host_pool_cap);
  return TEST_SUMMARY();
}
