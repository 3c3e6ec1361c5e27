/*
 * The plan executor and passive mode: op begin/end on the hot path, plan
 * triggers looked up by (tensor, access) in O(1), swap-outs after the
 * evicted-access, prefetches at in-triggers, waits and recomputation at
 * back-accesses, and LRU swapping on demand when an allocation does not fit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

/* --- Op log (lineage) ------------------------------------------------------- */

int cap__oplog_add(cap__oplog_t *l, const char *name, const uint32_t *in,
                   uint32_t n_in, const uint32_t *out, uint32_t n_out) {
  if (l->n_ops == l->cap_ops) {
    uint32_t n = l->cap_ops ? l->cap_ops * 2 : 1024;
    cap__oplog_op_t *ops = realloc(l->ops, (size_t)n * sizeof *ops);
    if (!ops)
      return CAP_ENOMEM;
    l->ops = ops;
    l->cap_ops = n;
  }
  uint32_t need = n_in + n_out;
  if (l->cap_ids - l->n_ids < need) {
    uint32_t n = l->cap_ids ? l->cap_ids : 4096;
    while (n - l->n_ids < need)
      n *= 2;
    uint32_t *ids = realloc(l->ids, (size_t)n * sizeof *ids);
    if (!ids)
      return CAP_ENOMEM;
    l->ids = ids;
    l->cap_ids = n;
  }
  cap__oplog_op_t *op = &l->ops[l->n_ops++];
  op->name = name;
  op->off = l->n_ids;
  op->n_in = n_in;
  op->n_out = n_out;
  if (n_in)
    memcpy(l->ids + l->n_ids, in, n_in * sizeof *in);
  if (n_out)
    memcpy(l->ids + l->n_ids + n_in, out, n_out * sizeof *out);
  l->n_ids += need;
  return 0;
}

void cap__oplog_close(cap__oplog_t *l) {
  free(l->ops);
  free(l->ids);
  memset(l, 0, sizeof *l);
}

/* --- Plan index ------------------------------------------------------------- */

void cap__x_clear(cap_client_t *c) {
  cap__xplan_t *x = &c->x;
  cap_plan_destroy(x->plan);
  free(x->slot_off);
  free(x->slots);
  free(x->trig);
  free(x->fallback);
  memset(x, 0, sizeof *x);
}

static bool recompute_usable(cap_client_t *c, const cap_plan_t *p,
                             const cap_action_t *a) {
  if (cap_action_is_release(a))
    return true; /* nothing to replay */
  if (!c->recompute || !c->log_last_valid || a->n_recompute == 0)
    return false;
  const uint32_t *ops = cap_action_recompute_ops(p, a);
  for (uint32_t i = 0; i < a->n_recompute; i++)
    if (ops[i] >= c->log_last.n_ops)
      return false;
  /* The last op must produce the tensor. */
  const cap__oplog_op_t *last = &c->log_last.ops[ops[a->n_recompute - 1]];
  const uint32_t *outs = c->log_last.ids + last->off + last->n_in;
  for (uint32_t i = 0; i < last->n_out; i++)
    if (outs[i] == a->tensor)
      return true;
  return false;
}

/* Build the (tensor, access) index of a plan and make it the installed one.
 * Takes ownership of plan. Actions naming unknown tensors are refused as a
 * whole (the plan was made for another job). */
int cap__x_install(cap_client_t *c, cap_plan_t *plan) {
  int rc = CAP_ENOMEM;
  cap__xplan_t x = {0};
  uint32_t nt = c->n_tensors;
  uint32_t *maxk = NULL, *ntrig = NULL;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->tensor >= nt || a->evict_after_access == 0 ||
        a->evict_after_access == UINT32_MAX ||
        (a->method == CAP_METHOD_SWAP && a->prefetch_tensor != CAP_NONE &&
         (a->prefetch_tensor >= nt || a->prefetch_access == 0)) ||
        (a->method != CAP_METHOD_SWAP && a->method != CAP_METHOD_RECOMPUTE) ||
        (a->method == CAP_METHOD_RECOMPUTE &&
         (uint64_t)a->recompute_off + a->n_recompute > plan->n_recompute_ops)) {
      cap__set_error(c, "plan v%u: action %u (tensor %u) does not fit this job",
                     plan->version, i, a->tensor);
      cap_plan_destroy(plan);
      return CAP_EINVAL;
    }
  }
  maxk = calloc(nt ? nt : 1, sizeof *maxk);
  ntrig = calloc(nt ? nt : 1, sizeof *ntrig);
  x.slot_off = calloc((size_t)nt + 1, sizeof *x.slot_off);
  x.fallback = calloc(plan->n_actions ? plan->n_actions : 1, 1);
  if (!maxk || !ntrig || !x.slot_off || !x.fallback)
    goto out;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->evict_after_access > maxk[a->tensor])
      maxk[a->tensor] = a->evict_after_access;
    if (a->method == CAP_METHOD_SWAP && a->prefetch_tensor != CAP_NONE &&
        a->prefetch_access > maxk[a->prefetch_tensor])
      maxk[a->prefetch_tensor] = a->prefetch_access;
    if (a->method == CAP_METHOD_RECOMPUTE && !recompute_usable(c, plan, a))
      x.fallback[i] = 1;
    for (uint32_t f = 0; f < c->n_failed; f++)
      if (c->failed[f].tensor == a->tensor &&
          c->failed[f].access == a->evict_after_access)
        x.fallback[i] = 1;
  }
  uint64_t total = 0;
  for (uint32_t t = 0; t < nt; t++) {
    x.slot_off[t] = (uint32_t)total;
    total += maxk[t];
  }
  x.slot_off[nt] = (uint32_t)total;
  x.slots = malloc((total ? total : 1) * sizeof *x.slots);
  x.trig = malloc((plan->n_actions ? plan->n_actions : 1) * sizeof *x.trig);
  if (!x.slots || !x.trig)
    goto out;
  for (uint64_t s = 0; s < total; s++)
    x.slots[s] = (cap__slot_t){CAP_NONE, 0, 0};
  /* Count triggers per slot, then lay them out. */
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    cap__slot_t *s = &x.slots[x.slot_off[a->tensor] + a->evict_after_access - 1];
    if (s->evict != CAP_NONE) {
      cap__set_error(c, "plan v%u: two actions evict tensor %u after access %u",
                     plan->version, a->tensor, a->evict_after_access);
      rc = CAP_EINVAL;
      goto out;
    }
    s->evict = i;
    if (a->method == CAP_METHOD_SWAP && a->prefetch_tensor != CAP_NONE)
      x.slots[x.slot_off[a->prefetch_tensor] + a->prefetch_access - 1].n_trig++;
  }
  uint32_t off = 0;
  for (uint64_t s = 0; s < total; s++) {
    x.slots[s].trig_off = off;
    off += x.slots[s].n_trig;
    x.slots[s].n_trig = 0;
  }
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->method == CAP_METHOD_SWAP && a->prefetch_tensor != CAP_NONE) {
      cap__slot_t *s =
          &x.slots[x.slot_off[a->prefetch_tensor] + a->prefetch_access - 1];
      x.trig[s->trig_off + s->n_trig++] = i;
    }
  }
  x.plan = plan;
  x.n_tensors = nt;
  cap__x_clear(c);
  c->x = x;
  free(maxk);
  free(ntrig);
  return 0;
out:
  free(maxk);
  free(ntrig);
  free(x.slot_off);
  free(x.slots);
  free(x.trig);
  free(x.fallback);
  cap_plan_destroy(plan);
  return rc;
}

static inline const cap__slot_t *slot_at(const cap__xplan_t *x, uint32_t t,
                                         uint32_t k) {
  if (t >= x->n_tensors)
    return NULL;
  uint32_t off = x->slot_off[t], n = x->slot_off[t + 1] - off;
  if (k == 0 || k > n)
    return NULL;
  return &x->slots[off + k - 1];
}

/* --- Deferred releases ------------------------------------------------------ */

static int retire_push(cap_client_t *c, cap__ev_t *ev, void *dev, void *host,
                       uint64_t host_bytes, uint32_t tensor) {
  if (c->n_retire == c->cap_retire) {
    uint32_t n = c->cap_retire ? c->cap_retire * 2 : 64;
    cap__retire_t *r = realloc(c->retire, (size_t)n * sizeof *r);
    if (!r)
      return CAP_ENOMEM;
    c->retire = r;
    c->cap_retire = n;
  }
  c->retire[c->n_retire++] =
      (cap__retire_t){ev, dev, host, host_bytes, tensor};
  return 0;
}

static void retire_finish(cap_client_t *c, cap__retire_t *r, int status) {
  if (r->tensor != CAP_NONE) {
    /* A swap-out: on success the device copy goes; on failure the device
     * copy is the only one, so it stays and the host buffer goes. */
    cap__tensor_t *t = &c->tensors[r->tensor];
    if (status >= 0) {
      t->state = CAP__T_HOST;
      cap__dev_free(c, r->dev);
      t->dev = NULL;
    } else {
      t->state = CAP__T_DEVICE;
      cap__host_free(c, t->host, t->bytes);
      t->host = NULL;
      atomic_fetch_add(&c->ctr.fallbacks, 1);
      c->it.fallbacks++;
    }
    atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c));
  } else {
    if (r->dev)
      cap__dev_free(c, r->dev);
    if (r->host)
      cap__host_free(c, r->host, r->host_bytes);
  }
  cap__ev_release(c, r->ev);
}

void cap__reap(cap_client_t *c, bool wait_all) {
  uint32_t j = 0;
  for (uint32_t i = 0; i < c->n_retire; i++) {
    cap__retire_t *r = &c->retire[i];
    int st = wait_all ? cap__ev_sync(c, r->ev) : cap__ev_query(c, r->ev);
    if (wait_all && st == 0)
      st = 1;
    if (st != 0) {
      retire_finish(c, r, st);
    } else {
      c->retire[j++] = *r;
    }
  }
  c->n_retire = j;
}

static cap__retire_t *retire_of(cap_client_t *c, uint32_t tensor) {
  for (uint32_t i = 0; i < c->n_retire; i++)
    if (c->retire[i].tensor == tensor)
      return &c->retire[i];
  return NULL;
}

/* Wait for the oldest pending swap-out that frees device memory. */
static bool wait_one_out(cap_client_t *c) {
  for (uint32_t i = 0; i < c->n_retire; i++) {
    cap__retire_t *r = &c->retire[i];
    if (r->tensor != CAP_NONE || r->dev) {
      int64_t t0 = cap__now_ns(c);
      int st = cap__ev_sync(c, r->ev);
      int64_t w = cap__now_ns(c) - t0;
      c->it.stall_ns += w;
      c->it.budget_waits++;
      atomic_fetch_add(&c->ctr.stall_ns, w);
      retire_finish(c, r, st < 0 ? st : 1);
      memmove(r, r + 1, (c->n_retire - i - 1) * sizeof *r);
      c->n_retire--;
      return true;
    }
  }
  return false;
}

/* --- Evictions -------------------------------------------------------------- */

static int swap_out(cap_client_t *c, uint32_t id, uint32_t action, bool sync) {
  cap__tensor_t *t = &c->tensors[id];
  void *host = NULL;
  cap__ev_t *ev = NULL;
  int rc = cap__host_alloc(c, t->bytes, &host);
  if (rc < 0)
    return rc;
  rc = cap__copy_d2h(c, host, t->dev, t->bytes, &ev);
  if (rc < 0)
    goto out_free_host;
  if (sync) {
    int64_t t0 = cap__now_ns(c);
    rc = cap__ev_sync(c, ev);
    int64_t w = cap__now_ns(c) - t0;
    c->it.stall_ns += w;
    atomic_fetch_add(&c->ctr.stall_ns, w);
    cap__ev_release(c, ev);
    if (rc < 0)
      goto out_free_host;
    cap__dev_free(c, t->dev);
    t->dev = NULL;
    t->host = host;
    t->state = CAP__T_HOST;
    atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c));
  } else {
    rc = retire_push(c, ev, t->dev, NULL, 0, id);
    if (rc < 0) {
      cap__ev_sync(c, ev);
      cap__ev_release(c, ev);
      goto out_free_host;
    }
    t->host = host;
    t->state = CAP__T_OUT;
  }
  t->out_action = action;
  t->prefetch_due = 0;
  t->gone_op = c->op_seq ? c->op_seq - 1 : 0;
  c->it.bytes_out += t->bytes;
  c->it.evictions++;
  atomic_fetch_add(&c->ctr.bytes_out, t->bytes);
  atomic_fetch_add(&c->ctr.evictions, 1);
  return 0;
out_free_host:
  cap__host_free(c, host, t->bytes);
  return rc;
}

/* Passive mode: swap out the least recently used evictable tensor
 * synchronously. false when none is left. */
static bool evict_lru(cap_client_t *c) {
  uint32_t best = CAP_NONE;
  uint64_t best_lru = UINT64_MAX;
  /* Transient tensors first; persistent ones (weights, optimizer state)
   * only when nothing else is left, e.g. an optimizer op whose own tensors
   * fill the budget: the job goes on rather than fail. */
  for (int pass = 0; pass < 2 && best == CAP_NONE; pass++) {
    for (uint32_t i = 0; i < c->n_tensors; i++) {
      const cap__tensor_t *t = &c->tensors[i];
      if (t->state == CAP__T_DEVICE && t->persistent == pass && !t->pinned &&
          t->lru < best_lru) {
        best = i;
        best_lru = t->lru;
      }
    }
  }
  if (best == CAP_NONE)
    return false;
  if (swap_out(c, best, CAP_NONE, true) != 0)
    return false;
  c->it.lru_evictions++;
  return true;
}

/* Fragmentation: the budget has room but no free chunk is big enough.
 * Swap out the few tensors that sit between free chunks (the cheapest run,
 * cap_bfc_find_window) instead of LRU victims that may lie anywhere. */
typedef struct {
  const void *ptr;
  uint32_t id;
  uint32_t weight; /* 1 least recently used .. 16 most */
  uint64_t lru;
} dev_owner_t;

static int owner_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const dev_owner_t *)a)->ptr;
  uintptr_t y = (uintptr_t)((const dev_owner_t *)b)->ptr;
  return x < y ? -1 : x > y;
}

typedef struct {
  dev_owner_t *v;
  uint32_t n;
} owners_t;

static const dev_owner_t *owner_of(const owners_t *o, const void *ptr) {
  dev_owner_t key = {ptr, 0, 0, 0};
  return bsearch(&key, o->v, o->n, sizeof *o->v, owner_cmp);
}

static int lru_cmp(const void *a, const void *b) {
  uint64_t x = ((const dev_owner_t *)a)->lru, y = ((const dev_owner_t *)b)->lru;
  return x < y ? -1 : x > y;
}

/* Bytes weighted by recency: a run of cold tensors beats a slightly
 * smaller run of tensors the next ops are likely to read. */
static uint32_t owner_weight(void *ctx, const void *ptr) {
  const dev_owner_t *w = owner_of(ctx, ptr);
  return w ? w->weight : 0;
}

#define DEFRAG_MAX 64u /* tensors one window may evict */

static bool evict_window(cap_client_t *c, uint64_t bytes) {
  owners_t o = {malloc((c->n_tensors ? c->n_tensors : 1) * sizeof *o.v), 0};
  if (!o.v)
    return false;
  for (uint32_t i = 0; i < c->n_tensors; i++) {
    const cap__tensor_t *t = &c->tensors[i];
    if (t->state == CAP__T_DEVICE && !t->pinned && t->dev)
      o.v[o.n++] = (dev_owner_t){t->dev, i, 0, t->lru};
  }
  /* recency rank -> weight 1..16 */
  qsort(o.v, o.n, sizeof *o.v, lru_cmp);
  for (uint32_t i = 0; i < o.n; i++)
    o.v[i].weight = 1 + (uint32_t)((uint64_t)i * 16 / (o.n ? o.n : 1));
  qsort(o.v, o.n, sizeof *o.v, owner_cmp);
  void *win[DEFRAG_MAX];
  int n = cap__dev_find_window(c, bytes, owner_weight, &o, win, DEFRAG_MAX);
  bool ok = n > 0;
  for (int i = 0; i < n && ok; i++) {
    const dev_owner_t *w = owner_of(&o, win[i]);
    ok = w && swap_out(c, w->id, CAP_NONE, true) == 0;
    if (ok)
      c->it.lru_evictions++;
  }
  free(o.v);
  return ok;
}

int cap__alloc_for(cap_client_t *c, uint64_t bytes, void **p, bool may_evict) {
  for (;;) {
    int rc = cap__dev_alloc(c, bytes, p);
    if (rc == 0) {
      cap__note_peak(c);
      return 0;
    }
    if (rc != CAP_EBUDGET)
      return rc;
    /* Memory that finished copies hold comes back first, then memory that
     * running swap-outs will release, and only then do we swap out more. */
    uint32_t before = c->n_retire;
    cap__reap(c, false);
    if (c->n_retire != before)
      continue;
    if (wait_one_out(c))
      continue;
    if (may_evict && cap__dev_budget_has_room(c, bytes) &&
        evict_window(c, bytes))
      continue;
    if (!may_evict || !evict_lru(c)) {
      cap__set_error(c, "allocation of %llu bytes does not fit the budget of "
                        "%llu bytes (%llu in use)",
                     (unsigned long long)bytes,
                     (unsigned long long)c->budget_bytes,
                     (unsigned long long)cap__dev_in_use(c));
      return CAP_EBUDGET;
    }
  }
}

/* --- Bringing tensors back -------------------------------------------------- */

static int swap_in_start(cap_client_t *c, uint32_t id, bool may_evict) {
  cap__tensor_t *t = &c->tensors[id];
  void *dev = NULL;
  cap__ev_t *ev = NULL;
  int rc = cap__alloc_for(c, t->bytes, &dev, may_evict);
  if (rc < 0)
    return rc;
  rc = cap__copy_h2d(c, dev, t->host, t->bytes, &ev);
  if (rc < 0) {
    cap__dev_free(c, dev);
    return rc;
  }
  t->dev = dev;
  t->ev = ev;
  t->state = CAP__T_IN;
  t->in_start_ns = cap__now_ns(c);
  double gbps = c->h2d_gbps > 0 ? c->h2d_gbps : 1.0;
  t->in_est_end_ns = t->in_start_ns + (int64_t)((double)t->bytes / gbps);
  c->it.bytes_in += t->bytes;
  atomic_fetch_add(&c->ctr.bytes_in, t->bytes);
  return 0;
}

static void note_stall(cap_client_t *c, uint32_t id, int64_t stall) {
  if (stall <= 0)
    return;
  c->it.stalls++;
  c->it.stall_ns += stall;
  atomic_fetch_add(&c->ctr.stalls, 1);
  atomic_fetch_add(&c->ctr.stall_ns, stall);
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
 * is done. A failed copy is retried once synchronously (the host copy is
 * still good). */
static int swap_in_finish(cap_client_t *c, uint32_t id) {
  cap__tensor_t *t = &c->tensors[id];
  int64_t stall = 0;
  int st = cap__ev_query(c, t->ev);
  if (st == 0) {
    int64_t t0 = cap__now_ns(c);
    st = cap__ev_compute_wait(c, t->ev);
    int64_t now = cap__now_ns(c);
    stall = cap__dev_host_compute(c) ? now - t0 : t->in_est_end_ns - now;
  }
  if (st < 0) {
    cap__ev_release(c, t->ev);
    t->ev = NULL;
    cap__ev_t *ev = NULL;
    int rc = cap__copy_h2d(c, t->dev, t->host, t->bytes, &ev);
    if (rc == 0) {
      rc = cap__ev_sync(c, ev);
      cap__ev_release(c, ev);
    }
    if (rc < 0) {
      cap__dev_free(c, t->dev);
      t->dev = NULL;
      t->state = CAP__T_HOST;
      cap__set_error(c, "tensor %u: copy to the device failed twice", id);
      return CAP_EDEVICE;
    }
    c->it.fallbacks++;
    atomic_fetch_add(&c->ctr.fallbacks, 1);
    t->ev = NULL;
    cap__host_free(c, t->host, t->bytes);
  } else if (retire_push(c, t->ev, NULL, t->host, t->bytes, CAP_NONE) < 0) {
    cap__ev_sync(c, t->ev);
    cap__ev_release(c, t->ev);
    cap__host_free(c, t->host, t->bytes);
  }
  t->ev = NULL;
  t->host = NULL;
  t->state = CAP__T_DEVICE;
  note_stall(c, id, stall);
  return 0;
}

static int ensure_resident(cap_client_t *c, uint32_t id, bool is_output);

/* Why a listed op's input is not there, in the words of
 * docs/plan-semantics.md; NULL when it is there (or coming back). */
static const char *missing_reason(const cap__tensor_t *u) {
  switch (u->state) {
  case CAP__T_DEVICE:
  case CAP__T_IN: /* prefetch issued: the replay waits for it */
    return NULL;
  case CAP__T_OUT: /* swap-out running (the device copy is still there) */
  case CAP__T_HOST:
    /* Its prefetch fired but found no room, or the client evicted it on
     * its own (no plan action) for lack of room: fetched now. A plan that
     * swapped it without a prefetch by now is wrong, whether or not the
     * copy out has finished. */
    if (u->prefetch_due || u->out_action == CAP_NONE)
      return NULL;
    return "swapped out, with no prefetch issued by then";
  case CAP__T_DROPPED:
    return "dropped by the plan and not recomputed earlier in the list";
  case CAP__T_RELEASED:
    return "released by the plan";
  case CAP__T_LOST:
    return "lost (an earlier recompute of it failed)";
  default:
    return "freed by the framework";
  }
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
  for (uint32_t i = 0; i < c->n_failed; i++)
    if (c->failed[i].tensor == a->tensor &&
        c->failed[i].access == a->evict_after_access)
      return;
  if (c->n_failed == c->cap_failed) {
    uint32_t n = c->cap_failed ? c->cap_failed * 2 : 16;
    cap__action_key_t *f = realloc(c->failed, (size_t)n * sizeof *f);
    if (!f)
      return; /* this version still falls back; a later one may not */
    c->failed = f;
    c->cap_failed = n;
  }
  c->failed[c->n_failed++] =
      (cap__action_key_t){a->tensor, a->evict_after_access};
}

/* A list's outputs that are not live tensors, kept until the list ends
 * because a later listed op may read them. */
typedef struct list_temp {
  uint32_t id;
  void *ptr;
} list_temp_t;

typedef struct list_run {
  list_temp_t *temps;
  uint32_t n_temps, cap_temps;
  uint32_t *restored; /* tensors the list brought back to the device */
  uint32_t n_restored, cap_restored;
} list_run_t;

static void *temp_of(const list_run_t *r, uint32_t id) {
  for (uint32_t i = 0; i < r->n_temps; i++)
    if (r->temps[i].id == id)
      return r->temps[i].ptr;
  return NULL;
}

static int push_u32(uint32_t **v, uint32_t *n, uint32_t *cap, uint32_t x) {
  if (*n == *cap) {
    uint32_t nc = *cap ? *cap * 2 : 16;
    uint32_t *nv = realloc(*v, (size_t)nc * sizeof *nv);
    if (!nv)
      return CAP_ENOMEM;
    *v = nv;
    *cap = nc;
  }
  (*v)[(*n)++] = x;
  return 0;
}

static int push_temp(list_run_t *r, uint32_t id, void *ptr) {
  if (r->n_temps == r->cap_temps) {
    uint32_t nc = r->cap_temps ? r->cap_temps * 2 : 16;
    list_temp_t *nt = realloc(r->temps, (size_t)nc * sizeof *nt);
    if (!nt)
      return CAP_ENOMEM;
    r->temps = nt;
    r->cap_temps = nc;
  }
  r->temps[r->n_temps++] = (list_temp_t){id, ptr};
  return 0;
}

/* Device pointers for one listed op: inputs from earlier listed ops'
 * temporaries or from the device (waiting for a prefetch in flight), outputs
 * into restored tensors or fresh temporaries. Pins what it reads; *n_pin
 * counts the leading ids pinned. */
static int bind_op(cap_client_t *c, uint32_t id, uint32_t list_op,
                   const cap__oplog_op_t *op, const uint32_t *ids, void **ptrs,
                   uint8_t *pinned, list_run_t *r) {
  uint32_t n = op->n_in + op->n_out;
  for (uint32_t j = 0; j < n; j++) {
    uint32_t tid = ids[j];
    if (tid >= c->n_tensors) {
      cap__set_error(c, "op %u %s: recompute of tensor %u: listed op %u names "
                        "unknown tensor %u",
                     c->op_seq, c->op_name, id, list_op, tid);
      return CAP_ERECOMPUTE;
    }
    cap__tensor_t *u = &c->tensors[tid];
    bool is_out = j >= op->n_in, in_too = false;
    for (uint32_t k = 0; k < op->n_in && is_out; k++)
      in_too |= ids[k] == tid;
    void *tp = temp_of(r, tid);
    if (tp) { /* produced earlier in the list */
      ptrs[j] = tp;
      continue;
    }
    if (!is_out || in_too) {
      const char *why = missing_reason(u);
      if (why) {
        cap__set_error(c, "op %u %s: recompute of tensor %u (action %u): op "
                          "%u (%s) needs tensor %u, %s (after op %u)",
                       c->op_seq, c->op_name, id, c->tensors[id].out_action,
                       list_op, op->name ? op->name : "?", tid, why,
                       u->gone_op);
        return CAP_ERECOMPUTE;
      }
      int rc = ensure_resident(c, tid, false);
      if (rc < 0)
        return rc;
      ptrs[j] = u->dev;
      u->pinned++;
      pinned[j] = 1;
      continue;
    }
    void *p = NULL;
    int rc = cap__alloc_for(c, u->bytes ? u->bytes : 1, &p, true);
    if (rc < 0)
      return rc;
    ptrs[j] = p;
    if (tid == id || u->state == CAP__T_DROPPED) {
      /* restored for good (DESIGN.md: one replay restores every dropped
       * tensor of the segment), filled by the callback */
      rc = push_u32(&r->restored, &r->n_restored, &r->cap_restored, tid);
      if (rc < 0) {
        cap__dev_free(c, p);
        return rc;
      }
      u->dev = p;
      u->state = CAP__T_DEVICE;
      u->lru = ++c->tick;
      u->pinned++;
      pinned[j] = 1;
    } else if ((rc = push_temp(r, tid, p)) < 0) {
      /* the live tensor, if any, is not touched */
      cap__dev_free(c, p);
      return rc;
    }
  }
  return 0;
}

/* Replay the lineage ops of a dropped tensor through the framework, exactly
 * as the plan lists them: every input of a listed op is an output of an
 * earlier listed op or on the device (docs/plan-semantics.md). Nothing is
 * recomputed implicitly; a missing input fails the list with a message
 * naming the op, the tensor, the action and the reason, and the list leaves
 * nothing behind. */
static int recompute(cap_client_t *c, uint32_t id) {
  cap__tensor_t *t = &c->tensors[id];
  const cap__xplan_t *x = &c->x;
  if (!x->plan || t->out_action >= x->plan->n_actions || !c->recompute ||
      !c->log_last_valid) {
    cap__set_error(c, "op %u %s: recompute of tensor %u: %s", c->op_seq,
                   c->op_name, id,
                   !c->recompute ? "no recompute callback"
                                 : "no lineage from the last iteration");
    return CAP_ERECOMPUTE;
  }
  const cap_action_t *a = &x->plan->actions[t->out_action];
  const uint32_t *ops = cap_action_recompute_ops(x->plan, a);
  list_run_t r = {0};
  int rc = 0;
  for (uint32_t i = 0; i < a->n_recompute && rc == 0; i++) {
    if (ops[i] >= c->log_last.n_ops) {
      cap__set_error(c, "op %u %s: recompute of tensor %u (action %u) lists "
                        "op %u, beyond the last iteration's %u ops",
                     c->op_seq, c->op_name, id, t->out_action, ops[i],
                     c->log_last.n_ops);
      rc = CAP_ERECOMPUTE;
      break;
    }
    const cap__oplog_op_t *op = &c->log_last.ops[ops[i]];
    const uint32_t *ids = c->log_last.ids + op->off;
    uint32_t n = op->n_in + op->n_out;
    void **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    uint8_t *pinned = calloc(n ? n : 1, 1);
    if (!ptrs || !pinned) {
      rc = CAP_ENOMEM;
    } else {
      rc = bind_op(c, id, ops[i], op, ids, ptrs, pinned, &r);
      if (rc == 0) {
        int cb = c->recompute(c->recompute_user, ops[i], op->name, ids, ptrs,
                              op->n_in, ids + op->n_in, ptrs + op->n_in,
                              op->n_out);
        if (cb < 0) {
          cap__set_error(c, "op %u %s: recompute of tensor %u: the callback "
                            "failed on op %u %s (%d)",
                         c->op_seq, c->op_name, id, ops[i],
                         op->name ? op->name : "?", cb);
          rc = CAP_ERECOMPUTE;
        } else {
          c->it.recomputed_ops++;
          atomic_fetch_add(&c->ctr.recomputed_ops, 1);
        }
      }
      for (uint32_t j = 0; j < n; j++)
        if (pinned[j] && c->tensors[ids[j]].pinned)
          c->tensors[ids[j]].pinned--;
    }
    free(ptrs);
    free(pinned);
  }
  if (rc == 0 && t->state != CAP__T_DEVICE) {
    cap__set_error(c, "op %u %s: recompute of tensor %u (action %u): its "
                      "list does not produce it",
                   c->op_seq, c->op_name, id, t->out_action);
    rc = CAP_ERECOMPUTE;
  }
  for (uint32_t i = 0; i < r.n_temps; i++)
    cap__dev_free(c, r.temps[i].ptr);
  for (uint32_t i = 0; i < r.n_restored && rc < 0; i++) {
    cap__tensor_t *u = &c->tensors[r.restored[i]];
    if (u->state == CAP__T_DEVICE) {
      cap__dev_free(c, u->dev);
      u->dev = NULL;
      u->state = CAP__T_DROPPED;
    }
  }
  free(r.temps);
  free(r.restored);
  atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c));
  return rc < 0 ? CAP_ERECOMPUTE : 0;
}

static int ensure_resident(cap_client_t *c, uint32_t id, bool is_output) {
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
    void *p = NULL;
    rc = cap__alloc_for(c, t->bytes ? t->bytes : 1, &p, true);
    if (rc < 0)
      return rc;
    t->dev = p;
    bool lost = t->state == CAP__T_LOST;
    t->state = CAP__T_DEVICE;
    if (lost && !is_output) {
      cap__set_error(c, "tensor %u: contents were lost (failed recompute)", id);
      return CAP_ERECOMPUTE;
    }
    return 0;
  }
  case CAP__T_OUT: {
    /* Accessed while its swap-out runs: keep the device copy. The copy
     * still reads it, so wait for the copy before the op may write. */
    cap__retire_t *r = retire_of(c, id);
    if (r) {
      int64_t t0 = cap__now_ns(c);
      int st = cap__ev_sync(c, r->ev);
      (void)st;
      note_stall(c, id, cap__now_ns(c) - t0);
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
    rc = swap_in_start(c, id, true);
    if (rc < 0)
      return rc;
    /* fall through */
  case CAP__T_IN:
    return swap_in_finish(c, id);
  case CAP__T_DROPPED:
    rc = recompute(c, id);
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

/* --- Hot path --------------------------------------------------------------- */

static void start_prefetches(cap_client_t *c, const cap__slot_t *s) {
  for (uint32_t i = 0; i < s->n_trig; i++) {
    uint32_t ai = c->x.trig[s->trig_off + i];
    const cap_action_t *a = &c->x.plan->actions[ai];
    cap__tensor_t *u = &c->tensors[a->tensor];
    if (u->out_action == ai)
      u->prefetch_due = 1;
    if (u->state == CAP__T_OUT) {
      /* Its swap-out is still running: finish it first (rare; the plan put
       * the trigger before the swap-out's end). */
      cap__retire_t *r = retire_of(c, a->tensor);
      if (!r)
        continue;
      int st = cap__ev_sync(c, r->ev);
      retire_finish(c, r, st < 0 ? st : 1);
      *r = c->retire[--c->n_retire];
    }
    if (u->state != CAP__T_HOST || u->out_action != ai)
      continue;
    /* A prefetch never evicts others: if it does not fit now it becomes an
     * on-demand copy at the back-access. */
    (void)swap_in_start(c, a->tensor, false);
  }
}

int cap__op_begin(cap_client_t *c, const char *name, const uint32_t *in,
                  uint32_t n_in, const uint32_t *out, uint32_t n_out,
                  void **in_ptrs, void **out_ptrs) {
  if (!c->in_iter || c->op_open) {
    cap__set_error(c, c->op_open ? "op begin: an op is already open"
                                 : "op begin outside an iteration");
    return CAP_ESTATE;
  }
  if (!name || !*name || n_in > CAP__MAX_OP_TENSORS ||
      n_out > CAP__MAX_OP_TENSORS || (n_in && !in) || (n_out && !out)) {
    cap__set_error(c, "op begin: bad arguments");
    return CAP_EINVAL;
  }
  c->op_name = name; /* named in errors of the restores below */
  /* Unique tensors of the op: an op listing one on both sides is one
   * access. pinned doubles as the "already seen" mark. */
  uint32_t nu = 0;
  int rc = 0;
  for (uint32_t i = 0; i < n_in + n_out; i++) {
    uint32_t id = i < n_in ? in[i] : out[i - n_in];
    if (id >= c->n_tensors || c->tensors[id].state == CAP__T_UNUSED) {
      cap__set_error(c, "op %s: tensor %u is not live", name, id);
      rc = CAP_EINVAL;
      goto out_unpin;
    }
    cap__tensor_t *t = &c->tensors[id];
    if (t->pinned && i >= n_in) {
      bool dup = false;
      for (uint32_t j = 0; j < nu && !dup; j++)
        dup = c->op_ids[j] == id;
      if (dup)
        continue;
    } else if (t->pinned) {
      bool dup = false;
      for (uint32_t j = 0; j < nu && !dup; j++)
        dup = c->op_ids[j] == id;
      if (dup)
        continue;
    }
    t->pinned++;
    c->op_ids[nu++] = id;
  }
  /* docs/plan-semantics.md: the op's own swap-ins are issued first (they
   * overlap the recomputes), then its dropped tensors are recomputed, the op
   * waits for its copies, and as it starts it fires the prefetches it
   * triggers. */
  for (uint32_t i = 0; i < nu; i++)
    if (c->tensors[c->op_ids[i]].state == CAP__T_HOST)
      (void)swap_in_start(c, c->op_ids[i], true); /* else: below, again */
  for (uint32_t i = 0; i < nu; i++) {
    uint32_t id = c->op_ids[i];
    if (c->tensors[id].state != CAP__T_DEVICE) {
      bool is_out = false;
      for (uint32_t j = 0; j < n_out && !is_out; j++)
        is_out = out[j] == id;
      rc = ensure_resident(c, id, is_out);
      if (rc < 0)
        goto out_unpin;
    }
  }
  if (c->x.plan && c->mode == CAP_MODE_GUIDED) {
    for (uint32_t i = 0; i < nu; i++) {
      const cap__slot_t *s =
          slot_at(&c->x, c->op_ids[i], c->tensors[c->op_ids[i]].n_access + 1);
      if (s && s->n_trig)
        start_prefetches(c, s);
    }
  }
  for (uint32_t i = 0; i < nu; i++) {
    cap__tensor_t *t = &c->tensors[c->op_ids[i]];
    t->n_access++;
    t->lru = ++c->tick;
  }
  if (in_ptrs)
    for (uint32_t i = 0; i < n_in; i++)
      in_ptrs[i] = c->tensors[in[i]].dev;
  if (out_ptrs)
    for (uint32_t i = 0; i < n_out; i++)
      out_ptrs[i] = c->tensors[out[i]].dev;
  if (!c->log_failed &&
      cap__oplog_add(&c->log_cur, name, in, n_in, out, n_out) < 0)
    c->log_failed = true; /* no lineage from this iteration */
  c->op_n_unique = nu;
  c->op_name = name;
  c->op_in = in;
  c->op_out = out;
  c->op_n_in = n_in;
  c->op_n_out = n_out;
  c->op_open = true;
  c->op_start_ns = cap__now_ns(c);
  return 0;
out_unpin:
  for (uint32_t i = 0; i < nu; i++)
    if (c->tensors[c->op_ids[i]].pinned)
      c->tensors[c->op_ids[i]].pinned--;
  /* The framework skips this op: the iteration's op sequence no longer
   * matches the profile's (no lineage, no measurement from it). */
  c->iter_op_errors++;
  c->it.op_errors++;
  if (!c->it.first_error[0])
    snprintf(c->it.first_error, sizeof c->it.first_error, "%s", c->err);
  return rc;
}

int cap__op_end(cap_client_t *c) {
  if (!c->op_open) {
    cap__set_error(c, "op end without op begin");
    return CAP_ESTATE;
  }
  int64_t t1 = cap__now_ns(c);
  if (c->recording) {
    if (c->decl_next < c->n_tensors)
      cap__decl_upto(c, c->n_tensors - 1);
    /* The profile is the framework's timeline: time the client itself
     * stalled (passive swapping) is taken out. */
    int64_t base = c->iter_start_ns + c->it.stall_ns;
    int64_t s = c->op_start_ns - base, e = t1 - base;
    if (s < 0)
      s = 0;
    if (e < s)
      e = s;
    if (!cap__rec_op(c, c->op_seq, s, e, c->op_name, c->op_in, c->op_n_in,
                     c->op_out, c->op_n_out))
      c->it.dropped_records++;
  }
  c->op_open = false;
  c->op_seq++;
  bool guided = c->x.plan && c->mode == CAP_MODE_GUIDED;
  for (uint32_t i = 0; i < c->op_n_unique; i++) {
    uint32_t id = c->op_ids[i];
    cap__tensor_t *t = &c->tensors[id];
    if (t->pinned)
      t->pinned--;
    if (!guided)
      continue;
    const cap__slot_t *s = slot_at(&c->x, id, t->n_access);
    if (!s || s->evict == CAP_NONE || t->state != CAP__T_DEVICE || t->pinned)
      continue;
    uint32_t ai = s->evict;
    const cap_action_t *a = &c->x.plan->actions[ai];
    if (a->method == CAP_METHOD_RECOMPUTE && !c->x.fallback[ai]) {
      cap__dev_free(c, t->dev);
      t->dev = NULL;
      t->state = cap_action_is_release(a) ? CAP__T_RELEASED : CAP__T_DROPPED;
      t->out_action = ai;
      t->gone_op = c->op_seq - 1;
      c->it.evictions++;
      atomic_fetch_add(&c->ctr.evictions, 1);
      atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c));
    } else if (swap_out(c, id, ai, (a->flags & CAP_ACTION_SYNC_OUT) != 0) < 0) {
      /* No pinned memory or the copy refused: keep it on the device. */
      c->it.fallbacks++;
      atomic_fetch_add(&c->ctr.fallbacks, 1);
    }
  }
  if (c->n_retire)
    cap__reap(c, false);
  return 0;
}

int cap__release_tensor(cap_client_t *c, uint32_t id) {
  cap__tensor_t *t = &c->tensors[id];
  switch (t->state) {
  case CAP__T_DEVICE:
  case CAP__T_LOST:
    if (t->dev)
      cap__dev_free(c, t->dev);
    break;
  case CAP__T_OUT: {
    cap__retire_t *r = retire_of(c, id);
    if (r) {
      r->tensor = CAP_NONE;
      r->host = t->host;
      r->host_bytes = t->bytes;
    }
    break;
  }
  case CAP__T_HOST:
    cap__host_free(c, t->host, t->bytes);
    break;
  case CAP__T_IN:
    if (retire_push(c, t->ev, t->dev, t->host, t->bytes, CAP_NONE) < 0) {
      cap__ev_sync(c, t->ev);
      cap__ev_release(c, t->ev);
      cap__dev_free(c, t->dev);
      cap__host_free(c, t->host, t->bytes);
    }
    break;
  default:
    break;
  }
  t->dev = NULL;
  t->host = NULL;
  t->ev = NULL;
  t->state = CAP__T_UNUSED;
  t->pinned = 0;
  t->gone_op = c->op_seq ? c->op_seq - 1 : 0;
  atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c));
  return 0;
}
