/*
 * capuchin-sim's planning modes as a user runs them: --budget with every
 * policy (table and JSON), --emit-plan and --check-plan round trip, exit 2
 * naming the smallest peak for an impossible budget, exit 64 with usage for
 * bad arguments, exit 1 for unreadable or foreign plans, the window bound
 * where a budget forces a cost.
 */
#include "cap_test.h"

#include <sys/wait.h>
#include <unistd.h>

#include "capuchin/planner.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"

#define SIM CAP_BIN_DIR "/capuchin-sim"

typedef struct run {
  int status;
  char out[16384];
  char err[8192];
} run_t;

static void slurp(const char *path, char *buf, size_t cap) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
}

static void run(const char *args, run_t *r) {
  char out_path[] = "/tmp/cap_simcli_out_XXXXXX";
  char err_path[] = "/tmp/cap_simcli_err_XXXXXX";
  int fo = mkstemp(out_path), fe = mkstemp(err_path);
  char cmd[10240];
  snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", SIM, args, out_path, err_path);
  int st = system(cmd);
  r->status = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
  slurp(out_path, r->out, sizeof r->out);
  slurp(err_path, r->err, sizeof r->err);
  if (fo >= 0)
    close(fo);
  if (fe >= 0)
    close(fe);
  unlink(out_path);
  unlink(err_path);
}

static const char *trace(const char *name) {
  static char buf[1024];
  snprintf(buf, sizeof buf, "%s/tests/data/traces/%s.trace", CAP_SOURCE_DIR, name);
  return buf;
}

/* Value of the first "key": number after position `from` in s. */
static long long num_after(const char *s, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *at = strstr(s, k);
  return at ? strtoll(at + strlen(k), NULL, 10) : -1;
}

/* capuchin-sim --budget 50% --policy all --json on a bundled model, into
 * r; the model's profile (NULL if it cannot be read). */
static cap_profile_t *all_policies_json(const char *model, run_t *r) {
  char args[8192], err[256];
  snprintf(args, sizeof args, "--trace '%s' --budget 50%% --policy all --json",
           trace(model));
  run(args, r);
  cap_profile_t *p = NULL;
  return cap_trace_load(trace(model), &p, err, sizeof err) == 0 ? p : NULL;
}

static void test_all_policies_json(void) {
  char args[8192];
  run_t r;
  cap_profile_t *p = all_policies_json("mobilenet_v2", &r);
  CHECK_EQ(r.status, 0);
  REQUIRE(p);
  CHECK_EQ(num_after(r.out, "budget_bytes"),
           (long long)cap_profile_budget_pct(p, 50));
  CHECK(strncmp(r.out, "{\"trace\":", 9) == 0);
  for (size_t i = 0; cap_planner_names[i]; i++) {
    char pol[64];
    snprintf(pol, sizeof pol, "{\"policy\":\"%s\",\"feasible\":", cap_planner_names[i]);
    const char *at = strstr(r.out, pol);
    CHECK(at != NULL);
    if (!at)
      continue;
    const char *keys[] = {"peak_bytes",     "iter_ns",       "overhead_pct",
                          "swap_out_bytes", "swap_in_bytes", "recompute_ns",
                          "stall_ns",       "room_wait_ns",  "plan_ms"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
      CHECK(num_after(at, keys[k]) >= 0);
    CHECK(num_after(at, "room_wait_ns") <= num_after(at, "stall_ns"));
    CHECK(num_after(at, "iter_ns") >= p->ops[p->n_ops - 1].end_ns);
  }
  CHECK(strstr(r.out, "]}\n") != NULL);
  cap_profile_destroy(p);

  /* The same as a table. */
  snprintf(args, sizeof args, "--trace '%s' --budget 50%% --policy all",
           trace("mobilenet_v2"));
  run(args, &r);
  CHECK_EQ(r.status, 0);
  CHECK(strstr(r.out, "policy") && strstr(r.out, "overhd %"));
  for (size_t i = 0; cap_planner_names[i]; i++)
    CHECK(strstr(r.out, cap_planner_names[i]) != NULL);
}

/* The window bound (capuchin/bound.h): in the JSON, and as a line under the
 * table, where the budget forces a cost (vgg16 at 50 %: the optimizer step
 * needs gradients sent to the host during the first layers' backward); no
 * plan below it; nothing at a budget everything fits. */
static void test_window_bound_reported(void) {
  char args[8192];
  run_t r;
  cap_profile_t *p = all_policies_json("vgg16", &r);
  CHECK_EQ(r.status, 0);
  REQUIRE(p);
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  cap_sim_result_t base = {0};
  REQUIRE(cap_sim_run(p, NULL, &bw, &base) == 0);
  long long bound = num_after(r.out, "window_bound_ns");
  CHECK(bound > 0);
  for (size_t i = 0; cap_planner_names[i]; i++) {
    char pol[64];
    snprintf(pol, sizeof pol, "{\"policy\":\"%s\",\"feasible\":true",
             cap_planner_names[i]);
    const char *at = strstr(r.out, pol);
    if (at)
      CHECK(num_after(at, "iter_ns") - base.iter_ns >= bound);
  }
  snprintf(args, sizeof args, "--trace '%s' --budget 50%%", trace("vgg16"));
  run(args, &r);
  CHECK_EQ(r.status, 0);
  CHECK(strstr(r.out, "no plan costs less than") != NULL);
  CHECK(strstr(r.out, "(window bound)") != NULL);
  snprintf(args, sizeof args, "--trace '%s' --budget 100%% --json",
           trace("vgg16"));
  run(args, &r);
  CHECK_EQ(r.status, 0);
  CHECK_EQ(num_after(r.out, "window_bound_ns"), 0);
  snprintf(args, sizeof args, "--trace '%s' --budget 100%%", trace("vgg16"));
  run(args, &r);
  CHECK(strstr(r.out, "no plan costs less than") == NULL);
  cap_sim_result_close(&base);
  cap_profile_destroy(p);
}

static void test_emit_and_check_plan(void) {
  char plan_path[] = "/tmp/cap_simcli_plan_XXXXXX";
  int fd = mkstemp(plan_path);
  REQUIRE(fd >= 0);
  close(fd);
  char args[8192];
  run_t r;
  snprintf(args, sizeof args, "--trace '%s' --budget 50%% --json --emit-plan '%s'",
           trace("resnet50"), plan_path);
  run(args, &r);
  CHECK_EQ(r.status, 0);
  long long peak = num_after(r.out, "peak_bytes"), iter = num_after(r.out, "iter_ns");
  snprintf(args, sizeof args, "--trace '%s' --check-plan '%s' --json",
           trace("resnet50"), plan_path);
  run(args, &r);
  CHECK_EQ(r.status, 0);
  CHECK_EQ(num_after(r.out, "peak_bytes"), peak);
  CHECK_EQ(num_after(r.out, "iter_ns"), iter);
  CHECK(strstr(r.out, "\"policy\":\"capuchin\"") != NULL);

  /* Other bandwidths give another iteration time: the check says so. */
  snprintf(args, sizeof args, "--trace '%s' --check-plan '%s' --h2d-gbps 5",
           trace("resnet50"), plan_path);
  run(args, &r);
  CHECK_EQ(r.status, 1);
  CHECK(strstr(r.err, "re-simulated") != NULL);

  /* The plan does not belong to another trace. */
  snprintf(args, sizeof args, "--trace '%s' --check-plan '%s'", trace("vgg16"),
           plan_path);
  run(args, &r);
  CHECK_EQ(r.status, 1);
  CHECK(strstr(r.err, "not a plan for") != NULL);

  /* A damaged file. */
  FILE *f = fopen(plan_path, "w");
  REQUIRE(f);
  fputs("{\"trace\":\"x\",\"budget_bytes\":1,\"policy\":\"p\",\"actions\":[{]}", f);
  fclose(f);
  snprintf(args, sizeof args, "--trace '%s' --check-plan '%s'", trace("resnet50"),
           plan_path);
  run(args, &r);
  CHECK_EQ(r.status, 1);
  CHECK(strstr(r.err, "byte ") != NULL);
  unlink(plan_path);
  run("--trace /nonexistent.trace --check-plan /nonexistent.json", &r);
  CHECK_EQ(r.status, 1);
}

/* --placement: the emitted plan carries its blocks; --check-plan finds a
 * block moved onto another and a block that is missing. */
static void test_placement_emit_and_check(void) {
  char plan_path[] = "/tmp/cap_simcli_plan_XXXXXX";
  int fd = mkstemp(plan_path);
  REQUIRE(fd >= 0);
  close(fd);
  char args[8192], err[512];
  run_t r;
  snprintf(args, sizeof args, "--trace '%s' --budget 50%% --placement --emit-plan '%s'",
           trace("resnet50"), plan_path);
  run(args, &r);
  CHECK_EQ(r.status, 0);
  CHECK(strstr(r.out, "placement:") != NULL);
  snprintf(args, sizeof args, "--trace '%s' --check-plan '%s'", trace("resnet50"),
           plan_path);
  run(args, &r);
  CHECK_EQ(r.status, 0);
  CHECK(strstr(r.out, "MiB arena") != NULL);

  /* Load it, and move one block onto another it meets in time. */
  FILE *f = fopen(plan_path, "r");
  REQUIRE(f);
  static char buf[1 << 22];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  cap_plan_t *plan = NULL;
  REQUIRE(cap_plan_read_json(buf, len, &plan, err, sizeof err) == 0);
  REQUIRE(plan->n_blocks > 1);
  uint32_t a = CAP_NONE, b = CAP_NONE;
  for (uint32_t i = 0; i < plan->n_blocks && a == CAP_NONE; i++)
    for (uint32_t j = i + 1; j < plan->n_blocks; j++) {
      const cap_block_t *x = &plan->blocks[i], *y = &plan->blocks[j];
      if (x->start_ns < y->end_ns && y->start_ns < x->end_ns &&
          x->offset != y->offset && x->share != j && y->share != i &&
          x->same_as == CAP_NONE && y->same_as == CAP_NONE &&
          x->offset + y->bytes <= plan->arena_bytes) {
        a = i;
        b = j;
        break;
      }
    }
  REQUIRE(a != CAP_NONE);
  uint64_t saved = plan->blocks[b].offset;
  plan->blocks[b].offset = plan->blocks[a].offset;
  f = fopen(plan_path, "w");
  REQUIRE(f);
  CHECK(cap_plan_write_json(f, plan, "resnet50.trace") == 0);
  fclose(f);
  run(args, &r);
  CHECK_EQ(r.status, 1);
  CHECK(strstr(r.err, "collide from") != NULL);
  char want[64];
  snprintf(want, sizeof want, "tensor %u", plan->blocks[b].tensor);
  CHECK(strstr(r.err, want) != NULL);

  /* Put it back and drop the last block: that stay has no address. */
  plan->blocks[b].offset = saved;
  plan->n_blocks--;
  for (uint32_t i = 0; i < plan->n_blocks; i++) {
    if (plan->blocks[i].share == plan->n_blocks)
      plan->blocks[i].share = CAP_NONE;
    if (plan->blocks[i].same_as == plan->n_blocks)
      plan->blocks[i].same_as = CAP_NONE;
  }
  f = fopen(plan_path, "w");
  REQUIRE(f);
  CHECK(cap_plan_write_json(f, plan, "resnet50.trace") == 0);
  fclose(f);
  run(args, &r);
  CHECK_EQ(r.status, 1);
  CHECK(strstr(r.err, "has no block") != NULL);
  cap_plan_destroy(plan);
  unlink(plan_path);
}

/* Tiny tensors: three 64-byte weights and a 64-byte output per op, one
 * live at a time, so 100 % is 256 bytes of live peak; each output takes
 * a 256-byte block of the placed arena, so with placement every plan
 * needs 192 + 256 = 448 bytes, and that is the number to name. */
static void test_placement_names_its_need(void) {
  char path[] = "/tmp/cap_simcli_tiny_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  FILE *f = fdopen(fd, "w");
  REQUIRE(f != NULL);
  fprintf(f, "capuchin-trace 1\nmeta model=tiny device=sim iter_ns=100000 "
             "peak_bytes=256\n");
  for (int t = 0; t < 3; t++)
    fprintf(f, "tensor %d 64 param\n", t);
  for (int t = 3; t < 7; t++)
    fprintf(f, "tensor %d 64 activation\n", t);
  for (int i = 0; i < 4; i++) /* ops first, then the frees */
    fprintf(f, "op %d %d %d add 0,1 %d\n", i, i * 20000, i * 20000 + 10000,
            i + 3);
  for (int i = 0; i < 4; i++)
    fprintf(f, "free %d %d\n", i * 20000 + 15000, i + 3);
  fclose(f);
  char args[8192];
  run_t r;
  snprintf(args, sizeof args, "--trace '%s' --budget 320", path);
  run(args, &r);
  CHECK_EQ(r.status, 0); /* counting bytes, it fits */
  snprintf(args, sizeof args, "--trace '%s' --budget 320 --placement", path);
  run(args, &r);
  CHECK_EQ(r.status, 2);
  CHECK(strstr(r.err, "smallest feasible peak found is 448 bytes") != NULL);
  snprintf(args, sizeof args, "--trace '%s' --budget 448 --placement", path);
  run(args, &r);
  CHECK_EQ(r.status, 0);
  unlink(path);
}

static void test_impossible_budget_exits_2(void) {
  char args[8192];
  run_t r;
  snprintf(args, sizeof args, "--trace '%s' --budget 1000 --policy dtr",
           trace("vgg16"));
  run(args, &r);
  CHECK_EQ(r.status, 2);
  CHECK(strstr(r.err, "smallest feasible peak") != NULL);
  CHECK(strstr(r.err, "1000 bytes") != NULL);
  /* and names the floor no plan can go below */
  CHECK(strstr(r.err, "no plan can fit below") != NULL);
  snprintf(args, sizeof args, "--trace '%s' --budget 1000 --policy all --json",
           trace("vgg16"));
  run(args, &r);
  CHECK_EQ(r.status, 2);
  CHECK(strstr(r.out, "\"feasible\":true") == NULL);
}

static void test_bad_arguments_exit_64(void) {
  const char *bad[] = {
      "--budget 50%",
      "--trace x --budget 0",
      "--trace x --budget 50x",
      "--trace x --budget -5%",
      "--trace x --budget %",
      "--trace x --budget 1e9",
      "--trace x --budget 99999999999999999999999",
      "--trace x --budget 50% --policy nope",
      "--trace x --budget 50% --h2d-gbps 0",
      "--trace x --budget 50% --d2h-gbps abc",
      "--trace x --budget 50% --duplex-gbps -1",
      "--trace x --budget 50% --duplex-gbps nan",
      "--trace x --budget 50% --check-plan y",
      "--trace x --info --budget 50%",
      "--trace x --policy dtr",
      "--trace x --emit-plan y",
      "--trace x --evict-persistent",
      "--trace x --budget",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    run_t r;
    run(bad[i], &r);
    if (r.status != 64)
      fprintf(stderr, "args '%s': exit %d\n", bad[i], r.status);
    CHECK_EQ(r.status, 64);
    CHECK(strstr(r.err, "usage: capuchin-sim") != NULL);
  }
}

static void test_options_change_the_answer(void) {
  char args[8192];
  run_t a, b;
  snprintf(args, sizeof args, "--trace '%s' --budget 50%% --policy vdnn --json",
           trace("resnet50"));
  run(args, &a);
  snprintf(args, sizeof args,
           "--trace '%s' --budget 50%% --policy vdnn --json --h2d-gbps 12 "
           "--d2h-gbps 12 --duplex-gbps 20",
           trace("resnet50"));
  run(args, &b);
  CHECK(num_after(b.out, "iter_ns") > num_after(a.out, "iter_ns"));
  snprintf(args, sizeof args, "--trace '%s' --budget 3000000000 --policy passive-lru --json",
           trace("resnet50"));
  run(args, &a);
  CHECK_EQ(a.status, 0);
  CHECK_EQ(num_after(a.out, "budget_bytes"), 3000000000LL);
  CHECK(num_after(a.out, "peak_bytes") <= 3000000000LL);
}

int main(void) {
  if (access(SIM, X_OK) != 0) {
    fprintf(stderr, "%s not built\n", SIM);
    return 1;
  }
  RUN_TEST(test_all_policies_json);
  RUN_TEST(test_window_bound_reported);
  RUN_TEST(test_emit_and_check_plan);
  RUN_TEST(test_placement_emit_and_check);
  RUN_TEST(test_impossible_budget_exits_2);
  RUN_TEST(test_placement_names_its_need);
  RUN_TEST(test_bad_arguments_exit_64);
  RUN_TEST(test_options_change_the_answer);
  return TEST_SUMMARY();
}
