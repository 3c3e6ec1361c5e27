/*
 * The placement region: one block of device memory, taken from the budgeted
 * allocator when a plan with a placement is installed, in which the plan's
 * blocks live at their planned offsets (docs/placement.md). The region
 * keeps the allocations live in it, sorted by offset, and hands out an
 * offset only when nothing live overlaps it: whatever the plan says, two
 * tensors never share bytes here.
 */
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

bool cap__region_contains(const cap__region_t *r, const void *p) {
  const uint8_t *q = p;
  return r->base && q >= r->base && q < r->base + r->bytes;
}

/* First live allocation whose offset is >= off. */
static uint32_t first_at_or_after(const cap__region_t *r, uint64_t off) {
  uint32_t lo = 0, hi = r->n_live;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (r->live[mid].off < off)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

int cap__region_take(cap__region_t *r, uint64_t off, uint64_t len, void **p,
                     void **busy) {
  *p = NULL;
  if (busy)
    *busy = NULL;
  if (!r->base || len == 0 || off > r->bytes || len > r->bytes - off)
    return CAP_ERANGE;
  uint32_t k = first_at_or_after(r, off);
  /* The one before may reach into [off, off + len); the ones from k on
   * start inside it if they start before its end. */
  uint32_t hit = UINT32_MAX;
  if (k > 0 && r->live[k - 1].off + r->live[k - 1].len > off)
    hit = k - 1;
  else if (k < r->n_live && r->live[k].off < off + len)
    hit = k;
  if (hit != UINT32_MAX) {
    if (busy)
      *busy = r->base + r->live[hit].off;
    return CAP_EAGAIN;
  }
  if (r->n_live == r->cap_live) {
    uint32_t cap = r->cap_live ? r->cap_live * 2 : 256;
    void *nl = realloc(r->live, (size_t)cap * sizeof *r->live);
    if (!nl)
      return CAP_ENOMEM;
    r->live = nl;
    r->cap_live = cap;
  }
  memmove(&r->live[k + 1], &r->live[k], (r->n_live - k) * sizeof *r->live);
  r->live[k].off = off;
  r->live[k].len = len;
  r->live[k].sharers = 0;
  r->n_live++;
  r->live_bytes += len;
  *p = r->base + off;
  return 0;
}

int cap__region_take_any(cap__region_t *r, uint64_t len, void **p) {
  uint64_t off = 0;
  for (uint32_t k = 0; k <= r->n_live; k++) {
    uint64_t end = k < r->n_live ? r->live[k].off : r->bytes;
    if (end >= off + len) {
      void *busy;
      return cap__region_take(r, off, len, p, &busy);
    }
    if (k < r->n_live)
      off = r->live[k].off + r->live[k].len;
  }
  return CAP_EBUDGET;
}

int cap__region_share(cap__region_t *r, uint64_t off, uint64_t len, void **p) {
  uint32_t k = first_at_or_after(r, off);
  if (!r->base || k == r->n_live || r->live[k].off != off || r->live[k].len < len)
    return CAP_ENOENT;
  r->live[k].sharers++;
  *p = r->base + off;
  return 0;
}

bool cap__region_give(cap__region_t *r, const void *p) {
  if (!cap__region_contains(r, p))
    return false;
  uint64_t off = (uint64_t)((const uint8_t *)p - r->base);
  uint32_t k = first_at_or_after(r, off);
  if (k < r->n_live && r->live[k].off == off && r->live[k].sharers) {
    r->live[k].sharers--; /* the other tensor still holds it */
  } else if (k < r->n_live && r->live[k].off == off) {
    r->live_bytes -= r->live[k].len;
    memmove(&r->live[k], &r->live[k + 1], (r->n_live - k - 1) * sizeof *r->live);
    r->n_live--;
  }
  return true;
}

int cap__region_find_window(const cap__region_t *r, uint64_t len,
                            uint32_t (*weight)(void *ctx, const void *ptr),
                            void *ctx, void **out, size_t max_out) {
  if (!r->base || len == 0 || len > r->bytes)
    return CAP_ENOENT;
  /* A cheapest window starts at the region's start or where a live
   * allocation ends (sliding it lower never takes in more). */
  uint64_t best_cost = UINT64_MAX, best_off = 0;
  for (uint32_t s = 0; s <= r->n_live; s++) {
    uint64_t off = s == 0 ? 0 : r->live[s - 1].off + r->live[s - 1].len;
    if (off > r->bytes - len)
      break;
    uint64_t cost = 0;
    uint32_t n = 0;
    for (uint32_t k = s; k < r->n_live && r->live[k].off < off + len; k++) {
      uint32_t w = r->live[k].sharers ? 0 : weight(ctx, r->base + r->live[k].off);
      if (w == 0 || ++n > max_out) {
        cost = UINT64_MAX;
        break;
      }
      cost += r->live[k].len * w;
    }
    if (cost < best_cost) {
      best_cost = cost;
      best_off = off;
    }
  }
  if (best_cost == UINT64_MAX)
    return CAP_ENOENT;
  int n = 0;
  for (uint32_t k = first_at_or_after(r, best_off);
       k < r->n_live && r->live[k].off < best_off + len; k++)
    out[n++] = r->base + r->live[k].off;
  return n;
}
