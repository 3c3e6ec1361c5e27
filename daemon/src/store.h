/*
 * The daemon's store: profiles, plans, jobs, sessions and iterations in one
 * SQLite database (DESIGN.md, "Store").
 *
 * WAL journal, synchronous=NORMAL, busy_timeout, foreign_keys=ON, STRICT
 * tables, schema versioned by PRAGMA user_version with forward migrations
 * (store_schema.c). Every write function below is one daemon event and runs
 * as exactly one transaction: it either commits completely or leaves the
 * database as it was. A crash (kill -9) loses at most the event in flight and
 * never corrupts the file.
 *
 * Ids are SQLite rowids (> 0). Id arguments of 0 mean "none" where a field
 * says so. Times are wall-clock milliseconds since the Unix epoch, taken by
 * the store when the event is written.
 *
 * Threading: a cap_store_t is one SQLite connection guarded by a mutex inside
 * the handle. Any thread may call any function on it (the event loop thread
 * and uv_queue_work threads may share one handle); calls on one handle are
 * serialised, so a long write (a large profile, a few ms) delays the others
 * on that handle. Threads that must not wait on each other open their own
 * handles on the same file: WAL lets readers run while one writer writes, and
 * writers on different handles wait for each other up to busy_timeout (5 s),
 * then fail with CAP_ESTORE. Never share a handle across fork().
 *
 * Errors: every function returns 0 or a negative CAP_E* code; the message of
 * the last failure on the calling thread is in cap_store_last_error().
 */
#ifndef CAPUCHIN_DAEMON_STORE_H
#define CAPUCHIN_DAEMON_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capuchin/plan.h"
#include "capuchin/profile.h"
#include "capuchin/sim.h"

/* Schema version this code writes and understands (PRAGMA user_version). */
#define CAP_STORE_SCHEMA_VERSION 4

typedef struct cap_store cap_store_t;

/* cap_store_open() flags */
#define CAP_STORE_READONLY 0x1u /* SQLITE_OPEN_READONLY: capuchin-query */
#define CAP_STORE_CREATE                                                       \
  0x2u /* create the file (and its parent folder,                              \
          mode 0750) when missing; read-write only */

/* Default database path: /var/lib/capuchin/capuchin.db as root,
 * else $XDG_STATE_HOME/capuchin/capuchin.db, else
 * $HOME/.local/state/capuchin/capuchin.db. Returns 0, CAP_ERANGE when buf is
 * too small, CAP_ENOENT when neither XDG_STATE_HOME nor HOME is set. */
int cap_store_default_path(char *buf, size_t len);

/* Open (and for read-write, create and migrate) the database at path.
 *
 * Before writing anything the file is opened read-only and checked: a file
 * that is not an SQLite database (CAP_ECORRUPT) or whose user_version is newer
 * than CAP_STORE_SCHEMA_VERSION (CAP_EVERSION) is refused with a message
 * naming the path and the reason, and is left byte-for-byte untouched. A
 * missing file without CAP_STORE_CREATE is CAP_ENOENT. Read-write opens then
 * set WAL/synchronous/foreign_keys and run the forward migrations, each in one
 * transaction. Read-only opens do not migrate: an older schema is refused
 * with CAP_EVERSION ("run capuchind once to upgrade"). *out is NULL on
 * failure. */
int cap_store_open(const char *path, unsigned flags, cap_store_t **out);

/* cap_store_open() that creates a missing database file with permission
 * bits `mode` exactly, whatever the umask (cap_store_open: 0600); SQLite
 * gives the -wal and -shm files the same. A read-write open of an existing
 * file that other users may read removes their bits. Before anything is
 * written, an existing database is also checked page by page (PRAGMA
 * quick_check): a damaged one is refused (CAP_ECORRUPT) and left
 * untouched. */
int cap_store_open_mode(const char *path, unsigned flags, unsigned mode,
                        cap_store_t **out);

/* Give back the page cache's unused pages (sqlite3_db_release_memory);
 * the cache refills as pages are read again. Any thread. */
void cap_store_release_memory(cap_store_t *s);

/* Close the connection (checkpointing the WAL if it is the last one).
 * NULL is a no-op. No other thread may be inside a call on s. */
void cap_store_close(cap_store_t *s);

/* Message of the last failed cap_store_* call on this thread ("" if none).
 * Thread-local; valid until this thread's next cap_store_* call. */
const char *cap_store_last_error(void);

/* The underlying sqlite3 * (for read-only queries by capuchin-query and
 * tests). Take it only while no other thread uses s. */
struct sqlite3;
struct sqlite3 *cap_store_db(cap_store_t *s);

/* --- Jobs and sessions ---------------------------------------------------
 * A job is one training process as it introduced itself (Hello); a session
 * is one connection carrying it. */
typedef struct cap_store_job {
  const char *name;                /* job name from Hello; NULL -> "" */
  const char *hostname;            /* NULL -> "" */
  uint32_t pid, uid, gid;          /* peer credentials (SO_PEERCRED) */
  int32_t device;                  /* CUDA device index, -1 if unknown */
  uint64_t device_total_bytes;     /* 0 if unknown */
  uint64_t requested_budget_bytes; /* 0: none requested */
  uint64_t hello_signature;        /* signature the client claimed, 0 if none */
} cap_store_job_t;

int cap_store_job_begin(cap_store_t *s, const cap_store_job_t *job,
                        int64_t *job_id);
/* The job's granted budget changed (shared GPU budgets): one event. */
int cap_store_job_set_budget(cap_store_t *s, int64_t job_id,
                             uint64_t granted_budget_bytes);
/* The job ended; status is a short word ("ok", "disconnected",
 * "error: ..."); NULL -> "ok". */
int cap_store_job_end(cap_store_t *s, int64_t job_id, const char *status);

int cap_store_session_begin(cap_store_t *s, int64_t job_id, uint32_t pid,
                            uint32_t uid, uint32_t gid, int64_t *session_id);
int cap_store_session_end(cap_store_t *s, int64_t session_id,
                          const char *reason);

/* --- Profiles ------------------------------------------------------------ */

/* Store profile p measured by job_id (0: none) with its signature and the
 * bandwidths the client measured (NULL: unknown), in one transaction:
 * profile row, meta, tensors, ops with their inputs and outputs, frees.
 * complete=false stores a partial profile (client gone mid-iteration): it is
 * kept for inspection and never returned by cap_store_profile_find(); p need
 * not be finished then. complete=true requires cap_profile_finish() to have
 * succeeded. Storing resnet50 (1039 tensors, 685 ops) takes a few ms. */
int cap_store_profile_put(cap_store_t *s, int64_t job_id,
                          const cap_profile_t *p, uint64_t signature,
                          bool complete, const cap_bandwidth_t *bw,
                          int64_t *profile_id);

/* Mark in stored profile profile_id every tensor p marks no_evict (p: a
 * profile of the same signature, measured again). Marks only add up: a
 * tensor once found not evictable stays so for plans made from the store,
 * the safe side when runs of a job differ. */
int cap_store_profile_mark_no_evict(cap_store_t *s, int64_t profile_id,
                                    const cap_profile_t *p);

/* Newest complete profile with this signature; CAP_ENOENT if none. */
int cap_store_profile_find(cap_store_t *s, uint64_t signature,
                           int64_t *profile_id);

/* Rebuild a stored complete profile through the cap_profile_* builder; *out
 * is finished and owned by the caller (cap_profile_destroy). CAP_ENOENT for an
 * unknown id, CAP_ESTATE for an incomplete profile, CAP_ECORRUPT when the
 * stored rows do not form a valid profile. signature may be NULL. */
int cap_store_profile_load(cap_store_t *s, int64_t profile_id,
                           cap_profile_t **out, uint64_t *signature);

/* --- Plans --------------------------------------------------------------- */

/* Store plan (all of it: budget, policy, version, predicted time and peak,
 * actions with triggers and recompute lists) for profile_id, computed for
 * bandwidths bw (NULL: unknown). job_id (0: none) is the job it was made
 * for; the plan is also recorded as sent to that job (as
 * cap_store_plan_assign), in the same transaction. */
int cap_store_plan_put(cap_store_t *s, int64_t profile_id, int64_t job_id,
                       const cap_plan_t *plan, const cap_bandwidth_t *bw,
                       int64_t *plan_id);

/* Record that plan_id was pushed to job_id; reused=true when it came from
 * the store without a measured iteration (profile reuse). */
int cap_store_plan_assign(cap_store_t *s, int64_t job_id, int64_t plan_id,
                          bool reused);

/* Latest plan (highest version, then newest) for a complete profile with
 * this signature, exactly this budget, and bandwidths compatible with bw:
 * each of h2d, d2h (and duplex when both are known) within bw_tolerance
 * (relative, e.g. 0.2 = 20 %) of the stored plan's. bw NULL matches any.
 * CAP_ENOENT if none. profile_id may be NULL. */
int cap_store_plan_find(cap_store_t *s, uint64_t signature,
                        uint64_t budget_bytes, const cap_bandwidth_t *bw,
                        double bw_tolerance, int64_t *plan_id,
                        int64_t *profile_id);

/* Latest version of the plans for profile_id and budget (any bandwidth), for
 * refinement: CAP_ENOENT if none. */
int cap_store_plan_latest_version(cap_store_t *s, int64_t profile_id,
                                  uint64_t budget_bytes, uint32_t *version);

/* Load a stored plan; *out is owned by the caller (cap_plan_destroy).
 * profile_id and bw (the bandwidths it was computed for; zeros if unknown)
 * may be NULL. CAP_ENOENT for an unknown id. */
int cap_store_plan_load(cap_store_t *s, int64_t plan_id, cap_plan_t **out,
                        int64_t *profile_id, cap_bandwidth_t *bw);

/* --- Iterations ---------------------------------------------------------- */
typedef struct cap_store_iteration {
  int64_t job_id;          /* required */
  int64_t session_id;      /* 0: none */
  int64_t plan_id;         /* plan the iteration ran under, 0: unmanaged */
  uint32_t plan_version;   /* version of that plan, 0 when unmanaged */
  uint64_t iteration;      /* the client's iteration number */
  int64_t iter_ns;         /* measured iteration time */
  uint64_t peak_bytes;     /* measured device peak */
  int64_t stall_ns;        /* total back-access stalls (late prefetches) */
  uint32_t n_stalls;       /* number of late prefetches */
  uint64_t swap_out_bytes; /* bytes moved D2H */
  uint64_t swap_in_bytes;  /* bytes moved H2D */
  int64_t recompute_ns;    /* time spent recomputing */
  uint32_t op_errors;      /* ops that could not run */
  char error[256];         /* the first op error's message, "" when none */
} cap_store_iteration_t;

int cap_store_iteration_put(cap_store_t *s, const cap_store_iteration_t *it,
                            int64_t *iteration_id /* may be NULL */);

/* Store n rows in one transaction (one fsync for all of them). A row whose
 * values are out of range is skipped and counted in *skipped (may be NULL);
 * any other failure rolls the whole batch back. */
int cap_store_iterations_put(cap_store_t *s, const cap_store_iteration_t *its,
                             uint32_t n, uint32_t *skipped);

#endif /* CAPUCHIN_DAEMON_STORE_H */
