/*
 * libFuzzer driver for the trace reader: arbitrary bytes into
 * cap_trace_parse(). Any crash, leak, out-of-bounds read or undefined
 * behaviour is a finding. A trace that loads is also written back and
 * re-read, which must give an equal profile.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  cap_profile_t *p = NULL;
  char err[256];
  int rc = cap_trace_parse((const char *)data, size, "fuzz.trace", &p, err,
                           sizeof err);
  if (rc != 0) {
    if (p != NULL || strncmp(err, "fuzz.trace:", 11) != 0)
      abort();
    return 0;
  }
  cap_curve_t c;
  if (cap_curve_compute(p, &c) != 0 || c.peak_bytes != p->peak_bytes)
    abort();
  cap_curve_close(&c);
  (void)cap_profile_signature(p);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f) {
    int wrc = cap_trace_write(f, p);
    fclose(f);
    cap_profile_t *q = NULL;
    if (wrc != 0 || cap_trace_parse(buf, len, "rt.trace", &q, err, sizeof err))
      abort();
    if (!cap_profile_equal(p, q))
      abort();
    cap_profile_destroy(q);
    free(buf);
  }
  cap_profile_destroy(p);
  return 0;
}
