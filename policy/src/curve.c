/*
 * The memory curve of the unmanaged iteration (profile.h): persistent bytes
 * plus every freed activation from the start of its first access to its
 * free. One sort of 2N events, then one sweep.
 */
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin/profile.h"

typedef struct event {
  int64_t t_ns;
  int64_t delta; /* +bytes at birth, -bytes at free */
} event_t;

static int cmp_event(const void *a, const void *b) {
  const event_t *x = a, *y = b;
  if (x->t_ns != y->t_ns)
    return x->t_ns < y->t_ns ? -1 : 1;
  /* Frees first at equal times: memory released at t can be reused at t. */
  return (x->delta > y->delta) - (x->delta < y->delta);
}

int cap_curve_compute(const cap_profile_t *p, cap_curve_t *out) {
  if (!p || !out || !p->finished)
    return CAP_EINVAL;
  *out = (cap_curve_t){0};
  uint32_t n = 0;
  for (uint32_t t = 0; t < p->n_tensors; t++)
    n += !cap_tensor_is_resident(&p->tensors[t]);
  event_t *ev = malloc(((size_t)n * 2 + 1) * sizeof *ev);
  cap_curve_point_t *pts = malloc(((size_t)n * 2 + 1) * sizeof *pts);
  if (!ev || !pts) {
    free(ev);
    free(pts);
    return CAP_ENOMEM;
  }
  size_t ne = 0;
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    const cap_tensor_t *ct = &p->tensors[t];
    if (cap_tensor_is_resident(ct))
      continue;
    /* The builder only accepts a free of an accessed tensor. */
    int64_t born = p->ops[p->access_ops[ct->access_off]].start_ns;
    ev[ne++] = (event_t){born, (int64_t)ct->bytes};
    ev[ne++] = (event_t){ct->free_ns, -(int64_t)ct->bytes};
  }
  qsort(ev, ne, sizeof *ev, cmp_event);

  /* Sums stay below 2^63: the builder caps the total of all tensor bytes
   * and resident_bytes at 2^62 each. */
  int64_t cur = (int64_t)p->persistent_bytes;
  uint32_t np = 0;
  pts[np++] = (cap_curve_point_t){0, (uint64_t)cur};
  out->peak_bytes = (uint64_t)cur;
  out->peak_t_ns = 0;
  for (size_t i = 0; i < ne;) {
    int64_t t = ev[i].t_ns;
    for (; i < ne && ev[i].t_ns == t; i++)
      cur += ev[i].delta;
    if ((uint64_t)cur > out->peak_bytes) {
      out->peak_bytes = (uint64_t)cur;
      out->peak_t_ns = t;
    }
    if (pts[np - 1].t_ns == t)
      pts[np - 1].bytes = (uint64_t)cur;
    else if (pts[np - 1].bytes != (uint64_t)cur)
      pts[np++] = (cap_curve_point_t){t, (uint64_t)cur};
  }
  free(ev);
  out->points = pts;
  out->n_points = np;
  return 0;
}

void cap_curve_close(cap_curve_t *c) {
  if (!c)
    return;
  free(c->points);
  *c = (cap_curve_t){0};
}

uint64_t cap_profile_transient_peak(const cap_profile_t *p) {
  if (!p || !p->finished || p->peak_bytes < p->persistent_bytes)
    return 0;
  return p->peak_bytes - p->persistent_bytes;
}

uint64_t cap_profile_budget_pct(const cap_profile_t *p, double pct) {
  if (!p || !p->finished || !(pct >= 0))
    return p ? p->persistent_bytes : 0;
  double b = (double)p->persistent_bytes +
             pct / 100.0 * (double)cap_profile_transient_peak(p);
  if (b >= 18446744073709551615.0)
    return UINT64_MAX;
  return (uint64_t)b;
}
