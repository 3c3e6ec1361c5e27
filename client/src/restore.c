/*
 * Bringing a tensor back for an access: finishing its swap-in (the compute
 * stream waits on the copy's event), fetching it on demand, recomputing it,
 * and falling back to a swap for the rest of the job when an action cannot
 * be carried out. Every state a tensor can be in at an access is handled
 * here, and nowhere else.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

int cap__swap_in_start(cap_client_t *c, uint32_t id, bool may_evict) {
  void *dev = NULL;
  int rc = cap__tmem_alloc(c, id, &dev, may_evict);
  return rc < 0 ? rc : cap__swap_in_to(c, id, dev);
}

int cap__swap_in_to(cap_client_t *c, uint32_t id, void *dev) {
  cap__tensor_t *t = &c->tensors[id];
  cap__ev_t *ev = NULL;
  int rc = cap__copy_h2d(c->dev, dev, t->host, t->bytes, &ev);
  if (rc < 0) {
    cap__tmem_free(c, id, dev);
    return rc;
  }
  t->dev = dev;
  t->ev = ev;
  t->in_start_ns = cap__now_ns(c->dev);
  /* Copies to the device run one at a time in issue order: this one starts
   * when the one before it ends, by the same estimate. */
  int64_t start = t->in_start_ns;
  if (c->h2d_last < c->n_tensors) {
    const cap__tensor_t *prev = &c->tensors[c->h2d_last];
    if (prev->state == CAP__T_IN && prev->in_est_end_ns > start)
      start = prev->in_est_end_ns;
  }
  t->state = CAP__T_IN;
  c->h2d_last = id;
  double gbps = c->h2d_gbps > 0 ? c->h2d_gbps : 1.0;
  t->in_est_end_ns = start + (int64_t)((double)t->bytes / gbps);
  c->it.bytes_in += t->bytes;
  atomic_fetch_add(&c->ctr.bytes_in, t->bytes);
  return 0;
}

/* A plan has every persistent tensor on the device when an iteration
 * starts (one it evicts, in its block of the arena). Those on the host
 * with no action of the plan holding them there (moved out of the
 * region's way when the plan was installed, or by the measured iteration's
 * evictions on demand) start coming back now rather than at their first
 * access: into their block when the plan places them, else from the
 * allocator (not the region's holes, where the plan's blocks go) without
 * evicting anything. Any that cannot come back yet come back at their
 * access. */
void cap__prefetch_persistent(cap_client_t *c) {
  for (uint32_t id = 0; id < c->n_tensors; id++) {
    const cap__tensor_t *t = &c->tensors[id];
    if (t->state != CAP__T_HOST || t->out_action != CAP_NONE || !t->persistent ||
        t->framework)
      continue;
    void *dev = NULL;
    int rc = cap__placement_has(c, id, CAP_RESIDENCY_PERSISTENT, CAP_NONE)
                 ? cap__placed_alloc(c, id, CAP_RESIDENCY_PERSISTENT, CAP_NONE, &dev)
                 : cap__dev_alloc(c->dev, t->bytes ? t->bytes : 1, &dev);
    if (rc == 0) {
      cap__note_peak(c);
      (void)cap__swap_in_to(c, id, dev);
    }
  }
}

static void note_stall(cap_client_t *c, uint32_t id, int64_t stall, bool host) {
  if (stall <= 0)
    return;
  c->it.stalls++;
  atomic_fetch_add(&c->ctr.stalls, 1);
  cap__note_wait(c, stall, host);
  cap__tensor_t *t = &c->tensors[id];
  if (c->mode != CAP_MODE_GUIDED || t->out_action == CAP_NONE)
    return;
  if (c->n_fb == c->cap_fb) {
    uint32_t n = c->cap_fb ? c->cap_fb * 2 : 64;
    cap_feedback_t *f = realloc(c->fb, (size_t)n * sizeof *f);
    if (!f)
      return; /* feedback is advisory */
    c->fb = f;
    c->cap_fb = n;
  }
  c->fb[c->n_fb++] = (cap_feedback_t){id, t->n_access + 1, stall};
}

/* The compute stream waits for a swap-in; the host buffer goes once the copy
 * is done. Where ops run on a device (cuda), the host does not wait: the
 * stall is the copy's estimated lateness, the device's alone. In a measured
 * iteration the host waits instead, so that the wait is timed and left out
 * of the recorded op times rather than inflating a later op's. A failed copy
 * is retried once synchronously (the host copy is still good). */
static int swap_in_finish(cap_client_t *c, uint32_t id) {
  cap__tensor_t *t = &c->tensors[id];
  int64_t stall = 0;
  /* sim: the compute stream's waits block the host already */
  bool sync = c->recording && !cap__dev_host_compute(c->dev);
  bool host = sync || cap__dev_host_compute(c->dev);
  int st = cap__ev_query(c->dev, t->ev);
  if (st == 0) {
    int64_t t0 = cap__now_ns(c->dev);
    st = sync ? cap__ev_sync(c->dev, t->ev)
              : cap__ev_compute_wait(c->dev, t->ev);
    int64_t now = cap__now_ns(c->dev);
    stall = host ? now - t0 : t->in_est_end_ns - now;
  }
  if (st < 0) {
    cap__ev_release(c->dev, t->ev);
    t->ev = NULL;
    cap__ev_t *ev = NULL;
    int rc = cap__copy_h2d(c->dev, t->dev, t->host, t->bytes, &ev);
    if (rc == 0) {
      rc = cap__ev_sync(c->dev, ev);
      cap__ev_release(c->dev, ev);
    }
    if (rc < 0) {
      cap__tmem_free(c, id, t->dev);
      t->dev = NULL;
      t->state = CAP__T_HOST;
      cap__set_error(c, "tensor %u: copy to the device failed twice", id);
      return CAP_EDEVICE;
    }
    c->it.fallbacks++;
    atomic_fetch_add(&c->ctr.fallbacks, 1);
    t->ev = NULL;
    cap__host_free(c->dev, t->host, t->bytes);
  } else if (cap__retire_push(c, t->ev, NULL, t->host, t->bytes, CAP_NONE,
                              CAP_NONE) < 0) {
    cap__ev_sync(c->dev, t->ev);
    cap__ev_release(c->dev, t->ev);
    cap__host_free(c->dev, t->host, t->bytes);
  }
  t->ev = NULL;
  t->host = NULL;
  t->state = CAP__T_DEVICE;
  note_stall(c, id, stall, host);
  return 0;
}

void cap__note_failed(cap_client_t *c, uint32_t tensor, uint32_t access) {
  for (uint32_t i = 0; i < c->n_failed; i++)
    if (c->failed[i].tensor == tensor && c->failed[i].access == access)
      return;
  if (c->n_failed == c->cap_failed) {
    uint32_t n = c->cap_failed ? c->cap_failed * 2 : 16;
    cap__action_key_t *f = realloc(c->failed, (size_t)n * sizeof *f);
    if (!f)
      return; /* this version still falls back; a later one may not */
    c->failed = f;
    c->cap_failed = n;
  }
  c->failed[c->n_failed++] = (cap__action_key_t){tensor, access};
}

/* The eviction in force for tensor id could not be carried out: swap it
 * instead from now on, in this plan version and every later one. */
static void fall_back(cap_client_t *c, uint32_t id) {
  cap__tensor_t *t = &c->tensors[id];
  c->it.fallbacks++;
  atomic_fetch_add(&c->ctr.fallbacks, 1);
  if (!c->x.plan || t->out_action >= c->x.plan->n_actions)
    return;
  const cap_action_t *a = &c->x.plan->actions[t->out_action];
  c->x.fallback[t->out_action] = 1;
  cap__note_failed(c, a->tensor, a->evict_after_access);
}

static int bring_back(cap_client_t *c, uint32_t id, bool is_output) {
  cap__tensor_t *t = &c->tensors[id];
  int rc;
  switch (t->state) {
  case CAP__T_DEVICE:
    return 0;
  case CAP__T_RELEASED:
    /* The plan said the last access had passed; this iteration differs.
     * Later iterations swap it instead of releasing it (fallback); an op
     * that only writes it loses nothing. */
    fall_back(c, id);
    t->state = CAP__T_LOST;
    /* fall through */
  case CAP__T_DECLARED:
  case CAP__T_LOST: {
    /* Lost contents stay lost for every op that reads them (it fails), not
     * only the first: memory given here would hold wrong bytes. */
    if (t->state == CAP__T_LOST && !is_output) {
      cap__set_error(c, "tensor %u: contents were lost (failed recompute)", id);
      return CAP_ERECOMPUTE;
    }
    void *p = NULL;
    rc = cap__tmem_alloc(c, id, &p, true);
    if (rc < 0)
      return rc;
    t->dev = p;
    t->state = CAP__T_DEVICE;
    return 0;
  }
  case CAP__T_OUT: {
    /* Accessed while its swap-out runs: keep the device copy. The copy
     * still reads it, so wait for the copy before the op may write. */
    cap__retire_t *r = cap__retire_of(c, id);
    if (r) {
      int64_t t0 = cap__now_ns(c->dev);
      int st = cap__ev_sync(c->dev, r->ev);
      (void)st;
      note_stall(c, id, cap__now_ns(c->dev) - t0, true);
      r->tensor = CAP_NONE;
      r->dev = NULL;
      r->host = t->host;
      r->host_bytes = t->bytes;
    }
    t->host = NULL;
    t->state = CAP__T_DEVICE;
    return 0;
  }
  case CAP__T_HOST:
    rc = cap__swap_in_start(c, id, true);
    if (rc < 0)
      return rc;
    /* fall through */
  case CAP__T_IN:
    return swap_in_finish(c, id);
  case CAP__T_DROPPED:
    rc = cap__recompute(c, id);
    if (rc < 0) {
      /* The data is gone: the access fails, later iterations swap this
       * tensor instead (fallback), and it gets fresh memory. */
      fall_back(c, id);
      t->state = CAP__T_LOST;
      return CAP_ERECOMPUTE;
    }
    return 0;
  default:
    cap__set_error(c, "tensor %u is not live", id);
    return CAP_EINVAL;
  }
}

#ifndef NDEBUG
/* Where an access may leave a tensor: on the device when it succeeds;
 * when it fails, still where its data is (on the host after a failed
 * swap-in, dropped or lost after a failed recompute, untouched when no
 * memory could be found). */
static bool transition_ok(uint8_t from, uint8_t to, int rc) {
  if (rc == 0)
    return to == CAP__T_DEVICE;
  switch (from) {
  case CAP__T_HOST:
  case CAP__T_IN:
    return to == CAP__T_HOST || to == from;
  case CAP__T_DROPPED:
  case CAP__T_RELEASED:
    return to == CAP__T_LOST || to == CAP__T_DEVICE;
  case CAP__T_LOST:
    return to == CAP__T_LOST || to == CAP__T_DEVICE;
  default:
    return to == from || to == CAP__T_DEVICE;
  }
}
#endif

int cap__ensure_resident(cap_client_t *c, uint32_t id, bool is_output) {
  uint8_t from = c->tensors[id].state;
  int rc = bring_back(c, id, is_output);
  assert(transition_ok(from, c->tensors[id].state, rc));
  (void)from;
  return rc;
}
