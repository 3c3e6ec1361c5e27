/*
 * A session's off-loop work: what it asks the planning tasks (planning.c)
 * to do, with the inputs taken from the session, and what it does with their
 * answers on the loop: welcome the job, install and push a plan, tell the
 * client that no plan fits, put a refined plan on trial.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_internal.h"

static void on_done(cap__task_t *t, int status);

/* Install and push a plan; takes ownership of plan. */
static void install_plan(cap__session_t *s, cap_plan_t *plan,
                         int64_t plan_id) {
  cap_plan_destroy(s->plan);
  s->plan = plan;
  s->plan_id = plan_id;
  /* A new plan starts its measurements afresh; one that did not come from
   * a refinement ends any trial (finish_plan starts a trial after). */
  cap_plan_destroy(s->plan_before);
  s->plan_before = NULL;
  s->best_ns_before = 0;
  s->best_ns = 0;
  s->n_guided = 0;
  s->history[s->n_history % CAP__PLAN_HISTORY].version = plan->version;
  s->history[s->n_history % CAP__PLAN_HISTORY].plan_id = plan_id;
  s->n_history++;
  Capuchin__Plan *msg = NULL;
  int rc = cap_proto_plan_to_msg(plan, &msg);
  char w[320];
  if (rc != 0) {
    cap__log(CAP_LOG_ERROR, "%s: plan %" PRId64 " cannot be sent: %s",
             cap__session_who(s, w, sizeof w), plan_id, cap_strerror(rc));
    return;
  }
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  cap_proto_envelope_set(&env, msg);
  cap__session_send_env(s, &env);
  cap_proto_msg_free(msg);
  s->d->stats.plans_pushed++;
  cap__log(CAP_LOG_INFO,
           "%s: plan %" PRId64 " v%" PRIu32 " pushed: %" PRIu32
           " actions, budget %" PRIu64 ", predicted peak %" PRIu64
           " iter %" PRId64 " ns",
           cap__session_who(s, w, sizeof w), plan_id, plan->version, plan->n_actions,
           plan->budget_bytes, plan->predicted_peak_bytes,
           plan->predicted_iter_ns);
}

/* Feedback refines the plan only while no refinement is on trial and none
 * has lost one (judge_refinement). */
bool cap__session_may_refine(const cap__session_t *s) {
  return !s->plan_before && !s->refine_off;
}

/* Capuchin's feedback moves prefetches earlier, and an earlier prefetch
 * holds device memory longer; what that costs on the client (fragmentation,
 * on-demand evictions) the simulator does not see. So a refined plan is a
 * trial: after CAP__JUDGE_ITERATIONS guided iterations its fastest must be
 * at least as fast as the fastest under the plan it came from, or that plan
 * is restored (as a new version) and this session refines no more. */
void cap__session_judge_refinement(cap__session_t *s, int64_t iter_ns) {
  if (iter_ns <= 0)
    return;
  if (!s->best_ns || iter_ns < s->best_ns)
    s->best_ns = iter_ns;
  s->n_guided++;
  if (!s->plan_before || s->n_guided < CAP__JUDGE_ITERATIONS)
    return;
  cap_plan_t *before = s->plan_before;
  s->plan_before = NULL;
  char w[320];
  if (!s->best_ns_before || s->best_ns <= s->best_ns_before) {
    cap__log(CAP_LOG_INFO,
             "%s: refined plan v%" PRIu32 " kept: %.3f ms at best against "
             "%.3f ms under v%" PRIu32,
             cap__session_who(s, w, sizeof w), s->plan->version, (double)s->best_ns / 1e6,
             (double)s->best_ns_before / 1e6, before->version);
    cap_plan_destroy(before);
    return;
  }
  cap__log(CAP_LOG_INFO,
           "%s: refined plan v%" PRIu32 " ran slower (%.3f ms at best against "
           "%.3f ms under v%" PRIu32 "): restoring v%" PRIu32
           "'s triggers; no more feedback refinement for this session",
           cap__session_who(s, w, sizeof w), s->plan->version, (double)s->best_ns / 1e6,
           (double)s->best_ns_before / 1e6, before->version, before->version);
  s->refine_off = true;
  if (s->busy != CAP__W_NONE) {
    cap_plan_destroy(before); /* a replan is running: it decides */
    return;
  }
  cap__work_restore(s, before);
}

/* A task with the session's inputs. */
static cap__task_t *task_new(cap__session_t *s, cap__work_kind_t kind) {
  cap__task_t *t = cap__task_new(s->d, kind);
  if (!t)
    return NULL;
  t->done = on_done;
  t->ctx = s;
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

static void finish_plan(cap__session_t *s, cap__task_t *t) {
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
    install_plan(s, t->plan, t->plan_id);
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

static void on_done(cap__task_t *t, int status) {
  cap__session_t *s = t->ctx;
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
  cap__task_free(t);
  cap__session_kick(s);
  cap__session_unref(s);
}

static void submit(cap__session_t *s, cap__task_t *t) {
  s->busy = t->kind;
  s->refs++;
  int rc = cap__task_submit(s->d, t);
  if (rc != 0) {
    s->busy = CAP__W_NONE;
    s->refs--;
    cap__task_free(t);
    cap__session_fail(s, CAP_ENOMEM, "cannot queue work: %s", uv_strerror(rc));
  }
}

void cap__work_hello(cap__session_t *s) {
  cap__task_t *t = task_new(s, CAP__W_HELLO);
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
  cap__task_t *t = task_new(s, CAP__W_MEASURED);
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
  cap__task_t *t = task_new(s, CAP__W_PROBE);
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
  cap__task_t *t = task_new(s, CAP__W_REPLAN);
  if (!t) {
    cap__session_fail(s, CAP_ENOMEM, "out of memory");
    return;
  }
  submit(s, t);
}

/* A refine task on plan_in, which it takes, as it takes `owned` (the
 * feedback or failed keys the caller hands over): NULL, with both freed
 * and the session failed, when there is no memory for it (plan_in NULL: a
 * clone that failed). */
static cap__task_t *refine_task(cap__session_t *s, cap_plan_t *plan_in,
                                void *owned) {
  cap__task_t *t = plan_in ? task_new(s, CAP__W_REFINE) : NULL;
  if (!t) {
    cap_plan_destroy(plan_in);
    free(owned);
    cap__session_fail(s, CAP_ENOMEM, "out of memory");
    return NULL;
  }
  t->plan_in = plan_in;
  return t;
}

/* Refine plan_in by the feedback, or with `restore` store it as the next
 * version as it is. */
static void submit_refine(cap__session_t *s, cap_plan_t *plan_in,
                          cap_feedback_t *fb, uint32_t n, bool restore) {
  cap__task_t *t = refine_task(s, plan_in, fb);
  if (!t)
    return;
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
  cap__task_t *t = refine_task(s, cap_plan_clone(s->plan), failed);
  if (!t)
    return;
  t->failed = failed;
  t->n_failed = n;
  submit(s, t);
}
