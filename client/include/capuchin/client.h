/*
 * libcapuchin-client: the library a training job links.
 *
 * It reports every tensor access to capuchind, receives plans and carries
 * them out: swapping tensors to pinned host memory and prefetching them back
 * on its own copy streams, or dropping them and recomputing them through the
 * framework (DESIGN.md, "Plan semantics").
 *
 * Threads. A client has one *owner thread*: the training thread that created
 * it. Every function below is called from the owner thread only unless its
 * comment says otherwise; none of them is re-entrant from a recompute
 * callback except those the callback's comment names. Internally the client
 * runs one reporter thread (socket I/O, plan reception, reconnection) and
 * the backend's copy machinery; the owner thread never blocks on the socket.
 *
 * Streams. "Compute stream" is the stream the framework runs its ops on
 * (the cuda backend: the stream given in the config, default the legacy
 * stream; the sim backend: the owner thread itself). The client issues
 * device-to-host copies on its own D2H stream and host-to-device copies on
 * its own H2D stream; when op begin returns, every input and output of the
 * op is ready *in compute-stream order* (the cuda backend: the compute
 * stream waits on the copy's event, no host wait).
 *
 * Memory. Two ownership models share the executor (DESIGN.md, "Two ways a
 * framework holds memory"); this API serves the first (capuchin/framework.h
 * adds the second, where the framework owns it): the client owns the
 * device memory of every tensor it knows, allocating it from a budgeted
 * best-fit allocator. Addresses may change whenever a tensor leaves the
 * device and comes back; only the pointers op begin returns are valid, until
 * the matching op end.
 *
 * Errors. Functions that act return 0 or a negative CAP_E* code
 * (capuchin/error.h; cap_strerror() gives the message). The client never
 * calls exit() or abort(); after an error the job may carry on.
 */
#ifndef CAPUCHIN_CLIENT_H
#define CAPUCHIN_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capuchin/error.h"
#include "capuchin/extern.h"
#include "capuchin/types.h" /* cap_tensor_kind_t, CAP_NONE */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cap_client cap_client_t;

/* How an iteration ran. */
typedef enum {
  CAP_MODE_MEASURED = 0, /* reported to the daemon to build a profile; LRU
                            swapping on demand if over budget */
  CAP_MODE_GUIDED = 1,   /* a plan from the daemon drives evictions */
  CAP_MODE_PASSIVE = 2,  /* no plan and nothing being measured (no daemon,
                            or a measurement already reported): LRU only */
} cap_mode_t;

/* Name of a mode ("measured", "guided", "passive"). Not cap_mode_name:
 * libcap exports that name, and a process that loads libcap globally (as
 * PyTorch does, through libudev) would bind callers to libcap's. */
CAP_EXTERN const char *cap_client_mode_name(cap_mode_t m);

typedef struct cap_client_config {
  /* Daemon socket. NULL: $CAPUCHIN_SOCKET, else the daemon's default,
   * /run/capuchin/capuchind.sock as root or
   * $XDG_RUNTIME_DIR/capuchin/capuchind.sock otherwise. */
  const char *socket_path;
  const char *job_name;  /* shown by capuchin-query; NULL: "job-<pid>" */
  uint64_t budget_bytes; /* device bytes the job may use, persistent included;
                            0: no limit beyond the device's memory */
  const char *backend;   /* "sim", "cuda", or NULL: cuda when a GPU is
                            present, else sim */
  int device_index;      /* cuda device ordinal (default 0) */
  void *compute_stream;  /* cuda: the framework's cudaStream_t (NULL: the
                            legacy default stream); ignored by sim */
  /* sim backend: device memory (0: 80 GiB as on an H100), the clock scale
   * (time_scale 0.01 runs 100x faster than the trace) and the modelled copy
   * bandwidths (0: the H100 figures of FORMAT.md). */
  uint64_t sim_device_bytes;
  double time_scale;
  double sim_h2d_gbps, sim_d2h_gbps, sim_duplex_gbps;
  /* sim backend: the device's UUID; jobs with the same one share its
   * memory (NULL: $CAPUCHIN_SIM_DEVICE_UUID, else one UUID for every sim
   * job of the machine). The cuda backend reports the GPU's own. */
  const char *sim_device_uuid;
  uint64_t host_pool_bytes; /* pinned host memory for swaps to allocate (and
                               touch) at create, so that the first swaps do
                               not pay for pinning or page faults; the pool
                               grows on demand beyond it (0: all on demand) */
  bool no_daemon;           /* never connect: passive mode throughout */
  uint32_t ring_records;    /* recorder ring capacity, records (power of two,
                               default 65536) */
  uint32_t reconnect_ms;    /* delay between reconnection attempts (200) */
  uint32_t connect_timeout_ms; /* first connection wait at create (1000);
                                  the job starts passive if it fails */
  uint64_t host_pool_cap_bytes; /* the most pinned host memory swaps may
                                   hold (0: no cap); a swap-out that does
                                   not fit keeps its tensor on the device */
  bool framework_memory;    /* the framework owns the tensors' device memory
                               (capuchin/framework.h): take no budget-sized
                               arena at create */
} cap_client_config_t;

/* Fill cfg with the defaults above. */
CAP_EXTERN void cap_client_config_init(cap_client_config_t *cfg);

/* The socket path the config resolves to (config, $CAPUCHIN_SOCKET or the
 * default), written to buf. Returns 0, or CAP_ERANGE if it does not fit. */
CAP_EXTERN int cap_client_socket_path(const cap_client_config_t *cfg, char *buf,
                                      size_t len);

/* Open a client: open the backend, measure its bandwidths, start the
 * reporter thread and connect to the daemon (waiting at most
 * connect_timeout_ms; without a daemon the client runs passive and keeps
 * trying in the background). *out is the caller's; destroy it with
 * cap_client_destroy. The calling thread becomes the owner thread.
 * Returns CAP_EINVAL (bad config), CAP_EUNSUPPORTED (backend not compiled
 * in or no GPU), CAP_EDEVICE, CAP_ENOMEM. */
CAP_EXTERN int cap_client_create(const cap_client_config_t *cfg,
                                 cap_client_t **out);

/* Flush what is recorded, say Bye, stop the reporter thread, release every
 * tensor's memory and the backend. NULL is a no-op. Owner thread. */
CAP_EXTERN void cap_client_destroy(cap_client_t *c);

/* --- Tensors ---------------------------------------------------------------
 * Tensor ids are dense from 0 and stable across iterations (DESIGN.md):
 * a persistent tensor keeps the id it was registered with; the i-th
 * transient tensor declared in an iteration gets the id the i-th transient
 * declaration of the first iteration got. */

/* Register a persistent tensor (weights, optimizer state, the batch buffer)
 * of `bytes` and allocate its device memory now. May be called before the
 * first iteration or inside any iteration. *id receives its id, *dev (if
 * non-NULL) its current device address. Returns CAP_EBUDGET when it cannot
 * fit even after evicting everything evictable. */
CAP_EXTERN int cap_client_register(cap_client_t *c, uint64_t bytes,
                                   cap_tensor_kind_t kind, uint32_t *id,
                                   void **dev);

/* Declare a transient tensor (activation, gradient, temporary) of `bytes`
 * without allocating it: its device memory is allocated at its first access
 * (op begin listing it), as a framework's caching allocator would. Inside an
 * iteration only. */
CAP_EXTERN int cap_client_declare(cap_client_t *c, uint64_t bytes,
                                  uint32_t *id);

/* Declare and allocate a transient tensor now. *dev gets its address. */
CAP_EXTERN int cap_client_alloc(cap_client_t *c, uint64_t bytes, uint32_t *id,
                                void **dev);

/* Free a transient tensor (its last use is over): its device and host
 * memory go back to the pools, pending copies of it are cancelled.
 * Persistent tensors cannot be freed (CAP_EINVAL). */
CAP_EXTERN int cap_client_free(cap_client_t *c, uint32_t id);

/* Current device address of a resident tensor, or NULL when it is not on
 * the device. Owner thread. For diagnostics: use op begin's addresses. */
CAP_EXTERN void *cap_client_tensor_ptr(cap_client_t *c, uint32_t id);

/* --- Iterations and ops --------------------------------------------------- */

/* Start an iteration. Installs the newest plan the reporter has received
 * (plan versions change only here), decides the mode and resets the
 * per-iteration counters. Returns CAP_ESTATE inside an iteration. */
CAP_EXTERN int cap_client_iteration_begin(cap_client_t *c);

/* What one iteration did (cap_client_iteration_end). */
typedef struct cap_iter_stats {
  uint32_t iteration;      /* 1-based */
  cap_mode_t mode;
  int64_t time_ns;         /* on the backend's clock (sim: scaled back to
                              trace time, i.e. divided by time_scale) */
  uint64_t peak_bytes;     /* device bytes in use at the peak */
  uint64_t bytes_out;      /* device -> host */
  uint64_t bytes_in;       /* host -> device */
  uint32_t evictions;      /* swap-outs and drops */
  uint32_t recomputed_ops; /* ops replayed through the recompute callback */
  uint32_t stalls;         /* accesses that waited for a tensor */
  int64_t stall_ns;        /* time the compute stream waited on copies */
  uint32_t plan_version;   /* 0: no plan */
  uint64_t dropped_records;/* recorder ring overflow (measurement incomplete) */
  uint32_t fallbacks;      /* plan actions replaced by on-demand handling
                              (failed copy or recompute, budget pressure) */
  uint32_t lru_evictions;  /* of evictions: LRU swap-outs on demand (passive,
                              or a guided allocation that did not fit) */
  uint32_t budget_waits;   /* allocations that waited for a running swap-out
                              to release memory (counted in stall_ns) */
  uint32_t refused_actions;/* actions of the plan in force the client swaps
                              instead: walked over the last iteration when
                              the plan was installed, their recompute lists
                              could not run as written */
  char plan_note[256];     /* the first such action and why, "" when none */
  uint32_t op_errors;      /* op begins that failed (the op did not run) */
  char first_error[256];   /* the first op error's message ("op 526
                              aten.native_batch_norm_backward: recompute of
                              tensor 506 (action 12) needs tensor 503, ..."),
                              "" when none */
  /* Placement (a plan that gives its blocks addresses): allocations made at
   * their planned offset, and those that found their block still taken by
   * a tensor the plan expected gone (they came from the allocator
   * instead). */
  uint32_t placed_allocs;
  uint32_t placement_misses;
  /* Where the peak was: the op (seq) running or about to run when the bytes
   * in use last rose to peak_bytes. */
  uint32_t peak_op;
  /* Allocations the framework made regardless of the budget (its op
   * outputs, tensors it brought back: DESIGN.md model 2) that left the
   * bytes in use above it. 0 in a guided iteration that keeps to its plan. */
  uint32_t over_budget_allocs;
} cap_iter_stats_t;

/* End the iteration: report IterationEnd (and prefetch feedback in guided
 * mode). Transient tensors still alive stay alive. *st may be NULL. */
CAP_EXTERN int cap_client_iteration_end(cap_client_t *c, cap_iter_stats_t *st);

/* Begin an op that reads `in` and writes `out` (an in-place op lists a
 * tensor on both sides). This is the access record: each listed tensor's
 * access count advances by one. Returns when every input and output is on
 * the device, in compute-stream order: swapped-out tensors are brought back
 * (the compute stream waits on the copy), dropped ones recomputed through
 * the callback, declared ones allocated. in_ptrs/out_ptrs (either may be
 * NULL) receive the addresses, valid until op end. `name` (the ATen name,
 * no spaces) must stay valid for the client's lifetime (the recorder keeps
 * the pointer; a string literal or an interned name). At most 4096 tensors
 * per side. Ops do not nest: CAP_ESTATE if an op is open. On error no op is
 * open and nothing is recorded. */
CAP_EXTERN int cap_client_op_begin(cap_client_t *c, const char *name,
                                   const uint32_t *in, uint32_t n_in,
                                   const uint32_t *out, uint32_t n_out,
                                   void **in_ptrs, void **out_ptrs);

/* End the op opened last: record its end time and start the evictions the
 * plan schedules after this access (or none). Owner thread. */
CAP_EXTERN int cap_client_op_end(cap_client_t *c);

/* Recompute callback: re-run op `seq` (of the measured iteration) reading
 * in_ptrs and writing out_ptrs, on the compute stream, exactly as it first
 * ran. Ids are given so the framework can find the op's other arguments.
 * Return 0, or any negative value to refuse (the client then falls back:
 * the next such tensor is swapped rather than dropped, and the current
 * access fails with CAP_ERECOMPUTE if the data is lost). Called on the owner
 * thread from within op begin; it may call cap_client_tensor_ptr only. */
typedef int (*cap_recompute_fn)(void *user, uint32_t seq, const char *name,
                                const uint32_t *in_ids, void *const *in_ptrs,
                                uint32_t n_in, const uint32_t *out_ids,
                                void *const *out_ptrs, uint32_t n_out);

/* Register the recompute callback. Without one, recompute actions of a plan
 * are carried out as swaps. */
CAP_EXTERN void cap_client_set_recompute(cap_client_t *c, cap_recompute_fn fn,
                                         void *user);

/* Run a synthetic op of `duration_ns` (trace time) on the compute stream:
 * sim: the owner thread advances the backend clock (sleeping, scaled);
 * cuda: a kernel that spins that long. Used by capuchin-replay and tests in
 * place of a framework's kernel, between op begin and op end. */
CAP_EXTERN int cap_client_compute(cap_client_t *c, int64_t duration_ns);

/* The backend clock, in trace nanoseconds (sim: wall time divided by
 * time_scale). Owner thread. */
CAP_EXTERN int64_t cap_client_now_ns(cap_client_t *c);

/* Fill `bytes` of device memory at dev with a pattern derived from `seed`,
 * on the compute stream, or check that it holds that pattern (returns the
 * number of mismatching 8-byte words, 0 when intact, or a negative CAP_E*).
 * capuchin-replay's integrity check; dev must come from op begin. */
CAP_EXTERN int cap_client_pattern_fill(cap_client_t *c, void *dev,
                                       uint64_t bytes, uint64_t seed);
CAP_EXTERN int64_t cap_client_pattern_check(cap_client_t *c, const void *dev,
                                            uint64_t bytes, uint64_t seed);

/* --- State ---------------------------------------------------------------- */

typedef struct cap_client_stats {
  uint64_t bytes_out, bytes_in;  /* all iterations */
  uint64_t evictions;
  uint64_t recomputed_ops;
  uint64_t stalls;
  int64_t stall_ns;
  uint64_t peak_bytes;           /* device bytes, since create */
  uint64_t device_bytes;         /* in use now */
  uint64_t budget_bytes;
  uint64_t dropped_records;
  uint64_t fallbacks;
  uint32_t plan_version;         /* installed plan, 0 for none */
  uint32_t iterations;           /* completed */
  bool connected;                /* reporter has a live session */
  uint32_t reconnects;           /* successful connections after the first */
  char backend[16];              /* "sim" / "cuda" */
  char device_name[128];
  double h2d_gbps, d2h_gbps, duplex_gbps; /* measured at create */
  /* The daemon found no plan for the budget: the smallest budget it found
   * one for (bytes); 0 while a plan fits or none was made yet. The job
   * runs passive meanwhile. */
  uint64_t min_budget_bytes;
  /* What the daemon last said that the user should see: why no plan fits,
   * or the Error it refused or closed the session with ("" none). */
  char daemon_message[256];
} cap_client_stats_t;

/* Snapshot of the counters. Any thread (counters read atomically). */
CAP_EXTERN void cap_client_get_stats(cap_client_t *c, cap_client_stats_t *st);

/* Install a plan without the daemon, given as the JSON bytes capuchin-sim
 * --emit-plan writes (json[0..len), need not be NUL-terminated; the caller
 * keeps it). It takes effect at the next iteration boundary, exactly like a
 * plan the daemon pushes; a later plan from the daemon replaces it. Tensor
 * ids and op seqs must be this job's. Returns CAP_EPARSE with the reason
 * (and where) in cap_client_last_error, CAP_ENOMEM. Owner thread. */
CAP_EXTERN int cap_client_load_plan_json(cap_client_t *c, const char *json,
                                         size_t len);

/* Predicted iteration time of the installed plan (the daemon's simulator),
 * 0 when none. Owner thread. */
CAP_EXTERN int64_t cap_client_plan_predicted_ns(cap_client_t *c);

/* Block until the reporter has received a plan with version > `version` or
 * timeout_ms passes (CAP_ETIMEDOUT), or the daemon said no plan fits the
 * budget (CAP_EINFEASIBLE; cap_client_stats_t.min_budget_bytes). For tools
 * and tests; any thread. */
CAP_EXTERN int cap_client_wait_plan(cap_client_t *c, uint32_t version,
                                    uint32_t timeout_ms);

/* Message describing the last error on this client (or ""). Owner thread. */
CAP_EXTERN const char *cap_client_last_error(cap_client_t *c);

/* Fault injection (tests): fail the n-th device allocation from now
 * (n >= 1; 0 disables) and every allocation after it while `sticky`. */
CAP_EXTERN void cap_client_fault_alloc(cap_client_t *c, uint32_t nth,
                                       bool sticky);
/* Fault injection (tests): the n-th host<->device copy from now fails
 * (0 disables). */
CAP_EXTERN void cap_client_fault_copy(cap_client_t *c, uint32_t nth);

#ifdef __cplusplus
}
#endif

#endif /* CAPUCHIN_CLIENT_H */
