/*
 * The client's device layer: budgeted device memory, pinned host buffers,
 * the D2H/H2D copy streams and their events, the clock, synthetic compute
 * and the integrity pattern, over a device model.
 *
 * This file carries its own host-memory device model (copy-engine threads
 * that move the bytes and take the modelled time at the configured
 * bandwidths, the two directions sharing the duplex bandwidth, a scalable
 * clock) so that the executor runs anywhere. The backend vtable
 * (backend.h: sim and cuda) plugs in underneath when it is built.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_impl.h"

struct cap__ev {
  _Atomic int state; /* 0 pending, 1 done, < 0 failed */
  _Atomic int refs;
  struct cap__ev *next;
  void *dst;
  const void *src;
  uint64_t bytes;
  int dir; /* 0 D2H, 1 H2D */
};

typedef struct engine {
  struct cap__dev *d;
  int idx; /* 0 D2H, 1 H2D */
  pthread_t th;
  bool started;
  struct cap__ev *head, *tail;
  double gbps;
  _Atomic bool busy;
  int64_t free_at_ns; /* modelled time the engine becomes free */
} engine_t;

/* Freed blocks are kept for reuse by exact size: iterations repeat the same
 * sizes, and giving memory back to the OS each time costs page faults
 * (as the cuda backend's pools avoid cudaMalloc). */
#define CACHE_BUCKETS 4096u
typedef struct blk {
  uint64_t bytes; /* rounded size */
  struct blk *next;
} blk_t;

typedef struct cache {
  blk_t *b[CACHE_BUCKETS];
  uint64_t held;
} cache_t;

static inline uint32_t bucket(uint64_t r) {
  return (uint32_t)((r * 0x9e3779b97f4a7c15ull) >> 52) & (CACHE_BUCKETS - 1);
}

static void *cache_get(cache_t *k, uint64_t r) {
  blk_t **pp = &k->b[bucket(r)];
  for (; *pp; pp = &(*pp)->next) {
    if ((*pp)->bytes == r) {
      blk_t *b = *pp;
      *pp = b->next;
      k->held -= r;
      return b;
    }
  }
  uint8_t *m = aligned_alloc(256, r + 256);
  if (!m)
    return NULL;
  ((blk_t *)m)->bytes = r;
  return m;
}

static void cache_put(cache_t *k, void *m) {
  blk_t *b = m;
  uint32_t i = bucket(b->bytes);
  b->next = k->b[i];
  k->b[i] = b;
  k->held += b->bytes;
}

static void cache_drain(cache_t *k) {
  for (uint32_t i = 0; i < CACHE_BUCKETS; i++) {
    while (k->b[i]) {
      blk_t *b = k->b[i];
      k->b[i] = b->next;
      free(b);
    }
  }
  k->held = 0;
}

struct cap__dev {
  cache_t dev_cache, host_cache;
  int64_t t0_ns;    /* wall clock origin */
  double scale;     /* wall ns per trace ns */
  uint64_t total_bytes, budget_bytes;
  _Atomic uint64_t in_use;
  double duplex_gbps;
  pthread_mutex_t mu;
  pthread_cond_t cv, done_cv;
  engine_t eng[2];
  bool stop;
  _Atomic uint32_t fail_copy_nth; /* fault injection: fail the n-th copy */
  _Atomic uint32_t copies;
  bool verify_full;
};

static int64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_until_wall(int64_t t) {
  for (;;) {
    int64_t now = wall_ns();
    if (now >= t)
      return;
    int64_t d = t - now;
    if (d < 20000) {
      /* Short waits spin: nanosleep's slack would dominate. */
      while (wall_ns() < t) {
      }
      return;
    }
    struct timespec ts = {d / 1000000000, d % 1000000000};
    nanosleep(&ts, NULL);
  }
}

static uint64_t round256(uint64_t b) { return (b + 255) & ~(uint64_t)255; }

static void *engine_main(void *arg) {
  engine_t *e = arg;
  cap__dev_t *d = e->d;
  int me = e->idx;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!d->stop && !e->head)
      pthread_cond_wait(&d->cv, &d->mu);
    if (d->stop && !e->head)
      break;
    struct cap__ev *ev = e->head;
    e->head = ev->next;
    if (!e->head)
      e->tail = NULL;
    atomic_store(&e->busy, true);
    bool other_busy = atomic_load(&d->eng[1 - me].busy);
    pthread_mutex_unlock(&d->mu);

    double gbps = e->gbps;
    if (other_busy && d->duplex_gbps > 0 && gbps > d->duplex_gbps / 2)
      gbps = d->duplex_gbps / 2;
    int64_t start = wall_ns();
    int64_t model_ns = (int64_t)((double)ev->bytes / gbps * d->scale);
    uint32_t n = atomic_fetch_add(&d->copies, 1) + 1;
    uint32_t fail = atomic_load(&d->fail_copy_nth);
    int st = 1;
    if (fail && n == fail) {
      st = CAP_EDEVICE;
    } else {
      memcpy(ev->dst, ev->src, ev->bytes);
    }
    sleep_until_wall(start + model_ns);

    pthread_mutex_lock(&d->mu);
    atomic_store(&e->busy, false);
    atomic_store_explicit(&ev->state, st, memory_order_release);
    pthread_cond_broadcast(&d->done_cv);
    if (atomic_fetch_sub(&ev->refs, 1) == 1)
      free(ev);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

int cap__dev_open(cap_client_t *c, const cap_client_config_t *cfg) {
  if (cfg->backend && strcmp(cfg->backend, "cuda") == 0) {
#ifndef CAP_WITH_CUDA
    return CAP_EUNSUPPORTED;
#else
    return CAP_EUNSUPPORTED; /* the cuda backend plugs in via backend.h */
#endif
  }
  cap__dev_t *d = calloc(1, sizeof *d);
  if (!d)
    return CAP_ENOMEM;
  d->t0_ns = wall_ns();
  d->scale = cfg->time_scale > 0 ? cfg->time_scale : 1.0;
  d->total_bytes = cfg->sim_device_bytes ? cfg->sim_device_bytes : 80ull << 30;
  d->budget_bytes = d->total_bytes;
  d->duplex_gbps = cfg->sim_duplex_gbps > 0 ? cfg->sim_duplex_gbps : 85.8;
  d->eng[0].gbps = cfg->sim_d2h_gbps > 0 ? cfg->sim_d2h_gbps : 55.1;
  d->eng[1].gbps = cfg->sim_h2d_gbps > 0 ? cfg->sim_h2d_gbps : 55.1;
  const char *v = getenv("CAPUCHIN_VERIFY");
  d->verify_full = v && strcmp(v, "full") == 0;
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  pthread_cond_init(&d->done_cv, NULL);
  c->dev = d;
  snprintf(c->backend, sizeof c->backend, "sim");
  snprintf(c->device_name, sizeof c->device_name, "sim");
  c->device_total_bytes = d->total_bytes;
  c->d2h_gbps = d->eng[0].gbps;
  c->h2d_gbps = d->eng[1].gbps;
  c->duplex_gbps = d->duplex_gbps;
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < 2; i++) {
    d->eng[i].d = d;
    d->eng[i].idx = i;
    if (pthread_create(&d->eng[i].th, NULL, engine_main, &d->eng[i]) != 0) {
      d->stop = true;
      pthread_cond_broadcast(&d->cv);
      pthread_mutex_unlock(&d->mu);
      for (int j = 0; j < i; j++)
        pthread_join(d->eng[j].th, NULL);
      free(d);
      c->dev = NULL;
      return CAP_ENOMEM;
    }
    d->eng[i].started = true;
  }
  pthread_mutex_unlock(&d->mu);
  return 0;
}

void cap__dev_close(cap_client_t *c) {
  cap__dev_t *d = c->dev;
  if (!d)
    return;
  pthread_mutex_lock(&d->mu);
  d->stop = true;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  for (int i = 0; i < 2; i++)
    if (d->eng[i].started)
      pthread_join(d->eng[i].th, NULL);
  pthread_cond_destroy(&d->cv);
  pthread_cond_destroy(&d->done_cv);
  pthread_mutex_destroy(&d->mu);
  cache_drain(&d->dev_cache);
  cache_drain(&d->host_cache);
  free(d);
  c->dev = NULL;
}

void cap__dev_fault_copy(cap_client_t *c, uint32_t nth) {
  atomic_store(&c->dev->copies, 0);
  atomic_store(&c->dev->fail_copy_nth, nth);
}

int cap__dev_set_budget(cap_client_t *c, uint64_t bytes) {
  if (!bytes || bytes > c->dev->total_bytes)
    bytes = c->dev->total_bytes;
  c->dev->budget_bytes = bytes;
  return 0;
}

/* Each block carries its rounded size in a 256-byte header so that free
 * gives back exactly what alloc took. */
int cap__dev_alloc(cap_client_t *c, uint64_t bytes, void **p) {
  cap__dev_t *d = c->dev;
  if (c->fault_alloc_nth) {
    if (--c->fault_alloc_nth == 0) {
      if (c->fault_alloc_sticky)
        c->fault_alloc_nth = 1;
      cap__set_error(c, "injected allocation failure");
      return CAP_ENOMEM;
    }
  }
  uint64_t r = round256(bytes ? bytes : 1);
  uint64_t used = atomic_load(&d->in_use);
  if (used + r > d->budget_bytes)
    return CAP_EBUDGET;
  uint8_t *m = cache_get(&d->dev_cache, r);
  if (!m)
    return CAP_ENOMEM;
  atomic_fetch_add(&d->in_use, r);
  *p = m + 256;
  return 0;
}

void cap__dev_free(cap_client_t *c, void *p) {
  if (!p)
    return;
  blk_t *b = (blk_t *)((uint8_t *)p - 256);
  atomic_fetch_sub(&c->dev->in_use, b->bytes);
  cache_put(&c->dev->dev_cache, b);
}

uint64_t cap__dev_in_use(cap_client_t *c) { return atomic_load(&c->dev->in_use); }

int cap__host_alloc(cap_client_t *c, uint64_t bytes, void **p) {
  uint8_t *m = cache_get(&c->dev->host_cache, round256(bytes ? bytes : 1));
  if (!m)
    return CAP_ENOMEM;
  *p = m + 256;
  return 0;
}

void cap__host_free(cap_client_t *c, void *p, uint64_t bytes) {
  (void)bytes;
  if (p)
    cache_put(&c->dev->host_cache, (uint8_t *)p - 256);
}

static int enqueue(cap_client_t *c, int dir, void *dst, const void *src,
                   uint64_t bytes, cap__ev_t **out) {
  cap__dev_t *d = c->dev;
  struct cap__ev *ev = calloc(1, sizeof *ev);
  if (!ev)
    return CAP_ENOMEM;
  ev->dst = dst;
  ev->src = src;
  ev->bytes = bytes;
  ev->dir = dir;
  atomic_init(&ev->state, 0);
  atomic_init(&ev->refs, 2); /* the engine's and the caller's */
  engine_t *e = &d->eng[dir];
  pthread_mutex_lock(&d->mu);
  if (e->tail)
    e->tail->next = ev;
  else
    e->head = ev;
  e->tail = ev;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  *out = ev;
  return 0;
}

int cap__copy_d2h(cap_client_t *c, void *host, const void *dev, uint64_t bytes,
                  cap__ev_t **ev) {
  return enqueue(c, 0, host, dev, bytes, ev);
}

int cap__copy_h2d(cap_client_t *c, void *dev, const void *host, uint64_t bytes,
                  cap__ev_t **ev) {
  return enqueue(c, 1, dev, host, bytes, ev);
}

int cap__ev_query(cap_client_t *c, cap__ev_t *ev) {
  (void)c;
  return atomic_load_explicit(&ev->state, memory_order_acquire);
}

int cap__ev_sync(cap_client_t *c, cap__ev_t *ev) {
  cap__dev_t *d = c->dev;
  int st = atomic_load_explicit(&ev->state, memory_order_acquire);
  if (st != 0)
    return st < 0 ? st : 0;
  pthread_mutex_lock(&d->mu);
  while ((st = atomic_load_explicit(&ev->state, memory_order_acquire)) == 0)
    pthread_cond_wait(&d->done_cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
  return st < 0 ? st : 0;
}

int cap__ev_compute_wait(cap_client_t *c, cap__ev_t *ev) {
  /* The compute stream is the owner thread here. */
  return cap__ev_sync(c, ev);
}

void cap__ev_release(cap_client_t *c, cap__ev_t *ev) {
  if (!ev)
    return;
  cap__dev_t *d = c->dev;
  pthread_mutex_lock(&d->mu);
  if (atomic_fetch_sub(&ev->refs, 1) == 1)
    free(ev);
  pthread_mutex_unlock(&d->mu);
}

int64_t cap__now_ns(cap_client_t *c) {
  cap__dev_t *d = c->dev;
  return (int64_t)((double)(wall_ns() - d->t0_ns) / d->scale);
}

bool cap__dev_host_compute(cap_client_t *c) {
  (void)c;
  return true;
}

int cap__dev_compute(cap_client_t *c, int64_t ns) {
  cap__dev_t *d = c->dev;
  if (ns <= 0)
    return 0;
  sleep_until_wall(wall_ns() + (int64_t)((double)ns * d->scale));
  return 0;
}

/* --- Integrity pattern -------------------------------------------------------
 * Word i of a tensor holds mix(seed, i). "sample" touches the first and the
 * last word and one word per 64 KiB (at an offset that moves with the seed);
 * "full" every word. */
#define SAMPLE_STRIDE_WORDS 8192u

static inline uint64_t mix(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int cap__dev_fill(cap_client_t *c, void *dev, uint64_t bytes, uint64_t seed) {
  uint64_t n = bytes / 8;
  uint8_t *b = dev;
  if (n == 0) {
    for (uint64_t i = 0; i < bytes; i++)
      b[i] = (uint8_t)mix(seed, i);
    return 0;
  }
  if (c->dev->verify_full) {
    for (uint64_t i = 0; i < n; i++) {
      uint64_t v = mix(seed, i);
      memcpy(b + 8 * i, &v, 8);
    }
    return 0;
  }
  uint64_t off = seed % SAMPLE_STRIDE_WORDS;
  for (uint64_t i = off; i < n; i += SAMPLE_STRIDE_WORDS) {
    uint64_t v = mix(seed, i);
    memcpy(b + 8 * i, &v, 8);
  }
  uint64_t v0 = mix(seed, 0), vl = mix(seed, n - 1);
  memcpy(b, &v0, 8);
  memcpy(b + 8 * (n - 1), &vl, 8);
  return 0;
}

int64_t cap__dev_check(cap_client_t *c, const void *dev, uint64_t bytes,
                       uint64_t seed) {
  uint64_t n = bytes / 8;
  const uint8_t *b = dev;
  int64_t bad = 0;
  if (n == 0) {
    for (uint64_t i = 0; i < bytes; i++)
      bad += b[i] != (uint8_t)mix(seed, i);
    return bad;
  }
  uint64_t v;
  if (c->dev->verify_full) {
    for (uint64_t i = 0; i < n; i++) {
      memcpy(&v, b + 8 * i, 8);
      bad += v != mix(seed, i);
    }
    return bad;
  }
  uint64_t off = seed % SAMPLE_STRIDE_WORDS;
  for (uint64_t i = off; i < n; i += SAMPLE_STRIDE_WORDS) {
    memcpy(&v, b + 8 * i, 8);
    bad += v != mix(seed, i);
  }
  memcpy(&v, b, 8);
  bad += v != mix(seed, 0);
  memcpy(&v, b + 8 * (n - 1), 8);
  bad += v != mix(seed, n - 1);
  return bad;
}
