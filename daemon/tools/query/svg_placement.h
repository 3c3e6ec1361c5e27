/*
 * The placement picture of `capuchin-query timeline PLAN --placement --svg
 * FILE`: the arena's addresses over one iteration, each block of the plan a
 * rectangle from its allocation to its release, at its offset, coloured by
 * how the tensor got there (first touch, prefetched, recomputed, a list's
 * temporary, an evicted weight), with the arena's size and the room the
 * budget leaves it as lines: the picture people draw for static memory
 * planning, here for a whole training iteration.
 */
#ifndef CAPUCHIN_DAEMON_SVG_PLACEMENT_H
#define CAPUCHIN_DAEMON_SVG_PLACEMENT_H

#include <stdint.h>
#include <stdio.h>

#include "capuchin/plan.h"

typedef struct cap_svg_placement {
  const char *title;
  const char *subtitle;      /* may be NULL */
  const cap_block_t *blocks; /* required, n > 0 */
  uint32_t n;
  uint64_t arena_bytes;
  uint64_t room_bytes;       /* the budget less what stays outside the arena;
                                0: no line */
  int64_t end_ns;            /* the iteration's length */
} cap_svg_placement_t;

/* Write the SVG document to f. Returns 0, CAP_EINVAL or CAP_EIO. */
int cap_svg_placement_write(FILE *f, const cap_svg_placement_t *pl);

#endif /* CAPUCHIN_DAEMON_SVG_PLACEMENT_H */
