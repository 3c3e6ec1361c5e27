/*
 * The conformance suite on the cuda backend. Carries the ctest label `gpu`;
 * exits 77 (skipped) where the cuda backend is not compiled in or no GPU is
 * present.
 */
#include "backend_conformance.h"

/* An integrity check and a read of the op mismatch count wait for the
 * compute stream only, never for a copy the copy engines run: a replay
 * checks every input of every op, and a check queued behind a swap-out's
 * copy (its count read back by a copy on the same engine) made each such
 * op wait for the whole swap-out. A 1 GiB copy out takes about 20 ms at
 * the H100's 55 GB/s; the check must come back while it still runs. */
static void check_skips_copy_engines(void) {
  size_t n = 1024 * (size_t)MIB, small = 64 * 1024;
  void *host = NULL, *dev = NULL, *buf = NULL;
  REQUIRE(cap_backend_host_alloc(B, n, &host) == 0);
  REQUIRE(cap_backend_device_alloc(B, n, &dev) == 0);
  REQUIRE(cap_backend_device_alloc(B, small, &buf) == 0);
  REQUIRE(cap_backend_pattern_fill(B, buf, small, 3) == 0);
  REQUIRE(cap_backend_stream_synchronize(B, CAP_STREAM_COMPUTE) == 0);
  cap_event_t *done = NULL;
  REQUIRE(cap_backend_event_create(B, &done) == 0);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_D2H, host, dev, n), 0);
  CHECK_EQ(cap_backend_event_record(B, done, CAP_STREAM_D2H), 0);
  CHECK_EQ(cap_backend_pattern_check(B, buf, small, 3), 0);
  uint64_t bad = 99;
  CHECK_EQ(cap_backend_mismatches(B, &bad), 0);
  CHECK_EQ(bad, 0);
  CHECK_EQ(cap_backend_event_query(B, done), 0); /* the copy still runs */
  CHECK_EQ(cap_backend_event_synchronize(B, done), 0);
  cap_backend_event_destroy(B, done);
  cap_backend_device_free(B, buf);
  cap_backend_device_free(B, dev);
  cap_backend_host_free(B, host);
}

int main(void) {
  if (!cap_backend_available("cuda")) {
    printf("skipped: no CUDA device (or the cuda backend is not compiled in)\n");
    return 77;
  }
  cap_backend_config_init(&conf_cfg);
  conf_cfg.name = "cuda";
  /* 256 MiB copies take several milliseconds on any PCIe generation */
  run_conformance("cuda", 256 * MIB, 2);
  if (cap_backend_create(&conf_cfg, &B) == 0) {
    RUN_TEST(check_skips_copy_engines);
    cap_backend_destroy(B);
    B = NULL;
  } else {
    cap_test_failed++;
  }
  return TEST_SUMMARY();
}
