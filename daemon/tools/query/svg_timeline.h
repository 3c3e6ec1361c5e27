/*
 * The memory timeline picture of `capuchin-query timeline PLAN --svg FILE`:
 * device memory over one iteration, unmanaged (the measured profile's curve)
 * against planned (the simulator's curve under the plan), with the budget as
 * a line, the persistent bytes as a floor, both peaks marked, MiB and ms
 * axes, a legend and a title. Plain SVG 1.1, no scripts or external fonts.
 */
#ifndef CAPUCHIN_DAEMON_SVG_TIMELINE_H
#define CAPUCHIN_DAEMON_SVG_TIMELINE_H

#include <stdint.h>
#include <stdio.h>

#include "capuchin/profile.h"

typedef struct cap_svg_timeline {
  const char *title;            /* "resnet50 — plan 3 (capuchin v2)" */
  const char *subtitle;         /* one line of numbers, may be NULL */
  const cap_curve_t *unmanaged; /* required */
  int64_t unmanaged_end_ns;     /* the unmanaged iteration's length */
  const cap_curve_t *planned;   /* NULL: draw the unmanaged curve only */
  int64_t planned_end_ns;
  uint64_t budget_bytes;     /* 0: no budget line */
  uint64_t persistent_bytes; /* 0: no floor line */
} cap_svg_timeline_t;

/* Write the SVG document to f. Returns 0, CAP_EINVAL or CAP_EIO. */
int cap_svg_timeline_write(FILE *f, const cap_svg_timeline_t *tl);

#endif /* CAPUCHIN_DAEMON_SVG_TIMELINE_H */
