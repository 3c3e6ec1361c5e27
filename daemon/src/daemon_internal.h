/*
 * What the daemon's files share: the daemon context, the session (one per
 * connection, transport-independent so that tests and the fuzzer feed bytes
 * straight into it), the tracker that assembles a measured iteration, the
 * planning work that runs off the loop, and the shared-budget arithmetic.
 *
 * Threads: everything here runs on the loop thread except the work callbacks
 * of planning.c, which touch only their task and the store (whose handle is
 * thread-safe, store.h).
 */
#ifndef CAPUCHIN_DAEMON_INTERNAL_H
#define CAPUCHIN_DAEMON_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "capuchin/daemon.h"
#include "capuchin/error.h"
#include "capuchin/frame.h"
#include "capuchin/plan.h"
#include "capuchin/planner.h"
#include "capuchin/profile.h"
#include "capuchin/proto.h"
#include "capuchin/sim.h"
#include "store.h"

/* --- Log (log.c) --------------------------------------------------------- */
void cap__log_set_level(cap_log_level_t level);
cap_log_level_t cap__log_get_level(void);
int cap__log_parse_level(const char *s, cap_log_level_t *out);
/* Log to stderr, or to path when set (reopened by each call of this). */
int cap__log_open(const char *path);
void cap__log(cap_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void cap__vlog(cap_log_level_t level, const char *fmt, va_list ap);
#define cap__log_enabled(level) ((level) <= cap__log_get_level())

/* --- sd_notify (notify.c) ------------------------------------------------- */
/* Send state ("READY=1") to $NOTIFY_SOCKET; 0 when unset. */
int cap__notify(const char *state);

/* --- Shared budgets (budget.c) --------------------------------------------- */
/* Shares of `capacity` for n jobs requesting req[i] bytes with floors
 * floor_[i] (persistent bytes): when the requests fit, each gets its request;
 * otherwise each gets a share proportional to its request, never below its
 * floor (capped at its request), the others sharing what the floors leave.
 * Returns true when the requests were cut. */
bool cap__budget_shares(const uint64_t *req, const uint64_t *floor_,
                        uint32_t n, uint64_t capacity, uint64_t *out);
/* A device's capacity when the operator did not set it (gpu-memory): from
 * the totals its n sessions report (claim[i], 0 = none), oldest session
 * first. The claim most others agree with (within 25 %; ties: the older
 * session's) wins, and the capacity is the largest claim agreeing with it:
 * never a minimum (or a maximum) one client can set alone. Claims that
 * disagree are marked in ignored[i] (may be NULL). Returns 0 with no
 * claim. */
uint64_t cap__budget_capacity(const uint64_t *claim, uint32_t n,
                              bool *ignored);

/* --- Tracker (tracker.c) ----------------------------------------------------
 * Records of the iteration in progress, checked as they arrive (dense ids,
 * declared tensors, quotas) and kept in flat arrays; the profile is built
 * from them off the loop (cap__tracker_build). */
typedef struct cap__tracker_op {
  int64_t start_ns, end_ns;
  uint32_t name;    /* index into names */
  uint32_t ten_off; /* inputs then outputs in op_tensors */
  uint32_t n_in, n_out;
} cap__tracker_op_t;

typedef struct cap__tracker_limits {
  uint64_t max_accesses;
  uint32_t max_ops;
  uint32_t max_tensors;
  uint32_t max_names;      /* distinct op names of one iteration */
  uint64_t max_name_bytes; /* their bytes, NULs included */
} cap__tracker_limits_t;

/* Everything a profile is built from; owned arrays, movable to a task. */
typedef struct cap__iter_records {
  uint64_t *t_bytes; /* declared tensors (a snapshot) */
  uint8_t *t_kind;
  uint32_t n_tensors;
  cap__tracker_op_t *ops;
  uint32_t n_ops, cap_ops;
  uint32_t *op_tensors;
  uint64_t n_op_tensors, cap_op_tensors;
  char **names;
  uint32_t n_names, cap_names;
  cap_free_t *frees;
  uint32_t n_frees, cap_frees;
  uint32_t *no_evict; /* tensors no plan may evict (AccessBatch.no_evict) */
  uint32_t n_no_evict, cap_no_evict;
} cap__iter_records_t;

typedef struct cap__tracker {
  cap__tracker_limits_t lim;
  /* Declarations live for the session (ids stable across iterations). */
  uint64_t *t_bytes;
  uint8_t *t_kind;
  uint32_t n_tensors, cap_tensors;
  /* The iteration in progress. */
  bool active;
  bool iter_known;    /* iteration number seen (AccessBatch/IterationEnd) */
  uint64_t iteration;
  uint64_t last_ended; /* last IterationEnd's number, 0 before the first */
  uint64_t dropped;
  cap__iter_records_t rec;
  int64_t last_start_ns;
  /* Name interning: open addressing over rec.names. */
  uint32_t *name_slots; /* index + 1, 0 empty */
  uint32_t n_slots;
  uint64_t name_bytes; /* of rec.names, counted against max_name_bytes */
} cap__tracker_t;

void cap__tracker_init(cap__tracker_t *t, const cap__tracker_limits_t *lim);
void cap__tracker_close(cap__tracker_t *t);
int cap__tracker_decl(cap__tracker_t *t, uint32_t id, uint64_t bytes,
                      uint32_t kind, char *err, size_t err_len);
/* Start the iteration the next records belong to (0 = number unknown yet). */
int cap__tracker_begin(cap__tracker_t *t, uint64_t iteration, char *err,
                       size_t err_len);
int cap__tracker_op(cap__tracker_t *t, const cap_proto_op_view_t *op,
                    char *err, size_t err_len);
int cap__tracker_batch(cap__tracker_t *t, const Capuchin__AccessBatch *b,
                       uint64_t *accesses, char *err, size_t err_len);
int cap__tracker_free(cap__tracker_t *t, int64_t t_ns, uint32_t tensor,
                      char *err, size_t err_len);
/* End the iteration: moves its records into *out (snapshotting the
 * declarations) and resets for the next one. */
int cap__tracker_end(cap__tracker_t *t, uint64_t iteration,
                     cap__iter_records_t *out, char *err, size_t err_len);
/* Drop the iteration in progress (client gone mid-iteration). */
void cap__tracker_discard(cap__tracker_t *t);
void cap__iter_records_free(cap__iter_records_t *r);
/* Build a finished profile from records (any thread). meta: NULL-terminated
 * key, value pairs. Returns 0 or an error with a message in err. */
int cap__iter_records_build(cap__iter_records_t *r, const char *const *meta,
                            cap_profile_t **out, char *err, size_t err_len);

/* --- Daemon context and sessions ------------------------------------------ */
typedef struct cap__session cap__session_t;
typedef struct cap__store_item cap__store_item_t;

/* How a session talks to its peer. The session never frees its transport:
 * close() asks the transport to close (after flushing what was sent), and
 * the transport calls cap__session_detach() from its close callback. */
typedef struct cap__session_io {
  /* Queue a frame (malloc'd; ownership passes). Returns 0 or an error
   * (CAP_EQUOTA when the peer does not read fast enough). */
  int (*send)(void *ctx, uint8_t *frame, size_t len);
  void (*close)(void *ctx);
  void (*pause)(void *ctx);  /* stop feeding input; may be NULL */
  void (*resume)(void *ctx); /* feed input again; may be NULL */
} cap__session_io_t;

struct cap_daemon {
  uv_loop_t *loop;
  bool own_loop;
  cap_daemon_config_t cfg;
  cap_daemon_config_t cmdline; /* applied over the config file on SIGHUP */
  bool have_cmdline;
  cap_store_t *store;
  uv_pipe_t server;
  bool listening;
  bool socket_inherited; /* from systemd (LISTEN_FDS): not ours to unlink */
  uv_signal_t sig_term, sig_int, sig_hup;
  bool signals;
  uv_timer_t probe;
  bool probing;
  uv_timer_t sweep; /* cap__daemon_sweep */
  bool sweeping;
  uint64_t probe_last_ns;
  uv_prepare_t turn;     /* resumes connections throttled last turn */
  bool turn_init;
  void *throttled;       /* conn_t list (server.c) */
  uint64_t turn_no;      /* loop turns seen by `turn` */
  size_t turn_bytes;     /* bytes all connections fed this turn */
  uv_async_t stop_async;
  bool stop_async_init;
  bool stopping;
  cap__store_item_t *sq_head, *sq_tail; /* store_queue.c */
  bool store_writing;                   /* a writer task is in the pool */
  cap__session_t *sessions; /* doubly linked, all not yet freed */
  uint32_t n_live;          /* sessions whose transport is open */
  int fd_limit;             /* RLIMIT_NOFILE (soft) at start, raised to the
                               hard limit where allowed */
  uint64_t next_local_id;
  cap_daemon_stats_t stats;
};

typedef enum {
  CAP__S_HELLO = 0,  /* waiting for Hello */
  CAP__S_WELCOMING,  /* Hello being registered (work in flight) */
  CAP__S_ACTIVE,
  CAP__S_CLOSING,    /* close requested; input ignored */
} cap__session_state_t;

typedef enum {
  CAP__W_NONE = 0,
  CAP__W_HELLO,
  CAP__W_MEASURED,
  CAP__W_REPLAN,
  CAP__W_REFINE,
  CAP__W_PROBE, /* does any plan fit? (an iteration that did not fit) */
} cap__work_kind_t;

#define CAP__PLAN_HISTORY 8
#define CAP__JUDGE_ITERATIONS 2

struct cap__session {
  cap_daemon_t *d;
  cap__session_t *prev, *next;
  const cap__session_io_t *io;
  void *io_ctx; /* NULL once the transport closed */
  uint64_t local_id;
  uint32_t pid, uid, gid; /* peer credentials */
  cap__session_state_t state;
  cap_frame_decoder_t *dec;
  bool draining; /* inside the feed/drain loop (no re-entry) */
  bool paused;
  uint64_t accepted_ms; /* loop time (uv_now) of the connection */
  uint64_t last_rx_ms;  /* of the last bytes, or of the end of a pause */

  /* From Hello. */
  char job_name[256];
  uint32_t hello_pid;
  uint32_t device_index;
  char device_name[256];
  char device_uuid[128]; /* "" for a client too old to send it */
  uint64_t device_total_bytes;
  bool claim_ignored; /* device_total_bytes disagrees (logged once) */
  uint64_t requested_budget;
  uint64_t granted_budget;
  uint64_t hello_persistent;
  uint64_t hello_signature;
  cap_bandwidth_t bw;
  /* Budget cuts and their confirmation (budget.c). */
  bool acks_budget;        /* the client confirms cuts (BudgetAck) */
  bool hello_deferred;     /* registration waits for a cut on the device */
  uint64_t trim_to;        /* a cut not confirmed yet: bytes, 0 none */
  uint64_t trim_deadline_ms; /* loop time the others stop waiting for it */

  int64_t job_id, session_id;
  cap__tracker_t tracker;
  uint32_t iteration_stalls; /* stalls of the last Feedback (n_stalls) */
  uint64_t feedback_iteration;

  /* The measured profile and the plan in force. */
  cap_profile_t *profile;
  int64_t profile_id;
  uint64_t signature;
  cap_plan_t *plan;
  int64_t plan_id;
  uint32_t acked_version;
  struct {
    uint32_t version;
    int64_t plan_id;
  } history[CAP__PLAN_HISTORY];
  uint32_t n_history;

  /* Off-loop work: one planning task at a time; what arrives meanwhile
   * waits here. */
  cap__work_kind_t busy;
  bool want_replan;
  bool measuring_done; /* a measured iteration went to planning */
  uint64_t probed_budget; /* budget a probe ran for (cap__work_probe) */
  cap_feedback_t *pending_fb;
  uint32_t n_pending_fb;
  uint32_t pending_fb_version;
  /* Actions the client reported it swaps instead, waiting for the worker:
   * the next plan version says so (cap__work_fall_back). */
  cap_action_key_t *pending_failed;
  uint32_t n_pending_failed;
  uint32_t refs; /* tasks holding the session */
  uint32_t store_queued; /* iteration rows queued or being written */
  bool store_blocked;    /* input paused until the store catches up */
  bool ended;    /* job end recorded */

  /* Feedback as an experiment: the plan the one in force was refined
   * from, until the refined one has run CAP__JUDGE_ITERATIONS guided
   * iterations and proved at least as fast (session_work.c). */
  cap_plan_t *plan_before;
  int64_t best_ns_before; /* fastest guided iteration under plan_before */
  int64_t best_ns;        /* fastest guided iteration under plan */
  uint32_t n_guided;      /* guided iterations measured under plan */
  bool refine_off;        /* a refinement lost: no more for this session */
};

/* Create a session for a peer (credentials already authorised). */
cap__session_t *cap__session_create(cap_daemon_t *d,
                                    const cap__session_io_t *io, void *io_ctx,
                                    uint32_t pid, uint32_t uid, uint32_t gid);
/* Bytes from the peer. Never frees s; errors close the session. */
void cap__session_feed(cap__session_t *s, const void *data, size_t len);
/* The transport closed (its close callback): the session ends and is freed
 * once no task holds it. */
void cap__session_detach(cap__session_t *s);
/* Send Error{code, msg} and close. */
void cap__session_fail(cap__session_t *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void cap__session_send_env(cap__session_t *s, const Capuchin__Envelope *env);
/* Continue with work that waited for the previous task. */
void cap__session_kick(cap__session_t *s);
/* Feedback may refine the plan in force: no refinement is on trial, and
 * none has lost one (session_work.c). */
bool cap__session_may_refine(const cap__session_t *s);
/* A guided iteration of iter_ns under the plan in force: a refined plan on
 * trial is kept once it proved at least as fast as the one it came from,
 * or that one is restored (session_work.c). */
void cap__session_judge_refinement(cap__session_t *s, int64_t iter_ns);
void cap__session_unref(cap__session_t *s);
/* Close sessions past their deadlines: no Hello handshake_timeout_ms after
 * accept, or a frame begun and not finished for idle_timeout_ms while
 * input was read (a session between frames is never idle: a job between
 * iterations sends nothing and needs no keep-alive). Loop thread; from a
 * timer (server.c). */
void cap__daemon_sweep(cap_daemon_t *d);
/* "session 7 (job 'x' pid 42)", for log lines. */
const char *cap__session_who(const cap__session_t *s, char *buf, size_t len);

/* --- Shared budgets of a device's sessions (budget.c) ---------------------- */
/* Recompute the budget shares of the device s is on and push the changes:
 * cuts at once, growth only when no cut on the device waits for its
 * confirmation; then start the registration of the newcomers that waited
 * for one (hello_deferred). Loop thread. */
void cap__daemon_rebalance(cap_daemon_t *d, const cap__session_t *s);
/* s says it holds device_bytes under budget_bytes (BudgetAck): the cut it
 * confirms, if any, no longer holds the others back. */
void cap__budget_on_ack(cap__session_t *s, uint64_t budget_bytes,
                        uint64_t device_bytes);
/* Stop waiting for cuts not confirmed within budget-ack-timeout-ms. Loop
 * thread; from the sweep timer. */
void cap__budget_sweep(cap_daemon_t *d);

/* Open store and set up state without sockets (tests, fuzzer). */
int cap__daemon_init_core(cap_daemon_t *d, uv_loop_t *loop,
                          const cap_daemon_config_t *cfg, char *err,
                          size_t err_len);
/* Close every session and the store (after the loop stopped). */
void cap__daemon_close_core(cap_daemon_t *d);

/* --- Work off the loop (planning.c) ---------------------------------------
 * A task: its inputs, set by the submitter after cap__task_new; the work
 * callback's outputs, read by `done` on the loop. */
typedef struct cap__task cap__task_t;
struct cap__task {
  uv_work_t req;
  cap__work_kind_t kind;
  cap_store_t *store;
  char planner[32];
  cap_evict_persistent_t evict_persistent;
  bool evicts_persistent; /* the plan computed does */
  bool placement;         /* plans carry a placement that fits the budget */
  double headroom_pct;    /* plan this far under the budget when it fits */
  double bw_tolerance;
  /* inputs */
  cap_store_job_t job;
  char job_name[256], device_name[256];
  uint32_t uid, gid, pid;
  uint64_t budget;
  cap_bandwidth_t bw;
  uint64_t hello_signature;
  int64_t job_id, session_id;
  uint32_t base_version;
  const cap_profile_t *profile; /* session's (replan, refine) */
  int64_t profile_id;
  uint64_t signature;
  cap__iter_records_t rec;
  int64_t iter_ns;
  uint64_t peak_bytes;
  uint64_t resident_bytes;
  cap_feedback_t *fb;
  uint32_t n_fb;
  cap_plan_t *plan_in; /* refine: a clone of the plan in force */
  bool restore;        /* refine: store plan_in as it is, no feedback */
  cap_action_key_t *failed; /* refine: actions the client swaps instead */
  uint32_t n_failed;
  /* done(t, status) runs on the loop when the work is over (status: that
   * of uv_queue_work's after-work callback); it frees t (cap__task_free). */
  void (*done)(cap__task_t *t, int status);
  void *ctx; /* the submitter's */
  /* outputs */
  int rc;
  char err[512];
  cap_profile_t *profile_out;
  cap_plan_t *plan;
  int64_t plan_id;
  bool reused;
  bool infeasible;
  bool unchanged;     /* refine: no trigger could move within the budget */
  int planner_failed; /* CAP_E* from the planner, 0 if it worked */
  uint64_t best_peak;
  uint64_t plan_us;
};

/* A task of this kind with the daemon's planning options; NULL on out of
 * memory. */
cap__task_t *cap__task_new(cap_daemon_t *d, cap__work_kind_t kind);
/* Run t off the loop, then t->done(t) on it. 0, or uv_queue_work's error
 * (t is then still the caller's). */
int cap__task_submit(cap_daemon_t *d, cap__task_t *t);
void cap__task_free(cap__task_t *t); /* and what it owns */

/* --- What a session asks of the work, and what it does with the answers
 * (session_work.c) ------------------------------------------------------- */
void cap__work_hello(cap__session_t *s);
void cap__work_measured(cap__session_t *s, cap__iter_records_t *rec,
                        int64_t iter_ns, uint64_t peak_bytes);
void cap__work_replan(cap__session_t *s);
/* Records of a measured iteration some ops of which did not fit the budget:
 * build the profile and plan for the budget only to tell the client, when
 * none fits, the smallest budget that does (nothing is stored or pushed
 * otherwise). Takes rec. */
void cap__work_probe(cap__session_t *s, cap__iter_records_t *rec);
void cap__work_refine(cap__session_t *s, cap_feedback_t *fb, uint32_t n);
/* Store `plan` (taken) as the session's next version and push it. */
void cap__work_restore(cap__session_t *s, cap_plan_t *plan);
/* Next version of the plan in force with the actions the client could not
 * carry out swapped instead (cap_plan_fall_back); takes failed. */
void cap__work_fall_back(cap__session_t *s, cap_action_key_t *failed,
                         uint32_t n);
/* --- Store writes nobody waits for (store_queue.c) ------------------------ */
/* Queue s's iteration row; holds s until it is written, and pauses s's
 * input while max_queued_store_rows of its rows wait. */
void cap__work_store_iteration(cap__session_t *s,
                               const cap_store_iteration_t *it);
void cap__work_store_budget(cap_daemon_t *d, int64_t job_id, uint64_t bytes);
void cap__work_store_end(cap_daemon_t *d, int64_t job_id, int64_t session_id,
                         const char *status);
/* Give the store's cached pages and free heap back to the system, after
 * what is queued (a session closed: what it made the cache hold is not
 * needed by the others). */
void cap__work_store_trim(cap_daemon_t *d);
/* Drop what is still queued (the loop no longer runs). */
void cap__store_queue_drop(cap_daemon_t *d);

uint64_t cap__now_ns(void);

#endif /* CAPUCHIN_DAEMON_INTERNAL_H */
