/*
 * A training job as a user of the installed library writes it: only
 * <capuchin/client.h>, linked through pkg-config or find_package(Capuchin).
 * tests/install/test_install.sh builds it both ways against a temporary
 * install prefix and runs it against that prefix's capuchind.
 *
 *   consumer SOCKET
 *
 * A seven-op model whose peak (25 MiB) is over its budget (20 MiB): the
 * first iteration is measured, the daemon answers with a plan, and later
 * iterations are guided by it. Also loads a plan as JSON, as a job that
 * brings its own plan would. Exit 0 when all of it worked.
 */
#include <capuchin/client.h>

#include <stdio.h>
#include <string.h>

#define MIB (UINT64_C(1) << 20)

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "consumer: %s:%d: %s failed (%s)\n", __FILE__,           \
              __LINE__, #cond, c ? cap_client_last_error(c) : "");             \
      return 1;                                                                \
    }                                                                          \
  } while (0)

/* op0: w -> a1, op1: a1 -> a2, op2: a2 -> a2 (in place), op3: a2 -> a3,
 * op4: a3 -> a4, op5: a4 -> a5, op6: a5, a1 -> a6; each activation is
 * freed after its last reader. Unmanaged, the peak is 25 MiB (w, a1, a2, a3
 * at op3); with a1 swapped out after op1 (the copy runs during op2) and
 * prefetched when op5 starts, 18 MiB. */
static int iteration(cap_client_t *c, uint32_t w, cap_iter_stats_t *st) {
  static const uint64_t mib[6] = {8, 8, 8, 8, 1, 1};
  uint32_t a[6];
  CHECK(cap_client_iteration_begin(c) == 0);
  for (int i = 0; i < 6; i++)
    CHECK(cap_client_declare(c, mib[i] * MIB, &a[i]) == 0);
  const struct {
    uint32_t in[2], n_in, out, free; /* free: freed after the op, or none */
  } ops[7] = {
      {{w}, 1, a[0], CAP_NONE},          {{a[0]}, 1, a[1], CAP_NONE},
      {{a[1]}, 1, a[1], CAP_NONE},       {{a[1]}, 1, a[2], a[1]},
      {{a[2]}, 1, a[3], a[2]},           {{a[3]}, 1, a[4], a[3]},
      {{a[4], a[0]}, 2, a[5], CAP_NONE},
  };
  for (int i = 0; i < 7; i++) {
    CHECK(cap_client_op_begin(c, i == 2 ? "aten::relu_" : "aten::mul",
                              ops[i].in, ops[i].n_in, &ops[i].out, 1, NULL,
                              NULL) == 0);
    CHECK(cap_client_compute(c, 2000000) == 0); /* 2 ms of trace time */
    CHECK(cap_client_op_end(c) == 0);
    if (ops[i].free != CAP_NONE)
      CHECK(cap_client_free(c, ops[i].free) == 0);
  }
  CHECK(cap_client_free(c, a[0]) == 0);
  CHECK(cap_client_free(c, a[4]) == 0);
  CHECK(cap_client_free(c, a[5]) == 0);
  CHECK(cap_client_iteration_end(c, st) == 0);
  return 0;
}

int main(int argc, char **argv) {
  cap_client_t *c = NULL;
  if (argc != 2) {
    fprintf(stderr, "usage: consumer SOCKET\n");
    return 64;
  }
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.socket_path = argv[1];
  cfg.job_name = "install-consumer";
  cfg.backend = "sim";
  cfg.budget_bytes = 20 * MIB;
  cfg.time_scale = 0.5;
  cfg.connect_timeout_ms = 5000;
  int rc = cap_client_create(&cfg, &c);
  if (rc != 0) {
    fprintf(stderr, "consumer: create: %s (%s)\n", cap_strerror(rc),
            cap_err_name(rc));
    return 1;
  }
  cap_client_stats_t cs;
  cap_client_get_stats(c, &cs);
  CHECK(cs.connected);
  CHECK(strcmp(cs.backend, "sim") == 0);

  uint32_t w;
  CHECK(cap_client_register(c, 1 * MIB, CAP_KIND_PARAM, &w, NULL) == 0);
  cap_iter_stats_t st;
  CHECK(iteration(c, w, &st) == 0);
  CHECK(st.mode == CAP_MODE_MEASURED);
  CHECK(cap_client_wait_plan(c, 0, 20000) == 0);
  for (int i = 0; i < 2; i++)
    CHECK(iteration(c, w, &st) == 0);
  CHECK(st.mode == CAP_MODE_GUIDED);
  CHECK(st.plan_version >= 1);
  CHECK(st.peak_bytes <= cfg.budget_bytes);
  printf("consumer: guided iteration %u: plan %u, peak %.1f MiB, %u "
         "evictions\n",
         st.iteration, st.plan_version, (double)st.peak_bytes / MIB,
         st.evictions);

  /* A plan brought by the job itself replaces the daemon's at the next
   * iteration; a malformed one is refused with the reason. */
  static const char bad[] = "{\"trace\": \"x\", \"budget_bytes\": }";
  CHECK(cap_client_load_plan_json(c, bad, sizeof bad - 1) == CAP_EPARSE);
  CHECK(strstr(cap_client_last_error(c), "byte") != NULL);
  static const char plan[] =
      "{\"trace\":\"consumer\",\"budget_bytes\":20971520,\"policy\":"
      "\"by-hand\",\"version\":1000,\"actions\":[{\"tensor\":1,"
      "\"evict_after_access\":2,\"method\":\"swap\",\"prefetch_at\":null}]}";
  CHECK(cap_client_load_plan_json(c, plan, sizeof plan - 1) == 0);
  CHECK(iteration(c, w, &st) == 0);
  CHECK(st.plan_version == 1000);
  CHECK(st.bytes_out >= 8 * MIB);

  cap_client_destroy(c);
  printf("consumer: ok\n");
  return 0;
}
