/*
 * Static checks of a plan against its profile (plan.h, cap_plan_validate).
 * What can be decided without running the plan is decided here, so that the
 * simulator, the daemon and the client can trust every index in a plan.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/plan.h"

static int fail(char *err, size_t err_len, const char *fmt, ...) {
  if (err && err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return CAP_EINVAL;
}

static bool op_lists_output(const cap_profile_t *p, uint32_t op, uint32_t t) {
  const cap_op_t *o = &p->ops[op];
  const uint32_t *out = cap_op_outputs(p, o);
  for (uint32_t i = 0; i < o->n_out; i++)
    if (out[i] == t)
      return true;
  return false;
}

typedef struct {
  uint32_t tensor, access, index;
} key_t_;

static int key_cmp(const void *a, const void *b) {
  const key_t_ *x = a, *y = b;
  if (x->tensor != y->tensor)
    return x->tensor < y->tensor ? -1 : 1;
  if (x->access != y->access)
    return x->access < y->access ? -1 : 1;
  return 0;
}

/* The list itself; whether its inputs are there when it runs is the
 * walk's question (plan_walk.c). */
static int check_recompute(const cap_plan_t *plan, const cap_profile_t *p,
                           uint32_t ai, const cap_action_t *a, uint32_t evict_op,
                           uint32_t back_op, char *err, size_t err_len) {
  const cap_tensor_t *t = &p->tensors[a->tensor];
  if (a->n_recompute == 0)
    return fail(err, err_len, "action %u (tensor %u): empty recompute list", ai,
                a->tensor);
  if (a->recompute_off > plan->n_recompute_ops ||
      a->n_recompute > plan->n_recompute_ops - a->recompute_off)
    return fail(err, err_len,
                "action %u (tensor %u): recompute list out of range", ai,
                a->tensor);
  if (a->prefetch_tensor != CAP_NONE || a->flags)
    return fail(err, err_len,
                "action %u (tensor %u): recompute action with swap fields", ai,
                a->tensor);
  if (t->producer_op == CAP_NONE)
    return fail(err, err_len,
                "action %u (tensor %u): tensor has no producing op to replay",
                ai, a->tensor);
  const uint32_t *ops = cap_action_recompute_ops(plan, a);
  for (uint32_t i = 0; i < a->n_recompute; i++) {
    if (ops[i] >= p->n_ops)
      return fail(err, err_len, "action %u (tensor %u): recompute op %u does not exist",
                  ai, a->tensor, ops[i]);
    if (ops[i] >= back_op)
      return fail(err, err_len,
                  "action %u (tensor %u): recompute op %u does not precede the "
                  "back-access (op %u)",
                  ai, a->tensor, ops[i], back_op);
    if (i > 0 && ops[i] <= ops[i - 1])
      return fail(err, err_len,
                  "action %u (tensor %u): recompute ops not in execution order",
                  ai, a->tensor);
  }
  if (!op_lists_output(p, ops[a->n_recompute - 1], a->tensor))
    return fail(err, err_len,
                "action %u (tensor %u): last recompute op %u does not produce it",
                ai, a->tensor, ops[a->n_recompute - 1]);
  /* The value at the evicted-access is the producer's output after every
   * later write up to that access: all of those ops must be replayed. */
  const uint32_t *acc = p->access_ops + t->access_off;
  for (uint32_t k = 0; k < t->n_accesses && acc[k] <= evict_op; k++) {
    uint32_t op = acc[k];
    if (op != t->producer_op &&
        (!op_lists_output(p, op, a->tensor) || (p->ops[op].flags & CAP_OP_VIEW)))
      continue;
    bool found = false;
    for (uint32_t i = 0; i < a->n_recompute && !found; i++)
      found = ops[i] == op;
    if (!found)
      return fail(err, err_len,
                  "action %u (tensor %u): op %u writes the tensor but is not "
                  "replayed",
                  ai, a->tensor, op);
  }
  return 0;
}

int cap_plan_validate(const cap_plan_t *plan, const cap_profile_t *p, char *err,
                      size_t err_len) {
  if (err && err_len)
    err[0] = '\0';
  if (!plan || !p)
    return fail(err, err_len, "no plan or no profile");
  if (!p->finished)
    return fail(err, err_len, "profile is not finished");
  if (plan->n_actions && !plan->actions)
    return fail(err, err_len, "plan has actions but no action array");
  key_t_ *keys = NULL;
  if (plan->n_actions) {
    keys = malloc((size_t)plan->n_actions * sizeof *keys);
    if (!keys)
      return CAP_ENOMEM;
  }
  int rc = 0;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->tensor >= p->n_tensors) {
      rc = fail(err, err_len, "action %u: unknown tensor id %u", i, a->tensor);
      goto out_free;
    }
    const cap_tensor_t *t = &p->tensors[a->tensor];
    if (!cap_action_is_release(a))
      continue;
    if (a->evict_after_access != t->n_accesses || t->n_accesses == 0) {
      rc = fail(err, err_len,
                "action %u (tensor %u): release after access %u, but the "
                "tensor's last access is %u",
                i, a->tensor, a->evict_after_access, t->n_accesses);
      goto out_free;
    }
    if (cap_tensor_is_resident(t)) {
      rc = fail(err, err_len,
                "action %u (tensor %u): release of a tensor that outlives the "
                "iteration",
                i, a->tensor);
      goto out_free;
    }
    if (a->prefetch_tensor != CAP_NONE || a->flags) {
      rc = fail(err, err_len,
                "action %u (tensor %u): release with swap fields", i, a->tensor);
      goto out_free;
    }
  }
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    const cap_tensor_t *t = &p->tensors[a->tensor];
    if (cap_action_is_release(a)) {
      keys[i] = (key_t_){a->tensor, a->evict_after_access, i};
      continue;
    }
    if (t->no_evict) {
      rc = fail(err, err_len,
                "action %u (tensor %u): evicts a tensor the framework cannot "
                "give up (no_evict)",
                i, a->tensor);
      goto out_free;
    }
    if (a->evict_after_access == 0 || a->evict_after_access >= t->n_accesses) {
      rc = fail(err, err_len,
                "action %u (tensor %u): evict after access %u, but the tensor "
                "has %u accesses (a back-access must follow)",
                i, a->tensor, a->evict_after_access, t->n_accesses);
      goto out_free;
    }
    uint32_t evict_op = p->access_ops[t->access_off + a->evict_after_access - 1];
    uint32_t back_op = p->access_ops[t->access_off + a->evict_after_access];
    keys[i] = (key_t_){a->tensor, a->evict_after_access, i};
    if (a->method == CAP_METHOD_SWAP) {
      if (a->flags & ~CAP_ACTION_SYNC_OUT) {
        rc = fail(err, err_len, "action %u (tensor %u): unknown flags 0x%x", i,
                  a->tensor, a->flags);
        goto out_free;
      }
      if (a->n_recompute) {
        rc = fail(err, err_len,
                  "action %u (tensor %u): swap action with a recompute list", i,
                  a->tensor);
        goto out_free;
      }
      if (a->prefetch_tensor != CAP_NONE) {
        if (a->prefetch_tensor >= p->n_tensors) {
          rc = fail(err, err_len,
                    "action %u (tensor %u): unknown in-trigger tensor %u", i,
                    a->tensor, a->prefetch_tensor);
          goto out_free;
        }
        uint32_t trig = cap_profile_access_op(p, a->prefetch_tensor,
                                              a->prefetch_access);
        if (trig == CAP_NONE) {
          rc = fail(err, err_len,
                    "action %u (tensor %u): in-trigger tensor %u has no access %u",
                    i, a->tensor, a->prefetch_tensor, a->prefetch_access);
          goto out_free;
        }
        if (trig <= evict_op || trig > back_op) {
          rc = fail(err, err_len,
                    "action %u (tensor %u): in-trigger op %u is not after the "
                    "evicted-access (op %u) and at or before the back-access "
                    "(op %u)",
                    i, a->tensor, trig, evict_op, back_op);
          goto out_free;
        }
      }
    } else if (a->method == CAP_METHOD_RECOMPUTE) {
      rc = check_recompute(plan, p, i, a, evict_op, back_op, err, err_len);
      if (rc)
        goto out_free;
    } else {
      rc = fail(err, err_len, "action %u (tensor %u): unknown method %d", i,
                a->tensor, (int)a->method);
      goto out_free;
    }
  }
  if (plan->n_actions > 1) {
    qsort(keys, plan->n_actions, sizeof *keys, key_cmp);
    for (uint32_t i = 1; i < plan->n_actions; i++)
      if (keys[i].tensor == keys[i - 1].tensor &&
          keys[i].access == keys[i - 1].access) {
        rc = fail(err, err_len,
                  "actions %u and %u both evict tensor %u after access %u",
                  keys[i - 1].index, keys[i].index, keys[i].tensor,
                  keys[i].access);
        goto out_free;
      }
  }
  for (uint32_t i = 0; i < plan->n_blocks; i++) {
    const cap_block_t *b = &plan->blocks[i];
    if (b->tensor >= p->n_tensors ||
        (b->action != CAP_NONE && b->action >= plan->n_actions)) {
      rc = fail(err, err_len, "block %u names tensor %u and action %d, of %u "
                "and %u", i, b->tensor, b->action == CAP_NONE ? -1 : (int)b->action,
                p->n_tensors, plan->n_actions);
      goto out_free;
    }
  }
  if (plan->n_blocks && (rc = cap_plan_check_blocks(plan, err, err_len)))
    goto out_free;
  cap_plan_fault_t f;
  rc = cap_plan_walk(plan, p, &f);
  if (rc == CAP_EINVAL && err && err_len)
    cap_plan_fault_format(plan, p, &f, err, err_len);

out_free:
  free(keys);
  return rc;
}
