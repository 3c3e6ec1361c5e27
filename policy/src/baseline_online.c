/*
 * The two online baselines, run over the profile as they would run during
 * the iteration, their decisions recorded as a plan:
 *
 * dtr: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021). When
 *   an allocation would exceed the budget, evict the resident tensor with
 *   the smallest h = cost / (bytes * staleness) (cost: the time to replay
 *   the ops that wrote it; staleness: time since its last access), until the
 *   allocation fits; a tensor needed while evicted is rematerialized on
 *   demand by replaying its lineage, recursively through evicted inputs.
 * passive-lru: Capuchin's passive mode: when an allocation would exceed the
 *   budget, swap out the least recently used tensors synchronously until it
 *   fits; bring them back on demand.
 *
 * An eviction decided at time t is recorded as "evict after its last access
 * before t" (the plan's eviction point), which frees the memory no later
 * than the online policy did. Tensors with no later access are not evicted
 * (a plan cannot name an eviction without a back-access, and a tensor with
 * no further use is garbage the framework frees on its own).
 */
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "planners.h"

enum { O_UNBORN = 0, O_RES, O_GONE, O_FREED };
enum { MODE_DTR, MODE_LRU, MODE_BELADY };

/* Longest replay list DTR will sign up for; beyond it the tensor stays. */
#define MAX_LIST 32

typedef struct {
  uint32_t tensor, k;
  uint32_t list_off, n_list; /* dtr: into on->lists; n_list 0: none yet */
  bool dead;                 /* could not be restored: left out */
} ev_t;

typedef struct {
  const cap_profile_t *p;
  const cap_plan_config_t *cfg;
  int mode;
  uint8_t *st;
  uint8_t *gone; /* st == O_GONE, for cap__lineage */
  uint32_t *lock;  /* == lock_gen: in use now, not evictable */
  uint32_t lock_gen;
  uint32_t *done;  /* accesses completed */
  uint32_t *seen;  /* == op + 1 once counted for that op */
  uint32_t *last_k; /* k of the last recorded eviction, 0 if none */
  uint32_t *ev_of;  /* index into evs of the current eviction */
  int64_t *last_use;
  int64_t *cost;   /* dtr: replay time of its writers so far */
  int64_t now;
  int64_t mem, budget;
  ev_t *evs;
  uint32_t n_evs, cap_evs;
  uint32_t *lists;
  uint32_t n_lists, cap_lists;
  uint32_t *cands; /* resident evictable activations, scanned per eviction */
  uint32_t n_cands;
  cap__lineage_t lin;
  int err;
} online_t;

static bool has_future(const online_t *on, uint32_t t) {
  return on->done[t] >= 1 && on->done[t] < on->p->tensors[t].n_accesses;
}

static int add_ev(online_t *on, uint32_t t, uint32_t k) {
  if (on->n_evs == on->cap_evs) {
    uint32_t cap = on->cap_evs ? on->cap_evs * 2 : 256;
    ev_t *n = realloc(on->evs, (size_t)cap * sizeof *n);
    if (!n)
      return CAP_ENOMEM;
    on->evs = n;
    on->cap_evs = cap;
  }
  on->evs[on->n_evs] = (ev_t){t, k, 0, 0, false};
  on->ev_of[t] = on->n_evs++;
  return 0;
}

static int save_list(online_t *on, uint32_t ev, const uint32_t *ops, uint32_t n) {
  if (n > UINT32_MAX - on->n_lists)
    return CAP_ENOMEM;
  if (on->n_lists + n > on->cap_lists) {
    uint64_t cap = on->cap_lists ? on->cap_lists : 1024;
    while (cap < (uint64_t)on->n_lists + n)
      cap *= 2;
    uint32_t *l = realloc(on->lists, (size_t)cap * sizeof *l);
    if (!l)
      return CAP_ENOMEM;
    on->lists = l;
    on->cap_lists = (uint32_t)cap;
  }
  memcpy(on->lists + on->n_lists, ops, (size_t)n * sizeof *ops);
  on->evs[ev].list_off = on->n_lists;
  on->evs[ev].n_list = n;
  on->n_lists += n;
  return 0;
}

/* Op of access k (1-based) of t. */
static uint32_t acc_op(const cap_profile_t *p, uint32_t t, uint32_t k) {
  return p->access_ops[p->tensors[t].access_off + k - 1];
}

/* Belady, capuchin's last resort, may also swap the never-freed
 * activations (optimizer state, running stats) that persistent eviction
 * lets capuchin evict, and release activations after their last access
 * (the framework frees them later); the baselines do neither, as before. */
static bool may_evict(const online_t *on, uint32_t t) {
  const cap_tensor_t *ct = &on->p->tensors[t];
  if (on->mode == MODE_BELADY && ct->bytes > 0 && !ct->no_evict) {
    if (ct->kind == CAP_KIND_ACTIVATION && ct->free_ns >= 0)
      return true;
    return on->cfg->evict_persistent && ct->n_accesses >= 2;
  }
  return cap__evictable(on->p, on->cfg, t);
}

/* Belady: an activation past its last access, still allocated: releasing
 * it costs nothing. */
static bool dead(const online_t *on, uint32_t t) {
  const cap_tensor_t *ct = &on->p->tensors[t];
  return on->mode == MODE_BELADY && on->st[t] == O_RES &&
         on->lock[t] != on->lock_gen && ct->kind == CAP_KIND_ACTIVATION &&
         ct->free_ns >= 0 && on->done[t] == ct->n_accesses;
}

static bool candidate(const online_t *on, uint32_t t) {
  return on->st[t] == O_RES && on->lock[t] != on->lock_gen && has_future(on, t) &&
         on->done[t] > on->last_k[t];
}

/* Free memory until `need` more bytes fit, by the mode's rule. */
static void make_room(online_t *on, int64_t need) {
  const cap_profile_t *p = on->p;
  while (!on->err && on->mem + need > on->budget) {
    uint32_t best = CAP_NONE, best_i = 0;
    double best_h = 0;
    for (uint32_t i = 0; i < on->n_cands; i++) {
      uint32_t t = on->cands[i];
      if (dead(on, t)) { /* free: take it now */
        best = t;
        best_i = i;
        break;
      }
      if (!candidate(on, t))
        continue;
      int64_t stale = on->now - on->last_use[t] + 1;
      if (stale < 1)
        stale = 1;
      double h;
      if (on->mode == MODE_DTR)
        h = (double)(on->cost[t] + 1) /
            ((double)p->tensors[t].bytes * (double)stale);
      else if (on->mode == MODE_LRU)
        h = (double)on->last_use[t]; /* least recently used first */
      else /* the one needed again last first */
        h = -(double)p->ops[acc_op(p, t, on->done[t] + 1)].start_ns;
      if (best == CAP_NONE || h < best_h) {
        best = t;
        best_h = h;
        best_i = i;
      }
    }
    if (best == CAP_NONE)
      return; /* nothing left to evict: over budget */
    uint32_t t = best;
    if (on->mode == MODE_DTR) {
      /* Only evict what can be rebuilt at its next access as things stand,
       * and price it by the whole replay that takes (DTR's cost of the
       * evicted neighbourhood): a tensor whose sources are gone costs their
       * replay too. Costs are cached and corrected lazily; a corrected cost
       * sends the choice round again. */
      uint32_t k = on->done[t];
      int rc = cap__lineage(&on->lin, p, t, acc_op(p, t, k), acc_op(p, t, k + 1),
                            on->gone, MAX_LIST);
      if (rc == CAP_ENOENT) {
        on->cands[best_i] = on->cands[--on->n_cands];
        continue;
      }
      if (rc) {
        on->err = rc;
        return;
      }
      int64_t c = 0;
      for (uint32_t i = 0; i < on->lin.n_ops; i++)
        c += p->ops[on->lin.ops[i]].end_ns - p->ops[on->lin.ops[i]].start_ns;
      if (c > on->cost[t] + on->cost[t] / 16 + 1000) {
        on->cost[t] = c;
        continue;
      }
    }
    int rc = add_ev(on, t, on->done[t]);
    if (rc) {
      on->err = rc;
      return;
    }
    on->last_k[t] = on->done[t];
    on->st[t] = O_GONE;
    on->gone[t] = 1;
    on->mem -= (int64_t)p->tensors[t].bytes;
    on->cands[best_i] = on->cands[--on->n_cands];
  }
}

static void set_resident(online_t *on, uint32_t t) {
  on->st[t] = O_RES;
  on->gone[t] = 0;
  on->cands[on->n_cands++] = t;
}

/* DTR: replay the lineage of t before op `at`; restored tensors stay. */
static void remat(online_t *on, uint32_t t, uint32_t at) {
  const cap_profile_t *p = on->p;
  ev_t *ev = &on->evs[on->ev_of[t]];
  uint32_t evict_op = acc_op(p, t, ev->k);
  int rc = cap__lineage(&on->lin, p, t, evict_op, at, on->gone, 4 * MAX_LIST);
  if (rc == CAP_ENOENT) {
    /* Cannot happen for a tensor checked at eviction unless its sources
     * changed since; leave the eviction out of the plan and count the
     * tensor as resident again. */
    ev->dead = true;
    on->mem += (int64_t)p->tensors[t].bytes;
    set_resident(on, t);
    return;
  }
  if (rc) {
    on->err = rc;
    return;
  }
  uint32_t n = on->lin.n_ops;
  uint32_t *ops = malloc((size_t)n * sizeof *ops);
  if (!ops) {
    on->err = CAP_ENOMEM;
    return;
  }
  memcpy(ops, on->lin.ops, (size_t)n * sizeof *ops);
  rc = save_list(on, on->ev_of[t], ops, n);
  if (rc) {
    free(ops);
    on->err = rc;
    return;
  }
  /* Nothing the replay reads or writes may be evicted while it runs. A
   * resident tensor the replay reads may not be recorded as evicted after
   * its current access any more: the plan would drop it at that access,
   * before this replay needs it. */
  for (uint32_t i = 0; i < n; i++) {
    const cap_op_t *o = &p->ops[ops[i]];
    const uint32_t *in = cap_op_inputs(p, o), *outs = cap_op_outputs(p, o);
    for (uint32_t j = 0; j < o->n_in; j++) {
      on->lock[in[j]] = on->lock_gen;
      if (on->st[in[j]] == O_RES)
        on->last_k[in[j]] = on->done[in[j]];
    }
    for (uint32_t j = 0; j < o->n_out; j++)
      on->lock[outs[j]] = on->lock_gen;
  }
  int64_t temps = 0;
  for (uint32_t i = 0; i < n && !on->err; i++) {
    const cap_op_t *o = &p->ops[ops[i]];
    const uint32_t *in = cap_op_inputs(p, o), *outs = cap_op_outputs(p, o);
    for (uint32_t j = 0; j < o->n_out; j++) {
      uint32_t y = outs[j];
      bool inplace = false;
      for (uint32_t q = 0; q < o->n_in && !inplace; q++)
        inplace = in[q] == y;
      if (inplace)
        continue;
      make_room(on, (int64_t)p->tensors[y].bytes);
      on->mem += (int64_t)p->tensors[y].bytes;
      on->lock[y] = on->lock_gen;
      if (on->st[y] == O_GONE) {
        set_resident(on, y);
        ev_t *yev = &on->evs[on->ev_of[y]];
        if (yev->n_list == 0 && y != t) {
          /* Restored as a by-product: its own list, should it be needed,
           * is its lineage as things stand now. */
          int r2 = cap__lineage(&on->lin, p, y, acc_op(p, y, yev->k),
                                acc_op(p, y, yev->k + 1), on->gone, p->n_ops);
          if (r2 == 0)
            r2 = save_list(on, on->ev_of[y], on->lin.ops, on->lin.n_ops);
          if (r2 == CAP_ENOENT)
            yev->dead = true;
          else if (r2)
            on->err = r2;
        }
      } else {
        temps += (int64_t)p->tensors[y].bytes;
      }
    }
  }
  on->mem -= temps;
  free(ops);
  if (on->st[t] != O_RES) { /* the list did not produce it (cannot happen) */
    on->mem += (int64_t)p->tensors[t].bytes;
    set_resident(on, t);
  }
}

static int run(online_t *on) {
  const cap_profile_t *p = on->p;
  uint32_t nt = p->n_tensors ? p->n_tensors : 1;
  on->st = calloc(nt, 1);
  on->gone = calloc(nt, 1);
  on->lock = calloc(nt, sizeof *on->lock);
  on->done = calloc(nt, sizeof *on->done);
  on->seen = calloc(nt, sizeof *on->seen);
  on->last_k = calloc(nt, sizeof *on->last_k);
  on->ev_of = calloc(nt, sizeof *on->ev_of);
  on->last_use = calloc(nt, sizeof *on->last_use);
  on->cost = calloc(nt, sizeof *on->cost);
  on->cands = calloc(nt, sizeof *on->cands);
  if (!on->st || !on->gone || !on->lock || !on->done || !on->seen || !on->last_k ||
      !on->ev_of || !on->last_use || !on->cost || !on->cands)
    return CAP_ENOMEM;
  on->mem = (int64_t)p->persistent_bytes;
  for (uint32_t t = 0; t < p->n_tensors; t++)
    if (cap_tensor_is_resident(&p->tensors[t])) {
      on->st[t] = O_RES;
      /* Persistent tensors are candidates only for passive swapping with
       * evict_persistent (they cannot be recomputed). */
      if (on->mode != MODE_DTR && may_evict(on, t))
        on->cands[on->n_cands++] = t;
    }
  uint32_t fi = 0;
  for (uint32_t i = 0; i < p->n_ops && !on->err; i++) {
    const cap_op_t *o = &p->ops[i];
    on->now = o->start_ns;
    on->lock_gen = i + 1;
    while (fi < p->n_frees && p->frees[fi].t_ns <= o->start_ns) {
      uint32_t t = p->frees[fi++].tensor;
      if (on->st[t] == O_RES)
        on->mem -= (int64_t)p->tensors[t].bytes;
      on->st[t] = O_FREED;
      on->gone[t] = 0;
    }
    const uint32_t *in = cap_op_inputs(p, o), *outs = cap_op_outputs(p, o);
    uint32_t n_all = o->n_in + o->n_out;
    for (uint32_t j = 0; j < n_all; j++)
      on->lock[j < o->n_in ? in[j] : outs[j - o->n_in]] = on->lock_gen;
    /* Bring back what this op needs. */
    for (uint32_t j = 0; j < n_all && !on->err; j++) {
      uint32_t t = j < o->n_in ? in[j] : outs[j - o->n_in];
      if (on->st[t] != O_GONE)
        continue;
      if (on->mode == MODE_DTR) {
        remat(on, t, i);
      } else { /* swapped: back on demand */
        make_room(on, (int64_t)p->tensors[t].bytes);
        on->mem += (int64_t)p->tensors[t].bytes;
        set_resident(on, t);
      }
    }
    /* Allocate what it creates. */
    int64_t need = 0;
    for (uint32_t j = 0; j < n_all; j++) {
      uint32_t t = j < o->n_in ? in[j] : outs[j - o->n_in];
      if (on->st[t] == O_UNBORN)
        need += (int64_t)p->tensors[t].bytes;
    }
    if (need)
      make_room(on, need);
    on->mem += need;
    int64_t dur = o->end_ns - o->start_ns;
    for (uint32_t j = 0; j < n_all; j++) {
      uint32_t t = j < o->n_in ? in[j] : outs[j - o->n_in];
      if (on->st[t] == O_UNBORN) {
        on->st[t] = O_RES;
        if (may_evict(on, t) &&
            (on->mode != MODE_DTR || p->tensors[t].producer_op != CAP_NONE))
          on->cands[on->n_cands++] = t;
      }
      /* One access per op however often the op lists the tensor. */
      if (on->seen[t] != i + 1) {
        on->seen[t] = i + 1;
        on->done[t]++;
        if (j >= o->n_in && !(o->flags & CAP_OP_VIEW))
          on->cost[t] += dur;
      }
      on->last_use[t] = o->end_ns;
    }
  }
  return on->err;
}

static int plan_online(const cap_profile_t *p, const cap_plan_config_t *cfg,
                       int mode, cap_plan_t **out) {
  online_t on;
  memset(&on, 0, sizeof on);
  on.p = p;
  on.cfg = cfg;
  on.mode = mode;
  on.budget = cfg->budget_bytes > (uint64_t)INT64_MAX ? INT64_MAX
                                                      : (int64_t)cfg->budget_bytes;
  static const char *const names[] = {"dtr", "passive-lru", "belady"};
  cap_plan_t *plan = cap_plan_create(names[mode], cfg->budget_bytes);
  int rc = plan ? run(&on) : CAP_ENOMEM;
  for (uint32_t i = 0; !rc && i < on.n_evs; i++) {
    const ev_t *ev = &on.evs[i];
    if (mode == MODE_BELADY && ev->k == p->tensors[ev->tensor].n_accesses) {
      rc = cap_plan_add_release(plan, ev->tensor, ev->k);
    } else if (mode != MODE_DTR) {
      rc = cap_plan_add_swap(plan, ev->tensor, ev->k, CAP_NONE, 0,
                             CAP_ACTION_SYNC_OUT);
    } else if (!ev->dead && ev->n_list) {
      rc = cap_plan_add_recompute(plan, ev->tensor, ev->k,
                                  on.lists + ev->list_off, ev->n_list);
    }
  }
  free(on.st);
  free(on.gone);
  free(on.lock);
  free(on.done);
  free(on.seen);
  free(on.last_k);
  free(on.ev_of);
  free(on.last_use);
  free(on.cost);
  free(on.cands);
  free(on.evs);
  free(on.lists);
  cap__lineage_close(&on.lin);
  if (rc) {
    cap_plan_destroy(plan);
    return rc;
  }
  *out = plan;
  return 0;
}

int cap__plan_dtr(const cap_profile_t *p, const cap_plan_config_t *cfg,
                  cap_plan_t **out) {
  return plan_online(p, cfg, MODE_DTR, out);
}

int cap__plan_passive_lru(const cap_profile_t *p, const cap_plan_config_t *cfg,
                          cap_plan_t **out) {
  return plan_online(p, cfg, MODE_LRU, out);
}

int cap__plan_belady(const cap_profile_t *p, const cap_plan_config_t *cfg,
                     cap_plan_t **out) {
  return plan_online(p, cfg, MODE_BELADY, out);
}
