/*
 * The recorder ring and the reporter thread.
 *
 * The owner thread appends fixed-size records to a bounded single-producer,
 * single-consumer ring and never waits: a full ring drops the record and
 * counts it, and the measured iteration is then reported incomplete. The
 * reporter thread drains the ring into AccessBatch frames, sends
 * IterationEnd and Feedback, receives Welcome / Plan / BudgetUpdate and
 * hands plans to the owner, which installs them at the next iteration
 * boundary. When the daemon goes away the reporter keeps draining (and
 * discarding) and reconnects in the background; the owner keeps its plan.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "capuchin/proto.h"
#include "client_impl.h"

/* --- Ring ------------------------------------------------------------------ */

int cap__ring_init(cap__ring_t *r, uint32_t n) {
  memset(r, 0, sizeof *r);
  r->recs = calloc(n, sizeof *r->recs);
  if (!r->recs)
    return CAP_ENOMEM;
  r->mask = n - 1;
  atomic_init(&r->head, 0);
  atomic_init(&r->tail, 0);
  return 0;
}

void cap__ring_close(cap__ring_t *r) {
  free(r->recs);
  r->recs = NULL;
}

uint64_t cap__ring_reserve(cap__ring_t *r, uint32_t n) {
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  uint64_t size = (uint64_t)r->mask + 1;
  if (head + n - r->tail_cache > size) {
    r->tail_cache = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (head + n - r->tail_cache > size)
      return UINT64_MAX;
  }
  return head;
}

bool cap__rec_decl(cap_client_t *c, uint32_t id, uint64_t bytes, uint8_t kind) {
  uint64_t s = cap__ring_reserve(&c->ring, 1);
  if (s == UINT64_MAX) {
    atomic_fetch_add_explicit(&c->dropped, 1, memory_order_relaxed);
    return false;
  }
  cap__rec_t *r = cap__ring_at(&c->ring, s);
  r->type = CAP__REC_DECL;
  r->a = id;
  r->b = kind;
  r->u.op.u64 = bytes;
  cap__ring_commit(&c->ring, s + 1);
  return true;
}

bool cap__rec_op(cap_client_t *c, uint32_t seq, int64_t t0, int64_t t1,
                 const char *name, const uint32_t *in, uint32_t n_in,
                 const uint32_t *out, uint32_t n_out) {
  uint32_t n_ids = n_in + n_out;
  uint32_t n = 1 + (n_ids + CAP__REC_IDS - 1) / CAP__REC_IDS;
  uint64_t s = cap__ring_reserve(&c->ring, n);
  if (s == UINT64_MAX) {
    atomic_fetch_add_explicit(&c->dropped, n, memory_order_relaxed);
    return false;
  }
  cap__rec_t *r = cap__ring_at(&c->ring, s);
  r->type = CAP__REC_OP;
  r->a = seq;
  r->b = n_in;
  r->c = n_out;
  r->u.op.t0 = t0;
  r->u.op.t1 = t1;
  r->u.op.name = name;
  for (uint32_t i = 0; i < n_ids; i++) {
    cap__rec_t *cr = cap__ring_at(&c->ring, s + 1 + i / CAP__REC_IDS);
    if (i % CAP__REC_IDS == 0)
      cr->type = CAP__REC_CONT;
    cr->u.ids[i % CAP__REC_IDS] = i < n_in ? in[i] : out[i - n_in];
  }
  cap__ring_commit(&c->ring, s + n);
  return true;
}

bool cap__rec_free(cap_client_t *c, uint32_t id, int64_t t) {
  uint64_t s = cap__ring_reserve(&c->ring, 1);
  if (s == UINT64_MAX) {
    atomic_fetch_add_explicit(&c->dropped, 1, memory_order_relaxed);
    return false;
  }
  cap__rec_t *r = cap__ring_at(&c->ring, s);
  r->type = CAP__REC_FREE;
  r->a = id;
  r->u.op.t0 = t;
  cap__ring_commit(&c->ring, s + 1);
  return true;
}

bool cap__rec_simple(cap_client_t *c, uint8_t type, uint32_t a, uint32_t b) {
  uint64_t s = cap__ring_reserve(&c->ring, 1);
  if (s == UINT64_MAX) {
    atomic_fetch_add_explicit(&c->dropped, 1, memory_order_relaxed);
    return false;
  }
  cap__rec_t *r = cap__ring_at(&c->ring, s);
  r->type = type;
  r->a = a;
  r->b = b;
  cap__ring_commit(&c->ring, s + 1);
  return true;
}

/* --- Reporter thread ------------------------------------------------------------ */

#define OUT_MAX_BYTES (256u << 20) /* unsent bytes before we give up a session */
#define BATCH_FLUSH_BYTES (4u << 20)

typedef struct rep {
  cap_client_t *c;
  int fd;                  /* -1: not connected */
  bool welcomed;
  cap_frame_decoder_t *dec;
  cap_proto_batch_t *batch;
  uint64_t batch_iter;
  uint8_t *out;            /* unsent bytes */
  size_t out_len, out_off, out_cap;
  int64_t next_try_ms;
  uint32_t connects;
  uint32_t acked;
  bool budget_acks;        /* the daemon asked for BudgetAck */
  uint32_t budget_acked;   /* budget_changes of the last one sent */
  uint32_t op_buf_cap;
  uint32_t *op_buf;
  bool want_close;
  bool in_measured; /* this session saw the ITER_BEGIN of the measured
                       iteration whose records are being drained */
} rep_t;

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void rep_disconnect(rep_t *r, const char *why) {
  cap_client_t *c = r->c;
  if (r->fd >= 0) {
    close(r->fd);
    r->fd = -1;
    if (why && getenv("CAPUCHIN_CLIENT_DEBUG"))
      fprintf(stderr, "capuchin-client: disconnected: %s\n", why);
  }
  r->welcomed = false;
  r->in_measured = false;
  r->acked = 0;
  r->out_len = r->out_off = 0;
  cap_frame_decoder_destroy(r->dec);
  r->dec = NULL;
  cap_proto_batch_reset(r->batch, r->batch_iter);
  r->next_try_ms = mono_ms() + c->reconnect_ms;
  if (atomic_exchange(&c->ctr.connected, false)) {
    pthread_mutex_lock(&c->mu);
    c->session_lost = true;
    pthread_mutex_unlock(&c->mu);
  }
}

static int rep_queue(rep_t *r, Capuchin__Envelope *env) {
  if (r->fd < 0)
    return CAP_ENOTCONN;
  if (r->out_len - r->out_off > OUT_MAX_BYTES) {
    rep_disconnect(r, "daemon not reading");
    return CAP_ENOTCONN;
  }
  if (r->out_off && r->out_off == r->out_len)
    r->out_off = r->out_len = 0;
  return cap_frame_append(env, 0, &r->out, &r->out_len, &r->out_cap);
}

static int rep_queue_msg(rep_t *r, void *msg) {
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  int rc = cap_proto_envelope_set(&env, msg);
  if (rc < 0)
    return rc;
  return rep_queue(r, &env);
}

static void rep_flush_out(rep_t *r) {
  while (r->fd >= 0 && r->out_off < r->out_len) {
    ssize_t n = send(r->fd, r->out + r->out_off, r->out_len - r->out_off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      r->out_off += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      rep_disconnect(r, strerror(errno));
      return;
    }
  }
  if (r->out_off == r->out_len)
    r->out_off = r->out_len = 0;
}

static void rep_try_connect(rep_t *r) {
  cap_client_t *c = r->c;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(c->socket_path) >= sizeof sa.sun_path)
    goto fail_noclose;
  memcpy(sa.sun_path, c->socket_path, strlen(c->socket_path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    goto fail_noclose;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    close(fd);
    goto fail_noclose;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  r->fd = fd;
  r->dec = cap_frame_decoder_create(NULL);
  if (!r->dec) {
    rep_disconnect(r, "out of memory");
    return;
  }
  Capuchin__Hello h = CAPUCHIN__HELLO__INIT;
  h.has_protocol_version = 1;
  h.protocol_version = CAP_PROTO_VERSION;
  h.job_name = c->job_name;
  h.has_pid = 1;
  h.pid = (uint32_t)getpid();
  h.has_device_index = 1;
  h.device_index = (uint32_t)c->device_index;
  h.device_name = c->device_name[0] ? c->device_name : c->backend;
  h.has_device_total_bytes = 1;
  h.device_total_bytes = c->device_total_bytes ? c->device_total_bytes : 1;
  h.has_budget_bytes = 1;
  uint64_t budget = c->requested_budget;
  h.budget_bytes = budget ? budget : h.device_total_bytes;
  h.has_h2d_gbps = h.has_d2h_gbps = h.has_duplex_gbps = 1;
  h.h2d_gbps = c->h2d_gbps > 0 ? c->h2d_gbps : 1;
  h.d2h_gbps = c->d2h_gbps > 0 ? c->d2h_gbps : 1;
  h.duplex_gbps = c->duplex_gbps > 0 ? c->duplex_gbps : 1;
  h.backend = c->backend;
  uint64_t sig = atomic_load(&c->signature);
  if (sig) {
    h.has_model_signature = 1;
    h.model_signature = sig;
  }
  h.has_persistent_bytes = 1;
  h.persistent_bytes = atomic_load(&c->ctr.persistent_bytes);
  if (c->device_uuid[0])
    h.device_uuid = c->device_uuid;
  h.has_acks_budget = h.acks_budget = 1;
  if (rep_queue_msg(r, &h) < 0) {
    rep_disconnect(r, "hello");
    return;
  }
  rep_flush_out(r);
  return;
fail_noclose:
  r->next_try_ms = mono_ms() + c->reconnect_ms;
}

static void rep_handle(rep_t *r, Capuchin__Envelope *env) {
  cap_client_t *c = r->c;
  switch (env->msg_case) {
  case CAPUCHIN__ENVELOPE__MSG_WELCOME: {
    r->welcomed = true;
    r->budget_acks = env->welcome->has_wants_budget_ack &&
                     env->welcome->wants_budget_ack;
    if (r->connects++ > 0)
      atomic_fetch_add(&c->ctr.reconnects, 1);
    pthread_mutex_lock(&c->mu);
    c->session++;
    if (env->welcome->has_budget_bytes && env->welcome->budget_bytes)
      c->pending_budget = env->welcome->budget_bytes;
    atomic_store(&c->ctr.connected, true);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_PLAN: {
    cap_plan_t *plan = NULL;
    char err[256];
    int rc = cap_proto_plan_from_msg(env->plan, NULL, &plan, err, sizeof err);
    if (rc < 0) {
      if (getenv("CAPUCHIN_CLIENT_DEBUG"))
        fprintf(stderr, "capuchin-client: bad plan: %s\n", err);
      break;
    }
    pthread_mutex_lock(&c->mu);
    cap_plan_destroy(c->pending_plan);
    c->pending_plan = plan;
    c->min_budget = 0; /* a plan fits now */
    c->pending_session = c->session;
    if (plan->version > c->received_version)
      c->received_version = plan->version;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_BUDGET_UPDATE: {
    const Capuchin__BudgetUpdate *bu = env->budget_update;
    pthread_mutex_lock(&c->mu);
    if (bu->budget_bytes)
      c->pending_budget = bu->budget_bytes;
    /* No plan fits: keep what the daemon said for the user (stats), and
     * wake a cap_client_wait_plan() that would otherwise wait in vain. */
    c->min_budget = bu->has_min_budget_bytes ? bu->min_budget_bytes : 0;
    if (bu->has_min_budget_bytes && bu->reason)
      snprintf(c->daemon_message, sizeof c->daemon_message, "%s", bu->reason);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    break;
  }
  case CAPUCHIN__ENVELOPE__MSG_ERROR:
    if (getenv("CAPUCHIN_CLIENT_DEBUG"))
      fprintf(stderr, "capuchin-client: daemon error %d: %s\n",
              env->error->code, env->error->message ? env->error->message : "");
    /* Kept for the user: "daemon unreachable" is not what happened when
     * the daemon answered (too many sessions, not allowed, ...). */
    pthread_mutex_lock(&c->mu);
    snprintf(c->daemon_message, sizeof c->daemon_message, "%s",
             env->error->message ? env->error->message : "error");
    pthread_mutex_unlock(&c->mu);
    break;
  case CAPUCHIN__ENVELOPE__MSG_BYE:
    r->want_close = true; /* after the message is released */
    break;
  default:
    break;
  }
}

static void rep_read(rep_t *r) {
  uint8_t buf[65536];
  for (;;) {
    if (r->fd < 0)
      return;
    ssize_t n = recv(r->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) {
      rep_disconnect(r, "daemon closed the connection");
      return;
    }
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        rep_disconnect(r, strerror(errno));
      return;
    }
    if (cap_frame_decoder_feed(r->dec, buf, (size_t)n) < 0) {
      rep_disconnect(r, "bad frame from daemon");
      return;
    }
    for (;;) {
      Capuchin__Envelope *env = NULL;
      char err[256];
      int rc = cap_frame_decoder_next(r->dec, &env, err, sizeof err);
      if (rc == 0)
        break;
      if (rc < 0) {
        if (cap_frame_decoder_error(r->dec)) {
          rep_disconnect(r, err);
          return;
        }
        continue;
      }
      rep_handle(r, env);
      cap_frame_decoder_release(r->dec, env);
      if (r->want_close) {
        r->want_close = false;
        rep_disconnect(r, "daemon said bye");
        return;
      }
    }
  }
}

static void rep_flush_batch(rep_t *r) {
  if (cap_proto_batch_records(r->batch) == 0)
    return;
  if (r->fd >= 0 && r->welcomed) {
    uint64_t dropped = atomic_load(&r->c->dropped);
    cap_proto_batch_set_dropped(r->batch, dropped);
    if (r->out_len - r->out_off > OUT_MAX_BYTES)
      rep_disconnect(r, "daemon not reading");
    else if (cap_proto_batch_append_frame(r->batch, 0, &r->out, &r->out_len,
                                          &r->out_cap) < 0)
      rep_disconnect(r, "batch too large");
  }
  cap_proto_batch_reset(r->batch, r->batch_iter);
}

static void rep_iter_end(rep_t *r, const cap__rec_t *a, const cap__rec_t *b) {
  cap_client_t *c = r->c;
  rep_flush_batch(r);
  uint64_t v[5];
  memcpy(v, b->u.ids, sizeof v);
  Capuchin__IterationEnd ie = CAPUCHIN__ITERATION_END__INIT;
  ie.has_iteration = 1;
  ie.iteration = a->a;
  ie.has_iter_ns = 1;
  ie.iter_ns = a->u.op.t0 < 0 ? 0 : a->u.op.t0;
  /* A measured iteration becomes the profile: its ops were recorded on the
   * framework's timeline (the client's own passive-mode stalls taken out),
   * and so is its length. stall_ns still says what was taken out. */
  if ((a->b & CAP__ITER_MEASURED) && a->u.op.t1 > 0 && a->u.op.t1 < ie.iter_ns)
    ie.iter_ns -= a->u.op.t1;
  ie.has_peak_bytes = 1;
  ie.peak_bytes = a->u.op.u64;
  ie.has_bytes_out = 1;
  ie.bytes_out = v[0];
  ie.has_bytes_in = 1;
  ie.bytes_in = v[1];
  ie.has_stall_ns = 1;
  ie.stall_ns = a->u.op.t1 < 0 ? 0 : a->u.op.t1;
  ie.has_measured = 1;
  ie.measured = (a->b & CAP__ITER_MEASURED) != 0;
  ie.has_incomplete = 1;
  ie.incomplete = (a->b & CAP__ITER_INCOMPLETE) != 0;
  if (ie.measured && v[4]) {
    ie.has_ops_over_budget = 1;
    ie.ops_over_budget = (uint32_t)v[4];
  }
  ie.has_mode = 1;
  switch (a->b & CAP__ITER_MODE_MASK) {
  case CAP_MODE_MEASURED:
    ie.mode = CAPUCHIN__MODE__MODE_MEASURED;
    break;
  case CAP_MODE_GUIDED:
    ie.mode = CAPUCHIN__MODE__MODE_GUIDED;
    break;
  default:
    ie.mode = CAPUCHIN__MODE__MODE_PASSIVE;
    break;
  }
  if (a->c) {
    ie.has_plan_version = 1;
    ie.plan_version = a->c;
  }
  ie.has_recompute_ops = 1;
  ie.recompute_ops = v[2];
  ie.has_evictions = 1;
  ie.evictions = v[3];
  /* What went wrong in this iteration (older reports whose IterationEnd
   * was lost with the ring are dropped). */
  cap__iter_errors_t *errs = NULL;
  pthread_mutex_lock(&c->mu);
  while (c->pending_errors && c->pending_errors->iteration <= ie.iteration) {
    cap__iter_errors_t *e = c->pending_errors;
    c->pending_errors = e->next;
    e->next = NULL;
    if (e->iteration == ie.iteration) {
      cap__iter_errors_free(errs);
      errs = e;
    } else {
      cap__iter_errors_free(e);
    }
  }
  pthread_mutex_unlock(&c->mu);
  Capuchin__ActionKey *acts = NULL, **act_ptrs = NULL;
  if (errs) {
    if (errs->op_errors) {
      ie.has_op_errors = 1;
      ie.op_errors = errs->op_errors;
      ie.error = errs->first_error;
    }
    acts = calloc(errs->n_failed ? errs->n_failed : 1, sizeof *acts);
    act_ptrs = calloc(errs->n_failed ? errs->n_failed : 1, sizeof *act_ptrs);
    if (acts && act_ptrs) {
      for (uint32_t i = 0; i < errs->n_failed; i++) {
        capuchin__action_key__init(&acts[i]);
        acts[i].has_tensor = acts[i].has_evict_after_access = 1;
        acts[i].tensor = errs->failed[i].tensor;
        acts[i].evict_after_access = errs->failed[i].access;
        act_ptrs[i] = &acts[i];
      }
      ie.n_failed_actions = errs->n_failed;
      ie.failed_actions = act_ptrs;
    }
  }
  if (r->fd >= 0 && r->welcomed)
    rep_queue_msg(r, &ie);
  free(acts);
  free(act_ptrs);
  cap__iter_errors_free(errs);

  cap_feedback_t *fb = NULL;
  uint32_t n_fb = 0, fb_version = 0;
  pthread_mutex_lock(&c->mu);
  fb = c->pending_fb;
  n_fb = c->n_pending_fb;
  fb_version = c->pending_fb_version;
  c->pending_fb = NULL;
  c->n_pending_fb = 0;
  pthread_mutex_unlock(&c->mu);
  if (n_fb && fb_version && r->fd >= 0 && r->welcomed) {
    Capuchin__Feedback *m = NULL;
    if (cap_proto_feedback_to_msg(fb_version, a->a, fb, n_fb, &m) == 0) {
      rep_queue_msg(r, m);
      cap_proto_msg_free(m);
    }
  }
  free(fb);
}

/* Drain what the owner has published. */
static void rep_drain(rep_t *r) {
  cap_client_t *c = r->c;
  cap__ring_t *ring = &c->ring;
  uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&ring->head, memory_order_acquire);
  while (tail < head) {
    const cap__rec_t *rec = cap__ring_at(ring, tail);
    uint32_t used = 1;
    switch (rec->type) {
    case CAP__REC_ITER_BEGIN:
      rep_flush_batch(r);
      r->in_measured = r->fd >= 0 && r->welcomed;
      r->batch_iter = rec->a;
      cap_proto_batch_reset(r->batch, r->batch_iter);
      break;
    case CAP__REC_DECL:
      if (!r->in_measured)
        break; /* from before this session: the daemon cannot place it */
      cap_proto_batch_add_decl(r->batch, rec->a, rec->u.op.u64,
                               (cap_tensor_kind_t)rec->b);
      break;
    case CAP__REC_OP: {
      uint32_t n_ids = rec->b + rec->c;
      used += (n_ids + CAP__REC_IDS - 1) / CAP__REC_IDS;
      if (!r->in_measured)
        break;
      if (n_ids > r->op_buf_cap) {
        uint32_t *nb = realloc(r->op_buf, (size_t)n_ids * sizeof *nb);
        if (!nb)
          break;
        r->op_buf = nb;
        r->op_buf_cap = n_ids;
      }
      for (uint32_t i = 0; i < n_ids; i++)
        r->op_buf[i] = cap__ring_at(ring, tail + 1 + i / CAP__REC_IDS)
                           ->u.ids[i % CAP__REC_IDS];
      cap_proto_batch_add_op(r->batch, rec->a, rec->u.op.t0, rec->u.op.t1,
                             rec->u.op.name, r->op_buf, rec->b,
                             r->op_buf + rec->b, rec->c);
      break;
    }
    case CAP__REC_NO_EVICT:
      if (r->in_measured)
        cap_proto_batch_add_no_evict(r->batch, rec->a);
      break;
    case CAP__REC_FREE:
      if (!r->in_measured)
        break;
      cap_proto_batch_add_free(r->batch, rec->u.op.t0, rec->a);
      break;
    case CAP__REC_ITER_END:
      used = 2;
      /* A measured iteration this session did not see from its start is
       * not reported at all (the daemon would get a partial profile). */
      if (!(rec->b & CAP__ITER_MEASURED) || r->in_measured)
        rep_iter_end(r, rec, cap__ring_at(ring, tail + 1));
      r->in_measured = false;
      break;
    default:
      break;
    }
    tail += used;
    if (cap_proto_batch_bytes(r->batch) > BATCH_FLUSH_BYTES)
      rep_flush_batch(r);
  }
  atomic_store_explicit(&ring->tail, tail, memory_order_release);
}

/* Tell the daemon the budget in force and the device bytes held under it,
 * once per change, so that it can give what this job gave back to another
 * (proto: BudgetAck). */
static void rep_ack_budget(rep_t *r) {
  cap_client_t *c = r->c;
  if (!r->budget_acks)
    return;
  Capuchin__BudgetAck ba = CAPUCHIN__BUDGET_ACK__INIT;
  pthread_mutex_lock(&c->mu);
  uint32_t changes = c->budget_changes;
  ba.budget_bytes = c->ack_budget;
  ba.device_bytes = c->ack_held;
  pthread_mutex_unlock(&c->mu);
  if (changes == r->budget_acked || !ba.budget_bytes)
    return;
  ba.has_budget_bytes = ba.has_device_bytes = 1;
  if (rep_queue_msg(r, &ba) == 0)
    r->budget_acked = changes;
}

static void *rep_main(void *arg) {
  rep_t *r = arg;
  cap_client_t *c = r->c;
  /* Signals belong to the training process, not to us. */
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  while (!atomic_load(&c->stop)) {
    if (r->fd < 0 && !c->no_daemon && mono_ms() >= r->next_try_ms)
      rep_try_connect(r);
    rep_drain(r);
    if (r->fd >= 0 && r->welcomed) {
      uint32_t ack;
      pthread_mutex_lock(&c->mu);
      ack = c->ack_session == c->session ? c->ack_version : 0;
      pthread_mutex_unlock(&c->mu);
      if (ack && ack != r->acked) {
        Capuchin__PlanAck pa = CAPUCHIN__PLAN_ACK__INIT;
        pa.has_version = 1;
        pa.version = ack;
        if (rep_queue_msg(r, &pa) == 0)
          r->acked = ack;
      }
      rep_ack_budget(r);
    }
    rep_flush_out(r);
    struct pollfd pf[2];
    int n = 0;
    pf[n++] = (struct pollfd){.fd = c->wake_fd[0], .events = POLLIN};
    if (r->fd >= 0) {
      pf[n] = (struct pollfd){.fd = r->fd, .events = POLLIN};
      if (r->out_off < r->out_len)
        pf[n].events |= POLLOUT;
      n++;
    }
    int rc = poll(pf, (nfds_t)n, 2);
    if (rc > 0 && (pf[0].revents & POLLIN)) {
      char b[256];
      while (read(c->wake_fd[0], b, sizeof b) > 0) {
      }
    }
    if (rc > 0 && n > 1 && (pf[1].revents & (POLLIN | POLLHUP | POLLERR)))
      rep_read(r);
  }
  /* Orderly close: send what is left and say Bye. */
  rep_drain(r);
  if (r->fd >= 0 && r->welcomed) {
    rep_flush_batch(r);
    Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
    bye.reason = "client closed";
    rep_queue_msg(r, &bye);
    int64_t deadline = mono_ms() + 1000;
    while (r->fd >= 0 && r->out_off < r->out_len && mono_ms() < deadline) {
      rep_flush_out(r);
      struct pollfd pf = {.fd = r->fd, .events = POLLOUT};
      if (r->fd >= 0)
        poll(&pf, 1, 10);
    }
  }
  if (r->fd >= 0) {
    close(r->fd);
    r->fd = -1;
  }
  return NULL;
}

int cap__reporter_start(cap_client_t *c) {
  rep_t *r = calloc(1, sizeof *r);
  if (!r)
    return CAP_ENOMEM;
  r->c = c;
  r->fd = -1;
  r->batch = cap_proto_batch_create();
  if (!r->batch)
    goto out_free;
  if (pipe(c->wake_fd) < 0)
    goto out_batch;
  fcntl(c->wake_fd[0], F_SETFL, O_NONBLOCK);
  fcntl(c->wake_fd[1], F_SETFL, O_NONBLOCK);
  fcntl(c->wake_fd[0], F_SETFD, FD_CLOEXEC);
  fcntl(c->wake_fd[1], F_SETFD, FD_CLOEXEC);
  atomic_store(&c->stop, false);
  if (pthread_create(&c->reporter, NULL, rep_main, r) != 0)
    goto out_pipe;
  c->reporter_started = true;
  c->rep = r;
  return 0;
out_pipe:
  close(c->wake_fd[0]);
  close(c->wake_fd[1]);
  c->wake_fd[0] = c->wake_fd[1] = -1;
out_batch:
  cap_proto_batch_destroy(r->batch);
out_free:
  free(r);
  return CAP_ENOMEM;
}

void cap__reporter_wake(cap_client_t *c) {
  if (c->wake_fd[1] >= 0) {
    char b = 1;
    ssize_t n = write(c->wake_fd[1], &b, 1);
    (void)n;
  }
}

void cap__reporter_stop(cap_client_t *c) {
  if (!c->reporter_started)
    return;
  atomic_store(&c->stop, true);
  cap__reporter_wake(c);
  pthread_join(c->reporter, NULL);
  c->reporter_started = false;
  rep_t *r = c->rep;
  cap_frame_decoder_destroy(r->dec);
  cap_proto_batch_destroy(r->batch);
  free(r->out);
  free(r->op_buf);
  free(r);
  c->rep = NULL;
  close(c->wake_fd[0]);
  close(c->wake_fd[1]);
  c->wake_fd[0] = c->wake_fd[1] = -1;
}

void cap__decl_upto(cap_client_t *c, uint32_t upto) {
  for (; c->decl_next <= upto && c->decl_next < c->n_tensors; c->decl_next++) {
    const cap__tensor_t *t = &c->tensors[c->decl_next];
    if (!cap__rec_decl(c, c->decl_next, t->bytes, t->kind))
      c->it.dropped_records++;
  }
}

void cap__iter_errors_free(cap__iter_errors_t *e) {
  while (e) {
    cap__iter_errors_t *next = e->next;
    free(e->failed);
    free(e);
    e = next;
  }
}
