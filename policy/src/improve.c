/*
 * Local search under the simulator: the greedy chooses each eviction with
 * an op-space estimate of memory and copy-engine time, one choice at a
 * time, and recomputes where it cannot see that a swap would still be
 * hidden. Once a plan fits, try its costliest replays as swaps (the
 * prefetch just in time on idle engines, cap__earlier_trigger), one at a
 * time, and keep each that the simulator says is faster and no higher at
 * its peak. Not just within the budget: the room the greedy's plan left
 * under it absorbs what the simulator does not see when the client runs
 * the plan (a real allocator, copies that run late); plans that filled it
 * made the client wait for memory in end-to-end replays.
 *
 * Then the prefetches the simulator finds late start that much earlier
 * (what cap_plan_refine does with measured stalls), each kept under the
 * same rule.
 *
 * Then the swaps that stall the compute stream (on-demand prefetches,
 * synchronous swap-outs: Belady's plan near the floor is made of them):
 * give them just-in-time prefetches, then let their copies out run
 * alongside compute, a group at a time: a group the simulator accepts
 * (no higher, faster) is kept whole, one it refuses is split in two and each
 * half tried, as long as simulations are left.
 */
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"
#include "planners.h"

typedef struct {
  int64_t cost_ns; /* replay time of the list */
  uint32_t tensor, k;
} cand_t;

static int cmp_cand(const void *a, const void *b) {
  const cand_t *x = a, *y = b;
  if (x->cost_ns != y->cost_ns)
    return x->cost_ns > y->cost_ns ? -1 : 1;
  if (x->tensor != y->tensor)
    return x->tensor < y->tensor ? -1 : 1;
  return x->k < y->k ? -1 : x->k > y->k;
}

static uint32_t find_action(const cap_plan_t *plan, uint32_t tensor, uint32_t k) {
  for (uint32_t i = 0; i < plan->n_actions; i++)
    if (plan->actions[i].tensor == tensor &&
        plan->actions[i].evict_after_access == k)
      return i;
  return CAP_NONE;
}

/* Simulate a changed plan; *ok false when its lists cannot run as written
 * (the simulator's walk refuses it). The whole check, cap_plan_validate,
 * runs only on a change that is kept (keep()): most are refused for their
 * time or their peak, and each check walks the plan once more. */
static int simulate(cap_plan_t *next, const cap_profile_t *p,
                    const cap_bandwidth_t *bw, bool *ok) {
  int rc = cap__plan_predict(next, p, bw);
  *ok = rc == 0;
  return rc == CAP_EINVAL ? 0 : rc;
}

/* Whether the simulated change next is kept over plan: faster, no higher
 * than limit at its peak, and valid. */
static bool keep(const cap_plan_t *next, const cap_plan_t *plan,
                 const cap_profile_t *p, uint64_t limit) {
  return next->predicted_peak_bytes <= limit &&
         next->predicted_iter_ns < plan->predicted_iter_ns &&
         cap_plan_validate(next, p, NULL, 0) == 0;
}

enum { TO_SWAP, DROP, EARLIER };

/* The plan with the replay of (tensor, k) turned into a swap (TO_SWAP),
 * with the eviction of (tensor, k) left out (DROP: the tensor stays), or
 * with the prefetch of the swap of (tensor, k) started its lateness (cd's
 * cost) earlier (EARLIER), made explicit and simulated; NULL in *out when
 * there is nothing to change or its lists cannot run as written. */
static int try_change(const cap_plan_t *plan, const cap_profile_t *p,
                      const cap_plan_config_t *cfg, const cand_t *cd, int how,
                      cap_plan_t **out) {
  *out = NULL;
  uint32_t ai = find_action(plan, cd->tensor, cd->k);
  if (ai == CAP_NONE || cap_action_is_release(&plan->actions[ai]) ||
      (how == TO_SWAP && plan->actions[ai].method != CAP_METHOD_RECOMPUTE) ||
      (how == EARLIER && plan->actions[ai].method != CAP_METHOD_SWAP))
    return 0;
  uint32_t tt, ta;
  if (how == EARLIER &&
      !cap__earlier_trigger(p, &plan->actions[ai], cd->cost_ns,
                            cfg->trigger_margin_ns, &tt, &ta))
    return 0;
  cap_plan_t *next = cap_plan_clone(plan);
  if (!next)
    return CAP_ENOMEM;
  cap_action_t *a = &next->actions[ai];
  if (how == DROP) {
    /* its list ops stay in the pool, unused */
    next->actions[ai] = next->actions[--next->n_actions];
    goto explicit;
  }
  if (how == EARLIER) {
    a->prefetch_tensor = tt;
    a->prefetch_access = ta;
    goto explicit;
  }
  a->method = CAP_METHOD_SWAP;
  a->recompute_off = a->n_recompute = 0;
  a->flags = 0;
  a->prefetch_tensor = CAP_NONE;
  a->prefetch_access = 0;
  if (cap__earlier_trigger(p, a,
                           cap_copy_ns(p->tensors[a->tensor].bytes, cfg->bw.h2d_gbps),
                           cfg->trigger_margin_ns, &tt, &ta)) {
    a->prefetch_tensor = tt;
    a->prefetch_access = ta;
  }
explicit:;
  int rc = cap__plan_make_explicit(next, p, NULL);
  if (rc) {
    cap_plan_destroy(next);
    return rc;
  }
  bool ok;
  rc = simulate(next, p, &cfg->bw, &ok);
  if (rc || !ok) {
    cap_plan_destroy(next);
    return rc;
  }
  *out = next;
  return 0;
}

/* --- stalling swaps, in groups ------------------------------------------- */

enum { UP_PREFETCH, UP_ASYNC_OUT };

typedef struct {
  cap_plan_t *plan;
  const cap_profile_t *p;
  const cap_plan_config_t *cfg;
  const cand_t *keys; /* the swaps to upgrade, by (tensor, k) */
  uint64_t limit;     /* peak bytes a kept change may reach */
  int kind;           /* UP_* */
  uint32_t sims_left;
} group_t;

/* Upgrade action a of the clone; false when there is nothing to change. */
static bool upgrade(const group_t *g, cap_action_t *a) {
  if (g->kind == UP_ASYNC_OUT) {
    if (!(a->flags & CAP_ACTION_SYNC_OUT))
      return false;
    a->flags &= ~CAP_ACTION_SYNC_OUT;
    return true;
  }
  if (a->prefetch_tensor != CAP_NONE)
    return false;
  uint32_t tt, ta;
  if (!cap__earlier_trigger(
          g->p, a, cap_copy_ns(g->p->tensors[a->tensor].bytes, g->cfg->bw.h2d_gbps),
          g->cfg->trigger_margin_ns, &tt, &ta))
    return false;
  a->prefetch_tensor = tt;
  a->prefetch_access = ta;
  return true;
}

static int try_group(group_t *g, uint32_t lo, uint32_t hi) {
  if (!g->sims_left || lo >= hi)
    return 0;
  cap_plan_t *next = cap_plan_clone(g->plan);
  if (!next)
    return CAP_ENOMEM;
  bool any = false;
  for (uint32_t i = lo; i < hi; i++) {
    uint32_t ai = find_action(next, g->keys[i].tensor, g->keys[i].k);
    if (ai != CAP_NONE && next->actions[ai].method == CAP_METHOD_SWAP)
      any |= upgrade(g, &next->actions[ai]);
  }
  int rc = 0;
  if (any) {
    g->sims_left--;
    bool ok;
    rc = simulate(next, g->p, &g->cfg->bw, &ok);
    if (ok && keep(next, g->plan, g->p, g->limit)) {
      cap_plan_t tmp = *g->plan;
      *g->plan = *next;
      *next = tmp;
      cap_plan_destroy(next);
      return 0;
    }
  }
  cap_plan_destroy(next);
  if (rc || !any || hi - lo == 1)
    return rc;
  uint32_t mid = lo + (hi - lo) / 2;
  rc = try_group(g, lo, mid);
  return rc ? rc : try_group(g, mid, hi);
}

static int upgrade_swaps(cap_plan_t *plan, const cap_profile_t *p,
                         const cap_plan_config_t *cfg, uint32_t max_sims) {
  cand_t *keys = malloc(((size_t)plan->n_actions + 1) * sizeof *keys);
  if (!keys)
    return CAP_ENOMEM;
  uint32_t n = 0;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->method == CAP_METHOD_SWAP &&
        (a->prefetch_tensor == CAP_NONE || (a->flags & CAP_ACTION_SYNC_OUT)))
      keys[n++] = (cand_t){(int64_t)p->tensors[a->tensor].bytes, a->tensor,
                           a->evict_after_access};
  }
  /* in plan order: neighbours in a group share the same stretch of the
   * iteration, so a refused group is refused for a local reason */
  group_t g = {plan, p, cfg, keys, plan->predicted_peak_bytes, UP_PREFETCH,
               max_sims / 2};
  int rc = try_group(&g, 0, n);
  if (!rc) {
    g.kind = UP_ASYNC_OUT;
    g.sims_left += max_sims - max_sims / 2;
    rc = try_group(&g, 0, n);
  }
  free(keys);
  return rc;
}

/* Stall of each swap action's prefetch in the simulated plan, by action
 * index (0: on time, or not a swap). */
static int stalls(const cap_plan_t *plan, const cap_profile_t *p,
                  const cap_plan_config_t *cfg, int64_t **out) {
  *out = calloc((size_t)plan->n_actions + 1, sizeof **out);
  if (!*out)
    return CAP_ENOMEM;
  cap_sim_result_t r;
  int rc = cap_sim_run(p, plan, &cfg->bw, &r);
  if (rc) {
    free(*out);
    *out = NULL;
    return rc;
  }
  for (uint32_t i = 0; i < r.n_prefetches; i++)
    if (r.prefetches[i].action < plan->n_actions)
      (*out)[r.prefetches[i].action] = r.prefetches[i].late_ns;
  cap_sim_result_close(&r);
  return 0;
}

/* One move over the costliest candidates: TO_SWAP for replays (cost: their
 * list's time), DROP for replays and late prefetches (cost: list time or
 * stall). Each change the simulator finds faster and no higher at its peak
 * is kept. */
static int search(cap_plan_t *plan, const cap_profile_t *p,
                  const cap_plan_config_t *cfg, int how, uint32_t max_tries) {
  uint64_t limit = plan->predicted_peak_bytes;
  int64_t *late = NULL;
  int rc = how != TO_SWAP ? stalls(plan, p, cfg, &late) : 0;
  if (rc)
    return rc;
  cand_t *cands = malloc(((size_t)plan->n_actions + 1) * sizeof *cands);
  if (!cands) {
    free(late);
    return CAP_ENOMEM;
  }
  uint32_t n = 0;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (cap_action_is_release(a))
      continue;
    int64_t cost = 0;
    if (a->method == CAP_METHOD_RECOMPUTE && how != EARLIER)
      cost = cap__replay_ns(plan, p, a);
    else if (a->method == CAP_METHOD_SWAP && how != TO_SWAP)
      cost = late[i];
    if (cost > 0)
      cands[n++] = (cand_t){cost, a->tensor, a->evict_after_access};
  }
  qsort(cands, n, sizeof *cands, cmp_cand);
  for (uint32_t i = 0; i < n && i < max_tries && !rc; i++) {
    cap_plan_t *next;
    rc = try_change(plan, p, cfg, &cands[i], how, &next);
    if (rc || !next)
      continue;
    if (keep(next, plan, p, limit)) {
      /* swap the contents: the caller's pointer stays valid */
      cap_plan_t tmp = *plan;
      *plan = *next;
      *next = tmp;
    }
    cap_plan_destroy(next);
  }
  free(cands);
  free(late);
  return rc;
}

int cap__plan_improve(cap_plan_t *plan, const cap_profile_t *p,
                      const cap_plan_config_t *cfg, uint32_t max_tries) {
  if (plan->predicted_peak_bytes > cfg->budget_bytes)
    return 0;
  int rc = search(plan, p, cfg, TO_SWAP, max_tries);
  if (!rc)
    rc = search(plan, p, cfg, DROP, max_tries / 8);
  if (!rc)
    rc = search(plan, p, cfg, EARLIER, max_tries / 2);
  if (!rc)
    rc = upgrade_swaps(plan, p, cfg, max_tries);
  return rc;
}
