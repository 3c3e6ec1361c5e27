/*
 * The cuda device backend (compiled only with CAP_WITH_CUDA).
 *
 * Device arenas from cudaMalloc, pinned host memory from cudaHostAlloc, a D2H
 * and an H2D stream created non-blocking at the highest priority (copies that
 * a back-access waits for must not queue behind the framework's kernels),
 * events with timing disabled (cheaper to record and wait on), and
 * cudaStreamWaitEvent for every cross-stream dependency. The synthetic op is
 * a kernel from kernels.cu, embedded as a fatbin and loaded at open.
 *
 * Every CUDA call goes through CK(), which logs the call, file and line of a
 * failure and turns it into CAP_EDEVICE (CAP_ENOMEM for out-of-memory):
 * llm.c's cudaCheck, except that nothing exits.
 */
#include "backend.h"

#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern const unsigned char cap__kernels_fatbin[];
extern const unsigned long cap__kernels_fatbin_size;

static int cuda_err(cudaError_t e, const char *call, const char *file, int line) {
  if (e == cudaSuccess)
    return 0;
  fprintf(stderr, "capuchin: cuda: %s:%d: %s: %s (%s)\n", file, line, call,
          cudaGetErrorString(e), cudaGetErrorName(e));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError(); /* not sticky: clear it so later calls do not see it */
    return CAP_ENOMEM;
  }
  return CAP_EDEVICE;
}
#define CK(call) cuda_err((call), #call, __FILE__, __LINE__)

/* Must match struct cap_kargs in kernels.cu. */
#define KMAX 32
typedef struct {
  unsigned long long ptr, bytes, verify_seed, fill_seed;
  unsigned int flags, pad;
} kbuf;
typedef struct {
  kbuf b[KMAX];
  unsigned int n, pad;
  long long duration_ns;
  unsigned long long *mismatches;
  unsigned long long *sink;
} kargs;
/* The kernel receives these bytes as its parameter, laid out by nvcc from
 * kernels.cu's struct: a field moved on one side only would shift every
 * field after it without any error. kernels.cu asserts the same numbers.
 * (A kernel's parameters may take at most 4 KiB.) */
_Static_assert(sizeof(kbuf) == 40, "kbuf: 4 u64 + 2 u32, as cap_kbuf");
_Static_assert(sizeof(kargs) == 1312, "kargs: as cap_kargs in kernels.cu");
_Static_assert(offsetof(kargs, n) == 1280 &&
                   offsetof(kargs, duration_ns) == 1288 &&
                   offsetof(kargs, mismatches) == 1296 &&
                   offsetof(kargs, sink) == 1304,
               "kargs field offsets, as cap_kargs in kernels.cu");
_Static_assert(sizeof(kargs) <= 4096,
               "CUDA kernel parameters are at most 4 KiB");

typedef struct cu {
  int device;
  cudaStream_t s[CAP_STREAM_COUNT];
  bool own_compute;
  cudaLibrary_t lib;
  cudaKernel_t op_kernel;
  cudaKernel_t take_kernel; /* cap_counter_take */
  int sm_count;
  unsigned long long *d_counters; /* [0] op mismatches, [1] checks, [2] sink */
  unsigned long long *h_counter;  /* pinned, mapped: read-back */
  unsigned long long *h_counter_dev; /* the same word, as the device sees it */
  pthread_mutex_t check_mu;       /* one pattern check at a time uses [1] */
} cu;

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static pthread_once_t avail_once = PTHREAD_ONCE_INIT;
static bool avail;
static void probe_available(void) {
  int n = 0;
  /* No driver or no device: not available, quietly. */
  avail = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
}

static bool cuda_available(void) {
  pthread_once(&avail_once, probe_available);
  return avail;
}

/* The runtime's current device is per thread: set it on every entry from a
 * thread that may not have (cheap when it already is). */
static int use(cu *c) { return CK(cudaSetDevice(c->device)); }

/* The 16 bytes of cudaDeviceProp.uuid as nvidia-smi -L prints them
 * ("GPU-" then 8-4-4-4-12 hex digits): the identity that holds across
 * CUDA_VISIBLE_DEVICES renumbering and containers. */
static void format_uuid(const char b[16], char *out, size_t len) {
  const unsigned char *u = (const unsigned char *)b;
  snprintf(out, len,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
           u[11], u[12], u[13], u[14], u[15]);
}

/* Time `reps` copies of n bytes each way and both at once, with timing
 * events; GB/s figures (bytes per ns). */
static int probe_bandwidth(cu *c, cap_backend_info_t *info) {
  size_t sizes[] = {64u << 20, 256u << 20, 512u << 20};
  size_t max = sizes[2];
  void *h1 = NULL, *h2 = NULL, *d1 = NULL, *d2 = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL, e2 = NULL;
  int rc;
  /* Smaller devices: halve until it fits. */
  while (max >= sizes[0]) {
    if (cudaMalloc(&d1, max) == cudaSuccess && cudaMalloc(&d2, max) == cudaSuccess &&
        cudaHostAlloc(&h1, max, cudaHostAllocDefault) == cudaSuccess &&
        cudaHostAlloc(&h2, max, cudaHostAllocDefault) == cudaSuccess)
      break;
    cudaGetLastError();
    cudaFree(d1);
    cudaFree(d2);
    cudaFreeHost(h1);
    cudaFreeHost(h2);
    d1 = d2 = h1 = h2 = NULL;
    max /= 2;
  }
  if (!d1) {
    fprintf(stderr, "capuchin: cuda: no memory for the bandwidth probe\n");
    return CAP_ENOMEM;
  }
  if ((rc = CK(cudaEventCreate(&e0))) || (rc = CK(cudaEventCreate(&e1))) ||
      (rc = CK(cudaEventCreate(&e2))))
    goto out_free;
  cudaStream_t up = c->s[CAP_STREAM_H2D], down = c->s[CAP_STREAM_D2H];
  /* warm-up */
  if ((rc = CK(cudaMemcpyAsync(d1, h1, sizes[0], cudaMemcpyHostToDevice, up))) ||
      (rc = CK(cudaMemcpyAsync(h2, d2, sizes[0], cudaMemcpyDeviceToHost, down))) ||
      (rc = CK(cudaStreamSynchronize(up))) || (rc = CK(cudaStreamSynchronize(down))))
    goto out_free;
  double best_up = 0, best_down = 0, best_duo = 0;
  for (int k = 0; k < 3; k++) {
    size_t n = sizes[k];
    if (n > max)
      break;
    float ms = 0;
    /* H2D alone */
    if ((rc = CK(cudaEventRecord(e0, up))) ||
        (rc = CK(cudaMemcpyAsync(d1, h1, n, cudaMemcpyHostToDevice, up))) ||
        (rc = CK(cudaEventRecord(e1, up))) || (rc = CK(cudaEventSynchronize(e1))) ||
        (rc = CK(cudaEventElapsedTime(&ms, e0, e1))))
      goto out_free;
    if (ms > 0 && n / (ms * 1e6) > best_up)
      best_up = n / (ms * 1e6);
    /* D2H alone */
    if ((rc = CK(cudaEventRecord(e0, down))) ||
        (rc = CK(cudaMemcpyAsync(h2, d2, n, cudaMemcpyDeviceToHost, down))) ||
        (rc = CK(cudaEventRecord(e1, down))) || (rc = CK(cudaEventSynchronize(e1))) ||
        (rc = CK(cudaEventElapsedTime(&ms, e0, e1))))
      goto out_free;
    if (ms > 0 && n / (ms * 1e6) > best_down)
      best_down = n / (ms * 1e6);
    /* both at once: start together, end when both are done */
    if ((rc = CK(cudaEventRecord(e0, up))) || (rc = CK(cudaStreamWaitEvent(down, e0, 0))) ||
        (rc = CK(cudaMemcpyAsync(d1, h1, n, cudaMemcpyHostToDevice, up))) ||
        (rc = CK(cudaMemcpyAsync(h2, d2, n, cudaMemcpyDeviceToHost, down))) ||
        (rc = CK(cudaEventRecord(e2, down))) || (rc = CK(cudaStreamWaitEvent(up, e2, 0))) ||
        (rc = CK(cudaEventRecord(e1, up))) || (rc = CK(cudaEventSynchronize(e1))) ||
        (rc = CK(cudaEventElapsedTime(&ms, e0, e1))))
      goto out_free;
    if (ms > 0 && 2.0 * n / (ms * 1e6) > best_duo)
      best_duo = 2.0 * n / (ms * 1e6);
  }
  info->h2d_gbps = best_up;
  info->d2h_gbps = best_down;
  info->duplex_gbps = best_duo;
  rc = 0;
out_free:
  if (e0)
    cudaEventDestroy(e0);
  if (e1)
    cudaEventDestroy(e1);
  if (e2)
    cudaEventDestroy(e2);
  cudaFree(d1);
  cudaFree(d2);
  cudaFreeHost(h1);
  cudaFreeHost(h2);
  return rc;
}

static void cuda_close(void *impl);
static int launch(cu *c, const cap_op_buf_t *bufs, size_t n,
                  int64_t duration_ns, unsigned long long *counter);
static int64_t read_counter(cu *c, int slot);

static int cuda_open(const cap_backend_config_t *cfg, cap_backend_info_t *info, void **impl) {
  cu *c = calloc(1, sizeof *c);
  if (!c)
    return CAP_ENOMEM;
  int rc;
  c->device = cfg->device_index;
  if (pthread_mutex_init(&c->check_mu, NULL)) {
    free(c);
    return CAP_ENOMEM;
  }
  int ndev = 0;
  if ((rc = CK(cudaGetDeviceCount(&ndev))))
    goto out_close;
  if (c->device >= ndev) {
    fprintf(stderr, "capuchin: cuda: device %d requested, %d present\n", c->device, ndev);
    rc = CAP_EINVAL;
    goto out_close;
  }
  if ((rc = use(c)))
    goto out_close;
  struct cudaDeviceProp prop;
  if ((rc = CK(cudaGetDeviceProperties(&prop, c->device))))
    goto out_close;
  snprintf(info->device_name, sizeof info->device_name, "%.127s", prop.name);
  info->total_bytes = prop.totalGlobalMem;
  format_uuid(prop.uuid.bytes, info->device_uuid, sizeof info->device_uuid);
  info->device_index = c->device;
  info->time_scale = 1.0;
  c->sm_count = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
  int least = 0, greatest = 0;
  if ((rc = CK(cudaDeviceGetStreamPriorityRange(&least, &greatest))))
    goto out_close;
  if ((rc = CK(cudaStreamCreateWithPriority(&c->s[CAP_STREAM_D2H], cudaStreamNonBlocking,
                                             greatest))) ||
      (rc = CK(cudaStreamCreateWithPriority(&c->s[CAP_STREAM_H2D], cudaStreamNonBlocking,
                                             greatest))))
    goto out_close;
  c->s[CAP_STREAM_COMPUTE] = (cudaStream_t)cfg->compute_stream; /* NULL: legacy */
  if ((rc = CK(cudaLibraryLoadData(&c->lib, cap__kernels_fatbin, NULL, NULL, 0,
                                   NULL, NULL, 0))) ||
      (rc = CK(cudaLibraryGetKernel(&c->op_kernel, c->lib, "cap_op_kernel"))) ||
      (rc = CK(
           cudaLibraryGetKernel(&c->take_kernel, c->lib, "cap_counter_take"))))
    goto out_close;
  if ((rc = CK(cudaMalloc((void **)&c->d_counters,
                          3 * sizeof(unsigned long long)))) ||
      (rc = CK(cudaMemset(c->d_counters, 0, 3 * sizeof(unsigned long long)))) ||
      (rc = CK(cudaHostAlloc((void **)&c->h_counter, sizeof(unsigned long long),
                             cudaHostAllocMapped))) ||
      (rc = CK(cudaHostGetDevicePointer((void **)&c->h_counter_dev,
                                        c->h_counter, 0))))
    goto out_close;
  /* Load the kernels now. CUDA loads a library's kernels at their first
   * launch, and loading may wait for the whole device: a job's first
   * integrity check would wait for every copy then in flight. */
  int64_t r;
  if ((rc = launch(c, NULL, 0, 0, c->d_counters + 2)) ||
      (r = read_counter(c, 2)) < 0) {
    rc = rc ? rc : (int)r;
    goto out_close;
  }
  if (!cfg->skip_bandwidth_probe && (rc = probe_bandwidth(c, info)))
    goto out_close;
  *impl = c;
  return 0;
out_close:
  cuda_close(c);
  return rc;
}

static void cuda_close(void *impl) {
  cu *c = impl;
  cudaSetDevice(c->device);
  for (int i = 0; i < CAP_STREAM_COUNT; i++)
    if (c->s[i] || i == CAP_STREAM_COMPUTE)
      cudaStreamSynchronize(c->s[i]);
  if (c->s[CAP_STREAM_D2H])
    CK(cudaStreamDestroy(c->s[CAP_STREAM_D2H]));
  if (c->s[CAP_STREAM_H2D])
    CK(cudaStreamDestroy(c->s[CAP_STREAM_H2D]));
  if (c->d_counters)
    CK(cudaFree(c->d_counters));
  if (c->h_counter)
    CK(cudaFreeHost(c->h_counter));
  if (c->lib)
    CK(cudaLibraryUnload(c->lib));
  pthread_mutex_destroy(&c->check_mu);
  free(c);
}

static int64_t cuda_now(void *impl) {
  (void)impl;
  return mono_ns();
}

static int cuda_device_alloc(void *impl, size_t bytes, void **ptr) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError(); /* an expected outcome, not worth a log line */
    return CAP_ENOMEM;
  }
  if ((rc = CK(e)))
    return rc;
  *ptr = p; /* cudaMalloc aligns to at least 256 bytes */
  return 0;
}

static void cuda_device_free(void *impl, void *ptr) {
  cu *c = impl;
  if (use(c) == 0)
    CK(cudaFree(ptr));
}

static int cuda_host_alloc(void *impl, size_t bytes, void **ptr) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  void *p = NULL;
  if ((rc = CK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault))))
    return rc;
  *ptr = p; /* page aligned */
  return 0;
}

static void cuda_host_free(void *impl, void *ptr) {
  cu *c = impl;
  if (use(c) == 0)
    CK(cudaFreeHost(ptr));
}

static int cuda_copy_async(void *impl, cap_stream_t s, void *dst, const void *src,
                           size_t bytes) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  return CK(cudaMemcpyAsync(dst, src, bytes,
                            s == CAP_STREAM_D2H ? cudaMemcpyDeviceToHost
                                                : cudaMemcpyHostToDevice,
                            c->s[s]));
}

static int cuda_event_create(void *impl, void **ev) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  cudaEvent_t e = NULL;
  if ((rc = CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming))))
    return rc;
  *ev = e;
  return 0;
}

static void cuda_event_destroy(void *impl, void *ev) {
  (void)impl;
  CK(cudaEventDestroy((cudaEvent_t)ev));
}

static int cuda_event_record(void *impl, void *ev, cap_stream_t s) {
  cu *c = impl;
  return CK(cudaEventRecord((cudaEvent_t)ev, c->s[s]));
}

static int cuda_stream_wait_event(void *impl, cap_stream_t s, void *ev) {
  cu *c = impl;
  return CK(cudaStreamWaitEvent(c->s[s], (cudaEvent_t)ev, 0));
}

static int cuda_event_query(void *impl, void *ev) {
  (void)impl;
  cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
  if (e == cudaErrorNotReady)
    return 0;
  int rc = CK(e);
  return rc ? rc : 1;
}

static int cuda_event_synchronize(void *impl, void *ev) {
  (void)impl;
  return CK(cudaEventSynchronize((cudaEvent_t)ev));
}

static int cuda_stream_synchronize(void *impl, cap_stream_t s) {
  cu *c = impl;
  return CK(cudaStreamSynchronize(c->s[s]));
}

/* One launch of the op kernel over up to KMAX buffers. */
static int launch(cu *c, const cap_op_buf_t *bufs, size_t n, int64_t duration_ns,
                  unsigned long long *counter) {
  kargs a;
  memset(&a, 0, sizeof a);
  unsigned long long words = 0;
  for (size_t i = 0; i < n; i++) {
    a.b[i].ptr = (unsigned long long)(uintptr_t)bufs[i].ptr;
    a.b[i].bytes = bufs[i].bytes;
    a.b[i].verify_seed = bufs[i].verify_seed;
    a.b[i].fill_seed = bufs[i].fill_seed;
    a.b[i].flags = bufs[i].flags;
    if (bufs[i].bytes / 8 > words)
      words = bufs[i].bytes / 8;
  }
  a.n = (unsigned)n;
  a.duration_ns = duration_ns;
  a.mismatches = counter;
  a.sink = c->d_counters + 2;
  /* Enough threads to stream the biggest buffer at full bandwidth; one block
   * when there is nothing but time to spend. */
  unsigned long long blocks = (words + 255) / 256;
  unsigned long long cap = (unsigned long long)c->sm_count * 8;
  if (blocks > cap)
    blocks = cap;
  if (blocks == 0)
    blocks = 1;
  dim3 grid = {(unsigned)blocks, 1, 1}, block = {256, 1, 1};
  void *args[] = {&a};
  return CK(cudaLaunchKernel((const void *)c->op_kernel, grid, block, args, 0,
                             c->s[CAP_STREAM_COMPUTE]));
}

static int cuda_run_op(void *impl, int64_t duration_ns, const cap_op_buf_t *bufs, size_t n) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  /* More than KMAX buffers: several launches, the time on the last. */
  size_t done = 0;
  do {
    size_t k = n - done > KMAX ? KMAX : n - done;
    bool last = done + k == n;
    if ((rc = launch(c, k ? bufs + done : NULL, k, last ? duration_ns : 0, c->d_counters)))
      return rc;
    done += k;
  } while (done < n);
  return 0;
}

static int cuda_pattern_fill(void *impl, void *dev, size_t bytes, uint64_t seed) {
  cap_op_buf_t b = {.ptr = dev, .bytes = bytes, .fill_seed = seed, .flags = CAP_OPBUF_FILL};
  return cuda_run_op(impl, 0, &b, 1);
}

static int cuda_memset(void *impl, void *dev, int byte, size_t bytes) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  return CK(cudaMemsetAsync(dev, byte, bytes, c->s[CAP_STREAM_COMPUTE]));
}

/* Read counter slot `slot` back and zero it, in compute-stream order: a
 * one-thread kernel stores it into mapped pinned memory (cap_counter_take:
 * no copy engine, so the read never waits behind a swap's copy). */
static int64_t read_counter(cu *c, int slot) {
  unsigned long long *counter = c->d_counters + slot;
  void *args[] = {&counter, &c->h_counter_dev};
  dim3 one = {1, 1, 1};
  int rc;
  if ((rc = CK(cudaLaunchKernel((const void *)c->take_kernel, one, one, args, 0,
                                c->s[CAP_STREAM_COMPUTE]))) ||
      (rc = CK(cudaStreamSynchronize(c->s[CAP_STREAM_COMPUTE]))))
    return rc;
  return (int64_t) * (volatile unsigned long long *)c->h_counter;
}

static int64_t cuda_pattern_check(void *impl, const void *dev, size_t bytes, uint64_t seed) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  cap_op_buf_t b = {.ptr = (void *)dev, .bytes = bytes, .verify_seed = seed,
                    .flags = CAP_OPBUF_VERIFY};
  pthread_mutex_lock(&c->check_mu);
  int64_t r = launch(c, &b, 1, 0, c->d_counters + 1);
  if (r == 0)
    r = read_counter(c, 1);
  pthread_mutex_unlock(&c->check_mu);
  return r;
}

static int cuda_mismatches(void *impl, uint64_t *count) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  pthread_mutex_lock(&c->check_mu);
  int64_t r = read_counter(c, 0);
  pthread_mutex_unlock(&c->check_mu);
  if (r < 0)
    return (int)r;
  *count = (uint64_t)r;
  return 0;
}

static int cuda_read(void *impl, void *host_dst, const void *dev_src, size_t bytes) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  if ((rc = CK(cudaStreamSynchronize(c->s[CAP_STREAM_COMPUTE]))))
    return rc;
  return CK(cudaMemcpy(host_dst, dev_src, bytes, cudaMemcpyDeviceToHost));
}

static int cuda_write(void *impl, void *dev_dst, const void *host_src, size_t bytes) {
  cu *c = impl;
  int rc = use(c);
  if (rc)
    return rc;
  if ((rc = CK(cudaStreamSynchronize(c->s[CAP_STREAM_COMPUTE]))))
    return rc;
  return CK(cudaMemcpy(dev_dst, host_src, bytes, cudaMemcpyHostToDevice));
}

const cap_backend_ops_t cap__backend_cuda = {
    .name = "cuda",
    .available = cuda_available,
    .open = cuda_open,
    .close = cuda_close,
    .now_ns = cuda_now,
    .device_alloc = cuda_device_alloc,
    .device_free = cuda_device_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_async = cuda_copy_async,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .stream_synchronize = cuda_stream_synchronize,
    .run_op = cuda_run_op,
    .pattern_fill = cuda_pattern_fill,
    .memset = cuda_memset,
    .pattern_check = cuda_pattern_check,
    .mismatches = cuda_mismatches,
    .read = cuda_read,
    .write = cuda_write,
};
