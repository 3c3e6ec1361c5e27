/*
 * The sim device backend: host memory stands in for the device, two
 * copy-engine threads move real bytes and take as long as the configured
 * bandwidths say, and the compute stream is the calling thread.
 *
 * Time is modelled, then paced in real time: every copy and op has a start
 * and end on the backend's clock (trace ns = real ns / time_scale), computed
 * from the bandwidths and the queue, and the threads sleep until the real
 * moment that corresponds. Copies in the two directions share the duplex
 * bandwidth max-min fairly while both run (the policy simulator's model), so
 * a copy's end moves whenever the other direction starts or stops; the
 * engines re-read it each time they wake. Model times, not wake-up times,
 * chain one item to the next, so sleep overshoot does not accumulate, and a
 * copy starts in the model when it is queued (or its engine frees up), not
 * when its engine thread gets to run.
 *
 * A copy's bytes are moved (memcpy) just before its modelled end, so that
 * reading the destination without waiting for the copy finds the old bytes,
 * as it would on a GPU.
 *
 * One mutex guards the engines, their queues and every event; one condition
 * variable (CLOCK_MONOTONIC) is broadcast on every change. The compute stream
 * has its own mutex, held for the length of an op (ops on one stream are
 * serial).
 */
#include "backend.h"
#include "capuchin/sim.h" /* cap__duplex_share: the simulator's copy model */

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MEMCPY_SLACK_REAL_NS 1e6 /* see engine_main */

typedef struct sim_event {
  uint64_t recorded;  /* records issued */
  uint64_t completed; /* highest record completed */
  int64_t t_done;     /* model time of the latest completion */
  int refs;           /* user + queued items */
} sim_event;

enum { ITEM_COPY, ITEM_RECORD, ITEM_WAIT };

typedef struct item {
  int kind;
  void *dst;
  const void *src;
  size_t bytes;
  int64_t submit_t; /* model time the host queued it */
  sim_event *ev;
  uint64_t gen;
  struct item *next;
} item;

typedef struct engine {
  struct sim *sim;
  int dir; /* 0: D2H, 1: H2D */
  pthread_t th;
  bool started;
  item *head, *tail;
  int64_t te; /* model time its last item finished */
  /* the copy in flight */
  bool active, done;
  double remaining; /* bytes */
  double rate;      /* bytes per model ns */
  int64_t t_last;   /* model time `remaining` refers to */
  int64_t done_t;
} engine;

typedef struct sim {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stop;
  engine eng[2];
  cap_bandwidth_t bw; /* GB/s = bytes per ns */
  double scale;
  int64_t t0_real;
  double memcpy_ns_per_byte; /* real time, running estimate */
  /* device capacity */
  uint64_t capacity, used;
  /* compute stream: op_mu serializes ops (held for an op's length), cmu
   * guards the two times below (held briefly) */
  pthread_mutex_t op_mu, cmu;
  int64_t compute_end; /* model time the last op ended */
  int64_t ret_late;    /* how late the caller got control back after it */
  atomic_ullong mismatches;
} sim;

/* ---- clocks ---- */

static int64_t real_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t model_now(const sim *s) {
  return (int64_t)((double)(real_ns() - s->t0_real) / s->scale);
}

static struct timespec real_deadline(const sim *s, int64_t t_model) {
  double r = (double)s->t0_real + (double)t_model * s->scale;
  if (r > 9.0e18)
    r = 9.0e18;
  int64_t ns = (int64_t)r;
  struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
  return ts;
}

/* Sleep the calling thread until the model clock reaches t. */
static void sleep_until(const sim *s, int64_t t) {
  struct timespec ts = real_deadline(s, t);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
}

/* ---- the copy model (called with mu held) ---- */

/* The running copies' rates: the simulator's duplex model. */
static void set_rates(sim *s) {
  bool a0 = s->eng[0].active && !s->eng[0].done;
  bool a1 = s->eng[1].active && !s->eng[1].done;
  double r0 = s->bw.d2h_gbps, r1 = s->bw.h2d_gbps;
  if (a0 && a1)
    cap__duplex_share(&s->bw, &r0, &r1);
  s->eng[0].rate = r0;
  s->eng[1].rate = r1;
}

static void advance_engine(engine *e, int64_t t) {
  if (!e->active || e->done || t <= e->t_last)
    return;
  e->remaining -= (double)(t - e->t_last) * e->rate;
  if (e->remaining < 0)
    e->remaining = 0;
  e->t_last = t;
}

static int64_t end_of(const engine *e) {
  return e->t_last + (int64_t)(e->remaining / e->rate + 0.999);
}

/* Move the model forward to t, finishing copies in the order they end (a
 * finished copy's bandwidth goes to the other direction from then on). */
static void progress_to(sim *s, int64_t t) {
  for (;;) {
    int first = -1;
    int64_t first_end = 0;
    for (int i = 0; i < 2; i++) {
      engine *e = &s->eng[i];
      if (!e->active || e->done)
        continue;
      int64_t end = end_of(e);
      if (end < e->t_last)
        end = e->t_last;
      if (first < 0 || end < first_end) {
        first = i;
        first_end = end;
      }
    }
    if (first < 0 || first_end > t) {
      advance_engine(&s->eng[0], t);
      advance_engine(&s->eng[1], t);
      return;
    }
    advance_engine(&s->eng[0], first_end);
    advance_engine(&s->eng[1], first_end);
    s->eng[first].done = true;
    s->eng[first].done_t = first_end;
    s->eng[first].remaining = 0;
    set_rates(s);
  }
}

static void event_unref(sim_event *ev) {
  if (--ev->refs == 0)
    free(ev);
}

static void pop_item(engine *e) {
  item *it = e->head;
  e->head = it->next;
  if (!e->head)
    e->tail = NULL;
  if (it->ev)
    event_unref(it->ev);
  free(it);
}

/* Retire the records and satisfied waits at the head of e's queue and start
 * the copy behind them on the model's clock. Answers whether it changed
 * anything. A copy starts when the engine is free and the host has queued
 * it, but never before the moment the model has already been advanced to:
 * the other direction's progress up to then is settled. */
static bool start_head(sim *s, engine *e) {
  bool changed = false;
  while (!e->active && e->head) {
    item *it = e->head;
    if (it->kind == ITEM_WAIT) {
      if (it->ev->completed < it->gen)
        break;
      if (it->ev->t_done > e->te)
        e->te = it->ev->t_done;
      pop_item(e);
    } else if (it->kind == ITEM_RECORD) {
      if (it->gen > it->ev->completed) {
        it->ev->completed = it->gen;
        it->ev->t_done = e->te;
      }
      pop_item(e);
    } else {
      int64_t start = e->te > it->submit_t ? e->te : it->submit_t;
      const engine *o = &s->eng[!e->dir];
      if (o->active) {
        int64_t settled = o->done ? o->done_t : o->t_last;
        if (settled > start)
          start = settled;
      }
      progress_to(s, start);
      e->active = true;
      e->done = false;
      e->remaining = (double)it->bytes;
      e->t_last = start;
      set_rates(s);
    }
    changed = true;
  }
  return changed;
}

/* Start what can start on both engines. Whoever queues an item, completes
 * an event or finishes a copy calls it (with mu held), so that the model
 * moves at the moment it should and not when an engine thread next wakes:
 * a thread that woke late would otherwise let the other direction run
 * alone, at full bandwidth, through time that is already modelled. */
static void start_queued(sim *s) {
  bool changed;
  do {
    changed = start_head(s, &s->eng[0]);
    changed |= start_head(s, &s->eng[1]);
    if (changed)
      pthread_cond_broadcast(&s->cv);
  } while (changed);
}

static void *engine_main(void *arg) {
  engine *e = arg;
  sim *s = e->sim;
  pthread_mutex_lock(&s->mu);
  while (!s->stop) {
    start_queued(s);
    if (!e->active) {
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    item *it = e->head;
    /* The bytes land at the end of the copy, as on a device: a reader that
     * does not wait for the copy's event sees the old contents. So wait
     * until the modelled end minus the time memcpy is expected to take,
     * twice over and 1 ms more: a memcpy that a busy machine slows, or an
     * engine thread woken late, must still end by the modelled end. One
     * that ends later delays every copy queued behind it, which a GPU's
     * copy engine does not do (on 2 loaded cores that added 2.8 ms over a
     * 98 ms gpt2_small iteration at time scale 40). */
    while (!s->stop) {
      progress_to(s, model_now(s));
      if (e->done)
        break;
      int64_t lead = (int64_t)((2.0 * (double)it->bytes * s->memcpy_ns_per_byte +
                                MEMCPY_SLACK_REAL_NS) /
                               s->scale);
      int64_t t_copy = end_of(e) - lead;
      if (model_now(s) >= t_copy)
        break;
      struct timespec ts = real_deadline(s, t_copy);
      pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    int64_t r0 = real_ns();
    memcpy(it->dst, it->src, it->bytes);
    int64_t r1 = real_ns();
    int64_t moved_t = model_now(s);
    pthread_mutex_lock(&s->mu);
    if (it->bytes >= (64u << 10)) /* running estimate of memcpy speed */
      s->memcpy_ns_per_byte =
          0.8 * s->memcpy_ns_per_byte + 0.2 * (double)(r1 - r0) / (double)it->bytes;
    while (!s->stop) {
      progress_to(s, model_now(s));
      if (e->done)
        break;
      struct timespec ts = real_deadline(s, end_of(e));
      pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    /* A memcpy slower than the model delays the copy's end: the bytes are
     * not there before it. */
    e->te = e->done_t > moved_t ? e->done_t : moved_t;
    e->active = e->done = false;
    set_rates(s);
    pop_item(e);
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* ---- vtable ---- */

static bool sim_available(void) { return true; }

static void sim_close(void *impl);

static int sim_open(const cap_backend_config_t *cfg, cap_backend_info_t *info, void **impl) {
  if (cfg->time_scale <= 0 || cfg->sim_h2d_gbps <= 0 || cfg->sim_d2h_gbps <= 0 ||
      cfg->sim_duplex_gbps <= 0)
    return CAP_EINVAL;
  sim *s = calloc(1, sizeof *s);
  if (!s)
    return CAP_ENOMEM;
  s->bw = (cap_bandwidth_t){.h2d_gbps = cfg->sim_h2d_gbps,
                            .d2h_gbps = cfg->sim_d2h_gbps,
                            .duplex_gbps = cfg->sim_duplex_gbps};
  s->scale = cfg->time_scale;
  s->capacity = cfg->sim_device_bytes;
  s->memcpy_ns_per_byte = 0.1; /* 10 GB/s until measured */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (pthread_mutex_init(&s->mu, NULL) || pthread_mutex_init(&s->cmu, NULL) ||
      pthread_mutex_init(&s->op_mu, NULL) ||
      pthread_cond_init(&s->cv, &ca)) {
    pthread_condattr_destroy(&ca);
    free(s);
    return CAP_ENOMEM;
  }
  pthread_condattr_destroy(&ca);
  s->t0_real = real_ns();
  for (int i = 0; i < 2; i++) {
    s->eng[i].sim = s;
    s->eng[i].dir = i;
    if (pthread_create(&s->eng[i].th, NULL, engine_main, &s->eng[i]) != 0) {
      sim_close(s);
      return CAP_ENOMEM;
    }
    s->eng[i].started = true;
  }
  snprintf(info->device_name, sizeof info->device_name, "sim");
  snprintf(info->device_uuid, sizeof info->device_uuid, "%s",
           cfg->sim_device_uuid);
  info->total_bytes = s->capacity;
  info->h2d_gbps = cfg->sim_h2d_gbps;
  info->d2h_gbps = cfg->sim_d2h_gbps;
  info->duplex_gbps = cfg->sim_duplex_gbps;
  info->time_scale = s->scale;
  *impl = s;
  return 0;
}

static void sim_close(void *impl) {
  sim *s = impl;
  pthread_mutex_lock(&s->mu);
  /* Let queued work finish (destroy synchronizes every stream), unless an
   * engine waits on an event that will never be recorded. */
  for (int i = 0; i < 2; i++)
    while (s->eng[i].started && s->eng[i].head &&
           !(s->eng[i].head->kind == ITEM_WAIT &&
             s->eng[i].head->ev->completed < s->eng[i].head->gen &&
             s->eng[i].head->ev->refs == 1))
      pthread_cond_wait(&s->cv, &s->mu);
  s->stop = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < 2; i++)
    if (s->eng[i].started)
      pthread_join(s->eng[i].th, NULL);
  for (int i = 0; i < 2; i++)
    while (s->eng[i].head)
      pop_item(&s->eng[i]);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->cmu);
  pthread_mutex_destroy(&s->op_mu);
  free(s);
}

static int64_t sim_now(void *impl) { return model_now(impl); }

/* Allocations carry a header in front (their size) so that free can account
 * them; the block handed out stays aligned to CAP_BACKEND_ALIGN. */
#define HDR CAP_BACKEND_ALIGN
static void *block_alloc(size_t bytes) {
  size_t total = ((bytes + HDR - 1) & ~(size_t)(HDR - 1)) + HDR;
  unsigned char *p = aligned_alloc(HDR, total);
  if (!p)
    return NULL;
  memcpy(p, &bytes, sizeof bytes);
  return p + HDR;
}
static size_t block_size(void *ptr) {
  size_t n;
  memcpy(&n, (unsigned char *)ptr - HDR, sizeof n);
  return n;
}
static void block_free(void *ptr) { free((unsigned char *)ptr - HDR); }

static int sim_device_alloc(void *impl, size_t bytes, void **ptr) {
  sim *s = impl;
  if (bytes > SIZE_MAX / 2)
    return CAP_ENOMEM;
  pthread_mutex_lock(&s->mu);
  bool room = s->used + bytes <= s->capacity;
  if (room)
    s->used += bytes;
  pthread_mutex_unlock(&s->mu);
  if (!room)
    return CAP_ENOMEM;
  void *p = block_alloc(bytes);
  if (!p) {
    pthread_mutex_lock(&s->mu);
    s->used -= bytes;
    pthread_mutex_unlock(&s->mu);
    return CAP_ENOMEM;
  }
  *ptr = p;
  return 0;
}

static void sim_device_free(void *impl, void *ptr) {
  sim *s = impl;
  size_t n = block_size(ptr);
  block_free(ptr);
  pthread_mutex_lock(&s->mu);
  s->used -= n;
  pthread_mutex_unlock(&s->mu);
}

static int sim_host_alloc(void *impl, size_t bytes, void **ptr) {
  (void)impl;
  void *p = bytes <= SIZE_MAX / 2 ? block_alloc(bytes) : NULL;
  if (!p)
    return CAP_ENOMEM;
  *ptr = p;
  return 0;
}

static void sim_host_free(void *impl, void *ptr) {
  (void)impl;
  block_free(ptr);
}

/* The compute stream's current model time. A caller that comes back from an
 * op or a wait late only because its thread woke late (sleep overshoot) is
 * credited that lateness, at most CREDIT_REAL_NS of real time, so that
 * overshoot does not accumulate over thousands of short ops; time the caller
 * spends on its own work counts. Synchronizing the compute stream spends the
 * credit: after it the caller and the stream agree on the time. Called with
 * cmu held. */
#define CREDIT_REAL_NS 1000000
static int64_t compute_now(sim *s) {
  int64_t credit = s->ret_late;
  int64_t cap = (int64_t)(CREDIT_REAL_NS / s->scale);
  if (credit > cap)
    credit = cap;
  int64_t t = model_now(s) - credit;
  return t > s->compute_end ? t : s->compute_end;
}

static void enqueue(sim *s, int dir, item *it) {
  engine *e = &s->eng[dir];
  if (e->tail)
    e->tail->next = it;
  else
    e->head = it;
  e->tail = it;
  start_queued(s); /* wakes the engines when it starts anything */
}

static int sim_copy_async(void *impl, cap_stream_t st, void *dst, const void *src,
                          size_t bytes) {
  sim *s = impl;
  item *it = calloc(1, sizeof *it);
  if (!it)
    return CAP_ENOMEM;
  it->kind = ITEM_COPY;
  it->dst = dst;
  it->src = src;
  it->bytes = bytes;
  pthread_mutex_lock(&s->cmu);
  it->submit_t = compute_now(s);
  pthread_mutex_unlock(&s->cmu);
  pthread_mutex_lock(&s->mu);
  enqueue(s, st == CAP_STREAM_D2H ? 0 : 1, it);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static int sim_event_create(void *impl, void **ev) {
  (void)impl;
  sim_event *e = calloc(1, sizeof *e);
  if (!e)
    return CAP_ENOMEM;
  e->refs = 1;
  *ev = e;
  return 0;
}

static void sim_event_destroy(void *impl, void *ev) {
  sim *s = impl;
  pthread_mutex_lock(&s->mu);
  event_unref(ev);
  pthread_mutex_unlock(&s->mu);
}

static int sim_event_record(void *impl, void *evp, cap_stream_t st) {
  sim *s = impl;
  sim_event *ev = evp;
  if (st == CAP_STREAM_COMPUTE) {
    /* Everything before it on the compute stream is done: the caller is
     * the compute stream. */
    pthread_mutex_lock(&s->cmu);
    int64_t t = compute_now(s);
    pthread_mutex_unlock(&s->cmu);
    pthread_mutex_lock(&s->mu);
    ev->completed = ++ev->recorded;
    ev->t_done = t;
    start_queued(s); /* a copy may wait on it */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
  }
  item *it = calloc(1, sizeof *it);
  if (!it)
    return CAP_ENOMEM;
  it->kind = ITEM_RECORD;
  pthread_mutex_lock(&s->mu);
  it->ev = ev;
  ev->refs++;
  it->gen = ++ev->recorded;
  enqueue(s, st == CAP_STREAM_D2H ? 0 : 1, it);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

/* Block the caller until ev's record `gen` completes; the compute stream
 * then resumes at the event's model time (not at the wake-up). */
static void host_wait(sim *s, sim_event *ev, uint64_t gen, bool compute) {
  pthread_mutex_lock(&s->mu);
  ev->refs++;
  while (ev->completed < gen && !s->stop)
    pthread_cond_wait(&s->cv, &s->mu);
  int64_t t_done = ev->t_done;
  event_unref(ev);
  pthread_mutex_unlock(&s->mu);
  if (!compute)
    return;
  pthread_mutex_lock(&s->cmu);
  if (t_done > s->compute_end) {
    int64_t now = model_now(s);
    s->compute_end = t_done;
    s->ret_late = now > t_done ? now - t_done : 0;
  }
  pthread_mutex_unlock(&s->cmu);
}

static int sim_stream_wait_event(void *impl, cap_stream_t st, void *evp) {
  sim *s = impl;
  sim_event *ev = evp;
  if (st == CAP_STREAM_COMPUTE) {
    pthread_mutex_lock(&s->mu);
    uint64_t gen = ev->recorded;
    pthread_mutex_unlock(&s->mu);
    host_wait(s, ev, gen, true);
    return 0;
  }
  item *it = calloc(1, sizeof *it);
  if (!it)
    return CAP_ENOMEM;
  it->kind = ITEM_WAIT;
  pthread_mutex_lock(&s->mu);
  it->ev = ev;
  ev->refs++;
  it->gen = ev->recorded;
  enqueue(s, st == CAP_STREAM_D2H ? 0 : 1, it);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static int sim_event_query(void *impl, void *evp) {
  sim *s = impl;
  sim_event *ev = evp;
  pthread_mutex_lock(&s->mu);
  int done = ev->completed >= ev->recorded;
  pthread_mutex_unlock(&s->mu);
  return done;
}

static int sim_event_synchronize(void *impl, void *evp) {
  sim *s = impl;
  sim_event *ev = evp;
  pthread_mutex_lock(&s->mu);
  uint64_t gen = ev->recorded;
  pthread_mutex_unlock(&s->mu);
  host_wait(s, ev, gen, false);
  return 0;
}

static void compute_sync(sim *s) {
  pthread_mutex_lock(&s->op_mu); /* an op in another thread ends first */
  pthread_mutex_lock(&s->cmu);
  s->ret_late = 0;
  pthread_mutex_unlock(&s->cmu);
  pthread_mutex_unlock(&s->op_mu);
}

static int sim_stream_synchronize(void *impl, cap_stream_t st) {
  sim *s = impl;
  if (st == CAP_STREAM_COMPUTE) {
    compute_sync(s);
    return 0;
  }
  engine *e = &s->eng[st == CAP_STREAM_D2H ? 0 : 1];
  pthread_mutex_lock(&s->mu);
  while (e->head && !s->stop)
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static int sim_run_op(void *impl, int64_t duration_ns, const cap_op_buf_t *bufs, size_t n) {
  sim *s = impl;
  pthread_mutex_lock(&s->op_mu);
  pthread_mutex_lock(&s->cmu);
  int64_t start = compute_now(s);
  pthread_mutex_unlock(&s->cmu);
  int64_t work0 = model_now(s);
  uint64_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (bufs[i].flags & CAP_OPBUF_VERIFY)
      bad += cap_pattern_check_host(bufs[i].ptr, bufs[i].bytes, bufs[i].verify_seed);
  for (size_t i = 0; i < n; i++)
    if (bufs[i].flags & CAP_OPBUF_FILL)
      cap_pattern_fill_host(bufs[i].ptr, bufs[i].bytes, bufs[i].fill_seed);
  if (bad)
    atomic_fetch_add(&s->mismatches, bad);
  /* The op lasts its duration, or as long as the buffer work took if that
   * is longer; a caller that is already late (sleep overshoot of earlier
   * ops) does not stretch it. */
  int64_t work = model_now(s) - work0;
  int64_t end = start + (work > duration_ns ? work : duration_ns);
  if (model_now(s) < end)
    sleep_until(s, end);
  int64_t now = model_now(s);
  pthread_mutex_lock(&s->cmu);
  s->compute_end = end;
  s->ret_late = now > end ? now - end : 0;
  pthread_mutex_unlock(&s->cmu);
  pthread_mutex_unlock(&s->op_mu);
  return 0;
}

static int sim_pattern_fill(void *impl, void *dev, size_t bytes, uint64_t seed) {
  (void)impl;
  cap_pattern_fill_host(dev, bytes, seed);
  return 0;
}

static int sim_memset(void *impl, void *dev, int byte, size_t bytes) {
  (void)impl;
  memset(dev, byte, bytes);
  return 0;
}

static int64_t sim_pattern_check(void *impl, const void *dev, size_t bytes, uint64_t seed) {
  compute_sync(impl);
  return (int64_t)cap_pattern_check_host(dev, bytes, seed);
}

static int sim_mismatches(void *impl, uint64_t *count) {
  sim *s = impl;
  compute_sync(s);
  *count = atomic_exchange(&s->mismatches, 0);
  return 0;
}

static int sim_read(void *impl, void *host_dst, const void *dev_src, size_t bytes) {
  compute_sync(impl);
  memcpy(host_dst, dev_src, bytes);
  return 0;
}

static int sim_write(void *impl, void *dev_dst, const void *host_src, size_t bytes) {
  compute_sync(impl);
  memcpy(dev_dst, host_src, bytes);
  return 0;
}

const cap_backend_ops_t cap__backend_sim = {
    .name = "sim",
    .available = sim_available,
    .open = sim_open,
    .close = sim_close,
    .now_ns = sim_now,
    .device_alloc = sim_device_alloc,
    .device_free = sim_device_free,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .copy_async = sim_copy_async,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .stream_wait_event = sim_stream_wait_event,
    .event_query = sim_event_query,
    .event_synchronize = sim_event_synchronize,
    .stream_synchronize = sim_stream_synchronize,
    .run_op = sim_run_op,
    .pattern_fill = sim_pattern_fill,
    .memset = sim_memset,
    .pattern_check = sim_pattern_check,
    .mismatches = sim_mismatches,
    .read = sim_read,
    .write = sim_write,
};
