/*
 * Internals of placement (placement.c and placement_skyline.c).
 */
#ifndef CAPUCHIN_PLACEMENT_INTERNAL_H
#define CAPUCHIN_PLACEMENT_INTERNAL_H

#include <stdint.h>

#include "capuchin/placement.h"

/* qsort comparator for int64_t. */
int cap__cmp_i64(const void *a, const void *b);

/* First k with t[k] >= x in ascending t[0..m) (m if none). */
uint32_t cap__lower_bound(const int64_t *t, uint32_t m, int64_t x);

/* Skyline placement (placement_skyline.c) of n valid intervals whose aligned
 * sizes are size[]: offset[i] for each, *arena, *shared (intervals that took
 * over another's block). s is CAP_PLACE_SKYLINE_LENGTH or
 * CAP_PLACE_SKYLINE_AREA. Returns 0 or CAP_ENOMEM. */
int cap__place_skyline(const cap_interval_t *iv, const uint64_t *size,
                       uint32_t n, cap_place_strategy_t s, uint64_t *offset,
                       uint64_t *arena, uint32_t *shared);

#endif /* CAPUCHIN_PLACEMENT_INTERNAL_H */
