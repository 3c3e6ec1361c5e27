/*
 * The meaning of a plan, walked op by op over its profile (plan.h,
 * cap_plan_walk; docs/plan-semantics.md). The validator, the simulator, the
 * planners and the client's executor all ask this walk whether a recompute
 * list can run exactly as written, so that they cannot disagree.
 *
 * Per op i, in this order (what the executor does in op begin and op end):
 *  1. the framework's frees due before op i starts (time <= its start);
 *  2. tensors of op i that are swapped out and not yet coming back are
 *     fetched on demand;
 *  3. tensors of op i that the plan dropped are recomputed, each through its
 *     own action's list: every input of a listed op is an output of an
 *     earlier listed op, or on the device (resident, or coming back by a
 *     prefetch issued before op i: the replay waits for it) and not written
 *     in place since that op first ran; outputs that the plan had dropped
 *     are on the device again afterwards, the others are temporaries;
 *  4. op i starts: everything it names is on the device, and the prefetches
 *     whose in-trigger is op i are issued;
 *  5. the evictions after op i (swap, drop, release) take effect.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin/plan.h"
#include "capuchin_internal.h" /* cap__trigger_name */
#include "planners.h"          /* cap__lineage */
#include "tensor_state.h"

typedef struct {
  uint8_t state;
  uint32_t action; /* the eviction that took it off the device */
  uint32_t since;  /* op after which it left (or was freed before) */
  uint32_t fresh;  /* == gen: output of an earlier op of the list running */
} wtensor_t;

typedef struct {
  const cap_plan_t *plan;
  const cap_profile_t *p;
  wtensor_t *t;
  uint32_t *evict_off, *evict; /* actions by evicted-access op (CSR) */
  uint32_t *trig_off, *trig;   /* swap actions by in-trigger op */
  uint32_t gen;
  uint32_t n_repairs;
} walk_t;

static int csr(uint32_t n_ops, uint32_t n, const uint32_t *key,
               uint32_t **off_out, uint32_t **items_out) {
  uint32_t *off = calloc((size_t)n_ops + 2, sizeof *off);
  uint32_t *items = malloc((size_t)(n ? n : 1) * sizeof *items);
  if (!off || !items) {
    free(off);
    free(items);
    return CAP_ENOMEM;
  }
  for (uint32_t i = 0; i < n; i++)
    if (key[i] != CAP_NONE)
      off[key[i] + 2]++;
  for (uint32_t i = 0; i < n_ops; i++)
    off[i + 2] += off[i + 1];
  for (uint32_t i = 0; i < n; i++)
    if (key[i] != CAP_NONE)
      items[off[key[i] + 1]++] = i;
  /* off[o] .. off[o + 1] now bound op o's items */
  *off_out = off;
  *items_out = items;
  return 0;
}

static int prepare(walk_t *w) {
  const cap_profile_t *p = w->p;
  const cap_plan_t *plan = w->plan;
  uint32_t na = plan->n_actions;
  w->t = calloc((size_t)p->n_tensors + 1, sizeof *w->t);
  uint32_t *ekey = malloc(((size_t)na + 1) * sizeof *ekey);
  uint32_t *tkey = malloc(((size_t)na + 1) * sizeof *tkey);
  int rc = CAP_ENOMEM;
  if (!w->t || !ekey || !tkey)
    goto out;
  for (uint32_t i = 0; i < na; i++) {
    const cap_action_t *a = &plan->actions[i];
    /* the static checks (cap_plan_validate) say why; the walk only refuses
     * to read out of bounds */
    rc = CAP_EINVAL;
    if (a->tensor >= p->n_tensors ||
        (uint64_t)a->recompute_off + a->n_recompute > plan->n_recompute_ops)
      goto out;
    for (uint32_t k = 0; k < a->n_recompute; k++)
      if (plan->recompute_ops[a->recompute_off + k] >= p->n_ops)
        goto out;
    ekey[i] = cap_profile_access_op(p, a->tensor, a->evict_after_access);
    tkey[i] = CAP_NONE;
    if (a->method == CAP_METHOD_SWAP && a->prefetch_tensor != CAP_NONE)
      tkey[i] = cap_profile_access_op(p, a->prefetch_tensor, a->prefetch_access);
  }
  rc = csr(p->n_ops, na, ekey, &w->evict_off, &w->evict);
  if (!rc)
    rc = csr(p->n_ops, na, tkey, &w->trig_off, &w->trig);
out:
  free(ekey);
  free(tkey);
  return rc;
}

static void fault_set(cap_plan_fault_t *f, uint32_t action, uint32_t op,
                      uint32_t source, const wtensor_t *s, cap_lack_t lack) {
  f->action = action;
  f->op = op;
  f->source = source;
  f->by = s ? s->action : CAP_NONE;
  f->since_op = s ? s->since : CAP_NONE;
  f->lack = lack;
}

static cap_lack_t lack_of(uint8_t state) {
  switch (state) {
  case CAP__TS_HOST:
    return CAP_LACK_SWAPPED;
  case CAP__TS_DROPPED:
    return CAP_LACK_DROPPED;
  case CAP__TS_RELEASED:
    return CAP_LACK_RELEASED;
  case CAP__TS_FREED:
    return CAP_LACK_FREED;
  default:
    return CAP_LACK_UNBORN;
  }
}

/* Step 4 for one dropped tensor: check its action's list at op back_op
 * and, when every input is there, carry it out (dropped outputs are back
 * for good). Nothing changes when it cannot run. */
static int run_list(walk_t *w, uint32_t ai, uint32_t back_op,
                    cap_plan_fault_t *f) {
  const cap_profile_t *p = w->p;
  const cap_action_t *a = &w->plan->actions[ai];
  const uint32_t *ops = cap_action_recompute_ops(w->plan, a);
  uint32_t gen = ++w->gen;
  for (uint32_t k = 0; k < a->n_recompute; k++) {
    const cap_op_t *o = &p->ops[ops[k]];
    const uint32_t *in = cap_op_inputs(p, o), *out = cap_op_outputs(p, o);
    for (uint32_t j = 0; j < o->n_in; j++) {
      wtensor_t *x = &w->t[in[j]];
      if (x->fresh == gen)
        continue;
      if (x->state != CAP__TS_RESIDENT && x->state != CAP__TS_SWAP_IN) {
        fault_set(f, ai, ops[k], in[j], x, lack_of(x->state));
        return CAP_EINVAL;
      }
      if (cap_profile_written_in_place(p, in[j], ops[k], back_op)) {
        fault_set(f, ai, ops[k], in[j], NULL, CAP_LACK_WRITTEN);
        return CAP_EINVAL;
      }
    }
    for (uint32_t j = 0; j < o->n_out; j++)
      w->t[out[j]].fresh = gen;
  }
  for (uint32_t k = 0; k < a->n_recompute; k++) {
    const cap_op_t *o = &p->ops[ops[k]];
    const uint32_t *out = cap_op_outputs(p, o);
    for (uint32_t j = 0; j < o->n_out; j++)
      if (w->t[out[j]].state == CAP__TS_DROPPED)
        w->t[out[j]].state = CAP__TS_RESIDENT;
  }
  /* cap_plan_validate checked that the last op produces the tensor */
  w->t[a->tensor].state = CAP__TS_RESIDENT;
  return 0;
}

/* --- repair (cap__plan_make_explicit) ---------------------------------------
 * A planner reasons about estimates and may count on a source coming back
 * that the written semantics do not bring back. At each fault: a swapped-out
 * source gets its prefetch issued at the back-access (the planner priced an
 * on-demand fetch there); otherwise the list is rebuilt from the lineage
 * with every tensor that is off the device at that moment recomputed inside
 * it; if that cannot be done, the tensor is swapped instead of recomputed
 * (on demand at the back-access). */

#define REPAIR_MAX_OPS 256u /* longest rebuilt list */

static int repair(walk_t *w, cap_plan_t *plan, uint32_t back_op,
                  const cap_plan_fault_t *f, cap__lineage_t *lin,
                  uint8_t *gone) {
  const cap_profile_t *p = w->p;
  cap_action_t *a = &plan->actions[f->action];
  if (f->lack == CAP_LACK_SWAPPED && f->by != CAP_NONE &&
      back_op > f->since_op + 1) {
    /* the latest op that can issue it in time: the one before */
    uint32_t tt, ta;
    if (cap__trigger_name(p, back_op - 1, f->source, &tt, &ta)) {
      plan->actions[f->by].prefetch_tensor = tt;
      plan->actions[f->by].prefetch_access = ta;
      w->t[f->source].state = CAP__TS_SWAP_IN;
      return 0;
    }
  }
  if (f->lack == CAP_LACK_DROPPED && f->by != CAP_NONE &&
      plan->actions[f->by].method == CAP_METHOD_RECOMPUTE) {
    /* what the planner meant: the source's own list runs first; as one
     * list, the union of both in execution order */
    int rc = cap__plan_merge_lists(plan, f->action, f->by, REPAIR_MAX_OPS);
    if (rc != CAP_ENOENT)
      return rc;
  }
  for (uint32_t x = 0; x < p->n_tensors; x++) {
    uint8_t st = w->t[x].state;
    gone[x] = st == CAP__TS_HOST || st == CAP__TS_DROPPED || st == CAP__TS_RELEASED;
  }
  gone[a->tensor] = 1;
  uint32_t evict_op = cap_profile_access_op(p, a->tensor, a->evict_after_access);
  int rc = cap__lineage(lin, p, a->tensor, evict_op, back_op, gone,
                        REPAIR_MAX_OPS);
  if (rc == CAP_ENOMEM)
    return rc;
  bool same = rc == 0 && lin->n_ops == a->n_recompute &&
              memcmp(lin->ops, cap_action_recompute_ops(plan, a),
                     lin->n_ops * sizeof *lin->ops) == 0;
  if (rc == 0 && !same)
    return cap__plan_set_list(plan, f->action, lin->ops, lin->n_ops);
  /* swap it instead; its list's ops stay in the pool, unused */
  a->method = CAP_METHOD_SWAP;
  a->recompute_off = 0;
  a->n_recompute = 0;
  a->prefetch_tensor = CAP_NONE;
  a->prefetch_access = 0;
  a->flags = 0;
  w->t[a->tensor].state = CAP__TS_SWAP_IN;
  return 0;
}

/* fix == NULL: stop at the first fault. Otherwise the plan is mended at
 * each fault (repair mode) and the walk goes on. */
static int walk(walk_t *w, cap_plan_fault_t *f, cap_plan_t *fix) {
  const cap_profile_t *p = w->p;
  const cap_plan_t *plan = w->plan;
  cap__lineage_t lin;
  memset(&lin, 0, sizeof lin);
  uint8_t *gone = NULL;
  int rc = 0;
  for (uint32_t x = 0; x < p->n_tensors; x++)
    if (cap_tensor_is_resident(&p->tensors[x]))
      w->t[x].state = CAP__TS_RESIDENT;
  uint32_t fi = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const cap_op_t *o = &p->ops[i];
    const uint32_t *ts = p->op_tensors;
    uint32_t n_all = o->n_in + o->n_out;
#define TENSOR_OF(j)                                                          \
  ((j) < o->n_in ? ts[o->in_off + (j)] : ts[o->out_off + (j) - o->n_in])
    for (; fi < p->n_frees && p->frees[fi].t_ns <= o->start_ns; fi++) {
      wtensor_t *x = &w->t[p->frees[fi].tensor];
      x->state = CAP__TS_FREED;
      x->action = CAP_NONE;
      x->since = i ? i - 1 : 0;
    }
    bool dropped = false;
    for (uint32_t j = 0; j < n_all; j++) {
      wtensor_t *x = &w->t[TENSOR_OF(j)];
      if (x->state == CAP__TS_HOST)
        x->state = CAP__TS_SWAP_IN;
      dropped |= x->state == CAP__TS_DROPPED;
    }
    /* (most ops name no dropped tensor: no list to run) */
    for (uint32_t j = 0; dropped && j < n_all; j++) {
      wtensor_t *x = &w->t[TENSOR_OF(j)];
      while (x->state == CAP__TS_DROPPED && !rc) {
        rc = run_list(w, x->action, i, f);
        if (rc != CAP_EINVAL || !fix)
          break;
        if (!gone && !(gone = malloc((size_t)p->n_tensors + 1))) {
          rc = CAP_ENOMEM;
          break;
        }
        w->n_repairs++;
        rc = repair(w, fix, i, f, &lin, gone);
      }
      if (rc)
        goto out;
    }
    for (uint32_t j = 0; j < n_all; j++) {
      wtensor_t *x = &w->t[TENSOR_OF(j)];
      if (x->state == CAP__TS_UNBORN || x->state == CAP__TS_SWAP_IN)
        x->state = CAP__TS_RESIDENT;
    }
    for (uint32_t k = w->trig_off[i]; k < w->trig_off[i + 1]; k++) {
      wtensor_t *x = &w->t[plan->actions[w->trig[k]].tensor];
      if (x->state == CAP__TS_HOST && x->action == w->trig[k])
        x->state = CAP__TS_SWAP_IN;
    }
#undef TENSOR_OF
    for (uint32_t k = w->evict_off[i]; k < w->evict_off[i + 1]; k++) {
      uint32_t ai = w->evict[k];
      const cap_action_t *a = &plan->actions[ai];
      wtensor_t *x = &w->t[a->tensor];
      if (x->state != CAP__TS_RESIDENT)
        continue; /* freed during the op */
      x->action = ai;
      x->since = i;
      if (a->method == CAP_METHOD_SWAP)
        x->state = CAP__TS_HOST;
      else
        x->state = cap_action_is_release(a) ? CAP__TS_RELEASED : CAP__TS_DROPPED;
    }
  }
out:
  cap__lineage_close(&lin);
  free(gone);
  return rc;
}

static int run_walk(const cap_plan_t *plan, const cap_profile_t *p,
                    cap_plan_fault_t *fault, cap_plan_t *fix,
                    uint32_t *n_repairs) {
  cap_plan_fault_t scratch;
  if (!fault)
    fault = &scratch;
  memset(fault, 0, sizeof *fault);
  fault->action = CAP_NONE;
  if (!plan->n_actions)
    return 0;
  walk_t w;
  memset(&w, 0, sizeof w);
  w.plan = plan;
  w.p = p;
  int rc = prepare(&w);
  if (!rc)
    rc = walk(&w, fault, fix);
  if (n_repairs)
    *n_repairs = w.n_repairs;
  free(w.t);
  free(w.evict_off);
  free(w.evict);
  free(w.trig_off);
  free(w.trig);
  return rc;
}

int cap_plan_walk(const cap_plan_t *plan, const cap_profile_t *p,
                  cap_plan_fault_t *fault) {
  return run_walk(plan, p, fault, NULL, NULL);
}

int cap__plan_make_explicit(cap_plan_t *plan, const cap_profile_t *p,
                            uint32_t *n_repairs) {
  return run_walk(plan, p, NULL, plan, n_repairs);
}

const char *cap_lack_name(cap_lack_t lack) {
  switch (lack) {
  case CAP_LACK_DROPPED:
    return "dropped by the plan and not recomputed earlier in the list";
  case CAP_LACK_SWAPPED:
    return "swapped out, with no prefetch issued by then";
  case CAP_LACK_FREED:
    return "freed by the framework";
  case CAP_LACK_RELEASED:
    return "released by the plan";
  case CAP_LACK_UNBORN:
    return "not created yet";
  case CAP_LACK_WRITTEN:
    return "written in place since the op ran";
  default:
    return "available";
  }
}

int cap_plan_fault_format(const cap_plan_t *plan, const cap_profile_t *p,
                          const cap_plan_fault_t *f, char *buf, size_t len) {
  if (!buf || !len)
    return 0;
  if (!plan || !p || f->action >= plan->n_actions || f->op >= p->n_ops)
    return snprintf(buf, len, "no fault");
  const cap_action_t *a = &plan->actions[f->action];
  uint32_t back = cap_profile_access_op(p, a->tensor, a->evict_after_access + 1);
  const char *name = p->ops[f->op].name ? p->ops[f->op].name : "?";
  int n = snprintf(buf, len,
                   "action %u: recompute of tensor %u before op %u: op %u (%s) "
                   "needs tensor %u, %s",
                   f->action, a->tensor, back, f->op, name, f->source,
                   cap_lack_name(f->lack));
  if (n >= 0 && (size_t)n < len && f->since_op != CAP_NONE &&
      f->lack != CAP_LACK_WRITTEN && f->lack != CAP_LACK_UNBORN)
    n += snprintf(buf + n, len - (size_t)n, " (after op %u)", f->since_op);
  return n;
}
