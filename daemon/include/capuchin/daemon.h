/*
 * capuchind as a library: configuration, and a daemon that runs a libuv loop
 * on the calling thread (DESIGN.md, "Data flow"). daemon/tools/capuchind.c is
 * a thin main() around it; tests and benchmarks run it in-process.
 */
#ifndef CAPUCHIN_DAEMON_H
#define CAPUCHIN_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CAP_DAEMON_MAX_ALLOW 64 /* entries of each allow list */
#define CAP_DAEMON_MAX_DEVICES 64 /* device indices gpu-memory can name */

typedef enum {
  CAP_LOG_ERROR = 0,
  CAP_LOG_WARN = 1,
  CAP_LOG_INFO = 2,
  CAP_LOG_DEBUG = 3,
} cap_log_level_t;

typedef enum {
  CAP_EVICT_PERSISTENT_AUTO = 0,
  CAP_EVICT_PERSISTENT_NO,
  CAP_EVICT_PERSISTENT_YES,
} cap_evict_persistent_t;

typedef struct cap_daemon_config {
  char socket_path[108]; /* sun_path limit */
  char db_path[4096];
  char config_path[4096]; /* "" when none */
  char log_file[4096];    /* "" = stderr; reopened on SIGHUP */
  uint64_t gpu_memory_bytes; /* every device; 0: from the clients' Hellos */
  /* gpu-memory = INDEX:BYTES, one device (wins over gpu_memory_bytes);
   * 0: unset. */
  uint64_t gpu_memory_dev[CAP_DAEMON_MAX_DEVICES];
  uint32_t allow_uids[CAP_DAEMON_MAX_ALLOW];
  uint32_t n_allow_uids;
  uint32_t allow_gids[CAP_DAEMON_MAX_ALLOW];
  uint32_t n_allow_gids;
  cap_log_level_t log_level;
  uint32_t max_sessions;
  /* Per-session quotas (bad input and faults). */
  size_t max_frame_bytes;              /* payload of one frame */
  uint64_t max_accesses_per_iteration; /* op inputs + outputs */
  uint32_t max_ops_per_iteration;
  uint32_t max_tensors;       /* declared tensors of one session */
  size_t max_pending_write_bytes; /* unsent output before a slow reader is cut */
  /* Hostile clients. */
  uint32_t max_op_names;        /* distinct op names of one iteration */
  uint64_t max_op_name_bytes;   /* and their bytes */
  uint32_t handshake_timeout_ms; /* accept -> Hello */
  uint32_t idle_timeout_ms;      /* a frame begun and not finished */
  uint32_t budget_ack_timeout_ms; /* a budget cut not confirmed: the other
                                     jobs on the device wait no longer */
  uint32_t max_queued_store_rows; /* iteration rows a session may have
                                     waiting for the store before its
                                     input is paused */
  uint32_t db_mode;              /* permission bits of a database it creates
                                    (0600, 0640 or 0660), whatever the umask */
  double bw_tolerance;        /* profile reuse: relative bandwidth match */
  char planner[32];           /* "capuchin" */
  /* May plans evict params and optimizer state? CAP_EVICT_PERSISTENT_AUTO:
   * only when no plan without it fits the budget. */
  cap_evict_persistent_t evict_persistent;
  /* Plans give every block an address (docs/placement.md): the budget a
   * plan meets is its placement's, persistent bytes plus the arena (true). */
  bool placement;
  /* Plans aim this many percent under the budget where they can, so that
   * the client's allocator has free space to absorb fragmentation (0:
   * placement leaves none to absorb; 6 suits plans without placement). */
  double alloc_headroom_pct;
  uint32_t stall_probe_ms;    /* >0: measure loop stalls with a timer */
} cap_daemon_config_t;

/* Defaults: socket $CAPUCHIN_SOCKET, else
 * /run/capuchin/capuchind.sock as root or
 * $XDG_RUNTIME_DIR/capuchin/capuchind.sock; database from
 * cap_store_default_path(). */
void cap_daemon_config_init(cap_daemon_config_t *cfg);

/* Set one option by its long name without dashes ("socket", "allow-uid",
 * "gpu-memory", "max-accesses-per-iteration", ...), as on the command line or
 * as "key = value" in the config file. Lists append. Returns 0, CAP_ENOENT
 * for an unknown key, CAP_EINVAL/CAP_ERANGE for a bad value, with a message
 * in err. */
int cap_daemon_config_set(cap_daemon_config_t *cfg, const char *key,
                          const char *value, char *err, size_t err_len);

/* Read a config file of "key = value" lines ('#' starts a comment) into cfg.
 * Messages name file and line. */
int cap_daemon_config_load(cap_daemon_config_t *cfg, const char *path,
                           char *err, size_t err_len);

/* Parse a byte count: plain digits or with a K/M/G/T (binary) suffix. */
int cap_daemon_parse_bytes(const char *s, uint64_t *out);

typedef struct cap_daemon cap_daemon_t;

/* Counters a test or benchmark may read after cap_daemon_run returned (or,
 * racily, while it runs). */
typedef struct cap_daemon_stats {
  uint64_t sessions_accepted;
  uint64_t sessions_refused;
  uint64_t frames_in;
  uint64_t accesses_in;   /* op inputs + outputs ingested */
  uint64_t plans_pushed;
  uint64_t plans_computed;
  uint64_t plans_reused;
  uint64_t protocol_errors;
  int64_t max_loop_stall_ns; /* with stall_probe_ms > 0 */
} cap_daemon_stats_t;

/* Open the store (creating and migrating it), bind and listen. On failure a
 * message is in err and nothing is left behind (the database file is never
 * modified when it is refused). cmdline (may be NULL) holds options that
 * override the config file when it is re-read on SIGHUP. */
int cap_daemon_create(const cap_daemon_config_t *cfg,
                      const cap_daemon_config_t *cmdline, cap_daemon_t **out,
                      char *err, size_t err_len);

/* Run the loop until SIGTERM/SIGINT (when handle_signals) or
 * cap_daemon_stop(). Sends READY=1 to $NOTIFY_SOCKET when set. Returns 0 on
 * a clean stop. Call on one thread only. */
int cap_daemon_run(cap_daemon_t *d, int handle_signals);

/* Ask a running daemon to stop (any thread, async-signal-unsafe). */
void cap_daemon_stop(cap_daemon_t *d);

void cap_daemon_get_stats(const cap_daemon_t *d, cap_daemon_stats_t *out);

/* Close everything; NULL is a no-op. Only after cap_daemon_run returned. */
void cap_daemon_destroy(cap_daemon_t *d);

#endif /* CAPUCHIN_DAEMON_H */
