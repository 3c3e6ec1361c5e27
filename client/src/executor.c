/*
 * The executor's hot path: op begin and op end. At op begin the op's
 * tensors are brought back (restore.c), then the prefetches the op
 * triggers are issued; at op end the plan's evictions after the op are
 * carried out (evict.c). The plan index (plan_index.c) answers "what does
 * this access trigger" in O(1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

/* Whether an H2D copy is still running. */
static bool h2d_busy(cap_client_t *c) {
  if (c->h2d_last == CAP_NONE || c->h2d_last >= c->n_tensors)
    return false;
  const cap__tensor_t *t = &c->tensors[c->h2d_last];
  return t->state == CAP__T_IN && t->ev && cap__ev_query(c->dev, t->ev) == 0;
}

/* A framework-owned tensor's prefetch waits for the copy engine: the plan
 * takes its memory when its copy starts, after the copies in before it,
 * and the framework allocates the ops' outputs regardless of the budget,
 * so memory taken earlier than planned would push them past it. (The
 * client's own allocator refuses what does not fit and makes room for an
 * op's outputs, so its tensors' prefetches start at once.) */
static void queue_prefetch(cap_client_t *c, uint32_t id) {
  if (c->n_pf == c->cap_pf) {
    uint32_t n = c->cap_pf ? 2 * c->cap_pf : 64;
    uint32_t *q = realloc(c->pf_queue, (size_t)n * sizeof *q);
    if (!q)
      return; /* brought back on demand at its back-access instead */
    c->pf_queue = q;
    c->cap_pf = n;
  }
  c->pf_queue[c->n_pf++] = id;
}

void cap__prefetch_pump(cap_client_t *c) {
  if (c->pf_pumping)
    return; /* (swap_in_start reaps, which pumps) */
  c->pf_pumping = true;
  uint32_t done = 0;
  while (done < c->n_pf && !h2d_busy(c)) {
    uint32_t id = c->pf_queue[done++];
    const cap__tensor_t *t = &c->tensors[id];
    /* Still out and still due (its back-access may have fetched it). */
    if (t->state == CAP__T_HOST && t->prefetch_due)
      (void)cap__swap_in_start(c, id, false);
  }
  memmove(c->pf_queue, c->pf_queue + done, (c->n_pf - done) * sizeof *c->pf_queue);
  c->n_pf -= done;
  c->pf_pumping = false;
}

static void start_prefetch(cap_client_t *c, uint32_t ai) {
  const cap_action_t *a = &c->x.plan->actions[ai];
  cap__tensor_t *u = &c->tensors[a->tensor];
  if (u->out_action == ai)
    u->prefetch_due = 1;
  if (u->state == CAP__T_OUT) {
    /* Its swap-out is still running: finish it first (rare; the plan put
     * the trigger before the swap-out's end). */
    cap__retire_t *r = cap__retire_of(c, a->tensor);
    if (!r)
      return;
    int st = cap__ev_sync(c->dev, r->ev);
    cap__retire_finish(c, r, st < 0 ? st : 1);
    *r = c->retire[--c->n_retire];
  }
  if (u->state != CAP__T_HOST || u->out_action != ai)
    return;
  /* A prefetch never evicts others: if it does not fit now it becomes an
   * on-demand copy at the back-access. */
  if (u->framework && (c->n_pf || h2d_busy(c)))
    queue_prefetch(c, a->tensor);
  else
    (void)cap__swap_in_start(c, a->tensor, false);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* The open op's actions in c->x.op_acts, in action order: the order in
 * which the simulator issues an op's prefetches, and the swap-outs after
 * it (docs/plan-semantics.md). Each direction's copies run in issue order,
 * so issuing them in another order makes a copy the plan expects done
 * early wait behind a large one (a tensor's block the plan reuses then
 * is not free yet). */
static void sort_op_acts(cap_client_t *c, uint32_t n) {
  if (n > 1)
    qsort(c->x.op_acts, n, sizeof *c->x.op_acts, cmp_u32);
}

/* The prefetches that the op's nu tensors (c->op_ids) trigger. */
static void start_prefetches(cap_client_t *c, uint32_t nu) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < nu; i++) {
    uint32_t id = c->op_ids[i];
    const cap__slot_t *s = cap__slot_at(&c->x, id, c->tensors[id].n_access + 1);
    if (s && s->n_trig) {
      memcpy(c->x.op_acts + n, c->x.trig + s->trig_off,
             s->n_trig * sizeof *c->x.op_acts);
      n += s->n_trig;
    }
  }
  sort_op_acts(c, n);
  for (uint32_t i = 0; i < n; i++)
    start_prefetch(c, c->x.op_acts[i]);
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
  c->op_in = in;     /* an output may take over an input's block */
  c->op_n_in = n_in;
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
      (void)cap__swap_in_start(c, c->op_ids[i], true); /* else: below, again */
  for (uint32_t i = 0; i < nu; i++) {
    uint32_t id = c->op_ids[i];
    if (c->tensors[id].state != CAP__T_DEVICE) {
      /* Only an op that writes the tensor without reading it may get fresh
       * memory for lost contents: one listing it on both sides (relu_,
       * detach, add_) reads what a failed recompute never restored. */
      bool only_out = false;
      for (uint32_t j = 0; j < n_out && !only_out; j++)
        only_out = out[j] == id;
      for (uint32_t j = 0; j < n_in && only_out; j++)
        only_out = in[j] != id;
      rc = cap__ensure_resident(c, id, only_out);
      if (rc < 0)
        goto out_unpin;
    }
  }
  if (c->x.plan && c->mode == CAP_MODE_GUIDED)
    start_prefetches(c, nu);
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
  c->op_start_ns = cap__now_ns(c->dev);
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
  int64_t t1 = cap__now_ns(c->dev);
  if (c->recording) {
    if (c->decl_next < c->n_tensors)
      cap__decl_upto(c, c->n_tensors - 1);
    /* The profile is the framework's timeline: time the client held the
     * host (passive swapping, waits for copies) is taken out
     * (cap__rec_time_ns); a wait the device alone did is not. */
    int64_t s, e;
    cap__rec_span(c, c->op_start_ns, t1, &s, &e);
    if (!cap__rec_op(c, c->op_seq, s, e, c->op_name, c->op_in, c->op_n_in,
                     c->op_out, c->op_n_out))
      c->it.dropped_records++;
  }
  c->op_open = false;
  c->op_seq++;
  bool guided = c->x.plan && c->mode == CAP_MODE_GUIDED;
  uint32_t n = 0;
  for (uint32_t i = 0; i < c->op_n_unique; i++) {
    uint32_t id = c->op_ids[i];
    cap__tensor_t *t = &c->tensors[id];
    if (t->pinned)
      t->pinned--;
    const cap__slot_t *s = guided ? cap__slot_at(&c->x, id, t->n_access) : NULL;
    if (s && s->evict != CAP_NONE)
      c->x.op_acts[n++] = s->evict;
  }
  sort_op_acts(c, n);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t ai = c->x.op_acts[i];
    const cap_action_t *a = &c->x.plan->actions[ai];
    uint32_t id = a->tensor;
    cap__tensor_t *t = &c->tensors[id];
    if (t->state != CAP__T_DEVICE || t->pinned)
      continue;
    if (t->framework && t->persistent && !t->evictable) {
      /* The framework cannot give up this weight's memory (framework.h,
       * cap_client_set_evictable): kept on the device, a fallback. */
      c->it.fallbacks++;
      atomic_fetch_add(&c->ctr.fallbacks, 1);
      if (!c->it.plan_note[0])
        snprintf(c->it.plan_note, sizeof c->it.plan_note,
                 "action %u evicts persistent tensor %u, whose memory the "
                 "framework cannot give up: kept on the device", ai, id);
      continue;
    }
    if (a->method == CAP_METHOD_RECOMPUTE && !c->x.fallback[ai]) {
      cap__tmem_free(c, id, t->dev);
      t->dev = NULL;
      t->state = cap_action_is_release(a) ? CAP__T_RELEASED : CAP__T_DROPPED;
      t->out_action = ai;
      t->gone_op = c->op_seq - 1;
      c->it.evictions++;
      atomic_fetch_add(&c->ctr.evictions, 1);
      atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c->dev));
    } else {
      int rc = cap__swap_out(c, id, ai, (a->flags & CAP_ACTION_SYNC_OUT) != 0);
      if (rc < 0) {
        /* No pinned memory (the pool's cap) or the copy refused: keep it
         * on the device. */
        c->it.fallbacks++;
        atomic_fetch_add(&c->ctr.fallbacks, 1);
        if (!c->it.plan_note[0])
          snprintf(c->it.plan_note, sizeof c->it.plan_note,
                   "swap-out of tensor %u kept on the device: %s%s", id,
                   cap_strerror(rc),
                   rc == CAP_EBUDGET ? " (host pool cap)" : "");
      }
    }
  }
  if (c->n_retire || c->n_pf) /* (reaping starts queued prefetches) */
    cap__reap(c, false);
  return 0;
}

int cap__release_tensor(cap_client_t *c, uint32_t id) {
  cap__tensor_t *t = &c->tensors[id];
  switch (t->state) {
  case CAP__T_DEVICE:
  case CAP__T_LOST:
    if (t->dev && t->framework && !t->lent) /* the framework frees it */
      cap__dev_track_framework(c->dev, t->bytes ? t->bytes : 1, false);
    else if (t->dev && !t->framework)
      cap__dev_free(c->dev, t->dev);
    break;
  case CAP__T_OUT: {
    cap__retire_t *r = cap__retire_of(c, id);
    if (r) {
      r->tensor = CAP_NONE;
      r->host = t->host;
      r->host_bytes = t->bytes;
    }
    break;
  }
  case CAP__T_HOST:
    cap__host_free(c->dev, t->host, t->bytes);
    break;
  case CAP__T_IN:
    if (cap__retire_push(c, t->ev, t->dev, t->host, t->bytes, CAP_NONE,
                         t->framework ? id : CAP_NONE) < 0) {
      cap__ev_sync(c->dev, t->ev);
      cap__ev_release(c->dev, t->ev);
      cap__tmem_free(c, id, t->dev);
      cap__host_free(c->dev, t->host, t->bytes);
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
  atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c->dev));
  return 0;
}

