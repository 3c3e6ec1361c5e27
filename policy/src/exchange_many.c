/*
 * Replays and swaps exchanged, one or several for one.
 *
 * On the CNNs the D2H engine is busy up to the memory peak, so which bytes
 * it carries decides how much is replayed. The exchange of improve.c gives
 * a costly replay the copy-engine time of one swap at least as large,
 * simulated once; a replay larger than any single swap that is cheap to
 * replay has no partner there, and a new prefetch just in time often comes
 * late (below). Here, for each of the costliest replays Y, the swaps
 * cheapest to replay per byte (their lineage, sources taken as on the
 * device) are taken, those copied out no later than Y first, then any,
 * until their bytes cover Y's, while their replay time stays under Y's
 * (mobilenet_v2 at 50 %: a 110 MiB batch-norm output, 0.33 ms to replay, is
 * swapped in place of two smaller swaps). The other way round, each swap
 * cheap to replay per byte is replayed and the replays costliest per byte
 * that fit in its bytes are swapped. The swaps replay their lineage
 * (cap__plan_make_explicit rebuilds what is off the device), the replays
 * are swapped with their prefetch just in time on idle engines.
 *
 * A new prefetch just in time queues behind the others that come back at
 * the end of the backward pass, and small ones behind it come late (a
 * batch-norm statistic of 256 bytes 3 ms late behind a 196 MiB tensor): a
 * change is simulated, and while it is not kept, every late prefetch starts
 * its lateness earlier and it is simulated again, a few rounds. It is kept
 * when the simulator finds it faster, no higher at its peak, and valid.
 *
 * Near the floor a plan waits for its copies: at the memory peak the
 * swap-outs that free the room, and the prefetches after, queue behind
 * every copy issued before them (bert_base at 30 % with persistent
 * tensors evictable: 8.8 ms of stalls in 88 ms). A swap whose replay takes
 * less than its copy out, replayed instead, takes its copies out of both
 * queues, and what waited behind them moves up; no exchange above does
 * that, each giving the swap's bytes to another swap. So while the plan
 * stalls more than 1 % of its iteration, its swaps least costly to replay
 * per ns of copy are replayed, one change at a time, kept as above
 * (cap__replay_queued_swaps): 22.3 -> 14.8 % there.
 */
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"
#include "planners.h"

#define LATE_ROUNDS 8u      /* simulations per exchange, at most */
#define MANY_MAX 8u         /* actions exchanged for one */
#define QUEUED_STALL_DIV 100 /* swaps replayed when stalls pass 1 % */

int cap__cmp_item(const void *a, const void *b) {
  const cap__item_t *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  if (x->tensor != y->tensor)
    return x->tensor < y->tensor ? -1 : 1;
  return x->k < y->k ? -1 : x->k > y->k;
}

/* The swaps xs[0 .. nx) replayed and the replays ys[0 .. ny) swapped, in a
 * copy of plan; kept (plan holds it) when the simulator accepts it. */
static int try_many(cap_plan_t *plan, const cap_profile_t *p,
                    const cap_plan_config_t *cfg, cap__lineage_t *lin,
                    const cap__item_t *const *xs, uint32_t nx,
                    const cap__item_t *const *ys, uint32_t ny, uint64_t limit,
                    bool *kept) {
  *kept = false;
  cap_plan_t *next = cap_plan_clone(plan);
  if (!next)
    return CAP_ENOMEM;
  int rc = 0;
  for (uint32_t i = 0; i < nx && !rc; i++) {
    uint32_t xi = cap__find_action(next, xs[i]->tensor, xs[i]->k);
    int64_t ns;
    rc = cap__lineage_ns(lin, p, &next->actions[xi], &ns);
    if (!rc && ns < 0)
      rc = CAP_ENOENT; /* no lineage: nothing to exchange */
    if (rc)
      break;
    rc = cap__set_replay(next, xi, lin);
  }
  for (uint32_t i = 0; i < ny && !rc; i++)
    cap__make_swap(
        &next->actions[cap__find_action(next, ys[i]->tensor, ys[i]->k)], p,
        cfg, 0);
  if (!rc)
    rc = cap__plan_make_explicit(next, p, NULL);
  if (!rc)
    rc = cap__take_with_earlier_prefetches(plan, next, p, cfg, limit,
                                           LATE_ROUNDS, NULL, kept);
  cap_plan_destroy(next);
  return rc == CAP_ENOENT || rc == CAP_EINVAL ? 0 : rc;
}

int cap__exchange_many(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg, uint32_t max_tries) {
  if (plan->predicted_peak_bytes > cfg->budget_bytes)
    return 0;
  uint64_t limit = plan->predicted_peak_bytes;
  uint32_t n_act = plan->n_actions;
  cap__item_t *ys = malloc(((size_t)n_act + 1) * sizeof *ys);
  cap__item_t *xs = malloc(((size_t)n_act + 1) * sizeof *xs);
  cap__item_t *zs = malloc(((size_t)n_act + 1) * sizeof *zs);
  const cap__item_t **pick = malloc(((size_t)n_act + 1) * sizeof *pick);
  cap__lineage_t lin = {0};
  int rc = ys && xs && zs && pick ? 0 : CAP_ENOMEM;
  uint32_t ny = 0, nx = 0, nz = 0;
  for (uint32_t i = 0; i < n_act && !rc; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (cap_action_is_release(a))
      continue;
    uint64_t bytes = p->tensors[a->tensor].bytes;
    if (a->method == CAP_METHOD_RECOMPUTE) {
      int64_t ns = cap__replay_ns(plan, p, a);
      ys[ny++] = (cap__item_t){-(double)ns, ns, a->tensor, a->evict_after_access};
      if (bytes && ns > 0)
        zs[nz++] = (cap__item_t){-(double)ns / (double)bytes, ns, a->tensor,
                            a->evict_after_access};
      continue;
    }
    int64_t ns;
    rc = cap__lineage_ns(&lin, p, a, &ns);
    if (!rc && ns >= 0 && bytes)
      xs[nx++] = (cap__item_t){(double)ns / (double)bytes, ns, a->tensor,
                          a->evict_after_access};
  }
  if (!rc) {
    qsort(ys, ny, sizeof *ys, cap__cmp_item);
    qsort(xs, nx, sizeof *xs, cap__cmp_item);
    qsort(zs, nz, sizeof *zs, cap__cmp_item);
  }
  /* one costly replay swapped, several swaps cheap to replay per byte
   * replayed: first those copied out no later than it, then any */
  for (uint32_t i = 0; i < ny && i < max_tries && !rc; i++) {
    uint32_t yi = cap__find_action(plan, ys[i].tensor, ys[i].k);
    if (yi == CAP_NONE || plan->actions[yi].method != CAP_METHOD_RECOMPUTE)
      continue;
    uint64_t y_bytes = p->tensors[ys[i].tensor].bytes;
    uint32_t y_out = cap_profile_access_op(p, ys[i].tensor, ys[i].k);
    const cap__item_t *y = &ys[i];
    bool kept = false;
    for (int before = 1; before >= 0 && !kept && !rc; before--) {
      uint64_t bytes = 0;
      int64_t ns = 0;
      uint32_t n = 0;
      for (uint32_t j = 0; j < nx && bytes < y_bytes && n < MANY_MAX; j++) {
        uint32_t xi = cap__find_action(plan, xs[j].tensor, xs[j].k);
        if (xi == CAP_NONE || plan->actions[xi].method != CAP_METHOD_SWAP ||
            (before &&
             cap_profile_access_op(p, xs[j].tensor, xs[j].k) > y_out) ||
            ns + xs[j].ns >= y->ns)
          continue;
        ns += xs[j].ns;
        bytes += p->tensors[xs[j].tensor].bytes;
        pick[n++] = &xs[j];
      }
      if (bytes < y_bytes || !n)
        continue;
      rc = try_many(plan, p, cfg, &lin, pick, n, &y, 1, limit, &kept);
    }
  }
  /* one swap cheap to replay per byte replayed, the replays costliest per
   * byte that fit in its bytes swapped */
  for (uint32_t i = 0; i < nx && i < max_tries && !rc; i++) {
    uint32_t xi = cap__find_action(plan, xs[i].tensor, xs[i].k);
    if (xi == CAP_NONE || plan->actions[xi].method != CAP_METHOD_SWAP)
      continue;
    uint64_t x_bytes = p->tensors[xs[i].tensor].bytes, bytes = 0;
    int64_t ns = 0;
    uint32_t n = 0;
    for (uint32_t j = 0; j < nz && n < MANY_MAX; j++) {
      uint32_t zi = cap__find_action(plan, zs[j].tensor, zs[j].k);
      uint64_t b = p->tensors[zs[j].tensor].bytes;
      if (zi == CAP_NONE || plan->actions[zi].method != CAP_METHOD_RECOMPUTE ||
          bytes + b > x_bytes)
        continue;
      ns += zs[j].ns;
      bytes += b;
      pick[n++] = &zs[j];
    }
    if (!n || ns <= xs[i].ns)
      continue;
    const cap__item_t *x = &xs[i];
    bool kept;
    rc = try_many(plan, p, cfg, &lin, &x, 1, pick, n, limit, &kept);
  }
  cap__lineage_close(&lin);
  free(ys);
  free(xs);
  free(zs);
  free(pick);
  return rc;
}

int cap__replay_queued_swaps(cap_plan_t *plan, const cap_profile_t *p,
                             const cap_plan_config_t *cfg, uint32_t max_tries) {
  if (plan->predicted_peak_bytes > cfg->budget_bytes)
    return 0;
  cap_sim_result_t r;
  int rc = cap_sim_run(p, plan, &cfg->bw, &r);
  if (rc)
    return rc == CAP_EINVAL ? 0 : rc;
  /* a short wait is the trigger polish's (a prefetch started earlier), a
   * long one the queues' */
  bool queued = r.stall_ns * QUEUED_STALL_DIV > r.iter_ns;
  cap_sim_result_close(&r);
  if (!queued)
    return 0;
  cap__item_t *xs = malloc(((size_t)plan->n_actions + 1) * sizeof *xs);
  cap__lineage_t lin = {0};
  uint32_t nx = 0;
  rc = xs ? 0 : CAP_ENOMEM;
  /* the swaps whose replay takes less than their copy out, least replay
   * time per copy time first */
  for (uint32_t i = 0; i < plan->n_actions && !rc; i++) {
    const cap_action_t *a = &plan->actions[i];
    if (a->method != CAP_METHOD_SWAP || cap_action_is_release(a))
      continue;
    int64_t ns,
        copy = cap_copy_ns(p->tensors[a->tensor].bytes, cfg->bw.d2h_gbps);
    rc = cap__lineage_ns(&lin, p, a, &ns);
    if (!rc && ns >= 0 && ns < copy)
      xs[nx++] = (cap__item_t){(double)ns / (double)copy, ns, a->tensor,
                               a->evict_after_access};
  }
  if (!rc && nx)
    qsort(xs, nx, sizeof *xs, cap__cmp_item);
  uint64_t limit = plan->predicted_peak_bytes;
  for (uint32_t i = 0, tries = 0; i < nx && tries < max_tries && !rc; i++) {
    uint32_t xi = cap__find_action(plan, xs[i].tensor, xs[i].k);
    if (xi == CAP_NONE || plan->actions[xi].method != CAP_METHOD_SWAP)
      continue;
    tries++;
    const cap__item_t *x = &xs[i];
    bool kept;
    rc = try_many(plan, p, cfg, &lin, &x, 1, NULL, 0, limit, &kept);
  }
  cap__lineage_close(&lin);
  free(xs);
  return rc;
}
