/*
 * The client under a hand-made plan (loaded without a daemon) on the sim
 * backend: swaps with prefetch, recompute through the callback, and the
 * faults -- copies that fail, allocations that fail, a recompute
 * callback that returns an error. Each must give an error to the caller or
 * a fallback, never a crash, a hang or silent corruption (every access is
 * checked against the pattern its writer left).
 */
#include <signal.h>
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/client.h"
#include "capuchin/plan.h"
#include "client_impl.h" /* cap__client_load_plan: a plan without JSON */

#define MIB (1u << 20)

/* The job: tensor 0 a weight, 1..6 activations.
 *   op0: w  -> a1      op1: a1 -> a2      op2: a2 -> a3
 *   op3: a3 -> a4      op4: a4, a1 -> a5  op5: a5, a2 -> a6
 * a1 (accesses op0, op1, back-access op4) is swapped after access 2 and
 * prefetched when op3 (a3's access 2) starts; a2 (accesses op1, op2,
 * back-access op5) is dropped after access 2 and recomputed by replaying
 * op1 (a1 -> a2). */
enum { NT = 7, MAX_OPS = 7 };
typedef struct shape {
  uint32_t n_ops;
  uint32_t in[MAX_OPS][2], n_in[MAX_OPS], out[MAX_OPS];
} shape_t;
static const shape_t chain = {
    6, {{0}, {1}, {2}, {3}, {4, 1}, {5, 2}}, {1, 1, 1, 1, 2, 2}, {1, 2, 3, 4, 5, 6}};
/* For a merged list (one replay restoring two dropped tensors): a3 is read
 * at op4, a2 only at op5, and op6 lists a3 on both sides, as detach or
 * relu_ do (it reads what it writes).
 *   op0: w  -> a1      op1: a1 -> a2      op2: a2 -> a3      op3: a3 -> a4
 *   op4: a4, a3 -> a5  op5: a5, a2 -> a6  op6: a3 -> a3 */
static const shape_t merged = {7,
                               {{0}, {1}, {2}, {3}, {4, 3}, {5, 2}, {3}},
                               {1, 1, 1, 1, 2, 2, 1},
                               {1, 2, 3, 4, 5, 6, 3}};
static const uint64_t bytes[NT] = {1 * MIB, 8 * MIB, 8 * MIB, 8 * MIB,
                                   8 * MIB, 8 * MIB, 8 * MIB};
static const char *names[MAX_OPS] = {"op.a", "op.b", "op.c", "op.d",
                                     "op.e", "op.f", "op.g"};

typedef struct job {
  cap_client_t *c;
  uint32_t iter;
  uint32_t seed_iter[NT];
  int64_t mismatches;
  const shape_t *shape;
  int fail_recompute; /* callback returns an error while set */
  int fail_at;        /* and when it is the fail_at-th call (1-based) */
  int recomputes;
  bool unwritten[NT]; /* its op failed this iteration: nothing to check */
} job_t;

static uint64_t seed(uint32_t id, uint32_t it) { return ((uint64_t)id << 32) | it; }

static int recompute_cb(void *user, uint32_t seq, const char *name,
                        const uint32_t *in_ids, void *const *in_ptrs,
                        uint32_t n_in, const uint32_t *out_ids,
                        void *const *out_ptrs, uint32_t n_out) {
  job_t *j = user;
  (void)name;
  j->recomputes++;
  if (j->fail_recompute || j->recomputes == j->fail_at)
    return -1;
  if (seq >= j->shape->n_ops)
    return -1;
  for (uint32_t i = 0; i < n_in; i++) {
    int64_t bad = cap_client_pattern_check(j->c, in_ptrs[i], bytes[in_ids[i]],
                                           seed(in_ids[i], j->seed_iter[in_ids[i]]));
    if (bad)
      j->mismatches += bad;
  }
  for (uint32_t i = 0; i < n_out; i++)
    cap_client_pattern_fill(j->c, out_ptrs[i], bytes[out_ids[i]],
                            seed(out_ids[i], j->seed_iter[out_ids[i]]));
  return 0;
}

/* One iteration; returns the number of op begins that failed (with what). */
static int run_iter(job_t *j, cap_iter_stats_t *st, int *last_err) {
  cap_client_t *c = j->c;
  int errs = 0;
  CHECK_EQ(cap_client_iteration_begin(c), 0);
  j->iter++;
  memset(j->unwritten, 0, sizeof j->unwritten);
  for (uint32_t t = 1; t < NT; t++) {
    uint32_t id;
    CHECK_EQ(cap_client_declare(c, bytes[t], &id), 0);
    CHECK_EQ(id, t);
  }
  const shape_t *sh = j->shape;
  for (uint32_t s = 0; s < sh->n_ops; s++) {
    void *in[2], *out[1];
    int rc = cap_client_op_begin(c, names[s], sh->in[s], sh->n_in[s],
                                 &sh->out[s], 1, in, out);
    if (rc < 0) {
      errs++;
      *last_err = rc;
      j->unwritten[sh->out[s]] = true;
      continue;
    }
    for (uint32_t i = 0; i < sh->n_in[s]; i++) {
      uint32_t id = sh->in[s][i];
      if (!j->unwritten[id])
        j->mismatches += cap_client_pattern_check(c, in[i], bytes[id],
                                                  seed(id, j->seed_iter[id]));
    }
    j->unwritten[sh->out[s]] = false;
    j->seed_iter[sh->out[s]] = j->iter;
    cap_client_pattern_fill(c, out[0], bytes[sh->out[s]],
                            seed(sh->out[s], j->iter));
    cap_client_compute(c, 200000); /* 0.2 ms of trace time */
    CHECK_EQ(cap_client_op_end(c), 0);
  }
  for (uint32_t t = 1; t < NT; t++)
    cap_client_free(c, t);
  CHECK_EQ(cap_client_iteration_end(c, st), 0);
  return errs;
}

static cap_plan_t *make_plan(void) {
  cap_plan_t *p = cap_plan_create("test", 64 * MIB);
  /* a1: evict after access 2 (op1), prefetch when a3's access 2 (op3) starts */
  cap_plan_add_swap(p, 1, 2, 3, 2, 0);
  /* a2: drop after access 2 (op2), recompute with op1 */
  uint32_t ops[] = {1};
  cap_plan_add_recompute(p, 2, 2, ops, 1);
  p->version = 7;
  return p;
}

static job_t *open_job_shaped(uint64_t budget, const shape_t *shape) {
  static job_t j;
  memset(&j, 0, sizeof j);
  j.shape = shape;
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.no_daemon = true;
  cfg.budget_bytes = budget;
  cfg.time_scale = 1.0;
  if (cap_client_create(&cfg, &j.c) != 0)
    return NULL;
  uint32_t id;
  void *w;
  if (cap_client_register(j.c, bytes[0], CAP_KIND_PARAM, &id, &w) != 0 || id != 0)
    return NULL;
  cap_client_pattern_fill(j.c, w, bytes[0], seed(0, 0));
  cap_client_set_recompute(j.c, recompute_cb, &j);
  return &j;
}

static job_t *open_job(uint64_t budget) { return open_job_shaped(budget, &chain); }

static void test_guided_plan(void) {
  job_t *j = open_job(64 * MIB);
  REQUIRE(j);
  cap_iter_stats_t st;
  int err = 0;
  CHECK_EQ(run_iter(j, &st, &err), 0); /* passive: builds the lineage */
  CHECK_EQ(st.mode, CAP_MODE_PASSIVE);
  cap_plan_t *p = make_plan();
  CHECK_EQ(cap__client_load_plan(j->c, p), 0);
  cap_plan_destroy(p);
  for (int i = 0; i < 3; i++) {
    CHECK_EQ(run_iter(j, &st, &err), 0);
    CHECK_EQ(st.mode, CAP_MODE_GUIDED);
    CHECK_EQ(st.plan_version, 7);
    CHECK_EQ(st.bytes_out, 8 * MIB); /* a1 out and back in */
    CHECK_EQ(st.bytes_in, 8 * MIB);
    CHECK_EQ(st.recomputed_ops, 1);  /* a2 by op1 */
    CHECK_EQ(st.evictions, 2);
  }
  CHECK(j->recomputes >= 3);
  CHECK_EQ(j->mismatches, 0);
  cap_client_destroy(j->c);
}

static void test_budget_passive(void) {
  /* 30 MiB: w + at most three 8 MiB activations; LRU swapping makes it fit. */
  job_t *j = open_job(30 * MIB);
  REQUIRE(j);
  cap_iter_stats_t st;
  int err = 0;
  for (int i = 0; i < 2; i++) {
    CHECK_EQ(run_iter(j, &st, &err), 0);
    CHECK(st.peak_bytes <= 30 * MIB);
    CHECK(st.evictions > 0);
  }
  CHECK_EQ(j->mismatches, 0);
  cap_client_destroy(j->c);
}

static void test_copy_faults(void) {
  job_t *j = open_job(64 * MIB);
  REQUIRE(j);
  cap_iter_stats_t st;
  int err = 0;
  run_iter(j, &st, &err);
  cap_plan_t *p = make_plan();
  cap__client_load_plan(j->c, p);
  cap_plan_destroy(p);
  /* The swap-out of a1 fails: a1 stays on the device (fallback). */
  cap_client_fault_copy(j->c, 1);
  CHECK_EQ(run_iter(j, &st, &err), 0);
  CHECK(st.fallbacks >= 1);
  /* The prefetch (second copy) fails: retried synchronously. */
  cap_client_fault_copy(j->c, 2);
  CHECK_EQ(run_iter(j, &st, &err), 0);
  CHECK(st.fallbacks >= 1);
  cap_client_fault_copy(j->c, 0);
  CHECK_EQ(run_iter(j, &st, &err), 0);
  CHECK_EQ(j->mismatches, 0);
  cap_client_destroy(j->c);
}

static void test_alloc_fault(void) {
  job_t *j = open_job(64 * MIB);
  REQUIRE(j);
  cap_iter_stats_t st;
  int err = 0;
  cap_client_fault_alloc(j->c, 3, false); /* the third allocation fails */
  int errs = run_iter(j, &st, &err);
  CHECK(errs >= 1);
  CHECK_EQ(err, CAP_ENOMEM);
  /* The job goes on: the next iteration is whole again. */
  j->mismatches = 0;
  CHECK_EQ(run_iter(j, &st, &err), 0);
  CHECK_EQ(run_iter(j, &st, &err), 0);
  CHECK_EQ(j->mismatches, 0);
  cap_client_destroy(j->c);
}

static void test_recompute_fault(void) {
  job_t *j = open_job(64 * MIB);
  REQUIRE(j);
  cap_iter_stats_t st;
  int err = 0;
  run_iter(j, &st, &err);
  cap_plan_t *p = make_plan();
  cap__client_load_plan(j->c, p);
  cap_plan_destroy(p);
  j->fail_recompute = 1;
  int errs = run_iter(j, &st, &err);
  CHECK_EQ(errs, 1); /* op5 cannot get a2 */
  CHECK_EQ(err, CAP_ERECOMPUTE);
  CHECK(st.fallbacks >= 1);
  /* Next iterations: a2 is swapped instead of dropped; no errors, no
   * mismatches, and the callback is not needed. */
  j->mismatches = 0;
  int before = j->recomputes;
  CHECK_EQ(run_iter(j, &st, &err), 0);
  CHECK_EQ(run_iter(j, &st, &err), 0);
  CHECK_EQ(j->recomputes, before);
  CHECK_EQ(st.recomputed_ops, 0);
  CHECK_EQ(j->mismatches, 0);
  cap_client_destroy(j->c);
}

/* The merged shape under a plan whose list for a3 also restores a2 (one
 * replay for both): [op1, op2], or with a1 released after op1, [op0, op1,
 * op2]; a2's own list is [op1]. One guided iteration runs as planned; the
 * callback is then set to fail on the list's last op, op2, once op1 has
 * restored a2. */
static job_t *merged_guided(bool release_a1) {
  job_t *j = open_job_shaped(64 * MIB, &merged);
  if (!j)
    return NULL;
  cap_iter_stats_t st;
  int err = 0;
  run_iter(j, &st, &err);
  cap_plan_t *p = cap_plan_create("merged", 64 * MIB);
  uint32_t a3_ops[] = {0, 1, 2}, a2_ops[] = {1};
  uint32_t n = release_a1 ? 3 : 2;
  if (release_a1)
    cap_plan_add_release(p, 1, 2);                  /* a1, after op1 */
  cap_plan_add_recompute(p, 3, 2, a3_ops + 3 - n, n); /* back-access op4 */
  cap_plan_add_recompute(p, 2, 2, a2_ops, 1);         /* back-access op5 */
  CHECK_EQ(cap__client_load_plan(j->c, p), 0);
  cap_plan_destroy(p);
  int before = j->recomputes;
  CHECK_EQ(run_iter(j, &st, &err), 0);
  CHECK_EQ(st.mode, CAP_MODE_GUIDED);
  CHECK_EQ(j->recomputes - before, (int)n); /* a2's own list never runs */
  CHECK_EQ(j->mismatches, 0);
  j->fail_at = j->recomputes + (int)n;
  return j;
}

/* The merged list fails after restoring a2: a2, restored whole by op1,
 * stays on the device as the plan has it and op5 reads its bytes; a3's
 * contents are lost, so every op that reads it fails -- op6 too, which
 * lists a3 as input and output and used to be given fresh memory as if it
 * only wrote it (wrong bytes, no error). */
static void test_merged_list_fault(void) {
  job_t *j = merged_guided(false);
  REQUIRE(j);
  cap_iter_stats_t st;
  int err = 0;
  CHECK_EQ(run_iter(j, &st, &err), 2); /* op4 and op6 cannot read a3 */
  CHECK_EQ(err, CAP_ERECOMPUTE);
  CHECK_EQ(j->mismatches, 0); /* a2 at op5 and a3 at op6: no wrong bytes */
  CHECK_EQ(j->recomputes, j->fail_at); /* a2's own list never ran */
  /* Then a3 is swapped and a2's own list runs at op5. */
  for (int i = 0; i < 2; i++) {
    int before = j->recomputes;
    CHECK_EQ(run_iter(j, &st, &err), 0);
    CHECK_EQ(j->recomputes - before, 1);
    CHECK_EQ(st.bytes_out, 8 * MIB);
  }
  CHECK_EQ(j->mismatches, 0);
  cap_client_destroy(j->c);
}

/* With a1 released, a2's own list [op1] cannot run at op5 (a3's list
 * rebuilds a1 as a temporary). Once a3 falls back to a swap, a2's list
 * would run and fail at op5 in every iteration after: the plan is walked
 * again as it will run, and a2 falls back too. */
static void test_merged_partner_falls_back(void) {
  job_t *j = merged_guided(true);
  REQUIRE(j);
  cap_iter_stats_t st;
  int err = 0;
  CHECK_EQ(run_iter(j, &st, &err), 2); /* op4 and op6 cannot read a3 */
  for (int i = 0; i < 2; i++) {
    int before = j->recomputes;
    CHECK_EQ(run_iter(j, &st, &err), 0);
    CHECK_EQ(j->recomputes, before);
    CHECK_EQ(st.bytes_out, 16 * MIB); /* a2 and a3 swapped */
  }
  CHECK_EQ(j->mismatches, 0);
  cap_client_destroy(j->c);
}

static void test_bad_input(void) {
  job_t *j = open_job(64 * MIB);
  REQUIRE(j);
  cap_client_t *c = j->c;
  uint32_t id, bogus = 999;
  CHECK_EQ(cap_client_op_begin(c, "x", &bogus, 1, NULL, 0, NULL, NULL), CAP_ESTATE);
  CHECK_EQ(cap_client_declare(c, 10, &id), CAP_ESTATE);
  CHECK_EQ(cap_client_iteration_begin(c), 0);
  CHECK_EQ(cap_client_iteration_begin(c), CAP_ESTATE);
  CHECK_EQ(cap_client_op_begin(c, "x", &bogus, 1, NULL, 0, NULL, NULL), CAP_EINVAL);
  CHECK_EQ(cap_client_op_begin(c, NULL, NULL, 0, NULL, 0, NULL, NULL), CAP_EINVAL);
  CHECK_EQ(cap_client_op_end(c), CAP_ESTATE);
  CHECK_EQ(cap_client_free(c, 0), CAP_EINVAL); /* persistent */
  CHECK_EQ(cap_client_free(c, 12345), CAP_EINVAL);
  uint32_t w = 0;
  CHECK_EQ(cap_client_op_begin(c, "x", &w, 1, NULL, 0, NULL, NULL), 0);
  CHECK_EQ(cap_client_op_begin(c, "x", &w, 1, NULL, 0, NULL, NULL), CAP_ESTATE);
  CHECK_EQ(cap_client_iteration_end(c, NULL), CAP_ESTATE);
  CHECK_EQ(cap_client_op_end(c), 0);
  CHECK_EQ(cap_client_iteration_end(c, NULL), 0);
  /* A plan naming tensors this job does not have is refused at install. */
  cap_plan_t *p = cap_plan_create("bad", 0);
  cap_plan_add_swap(p, 4000, 1, CAP_NONE, 0, 0);
  CHECK_EQ(cap__client_load_plan(c, p), 0);
  cap_plan_destroy(p);
  cap_iter_stats_t st;
  CHECK_EQ(cap_client_iteration_begin(c), 0);
  CHECK_EQ(cap_client_iteration_end(c, &st), 0);
  CHECK_EQ(st.mode, CAP_MODE_PASSIVE);
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "nonsense";
  cap_client_t *c2 = NULL;
  CHECK_EQ(cap_client_create(&cfg, &c2), CAP_EINVAL);
  cfg.backend = "sim";
  cfg.time_scale = -1;
  CHECK_EQ(cap_client_create(&cfg, &c2), CAP_EINVAL);
  cap_client_destroy(NULL);
  cap_client_destroy(c);
}

int main(void) {
  alarm(300); /* a hang is a failure */
  RUN_TEST(test_guided_plan);
  RUN_TEST(test_budget_passive);
  RUN_TEST(test_copy_faults);
  RUN_TEST(test_alloc_fault);
  RUN_TEST(test_recompute_fault);
  RUN_TEST(test_merged_list_fault);
  RUN_TEST(test_merged_partner_falls_back);
  RUN_TEST(test_bad_input);
  return TEST_SUMMARY();
}
