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
};

/* The executor's event: the backend event recorded after the copy. */
struct cap__ev {
  cap_event_t *ev;
};

int cap__dev_open(cap_client_t *c, const cap_client_config_t *cfg) {
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
  cap__dev_t *d = calloc(1, sizeof *d);
  if (!d)
    return CAP_ENOMEM;
  int rc = cap_backend_create(&bc, &d->b);
  if (rc < 0) {
    cap__set_error(c, "backend %s: %s", cfg->backend ? cfg->backend : "auto",
                   cap_strerror(rc));
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

  c->dev = d;
  snprintf(c->backend, sizeof c->backend, "%s", d->info->backend);
  snprintf(c->device_name, sizeof c->device_name, "%s", d->info->device_name);
  c->device_total_bytes = d->info->total_bytes;
  c->h2d_gbps = d->info->h2d_gbps;
  c->d2h_gbps = d->info->d2h_gbps;
  c->duplex_gbps = d->info->duplex_gbps;
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

void cap__dev_close(cap_client_t *c) {
  cap__dev_t *d = c->dev;
  if (!d)
    return;
  for (int s = 0; s < CAP_STREAM_COUNT; s++)
    cap_backend_stream_synchronize(d->b, (cap_stream_t)s);
  cap_backend_event_destroy(d->b, d->compute_ev);
  cap_bfc_destroy(d->host_bfc);
  cap_bfc_destroy(d->dev_bfc);
  cap_backend_destroy(d->b);
  free(d);
  c->dev = NULL;
}

int cap__dev_set_budget(cap_client_t *c, uint64_t bytes) {
  cap__dev_t *d = c->dev;
  bool whole = !bytes || bytes >= d->info->total_bytes;
  if (whole)
    bytes = d->info->total_bytes;
  cap_bfc_set_budget(d->dev_bfc, bytes);
  /* Take the budget's arena now and touch it once, so that the measured
   * iteration's op times are not inflated by first-touch page faults (sim)
   * or cudaMalloc calls (cuda). Best effort: failure leaves growth lazy. */
  if (!whole) {
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

void cap__dev_fault_copy(cap_client_t *c, uint32_t nth) {
  (void)c;
  cap_faultsim_arm(CAP_FAULT_COPY_ASYNC, nth, 1);
}

int cap__dev_alloc(cap_client_t *c, uint64_t bytes, void **p) {
  if (c->fault_alloc_nth) {
    if (--c->fault_alloc_nth == 0) {
      if (c->fault_alloc_sticky)
        c->fault_alloc_nth = 1;
      cap__set_error(c, "injected allocation failure");
      return CAP_ENOMEM;
    }
  }
  return cap_bfc_alloc(c->dev->dev_bfc, bytes ? bytes : 1, p);
}

void cap__dev_free(cap_client_t *c, void *p) {
  if (p)
    cap_bfc_free(c->dev->dev_bfc, p);
}

uint64_t cap__dev_in_use(cap_client_t *c) {
  cap_bfc_stats_t st;
  cap_bfc_stats(c->dev->dev_bfc, &st);
  return st.in_use_bytes;
}

bool cap__dev_budget_has_room(cap_client_t *c, uint64_t bytes) {
  cap_bfc_stats_t st;
  cap_bfc_stats(c->dev->dev_bfc, &st);
  uint64_t rounded = (bytes + CAP_BFC_GRANULE - 1) & ~(uint64_t)(CAP_BFC_GRANULE - 1);
  return !st.budget_bytes || st.in_use_bytes + rounded <= st.budget_bytes;
}

int cap__dev_find_window(cap_client_t *c, uint64_t bytes,
                         uint32_t (*weight)(void *ctx, const void *ptr),
                         void *ctx, void **out, size_t max_out) {
  return cap_bfc_find_window(c->dev->dev_bfc, bytes ? bytes : 1, weight, ctx,
                             out, max_out);
}

int cap__host_alloc(cap_client_t *c, uint64_t bytes, void **p) {
  return cap_bfc_alloc(c->dev->host_bfc, bytes ? bytes : 1, p);
}

void cap__host_free(cap_client_t *c, void *p, uint64_t bytes) {
  (void)bytes;
  if (p)
    cap_bfc_free(c->dev->host_bfc, p);
}

static int copy(cap_client_t *c, cap_stream_t s, void *dst, const void *src,
                uint64_t bytes, cap__ev_t **out) {
  cap__dev_t *d = c->dev;
  int rc;
  if (s == CAP_STREAM_D2H) {
    /* Order the copy after what the compute stream has issued so far. */
    rc = cap_backend_event_record(d->b, d->compute_ev, CAP_STREAM_COMPUTE);
    if (rc < 0)
      return rc;
    rc = cap_backend_stream_wait_event(d->b, s, d->compute_ev);
    if (rc < 0)
      return rc;
  }
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
  *out = e;
  return 0;
out_event:
  cap_backend_event_destroy(d->b, e->ev);
out_free:
  free(e);
  return rc;
}

int cap__copy_d2h(cap_client_t *c, void *host, const void *dev, uint64_t bytes,
                  cap__ev_t **ev) {
  return copy(c, CAP_STREAM_D2H, host, dev, bytes, ev);
}

int cap__copy_h2d(cap_client_t *c, void *dev, const void *host, uint64_t bytes,
                  cap__ev_t **ev) {
  return copy(c, CAP_STREAM_H2D, dev, host, bytes, ev);
}

int cap__ev_query(cap_client_t *c, cap__ev_t *ev) {
  return cap_backend_event_query(c->dev->b, ev->ev);
}

int cap__ev_sync(cap_client_t *c, cap__ev_t *ev) {
  return cap_backend_event_synchronize(c->dev->b, ev->ev);
}

int cap__ev_compute_wait(cap_client_t *c, cap__ev_t *ev) {
  int rc = cap_backend_stream_wait_event(c->dev->b, CAP_STREAM_COMPUTE, ev->ev);
  if (rc < 0)
    return rc;
  /* A failed copy shows up in the event: look without blocking. */
  int q = cap_backend_event_query(c->dev->b, ev->ev);
  return q < 0 ? q : 0;
}

void cap__ev_release(cap_client_t *c, cap__ev_t *ev) {
  if (!ev)
    return;
  cap_backend_event_destroy(c->dev->b, ev->ev);
  free(ev);
}

int64_t cap__now_ns(cap_client_t *c) { return cap_backend_now_ns(c->dev->b); }

bool cap__dev_host_compute(cap_client_t *c) { return c->dev->sim; }

int cap__dev_compute(cap_client_t *c, int64_t ns) {
  return cap_backend_run_op(c->dev->b, ns, NULL, 0);
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

int cap__dev_fill(cap_client_t *c, void *dev, uint64_t bytes, uint64_t seed) {
  cap__dev_t *d = c->dev;
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

int64_t cap__dev_check(cap_client_t *c, const void *dev, uint64_t bytes,
                       uint64_t seed) {
  cap__dev_t *d = c->dev;
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
