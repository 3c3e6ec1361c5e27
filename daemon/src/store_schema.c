/*
 * Store schema and forward migrations. Migration i takes user_version i to
 * i + 1 and runs in one transaction together with the user_version bump, so
 * a crash mid-migration leaves the previous version intact. Never edit a
 * shipped migration: append a new one and raise CAP_STORE_SCHEMA_VERSION.
 */
#include "store_internal.h"

/* uint64 quantities (bytes, signatures) are stored as INTEGER; a signature
 * is the uint64 bit pattern reinterpreted as int64. Op and tensor ids are
 * the profile's dense ids; CAP_NONE is stored as NULL. */
static const char *const migrations[] = {
    /* 0 -> 1: the initial schema. */
    "CREATE TABLE jobs ("
    "  id INTEGER PRIMARY KEY,"
    "  name TEXT NOT NULL,"
    "  hostname TEXT NOT NULL,"
    "  pid INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,"
    "  device INTEGER NOT NULL,"
    "  device_total_bytes INTEGER NOT NULL,"
    "  requested_budget_bytes INTEGER NOT NULL,"
    "  granted_budget_bytes INTEGER,"
    "  hello_signature INTEGER NOT NULL,"
    "  started_ms INTEGER NOT NULL,"
    "  ended_ms INTEGER,"
    "  status TEXT"
    ") STRICT;"
    "CREATE TABLE sessions ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER REFERENCES jobs(id),"
    "  pid INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,"
    "  started_ms INTEGER NOT NULL,"
    "  ended_ms INTEGER,"
    "  end_reason TEXT"
    ") STRICT;"
    "CREATE INDEX sessions_job ON sessions(job_id);"
    "CREATE TABLE profiles ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER REFERENCES jobs(id),"
    "  signature INTEGER NOT NULL,"
    "  complete INTEGER NOT NULL CHECK (complete IN (0, 1)),"
    "  model TEXT NOT NULL,"
    "  n_tensors INTEGER NOT NULL,"
    "  n_ops INTEGER NOT NULL,"
    "  n_accesses INTEGER NOT NULL,"
    "  iter_ns INTEGER NOT NULL,"
    "  persistent_bytes INTEGER NOT NULL,"
    "  transient_peak_bytes INTEGER NOT NULL,"
    "  meta_peak_bytes INTEGER NOT NULL,"
    "  h2d_gbps REAL, d2h_gbps REAL, duplex_gbps REAL,"
    "  created_ms INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX profiles_signature ON profiles(signature, complete);"
    "CREATE TABLE profile_meta ("
    "  profile_id INTEGER NOT NULL REFERENCES profiles(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  key TEXT NOT NULL,"
    "  value TEXT NOT NULL,"
    "  PRIMARY KEY (profile_id, seq)"
    ") STRICT, WITHOUT ROWID;"
    "CREATE TABLE profile_tensors ("
    "  profile_id INTEGER NOT NULL REFERENCES profiles(id) ON DELETE CASCADE,"
    "  tensor INTEGER NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  kind INTEGER NOT NULL CHECK (kind IN (0, 1, 2)),"
    "  producer_op INTEGER,"
    "  free_ns INTEGER NOT NULL,"
    "  n_accesses INTEGER NOT NULL,"
    "  PRIMARY KEY (profile_id, tensor)"
    ") STRICT, WITHOUT ROWID;"
    /* An op's inputs and outputs are JSON arrays of tensor ids ("[3,17]"):
     * one row per op keeps storing a profile to a few ms. The
     * profile_accesses view below unnests them for ad-hoc SQL. */
    "CREATE TABLE profile_ops ("
    "  profile_id INTEGER NOT NULL REFERENCES profiles(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  start_ns INTEGER NOT NULL,"
    "  end_ns INTEGER NOT NULL,"
    "  name TEXT NOT NULL,"
    "  flags INTEGER NOT NULL,"
    "  n_in INTEGER NOT NULL,"
    "  n_out INTEGER NOT NULL,"
    "  inputs TEXT NOT NULL,"
    "  outputs TEXT NOT NULL,"
    "  PRIMARY KEY (profile_id, seq)"
    ") STRICT, WITHOUT ROWID;"
    /* One row per tensor an op lists (DESIGN.md's accesses derive from these
     * in op order): pos runs over the inputs, then the outputs. */
    "CREATE VIEW profile_accesses (profile_id, op_seq, pos, tensor, is_output)"
    " AS SELECT o.profile_id, o.seq, CAST(i.key AS INTEGER), i.value, 0"
    "  FROM profile_ops o, json_each(o.inputs) i"
    " UNION ALL SELECT o.profile_id, o.seq, o.n_in + CAST(x.key AS INTEGER),"
    "  x.value, 1 FROM profile_ops o, json_each(o.outputs) x;"
    "CREATE TABLE profile_frees ("
    "  profile_id INTEGER NOT NULL REFERENCES profiles(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  t_ns INTEGER NOT NULL,"
    "  tensor INTEGER NOT NULL,"
    "  PRIMARY KEY (profile_id, seq)"
    ") STRICT, WITHOUT ROWID;"
    "CREATE TABLE plans ("
    "  id INTEGER PRIMARY KEY,"
    "  profile_id INTEGER NOT NULL REFERENCES profiles(id),"
    "  job_id INTEGER REFERENCES jobs(id),"
    "  policy TEXT NOT NULL,"
    "  version INTEGER NOT NULL,"
    "  budget_bytes INTEGER NOT NULL,"
    "  predicted_iter_ns INTEGER NOT NULL,"
    "  predicted_peak_bytes INTEGER NOT NULL,"
    "  h2d_gbps REAL, d2h_gbps REAL, duplex_gbps REAL,"
    "  n_actions INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX plans_lookup ON plans(profile_id, budget_bytes, version);"
    "CREATE INDEX plans_job ON plans(job_id);"
    "CREATE TABLE plan_actions ("
    "  plan_id INTEGER NOT NULL REFERENCES plans(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  tensor INTEGER NOT NULL,"
    "  evict_after_access INTEGER NOT NULL,"
    "  method TEXT NOT NULL CHECK (method IN ('swap', 'recompute')),"
    "  flags INTEGER NOT NULL,"
    "  prefetch_tensor INTEGER,"
    "  prefetch_access INTEGER,"
    "  PRIMARY KEY (plan_id, seq)"
    ") STRICT, WITHOUT ROWID;"
    "CREATE TABLE plan_recompute_ops ("
    "  plan_id INTEGER NOT NULL REFERENCES plans(id) ON DELETE CASCADE,"
    "  action_seq INTEGER NOT NULL,"
    "  pos INTEGER NOT NULL,"
    "  op_seq INTEGER NOT NULL,"
    "  PRIMARY KEY (plan_id, action_seq, pos)"
    ") STRICT, WITHOUT ROWID;"
    "CREATE TABLE job_plans ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  plan_id INTEGER NOT NULL REFERENCES plans(id),"
    "  reused INTEGER NOT NULL CHECK (reused IN (0, 1)),"
    "  sent_ms INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX job_plans_job ON job_plans(job_id);"
    "CREATE TABLE iterations ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  session_id INTEGER REFERENCES sessions(id),"
    "  plan_id INTEGER REFERENCES plans(id),"
    "  plan_version INTEGER NOT NULL,"
    "  iteration INTEGER NOT NULL,"
    "  iter_ns INTEGER NOT NULL,"
    "  peak_bytes INTEGER NOT NULL,"
    "  stall_ns INTEGER NOT NULL,"
    "  n_stalls INTEGER NOT NULL,"
    "  swap_out_bytes INTEGER NOT NULL,"
    "  swap_in_bytes INTEGER NOT NULL,"
    "  recompute_ns INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX iterations_job ON iterations(job_id, iteration);",
    /* 1 -> 2: what went wrong in an iteration (docs/plan-semantics.md) */
    "ALTER TABLE iterations ADD COLUMN op_errors INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE iterations ADD COLUMN error TEXT;",
    /* 2 -> 3: placement, an address for every block a plan makes */
    "ALTER TABLE plans ADD COLUMN arena_bytes INTEGER;"
    "CREATE TABLE plan_blocks ("
    "  plan_id INTEGER NOT NULL REFERENCES plans(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  tensor INTEGER NOT NULL,"
    "  kind TEXT NOT NULL CHECK (kind IN ('first_touch', 'swapped_in',"
    "    'recomputed', 'temporary', 'persistent')),"
    "  action_seq INTEGER,"
    "  offset INTEGER NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  start_ns INTEGER NOT NULL,"
    "  end_ns INTEGER NOT NULL,"
    "  share INTEGER,"
    "  same_as INTEGER,"
    "  PRIMARY KEY (plan_id, seq)"
    ") STRICT, WITHOUT ROWID;",
    /* 3 -> 4: tensors the framework cannot give up (cap_tensor_t.no_evict);
     * profiles stored before knew of none */
    "ALTER TABLE profile_tensors ADD COLUMN no_evict INTEGER NOT NULL"
    "  DEFAULT 0 CHECK (no_evict IN (0, 1));",
};

_Static_assert(sizeof migrations / sizeof migrations[0] ==
                   CAP_STORE_SCHEMA_VERSION,
               "one migration per schema version");

int cap__store_migrate(sqlite3 *db, const char *path, int from_version) {
  for (int v = from_version; v < CAP_STORE_SCHEMA_VERSION; v++) {
    char sql[64];
    char *msg = NULL;
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, &msg) != SQLITE_OK)
      goto fail;
    /* Another process may have migrated while we waited for the lock. */
    int cur = 0;
    int rc = cap__store_user_version(db, &cur);
    if (rc != 0) {
      sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
      return cap__store_fail(rc, "%s: reading user_version: %s", path,
                             sqlite3_errmsg(db));
    }
    if (cur > v) {
      sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
      v = cur - 1;
      continue;
    }
    if (sqlite3_exec(db, migrations[v], NULL, NULL, &msg) != SQLITE_OK) {
      sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
      goto fail;
    }
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v + 1);
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK ||
        sqlite3_exec(db, "COMMIT", NULL, NULL, &msg) != SQLITE_OK) {
      sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
      goto fail;
    }
    continue;
  fail:
    rc = cap__store_fail(CAP_ESTORE, "%s: migrating schema %d -> %d: %s", path,
                         v, v + 1, msg ? msg : sqlite3_errmsg(db));
    sqlite3_free(msg);
    return rc;
  }
  return 0;
}
