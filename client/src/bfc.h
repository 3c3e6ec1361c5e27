/*
 * Budgeted best-fit-with-coalescing allocator (TensorFlow's BFC design).
 *
 * Memory comes in arenas from a source (the backend's device memory, its
 * pinned host memory, or fake addresses in tests). Each arena is a list of
 * chunks in address order; a chunk is in use or free. Free chunks sit in
 * bins by size class: bin i holds sizes in [256 << i, 256 << (i+1)), the last
 * bin everything larger; each bin is ordered by (size, address).
 *
 *   alloc  round up to 256 bytes; take the smallest free chunk that fits
 *          (ties: lowest address), searching from the request's bin upwards;
 *          split off the remainder as a free chunk when it is at least
 *          split_min_bytes; if nothing fits, grow by a new arena (the next
 *          arena size doubles, at least the request, at most what the arena
 *          limit leaves; a failing source is retried with smaller sizes
 *          down to the request).
 *   free   mark the chunk free and merge it with free neighbours in the same
 *          arena.
 *
 * Budget. `budget_bytes` caps the bytes in use (sum of allocated chunk sizes,
 * i.e. requests rounded to 256 plus any unsplit remainder); `arena_limit_bytes`
 * caps the arenas taken from the source (default: the budget, rounded up to
 * 256). An allocation that would pass either, or that finds no free chunk and
 * cannot grow (fragmentation), fails with CAP_EBUDGET: the caller may evict
 * tensors and retry. A source that fails returns its error (CAP_ENOMEM,
 * CAP_EDEVICE) when no smaller arena works either.
 *
 * Threads. Every function takes an internal mutex: any thread may call any
 * function, except destroy.
 */
#ifndef CAP_CLIENT_BFC_H
#define CAP_CLIENT_BFC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capuchin/error.h"

#define CAP_BFC_GRANULE 256u
#define CAP_BFC_BINS 21 /* 256 B .. 256 MiB, last bin unbounded */

/* Where arenas come from. alloc returns 0 and a base aligned to 256 bytes, or
 * a negative CAP_E*; free gives an arena back. The addresses are never
 * dereferenced by the allocator, so tests may hand out fake ones. */
typedef struct cap_bfc_source {
  int (*alloc)(void *ctx, size_t bytes, void **base);
  void (*free)(void *ctx, void *base, size_t bytes);
  void *ctx;
} cap_bfc_source_t;

typedef struct cap_bfc_config {
  uint64_t budget_bytes;        /* cap on bytes in use; 0: unlimited */
  uint64_t arena_limit_bytes;   /* cap on arena bytes; 0: budget (or
                                   unlimited when the budget is) */
  uint64_t initial_arena_bytes; /* first arena (default 64 MiB); later ones
                                   double */
  uint64_t max_arena_bytes;     /* largest arena (default 1 GiB; a single
                                   bigger request gets its own arena) */
  uint64_t split_min_bytes;     /* split when the remainder is at least this
                                   (default 256: always, so in-use bytes are
                                   exactly the rounded requests) */
} cap_bfc_config_t;

typedef struct cap_bfc_stats {
  uint64_t in_use_bytes;        /* allocated chunks */
  uint64_t peak_in_use_bytes;   /* since create or cap_bfc_reset_peak */
  uint64_t requested_bytes;     /* sum of live requests before rounding */
  uint64_t arena_bytes;         /* taken from the source */
  uint64_t free_bytes;          /* arena_bytes - in_use_bytes */
  uint64_t largest_free_bytes;  /* largest free chunk */
  double fragmentation;         /* 1 - largest_free / free_bytes (0 when
                                   nothing is free) */
  uint64_t budget_bytes, arena_limit_bytes;
  uint32_t arenas;
  uint64_t live_allocs;
  uint64_t allocs, frees;       /* since create */
  uint64_t budget_failures;     /* CAP_EBUDGET returned */
  uint64_t fragmentation_failures; /* of those: in-use budget had room but
                                      no chunk fit and arenas could not grow */
  uint64_t source_failures;     /* arena requests the source refused */
  uint64_t overflow_arenas;     /* arenas taken past the arena limit */
  uint64_t overflow_bytes;      /* ... and their bytes */
} cap_bfc_stats_t;

typedef struct cap_bfc cap_bfc_t;

/* Fill cfg with the defaults above (budget 0: unlimited). */
void cap_bfc_config_init(cap_bfc_config_t *cfg);

/* Create an allocator over `src` (copied). Takes no arena until the first
 * allocation. CAP_EINVAL for a NULL source, CAP_ENOMEM. */
int cap_bfc_create(const cap_bfc_config_t *cfg, const cap_bfc_source_t *src,
                   cap_bfc_t **out);

/* Give every arena back to the source and free the allocator; outstanding
 * allocations become invalid. NULL is a no-op. */
void cap_bfc_destroy(cap_bfc_t *a);

/* Allocate `bytes` (> 0), 256-byte aligned. 0 and *ptr, or CAP_EINVAL,
 * CAP_EBUDGET (see "Budget"), or the source's error. */
int cap_bfc_alloc(cap_bfc_t *a, size_t bytes, void **ptr);

/* Free an allocation. CAP_EINVAL if ptr is not a live allocation of this
 * allocator (nothing changes then). NULL is a no-op returning 0. */
int cap_bfc_free(cap_bfc_t *a, void *ptr);

/* Size of the chunk behind a live allocation (its rounded size), 0 if ptr is
 * not one. */
size_t cap_bfc_chunk_bytes(cap_bfc_t *a, const void *ptr);

/* True if an allocation of `bytes` would succeed now without growing past
 * the budget (it may still need a new arena from the source). */
bool cap_bfc_fits(cap_bfc_t *a, size_t bytes);

/* Fragmentation relief. When the bytes in use leave room for `bytes` but no
 * free chunk is that large, freeing a few allocations that sit between free
 * chunks makes one. This finds the run of neighbouring chunks in one arena
 * whose in-use chunks, once freed, merge with the free ones around them
 * into a chunk of at least `bytes` at the least cost: the sum over its
 * in-use chunks of bytes x weight(ctx, ptr), where weight 0 means the chunk
 * may not move. weight is called with the allocator's mutex held: it must
 * not call back into the allocator. Writes the run's allocations to out (at
 * most max_out) and returns their count (0: a free chunk fits already), or
 * CAP_ENOENT when no run qualifies or it has more than max_out
 * allocations. */
int cap_bfc_find_window(cap_bfc_t *a, size_t bytes,
                        uint32_t (*weight)(void *ctx, const void *ptr),
                        void *ctx, void **out, size_t max_out);

/* As cap_bfc_alloc, but when no free chunk fits and the arena limit leaves
 * no room, take one more arena of just the request past the limit (the
 * bytes in use still keep to the budget). For an allocation that must not
 * fail for fragmentation alone, after everything movable was moved.
 * `unused_bytes` of what is in use hold nothing (the free room of a
 * sub-allocator inside one allocation, the client's placement region): the
 * budget does not count them. */
int cap_bfc_alloc_beyond_limit(cap_bfc_t *a, size_t bytes, uint64_t unused_bytes,
                               void **ptr);

/* Change the budget (and the arena limit with it unless one was configured).
 * Lowering it below the bytes in use is allowed: allocations fail until
 * enough is freed. Arenas are not given back; see cap_bfc_trim. */
void cap_bfc_set_budget(cap_bfc_t *a, uint64_t budget_bytes);

/* Give every completely free arena back to the source; returns bytes freed. */
uint64_t cap_bfc_trim(cap_bfc_t *a);

/* The live allocations of the arena with the fewest bytes in use, written
 * to out in address order: what must be freed before cap_bfc_trim can give
 * that arena back. Returns their count (0: the arena is free already), or
 * CAP_ENOENT when there is no arena or it holds more than max_out. */
int cap_bfc_emptiest_arena(cap_bfc_t *a, void **out, size_t max_out);

void cap_bfc_stats(cap_bfc_t *a, cap_bfc_stats_t *st);
void cap_bfc_reset_peak(cap_bfc_t *a);

/* Check every internal invariant (chunk lists tile each arena, neighbours
 * never both free, bins hold exactly the free chunks in order, counters
 * match). 0 or CAP_ECORRUPT; for tests. */
int cap_bfc_validate(cap_bfc_t *a);

#endif /* CAP_CLIENT_BFC_H */
