/*
 * The conformance suite on the cuda backend. Carries the ctest label `gpu`;
 * exits 77 (skipped) where the cuda backend is not compiled in or no GPU is
 * present.
 */
#include "backend_conformance.h"

int main(void) {
  if (!cap_backend_available("cuda")) {
    printf("skipped: no CUDA device (or the cuda backend is not compiled in)\n");
    return 77;
  }
  cap_backend_config_init(&conf_cfg);
  conf_cfg.name = "cuda";
  /* 256 MiB copies take several milliseconds on any PCIe generation */
  run_conformance("cuda", 256 * MIB, 2);
  return TEST_SUMMARY();
}
