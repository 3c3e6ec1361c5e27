/*
 * The Capuchin planner on random small profiles (random lineage, in-place
 * ops, tensors that never die, random budgets, persistent eviction on or
 * off): whatever it returns must be a plan that cap_plan_validate accepts,
 * that the simulator runs, and that stays within the budget whenever the
 * planner says it fits. Deterministic (fixed seed).
 */
#include <stdlib.h>
#include <string.h>

#include "cap_test.h"
#include "capuchin/error.h"
#include "capuchin/planner.h"
#include "capuchin/sim.h"

static unsigned long long rng = 88172645463325252ULL;
static unsigned next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (unsigned)rng;
}

static cap_profile_t *random_profile(void) {
  cap_profile_t *p = cap_profile_create();
  if (!p)
    return NULL;
  unsigned nt = 3 + next_rand() % 30, nops = 3 + next_rand() % 40,
           np = 1 + next_rand() % 3;
  for (unsigned i = 0; i < nt; i++)
    cap_profile_add_tensor(p, i, (1 + next_rand() % 100) * 1000000ULL,
                           i < np ? CAP_KIND_PARAM : CAP_KIND_ACTIVATION);
  unsigned created = np, seq = 0;
  long long t = 0;
  for (unsigned o = 0; o < nops; o++) {
    uint32_t in[4], out[1];
    unsigned nin = 0, nout = 0, k = next_rand() % 3;
    for (unsigned j = 0; j < k && created; j++) {
      uint32_t x = next_rand() % created;
      bool dup = false;
      for (unsigned m = 0; m < nin; m++)
        dup |= in[m] == x;
      if (!dup)
        in[nin++] = x;
    }
    const char *name = "aten.mm.default";
    if (created < nt && next_rand() % 4)
      out[nout++] = created;
    else if (nin && next_rand() % 2 && in[0] >= np) {
      out[nout++] = in[0];
      name = "aten.relu_.default";
    }
    long long d = 1000 + next_rand() % 500000;
    if (cap_profile_add_op(p, seq, t, t + d, name, in, nin, out, nout) == 0) {
      seq++;
      if (nout && out[0] == created)
        created++;
    }
    t += d + next_rand() % 20000;
  }
  for (unsigned i = np; i < created; i++)
    if (next_rand() % 5)
      cap_profile_add_free(p, t, i);
  if (cap_profile_finish(p)) {
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

static void test_random_profiles(void) {
  int planned = 0, fits = 0;
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  for (int it = 0; it < 400; it++) {
    cap_profile_t *p = random_profile();
    if (!p)
      continue;
    cap_sim_result_t base;
    memset(&base, 0, sizeof base);
    if (cap_sim_run(p, NULL, &bw, &base)) {
      cap_profile_destroy(p);
      continue;
    }
    uint64_t budget = p->persistent_bytes +
                      (base.peak_bytes - p->persistent_bytes) *
                          (60 + next_rand() % 41) / 100;
    cap_plan_config_t cfg;
    cap_plan_config_init(&cfg, budget);
    cfg.evict_persistent = next_rand() % 4 == 0;
    cap_plan_t *plan = NULL;
    int rc = cap_plan_compute(p, "capuchin", &cfg, &plan);
    if (rc != 0 && rc != CAP_EINFEASIBLE)
      fprintf(stderr, "profile %d: %s\n", it, cap_err_name(rc));
    CHECK(rc == 0 || rc == CAP_EINFEASIBLE);
    CHECK(plan != NULL);
    if (plan) {
      char err[256];
      int v = cap_plan_validate(plan, p, err, sizeof err);
      if (v)
        fprintf(stderr, "profile %d: %s\n", it, err);
      CHECK_EQ(v, 0);
      cap_sim_result_t r;
      memset(&r, 0, sizeof r);
      CHECK_EQ(cap_sim_run(p, plan, &bw, &r), 0);
      if (rc == 0) {
        CHECK(r.peak_bytes <= budget);
        fits++;
      }
      /* never worse than doing nothing */
      CHECK(r.peak_bytes <= base.peak_bytes);
      cap_sim_result_close(&r);
      planned++;
    }
    cap_plan_destroy(plan);
    cap_sim_result_close(&base);
    cap_profile_destroy(p);
  }
  CHECK(planned > 200);
  CHECK(fits >= 10); /* most random budgets are below what some op needs at once */
  printf("random profiles: %d planned, %d fit their budget\n", planned, fits);
}

int main(void) {
  RUN_TEST(test_random_profiles);
  return TEST_SUMMARY();
}
