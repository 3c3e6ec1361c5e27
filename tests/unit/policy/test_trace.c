/*
 * The trace reader on the seven vendored traces: every one loads, its
 * counts match the file, its reconstructed peak lands within 3 % of the
 * measured allocator peak, and writing it back and re-reading it gives an
 * equal profile with the same signature. Also: file-level errors.
 */
#include <math.h>
#include <stdio.h>
#include <time.h>

#include "cap_test.h"
#include "capuchin/error.h"
#include "capuchin/trace.h"

static const char *const traces[] = {
    "resnet50", "vgg16", "inception_v3", "mobilenet_v2",
    "bert_base", "bert_large", "gpt2_small",
};
#define N_TRACES (sizeof traces / sizeof *traces)

/* Counts straight from the text, independent of the reader. */
typedef struct counts {
  uint32_t tensors, ops, frees, params;
} counts_t;

static counts_t count_lines(const char *path) {
  counts_t c = {0};
  FILE *f = fopen(path, "r");
  if (!f)
    return c;
  char line[1 << 16];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "tensor ", 7) == 0) {
      c.tensors++;
      if (strstr(line, " param"))
        c.params++;
    } else if (strncmp(line, "op ", 3) == 0)
      c.ops++;
    else if (strncmp(line, "free ", 5) == 0)
      c.frees++;
  }
  fclose(f);
  return c;
}

static void test_all_traces_load_within_3pct(void) {
  for (size_t i = 0; i < N_TRACES; i++) {
    char rel[64], err[512];
    snprintf(rel, sizeof rel, "traces/%s.trace", traces[i]);
    const char *path = cap_test_data(rel);
    counts_t c = count_lines(path);
    cap_profile_t *p = NULL;
    int rc = cap_trace_load(path, &p, err, sizeof err);
    if (rc) {
      fprintf(stderr, "%s: %s\n", traces[i], err);
      CHECK_EQ(rc, 0);
      continue;
    }
    CHECK(p->finished);
    CHECK_STR(p->model, traces[i]);
    CHECK_EQ(p->n_tensors, c.tensors);
    CHECK_EQ(p->n_ops, c.ops);
    CHECK_EQ(p->n_frees, c.frees);
    CHECK(c.params > 0);
    CHECK(p->meta_peak_bytes > 0);
    CHECK(p->resident_bytes > 0);
    double dev = ((double)p->peak_bytes - (double)p->meta_peak_bytes) /
                 (double)p->meta_peak_bytes * 100.0;
    printf("  %-13s peak %10" PRIu64 " meta %10" PRIu64 " dev %+.3f %%"
           " persistent %10" PRIu64 " at %" PRId64 " ns\n",
           traces[i], p->peak_bytes, p->meta_peak_bytes, dev,
           p->persistent_bytes, p->peak_t_ns);
    CHECK(fabs(dev) <= 3.0);
    CHECK(p->peak_bytes > p->persistent_bytes);
    CHECK(p->peak_t_ns > 0 && p->peak_t_ns <= p->iter_ns);
    CHECK_EQ(cap_profile_transient_peak(p),
             p->peak_bytes - p->persistent_bytes);
    CHECK_EQ(cap_profile_budget_pct(p, 100.0), p->peak_bytes);
    CHECK_EQ(cap_profile_budget_pct(p, 0.0), p->persistent_bytes);
    CHECK_EQ(p->iter_ns, p->ops[p->n_ops - 1].end_ns);

    /* Every access list is ascending and each entry really names t. */
    uint64_t total = 0;
    for (uint32_t t = 0; t < p->n_tensors; t++) {
      const cap_tensor_t *ct = &p->tensors[t];
      total += ct->n_accesses;
      for (uint32_t k = 1; k <= ct->n_accesses; k++) {
        uint32_t o = cap_profile_access_op(p, t, k);
        REQUIRE(o < p->n_ops);
        if (k > 1)
          CHECK(o > cap_profile_access_op(p, t, k - 1));
        CHECK_EQ(cap_profile_access_index(p, t, o), k);
        const cap_op_t *op = &p->ops[o];
        bool found = false;
        for (uint32_t j = 0; j < op->n_in + op->n_out; j++)
          found |= p->op_tensors[op->in_off + j] == t;
        CHECK(found);
      }
      CHECK_EQ(cap_profile_access_op(p, t, ct->n_accesses + 1), CAP_NONE);
      /* Freed activations are created by their first access's op. */
      if (ct->kind == CAP_KIND_ACTIVATION && ct->free_ns >= 0)
        CHECK_EQ(ct->producer_op, cap_profile_access_op(p, t, 1));
      if (ct->kind != CAP_KIND_ACTIVATION)
        CHECK_EQ(ct->producer_op, CAP_NONE);
    }
    CHECK_EQ(total, p->n_accesses);
    cap_profile_destroy(p);
  }
}

/* Flags and lineage checked on known lines of resnet50.trace:
 *   op 0 ... aten.convolution.default 0,1 483
 *   op 1 ... aten.add_.Tensor 2 2 */
static void test_lineage_and_flags(void) {
  char err[512];
  cap_profile_t *p = NULL;
  REQUIRE(cap_trace_load(cap_test_data("traces/resnet50.trace"), &p, err,
                         sizeof err) == 0);
  CHECK_EQ(p->tensors[483].producer_op, 0);
  CHECK_EQ(p->ops[0].flags, 0);
  CHECK_EQ(p->ops[1].flags, CAP_OP_INPLACE);
  CHECK_EQ(p->tensors[2].producer_op, CAP_NONE); /* in-place on a buffer */
  CHECK_EQ(p->tensors[2].free_ns, -1);
  CHECK(cap_tensor_is_resident(&p->tensors[2]));
  uint32_t inplace = 0, view = 0;
  for (uint32_t o = 0; o < p->n_ops; o++) {
    const cap_op_t *op = &p->ops[o];
    if (op->flags & CAP_OP_INPLACE) {
      inplace++;
      const char *us = strchr(strchr(op->name, '.') + 1, '.');
      CHECK(us && us[-1] == '_');
    }
    if (op->flags & CAP_OP_VIEW) {
      view++;
      CHECK(!(op->flags & CAP_OP_INPLACE));
    }
  }
  CHECK(inplace > 0);
  CHECK(view > 0);
  CHECK(cap_profile_multi_access_tensors(p) > 0);
  CHECK(cap_profile_multi_access_tensors(p) <= p->n_tensors);
  cap_profile_destroy(p);
}

static cap_profile_t *round_trip(const cap_profile_t *p) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f)
    return NULL;
  int rc = cap_trace_write(f, p);
  fclose(f);
  cap_profile_t *q = NULL;
  char err[512];
  if (rc == 0 && cap_trace_parse(buf, len, "rt.trace", &q, err, sizeof err))
    fprintf(stderr, "round trip: %s\n", err);
  free(buf);
  return q;
}

static void test_round_trip_all(void) {
  uint64_t sigs[N_TRACES];
  for (size_t i = 0; i < N_TRACES; i++) {
    char rel[64], err[512];
    snprintf(rel, sizeof rel, "traces/%s.trace", traces[i]);
    cap_profile_t *p = NULL;
    REQUIRE(cap_trace_load(cap_test_data(rel), &p, err, sizeof err) == 0);
    cap_profile_t *q = round_trip(p);
    CHECK(q != NULL);
    CHECK(cap_profile_equal(p, q));
    sigs[i] = cap_profile_signature(p);
    CHECK_EQ(cap_profile_signature(q), sigs[i]);
    cap_profile_destroy(q);
    cap_profile_destroy(p);
    for (size_t j = 0; j < i; j++)
      CHECK(sigs[j] != sigs[i]);
  }
}

/* Byte-identical too: the vendored files are written the way the writer
 * writes, so writing a loaded trace reproduces the file. */
static void test_write_reproduces_file(void) {
  const char *path = cap_test_data("traces/vgg16.trace");
  FILE *f = fopen(path, "rb");
  REQUIRE(f);
  char *orig = malloc(1 << 20);
  size_t olen = fread(orig, 1, 1 << 20, f);
  fclose(f);
  cap_profile_t *p = NULL;
  char err[512];
  CHECK(cap_trace_parse(orig, olen, "vgg16.trace", &p, err, sizeof err) == 0);
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  CHECK(m && p && cap_trace_write(m, p) == 0);
  if (m)
    fclose(m);
  CHECK_EQ(len, olen);
  CHECK(len == olen && memcmp(buf, orig, len) == 0);
  free(buf);
  free(orig);
  cap_profile_destroy(p);
}

static void test_load_errors(void) {
  char err[512];
  cap_profile_t *p = (cap_profile_t *)1;
  int rc = cap_trace_load("/nonexistent/x.trace", &p, err, sizeof err);
  CHECK_EQ(rc, CAP_ENOENT);
  CHECK(p == NULL);
  CHECK(strstr(err, "x.trace: cannot open") != NULL);
  rc = cap_trace_load(cap_test_data("traces"), &p, err, sizeof err);
  CHECK(rc < 0);
  CHECK(p == NULL);
  /* A tiny error buffer truncates, never overflows. */
  char tiny[8];
  memset(tiny, 'x', sizeof tiny);
  rc = cap_trace_parse("bad", 3, "t.trace", &p, tiny, 4);
  CHECK_EQ(rc, CAP_EPARSE);
  CHECK_EQ(strlen(tiny), 3);
  CHECK_EQ(tiny[5], 'x');
  CHECK_EQ(cap_trace_parse("bad", 3, "t.trace", &p, NULL, 0), CAP_EPARSE);
  CHECK_EQ(cap_trace_write(stdout, NULL), CAP_EINVAL);
}

/* One pass, no quadratic work: bert_large (280 KB) parses in a few ms.
 * The bound is loose (slow shared CI, sanitizers); it catches O(n^2). */
static void test_parse_speed(void) {
  const char *path = cap_test_data("traces/bert_large.trace");
  FILE *f = fopen(path, "rb");
  REQUIRE(f);
  char *buf = malloc(1 << 20);
  size_t len = fread(buf, 1, 1 << 20, f);
  fclose(f);
  struct timespec a, b;
  const int reps = 20;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < reps; i++) {
    cap_profile_t *p = NULL;
    char err[256];
    CHECK(cap_trace_parse(buf, len, "bert_large.trace", &p, err, sizeof err) ==
          0);
    cap_profile_destroy(p);
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  double ms = ((double)(b.tv_sec - a.tv_sec) * 1e3 +
               (double)(b.tv_nsec - a.tv_nsec) / 1e6) /
              reps;
  printf("  bert_large: %zu bytes parsed in %.2f ms\n", len, ms);
  CHECK(ms < 500.0);
  free(buf);
}

int main(void) {
  RUN_TEST(test_all_traces_load_within_3pct);
  RUN_TEST(test_lineage_and_flags);
  RUN_TEST(test_round_trip_all);
  RUN_TEST(test_write_reproduces_file);
  RUN_TEST(test_load_errors);
  RUN_TEST(test_parse_speed);
  return TEST_SUMMARY();
}
