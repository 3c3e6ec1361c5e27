/*
 * Shared GPU budgets: how the memory of one device is split between the jobs
 * on it when their requests add up to more than it has. Each job keeps at
 * least its persistent bytes (below that no plan can exist); the rest is
 * shared in proportion to the requests (water-filling: a job whose
 * proportional share falls below its floor is pinned at the floor and the
 * others share what remains).
 */
#include <stdlib.h>

#include "daemon_internal.h"

bool cap__budget_shares(const uint64_t *req, const uint64_t *floor_,
                        uint32_t n, uint64_t capacity, uint64_t *out) {
  unsigned __int128 total = 0;
  for (uint32_t i = 0; i < n; i++)
    total += req[i];
  if (total <= capacity) {
    for (uint32_t i = 0; i < n; i++)
      out[i] = req[i];
    return false;
  }
  bool *pinned = calloc(n ? n : 1, sizeof *pinned);
  if (!pinned) { /* degrade: plain proportional shares */
    for (uint32_t i = 0; i < n; i++)
      out[i] = (uint64_t)((unsigned __int128)capacity * req[i] / total);
    return true;
  }
  for (;;) {
    unsigned __int128 pinned_bytes = 0, free_req = 0;
    for (uint32_t i = 0; i < n; i++) {
      uint64_t fl = floor_[i] < req[i] ? floor_[i] : req[i];
      if (pinned[i])
        pinned_bytes += fl;
      else
        free_req += req[i];
    }
    unsigned __int128 left =
        pinned_bytes < capacity ? capacity - pinned_bytes : 0;
    bool changed = false;
    for (uint32_t i = 0; i < n; i++) {
      if (pinned[i])
        continue;
      uint64_t fl = floor_[i] < req[i] ? floor_[i] : req[i];
      uint64_t share =
          free_req ? (uint64_t)(left * req[i] / free_req) : 0;
      if (share > req[i])
        share = req[i];
      if (share < fl) {
        pinned[i] = true;
        changed = true;
      }
      out[i] = share;
    }
    if (!changed)
      break;
  }
  for (uint32_t i = 0; i < n; i++)
    if (pinned[i])
      out[i] = floor_[i] < req[i] ? floor_[i] : req[i];
  free(pinned);
  return true;
}

/* Two honest reports of one device agree within a quarter: the same card
 * reports the same total, and a MIG slice or a driver's reserve differs by
 * far less than a lie that matters. */
static bool near(uint64_t a, uint64_t b) {
  uint64_t lo = a < b ? a : b, hi = a < b ? b : a;
  return (unsigned __int128)hi * 4 <= (unsigned __int128)lo * 5;
}

uint64_t cap__budget_capacity(const uint64_t *claim, uint32_t n,
                              bool *ignored) {
  uint32_t best = UINT32_MAX, best_support = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (!claim[i])
      continue;
    uint32_t support = 0;
    for (uint32_t j = 0; j < n; j++)
      support += claim[j] && near(claim[i], claim[j]);
    if (support > best_support) { /* ties: the older session's */
      best = i;
      best_support = support;
    }
  }
  uint64_t capacity = 0;
  for (uint32_t j = 0; j < n; j++) {
    bool agrees = best != UINT32_MAX && claim[j] && near(claim[best], claim[j]);
    if (ignored)
      ignored[j] = claim[j] && !agrees;
    if (agrees && claim[j] > capacity)
      capacity = claim[j];
  }
  return capacity;
}
