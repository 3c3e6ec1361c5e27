/*
 * Internals of the Capuchin planner (capuchin.c and its helpers).
 *
 * The planner reasons in "op space": device memory while op i runs is the
 * memory at op i's start (allocations happen at op starts, releases at op
 * ends or when a copy completes), so an array indexed by op seq describes
 * the whole curve. Every candidate eviction removes its bytes from a range
 * of ops; a segment tree with range add / range max answers "is this range
 * still over the target" and keeps the estimate incremental, so the real
 * simulator (cap_sim_run) runs once per round rather than once per
 * candidate.
 *
 * Files: candidates.c (context, op-space memory, eviction gaps), ft.c (swap
 * timing and copy-engine bookings, free time), trigger.c (in-trigger
 * choice), msps.c (recompute lists and their cost), capuchin.c (the main
 * loop), refine.c (cap_plan_refine).
 */
#ifndef CAPUCHIN_INTERNAL_H
#define CAPUCHIN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "capuchin/plan.h"
#include "capuchin/planner.h"
#include "capuchin/profile.h"
#include "capuchin/sim.h"
#include "planners.h" /* cap__lineage_t */

/* --- op-space memory: range add, range max (candidates.c) ---------------- */
typedef struct cap__memtree {
  int64_t *mx; /* max of the subtree, lazy adds folded in */
  int64_t *lz; /* pending add for the whole subtree */
  uint32_t n;
} cap__memtree_t;

int cap__memtree_init(cap__memtree_t *t, const int64_t *vals, uint32_t n);
void cap__memtree_close(cap__memtree_t *t);
/* Add delta to ops [lo, hi). */
void cap__memtree_add(cap__memtree_t *t, uint32_t lo, uint32_t hi,
                      int64_t delta);
/* Max over ops [lo, hi); INT64_MIN for an empty range. */
int64_t cap__memtree_max(const cap__memtree_t *t, uint32_t lo, uint32_t hi);
/* First / last op whose value is > x, or CAP_NONE. */
uint32_t cap__memtree_first_above(const cap__memtree_t *t, int64_t x);
uint32_t cap__memtree_last_above(const cap__memtree_t *t, int64_t x);
static inline int64_t cap__memtree_max_all(const cap__memtree_t *t) {
  return t->n ? t->mx[1] : 0;
}

/* --- copy engine bookings (ft.c) -----------------------------------------
 * One FIFO copy engine, bookings keyed by the op seq at which the copy is
 * issued (D2H: the evicted-access op, H2D: the in-trigger op). Bookings are
 * kept in FIFO order: a booking at key k starts after every booking with a
 * key <= k ends and ends before any booking with a key > k starts, which is
 * what the simulator's FIFO queues do as long as nothing is pushed later. */
typedef struct cap__engine {
  uint32_t n;            /* keys: op seqs 0..n-1 */
  uint64_t *bits;        /* key has a booking */
  uint64_t *sum;         /* bits of bits: word w has any booking */
  int64_t *first_start;  /* per key: start of its first booking, ns */
  int64_t *last_end;     /* per key: end of its last booking, ns */
} cap__engine_t;

int cap__engine_init(cap__engine_t *e, uint32_t n);
void cap__engine_close(cap__engine_t *e);
/* Largest booked key <= k, or CAP_NONE. */
uint32_t cap__engine_prev(const cap__engine_t *e, uint32_t k);
/* Smallest booked key > k, or CAP_NONE. */
uint32_t cap__engine_next(const cap__engine_t *e, uint32_t k);
void cap__engine_book(cap__engine_t *e, uint32_t k, int64_t start,
                      int64_t end);

/* --- planner context (candidates.c) --------------------------------------- */

/* An eviction candidate: tensor evicted after access k (op a), back at
 * access k+1 (op b). A tail (k = the last access) has no back-access: op b
 * is the first op that no longer holds the tensor, and evicting it there is
 * a release (plan.h). */
typedef struct cap__gap {
  uint32_t tensor;
  uint32_t k;
  uint32_t a, b;
} cap__gap_t;

enum { GAP_FREE = 0, GAP_SWAP = 1, GAP_RECOMPUTE = 2 };

typedef struct cap__choice {
  uint32_t gap;
  cap_method_t method;
  uint32_t trig_op;        /* swap: in-trigger op, CAP_NONE = on demand */
  uint32_t rc_off, rc_n;   /* recompute: ops in ctx->rc_ops */
  uint32_t save_lo, save_hi; /* ops [lo, hi) no longer hold the tensor */
  int64_t extra_bytes;     /* recompute: temporaries at op b */
  int64_t in_end;          /* swap: when the swap-in lands, ns */
  int64_t in_start;        /* swap: when the swap-in starts, ns */
  int64_t out_end;         /* swap: when the swap-out ends, ns */
  uint32_t d2h_next;       /* next choice booked at the same D2H key */
  bool pruned;             /* undone after the fact (see prune) */
  bool release;            /* a tail: released after its last access */
  int64_t cost_ns;         /* recompute time or exposed swap time */
} cap__choice_t;

typedef struct cap__u32vec {
  uint32_t *v;
  uint32_t n, cap;
} cap__u32vec_t;

typedef struct cap__ctx {
  const cap_profile_t *p;
  const cap_plan_config_t *cfg;
  uint32_t n_ops;
  int64_t *op_start; /* ns, per op (profile timeline) */
  int64_t *op_end;
  uint32_t *live_end; /* per tensor: first op that no longer holds it */
  int64_t *base_mem;  /* per op: unmanaged device bytes at its start */
  int64_t *born;      /* per op: bytes first allocated at its start */
  /* per tensor: ops that write it after its producer (in-place or out=),
   * and its producer too when that op is in place, ascending:
   * mods[mod_off[t] .. mod_off[t+1]) */
  uint32_t *mod_off, *mods;
  uint8_t *gap_state; /* per access slot (access_off + k - 1): GAP_* */
  uint32_t *slot_choice; /* per access slot: index into ch, when chosen */
  cap__gap_t *gaps;
  uint32_t n_gaps;    /* gaps with a back-access: gaps[0 .. n_gaps) */
  uint32_t n_tails;   /* tails after them: gaps[n_gaps .. n_gaps + n_tails) */
  double *gap_key;    /* per gap: ranking key when last evaluated (0: dead) */
  uint8_t *no_hidden; /* per gap: a hidden swap was found impossible */
  cap__memtree_t mem;
  cap__engine_t d2h, h2d;
  uint32_t *d2h_head; /* per op: first choice whose D2H is issued there */
  int64_t target;     /* bytes the estimate must stay within this round */
  bool push_back;     /* a new D2H copy may delay copies issued later */
  bool loose_push;    /* ... up to the current peak, not just the target */
  bool no_fetch;      /* replays may not fetch swapped-out sources */
  bool weigh_cover;   /* rank by MSPS x share of the over-target region */
  bool share_lineage; /* rank replays by cost beyond cap__rc_saved */
  double d2h_gbps, h2d_gbps; /* rates the planner books copies at */
  /* the budget of the plans built: what the simulator lets an allocation
   * wait for room in (sim.h); 0 while the planner keeps to plans that
   * need no such wait */
  uint64_t plan_budget;
  /* per tensor: back-access ops at which a chosen recompute list reads or
   * writes it; evicting the tensor over such an op would break that list */
  cap__u32vec_t *uses;
  cap__choice_t *ch;
  uint32_t n_ch, cap_ch;
  uint32_t *rc_ops; /* recompute lists of the chosen actions */
  uint32_t n_rc_ops, cap_rc_ops;
  /* scratch for recompute-list building */
  uint32_t *mark;    /* per tensor: generation it was restored in */
  uint32_t *mark_ver; /* per tensor: version restored */
  uint32_t gen;
  uint32_t *opmark;  /* per op: generation it was listed in */
  cap__u32vec_t list, stack, stack_ver, touched;
  cap__u32vec_t restored; /* choices a built list brings back early */
  /* restored[0 .. n_sources_restored): sources the list reads, brought
   * back by their own lists run before it (not in its cost); the rest are
   * outputs of its own ops (in its cost) */
  uint32_t n_sources_restored;
} cap__ctx_t;

/* Whether the Capuchin planner may evict tensor t: a freed activation
 * always, unless no_evict; params, inputs and never-freed activations
 * (running stats, optimizer state) only with persistent eviction. The
 * baselines' rule (cap__evictable, planners.h) is narrower. */
static inline bool cap__may_evict(const cap_tensor_t *t,
                                  bool evict_persistent) {
  if (t->no_evict)
    return false;
  if (t->kind == CAP_KIND_ACTIVATION && t->free_ns >= 0)
    return true;
  return evict_persistent;
}

int cap__ctx_init(cap__ctx_t *c, const cap_profile_t *p,
                  const cap_plan_config_t *cfg);
void cap__ctx_close(cap__ctx_t *c);
int cap__u32vec_push(cap__u32vec_t *v, uint32_t x);
/* First op whose start is >= t (n_ops when none). */
uint32_t cap__op_at_or_after(const cap__ctx_t *c, int64_t t);
/* Last op < limit whose start is <= t (CAP_NONE when none). */
uint32_t cap__op_at_or_before(const cap__ctx_t *c, int64_t t, uint32_t limit);
/* Whether tensor x is on the device just before op b under the choices so
 * far (live at b and not inside an evicted gap ending at or after b). */
bool cap__resident_at(const cap__ctx_t *c, uint32_t x, uint32_t b);
/* Index of the chosen action that has x off the device just before op b
 * (its gap (a, b'] contains b; a release after the last access a < b), or
 * CAP_NONE. */
uint32_t cap__evicting_choice(const cap__ctx_t *c, uint32_t x, uint32_t b);
/* First op in (a, b] at which a chosen recompute list reads or writes x
 * (CAP_NONE when none): evicting x over (a, b) brings it back there (the
 * simulator fetches or replays a missing source on demand). */
uint32_t cap__first_use(const cap__ctx_t *c, uint32_t x, uint32_t a,
                        uint32_t b);/* Number of writes to x after its producer by ops with seq < op. */
uint32_t cap__version_before(const cap__ctx_t *c, uint32_t x, uint32_t op);
/* Whether x is written after its producer by an op with seq in [lo, hi). */
bool cap__written_between(const cap__ctx_t *c, uint32_t x, uint32_t lo,
                          uint32_t hi);

/* --- swap timing, free time (ft.c) ---------------------------------------- */
typedef struct cap__swap_eval {
  int64_t out_start, out_end; /* D2H, ns on the profile timeline */
  int64_t in_start, in_end;   /* H2D */
  uint32_t trig_op;           /* CAP_NONE: on demand at the back-access */
  uint32_t save_lo, save_hi;  /* ops [lo, hi) freed of the tensor */
  int64_t ft_ns;              /* in_start - out_end */
  int64_t stall_ns;           /* exposed time at the back-access */
} cap__swap_eval_t;

/* Free time of gap g with both engines idle: back-access start - swap-in
 * time - (evicted-access end + swap-out time). */
int64_t cap__ft_standalone(const cap__ctx_t *c, const cap__gap_t *g);
/* Book-keeping-aware swap of gap g. hidden: the swap-in must end by the
 * back-access minus the margin, and the ops from its start to the
 * back-access must be within c->target (returns false when it cannot);
 * otherwise an on-demand swap-in whose time is exposed. Nothing is
 * booked. */
bool cap__ft_eval(const cap__ctx_t *c, const cap__gap_t *g, bool hidden,
                  cap__swap_eval_t *ev);
/* Book the swap of choice ci (already in c->ch) on the engines. A D2H
 * copy inserted before copies issued later pushes them back (FIFO); their
 * frees move later, which this updates in the memory estimate. */
void cap__ft_commit(cap__ctx_t *c, const cap__gap_t *g,
                    const cap__swap_eval_t *ev, uint32_t ci);

/* --- in-trigger choice (trigger.c) ---------------------------------------- */
/* Latest op t in (so_op.., b) whose start is a valid issue time for an H2D
 * copy of `len_ns` that must end by `deadline`, the H2D queue considered,
 * and that accesses a tensor other than x. Returns the op (CAP_NONE when
 * none) and the copy's start in *start. */
uint32_t cap__trigger_find(const cap__ctx_t *c, uint32_t x, uint32_t so_op,
                           uint32_t b, int64_t len_ns, int64_t deadline,
                           int64_t *start);
/* A (tensor, access) naming op t other than tensor x; false when op t
 * accesses no other tensor. */
bool cap__trigger_name(const cap_profile_t *p, uint32_t t, uint32_t x,
                       uint32_t *tensor, uint32_t *access);

/* The in-trigger (tt, ta) for swap action a that starts its prefetch
 * stall_ns + step_ns earlier than now (its current trigger, or its
 * back-access when on demand), but after its evicted-access; the earliest
 * such trigger when none starts that early. false when there is none
 * (refine.c). */
bool cap__earlier_trigger(const cap_profile_t *p, const cap_action_t *a,
                          int64_t stall_ns, int64_t step_ns, uint32_t *tt,
                          uint32_t *ta);

/* Profiles shorter than this get the whole local search (more tries, the
 * search repeated, the moves on pairs of actions); bert_large (3341 ops),
 * whose planning time at 50 % is bounded, and longer profiles the plain
 * one. */
#define CAP__SMALL_OPS 3000u

/* Local search on a plan that fits cfg->budget_bytes: tries its costliest
 * replays (at most max_tries) as just-in-time swaps, leaves out costly
 * evictions, starts late prefetches earlier by their lateness, gives
 * stalling swaps prefetches, merges replays that share ops into one list,
 * exchanges costly replays for swaps cheaper to replay, and keeps each
 * change that the
 * simulator finds faster and no higher at its peak; plan is replaced in
 * place, its predictions kept current. A plan that does not fit is left as it is.
 * Returns 0 or CAP_ENOMEM (improve.c). */
int cap__plan_improve(cap_plan_t *plan, const cap_profile_t *p,
                      const cap_plan_config_t *cfg, uint32_t max_tries);

/* The same search, each change kept up to the budget rather than the
 * plan's own peak: the room a plan leaves under the budget, used last. */
int cap__plan_use_room(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg, uint32_t max_tries);

/* A swap whose prefetch the simulator finds late: the action, and by how
 * much. */
typedef struct {
  int64_t late_ns;
  uint32_t action;
} cap__late_t;

/* plan's late swaps, the latest first: *out (malloc'd, freed by the
 * caller) and *n. plan must have actions (polish.c). Returns 0 or an
 * error. */
int cap__late_swaps(const cap_plan_t *plan, const cap_profile_t *p,
                    const cap_bandwidth_t *bw, cap__late_t **out, uint32_t *n);

/* Action a becomes a swap whose prefetch lands just in time on idle
 * engines (cap__earlier_trigger), `lead` ns earlier than that, on demand
 * when none can (improve.c). */
void cap__make_swap(cap_action_t *a, const cap_profile_t *p,
                    const cap_plan_config_t *cfg, int64_t lead);

/* Replay time of the lineage of swap action a, its sources taken as on the
 * device (make_explicit adds what is not); -1 when it has none. The list
 * is left in l (improve.c). */
int cap__lineage_ns(cap__lineage_t *l, const cap_profile_t *p,
                    const cap_action_t *a, int64_t *ns);

/* Action ai of plan replays the list in l instead of swapping
 * (improve.c). */
int cap__set_replay(cap_plan_t *plan, uint32_t ai, const cap__lineage_t *l);

/* next, simulated, takes plan's place when it is faster than plan, no
 * higher than limit at its peak, and valid (contents swapped: the caller's
 * pointer stays valid, next then holds the old plan); answers whether it
 * did (improve.c). */
bool cap__take_if_better(cap_plan_t *plan, cap_plan_t *next,
                         const cap_profile_t *p, uint64_t limit);

/* A change to plan, next, simulated: when it is faster than plan, no
 * higher than limit at its peak, and valid, it takes plan's place
 * (contents swapped: the caller's pointer stays valid) and *kept is set;
 * one whose recompute list cannot run as written is refused. next is
 * destroyed either way (improve.c). Returns 0 or an error. */
int cap__keep_if_faster(cap_plan_t *plan, cap_plan_t *next,
                        const cap_profile_t *p, const cap_bandwidth_t *bw,
                        uint64_t limit, bool *kept);

/* next, a change to plan with its lists made explicit, simulated and taken
 * as cap__take_if_better takes it (*kept). While it is not, every late
 * prefetch starts its lateness earlier (cap__earlier_trigger) and it is
 * simulated again, `rounds` simulations at most: a new prefetch just in
 * time queues behind others in the H2D FIFO, and small ones behind it come
 * late (a batch-norm statistic of 256 bytes 3 ms late behind a 196 MiB
 * tensor). *first_ns (unless NULL): its time as first simulated. next stays
 * the caller's (improve.c). Returns 0 or cap_sim_run's error (CAP_EINVAL:
 * a list cannot run as written). */
int cap__take_with_earlier_prefetches(cap_plan_t *plan, cap_plan_t *next,
                                      const cap_profile_t *p,
                                      const cap_plan_config_t *cfg,
                                      uint64_t limit, uint32_t rounds,
                                      int64_t *first_ns, bool *kept);

/* Swap action ai of plan with its prefetch started lead ns earlier
 * (cap__earlier_trigger), simulated and kept as cap__keep_if_faster keeps;
 * *tried false when no other trigger does that (nothing simulated)
 * (polish.c). Returns 0 or an error. */
int cap__try_earlier(cap_plan_t *plan, const cap_profile_t *p,
                     const cap_plan_config_t *cfg, uint32_t ai, int64_t lead,
                     uint64_t limit, bool *tried, bool *kept);

/* Each late prefetch of plan, the latest first, tries a few triggers
 * around its lateness earlier and keeps the first that the simulator finds
 * faster, no higher at its peak, and valid; at most max_sims simulations
 * (polish.c). Returns 0 or an error. */
int cap__polish_triggers(cap_plan_t *plan, const cap_profile_t *p,
                         const cap_plan_config_t *cfg, uint32_t max_sims);

/* Each late swap of plan, the latest first, tries the eviction of a
 * tensor at least as large, resident across its time off the device (a
 * second pass: from a later op on) and next needed later, in its place; keeps the first the simulator finds
 * faster, no higher at its peak, and valid; at most max_sims simulations
 * (substitute.c). Returns 0 or an error. */
int cap__substitute_late(cap_plan_t *plan, const cap_profile_t *p,
                         const cap_plan_config_t *cfg, uint32_t max_sims);

/* An action or a gap ranked for a move: sorted by key, ascending, then by
 * tensor and access (cap__cmp_item, a qsort comparator; exchange_many.c). */
typedef struct {
  double key;
  int64_t ns; /* replay time, or what a change saves */
  uint32_t tensor, k;
} cap__item_t;

int cap__cmp_item(const void *a, const void *b);

/* For each of the costliest replays of plan (at most max_tries), the swaps
 * cheapest to replay per byte whose bytes together cover it are replayed
 * instead and it is swapped; for each swap cheapest to replay per byte, the
 * replays costliest per byte that fit in its bytes are swapped and it is
 * replayed. Keeps each change that the simulator finds faster, no higher
 * at its peak, and valid (exchange_many.c). Returns 0 or an error. */
int cap__exchange_many(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg, uint32_t max_tries);

/* While plan stalls more than 1 % of its iteration (a shorter wait is the
 * trigger polish's), its swaps whose replay takes less than their copy out,
 * least replay time per copy time first (at most max_tries), each replayed
 * instead: its copies leave the queues, and what waited behind them moves
 * up. Keeps each change that the simulator finds faster, no higher at its
 * peak, and valid (exchange_many.c). Returns 0 or an error. */
int cap__replay_queued_swaps(cap_plan_t *plan, const cap_profile_t *p,
                             const cap_plan_config_t *cfg, uint32_t max_tries);

/* For the costliest replays of plan (at most max_tries), ranked by what
 * keeping their tensor on the device saves (the lists that replay part of
 * its list rebuilt): the tensor stays, and gaps the plan leaves on the
 * device across the ops it would take over the plan's peak, cheapest to
 * replay per byte, are dropped instead, their replays costing less than
 * the saving. Keeps each change that the simulator finds faster, no
 * higher at its peak, and valid (trade.c). Returns 0 or an error. */
int cap__trade_replays(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg, uint32_t max_tries);
/* The same, each change kept up to the budget rather than the plan's own
 * peak. */
int cap__trade_replays_room(cap_plan_t *plan, const cap_profile_t *p,
                            const cap_plan_config_t *cfg, uint32_t max_tries);
/* The same two, each followed, on short profiles, by pairs of the
 * costliest replays kept on the device together the same way. */
int cap__trade_replays_pairs(cap_plan_t *plan, const cap_profile_t *p,
                             const cap_plan_config_t *cfg, uint32_t max_tries);
int cap__trade_replays_room_pairs(cap_plan_t *plan, const cap_profile_t *p,
                                  const cap_plan_config_t *cfg,
                                  uint32_t max_tries);
/* The same as cap__trade_replays_pairs, the drops allowed to leave up to a
 * quarter of the kept bytes uncovered by the estimate (each op's bytes
 * from the simulator's residencies; queues that move with the plan, it
 * cannot see), each taking along the swaps of its op's other outputs
 * (replayed with it): the simulator judges. */
int cap__trade_replays_near(cap_plan_t *plan, const cap_profile_t *p,
                            const cap_plan_config_t *cfg, uint32_t max_tries);

/* The ops with two or more evictable outputs, cheapest per byte first (at
 * most max_groups): each, cumulatively, has every output dropped over its
 * longest access gap and replayed whole; the costliest replays then try
 * swaps in the memory that frees, and the local search (tries) runs; the
 * fastest plan seen replaces plan when it is faster, no higher at its
 * peak, and valid (group.c). Returns 0 or an error. */
int cap__group_replays(cap_plan_t *plan, const cap_profile_t *p,
                       const cap_plan_config_t *cfg, uint32_t max_groups,
                       uint32_t tries);

/* --- recompute lists, MSPS (msps.c) --------------------------------------- */
/* Build the recompute list of gap g under the choices so far into c->list
 * (op seqs ascending). Returns 0 with *cost_ns (replay time) and
 * *extra_bytes (temporaries at the back-access), or CAP_ENOENT when the
 * tensor cannot be recomputed correctly (no lineage, an input written in
 * place since, a source the plan has evicted, list too long). */
int cap__rc_build(cap__ctx_t *c, const cap__gap_t *g, int64_t *cost_ns,
                  int64_t *extra_bytes);
/* Replay time of the chosen lists that the list in c->list (built for a
 * back-access at op b) makes unnecessary: each dropped tensor its own ops
 * bring back whose own back-access comes later finds it on the device and
 * never runs its own list. Two tensors with a common ancestor then pay for
 * it once, as one segment. (A dropped source the list reads is brought
 * back by its own list, which is not in the list's cost: nothing saved.) */
int64_t cap__rc_saved(const cap__ctx_t *c, uint32_t b);
/* Register the list in c->list as used at op b (see cap__first_use). */
int cap__rc_register(cap__ctx_t *c, uint32_t b);
/* Memory saving per second, bytes / ns scaled, for ranking. */
static inline double cap__msps(uint64_t bytes, int64_t cost_ns) {
  return (double)bytes / (double)(cost_ns + 1);
}

/* Entry point registered in planner.c. */
int cap__plan_capuchin(const cap_profile_t *p, const cap_plan_config_t *cfg,
                       cap_plan_t **out);

#endif /* CAPUCHIN_INTERNAL_H */
