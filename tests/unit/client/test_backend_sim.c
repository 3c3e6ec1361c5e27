/*
 * The conformance suite on the sim backend, at real time and 20x faster,
 * plus what only sim promises: copy times that follow the configured
 * bandwidths and duplex limit, a scaled clock, the device capacity.
 */
#include "backend_conformance.h"

static void sim_config(double scale) {
  cap_backend_config_init(&conf_cfg);
  conf_cfg.name = "sim";
  conf_cfg.time_scale = scale;
  /* slow enough that a 32 MiB copy takes 11 ms of model time, well above
   * what memcpy needs; both directions at once are duplex-limited */
  conf_cfg.sim_h2d_gbps = 3.0;
  conf_cfg.sim_d2h_gbps = 3.0;
  conf_cfg.sim_duplex_gbps = 4.0;
  conf_cfg.sim_device_bytes = 1ull << 30;
}

/* Duplex sharing, max-min, at 2 GB/s H2D, 1.5 GB/s D2H, 2.5 GB/s duplex
 * (slow, so that the model and not memcpy sets the pace): while both run,
 * neither is below half the duplex (1.25), so both get 1.25 GB/s. A 30 MB
 * H2D copy and a 15 MB D2H copy started together: D2H ends at 15e6 / 1.25 =
 * 12 ms, having let H2D move 15 MB; H2D then runs alone at 2 GB/s for
 * 7.5 ms: 19.5 ms. (Without the duplex limit: 10 ms and 15 ms.) */
static void sim_duplex_exact(void) {
  sim_config(1.0);
  conf_cfg.sim_h2d_gbps = 2.0;
  conf_cfg.sim_d2h_gbps = 1.5;
  conf_cfg.sim_duplex_gbps = 2.5;
  cap_backend_t *b = NULL;
  REQUIRE(cap_backend_create(&conf_cfg, &b) == 0);
  size_t big = 30000000, small = 15000000;
  void *h1, *h2, *d1, *d2;
  REQUIRE(cap_backend_host_alloc(b, big, &h1) == 0);
  REQUIRE(cap_backend_host_alloc(b, small, &h2) == 0);
  REQUIRE(cap_backend_device_alloc(b, big, &d1) == 0);
  REQUIRE(cap_backend_device_alloc(b, small, &d2) == 0);
  memset(h1, 1, big);
  memset(d2, 2, small);
  cap_event_t *e1, *e2;
  REQUIRE(cap_backend_event_create(b, &e1) == 0);
  REQUIRE(cap_backend_event_create(b, &e2) == 0);
  /* warm the pages so that first-touch faults do not count */
  memset(d1, 0, big);
  memset(h2, 0, small);
  /* A loaded machine can deschedule this process for longer than any
   * margin: an upper bound must hold in one of three tries, a lower bound
   * (the model's pace) in every one. */
  int64_t t_d2h = 0, t_h2d = 0;
  for (int try = 0; try < 3; try++) {
    int64_t t0 = cap_backend_now_ns(b);
    CHECK_EQ(cap_backend_copy_async(b, CAP_STREAM_H2D, d1, h1, big), 0);
    CHECK_EQ(cap_backend_copy_async(b, CAP_STREAM_D2H, h2, d2, small), 0);
    CHECK_EQ(cap_backend_event_record(b, e1, CAP_STREAM_H2D), 0);
    CHECK_EQ(cap_backend_event_record(b, e2, CAP_STREAM_D2H), 0);
    CHECK_EQ(cap_backend_event_synchronize(b, e2), 0);
    t_d2h = cap_backend_now_ns(b) - t0;
    CHECK_EQ(cap_backend_event_synchronize(b, e1), 0);
    t_h2d = cap_backend_now_ns(b) - t0;
    printf("  duplex: D2H %.3f ms (model 12.000), H2D %.3f ms (model 19.500)\n",
           t_d2h / 1e6, t_h2d / 1e6);
    CHECK(t_d2h >= 11640000 && t_h2d >= 18900000);
    if (t_d2h < 12000000 * 4 + 100000000 && t_h2d < 19500000 * 4 + 100000000)
      break;
  }
  CHECK(t_d2h < 12000000 * 4 + 100000000);
  CHECK(t_h2d < 19500000 * 4 + 100000000);
  CHECK(t_h2d > t_d2h);
  CHECK(((unsigned char *)d1)[big - 1] == 1 && ((unsigned char *)h2)[small - 1] == 2);
  cap_backend_event_destroy(b, e1);
  cap_backend_event_destroy(b, e2);
  cap_backend_device_free(b, d1);
  cap_backend_device_free(b, d2);
  cap_backend_host_free(b, h1);
  cap_backend_host_free(b, h2);
  cap_backend_destroy(b);
}

/* Copies on one stream run one at a time: two 8 MB H2D copies take twice
 * as long as one. */
static void sim_serialised(void) {
  sim_config(1.0);
  conf_cfg.sim_h2d_gbps = 8.0;
  cap_backend_t *b = NULL;
  REQUIRE(cap_backend_create(&conf_cfg, &b) == 0);
  size_t n = 8000000;
  void *h, *d;
  REQUIRE(cap_backend_host_alloc(b, n, &h) == 0);
  REQUIRE(cap_backend_device_alloc(b, 2 * n, &d) == 0);
  memset(h, 7, n);
  memset(d, 0, 2 * n);
  int64_t el = 0;
  for (int try = 0; try < 3; try++) { /* upper bound: one of three tries */
    int64_t t0 = cap_backend_now_ns(b);
    CHECK_EQ(cap_backend_copy_async(b, CAP_STREAM_H2D, d, h, n), 0);
    CHECK_EQ(cap_backend_copy_async(b, CAP_STREAM_H2D, (char *)d + n, h, n), 0);
    CHECK_EQ(cap_backend_stream_synchronize(b, CAP_STREAM_H2D), 0);
    el = cap_backend_now_ns(b) - t0;
    printf("  two 8 MB H2D copies: %.3f ms (model 2.000)\n", el / 1e6);
    CHECK(el >= 1950000);
    if (el < 2000000 * 4 + 100000000)
      break;
  }
  CHECK(el < 2000000 * 4 + 100000000);
  cap_backend_device_free(b, d);
  cap_backend_host_free(b, h);
  cap_backend_destroy(b);
}

/* The clock is trace time: at time_scale 0.05 a 100 ms op ends 100 ms later
 * on the clock but about 5 ms later in real time. */
static void sim_time_scale(void) {
  sim_config(0.05);
  cap_backend_t *b = NULL;
  REQUIRE(cap_backend_create(&conf_cfg, &b) == 0);
  /* upper bounds: one of three tries (see sim_duplex_exact) */
  bool fast_enough = false;
  for (int try = 0; try < 3 && !fast_enough; try++) {
    struct timespec r0, r1;
    CHECK_EQ(cap_backend_stream_synchronize(b, CAP_STREAM_COMPUTE), 0);
    clock_gettime(CLOCK_MONOTONIC, &r0);
    int64_t t0 = cap_backend_now_ns(b);
    for (int i = 0; i < 10; i++)
      CHECK_EQ(cap_backend_run_op(b, 10000000, NULL, 0), 0);
    int64_t el = cap_backend_now_ns(b) - t0;
    clock_gettime(CLOCK_MONOTONIC, &r1);
    double real = (double)(r1.tv_sec - r0.tv_sec) * 1e9 +
                  (double)(r1.tv_nsec - r0.tv_nsec);
    printf("  10 ops of 10 ms at scale 0.05: clock %.2f ms, real %.2f ms\n",
           el / 1e6, real / 1e6);
    CHECK(el >= 100000000 && real >= 0.05 * 100e6 * 0.99);
    fast_enough = el < 100000000 + (int64_t)(100e6 / 0.05) &&
                  real < 0.05 * 100e6 * 3 + 100e6;
    /* ops back to back do not accumulate sleep overshoot: 200 ops of 50 us */
    CHECK_EQ(cap_backend_stream_synchronize(b, CAP_STREAM_COMPUTE), 0);
    t0 = cap_backend_now_ns(b);
    for (int i = 0; i < 200; i++)
      CHECK_EQ(cap_backend_run_op(b, 50000, NULL, 0), 0);
    el = cap_backend_now_ns(b) - t0;
    printf("  200 ops of 50 us at scale 0.05: clock %.2f ms (model 10.00)\n",
           el / 1e6);
    CHECK(el >= 10000000);
    fast_enough = fast_enough && el < 10000000 * 3 + 100000000;
  }
  CHECK(fast_enough);
  cap_backend_destroy(b);
}

/* The sim device's UUID: as configured, else $CAPUCHIN_SIM_DEVICE_UUID,
 * else the one every sim job of the machine shares. */
static void sim_uuid(void) {
  sim_config(1.0);
  unsetenv("CAPUCHIN_SIM_DEVICE_UUID");
  cap_backend_t *b = NULL;
  REQUIRE(cap_backend_create(&conf_cfg, &b) == 0);
  CHECK(!strcmp(cap_backend_info(b)->device_uuid, CAP_BACKEND_DEFAULT_SIM_UUID));
  cap_backend_destroy(b);
  setenv("CAPUCHIN_SIM_DEVICE_UUID", "SIM-e", 1);
  REQUIRE(cap_backend_create(&conf_cfg, &b) == 0);
  CHECK(!strcmp(cap_backend_info(b)->device_uuid, "SIM-e"));
  cap_backend_destroy(b);
  conf_cfg.sim_device_uuid = "SIM-c";
  REQUIRE(cap_backend_create(&conf_cfg, &b) == 0);
  CHECK(!strcmp(cap_backend_info(b)->device_uuid, "SIM-c"));
  cap_backend_destroy(b);
  conf_cfg.sim_device_uuid = NULL;
  unsetenv("CAPUCHIN_SIM_DEVICE_UUID");
}

static void sim_capacity(void) {
  sim_config(1.0);
  conf_cfg.sim_device_bytes = 10 * MIB;
  cap_backend_t *b = NULL;
  REQUIRE(cap_backend_create(&conf_cfg, &b) == 0);
  CHECK_EQ(cap_backend_info(b)->total_bytes, 10 * MIB);
  void *p, *q;
  CHECK_EQ(cap_backend_device_alloc(b, 8 * MIB, &p), 0);
  CHECK_EQ(cap_backend_device_alloc(b, 4 * MIB, &q), CAP_ENOMEM);
  cap_backend_device_free(b, p);
  CHECK_EQ(cap_backend_device_alloc(b, 4 * MIB, &q), 0);
  cap_backend_device_free(b, q);
  cap_backend_destroy(b);
}

static void sim_bad_config(void) {
  cap_backend_config_t c;
  cap_backend_config_init(&c);
  cap_backend_t *b = NULL;
  c.name = "nope";
  CHECK_EQ(cap_backend_create(&c, &b), CAP_ENOENT);
  c.name = "sim";
  c.time_scale = -1;
  CHECK_EQ(cap_backend_create(&c, &b), CAP_EINVAL);
  CHECK(b == NULL);
  CHECK(cap_backend_available("sim"));
  CHECK(!cap_backend_available("nope"));
  cap_backend_destroy(NULL);
}

int main(void) {
  sim_config(1.0);
  run_conformance("sim, real time", 32 * MIB, 1);
  /* 20x faster than real time a 32 MiB copy is modelled in 0.2 ms, less than
   * memcpy takes: copy times then follow memcpy, so no bandwidth check */
  sim_config(0.05);
  run_conformance("sim, 20x faster", 32 * MIB, 0);
  RUN_TEST(sim_duplex_exact);
  RUN_TEST(sim_serialised);
  RUN_TEST(sim_time_scale);
  RUN_TEST(sim_uuid);
  RUN_TEST(sim_capacity);
  RUN_TEST(sim_bad_config);
  return TEST_SUMMARY();
}
