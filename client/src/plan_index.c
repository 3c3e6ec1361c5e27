/*
 * The installed plan's index: every action found by (tensor, access) in
 * O(1) on the hot path, the prefetches each access triggers, and which
 * actions fall back to a swap (no lineage yet, or failed earlier in the
 * job).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

void cap__x_clear(cap_client_t *c) {
  cap__xplan_t *x = &c->x;
  cap_plan_destroy(x->plan);
  free(x->slot_off);
  free(x->slots);
  free(x->trig);
  free(x->op_acts);
  free(x->fallback);
  free(x->replays);
  free(x->block_of);
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

/* Which ops the recompute lists that will run replay: a framework that
 * must record an op's arguments to replay it records only those
 * (cap_client_op_replayed). */
static int mark_replays(const cap_plan_t *plan, cap__xplan_t *x) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < plan->n_recompute_ops; i++)
    if (plan->recompute_ops[i] >= n)
      n = plan->recompute_ops[i] + 1;
  x->replays = calloc(n ? n : 1, 1);
  if (!x->replays)
    return CAP_ENOMEM;
  x->n_replays = n;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->method != CAP_METHOD_RECOMPUTE || x->fallback[i])
      continue;
    const uint32_t *ops = cap_action_recompute_ops(plan, a);
    for (uint32_t k = 0; k < a->n_recompute; k++)
      x->replays[ops[k]] = 1;
  }
  return 0;
}

/* Action a carried out as the executor does when it falls back. */
static void as_swap(cap_action_t *a) {
  a->method = CAP_METHOD_SWAP;
  a->recompute_off = a->n_recompute = 0;
  a->prefetch_tensor = CAP_NONE;
  a->prefetch_access = 0;
}

/* The plan as the executor will run it: the actions that fall back
 * swapped. NULL when out of memory. */
static cap_plan_t *as_run(const cap_plan_t *plan, const cap__xplan_t *x) {
  cap_plan_t *w = cap_plan_clone(plan);
  for (uint32_t i = 0; w && i < w->n_actions; i++)
    if (x->fallback[i])
      as_swap(&w->actions[i]);
  return w;
}

/* The plan walked over the last iteration's log (docs/plan-semantics.md,
 * the walk the daemon's validator and simulator use), with the actions
 * that already fall back swapped: an action whose list cannot run here
 * exactly as written is carried out as a swap from the start, and the
 * daemon is told. (A list may count on another action's list: one merged
 * list restores two tensors, and when the other falls back, this one's
 * list runs where the plan never checked it.) A plan that does not fit the
 * log at all (accesses that do not exist) is refused with the validator's
 * message. */
static int check_against_log(cap_client_t *c, const cap_plan_t *plan,
                             cap__xplan_t *x) {
  cap_profile_t *p = NULL;
  if (cap__oplog_profile(c, &c->log_last, &p) < 0)
    return 0; /* the log does not make a profile: the executor still checks */
  char err[224] = "";
  int rc = cap_plan_validate(plan, p, err, sizeof err);
  bool falls_back = false;
  for (uint32_t i = 0; i < plan->n_actions && !falls_back; i++)
    falls_back = x->fallback[i];
  if (rc == 0 && falls_back)
    rc = CAP_EINVAL; /* walk it as it will run */
  cap_plan_t *walked = NULL;
  /* each round swaps one more action: at most one per action */
  for (uint32_t n = 0; rc == CAP_EINVAL && n <= plan->n_actions; n++) {
    cap_plan_fault_t f;
    if (!walked && !(walked = as_run(plan, x))) {
      rc = CAP_ENOMEM;
      break;
    }
    rc = cap_plan_walk(walked, p, &f);
    if (rc != CAP_EINVAL)
      break;
    if (f.action == CAP_NONE) {
      cap__set_error(c, "plan v%u does not fit the last iteration: %s",
                     plan->version, err);
      break;
    }
    /* walk on as the executor will run it: that tensor swapped */
    cap_action_t *a = &walked->actions[f.action];
    if (!x->n_refused++) {
      char why[192];
      cap_plan_fault_format(walked, p, &f, why, sizeof why);
      snprintf(x->note, sizeof x->note, "plan v%u swaps instead: %s",
               plan->version, why);
    }
    x->fallback[f.action] = 1;
    cap__note_failed(c, a->tensor, a->evict_after_access);
    as_swap(a);
  }
  cap_plan_destroy(walked);
  cap_profile_destroy(p);
  return rc == CAP_ENOMEM ? 0 : rc;
}

/* Build the (tensor, access) index of a plan and make it the installed one.
 * Takes ownership of plan. Actions naming unknown tensors are refused as a
 * whole (the plan was made for another job). */
int cap__x_install(cap_client_t *c, cap_plan_t *plan) {
  int rc = CAP_ENOMEM;
  cap__xplan_t x = {0};
  uint32_t nt = c->n_tensors;
  uint32_t *maxk = NULL;
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
  x.slot_off = calloc((size_t)nt + 1, sizeof *x.slot_off);
  x.fallback = calloc(plan->n_actions ? plan->n_actions : 1, 1);
  if (!maxk || !x.slot_off || !x.fallback)
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
  if (c->log_last_valid && (rc = check_against_log(c, plan, &x)) < 0)
    goto out;
  x.n_failed_walked = c->n_failed;
  rc = CAP_ENOMEM;
  if (mark_replays(plan, &x) < 0)
    goto out;
  uint64_t total = 0;
  for (uint32_t t = 0; t < nt; t++) {
    x.slot_off[t] = (uint32_t)total;
    total += maxk[t];
  }
  x.slot_off[nt] = (uint32_t)total;
  x.slots = malloc((total ? total : 1) * sizeof *x.slots);
  x.trig = malloc((plan->n_actions ? plan->n_actions : 1) * sizeof *x.trig);
  x.op_acts =
      malloc((plan->n_actions ? plan->n_actions : 1) * sizeof *x.op_acts);
  if (!x.slots || !x.trig || !x.op_acts)
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
  if ((rc = cap__placement_index(c, &x)) < 0) {
    x.plan = NULL;
    goto out;
  }
  cap__x_clear(c);
  c->x = x;
  free(maxk);
  return 0;
out:
  free(maxk);
  free(x.slot_off);
  free(x.slots);
  free(x.trig);
  free(x.op_acts);
  free(x.fallback);
  free(x.replays);
  free(x.block_of);
  cap_plan_destroy(plan);
  return rc;
}
