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
