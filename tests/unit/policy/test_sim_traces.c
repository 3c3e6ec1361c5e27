/*
 * The simulator on the seven real traces: with no plan it reproduces the
 * profile's own memory curve and timeline exactly, and it is fast enough
 * for a planner to call it many times.
 */
#include "cap_test.h"

#include <time.h>

#include "capuchin/error.h"
#include "capuchin/plan.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"

static const char *const traces[] = {
    "resnet50", "vgg16", "inception_v3", "mobilenet_v2",
    "bert_base", "bert_large", "gpt2_small",
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void test_unmanaged_equals_profile(void) {
  for (size_t i = 0; i < sizeof traces / sizeof *traces; i++) {
    char rel[64], err[512];
    snprintf(rel, sizeof rel, "traces/%s.trace", traces[i]);
    cap_profile_t *p = NULL;
    int rc = cap_trace_load(cap_test_data(rel), &p, err, sizeof err);
    if (rc) {
      fprintf(stderr, "%s: %s\n", rel, err);
      CHECK(rc == 0);
      continue;
    }
    cap_sim_result_t r;
    cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
    REQUIRE(cap_sim_run(p, NULL, &bw, &r) == 0);
    CHECK_EQ(r.peak_bytes, p->peak_bytes);
    CHECK_EQ(r.peak_t_ns, p->peak_t_ns);
    CHECK_EQ(r.iter_ns, p->ops[p->n_ops - 1].end_ns);
    CHECK_EQ(r.stall_ns, 0);
    CHECK_EQ(r.recompute_ns, 0);
    /* The simulated curve is the profile's curve. */
    cap_curve_t c;
    REQUIRE(cap_curve_compute(p, &c) == 0);
    uint32_t j = 0, k = 0;
    /* Compare as step functions: values at every change point of either. */
    while (j < c.n_points && k < r.curve.n_points) {
      int64_t t = c.points[j].t_ns < r.curve.points[k].t_ns
                      ? c.points[j].t_ns
                      : r.curve.points[k].t_ns;
      while (j + 1 < c.n_points && c.points[j + 1].t_ns <= t)
        j++;
      while (k + 1 < r.curve.n_points && r.curve.points[k + 1].t_ns <= t)
        k++;
      if (c.points[j].t_ns <= t && r.curve.points[k].t_ns <= t &&
          c.points[j].bytes != r.curve.points[k].bytes) {
        fprintf(stderr, "%s: curve differs at %lld: %llu vs %llu\n", rel,
                (long long)t, (unsigned long long)c.points[j].bytes,
                (unsigned long long)r.curve.points[k].bytes);
        CHECK(0);
        break;
      }
      if (j + 1 >= c.n_points && k + 1 >= r.curve.n_points)
        break;
      int64_t nj = j + 1 < c.n_points ? c.points[j + 1].t_ns : INT64_MAX;
      int64_t nk = k + 1 < r.curve.n_points ? r.curve.points[k + 1].t_ns : INT64_MAX;
      if (nj <= nk)
        j++;
      if (nk <= nj)
        k++;
    }
    cap_curve_close(&c);
    cap_sim_result_close(&r);

    if (strcmp(traces[i], "bert_large") == 0) {
      int reps = 200;
      double t0 = now_ms();
      for (int n = 0; n < reps; n++) {
        REQUIRE(cap_sim_run(p, NULL, &bw, &r) == 0);
        cap_sim_result_close(&r);
      }
      printf("bert_large unmanaged sim: %.3f ms per run\n",
             (now_ms() - t0) / reps);
    }
    cap_profile_destroy(p);
  }
}

int main(void) {
  RUN_TEST(test_unmanaged_equals_profile);
  return TEST_SUMMARY();
}
