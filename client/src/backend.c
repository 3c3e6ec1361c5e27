/*
 * Backend registry and the checked, fault-injecting wrappers around the
 * vtable (backend.h). Fault injection lives here so that every backend fails
 * the same way under the same test.
 */
#include "backend.h"
#include "capuchin/sim.h" /* CAP_BANDWIDTH_H100 */
#include "bfc.h"
#include "faultsim.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cap_backend {
  const cap_backend_ops_t *ops;
  void *impl;
  cap_backend_info_t info;
  /* An injected asynchronous copy failure, waiting to be reported by the
   * next event recorded on its stream and by the next synchronize of it. */
  atomic_int fail_for_event[CAP_STREAM_COUNT];
  atomic_int fail_for_sync[CAP_STREAM_COUNT];
  atomic_uint_least64_t queries; /* cap_backend_event_query calls */
};

struct cap_event {
  void *impl;
  atomic_int failed; /* the record it tracks follows a failed copy */
};

static const cap_backend_ops_t *const registry[] = {
#ifdef CAP_WITH_CUDA
    &cap__backend_cuda,
#endif
    &cap__backend_sim,
};
#define NREG (sizeof registry / sizeof registry[0])

static const cap_backend_ops_t *find(const char *name) {
  for (size_t i = 0; i < NREG; i++)
    if (strcmp(registry[i]->name, name) == 0)
      return registry[i];
  return NULL;
}

void cap_backend_config_init(cap_backend_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->sim_device_bytes = CAP_BACKEND_DEFAULT_SIM_DEVICE_BYTES;
  cfg->time_scale = 1.0;
  cfg->sim_h2d_gbps = CAP_BANDWIDTH_H100.h2d_gbps;
  cfg->sim_d2h_gbps = CAP_BANDWIDTH_H100.d2h_gbps;
  cfg->sim_duplex_gbps = CAP_BANDWIDTH_H100.duplex_gbps;
}

bool cap_backend_available(const char *name) {
  if (!name)
    return false;
  const cap_backend_ops_t *ops = find(name);
  return ops && ops->available();
}

int cap_backend_create(const cap_backend_config_t *cfg, cap_backend_t **out) {
  if (!out)
    return CAP_EINVAL;
  cap_backend_config_t c;
  if (cfg)
    c = *cfg;
  else
    cap_backend_config_init(&c);
  const cap_backend_ops_t *ops = NULL;
  if (!c.name || !c.name[0] || strcmp(c.name, "auto") == 0) {
    for (size_t i = 0; i < NREG && !ops; i++)
      if (registry[i]->available())
        ops = registry[i];
  } else {
    ops = find(c.name);
    if (!ops)
      return strcmp(c.name, "cuda") == 0 ? CAP_EUNSUPPORTED : CAP_ENOENT;
    if (!ops->available())
      return CAP_EUNSUPPORTED;
  }
  if (!ops)
    return CAP_EUNSUPPORTED;
  /* Zero means "default" for the sim fields; negatives are mistakes. */
  if (c.time_scale < 0 || c.sim_h2d_gbps < 0 || c.sim_d2h_gbps < 0 ||
      c.sim_duplex_gbps < 0 || c.device_index < 0)
    return CAP_EINVAL;
  if (c.time_scale == 0)
    c.time_scale = 1.0;
  if (c.sim_h2d_gbps == 0)
    c.sim_h2d_gbps = CAP_BANDWIDTH_H100.h2d_gbps;
  if (c.sim_d2h_gbps == 0)
    c.sim_d2h_gbps = CAP_BANDWIDTH_H100.d2h_gbps;
  if (c.sim_duplex_gbps == 0)
    c.sim_duplex_gbps = CAP_BANDWIDTH_H100.duplex_gbps;
  if (c.sim_device_bytes == 0)
    c.sim_device_bytes = CAP_BACKEND_DEFAULT_SIM_DEVICE_BYTES;
  if (!c.sim_device_uuid || !c.sim_device_uuid[0])
    c.sim_device_uuid = getenv("CAPUCHIN_SIM_DEVICE_UUID");
  if (!c.sim_device_uuid || !c.sim_device_uuid[0])
    c.sim_device_uuid = CAP_BACKEND_DEFAULT_SIM_UUID;
  cap_backend_t *b = calloc(1, sizeof *b);
  if (!b)
    return CAP_ENOMEM;
  b->ops = ops;
  b->info.device_index = c.device_index;
  b->info.time_scale = 1.0;
  int rc = ops->open(&c, &b->info, &b->impl);
  if (rc) {
    free(b);
    return rc;
  }
  snprintf(b->info.backend, sizeof b->info.backend, "%s", ops->name);
  *out = b;
  return 0;
}

void cap_backend_destroy(cap_backend_t *b) {
  if (!b)
    return;
  b->ops->close(b->impl);
  free(b);
}

const cap_backend_info_t *cap_backend_info(const cap_backend_t *b) {
  return &b->info;
}

int64_t cap_backend_now_ns(const cap_backend_t *b) { return b->ops->now_ns(b->impl); }

int cap_backend_device_alloc(cap_backend_t *b, size_t bytes, void **ptr) {
  if (!b || !ptr || bytes == 0)
    return CAP_EINVAL;
  if (cap_faultsim_step(CAP_FAULT_DEVICE_ALLOC))
    return CAP_ENOMEM;
  return b->ops->device_alloc(b->impl, bytes, ptr);
}

void cap_backend_device_free(cap_backend_t *b, void *ptr) {
  if (b && ptr)
    b->ops->device_free(b->impl, ptr);
}

int cap_backend_host_alloc(cap_backend_t *b, size_t bytes, void **ptr) {
  if (!b || !ptr || bytes == 0)
    return CAP_EINVAL;
  if (cap_faultsim_step(CAP_FAULT_HOST_ALLOC))
    return CAP_ENOMEM;
  return b->ops->host_alloc(b->impl, bytes, ptr);
}

void cap_backend_host_free(cap_backend_t *b, void *ptr) {
  if (b && ptr)
    b->ops->host_free(b->impl, ptr);
}

static bool valid_stream(cap_stream_t s) { return (unsigned)s < CAP_STREAM_COUNT; }

int cap_backend_copy_async(cap_backend_t *b, cap_stream_t s, void *dst, const void *src,
                           size_t bytes) {
  if (!b || (s != CAP_STREAM_D2H && s != CAP_STREAM_H2D) || !dst || !src)
    return CAP_EINVAL;
  if (bytes == 0)
    return 0;
  if (cap_faultsim_step(CAP_FAULT_COPY_SUBMIT))
    return CAP_EDEVICE;
  if (cap_faultsim_step(CAP_FAULT_COPY_ASYNC)) {
    /* The copy "runs" and fails: nothing moves; the stream reports it. */
    atomic_store(&b->fail_for_event[s], 1);
    atomic_store(&b->fail_for_sync[s], 1);
    return 0;
  }
  return b->ops->copy_async(b->impl, s, dst, src, bytes);
}

int cap_backend_event_create(cap_backend_t *b, cap_event_t **ev) {
  if (!b || !ev)
    return CAP_EINVAL;
  if (cap_faultsim_step(CAP_FAULT_EVENT))
    return CAP_EDEVICE;
  cap_event_t *e = calloc(1, sizeof *e);
  if (!e)
    return CAP_ENOMEM;
  int rc = b->ops->event_create(b->impl, &e->impl);
  if (rc) {
    free(e);
    return rc;
  }
  *ev = e;
  return 0;
}

void cap_backend_event_destroy(cap_backend_t *b, cap_event_t *ev) {
  if (!b || !ev)
    return;
  b->ops->event_destroy(b->impl, ev->impl);
  free(ev);
}

int cap_backend_event_record(cap_backend_t *b, cap_event_t *ev, cap_stream_t s) {
  if (!b || !ev || !valid_stream(s))
    return CAP_EINVAL;
  if (cap_faultsim_step(CAP_FAULT_EVENT))
    return CAP_EDEVICE;
  int rc = b->ops->event_record(b->impl, ev->impl, s);
  if (rc)
    return rc;
  atomic_store(&ev->failed, atomic_exchange(&b->fail_for_event[s], 0));
  return 0;
}

int cap_backend_stream_wait_event(cap_backend_t *b, cap_stream_t s, cap_event_t *ev) {
  if (!b || !ev || !valid_stream(s))
    return CAP_EINVAL;
  return b->ops->stream_wait_event(b->impl, s, ev->impl);
}

int cap_backend_event_query(cap_backend_t *b, cap_event_t *ev) {
  if (!b || !ev)
    return CAP_EINVAL;
  atomic_fetch_add_explicit(&b->queries, 1, memory_order_relaxed);
  int rc = b->ops->event_query(b->impl, ev->impl);
  if (rc == 1 && atomic_load(&ev->failed))
    return CAP_EDEVICE;
  return rc;
}

uint64_t cap_backend_event_queries(const cap_backend_t *b) {
  return b ? atomic_load_explicit(&b->queries, memory_order_relaxed) : 0;
}

int cap_backend_event_synchronize(cap_backend_t *b, cap_event_t *ev) {
  if (!b || !ev)
    return CAP_EINVAL;
  int rc = b->ops->event_synchronize(b->impl, ev->impl);
  if (rc == 0 && atomic_load(&ev->failed))
    return CAP_EDEVICE;
  return rc;
}

int cap_backend_stream_synchronize(cap_backend_t *b, cap_stream_t s) {
  if (!b || !valid_stream(s))
    return CAP_EINVAL;
  int rc = b->ops->stream_synchronize(b->impl, s);
  if (atomic_exchange(&b->fail_for_sync[s], 0) && rc == 0)
    rc = CAP_EDEVICE;
  return rc;
}

int cap_backend_run_op(cap_backend_t *b, int64_t duration_ns, const cap_op_buf_t *bufs,
                       size_t n) {
  if (!b || duration_ns < 0 || (n && !bufs))
    return CAP_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (!bufs[i].ptr && bufs[i].bytes)
      return CAP_EINVAL;
  return b->ops->run_op(b->impl, duration_ns, bufs, n);
}

int cap_backend_pattern_fill(cap_backend_t *b, void *dev, size_t bytes, uint64_t seed) {
  if (!b || (!dev && bytes))
    return CAP_EINVAL;
  return bytes ? b->ops->pattern_fill(b->impl, dev, bytes, seed) : 0;
}

int cap_backend_memset(cap_backend_t *b, void *dev, int byte, size_t bytes) {
  if (!b || (!dev && bytes))
    return CAP_EINVAL;
  return bytes ? b->ops->memset(b->impl, dev, byte, bytes) : 0;
}

int64_t cap_backend_pattern_check(cap_backend_t *b, const void *dev, size_t bytes,
                                  uint64_t seed) {
  if (!b || (!dev && bytes))
    return CAP_EINVAL;
  return bytes ? b->ops->pattern_check(b->impl, dev, bytes, seed) : 0;
}

int cap_backend_mismatches(cap_backend_t *b, uint64_t *count) {
  if (!b || !count)
    return CAP_EINVAL;
  return b->ops->mismatches(b->impl, count);
}

int cap_backend_read(cap_backend_t *b, void *host_dst, const void *dev_src, size_t bytes) {
  if (!b || ((!host_dst || !dev_src) && bytes))
    return CAP_EINVAL;
  return bytes ? b->ops->read(b->impl, host_dst, dev_src, bytes) : 0;
}

int cap_backend_write(cap_backend_t *b, void *dev_dst, const void *host_src, size_t bytes) {
  if (!b || ((!dev_dst || !host_src) && bytes))
    return CAP_EINVAL;
  return bytes ? b->ops->write(b->impl, dev_dst, host_src, bytes) : 0;
}

/* ---- integrity pattern on the host ---- */

/* Words are stored little-endian on every host and device we run on
 * (x86-64, aarch64, NVIDIA GPUs), so memcpy of the native word is the
 * pattern's byte order. */
void cap_pattern_fill_host(void *p, size_t bytes, uint64_t seed) {
  unsigned char *d = p;
  size_t words = bytes / 8;
  uint64_t w = cap_pattern_base(seed);
  for (size_t i = 0; i < words; i++, w += CAP_PATTERN_STEP)
    memcpy(d + i * 8, &w, 8);
  size_t tail = bytes % 8;
  if (tail)
    memcpy(d + words * 8, &w, tail);
}

uint64_t cap_pattern_check_host(const void *p, size_t bytes, uint64_t seed) {
  const unsigned char *d = p;
  size_t words = bytes / 8;
  uint64_t bad = 0, w = cap_pattern_base(seed);
  for (size_t i = 0; i < words; i++, w += CAP_PATTERN_STEP) {
    uint64_t v;
    memcpy(&v, d + i * 8, 8);
    bad += v != w;
  }
  size_t tail = bytes % 8;
  if (tail) {
    uint64_t v = 0;
    memcpy(&v, d + words * 8, tail);
    bad += memcmp(&v, &w, tail) != 0;
  }
  return bad;
}

/* ---- arena sources ---- */

static int dev_src_alloc(void *ctx, size_t bytes, void **base) {
  return cap_backend_device_alloc(ctx, bytes, base);
}
static void dev_src_free(void *ctx, void *base, size_t bytes) {
  (void)bytes;
  cap_backend_device_free(ctx, base);
}
static int host_src_alloc(void *ctx, size_t bytes, void **base) {
  return cap_backend_host_alloc(ctx, bytes, base);
}
static void host_src_free(void *ctx, void *base, size_t bytes) {
  (void)bytes;
  cap_backend_host_free(ctx, base);
}

void cap_backend_device_source(cap_backend_t *b, cap_bfc_source_t *src) {
  src->alloc = dev_src_alloc;
  src->free = dev_src_free;
  src->ctx = b;
}

void cap_backend_host_source(cap_backend_t *b, cap_bfc_source_t *src) {
  src->alloc = host_src_alloc;
  src->free = host_src_free;
  src->ctx = b;
}
