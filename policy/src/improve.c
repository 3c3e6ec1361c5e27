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
 *
 * Then replays that share ops merge into the earlier one's list (one replay
 * restores both tensors), and the costliest replays are exchanged for
 * swaps that are cheaper to replay, the replay's tensor taking the swap's
 * copy-engine time.
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

bool cap__take_if_better(cap_plan_t *plan, cap_plan_t *next,
                         const cap_profile_t *p, uint64_t limit) {
  if (!keep(next, plan, p, limit))
    return false;
  /* swap the contents: the caller's pointer stays valid */
  cap_plan_t tmp = *plan;
  *plan = *next;
  *next = tmp;
  return true;
}

int cap__keep_if_faster(cap_plan_t *plan, cap_plan_t *next,
                        const cap_profile_t *p, const cap_bandwidth_t *bw,
                        uint64_t limit, bool *kept) {
  bool ok;
  int rc = simulate(next, p, bw, &ok);
  *kept = ok && cap__take_if_better(plan, next, p, limit);
  cap_plan_destroy(next);
  return rc;
}

int cap__take_with_earlier_prefetches(cap_plan_t *plan, cap_plan_t *next,
                                      const cap_profile_t *p,
                                      const cap_plan_config_t *cfg,
                                      uint64_t limit, uint32_t rounds,
                                      int64_t *first_ns, bool *kept) {
  *kept = false;
  int rc = 0;
  for (uint32_t round = 0; !rc && round < rounds; round++) {
    cap_sim_result_t r;
    rc = cap_sim_run(p, next, &cfg->bw, &r);
    if (rc)
      break;
    next->predicted_iter_ns = r.iter_ns;
    next->predicted_peak_bytes = r.peak_bytes;
    if (!round && first_ns)
      *first_ns = r.iter_ns;
    *kept = cap__take_if_better(plan, next, p, limit);
    bool moved = false;
    for (uint32_t i = 0; i < r.n_prefetches && !*kept; i++) {
      cap_action_t *pa = &next->actions[r.prefetches[i].action];
      uint32_t tt, ta;
      if (r.prefetches[i].late_ns > 0 &&
          cap__earlier_trigger(p, pa, r.prefetches[i].late_ns,
                               cfg->trigger_margin_ns, &tt, &ta)) {
        moved |= pa->prefetch_tensor != tt || pa->prefetch_access != ta;
        pa->prefetch_tensor = tt;
        pa->prefetch_access = ta;
      }
    }
    cap_sim_result_close(&r);
    if (!moved)
      break;
  }
  return rc;
}

void cap__make_swap(cap_action_t *a, const cap_profile_t *p,
                    const cap_plan_config_t *cfg, int64_t lead) {
  uint32_t tt, ta;
  a->method = CAP_METHOD_SWAP;
  a->recompute_off = a->n_recompute = 0;
  a->flags = 0;
  a->prefetch_tensor = CAP_NONE;
  a->prefetch_access = 0;
  int64_t in_ns = cap_copy_ns(p->tensors[a->tensor].bytes, cfg->bw.h2d_gbps);
  if (cap__earlier_trigger(p, a, in_ns + lead, cfg->trigger_margin_ns, &tt,
                           &ta)) {
    a->prefetch_tensor = tt;
    a->prefetch_access = ta;
  }
}

#define LINEAGE_MAX_OPS 16u /* longest lineage a swap may turn into */

int cap__lineage_ns(cap__lineage_t *l, const cap_profile_t *p,
                    const cap_action_t *a, int64_t *ns) {
  uint32_t out = cap_profile_access_op(p, a->tensor, a->evict_after_access);
  uint32_t back =
      cap_profile_access_op(p, a->tensor, a->evict_after_access + 1);
  *ns = -1;
  int rc = cap__lineage(l, p, a->tensor, out, back, NULL, LINEAGE_MAX_OPS);
  if (rc == CAP_ENOENT)
    return 0;
  if (rc)
    return rc;
  *ns = 0;
  for (uint32_t i = 0; i < l->n_ops; i++)
    *ns += p->ops[l->ops[i]].end_ns - p->ops[l->ops[i]].start_ns;
  return 0;
}

int cap__set_replay(cap_plan_t *plan, uint32_t ai, const cap__lineage_t *l) {
  cap_action_t *x = &plan->actions[ai];
  x->method = CAP_METHOD_RECOMPUTE;
  x->flags = 0;
  x->prefetch_tensor = CAP_NONE;
  x->prefetch_access = 0;
  return cap__plan_set_list(plan, ai, l->ops, l->n_ops);
}

enum { TO_SWAP, DROP, EARLIER, TO_REPLAY, TO_SWAP_EARLY };

/* The plan with the replay of (tensor, k) turned into a swap (TO_SWAP;
 * TO_SWAP_EARLY: its prefetch a whole copy earlier),
 * with the eviction of (tensor, k) left out (DROP: the tensor stays),
 * with the prefetch of the swap of (tensor, k) started its lateness (cd's
 * cost) earlier (EARLIER), or with that late swap replayed instead when
 * its lineage takes less than the lateness (TO_REPLAY: a prefetch no
 * trigger can bring in time, of a tensor cheap to rebuild), made explicit
 * and simulated; NULL in *out when there is nothing to change or its lists
 * cannot run as written. */
static int try_change(const cap_plan_t *plan, const cap_profile_t *p,
                      const cap_plan_config_t *cfg, const cand_t *cd, int how,
                      cap_plan_t **out) {
  *out = NULL;
  uint32_t ai = cap__find_action(plan, cd->tensor, cd->k);
  if (ai == CAP_NONE || cap_action_is_release(&plan->actions[ai]) ||
      ((how == TO_SWAP || how == TO_SWAP_EARLY) &&
       plan->actions[ai].method != CAP_METHOD_RECOMPUTE) ||
      ((how == EARLIER || how == TO_REPLAY) &&
       plan->actions[ai].method != CAP_METHOD_SWAP))
    return 0;
  cap__lineage_t lin = {0};
  if (how == TO_REPLAY) {
    int64_t ns;
    int rc = cap__lineage_ns(&lin, p, &plan->actions[ai], &ns);
    if (rc || ns < 0 || ns >= cd->cost_ns) {
      cap__lineage_close(&lin);
      return rc;
    }
  }
  uint32_t tt, ta;
  if (how == EARLIER &&
      !cap__earlier_trigger(p, &plan->actions[ai], cd->cost_ns,
                            cfg->trigger_margin_ns, &tt, &ta))
    return 0;
  cap_plan_t *next = cap_plan_clone(plan);
  if (!next) {
    cap__lineage_close(&lin);
    return CAP_ENOMEM;
  }
  cap_action_t *a = &next->actions[ai];
  if (how == TO_REPLAY) {
    int rc = cap__set_replay(next, ai, &lin);
    cap__lineage_close(&lin);
    if (rc) {
      cap_plan_destroy(next);
      return rc;
    }
    goto explicit;
  }
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
  /* TO_SWAP_EARLY: its prefetch a whole copy earlier than just in time */
  cap__make_swap(a, p, cfg,
            how == TO_SWAP_EARLY
                ? cap_copy_ns(p->tensors[a->tensor].bytes, cfg->bw.h2d_gbps)
                : 0);
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
    uint32_t ai = cap__find_action(next, g->keys[i].tensor, g->keys[i].k);
    if (ai != CAP_NONE && next->actions[ai].method == CAP_METHOD_SWAP)
      any |= upgrade(g, &next->actions[ai]);
  }
  int rc = 0;
  if (any) {
    g->sims_left--;
    bool ok;
    rc = simulate(next, g->p, &g->cfg->bw, &ok);
    if (ok && cap__take_if_better(g->plan, next, g->p, g->limit)) {
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
                         const cap_plan_config_t *cfg, uint64_t limit,
                         uint32_t max_sims) {
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
  group_t g = {plan, p, cfg, keys, limit, UP_PREFETCH,
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
 * stall), EARLIER and TO_REPLAY for late prefetches (cost: stall). Each
 * change the simulator finds faster and no higher at its peak is kept. */
static int lists_that_run(const cap_plan_t *plan, const cap_profile_t *p,
                          const cap_plan_config_t *cfg, uint8_t **out);

static int search(cap_plan_t *plan, const cap_profile_t *p,
                  const cap_plan_config_t *cfg, int how, uint64_t limit,
                  uint32_t max_tries) {
  int64_t *late = NULL;
  uint8_t *runs = NULL;
  int rc = how != TO_SWAP ? stalls(plan, p, cfg, &late) : 0;
  /* a replay whose list never runs (an earlier segment restores its
   * tensor) costs nothing: not a candidate. Short profiles only: one more
   * simulation per move (bert_large's planning time is bounded). */
  if (!rc && p->n_ops < CAP__SMALL_OPS && (how == TO_SWAP || how == DROP))
    rc = lists_that_run(plan, p, cfg, &runs);
  if (rc) {
    free(late);
    return rc;
  }
  cand_t *cands = malloc(((size_t)plan->n_actions + 1) * sizeof *cands);
  if (!cands) {
    free(late);
    free(runs);
    return CAP_ENOMEM;
  }
  uint32_t n = 0;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (cap_action_is_release(a))
      continue;
    int64_t cost = 0;
    if (a->method == CAP_METHOD_RECOMPUTE && (how == TO_SWAP || how == DROP) &&
        (!runs || runs[i]))
      cost = cap__replay_ns(plan, p, a);
    else if (a->method == CAP_METHOD_SWAP && how != TO_SWAP)
      cost = late[i];
    if (cost > 0)
      cands[n++] = (cand_t){cost, a->tensor, a->evict_after_access};
  }
  qsort(cands, n, sizeof *cands, cmp_cand);
  for (uint32_t i = 0; i < n && i < max_tries && !rc; i++) {
    /* A prefetch started its whole lateness earlier may start inside an
     * op with no room for it (vgg16's 392 MiB gradient during the first
     * convolution's backward): then try half and a quarter of it, a
     * trigger after that op, which hides part of the copy. */
    cand_t cd = cands[i];
    for (uint32_t part = 0;
         part < (how == EARLIER && p->n_ops < CAP__SMALL_OPS ? 3u : 1u) && !rc;
         part++, cd.cost_ns /= 2) {
      cap_plan_t *next = NULL;
      rc = try_change(plan, p, cfg, &cd, how, &next);
      bool kept = !rc && next && cap__take_if_better(plan, next, p, limit);
      /* a prefetch just in time may come late behind other prefetches or
       * land inside a peak: on short profiles try one a whole copy earlier
       * too */
      if (!rc && !kept && how == TO_SWAP && p->n_ops < CAP__SMALL_OPS) {
        cap_plan_destroy(next);
        next = NULL;
        rc = try_change(plan, p, cfg, &cd, TO_SWAP_EARLY, &next);
        kept = !rc && next && cap__take_if_better(plan, next, p, limit);
      }
      cap_plan_destroy(next);
      if (kept)
        break;
    }
  }
  free(cands);
  free(late);
  free(runs);
  return rc;
}

/* --- replays that share their lineage ------------------------------------
 * The greedy builds each recompute list alone, so two dropped tensors made
 * by the same few ops each pay for them: a CNN's batch-norm output (kept
 * for the next conv's backward) and its clone before the in-place
 * activation (kept for the activation's backward) both replay the batch
 * norm. One replay of the union at the earlier back-access restores both
 * (a list brings back every dropped tensor it produces), so the later list
 * never runs; the price is holding that tensor from the earlier
 * back-access on, which the simulator weighs. */

#define SHARE_MAX_OPS 128u /* longest merged list */
/* candidates looked at per try allowed (a look scans the whole plan) */
#define SCAN_PER_TRY 4u

/* Time of the ops both sorted lists replay, ns. */
static int64_t shared_ns(const cap_profile_t *p, const uint32_t *x,
                         uint32_t nx, const uint32_t *y, uint32_t ny) {
  int64_t ns = 0;
  for (uint32_t i = 0, j = 0; i < nx && j < ny;) {
    if (x[i] < y[j]) {
      i++;
    } else if (y[j] < x[i]) {
      j++;
    } else {
      ns += p->ops[x[i]].end_ns - p->ops[x[i]].start_ns;
      i++, j++;
    }
  }
  return ns;
}

/* The replay that best takes over action bi's: back-access while bi's
 * tensor is off the device (after its evicted-access, before its own
 * back-access), sharing the most replay time with it (the latest such
 * back-access on a tie: the tensor comes back least early). CAP_NONE
 * when no replay shares an op. */
static uint32_t share_partner(const cap_plan_t *plan, const cap_profile_t *p,
                              const uint8_t *runs, uint32_t bi) {
  const cap_action_t *b = &plan->actions[bi];
  uint32_t out = cap_profile_access_op(p, b->tensor, b->evict_after_access);
  uint32_t back =
      cap_profile_access_op(p, b->tensor, b->evict_after_access + 1);
  const uint32_t *y = cap_action_recompute_ops(plan, b);
  uint32_t best = CAP_NONE, best_back = 0;
  int64_t best_ns = 0;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (i == bi || a->method != CAP_METHOD_RECOMPUTE || !a->n_recompute ||
        (runs && !runs[i]))
      continue;
    uint32_t ab =
        cap_profile_access_op(p, a->tensor, a->evict_after_access + 1);
    if (ab <= out || ab >= back)
      continue;
    int64_t ns = shared_ns(p, cap_action_recompute_ops(plan, a), a->n_recompute,
                           y, b->n_recompute);
    if (ns > best_ns || (ns == best_ns && ns > 0 && ab > best_back)) {
      best = i;
      best_ns = ns;
      best_back = ab;
    }
  }
  return best;
}

/* Per action of plan, whether the simulator runs its own list (1): a list
 * whose tensor an earlier list brings back as part of its segment never
 * runs, and merging into it changes nothing. NULL in *out on CAP_ENOMEM
 * or a plan the simulator refuses (then every partner is tried). */
static int lists_that_run(const cap_plan_t *plan, const cap_profile_t *p,
                          const cap_plan_config_t *cfg, uint8_t **out) {
  *out = NULL;
  cap_sim_result_t r;
  cap_residency_t *res = NULL;
  uint32_t n_res = 0;
  if (cap_sim_residency(p, plan, &cfg->bw, &r, &res, &n_res))
    return 0;
  cap_sim_result_close(&r);
  uint8_t *runs = calloc((size_t)plan->n_actions + 1, 1);
  if (!runs) {
    free(res);
    return CAP_ENOMEM;
  }
  for (uint32_t i = 0; i < n_res; i++)
    if (res[i].kind == CAP_RESIDENCY_RECOMPUTED &&
        res[i].action < plan->n_actions &&
        plan->actions[res[i].action].tensor == res[i].tensor)
      runs[res[i].action] = 1;
  free(res);
  *out = runs;
  return 0;
}

/* For the costliest replays (at most max_tries), merge each into its
 * partner's list (one that runs); keep each merge the simulator finds
 * faster and no higher at its peak. */
static int share_replays(cap_plan_t *plan, const cap_profile_t *p,
                         const cap_plan_config_t *cfg, uint64_t limit,
                         uint32_t max_tries) {
  cand_t *cands = malloc(((size_t)plan->n_actions + 1) * sizeof *cands);
  if (!cands)
    return CAP_ENOMEM;
  uint32_t n = 0;
  for (uint32_t i = 0; i < plan->n_actions; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->method == CAP_METHOD_RECOMPUTE && a->n_recompute)
      cands[n++] = (cand_t){cap__replay_ns(plan, p, a), a->tensor,
                            a->evict_after_access};
  }
  qsort(cands, n, sizeof *cands, cmp_cand);
  uint8_t *runs = NULL;
  int rc = lists_that_run(plan, p, cfg, &runs);
  /* each look for a partner scans the plan: the costliest few only */
  for (uint32_t i = 0, tries = 0;
       i < n && i < SCAN_PER_TRY * max_tries && tries < max_tries && !rc; i++) {
    uint32_t bi = cap__find_action(plan, cands[i].tensor, cands[i].k);
    uint32_t ai = bi == CAP_NONE ? CAP_NONE : share_partner(plan, p, runs, bi);
    if (ai == CAP_NONE)
      continue;
    tries++;
    cap_plan_t *next = cap_plan_clone(plan);
    if (!next) {
      rc = CAP_ENOMEM;
      break;
    }
    rc = cap__plan_merge_lists(next, ai, bi, SHARE_MAX_OPS);
    bool kept = false;
    if (!rc) {
      rc = cap__keep_if_faster(plan, next, p, &cfg->bw, limit, &kept);
    } else {
      cap_plan_destroy(next);
      if (rc == CAP_ENOENT)
        rc = 0;
    }
    /* the merged list now restores more: others may no longer run */
    if (kept && !rc) {
      free(runs);
      rc = lists_that_run(plan, p, cfg, &runs);
    }
  }
  free(runs);
  free(cands);
  return rc;
}

/* --- a swap exchanged for a replay -----------------------------------------
 * The greedy gives the D2H engine's time away one tensor at a time, in
 * free-time (or replay-cost) order; a tensor it swapped early may replay
 * cheaply while one it could no longer swap replays dearly. Exchange them:
 * the cheap one is replayed (its lineage, with what is off the device
 * rebuilt by cap__plan_make_explicit), the costly one swapped just in time
 * on the copy-engine time the first leaves (it is at least as large and
 * copied out no later). */

/* The cheapest swap to replay in place of replay yi: cheaper than it,
 * at least as large, (when before) copied out no later, and not one of the
 * n_refused the simulator refused already; CAP_NONE when none. */
static uint32_t exchange_partner(const cap_plan_t *plan, const cap_profile_t *p,
                                 const int64_t *swap_ns, uint32_t yi,
                                 int64_t y_ns, bool before,
                                 const uint32_t *refused, uint32_t n_refused) {
  const cap_action_t *y = &plan->actions[yi];
  uint32_t y_out = cap_profile_access_op(p, y->tensor, y->evict_after_access);
  uint64_t y_bytes = p->tensors[y->tensor].bytes;
  uint32_t xi = CAP_NONE;
  int64_t best = y_ns;
  for (uint32_t j = 0; j < plan->n_actions; j++) {
    const cap_action_t *x = &plan->actions[j];
    if (swap_ns[j] < 0 || swap_ns[j] >= best ||
        x->method != CAP_METHOD_SWAP ||
        p->tensors[x->tensor].bytes < y_bytes ||
        (before &&
         cap_profile_access_op(p, x->tensor, x->evict_after_access) > y_out))
      continue;
    bool seen = false;
    for (uint32_t r = 0; r < n_refused && !seen; r++)
      seen = refused[r] == j;
    if (seen)
      continue;
    xi = j;
    best = swap_ns[j];
  }
  return xi;
}

/* Replay swap xi and swap replay yi in a copy of plan; *kept when the
 * simulator accepts it (plan then holds it). */
static int try_exchange(cap_plan_t *plan, const cap_profile_t *p,
                        const cap_plan_config_t *cfg, cap__lineage_t *lin,
                        uint32_t xi, uint32_t yi, uint64_t limit, bool *kept) {
  *kept = false;
  int64_t ns;
  int rc = cap__lineage_ns(lin, p, &plan->actions[xi], &ns);
  if (rc || ns < 0)
    return rc;
  cap_plan_t *next = cap_plan_clone(plan);
  if (!next)
    return CAP_ENOMEM;
  rc = cap__set_replay(next, xi, lin);
  cap__make_swap(&next->actions[yi], p, cfg, 0);
  if (!rc)
    rc = cap__plan_make_explicit(next, p, NULL);
  if (!rc)
    return cap__keep_if_faster(plan, next, p, &cfg->bw, limit, kept);
  cap_plan_destroy(next);
  return rc;
}

/* Swaps tried per replay: the cheapest to replay first (the simulator may
 * refuse one for where its copies or its replay fall). */
#define EXCHANGE_PARTNERS 3u

static int exchange(cap_plan_t *plan, const cap_profile_t *p,
                    const cap_plan_config_t *cfg, uint64_t limit,
                    uint32_t max_tries) {
  uint32_t n_act = plan->n_actions;
  cand_t *cands = malloc(((size_t)n_act + 1) * sizeof *cands);
  int64_t *swap_ns = malloc(((size_t)n_act + 1) * sizeof *swap_ns);
  cap__lineage_t lin = {0};
  int rc = cands && swap_ns ? 0 : CAP_ENOMEM;
  uint32_t n = 0;
  /* the replay time of each swap, fixed for the search: an exchange that
   * is kept changes other lists only through make_explicit */
  for (uint32_t i = 0; i < n_act && !rc; i++) {
    const cap_action_t *a = &plan->actions[i];
    swap_ns[i] = -1;
    if (a->method == CAP_METHOD_SWAP)
      rc = cap__lineage_ns(&lin, p, a, &swap_ns[i]);
    else if (!cap_action_is_release(a))
      cands[n++] = (cand_t){cap__replay_ns(plan, p, a), a->tensor,
                            a->evict_after_access};
  }
  if (!rc)
    qsort(cands, n, sizeof *cands, cmp_cand);
  for (uint32_t i = 0, tries = 0;
       i < n && i < SCAN_PER_TRY * max_tries && tries < max_tries && !rc; i++) {
    uint32_t yi = cap__find_action(plan, cands[i].tensor, cands[i].k);
    if (yi == CAP_NONE || plan->actions[yi].method != CAP_METHOD_RECOMPUTE)
      continue;
    /* first a swap whose copy out the replay's can take over; then any:
     * a later copy out that the engine then runs earlier */
    uint32_t refused[EXCHANGE_PARTNERS], n_refused = 0;
    bool kept = false;
    for (int before = 1; before >= 0 && !kept && !rc; before--) {
      while (!kept && !rc && n_refused < EXCHANGE_PARTNERS) {
        uint32_t xi = exchange_partner(plan, p, swap_ns, yi, cands[i].cost_ns,
                                       before, refused, n_refused);
        if (xi == CAP_NONE)
          break;
        tries++;
        refused[n_refused++] = xi;
        rc = try_exchange(plan, p, cfg, &lin, xi, yi, limit, &kept);
        if (kept)
          swap_ns[xi] = -1; /* a replay now */
      }
    }
  }
  cap__lineage_close(&lin);
  free(cands);
  free(swap_ns);
  return rc;
}

/* The search's moves, each change kept only when faster and no higher
 * than limit at its peak. */
static int improve_to(cap_plan_t *plan, const cap_profile_t *p,
                      const cap_plan_config_t *cfg, uint64_t limit,
                      uint32_t max_tries) {
  /* the moves on pairs of actions scan the plan for partners: on short
   * profiles only, where planning time is to spare */
  uint32_t pair_tries = p->n_ops < CAP__SMALL_OPS ? max_tries : 0;
  int rc = search(plan, p, cfg, TO_SWAP, limit, max_tries);
  if (!rc)
    rc = search(plan, p, cfg, DROP, limit, max_tries / 8);
  if (!rc)
    rc = search(plan, p, cfg, EARLIER, limit, max_tries / 2);
  if (!rc)
    rc = upgrade_swaps(plan, p, cfg, limit, max_tries);
  if (!rc)
    rc = search(plan, p, cfg, TO_REPLAY, limit, max_tries / 2);
  if (!rc && pair_tries)
    rc = share_replays(plan, p, cfg, limit, pair_tries);
  if (!rc && pair_tries)
    rc = exchange(plan, p, cfg, limit, pair_tries);
  return rc;
}

int cap__plan_improve(cap_plan_t *plan, const cap_profile_t *p,
                      const cap_plan_config_t *cfg, uint32_t max_tries) {
  if (plan->predicted_peak_bytes > cfg->budget_bytes)
    return 0;
  return improve_to(plan, p, cfg, plan->predicted_peak_bytes, max_tries);
}

int cap__plan_use_room(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg, uint32_t max_tries) {
  if (plan->predicted_peak_bytes > cfg->budget_bytes)
    return 0;
  return improve_to(plan, p, cfg, cfg->budget_bytes, max_tries);
}
