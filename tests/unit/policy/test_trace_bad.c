/*
 * Malformed traces: every file in tests/data/bad_traces/ is rejected with
 * the line and reason its EXPECTED entry names ("<file> <line>:<reason>"),
 * and every file there has an entry. Then every prefix and many byte
 * mutations of a small valid trace are parsed: each either loads or fails
 * with a "name:line: " message, never crashing or leaking (run under
 * ASan in CI).
 */
#include <dirent.h>

#include "cap_test.h"
#include "capuchin/error.h"
#include "capuchin/trace.h"

#define MAX_CASES 256

typedef struct expect {
  char file[128];
  unsigned line;
  char reason[256];
  bool seen;
} expect_t;

static expect_t cases[MAX_CASES];
static int n_cases;

static void read_expected(void) {
  FILE *f = fopen(cap_test_data("bad_traces/EXPECTED"), "r");
  if (!f)
    return;
  char buf[512];
  while (fgets(buf, sizeof buf, f) && n_cases < MAX_CASES) {
    if (buf[0] == '#' || buf[0] == '\n')
      continue;
    buf[strcspn(buf, "\n")] = '\0';
    expect_t *e = &cases[n_cases];
    char *sp = strchr(buf, ' ');
    char *colon = sp ? strchr(sp, ':') : NULL;
    if (!sp || !colon) {
      fprintf(stderr, "EXPECTED: bad entry '%s'\n", buf);
      cap_test_failed_checks++;
      continue;
    }
    *sp = '\0';
    *colon = '\0';
    snprintf(e->file, sizeof e->file, "%.127s", buf);
    e->line = (unsigned)strtoul(sp + 1, NULL, 10);
    snprintf(e->reason, sizeof e->reason, "%.255s", colon + 1);
    n_cases++;
  }
  fclose(f);
}

static void test_corpus_fails_with_line_and_reason(void) {
  read_expected();
  CHECK(n_cases >= 15);
  for (int i = 0; i < n_cases; i++) {
    expect_t *e = &cases[i];
    char rel[192], err[1024], prefix[192];
    snprintf(rel, sizeof rel, "bad_traces/%.127s", e->file);
    cap_profile_t *p = (cap_profile_t *)&p; /* must be reset to NULL */
    int rc = cap_trace_load(cap_test_data(rel), &p, err, sizeof err);
    snprintf(prefix, sizeof prefix, "%.127s:%u: ", e->file, e->line);
    bool ok = rc < 0 && p == NULL && strncmp(err, prefix, strlen(prefix)) == 0 &&
              strstr(err + strlen(prefix), e->reason) != NULL;
    if (!ok) {
      fprintf(stderr, "%s: rc %d, got '%s', want '%s%s...'\n", e->file, rc,
              err, prefix, e->reason);
      cap_test_failed_checks++;
      if (rc == 0)
        cap_profile_destroy(p);
    }
    CHECK(rc != CAP_ENOENT);
  }
}

/* Every *.trace in the folder is in EXPECTED, so none goes unchecked. */
static void test_corpus_all_listed(void) {
  DIR *d = opendir(cap_test_data("bad_traces"));
  REQUIRE(d);
  struct dirent *de;
  int files = 0;
  while ((de = readdir(d))) {
    size_t n = strlen(de->d_name);
    if (n < 6 || strcmp(de->d_name + n - 6, ".trace") != 0)
      continue;
    files++;
    bool listed = false;
    for (int i = 0; i < n_cases; i++)
      if (strcmp(cases[i].file, de->d_name) == 0)
        listed = cases[i].seen = true;
    if (!listed) {
      fprintf(stderr, "bad_traces/%s has no EXPECTED entry\n", de->d_name);
      cap_test_failed_checks++;
    }
  }
  closedir(d);
  CHECK_EQ(files, n_cases);
}

static const char tiny[] =
    "capuchin-trace 1\n"
    "meta model=tiny peak_bytes=3000 resident_bytes=1000\n"
    "tensor 0 1000 param\n"
    "tensor 1 500 input\n"
    "tensor 2 800 activation\n"
    "tensor 3 400 activation\n"
    "op 0 0 10 aten.mm.default 1,0 2\n"
    "op 1 10 20 aten.relu_.default 2 2\n"
    "op 2 20 30 aten.sum.default 2 3\n"
    "free 30 2\n"
    "free 30 3\n";

/* The corpus's base trace is valid: each bad file differs in one place. */
static void test_base_is_valid(void) {
  cap_profile_t *p = NULL;
  char err[256];
  int rc = cap_trace_parse(tiny, sizeof tiny - 1, "tiny.trace", &p, err,
                           sizeof err);
  if (rc)
    fprintf(stderr, "%s\n", err);
  REQUIRE(rc == 0);
  CHECK_EQ(p->n_tensors, 4);
  CHECK_EQ(p->n_ops, 3);
  CHECK_EQ(p->persistent_bytes, 1500); /* tensors beat resident_bytes */
  CHECK_EQ(p->peak_bytes, 2700);
  CHECK_EQ(p->peak_t_ns, 20);
  cap_profile_destroy(p);
}

static void check_outcome(const char *buf, size_t len) {
  cap_profile_t *p = NULL;
  char err[256];
  int rc = cap_trace_parse(buf, len, "m.trace", &p, err, sizeof err);
  if (rc == 0) {
    CHECK(p && p->finished);
    cap_profile_destroy(p);
  } else {
    CHECK(p == NULL);
    CHECK(strncmp(err, "m.trace:", 8) == 0);
  }
}

static void test_prefixes_and_mutations(void) {
  size_t n = sizeof tiny - 1;
  /* Prefixes, copied so that reading past len would hit ASan's redzone. */
  for (size_t len = 0; len <= n; len++) {
    char *b = malloc(len ? len : 1);
    memcpy(b, tiny, len);
    check_outcome(b, len);
    free(b);
  }
  static const unsigned char subst[] = {0,   '\r', '\n', ' ', ',', '-', '9',
                                        '0', '_',  '=',  'x', 0xff, 0x80};
  char *b = malloc(n);
  for (size_t i = 0; i < n; i++) {
    for (size_t s = 0; s < sizeof subst; s++) {
      memcpy(b, tiny, n);
      b[i] = (char)subst[s];
      check_outcome(b, n);
    }
  }
  free(b);
}

int main(void) {
  RUN_TEST(test_corpus_fails_with_line_and_reason);
  RUN_TEST(test_corpus_all_listed);
  RUN_TEST(test_base_is_valid);
  RUN_TEST(test_prefixes_and_mutations);
  return TEST_SUMMARY();
}
