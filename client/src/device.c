/*
 * The client's device layer: the executor's view of a device backend
 * (backend.h) and its memory, budgeted by BFC allocators (bfc.h): one over
 * device arenas enforcing the job's budget, one over pinned host arenas
 * (the pool swaps land in, allocated once and reused).
 *
 * Copies: a swap-out runs on the D2H stream after an event recorded on the
 * compute stream (so it reads what the op wrote); a swap-in on the H2D
 * stream. Each copy gets its own completion event recorded on its stream.
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bfc.h"
#include "client_impl.h"
#include "faultsim.h"

struct cap__dev {
  cap_backend_t *b;
  const cap_backend_info_t *info;
  cap_bfc_t *dev_bfc;
  cap_bfc_t *host_bfc;
  cap_event_t *compute_ev; /* re-recorded before each swap-out */
  bool sim;
  bool verify_full;
  uint32_t fault_alloc_nth; /* fail the nth allocation from now (tests) */
  bool fault_alloc_sticky;  /* ... and every one after it */
  bool no_arena;            /* the framework owns tensor memory (model 2):
                               take no budget-sized arena up front */
  uint64_t framework_bytes; /* device bytes of framework-owned tensors the
                               client tracks (counted in in_use) */
  cap__region_t region;     /* the installed plan's placement (region.c) */
  uint64_t copies[CAP_STREAM_COUNT]; /* copies issued on each stream */
};

/* The executor's event: the backend event recorded after the copy. */
struct cap__ev {
  cap_event_t *ev;
  cap_stream_t stream; /* the copy's */
  uint64_t seq;        /* its place among its stream's copies, from 1 */
};

int cap__dev_open(const cap_client_config_t *cfg, cap__dev_t **out,
                  cap__dev_info_t *info, char *err, size_t err_len) {
  cap_backend_config_t bc;
  cap_backend_config_init(&bc);
  bc.name = cfg->backend;
  bc.device_index = cfg->device_index;
  bc.compute_stream = cfg->compute_stream;
  bc.sim_device_bytes = cfg->sim_device_bytes;
  bc.time_scale = cfg->time_scale > 0 ? cfg->time_scale : 1.0;
  bc.sim_h2d_gbps = cfg->sim_h2d_gbps;
  bc.sim_d2h_gbps = cfg->sim_d2h_gbps;
  bc.sim_duplex_gbps = cfg->sim_duplex_gbps;
  bc.sim_device_uuid = cfg->sim_device_uuid;
  cap__dev_t *d = calloc(1, sizeof *d);
  if (!d)
    return CAP_ENOMEM;
  d->no_arena = cfg->framework_memory;
  int rc = cap_backend_create(&bc, &d->b);
  if (rc < 0) {
    snprintf(err, err_len, "backend %s: %s",
             cfg->backend ? cfg->backend : "auto", cap_strerror(rc));
    goto out_free;
  }
  d->info = cap_backend_info(d->b);
  d->sim = strcmp(d->info->backend, "sim") == 0;
  const char *v = getenv("CAPUCHIN_VERIFY");
  d->verify_full = v && strcmp(v, "full") == 0;

  cap_bfc_config_t dc;
  cap_bfc_config_init(&dc);
  dc.budget_bytes = d->info->total_bytes;
  cap_bfc_source_t src;
  cap_backend_device_source(d->b, &src);
  rc = cap_bfc_create(&dc, &src, &d->dev_bfc);
  if (rc < 0)
    goto out_backend;
  cap_bfc_config_t hc;
  cap_bfc_config_init(&hc);
  hc.budget_bytes = cfg->host_pool_cap_bytes; /* 0: unlimited */
  cap_bfc_source_t hsrc;
  cap_backend_host_source(d->b, &hsrc);
  rc = cap_bfc_create(&hc, &hsrc, &d->host_bfc);
  if (rc < 0)
    goto out_dev_bfc;
  rc = cap_backend_event_create(d->b, &d->compute_ev);
  if (rc < 0)
    goto out_host_bfc;
  if (cfg->host_pool_bytes) {
    /* One arena for the pool, touched once; best effort. */
    void *p = NULL;
    if (cap_bfc_alloc(d->host_bfc, cfg->host_pool_bytes, &p) == 0) {
      memset(p, 0, cfg->host_pool_bytes);
      cap_bfc_free(d->host_bfc, p);
    }
  }

  *out = d;
  snprintf(info->backend, sizeof info->backend, "%s", d->info->backend);
  snprintf(info->device_name, sizeof info->device_name, "%s",
           d->info->device_name);
  snprintf(info->device_uuid, sizeof info->device_uuid, "%s",
           d->info->device_uuid);
  info->device_index = d->info->device_index;
  info->total_bytes = d->info->total_bytes;
  info->h2d_gbps = d->info->h2d_gbps;
  info->d2h_gbps = d->info->d2h_gbps;
  info->duplex_gbps = d->info->duplex_gbps;
  return 0;
out_host_bfc:
  cap_bfc_destroy(d->host_bfc);
out_dev_bfc:
  cap_bfc_destroy(d->dev_bfc);
out_backend:
  cap_backend_destroy(d->b);
out_free:
  free(d);
  return rc;
}

void cap__dev_close(cap__dev_t *d) {
  if (!d)
    return;
  for (int s = 0; s < CAP_STREAM_COUNT; s++)
    cap_backend_stream_synchronize(d->b, (cap_stream_t)s);
  cap_backend_event_destroy(d->b, d->compute_ev);
  free(d->region.live); /* its memory goes with the allocator's arenas */
  cap_bfc_destroy(d->host_bfc);
  cap_bfc_destroy(d->dev_bfc);
  cap_backend_destroy(d->b);
  free(d);
}

int cap__dev_set_budget(cap__dev_t *d, uint64_t bytes) {
  bool whole = !bytes || bytes >= d->info->total_bytes;
  if (whole)
    bytes = d->info->total_bytes;
  /* Rounded down to the granule, so that the arenas, which the budget also
   * limits (rounded up), never pass it: a cut is confirmed by the bytes held. */
  uint64_t granules = bytes & ~(uint64_t)(CAP_BFC_GRANULE - 1);
  cap_bfc_set_budget(d->dev_bfc, granules ? granules : CAP_BFC_GRANULE);
  /* Take the budget's arena now and touch it once, so that the measured
   * iteration's op times are not inflated by first-touch page faults (sim)
   * or cudaMalloc calls (cuda). Best effort: failure leaves growth lazy. */
  if (!whole && !d->no_arena) {
    cap_bfc_stats_t st;
    cap_bfc_stats(d->dev_bfc, &st);
    if (st.arena_bytes < bytes && bytes - st.in_use_bytes > (64u << 20)) {
      uint64_t want = bytes - st.in_use_bytes - CAP_BFC_GRANULE;
      void *p = NULL;
      if (cap_bfc_alloc(d->dev_bfc, want, &p) == 0) {
        cap_backend_memset(d->b, p, 0, want);
        cap_backend_stream_synchronize(d->b, CAP_STREAM_COMPUTE);
        cap_bfc_free(d->dev_bfc, p);
      }
    }
  }
  return 0;
}

void cap__dev_fault_copy(cap__dev_t *d, uint32_t nth) {
  (void)d;
  cap_faultsim_arm(CAP_FAULT_COPY_ASYNC, nth, 1);
}

void cap__dev_fault_alloc(cap__dev_t *d, uint32_t nth, bool sticky) {
  d->fault_alloc_nth = nth;
  d->fault_alloc_sticky = sticky;
}

int cap__dev_alloc(cap__dev_t *d, uint64_t bytes, void **p) {
  if (d->fault_alloc_nth && --d->fault_alloc_nth == 0) {
    if (d->fault_alloc_sticky)
      d->fault_alloc_nth = 1;
    return CAP_ENOMEM; /* injected */
  }
  /* The budget covers framework-owned tensors too (both models at once). */
  if (d->framework_bytes && !cap__dev_budget_has_room(d, bytes))
    return CAP_EBUDGET;
  return cap_bfc_alloc(d->dev_bfc, bytes ? bytes : 1, p);
}

static uint64_t granule_up(uint64_t bytes) {
  return (bytes + CAP_BFC_GRANULE - 1) & ~(uint64_t)(CAP_BFC_GRANULE - 1);
}

/* The region is one allocation of the allocator, but what the job uses is
 * what lives in it: its free room counts as an arena's free chunks do. */
static uint64_t region_free(const cap__dev_t *d) {
  return d->region.base ? d->region.bytes - d->region.live_bytes : 0;
}

/* From one look at the allocator (st): the bytes tensors use, framework-
 * owned ones included and the region's free room not, and whether they
 * leave room for `bytes` more. */
static uint64_t tensor_bytes(const cap__dev_t *d, const cap_bfc_stats_t *st) {
  return st->in_use_bytes - region_free(d) + d->framework_bytes;
}

static bool use_has_room(const cap__dev_t *d, const cap_bfc_stats_t *st,
                         uint64_t bytes) {
  return !st->budget_bytes || tensor_bytes(d, st) + granule_up(bytes) <= st->budget_bytes;
}

int cap__dev_alloc_beyond_arena(cap__dev_t *d, uint64_t bytes, void **p) {
  return cap_bfc_alloc_beyond_limit(d->dev_bfc, bytes ? bytes : 1,
                                    region_free(d), p);
}

void cap__dev_free(cap__dev_t *d, void *p) {
  if (p && !cap__region_give(&d->region, p))
    cap_bfc_free(d->dev_bfc, p);
}

int cap__dev_region_open(cap__dev_t *d, uint64_t bytes) {
  if (d->region.base && d->region.bytes >= bytes)
    return 0;
  if (d->region.base && d->region.n_live)
    return CAP_ESTATE;
  cap__dev_region_close(d);
  void *p = NULL;
  int rc = cap__dev_alloc(d, bytes, &p);
  if (rc == CAP_EBUDGET) { /* empty arenas may hold the room: give them back */
    cap_bfc_trim(d->dev_bfc);
    rc = cap__dev_alloc(d, bytes, &p);
  }
  if (rc < 0)
    return rc;
  d->region.base = p;
  d->region.bytes = bytes;
  return 0;
}

void cap__dev_region_close(cap__dev_t *d) {
  if (!d->region.base || d->region.n_live)
    return;
  cap_bfc_free(d->dev_bfc, d->region.base);
  free(d->region.live);
  memset(&d->region, 0, sizeof d->region);
}

/* The region's room is part of the budget, counted whole with the region;
 * only an allocation past the arenas (cap__dev_alloc_beyond_arena) can have
 * borrowed it, and only then, with the allocator over the budget, does the
 * room left for tensors decide. (Checking that always would refuse blocks
 * the plan sized to the byte for the allocator's rounding of the rest.) */
static bool region_room_lent(cap__dev_t *d, uint64_t len) {
  cap_bfc_stats_t st;
  cap_bfc_stats(d->dev_bfc, &st);
  return st.budget_bytes && st.in_use_bytes + d->framework_bytes > st.budget_bytes &&
         !use_has_room(d, &st, len);
}

int cap__dev_region_take(cap__dev_t *d, uint64_t off, uint64_t len, void **p,
                         void **busy) {
  if (busy)
    *busy = NULL;
  if (region_room_lent(d, len))
    return CAP_EBUDGET;
  return cap__region_take(&d->region, off, len, p, busy);
}

bool cap__dev_has_region(cap__dev_t *d) { return d->region.base != NULL; }

int cap__dev_region_take_any(cap__dev_t *d, uint64_t len, void **p) {
  if (!d->region.base)
    return CAP_EBUDGET;
  len = granule_up(len);
  if (region_room_lent(d, len))
    return CAP_EBUDGET;
  return cap__region_take_any(&d->region, len ? len : CAP_BFC_GRANULE, p);
}

bool cap__dev_in_region(cap__dev_t *d, const void *p) {
  return cap__region_contains(&d->region, p);
}

int cap__dev_region_share(cap__dev_t *d, uint64_t off, uint64_t len, void **p) {
  return cap__region_share(&d->region, off, len, p);
}

uint64_t cap__dev_in_use(cap__dev_t *d) {
  cap_bfc_stats_t st;
  cap_bfc_stats(d->dev_bfc, &st);
  return tensor_bytes(d, &st);
}

bool cap__dev_owns(cap__dev_t *d, const void *p) {
  return cap__region_contains(&d->region, p) ||
         cap_bfc_chunk_bytes(d->dev_bfc, p) != 0;
}

void cap__dev_track_framework(cap__dev_t *d, uint64_t bytes, bool add) {
  if (add)
    d->framework_bytes += bytes;
  else
    d->framework_bytes -= bytes <= d->framework_bytes ? bytes : d->framework_bytes;
}

uint64_t cap__dev_held(cap__dev_t *d) {
  cap_bfc_stats_t st;
  cap_bfc_stats(d->dev_bfc, &st);
  return st.arena_bytes;
}

uint64_t cap__dev_trim(cap__dev_t *d) {
  cap_bfc_trim(d->dev_bfc);
  return cap__dev_held(d);
}

int cap__dev_emptiest_arena(cap__dev_t *d, void **out, size_t max_out) {
  return cap_bfc_emptiest_arena(d->dev_bfc, out, max_out);
}

bool cap__dev_budget_has_room(cap__dev_t *d, uint64_t bytes) {
  cap_bfc_stats_t st;
  cap_bfc_stats(d->dev_bfc, &st);
  return !st.budget_bytes ||
         st.in_use_bytes + d->framework_bytes + granule_up(bytes) <= st.budget_bytes;
}

bool cap__dev_use_has_room(cap__dev_t *d, uint64_t bytes) {
  cap_bfc_stats_t st;
  cap_bfc_stats(d->dev_bfc, &st);
  return use_has_room(d, &st, bytes);
}

int cap__dev_find_window(cap__dev_t *d, uint64_t bytes,
                         uint32_t (*weight)(void *ctx, const void *ptr),
                         void *ctx, void **out, size_t max_out) {
  return cap_bfc_find_window(d->dev_bfc, bytes ? bytes : 1, weight, ctx,
                             out, max_out);
}

int cap__dev_region_find_window(cap__dev_t *d, uint64_t bytes,
                                uint32_t (*weight)(void *ctx, const void *ptr),
                                void *ctx, void **out, size_t max_out) {
  bytes = granule_up(bytes);
  return cap__region_find_window(&d->region, bytes ? bytes : CAP_BFC_GRANULE,
                                 weight, ctx, out, max_out);
}

int cap__host_alloc(cap__dev_t *d, uint64_t bytes, void **p) {
  return cap_bfc_alloc(d->host_bfc, bytes ? bytes : 1, p);
}

void cap__host_free(cap__dev_t *d, void *p, uint64_t bytes) {
  (void)bytes;
  if (p)
    cap_bfc_free(d->host_bfc, p);
}

static int copy(cap__dev_t *d, cap_stream_t s, void *dst, const void *src,
                uint64_t bytes, cap__ev_t **out) {
  /* Order the copy after what the compute stream has issued so far: a
   * copy out reads what those kernels write, and a copy in writes memory
   * that the host gave back as soon as it issued the last kernel reading
   * it (the tensor that had the block, freed at its op's end), which may
   * still be running on a GPU. On the sim backend compute is synchronous
   * and this waits for nothing. */
  int rc = cap_backend_event_record(d->b, d->compute_ev, CAP_STREAM_COMPUTE);
  if (rc < 0)
    return rc;
  rc = cap_backend_stream_wait_event(d->b, s, d->compute_ev);
  if (rc < 0)
    return rc;
  cap__ev_t *e = calloc(1, sizeof *e);
  if (!e)
    return CAP_ENOMEM;
  rc = cap_backend_event_create(d->b, &e->ev);
  if (rc < 0)
    goto out_free;
  rc = cap_backend_copy_async(d->b, s, dst, src, bytes);
  if (rc < 0)
    goto out_event;
  rc = cap_backend_event_record(d->b, e->ev, s);
  if (rc < 0) {
    /* The copy is queued but unobservable: wait for the stream instead. */
    cap_backend_stream_synchronize(d->b, s);
    goto out_event;
  }
  e->stream = s;
  e->seq = ++d->copies[s];
  *out = e;
  return 0;
out_event:
  cap_backend_event_destroy(d->b, e->ev);
out_free:
  free(e);
  return rc;
}

int cap__copy_d2h(cap__dev_t *d, void *host, const void *dev, uint64_t bytes,
                  cap__ev_t **ev) {
  return copy(d, CAP_STREAM_D2H, host, dev, bytes, ev);
}

int cap__copy_h2d(cap__dev_t *d, void *dev, const void *host, uint64_t bytes,
                  cap__ev_t **ev) {
  return copy(d, CAP_STREAM_H2D, dev, host, bytes, ev);
}

int cap__ev_query(cap__dev_t *d, cap__ev_t *ev) {
  return cap_backend_event_query(d->b, ev->ev);
}

_Static_assert(CAP__POLL_STREAMS == CAP_STREAM_COUNT, "a poll slot per stream");

void cap__poll_begin(cap__poll_t *p) {
  for (int s = 0; s < CAP__POLL_STREAMS; s++)
    p->running_from[s] = UINT64_MAX;
}

int cap__ev_poll(cap__dev_t *d, cap__ev_t *ev, cap__poll_t *p) {
  uint64_t *from = &p->running_from[ev->stream];
  if (ev->seq > *from) /* (every event is a copy's: copy() numbers it) */
    return 0;
  int st = cap__ev_query(d, ev);
  if (st == 0 && ev->seq < *from)
    *from = ev->seq;
  return st;
}

uint64_t cap__dev_event_queries(cap__dev_t *d) {
  return cap_backend_event_queries(d->b);
}

int cap__ev_sync(cap__dev_t *d, cap__ev_t *ev) {
  return cap_backend_event_synchronize(d->b, ev->ev);
}

int cap__ev_compute_wait(cap__dev_t *d, cap__ev_t *ev) {
  int rc = cap_backend_stream_wait_event(d->b, CAP_STREAM_COMPUTE, ev->ev);
  if (rc < 0)
    return rc;
  /* A failed copy shows up in the event: look without blocking. */
  int q = cap_backend_event_query(d->b, ev->ev);
  return q < 0 ? q : 0;
}

void cap__ev_release(cap__dev_t *d, cap__ev_t *ev) {
  if (!ev)
    return;
  cap_backend_event_destroy(d->b, ev->ev);
  free(ev);
}

int64_t cap__now_ns(cap__dev_t *d) { return cap_backend_now_ns(d->b); }

bool cap__dev_host_compute(cap__dev_t *d) { return d->sim; }

int cap__dev_compute(cap__dev_t *d, int64_t ns) {
  return cap_backend_run_op(d->b, ns, NULL, 0);
}

/* --- Integrity pattern --------------------------------------------------------
 * The backend's pattern (cap_pattern_word). On the sim backend a full check
 * of every access costs tens of GB of memory traffic per iteration for the
 * bundled traces, more than two CPU cores can do in the trace's time; there
 * "sample" mode (the default) writes and checks the first and the last word
 * and one word per 64 KiB at an offset that moves with the seed, which still
 * catches any swap or recompute that loses or misplaces a tensor's data.
 * CAPUCHIN_VERIFY=full checks every word; the cuda backend always does (on
 * the GPU). */
#define SAMPLE_STRIDE_WORDS 8192u

int cap__dev_fill(cap__dev_t *d, void *dev, uint64_t bytes, uint64_t seed) {
  uint64_t n = bytes / 8;
  if (!d->sim || d->verify_full || n < 4)
    return cap_backend_pattern_fill(d->b, dev, bytes, seed);
  uint8_t *b = dev;
  for (uint64_t i = seed % SAMPLE_STRIDE_WORDS; i < n; i += SAMPLE_STRIDE_WORDS) {
    uint64_t v = cap_pattern_word(seed, i);
    memcpy(b + 8 * i, &v, 8);
  }
  uint64_t v0 = cap_pattern_word(seed, 0), vl = cap_pattern_word(seed, n - 1);
  memcpy(b, &v0, 8);
  memcpy(b + 8 * (n - 1), &vl, 8);
  return 0;
}

int64_t cap__dev_check(cap__dev_t *d, const void *dev, uint64_t bytes,
                       uint64_t seed) {
  uint64_t n = bytes / 8;
  if (!d->sim || d->verify_full || n < 4)
    return cap_backend_pattern_check(d->b, dev, bytes, seed);
  const uint8_t *b = dev;
  int64_t bad = 0;
  uint64_t v;
  for (uint64_t i = seed % SAMPLE_STRIDE_WORDS; i < n; i += SAMPLE_STRIDE_WORDS) {
    memcpy(&v, b + 8 * i, 8);
    bad += v != cap_pattern_word(seed, i);
  }
  memcpy(&v, b, 8);
  bad += v != cap_pattern_word(seed, 0);
  memcpy(&v, b + 8 * (n - 1), 8);
  bad += v != cap_pattern_word(seed, n - 1);
  return bad;
}
