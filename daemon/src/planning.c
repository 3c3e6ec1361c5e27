/*
 * Work that runs off the loop (uv_queue_work): registering a job, building
 * and storing a measured profile, computing, reusing, re-planning and
 * refining plans. A task owns its inputs (or reads session data the loop
 * leaves alone while the session is busy: the profile never changes once
 * set), does its store writes and planning in the work callback, and
 * returns its results in the task to whoever submitted it (its done
 * callback, on the loop): it knows nothing of sessions. The plan is stored
 * before it is pushed, so a plan a client has seen is always in the
 * database.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "capuchin/placement.h"
#include "daemon_internal.h"

uint64_t cap__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}


/* Bytes a plan leaves free under `budget` for the allocator's
 * fragmentation (the alloc-headroom option). */
static uint64_t headroom_bytes(const cap__task_t *t, uint64_t budget) {
  return (uint64_t)((double)budget * t->headroom_pct / 100.0);
}

cap__task_t *cap__task_new(cap_daemon_t *d, cap__work_kind_t kind) {
  cap__task_t *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  t->req.data = t;
  t->kind = kind;
  t->store = d->store;
  snprintf(t->planner, sizeof t->planner, "%s", d->cfg.planner);
  t->evict_persistent = d->cfg.evict_persistent;
  t->placement = d->cfg.placement;
  t->headroom_pct = d->cfg.alloc_headroom_pct;
  t->bw_tolerance = d->cfg.bw_tolerance;
  return t;
}

void cap__task_free(cap__task_t *t) {
  cap__iter_records_free(&t->rec);
  free(t->fb);
  free(t->failed);
  cap_plan_destroy(t->plan_in);
  cap_plan_destroy(t->plan);
  cap_profile_destroy(t->profile_out);
  free(t);
}

static void store_err(cap__task_t *t, int rc, const char *what) {
  t->rc = rc;
  snprintf(t->err, sizeof t->err, "%s: %s", what, cap_store_last_error());
}

/* Plan for `budget`; when activations alone do not fit and the operator
 * lets it (evict-persistent = auto), plan again swapping weights and
 * optimizer state too, and keep whichever gets lower. */
/* One plan: with its placement (the arena planned into the budget,
 * cap_plan_compute_placed) when the daemon places plans. */
static int compute(const cap__task_t *t, const cap_profile_t *p,
                   const cap_plan_config_t *cfg, cap_plan_t **out) {
  if (!t->placement)
    return cap_plan_compute(p, t->planner, cfg, out);
  cap_plan_placement_t pp;
  int rc = cap_plan_compute_placed(p, t->planner, cfg, out, &pp);
  cap_plan_placement_close(&pp);
  return rc;
}

/* The device memory a plan needs: its placement's (the persistent bytes
 * left outside the arena, plus the arena) where it has one, whose blocks
 * are aligned and can exceed the live bytes (tiny tensors: 64 bytes take
 * a 256-byte block); else its peak of live bytes. What "no plan fits"
 * must name as the smallest budget. */
static uint64_t need_bytes(const cap_profile_t *p, const cap_plan_t *plan) {
  if (!plan)
    return 0;
  if (plan->n_blocks)
    return cap_plan_outside_arena(plan, p) + plan->arena_bytes;
  return plan->predicted_peak_bytes;
}

static int plan_with_fallback(cap__task_t *t, const cap_profile_t *p,
                              uint64_t budget, cap_plan_t **out,
                              bool *evicts_persistent) {
  cap_plan_config_t cfg;
  cap_plan_config_init(&cfg, budget);
  cfg.bw = t->bw;
  cfg.evict_persistent = t->evict_persistent == CAP_EVICT_PERSISTENT_YES;
  cap_plan_t *plan = NULL;
  int rc = compute(t, p, &cfg, &plan);
  *evicts_persistent = cfg.evict_persistent;
  if (rc == CAP_EINFEASIBLE && !cfg.evict_persistent &&
      t->evict_persistent == CAP_EVICT_PERSISTENT_AUTO) {
    cap_plan_t *again = NULL;
    cfg.evict_persistent = true;
    int rc2 = compute(t, p, &cfg, &again);
    if (rc2 == 0 || (rc2 == CAP_EINFEASIBLE && again && plan &&
                     need_bytes(p, again) < need_bytes(p, plan))) {
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

/* A plan whose actions changed gets its placement anew. A refinement whose
 * placement no longer fits the budget is undone, and so is one whose arena
 * outgrows the plan in force's: the client would have to move everything
 * out of its region to make a bigger one, a cost the refinement's gain
 * does not pay (*before holds the plan as it was; NULL for a fallback,
 * which stays whatever its placement). */
static int replace_placement(cap__task_t *t, uint64_t budget,
                             cap_plan_t **before) {
  cap_plan_placement_t pp;
  int rc = cap_plan_place(t->profile, t->plan_in, &t->bw, CAP_PLACE_BEST, &pp);
  if (rc == 0 && *before &&
      (pp.persistent_bytes + pp.placement.arena_bytes > budget ||
       ((*before)->arena_bytes &&
        pp.placement.arena_bytes > (*before)->arena_bytes))) {
    cap_plan_placement_close(&pp);
    cap_plan_destroy(t->plan_in);
    t->plan_in = *before; /* unchanged: nothing is pushed */
    *before = NULL;
    return 0;
  }
  if (rc == 0)
    rc = cap_plan_attach_placement(t->plan_in, &pp);
  cap_plan_placement_close(&pp);
  return rc;
}

/* plan becomes the session's plan under a version above its last, stored
 * as a new row (t->plan_id). On a store error the plan goes and the task
 * says why. */
static void store_as_new_version(cap__task_t *t, cap_plan_t *plan) {
  plan->version = t->base_version + 1;
  int rc = cap_store_plan_put(t->store, t->profile_id, t->job_id, plan, &t->bw,
                              &t->plan_id);
  if (rc) {
    cap_plan_destroy(plan);
    store_err(t, rc, "storing a plan");
    return;
  }
  t->plan = plan;
}

/* A plan for (profile, signature, budget): the stored one when there is one
 * for these bandwidths, else a new one. Sets t->plan/plan_id/reused, or
 * t->infeasible. Every plan gets a version above the session's last. */
static void find_or_compute(cap__task_t *t, const cap_profile_t *p) {
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
      store_as_new_version(t, plan);
      t->reused = t->plan != NULL;
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
        (full && plan && need_bytes(p, full) < need_bytes(p, plan))) {
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
    t->best_peak = need_bytes(p, plan);
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
  store_as_new_version(t, plan);
}

static void work_cb(uv_work_t *req) {
  cap__task_t *t = req->data;
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
    /* The model was measured before: its stored plan for this budget and
     * these bandwidths, or else one planned from its stored profile; either
     * way without a measured iteration. */
    int64_t profile_id = 0;
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
      t->best_peak = need_bytes(p, plan);
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
    /* The signature leaves no_evict out (the model is the same): a storage
     * found shared this time must be kept by plans made from the store. */
    if (rc == 0)
      rc = cap_store_profile_mark_no_evict(t->store, t->profile_id, p);
    else if (rc == CAP_ENOENT)
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
    /* A refinement must keep the placement within the budget, or it is
     * not made; a fallback is made anyway (the client could not do what
     * it was asked). */
    cap_plan_t *before = t->placement && !t->restore && !t->failed
                             ? cap_plan_clone(t->plan_in)
                             : NULL;
    if (t->restore)
      rc = 0;
    else if (t->failed)
      rc = cap_plan_fall_back(t->plan_in, t->profile, t->failed, t->n_failed,
                              &cfg);
    else
      rc = cap_plan_refine(t->plan_in, t->profile, t->fb, t->n_fb, &cfg);
    if (rc == 0 && t->placement && !t->restore &&
        t->plan_in->version != version_in)
      rc = replace_placement(t, budget, &before);
    cap_plan_destroy(before);
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

static void after_cb(uv_work_t *req, int status) {
  cap__task_t *t = req->data;
  t->done(t, status);
}

int cap__task_submit(cap_daemon_t *d, cap__task_t *t) {
  return uv_queue_work(d->loop, &t->req, work_cb, after_cb);
}
