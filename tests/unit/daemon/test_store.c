/*
 * Store tests: migration from empty, refusal of foreign and newer files
 * (left byte-identical), profile and plan round trips over the vendored
 * traces, lookups, events, and durability under kill -9.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/error.h"
#include "capuchin/trace.h"
#include "store.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
  static char buf[4][512];
  static int i;
  i = (i + 1) % 4;
  snprintf(buf[i], sizeof buf[i], "%s/%s", tmpdir, name);
  return buf[i];
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf)
    *len = (size_t)n;
  return buf;
}

static bool exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

static cap_profile_t *load_trace(const char *name) {
  char rel[128], err[256];
  cap_profile_t *p = NULL;
  snprintf(rel, sizeof rel, "traces/%s.trace", name);
  if (cap_trace_load(cap_test_data(rel), &p, err, sizeof err) != 0) {
    fprintf(stderr, "cap_trace_load %s: %s\n", name, err);
    return NULL;
  }
  return p;
}

static int64_t scalar(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  int64_t v = -1;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return v;
}

static char *text_scalar(sqlite3 *db, const char *sql, char *buf, size_t len) {
  sqlite3_stmt *st = NULL;
  buf[0] = '\0';
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
    snprintf(buf, len, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  return buf;
}

/* --- open and migrate ----------------------------------------------------- */

static void test_migrate_from_empty(void) {
  const char *path = tmp_path("sub/dir/fresh.db");
  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(path, 0, &s) == CAP_ENOENT);
  CHECK(strstr(cap_store_last_error(), "fresh.db") != NULL);
  REQUIRE(cap_store_open(path, CAP_STORE_CREATE, &s) == 0);
  sqlite3 *db = cap_store_db(s);
  char buf[64];
  CHECK_EQ(scalar(db, "PRAGMA user_version"), CAP_STORE_SCHEMA_VERSION);
  CHECK_STR(text_scalar(db, "PRAGMA journal_mode", buf, sizeof buf), "wal");
  CHECK_EQ(scalar(db, "PRAGMA foreign_keys"), 1);
  CHECK_EQ(scalar(db, "PRAGMA synchronous"), 1); /* NORMAL */
  CHECK_EQ(scalar(db, "SELECT count(*) FROM sqlite_schema WHERE type='table'"
                      " AND name IN ('jobs','sessions','profiles',"
                      "'profile_tensors','profile_ops',"
                      "'profile_frees','profile_meta','plans','plan_actions',"
                      "'plan_recompute_ops','job_plans','iterations',"
                      "'plan_blocks')"),
           13);
  CHECK_EQ(scalar(db, "SELECT count(*) FROM sqlite_schema WHERE type='view'"
                      " AND name='profile_accesses'"),
           1);
  /* Every table is STRICT. */
  CHECK_EQ(scalar(db, "SELECT count(*) FROM pragma_table_list"
                      " WHERE schema='main' AND type='table'"
                      " AND name NOT LIKE 'sqlite_%' AND strict=0"),
           0);
  cap_store_close(s);

  /* Reopening an up-to-date file migrates nothing and works. */
  REQUIRE(cap_store_open(path, CAP_STORE_CREATE, &s) == 0);
  CHECK_EQ(scalar(cap_store_db(s), "PRAGMA user_version"),
           CAP_STORE_SCHEMA_VERSION);
  cap_store_close(s);

  /* A zero-length file is an empty database: migrated. */
  const char *empty = tmp_path("empty.db");
  FILE *f = fopen(empty, "w");
  REQUIRE(f);
  fclose(f);
  REQUIRE(cap_store_open(empty, 0, &s) == 0);
  CHECK_EQ(scalar(cap_store_db(s), "PRAGMA user_version"),
           CAP_STORE_SCHEMA_VERSION);
  cap_store_close(s);

  /* Read-only open of the migrated file works and refuses writes. */
  REQUIRE(cap_store_open(path, CAP_STORE_READONLY, &s) == 0);
  cap_store_job_t job = {.name = "x"};
  int64_t id = 0;
  CHECK_EQ(cap_store_job_begin(s, &job, &id), CAP_EPERM);
  cap_store_close(s);
}

static void check_refused(const char *path, int want, const char *why) {
  size_t len0 = 0, len1 = 0;
  char *before = slurp(path, &len0);
  REQUIRE(before);
  cap_store_t *s = (cap_store_t *)1;
  for (int ro = 0; ro < 2; ro++) {
    int rc =
        cap_store_open(path, ro ? CAP_STORE_READONLY : CAP_STORE_CREATE, &s);
    CHECK_EQ(rc, want);
    CHECK(s == NULL);
    CHECK(strstr(cap_store_last_error(), path) != NULL);
    CHECK(strstr(cap_store_last_error(), why) != NULL);
  }
  char *after = slurp(path, &len1);
  REQUIRE(after);
  CHECK_EQ(len0, len1);
  CHECK(memcmp(before, after, len0) == 0);
  char side[600];
  snprintf(side, sizeof side, "%s-wal", path);
  CHECK(!exists(side));
  snprintf(side, sizeof side, "%s-journal", path);
  CHECK(!exists(side));
  free(before);
  free(after);
}

static void test_refuse_not_a_database(void) {
  const char *path = tmp_path("notes.txt");
  FILE *f = fopen(path, "w");
  REQUIRE(f);
  for (int i = 0; i < 200; i++)
    fprintf(f, "line %d: this is a text file, not a database\n", i);
  fclose(f);
  check_refused(path, CAP_ECORRUPT, "not a capuchin database");
}

static void test_refuse_newer_version(void) {
  const char *path = tmp_path("newer.db");
  sqlite3 *db = NULL;
  REQUIRE(sqlite3_open(path, &db) == SQLITE_OK);
  REQUIRE(sqlite3_exec(db,
                       "CREATE TABLE future(x INTEGER);"
                       "INSERT INTO future VALUES (42);"
                       "PRAGMA user_version = 99;",
                       NULL, NULL, NULL) == SQLITE_OK);
  sqlite3_close(db);
  check_refused(path, CAP_EVERSION, "newer");
}

static void test_refuse_foreign_sqlite(void) {
  /* Someone else's SQLite file (user_version 0, own tables): not ours to
   * migrate. */
  const char *path = tmp_path("foreign.db");
  sqlite3 *db = NULL;
  REQUIRE(sqlite3_open(path, &db) == SQLITE_OK);
  REQUIRE(sqlite3_exec(db, "CREATE TABLE photos(id INTEGER, path TEXT);", NULL,
                       NULL, NULL) == SQLITE_OK);
  sqlite3_close(db);
  check_refused(path, CAP_ECORRUPT, "not a capuchin database");
}

/* --- profiles ------------------------------------------------------------- */

static void check_profiles_equal(const cap_profile_t *a,
                                 const cap_profile_t *b) {
  REQUIRE(a->n_tensors == b->n_tensors);
  REQUIRE(a->n_ops == b->n_ops);
  REQUIRE(a->n_frees == b->n_frees);
  REQUIRE(a->n_meta == b->n_meta);
  REQUIRE(a->n_op_tensors == b->n_op_tensors);
  CHECK_EQ(a->n_accesses, b->n_accesses);
  CHECK_EQ(a->iter_ns, b->iter_ns);
  CHECK_EQ(a->persistent_bytes, b->persistent_bytes);
  CHECK_EQ(a->meta_peak_bytes, b->meta_peak_bytes);
  CHECK_STR(a->model, b->model);
  int bad = 0;
  for (uint32_t t = 0; t < a->n_tensors; t++) {
    const cap_tensor_t *x = &a->tensors[t], *y = &b->tensors[t];
    bad += x->bytes != y->bytes || x->kind != y->kind ||
           x->producer_op != y->producer_op || x->free_ns != y->free_ns ||
           x->n_accesses != y->n_accesses || x->no_evict != y->no_evict;
  }
  for (uint32_t i = 0; i < a->n_ops; i++) {
    const cap_op_t *x = &a->ops[i], *y = &b->ops[i];
    bad += x->start_ns != y->start_ns || x->end_ns != y->end_ns ||
           strcmp(x->name, y->name) != 0 || x->n_in != y->n_in ||
           x->n_out != y->n_out || x->flags != y->flags;
    if (x->n_in == y->n_in && x->n_out == y->n_out) {
      bad += memcmp(cap_op_inputs(a, x), cap_op_inputs(b, y),
                    x->n_in * sizeof(uint32_t)) != 0;
      bad += memcmp(cap_op_outputs(a, x), cap_op_outputs(b, y),
                    x->n_out * sizeof(uint32_t)) != 0;
    }
  }
  for (uint32_t i = 0; i < a->n_frees; i++)
    bad += a->frees[i].t_ns != b->frees[i].t_ns ||
           a->frees[i].tensor != b->frees[i].tensor;
  for (uint32_t i = 0; i < a->n_meta; i++)
    bad += strcmp(a->meta[i].key, b->meta[i].key) != 0 ||
           strcmp(a->meta[i].value, b->meta[i].value) != 0;
  CHECK_EQ(bad, 0);
  CHECK(cap_profile_signature(a) == cap_profile_signature(b));
}

static void test_profile_round_trip(void) {
  static const char *const models[] = {
      "resnet50",  "vgg16",      "inception_v3", "mobilenet_v2",
      "bert_base", "bert_large", "gpt2_small"};
  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(tmp_path("profiles.db"), CAP_STORE_CREATE, &s) == 0);
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
    cap_profile_t *p = load_trace(models[m]);
    REQUIRE(p);
    uint64_t sig = cap_profile_signature(p);
    int64_t id = 0, found = 0;
    double best = 1e9;
    /* Time the write a few times; report the best (the machine is noisy). */
    for (int rep = 0; rep < 3; rep++) {
      double t0 = now_s();
      REQUIRE(cap_store_profile_put(s, 0, p, sig, true, &bw, &id) == 0);
      double dt = now_s() - t0;
      best = dt < best ? dt : best;
    }
    printf("  store %-13s %5u tensors %5u ops %6u op-tensors: %.2f ms\n",
           models[m], p->n_tensors, p->n_ops, p->n_op_tensors, best * 1e3);
    REQUIRE(cap_store_profile_find(s, sig, &found) == 0);
    CHECK_EQ(found, id); /* the newest of the three */
    cap_profile_t *q = NULL;
    uint64_t sig2 = 0;
    REQUIRE(cap_store_profile_load(s, id, &q, &sig2) == 0);
    CHECK(sig2 == sig);
    check_profiles_equal(p, q);
    /* The profile_accesses view lists every input and output once. */
    char sql[160];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM profile_accesses WHERE profile_id=%lld",
             (long long)id);
    CHECK_EQ(scalar(cap_store_db(s), sql), p->n_op_tensors);
    cap_profile_destroy(q);
    cap_profile_destroy(p);
  }
  int64_t none = 0;
  CHECK_EQ(cap_store_profile_find(s, 0x1234, &none), CAP_ENOENT);
  cap_profile_t *q = NULL;
  CHECK_EQ(cap_store_profile_load(s, 99999, &q, NULL), CAP_ENOENT);
  CHECK(q == NULL);
  char buf[32];
  CHECK_STR(
      text_scalar(cap_store_db(s), "PRAGMA integrity_check", buf, sizeof buf),
      "ok");
  cap_store_close(s);
}

/* W0 and W1 (params) read by op 0 and op 1, an activation between them;
 * W1 marked no_evict when mark is set. */
static cap_profile_t *two_weights(bool mark) {
  cap_profile_t *p = cap_profile_create();
  const uint32_t w0 = 0, a = 2, w1a[] = {1, 2};
  if (!p || cap_profile_add_tensor(p, 0, 4096, CAP_KIND_PARAM) ||
      cap_profile_add_tensor(p, 1, 4096, CAP_KIND_PARAM) ||
      cap_profile_add_tensor(p, 2, 8192, CAP_KIND_ACTIVATION) ||
      cap_profile_add_op(p, 0, 0, 10, "aten.mm.default", &w0, 1, &a, 1) ||
      cap_profile_add_op(p, 1, 10, 20, "aten.mm.default", w1a, 2, NULL, 0) ||
      cap_profile_add_free(p, 20, a) ||
      (mark && cap_profile_set_no_evict(p, 1)) || cap_profile_finish(p)) {
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

/* A tensor marked no_evict comes back marked, the others do not; a
 * profile stored unmarked takes the marks of one measured again (a plan
 * recomputed from the store must honour what the client reported). */
static void test_no_evict_round_trip(void) {
  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(tmp_path("no_evict.db"), CAP_STORE_CREATE, &s) == 0);
  cap_profile_t *p = two_weights(true), *plain = two_weights(false);
  REQUIRE(p && plain);
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  uint64_t sig = cap_profile_signature(p);
  CHECK(sig == cap_profile_signature(plain)); /* marks are not the model */
  int64_t id = 0, plain_id = 0;
  REQUIRE(cap_store_profile_put(s, 0, p, sig, true, &bw, &id) == 0);
  REQUIRE(cap_store_profile_put(s, 0, plain, sig, true, &bw, &plain_id) == 0);
  cap_profile_t *q = NULL;
  REQUIRE(cap_store_profile_load(s, id, &q, NULL) == 0);
  check_profiles_equal(p, q);
  CHECK(q->tensors[1].no_evict);
  CHECK(!q->tensors[0].no_evict && !q->tensors[2].no_evict);
  CHECK(cap_profile_equal(p, q));
  cap_profile_destroy(q);
  q = NULL;
  REQUIRE(cap_store_profile_load(s, plain_id, &q, NULL) == 0);
  CHECK(!q->tensors[1].no_evict);
  cap_profile_destroy(q);
  q = NULL;
  CHECK_EQ(cap_store_profile_mark_no_evict(s, plain_id, plain), 0); /* none */
  CHECK_EQ(cap_store_profile_mark_no_evict(s, plain_id, p), 0);
  REQUIRE(cap_store_profile_load(s, plain_id, &q, NULL) == 0);
  CHECK(cap_profile_equal(p, q));
  cap_profile_destroy(q);
  cap_profile_destroy(plain);
  cap_profile_destroy(p);
  cap_store_close(s);
}

static void test_incomplete_profile(void) {
  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(tmp_path("partial.db"), CAP_STORE_CREATE, &s) == 0);
  /* A half-built profile, as the tracker holds when a client disconnects
   * mid-iteration: tensors and a few ops, never finished. */
  cap_profile_t *p = cap_profile_create();
  REQUIRE(p);
  REQUIRE(cap_profile_add_tensor(p, 0, 4096, CAP_KIND_PARAM) == 0);
  REQUIRE(cap_profile_add_tensor(p, 1, 8192, CAP_KIND_ACTIVATION) == 0);
  uint32_t in[] = {0}, out[] = {1};
  REQUIRE(cap_profile_add_op(p, 0, 0, 100, "aten.mm.default", in, 1, out, 1) ==
          0);
  int64_t id = 0, found = 0;
  CHECK_EQ(cap_store_profile_put(s, 0, p, 0xabcdef, true, NULL, &id),
           CAP_ESTATE);
  REQUIRE(cap_store_profile_put(s, 0, p, 0xabcdef, false, NULL, &id) == 0);
  CHECK_EQ(cap_store_profile_find(s, 0xabcdef, &found), CAP_ENOENT);
  cap_profile_t *q = NULL;
  CHECK_EQ(cap_store_profile_load(s, id, &q, NULL), CAP_ESTATE);
  CHECK_EQ(scalar(cap_store_db(s), "SELECT count(*) FROM profile_accesses"), 2);
  cap_profile_destroy(p);
  cap_store_close(s);
}

/* --- plans ---------------------------------------------------------------- */

/* A plan over p exercising every field: swaps with and without triggers
 * and flags, recomputes with their lineage ops. */
static cap_plan_t *make_plan(const cap_profile_t *p, uint64_t budget,
                             uint32_t version) {
  cap_plan_t *plan = cap_plan_create("capuchin", budget);
  if (!plan)
    return NULL;
  plan->version = version;
  plan->predicted_iter_ns = 41234567;
  plan->predicted_peak_bytes = budget - 12345;
  uint32_t n = 0;
  for (uint32_t t = 0; t < p->n_tensors && n < 60; t++) {
    const cap_tensor_t *tt = &p->tensors[t];
    if (tt->kind != CAP_KIND_ACTIVATION || tt->n_accesses < 2)
      continue;
    if (n % 3 == 2 && tt->producer_op != CAP_NONE) {
      uint32_t ops[2] = {tt->producer_op, tt->producer_op};
      uint32_t k = tt->producer_op > 0 ? 2 : 1;
      if (k == 2)
        ops[0] = tt->producer_op - 1;
      if (cap_plan_add_recompute(plan, t, 1, ops, k) != 0)
        goto fail;
    } else if (n % 3 == 1) {
      /* Prefetch triggered by an access of tensor 0 (a param) that exists. */
      if (cap_plan_add_swap(plan, t, 1, 0, 1, 0) != 0)
        goto fail;
    } else {
      if (cap_plan_add_swap(plan, t, 1, CAP_NONE, 0,
                            n % 2 ? CAP_ACTION_SYNC_OUT : 0) != 0)
        goto fail;
    }
    n++;
  }
  /* and a release after the last access of a freed activation */
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    const cap_tensor_t *tt = &p->tensors[t];
    if (tt->kind == CAP_KIND_ACTIVATION && tt->free_ns >= 0 &&
        tt->n_accesses >= 1) {
      if (cap_plan_add_release(plan, t, tt->n_accesses) != 0)
        goto fail;
      break;
    }
  }
  return plan;
fail:
  cap_plan_destroy(plan);
  return NULL;
}

static void check_plans_equal(const cap_plan_t *a, const cap_plan_t *b) {
  CHECK_EQ(a->version, b->version);
  CHECK_EQ(a->budget_bytes, b->budget_bytes);
  CHECK_STR(a->policy, b->policy);
  CHECK_EQ(a->predicted_iter_ns, b->predicted_iter_ns);
  CHECK_EQ(a->predicted_peak_bytes, b->predicted_peak_bytes);
  REQUIRE(a->n_actions == b->n_actions);
  int bad = 0;
  for (uint32_t i = 0; i < a->n_actions; i++) {
    const cap_action_t *x = &a->actions[i], *y = &b->actions[i];
    bad += x->tensor != y->tensor ||
           x->evict_after_access != y->evict_after_access ||
           x->method != y->method || x->flags != y->flags;
    if (x->method == CAP_METHOD_SWAP) {
      bad += x->prefetch_tensor != y->prefetch_tensor;
      if (x->prefetch_tensor != CAP_NONE)
        bad += x->prefetch_access != y->prefetch_access;
    } else {
      bad += x->n_recompute != y->n_recompute;
      if (x->n_recompute == y->n_recompute && x->n_recompute)
        bad += memcmp(cap_action_recompute_ops(a, x),
                      cap_action_recompute_ops(b, y),
                      x->n_recompute * sizeof(uint32_t)) != 0;
    }
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(a->arena_bytes, b->arena_bytes);
  REQUIRE(a->n_blocks == b->n_blocks);
  for (uint32_t i = 0; i < a->n_blocks; i++) {
    const cap_block_t *x = &a->blocks[i], *y = &b->blocks[i];
    bad += x->tensor != y->tensor || x->kind != y->kind ||
           x->action != y->action || x->offset != y->offset ||
           x->bytes != y->bytes || x->start_ns != y->start_ns ||
           x->end_ns != y->end_ns || x->share != y->share ||
           x->same_as != y->same_as;
  }
  CHECK_EQ(bad, 0);
}

/* A database of schema 2 (before placement) with a plan in it: opening it
 * migrates to the current schema, the old plan loads without blocks, and a
 * plan with blocks can be stored and loaded after. */
static void test_migrate_from_schema_2(void) {
  const char *path = tmp_path("schema2.db");
  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(path, CAP_STORE_CREATE, &s) == 0);
  cap_profile_t *p = load_trace("resnet50");
  REQUIRE(p);
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  cap_store_job_t job = {.name = "old", .pid = 1, .device = 0};
  int64_t job_id = 0, prof_id = 0, old_plan = 0, new_plan = 0;
  REQUIRE(cap_store_job_begin(s, &job, &job_id) == 0);
  REQUIRE(cap_store_profile_put(s, job_id, p, cap_profile_signature(p), true,
                                &bw, &prof_id) == 0);
  cap_plan_t *v1 = make_plan(p, cap_profile_budget_pct(p, 50), 1);
  REQUIRE(v1);
  REQUIRE(cap_store_plan_put(s, prof_id, job_id, v1, &bw, &old_plan) == 0);
  cap_store_close(s);
  /* Back to what schema 2 was. */
  sqlite3 *db = NULL;
  REQUIRE(sqlite3_open(path, &db) == SQLITE_OK);
  REQUIRE(sqlite3_exec(db,
                       "DROP TABLE plan_blocks;"
                       "ALTER TABLE plans DROP COLUMN arena_bytes;"
                       "ALTER TABLE profile_tensors DROP COLUMN no_evict;"
                       "PRAGMA user_version = 2;",
                       NULL, NULL, NULL) == SQLITE_OK);
  sqlite3_close(db);

  REQUIRE(cap_store_open(path, 0, &s) == 0);
  CHECK_EQ(scalar(cap_store_db(s), "PRAGMA user_version"),
           CAP_STORE_SCHEMA_VERSION);
  cap_plan_t *back = NULL;
  REQUIRE(cap_store_plan_load(s, old_plan, &back, NULL, NULL) == 0);
  check_plans_equal(v1, back);
  CHECK_EQ(back->n_blocks, 0);
  cap_plan_destroy(back);
  const cap_block_t b = {5, CAP_RESIDENCY_FIRST_TOUCH, CAP_NONE, 0, 4096,
                         0, 10, CAP_NONE, CAP_NONE};
  REQUIRE(cap_plan_set_blocks(v1, &b, 1, 4096) == 0);
  REQUIRE(cap_store_plan_put(s, prof_id, job_id, v1, &bw, &new_plan) == 0);
  back = NULL;
  REQUIRE(cap_store_plan_load(s, new_plan, &back, NULL, NULL) == 0);
  check_plans_equal(v1, back);
  cap_plan_destroy(back);
  cap_plan_destroy(v1);
  cap_profile_destroy(p);
  cap_store_close(s);
}

static void test_plan_round_trip_and_find(void) {
  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(tmp_path("plans.db"), CAP_STORE_CREATE, &s) == 0);
  cap_profile_t *p = load_trace("resnet50");
  REQUIRE(p);
  uint64_t sig = cap_profile_signature(p);
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  cap_store_job_t job = {.name = "resnet50-rank0", .pid = 1, .device = 0};
  int64_t job_id = 0, prof_id = 0, plan1 = 0, plan2 = 0, other = 0;
  REQUIRE(cap_store_job_begin(s, &job, &job_id) == 0);
  REQUIRE(cap_store_profile_put(s, job_id, p, sig, true, &bw, &prof_id) == 0);
  uint64_t budget = cap_profile_budget_pct(p, 50);
  cap_plan_t *v1 = make_plan(p, budget, 1), *v2 = make_plan(p, budget, 2);
  REQUIRE(v1 && v2);
  REQUIRE(v1->n_actions > 10);
  v2->actions[0].prefetch_tensor = 0; /* v2: an earlier trigger */
  v2->actions[0].prefetch_access = 1;
  /* v2 has a placement (blocks of every kind, shared and tied ones). */
  const cap_block_t blocks[] = {
      {7, CAP_RESIDENCY_FIRST_TOUCH, CAP_NONE, 0, 4096, 0, 100, CAP_NONE, CAP_NONE},
      {8, CAP_RESIDENCY_FIRST_TOUCH, CAP_NONE, 0, 2048, 90, 200, 0, CAP_NONE},
      {7, CAP_RESIDENCY_SWAPPED_IN, 0, 4096, 4096, 150, 300, CAP_NONE, CAP_NONE},
      {9, CAP_RESIDENCY_RECOMPUTED, 2, 0, 1024, 250, 400, CAP_NONE, CAP_NONE},
      {3, CAP_RESIDENCY_TEMPORARY, 2, 1024, 512, 240, 250, CAP_NONE, CAP_NONE},
      {1, CAP_RESIDENCY_PERSISTENT, CAP_NONE, 8192, 256, 0, 50, CAP_NONE, 6},
      {1, CAP_RESIDENCY_SWAPPED_IN, 1, 8192, 256, 350, 500, CAP_NONE, 5},
  };
  REQUIRE(cap_plan_set_blocks(v2, blocks, 7, 8192 + 256) == 0);
  REQUIRE(cap_store_plan_put(s, prof_id, job_id, v1, &bw, &plan1) == 0);
  REQUIRE(cap_store_plan_put(s, prof_id, job_id, v2, &bw, &plan2) == 0);
  /* A plan for another budget must not be found for this one. */
  cap_plan_t *vo = make_plan(p, budget + 4096, 7);
  REQUIRE(vo);
  REQUIRE(cap_store_plan_put(s, prof_id, 0, vo, &bw, &other) == 0);

  cap_plan_t *back = NULL;
  int64_t back_prof = 0;
  cap_bandwidth_t back_bw = {0, 0, 0};
  REQUIRE(cap_store_plan_load(s, plan1, &back, &back_prof, &back_bw) == 0);
  check_plans_equal(v1, back);
  CHECK_EQ(back_prof, prof_id);
  CHECK(back_bw.h2d_gbps == bw.h2d_gbps &&
        back_bw.duplex_gbps == bw.duplex_gbps);
  cap_plan_destroy(back);
  back = NULL;
  REQUIRE(cap_store_plan_load(s, plan2, &back, NULL, NULL) == 0);
  check_plans_equal(v2, back);
  cap_plan_destroy(back);
  back = NULL;
  CHECK_EQ(cap_store_plan_load(s, 424242, &back, NULL, NULL), CAP_ENOENT);

  int64_t found = 0, found_prof = 0;
  REQUIRE(cap_store_plan_find(s, sig, budget, &bw, 0.2, &found, &found_prof) ==
          0);
  CHECK_EQ(found, plan2); /* highest version */
  CHECK_EQ(found_prof, prof_id);
  cap_bandwidth_t near = {bw.h2d_gbps * 0.9, bw.d2h_gbps * 1.1, bw.duplex_gbps};
  CHECK_EQ(cap_store_plan_find(s, sig, budget, &near, 0.2, &found, NULL), 0);
  cap_bandwidth_t pcie3 = {12.0, 12.0, 20.0};
  CHECK_EQ(cap_store_plan_find(s, sig, budget, &pcie3, 0.2, &found, NULL),
           CAP_ENOENT);
  CHECK_EQ(cap_store_plan_find(s, sig, budget, NULL, 0.2, &found, NULL), 0);
  CHECK_EQ(cap_store_plan_find(s, sig, budget + 1, &bw, 0.2, &found, NULL),
           CAP_ENOENT);
  CHECK_EQ(cap_store_plan_find(s, sig ^ 1, budget, &bw, 0.2, &found, NULL),
           CAP_ENOENT);
  uint32_t ver = 0;
  REQUIRE(cap_store_plan_latest_version(s, prof_id, budget, &ver) == 0);
  CHECK_EQ(ver, 2);
  CHECK_EQ(cap_store_plan_latest_version(s, prof_id, 1, &ver), CAP_ENOENT);

  /* A plan for a profile that does not exist violates a foreign key and
   * leaves nothing behind. */
  int64_t bad = 0;
  int64_t plans_before = scalar(cap_store_db(s), "SELECT count(*) FROM plans");
  CHECK_EQ(cap_store_plan_put(s, 777777, 0, v1, &bw, &bad), CAP_ESTORE);
  CHECK_EQ(scalar(cap_store_db(s), "SELECT count(*) FROM plans"), plans_before);
  CHECK_EQ(scalar(cap_store_db(s), "SELECT count(*) FROM job_plans"), 2);

  cap_plan_destroy(v1);
  cap_plan_destroy(v2);
  cap_plan_destroy(vo);
  cap_profile_destroy(p);
  cap_store_close(s);
}

/* --- jobs, sessions, iterations ------------------------------------------- */

static void test_events(void) {
  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(tmp_path("events.db"), CAP_STORE_CREATE, &s) == 0);
  sqlite3 *db = cap_store_db(s);
  cap_store_job_t job = {.name = "bert",
                         .hostname = "node7",
                         .pid = 4242,
                         .uid = 1000,
                         .gid = 1000,
                         .device = 3,
                         .device_total_bytes = 80ull << 30,
                         .requested_budget_bytes = 6ull << 30,
                         .hello_signature = 0xfedcba9876543210ull};
  int64_t job_id = 0, sess = 0, it_id = 0;
  REQUIRE(cap_store_job_begin(s, &job, &job_id) == 0);
  REQUIRE(cap_store_session_begin(s, job_id, 4242, 1000, 1000, &sess) == 0);
  REQUIRE(cap_store_job_set_budget(s, job_id, 5ull << 30) == 0);
  CHECK_EQ(scalar(db, "SELECT granted_budget_bytes FROM jobs"), 5ll << 30);
  CHECK((uint64_t)scalar(db, "SELECT hello_signature FROM jobs") ==
        0xfedcba9876543210ull);
  for (uint64_t i = 1; i <= 5; i++) {
    cap_store_iteration_t it = {.job_id = job_id,
                                .session_id = sess,
                                .iteration = i,
                                .iter_ns = 40000000 + (int64_t)i,
                                .peak_bytes = 3ull << 30,
                                .stall_ns = 1000 * (int64_t)i,
                                .n_stalls = (uint32_t)i,
                                .swap_out_bytes = 1ull << 30,
                                .swap_in_bytes = 1ull << 30};
    REQUIRE(cap_store_iteration_put(s, &it, &it_id) == 0);
  }
  CHECK_EQ(scalar(db, "SELECT count(*) FROM iterations"), 5);
  CHECK_EQ(scalar(db, "SELECT sum(n_stalls) FROM iterations"), 15);
  REQUIRE(cap_store_session_end(s, sess, "client closed") == 0);
  REQUIRE(cap_store_job_end(s, job_id, NULL) == 0);
  char buf[64];
  CHECK_STR(text_scalar(db, "SELECT status FROM jobs", buf, sizeof buf), "ok");
  CHECK(scalar(db, "SELECT ended_ms FROM jobs") > 0);
  CHECK_EQ(cap_store_job_end(s, 999, "ok"), CAP_ENOENT);
  CHECK_EQ(cap_store_session_end(s, 999, "x"), CAP_ENOENT);
  /* An iteration of an unknown job: refused by the foreign key. */
  cap_store_iteration_t orphan = {.job_id = 999, .iteration = 1};
  CHECK_EQ(cap_store_iteration_put(s, &orphan, NULL), CAP_ESTORE);
  CHECK(strstr(cap_store_last_error(), "FOREIGN KEY") != NULL);
  CHECK_EQ(scalar(db, "SELECT count(*) FROM iterations"), 5);
  /* A value that does not fit INTEGER is refused, not wrapped. */
  cap_store_iteration_t huge = {.job_id = job_id, .peak_bytes = UINT64_MAX};
  CHECK_EQ(cap_store_iteration_put(s, &huge, NULL), CAP_ERANGE);
  cap_store_close(s);
}

/* Loop-thread and worker-thread writers sharing one handle, and a second
 * handle reading while they write (WAL). */
struct writer_arg {
  cap_store_t *s;
  int64_t job_id;
  int n, failures;
};

static void *writer(void *argp) {
  struct writer_arg *a = argp;
  for (int i = 0; i < a->n; i++) {
    cap_store_iteration_t it = {.job_id = a->job_id, .iteration = (uint64_t)i};
    if (cap_store_iteration_put(a->s, &it, NULL) != 0)
      a->failures++;
  }
  return NULL;
}

static void test_threads_share_handle(void) {
  const char *path = tmp_path("threads.db");
  cap_store_t *s = NULL, *ro = NULL;
  REQUIRE(cap_store_open(path, CAP_STORE_CREATE, &s) == 0);
  REQUIRE(cap_store_open(path, CAP_STORE_READONLY, &ro) == 0);
  cap_store_job_t job = {.name = "t"};
  int64_t job_id = 0;
  REQUIRE(cap_store_job_begin(s, &job, &job_id) == 0);
  struct writer_arg args[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (struct writer_arg){s, job_id, 200, 0};
    REQUIRE(pthread_create(&th[i], NULL, writer, &args[i]) == 0);
  }
  int64_t seen = 0;
  for (int i = 0; i < 20; i++) {
    int64_t n = scalar(cap_store_db(ro), "SELECT count(*) FROM iterations");
    CHECK(n >= seen); /* a reader never sees rows vanish */
    seen = n;
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK_EQ(args[i].failures, 0);
  }
  CHECK_EQ(scalar(cap_store_db(ro), "SELECT count(*) FROM iterations"), 800);
  cap_store_close(ro);
  cap_store_close(s);
}

/* --- kill -9 -------------------------------------------------------------- */

/* What the child reports after each committed event. */
struct committed {
  char kind; /* 'j' job, 'p' profile, 'P' plan, 'i' iteration */
  int64_t id;
  int64_t value; /* iteration number or plan version */
};

static void child_burst(const char *path, int fd, const cap_profile_t *p) {
  cap_store_t *s = NULL;
  if (cap_store_open(path, CAP_STORE_CREATE, &s) != 0)
    _exit(2);
  cap_bandwidth_t bw = CAP_BANDWIDTH_H100;
  uint64_t sig = cap_profile_signature(p);
  uint64_t budget = cap_profile_budget_pct(p, 50);
  for (int64_t round = 0;; round++) {
    cap_store_job_t job = {.name = "burst", .pid = (uint32_t)getpid()};
    struct committed c;
    int64_t job_id, prof_id, plan_id;
    if (cap_store_job_begin(s, &job, &job_id) != 0)
      _exit(3);
    c = (struct committed){'j', job_id, round};
    if (write(fd, &c, sizeof c) != sizeof c)
      _exit(4);
    if (cap_store_profile_put(s, job_id, p, sig, true, &bw, &prof_id) != 0)
      _exit(3);
    c = (struct committed){'p', prof_id, 0};
    if (write(fd, &c, sizeof c) != sizeof c)
      _exit(4);
    cap_plan_t *plan = make_plan(p, budget, (uint32_t)round + 1);
    if (!plan ||
        cap_store_plan_put(s, prof_id, job_id, plan, &bw, &plan_id) != 0)
      _exit(3);
    cap_plan_destroy(plan);
    c = (struct committed){'P', plan_id, round + 1};
    if (write(fd, &c, sizeof c) != sizeof c)
      _exit(4);
    for (int64_t i = 0; i < 50; i++) {
      int64_t it_id;
      cap_store_iteration_t it = {.job_id = job_id,
                                  .plan_id = plan_id,
                                  .plan_version = (uint32_t)round + 1,
                                  .iteration = (uint64_t)i,
                                  .iter_ns = 1000 + i};
      if (cap_store_iteration_put(s, &it, &it_id) != 0)
        _exit(3);
      c = (struct committed){'i', it_id, i};
      if (write(fd, &c, sizeof c) != sizeof c)
        _exit(4);
    }
  }
}

static void test_kill9_durability(void) {
  const char *path = tmp_path("kill9.db");
  cap_profile_t *p = load_trace("resnet50");
  REQUIRE(p);
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    child_burst(path, fds[1], p);
    _exit(0);
  }
  close(fds[1]);
  /* Let it write a few rounds (profiles, plans, iterations), then kill it
   * at an arbitrary moment. */
  size_t cap = 4096, n = 0;
  struct committed *log = malloc(cap * sizeof *log);
  REQUIRE(log);
  int profiles = 0;
  double t0 = now_s();
  while (profiles < 4 && now_s() - t0 < 60) {
    struct committed c;
    ssize_t r = read(fds[0], &c, sizeof c);
    if (r != (ssize_t)sizeof c)
      break;
    if (n == cap) {
      cap *= 2;
      struct committed *nl = realloc(log, cap * sizeof *log);
      REQUIRE(nl);
      log = nl;
    }
    log[n++] = c;
    profiles += c.kind == 'p';
  }
  /* Kill mid-write: wait for the profile after the 4th to be underway. */
  usleep(1500);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  /* Drain what the child reported before dying: those events committed. */
  struct committed c;
  while (read(fds[0], &c, sizeof c) == (ssize_t)sizeof c) {
    if (n == cap) {
      cap *= 2;
      struct committed *nl = realloc(log, cap * sizeof *log);
      REQUIRE(nl);
      log = nl;
    }
    log[n++] = c;
  }
  close(fds[0]);
  REQUIRE(profiles >= 4);

  cap_store_t *s = NULL;
  REQUIRE(cap_store_open(path, CAP_STORE_CREATE, &s) == 0);
  sqlite3 *db = cap_store_db(s);
  char buf[32];
  CHECK_STR(text_scalar(db, "PRAGMA integrity_check", buf, sizeof buf), "ok");
  CHECK_STR(text_scalar(db, "PRAGMA foreign_key_check", buf, sizeof buf), "");
  int missing = 0, checked_profiles = 0;
  uint64_t sig = cap_profile_signature(p);
  for (size_t i = 0; i < n; i++) {
    char sql[160];
    switch (log[i].kind) {
    case 'j':
      snprintf(sql, sizeof sql, "SELECT count(*) FROM jobs WHERE id=%lld",
               (long long)log[i].id);
      missing += scalar(db, sql) != 1;
      break;
    case 'p': {
      cap_profile_t *q = NULL;
      uint64_t sig2 = 0;
      if (cap_store_profile_load(s, log[i].id, &q, &sig2) != 0 || sig2 != sig)
        missing++;
      else
        check_profiles_equal(p, q);
      cap_profile_destroy(q);
      checked_profiles++;
      break;
    }
    case 'P': {
      cap_plan_t *plan = NULL;
      if (cap_store_plan_load(s, log[i].id, &plan, NULL, NULL) != 0 ||
          plan->version != (uint32_t)log[i].value || plan->n_actions == 0)
        missing++;
      cap_plan_destroy(plan);
      break;
    }
    case 'i':
      snprintf(sql, sizeof sql,
               "SELECT count(*) FROM iterations WHERE id=%lld AND "
               "iteration=%lld AND iter_ns=%lld",
               (long long)log[i].id, (long long)log[i].value,
               (long long)(1000 + log[i].value));
      missing += scalar(db, sql) != 1;
      break;
    }
  }
  printf("  kill -9 after %zu committed events (%d profiles): %d missing\n", n,
         checked_profiles, missing);
  CHECK_EQ(missing, 0);
  /* The reopened store takes new events. */
  cap_store_job_t job = {.name = "after"};
  int64_t jid = 0;
  CHECK_EQ(cap_store_job_begin(s, &job, &jid), 0);
  cap_store_close(s);
  free(log);
  cap_profile_destroy(p);
}

static void rm_rf(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/cap_test_store.XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  RUN_TEST(test_migrate_from_empty);
  RUN_TEST(test_migrate_from_schema_2);
  RUN_TEST(test_refuse_not_a_database);
  RUN_TEST(test_refuse_newer_version);
  RUN_TEST(test_refuse_foreign_sqlite);
  RUN_TEST(test_profile_round_trip);
  RUN_TEST(test_no_evict_round_trip);
  RUN_TEST(test_incomplete_profile);
  RUN_TEST(test_plan_round_trip_and_find);
  RUN_TEST(test_events);
  RUN_TEST(test_threads_share_handle);
  RUN_TEST(test_kill9_durability);
  rm_rf(tmpdir);
  return TEST_SUMMARY();
}
