/*
 * The client object: configuration, tensors, iterations, stats. The hot
 * path (op begin/end) lives in executor.c, the socket side in reporter.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_impl.h"

const char *cap_client_mode_name(cap_mode_t m) {
  switch (m) {
  case CAP_MODE_MEASURED:
    return "measured";
  case CAP_MODE_GUIDED:
    return "guided";
  case CAP_MODE_PASSIVE:
    return "passive";
  }
  return "?";
}

const char *cap_client_last_error(cap_client_t *c) { return c ? c->err : ""; }

void cap_client_config_init(cap_client_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->time_scale = 1.0;
  cfg->ring_records = 1u << 16;
  cfg->reconnect_ms = 200;
  cfg->connect_timeout_ms = 1000;
}

int cap_client_socket_path(const cap_client_config_t *cfg, char *buf,
                           size_t len) {
  int n;
  const char *env = getenv("CAPUCHIN_SOCKET");
  if (cfg && cfg->socket_path && *cfg->socket_path)
    n = snprintf(buf, len, "%s", cfg->socket_path);
  else if (env && *env)
    n = snprintf(buf, len, "%s", env);
  else if (geteuid() == 0)
    n = snprintf(buf, len, "/run/capuchin/capuchind.sock");
  else {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg)
      n = snprintf(buf, len, "%s/capuchin/capuchind.sock", xdg);
    else
      n = snprintf(buf, len, "/run/user/%u/capuchin/capuchind.sock",
                   (unsigned)geteuid());
  }
  return (n < 0 || (size_t)n >= len) ? CAP_ERANGE : 0;
}

int cap__tensor_grow(cap_client_t *c, uint32_t n) {
  if (n <= c->cap_tensors)
    return 0;
  uint32_t cap = c->cap_tensors ? c->cap_tensors : 1024;
  while (cap < n)
    cap *= 2;
  cap__tensor_t *t = realloc(c->tensors, (size_t)cap * sizeof *t);
  if (!t)
    return CAP_ENOMEM;
  memset(t + c->cap_tensors, 0, (size_t)(cap - c->cap_tensors) * sizeof *t);
  c->tensors = t;
  c->cap_tensors = cap;
  return 0;
}


int cap_client_create(const cap_client_config_t *cfg_in, cap_client_t **out) {
  cap_client_config_t cfg;
  if (!out)
    return CAP_EINVAL;
  *out = NULL;
  if (cfg_in)
    cfg = *cfg_in;
  else
    cap_client_config_init(&cfg);
  if (cfg.time_scale <= 0 || cfg.time_scale != cfg.time_scale ||
      cfg.time_scale > 1e6)
    return CAP_EINVAL;
  if (cfg.ring_records == 0)
    cfg.ring_records = 1u << 16;
  if (cfg.ring_records < 64 || (cfg.ring_records & (cfg.ring_records - 1)))
    return CAP_EINVAL;
  if (cfg.backend && strcmp(cfg.backend, "sim") != 0 &&
      strcmp(cfg.backend, "cuda") != 0)
    return CAP_EINVAL;

  cap_client_t *c = calloc(1, sizeof *c);
  if (!c)
    return CAP_ENOMEM;
  c->h2d_last = CAP_NONE;
  int rc = cap_client_socket_path(&cfg, c->socket_path, sizeof c->socket_path);
  if (rc < 0)
    goto out_free;
  if (cfg.job_name && *cfg.job_name)
    snprintf(c->job_name, sizeof c->job_name, "%s", cfg.job_name);
  else
    snprintf(c->job_name, sizeof c->job_name, "job-%ld", (long)getpid());
  c->budget_bytes = cfg.budget_bytes;
  c->no_daemon = cfg.no_daemon;
  c->reconnect_ms = cfg.reconnect_ms ? cfg.reconnect_ms : 200;
  c->connect_timeout_ms = cfg.connect_timeout_ms;
  c->time_scale = cfg.time_scale;
  c->wake_fd[0] = c->wake_fd[1] = -1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);

  rc = cap__ring_init(&c->ring, cfg.ring_records);
  if (rc < 0)
    goto out_mutex;
  cap__dev_info_t info;
  rc = cap__dev_open(&cfg, &c->dev, &info, c->err, sizeof c->err);
  if (rc < 0)
    goto out_ring;
  snprintf(c->backend, sizeof c->backend, "%s", info.backend);
  snprintf(c->device_name, sizeof c->device_name, "%s", info.device_name);
  snprintf(c->device_uuid, sizeof c->device_uuid, "%s", info.device_uuid);
  c->device_index = info.device_index;
  c->device_total_bytes = info.total_bytes;
  c->h2d_gbps = info.h2d_gbps;
  c->d2h_gbps = info.d2h_gbps;
  c->duplex_gbps = info.duplex_gbps;
  if (c->budget_bytes == 0)
    c->budget_bytes = c->device_total_bytes;
  rc = cap__dev_set_budget(c->dev, c->budget_bytes);
  if (rc < 0)
    goto out_dev;
  atomic_store(&c->ctr.budget_bytes, c->budget_bytes);
  c->requested_budget = c->budget_bytes;
  rc = cap__reporter_start(c);
  if (rc < 0)
    goto out_dev;
  if (!c->no_daemon && c->connect_timeout_ms) {
    /* Give the first connection a moment so that iteration 1 can be the
     * measured one; without a daemon we start passive and keep trying. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ns = ts.tv_nsec + (int64_t)c->connect_timeout_ms * 1000000;
    ts.tv_sec += ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    pthread_mutex_lock(&c->mu);
    while (!atomic_load(&c->ctr.connected)) {
      if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != 0)
        break;
    }
    pthread_mutex_unlock(&c->mu);
  }
  *out = c;
  return 0;
out_dev:
  cap__dev_close(c->dev);
  c->dev = NULL;
out_ring:
  cap__ring_close(&c->ring);
out_mutex:
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
out_free:
  free(c);
  return rc;
}

void cap_client_destroy(cap_client_t *c) {
  if (!c)
    return;
  cap__reporter_stop(c);
  cap__reap(c, true);
  for (uint32_t i = 0; i < c->n_tensors; i++)
    cap__release_tensor(c, i);
  cap__reap(c, true);
  free(c->retire);
  free(c->pf_queue);
  cap__x_clear(c);
  cap_plan_destroy(c->pending_plan);
  free(c->pending_fb);
  free(c->fb);
  free(c->failed);
  cap__iter_errors_free(c->pending_errors);
  cap__oplog_close(&c->log_cur);
  cap__oplog_close(&c->log_last);
  cap__dev_close(c->dev);
  c->dev = NULL;
  cap__ring_close(&c->ring);
  free(c->tensors);
  free(c->transient_ids);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* --- Tensors --------------------------------------------------------------- */

static int new_id(cap_client_t *c, uint32_t *id) {
  if (c->n_tensors >= (1u << 31))
    return CAP_ERANGE;
  int rc = cap__tensor_grow(c, c->n_tensors + 1);
  if (rc < 0)
    return rc;
  *id = c->n_tensors++;
  memset(&c->tensors[*id], 0, sizeof c->tensors[*id]);
  c->tensors[*id].out_action = CAP_NONE;
  return 0;
}

int cap_client_register(cap_client_t *c, uint64_t bytes, cap_tensor_kind_t kind,
                        uint32_t *id, void **dev) {
  if (!c || !id || (kind != CAP_KIND_PARAM && kind != CAP_KIND_INPUT) ||
      c->op_open)
    return CAP_EINVAL;
  uint32_t i;
  int rc = new_id(c, &i);
  if (rc < 0)
    return rc;
  cap__tensor_t *t = &c->tensors[i];
  void *p = NULL;
  rc = cap__alloc_for(c, bytes ? bytes : 1, &p, true);
  if (rc < 0) {
    c->n_tensors--;
    return rc;
  }
  t->bytes = bytes;
  t->kind = (uint8_t)kind;
  t->persistent = 1;
  t->state = CAP__T_DEVICE;
  t->dev = p;
  t->lru = ++c->tick;
  c->persistent_bytes += bytes;
  atomic_store(&c->ctr.persistent_bytes, c->persistent_bytes);
  if (c->recording)
    cap__decl_upto(c, i);
  *id = i;
  if (dev)
    *dev = p;
  return 0;
}


int cap_client_declare(cap_client_t *c, uint64_t bytes, uint32_t *id) {
  if (!c || !id)
    return CAP_EINVAL;
  if (!c->in_iter || c->op_open) {
    cap__set_error(c, "declare outside an iteration or inside an op");
    return CAP_ESTATE;
  }
  uint32_t i;
  int rc;
  if (c->transient_decl < c->n_transient_ids) {
    i = c->transient_ids[c->transient_decl];
    if (c->tensors[i].state != CAP__T_UNUSED || c->tensors[i].bytes != bytes) {
      /* Still alive from an earlier iteration: the pattern changed; give
       * this declaration a new id. */
      rc = new_id(c, &i);
      if (rc < 0)
        return rc;
    }
  } else {
    rc = new_id(c, &i);
    if (rc < 0)
      return rc;
    if (c->n_transient_ids == c->cap_transient_ids) {
      uint32_t n = c->cap_transient_ids ? c->cap_transient_ids * 2 : 1024;
      uint32_t *ids = realloc(c->transient_ids, (size_t)n * sizeof *ids);
      if (!ids) {
        c->n_tensors--;
        return CAP_ENOMEM;
      }
      c->transient_ids = ids;
      c->cap_transient_ids = n;
    }
    c->transient_ids[c->n_transient_ids++] = i;
  }
  c->transient_decl++;
  cap__tensor_t *t = &c->tensors[i];
  t->bytes = bytes;
  t->kind = CAP_KIND_ACTIVATION;
  t->persistent = 0;
  t->framework = 0; /* cap_client_adopt marks it */
  t->state = CAP__T_DECLARED;
  t->n_access = 0;
  t->out_action = CAP_NONE;
  t->pinned = 0;
  if (c->recording)
    cap__decl_upto(c, i);
  *id = i;
  return 0;
}

int cap_client_alloc(cap_client_t *c, uint64_t bytes, uint32_t *id,
                     void **dev) {
  uint32_t i;
  int rc = cap_client_declare(c, bytes, &i);
  if (rc < 0)
    return rc;
  cap__tensor_t *t = &c->tensors[i];
  void *p = NULL;
  rc = cap__alloc_for(c, bytes ? bytes : 1, &p, true);
  if (rc < 0) {
    t->state = CAP__T_UNUSED;
    return rc;
  }
  t->dev = p;
  t->state = CAP__T_DEVICE;
  t->lru = ++c->tick;
  *id = i;
  if (dev)
    *dev = p;
  return 0;
}

int cap_client_free(cap_client_t *c, uint32_t id) {
  if (!c || id >= c->n_tensors || c->tensors[id].state == CAP__T_UNUSED ||
      c->tensors[id].persistent || c->tensors[id].pinned) {
    if (c)
      cap__set_error(c, "free: tensor %u is not a live transient tensor", id);
    return CAP_EINVAL;
  }
  cap__release_tensor(c, id);
  if (c->in_iter && !c->log_failed && cap__oplog_free(&c->log_cur, id) < 0)
    c->log_failed = true; /* no lineage from this iteration */
  if (c->recording && c->in_iter) {
    /* (On a device timeline the host's time since the last op is not on
     * it: the free is at that op's end.) */
    int64_t t = c->device_timeline ? c->rec_end_ns
                                   : cap__rec_time_ns(c, cap__now_ns(c->dev));
    if (!cap__rec_free(c, id, t > c->rec_end_ns ? t : c->rec_end_ns))
      c->it.dropped_records++;
  }
  return 0;
}

void *cap_client_tensor_ptr(cap_client_t *c, uint32_t id) {
  if (!c || id >= c->n_tensors || c->tensors[id].state != CAP__T_DEVICE)
    return NULL;
  return c->tensors[id].dev;
}

/* --- Iterations -------------------------------------------------------------- */

int cap_client_iteration_begin(cap_client_t *c) {
  if (!c)
    return CAP_EINVAL;
  if (c->in_iter) {
    cap__set_error(c, "iteration begin inside an iteration");
    return CAP_ESTATE;
  }
  cap__reap(c, false);
  cap_plan_t *plan = NULL;
  uint64_t budget = 0;
  bool lost;
  uint32_t plan_session;
  pthread_mutex_lock(&c->mu);
  plan = c->pending_plan;
  plan_session = c->pending_session;
  c->pending_plan = NULL;
  budget = c->pending_budget;
  c->pending_budget = 0;
  lost = c->session_lost;
  c->session_lost = false;
  pthread_mutex_unlock(&c->mu);
  bool connected = atomic_load(&c->ctr.connected);
  if (lost) {
    c->measured_done = false; /* a new session: measure again if no plan */
    c->decl_next = 0;         /* and tell it about every tensor */
  }
  if (plan) {
    uint64_t pb = plan->budget_bytes;
    uint32_t v = plan->version;
    if (cap__x_install(c, plan) == 0) {
      atomic_store(&c->ctr.plan_version, v);
      if (pb)
        budget = pb;
      pthread_mutex_lock(&c->mu);
      c->ack_version = v;
      c->ack_session = plan_session;
      pthread_mutex_unlock(&c->mu);
    }
  }
  if (budget && budget != c->budget_bytes)
    cap__put_budget(c, budget);
  if (c->x.plan)
    c->mode = CAP_MODE_GUIDED;
  else if (!c->no_daemon && connected && !c->measured_done)
    c->mode = CAP_MODE_MEASURED;
  else
    c->mode = CAP_MODE_PASSIVE;
  c->recording = c->mode == CAP_MODE_MEASURED;
  c->iteration++;
  memset(&c->it, 0, sizeof c->it);
  c->it.iteration = c->iteration;
  c->it.mode = c->mode;
  c->it.plan_version = c->x.plan ? c->x.plan->version : 0;
  c->it.refused_actions = c->x.n_refused;
  memcpy(c->it.plan_note, c->x.note, sizeof c->it.plan_note);
  if (c->mode == CAP_MODE_GUIDED)
    cap__prefetch_persistent(c);
  c->n_fb = 0;
  c->op_seq = 0;
  c->transient_decl = 0;
  cap__oplog_reset(&c->log_cur);
  c->log_failed = false;
  c->iter_op_errors = 0;
  c->iter_ops_over_budget = 0;
  c->rec_start_ns = 0;
  c->rec_end_ns = 0;
  c->host_wait_ns = 0;
  for (uint32_t i = 0; i < c->n_tensors; i++) {
    c->tensors[i].n_access = 0;
  }
  c->dropped_at_begin = atomic_load(&c->dropped);
  if (c->recording) {
    cap__rec_simple(c, CAP__REC_ITER_BEGIN, c->iteration, 1);
    if (c->n_tensors)
      cap__decl_upto(c, c->n_tensors - 1);
  }
  c->it.peak_bytes = cap__dev_in_use(c->dev);
  c->in_iter = true;
  c->iter_start_ns = cap__now_ns(c->dev);
  c->adopted_since_op = 0;
  c->n_pf = 0; /* what did not start is fetched at its access */
  return 0;
}

/* The model signature (cap_profile_signature) of the iteration in
 * log_last, as the daemon computes it from the same records, so that a
 * reconnecting job is recognised and gets its stored plan at once. */
static void update_signature(cap_client_t *c) {
  const cap__oplog_t *l = &c->log_last;
  if (l->n_ops == 0 || l->n_ops == c->sig_ops)
    return;
  cap_profile_t *p = NULL;
  if (cap__oplog_profile(c, l, &p) == 0) {
    atomic_store(&c->signature, cap_profile_signature(p));
    c->sig_ops = l->n_ops;
  }
  cap_profile_destroy(p);
}


/* What went wrong in this iteration, for the daemon: the op errors and the
 * actions that fell back since the last report. NULL when nothing did (or
 * out of memory: the report is advisory). */
static cap__iter_errors_t *iter_errors(cap_client_t *c) {
  uint32_t n_new = c->n_failed - c->n_failed_sent;
  if (!c->it.op_errors && !n_new)
    return NULL;
  cap__iter_errors_t *e = calloc(1, sizeof *e);
  if (!e)
    return NULL;
  if (n_new) {
    e->failed = malloc((size_t)n_new * sizeof *e->failed);
    if (!e->failed) {
      free(e);
      return NULL;
    }
    memcpy(e->failed, c->failed + c->n_failed_sent, n_new * sizeof *e->failed);
    e->n_failed = n_new;
    c->n_failed_sent = c->n_failed;
  }
  e->iteration = c->iteration;
  e->op_errors = c->it.op_errors;
  memcpy(e->first_error, c->it.first_error, sizeof e->first_error);
  return e;
}

int cap_client_iteration_end(cap_client_t *c, cap_iter_stats_t *st) {
  if (!c)
    return CAP_EINVAL;
  if (!c->in_iter || c->op_open) {
    cap__set_error(c, "iteration end %s", c->op_open ? "with an op open"
                                                     : "outside an iteration");
    return CAP_ESTATE;
  }
  c->it.time_ns = cap__now_ns(c->dev) - c->iter_start_ns;
  c->it.dropped_records = atomic_load(&c->dropped) - c->dropped_at_begin;
  c->in_iter = false;
  bool incomplete = c->it.dropped_records != 0 || c->iter_op_errors != 0;
  if (c->log_failed || c->iter_op_errors) {
    c->log_failed = false;
  } else {
    cap__oplog_t tmp = c->log_last;
    c->log_last = c->log_cur;
    c->log_cur = tmp;
    if (!c->log_last_valid && c->x.plan) {
      /* Lineage just became available: recompute actions of the installed
       * plan become usable from the next iteration. */
      c->log_last_valid = true;
      cap_plan_t *p = cap_plan_clone(c->x.plan);
      if (p)
        cap__x_install(c, p);
    }
    c->log_last_valid = true;
    if (c->mode == CAP_MODE_MEASURED)
      update_signature(c);
  }
  if (c->x.plan && c->log_last_valid && c->n_failed != c->x.n_failed_walked) {
    /* Actions fell back in this iteration: walk the plan again as it will
     * run now, so that a list that counted on one of them (a merged list's
     * partner) falls back too, before it runs where it cannot. */
    cap_plan_t *p = cap_plan_clone(c->x.plan);
    if (p)
      cap__x_install(c, p);
  }
  /* Hand the stats, the errors and the feedback to the reporter. */
  cap__iter_errors_t *errs = iter_errors(c);
  pthread_mutex_lock(&c->mu);
  if (errs) {
    cap__iter_errors_t **tail = &c->pending_errors;
    while (*tail)
      tail = &(*tail)->next;
    *tail = errs;
  }
  if (c->mode == CAP_MODE_GUIDED && c->n_fb) {
    cap_feedback_t *f =
        realloc(c->pending_fb, (size_t)(c->n_pending_fb + c->n_fb) * sizeof *f);
    if (f) {
      memcpy(f + c->n_pending_fb, c->fb, c->n_fb * sizeof *f);
      c->pending_fb = f;
      c->n_pending_fb += c->n_fb;
      c->pending_fb_version = c->it.plan_version;
    }
  }
  pthread_mutex_unlock(&c->mu);
  if (c->recording)
    cap__rec_no_evict(c);
  {
    /* ITER_END carries the stats across the ring in two records. */
    uint64_t s = cap__ring_reserve(&c->ring, 2);
    if (s != UINT64_MAX) {
      cap__rec_t *r = cap__ring_at(&c->ring, s);
      memset(r, 0, sizeof *r);
      r->type = CAP__REC_ITER_END;
      r->a = c->iteration;
      r->b = (uint32_t)c->mode | (c->recording ? CAP__ITER_MEASURED : 0) |
             (incomplete ? CAP__ITER_INCOMPLETE : 0);
      r->c = c->it.plan_version;
      r->u.op.t0 = c->it.time_ns;
      r->u.op.t1 = c->it.stall_ns;
      r->u.op.u64 = c->it.peak_bytes;
      cap__rec_t *r2 = cap__ring_at(&c->ring, s + 1);
      memset(r2, 0, sizeof *r2);
      r2->type = CAP__REC_CONT;
      uint64_t v[5] = {c->it.bytes_out, c->it.bytes_in, c->it.recomputed_ops,
                       c->it.evictions, c->iter_ops_over_budget};
      memcpy(r2->u.ids, v, sizeof v < sizeof r2->u.ids ? sizeof v
                                                      : sizeof r2->u.ids);
      cap__ring_commit(&c->ring, s + 2);
    } else {
      atomic_fetch_add(&c->dropped, 2);
    }
  }
  cap__reporter_wake(c);
  if (c->mode == CAP_MODE_MEASURED && !incomplete)
    c->measured_done = true;
  atomic_fetch_add(&c->ctr.iterations, 1);
  atomic_fetch_add(&c->ctr.dropped_records, c->it.dropped_records);
  if (st)
    *st = c->it;
  return 0;
}

int64_t cap__rec_time_ns(const cap_client_t *c, int64_t t) {
  t -= c->iter_start_ns + c->host_wait_ns;
  return t < 0 ? 0 : t;
}

void cap__rec_span(cap_client_t *c, int64_t t0, int64_t t1, int64_t *s,
                   int64_t *e) {
  *s = cap__rec_time_ns(c, t0);
  if (*s < c->rec_start_ns) /* a wait noted inside the op: keep start order */
    *s = c->rec_start_ns;
  *e = cap__rec_time_ns(c, t1);
  if (*e < *s)
    *e = *s;
  c->rec_start_ns = *s;
  if (*e > c->rec_end_ns)
    c->rec_end_ns = *e;
}

/* Every wait is a stall of the iteration. Only one on the host is also left
 * out of the recorded timeline: where ops run on a device (cuda), an op that
 * waits for a copy there holds no host time, and taking its estimated wait
 * out of the host's clock would move later ops before earlier ones. */
void cap__note_wait(cap_client_t *c, int64_t w, bool host) {
  if (w <= 0)
    return;
  c->it.stall_ns += w;
  atomic_fetch_add(&c->ctr.stall_ns, w);
  if (host)
    c->host_wait_ns += w;
}

/* A measured op that does not fit the budget is still recorded, with no
 * duration: the measurement then has the job's whole op sequence and tensor
 * sizes, from which the daemon can tell that the budget is too small and
 * what the smallest feasible one is. The iteration stays
 * incomplete: it is never planned from. */
static void record_over_budget(cap_client_t *c, const char *name,
                               const uint32_t *in, uint32_t n_in,
                               const uint32_t *out, uint32_t n_out) {
  if (c->n_tensors)
    cap__decl_upto(c, c->n_tensors - 1);
  int64_t now = cap__now_ns(c->dev), t, t_end;
  cap__rec_span(c, now, now, &t, &t_end);
  if (!cap__rec_op(c, c->op_seq, t, t_end, name, in, n_in, out, n_out)) {
    c->it.dropped_records++;
    return;
  }
  c->op_seq++;
  c->iter_ops_over_budget++;
}

int cap_client_op_begin(cap_client_t *c, const char *name, const uint32_t *in,
                        uint32_t n_in, const uint32_t *out, uint32_t n_out,
                        void **in_ptrs, void **out_ptrs) {
  if (!c)
    return CAP_EINVAL;
  int rc = cap__op_begin(c, name, in, n_in, out, n_out, in_ptrs, out_ptrs);
  if (rc == CAP_EBUDGET && c->recording && c->in_iter && !c->op_open)
    record_over_budget(c, name, in, n_in, out, n_out);
  return rc;
}

int cap_client_op_end(cap_client_t *c) {
  if (!c)
    return CAP_EINVAL;
  return cap__op_end(c);
}

void cap_client_set_recompute(cap_client_t *c, cap_recompute_fn fn,
                              void *user) {
  if (!c)
    return;
  c->recompute = fn;
  c->recompute_user = user;
}

int cap_client_compute(cap_client_t *c, int64_t duration_ns) {
  if (!c || duration_ns < 0)
    return CAP_EINVAL;
  return cap__dev_compute(c->dev, duration_ns);
}

int cap_client_pattern_fill(cap_client_t *c, void *dev, uint64_t bytes,
                            uint64_t seed) {
  if (!c || (!dev && bytes))
    return CAP_EINVAL;
  return cap__dev_fill(c->dev, dev, bytes, seed);
}

int64_t cap_client_pattern_check(cap_client_t *c, const void *dev,
                                 uint64_t bytes, uint64_t seed) {
  if (!c || (!dev && bytes))
    return CAP_EINVAL;
  return cap__dev_check(c->dev, dev, bytes, seed);
}

void cap_client_get_stats(cap_client_t *c, cap_client_stats_t *st) {
  memset(st, 0, sizeof *st);
  if (!c)
    return;
  st->bytes_out = atomic_load(&c->ctr.bytes_out);
  st->bytes_in = atomic_load(&c->ctr.bytes_in);
  st->evictions = atomic_load(&c->ctr.evictions);
  st->recomputed_ops = atomic_load(&c->ctr.recomputed_ops);
  st->stalls = atomic_load(&c->ctr.stalls);
  st->stall_ns = atomic_load(&c->ctr.stall_ns);
  st->peak_bytes = atomic_load(&c->ctr.peak_bytes);
  st->device_bytes = atomic_load(&c->ctr.device_bytes);
  st->budget_bytes = atomic_load(&c->ctr.budget_bytes);
  st->dropped_records = atomic_load(&c->dropped);
  st->fallbacks = atomic_load(&c->ctr.fallbacks);
  st->plan_version = atomic_load(&c->ctr.plan_version);
  st->iterations = atomic_load(&c->ctr.iterations);
  st->connected = atomic_load(&c->ctr.connected);
  st->reconnects = atomic_load(&c->ctr.reconnects);
  snprintf(st->backend, sizeof st->backend, "%s", c->backend);
  snprintf(st->device_name, sizeof st->device_name, "%s", c->device_name);
  st->h2d_gbps = c->h2d_gbps;
  st->d2h_gbps = c->d2h_gbps;
  st->duplex_gbps = c->duplex_gbps;
  pthread_mutex_lock(&c->mu);
  st->min_budget_bytes = c->min_budget;
  snprintf(st->daemon_message, sizeof st->daemon_message, "%s",
           c->daemon_message);
  pthread_mutex_unlock(&c->mu);
}

int cap__client_load_plan(cap_client_t *c, const cap_plan_t *plan) {
  if (!c || !plan)
    return CAP_EINVAL;
  cap_plan_t *p = cap_plan_clone(plan);
  if (!p)
    return CAP_ENOMEM;
  pthread_mutex_lock(&c->mu);
  cap_plan_destroy(c->pending_plan);
  c->pending_plan = p;
  c->pending_session = 0; /* not from a daemon: never acknowledged */
  if (p->version > c->received_version)
    c->received_version = p->version;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

int64_t cap_client_plan_predicted_ns(cap_client_t *c) {
  return c && c->x.plan ? c->x.plan->predicted_iter_ns : 0;
}

int cap_client_wait_plan(cap_client_t *c, uint32_t version,
                         uint32_t timeout_ms) {
  if (!c)
    return CAP_EINVAL;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t ns = ts.tv_nsec + (int64_t)timeout_ms * 1000000;
  ts.tv_sec += ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  int rc = 0;
  pthread_mutex_lock(&c->mu);
  while (c->received_version <= version) {
    if (c->min_budget) { /* the daemon said no plan fits */
      rc = CAP_EINFEASIBLE;
      break;
    }
    if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != 0) {
      rc = CAP_ETIMEDOUT;
      break;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

void cap_client_fault_copy(cap_client_t *c, uint32_t nth) {
  if (c)
    cap__dev_fault_copy(c->dev, nth);
}

int64_t cap_client_now_ns(cap_client_t *c) { return c ? cap__now_ns(c->dev) : 0; }

void cap_client_fault_alloc(cap_client_t *c, uint32_t nth, bool sticky) {
  if (!c)
    return;
  cap__dev_fault_alloc(c->dev, nth, sticky);
}
