/*
 * capuchin-query end to end: a database populated through the store API
 * (jobs, sessions, the resnet50 profile, two plan versions simulated for
 * their predictions, a reused plan, iterations, a partial profile), then
 * every command run as a real process: JSON parses (python3), CSV quotes,
 * the SVG is well-formed XML, export-trace reads back as the same profile
 * (and capuchin-sim --info accepts it), bad arguments exit 64, a missing or
 * foreign database exits 66, and queries succeed while a writer writes.
 */
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/bound.h"
#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/sim.h"
#include "capuchin/trace.h"
#include "store.h"

static char dir[256], db_path[512], query_bin[512];
static bool have_python;
static cap_profile_t *prof;
static int64_t job_a, job_b, prof_id, partial_id, plan1, plan2;
static cap_plan_t *p1, *p2;
static const char weird_name[] = "bert \"large\", rank 1";

static const char *path_in(const char *name) {
  static char buf[4][600];
  static int i;
  i = (i + 1) % 4;
  snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
  return buf[i];
}

/* Run capuchin-query with args (a shell fragment); stdout to out.txt,
 * stderr to err.txt. Returns the exit status. */
static int query(const char *args) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", query_bin, args,
           path_in("out.txt"), path_in("err.txt"));
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf) {
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
  }
  fclose(f);
  return buf;
}

static bool file_contains(const char *path, const char *needle) {
  char *s = slurp(path);
  bool r = s && strstr(s, needle);
  if (!r)
    fprintf(stderr, "%s does not contain \"%s\":\n%.600s\n", path, needle,
            s ? s : "(unreadable)");
  free(s);
  return r;
}

/* Run a python3 check over out.txt; the script exits non-zero on failure. */
static bool py(const char *script) {
  if (!have_python)
    return true;
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "python3 -c '%s' '%s'", script, path_in("out.txt"));
  int st = system(cmd);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* A plan as a planner would make it: the largest activations with a long
 * gap between their first two accesses are swapped after access 1, each
 * prefetched at an op that starts early enough for the copy; predictions
 * from the simulator. */
static cap_plan_t *make_plan(uint32_t version, int64_t lead_scale) {
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  cap_plan_t *plan = cap_plan_create("capuchin", 0);
  if (!plan)
    return NULL;
  plan->version = version;
  uint32_t chosen = 0;
  /* Walk tensors by size, largest first (simple selection). */
  bool *used = calloc(prof->n_tensors, 1);
  if (!used)
    goto fail;
  while (chosen < 40) {
    uint32_t best = CAP_NONE;
    for (uint32_t t = 0; t < prof->n_tensors; t++) {
      const cap_tensor_t *tt = &prof->tensors[t];
      if (used[t] || tt->kind != CAP_KIND_ACTIVATION || tt->n_accesses < 2)
        continue;
      uint32_t a1 = cap_profile_access_op(prof, t, 1);
      uint32_t a2 = cap_profile_access_op(prof, t, 2);
      int64_t gap = prof->ops[a2].start_ns - prof->ops[a1].end_ns;
      if (gap < 4 * cap_copy_ns(tt->bytes, bw.h2d_gbps))
        continue;
      if (best == CAP_NONE || tt->bytes > prof->tensors[best].bytes)
        best = t;
    }
    if (best == CAP_NONE)
      break;
    used[best] = true;
    uint32_t back = cap_profile_access_op(prof, best, 2);
    int64_t lead =
        cap_copy_ns(prof->tensors[best].bytes, bw.h2d_gbps) * lead_scale;
    uint32_t trig_op = back;
    while (trig_op > 0 &&
           prof->ops[back].start_ns - prof->ops[trig_op].start_ns < lead)
      trig_op--;
    uint32_t trig_t = CAP_NONE, trig_k = 0;
    const cap_op_t *op = &prof->ops[trig_op];
    for (uint32_t k = 0; k < op->n_in + op->n_out && trig_t == CAP_NONE; k++) {
      uint32_t t = k < op->n_in ? cap_op_inputs(prof, op)[k]
                                : cap_op_outputs(prof, op)[k - op->n_in];
      if (t != best) {
        trig_t = t;
        trig_k = cap_profile_access_index(prof, t, trig_op);
      }
    }
    if (trig_t == CAP_NONE || trig_op <= cap_profile_access_op(prof, best, 1))
      trig_t = CAP_NONE, trig_k = 0;
    if (cap_plan_add_swap(plan, best, 1, trig_t, trig_k, 0) != 0)
      goto fail;
    chosen++;
  }
  free(used);
  used = NULL;
  char err[256];
  if (cap_plan_validate(plan, prof, err, sizeof err) != 0) {
    fprintf(stderr, "hand plan invalid: %s\n", err);
    goto fail;
  }
  cap_sim_result_t r;
  if (cap_sim_run(prof, plan, &bw, &r) != 0)
    goto fail;
  plan->predicted_iter_ns = r.iter_ns;
  plan->predicted_peak_bytes = r.peak_bytes;
  /* The budget the plan was made for: its simulated peak, rounded up. */
  plan->budget_bytes =
      (r.peak_bytes + (64 << 20) - 1) / (64 << 20) * (64 << 20);
  cap_sim_result_close(&r);
  return plan;
fail:
  free(used);
  cap_plan_destroy(plan);
  return NULL;
}

static void populate(void) {
  cap_store_t *s = NULL;
  char err[256];
  REQUIRE(cap_trace_load(cap_test_data("traces/resnet50.trace"), &prof, err,
                         sizeof err) == 0);
  REQUIRE(cap_store_open(db_path, CAP_STORE_CREATE, &s) == 0);
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  uint64_t sig = cap_profile_signature(prof);
  cap_store_job_t a = {.name = "resnet50-rank0",
                       .hostname = "node1",
                       .pid = 100,
                       .uid = 1000,
                       .gid = 1000,
                       .device = 0,
                       .device_total_bytes = 80ull << 30,
                       .requested_budget_bytes = 4ull << 30};
  cap_store_job_t b = a;
  b.name = weird_name;
  b.pid = 101;
  b.hello_signature = sig;
  int64_t sess = 0;
  REQUIRE(cap_store_job_begin(s, &a, &job_a) == 0);
  REQUIRE(cap_store_session_begin(s, job_a, 100, 1000, 1000, &sess) == 0);
  REQUIRE(cap_store_profile_put(s, job_a, prof, sig, true, &bw, &prof_id) == 0);
  p1 = make_plan(1, 1);
  p2 = make_plan(2, 3); /* refined: earlier triggers */
  REQUIRE(p1 && p2);
  REQUIRE(p1->n_actions >= 10);
  p2->budget_bytes = p1->budget_bytes;
  /* Plan 2 carries a placement; plan 1, like plans stored before there
   * were placements, does not. */
  cap_plan_placement_t pp;
  REQUIRE(cap_plan_place(prof, p2, &bw, CAP_PLACE_BEST, &pp) == 0);
  REQUIRE(cap_plan_attach_placement(p2, &pp) == 0);
  cap_plan_placement_close(&pp);
  REQUIRE(cap_store_plan_put(s, prof_id, job_a, p1, &bw, &plan1) == 0);
  REQUIRE(cap_store_plan_put(s, prof_id, job_a, p2, &bw, &plan2) == 0);
  for (uint64_t i = 1; i <= 5; i++) {
    bool v2 = i > 2;
    cap_store_iteration_t it = {.job_id = job_a,
                                .session_id = sess,
                                .plan_id = v2 ? plan2 : plan1,
                                .plan_version = v2 ? 2 : 1,
                                .iteration = i,
                                .iter_ns = 41000000 + 100000 * (int64_t)i,
                                .peak_bytes = p1->predicted_peak_bytes,
                                .stall_ns = v2 ? 0 : 250000,
                                .n_stalls = v2 ? 0 : 3,
                                .swap_out_bytes = 1ull << 30,
                                .swap_in_bytes = 1ull << 30};
    REQUIRE(cap_store_iteration_put(s, &it, NULL) == 0);
  }
  REQUIRE(cap_store_job_end(s, job_a, "ok") == 0);
  /* A second rank reuses the stored plan without measuring. */
  REQUIRE(cap_store_job_begin(s, &b, &job_b) == 0);
  REQUIRE(cap_store_plan_assign(s, job_b, plan2, true) == 0);
  /* A partial profile from a client gone mid-iteration. */
  cap_profile_t *part = cap_profile_create();
  REQUIRE(part);
  REQUIRE(cap_profile_add_tensor(part, 0, 1024, CAP_KIND_PARAM) == 0);
  REQUIRE(cap_store_profile_put(s, job_b, part, 0, false, NULL, &partial_id) ==
          0);
  cap_profile_destroy(part);
  cap_store_close(s);
}

static void test_jobs(void) {
  char args[2048];
  snprintf(args, sizeof args, "--db '%s' jobs", db_path);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(path_in("out.txt"), "resnet50-rank0"));
  CHECK(file_contains(path_in("out.txt"), "4096.0")); /* requested MiB */
  snprintf(args, sizeof args, "--db '%s' --format json jobs", db_path);
  CHECK_EQ(query(args), 0);
  CHECK(py("import json,sys; d=json.load(open(sys.argv[1])); "
           "assert len(d)==2, d; assert d[0][\"name\"]==\"resnet50-rank0\"; "
           "assert d[1][\"name\"]==\"bert \\\"large\\\", rank 1\", d[1]; "
           "assert d[0][\"iterations\"]==5 and d[0][\"plans\"]==2; "
           "assert d[1][\"plans\"]==1 and d[1][\"ended\"] is None; "
           "assert d[0][\"requested_budget_bytes\"]==4<<30"));
  snprintf(args, sizeof args, "--db '%s' --format csv jobs", db_path);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(path_in("out.txt"), "\"bert \"\"large\"\", rank 1\""));
  CHECK(py("import csv,sys; r=list(csv.reader(open(sys.argv[1],newline=\"\")));"
           " assert r[0][0]==\"id\" and len(r)==3, r;"
           " assert r[2][1]==\"bert \\\"large\\\", rank 1\", r[2];"
           " assert all(len(x)==len(r[0]) for x in r)"));
}

static void test_profiles_and_plans(void) {
  char args[2048], sig[32];
  snprintf(sig, sizeof sig, "%016llx",
           (unsigned long long)cap_profile_signature(prof));
  snprintf(args, sizeof args, "--db '%s' --format json profiles", db_path);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(path_in("out.txt"), sig));
  CHECK(py("import json,sys; d=json.load(open(sys.argv[1])); "
           "assert len(d)==2; assert d[0][\"complete\"]==1 and "
           "d[0][\"tensors\"]==1039 and d[0][\"ops\"]==685 and "
           "d[0][\"model\"]==\"resnet50\"; assert d[1][\"complete\"]==0 and "
           "d[1][\"peak_bytes\"] is None"));
  snprintf(args, sizeof args, "--db '%s' profiles", db_path);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(path_in("out.txt"), "resnet50"));

  snprintf(args, sizeof args, "--db '%s' --format json plans", db_path);
  CHECK_EQ(query(args), 0);
  CHECK(py("import json,sys; d=json.load(open(sys.argv[1])); "
           "assert [p[\"version\"] for p in d]==[1,2], d; "
           "assert all(p[\"policy\"]==\"capuchin\" and p[\"h2d_gbps\"]==55.1 "
           "for p in d)"));
  snprintf(args, sizeof args, "--db '%s' --format json plans --job %lld",
           db_path, (long long)job_b);
  CHECK_EQ(query(args), 0);
  CHECK(py("import json,sys; d=json.load(open(sys.argv[1])); "
           "assert len(d)==1 and d[0][\"version\"]==2, d"));
  snprintf(args, sizeof args, "--db '%s' plans --job 999", db_path);
  CHECK_EQ(query(args), 1);
  CHECK(file_contains(path_in("err.txt"), "no job 999"));

  /* plan ID: every action with its tensor's bytes. */
  snprintf(args, sizeof args, "--db '%s' --format json plan %lld", db_path,
           (long long)plan1);
  CHECK_EQ(query(args), 0);
  char script[1400];
  snprintf(script, sizeof script,
           "import json,sys; d=json.load(open(sys.argv[1])); "
           "a=d[\"actions\"]; assert len(a)==%u, len(a); "
           "assert d[\"plan\"][\"predicted_peak_bytes\"]==%llu; "
           "assert d[\"plan\"][\"budget_bytes\"]==%llu; "
           "assert a[0][\"tensor\"]==%u and a[0][\"bytes\"]==%llu; "
           "assert all(x[\"method\"]==\"swap\" and x[\"saving_ns\"]>0 and "
           "x[\"bytes\"]>0 for x in a)",
           p1->n_actions, (unsigned long long)p1->predicted_peak_bytes,
           (unsigned long long)p1->budget_bytes, p1->actions[0].tensor,
           (unsigned long long)prof->tensors[p1->actions[0].tensor].bytes);
  CHECK(py(script));
  /* and the least any plan at its budget costs (capuchin/bound.h) */
  cap_window_bound_t wb;
  CHECK_EQ(cap_window_bound(prof, p1->budget_bytes, true, 55.1, &wb), 0);
  snprintf(script, sizeof script,
           "import json,sys; d=json.load(open(sys.argv[1])); "
           "assert d[\"plan\"][\"least_extra_ns\"]==%lld, d[\"plan\"]",
           (long long)wb.extra_ns);
  CHECK(py(script));
  snprintf(args, sizeof args, "--db '%s' plan %lld", db_path, (long long)plan1);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(path_in("out.txt"), "swap"));
  CHECK(file_contains(path_in("out.txt"), "freed for ms"));
  CHECK(file_contains(path_in("out.txt"), "least extra ms"));
  snprintf(args, sizeof args, "--db '%s' --format csv plan %lld", db_path,
           (long long)plan2);
  CHECK_EQ(query(args), 0);
  CHECK(py("import csv,sys; r=list(csv.reader(open(sys.argv[1],newline=\"\")));"
           " assert r[0][:3]==[\"action\",\"tensor\",\"bytes\"], r[0];"
           " assert len(r)>10 and all(len(x)==len(r[0]) for x in r)"));
  snprintf(args, sizeof args, "--db '%s' plan 999", db_path);
  CHECK_EQ(query(args), 1);
  CHECK(file_contains(path_in("err.txt"), "no plan 999"));
}

static void test_iterations(void) {
  char args[2048], script[600];
  snprintf(args, sizeof args, "--db '%s' --format json iterations %lld",
           db_path, (long long)job_a);
  CHECK_EQ(query(args), 0);
  snprintf(script, sizeof script,
           "import json,sys; d=json.load(open(sys.argv[1])); "
           "assert [r[\"iteration\"] for r in d]==[1,2,3,4,5]; "
           "assert d[0][\"predicted_iter_ns\"]==%lld and "
           "d[4][\"predicted_iter_ns\"]==%lld; "
           "assert d[0][\"stalls\"]==3 and d[4][\"plan_version\"]==2",
           (long long)p1->predicted_iter_ns, (long long)p2->predicted_iter_ns);
  CHECK(py(script));
  snprintf(args, sizeof args, "--db '%s' iterations %lld", db_path,
           (long long)job_a);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(path_in("out.txt"), "vs pred."));
  snprintf(args, sizeof args, "--db '%s' iterations 999", db_path);
  CHECK_EQ(query(args), 1);
}

/* Render an SVG in headless Chromium when it is installed: the picture must
 * load and paint (a blank or broken page is a small PNG). */
static void render(const char *svg, const char *png_name) {
  if (system("command -v chromium >/dev/null 2>&1") != 0) {
    printf("  chromium not installed: rendering check skipped\n");
    return;
  }
  char cmd[4096], png[600];
  snprintf(png, sizeof png, "%s", path_in(png_name));
  snprintf(cmd, sizeof cmd,
           "timeout 60 chromium --headless --no-sandbox --disable-gpu "
           "--disable-background-networking --disable-component-update "
           "--disable-sync --no-first-run --user-data-dir='%s' "
           "--screenshot='%s' --window-size=1200,700 'file://%s' "
           ">/dev/null 2>&1",
           path_in("chromium-profile"), png, svg);
  int st = system(cmd);
  struct stat sb;
  CHECK(st == 0 && stat(png, &sb) == 0 && sb.st_size > 10000);
}

static void test_timeline(void) {
  char args[2048];
  char svg[600]; /* path_in's buffers rotate: keep a copy */
  snprintf(svg, sizeof svg, "%s", path_in("timeline.svg"));
  snprintf(args, sizeof args, "--db '%s' timeline %lld --svg '%s'", db_path,
           (long long)plan2, svg);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(svg, "<svg"));
  CHECK(file_contains(svg, "budget"));
  CHECK(file_contains(svg, "unmanaged (measured profile)"));
  CHECK(file_contains(svg, "planned (simulated)"));
  CHECK(file_contains(svg, "device memory (MiB)"));
  if (have_python) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import sys,xml.etree.ElementTree as E; "
             "r=E.parse(sys.argv[1]).getroot(); "
             "assert r.tag.endswith(\"svg\"); "
             "ns=\"{http://www.w3.org/2000/svg}\"; "
             "assert len(r.findall(ns+\"path\"))==4; "
             "assert len(r.findall(\".//\"+ns+\"text\"))>10' '%s'",
             svg);
    CHECK(system(cmd) == 0);
  }
  render(svg, "timeline.png");
  snprintf(args, sizeof args, "--db '%s' timeline %lld", db_path,
           (long long)plan2);
  CHECK_EQ(query(args), 64);
}

/* The address picture: plan 2's stored placement, and plan 1 placed on the
 * spot; `plan` shows where each action's tensor comes back. */
static void test_placement(void) {
  char args[2048], svg[600];
  snprintf(svg, sizeof svg, "%s", path_in("placement.svg"));
  snprintf(args, sizeof args, "--db '%s' --format json timeline %lld --placement --svg '%s'",
           db_path, (long long)plan2, svg);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(svg, "<svg"));
  CHECK(file_contains(svg, "address in the arena (MiB)"));
  CHECK(file_contains(svg, "prefetched"));
  CHECK(file_contains(svg, "room for the arena"));
  char script[1024];
  snprintf(script, sizeof script,
           "import json,sys; r=json.load(open(sys.argv[1]))[0]; "
           "assert r[\"blocks\"]==%u and r[\"arena_bytes\"]==%llu, r; "
           "assert r[\"placed_now\"]==0 and r[\"live_peak_bytes\"]>0, r; "
           "assert r[\"arena_bytes\"]<=r[\"live_peak_bytes\"]*1.03, r",
           p2->n_blocks, (unsigned long long)p2->arena_bytes);
  CHECK(py(script));
  if (have_python) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import sys,xml.etree.ElementTree as E; "
             "r=E.parse(sys.argv[1]).getroot(); "
             "ns=\"{http://www.w3.org/2000/svg}\"; "
             "assert len(r.findall(\".//\"+ns+\"rect\"))>=%u' '%s'",
             p2->n_blocks, svg);
    CHECK(system(cmd) == 0);
  }
  render(svg, "placement.png");
  /* Plan 1 has no stored placement: placed now, and said so. */
  snprintf(args, sizeof args, "--db '%s' timeline %lld --placement --svg '%s'",
           db_path, (long long)plan1, svg);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(svg, "placed now"));
  /* The plan table: where each action's tensor comes back. */
  snprintf(args, sizeof args, "--db '%s' --format json plan %lld", db_path,
           (long long)plan2);
  CHECK_EQ(query(args), 0);
  CHECK(py("import json,sys; d=json.load(open(sys.argv[1])); "
           "assert d[\"plan\"][\"arena_bytes\"]>0, d[\"plan\"]; "
           "a=[x for x in d[\"actions\"] if x[\"method\"].startswith(\"swap\")]; "
           "assert a and all(x[\"return_offset_bytes\"] is not None and "
           "x[\"return_offset_bytes\"]+x[\"bytes\"]<=d[\"plan\"][\"arena_bytes\"] "
           "for x in a), a[:3]"));
  snprintf(args, sizeof args, "--db '%s' plan %lld", db_path, (long long)plan2);
  CHECK_EQ(query(args), 0);
  CHECK(file_contains(path_in("out.txt"), "back at MiB"));
  snprintf(args, sizeof args, "--db '%s' plans --placement", db_path);
  CHECK_EQ(query(args), 64);
}

static void test_export_trace(void) {
  char args[2048];
  char out[600];
  snprintf(out, sizeof out, "%s", path_in("exported.trace"));
  snprintf(args, sizeof args, "--db '%s' export-trace %lld -o '%s'", db_path,
           (long long)prof_id, out);
  CHECK_EQ(query(args), 0);
  cap_profile_t *q = NULL;
  char err[256];
  REQUIRE(cap_trace_load(out, &q, err, sizeof err) == 0);
  CHECK(cap_profile_signature(q) == cap_profile_signature(prof));
  CHECK_EQ(q->n_tensors, prof->n_tensors);
  CHECK_EQ(q->n_ops, prof->n_ops);
  CHECK_EQ(q->n_frees, prof->n_frees);
  CHECK_EQ(q->iter_ns, prof->iter_ns);
  CHECK_EQ(q->meta_peak_bytes, prof->meta_peak_bytes);
  cap_profile_destroy(q);
  /* stdout gives the same bytes. */
  snprintf(args, sizeof args, "--db '%s' export-trace %lld", db_path,
           (long long)prof_id);
  CHECK_EQ(query(args), 0);
  char *x = slurp(out), *y = slurp(path_in("out.txt"));
  CHECK(x && y && strcmp(x, y) == 0);
  CHECK(y && strncmp(y, "capuchin-trace 1\n", 17) == 0);
  free(x);
  free(y);
  /* capuchin-sim accepts it. */
  char sim[600];
  snprintf(sim, sizeof sim, "%s/capuchin-sim", CAP_BIN_DIR);
  if (access(sim, X_OK) == 0) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' --trace '%s' --info >'%s' 2>&1", sim, out,
             path_in("sim.txt"));
    CHECK(system(cmd) == 0);
    CHECK(file_contains(path_in("sim.txt"), "1039"));
  }
  /* The partial profile cannot be exported. */
  snprintf(args, sizeof args, "--db '%s' export-trace %lld", db_path,
           (long long)partial_id);
  CHECK_EQ(query(args), 1);
  CHECK(file_contains(path_in("err.txt"), "incomplete"));
}

static void test_bad_usage(void) {
  char args[2048];
  CHECK_EQ(query(""), 64);
  CHECK(file_contains(path_in("err.txt"), "usage: capuchin-query"));
  CHECK_EQ(query("frobnicate"), 64);
  CHECK_EQ(query("--format xml jobs"), 64);
  CHECK_EQ(query("plan"), 64);
  CHECK_EQ(query("plan abc"), 64);
  CHECK_EQ(query("plan -3"), 64);
  CHECK_EQ(query("jobs extra"), 64);
  CHECK_EQ(query("--job 1 jobs"), 64);
  CHECK_EQ(query("--bogus jobs"), 64);
  CHECK_EQ(query("--db"), 64);
  CHECK_EQ(query("--help"), 0);
  /* Missing database: a clear message naming it, nothing created. */
  snprintf(args, sizeof args, "--db '%s' jobs", path_in("missing.db"));
  CHECK_EQ(query(args), 66);
  CHECK(file_contains(path_in("err.txt"), "missing.db: no such database"));
  CHECK(access(path_in("missing.db"), F_OK) != 0);
  /* A file that is not a database. */
  FILE *f = fopen(path_in("junk.db"), "w");
  REQUIRE(f);
  for (int i = 0; i < 100; i++)
    fputs("definitely not sqlite\n", f);
  fclose(f);
  snprintf(args, sizeof args, "--db '%s' jobs", path_in("junk.db"));
  CHECK_EQ(query(args), 66);
  CHECK(file_contains(path_in("err.txt"), "not a capuchin database"));
}

/* Queries run while another process writes (WAL, read-only opens). */
static void test_while_writing(void) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    cap_store_t *s = NULL;
    if (cap_store_open(db_path, 0, &s) != 0)
      _exit(2);
    for (uint64_t i = 100;; i++) {
      cap_store_iteration_t it = {
          .job_id = job_b, .iteration = i, .iter_ns = 1};
      if (cap_store_iteration_put(s, &it, NULL) != 0)
        _exit(3);
      usleep(500); /* a busy daemon's pace, not a flood */
    }
  }
  char args[2048];
  snprintf(args, sizeof args, "--db '%s' --format json iterations %lld",
           db_path, (long long)job_b);
  int ok = 0;
  for (int i = 0; i < 10; i++) {
    usleep(20000);
    if (query(args) == 0 && py("import json,sys; json.load(open(sys.argv[1]))"))
      ok++;
  }
  int st = 0;
  bool alive = waitpid(pid, &st, WNOHANG) == 0;
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  CHECK(alive); /* the writer never failed (busy) while we read */
  CHECK_EQ(ok, 10);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/cap_test_query.XXXXXX");
  if (!mkdtemp(dir))
    return perror("mkdtemp"), 1;
  snprintf(db_path, sizeof db_path, "%s/capuchin.db", dir);
  snprintf(query_bin, sizeof query_bin, "%s/capuchin-query", CAP_BIN_DIR);
  if (access(query_bin, X_OK) != 0) {
    fprintf(stderr, "%s not built\n", query_bin);
    return 1;
  }
  have_python = system("python3 -c 'import json, csv, xml' 2>/dev/null") == 0;
  if (!have_python)
    printf("  python3 missing: JSON/CSV/XML parsing checks skipped\n");
  RUN_TEST(populate);
  if (cap_test_failed)
    return TEST_SUMMARY();
  RUN_TEST(test_jobs);
  RUN_TEST(test_profiles_and_plans);
  RUN_TEST(test_iterations);
  RUN_TEST(test_timeline);
  RUN_TEST(test_placement);
  RUN_TEST(test_export_trace);
  RUN_TEST(test_bad_usage);
  RUN_TEST(test_while_writing);
  cap_plan_destroy(p1);
  cap_plan_destroy(p2);
  cap_profile_destroy(prof);
  if (!cap_test_failed && !getenv("CAP_TEST_KEEP")) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
      fprintf(stderr, "could not remove %s\n", dir);
  } else {
    printf("  files kept in %s\n", dir);
  }
  return TEST_SUMMARY();
}
