/*
 * `capuchin-sim --trace FILE --info [--json]` as a user runs it: the JSON
 * is valid and agrees with the library, the text names its units, bad
 * arguments exit 64 with usage, a bad trace exits 1 with the reader's
 * message on stderr.
 */
#include <ctype.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cap_test.h"
#include "capuchin/trace.h"

#define SIM CAP_BIN_DIR "/capuchin-sim"

typedef struct run {
  int status; /* exit status, -1 if it did not exit */
  char out[8192];
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

/* Runs capuchin-sim with args (a shell-quoted string). */
static void run(const char *args, run_t *r) {
  char out_path[] = "/tmp/cap_cli_out_XXXXXX";
  char err_path[] = "/tmp/cap_cli_err_XXXXXX";
  int fo = mkstemp(out_path), fe = mkstemp(err_path);
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", SIM, args, out_path,
           err_path);
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

/* --- A small strict JSON checker (RFC 8259 values) ----------------------- */
static const char *ws(const char *s) {
  while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
    s++;
  return s;
}
static const char *value(const char *s, int depth);
static const char *string(const char *s) {
  if (*s != '"')
    return NULL;
  for (s++; *s != '"'; s++) {
    if ((unsigned char)*s < 0x20)
      return NULL;
    if (*s == '\\') {
      s++;
      if (*s == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!isxdigit((unsigned char)s[i]))
            return NULL;
        s += 4;
      } else if (!strchr("\"\\/bfnrt", *s) || !*s) {
        return NULL;
      }
    }
  }
  return s + 1;
}
static const char *number(const char *s) {
  if (*s == '-')
    s++;
  if (*s == '0')
    s++;
  else if (isdigit((unsigned char)*s))
    while (isdigit((unsigned char)*s))
      s++;
  else
    return NULL;
  if (*s == '.') {
    s++;
    if (!isdigit((unsigned char)*s))
      return NULL;
    while (isdigit((unsigned char)*s))
      s++;
  }
  if (*s == 'e' || *s == 'E') {
    s++;
    if (*s == '+' || *s == '-')
      s++;
    if (!isdigit((unsigned char)*s))
      return NULL;
    while (isdigit((unsigned char)*s))
      s++;
  }
  return s;
}
static const char *value(const char *s, int depth) {
  if (depth > 32)
    return NULL;
  s = ws(s);
  if (*s == '{' || *s == '[') {
    char close = *s == '{' ? '}' : ']';
    bool obj = *s == '{';
    s = ws(s + 1);
    if (*s == close)
      return s + 1;
    for (;;) {
      if (obj) {
        s = string(ws(s));
        if (!s || *(s = ws(s)) != ':')
          return NULL;
        s++;
      }
      s = value(s, depth + 1);
      if (!s)
        return NULL;
      s = ws(s);
      if (*s == close)
        return s + 1;
      if (*s != ',')
        return NULL;
      s++;
    }
  }
  if (*s == '"')
    return string(s);
  if (!strncmp(s, "true", 4))
    return s + 4;
  if (!strncmp(s, "false", 5))
    return s + 5;
  if (!strncmp(s, "null", 4))
    return s + 4;
  return number(s);
}
static bool json_valid(const char *s) {
  s = value(s, 0);
  return s && *ws(s) == '\0';
}
/* Integer value of "key": in a flat object; -1 when absent. */
static long long json_int(const char *s, const char *key) {
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(s, pat);
  return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

static void test_json_matches_library(void) {
  const char *trace = cap_test_data("traces/bert_large.trace");
  char args[4200];
  snprintf(args, sizeof args, "--trace '%s' --info --json", trace);
  run_t r;
  run(args, &r);
  CHECK_EQ(r.status, 0);
  CHECK(json_valid(r.out));
  if (!json_valid(r.out))
    fprintf(stderr, "not JSON: %s\n", r.out);
  cap_profile_t *p = NULL;
  char err[256];
  REQUIRE(cap_trace_load(trace, &p, err, sizeof err) == 0);
  CHECK_EQ(json_int(r.out, "peak_bytes"), p->peak_bytes);
  CHECK_EQ(json_int(r.out, "persistent_bytes"), p->persistent_bytes);
  CHECK_EQ(json_int(r.out, "iter_ns"), p->iter_ns);
  CHECK_EQ(json_int(r.out, "ops"), p->n_ops);
  CHECK_EQ(json_int(r.out, "tensors"), p->n_tensors);
  CHECK_EQ(json_int(r.out, "accesses"), p->n_accesses);
  CHECK_EQ(json_int(r.out, "multi_access_tensors"),
           cap_profile_multi_access_tensors(p));
  CHECK_EQ(json_int(r.out, "peak_t_ns"), p->peak_t_ns);
  CHECK(strstr(r.out, "\"model\":\"bert_large\"") != NULL);
  CHECK_EQ(r.err[0], '\0');
  cap_profile_destroy(p);
  CHECK(json_valid("{\"a\":[1,2.5e3,\"x\\n\"],\"b\":{}}"));
  CHECK(!json_valid("{\"a\":1,}"));
  CHECK(!json_valid("{\"a\":1} x"));
}

static void test_text(void) {
  char args[4200];
  snprintf(args, sizeof args, "--info --trace '%s'",
           cap_test_data("traces/resnet50.trace"));
  run_t r;
  run(args, &r);
  CHECK_EQ(r.status, 0);
  CHECK(strstr(r.out, "resnet50") != NULL);
  CHECK(strstr(r.out, "MiB") != NULL);
  CHECK(strstr(r.out, " ms") != NULL);
  CHECK(strstr(r.out, "ops                   685\n") != NULL);
  CHECK(strstr(r.out, "tensors               1039 ") != NULL);
  CHECK(strstr(r.out, "multi-access tensors") != NULL);
}

static void test_bad_arguments_exit_64(void) {
  static const char *const bad[] = {
      "",
      "--info",
      "--trace",
      "--bogus --info --trace x",
      "--trace x --info extra",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    run_t r;
    run(bad[i], &r);
    if (r.status != 64)
      fprintf(stderr, "args '%s': exit %d\n", bad[i], r.status);
    CHECK_EQ(r.status, 64);
    CHECK(strstr(r.err, "usage: capuchin-sim") != NULL);
    CHECK_EQ(r.out[0], '\0');
  }
  run_t r;
  run("--help", &r);
  CHECK_EQ(r.status, 0);
  CHECK(strstr(r.out, "usage: capuchin-sim") != NULL);
}

static void test_bad_trace_exits_1(void) {
  char args[4200];
  snprintf(args, sizeof args, "--trace '%s' --info --json",
           cap_test_data("bad_traces/unknown_tensor.trace"));
  run_t r;
  run(args, &r);
  CHECK_EQ(r.status, 1);
  CHECK(strstr(r.err, "unknown_tensor.trace:7: op 0: unknown tensor id 99999") !=
        NULL);
  CHECK_EQ(r.out[0], '\0');
  run("--trace /nonexistent/none.trace --info", &r);
  CHECK_EQ(r.status, 1);
  CHECK(strstr(r.err, "none.trace: cannot open") != NULL);
}

int main(void) {
  if (access(SIM, X_OK) != 0) {
    fprintf(stderr, "%s not built\n", SIM);
    return 1;
  }
  RUN_TEST(test_json_matches_library);
  RUN_TEST(test_text);
  RUN_TEST(test_bad_arguments_exit_64);
  RUN_TEST(test_bad_trace_exits_1);
  return TEST_SUMMARY();
}
