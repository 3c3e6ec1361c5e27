/*
 * capuchin-sim: inspect a trace and (as the planners land) plan and simulate
 * it offline.
 *
 *   capuchin-sim --trace FILE --info [--json]
 *
 * Exit status: 0 on success, 1 when the trace cannot be read (the reader's
 * message on stderr), 64 (EX_USAGE) on bad arguments.
 *
 * Structure, for whoever adds options: every option is one row in
 * `options[]` and one case in parse_args() filling `sim_args_t`; main()
 * loads the trace once and dispatches on the mode (cmd_info() here).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin/profile.h"
#include "capuchin/trace.h"

#define EXIT_USAGE 64 /* sysexits.h EX_USAGE */

typedef struct sim_args {
  const char *trace; /* --trace FILE */
  bool info;         /* --info: print the trace summary */
  bool json;         /* --json: one JSON object instead of text */
} sim_args_t;

enum { OPT_TRACE = 256, OPT_INFO, OPT_JSON, OPT_HELP };

static const struct option options[] = {
    {"trace", required_argument, NULL, OPT_TRACE},
    {"info", no_argument, NULL, OPT_INFO},
    {"json", no_argument, NULL, OPT_JSON},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f) {
  fputs("usage: capuchin-sim --trace FILE --info [--json]\n"
        "\n"
        "  --trace FILE   a capuchin-trace 1 file (one measured iteration)\n"
        "  --info         print the trace summary: model, ops, tensors,\n"
        "                 persistent and peak bytes, iteration time, accesses\n"
        "  --json         print one JSON object instead of text\n"
        "  --help         print this help\n",
        f);
}

static int usage_error(const char *fmt, const char *arg) {
  fputs("capuchin-sim: ", stderr);
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  usage(stderr);
  return EXIT_USAGE;
}

/* 0 to go on, or the exit status to end with. */
static int parse_args(int argc, char **argv, sim_args_t *a) {
  opterr = 0; /* our messages, not getopt's */
  int c;
  while ((c = getopt_long(argc, argv, ":", options, NULL)) != -1) {
    switch (c) {
    case OPT_TRACE:
      a->trace = optarg;
      break;
    case OPT_INFO:
      a->info = true;
      break;
    case OPT_JSON:
      a->json = true;
      break;
    case OPT_HELP:
      usage(stdout);
      exit(0);
    case ':':
      return usage_error("option %s needs a value", argv[optind - 1]);
    default:
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  if (!a->trace)
    return usage_error("%s", "--trace FILE is required");
  if (!a->info)
    return usage_error("%s", "nothing to do: give --info");
  return 0;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }
static double ms(int64_t ns) { return (double)ns / 1e6; }

/* JSON string; meta values are printable ASCII, so only " and \ need it. */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fputc('\\', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

static int cmd_info(const sim_args_t *a, const cap_profile_t *p) {
  uint32_t kinds[3] = {0};
  for (uint32_t t = 0; t < p->n_tensors; t++)
    kinds[p->tensors[t].kind]++;
  uint32_t multi = cap_profile_multi_access_tensors(p);
  uint64_t transient = cap_profile_transient_peak(p);
  uint64_t sig = cap_profile_signature(p);
  if (a->json) {
    printf("{\"model\":");
    json_str(stdout, p->model);
    printf(",\"ops\":%" PRIu32 ",\"tensors\":%" PRIu32
           ",\"param_tensors\":%" PRIu32 ",\"input_tensors\":%" PRIu32
           ",\"activation_tensors\":%" PRIu32,
           p->n_ops, p->n_tensors, kinds[CAP_KIND_PARAM],
           kinds[CAP_KIND_INPUT], kinds[CAP_KIND_ACTIVATION]);
    printf(",\"persistent_bytes\":%" PRIu64 ",\"peak_bytes\":%" PRIu64
           ",\"peak_t_ns\":%" PRId64 ",\"transient_peak_bytes\":%" PRIu64,
           p->persistent_bytes, p->peak_bytes, p->peak_t_ns, transient);
    printf(",\"meta_peak_bytes\":%" PRIu64 ",\"resident_bytes\":%" PRIu64,
           p->meta_peak_bytes, p->resident_bytes);
    printf(",\"iter_ns\":%" PRId64 ",\"accesses\":%" PRIu32
           ",\"multi_access_tensors\":%" PRIu32 ",\"frees\":%" PRIu32
           ",\"signature\":\"%016" PRIx64 "\"}\n",
           p->iter_ns, p->n_accesses, multi, p->n_frees, sig);
  } else {
    printf("model                 %s\n", *p->model ? p->model : "(unnamed)");
    printf("ops                   %" PRIu32 "\n", p->n_ops);
    printf("tensors               %" PRIu32 " (%" PRIu32 " param, %" PRIu32
           " input, %" PRIu32 " activation)\n",
           p->n_tensors, kinds[CAP_KIND_PARAM], kinds[CAP_KIND_INPUT],
           kinds[CAP_KIND_ACTIVATION]);
    printf("persistent            %.1f MiB\n", mib(p->persistent_bytes));
    printf("peak                  %.1f MiB at %.3f ms\n", mib(p->peak_bytes),
           ms(p->peak_t_ns));
    printf("transient peak        %.1f MiB\n", mib(transient));
    if (p->meta_peak_bytes)
      printf("measured peak         %.1f MiB (curve %+.2f %%)\n",
             mib(p->meta_peak_bytes),
             ((double)p->peak_bytes - (double)p->meta_peak_bytes) * 100.0 /
                 (double)p->meta_peak_bytes);
    printf("iteration             %.3f ms\n", ms(p->iter_ns));
    printf("accesses              %" PRIu32 "\n", p->n_accesses);
    printf("multi-access tensors  %" PRIu32 "\n", multi);
    printf("signature             %016" PRIx64 "\n", sig);
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "capuchin-sim: cannot write output\n");
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  sim_args_t a = {0};
  int rc = parse_args(argc, argv, &a);
  if (rc)
    return rc;
  char err[1024];
  cap_profile_t *p = NULL;
  if (cap_trace_load(a.trace, &p, err, sizeof err) != 0) {
    fprintf(stderr, "capuchin-sim: %s\n", err);
    return 1;
  }
  rc = 1;
  if (a.info)
    rc = cmd_info(&a, p);
  cap_profile_destroy(p);
  return rc;
}
