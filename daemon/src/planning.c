/*
 * Work that runs off the loop (uv_queue_work): registering a job, building
 * and storing a measured profile, computing, reusing, re-planning and
 * refining plans. A task owns its inputs (or reads session data the loop
 * leaves alone while the session is busy: the profile never changes once
 * set), does its store writes and planning in the work callback, and hands
 * its results to the session in the after-work callback on the loop. The
 * plan is stored before it is pushed, so a plan a client has seen is always
 * in the database.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon_internal.h"

uint64_t cap__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct task {
  uv_work_t req;
  cap__work_kind_t kind;
  cap__session_t *s;
  cap_store_t *store;
  char planner[32];
  cap_evict_persistent_t evict_persistent;
  bool evicts_persistent; /* the plan computed does */
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
} task_t;

/* Bytes a plan leaves free under `budget` for the allocator's
 * fragmentation (the alloc-headroom option). */
static uint64_t headroom_bytes(const task_t *t, uint64_t budget) {
  return (uint64_t)((double)budget * t->headroom_pct / 100.0);
}

static task_t *task_new(cap__session_t *s, cap__work_kind_t kind) {
  task_t *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  t->req.data = t;
  t->kind = kind;
  t->s = s;
  t->store = s->d->store;
  snprintf(t->planner, sizeof t->planner, "%s", s->d->cfg.planner);
  t->evict_persistent = s->d->cfg.evict_persistent;
  t->headroom_pct = s->d->cfg.alloc_headroom_pct;
  t->bw_tolerance = s->d->cfg.bw_tolerance;
  t->budget = s->granted_budget;
  t->bw = s->bw;
  t->job_id = s->job_id;
  t->session_id = s->session_id;
  t->profile = s->profile;
  t->profile_id = s->profile_id;
  t->signature = s->signature;
  t->base_version = s->plan ? s->plan->version : 0;
  return t;
}

static void task_free(task_t *t) {
  cap__iter_records_free(&t->rec);
  free(t->fb);
  free(t->failed);
  cap_plan_destroy(t->plan_in);
  cap_plan_destroy(t->plan);
  cap_profile_destroy(t->profile_out);
  free(t);
}

static void store_err(task_t *t, int rc, const char *what) {
  t->rc = rc;
  snprintf(t->err, sizeof t->err, "%s: %s", what, cap_store_last_error());
}

/* A plan for (profile, signature, budget): the stored one when there is one
 * for these bandwidths, else a new one. Sets t->plan/plan_id/reused, or
 * t->infeasible. Every plan gets a version above the session's last. */
/* Plan for `budget`; when activations alone do not fit and the operator
 * lets it (evict-persistent = auto), plan again swapping weights and
 * optimizer state too, and keep whichever gets lower. */
static int plan_with_fallback(task_t *t, const cap_profile_t *p,
                              uint64_t budget, cap_plan_t **out,
                              bool *evicts_persistent) {
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, budget);
  cfg.bw = t->bw;
  cfg.evict_persistent = t->evict_persistent == CAP_EVICT_PERSISTENT_YES;
  cap_plan_t *plan = NULL;
  int rc = cap_plan_compute(p, t->planner, &cfg, &plan);
  *evicts_persistent = cfg.evict_persistent;
  if (rc == CAP_EINFEASIBLE && !cfg.evict_persistent &&
      t->evict_persistent == CAP_EVICT_PERSISTENT_AUTO) {
    cap_plan_t *again = NULL;
    cfg.evict_persistent = true;
    int rc2 = cap_plan_compute(p, t->planner, &cfg, &again);
    if (rc2 == 0 || (rc2 == CAP_EINFEASIBLE && again && plan &&
                     again->predicted_peak_bytes < plan->predicted_peak_bytes)) {
      cap_plan_destroy(plan);
      plan = again;
      rc = rc2;
      *evicts_persistent = true;
    } else {
      cap_plan_destroy(again);
      if (rc2 != CAP_EINFEASIBLE) /* out of memory: report that */
        rc = rc2;
    }
  }
  *out = plan;
  return rc;
}

static void find_or_compute(task_t *t, const cap_profile_t *p) {
  int64_t plan_id = 0;
  int rc = cap_store_plan_find(t->store, t->signature, t->budget, &t->bw,
                               t->bw_tolerance, &plan_id, NULL);
  if (rc == 0) {
    cap_plan_t *plan = NULL;
    rc = cap_store_plan_load(t->store, plan_id, &plan, NULL, NULL);
    if (rc == 0 && cap_plan_validate(plan, p, NULL, 0) == 0) {
      if (plan->version > t->base_version) {
        rc = cap_store_plan_assign(t->store, t->job_id, plan_id, true);
        if (rc) {
          cap_plan_destroy(plan);
          store_err(t, rc, "recording a reused plan");
          return;
        }
        t->plan = plan;
        t->plan_id = plan_id;
        t->reused = true;
        return;
      }
      /* Same actions under a fresh version for this session. */
      plan->version = t->base_version + 1;
      rc = cap_store_plan_put(t->store, t->profile_id, t->job_id, plan, &t->bw,
                              &t->plan_id);
      if (rc) {
        cap_plan_destroy(plan);
        store_err(t, rc, "storing a plan");
        return;
      }
      t->plan = plan;
      t->reused = true;
      return;
    }
    cap_plan_destroy(plan);
    if (rc != 0 && rc != CAP_ENOENT && rc != CAP_ECORRUPT) {
      store_err(t, rc, "loading a stored plan");
      return;
    }
  } else if (rc != CAP_ENOENT) {
    store_err(t, rc, "looking up stored plans");
    return;
  }
  cap_plan_t *plan = NULL;
  uint64_t t0 = cap__now_ns();
  /* Aim under the budget by the allocator's headroom first (fragmentation
   * needs free space to live in); a budget only the full amount fits gets
   * a plan for the full amount. */
  uint64_t headroom = headroom_bytes(t, t->budget);
  rc = plan_with_fallback(t, p, t->budget - headroom, &plan,
                          &t->evicts_persistent);
  if (rc == CAP_EINFEASIBLE && headroom) {
    cap_plan_t *full = NULL;
    bool evicts = false;
    int rc2 = plan_with_fallback(t, p, t->budget, &full, &evicts);
    if (rc2 != CAP_EINFEASIBLE ||
        (full && plan &&
         full->predicted_peak_bytes < plan->predicted_peak_bytes)) {
      cap_plan_destroy(plan);
      plan = full;
      rc = rc2;
      t->evicts_persistent = evicts;
    } else {
      cap_plan_destroy(full);
    }
  }
  if (plan)
    plan->budget_bytes = t->budget; /* the client's budget stays whole */
  t->plan_us = (cap__now_ns() - t0) / 1000;
  if (rc == CAP_EINFEASIBLE) {
    t->infeasible = true;
    t->best_peak = plan ? plan->predicted_peak_bytes : 0;
    cap_plan_destroy(plan);
    return;
  }
  if (rc != 0) {
    /* The daemon's failure, not the client's: the job keeps running in
     * passive mode and is told its budget. */
    cap_plan_destroy(plan);
    t->planner_failed = rc;
    return;
  }
  plan->version = t->base_version + 1;
  rc = cap_store_plan_put(t->store, t->profile_id, t->job_id, plan, &t->bw,
                          &t->plan_id);
  if (rc) {
    cap_plan_destroy(plan);
    store_err(t, rc, "storing a plan");
    return;
  }
  t->plan = plan;
}

static void work_cb(uv_work_t *req) {
  task_t *t = req->data;
  int rc;
  switch (t->kind) {
  case CAP__W_HELLO: {
    t->job.name = t->job_name;
    if ((rc = cap_store_job_begin(t->store, &t->job, &t->job_id))) {
      store_err(t, rc, "registering the job");
      return;
    }
    if ((rc = cap_store_session_begin(t->store, t->job_id, t->pid, t->uid,
                                      t->gid, &t->session_id))) {
      store_err(t, rc, "registering the session");
      return;
    }
    if (t->budget != t->job.requested_budget_bytes &&
        (rc = cap_store_job_set_budget(t->store, t->job_id, t->budget))) {
      store_err(t, rc, "recording the budget");
      return;
    }
    if (!t->hello_signature)
      return;
    int64_t plan_id = 0, profile_id = 0;
    rc = cap_store_plan_find(t->store, t->hello_signature, t->budget, &t->bw,
                             t->bw_tolerance, &plan_id, &profile_id);
    if (rc == CAP_ENOENT) {
      /* No plan for this budget or these bandwidths, but the model was
       * measured before: plan from the stored profile, still without a
       * measured iteration. */
      if (cap_store_profile_find(t->store, t->hello_signature, &profile_id))
        return;
      cap_profile_t *p = NULL;
      if (cap_store_profile_load(t->store, profile_id, &p, NULL) != 0) {
        cap__log(CAP_LOG_WARN, "stored profile %" PRId64 " not reusable: %s",
                 profile_id, cap_store_last_error());
        return;
      }
      t->profile_id = profile_id;
      t->signature = t->hello_signature;
      find_or_compute(t, p);
      if (t->rc || !t->plan) {
        /* Measure instead; a store error here is no reason to refuse. */
        t->rc = 0;
        t->infeasible = false;
        t->planner_failed = 0;
        cap_profile_destroy(p);
        cap_plan_destroy(t->plan);
        t->plan = NULL;
        return;
      }
      t->profile_out = p;
      return;
    }
    if (rc) {
      store_err(t, rc, "looking up stored plans");
      return;
    }
    cap_plan_t *plan = NULL;
    cap_profile_t *p = NULL;
    uint64_t sig = 0;
    if ((rc = cap_store_plan_load(t->store, plan_id, &plan, NULL, NULL)) ||
        (rc = cap_store_profile_load(t->store, profile_id, &p, &sig)) ||
        cap_plan_validate(plan, p, NULL, 0) != 0) {
      /* A stored pair that does not load is no reason to refuse the job:
       * it is measured instead. */
      cap__log(CAP_LOG_WARN, "stored plan %" PRId64 " not reusable: %s",
               plan_id, rc ? cap_store_last_error() : "invalid for its profile");
      cap_plan_destroy(plan);
      cap_profile_destroy(p);
      return;
    }
    if ((rc = cap_store_plan_assign(t->store, t->job_id, plan_id, true))) {
      cap_plan_destroy(plan);
      cap_profile_destroy(p);
      store_err(t, rc, "recording a reused plan");
      return;
    }
    t->plan = plan;
    t->plan_id = plan_id;
    t->profile_out = p;
    t->profile_id = profile_id;
    t->signature = t->hello_signature;
    t->reused = true;
    return;
  }
  case CAP__W_PROBE: {
    const char *meta[] = {"source", "capuchind", NULL};
    cap_profile_t *p = NULL;
    rc = cap__iter_records_build(&t->rec, meta, &p, t->err, sizeof t->err);
    cap__iter_records_free(&t->rec);
    if (rc) {
      /* Records a profile cannot be built from: nothing to tell. */
      cap__log(CAP_LOG_INFO, "probe: %s", t->err);
      t->err[0] = 0;
      return;
    }
    cap_plan_t *plan = NULL;
    uint64_t t0 = cap__now_ns();
    rc = plan_with_fallback(t, p, t->budget, &plan, &t->evicts_persistent);
    t->plan_us = (cap__now_ns() - t0) / 1000;
    if (rc == CAP_EINFEASIBLE) {
      t->infeasible = true;
      t->best_peak = plan ? plan->predicted_peak_bytes : 0;
    }
    cap_plan_destroy(plan);
    cap_profile_destroy(p);
    return;
  }
  case CAP__W_MEASURED: {
    char iter_ns[32], peak[32];
    snprintf(iter_ns, sizeof iter_ns, "%" PRId64, t->iter_ns);
    snprintf(peak, sizeof peak, "%" PRIu64, t->peak_bytes);
    /* Meta values are single words in the trace format. */
    char model[256], device[256];
    snprintf(model, sizeof model, "%s", t->job_name);
    snprintf(device, sizeof device, "%s", t->device_name);
    for (char *c = model; *c; c++)
      if (*c == ' ' || *c == '\t' || *c == '=')
        *c = '_';
    for (char *c = device; *c; c++)
      if (*c == ' ' || *c == '\t' || *c == '=')
        *c = '_';
    const char *meta[16];
    int m = 0;
    if (model[0]) {
      meta[m++] = "model";
      meta[m++] = model;
    }
    if (device[0]) {
      meta[m++] = "device";
      meta[m++] = device;
    }
    meta[m++] = "iter_ns";
    meta[m++] = iter_ns;
    if (t->peak_bytes) {
      meta[m++] = "peak_bytes";
      meta[m++] = peak;
    }
    /* Bytes live before the iteration (Hello.persistent_bytes): the base of
     * the memory curve, as resident_bytes is in a trace. */
    char resident[32];
    if (t->resident_bytes) {
      snprintf(resident, sizeof resident, "%" PRIu64, t->resident_bytes);
      meta[m++] = "resident_bytes";
      meta[m++] = resident;
    }
    meta[m++] = "source";
    meta[m++] = "capuchind";
    meta[m] = NULL;
    cap_profile_t *p = NULL;
    rc = cap__iter_records_build(&t->rec, meta, &p, t->err, sizeof t->err);
    cap__iter_records_free(&t->rec);
    if (rc) {
      t->rc = rc;
      return;
    }
    t->profile_out = p;
    t->signature = cap_profile_signature(p);
    rc = cap_store_profile_find(t->store, t->signature, &t->profile_id);
    if (rc == CAP_ENOENT)
      rc = cap_store_profile_put(t->store, t->job_id, p, t->signature, true,
                                 &t->bw, &t->profile_id);
    if (rc) {
      store_err(t, rc, "storing the profile");
      return;
    }
    find_or_compute(t, p);
    return;
  }
  case CAP__W_REPLAN:
    find_or_compute(t, t->profile);
    return;
  case CAP__W_REFINE: {
    /* Earlier prefetches may use the budget up to where plans aim (the
     * allocator's headroom stays free), not beyond. */
    uint64_t budget = t->plan_in->budget_bytes;
    cap_plan_config_t cfg;
    cap_plan_config_init(&cfg, budget - headroom_bytes(t, budget));
    cfg.bw = t->bw;
    uint32_t version_in = t->plan_in->version;
    uint64_t t0 = cap__now_ns();
    if (t->restore)
      rc = 0;
    else if (t->failed)
      rc = cap_plan_fall_back(t->plan_in, t->profile, t->failed, t->n_failed,
                              &cfg);
    else
      rc = cap_plan_refine(t->plan_in, t->profile, t->fb, t->n_fb, &cfg);
    t->plan_us = (cap__now_ns() - t0) / 1000;
    if (rc && rc != CAP_EINVAL) {
      t->planner_failed = rc;
      return;
    }
    if (rc) {
      t->rc = rc;
      snprintf(t->err, sizeof t->err,
               "feedback: %s (it must name back-accesses of swapped tensors "
               "of the plan in force)",
               cap_strerror(rc));
      return;
    }
    if (!t->restore && t->plan_in->version == version_in) {
      t->unchanged = true; /* no earlier trigger fits: nothing to push */
      return;
    }
    if (t->plan_in->version <= t->base_version)
      t->plan_in->version = t->base_version + 1;
    rc = cap_store_plan_put(t->store, t->profile_id, t->job_id, t->plan_in,
                            &t->bw, &t->plan_id);
    if (rc) {
      store_err(t, rc, "storing the refined plan");
      return;
    }
    t->plan = t->plan_in;
    t->plan_in = NULL;
    return;
  }
  default:
    return;
  }
}

static void finish_plan(cap__session_t *s, task_t *t) {
  if (t->plan && t->plan->budget_bytes != s->granted_budget) {
    /* The budget changed while this plan was made (a job came or went):
     * every plan a session gets fits the budget it has now, so this one is
     * dropped and the replan below makes the one that does. It is stored,
     * which is harmless: it is a valid plan for its own budget. */
    cap__log(CAP_LOG_INFO,
             "session %" PRIu64 ": plan for budget %" PRIu64
             " not pushed: the budget is now %" PRIu64,
             s->local_id, t->plan->budget_bytes, s->granted_budget);
    cap_plan_destroy(t->plan);
    t->plan = NULL;
    if (s->profile)
      s->want_replan = true;
    return;
  }
  if (t->plan) {
    if (t->reused)
      s->d->stats.plans_reused++;
    else
      s->d->stats.plans_computed++;
    if (t->plan_us)
      cap__log(CAP_LOG_INFO, "session %" PRIu64 ": planned in %" PRIu64
               " us%s", s->local_id, t->plan_us,
               t->evicts_persistent
                   ? " (swapping persistent tensors too: activations alone "
                     "do not fit)"
                   : "");
    /* a feedback refinement is on trial (judge_refinement); a fallback is
     * what the client already does, and a restore ends a trial */
    bool refined = t->kind == CAP__W_REFINE && !t->restore && !t->failed;
    cap_plan_t *from = refined ? s->plan : NULL;
    int64_t from_best = s->best_ns;
    if (refined)
      s->plan = NULL; /* kept, not destroyed, by the install */
    cap__session_install_plan(s, t->plan, t->plan_id);
    t->plan = NULL;
    if (from) {
      s->plan_before = from;
      s->best_ns_before = from_best;
    }
  } else if (t->unchanged) {
    cap__log(CAP_LOG_DEBUG,
             "session %" PRIu64 ": feedback on %" PRIu32 " late prefetches: "
             "no in-trigger can move earlier within the budget; plan v%" PRIu32
             " stays (%" PRIu64 " us)",
             s->local_id, t->n_fb, s->plan ? s->plan->version : 0, t->plan_us);
  } else if (t->planner_failed) {
    cap__log(CAP_LOG_ERROR,
             "session %" PRIu64 " (job '%s'): planner '%s' failed: %s; the "
             "client stays in passive mode",
             s->local_id, s->job_name, t->planner,
             cap_strerror(t->planner_failed));
    Capuchin__BudgetUpdate bu = CAPUCHIN__BUDGET_UPDATE__INIT;
    bu.has_budget_bytes = 1;
    bu.budget_bytes = t->budget;
    bu.reason = "no plan: planner failed";
    Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
    cap_proto_envelope_set(&env, &bu);
    cap__session_send_env(s, &env);
  } else if (t->infeasible) {
    cap__log(CAP_LOG_WARN,
             "session %" PRIu64 " (job '%s'): no plan fits budget %" PRIu64
             " (smallest feasible budget %" PRIu64 "); the client stays in "
             "passive mode",
             s->local_id, s->job_name, t->budget, t->best_peak);
    Capuchin__BudgetUpdate bu = CAPUCHIN__BUDGET_UPDATE__INIT;
    bu.has_budget_bytes = 1;
    bu.budget_bytes = t->budget;
    char reason[192];
    if (t->best_peak) {
      /* The number the user needs: what to ask for instead. */
      bu.has_min_budget_bytes = 1;
      bu.min_budget_bytes = t->best_peak;
      snprintf(reason, sizeof reason,
               "no plan fits budget %" PRIu64 " bytes (%.1f MiB); the smallest "
               "feasible budget is %" PRIu64 " bytes (%.1f MiB)",
               t->budget, (double)t->budget / 1048576.0, t->best_peak,
               (double)t->best_peak / 1048576.0);
    } else {
      snprintf(reason, sizeof reason, "no plan fits budget %" PRIu64 " bytes",
               t->budget);
    }
    bu.reason = reason;
    Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
    cap_proto_envelope_set(&env, &bu);
    cap__session_send_env(s, &env);
  }
  if (t->budget != s->granted_budget && s->profile)
    s->want_replan = true;
}

static void after_cb(uv_work_t *req, int status) {
  task_t *t = req->data;
  cap__session_t *s = t->s;
  s->busy = CAP__W_NONE;
  bool open = s->state != CAP__S_CLOSING && status == 0;
  if (t->kind == CAP__W_HELLO) {
    if (t->job_id) {
      s->job_id = t->job_id;
      s->session_id = t->session_id;
    }
    if (!open) {
      /* Gone while registering: record the end now. */
      if (t->job_id && !s->ended) {
        cap__work_store_end(s->d, t->job_id, t->session_id, "disconnected");
        s->ended = true;
      }
      goto out;
    }
    if (t->rc) {
      cap__session_fail(s, t->rc, "%s", t->err);
      goto out;
    }
    Capuchin__Welcome w = CAPUCHIN__WELCOME__INIT;
    w.has_protocol_version = w.has_session_id = w.has_job_id = 1;
    w.has_budget_bytes = w.has_plan_reused = 1;
    w.protocol_version = CAP_PROTO_VERSION;
    w.session_id = (uint64_t)t->session_id;
    w.job_id = (uint64_t)t->job_id;
    w.budget_bytes = s->granted_budget;
    w.plan_reused = t->plan != NULL;
    w.has_wants_budget_ack = s->acks_budget;
    w.wants_budget_ack = s->acks_budget;
    Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
    cap_proto_envelope_set(&env, &w);
    s->state = CAP__S_ACTIVE;
    cap__session_send_env(s, &env);
    cap__log(CAP_LOG_INFO,
             "session %" PRIu64 ": job %" PRId64 " '%s' welcomed, budget %" PRIu64
             "%s",
             s->local_id, t->job_id, s->job_name, s->granted_budget,
             t->plan ? ", stored plan reused (no measured iteration)" : "");
    if (s->granted_budget != t->budget)
      cap__work_store_budget(s->d, s->job_id, s->granted_budget);
    if (t->plan) {
      s->profile = t->profile_out;
      t->profile_out = NULL;
      s->profile_id = t->profile_id;
      s->signature = t->signature;
      s->measuring_done = true;
      finish_plan(s, t);
      /* With its profile known, its floor is known: shares may change. */
      cap__daemon_rebalance(s->d, s);
    }
    goto out;
  }
  if (!open)
    goto out;
  if (t->rc) {
    cap__session_fail(s, t->rc, "%s", t->err);
    goto out;
  }
  if (t->kind == CAP__W_PROBE && !t->infeasible) {
    cap__log(CAP_LOG_INFO,
             "session %" PRIu64 ": some ops of the measured iteration did not "
             "fit budget %" PRIu64 ", but a plan does (%" PRIu64 " us): "
             "waiting for a complete measured iteration",
             s->local_id, t->budget, t->plan_us);
    goto out;
  }
  if (t->kind == CAP__W_MEASURED) {
    s->profile = t->profile_out;
    t->profile_out = NULL;
    s->profile_id = t->profile_id;
    s->signature = t->signature;
    cap__log(CAP_LOG_INFO,
             "session %" PRIu64 ": profile %" PRId64 " signature %016" PRIx64
             " stored",
             s->local_id, s->profile_id, s->signature);
  }
  finish_plan(s, t);
  if (t->kind == CAP__W_MEASURED)
    cap__daemon_rebalance(s->d, s);
out:
  task_free(t);
  cap__session_kick(s);
  cap__session_unref(s);
}

static void submit(cap__session_t *s, task_t *t) {
  s->busy = t->kind;
  s->refs++;
  int rc = uv_queue_work(s->d->loop, &t->req, work_cb, after_cb);
  if (rc != 0) {
    s->busy = CAP__W_NONE;
    s->refs--;
    task_free(t);
    cap__session_fail(s, CAP_ENOMEM, "cannot queue work: %s", uv_strerror(rc));
  }
}

void cap__work_hello(cap__session_t *s) {
  task_t *t = task_new(s, CAP__W_HELLO);
  if (!t) {
    cap__session_fail(s, CAP_ENOMEM, "out of memory");
    return;
  }
  snprintf(t->job_name, sizeof t->job_name, "%s", s->job_name);
  snprintf(t->device_name, sizeof t->device_name, "%s", s->device_name);
  t->job.name = t->job_name;
  t->job.hostname = NULL;
  t->job.pid = s->hello_pid ? s->hello_pid : s->pid;
  t->job.uid = s->uid;
  t->job.gid = s->gid;
  t->job.device = (int32_t)s->device_index;
  t->job.device_total_bytes = s->device_total_bytes;
  t->job.requested_budget_bytes = s->requested_budget;
  t->job.hello_signature = s->hello_signature;
  t->pid = s->pid;
  t->uid = s->uid;
  t->gid = s->gid;
  t->hello_signature = s->hello_signature;
  submit(s, t);
}

void cap__work_measured(cap__session_t *s, cap__iter_records_t *rec,
                        int64_t iter_ns, uint64_t peak_bytes) {
  task_t *t = task_new(s, CAP__W_MEASURED);
  if (!t) {
    cap__iter_records_free(rec);
    cap__session_fail(s, CAP_ENOMEM, "out of memory");
    return;
  }
  t->rec = *rec;
  memset(rec, 0, sizeof *rec);
  t->iter_ns = iter_ns;
  t->peak_bytes = peak_bytes;
  t->resident_bytes = s->hello_persistent;
  snprintf(t->job_name, sizeof t->job_name, "%s", s->job_name);
  snprintf(t->device_name, sizeof t->device_name, "%s", s->device_name);
  submit(s, t);
}

void cap__work_probe(cap__session_t *s, cap__iter_records_t *rec) {
  task_t *t = task_new(s, CAP__W_PROBE);
  if (!t) {
    cap__iter_records_free(rec);
    return; /* only a courtesy: the session goes on */
  }
  t->rec = *rec;
  memset(rec, 0, sizeof *rec);
  s->probed_budget = s->granted_budget;
  submit(s, t);
}

void cap__work_replan(cap__session_t *s) {
  task_t *t = task_new(s, CAP__W_REPLAN);
  if (!t) {
    cap__session_fail(s, CAP_ENOMEM, "out of memory");
    return;
  }
  submit(s, t);
}

/* A refine task (taking plan_in and fb): refine plan_in by the feedback,
 * or with `restore` store it as the next version as it is. */
static void submit_refine(cap__session_t *s, cap_plan_t *plan_in,
                          cap_feedback_t *fb, uint32_t n, bool restore) {
  task_t *t = plan_in ? task_new(s, CAP__W_REFINE) : NULL;
  if (!t) {
    cap_plan_destroy(plan_in);
    free(fb);
    cap__session_fail(s, CAP_ENOMEM, "out of memory");
    return;
  }
  t->plan_in = plan_in;
  t->fb = fb;
  t->n_fb = n;
  t->restore = restore;
  submit(s, t);
}

void cap__work_refine(cap__session_t *s, cap_feedback_t *fb, uint32_t n) {
  submit_refine(s, cap_plan_clone(s->plan), fb, n, false);
}

void cap__work_restore(cap__session_t *s, cap_plan_t *plan) {
  submit_refine(s, plan, NULL, 0, true);
}

void cap__work_fall_back(cap__session_t *s, cap_action_key_t *failed,
                         uint32_t n) {
  cap_plan_t *plan = cap_plan_clone(s->plan);
  task_t *t = plan ? task_new(s, CAP__W_REFINE) : NULL;
  if (!t) {
    cap_plan_destroy(plan);
    free(failed);
    cap__session_fail(s, CAP_ENOMEM, "out of memory");
    return;
  }
  t->plan_in = plan;
  t->failed = failed;
  t->n_failed = n;
  submit(s, t);
}
