/*
 * Device backends: one small vtable, two implementations (DESIGN.md,
 * "Device backend interface").
 *
 *   cuda  device memory from cudaMalloc (big arenas, carved up by the BFC
 *         allocator, bfc.h), pinned host memory from cudaHostAlloc, a D2H and
 *         an H2D stream created non-blocking at the highest priority, events
 *         with timing disabled, cudaStreamWaitEvent for cross-stream order.
 *   sim   host memory stands in for the device; two copy-engine threads move
 *         the bytes (real memcpy) and take as long as the configured
 *         bandwidths say, overlapping up to the duplex bandwidth; the compute
 *         stream is the calling thread, whose ops pass on a clock that can be
 *         scaled. Events and stream waits have CUDA's semantics.
 *
 * The client calls the cap_backend_* functions below, never the vtable
 * directly: they check arguments, apply fault injection (faultsim.h) the same
 * way for every backend, and dispatch.
 *
 * Streams. Three per backend, named by cap_stream_t:
 *   CAP_STREAM_COMPUTE  where ops run. cuda: the stream given in the config
 *                       (NULL: the legacy default stream). sim: the calling
 *                       thread itself, so compute work is finished when the
 *                       call returns; recording an event on it completes the
 *                       event at once, and making it wait on an event blocks
 *                       the caller until the event completes (which is what
 *                       cudaStreamWaitEvent means for the work issued after).
 *   CAP_STREAM_D2H      device-to-host copies, in submission order.
 *   CAP_STREAM_H2D      host-to-device copies, in submission order.
 * Copies in one direction run one at a time; the two directions overlap.
 *
 * Threads. Every function may be called from any thread (as the CUDA runtime
 * allows), but work submitted to one stream from two threads at once has no
 * defined order between the two callers. A backend and its events must be
 * destroyed by one thread once nothing else uses them.
 *
 * Time. cap_backend_now_ns() is the backend's clock in nanoseconds. sim: trace
 * time, that is real time divided by the time scale (time_scale 0.01 runs 100x
 * faster than real time; durations and bandwidths are in trace time). cuda:
 * CLOCK_MONOTONIC; the time scale does not apply.
 *
 * Errors. 0 or a negative CAP_E* code. A failed CUDA call becomes CAP_EDEVICE
 * (CAP_ENOMEM for out-of-memory) and is logged to stderr with file and line;
 * nothing here exits or aborts. An asynchronous copy failure (real, or
 * injected with CAP_FAULT_COPY_ASYNC) is reported by the next event recorded
 * on that copy's stream (query/synchronize return CAP_EDEVICE) and by
 * cap_backend_stream_synchronize() on that stream; the destination bytes are
 * then unspecified (sim: left as they were).
 */
#ifndef CAP_CLIENT_BACKEND_H
#define CAP_CLIENT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capuchin/error.h"

typedef enum {
  CAP_STREAM_COMPUTE = 0,
  CAP_STREAM_D2H = 1,
  CAP_STREAM_H2D = 2,
  CAP_STREAM_COUNT = 3
} cap_stream_t;

typedef struct cap_backend cap_backend_t;
typedef struct cap_event cap_event_t;

/* Defaults: an H100's memory, and its bandwidths (CAP_BANDWIDTH_H100,
 * capuchin/sim.h). */
#define CAP_BACKEND_DEFAULT_SIM_DEVICE_BYTES (80ull << 30)
/* Every sim device is this one unless configured otherwise, so that sim
 * jobs on one machine share a budget as they always did. */
#define CAP_BACKEND_DEFAULT_SIM_UUID "SIM-00000000-0000-0000-0000-000000000000"
/* Every device and host allocation is aligned to this many bytes. */
#define CAP_BACKEND_ALIGN 256u

typedef struct cap_backend_config {
  const char *name;      /* "sim", "cuda", or NULL / "auto": cuda when it is
                            compiled in and a GPU is present, else sim */
  int device_index;      /* cuda device ordinal (0) */
  void *compute_stream;  /* cuda: cudaStream_t the ops run on (NULL: legacy
                            default stream); sim: ignored */
  /* sim only (0 means the default) */
  uint64_t sim_device_bytes;   /* device capacity, bytes (80 GiB) */
  double time_scale;           /* real ns per trace ns (1.0) */
  double sim_h2d_gbps;         /* GB/s = bytes per trace ns (55.1) */
  double sim_d2h_gbps;         /* (55.1) */
  double sim_duplex_gbps;      /* both directions at once, total (85.8) */
  const char *sim_device_uuid; /* the device's identity (NULL:
                                  $CAPUCHIN_SIM_DEVICE_UUID, else
                                  CAP_BACKEND_DEFAULT_SIM_UUID) */
  /* cuda only: skip the bandwidth probe at open (then the bandwidths read
   * 0 in cap_backend_info); the probe takes well under a second. */
  bool skip_bandwidth_probe;
} cap_backend_config_t;

typedef struct cap_backend_info {
  char backend[8];        /* "sim" or "cuda" */
  char device_name[128];  /* "NVIDIA H100 80GB HBM3", "sim" */
  char device_uuid[64];   /* as nvidia-smi prints it: "GPU-6a0f3c2e-..." */
  int device_index;
  uint64_t total_bytes;   /* device memory */
  double h2d_gbps;        /* measured (cuda) or configured (sim), GB/s */
  double d2h_gbps;
  double duplex_gbps;     /* both directions at once, total GB/s */
  double time_scale;      /* sim: as configured; cuda: 1.0 */
} cap_backend_info_t;

/* Fill cfg with the defaults (name NULL: auto). */
void cap_backend_config_init(cap_backend_config_t *cfg);

/* True if the named backend ("sim", "cuda") is compiled into this build and,
 * for cuda, a GPU is present (cudaGetDeviceCount succeeds and is > 0). */
bool cap_backend_available(const char *name);

/* Open a backend: create its streams and copy engines and (cuda) measure the
 * copy bandwidths with 64-512 MiB pinned copies each way and both at once.
 * Returns CAP_EINVAL for a bad config, CAP_ENOENT for an unknown name,
 * CAP_EUNSUPPORTED when cuda is asked for but not compiled in or no GPU is
 * present, CAP_EDEVICE / CAP_ENOMEM when the device fails. *out is set only
 * on success. Any thread. */
int cap_backend_create(const cap_backend_config_t *cfg, cap_backend_t **out);

/* Synchronize every stream, stop the copy engines and free the backend.
 * Device and host memory not yet freed is released with it. NULL is a no-op. */
void cap_backend_destroy(cap_backend_t *b);

/* Name, device and bandwidths; valid for the backend's lifetime. */
const cap_backend_info_t *cap_backend_info(const cap_backend_t *b);

/* The backend's clock, ns (see "Time" above). Any thread. */
int64_t cap_backend_now_ns(const cap_backend_t *b);

/* --- Memory ---------------------------------------------------------------- */

/* Allocate `bytes` of device memory (an arena: the BFC allocator carves
 * tensors out of it), aligned to CAP_BACKEND_ALIGN. CAP_ENOMEM when the
 * device has no room (sim: beyond sim_device_bytes in total), CAP_EDEVICE
 * for other device failures. Synchronous. */
int cap_backend_device_alloc(cap_backend_t *b, size_t bytes, void **ptr);
/* Free an arena from cap_backend_device_alloc. The caller ensures no stream
 * still uses it. NULL is a no-op. */
void cap_backend_device_free(cap_backend_t *b, void *ptr);

/* Allocate `bytes` of pinned host memory, aligned to CAP_BACKEND_ALIGN.
 * Pinning is slow (cuda: ~0.5 ms per MiB), so allocate a pool once and carve
 * it with a BFC allocator (cap_backend_host_source) rather than per copy. */
int cap_backend_host_alloc(cap_backend_t *b, size_t bytes, void **ptr);
void cap_backend_host_free(cap_backend_t *b, void *ptr);

/* --- Copies and events ----------------------------------------------------- */

/* Copy `bytes` asynchronously on a copy stream: CAP_STREAM_D2H copies device
 * `src` to host `dst`, CAP_STREAM_H2D copies host `src` to device `dst`
 * (host memory must come from cap_backend_host_alloc). Returns once the copy
 * is queued; it runs after everything queued on that stream before it.
 * CAP_EINVAL for CAP_STREAM_COMPUTE or NULL pointers; CAP_EDEVICE when the
 * copy cannot be queued (nothing was queued then). */
int cap_backend_copy_async(cap_backend_t *b, cap_stream_t s, void *dst,
                           const void *src, size_t bytes);

/* Create / destroy an event (cuda: cudaEventDisableTiming). A new event
 * counts as complete. Destroying an event with work pending is allowed (as
 * in CUDA): the pending record simply has no observer. NULL is a no-op. */
int cap_backend_event_create(cap_backend_t *b, cap_event_t **ev);
void cap_backend_event_destroy(cap_backend_t *b, cap_event_t *ev);

/* Record ev on stream s: it completes when everything queued on s before
 * this call has completed. Re-recording replaces the previous record for
 * later queries and waits (cudaEventRecord). */
int cap_backend_event_record(cap_backend_t *b, cap_event_t *ev,
                             cap_stream_t s);

/* Make stream s wait, without a host wait, until ev's latest record (as of
 * this call) completes: work queued on s afterwards starts only then
 * (cudaStreamWaitEvent). sim, s == CAP_STREAM_COMPUTE: blocks the caller. */
int cap_backend_stream_wait_event(cap_backend_t *b, cap_stream_t s,
                                  cap_event_t *ev);

/* 1 if ev's latest record has completed (or it was never recorded), 0 if it
 * is pending, CAP_EDEVICE if the work before it failed. Never blocks. */
int cap_backend_event_query(cap_backend_t *b, cap_event_t *ev);

/* How many cap_backend_event_query calls b has answered (each one is a
 * driver call on a GPU: what polling costs the host). */
uint64_t cap_backend_event_queries(const cap_backend_t *b);

/* Block the calling thread until ev's latest record completes. 0, or
 * CAP_EDEVICE if the work before it failed. */
int cap_backend_event_synchronize(cap_backend_t *b, cap_event_t *ev);

/* Block until everything queued on s has completed. 0, or CAP_EDEVICE if any
 * of it failed since the last synchronize of s (the failure is then cleared). */
int cap_backend_stream_synchronize(cap_backend_t *b, cap_stream_t s);

/* --- Synthetic ops and integrity patterns ----------------------------------- */

/* The integrity pattern: 8-byte little-endian word i of a buffer filled with
 * `seed` is cap_pattern_word(seed, i) = mix(seed) + i * K (K odd), a trailing
 * partial word holds the low bytes of its word. Every position differs, every
 * seed starts elsewhere, and filling or checking it runs at memory speed (one
 * add per word). */
static inline uint64_t cap_pattern_base(uint64_t seed) {
  uint64_t z = seed + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
#define CAP_PATTERN_STEP 0x9e3779b97f4a7c15ull
static inline uint64_t cap_pattern_word(uint64_t seed, uint64_t i) {
  return cap_pattern_base(seed) + i * CAP_PATTERN_STEP;
}

/* Host helpers for the pattern (sim backend, tests, host-side checks):
 * fill, and count the mismatching words (a partial last word counts as one). */
void cap_pattern_fill_host(void *p, size_t bytes, uint64_t seed);
uint64_t cap_pattern_check_host(const void *p, size_t bytes, uint64_t seed);

enum {
  CAP_OPBUF_VERIFY = 1u << 0, /* check it holds pattern verify_seed; count
                                 mismatching words (cap_backend_mismatches) */
  CAP_OPBUF_FILL = 1u << 1,   /* write pattern fill_seed (after all verifies) */
};

/* One buffer an op touches. An input is VERIFY, an output FILL, an in-place
 * tensor both (checked against its old seed, then rewritten with its new
 * one). A buffer with neither flag is only read (cuda: touched). */
typedef struct cap_op_buf {
  void *ptr;            /* device memory */
  size_t bytes;
  uint64_t verify_seed;
  uint64_t fill_seed;
  uint32_t flags;       /* CAP_OPBUF_* */
} cap_op_buf_t;

/* Run a synthetic op on the compute stream for `duration_ns` (trace time),
 * reading and writing `bufs` as their flags say; the time spent on the
 * buffers counts towards the duration (it runs longer only if the buffer
 * work alone takes longer). sim: the caller returns when the op has ended
 * on the backend's clock (it sleeps, scaled by time_scale; the op starts
 * when the previous one ended if the caller came back at once, so sleep
 * overshoot does not accumulate). cuda: one kernel launch, returns at once;
 * durations are real time. capuchin-replay's stand-in for a framework op. */
int cap_backend_run_op(cap_backend_t *b, int64_t duration_ns,
                       const cap_op_buf_t *bufs, size_t n);

/* Fill device memory with the pattern of `seed`, or set every byte to
 * `byte`, on the compute stream (asynchronous on cuda). sim: done by the
 * caller's thread at memory speed, and that time passes on the clock as
 * extra compute time; inside cap_backend_run_op it counts towards the op's
 * duration instead. */
int cap_backend_pattern_fill(cap_backend_t *b, void *dev, size_t bytes,
                             uint64_t seed);
int cap_backend_memset(cap_backend_t *b, void *dev, int byte, size_t bytes);

/* Check device memory against the pattern of `seed` after everything on the
 * compute stream: waits for the compute stream, returns the number of
 * mismatching words (>= 0) or a negative CAP_E*. */
int64_t cap_backend_pattern_check(cap_backend_t *b, const void *dev,
                                  size_t bytes, uint64_t seed);

/* Mismatching words counted by CAP_OPBUF_VERIFY since the last call: waits
 * for the compute stream, stores the count in *count and resets it. */
int cap_backend_mismatches(cap_backend_t *b, uint64_t *count);

/* Synchronous copies for tests and debugging, ordered after the compute
 * stream: read device memory into any host buffer, or write it. */
int cap_backend_read(cap_backend_t *b, void *host_dst, const void *dev_src,
                     size_t bytes);
int cap_backend_write(cap_backend_t *b, void *dev_dst, const void *host_src,
                      size_t bytes);

/* --- Arena sources for the BFC allocator ------------------------------------ */

struct cap_bfc_source;
/* Fill src so that a BFC allocator takes its arenas from this backend's
 * device memory (cap_backend_device_alloc) or pinned host memory. */
void cap_backend_device_source(cap_backend_t *b, struct cap_bfc_source *src);
void cap_backend_host_source(cap_backend_t *b, struct cap_bfc_source *src);

/* --- The vtable (backend implementations only) ------------------------------ */

/* What each implementation provides; the wrappers above have already checked
 * arguments and applied fault injection. `impl` is the implementation's own
 * state, events are the implementation's own event objects. Returns follow
 * the wrappers' rules. */
typedef struct cap_backend_ops {
  const char *name;
  bool (*available)(void);
  int (*open)(const cap_backend_config_t *cfg, cap_backend_info_t *info,
              void **impl);
  void (*close)(void *impl);
  int64_t (*now_ns)(void *impl);
  int (*device_alloc)(void *impl, size_t bytes, void **ptr);
  void (*device_free)(void *impl, void *ptr);
  int (*host_alloc)(void *impl, size_t bytes, void **ptr);
  void (*host_free)(void *impl, void *ptr);
  int (*copy_async)(void *impl, cap_stream_t s, void *dst, const void *src,
                    size_t bytes);
  int (*event_create)(void *impl, void **ev);
  void (*event_destroy)(void *impl, void *ev);
  int (*event_record)(void *impl, void *ev, cap_stream_t s);
  int (*stream_wait_event)(void *impl, cap_stream_t s, void *ev);
  int (*event_query)(void *impl, void *ev);
  int (*event_synchronize)(void *impl, void *ev);
  int (*stream_synchronize)(void *impl, cap_stream_t s);
  int (*run_op)(void *impl, int64_t duration_ns, const cap_op_buf_t *bufs,
                size_t n);
  int (*pattern_fill)(void *impl, void *dev, size_t bytes, uint64_t seed);
  int (*memset)(void *impl, void *dev, int byte, size_t bytes);
  int64_t (*pattern_check)(void *impl, const void *dev, size_t bytes,
                           uint64_t seed);
  int (*mismatches)(void *impl, uint64_t *count);
  int (*read)(void *impl, void *host_dst, const void *dev_src, size_t bytes);
  int (*write)(void *impl, void *dev_dst, const void *host_src, size_t bytes);
} cap_backend_ops_t;

extern const cap_backend_ops_t cap__backend_sim;
#ifdef CAP_WITH_CUDA
extern const cap_backend_ops_t cap__backend_cuda;
#endif

#endif /* CAP_CLIENT_BACKEND_H */
