/*
 * The SQLite store (store.h). Each write is one daemon event and one
 * BEGIN IMMEDIATE ... COMMIT transaction over cached prepared statements:
 * IMMEDIATE takes the write lock up front, so a busy database fails (after
 * busy_timeout) before any row is written rather than at COMMIT.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store_internal.h"

#define BUSY_TIMEOUT_MS 5000

static _Thread_local char last_error[512];

int cap__store_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return code;
}

const char *cap_store_last_error(void) {
  return last_error;
}

enum {
  S_BEGIN,
  S_COMMIT,
  S_ROLLBACK,
  S_JOB_INSERT,
  S_JOB_SET_BUDGET,
  S_JOB_END,
  S_SESSION_INSERT,
  S_SESSION_END,
  S_PROFILE_INSERT,
  S_META_INSERT,
  S_TENSOR_INSERT,
  S_OP_INSERT,
  S_FREE_INSERT,
  S_TENSOR_NO_EVICT,
  S_PROFILE_FIND,
  S_PROFILE_GET,
  S_META_SELECT,
  S_TENSOR_SELECT,
  S_OP_SELECT,
  S_FREE_SELECT,
  S_PLAN_INSERT,
  S_ACTION_INSERT,
  S_RECOMP_INSERT,
  S_JOBPLAN_INSERT,
  S_PLAN_FIND,
  S_PLAN_LATEST,
  S_PLAN_GET,
  S_ACTION_SELECT,
  S_RECOMP_SELECT,
  S_BLOCK_SELECT,
  S_BLOCK_INSERT,
  S_ITER_INSERT,
  S_COUNT
};

static const char *const stmt_sql[S_COUNT] = {
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_JOB_INSERT] =
        "INSERT INTO jobs (name, hostname, pid, uid, gid, device,"
        " device_total_bytes, requested_budget_bytes, hello_signature,"
        " started_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    [S_JOB_SET_BUDGET] =
        "UPDATE jobs SET granted_budget_bytes = ?2 WHERE id = ?1",
    [S_JOB_END] = "UPDATE jobs SET ended_ms = ?2, status = ?3 WHERE id = ?1",
    [S_SESSION_INSERT] =
        "INSERT INTO sessions (job_id, pid, uid, gid, started_ms)"
        " VALUES (?1, ?2, ?3, ?4, ?5)",
    [S_SESSION_END] =
        "UPDATE sessions SET ended_ms = ?2, end_reason = ?3 WHERE id = ?1",
    [S_PROFILE_INSERT] =
        "INSERT INTO profiles (job_id, signature, complete, model, n_tensors,"
        " n_ops, n_accesses, iter_ns, persistent_bytes, transient_peak_bytes,"
        " meta_peak_bytes, h2d_gbps, d2h_gbps, duplex_gbps, created_ms)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
        " ?15)",
    [S_META_INSERT] = "INSERT INTO profile_meta VALUES (?1, ?2, ?3, ?4)",
    [S_TENSOR_INSERT] =
        "INSERT INTO profile_tensors VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [S_OP_INSERT] =
        "INSERT INTO profile_ops VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9,"
        " ?10)",
    [S_FREE_INSERT] = "INSERT INTO profile_frees VALUES (?1, ?2, ?3, ?4)",
    [S_PROFILE_FIND] = "SELECT id FROM profiles WHERE signature = ?1 AND"
                       " complete = 1 ORDER BY id DESC LIMIT 1",
    [S_PROFILE_GET] = "SELECT complete, signature, n_tensors, n_ops"
                      " FROM profiles WHERE id = ?1",
    [S_META_SELECT] = "SELECT key, value FROM profile_meta WHERE profile_id = "
                      "?1 ORDER BY seq",
    [S_TENSOR_NO_EVICT] = "UPDATE profile_tensors SET no_evict = 1"
                          " WHERE profile_id = ?1 AND tensor = ?2",
    [S_TENSOR_SELECT] = "SELECT tensor, bytes, kind, no_evict"
                        " FROM profile_tensors"
                        " WHERE profile_id = ?1 ORDER BY tensor",
    [S_OP_SELECT] = "SELECT seq, start_ns, end_ns, name, n_in, n_out, inputs,"
                    " outputs"
                    " FROM profile_ops WHERE profile_id = ?1 ORDER BY seq",
    [S_FREE_SELECT] = "SELECT t_ns, tensor FROM profile_frees"
                      " WHERE profile_id = ?1 ORDER BY seq",
    [S_PLAN_INSERT] =
        "INSERT INTO plans (profile_id, job_id, policy, version, budget_bytes,"
        " predicted_iter_ns, predicted_peak_bytes, h2d_gbps, d2h_gbps,"
        " duplex_gbps, n_actions, created_ms, arena_bytes)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    [S_ACTION_INSERT] =
        "INSERT INTO plan_actions VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [S_RECOMP_INSERT] =
        "INSERT INTO plan_recompute_ops VALUES (?1, ?2, ?3, ?4)",
    [S_JOBPLAN_INSERT] = "INSERT INTO job_plans (job_id, plan_id, reused,"
                         " sent_ms) VALUES (?1, ?2, ?3, ?4)",
    [S_PLAN_FIND] =
        "SELECT pl.id, pl.profile_id, pl.h2d_gbps, pl.d2h_gbps, pl.duplex_gbps"
        " FROM plans pl JOIN profiles pr ON pr.id = pl.profile_id"
        " WHERE pr.signature = ?1 AND pr.complete = 1 AND pl.budget_bytes = ?2"
        " ORDER BY pl.version DESC, pl.id DESC",
    [S_PLAN_LATEST] = "SELECT max(version) FROM plans WHERE profile_id = ?1"
                      " AND budget_bytes = ?2",
    [S_PLAN_GET] =
        "SELECT profile_id, policy, version, budget_bytes, predicted_iter_ns,"
        " predicted_peak_bytes, h2d_gbps, d2h_gbps, duplex_gbps, arena_bytes"
        " FROM plans WHERE id = ?1",
    [S_ACTION_SELECT] = "SELECT seq, tensor, evict_after_access, method, flags,"
                        " prefetch_tensor, prefetch_access FROM plan_actions"
                        " WHERE plan_id = ?1 ORDER BY seq",
    [S_RECOMP_SELECT] = "SELECT action_seq, op_seq FROM plan_recompute_ops"
                        " WHERE plan_id = ?1 ORDER BY action_seq, pos",
    [S_BLOCK_SELECT] = "SELECT tensor, kind, action_seq, offset, bytes,"
                       " start_ns, end_ns, share, same_as FROM plan_blocks"
                       " WHERE plan_id = ?1 ORDER BY seq",
    [S_BLOCK_INSERT] = "INSERT INTO plan_blocks VALUES (?1, ?2, ?3, ?4, ?5,"
                       " ?6, ?7, ?8, ?9, ?10, ?11)",
    [S_ITER_INSERT] =
        "INSERT INTO iterations (job_id, session_id, plan_id, plan_version,"
        " iteration, iter_ns, peak_bytes, stall_ns, n_stalls, swap_out_bytes,"
        " swap_in_bytes, recompute_ns, created_ms, op_errors, error)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
        " ?15)",
};

struct cap_store {
  sqlite3 *db;
  pthread_mutex_t mu;
  bool readonly;
  char *path;
  sqlite3_stmt *stmt[S_COUNT];
};

/* --- helpers -------------------------------------------------------------- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int sql_fail(cap_store_t *s, const char *what) {
  int ext = sqlite3_extended_errcode(s->db);
  int code = CAP_ESTORE;
  if ((ext & 0xff) == SQLITE_NOMEM)
    code = CAP_ENOMEM;
  else if ((ext & 0xff) == SQLITE_CORRUPT || (ext & 0xff) == SQLITE_NOTADB)
    code = CAP_ECORRUPT;
  return cap__store_fail(code, "%s: %s: %s", s->path, what,
                         sqlite3_errmsg(s->db));
}

/* The cached statement, reset and with bindings cleared. */
static sqlite3_stmt *stmt(cap_store_t *s, int which) {
  sqlite3_stmt *st = s->stmt[which];
  if (!st) {
    if (sqlite3_prepare_v3(s->db, stmt_sql[which], -1,
                           SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK)
      return NULL;
    s->stmt[which] = st;
  } else {
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
  }
  return st;
}

/* Run a statement that returns no rows. */
static int exec_stmt(cap_store_t *s, sqlite3_stmt *st, const char *what) {
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_fail(s, what);
  sqlite3_reset(st);
  return rc;
}

static int run_simple(cap_store_t *s, int which, const char *what) {
  sqlite3_stmt *st = stmt(s, which);
  if (!st)
    return sql_fail(s, what);
  return exec_stmt(s, st, what);
}

static int tx_begin(cap_store_t *s) {
  if (s->readonly)
    return cap__store_fail(CAP_EPERM, "%s: store opened read-only", s->path);
  return run_simple(s, S_BEGIN, "begin transaction");
}

static int tx_commit(cap_store_t *s) {
  int rc = run_simple(s, S_COMMIT, "commit");
  if (rc != 0 && !sqlite3_get_autocommit(s->db))
    run_simple(s, S_ROLLBACK, "rollback");
  return rc;
}

static void tx_rollback(cap_store_t *s) {
  /* Keep the first error's message: a rollback failure adds nothing. */
  if (sqlite3_get_autocommit(s->db))
    return;
  char saved[sizeof last_error];
  memcpy(saved, last_error, sizeof saved);
  run_simple(s, S_ROLLBACK, "rollback");
  memcpy(last_error, saved, sizeof saved);
}

/* The statement for a write of one row on its own: SQLite runs a lone
 * statement in autocommit as one transaction, so it needs no BEGIN/COMMIT. */
static int single_write(cap_store_t *s, int which, const char *what,
                        sqlite3_stmt **out) {
  if (s->readonly)
    return cap__store_fail(CAP_EPERM, "%s: store opened read-only", s->path);
  *out = stmt(s, which);
  return *out ? 0 : sql_fail(s, what);
}

/* Run a bound single_write() INSERT; its rowid into *id when id is set. */
static int insert_row(cap_store_t *s, sqlite3_stmt *st, const char *what,
                      int64_t *id) {
  int rc = exec_stmt(s, st, what);
  if (rc == 0 && id)
    *id = sqlite3_last_insert_rowid(s->db);
  return rc;
}

static void bind_opt_id(sqlite3_stmt *st, int col, int64_t id) {
  if (id > 0)
    sqlite3_bind_int64(st, col, id);
  else
    sqlite3_bind_null(st, col);
}

static void bind_u32_or_null(sqlite3_stmt *st, int col, uint32_t v) {
  if (v == CAP_NONE)
    sqlite3_bind_null(st, col);
  else
    sqlite3_bind_int64(st, col, v);
}

static void bind_bw(sqlite3_stmt *st, int col, const cap_bandwidth_t *bw) {
  if (bw) {
    sqlite3_bind_double(st, col, bw->h2d_gbps);
    sqlite3_bind_double(st, col + 1, bw->d2h_gbps);
    sqlite3_bind_double(st, col + 2, bw->duplex_gbps);
  } else {
    sqlite3_bind_null(st, col);
    sqlite3_bind_null(st, col + 1);
    sqlite3_bind_null(st, col + 2);
  }
}

/* uint64 to INTEGER: bytes never reach 2^63; signatures keep their bits. */
static sqlite3_int64 u64(uint64_t v) {
  sqlite3_int64 r;
  memcpy(&r, &v, sizeof r);
  return r;
}

static uint64_t col_u64(sqlite3_stmt *st, int col) {
  sqlite3_int64 v = sqlite3_column_int64(st, col);
  uint64_t r;
  memcpy(&r, &v, sizeof r);
  return r;
}

static int check_bytes(uint64_t v, const char *what) {
  if (v > (uint64_t)INT64_MAX)
    return cap__store_fail(CAP_ERANGE, "%s %llu out of range", what,
                           (unsigned long long)v);
  return 0;
}

/* --- open / close --------------------------------------------------------- */

int cap_store_default_path(char *buf, size_t len) {
  int n;
  const char *xdg = getenv("XDG_STATE_HOME");
  const char *home = getenv("HOME");
  if (geteuid() == 0)
    n = snprintf(buf, len, "/var/lib/capuchin/capuchin.db");
  else if (xdg && xdg[0] == '/')
    n = snprintf(buf, len, "%s/capuchin/capuchin.db", xdg);
  else if (home && home[0])
    n = snprintf(buf, len, "%s/.local/state/capuchin/capuchin.db", home);
  else
    return cap__store_fail(CAP_ENOENT,
                           "no default database path: neither XDG_STATE_HOME "
                           "nor HOME is set (use --db)");
  if (n < 0 || (size_t)n >= len)
    return cap__store_fail(CAP_ERANGE, "database path too long");
  return 0;
}

int cap__store_user_version(sqlite3 *db, int *version) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    *version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return 0;
  }
  rc = sqlite3_extended_errcode(db);
  sqlite3_finalize(st);
  return (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT
             ? CAP_ECORRUPT
             : CAP_ESTORE;
}

/* mkdir -p of path's parent folder. */
static int make_parent(const char *path) {
  char *dir = strdup(path);
  if (!dir)
    return cap__store_fail(CAP_ENOMEM, "out of memory");
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) {
    free(dir);
    return 0;
  }
  *slash = '\0';
  for (char *p = dir + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char c = *p;
      *p = '\0';
      if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
        int e = errno;
        int rc = cap__store_fail(CAP_EIO, "%s: cannot create folder %s: %s",
                                 path, dir, strerror(e));
        free(dir);
        return rc;
      }
      *p = c;
      if (c == '\0')
        break;
    }
  }
  free(dir);
  return 0;
}

/* Whether the database holds any schema object (table, index, view). */
static bool has_tables(sqlite3 *db) {
  sqlite3_stmt *st = NULL;
  bool any = true; /* when in doubt, do not touch it */
  if (sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_schema", -1, &st,
                         NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    any = sqlite3_column_int64(st, 0) > 0;
  sqlite3_finalize(st);
  return any;
}

/* Page-level damage (a torn or overwritten page) leaves the header, and so
 * user_version, intact; switching to WAL would then rewrite the header of a
 * damaged file and every later query would fail with "database disk image
 * is malformed". So the whole file is checked, read-only, before anything
 * writes to it: O(size), a few ms per MB, once per start. */
static int quick_check(sqlite3 *db, const char *path) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, "PRAGMA quick_check(1)", -1, &st, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    const char *r = (const char *)sqlite3_column_text(st, 0);
    if (r && strcmp(r, "ok") == 0) {
      sqlite3_finalize(st);
      return 0;
    }
    rc = cap__store_fail(CAP_ECORRUPT,
                         "%s: the database is damaged (PRAGMA quick_check: "
                         "%s); left untouched. Restore a backup, or move it "
                         "aside to start with an empty one",
                         path, r ? r : "no answer");
    sqlite3_finalize(st);
    return rc;
  }
  rc = cap__store_fail(CAP_ECORRUPT,
                       "%s: the database is damaged (PRAGMA quick_check: %s); "
                       "left untouched. Restore a backup, or move it aside "
                       "to start with an empty one",
                       path, sqlite3_errmsg(db));
  sqlite3_finalize(st);
  return rc;
}

/* Open path read-only and read its user_version without writing anything. */
static int precheck(const char *path, int *version) {
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL);
  if (rc != SQLITE_OK) {
    rc = cap__store_fail(CAP_EIO, "%s: cannot open: %s", path,
                         db ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_close(db);
    return rc;
  }
  sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
  rc = cap__store_user_version(db, version);
  if (rc == CAP_ECORRUPT)
    rc = cap__store_fail(CAP_ECORRUPT,
                         "%s: not a capuchin database (not an SQLite file); "
                         "left untouched",
                         path);
  else if (rc != 0)
    rc = cap__store_fail(rc, "%s: cannot read schema version: %s", path,
                         sqlite3_errmsg(db));
  else if (*version == 0 && has_tables(db))
    rc = cap__store_fail(CAP_ECORRUPT,
                         "%s: an SQLite database that is not a capuchin "
                         "database (it has tables but no capuchin schema "
                         "version); left untouched",
                         path);
  else if (*version > CAP_STORE_SCHEMA_VERSION)
    rc = cap__store_fail(CAP_EVERSION,
                         "%s: schema version %d is newer than this build "
                         "understands (%d); upgrade capuchin. File left "
                         "untouched",
                         path, *version, CAP_STORE_SCHEMA_VERSION);
  else if (*version > 0)
    rc = quick_check(db, path);
  sqlite3_close(db);
  return rc;
}

static int set_pragmas(sqlite3 *db, const char *path, bool readonly) {
  char *msg = NULL;
  const char *sql = readonly ? "PRAGMA foreign_keys=ON;"
                             : "PRAGMA foreign_keys=ON;"
                               "PRAGMA synchronous=NORMAL;";
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
    goto fail;
  if (!readonly) {
    sqlite3_stmt *st = NULL;
    bool wal = false;
    if (sqlite3_prepare_v2(db, "PRAGMA journal_mode=WAL", -1, &st, NULL) ==
            SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      const unsigned char *mode = sqlite3_column_text(st, 0);
      wal = mode && strcmp((const char *)mode, "wal") == 0;
    }
    sqlite3_finalize(st);
    if (!wal)
      return cap__store_fail(CAP_ESTORE, "%s: cannot enable WAL mode: %s", path,
                             sqlite3_errmsg(db));
  }
  return 0;
fail:;
  int rc = cap__store_fail(CAP_ESTORE, "%s: setting pragmas: %s", path,
                           msg ? msg : sqlite3_errmsg(db));
  sqlite3_free(msg);
  return rc;
}

/* Create the database file with exactly `mode`, whatever the umask: SQLite
 * would create it 0644 & ~umask, readable by every local user, and gives
 * its -wal and -shm files the database file's mode. */
static int create_file(const char *path, unsigned mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                (mode_t)mode);
  if (fd < 0) {
    if (errno == EEXIST) /* another process made it first: it is checked */
      return 0;
    return cap__store_fail(CAP_EIO, "%s: cannot create: %s", path,
                           strerror(errno));
  }
  int rc = 0;
  if (fchmod(fd, (mode_t)mode) != 0)
    rc = cap__store_fail(CAP_EIO, "%s: cannot set mode %04o: %s", path, mode,
                         strerror(errno));
  close(fd);
  return rc;
}

/* A database (and its -wal, -shm) that other users may read was made
 * before the daemon created files with a mode of its own: take the other
 * users' bits away (SQLite keeps the database file's mode for the others). */
static void tighten(const char *path, mode_t mode) {
  static const char *const sfx[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s%s", path, sfx[i]);
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0007))
      chmod(p, mode);
  }
}

int cap_store_open(const char *path, unsigned flags, cap_store_t **out) {
  return cap_store_open_mode(path, flags, 0600, out);
}

int cap_store_open_mode(const char *path, unsigned flags, unsigned mode,
                        cap_store_t **out) {
  int rc;
  int version = 0;
  bool readonly = flags & CAP_STORE_READONLY;
  struct stat sb;
  bool existed = false;
  cap_store_t *s = NULL;

  *out = NULL;
  if (!path || !path[0])
    return cap__store_fail(CAP_EINVAL, "empty database path");
  if (stat(path, &sb) == 0) {
    existed = true;
    if (!S_ISREG(sb.st_mode))
      return cap__store_fail(CAP_EINVAL, "%s: not a regular file", path);
    rc = precheck(path, &version);
    if (rc != 0)
      return rc;
  } else if (errno != ENOENT) {
    return cap__store_fail(CAP_EIO, "%s: %s", path, strerror(errno));
  } else if (readonly || !(flags & CAP_STORE_CREATE)) {
    return cap__store_fail(CAP_ENOENT, "%s: no such database", path);
  } else if ((rc = make_parent(path)) != 0) {
    return rc;
  } else if ((rc = create_file(path, mode)) != 0) {
    return rc;
  }
  if (readonly && version == 0)
    return cap__store_fail(CAP_EVERSION,
                           "%s: an empty database: no capuchind has written "
                           "to it yet (capuchind initialises it when it "
                           "starts with --db %s)",
                           path, path);
  if (readonly && version < CAP_STORE_SCHEMA_VERSION)
    return cap__store_fail(CAP_EVERSION,
                           "%s: schema version %d is older than this build's "
                           "(%d); start capuchind once to upgrade it",
                           path, version, CAP_STORE_SCHEMA_VERSION);
  if (!readonly && existed && (sb.st_mode & 0007))
    tighten(path, sb.st_mode & 0770);

  s = calloc(1, sizeof *s);
  if (!s || !(s->path = strdup(path))) {
    rc = cap__store_fail(CAP_ENOMEM, "out of memory");
    goto out_free;
  }
  s->readonly = readonly;
  pthread_mutex_init(&s->mu, NULL);
  /* NOMUTEX: the handle's own mutex serialises every use of s->db. */
  int oflags = SQLITE_OPEN_NOMUTEX |
               (readonly ? SQLITE_OPEN_READONLY
                         : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  if (sqlite3_open_v2(path, &s->db, oflags, NULL) != SQLITE_OK) {
    rc = cap__store_fail(CAP_EIO, "%s: cannot open: %s", path,
                         s->db ? sqlite3_errmsg(s->db) : "out of memory");
    goto out_close;
  }
  sqlite3_busy_timeout(s->db, BUSY_TIMEOUT_MS);
  sqlite3_extended_result_codes(s->db, 1);
  if ((rc = set_pragmas(s->db, path, readonly)) != 0)
    goto out_close;
  if (!readonly) {
    /* Re-read under this connection: the file may have changed (or been
     * created) since the precheck. */
    rc = cap__store_user_version(s->db, &version);
    if (rc != 0) {
      rc = cap__store_fail(rc, "%s: cannot read schema version: %s", path,
                           sqlite3_errmsg(s->db));
      goto out_close;
    }
    if (version > CAP_STORE_SCHEMA_VERSION) {
      rc = cap__store_fail(CAP_EVERSION,
                           "%s: schema version %d is newer than this build "
                           "understands (%d)",
                           path, version, CAP_STORE_SCHEMA_VERSION);
      goto out_close;
    }
    if ((rc = cap__store_migrate(s->db, path, version)) != 0)
      goto out_close;
  }
  *out = s;
  return 0;

out_close:
  sqlite3_close(s->db);
  pthread_mutex_destroy(&s->mu);
out_free:
  if (s)
    free(s->path);
  free(s);
  return rc;
}

void cap_store_close(cap_store_t *s) {
  if (!s)
    return;
  for (int i = 0; i < S_COUNT; i++)
    sqlite3_finalize(s->stmt[i]);
  sqlite3_close(s->db);
  pthread_mutex_destroy(&s->mu);
  free(s->path);
  free(s);
}

void cap_store_release_memory(cap_store_t *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  sqlite3_db_release_memory(s->db);
  pthread_mutex_unlock(&s->mu);
}

sqlite3 *cap_store_db(cap_store_t *s) {
  return s ? s->db : NULL;
}

/* --- jobs and sessions ---------------------------------------------------- */

#define LOCKED(s, call)                                                        \
  do {                                                                         \
    pthread_mutex_lock(&(s)->mu);                                              \
    int cap__rc = (call);                                                      \
    pthread_mutex_unlock(&(s)->mu);                                            \
    return cap__rc;                                                            \
  } while (0)

static int job_begin(cap_store_t *s, const cap_store_job_t *j, int64_t *id) {
  int rc;
  if ((rc = check_bytes(j->device_total_bytes, "device_total_bytes")) ||
      (rc = check_bytes(j->requested_budget_bytes, "requested_budget_bytes")))
    return rc;
  sqlite3_stmt *st;
  rc = single_write(s, S_JOB_INSERT, "job begin", &st);
  if (rc)
    return rc;
  sqlite3_bind_text(st, 1, j->name ? j->name : "", -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, j->hostname ? j->hostname : "", -1,
                    SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 3, j->pid);
  sqlite3_bind_int64(st, 4, j->uid);
  sqlite3_bind_int64(st, 5, j->gid);
  sqlite3_bind_int64(st, 6, j->device);
  sqlite3_bind_int64(st, 7, u64(j->device_total_bytes));
  sqlite3_bind_int64(st, 8, u64(j->requested_budget_bytes));
  sqlite3_bind_int64(st, 9, u64(j->hello_signature));
  sqlite3_bind_int64(st, 10, now_ms());
  return insert_row(s, st, "job begin", id);
}

int cap_store_job_begin(cap_store_t *s, const cap_store_job_t *job,
                        int64_t *job_id) {
  if (!s || !job)
    return cap__store_fail(CAP_EINVAL, "job begin: NULL argument");
  LOCKED(s, job_begin(s, job, job_id));
}

/* One UPDATE by id (a lone statement: its own transaction); CAP_ENOENT if
 * no row matched. */
static int update_one(cap_store_t *s, int which, int64_t id, int64_t a,
                      const char *text, bool a_is_text, const char *what) {
  sqlite3_stmt *st;
  int rc = single_write(s, which, what, &st);
  if (rc)
    return rc;
  sqlite3_bind_int64(st, 1, id);
  if (a_is_text) {
    sqlite3_bind_int64(st, 2, now_ms());
    sqlite3_bind_text(st, 3, text, -1, SQLITE_TRANSIENT);
  } else {
    sqlite3_bind_int64(st, 2, a);
  }
  rc = exec_stmt(s, st, what);
  if (rc == 0 && sqlite3_changes(s->db) != 1)
    rc = cap__store_fail(CAP_ENOENT, "%s: no id %lld", what, (long long)id);
  return rc;
}

int cap_store_job_set_budget(cap_store_t *s, int64_t job_id,
                             uint64_t granted_budget_bytes) {
  if (!s)
    return cap__store_fail(CAP_EINVAL, "job budget: NULL store");
  int rc = check_bytes(granted_budget_bytes, "granted_budget_bytes");
  if (rc)
    return rc;
  LOCKED(s, update_one(s, S_JOB_SET_BUDGET, job_id, u64(granted_budget_bytes),
                       NULL, false, "job budget"));
}

int cap_store_job_end(cap_store_t *s, int64_t job_id, const char *status) {
  if (!s)
    return cap__store_fail(CAP_EINVAL, "job end: NULL store");
  LOCKED(s, update_one(s, S_JOB_END, job_id, 0, status ? status : "ok", true,
                       "job end"));
}

static int session_begin(cap_store_t *s, int64_t job_id, uint32_t pid,
                         uint32_t uid, uint32_t gid, int64_t *id) {
  sqlite3_stmt *st;
  int rc = single_write(s, S_SESSION_INSERT, "session begin", &st);
  if (rc)
    return rc;
  bind_opt_id(st, 1, job_id);
  sqlite3_bind_int64(st, 2, pid);
  sqlite3_bind_int64(st, 3, uid);
  sqlite3_bind_int64(st, 4, gid);
  sqlite3_bind_int64(st, 5, now_ms());
  return insert_row(s, st, "session begin", id);
}

int cap_store_session_begin(cap_store_t *s, int64_t job_id, uint32_t pid,
                            uint32_t uid, uint32_t gid, int64_t *session_id) {
  if (!s)
    return cap__store_fail(CAP_EINVAL, "session begin: NULL store");
  LOCKED(s, session_begin(s, job_id, pid, uid, gid, session_id));
}

int cap_store_session_end(cap_store_t *s, int64_t session_id,
                          const char *reason) {
  if (!s)
    return cap__store_fail(CAP_EINVAL, "session end: NULL store");
  LOCKED(s, update_one(s, S_SESSION_END, session_id, 0, reason ? reason : "",
                       true, "session end"));
}

/* --- profiles ------------------------------------------------------------- */

/* ids as a JSON array ("[3,17]") into *buf (grown as needed). */
static int format_ids(char **buf, size_t *cap, const uint32_t *ids,
                      uint32_t n) {
  size_t need = 3 + (size_t)n * 11;
  if (need > *cap) {
    char *nb = realloc(*buf, need);
    if (!nb)
      return cap__store_fail(CAP_ENOMEM, "out of memory");
    *buf = nb;
    *cap = need;
  }
  char *w = *buf;
  *w++ = '[';
  for (uint32_t k = 0; k < n; k++) {
    char tmp[11];
    int len = 0;
    uint32_t v = ids[k];
    do {
      tmp[len++] = (char)('0' + v % 10);
      v /= 10;
    } while (v);
    if (k)
      *w++ = ',';
    while (len)
      *w++ = tmp[--len];
  }
  *w++ = ']';
  *w = '\0';
  return 0;
}

/* Parse exactly n ids from a JSON array written by format_ids. */
static bool parse_ids(const unsigned char *s, uint32_t *out, uint32_t n) {
  if (!s || *s++ != '[')
    return false;
  for (uint32_t k = 0; k < n; k++) {
    if (k && *s++ != ',')
      return false;
    if (*s < '0' || *s > '9')
      return false;
    uint64_t v = 0;
    while (*s >= '0' && *s <= '9') {
      v = v * 10 + (uint64_t)(*s++ - '0');
      if (v >= UINT32_MAX)
        return false;
    }
    out[k] = (uint32_t)v;
  }
  return s[0] == ']' && s[1] == '\0';
}

static int profile_put(cap_store_t *s, int64_t job_id, const cap_profile_t *p,
                       uint64_t signature, bool complete,
                       const cap_bandwidth_t *bw, int64_t *out_id) {
  int rc;
  uint64_t transient_peak = 0;
  char *ids_buf = NULL;
  size_t ids_cap = 0;
  if (complete && !p->finished)
    return cap__store_fail(CAP_ESTATE,
                           "profile put: complete profile not finished");
  if (complete)
    transient_peak = cap_profile_transient_peak(p);
  for (uint32_t t = 0; t < p->n_tensors; t++)
    if ((rc = check_bytes(p->tensors[t].bytes, "tensor bytes")) != 0)
      return rc;

  if ((rc = tx_begin(s)) != 0)
    return rc;
  sqlite3_stmt *st = stmt(s, S_PROFILE_INSERT);
  if (!st)
    goto out_sql;
  bind_opt_id(st, 1, job_id);
  sqlite3_bind_int64(st, 2, u64(signature));
  sqlite3_bind_int(st, 3, complete ? 1 : 0);
  sqlite3_bind_text(st, 4, p->model ? p->model : "", -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 5, p->n_tensors);
  sqlite3_bind_int64(st, 6, p->n_ops);
  sqlite3_bind_int64(st, 7, p->finished ? p->n_accesses : 0);
  sqlite3_bind_int64(st, 8, p->finished ? p->iter_ns : 0);
  sqlite3_bind_int64(st, 9, u64(p->finished ? p->persistent_bytes : 0));
  sqlite3_bind_int64(st, 10, u64(transient_peak));
  sqlite3_bind_int64(st, 11, u64(p->finished ? p->meta_peak_bytes : 0));
  bind_bw(st, 12, bw);
  sqlite3_bind_int64(st, 15, now_ms());
  if (sqlite3_step(st) != SQLITE_DONE)
    goto out_sql;
  int64_t pid = sqlite3_last_insert_rowid(s->db);

  if (!(st = stmt(s, S_META_INSERT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, pid);
  for (uint32_t i = 0; i < p->n_meta; i++) {
    sqlite3_bind_int64(st, 2, i);
    sqlite3_bind_text(st, 3, p->meta[i].key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, p->meta[i].value, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE)
      goto out_sql;
    sqlite3_reset(st);
  }

  if (!(st = stmt(s, S_TENSOR_INSERT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, pid);
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    const cap_tensor_t *tt = &p->tensors[t];
    sqlite3_bind_int64(st, 2, t);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)tt->bytes);
    sqlite3_bind_int(st, 4, (int)tt->kind);
    bind_u32_or_null(st, 5, p->finished ? tt->producer_op : CAP_NONE);
    sqlite3_bind_int64(st, 6, p->finished ? tt->free_ns : -1);
    sqlite3_bind_int64(st, 7, p->finished ? tt->n_accesses : 0);
    sqlite3_bind_int(st, 8, tt->no_evict);
    if (sqlite3_step(st) != SQLITE_DONE)
      goto out_sql;
    sqlite3_reset(st);
  }

  if (!(st = stmt(s, S_OP_INSERT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, pid);
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const cap_op_t *op = &p->ops[i];
    sqlite3_bind_int64(st, 2, i);
    sqlite3_bind_int64(st, 3, op->start_ns);
    sqlite3_bind_int64(st, 4, op->end_ns);
    sqlite3_bind_text(st, 5, op->name ? op->name : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, op->flags);
    sqlite3_bind_int64(st, 7, op->n_in);
    sqlite3_bind_int64(st, 8, op->n_out);
    for (int side = 0; side < 2; side++) {
      const uint32_t *ids = p->op_tensors + (side ? op->out_off : op->in_off);
      uint32_t n = side ? op->n_out : op->n_in;
      if ((rc = format_ids(&ids_buf, &ids_cap, ids, n)) != 0)
        goto out_rollback;
      sqlite3_bind_text(st, 9 + side, ids_buf, -1, SQLITE_TRANSIENT);
    }
    if (sqlite3_step(st) != SQLITE_DONE)
      goto out_sql;
    sqlite3_reset(st);
  }

  if (!(st = stmt(s, S_FREE_INSERT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, pid);
  for (uint32_t i = 0; i < p->n_frees; i++) {
    sqlite3_bind_int64(st, 2, i);
    sqlite3_bind_int64(st, 3, p->frees[i].t_ns);
    sqlite3_bind_int64(st, 4, p->frees[i].tensor);
    if (sqlite3_step(st) != SQLITE_DONE)
      goto out_sql;
    sqlite3_reset(st);
  }
  free(ids_buf);
  if ((rc = tx_commit(s)) != 0)
    return rc;
  if (out_id)
    *out_id = pid;
  return 0;

out_sql:
  rc = sql_fail(s, "profile put");
out_rollback:
  free(ids_buf);
  tx_rollback(s);
  return rc;
}

int cap_store_profile_put(cap_store_t *s, int64_t job_id,
                          const cap_profile_t *p, uint64_t signature,
                          bool complete, const cap_bandwidth_t *bw,
                          int64_t *profile_id) {
  if (!s || !p)
    return cap__store_fail(CAP_EINVAL, "profile put: NULL argument");
  LOCKED(s, profile_put(s, job_id, p, signature, complete, bw, profile_id));
}

static int mark_no_evict(cap_store_t *s, int64_t profile_id,
                         const cap_profile_t *p) {
  uint32_t n = 0;
  for (uint32_t t = 0; t < p->n_tensors; t++)
    n += p->tensors[t].no_evict;
  if (n == 0)
    return 0; /* the common case: no write at all */
  int rc = tx_begin(s);
  if (rc)
    return rc;
  sqlite3_stmt *st = stmt(s, S_TENSOR_NO_EVICT);
  if (!st)
    goto out_sql;
  sqlite3_bind_int64(st, 1, profile_id);
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    if (!p->tensors[t].no_evict)
      continue;
    sqlite3_bind_int64(st, 2, t);
    if (sqlite3_step(st) != SQLITE_DONE)
      goto out_sql;
    sqlite3_reset(st);
  }
  return tx_commit(s);

out_sql:
  rc = sql_fail(s, "profile mark no_evict");
  tx_rollback(s);
  return rc;
}

int cap_store_profile_mark_no_evict(cap_store_t *s, int64_t profile_id,
                                    const cap_profile_t *p) {
  if (!s || !p)
    return cap__store_fail(CAP_EINVAL, "profile mark no_evict: NULL argument");
  LOCKED(s, mark_no_evict(s, profile_id, p));
}

static int find_one_id(cap_store_t *s, int which, int64_t *out,
                       const char *what, sqlite3_int64 a) {
  sqlite3_stmt *st = stmt(s, which);
  if (!st)
    return sql_fail(s, what);
  sqlite3_bind_int64(st, 1, a);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    *out = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return 0;
  }
  sqlite3_reset(st);
  if (rc == SQLITE_DONE)
    return cap__store_fail(CAP_ENOENT, "%s: not found", what);
  return sql_fail(s, what);
}

int cap_store_profile_find(cap_store_t *s, uint64_t signature,
                           int64_t *profile_id) {
  if (!s || !profile_id)
    return cap__store_fail(CAP_EINVAL, "profile find: NULL argument");
  LOCKED(s, find_one_id(s, S_PROFILE_FIND, profile_id, "profile find",
                        u64(signature)));
}

/* Grow a uint32 buffer to hold n. */
static int reserve_u32(uint32_t **buf, uint32_t *cap, uint32_t n) {
  if (n <= *cap)
    return 0;
  uint32_t nc = *cap ? *cap : 16;
  while (nc < n)
    nc *= 2;
  uint32_t *nb = realloc(*buf, (size_t)nc * sizeof **buf);
  if (!nb)
    return CAP_ENOMEM;
  *buf = nb;
  *cap = nc;
  return 0;
}

static int corrupt(cap_store_t *s, int64_t id, const char *why,
                   const cap_profile_t *p) {
  return cap__store_fail(CAP_ECORRUPT, "%s: profile %lld: %s%s%s", s->path,
                         (long long)id, why, p ? ": " : "",
                         p ? cap_profile_error(p) : "");
}

static int profile_load(cap_store_t *s, int64_t id, cap_profile_t **out,
                        uint64_t *signature) {
  int rc = 0;
  cap_profile_t *p = NULL;
  uint32_t *in = NULL, *outs = NULL, cap_in = 0, cap_out = 0;
  sqlite3_stmt *st;

  /* A read transaction so that the rows come from one snapshot. */
  if (sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
    return sql_fail(s, "profile load");
  if (!(st = stmt(s, S_PROFILE_GET)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, id);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    rc = cap__store_fail(CAP_ENOENT, "%s: no profile %lld", s->path,
                         (long long)id);
    goto out;
  }
  if (step != SQLITE_ROW)
    goto out_sql;
  if (!sqlite3_column_int(st, 0)) {
    rc = cap__store_fail(CAP_ESTATE,
                         "%s: profile %lld is incomplete (its job ended "
                         "mid-iteration)",
                         s->path, (long long)id);
    goto out;
  }
  uint64_t sig = col_u64(st, 1);
  sqlite3_reset(st);

  if (!(p = cap_profile_create())) {
    rc = cap__store_fail(CAP_ENOMEM, "out of memory");
    goto out;
  }
  if (!(st = stmt(s, S_META_SELECT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, id);
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (cap_profile_set_meta(p, (const char *)sqlite3_column_text(st, 0),
                             (const char *)sqlite3_column_text(st, 1)) != 0) {
      rc = corrupt(s, id, "meta", p);
      goto out;
    }
  }
  if (step != SQLITE_DONE)
    goto out_sql;

  if (!(st = stmt(s, S_TENSOR_SELECT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, id);
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    sqlite3_int64 t = sqlite3_column_int64(st, 0);
    sqlite3_int64 kind = sqlite3_column_int64(st, 2);
    if (t < 0 || t >= (sqlite3_int64)UINT32_MAX || kind < CAP_KIND_PARAM ||
        kind > CAP_KIND_ACTIVATION) {
      rc = corrupt(s, id, "tensor row out of range", NULL);
      goto out;
    }
    if (cap_profile_add_tensor(p, (uint32_t)t, col_u64(st, 1),
                               (cap_tensor_kind_t)kind) != 0 ||
        (sqlite3_column_int(st, 3) &&
         cap_profile_set_no_evict(p, (uint32_t)t) != 0)) {
      rc = corrupt(s, id, "tensor", p);
      goto out;
    }
  }
  if (step != SQLITE_DONE)
    goto out_sql;

  if (!(st = stmt(s, S_OP_SELECT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, id);
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    sqlite3_int64 seq = sqlite3_column_int64(st, 0);
    sqlite3_int64 n_in = sqlite3_column_int64(st, 4);
    sqlite3_int64 n_out = sqlite3_column_int64(st, 5);
    if (seq < 0 || seq >= (sqlite3_int64)UINT32_MAX || n_in < 0 || n_out < 0 ||
        n_in > (1 << 24) || n_out > (1 << 24)) {
      rc = corrupt(s, id, "op row out of range", NULL);
      goto out;
    }
    if (reserve_u32(&in, &cap_in, (uint32_t)n_in) ||
        reserve_u32(&outs, &cap_out, (uint32_t)n_out)) {
      rc = cap__store_fail(CAP_ENOMEM, "out of memory");
      goto out;
    }
    if (!parse_ids(sqlite3_column_text(st, 6), in, (uint32_t)n_in) ||
        !parse_ids(sqlite3_column_text(st, 7), outs, (uint32_t)n_out)) {
      rc = corrupt(s, id, "op inputs/outputs do not match the op", NULL);
      goto out;
    }
    if (cap_profile_add_op(p, (uint32_t)seq, sqlite3_column_int64(st, 1),
                           sqlite3_column_int64(st, 2),
                           (const char *)sqlite3_column_text(st, 3), in,
                           (uint32_t)n_in, outs, (uint32_t)n_out) != 0) {
      rc = corrupt(s, id, "op", p);
      goto out;
    }
  }
  if (step != SQLITE_DONE)
    goto out_sql;

  if (!(st = stmt(s, S_FREE_SELECT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, id);
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    sqlite3_int64 t = sqlite3_column_int64(st, 1);
    if (t < 0 || t >= (sqlite3_int64)UINT32_MAX ||
        cap_profile_add_free(p, sqlite3_column_int64(st, 0), (uint32_t)t) !=
            0) {
      rc = corrupt(s, id, "free", t < 0 || t >= UINT32_MAX ? NULL : p);
      goto out;
    }
  }
  if (step != SQLITE_DONE)
    goto out_sql;
  if (cap_profile_finish(p) != 0) {
    rc = corrupt(s, id, "rebuilding", p);
    goto out;
  }
  if (signature)
    *signature = sig;
  *out = p;
  p = NULL;
  goto out;

out_sql:
  rc = sql_fail(s, "profile load");
out:
  for (int i = S_PROFILE_GET; i <= S_FREE_SELECT; i++)
    if (s->stmt[i])
      sqlite3_reset(s->stmt[i]);
  sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL);
  cap_profile_destroy(p);
  free(in);
  free(outs);
  return rc;
}

int cap_store_profile_load(cap_store_t *s, int64_t profile_id,
                           cap_profile_t **out, uint64_t *signature) {
  if (!s || !out)
    return cap__store_fail(CAP_EINVAL, "profile load: NULL argument");
  *out = NULL;
  LOCKED(s, profile_load(s, profile_id, out, signature));
}

/* --- plans ---------------------------------------------------------------- */

static int insert_job_plan(cap_store_t *s, int64_t job_id, int64_t plan_id,
                           bool reused) {
  sqlite3_stmt *st = stmt(s, S_JOBPLAN_INSERT);
  if (!st)
    return sql_fail(s, "plan assign");
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int64(st, 2, plan_id);
  sqlite3_bind_int(st, 3, reused ? 1 : 0);
  sqlite3_bind_int64(st, 4, now_ms());
  return exec_stmt(s, st, "plan assign");
}

static int plan_put(cap_store_t *s, int64_t profile_id, int64_t job_id,
                    const cap_plan_t *plan, const cap_bandwidth_t *bw,
                    int64_t *out_id) {
  int rc;
  if ((rc = check_bytes(plan->budget_bytes, "budget_bytes")) ||
      (rc = check_bytes(plan->predicted_peak_bytes, "predicted_peak_bytes")))
    return rc;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->method != CAP_METHOD_SWAP && a->method != CAP_METHOD_RECOMPUTE)
      return cap__store_fail(CAP_EINVAL, "plan put: action %u: bad method %d",
                             i, (int)a->method);
    if (a->method == CAP_METHOD_RECOMPUTE &&
        ((uint64_t)a->recompute_off + a->n_recompute > plan->n_recompute_ops))
      return cap__store_fail(
          CAP_EINVAL, "plan put: action %u: recompute ops out of range", i);
  }
  if ((rc = tx_begin(s)) != 0)
    return rc;
  sqlite3_stmt *st = stmt(s, S_PLAN_INSERT);
  if (!st)
    goto out_sql;
  sqlite3_bind_int64(st, 1, profile_id);
  bind_opt_id(st, 2, job_id);
  sqlite3_bind_text(st, 3, plan->policy,
                    (int)strnlen(plan->policy, sizeof plan->policy),
                    SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 4, plan->version);
  sqlite3_bind_int64(st, 5, u64(plan->budget_bytes));
  sqlite3_bind_int64(st, 6, plan->predicted_iter_ns);
  sqlite3_bind_int64(st, 7, u64(plan->predicted_peak_bytes));
  bind_bw(st, 8, bw);
  sqlite3_bind_int64(st, 11, plan->n_actions);
  sqlite3_bind_int64(st, 12, now_ms());
  if (plan->n_blocks)
    sqlite3_bind_int64(st, 13, u64(plan->arena_bytes));
  else
    sqlite3_bind_null(st, 13);
  if (sqlite3_step(st) != SQLITE_DONE)
    goto out_sql;
  int64_t id = sqlite3_last_insert_rowid(s->db);

  sqlite3_stmt *rs = NULL;
  if (!(st = stmt(s, S_ACTION_INSERT)) || !(rs = stmt(s, S_RECOMP_INSERT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_int64(rs, 1, id);
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    bool swap = a->method == CAP_METHOD_SWAP;
    sqlite3_bind_int64(st, 2, i);
    sqlite3_bind_int64(st, 3, a->tensor);
    sqlite3_bind_int64(st, 4, a->evict_after_access);
    sqlite3_bind_text(st, 5, swap ? "swap" : "recompute", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, a->flags);
    bind_u32_or_null(st, 7, swap ? a->prefetch_tensor : CAP_NONE);
    bind_u32_or_null(st, 8,
                     swap && a->prefetch_tensor != CAP_NONE ? a->prefetch_access
                                                            : CAP_NONE);
    if (sqlite3_step(st) != SQLITE_DONE)
      goto out_sql;
    sqlite3_reset(st);
    if (swap)
      continue;
    const uint32_t *ops = cap_action_recompute_ops(plan, a);
    sqlite3_bind_int64(rs, 2, i);
    for (uint32_t k = 0; k < a->n_recompute; k++) {
      sqlite3_bind_int64(rs, 3, k);
      sqlite3_bind_int64(rs, 4, ops[k]);
      if (sqlite3_step(rs) != SQLITE_DONE)
        goto out_sql;
      sqlite3_reset(rs);
    }
  }
  if (!(st = stmt(s, S_BLOCK_INSERT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, id);
  for (uint32_t i = 0; i < plan->n_blocks; i++) {
    const cap_block_t *b = &plan->blocks[i];
    sqlite3_bind_int64(st, 2, i);
    sqlite3_bind_int64(st, 3, b->tensor);
    sqlite3_bind_text(st, 4, cap_residency_kind_name(b->kind), -1, SQLITE_STATIC);
    bind_u32_or_null(st, 5, b->action);
    sqlite3_bind_int64(st, 6, u64(b->offset));
    sqlite3_bind_int64(st, 7, u64(b->bytes));
    sqlite3_bind_int64(st, 8, b->start_ns);
    sqlite3_bind_int64(st, 9, b->end_ns);
    bind_u32_or_null(st, 10, b->share);
    bind_u32_or_null(st, 11, b->same_as);
    if (sqlite3_step(st) != SQLITE_DONE)
      goto out_sql;
    sqlite3_reset(st);
  }
  if (job_id > 0 && (rc = insert_job_plan(s, job_id, id, false)) != 0)
    goto out_rollback;
  if ((rc = tx_commit(s)) != 0)
    return rc;
  if (out_id)
    *out_id = id;
  return 0;

out_sql:
  rc = sql_fail(s, "plan put");
out_rollback:
  tx_rollback(s);
  return rc;
}

int cap_store_plan_put(cap_store_t *s, int64_t profile_id, int64_t job_id,
                       const cap_plan_t *plan, const cap_bandwidth_t *bw,
                       int64_t *plan_id) {
  if (!s || !plan)
    return cap__store_fail(CAP_EINVAL, "plan put: NULL argument");
  LOCKED(s, plan_put(s, profile_id, job_id, plan, bw, plan_id));
}

static int plan_assign(cap_store_t *s, int64_t job_id, int64_t plan_id,
                       bool reused) {
  int rc;
  if ((rc = tx_begin(s)) != 0)
    return rc;
  if ((rc = insert_job_plan(s, job_id, plan_id, reused)) != 0) {
    tx_rollback(s);
    return rc;
  }
  return tx_commit(s);
}

int cap_store_plan_assign(cap_store_t *s, int64_t job_id, int64_t plan_id,
                          bool reused) {
  if (!s)
    return cap__store_fail(CAP_EINVAL, "plan assign: NULL store");
  LOCKED(s, plan_assign(s, job_id, plan_id, reused));
}

static bool bw_close(double stored, double want, double tol) {
  if (!(stored > 0) || !(want > 0))
    return false;
  return fabs(stored - want) <= tol * fmax(stored, want);
}

static int plan_find(cap_store_t *s, uint64_t signature, uint64_t budget,
                     const cap_bandwidth_t *bw, double tol, int64_t *plan_id,
                     int64_t *profile_id) {
  sqlite3_stmt *st = stmt(s, S_PLAN_FIND);
  if (!st)
    return sql_fail(s, "plan find");
  sqlite3_bind_int64(st, 1, u64(signature));
  sqlite3_bind_int64(st, 2, u64(budget));
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (bw) {
      if (sqlite3_column_type(st, 2) == SQLITE_NULL ||
          sqlite3_column_type(st, 3) == SQLITE_NULL)
        continue; /* unknown bandwidths cannot be compared */
      if (!bw_close(sqlite3_column_double(st, 2), bw->h2d_gbps, tol) ||
          !bw_close(sqlite3_column_double(st, 3), bw->d2h_gbps, tol))
        continue;
      double dup = sqlite3_column_double(st, 4);
      if (sqlite3_column_type(st, 4) != SQLITE_NULL && dup > 0 &&
          bw->duplex_gbps > 0 && !bw_close(dup, bw->duplex_gbps, tol))
        continue;
    }
    *plan_id = sqlite3_column_int64(st, 0);
    if (profile_id)
      *profile_id = sqlite3_column_int64(st, 1);
    sqlite3_reset(st);
    return 0;
  }
  sqlite3_reset(st);
  if (step != SQLITE_DONE)
    return sql_fail(s, "plan find");
  return cap__store_fail(CAP_ENOENT,
                         "plan find: no plan for signature %016llx and budget "
                         "%llu with compatible bandwidths",
                         (unsigned long long)signature,
                         (unsigned long long)budget);
}

int cap_store_plan_find(cap_store_t *s, uint64_t signature,
                        uint64_t budget_bytes, const cap_bandwidth_t *bw,
                        double bw_tolerance, int64_t *plan_id,
                        int64_t *profile_id) {
  if (!s || !plan_id || !(bw_tolerance >= 0))
    return cap__store_fail(CAP_EINVAL, "plan find: bad argument");
  LOCKED(s, plan_find(s, signature, budget_bytes, bw, bw_tolerance, plan_id,
                      profile_id));
}

static int plan_latest(cap_store_t *s, int64_t profile_id, uint64_t budget,
                       uint32_t *version) {
  sqlite3_stmt *st = stmt(s, S_PLAN_LATEST);
  if (!st)
    return sql_fail(s, "plan latest version");
  sqlite3_bind_int64(st, 1, profile_id);
  sqlite3_bind_int64(st, 2, u64(budget));
  int step = sqlite3_step(st);
  if (step != SQLITE_ROW) {
    sqlite3_reset(st);
    return sql_fail(s, "plan latest version");
  }
  bool none = sqlite3_column_type(st, 0) == SQLITE_NULL;
  *version = (uint32_t)sqlite3_column_int64(st, 0);
  sqlite3_reset(st);
  if (none)
    return cap__store_fail(CAP_ENOENT, "no plan for profile %lld, budget %llu",
                           (long long)profile_id, (unsigned long long)budget);
  return 0;
}

int cap_store_plan_latest_version(cap_store_t *s, int64_t profile_id,
                                  uint64_t budget_bytes, uint32_t *version) {
  if (!s || !version)
    return cap__store_fail(CAP_EINVAL, "plan latest version: NULL argument");
  LOCKED(s, plan_latest(s, profile_id, budget_bytes, version));
}

static uint32_t col_u32_or_none(sqlite3_stmt *st, int col) {
  return sqlite3_column_type(st, col) == SQLITE_NULL
             ? CAP_NONE
             : (uint32_t)sqlite3_column_int64(st, col);
}

/* The plan's placement, if it has one. */
static int load_blocks(cap_store_t *s, int64_t id, cap_plan_t *plan,
                       uint64_t arena) {
  sqlite3_stmt *st = stmt(s, S_BLOCK_SELECT);
  if (!st)
    return sql_fail(s, "plan load");
  sqlite3_bind_int64(st, 1, id);
  cap_block_t *blocks = NULL;
  uint32_t n = 0, cap = 0;
  int step, rc = 0;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      uint32_t c = cap ? cap * 2 : 256;
      cap_block_t *nb = realloc(blocks, (size_t)c * sizeof *nb);
      if (!nb) {
        rc = cap__store_fail(CAP_ENOMEM, "out of memory");
        break;
      }
      blocks = nb;
      cap = c;
    }
    const char *kind = (const char *)sqlite3_column_text(st, 1);
    int k = 0;
    while (cap_residency_kind_name((cap_residency_kind_t)k) && kind &&
           strcmp(cap_residency_kind_name((cap_residency_kind_t)k), kind))
      k++;
    if (!kind || !cap_residency_kind_name((cap_residency_kind_t)k)) {
      rc = cap__store_fail(CAP_ECORRUPT, "%s: plan %lld: block %u: kind %s",
                           s->path, (long long)id, n, kind ? kind : "NULL");
      break;
    }
    blocks[n++] = (cap_block_t){
        .tensor = (uint32_t)sqlite3_column_int64(st, 0),
        .kind = (cap_residency_kind_t)k,
        .action = col_u32_or_none(st, 2),
        .offset = col_u64(st, 3),
        .bytes = col_u64(st, 4),
        .start_ns = sqlite3_column_int64(st, 5),
        .end_ns = sqlite3_column_int64(st, 6),
        .share = col_u32_or_none(st, 7),
        .same_as = col_u32_or_none(st, 8)};
  }
  if (!rc && step != SQLITE_DONE)
    rc = sql_fail(s, "plan load");
  if (!rc)
    rc = cap_plan_set_blocks(plan, blocks, n, arena);
  sqlite3_reset(st);
  free(blocks);
  return rc;
}

static int plan_load(cap_store_t *s, int64_t id, cap_plan_t **out,
                     int64_t *profile_id, cap_bandwidth_t *bw) {
  int rc = 0;
  cap_plan_t *plan = NULL;
  uint32_t *ops = NULL, n_ops = 0, cap_ops = 0;
  sqlite3_stmt *st, *rs = NULL;

  if (sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
    return sql_fail(s, "plan load");
  if (!(st = stmt(s, S_PLAN_GET)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, id);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    rc =
        cap__store_fail(CAP_ENOENT, "%s: no plan %lld", s->path, (long long)id);
    goto out;
  }
  if (step != SQLITE_ROW)
    goto out_sql;
  int64_t prof = sqlite3_column_int64(st, 0);
  plan =
      cap_plan_create((const char *)sqlite3_column_text(st, 1), col_u64(st, 3));
  if (!plan) {
    rc = cap__store_fail(CAP_ENOMEM, "out of memory");
    goto out;
  }
  plan->version = (uint32_t)sqlite3_column_int64(st, 2);
  plan->predicted_iter_ns = sqlite3_column_int64(st, 4);
  plan->predicted_peak_bytes = col_u64(st, 5);
  cap_bandwidth_t b = {sqlite3_column_double(st, 6),
                       sqlite3_column_double(st, 7),
                       sqlite3_column_double(st, 8)};
  uint64_t arena = col_u64(st, 9); /* NULL (no placement) reads 0 */
  sqlite3_reset(st);

  if (!(st = stmt(s, S_ACTION_SELECT)) || !(rs = stmt(s, S_RECOMP_SELECT)))
    goto out_sql;
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_int64(rs, 1, id);
  int rstep = sqlite3_step(rs);
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    sqlite3_int64 seq = sqlite3_column_int64(st, 0);
    uint32_t tensor = (uint32_t)sqlite3_column_int64(st, 1);
    uint32_t after = (uint32_t)sqlite3_column_int64(st, 2);
    const char *method = (const char *)sqlite3_column_text(st, 3);
    uint32_t flags = (uint32_t)sqlite3_column_int64(st, 4);
    int r;
    if (method && strcmp(method, "swap") == 0) {
      uint32_t pt = sqlite3_column_type(st, 5) == SQLITE_NULL
                        ? CAP_NONE
                        : (uint32_t)sqlite3_column_int64(st, 5);
      uint32_t pa = sqlite3_column_type(st, 6) == SQLITE_NULL
                        ? 0
                        : (uint32_t)sqlite3_column_int64(st, 6);
      r = cap_plan_add_swap(plan, tensor, after, pt, pa, flags);
    } else {
      n_ops = 0;
      while (rstep == SQLITE_ROW && sqlite3_column_int64(rs, 0) == seq) {
        if (reserve_u32(&ops, &cap_ops, n_ops + 1)) {
          rc = cap__store_fail(CAP_ENOMEM, "out of memory");
          goto out;
        }
        ops[n_ops++] = (uint32_t)sqlite3_column_int64(rs, 1);
        rstep = sqlite3_step(rs);
      }
      r = cap_plan_add_recompute(plan, tensor, after, ops, n_ops);
      if (r == 0)
        plan->actions[plan->n_actions - 1].flags = flags;
    }
    if (r != 0) {
      rc = cap__store_fail(r == CAP_ENOMEM ? r : CAP_ECORRUPT,
                           "%s: plan %lld: action %lld: %s", s->path,
                           (long long)id, (long long)seq, cap_strerror(r));
      goto out;
    }
  }
  if (step != SQLITE_DONE || (rstep != SQLITE_DONE && rstep != SQLITE_ROW))
    goto out_sql;
  if ((rc = load_blocks(s, id, plan, arena)) != 0)
    goto out;
  if (profile_id)
    *profile_id = prof;
  if (bw)
    *bw = b;
  *out = plan;
  plan = NULL;
  goto out;

out_sql:
  rc = sql_fail(s, "plan load");
out:
  for (int i = S_PLAN_GET; i <= S_BLOCK_SELECT; i++)
    if (s->stmt[i])
      sqlite3_reset(s->stmt[i]);
  sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL);
  cap_plan_destroy(plan);
  free(ops);
  return rc;
}

int cap_store_plan_load(cap_store_t *s, int64_t plan_id, cap_plan_t **out,
                        int64_t *profile_id, cap_bandwidth_t *bw) {
  if (!s || !out)
    return cap__store_fail(CAP_EINVAL, "plan load: NULL argument");
  *out = NULL;
  LOCKED(s, plan_load(s, plan_id, out, profile_id, bw));
}

/* --- iterations ----------------------------------------------------------- */

static int iteration_put(cap_store_t *s, const cap_store_iteration_t *it,
                         int64_t *out_id) {
  int rc;
  if ((rc = check_bytes(it->peak_bytes, "peak_bytes")) ||
      (rc = check_bytes(it->swap_out_bytes, "swap_out_bytes")) ||
      (rc = check_bytes(it->swap_in_bytes, "swap_in_bytes")) ||
      (rc = check_bytes(it->iteration, "iteration")))
    return rc;
  sqlite3_stmt *st;
  rc = single_write(s, S_ITER_INSERT, "iteration put", &st);
  if (rc)
    return rc;
  sqlite3_bind_int64(st, 1, it->job_id);
  bind_opt_id(st, 2, it->session_id);
  bind_opt_id(st, 3, it->plan_id);
  sqlite3_bind_int64(st, 4, it->plan_version);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)it->iteration);
  sqlite3_bind_int64(st, 6, it->iter_ns);
  sqlite3_bind_int64(st, 7, (sqlite3_int64)it->peak_bytes);
  sqlite3_bind_int64(st, 8, it->stall_ns);
  sqlite3_bind_int64(st, 9, it->n_stalls);
  sqlite3_bind_int64(st, 10, (sqlite3_int64)it->swap_out_bytes);
  sqlite3_bind_int64(st, 11, (sqlite3_int64)it->swap_in_bytes);
  sqlite3_bind_int64(st, 12, it->recompute_ns);
  sqlite3_bind_int64(st, 13, now_ms());
  sqlite3_bind_int64(st, 14, it->op_errors);
  if (it->error[0])
    sqlite3_bind_text(st, 15, it->error, (int)strnlen(it->error, sizeof it->error),
                      SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(st, 15);
  return insert_row(s, st, "iteration put", out_id);
}

int cap_store_iteration_put(cap_store_t *s, const cap_store_iteration_t *it,
                            int64_t *iteration_id) {
  if (!s || !it)
    return cap__store_fail(CAP_EINVAL, "iteration put: NULL argument");
  LOCKED(s, iteration_put(s, it, iteration_id));
}

static int iterations_put(cap_store_t *s, const cap_store_iteration_t *its,
                          uint32_t n, uint32_t *skipped) {
  int rc = tx_begin(s);
  if (rc)
    return rc;
  for (uint32_t i = 0; i < n; i++) {
    rc = iteration_put(s, &its[i], NULL);
    if (rc == CAP_ERANGE) { /* refused before it reached SQLite */
      if (skipped)
        (*skipped)++;
      continue;
    }
    if (rc) {
      tx_rollback(s);
      return rc;
    }
  }
  return tx_commit(s);
}

int cap_store_iterations_put(cap_store_t *s, const cap_store_iteration_t *its,
                             uint32_t n, uint32_t *skipped) {
  if (skipped)
    *skipped = 0;
  if (!s || (!its && n))
    return cap__store_fail(CAP_EINVAL, "iterations put: NULL argument");
  if (n == 0)
    return 0;
  LOCKED(s, iterations_put(s, its, n, skipped));
}
