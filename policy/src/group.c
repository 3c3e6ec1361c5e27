/*
 * Whole multi-output ops replayed (a local-search move on the final plan).
 *
 * One replay of an op restores every output the plan dropped (plan
 * semantics), but the greedy ranks each output's eviction alone: vgg16's
 * max_pool2d_with_indices returns the pooled output and its indices, and
 * at 60 % the greedy drops the first pool's indices (392 MiB for its
 * 0.614 ms op) while it keeps the pooled output that the same replay would
 * bring back, swaps the next pool's indices, and pays for the second
 * convolution's output (1.38 ms) instead. Here, for the ops with two or
 * more evictable outputs, cheapest per byte first, every output is
 * dropped over its longest access gap and replayed by that op (the plan
 * made explicit), cumulatively; what each step frees goes to the costliest
 * replays, tried as swaps with prefetches just in time and a whole copy
 * earlier (kept when faster and no higher than the plan's peak). A step
 * then at most 1/GROUP_SLACK slower than the best plan so far gets the
 * local search, the prefetches issued just before its late ones started
 * earlier (the H2D engine is a FIFO) and a short trigger polish; a step
 * that fits and is still slower is left out of the next steps. The best
 * plan seen replaces the plan when it is faster, no higher at its peak,
 * and valid.
 */
#include <stdlib.h>

#include "capuchin/error.h"
#include "capuchin_internal.h"
#include "planners.h"

#define GROUP_SWAP_TRIES 4u /* costliest replays tried as swaps per step */
#define BLOCKER_LATE 4u     /* late prefetches whose blockers are moved */
#define BLOCKERS 3u         /* prefetches issued before one, tried earlier */
#define GROUP_POLISH_SIMS 16u /* trigger polish on a step searched */
#define GROUP_SLACK 20 /* a step 1/20 slower than the best is searched */

typedef struct {
  double key; /* bytes per ns of the op */
  uint32_t op;
} group_t;

static int cmp_group(const void *a, const void *b) {
  const group_t *x = a, *y = b;
  if (x->key != y->key)
    return x->key > y->key ? -1 : 1;
  return x->op < y->op ? -1 : x->op > y->op;
}

/* Access k of tensor t whose gap (k, k+1) is the longest in time, its
 * evicted-access at or after op `from`; 0 when t has no such gap. */
static uint32_t longest_gap(const cap_profile_t *p, uint32_t t, uint32_t from) {
  const cap_tensor_t *x = &p->tensors[t];
  uint32_t best = 0;
  int64_t len = 0;
  for (uint32_t k = 1; k < x->n_accesses; k++) {
    uint32_t a = p->access_ops[x->access_off + k - 1];
    uint32_t b = p->access_ops[x->access_off + k];
    int64_t l = p->ops[b].start_ns - p->ops[a].end_ns;
    if (a >= from && l > len) {
      len = l;
      best = k;
    }
  }
  return best;
}

/* Outputs of op o it produces that a plan may evict, with their gaps, into
 * ts/ks (at most max); their bytes. */
static uint64_t group_outputs(const cap_profile_t *p,
                              const cap_plan_config_t *cfg, uint32_t o,
                              uint32_t *ts, uint32_t *ks, uint32_t max,
                              uint32_t *n) {
  const cap_op_t *op = &p->ops[o];
  uint64_t bytes = 0;
  *n = 0;
  for (uint32_t j = 0; j < op->n_out && *n < max; j++) {
    uint32_t t = p->op_tensors[op->out_off + j];
    if (p->tensors[t].producer_op != o || p->tensors[t].no_evict ||
        !cap__evictable(p, cfg, t))
      continue;
    bool seen = false;
    for (uint32_t i = 0; i < *n; i++)
      seen |= ts[i] == t;
    uint32_t k = seen ? 0 : longest_gap(p, t, o);
    if (!k)
      continue;
    ts[*n] = t;
    ks[*n] = k;
    (*n)++;
    bytes += p->tensors[t].bytes;
  }
  return bytes;
}

/* Every output of op o dropped over its longest gap, replayed by o. */
static int drop_group(cap_plan_t *plan, const cap_profile_t *p,
                      const cap_plan_config_t *cfg, uint32_t o) {
  uint32_t ts[8], ks[8], n;
  group_outputs(p, cfg, o, ts, ks, 8, &n);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t ai = cap__find_action(plan, ts[i], ks[i]);
    int rc;
    if (ai == CAP_NONE) {
      rc = cap_plan_add_recompute(plan, ts[i], ks[i], &o, 1);
    } else {
      cap_action_t *a = &plan->actions[ai];
      a->method = CAP_METHOD_RECOMPUTE;
      a->flags = 0;
      a->prefetch_tensor = CAP_NONE;
      a->prefetch_access = 0;
      rc = cap__plan_set_list(plan, ai, &o, 1);
    }
    if (rc)
      return rc;
  }
  return 0;
}

/* A clone of plan with action ai swapped, its prefetch just in time on idle
 * engines `lead` ns earlier, made explicit and simulated; NULL in *out when
 * it cannot run as written. */
static int as_swap(const cap_plan_t *plan, const cap_profile_t *p,
                   const cap_plan_config_t *cfg, uint32_t ai, int64_t lead,
                   cap_plan_t **out) {
  *out = NULL;
  cap_plan_t *next = cap_plan_clone(plan);
  if (!next)
    return CAP_ENOMEM;
  cap__make_swap(&next->actions[ai], p, cfg, lead);
  int rc = cap__plan_make_explicit(next, p, NULL);
  if (!rc)
    rc = cap__plan_predict(next, p, &cfg->bw);
  if (rc) {
    cap_plan_destroy(next);
    return rc == CAP_EINVAL ? 0 : rc;
  }
  *out = next;
  return 0;
}

/* The costliest replays of plan as swaps, each kept when faster and no
 * higher than limit at its peak. */
static int replays_to_swaps(cap_plan_t *plan, const cap_profile_t *p,
                            const cap_plan_config_t *cfg, uint64_t limit) {
  int rc = 0;
  uint32_t *tried = malloc(GROUP_SWAP_TRIES * 2 * sizeof *tried);
  if (!tried)
    return CAP_ENOMEM;
  for (uint32_t t = 0; t < GROUP_SWAP_TRIES && !rc; t++) {
    uint32_t pick = CAP_NONE;
    int64_t top = 0;
    for (uint32_t i = 0; i < plan->n_actions; i++) {
      const cap_action_t *a = &plan->actions[i];
      bool done = false;
      for (uint32_t j = 0; j < t; j++)
        done |= tried[2 * j] == a->tensor &&
                tried[2 * j + 1] == a->evict_after_access;
      int64_t cost = cap__replay_ns(plan, p, a);
      if (!done && cost > top) {
        top = cost;
        pick = i;
      }
    }
    if (pick == CAP_NONE)
      break;
    tried[2 * t] = plan->actions[pick].tensor;
    tried[2 * t + 1] = plan->actions[pick].evict_after_access;
    int64_t copy = cap_copy_ns(p->tensors[plan->actions[pick].tensor].bytes,
                               cfg->bw.h2d_gbps);
    int64_t leads[2] = {0, copy};
    for (uint32_t l = 0; l < 2 && !rc; l++) {
      cap_plan_t *next;
      rc = as_swap(plan, p, cfg, pick, leads[l], &next);
      if (rc || !next)
        continue;
      bool kept = false;
      rc = cap__keep_if_faster(plan, next, p, &cfg->bw, limit, &kept);
      if (kept)
        break;
    }
  }
  free(tried);
  return rc;
}

/* Op at which swap action a's prefetch is issued (its back-access when on
 * demand). */
static uint32_t issue_op(const cap_profile_t *p, const cap_action_t *a) {
  if (a->prefetch_tensor != CAP_NONE)
    return cap_profile_access_op(p, a->prefetch_tensor, a->prefetch_access);
  return cap_profile_access_op(p, a->tensor, a->evict_after_access + 1);
}

/* A late prefetch often waits behind the one issued just before it on the
 * H2D queue (vgg16 at 60 %: a 196 MiB gradient input's ahead of a 392 MiB
 * activation's): start those, the nearest first, the lateness (and twice
 * it) earlier, each kept when faster and no higher than limit. */
static int advance_blockers(cap_plan_t *plan, const cap_profile_t *p,
                            const cap_plan_config_t *cfg, uint64_t limit) {
  cap__late_t *l;
  uint32_t n;
  int rc = cap__late_swaps(plan, p, &cfg->bw, &l, &n);
  for (uint32_t i = 0; i < n && i < BLOCKER_LATE && !rc; i++) {
    const cap_action_t *x = &plan->actions[l[i].action];
    uint32_t xi = issue_op(p, x);
    bool kept = false;
    /* the BLOCKERS swaps issued last at or before x's prefetch */
    uint32_t done[BLOCKERS], n_done = 0;
    for (uint32_t b = 0; b < BLOCKERS && !kept && !rc; b++) {
      uint32_t pick = CAP_NONE, pick_op = 0;
      for (uint32_t j = 0; j < plan->n_actions; j++) {
        const cap_action_t *y = &plan->actions[j];
        if (j == l[i].action || y->method != CAP_METHOD_SWAP ||
            cap_action_is_release(y))
          continue;
        uint32_t yi = issue_op(p, y);
        bool seen = false;
        for (uint32_t d = 0; d < n_done; d++)
          seen |= done[d] == j;
        if (!seen && yi <= xi && (pick == CAP_NONE || yi > pick_op)) {
          pick = j;
          pick_op = yi;
        }
      }
      if (pick == CAP_NONE)
        break;
      done[n_done++] = pick;
      for (int64_t m = 1; m <= 2 && !kept && !rc; m++) {
        bool tried;
        rc = cap__try_earlier(plan, p, cfg, pick, l[i].late_ns * m, limit,
                              &tried, &kept);
      }
    }
  }
  free(l);
  return rc;
}

int cap__group_replays(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg, uint32_t max_groups,
                       uint32_t tries) {
  if (!plan->n_actions || plan->predicted_peak_bytes > cfg->budget_bytes)
    return 0;
  uint64_t limit = plan->predicted_peak_bytes;
  group_t *gs = malloc((size_t)p->n_ops * sizeof *gs);
  if (!gs)
    return CAP_ENOMEM;
  uint32_t n = 0;
  for (uint32_t o = 0; o < p->n_ops; o++) {
    const cap_op_t *op = &p->ops[o];
    if (op->flags & (CAP_OP_INPLACE | CAP_OP_VIEW))
      continue;
    uint32_t ts[8], ks[8], m;
    uint64_t bytes = group_outputs(p, cfg, o, ts, ks, 8, &m);
    if (m < 2)
      continue;
    gs[n++] =
        (group_t){(double)bytes / (double)(op->end_ns - op->start_ns + 1), o};
  }
  qsort(gs, n, sizeof *gs, cmp_group);
  if (n > max_groups)
    n = max_groups;
  int rc = 0;
  cap_plan_t *cur = n ? cap_plan_clone(plan) : NULL, *best = NULL;
  if (n && !cur)
    rc = CAP_ENOMEM;
  for (uint32_t g = 0; g < n && !rc; g++) {
    cap_plan_t *prev = cap_plan_clone(cur);
    if (!prev) {
      rc = CAP_ENOMEM;
      break;
    }
    rc = drop_group(cur, p, cfg, gs[g].op);
    cap_plan_t *trial = rc ? NULL : cap_plan_clone(cur);
    if (!rc && !trial)
      rc = CAP_ENOMEM;
    if (!rc)
      rc = cap__plan_make_explicit(trial, p, NULL);
    if (!rc)
      rc = cap__plan_predict(trial, p, &cfg->bw);
    if (rc) {
      cap_plan_destroy(trial);
      cap_plan_destroy(prev);
      rc = rc == CAP_EINVAL ? 0 : rc;
      continue;
    }
    rc = replays_to_swaps(trial, p, cfg, limit);
    /* the search only on a step at most 1/GROUP_SLACK slower already: the
     * search is the dear part, and most steps are much slower (bert_base's
     * dropouts) */
    int64_t to_beat = best ? best->predicted_iter_ns : plan->predicted_iter_ns;
    bool fits = trial->predicted_peak_bytes <= limit;
    if (!rc && fits &&
        trial->predicted_iter_ns <= to_beat + to_beat / GROUP_SLACK) {
      rc = cap__plan_improve(trial, p, cfg, tries);
      if (!rc)
        rc = advance_blockers(trial, p, cfg, limit);
      if (!rc)
        rc = cap__polish_triggers(trial, p, cfg, GROUP_POLISH_SIMS);
    }
    /* a step that fits and is slower is left out of the next ones; one
     * over the peak stays (the next group may make room: vgg16's first
     * pool's output lengthens the second convolution's list until the
     * second pool is dropped too) */
    if (!rc && fits && trial->predicted_iter_ns > to_beat) {
      cap_plan_t tmp = *cur;
      *cur = *prev;
      *prev = tmp;
    }
    cap_plan_destroy(prev);
    if (!rc && fits && trial->predicted_iter_ns < to_beat &&
        cap_plan_validate(trial, p, NULL, 0) == 0) {
      cap_plan_destroy(best);
      best = trial;
    } else {
      cap_plan_destroy(trial);
    }
  }
  cap_plan_destroy(cur);
  free(gs);
  if (!rc && best) {
    cap_plan_t tmp = *plan;
    *plan = *best;
    *best = tmp;
  }
  cap_plan_destroy(best);
  return rc;
}
