/*
 * The device backend conformance suite (rmm runs one suite over every memory
 * resource): included by test_backend_sim.c and test_backend_gpu.c, which set
 * the backend up and call run_conformance(). Every check holds for any
 * correct backend; timing checks are lower bounds plus generous upper bounds
 * (CI is a noisy 2-core machine).
 */
#ifndef CAP_TEST_BACKEND_CONFORMANCE_H
#define CAP_TEST_BACKEND_CONFORMANCE_H

#include "backend.h"
#include "bfc.h"
#include "faultsim.h"

#include "cap_test.h"

#include <pthread.h>

static cap_backend_config_t conf_cfg; /* set by the including test */
static cap_backend_t *B;

#define MIB (1024 * 1024)

static void fill_bytes(unsigned char *p, size_t n, unsigned seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = (unsigned char)x;
  }
}

static void conf_info(void) {
  const cap_backend_info_t *in = cap_backend_info(B);
  CHECK(in->backend[0] != 0);
  CHECK(in->device_name[0] != 0);
  CHECK(in->total_bytes > 0);
  CHECK(in->h2d_gbps > 0 && in->d2h_gbps > 0 && in->duplex_gbps > 0);
  /* The identity jobs share a device by: nvidia-smi's form on a GPU. */
  CHECK(strlen(in->device_uuid) == 40);
  if (!strcmp(in->backend, "cuda"))
    CHECK(!strncmp(in->device_uuid, "GPU-", 4));
  printf("  backend %s, device \"%s\" %s, %.1f GiB, H2D %.1f GB/s, D2H %.1f "
         "GB/s, duplex %.1f GB/s\n",
         in->backend, in->device_name, in->device_uuid,
         (double)in->total_bytes / (1 << 30), in->h2d_gbps, in->d2h_gbps,
         in->duplex_gbps);
  int64_t t1 = cap_backend_now_ns(B), t2 = cap_backend_now_ns(B);
  CHECK(t2 >= t1);
}

static void conf_alloc_free(void) {
  size_t sizes[] = {1, 255, 4096, 3 * MIB + 5};
  void *p[4] = {0};
  for (int i = 0; i < 4; i++) {
    CHECK_EQ(cap_backend_device_alloc(B, sizes[i], &p[i]), 0);
    CHECK_EQ((uintptr_t)p[i] % CAP_BACKEND_ALIGN, 0);
  }
  /* every allocation is usable memory of its full size */
  unsigned char *h = malloc(sizes[3]), *g = malloc(sizes[3]);
  REQUIRE(h && g);
  for (int i = 0; i < 4; i++) {
    fill_bytes(h, sizes[i], (unsigned)i + 1);
    CHECK_EQ(cap_backend_write(B, p[i], h, sizes[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    fill_bytes(h, sizes[i], (unsigned)i + 1);
    memset(g, 0, sizes[i]);
    CHECK_EQ(cap_backend_read(B, g, p[i], sizes[i]), 0);
    CHECK(memcmp(g, h, sizes[i]) == 0);
  }
  for (int i = 0; i < 4; i++)
    cap_backend_device_free(B, p[i]);
  cap_backend_device_free(B, NULL);
  void *q = NULL;
  CHECK_EQ(cap_backend_device_alloc(B, (size_t)1 << 52, &q), CAP_ENOMEM); /* 4 PiB */
  CHECK(q == NULL);
  CHECK_EQ(cap_backend_device_alloc(B, 0, &q), CAP_EINVAL);
  void *hp = NULL;
  CHECK_EQ(cap_backend_host_alloc(B, 4096, &hp), 0);
  CHECK_EQ((uintptr_t)hp % CAP_BACKEND_ALIGN, 0);
  if (hp)
    memset(hp, 1, 4096);
  cap_backend_host_free(B, hp);
  free(h);
  free(g);
}

/* H2D then D2H through pinned buffers gives back exactly the bytes. */
static void conf_copy_round_trip(void) {
  size_t sizes[] = {1, 7, 4099, 8 * MIB + 3};
  for (int i = 0; i < 4; i++) {
    size_t n = sizes[i];
    void *src = NULL, *dst = NULL, *dev = NULL;
    REQUIRE(cap_backend_host_alloc(B, n, &src) == 0);
    REQUIRE(cap_backend_host_alloc(B, n, &dst) == 0);
    REQUIRE(cap_backend_device_alloc(B, n, &dev) == 0);
    fill_bytes(src, n, 100 + (unsigned)i);
    memset(dst, 0, n);
    cap_event_t *ev = NULL;
    REQUIRE(cap_backend_event_create(B, &ev) == 0);
    CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, dev, src, n), 0);
    CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_H2D), 0);
    CHECK_EQ(cap_backend_stream_wait_event(B, CAP_STREAM_D2H, ev), 0);
    CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_D2H, dst, dev, n), 0);
    CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_D2H), 0);
    CHECK(memcmp(src, dst, n) == 0);
    CHECK_EQ(cap_backend_event_query(B, ev), 1);
    cap_backend_event_destroy(B, ev);
    cap_backend_device_free(B, dev);
    cap_backend_host_free(B, src);
    cap_backend_host_free(B, dst);
  }
  /* copies on the compute stream, or without pointers, are refused */
  char c = 0;
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_COMPUTE, &c, &c, 1), CAP_EINVAL);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, NULL, &c, 1), CAP_EINVAL);
}

/* A D2H copy that waits on an event recorded after a long H2D copy sees the
 * H2D copy's bytes; without the wait it would read the old ones. */
static void conf_event_orders_copies(size_t n) {
  void *newer = NULL, *out = NULL, *dev = NULL;
  REQUIRE(cap_backend_host_alloc(B, n, &newer) == 0);
  REQUIRE(cap_backend_host_alloc(B, n, &out) == 0);
  REQUIRE(cap_backend_device_alloc(B, n, &dev) == 0);
  REQUIRE(cap_backend_pattern_fill(B, dev, n, 1) == 0); /* old contents */
  CHECK_EQ(cap_backend_pattern_check(B, dev, n, 1), 0);
  cap_pattern_fill_host(newer, n, 2);
  cap_event_t *ev = NULL;
  REQUIRE(cap_backend_event_create(B, &ev) == 0);
  CHECK_EQ(cap_backend_event_query(B, ev), 1); /* never recorded: complete */
  int64_t t0 = cap_backend_now_ns(B);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, dev, newer, n), 0);
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_H2D), 0);
  /* pending, unless this thread was descheduled for longer than the copy */
  int q = cap_backend_event_query(B, ev);
  CHECK(q == 0 || (q == 1 && (double)(cap_backend_now_ns(B) - t0) >=
                                 0.5 * (double)n / cap_backend_info(B)->h2d_gbps));
  CHECK_EQ(cap_backend_stream_wait_event(B, CAP_STREAM_D2H, ev), 0);
  /* the last 64 KiB only: a short copy that, not waiting, would finish long
   * before the H2D copy */
  size_t tail = 64 * 1024, off = n - tail;
  memset(out, 0, tail);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_D2H, out, (char *)dev + off, tail), 0);
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_D2H), 0);
  CHECK_EQ(cap_backend_event_query(B, ev), 1);
  CHECK(memcmp(out, (char *)newer + off, tail) == 0);
  /* and the whole buffer, once more behind the same event */
  CHECK_EQ(cap_backend_stream_wait_event(B, CAP_STREAM_D2H, ev), 0);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_D2H, out, dev, n), 0);
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_D2H), 0);
  CHECK_EQ(cap_pattern_check_host(out, n, 2), 0);
  cap_backend_event_destroy(B, ev);
  cap_backend_device_free(B, dev);
  cap_backend_host_free(B, newer);
  cap_backend_host_free(B, out);
}

/* The compute stream waits on a copy's event (no host wait on cuda): an op
 * verifying the copied bytes after the wait sees them all. */
static void conf_compute_waits_on_copy(size_t n) {
  void *host = NULL, *dev = NULL;
  REQUIRE(cap_backend_host_alloc(B, n, &host) == 0);
  REQUIRE(cap_backend_device_alloc(B, n, &dev) == 0);
  REQUIRE(cap_backend_memset(B, dev, 0, n) == 0);
  cap_pattern_fill_host(host, n, 77);
  cap_event_t *ev = NULL;
  REQUIRE(cap_backend_event_create(B, &ev) == 0);
  uint64_t junk;
  CHECK_EQ(cap_backend_mismatches(B, &junk), 0);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, dev, host, n), 0);
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_H2D), 0);
  CHECK_EQ(cap_backend_stream_wait_event(B, CAP_STREAM_COMPUTE, ev), 0);
  cap_op_buf_t in = {.ptr = dev, .bytes = n, .verify_seed = 77, .flags = CAP_OPBUF_VERIFY};
  CHECK_EQ(cap_backend_run_op(B, 1000, &in, 1), 0);
  uint64_t bad = 99;
  CHECK_EQ(cap_backend_mismatches(B, &bad), 0);
  CHECK_EQ(bad, 0);
  cap_backend_event_destroy(B, ev);
  cap_backend_device_free(B, dev);
  cap_backend_host_free(B, host);
}

/* A D2H copy waiting on an event recorded on the compute stream after an op
 * copies what the op wrote. */
static void conf_copy_waits_on_compute(size_t n) {
  void *host = NULL, *dev = NULL;
  REQUIRE(cap_backend_host_alloc(B, n, &host) == 0);
  REQUIRE(cap_backend_device_alloc(B, n, &dev) == 0);
  REQUIRE(cap_backend_memset(B, dev, 0xab, n) == 0);
  memset(host, 0, n);
  cap_event_t *ev = NULL;
  REQUIRE(cap_backend_event_create(B, &ev) == 0);
  cap_op_buf_t out = {.ptr = dev, .bytes = n, .fill_seed = 5, .flags = CAP_OPBUF_FILL};
  CHECK_EQ(cap_backend_run_op(B, 3000000, &out, 1), 0); /* 3 ms */
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_COMPUTE), 0);
  CHECK_EQ(cap_backend_stream_wait_event(B, CAP_STREAM_D2H, ev), 0);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_D2H, host, dev, n), 0);
  cap_event_t *done = NULL;
  REQUIRE(cap_backend_event_create(B, &done) == 0);
  CHECK_EQ(cap_backend_event_record(B, done, CAP_STREAM_D2H), 0);
  CHECK_EQ(cap_backend_event_synchronize(B, done), 0);
  CHECK_EQ(cap_pattern_check_host(host, n, 5), 0);
  cap_backend_event_destroy(B, ev);
  cap_backend_event_destroy(B, done);
  cap_backend_device_free(B, dev);
  cap_backend_host_free(B, host);
}

/* Re-recording an event: waits and queries follow the latest record. */
static void conf_event_rerecord(size_t n) {
  void *host = NULL, *dev = NULL;
  REQUIRE(cap_backend_host_alloc(B, n, &host) == 0);
  REQUIRE(cap_backend_device_alloc(B, n, &dev) == 0);
  cap_event_t *ev = NULL;
  REQUIRE(cap_backend_event_create(B, &ev) == 0);
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_H2D), 0);
  CHECK_EQ(cap_backend_event_synchronize(B, ev), 0);
  CHECK_EQ(cap_backend_event_query(B, ev), 1);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, dev, host, n), 0);
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_H2D), 0);
  CHECK_EQ(cap_backend_event_query(B, ev), 0);
  CHECK_EQ(cap_backend_event_synchronize(B, ev), 0);
  CHECK_EQ(cap_backend_event_query(B, ev), 1);
  /* destroying an event whose record is still pending is allowed */
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, dev, host, n), 0);
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_H2D), 0);
  cap_backend_event_destroy(B, ev);
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_H2D), 0);
  cap_backend_device_free(B, dev);
  cap_backend_host_free(B, host);
}

/* Synthetic ops: duration on the clock, verify counts mismatching words,
 * fill writes the pattern, a partial last word counts. */
static void conf_run_op(void) {
  size_t n = 1 * MIB + 13;
  void *dev = NULL;
  REQUIRE(cap_backend_device_alloc(B, n, &dev) == 0);
  uint64_t bad = 0;
  CHECK_EQ(cap_backend_mismatches(B, &bad), 0);
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_COMPUTE), 0);
  int64_t t0 = cap_backend_now_ns(B);
  cap_op_buf_t b = {.ptr = dev, .bytes = n, .fill_seed = 9, .flags = CAP_OPBUF_FILL};
  CHECK_EQ(cap_backend_run_op(B, 20000000, &b, 1), 0); /* 20 ms */
  CHECK_EQ(cap_backend_pattern_check(B, dev, n, 9), 0); /* waits for compute */
  int64_t el = cap_backend_now_ns(B) - t0;
  CHECK(el >= 20000000);
  /* upper bound: generous, in real time (sanitizers, a loaded 2-core CI) */
  CHECK(el < 20000000 * 10LL + (int64_t)(100e6 / cap_backend_info(B)->time_scale));
  cap_op_buf_t v = {.ptr = dev, .bytes = n, .verify_seed = 9, .flags = CAP_OPBUF_VERIFY};
  CHECK_EQ(cap_backend_run_op(B, 0, &v, 1), 0);
  CHECK_EQ(cap_backend_mismatches(B, &bad), 0);
  CHECK_EQ(bad, 0);
  v.verify_seed = 10; /* wrong seed: every word, the partial one included */
  CHECK_EQ(cap_backend_run_op(B, 0, &v, 1), 0);
  CHECK_EQ(cap_backend_mismatches(B, &bad), 0);
  CHECK_EQ(bad, (n + 7) / 8);
  CHECK_EQ(cap_backend_mismatches(B, &bad), 0); /* reset by the read */
  CHECK_EQ(bad, 0);
  /* one corrupted byte in the tail is caught */
  unsigned char last;
  CHECK_EQ(cap_backend_read(B, &last, (char *)dev + n - 1, 1), 0);
  last ^= 0x40;
  CHECK_EQ(cap_backend_write(B, (char *)dev + n - 1, &last, 1), 0);
  CHECK_EQ(cap_backend_pattern_check(B, dev, n, 9), 1);
  /* in place: verify the old seed, then rewrite with the new one */
  CHECK_EQ(cap_backend_pattern_fill(B, dev, n, 11), 0);
  cap_op_buf_t ip = {.ptr = dev, .bytes = n, .verify_seed = 11, .fill_seed = 12,
                     .flags = CAP_OPBUF_VERIFY | CAP_OPBUF_FILL};
  CHECK_EQ(cap_backend_run_op(B, 1000, &ip, 1), 0);
  CHECK_EQ(cap_backend_mismatches(B, &bad), 0);
  CHECK_EQ(bad, 0);
  CHECK_EQ(cap_backend_pattern_check(B, dev, n, 12), 0);
  CHECK_EQ(cap_backend_run_op(B, -1, NULL, 0), CAP_EINVAL);
  cap_backend_device_free(B, dev);
}

/* Injected failures: a copy refused at submission, a copy failing
 * asynchronously (reported by the next event on its stream and by the
 * stream's synchronize, destination untouched), failing allocations and
 * events. The backend keeps working afterwards. */
static void conf_faults(void) {
  size_t n = 1 * MIB;
  void *host = NULL, *dev = NULL;
  REQUIRE(cap_backend_host_alloc(B, n, &host) == 0);
  REQUIRE(cap_backend_device_alloc(B, n, &dev) == 0);
  REQUIRE(cap_backend_pattern_fill(B, dev, n, 1) == 0);
  cap_pattern_fill_host(host, n, 2);
  cap_event_t *ev = NULL;
  REQUIRE(cap_backend_event_create(B, &ev) == 0);
  cap_faultsim_reset();

  cap_faultsim_arm(CAP_FAULT_COPY_SUBMIT, 1, 1);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, dev, host, n), CAP_EDEVICE);
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_H2D), 0);
  CHECK_EQ(cap_backend_pattern_check(B, dev, n, 1), 0);

  cap_faultsim_arm(CAP_FAULT_COPY_ASYNC, 1, 1);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, dev, host, n), 0);
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_H2D), 0);
  CHECK_EQ(cap_backend_event_synchronize(B, ev), CAP_EDEVICE);
  CHECK_EQ(cap_backend_event_query(B, ev), CAP_EDEVICE);
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_H2D), CAP_EDEVICE);
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_H2D), 0); /* cleared */
  CHECK_EQ(cap_backend_pattern_check(B, dev, n, 1), 0); /* nothing moved */
  /* the next copy works and the event reports success again */
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, dev, host, n), 0);
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_H2D), 0);
  CHECK_EQ(cap_backend_event_synchronize(B, ev), 0);
  CHECK_EQ(cap_backend_pattern_check(B, dev, n, 2), 0);

  /* a D2H failure, other direction */
  cap_faultsim_arm(CAP_FAULT_COPY_ASYNC, 1, 1);
  memset(host, 0x5a, n);
  CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_D2H, host, dev, n), 0);
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_D2H), 0);
  CHECK_EQ(cap_backend_event_synchronize(B, ev), CAP_EDEVICE);
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_D2H), CAP_EDEVICE);
  CHECK(((unsigned char *)host)[0] == 0x5a && ((unsigned char *)host)[n - 1] == 0x5a);

  void *p = NULL;
  cap_faultsim_arm(CAP_FAULT_DEVICE_ALLOC, 1, 1);
  CHECK_EQ(cap_backend_device_alloc(B, 4096, &p), CAP_ENOMEM);
  CHECK_EQ(cap_backend_device_alloc(B, 4096, &p), 0);
  cap_backend_device_free(B, p);
  cap_faultsim_arm(CAP_FAULT_HOST_ALLOC, 1, 1);
  CHECK_EQ(cap_backend_host_alloc(B, 4096, &p), CAP_ENOMEM);
  cap_event_t *e2 = NULL;
  cap_faultsim_arm(CAP_FAULT_EVENT, 1, 1);
  CHECK_EQ(cap_backend_event_create(B, &e2), CAP_EDEVICE);
  CHECK(e2 == NULL);
  cap_faultsim_arm(CAP_FAULT_EVENT, 1, 1);
  CHECK_EQ(cap_backend_event_record(B, ev, CAP_STREAM_H2D), CAP_EDEVICE);
  CHECK_EQ(cap_faultsim_injected(CAP_FAULT_COPY_ASYNC), 2);
  cap_faultsim_reset();
  cap_backend_event_destroy(B, ev);
  cap_backend_device_free(B, dev);
  cap_backend_host_free(B, host);
}

/* The BFC allocator over the backend's device memory and pinned host pool:
 * tensors carved out of arenas hold their bytes. */
static void conf_bfc_over_backend(void) {
  cap_bfc_config_t cfg;
  cap_bfc_config_init(&cfg);
  cfg.budget_bytes = 16 * MIB;
  cfg.initial_arena_bytes = 16 * MIB;
  cap_bfc_source_t dsrc, hsrc;
  cap_backend_device_source(B, &dsrc);
  cap_backend_host_source(B, &hsrc);
  cap_bfc_t *dev = NULL, *host = NULL;
  REQUIRE(cap_bfc_create(&cfg, &dsrc, &dev) == 0);
  REQUIRE(cap_bfc_create(&cfg, &hsrc, &host) == 0);
  void *d[8], *h[8];
  for (int i = 0; i < 8; i++) {
    size_t n = (size_t)(i + 1) * 100000;
    REQUIRE(cap_bfc_alloc(dev, n, &d[i]) == 0);
    REQUIRE(cap_bfc_alloc(host, n, &h[i]) == 0);
    CHECK_EQ(cap_backend_pattern_fill(B, d[i], n, (uint64_t)i), 0);
  }
  void *x;
  CHECK_EQ(cap_bfc_alloc(dev, 16 * MIB, &x), CAP_EBUDGET);
  /* swap every tensor out and back into a different place */
  for (int i = 0; i < 8; i++)
    CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_D2H, h[i], d[i], (size_t)(i + 1) * 100000), 0);
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_D2H), 0);
  for (int i = 0; i < 8; i++)
    CHECK_EQ(cap_bfc_free(dev, d[i]), 0);
  for (int i = 7; i >= 0; i--) {
    REQUIRE(cap_bfc_alloc(dev, (size_t)(i + 1) * 100000, &d[i]) == 0);
    CHECK_EQ(cap_backend_copy_async(B, CAP_STREAM_H2D, d[i], h[i], (size_t)(i + 1) * 100000), 0);
  }
  CHECK_EQ(cap_backend_stream_synchronize(B, CAP_STREAM_H2D), 0);
  for (int i = 0; i < 8; i++)
    CHECK_EQ(cap_backend_pattern_check(B, d[i], (size_t)(i + 1) * 100000, (uint64_t)i), 0);
  CHECK_EQ(cap_bfc_validate(dev), 0);
  cap_bfc_destroy(dev);
  cap_bfc_destroy(host);
}

/* Two threads drive the two copy streams at once, each with its own events. */
typedef struct {
  cap_stream_t s;
  int errors;
} thr_arg;

static void *copy_thread(void *arg) {
  thr_arg *a = arg;
  size_t n = 256 * 1024;
  void *host = NULL, *dev = NULL, *back = NULL;
  cap_event_t *ev = NULL;
  if (cap_backend_host_alloc(B, n, &host) || cap_backend_host_alloc(B, n, &back) ||
      cap_backend_device_alloc(B, n, &dev) || cap_backend_event_create(B, &ev)) {
    a->errors++;
    return NULL;
  }
  for (int it = 0; it < 20; it++) {
    uint64_t seed = (uint64_t)a->s * 1000 + (uint64_t)it;
    cap_pattern_fill_host(host, n, seed);
    if (a->s == CAP_STREAM_H2D) {
      a->errors += cap_backend_copy_async(B, CAP_STREAM_H2D, dev, host, n) != 0;
      a->errors += cap_backend_event_record(B, ev, CAP_STREAM_H2D) != 0;
      a->errors += cap_backend_event_synchronize(B, ev) != 0;
      a->errors += cap_backend_read(B, back, dev, n) != 0;
    } else {
      a->errors += cap_backend_write(B, dev, host, n) != 0;
      a->errors += cap_backend_copy_async(B, CAP_STREAM_D2H, back, dev, n) != 0;
      a->errors += cap_backend_event_record(B, ev, CAP_STREAM_D2H) != 0;
      a->errors += cap_backend_event_synchronize(B, ev) != 0;
    }
    a->errors += cap_pattern_check_host(back, n, seed) != 0;
  }
  cap_backend_event_destroy(B, ev);
  cap_backend_device_free(B, dev);
  cap_backend_host_free(B, host);
  cap_backend_host_free(B, back);
  return NULL;
}

static void conf_threads(void) {
  pthread_t t[2];
  thr_arg a[2] = {{CAP_STREAM_H2D, 0}, {CAP_STREAM_D2H, 0}};
  for (int i = 0; i < 2; i++)
    REQUIRE(pthread_create(&t[i], NULL, copy_thread, &a[i]) == 0);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  CHECK_EQ(a[0].errors, 0);
  CHECK_EQ(a[1].errors, 0);
}

/* Copy times against the backend's bandwidths: one way alone, then both
 * directions at once (limited by the duplex bandwidth). Lower bounds are
 * strict where the backend models time (sim); upper bounds are generous. */
static double conf_time_copies(size_t n, bool both, cap_stream_t one) {
  void *h1 = NULL, *h2 = NULL, *d1 = NULL, *d2 = NULL;
  if (cap_backend_host_alloc(B, n, &h1) || cap_backend_host_alloc(B, n, &h2) ||
      cap_backend_device_alloc(B, n, &d1) || cap_backend_device_alloc(B, n, &d2))
    return -1;
  /* touch every page first: first-touch faults are not copy time */
  memset(h1, 1, n);
  memset(h2, 2, n);
  cap_backend_memset(B, d1, 4, n);
  cap_backend_memset(B, d2, 3, n);
  cap_backend_stream_synchronize(B, CAP_STREAM_H2D);
  cap_backend_stream_synchronize(B, CAP_STREAM_D2H);
  cap_backend_pattern_check(B, d2, 8, 0); /* drain the compute stream */
  int64_t t0 = cap_backend_now_ns(B);
  if (both || one == CAP_STREAM_H2D)
    cap_backend_copy_async(B, CAP_STREAM_H2D, d1, h1, n);
  if (both || one == CAP_STREAM_D2H)
    cap_backend_copy_async(B, CAP_STREAM_D2H, h2, d2, n);
  cap_backend_stream_synchronize(B, CAP_STREAM_H2D);
  cap_backend_stream_synchronize(B, CAP_STREAM_D2H);
  int64_t t1 = cap_backend_now_ns(B);
  cap_backend_device_free(B, d1);
  cap_backend_device_free(B, d2);
  cap_backend_host_free(B, h1);
  cap_backend_host_free(B, h2);
  return (double)(t1 - t0);
}

static void conf_bandwidth(size_t n, bool modelled) {
  const cap_backend_info_t *in = cap_backend_info(B);
  double h2d = conf_time_copies(n, false, CAP_STREAM_H2D);
  double d2h = conf_time_copies(n, false, CAP_STREAM_D2H);
  double duo = conf_time_copies(n, true, CAP_STREAM_H2D);
  REQUIRE(h2d > 0 && d2h > 0 && duo > 0);
  double want_h2d = (double)n / in->h2d_gbps, want_d2h = (double)n / in->d2h_gbps;
  double want_duo = 2.0 * (double)n / in->duplex_gbps;
  if (want_duo < want_h2d)
    want_duo = want_h2d;
  if (want_duo < want_d2h)
    want_duo = want_d2h;
  printf("  %zu MiB: H2D %.2f ms (model %.2f), D2H %.2f ms (model %.2f), both %.2f ms "
         "(model %.2f)\n",
         n / MIB, h2d / 1e6, want_h2d / 1e6, d2h / 1e6, want_d2h / 1e6, duo / 1e6,
         want_duo / 1e6);
  double lo = modelled ? 0.97 : 0.5; /* real hardware may beat its probe */
  CHECK(h2d >= lo * want_h2d && h2d <= 3.0 * want_h2d + 100e6);
  CHECK(d2h >= lo * want_d2h && d2h <= 3.0 * want_d2h + 100e6);
  CHECK(duo >= lo * want_duo && duo <= 3.0 * want_duo + 100e6);
}

static size_t conf_big;      /* bytes for the long copies */
static int conf_timing;      /* 0: skip the bandwidth check, 1: the backend
                                models time (sim at a scale where memcpy keeps
                                up), 2: real hardware */

static void conf_event_orders_copies_big(void) { conf_event_orders_copies(conf_big); }
static void conf_compute_waits_on_copy_big(void) { conf_compute_waits_on_copy(conf_big); }
static void conf_copy_waits_on_compute_big(void) { conf_copy_waits_on_compute(conf_big); }
static void conf_event_rerecord_big(void) { conf_event_rerecord(conf_big); }
static void conf_bandwidth_big(void) { conf_bandwidth(conf_big, conf_timing == 1); }

/* Open the backend of conf_cfg, run the suite, close it. big: bytes for the
 * copies that must take milliseconds. */
static void run_conformance(const char *label, size_t big, int timing) {
  printf("conformance: %s\n", label);
  conf_big = big;
  conf_timing = timing;
  int rc = cap_backend_create(&conf_cfg, &B);
  if (rc) {
    fprintf(stderr, "cap_backend_create: %s\n", cap_strerror(rc));
    cap_test_failed++;
    return;
  }
  RUN_TEST(conf_info);
  RUN_TEST(conf_alloc_free);
  RUN_TEST(conf_copy_round_trip);
  RUN_TEST(conf_event_orders_copies_big);
  RUN_TEST(conf_compute_waits_on_copy_big);
  RUN_TEST(conf_copy_waits_on_compute_big);
  RUN_TEST(conf_event_rerecord_big);
  RUN_TEST(conf_run_op);
  RUN_TEST(conf_faults);
  RUN_TEST(conf_bfc_over_backend);
  RUN_TEST(conf_threads);
  if (timing)
    RUN_TEST(conf_bandwidth_big);
  cap_backend_destroy(B);
  B = NULL;
}

#endif
