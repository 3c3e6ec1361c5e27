/*
 * A session: one client connection, from Hello to Bye. Bytes come in through
 * cap__session_feed() (from the socket in server.c, or straight from a test
 * or the fuzzer), are cut into validated frames by the proto decoder, and
 * each message moves the session's state machine. Anything a client gets
 * wrong ends its session with an Error frame naming the problem; nothing it
 * sends can affect another session or what is already stored.
 *
 * Lifetime: a session is freed only when its transport has closed
 * (cap__session_detach) and no off-loop task holds it (refs), never inside
 * one of its own callbacks.
 */
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_internal.h"

/* 1 MB/s: below any real link, but the sim backend's copy engines run at
 * whatever rate they are given, and the PyTorch adapter's tests model a
 * link about that slow so that their plans still recompute when a loaded
 * machine slows the measured step many times over (a slow step hides
 * every swap: tests/python/test_torch_adapter.py, SIM_GBPS). */
#define CAP__MIN_GBPS 0.001
#define CAP__MAX_GBPS 10000.0

static void drain(cap__session_t *s);
static void close_session(cap__session_t *s, const char *status);

cap__session_t *cap__session_create(cap_daemon_t *d,
                                    const cap__session_io_t *io, void *io_ctx,
                                    uint32_t pid, uint32_t uid, uint32_t gid) {
  cap__session_t *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  cap_frame_limits_t lim;
  cap_frame_limits_init(&lim);
  lim.max_frame_bytes = d->cfg.max_frame_bytes;
  /* Unpacked messages may be a few times their packed size; keep the
   * decoder's own defaults proportional to the frame cap. */
  lim.max_alloc_bytes = 4 * d->cfg.max_frame_bytes;
  if (lim.max_alloc_bytes < (1u << 20))
    lim.max_alloc_bytes = 1u << 20;
  lim.max_buffer_bytes = 2 * d->cfg.max_frame_bytes + (64u << 10);
  s->dec = cap_frame_decoder_create(&lim);
  if (!s->dec) {
    free(s);
    return NULL;
  }
  cap__tracker_limits_t tl = {
      .max_accesses = d->cfg.max_accesses_per_iteration,
      .max_ops = d->cfg.max_ops_per_iteration,
      .max_tensors = d->cfg.max_tensors,
      .max_names = d->cfg.max_op_names,
      .max_name_bytes = d->cfg.max_op_name_bytes,
  };
  cap__tracker_init(&s->tracker, &tl);
  s->d = d;
  s->io = io;
  s->io_ctx = io_ctx;
  s->local_id = ++d->next_local_id;
  s->pid = pid;
  s->uid = uid;
  s->gid = gid;
  s->state = CAP__S_HELLO;
  s->accepted_ms = s->last_rx_ms = uv_now(d->loop);
  s->refs = 1; /* the transport */
  s->next = d->sessions;
  if (d->sessions)
    d->sessions->prev = s;
  d->sessions = s;
  d->n_live++;
  return s;
}

static void session_free(cap__session_t *s) {
  cap_daemon_t *d = s->d;
  if (s->prev)
    s->prev->next = s->next;
  else
    d->sessions = s->next;
  if (s->next)
    s->next->prev = s->prev;
  cap_frame_decoder_destroy(s->dec);
  cap__tracker_close(&s->tracker);
  cap_profile_destroy(s->profile);
  cap_plan_destroy(s->plan);
  cap_plan_destroy(s->plan_before);
  free(s->pending_fb);
  free(s->pending_failed);
  free(s);
  if (d->store)
    cap__work_store_trim(d);
#ifdef __GLIBC__
  /* glibc keeps freed heap (a session's names, records, decoder buffers:
   * up to tens of MB) mapped; give it back, so that a client that came and
   * went leaves the daemon's RSS where it was. Sessions end rarely, and the
   * trim walks the arenas once. */
  malloc_trim(0);
#endif
}

void cap__session_unref(cap__session_t *s) {
  if (--s->refs == 0)
    session_free(s);
}

void cap__session_detach(cap__session_t *s) {
  s->io_ctx = NULL;
  if (s->state != CAP__S_CLOSING)
    close_session(s, "disconnected");
  s->d->n_live--;
  cap__session_unref(s);
}

const char *cap__session_who(const cap__session_t *s, char *buf, size_t len) {
  if (s->job_name[0])
    snprintf(buf, len, "session %" PRIu64 " (job '%s' pid %" PRIu32 ")",
             s->local_id, s->job_name, s->pid);
  else
    snprintf(buf, len, "session %" PRIu64 " (pid %" PRIu32 " uid %" PRIu32
             ")", s->local_id, s->pid, s->uid);
  return buf;
}

void cap__session_send_env(cap__session_t *s, const Capuchin__Envelope *env) {
  if (!s->io_ctx)
    return;
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = cap_frame_encode_alloc(env, 0, &buf, &len);
  if (rc != 0) {
    char w[320];
    cap__log(CAP_LOG_ERROR, "%s: cannot encode %s: %s", cap__session_who(s, w, sizeof w),
             cap_frame_msg_name(env), cap_strerror(rc));
    return;
  }
  rc = s->io->send(s->io_ctx, buf, len);
  if (rc == CAP_EQUOTA && s->state != CAP__S_CLOSING) {
    char w[320];
    cap__log(CAP_LOG_WARN, "%s: peer does not read its frames; closing",
             cap__session_who(s, w, sizeof w));
    close_session(s, "error: peer not reading");
  }
}

void cap__session_fail(cap__session_t *s, int code, const char *fmt, ...) {
  if (s->state == CAP__S_CLOSING)
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char w[320];
  cap__log(CAP_LOG_WARN, "%s: %s: %s; closing the session",
           cap__session_who(s, w, sizeof w), cap_err_name(code), msg);
  s->d->stats.protocol_errors++;
  uint8_t *buf = NULL;
  size_t len = 0;
  if (s->io_ctx && cap_proto_error_frame(code, msg, &buf, &len) == 0)
    s->io->send(s->io_ctx, buf, len);
  char status[160];
  snprintf(status, sizeof status, "error: %.150s", msg);
  close_session(s, status);
}

static void close_session(cap__session_t *s, const char *status) {
  if (s->state == CAP__S_CLOSING)
    return;
  cap__session_state_t was = s->state;
  s->state = CAP__S_CLOSING;
  char w[320];
  if (s->tracker.active && s->tracker.rec.n_ops) {
    cap__log(CAP_LOG_INFO,
             "%s: left during iteration %" PRIu64 "; its %" PRIu32
             " ops are discarded, never planned from",
             cap__session_who(s, w, sizeof w), s->tracker.iteration, s->tracker.rec.n_ops);
  }
  cap__tracker_discard(&s->tracker);
  /* With a Hello in flight the job ids are not known yet; the Hello task
   * records the end when it finishes. */
  if (was != CAP__S_WELCOMING && s->job_id && !s->ended) {
    cap__work_store_end(s->d, s->job_id, s->session_id, status);
    s->ended = true;
  }
  cap__log(CAP_LOG_INFO, "%s: closed (%s)", cap__session_who(s, w, sizeof w), status);
  if (s->io_ctx)
    s->io->close(s->io_ctx);
  /* The others on this device get their budgets back. */
  if (was == CAP__S_ACTIVE || was == CAP__S_WELCOMING)
    cap__daemon_rebalance(s->d, s);
}



void cap__session_kick(cap__session_t *s) {
  if (s->state != CAP__S_ACTIVE)
    return;
  if (s->busy == CAP__W_NONE) {
    if (s->want_replan && s->profile) {
      s->want_replan = false;
      cap__work_replan(s);
    } else if (s->n_pending_failed && s->plan && s->profile) {
      cap_action_key_t *f = s->pending_failed;
      uint32_t n = s->n_pending_failed;
      s->pending_failed = NULL;
      s->n_pending_failed = 0;
      cap__work_fall_back(s, f, n);
    } else if (s->n_pending_fb && s->plan &&
               s->pending_fb_version == s->plan->version && cap__session_may_refine(s) &&
               s->plan->budget_bytes == s->granted_budget) {
      cap_feedback_t *fb = s->pending_fb;
      uint32_t n = s->n_pending_fb;
      s->pending_fb = NULL;
      s->n_pending_fb = 0;
      cap__work_refine(s, fb, n);
    } else {
      free(s->pending_fb); /* for a plan no longer in force */
      s->pending_fb = NULL;
      s->n_pending_fb = 0;
    }
  }
  /* Frames held back while the Hello was registered; input resumes. */
  if (s->state == CAP__S_ACTIVE)
    drain(s);
}

static void copy_str(char *dst, size_t cap, const char *src) {
  snprintf(dst, cap, "%s", src ? src : "");
}

static void on_hello(cap__session_t *s, const Capuchin__Hello *h) {
  if (h->protocol_version != CAP_PROTO_VERSION) {
    cap__session_fail(s, CAP_EVERSION,
                      "hello: protocol version %" PRIu32
                      " not supported (this daemon speaks %u)",
                      h->protocol_version, CAP_PROTO_VERSION);
    return;
  }
  /* The frame decoder only asks for finite and positive; planning needs
   * bandwidths a PCIe/NVLink link can have (a copy time must fit in int64
   * nanoseconds). */
  const double bws[3] = {h->h2d_gbps, h->d2h_gbps, h->duplex_gbps};
  static const char *const bw_names[3] = {"h2d_gbps", "d2h_gbps",
                                          "duplex_gbps"};
  for (int i = 0; i < 3; i++)
    if (!(bws[i] >= CAP__MIN_GBPS && bws[i] <= CAP__MAX_GBPS)) {
      cap__session_fail(s, CAP_ERANGE,
                        "hello: %s %g out of range (%g..%g GB/s)",
                        bw_names[i], bws[i], CAP__MIN_GBPS, CAP__MAX_GBPS);
      return;
    }
  copy_str(s->job_name, sizeof s->job_name, h->job_name);
  copy_str(s->device_name, sizeof s->device_name, h->device_name);
  copy_str(s->device_uuid, sizeof s->device_uuid, h->device_uuid);
  s->acks_budget = h->has_acks_budget && h->acks_budget;
  s->hello_pid = h->pid;
  s->device_index = h->device_index;
  s->device_total_bytes = h->device_total_bytes;
  s->requested_budget = h->budget_bytes;
  s->granted_budget = h->budget_bytes;
  s->hello_persistent = h->has_persistent_bytes ? h->persistent_bytes : 0;
  s->hello_signature = h->has_model_signature ? h->model_signature : 0;
  s->bw.h2d_gbps = h->h2d_gbps;
  s->bw.d2h_gbps = h->d2h_gbps;
  s->bw.duplex_gbps = h->duplex_gbps;
  s->state = CAP__S_WELCOMING;
  char w[320];
  cap__log(CAP_LOG_INFO,
           "%s: hello: device %" PRIu32 " '%s' (%" PRIu64
           " bytes), budget %" PRIu64 ", bandwidth %.1f/%.1f/%.1f GB/s%s",
           cap__session_who(s, w, sizeof w), s->device_index, s->device_name,
           s->device_total_bytes, s->requested_budget, s->bw.h2d_gbps,
           s->bw.d2h_gbps, s->bw.duplex_gbps,
           s->hello_signature ? ", with a model signature" : "");
  /* Its share of the device decides the budget the Welcome grants; the
   * rebalance registers the Hello once no cut on the device is waiting for
   * its job to give memory back. */
  s->hello_deferred = true;
  cap__daemon_rebalance(s->d, s);
}


/* The client swaps these actions instead from now on (docs/plan-semantics.md):
 * the next plan version says so, as soon as the worker is free. */
static void note_failed_actions(cap__session_t *s,
                                const Capuchin__IterationEnd *e) {
  char w[320];
  cap__log(CAP_LOG_WARN,
           "%s: iteration %" PRIu64 ": %zu plan actions could not be carried "
           "out and are swapped instead%s%s",
           cap__session_who(s, w, sizeof w), e->iteration, e->n_failed_actions,
           e->error ? "; first error: " : "", e->error ? e->error : "");
  uint32_t n = s->n_pending_failed;
  size_t add = e->n_failed_actions;
  cap_action_key_t *f =
      realloc(s->pending_failed, ((size_t)n + add) * sizeof *f);
  if (!f)
    return; /* the client swaps them anyway; the plan just does not say so */
  for (size_t i = 0; i < add; i++)
    f[n + i] = (cap_action_key_t){e->failed_actions[i]->tensor,
                                  e->failed_actions[i]->evict_after_access};
  s->pending_failed = f;
  s->n_pending_failed = n + (uint32_t)add;
  if (s->busy == CAP__W_NONE && s->plan && s->profile) {
    s->pending_failed = NULL;
    s->n_pending_failed = 0;
    cap__work_fall_back(s, f, n + (uint32_t)add);
  } /* else cap__session_kick starts it when the worker is done */
}

static void on_iteration_end(cap__session_t *s, const Capuchin__IterationEnd *e) {
  char err[512] = "";
  uint64_t dropped = s->tracker.dropped;
  cap__iter_records_t rec;
  int rc = cap__tracker_end(&s->tracker, e->iteration, &rec, err, sizeof err);
  if (rc != 0) {
    cap__session_fail(s, rc, "iteration_end: %s",
                      err[0] ? err : cap_strerror(rc));
    return;
  }
  cap_store_iteration_t it = {
      .job_id = s->job_id,
      .session_id = s->session_id,
      .iteration = e->iteration,
      .iter_ns = e->iter_ns,
      .peak_bytes = e->peak_bytes,
      .stall_ns = e->stall_ns,
      .n_stalls = s->feedback_iteration == e->iteration ? s->iteration_stalls
                                                        : 0,
      .swap_out_bytes = e->bytes_out,
      .swap_in_bytes = e->bytes_in,
      .recompute_ns = e->has_recompute_ns ? e->recompute_ns : 0,
  };
  if (e->has_plan_version && e->plan_version) {
    it.plan_version = e->plan_version;
    for (uint32_t i = 0; i < CAP__PLAN_HISTORY && i < s->n_history; i++)
      if (s->history[i].version == e->plan_version)
        it.plan_id = s->history[i].plan_id;
    if (!it.plan_id)
      it.plan_version = 0; /* a version this session never sent */
  }
  if (e->has_op_errors) {
    it.op_errors = e->op_errors;
    if (e->error)
      snprintf(it.error, sizeof it.error, "%s", e->error);
  }
  cap__work_store_iteration(s, &it);
  if (e->n_failed_actions)
    note_failed_actions(s, e);
  if (!e->measured && it.plan_version && s->plan &&
      e->plan_version == s->plan->version)
    cap__session_judge_refinement(s, e->iter_ns);
  char w[320];
  bool usable = e->measured && !e->incomplete && dropped == 0 && rec.n_ops;
  if (e->measured && !usable) {
    cap__log(CAP_LOG_INFO,
             "%s: iteration %" PRIu64 " incomplete (%" PRIu64
             " records dropped, %" PRIu32 " ops%s): not used for planning",
             cap__session_who(s, w, sizeof w), e->iteration, dropped, rec.n_ops,
             e->has_ops_over_budget && e->ops_over_budget
                 ? ", some over the budget"
                 : "");
    /* Every op was reported, some of them not run for lack of memory: the
     * op sequence is whole, so the planner can tell whether any plan fits
     * this budget, and if none does the client hears which one would
     * (once per budget). */
    if (e->has_ops_over_budget && e->ops_over_budget && dropped == 0 &&
        rec.n_ops && !s->profile && !s->measuring_done &&
        s->busy == CAP__W_NONE && s->probed_budget != s->granted_budget) {
      cap__work_probe(s, &rec);
      return; /* rec moved */
    }
  } else if (usable && !s->profile && !s->measuring_done &&
             s->busy == CAP__W_NONE) {
    cap__log(CAP_LOG_INFO,
             "%s: measured iteration %" PRIu64 ": %" PRIu32 " ops, %" PRIu64
             " accesses, %" PRIu32 " tensors; planning",
             cap__session_who(s, w, sizeof w), e->iteration, rec.n_ops, rec.n_op_tensors,
             rec.n_tensors);
    s->measuring_done = true;
    cap__work_measured(s, &rec, e->iter_ns, e->peak_bytes);
    return; /* rec moved */
  }
  cap__iter_records_free(&rec);
}

static void on_feedback(cap__session_t *s, const Capuchin__Feedback *f) {
  s->feedback_iteration = f->iteration;
  s->iteration_stalls = (uint32_t)f->n_stalls;
  if (!s->plan || f->plan_version != s->plan->version) {
    cap__log(CAP_LOG_DEBUG,
             "session %" PRIu64 ": feedback for plan v%" PRIu32
             " ignored (v%" PRIu32 " is in force)",
             s->local_id, f->plan_version, s->plan ? s->plan->version : 0);
    return;
  }
  if (f->n_stalls == 0)
    return;
  if (s->plan->budget_bytes != s->granted_budget) {
    /* The budget was cut (or given back) since this plan: refining it would
     * push a plan for a budget the job no longer has. The plan for the new
     * budget (or the news that none fits) is what the job gets. */
    cap__log(CAP_LOG_DEBUG,
             "session %" PRIu64 ": feedback for plan v%" PRIu32
             " not used (it was for budget %" PRIu64 ", the budget is %" PRIu64
             ")",
             s->local_id, f->plan_version, s->plan->budget_bytes,
             s->granted_budget);
    return;
  }
  if (!cap__session_may_refine(s)) {
    cap__log(CAP_LOG_DEBUG,
             "session %" PRIu64 ": feedback for plan v%" PRIu32
             " not used (%s)",
             s->local_id, f->plan_version,
             s->refine_off ? "a refinement ran slower before"
                           : "the last refinement is still on trial");
    return;
  }
  cap_feedback_t *fb = NULL;
  uint32_t n = 0;
  int rc = cap_proto_feedback_from_msg(f, &fb, &n);
  if (rc != 0) {
    cap__session_fail(s, rc, "feedback: %s", cap_strerror(rc));
    return;
  }
  if (s->busy != CAP__W_NONE) {
    free(s->pending_fb); /* the newest measurement wins */
    s->pending_fb = fb;
    s->n_pending_fb = n;
    s->pending_fb_version = f->plan_version;
    return;
  }
  cap__work_refine(s, fb, n);
}

static void handle(cap__session_t *s, const Capuchin__Envelope *env) {
  char err[512] = "";
  int rc = 0;
  if (s->state == CAP__S_HELLO &&
      env->msg_case != CAPUCHIN__ENVELOPE__MSG_HELLO) {
    cap__session_fail(s, CAP_EPROTO, "expected hello first, got %s",
                      cap_frame_msg_name(env));
    return;
  }
  switch (env->msg_case) {
  case CAPUCHIN__ENVELOPE__MSG_HELLO:
    if (s->state != CAP__S_HELLO) {
      cap__session_fail(s, CAP_EPROTO, "unexpected hello: already said hello");
      return;
    }
    on_hello(s, env->hello);
    return;
  case CAPUCHIN__ENVELOPE__MSG_TENSOR_DECL:
    rc = cap__tracker_decl(&s->tracker, env->tensor_decl->id,
                           env->tensor_decl->bytes,
                           (uint32_t)env->tensor_decl->kind, err, sizeof err);
    break;
  case CAPUCHIN__ENVELOPE__MSG_OP_RECORD: {
    const Capuchin__OpRecord *o = env->op_record;
    cap_proto_op_view_t v = {
        .seq = o->seq, .start_ns = o->start_ns, .end_ns = o->end_ns,
        .name = o->name, .in = o->inputs, .n_in = (uint32_t)o->n_inputs,
        .out = o->outputs, .n_out = (uint32_t)o->n_outputs,
    };
    rc = cap__tracker_op(&s->tracker, &v, err, sizeof err);
    s->d->stats.accesses_in += (uint64_t)v.n_in + v.n_out;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_ACCESS_BATCH: {
    uint64_t n = 0;
    rc = cap__tracker_batch(&s->tracker, env->access_batch, &n, err,
                            sizeof err);
    s->d->stats.accesses_in += n;
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_FREE:
    rc = cap__tracker_free(&s->tracker, env->free->t_ns, env->free->tensor,
                           err, sizeof err);
    break;
  case CAPUCHIN__ENVELOPE__MSG_ITERATION_END:
    on_iteration_end(s, env->iteration_end);
    return;
  case CAPUCHIN__ENVELOPE__MSG_FEEDBACK:
    on_feedback(s, env->feedback);
    return;
  case CAPUCHIN__ENVELOPE__MSG_PLAN_ACK: {
    uint32_t v = env->plan_ack->version;
    if (!s->plan || v > s->plan->version) {
      cap__session_fail(s, CAP_EPROTO,
                        "plan_ack: version %" PRIu32 " was never sent", v);
      return;
    }
    s->acked_version = v;
    return;
  }
  case CAPUCHIN__ENVELOPE__MSG_BUDGET_ACK:
    if (!s->acks_budget) {
      cap__session_fail(s, CAP_EPROTO,
                        "budget_ack from a client that did not offer them");
      return;
    }
    cap__budget_on_ack(s, env->budget_ack->budget_bytes,
                       env->budget_ack->device_bytes);
    return;
  case CAPUCHIN__ENVELOPE__MSG_ERROR: {
    char w[320];
    cap__log(CAP_LOG_WARN, "%s: client reports error %d: %s",
             cap__session_who(s, w, sizeof w), env->error->code,
             env->error->message ? env->error->message : "");
    close_session(s, "client error");
    return;
  }
  case CAPUCHIN__ENVELOPE__MSG_BYE:
    close_session(s, "ok");
    return;
  case CAPUCHIN__ENVELOPE__MSG_WELCOME:
  case CAPUCHIN__ENVELOPE__MSG_PLAN:
  case CAPUCHIN__ENVELOPE__MSG_BUDGET_UPDATE:
    cap__session_fail(s, CAP_EPROTO, "unexpected %s from a client",
                      cap_frame_msg_name(env));
    return;
  default:
    cap__session_fail(s, CAP_EPROTO, "unknown message (%s)",
                      cap_frame_msg_name(env));
    return;
  }
  if (rc != 0)
    cap__session_fail(s, rc, "%s: %s", cap_frame_msg_name(env),
                      err[0] ? err : cap_strerror(rc));
}

static void drain(cap__session_t *s) {
  if (s->draining)
    return;
  s->draining = true;
  while ((s->state == CAP__S_HELLO || s->state == CAP__S_ACTIVE) &&
         !s->store_blocked) {
    Capuchin__Envelope *env = NULL;
    char err[512] = "";
    int rc = cap_frame_decoder_next(s->dec, &env, err, sizeof err);
    if (rc == 0)
      break;
    if (rc < 0) {
      cap__session_fail(s, rc, "bad frame: %s",
                        err[0] ? err : cap_strerror(rc));
      break;
    }
    s->d->stats.frames_in++;
    handle(s, env);
    cap_frame_decoder_release(s->dec, env);
  }
  s->draining = false;
  /* While the Hello is registered, or the session's rows wait for the
   * store (store_queue.c), hold the socket so that buffered input stays
   * bounded; resume when the Welcome is out or the rows are written. */
  if (s->io_ctx) {
    bool want_pause = s->state == CAP__S_WELCOMING ||
                      (s->state == CAP__S_ACTIVE && s->store_blocked);
    if (want_pause && !s->paused && s->io->pause) {
      s->io->pause(s->io_ctx);
      s->paused = true;
    } else if (!want_pause && s->paused && s->io->resume) {
      s->io->resume(s->io_ctx);
      s->paused = false;
      /* The wait was ours, not the peer's: its idle clock starts now. */
      s->last_rx_ms = uv_now(s->d->loop);
    }
  }
}

void cap__daemon_sweep(cap_daemon_t *d) {
  uint64_t now = uv_now(d->loop);
  cap__session_t *next;
  for (cap__session_t *s = d->sessions; s; s = next) {
    next = s->next; /* a failed session stays listed until its close */
    if (s->state == CAP__S_HELLO &&
        now - s->accepted_ms >= d->cfg.handshake_timeout_ms) {
      cap__session_fail(s, CAP_ETIMEDOUT,
                        "no hello within %" PRIu32 " ms of connecting "
                        "(handshake-timeout-ms)",
                        d->cfg.handshake_timeout_ms);
    } else if (s->state == CAP__S_ACTIVE && !s->paused && !s->store_blocked &&
               cap_frame_decoder_buffered(s->dec) > 0 &&
               now - s->last_rx_ms >= d->cfg.idle_timeout_ms) {
      cap__session_fail(s, CAP_ETIMEDOUT,
                        "a frame begun %" PRIu64 " ms ago is still incomplete "
                        "(%zu bytes buffered; idle-timeout-ms %" PRIu32 ")",
                        now - s->last_rx_ms, cap_frame_decoder_buffered(s->dec),
                        d->cfg.idle_timeout_ms);
    }
  }
  cap__budget_sweep(d);
}

void cap__session_feed(cap__session_t *s, const void *data, size_t len) {
  if (s->state == CAP__S_CLOSING)
    return;
  s->last_rx_ms = uv_now(s->d->loop);
  int rc = cap_frame_decoder_feed(s->dec, data, len);
  if (rc != 0) {
    if (rc == CAP_E2BIG)
      cap__session_fail(s, rc,
                        "bad frame: length over the maximum of %zu bytes",
                        s->d->cfg.max_frame_bytes);
    else if (rc == CAP_EPROTO)
      cap__session_fail(s, rc, "bad frame: zero-length frame");
    else
      cap__session_fail(s, rc, "bad frame: %s", cap_strerror(rc));
    return;
  }
  drain(s);
}
