/*
 * Internals of libcapuchin-client shared by its files: the client struct,
 * the tensor table, the recorder ring, the executor's plan index and the
 * thin device layer (device.c) over the backend vtable and the BFC
 * allocator.
 */
#ifndef CAP_CLIENT_IMPL_H
#define CAP_CLIENT_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "capuchin/client.h"
#include "capuchin/framework.h"
#include "capuchin/plan.h"
#include "capuchin/planner.h"

#define CAP__MAX_OP_TENSORS 4096u

/* --- Recorder ring: single producer (owner thread), single consumer
 * (reporter thread). Fixed 64-byte records; an op with many tensors takes
 * continuation records. Never blocks: a full ring drops and counts. */
enum {
  CAP__REC_DECL = 1,    /* a = id, u64[0] = bytes, b = kind */
  CAP__REC_OP = 2,      /* a = seq, b = n_in, c = n_out, t0, t1, name; the
                           ids follow in CONT records, 12 per record */
  CAP__REC_CONT = 3,    /* ids[] continuation of an OP */
  CAP__REC_FREE = 4,    /* a = id, t0 = time */
  CAP__REC_ITER_END = 5,/* a = iteration, b = mode | CAP__ITER_* flags,
                           c = plan version; stats here and in a CONT */
  CAP__REC_ITER_BEGIN = 6, /* a = iteration, b = measured */
  CAP__REC_NO_EVICT = 7,   /* a = id: a declared tensor no plan may evict */
};

/* ITER_END's b: the mode (cap_mode_t) in the low byte, then these. */
#define CAP__ITER_MODE_MASK 0xffu
#define CAP__ITER_MEASURED 0x100u   /* every access was recorded */
#define CAP__ITER_INCOMPLETE 0x200u /* records dropped or the iteration cut */

#define CAP__REC_IDS 12u
typedef struct cap__rec {
  uint8_t type;
  uint8_t pad[3];
  uint32_t a, b, c;
  union {
    struct {
      int64_t t0, t1;
      const char *name;
      uint64_t u64;
      uint32_t pad2[4];
    } op;
    uint32_t ids[CAP__REC_IDS];
  } u;
} cap__rec_t;
/* A record is one cache line: the hot path writes one line per access and
 * the ring takes ring_records x 64 bytes. A field added to a record must
 * fit in its padding. */
_Static_assert(sizeof(cap__rec_t) == 64, "ring records are 64 bytes");

typedef struct cap__ring {
  cap__rec_t *recs;
  uint32_t mask;
  _Alignas(64) _Atomic uint64_t head; /* producer writes here */
  uint64_t tail_cache;                /* producer's view of tail */
  _Alignas(64) _Atomic uint64_t tail; /* consumer reads here */
} cap__ring_t;

int cap__ring_init(cap__ring_t *r, uint32_t n_records);
void cap__ring_close(cap__ring_t *r);
/* Reserve n contiguous-in-sequence records; NULL-free API: returns the
 * first sequence number or UINT64_MAX when there is no room. Fill with
 * cap__ring_at, then publish with cap__ring_commit. */
uint64_t cap__ring_reserve(cap__ring_t *r, uint32_t n);
static inline cap__rec_t *cap__ring_at(cap__ring_t *r, uint64_t seq) {
  return &r->recs[seq & r->mask];
}
static inline void cap__ring_commit(cap__ring_t *r, uint64_t end) {
  atomic_store_explicit(&r->head, end, memory_order_release);
}

/* --- Device layer (device.c) ---------------------------------------------- */
typedef struct cap__dev cap__dev_t;
typedef struct cap__ev cap__ev_t; /* a copy's completion event */

/* What the backend says of its device. */
typedef struct cap__dev_info {
  char backend[16];
  char device_name[128];
  char device_uuid[64];
  int device_index;
  uint64_t total_bytes;
  double h2d_gbps, d2h_gbps, duplex_gbps;
} cap__dev_info_t;

/* Open the configured backend and its allocators; a message in err when it
 * fails. The device layer knows nothing of tensors or of the client. */
int cap__dev_open(const cap_client_config_t *cfg, cap__dev_t **out,
                  cap__dev_info_t *info, char *err, size_t err_len);
void cap__dev_close(cap__dev_t *d); /* NULL: no-op */
/* Fail the nth device allocation from now (sticky: and all after it). */
void cap__dev_fault_alloc(cap__dev_t *d, uint32_t nth, bool sticky);
/* Device memory under the budget: CAP_EBUDGET when it does not fit now. */
int cap__dev_alloc(cap__dev_t *d, uint64_t bytes, void **p);
/* The budget has room but no hole does (fragmentation) and nothing more
 * can move: take an arena of just this size past the budget's arenas. */
int cap__dev_alloc_beyond_arena(cap__dev_t *d, uint64_t bytes, void **p);
void cap__dev_free(cap__dev_t *d, void *p);
/* Bytes tensors use: framework-owned ones included, the region's free room
 * not. */
uint64_t cap__dev_in_use(cap__dev_t *d);
/* Count `bytes` of framework-owned tensor memory in (add) or out of the
 * bytes in use (model 2: the client tracks them, the framework holds them).
 * Not for memory the framework took from the client's allocator
 * (cap_client_framework_alloc), which the allocator counts already. */
void cap__dev_track_framework(cap__dev_t *d, uint64_t bytes, bool add);
/* Whether p is (in) a live allocation of the client's allocator or its
 * region: the framework took it from cap_client_framework_alloc. */
bool cap__dev_owns(cap__dev_t *d, const void *p);
/* Device memory the job holds: its arenas, in use or not. */
uint64_t cap__dev_held(cap__dev_t *d);
/* Give the arenas nothing is allocated in back to the device; returns the
 * bytes still held. */
uint64_t cap__dev_trim(cap__dev_t *d);
/* The allocations that keep the emptiest arena from going back
 * (cap_bfc_emptiest_arena). */
int cap__dev_emptiest_arena(cap__dev_t *d, void **out, size_t max_out);
/* The placement region (region.c): the device memory a plan's placement
 * puts its blocks in. Taken from the budgeted allocator as one allocation;
 * the allocations live in it are kept by offset so that none overlap. */
typedef struct cap__region {
  uint8_t *base; /* NULL: no region */
  uint64_t bytes;
  struct cap__region_live {
    uint64_t off, len;
    uint32_t sharers; /* allocations beyond the first at this offset (an
                         output that took over its input's block) */
  } *live;       /* sorted by off, disjoint */
  uint32_t n_live, cap_live;
  uint64_t live_bytes; /* the sum of the live allocations' len */
} cap__region_t;

bool cap__region_contains(const cap__region_t *r, const void *p);
/* Take [off, off + len): 0 with *p, CAP_EAGAIN with *busy the start of a
 * live allocation in the way, CAP_ERANGE outside the region, CAP_ENOMEM. */
int cap__region_take(cap__region_t *r, uint64_t off, uint64_t len, void **p,
                     void **busy);
/* Take the lowest free [off, off + len) of the region: what a plan did not
 * place may use the room its placement leaves free at that time. 0 with
 * *p, CAP_EBUDGET when no hole is that big. */
int cap__region_take_any(cap__region_t *r, uint64_t len, void **p);
/* Take over the live allocation at off for a second tensor of at most its
 * len (in-place sharing, placement.h): 0 with *p, CAP_ENOENT when no live
 * allocation starts at off or it is smaller. */
int cap__region_share(cap__region_t *r, uint64_t off, uint64_t len, void **p);
/* Give back the allocation at p; false when p is not in the region. */
bool cap__region_give(cap__region_t *r, const void *p);
/* What an allocation the plan did not place does when no hole is big
 * enough: the window of `len` bytes whose live allocations, once evicted,
 * cost least (the sum of len x weight(ctx, ptr); weight 0, or a shared
 * block, may not move), as cap_bfc_find_window does for the allocator.
 * Writes those allocations' starts to out and returns their count (0: a
 * hole fits already), CAP_ENOENT when no window qualifies or one needs
 * more than max_out. */
int cap__region_find_window(const cap__region_t *r, uint64_t len,
                            uint32_t (*weight)(void *ctx, const void *ptr),
                            void *ctx, void **out, size_t max_out);

/* The device's region: open one of at least `bytes` (0 when one that size
 * is open already; CAP_ESTATE when a smaller one still has allocations
 * live; CAP_EBUDGET when the budget has no contiguous room for it), close
 * it (only when nothing lives in it), and take a block in it. cap__dev_free
 * gives back a block as well as any other allocation. */
int cap__dev_region_open(cap__dev_t *d, uint64_t bytes);
void cap__dev_region_close(cap__dev_t *d);
int cap__dev_region_take(cap__dev_t *d, uint64_t off, uint64_t len, void **p,
                         void **busy);
int cap__dev_region_share(cap__dev_t *d, uint64_t off, uint64_t len, void **p);
bool cap__dev_in_region(cap__dev_t *d, const void *p);
bool cap__dev_has_region(cap__dev_t *d);
int cap__dev_region_take_any(cap__dev_t *d, uint64_t len, void **p);
/* Whether the bytes in use leave room for `bytes` (a failure is then
 * fragmentation, not the budget). */
bool cap__dev_budget_has_room(cap__dev_t *d, uint64_t bytes);
/* The fewest-bytes set of allocations whose eviction makes a free chunk of
 * `bytes` (cap_bfc_find_window); movable decides which may go. */
int cap__dev_find_window(cap__dev_t *d, uint64_t bytes,
                         uint32_t (*weight)(void *ctx, const void *ptr),
                         void *ctx, void **out, size_t max_out);
/* The same in the region (cap__region_find_window). */
int cap__dev_region_find_window(cap__dev_t *d, uint64_t bytes,
                                uint32_t (*weight)(void *ctx, const void *ptr),
                                void *ctx, void **out, size_t max_out);
/* Whether the bytes tensors use (the region's free room not counted, as an
 * arena's free chunks are not) leave room for `bytes`: the test for the
 * last resort, an allocation past the allocator's arenas. */
bool cap__dev_use_has_room(cap__dev_t *d, uint64_t bytes);
int cap__dev_set_budget(cap__dev_t *d, uint64_t bytes);
void cap__dev_fault_copy(cap__dev_t *d, uint32_t nth);
int cap__host_alloc(cap__dev_t *d, uint64_t bytes, void **p);
void cap__host_free(cap__dev_t *d, void *p, uint64_t bytes);
/* Async copies on the client's streams, ordered after the work the compute
 * stream has issued so far. *ev is the copy's completion. */
int cap__copy_d2h(cap__dev_t *d, void *host, const void *dev,
                  uint64_t bytes, cap__ev_t **ev);
int cap__copy_h2d(cap__dev_t *d, void *dev, const void *host,
                  uint64_t bytes, cap__ev_t **ev);
/* 1 complete, 0 pending, negative: the copy failed. */
int cap__ev_query(cap__dev_t *d, cap__ev_t *ev);
/* A poll of several copies: copies on one stream end in the order they
 * were issued, so once one is found running, the later ones on its stream
 * are running too and are not asked (on a GPU each question is a driver
 * call, and a job has tens of copies in flight at every op). Begin one
 * poll per pass over the copies; cap__ev_poll answers as cap__ev_query. */
#define CAP__POLL_STREAMS 3 /* backend.h's CAP_STREAM_COUNT */
typedef struct cap__poll {
  uint64_t running_from[CAP__POLL_STREAMS]; /* first copy found running */
} cap__poll_t;
void cap__poll_begin(cap__poll_t *p);
int cap__ev_poll(cap__dev_t *d, cap__ev_t *ev, cap__poll_t *p);
/* How many events the backend was asked about (tests, diagnosis). */
uint64_t cap__dev_event_queries(cap__dev_t *d);
/* Host wait; 0 or the copy's error. */
int cap__ev_sync(cap__dev_t *d, cap__ev_t *ev);
/* Make the compute stream wait for ev (no host wait where the backend can;
 * sim: a host wait). 0 or the copy's error. */
int cap__ev_compute_wait(cap__dev_t *d, cap__ev_t *ev);
void cap__ev_release(cap__dev_t *d, cap__ev_t *ev);
/* Backend clock in trace nanoseconds (scaled back by time_scale). */
int64_t cap__now_ns(cap__dev_t *d);
/* true when compute-stream waits are host waits (sim): stalls measured
 * directly rather than estimated. */
bool cap__dev_host_compute(cap__dev_t *d);
/* Time t of the backend's clock on this iteration's recorded timeline (0 at
 * its start): the framework's own time, without the client's waits. */
int64_t cap__rec_time_ns(const cap_client_t *c, int64_t t);
/* The recorded [*s, *e] of an op the host saw run from t0 to t1: after the
 * start of the op recorded before it, whatever waits were noted inside it
 * (the daemon takes ops in start order); no free is recorded before the
 * latest end (rec_end_ns). */
void cap__rec_span(cap_client_t *c, int64_t t0, int64_t t1, int64_t *s,
                   int64_t *e);
/* A wait of w ns: stall counters; host: the training thread waited (and the
 * recorded timeline leaves the wait out), else only the device did. */
void cap__note_wait(cap_client_t *c, int64_t w, bool host);
int cap__dev_compute(cap__dev_t *d, int64_t ns);
int cap__dev_fill(cap__dev_t *d, void *dev, uint64_t bytes, uint64_t seed);
int64_t cap__dev_check(cap__dev_t *d, const void *dev, uint64_t bytes,
                       uint64_t seed);

/* --- Tensors -------------------------------------------------------------- */
enum {
  CAP__T_UNUSED = 0, /* id not live (freed, or not declared this iteration) */
  CAP__T_DECLARED,   /* declared, no memory yet */
  CAP__T_DEVICE,     /* on the device */
  CAP__T_OUT,        /* D2H in flight; device memory still held */
  CAP__T_HOST,       /* only in host memory */
  CAP__T_IN,         /* H2D in flight; device memory allocated */
  CAP__T_DROPPED,    /* dropped for recompute */
  CAP__T_LOST,       /* contents lost (failed recompute) */
  CAP__T_RELEASED,   /* released after its last access (plan release) */
};

typedef struct cap__tensor {
  uint64_t bytes;
  uint8_t kind;
  uint8_t state;
  uint8_t persistent;
  uint8_t pinned;      /* used by the op being begun: not evictable */
  uint8_t framework;   /* its device memory is the framework's (model 2,
                          tensor_mem.c), not the client's allocator's */
  uint8_t lent;        /* the framework's, from cap_client_framework_alloc:
                          the allocator counts it, not framework bytes */
  uint8_t evictable;   /* persistent and the framework's: it can give the
                          memory up (cap_client_set_evictable) */
  uint32_t n_access;   /* accesses so far this iteration */
  uint32_t out_action; /* action of the eviction in force, CAP_NONE passive */
  uint32_t back_access;/* access that brings it back (feedback) */
  void *dev;
  void *host;
  cap__ev_t *ev;       /* pending copy (OUT / IN) */
  uint64_t lru;        /* tick of the last access */
  int64_t in_start_ns; /* when the swap-in started */
  int64_t in_est_end_ns; /* estimated end of the swap-in */
  uint32_t gone_op;    /* op seq after which it last left the device (or
                          was freed): named in recompute errors */
  uint8_t prefetch_due;/* the in-trigger of its swap has fired (the copy
                          may still wait for room) */
} cap__tensor_t;

/* Deferred release: memory that a copy still reads or writes, returned when
 * the copy's event completes. */
typedef struct cap__retire {
  cap__ev_t *ev;
  void *dev;       /* device memory to free, or NULL */
  void *host;      /* host memory to free, or NULL */
  uint64_t host_bytes;
  uint32_t tensor; /* tensor whose state moves OUT->HOST on completion, or
                      CAP_NONE */
  uint32_t dev_of; /* tensor whose framework-owned memory dev is (handed
                      back through the release callback), CAP_NONE: dev is
                      the client allocator's */
  uint64_t dev_bytes; /* its size, when dev_of is set */
} cap__retire_t;

/* --- Executor: plan index (executor.c) ------------------------------------ */
typedef struct cap__slot {
  uint32_t evict;    /* action evicting after this access, CAP_NONE */
  uint32_t trig_off; /* prefetches triggered when this access begins */
  uint32_t n_trig;
} cap__slot_t;

typedef struct cap__xplan {
  cap_plan_t *plan;
  uint32_t n_tensors;     /* tensors covered by slot_off */
  uint32_t *slot_off;     /* [n_tensors + 1]: slots of tensor t are
                             slots[slot_off[t] + k - 1] */
  cap__slot_t *slots;
  uint32_t *trig;         /* action indices */
  uint32_t *op_acts;      /* room for n_actions: the open op's actions,
                             issued in action order (executor.c) */
  uint8_t *fallback;      /* per action: carried out as swap (recompute
                             failed or unavailable) */
  uint8_t *replays;       /* per op seq: 1 when a recompute list carried
                             out (no fallback) replays that op */
  uint32_t n_replays;     /* op seqs covered by replays */
  uint32_t n_refused;     /* actions the install-time walk refused */
  uint32_t n_failed_walked; /* the client's failed actions it walked with */
  char note[256];         /* the first of them and why */
  /* Placement: the plan's blocks found by (tensor, kind, action), an open
   * addressing table of block indices (CAP_NONE: empty); mask 0: none. */
  uint32_t *block_of;
  uint32_t block_mask;
} cap__xplan_t;

/* Placement (placement.c): index the plan's blocks and open the region at
 * install; at an allocation of tensor id made the way `kind` and `action`
 * say (cap_block_t), take its block. 0 with *p, or CAP_ENOENT: no block
 * (or it could not be had), allocate elsewhere. */
int cap__placement_index(cap_client_t *c, cap__xplan_t *x);
/* The installed plan stops placing: its region's tensors go to the host and
 * the region back to the allocator (a budget cut must be able to give the
 * memory back; the plan for the new budget brings its own). */
int cap__placement_drop(cap_client_t *c);
int cap__placed_alloc(cap_client_t *c, uint32_t id, cap_residency_kind_t kind,
                      uint32_t action, void **p);
/* The same for the framework's allocator (framework_alloc.c): an output
 * never takes over its input's block, which the framework still reads. */
int cap__placed_alloc_unshared(cap_client_t *c, uint32_t id,
                               cap_residency_kind_t kind, uint32_t action,
                               void **p);
/* Whether the installed plan places that allocation (guided mode). */
bool cap__placement_has(const cap_client_t *c, uint32_t id,
                        cap_residency_kind_t kind, uint32_t action);

/* A plan action named by what it evicts (unique within a plan). */
typedef struct cap__action_key {
  uint32_t tensor, access;
} cap__action_key_t;

/* What went wrong in one iteration, for its IterationEnd: built by the owner
 * thread at the iteration's end (only when something did), taken by the
 * reporter thread when it sends that IterationEnd. */
typedef struct cap__iter_errors {
  struct cap__iter_errors *next;
  uint32_t iteration;
  uint32_t op_errors;
  cap__action_key_t *failed; /* actions that fell back this iteration */
  uint32_t n_failed;
  char first_error[256];
} cap__iter_errors_t;

void cap__iter_errors_free(cap__iter_errors_t *e); /* a whole list */

/* One op of an iteration's log (lineage for recompute). */
typedef struct cap__oplog_op {
  const char *name;
  uint32_t off;  /* ids: log->ids[off .. off + n_in + n_out) */
  uint32_t n_in, n_out;
  uint64_t adopted_bytes; /* model 2: bytes the framework adopted since the
                             op before (the outputs it allocated as this op
                             ran, before reporting it) */
} cap__oplog_op_t;

/* A free between ops: tensor freed before op `before` began. */
typedef struct cap__oplog_free {
  uint32_t tensor, before;
} cap__oplog_free_t;

typedef struct cap__oplog {
  cap__oplog_op_t *ops;
  uint32_t n_ops, cap_ops;
  uint32_t *ids;
  uint32_t n_ids, cap_ids;
  cap__oplog_free_t *frees;
  uint32_t n_frees, cap_frees;
} cap__oplog_t;

/* Stats shared with other threads (cap_client_get_stats). */
typedef struct cap__counters {
  _Atomic uint64_t bytes_out, bytes_in, evictions, recomputed_ops, stalls;
  _Atomic int64_t stall_ns;
  _Atomic uint64_t peak_bytes, device_bytes, dropped_records, fallbacks;
  _Atomic uint32_t plan_version, iterations, reconnects;
  _Atomic bool connected;
  _Atomic uint64_t budget_bytes, persistent_bytes; /* copies for other threads */
} cap__counters_t;

struct cap_client {
  /* Config (resolved). */
  char socket_path[108];
  char job_name[128];
  uint64_t budget_bytes;       /* in force (the daemon may lower it) */
  uint64_t requested_budget;   /* as configured; immutable after create */
  bool no_daemon;
  uint32_t reconnect_ms, connect_timeout_ms;
  double time_scale;

  /* Device. */
  cap__dev_t *dev;
  char backend[16];
  char device_name[128];
  char device_uuid[64];
  int device_index;
  uint64_t device_total_bytes;
  double h2d_gbps, d2h_gbps, duplex_gbps;

  /* Tensors. */
  cap__tensor_t *tensors;
  uint32_t n_tensors, cap_tensors;
  uint32_t *transient_ids;      /* i-th transient declaration -> id */
  uint32_t n_transient_ids, cap_transient_ids;
  uint32_t transient_decl;      /* declarations this iteration */
  uint64_t tick;
  uint64_t persistent_bytes;

  cap__retire_t *retire;
  uint32_t n_retire, cap_retire;

  /* Iteration. */
  bool in_iter;
  bool op_open;
  uint32_t iteration;          /* current (1-based) */
  cap_mode_t mode;
  int64_t iter_start_ns;
  int64_t host_wait_ns;        /* this iteration's waits on the host, taken
                                  out of its recorded timeline (client.c) */
  uint32_t op_seq;             /* ops begun this iteration */
  int64_t op_start_ns;
  const char *op_name;
  uint32_t op_ids[2 * CAP__MAX_OP_TENSORS]; /* unique tensors of the open op */
  uint32_t op_n_unique;
  const uint32_t *op_in, *op_out;
  uint32_t op_n_in, op_n_out;
  cap_iter_stats_t it;         /* this iteration's counters */
  bool recording;              /* measured: records go to the ring */
  uint64_t dropped_at_begin;
  bool measured_done;          /* a complete measured iteration was sent */
  uint32_t decl_next;          /* declarations go out in id order: next id
                                  this session has not been told about */

  /* Lineage: ops of this and of the last complete iteration. */
  cap__oplog_t log_cur, log_last;
  bool log_last_valid;
  bool log_failed;             /* log_cur incomplete (out of memory) */
  uint32_t iter_op_errors;     /* op begins that failed this iteration */
  uint32_t iter_ops_over_budget; /* of them: measured ops recorded although
                                    they did not fit the budget (client.c) */
  int64_t rec_start_ns;          /* recorded start of the last op recorded
                                    this iteration (ops go out in start order) */
  int64_t rec_end_ns;            /* latest end of an op recorded this
                                    iteration (no free is recorded before it) */
  uint32_t sig_ops;            /* op count the signature was computed for */
  _Atomic uint64_t signature;  /* model signature of the last complete
                                  iteration (Hello, profile reuse), 0 none */

  /* Plan. */
  cap__xplan_t x;              /* installed plan (x.plan NULL: none) */
  cap_feedback_t *fb;          /* stalls this iteration */
  uint32_t n_fb, cap_fb;
  cap_recompute_fn recompute;
  void *recompute_user;
  /* Model 2 (capuchin/framework.h): the framework allocates and frees the
   * memory of the tensors it adopted; NULL alloc: none adopted yet. */
  cap_framework_alloc_fn fw_alloc;
  cap_framework_release_fn fw_release;
  void *fw_user;
  uint64_t adopted_since_op;   /* bytes adopted since the last op was run */
  bool device_timeline;        /* cap_client_set_device_timeline */
  /* Placement under the framework's allocator (framework_alloc.c). */
  bool fw_placement;           /* cap_client_set_framework_placement */
  uint32_t fw_iter, fw_op;     /* the iteration and op seq fw_next_decl is
                                  for */
  uint32_t fw_next_decl;       /* the transient declaration the next first
                                  touch the framework allocates will be */
  struct cap__fw_want {        /* the restore the client is asking the
                                  framework's memory for (alloc callback) */
    bool on;
    uint32_t id, action;
    cap_residency_kind_t kind;
    uint64_t bytes;
  } fw_want;
  _Atomic uint64_t fw_lent;    /* cap_client_framework_alloc's allocations
                                  not given back */
  uint32_t fw_calling;         /* callbacks into the framework running: what
                                  it allocates then is no op's output */
  /* Prefetches of framework-owned tensors waiting for the H2D copy engine
   * (executor.c): the plan takes a tensor's memory when its copy starts,
   * and copies in one direction run one at a time. */
  uint32_t *pf_queue;
  uint32_t n_pf, cap_pf;
  uint32_t h2d_last;           /* tensor of the last H2D copy started, or
                                  CAP_NONE */
  bool pf_pumping;
  /* Evictions that failed this job: every plan version installed later
   * carries them out as swaps (fallback). failed[0 .. n_failed_sent) have
   * been handed to the reporter. */
  cap__action_key_t *failed;
  uint32_t n_failed, cap_failed, n_failed_sent;

  /* Reporter (reporter.c). */
  cap__ring_t ring;
  _Atomic uint64_t dropped;    /* records the ring refused */
  pthread_t reporter;
  bool reporter_started;
  _Atomic bool stop;
  pthread_mutex_t mu;          /* guards what follows */
  pthread_cond_t cv;
  cap_plan_t *pending_plan;    /* received, not yet installed */
  uint32_t received_version;
  uint64_t pending_budget;     /* BudgetUpdate, 0 none */
  uint64_t min_budget;         /* the daemon found no plan for the budget:
                                  the smallest it found one for; 0 none */
  char daemon_message[256];    /* the daemon's last Error or reason why no
                                  plan fits ("" none) */
  cap_iter_stats_t pending_end;/* stats for the ITER_END record */
  cap_feedback_t *pending_fb;
  uint32_t n_pending_fb;
  uint32_t pending_fb_version;
  cap__iter_errors_t *pending_errors; /* oldest first */
  uint32_t ack_version;        /* plan version to acknowledge, 0 none */
  uint32_t ack_session;        /* session that sent it (a plan is acked
                                  only to the session it came from) */
  uint32_t pending_session;    /* session pending_plan came from (0: none,
                                  loaded with cap__client_load_plan) */
  uint32_t session;            /* sessions welcomed so far (reporter) */
  uint32_t budget_changes;     /* budgets put in force so far, and the last */
  uint64_t ack_budget;         /* one's bytes and the device bytes held */
  uint64_t ack_held;           /* then, for the BudgetAck (reporter.c) */
  bool session_lost;           /* connection dropped since last begin */
  int wake_fd[2];              /* owner -> reporter wake pipe */
  struct rep *rep;             /* reporter state (reporter.c) */

  cap__counters_t ctr;
  char err[256];
};

/* last_error.c: the message cap_client_last_error returns. */
void cap__set_error(cap_client_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* client.c: the API. */
int cap__tensor_grow(cap_client_t *c, uint32_t n);
/* Install a copy of plan at the next iteration boundary (what
 * cap_client_load_plan_json does after parsing; tests call it directly). */
int cap__client_load_plan(cap_client_t *c, const cap_plan_t *plan);

/* plan_index.c: install a plan (takes ownership), clear it; the slot of
 * access k of tensor t (NULL when the plan has nothing there). */
int cap__x_install(cap_client_t *c, cap_plan_t *plan);
void cap__x_clear(cap_client_t *c);
static inline const cap__slot_t *cap__slot_at(const cap__xplan_t *x,
                                               uint32_t t, uint32_t k) {
  if (t >= x->n_tensors)
    return NULL;
  uint32_t off = x->slot_off[t], n = x->slot_off[t + 1] - off;
  if (k == 0 || k > n)
    return NULL;
  return &x->slots[off + k - 1];
}

/* oplog.c */
int cap__oplog_add(cap__oplog_t *l, const char *name, const uint32_t *in,
                   uint32_t n_in, const uint32_t *out, uint32_t n_out);
/* The framework freed tensor before the next op. */
int cap__oplog_free(cap__oplog_t *l, uint32_t tensor);
/* Forget the ops and frees, keep the memory (a new iteration). */
void cap__oplog_reset(cap__oplog_t *l);
void cap__oplog_close(cap__oplog_t *l);
/* The log as a finished profile over the client's tensors (op i runs in
 * [10i + 2, 10i + 6], a free before op k happens at 10k): what the plan
 * walk and the model signature are computed on. *out is the caller's. */
int cap__oplog_profile(const cap_client_t *c, const cap__oplog_t *l,
                       cap_profile_t **out);

/* executor.c: the hot path. */
int cap__op_begin(cap_client_t *c, const char *name, const uint32_t *in,
                  uint32_t n_in, const uint32_t *out, uint32_t n_out,
                  void **in_ptrs, void **out_ptrs);
int cap__op_end(cap_client_t *c);
int cap__release_tensor(cap_client_t *c, uint32_t id);
/* Start the queued prefetches the H2D copy engine has room for now (one at
 * a time: the next once the last copy in has finished). */
void cap__prefetch_pump(cap_client_t *c);

/* retire.c: memory a copy still uses, released when its event completes;
 * a finished swap-out moves its tensor to HOST (a failed one back to the
 * device). */
int cap__retire_push(cap_client_t *c, cap__ev_t *ev, void *dev, void *host,
                     uint64_t host_bytes, uint32_t tensor, uint32_t dev_of);
void cap__retire_finish(cap_client_t *c, cap__retire_t *r, int status);
/* Release what finished copies hold (wait_all: wait for every copy). */
void cap__reap(cap_client_t *c, bool wait_all);
/* The pending swap-out of tensor, or NULL. */
cap__retire_t *cap__retire_of(cap_client_t *c, uint32_t tensor);
/* Wait for the oldest pending copy that frees device memory; false when
 * there is none. */
bool cap__retire_wait_one(cap_client_t *c);
/* Wait for the copy that still holds device memory at dev and finish it;
 * false when no pending copy holds it. */
bool cap__retire_wait_dev(cap_client_t *c, const void *dev);

/* evict.c: swap tensor id out (action: the plan's, or CAP_NONE for an
 * on-demand eviction; sync: the compute stream waits for the copy). */
int cap__swap_out(cap_client_t *c, uint32_t id, uint32_t action, bool sync);
/* Allocate device memory, making room when over budget (may_evict: by
 * swapping out least recently used tensors synchronously). */
int cap__alloc_for(cap_client_t *c, uint64_t bytes, void **p, bool may_evict);
/* Put a budget from the daemon in force (owner thread, between
 * iterations): on a cut, give device memory back down to it, evicting what
 * must go; then tell the reporter what is held (BudgetAck). */
void cap__put_budget(cap_client_t *c, uint64_t budget);
/* Record the device bytes in use now in the iteration's and job's peaks;
 * returns them. */
uint64_t cap__note_peak(cap_client_t *c);
/* The same after an allocation the framework made regardless of the budget:
 * one that left the bytes in use above it is counted (over_budget_allocs). */
void cap__note_over(cap_client_t *c);

/* tensor_mem.c: the device memory of tensor id, whoever owns it: the
 * client's budgeted allocator (may_evict as cap__alloc_for), or the
 * framework's allocation callback for a framework-owned tensor. Free
 * returns it the same way (a framework-owned pointer goes back through the
 * release callback). */
int cap__tmem_alloc(cap_client_t *c, uint32_t id, void **p, bool may_evict);
/* cap__tmem_alloc saying why (placement keys): a recompute list's outputs. */
int cap__tmem_alloc_as(cap_client_t *c, uint32_t id, cap_residency_kind_t kind,
                       uint32_t action, void **p, bool may_evict);
void cap__tmem_free(cap_client_t *c, uint32_t id, void *p);
/* The framework's release callback (framework.h). */
void cap__fw_release(cap_client_t *c, uint32_t id, void *dev, uint64_t bytes);

/* framework.c: wait for swap-outs in flight, oldest first, until `bytes`
 * more fit the budget (each wait a budget wait); false when they do not and
 * no swap-out is left to wait for. Model 2's way to keep to the budget: the
 * framework allocates, so the client can only make room before it does. */
bool cap__fw_wait_room(cap_client_t *c, uint64_t bytes);
/* The bytes the framework has yet to allocate for the coming op's outputs
 * in a guided iteration: what they took in the last complete iteration,
 * less what it adopted since the last op (0 outside guided iterations). */
uint64_t cap__fw_outputs_to_come(const cap_client_t *c);

/* restore.c: start the H2D copy of a tensor on the host (may_evict: make
 * room), or into device memory dev already allocated for it (freed if the
 * copy cannot start); make tensor id usable by the op being begun
 * (is_output: the op only writes it), whatever state it is in. */
int cap__swap_in_start(cap_client_t *c, uint32_t id, bool may_evict);
int cap__swap_in_to(cap_client_t *c, uint32_t id, void *dev);
/* At a guided iteration's start, persistent tensors on the host that no
 * plan action holds there start coming back (restore.c). */
void cap__prefetch_persistent(cap_client_t *c);
int cap__ensure_resident(cap_client_t *c, uint32_t id, bool is_output);

/* Remember that the action evicting tensor after access failed: every
 * plan version installed later swaps it instead, and the daemon hears of
 * it with the iteration's end. */
void cap__note_failed(cap_client_t *c, uint32_t tensor, uint32_t access);

/* recompute.c: run the recompute list of dropped tensor id's action. */
int cap__recompute(cap_client_t *c, uint32_t id);

/* reporter.c */
int cap__reporter_start(cap_client_t *c);
void cap__reporter_stop(cap_client_t *c);
void cap__reporter_wake(cap_client_t *c);
/* Record helpers (owner thread). false when the ring dropped it. */
bool cap__rec_decl(cap_client_t *c, uint32_t id, uint64_t bytes, uint8_t kind);
bool cap__rec_op(cap_client_t *c, uint32_t seq, int64_t t0, int64_t t1,
                 const char *name, const uint32_t *in, uint32_t n_in,
                 const uint32_t *out, uint32_t n_out);
bool cap__rec_free(cap_client_t *c, uint32_t id, int64_t t);
bool cap__rec_simple(cap_client_t *c, uint8_t type, uint32_t a, uint32_t b);
/* Declare ids decl_next..upto (inclusive) to the daemon, in order. */
void cap__decl_upto(cap_client_t *c, uint32_t upto);

/* framework.c */
/* Record, at the end of a measured iteration, the framework's persistent
 * tensors it cannot give up, so that the daemon plans without evicting
 * them. */
void cap__rec_no_evict(cap_client_t *c);

#endif /* CAP_CLIENT_IMPL_H */
