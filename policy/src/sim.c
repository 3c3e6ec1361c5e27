/*
 * Discrete-event simulator of one iteration under a plan (sim.h).
 *
 * The compute stream runs the profile's ops in order. Op i becomes ready at
 * the simulated end of op i-1 plus the trace's gap between them (the host
 * launches ops at the measured pace; a stall shifts everything after it).
 * Before op i starts, at its ready time: on-demand swap-ins of its
 * non-resident tensors are issued, then recompute lists of its dropped
 * tensors run on the compute stream with their measured durations (every
 * input on the device or coming back by a prefetch issued earlier:
 * cap_plan_walk), then the op waits for every swap-in it needs (that wait
 * is the prefetch's lateness and counts in stall_ns). At its start,
 * prefetches whose in-trigger it is are issued and its first-touched
 * activations are allocated (an allocation over the plan's budget waits
 * for the running swap-outs first, as the client's allocator does: a
 * stall, in room_wait_ns too); at its end, the evictions after it are carried
 * out (swap: D2H issued, memory held until the copy ends, the compute
 * stream waits for it with CAP_ACTION_SYNC_OUT; recompute: memory released
 * at once).
 *
 * Frees are anchored to the op sequence so that stalls move them with the
 * ops: a free in the gap after op j (up to and including the next op's
 * measured start) happens at the same offset from op j's simulated end, so
 * before any stall of the next op; a free strictly inside op j's measured
 * interval happens at the same offset from op j's simulated start.
 *
 * Copy engines. D2H and H2D are FIFO queues, each running one copy at a time
 * (PCIe serialises one direction). An H2D copy of a tensor whose D2H has not
 * finished waits for it, blocking its queue as cudaStreamWaitEvent would.
 * Both busy, they share the duplex bandwidth (cap__duplex_share). Rates
 * change only when a copy starts or ends; a running copy keeps its remaining
 * bytes and its end is re-projected (rounded up to whole ns) at each change.
 *
 * Memory is a list of (time, delta) changes emitted in non-decreasing time;
 * changes at the same nanosecond are netted into one curve point.
 */
#include "capuchin/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "tensor_state.h"

int64_t cap_copy_ns(uint64_t bytes, double gbps) {
  if (bytes == 0)
    return 0;
  if (!(gbps > 0))
    return INT64_MAX / 4;
  double q = (double)bytes / gbps; /* GB/s == bytes/ns */
  double r = nearbyint(q);
  /* 551 bytes at 55.1 GB/s is 10 ns, not 11: forgive the representation
   * error of the bandwidth before rounding up. */
  if (fabs(q - r) <= 1e-9 * (q > 1.0 ? q : 1.0))
    return (int64_t)r;
  return (int64_t)ceil(q);
}

typedef struct {
  uint64_t bytes;
  uint32_t action;   /* action of the current eviction, CAP_NONE if none */
  uint32_t temp_gen; /* == sim.list_gen while a temporary replay output */
  uint8_t state;
} tens_t;

enum { DIR_D2H = 0, DIR_H2D = 1 };

typedef struct {
  uint32_t tensor;
  uint8_t issued, started, done;
  int64_t issue_t, end_t;
} copy_t;

typedef struct {
  uint32_t *q; /* copy indices, FIFO */
  uint32_t head, tail;
  int64_t cur; /* copy running, -1 if idle */
  double rem;  /* bytes left of cur at t_mark */
  int64_t t_mark;
  double rate; /* bytes/ns while cur runs */
  int64_t proj_end;
} engine_t;

typedef struct {
  const cap_profile_t *p;
  const cap_plan_t *plan;
  cap_bandwidth_t bw;
  cap_sim_result_t *out;
  tens_t *t;
  copy_t *copies; /* swap action i: D2H 2i, H2D 2i+1 */
  engine_t eng[2];
  int64_t eng_t; /* engines advanced up to here */
  uint64_t budget;   /* device bytes an allocation waits to fit in; 0: none */
  uint32_t *pf_slot; /* action -> index in out->prefetches */
  /* Per-op buckets (CSR over op seqs). */
  uint32_t *trig_off, *trig; /* actions whose in-trigger op is the op */
  uint32_t *evict_off, *evict; /* actions evicting after the op */
  uint32_t list_gen;
  uint32_t *temps; /* temporaries of the running recompute list */
  uint32_t *temp_res; /* their residency intervals (when recording) */
  uint32_t n_temps, cap_temps;
  /* Memory curve being built. */
  cap_curve_point_t *pts;
  uint32_t n_pts, cap_pts;
  uint64_t mem; /* device bytes now */
  /* Residency intervals, when asked for (cap_sim_residency). */
  bool record;
  cap_residency_t *res;
  uint32_t n_res, cap_res;
  uint32_t *open_res; /* tensor -> its open interval, CAP_NONE if none */
  bool *had_res;      /* tensor -> has had an interval */
  uint32_t op;        /* the op being prepared or run */
  bool op_started;
  int64_t op_start_ns, op_end_ns; /* the op's run, once started */
  int err;
} sim_t;

/* --- memory ---------------------------------------------------------------- */

static void mem_change(sim_t *s, int64_t t, int64_t delta) {
  if (s->err || delta == 0)
    return;
  if (s->n_pts && t < s->pts[s->n_pts - 1].t_ns)
    t = s->pts[s->n_pts - 1].t_ns; /* never reached on valid input */
  s->mem = (uint64_t)((int64_t)s->mem + delta);
  if (s->n_pts && s->pts[s->n_pts - 1].t_ns == t) {
    s->pts[s->n_pts - 1].bytes = s->mem;
    return;
  }
  if (s->n_pts == s->cap_pts) {
    uint32_t cap = s->cap_pts ? s->cap_pts * 2 : 1024;
    cap_curve_point_t *np = realloc(s->pts, (size_t)cap * sizeof *np);
    if (!np) {
      s->err = CAP_ENOMEM;
      return;
    }
    s->pts = np;
    s->cap_pts = cap;
  }
  s->pts[s->n_pts++] = (cap_curve_point_t){t, s->mem};
}

/* Open an interval for tensor id; returns its index (CAP_NONE when not
 * recording or out of memory). A list temporary may coexist with the
 * tensor's own interval (the replay makes a second copy of a resident
 * output), so it is not the tensor's open interval: the list closes it. */
static uint32_t open_residency(sim_t *s, uint32_t id, int64_t t,
                               cap_residency_kind_t how, uint32_t action) {
  if (!s->record || s->err)
    return CAP_NONE;
  if (s->n_res == s->cap_res) {
    uint32_t cap = s->cap_res ? s->cap_res * 2 : 1024;
    cap_residency_t *nr = realloc(s->res, (size_t)cap * sizeof *nr);
    if (!nr) {
      s->err = CAP_ENOMEM;
      return CAP_NONE;
    }
    s->res = nr;
    s->cap_res = cap;
  }
  if (how != CAP_RESIDENCY_TEMPORARY)
    s->open_res[id] = s->n_res;
  s->had_res[id] = true;
  s->res[s->n_res] = (cap_residency_t){.tensor = id, .kind = how,
                                       .start_ns = t, .end_ns = -1,
                                       .bytes = s->t[id].bytes,
                                       .action = action,
                                       .first_op = s->op,
                                       .last_op = CAP_NONE};
  return s->n_res++;
}

/* A stay ends when the client gives the memory back, which it does between
 * ops: what is freed, or whose swap-out ends, while an op runs stays held
 * until that op's end; but one the client waited for (at_once) it gives
 * back when the wait ends. */
static void close_residency(sim_t *s, uint32_t r, int64_t t, bool copied_out,
                            bool at_once) {
  if (r == CAP_NONE)
    return;
  if (!at_once && s->op_started && t >= s->op_start_ns && t < s->op_end_ns)
    t = s->op_end_ns;
  s->res[r].end_ns = t;
  s->res[r].last_op = s->op_started ? s->op : s->op - 1;
  s->res[r].copied_out = copied_out;
}

static uint32_t t_alloc(sim_t *s, uint32_t id, int64_t t,
                        cap_residency_kind_t how, uint32_t action) {
  mem_change(s, t, (int64_t)s->t[id].bytes);
  return open_residency(s, id, t, how, action);
}
/* copied_out: the memory is given back because a D2H copy of it ended
 * (the copy read it until then); at_once: close_residency. */
static void t_release(sim_t *s, uint32_t id, int64_t t, bool copied_out,
                      bool at_once) {
  mem_change(s, t, -(int64_t)s->t[id].bytes);
  if (!s->record)
    return;
  /* A persistent tensor evicted for the first time has been on the device
   * since before the iteration: its first interval starts at 0. */
  if (s->open_res[id] == CAP_NONE && !s->had_res[id]) {
    uint32_t op = s->op;
    s->op = 0;
    open_residency(s, id, 0, CAP_RESIDENCY_PERSISTENT, CAP_NONE);
    s->op = op;
  }
  close_residency(s, s->open_res[id], t, copied_out, at_once);
  s->open_res[id] = CAP_NONE;
}

/* --- copy engines ---------------------------------------------------------- */

static double own_bw(const sim_t *s, int dir) {
  return dir == DIR_H2D ? s->bw.h2d_gbps : s->bw.d2h_gbps;
}

/* Time to move `bytes` (possibly fractional after a rate change) at `r`
 * bytes/ns, rounded up to whole ns with the same forgiveness as
 * cap_copy_ns. */
static int64_t ns_for(double bytes, double r) {
  if (bytes <= 0)
    return 0;
  double q = bytes / r;
  double n = nearbyint(q);
  if (fabs(q - n) <= 1e-9 * (q > 1.0 ? q : 1.0))
    return (int64_t)n;
  return (int64_t)ceil(q);
}

/* Bring both running copies' remaining bytes up to time t. */
static void settle(sim_t *s, int64_t t) {
  for (int d = 0; d < 2; d++) {
    engine_t *e = &s->eng[d];
    if (e->cur < 0)
      continue;
    e->rem -= e->rate * (double)(t - e->t_mark);
    if (e->rem < 0)
      e->rem = 0;
    e->t_mark = t;
  }
}

void cap__duplex_share(const cap_bandwidth_t *bw, double *d2h_gbps,
                       double *h2d_gbps) {
  double d = bw->d2h_gbps, h = bw->h2d_gbps, dup = bw->duplex_gbps;
  if (dup > 0 && d + h > dup) {
    double half = dup / 2;
    if (d < half)
      h = dup - d;
    else if (h < half)
      d = dup - h;
    else
      d = h = half;
  }
  *d2h_gbps = d;
  *h2d_gbps = h;
}

/* Set rates for who is running now and re-project their ends from t. */
static void rerate(sim_t *s, int64_t t) {
  double rate[2];
  rate[DIR_D2H] = own_bw(s, DIR_D2H);
  rate[DIR_H2D] = own_bw(s, DIR_H2D);
  if (s->eng[0].cur >= 0 && s->eng[1].cur >= 0)
    cap__duplex_share(&s->bw, &rate[DIR_D2H], &rate[DIR_H2D]);
  for (int d = 0; d < 2; d++) {
    engine_t *e = &s->eng[d];
    if (e->cur < 0)
      continue;
    e->rate = rate[d];
    e->proj_end = t + ns_for(e->rem, rate[d]);
  }
}

static bool can_start(const sim_t *s, uint32_t ci) {
  if ((ci & 1) == DIR_H2D)
    return s->copies[ci - 1].done; /* its D2H must have finished */
  return true;
}

/* Start queued copies on idle engines at time t (settle() done by caller). */
static bool start_idle(sim_t *s, int64_t t) {
  bool changed = false;
  for (int d = 0; d < 2; d++) {
    engine_t *e = &s->eng[d];
    if (e->cur >= 0 || e->head == e->tail)
      continue;
    uint32_t ci = e->q[e->head];
    if (!can_start(s, ci))
      continue;
    e->head++;
    copy_t *c = &s->copies[ci];
    c->started = 1;
    e->cur = ci;
    e->rem = (double)s->t[c->tensor].bytes;
    e->t_mark = t;
    if (d == DIR_H2D) {
      tens_t *tt = &s->t[c->tensor];
      if (tt->state == CAP__TS_HOST) {
        tt->state = CAP__TS_SWAP_IN;
        /* The memory counts from the copy's start, but the client holds it
         * from the issue (it allocates, then queues the copy), or, issued
         * while the tensor's own swap-out still ran, from that copy's end
         * (executor.c start_prefetch: it waits for it, gives the block
         * back, then allocates): never two blocks of one tensor at once. */
        mem_change(s, t, (int64_t)tt->bytes);
        int64_t from = c->issue_t;
        if (s->copies[ci - 1].end_t > from)
          from = s->copies[ci - 1].end_t;
        open_residency(s, c->tensor, from, CAP_RESIDENCY_SWAPPED_IN, ci / 2);
      }
    }
    changed = true;
  }
  return changed;
}

static int64_t next_event(const sim_t *s) {
  int64_t n = INT64_MAX;
  for (int d = 0; d < 2; d++)
    if (s->eng[d].cur >= 0 && s->eng[d].proj_end < n)
      n = s->eng[d].proj_end;
  return n;
}

/* Process the next copy completion. */
static void step(sim_t *s) {
  int64_t t = next_event(s);
  settle(s, t);
  for (int d = 0; d < 2; d++) {
    engine_t *e = &s->eng[d];
    if (e->cur < 0 || e->proj_end != t)
      continue;
    copy_t *c = &s->copies[e->cur];
    c->done = 1;
    c->end_t = t;
    tens_t *tt = &s->t[c->tensor];
    if (d == DIR_D2H) {
      if (tt->state == CAP__TS_SWAP_OUT) {
        tt->state = CAP__TS_HOST;
        /* its prefetch issued already: the client waited for this copy
         * (executor.c start_prefetch) */
        t_release(s, c->tensor, t, true, s->copies[e->cur + 1].issued);
      }
    } else if (tt->state == CAP__TS_SWAP_IN) {
      tt->state = CAP__TS_RESIDENT;
    }
    e->cur = -1;
  }
  /* A finished D2H may unblock the H2D queue's head; loop for zero-length. */
  start_idle(s, t);
  rerate(s, t);
  if (t > s->eng_t)
    s->eng_t = t;
}

static void advance_to(sim_t *s, int64_t t) {
  while (!s->err && next_event(s) <= t)
    step(s);
  if (t > s->eng_t)
    s->eng_t = t;
}

static void issue_copy(sim_t *s, uint32_t ci, int64_t t) {
  copy_t *c = &s->copies[ci];
  if (c->issued)
    return;
  c->issued = 1;
  c->issue_t = t;
  engine_t *e = &s->eng[ci & 1];
  e->q[e->tail++] = ci;
  settle(s, t);
  if (start_idle(s, t))
    rerate(s, t);
}

/* Run the engines until copy ci is done; returns its end time. */
static int64_t wait_copy(sim_t *s, uint32_t ci) {
  while (!s->err && !s->copies[ci].done) {
    if (next_event(s) == INT64_MAX) {
      s->err = CAP_EINVAL; /* cannot happen: a queued copy always runs */
      return s->eng_t;
    }
    step(s);
  }
  return s->copies[ci].end_t;
}

/* --- compute stream -------------------------------------------------------- */

/* An allocation of `need` bytes at time t that does not fit the budget
 * waits for the running swap-outs, oldest first, until it fits or none is
 * left (the client's allocator, evict.c cap__alloc_for); returns when it
 * may allocate. */
static int64_t wait_for_room(sim_t *s, uint64_t need, int64_t t) {
  advance_to(s, t);
  while (!s->err && need && s->budget && s->mem + need > s->budget &&
         s->eng[DIR_D2H].cur >= 0) {
    int64_t done = wait_copy(s, (uint32_t)s->eng[DIR_D2H].cur);
    if (done > t) {
      s->out->stall_ns += done - t;
      s->out->room_wait_ns += done - t;
      t = done;
    }
  }
  return t;
}

static bool lists_tensor(const uint32_t *v, uint32_t n, uint32_t id) {
  for (uint32_t i = 0; i < n; i++)
    if (v[i] == id)
      return true;
  return false;
}

static void note_late(sim_t *s, uint32_t action, int64_t late) {
  if (action == CAP_NONE || s->pf_slot[action] == CAP_NONE || late <= 0)
    return;
  cap_sim_prefetch_t *pf = &s->out->prefetches[s->pf_slot[action]];
  if (late > pf->late_ns)
    pf->late_ns = late;
}

/* Make tensor id usable by a computation ready at time t; returns when it is.
 * Swapped-out tensors come back on demand (if no prefetch was issued);
 * dropped ones were recomputed by their lists before (cap_plan_walk). */
static int64_t ensure(sim_t *s, uint32_t id, int64_t t) {
  tens_t *tt = &s->t[id];
  switch (tt->state) {
  case CAP__TS_HOST:
  case CAP__TS_SWAP_OUT:
  case CAP__TS_SWAP_IN: {
    if (tt->state == CAP__TS_SWAP_OUT && tt->action == CAP_NONE)
      return t;
    uint32_t ci = 2 * tt->action + 1;
    if (!s->copies[ci].issued) {
      advance_to(s, t);
      issue_copy(s, ci, t);
    }
    int64_t end = wait_copy(s, ci);
    if (end > t) {
      note_late(s, tt->action, end - t);
      s->out->stall_ns += end - t;
      t = end;
    }
    advance_to(s, t);
    return t;
  }
  case CAP__TS_DROPPED:  /* never restored implicitly */
  case CAP__TS_RELEASED: /* accessed after its last access */
    s->err = CAP_EINVAL;
    return t;
  default:
    return t;
  }
}

static int64_t run_list(sim_t *s, uint32_t action, int64_t t) {
  const cap_action_t *a = &s->plan->actions[action];
  tens_t *owner = &s->t[a->tensor];
  s->list_gen++; /* lists do not nest: each marks its temporaries anew */
  const uint32_t *ops = cap_action_recompute_ops(s->plan, a);
  for (uint32_t k = 0; k < a->n_recompute && !s->err; k++) {
    const cap_op_t *o = &s->p->ops[ops[k]];
    const uint32_t *in = cap_op_inputs(s->p, o);
    const uint32_t *out = cap_op_outputs(s->p, o);
    for (uint32_t j = 0; j < o->n_in && !s->err; j++) {
      tens_t *x = &s->t[in[j]];
      if (x->temp_gen == s->list_gen)
        continue;
      /* Nothing comes back implicitly (cap_plan_walk has checked this):
       * an input is on the device, or its prefetch has been issued and the
       * replay waits for it. */
      bool coming = (x->state == CAP__TS_HOST || x->state == CAP__TS_SWAP_OUT) &&
                    x->action != CAP_NONE &&
                    s->copies[2 * x->action + 1].issued;
      if (x->state != CAP__TS_RESIDENT && x->state != CAP__TS_SWAP_IN && !coming) {
        s->err = CAP_EINVAL;
        break;
      }
      t = ensure(s, in[j], t);
    }
    if (s->err)
      break;
    uint64_t need = 0;
    for (uint32_t j = 0; s->budget && j < o->n_out; j++)
      if (!lists_tensor(in, o->n_in, out[j]) &&
          s->t[out[j]].temp_gen != s->list_gen && !lists_tensor(out, j, out[j]))
        need += s->t[out[j]].bytes;
    t = wait_for_room(s, need, t);
    for (uint32_t j = 0; j < o->n_out; j++) {
      uint32_t y = out[j];
      tens_t *yt = &s->t[y];
      if (lists_tensor(in, o->n_in, y) || yt->temp_gen == s->list_gen)
        continue; /* in place or a view: no new storage */
      if (yt->state == CAP__TS_DROPPED) {
        yt->state = CAP__TS_RESIDENT; /* restored by the replay */
        yt->action = CAP_NONE;
        t_alloc(s, y, t, CAP_RESIDENCY_RECOMPUTED, action);
        continue;
      }
      if (s->n_temps == s->cap_temps) {
        uint32_t cap = s->cap_temps ? s->cap_temps * 2 : 64;
        uint32_t *nt = realloc(s->temps, (size_t)cap * sizeof *nt);
        if (nt)
          s->temps = nt;
        uint32_t *nr = realloc(s->temp_res, (size_t)cap * sizeof *nr);
        if (nr)
          s->temp_res = nr;
        if (!nt || !nr) {
          s->err = CAP_ENOMEM;
          break;
        }
        s->cap_temps = cap;
      }
      yt->temp_gen = s->list_gen;
      s->temp_res[s->n_temps] = t_alloc(s, y, t, CAP_RESIDENCY_TEMPORARY, action);
      s->temps[s->n_temps++] = y;
    }
    int64_t dur = o->end_ns - o->start_ns;
    t += dur;
    s->out->recompute_ns += dur;
  }
  advance_to(s, t);
  for (uint32_t i = 0; i < s->n_temps; i++) {
    s->t[s->temps[i]].temp_gen = 0;
    mem_change(s, t, -(int64_t)s->t[s->temps[i]].bytes);
    close_residency(s, s->temp_res[i], t, false, false);
  }
  s->n_temps = 0;
  if (owner->state == CAP__TS_DROPPED) /* the list did not produce it */
    s->err = CAP_EINVAL;
  return t;
}

static void do_free(sim_t *s, uint32_t id, int64_t t) {
  tens_t *tt = &s->t[id];
  switch (tt->state) {
  case CAP__TS_RESIDENT:
  case CAP__TS_SWAP_OUT:
  case CAP__TS_SWAP_IN:
    advance_to(s, t);
    t_release(s, id, t, false, false);
    break;
  default:
    break;
  }
  tt->state = CAP__TS_FREED;
}

/* --- setup ----------------------------------------------------------------- */

static int bucket(uint32_t n_ops, uint32_t n_items, const uint32_t *key,
                  uint32_t **off_out, uint32_t **items_out) {
  uint32_t *off = calloc((size_t)n_ops + 1, sizeof *off);
  uint32_t *items = malloc((size_t)(n_items ? n_items : 1) * sizeof *items);
  if (!off || !items) {
    free(off);
    free(items);
    return CAP_ENOMEM;
  }
  for (uint32_t i = 0; i < n_items; i++)
    if (key[i] != CAP_NONE)
      off[key[i] + 1]++;
  for (uint32_t i = 0; i < n_ops; i++)
    off[i + 1] += off[i];
  uint32_t *fill = malloc((size_t)(n_ops + 1) * sizeof *fill);
  if (!fill) {
    free(off);
    free(items);
    return CAP_ENOMEM;
  }
  memcpy(fill, off, (size_t)(n_ops + 1) * sizeof *fill);
  for (uint32_t i = 0; i < n_items; i++)
    if (key[i] != CAP_NONE)
      items[fill[key[i]]++] = i;
  free(fill);
  *off_out = off;
  *items_out = items;
  return 0;
}

static int prepare(sim_t *s) {
  const cap_profile_t *p = s->p;
  const cap_plan_t *plan = s->plan;
  uint32_t na = plan ? plan->n_actions : 0;
  s->t = calloc((size_t)(p->n_tensors ? p->n_tensors : 1), sizeof *s->t);
  if (!s->t)
    return CAP_ENOMEM;
  for (uint32_t i = 0; i < p->n_tensors; i++) {
    s->t[i].bytes = p->tensors[i].bytes;
    s->t[i].action = CAP_NONE;
  }
  s->copies = calloc((size_t)(2 * na + 2), sizeof *s->copies);
  s->pf_slot = malloc((size_t)(na + 1) * sizeof *s->pf_slot);
  for (int d = 0; d < 2; d++) {
    s->eng[d].q = malloc((size_t)(na + 1) * sizeof(uint32_t));
    s->eng[d].cur = -1;
  }
  uint32_t *tkey = malloc((size_t)(na + 1) * sizeof *tkey);
  uint32_t *ekey = malloc((size_t)(na + 1) * sizeof *ekey);
  int rc = 0;
  if (!s->copies || !s->pf_slot || !s->eng[0].q || !s->eng[1].q || !tkey ||
      !ekey) {
    rc = CAP_ENOMEM;
    goto out;
  }
  uint32_t n_swaps = 0;
  for (uint32_t i = 0; i < na; i++) {
    const cap_action_t *a = &plan->actions[i];
    s->pf_slot[i] = CAP_NONE;
    tkey[i] = ekey[i] = CAP_NONE;
    if (a->tensor >= p->n_tensors) {
      rc = CAP_EINVAL;
      goto out;
    }
    const cap_tensor_t *t = &p->tensors[a->tensor];
    bool release = cap_action_is_release(a);
    if (a->evict_after_access == 0 ||
        (release ? a->evict_after_access != t->n_accesses
                 : a->evict_after_access >= t->n_accesses)) {
      rc = CAP_EINVAL;
      goto out;
    }
    ekey[i] = p->access_ops[t->access_off + a->evict_after_access - 1];
    s->copies[2 * i].tensor = s->copies[2 * i + 1].tensor = a->tensor;
    if (a->method == CAP_METHOD_SWAP) {
      s->pf_slot[i] = n_swaps++;
      if (a->prefetch_tensor != CAP_NONE) {
        uint32_t op = a->prefetch_tensor < p->n_tensors
                          ? cap_profile_access_op(p, a->prefetch_tensor,
                                                  a->prefetch_access)
                          : CAP_NONE;
        if (op == CAP_NONE || op <= ekey[i]) {
          rc = CAP_EINVAL;
          goto out;
        }
        tkey[i] = op;
      }
    } else if (release) {
      if (cap_tensor_is_resident(t)) {
        rc = CAP_EINVAL; /* its value is needed by the next iteration */
        goto out;
      }
    } else if (a->method == CAP_METHOD_RECOMPUTE) {
      if (a->recompute_off > plan->n_recompute_ops ||
          a->n_recompute > plan->n_recompute_ops - a->recompute_off) {
        rc = CAP_EINVAL;
        goto out;
      }
      const uint32_t *ops = cap_action_recompute_ops(plan, a);
      for (uint32_t k = 0; k < a->n_recompute; k++)
        if (ops[k] >= p->n_ops) {
          rc = CAP_EINVAL;
          goto out;
        }
    } else {
      rc = CAP_EINVAL;
      goto out;
    }
  }
  if (n_swaps) {
    s->out->prefetches = calloc(n_swaps, sizeof *s->out->prefetches);
    if (!s->out->prefetches) {
      rc = CAP_ENOMEM;
      goto out;
    }
    s->out->n_prefetches = n_swaps;
    for (uint32_t i = 0; i < na; i++)
      if (s->pf_slot[i] != CAP_NONE)
        s->out->prefetches[s->pf_slot[i]].action = i;
  }
  rc = bucket(p->n_ops, na, tkey, &s->trig_off, &s->trig);
  if (!rc)
    rc = bucket(p->n_ops, na, ekey, &s->evict_off, &s->evict);
out:
  free(tkey);
  free(ekey);
  return rc;
}

static void cleanup(sim_t *s) {
  free(s->t);
  free(s->copies);
  free(s->pf_slot);
  free(s->eng[0].q);
  free(s->eng[1].q);
  free(s->trig_off);
  free(s->trig);
  free(s->evict_off);
  free(s->evict);
  free(s->temps);
  free(s->temp_res);
  free(s->pts);
  free(s->res);
  free(s->open_res);
  free(s->had_res);
}

/* --- the iteration --------------------------------------------------------- */

static void simulate(sim_t *s) {
  const cap_profile_t *p = s->p;
  const cap_plan_t *plan = s->plan;
  cap_sim_result_t *out = s->out;
  /* Params, inputs and never-freed activations are on the device all along,
   * inside persistent_bytes (profile.h explains why that is not their sum). */
  for (uint32_t i = 0; i < p->n_tensors; i++)
    if (cap_tensor_is_resident(&p->tensors[i]))
      s->t[i].state = CAP__TS_RESIDENT;
  mem_change(s, 0, (int64_t)p->persistent_bytes);
  if (s->n_pts == 0) { /* keep a point at 0 even with nothing persistent */
    s->pts = malloc(1024 * sizeof *s->pts);
    if (!s->pts) {
      s->err = CAP_ENOMEM;
      return;
    }
    s->cap_pts = 1024;
    s->pts[s->n_pts++] = (cap_curve_point_t){0, 0};
  }

  int64_t cursor = 0;   /* simulated end of the previous op */
  int64_t hold = 0;     /* compute stream blocked until (sync swap-outs) */
  int64_t prev_end = 0; /* measured end of the previous op */
  uint32_t fi = 0;
  for (uint32_t i = 0; i < p->n_ops && !s->err; i++) {
    const cap_op_t *o = &p->ops[i];
    s->op = i;
    s->op_started = false;
    int64_t gap = o->start_ns - prev_end;
    if (gap < 0)
      gap = 0;
    /* Frees in the gap before this op. */
    while (fi < p->n_frees && p->frees[fi].t_ns <= o->start_ns) {
      int64_t off = p->frees[fi].t_ns - prev_end;
      do_free(s, p->frees[fi].tensor, cursor + (off > 0 ? off : 0));
      fi++;
    }
    int64_t ready = cursor + gap;
    if (hold > ready) {
      out->stall_ns += hold - ready;
      ready = hold;
    }
    advance_to(s, ready);
    const uint32_t *in = cap_op_inputs(p, o), *outs = cap_op_outputs(p, o);
    uint32_t n_all = o->n_in + o->n_out;
    /* On-demand swap-ins first, so that they overlap the recomputes. */
    for (uint32_t j = 0; j < n_all; j++) {
      uint32_t id = j < o->n_in ? in[j] : outs[j - o->n_in];
      tens_t *tt = &s->t[id];
      if ((tt->state == CAP__TS_HOST || tt->state == CAP__TS_SWAP_OUT) &&
          tt->action != CAP_NONE && !s->copies[2 * tt->action + 1].issued)
        issue_copy(s, 2 * tt->action + 1, ready);
    }
    int64_t t = ready;
    for (uint32_t j = 0; j < n_all && !s->err; j++) {
      uint32_t id = j < o->n_in ? in[j] : outs[j - o->n_in];
      if (s->t[id].state == CAP__TS_DROPPED)
        t = run_list(s, s->t[id].action, t);
    }
    for (uint32_t j = 0; j < n_all && !s->err; j++) {
      uint32_t id = j < o->n_in ? in[j] : outs[j - o->n_in];
      t = ensure(s, id, t);
    }
    if (s->err)
      break;
    /* The op starts, once its first-touched activations fit. */
    uint64_t need = 0;
    for (uint32_t j = 0; s->budget && j < n_all; j++) {
      uint32_t id = j < o->n_in ? in[j] : outs[j - o->n_in];
      bool dup = false; /* (an optimizer step lists thousands, none unborn) */
      for (uint32_t q = 0; s->t[id].state == CAP__TS_UNBORN && q < j && !dup;
           q++)
        dup = (q < o->n_in ? in[q] : outs[q - o->n_in]) == id;
      if (!dup && s->t[id].state == CAP__TS_UNBORN)
        need += s->t[id].bytes;
    }
    t = wait_for_room(s, need, t);
    int64_t start = t;
    advance_to(s, start);
    s->op_started = true;
    s->op_start_ns = start;
    s->op_end_ns = start + (o->end_ns - o->start_ns);
    for (uint32_t k = s->trig_off[i]; k < s->trig_off[i + 1]; k++) {
      uint32_t ai = s->trig[k];
      tens_t *tt = &s->t[plan->actions[ai].tensor];
      if (tt->action == ai && (tt->state == CAP__TS_HOST || tt->state == CAP__TS_SWAP_OUT))
        issue_copy(s, 2 * ai + 1, start);
    }
    for (uint32_t j = 0; j < n_all; j++) {
      uint32_t id = j < o->n_in ? in[j] : outs[j - o->n_in];
      if (s->t[id].state == CAP__TS_UNBORN) {
        s->t[id].state = CAP__TS_RESIDENT;
        t_alloc(s, id, start, CAP_RESIDENCY_FIRST_TOUCH, CAP_NONE);
      }
    }
    /* Frees during this op. */
    while (fi < p->n_frees && p->frees[fi].t_ns < o->end_ns) {
      do_free(s, p->frees[fi].tensor, start + (p->frees[fi].t_ns - o->start_ns));
      fi++;
    }
    int64_t end = start + (o->end_ns - o->start_ns);
    advance_to(s, end);
    for (uint32_t k = s->evict_off[i]; k < s->evict_off[i + 1]; k++) {
      uint32_t ai = s->evict[k];
      const cap_action_t *a = &plan->actions[ai];
      tens_t *tt = &s->t[a->tensor];
      if (tt->state != CAP__TS_RESIDENT)
        continue; /* freed already */
      tt->action = ai;
      if (a->method == CAP_METHOD_RECOMPUTE) {
        tt->state = cap_action_is_release(a) ? CAP__TS_RELEASED : CAP__TS_DROPPED;
        t_release(s, a->tensor, end, false, false);
        continue;
      }
      tt->state = CAP__TS_SWAP_OUT;
      out->swap_out_bytes += tt->bytes;
      issue_copy(s, 2 * ai, end);
      if (a->flags & CAP_ACTION_SYNC_OUT) {
        int64_t done = wait_copy(s, 2 * ai);
        if (done > hold)
          hold = done;
      }
    }
    cursor = end;
    prev_end = o->end_ns;
  }
  if (s->err)
    return;
  int64_t iter = cursor;
  if (hold > iter) {
    out->stall_ns += hold - iter;
    iter = hold;
  }
  while (fi < p->n_frees) {
    int64_t off = p->frees[fi].t_ns - prev_end;
    do_free(s, p->frees[fi].tensor, cursor + (off > 0 ? off : 0));
    fi++;
  }
  out->iter_ns = iter;
  /* What is still on the device at the end stays into the next iteration:
   * its interval ends with this one. */
  for (uint32_t i = 0; s->record && i < s->n_res; i++)
    if (s->res[i].end_ns < 0) {
      s->res[i].end_ns = iter > s->res[i].start_ns ? iter : s->res[i].start_ns + 1;
      s->res[i].last_op = p->n_ops - 1;
    }
  for (uint32_t i = 0; plan && i < plan->n_actions; i++)
    if (plan->actions[i].method == CAP_METHOD_SWAP && s->copies[2 * i + 1].issued)
      out->swap_in_bytes += s->t[plan->actions[i].tensor].bytes;
}

static int run_sim(const cap_profile_t *p, const cap_plan_t *plan,
                   const cap_bandwidth_t *bw, cap_sim_result_t *out,
                   cap_residency_t **res, uint32_t *n_res) {
  if (!out)
    return CAP_EINVAL;
  memset(out, 0, sizeof *out);
  if (!p || !p->finished || !bw)
    return CAP_EINVAL;
  if (plan && plan->n_actions && (!bw->h2d_gbps || !bw->d2h_gbps ||
                                  !(bw->h2d_gbps > 0) || !(bw->d2h_gbps > 0)))
    return CAP_EINVAL;
  sim_t s;
  memset(&s, 0, sizeof s);
  s.p = p;
  s.plan = plan;
  s.bw = *bw;
  s.out = out;
  s.list_gen = 1;
  s.budget = plan ? plan->budget_bytes : 0;
  s.record = res != NULL;
  if (s.record) {
    s.open_res = malloc((p->n_tensors ? p->n_tensors : 1) * sizeof *s.open_res);
    s.had_res = calloc(p->n_tensors ? p->n_tensors : 1, sizeof *s.had_res);
    if (!s.open_res || !s.had_res) {
      free(s.open_res);
      free(s.had_res);
      return CAP_ENOMEM;
    }
    for (uint32_t i = 0; i < p->n_tensors; i++)
      s.open_res[i] = CAP_NONE;
  }
  /* The one definition of what a plan means: a plan whose lists cannot
   * run as written is not simulated (cap_plan_validate says why). */
  int rc = plan ? cap_plan_walk(plan, p, NULL) : 0;
  if (!rc)
    rc = prepare(&s);
  if (!rc) {
    simulate(&s);
    rc = s.err;
  }
  if (!rc) {
    uint64_t peak = 0;
    int64_t peak_t = 0;
    for (uint32_t i = 0; i < s.n_pts; i++)
      if (s.pts[i].bytes > peak) {
        peak = s.pts[i].bytes;
        peak_t = s.pts[i].t_ns;
      }
    out->peak_bytes = peak;
    out->peak_t_ns = peak_t;
    out->curve.points = s.pts;
    out->curve.n_points = s.n_pts;
    out->curve.peak_bytes = peak;
    out->curve.peak_t_ns = peak_t;
    s.pts = NULL;
    if (s.record) {
      *res = s.res;
      *n_res = s.n_res;
      s.res = NULL;
    }
  }
  cleanup(&s);
  if (rc)
    cap_sim_result_close(out);
  return rc;
}

int cap_sim_run(const cap_profile_t *p, const cap_plan_t *plan,
                const cap_bandwidth_t *bw, cap_sim_result_t *out) {
  return run_sim(p, plan, bw, out, NULL, NULL);
}

int cap_sim_residency(const cap_profile_t *p, const cap_plan_t *plan,
                      const cap_bandwidth_t *bw, cap_sim_result_t *out,
                      cap_residency_t **res, uint32_t *n_res) {
  if (!res || !n_res)
    return CAP_EINVAL;
  *res = NULL;
  *n_res = 0;
  return run_sim(p, plan, bw, out, res, n_res);
}

void cap_sim_result_close(cap_sim_result_t *r) {
  if (!r)
    return;
  free(r->prefetches);
  cap_curve_close(&r->curve);
  memset(r, 0, sizeof *r);
}
