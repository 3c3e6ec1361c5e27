/*
 * The plan container: actions and the shared pool of recompute op lists.
 */
#include "capuchin/plan.h"

#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "planners.h"

cap_plan_t *cap_plan_create(const char *policy, uint64_t budget_bytes) {
  cap_plan_t *plan = calloc(1, sizeof *plan);
  if (!plan)
    return NULL;
  plan->version = 1;
  plan->budget_bytes = budget_bytes;
  if (policy) {
    /* Names longer than the field are cut; every planner name fits. */
    size_t n = strlen(policy);
    if (n >= sizeof plan->policy)
      n = sizeof plan->policy - 1;
    memcpy(plan->policy, policy, n);
    plan->policy[n] = '\0';
  }
  return plan;
}

void cap_plan_destroy(cap_plan_t *plan) {
  if (!plan)
    return;
  free(plan->actions);
  free(plan->recompute_ops);
  free(plan->blocks);
  free(plan);
}

cap_plan_t *cap_plan_clone(const cap_plan_t *plan) {
  if (!plan)
    return NULL;
  cap_plan_t *c = malloc(sizeof *c);
  if (!c)
    return NULL;
  *c = *plan;
  c->actions = NULL;
  c->recompute_ops = NULL;
  c->blocks = NULL;
  c->cap_actions = plan->n_actions;
  c->cap_recompute_ops = plan->n_recompute_ops;
  if (plan->n_actions) {
    c->actions = malloc(plan->n_actions * sizeof *c->actions);
    if (!c->actions)
      goto out_free;
    memcpy(c->actions, plan->actions, plan->n_actions * sizeof *c->actions);
  }
  if (plan->n_recompute_ops) {
    c->recompute_ops = malloc(plan->n_recompute_ops * sizeof *c->recompute_ops);
    if (!c->recompute_ops)
      goto out_free;
    memcpy(c->recompute_ops, plan->recompute_ops,
           plan->n_recompute_ops * sizeof *c->recompute_ops);
  }
  if (plan->n_blocks) {
    c->blocks = malloc(plan->n_blocks * sizeof *c->blocks);
    if (!c->blocks)
      goto out_free;
    memcpy(c->blocks, plan->blocks, plan->n_blocks * sizeof *c->blocks);
  }
  return c;

out_free:
  cap_plan_destroy(c);
  return NULL;
}

const char *cap_residency_kind_name(cap_residency_kind_t k) {
  switch (k) {
  case CAP_RESIDENCY_FIRST_TOUCH:
    return "first_touch";
  case CAP_RESIDENCY_SWAPPED_IN:
    return "swapped_in";
  case CAP_RESIDENCY_RECOMPUTED:
    return "recomputed";
  case CAP_RESIDENCY_TEMPORARY:
    return "temporary";
  case CAP_RESIDENCY_PERSISTENT:
    return "persistent";
  }
  return NULL;
}

int cap_plan_set_blocks(cap_plan_t *plan, const cap_block_t *blocks,
                        uint32_t n, uint64_t arena_bytes) {
  if (!plan || (n && !blocks))
    return CAP_EINVAL;
  cap_block_t *copy = NULL;
  if (n) {
    copy = malloc((size_t)n * sizeof *copy);
    if (!copy)
      return CAP_ENOMEM;
    memcpy(copy, blocks, (size_t)n * sizeof *copy);
  }
  free(plan->blocks);
  plan->blocks = copy;
  plan->n_blocks = n;
  plan->arena_bytes = n ? arena_bytes : 0;
  return 0;
}

static int grow_actions(cap_plan_t *plan) {
  if (plan->n_actions < plan->cap_actions)
    return 0;
  if (plan->cap_actions >= UINT32_MAX / 2)
    return CAP_ENOMEM;
  uint32_t cap = plan->cap_actions ? plan->cap_actions * 2 : 16;
  cap_action_t *a = realloc(plan->actions, (size_t)cap * sizeof *a);
  if (!a)
    return CAP_ENOMEM;
  plan->actions = a;
  plan->cap_actions = cap;
  return 0;
}

int cap_plan_add_swap(cap_plan_t *plan, uint32_t tensor, uint32_t evict_after,
                      uint32_t prefetch_tensor, uint32_t prefetch_access,
                      uint32_t flags) {
  if (!plan || tensor == CAP_NONE || evict_after == 0 ||
      (flags & ~CAP_ACTION_SYNC_OUT) ||
      (prefetch_tensor != CAP_NONE && prefetch_access == 0))
    return CAP_EINVAL;
  int rc = grow_actions(plan);
  if (rc)
    return rc;
  cap_action_t *a = &plan->actions[plan->n_actions++];
  memset(a, 0, sizeof *a);
  a->tensor = tensor;
  a->evict_after_access = evict_after;
  a->method = CAP_METHOD_SWAP;
  a->flags = flags;
  a->prefetch_tensor = prefetch_tensor;
  a->prefetch_access = prefetch_tensor == CAP_NONE ? 0 : prefetch_access;
  return 0;
}

int cap_plan_add_recompute(cap_plan_t *plan, uint32_t tensor,
                           uint32_t evict_after, const uint32_t *ops,
                           uint32_t n_ops) {
  if (!plan || tensor == CAP_NONE || evict_after == 0 || (n_ops && !ops))
    return CAP_EINVAL;
  int rc = grow_actions(plan);
  if (rc)
    return rc;
  uint32_t off;
  if ((rc = cap__plan_append_ops(plan, ops, n_ops, &off)))
    return rc;
  cap_action_t *a = &plan->actions[plan->n_actions++];
  memset(a, 0, sizeof *a);
  a->tensor = tensor;
  a->evict_after_access = evict_after;
  a->method = CAP_METHOD_RECOMPUTE;
  a->prefetch_tensor = CAP_NONE;
  a->recompute_off = off;
  a->n_recompute = n_ops;
  return 0;
}

int cap__plan_append_ops(cap_plan_t *plan, const uint32_t *ops, uint32_t n,
                         uint32_t *off) {
  if (n > UINT32_MAX - plan->n_recompute_ops)
    return CAP_ENOMEM;
  uint32_t need = plan->n_recompute_ops + n;
  if (need > plan->cap_recompute_ops) {
    uint64_t cap = plan->cap_recompute_ops ? plan->cap_recompute_ops : 64;
    while (cap < need)
      cap *= 2;
    if (cap > UINT32_MAX)
      cap = UINT32_MAX;
    uint32_t *r = realloc(plan->recompute_ops, (size_t)cap * sizeof *r);
    if (!r)
      return CAP_ENOMEM;
    plan->recompute_ops = r;
    plan->cap_recompute_ops = (uint32_t)cap;
  }
  if (n)
    memcpy(plan->recompute_ops + plan->n_recompute_ops, ops, (size_t)n * sizeof *ops);
  *off = plan->n_recompute_ops;
  plan->n_recompute_ops = need;
  return 0;
}

int64_t cap__replay_ns(const cap_plan_t *plan, const cap_profile_t *p,
                       const cap_action_t *a) {
  const uint32_t *ops = cap_action_recompute_ops(plan, a);
  int64_t ns = 0;
  for (uint32_t j = 0; ops && j < a->n_recompute; j++)
    ns += p->ops[ops[j]].end_ns - p->ops[ops[j]].start_ns;
  return ns;
}

uint32_t cap__find_action(const cap_plan_t *plan, uint32_t tensor, uint32_t k) {
  for (uint32_t i = 0; i < plan->n_actions; i++)
    if (plan->actions[i].tensor == tensor &&
        plan->actions[i].evict_after_access == k)
      return i;
  return CAP_NONE;
}

int cap__plan_set_list(cap_plan_t *plan, uint32_t ai, const uint32_t *ops,
                       uint32_t n) {
  uint32_t off;
  int rc = cap__plan_append_ops(plan, ops, n, &off);
  if (rc)
    return rc;
  plan->actions[ai].recompute_off = off;
  plan->actions[ai].n_recompute = n;
  return 0;
}

int cap__plan_merge_lists(cap_plan_t *plan, uint32_t ai, uint32_t bi,
                          uint32_t max_ops) {
  const cap_action_t *a = &plan->actions[ai], *b = &plan->actions[bi];
  uint32_t na = a->n_recompute, nb = b->n_recompute;
  if ((uint64_t)na + nb > max_ops)
    return CAP_ENOENT;
  uint32_t *m = malloc(((size_t)na + nb + 1) * sizeof *m);
  if (!m)
    return CAP_ENOMEM;
  const uint32_t *x = cap_action_recompute_ops(plan, a);
  const uint32_t *y = cap_action_recompute_ops(plan, b);
  uint32_t i = 0, j = 0, n = 0;
  while (i < na || j < nb) {
    if (j == nb || (i < na && x[i] < y[j]))
      m[n++] = x[i++];
    else if (i == na || y[j] < x[i])
      m[n++] = y[j++];
    else
      m[n++] = x[i++], j++;
  }
  int rc = n == na ? CAP_ENOENT : cap__plan_set_list(plan, ai, m, n);
  free(m);
  return rc;
}
