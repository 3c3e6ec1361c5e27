/*
 * Recompute lists, run exactly as the plan writes them
 * (docs/plan-semantics.md): each listed op replayed through the framework's
 * callback, reading earlier listed ops' outputs or tensors on the device,
 * never an implicit restore.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

/* Why a listed op's input is not there, in the words of
 * docs/plan-semantics.md; NULL when it is there (or coming back). */
static const char *missing_reason(const cap__tensor_t *u) {
  switch (u->state) {
  case CAP__T_DEVICE:
  case CAP__T_IN: /* prefetch issued: the replay waits for it */
    return NULL;
  case CAP__T_OUT: /* swap-out running (the device copy is still there) */
  case CAP__T_HOST:
    /* Fetched now (a stall); note_fetched_early says so where the plan
     * did not count on it. */
    return NULL;
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

/* Source u of the list for tensor id is on the host although its prefetch
 * has not been issued: the list runs earlier than the plan has it. A
 * framework brings a saved tensor back when it unpacks it, and autograd
 * unpacks all of a node's saved tensors before the node's first op, which
 * may come before the trigger of a source's prefetch that the plan placed
 * before the op that reads the tensor. (The plan's checks refuse a list
 * whose source is not coming back by its op: docs/plan-semantics.md.) The
 * source is fetched now, a stall rather than a failed step, and the
 * iteration's note says so. (Its prefetch fired but found no room, or the
 * client evicted it on its own for lack of room: fetched now, as planned.) */
static void note_fetched_early(cap_client_t *c, uint32_t id, uint32_t list_op,
                               const cap__oplog_op_t *op, uint32_t tid) {
  const cap__tensor_t *u = &c->tensors[tid];
  if (u->prefetch_due || u->out_action == CAP_NONE || c->it.plan_note[0])
    return;
  snprintf(c->it.plan_note, sizeof c->it.plan_note,
           "op %u %s: recompute of tensor %u (action %u) ran before the "
           "prefetch of its source: op %u (%s) needs tensor %u, swapped out "
           "after op %u; fetched tensor %u for it (a stall)",
           c->op_seq, c->op_name, id, c->tensors[id].out_action, list_op,
           op->name ? op->name : "?", tid, u->gone_op, tid);
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
      if (u->state == CAP__T_OUT || u->state == CAP__T_HOST)
        note_fetched_early(c, id, list_op, op, tid);
      int rc = cap__ensure_resident(c, tid, false);
      if (rc < 0)
        return rc;
      ptrs[j] = u->dev;
      u->pinned++;
      pinned[j] = 1;
      continue;
    }
    void *p = NULL;
    /* The list's own action names its outputs' blocks (placement). */
    bool restores = tid == id || u->state == CAP__T_DROPPED;
    int rc = cap__tmem_alloc_as(c, tid,
                                restores ? CAP_RESIDENCY_RECOMPUTED
                                         : CAP_RESIDENCY_TEMPORARY,
                                c->tensors[id].out_action, &p, true);
    if (rc < 0)
      return rc;
    ptrs[j] = p;
    if (restores) {
      /* restored for good (DESIGN.md: one replay restores every dropped
       * tensor of the segment), filled by the callback */
      rc = push_u32(&r->restored, &r->n_restored, &r->cap_restored, tid);
      if (rc < 0) {
        cap__tmem_free(c, tid, p);
        return rc;
      }
      u->dev = p;
      u->state = CAP__T_DEVICE;
      u->lru = ++c->tick;
      u->pinned++;
      pinned[j] = 1;
    } else if ((rc = push_temp(r, tid, p)) < 0) {
      /* the live tensor, if any, is not touched */
      cap__tmem_free(c, tid, p);
      return rc;
    }
  }
  return 0;
}

/* Whether tensor tid, restored by a listed op that ran, holds its final
 * bytes although the list failed at its op rest[0]: no op from there on
 * (the failed one, or one that did not run) writes it. Such a tensor stays
 * restored, as the plan has it: a list merged from two (one replay for two
 * dropped tensors) that fails after restoring the other one leaves that
 * one on the device, correct, rather than make its own list run where the
 * plan never checked it. */
static bool restored_whole(const cap_client_t *c, const uint32_t *rest,
                           uint32_t n_rest, uint32_t tid) {
  for (uint32_t i = 0; i < n_rest; i++) {
    if (rest[i] >= c->log_last.n_ops)
      return false;
    const cap__oplog_op_t *op = &c->log_last.ops[rest[i]];
    const uint32_t *outs = c->log_last.ids + op->off + op->n_in;
    for (uint32_t j = 0; j < op->n_out; j++)
      if (outs[j] == tid)
        return false;
  }
  return true;
}

/* A restored tensor whose bytes the failed list did not finish: dropped
 * again (its own list or a fallback brings it back). */
static void unrestore(cap_client_t *c, uint32_t tid) {
  cap__tensor_t *u = &c->tensors[tid];
  if (u->state != CAP__T_DEVICE)
    return;
  cap__tmem_free(c, tid, u->dev);
  u->dev = NULL;
  u->state = CAP__T_DROPPED;
}

/* Replay the lineage ops of a dropped tensor through the framework, exactly
 * as the plan lists them: every input of a listed op is an output of an
 * earlier listed op or on the device (docs/plan-semantics.md). Nothing is
 * recomputed implicitly; a missing input fails the list with a message
 * naming the op, the tensor, the action and the reason; a failed list
 * leaves behind only the dropped tensors its ops that ran restored whole
 * (restored_whole), never a temporary or a half-made tensor. */
int cap__recompute(cap_client_t *c, uint32_t id) {
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
  uint32_t failed = a->n_recompute; /* the listed op that failed, if any */
  for (uint32_t i = 0; i < a->n_recompute && rc == 0; i++) {
    if (ops[i] >= c->log_last.n_ops) {
      cap__set_error(c, "op %u %s: recompute of tensor %u (action %u) lists "
                        "op %u, beyond the last iteration's %u ops",
                     c->op_seq, c->op_name, id, t->out_action, ops[i],
                     c->log_last.n_ops);
      rc = CAP_ERECOMPUTE;
      failed = i;
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
        c->fw_calling++; /* (framework_alloc.c: not the next op's outputs) */
        int cb = c->recompute(c->recompute_user, ops[i], op->name, ids, ptrs,
                              op->n_in, ids + op->n_in, ptrs + op->n_in,
                              op->n_out);
        c->fw_calling--;
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
    if (rc < 0)
      failed = i;
  }
  if (rc == 0 && t->state != CAP__T_DEVICE) {
    cap__set_error(c, "op %u %s: recompute of tensor %u (action %u): its "
                      "list does not produce it",
                   c->op_seq, c->op_name, id, t->out_action);
    rc = CAP_ERECOMPUTE;
  }
  for (uint32_t i = 0; i < r.n_temps; i++)
    cap__tmem_free(c, r.temps[i].id, r.temps[i].ptr);
  for (uint32_t k = 0; k < r.n_restored && rc < 0; k++)
    if (!restored_whole(c, ops + failed, a->n_recompute - failed,
                        r.restored[k]))
      unrestore(c, r.restored[k]);
  free(r.temps);
  free(r.restored);
  atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c->dev));
  return rc < 0 ? CAP_ERECOMPUTE : 0;
}
