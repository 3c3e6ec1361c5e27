#!/usr/bin/python3
"""lower_bound.py's LP with a tighter charge for a replay (every op a valid list must run)
and the bytes resident before the iteration that no tensor accounts for.

usage: lower_bound_tight.py TRACE [any lower_bound.py option]     (same rows, same --json)
       lower_bound_tight.py --compare BOUND.jsonl TIGHT.jsonl CAPUCHIN.jsonl  (bench_bound --jsonl)
       lower_bound_tight.py --check-plan TRACE PLAN.json   (capuchin-sim --emit-plan: the ASSUMPTION)

Imports /work/shared/tools/lower_bound.py (or $LOWER_BOUND_DIR) and changes two things.

UNTRACKED BYTES.  The simulator that decides whether a plan fits counts persistent_bytes =
max(resident_bytes, the resident tensors) from the start (profile.c), and evicts only tensors;
lower_bound.py counts params and inputs all along and never-freed activations from their first
access.  So at every op the simulator's memory is at least the LP's plus U = resident_bytes -
(params + inputs + never-freed activations) (cuBLAS workspaces: 65-88 MiB on the bundled
traces); U is added to the live curve and to the floor.  capuchin's cap_plan_min_budget then
equals this floor with --evict-persistent on every bundled trace, and is at most 4 KiB above it
without (the LP may evict never-freed activations, the planner may not).  Budgets stay
lower_bound.py's.

THE RECOMPUTE CHARGE.  lower_bound.py charges a restore of gap g = (T, access a -> b) only dur(p),
p the producer of T, and ignores whether p's inputs are there when the replay runs.  Here a
restore of g is charged every op of its CLOSURE, the ops any list the project's walk accepts
(docs/plan-semantics.md, plan_walk.c run_list) must contain to restore T at an op i:
  - p, and every in-place writer of T from p up to a (an op listing T as input and output
    whose ATen name ends in '_', profile.c name_is_inplace): cap_plan_validate demands them
    ("every op that wrote T ... up to the evicted-access");
  - for every listed op o and activation input y of o (y != T) that is GONE at op i: freed
    by the framework (a free line at or before op i's start) or written in place by an op in
    [o, i) (cap_profile_written_in_place), the producer of y, and so on recursively.  run_list
    takes an input either from an earlier op of the list or from the device, and refuses a
    gone one from the device; an earlier op that outputs y either makes it fresh (the unique
    fresh writer, the producer: lower_bound.py checks there is one) or also reads y, which is
    then gone for it too (its range [o', i) holds [o, i)), so by induction the list holds
    the producer.  (On mobilenet_v2, clone's input is overwritten by hardtanh_ right after:
    restoring the clone needs the batch norm before it.  On bert_large, a weight gradient's
    inputs are freed early in the backward: restoring it at the optimizer needs the backward
    chain behind it.)
Gone-ness only grows with i, and a restore counted at a checkpoint after a runs at an op
i > c_k1 (the first checkpoint after a: a list runs just before its op starts, so the list of
op c_k1 itself ends before that checkpoint), so the closure is taken at i0 = c_k1 + 1, a subset
of the one at the real i.  It is cut at CLOSURE_MAX ops (breadth-first): any subset is a bound.
Plan-dependent reasons a list must replay more (an input the plan dropped or released) are
left out.

The charge is one per op and window: y[o,w] >= (restored fraction of g in w) for every op o
in the closure of every gap g restored in window w, cost dur(o) * y[o,w], and R_w (the
replay time that lengthens window w) <= sum of dur(o) * y[o,w].  This replaces lower_bound.py's
charges (dur(p) per restored fraction, z[p,w] for a multi-output p, which is y[p,w]).

WHY IT IS STILL A LOWER BOUND.  lower_bound.py's argument (2), (4) are untouched; in (1) every
row's need rises by U, which the simulator's memory holds above the LP's (above).  In
(3), map a plan as there: fractions 0 or 1, y[o,w] = 1 when some list run in window w holds
op o.  A list runs whole in one window (just before its op), and every restore in window w is
made by a list run in w whose ops include the closure of the restored gap (above), so
y[o,w] >= restored fraction of each gap needing o; the simulator charges each listed op its
duration each time a list runs it, so sum dur(o) * y[o,w] <= the real replay time in w,
Delta_w >= 0 still holds, and the LP optimum is <= the extra time of the plan.
ASSUMPTION: a list also restores, for free, every dropped output of a listed op (a tensor T'
whose producer is in another tensor's list), and run_list checks T''s inputs there but not
T''s own in-place writers.  A by-product restore that skips them hands T''s back-access the
wrong value: the plan is wrong (FORMAT.md: a replay must reproduce the version read) but the
simulator accepts it.  The bound here holds for every accepted plan whose restores all
reproduce the version read at the back-access; for an accepted plan that breaks this,
lower_bound.py's bound still holds and this one may not.  --check-plan checks a plan's
every restore, own and by-product, against the closure at the list's real op; Capuchin's own
plans pass at every bench_bound budget, both modes.
Still ignored: replay temporaries' memory, inputs the plan swapped out (their copies), the
copy engines' FIFO order.

FORCED COPIES.  The LP checks memory at a few checkpoints (the op of most live bytes in each
run of over-budget ops), so an op where the memory pinches just before a deadline can fall
between them (bert_large's optimizer: op 3332's add, then three foreach ops that read every
weight, momentum and gradient; vgg16's op 169).  For such a pinch op o: while o runs the
device holds the U bytes, o's own tensors, the persistent tensors that must stay (all of them
without --evict-persistent; with it, those not accessed yet: a tensor leaves only after an
access) and every tensor accessed both up to o and after it that the plan did not take off.
Whatever exceeds the budget, X_o bytes, is off the device during o.  A tensor off during o
comes back before its next access q by a copy or (an activation) a replay.  The copy's
memory is taken when it starts (docs/plan-semantics.md), so it starts after o ends; copies
into the device run at most 55.1 bytes/ns; so the copies due by op q take at least their
bytes / 55.1 ns after o ends, and the time inserted before q starts (stalls, replays) is at
least that minus start(q) - end(o).  A replay runs at least the closure of its tensor at q
(above), each op once per list.  The plan's extra time is then at least
  min over f, x in {0, 1} (copied, replayed; f + x <= 1, sum (f + x) bytes >= X_o, less
  what a write-only next access needs not back) of max(max over q of sum_{q_t <= q}
  f_t bytes_t / 55.1 - (start(q) - end(o)), sum over ops of dur(op) * max over the replays
  holding op of x_t),
a MILP (forced_ns; integral for the FORCED_INTEGRAL largest candidates, the rest relaxed; past
FORCED_TIME_S its dual bound), solved at up to FORCED_OPS pinch ops, the likeliest first: the
largest copy-only values (no replay, the latest needed off first, which the max over q makes
optimal: the MILP is at most that), with and without the replays that cost less than a copy
taken as free.  With every activation off for free, the copy-only value is itself a bound, at
every op.  Any o gives a bound, so extra_ns is max(the LP's optimum, forced_ns) (lp_extra_ns,
forced_op keep both).

WHOLE REPLAYS.  The MILP is integral for its largest candidates only, and the rest share
closure ops charged once per op: a relaxation can then replay a few percent of each of many
small candidates whose closures overlap (bert_large's weight gradients at the optimizer, each
needing about 13 ms of the backward pass) and pay that fraction of the shared ops once.  A
plan replays a tensor whole, running its closure whole, so a plan that replays a candidate
whose closure alone runs V ns (V the copy-only value at o, no replay) costs at least V, and
a plan that replays none of them is a solution of the MILP without them.  The bound at o is
then at least min(V, that MILP): such candidates are left out of the replays, and the value
is capped at V (the MILP is integral where the copy-only value may copy part of a tensor).
(bert_large at 60 % --evict-persistent: 3.67 ms with them, 5.16 ms without, at op 3332.)

TWO PINCHES.  The time a plan inserts after o ends and before its candidates' next accesses
is disjoint from what it inserts between an earlier op o1's end and o's start.  At o1, the
candidates due by o's start are charged as above, those due later taken off for free (their
cost, if any, lies after o or is not counted); the two values add up (forced_ns; vgg16 at
50 %: the first convolution's 784 MiB output, off during op 164 and due at op 165, then the
weight gradients due at the optimizer after op 169).  o is the best single pinch op
(forced_op), o1 the best earlier one (forced_first_op).

COPIES OUT FIRST.  A candidate copied off for o must also have been copied OUT before o
starts: the simulator gives its memory back only when its D2H copy ends (an op that would
allocate over the budget waits for it, and an op that allocates nothing runs at the level an
earlier allocation reached with the candidate still there), and the copy starts after the
candidate's last access a before o ends.  Copies out of the device run one at a time at
most 55.1 bytes/ns, so for every such a the candidates copied whose a_t >= a take at least
their bytes / 55.1 ns between end(a) and start(o), and the time inserted there is at least
that minus start(o) - end(a): zb >= sum_{a_t >= a} f_t bytes_t / 55.1 - (start(o) - end(a)).
That time lies before o starts, the copies back and the replays after it ends: the plan's
extra time is at least zb + z, z as above.  forced_at(out=True) solves the MILP with zb
added to the cost and every replay in it, at the FORCED_OPS pinch ops of largest
out-and-back copy-only values (forced_out_ns, forced_out_op; extra_ns is the largest of the
LP, forced_ns and forced_out_ns).  (vgg16 at 60 %: the first convolution's 784 MiB output
cannot leave by copy before the classifier's pinch without 1.9 ms of waiting, as long as
replaying it; 2.77 ms where the LP and forced_ns give 1.91.)  Not added to TWO PINCHES: the
time before o may be the time after o1.
"""
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.environ.get('LOWER_BOUND_DIR', '/work/shared/tools'))
import lower_bound as lb  # noqa: E402
import numpy as np  # noqa: E402
from scipy.optimize import Bounds, LinearConstraint, milp  # noqa: E402

CLOSURE_MAX = 32  # ops charged per restore: any subset of the closure is a bound
FORCED_OPS = 32   # pinch ops the forced-copy LP is solved at, at most
FORCED_CLOSURE_MAX = 256  # its closures (few replays, so longer ones)
FORCED_INTEGRAL = 24      # its largest candidates, whole
FORCED_TIME_S = 5         # per pinch op


def name_is_inplace(name):
    """policy/src/profile.c: the operator between namespace and overload ends in '_';
    dunders only as __i*__."""
    op = name.split('.', 1)[1] if '.' in name else name
    op = op.split('.', 1)[0]
    if len(op) < 2 or op[-1] != '_':
        return False
    if len(op) >= 4 and op[:2] == '__' and op[-2] == '_':
        return op[2] == 'i'
    return True


def untracked_bytes(tr):
    """Bytes the simulator holds all along that lower_bound.py's live curve never counts:
    its persistent_bytes is max(resident_bytes, the resident tensors) (profile.c), while the
    LP counts params and inputs all along and never-freed activations from their first
    access on; what resident_bytes holds beyond all three (cuBLAS workspaces, ~66 MiB on
    every bundled trace) no plan can evict."""
    tracked = sum(b for x, b in tr.size.items()
                  if tr.kind[x] in ('param', 'input')
                  or (tr.kind[x] == 'activation' and x not in tr.free_ns))
    return max(0, int(tr.meta.get('resident_bytes', 0)) - tracked)


class TightBound(lb.LowerBound):
    def __init__(self, tr, *args, **kw):
        super().__init__(tr, *args, **kw)
        # the simulator's memory at every op is at least the LP's plus these bytes
        self.untracked = untracked_bytes(tr)
        self.forced_closures = {}                # (x, a, q) -> forced_closure's ops
        self.live = self.live + self.untracked
        self.min_budget += self.untracked
        # writes: T -> its in-place writers after its producer (an op listing T on both
        # sides); inplace: x -> every op that writes x in place, whatever x's kind
        # (cap_profile_written_in_place: the CAP_OP_INPLACE flag, x among the outputs)
        self.writes, self.inplace = defaultdict(list), defaultdict(list)
        for i, (_, _, name, ins, outs) in enumerate(tr.ops):
            if not name_is_inplace(name):
                continue
            for x in dict.fromkeys(outs):
                self.inplace[x].append(i)
                if x in ins and tr.kind[x] == 'activation' and x in tr.producer \
                        and i > tr.producer[x]:
                    self.writes[x].append(i)

    def gone(self, x, o, i):
        """plan_walk.c run_list: may a list run at op i NOT take input x of its op o from the
        device? Freed by the framework (a free line at or before op i's start), or written in
        place by an op in [o, i). Plan-dependent reasons (dropped, released) are left out."""
        tr = self.tr
        f = tr.free_ns.get(x)
        if f is not None and f <= tr.ops[i][0]:
            return True
        qs = self.inplace.get(x, ())
        j = lb.bisect.bisect_left(qs, o)
        return j < len(qs) and qs[j] < i

    def closure(self, x, a, i, cap=CLOSURE_MAX):
        """Ops every valid list that restores x (evicted after op a) at op i or later must
        contain, in BFS order, at most CLOSURE_MAX: its producer p, its in-place
        writers up to a, and, for each activation input of a listed op that is gone at op i,
        that input's producer (the one op that makes it fresh), recursively."""
        tr = self.tr
        p = tr.producer[x]
        ops = [p] + [q for q in self.writes.get(x, ()) if q <= a]
        seen, head = set(ops), 0
        while head < len(ops) and len(ops) < cap:
            o = ops[head]
            head += 1
            for y in dict.fromkeys(tr.ops[o][3]):
                if y == x or tr.kind[y] != 'activation' or not self.gone(y, o, i):
                    continue
                q = tr.producer.get(y)
                if q is not None and q not in seen and len(ops) < cap:
                    seen.add(q)
                    ops.append(q)
        return ops

    def pinch(self, budget):
        """X_o per op o (FORCED COPIES above): the bytes over the budget while o runs with
        every candidate on the device, the candidates being the tensors accessed both up to o
        and after it, not o's own, that may leave (self.movable). Ops with X_o <= 0 left out."""
        tr, ep = self.tr, self.evict_persistent
        n = tr.n
        persistent = {x for x, k in tr.kind.items() if k in ('param', 'input')}
        self.movable = {x for x, ks in tr.acc.items() if len(ks) > 1 and
                        (tr.kind[x] == 'activation' or (ep and x in persistent))}
        # persistent bytes that stay while o runs: all without EP; with it, those not
        # accessed yet (a tensor leaves only after an access)
        stay = np.zeros(n + 1)
        for x in persistent:
            stay[0] += tr.size[x]
            if ep and x in tr.acc:
                stay[tr.acc[x][0]] -= tr.size[x]
        # candidates' bytes: first access <= o < last access
        cand = np.zeros(n + 1)
        for x in self.movable:
            cand[tr.acc[x][0]] += tr.size[x]
            cand[tr.acc[x][-1]] -= tr.size[x]
        stay, cand = np.cumsum(stay)[:n], np.cumsum(cand)[:n]
        out = {}
        for o in range(n):
            own = set(tr.ops[o][3]) | set(tr.ops[o][4])
            X = self.untracked + stay[o] + cand[o] - budget
            for x in own:          # held once, as o's own
                ks = tr.acc[x]
                stays = tr.kind[x] in ('param', 'input') and (not ep or ks[0] > o)
                counted = x in self.movable and ks[0] <= o < ks[-1]
                X += tr.size[x] * (1 - stays - counted)
            if X > 0:
                out[o] = X
        return out

    def candidates(self, o):
        """The candidates at o (pinch): (tensor, its last access up to o, its next access),
        and the bytes of those whose next access only writes them (no plan needs those back:
        free to be off)."""
        tr = self.tr
        own = set(tr.ops[o][3]) | set(tr.ops[o][4])
        res, free = [], 0
        for x in self.movable:
            ks = tr.acc[x]
            if x in own or not ks[0] <= o < ks[-1]:
                continue
            j = lb.bisect.bisect_right(ks, o)
            if x in tr.ops[ks[j]][3]:
                res.append((x, ks[j - 1], ks[j]))
            else:
                free += tr.size[x]
        return res, free

    def copy_only(self, o, X, cands, free=()):
        """forced_ns at o with no replay, the latest needed off first; the candidates in free
        taken off first at no cost (all activations: a bound no replay can lower)."""
        tr = self.tr
        left, off = X, []
        left -= sum(tr.size[c[0]] for c in cands if c in free)
        for x, a, q in sorted((c for c in cands if c not in free), key=lambda r: -r[2]):
            if left <= 0:
                break
            take = min(left, tr.size[x])
            off.append((q, take))
            left -= take
        worst, acc = 0.0, 0.0
        for q, b in sorted(off):
            acc += b
            worst = max(worst, acc / lb.H2D_GBPS - (tr.ts[q] - tr.te[o]))
        return worst

    def forced_closure(self, x, a, q):
        """closure(x, a, q) at FORCED_CLOSURE_MAX ops, computed once per gap."""
        key = (x, a, q)
        if key not in self.forced_closures:
            self.forced_closures[key] = self.closure(x, a, q, FORCED_CLOSURE_MAX)
        return self.forced_closures[key]

    def cheap_replays(self, cands):
        """The activation candidates whose replay (forced_closure) costs less per byte than a
        copy: the order forced() tries pinch ops in takes them as free."""
        tr = self.tr
        return {c for c in cands if tr.kind[c[0]] == 'activation' and c[0] in tr.producer
                and sum(tr.dur[op] for op in self.forced_closure(*c))
                < tr.size[c[0]] / lb.H2D_GBPS}

    def forced_at(self, o, X, cands, most, out=False):
        """The MILP of FORCED COPIES at pinch op o, most its copy-only value: (extra ns or
        None, solver status). out: with COPIES OUT FIRST (the time inserted before o too)."""
        tr = self.tr
        k = len(cands)
        # A replay whose closure alone runs at least the copy-only value is left out: a
        # plan making it costs that much already (WHOLE REPLAYS above)
        reps = [(i, self.forced_closure(*c)) for i, c in enumerate(cands)
                if tr.kind[c[0]] == 'activation' and c[0] in tr.producer]
        n_reps = len(reps)
        reps = [(i, cl) for i, cl in reps if sum(tr.dur[op] for op in cl) < most]
        ops = sorted({op for _, cl in reps for op in cl})
        opcol = {op: i for i, op in enumerate(ops)}
        nx, ny = len(reps), len(ops)
        # columns: f[k], x[nx], y[ny], z, then zb with out
        nv = k + nx + ny + 1 + out
        zc = k + nx + ny
        MB = 1e6
        rows, cols, vals, rhs = [], [], [], []
        r = 0
        # sum (f + x) bytes >= X  ->  -sum ... <= -X
        for i, (x, _, _) in enumerate(cands):
            rows.append(r); cols.append(i); vals.append(-tr.size[x] / MB)
        for j, (i, _) in enumerate(reps):
            rows.append(r); cols.append(k + j); vals.append(-tr.size[cands[i][0]] / MB)
        rhs.append(-X / MB); r += 1
        # f_i + x_i <= 1
        for j, (i, _) in enumerate(reps):
            rows += [r, r]; cols += [i, k + j]; vals += [1.0, 1.0]; rhs.append(1.0); r += 1
        # per deadline q: sum_{q_t <= q} f bytes / BW - z <= start(q) - end(o)   (in us)
        order = sorted(range(k), key=lambda i: cands[i][2])
        qs = sorted({cands[i][2] for i in range(k)})
        pos = 0
        members = []
        for q in qs:
            while pos < k and cands[order[pos]][2] <= q:
                members.append(order[pos]); pos += 1
            for i in members:
                rows.append(r); cols.append(i)
                vals.append(tr.size[cands[i][0]] / lb.H2D_GBPS / lb.US)
            rows.append(r); cols.append(zc); vals.append(-1.0)
            rhs.append((tr.ts[q] - tr.te[o]) / lb.US); r += 1
        # replays: x_j - y_op <= 0 ; sum dur y - z <= 0
        for j, (i, cl) in enumerate(reps):
            for op in cl:
                rows += [r, r]; cols += [k + j, k + nx + opcol[op]]; vals += [1.0, -1.0]
                rhs.append(0.0); r += 1
        for op, c in opcol.items():
            rows.append(r); cols.append(k + nx + c); vals.append(tr.dur[op] / lb.US)
        rows.append(r); cols.append(zc); vals.append(-1.0); rhs.append(0.0); r += 1
        if out:
            # per threshold a: sum_{a_t >= a} f bytes / BW - zb <= start(o) - end(a)   (in us)
            order = sorted(range(k), key=lambda i: -cands[i][1])
            pos, members = 0, []
            for a in sorted({c[1] for c in cands}, reverse=True):
                while pos < k and cands[order[pos]][1] >= a:
                    members.append(order[pos]); pos += 1
                for i in members:
                    rows.append(r); cols.append(i)
                    vals.append(tr.size[cands[i][0]] / lb.D2H_GBPS / lb.US)
                rows.append(r); cols.append(zc + 1); vals.append(-1.0)
                rhs.append((tr.ts[o] - tr.te[a]) / lb.US); r += 1
        A = lb.sp.csr_matrix((vals, (rows, cols)), shape=(r, nv))
        cost = np.zeros(nv); cost[zc:] = 1.0
        lo = np.zeros(nv)
        hi = np.concatenate([np.ones(k + nx), np.full(ny + 1 + out, np.inf)])
        # a tensor is on the device, copied or replayed whole: integral for the largest
        # candidates (a relaxation of the rest is still a bound)
        integ = np.zeros(nv)
        big = sorted(range(k), key=lambda i: -tr.size[cands[i][0]])[:FORCED_INTEGRAL]
        integ[big] = 1
        rep_of = {i: j for j, (i, _) in enumerate(reps)}
        integ[[k + rep_of[i] for i in big if i in rep_of]] = 1
        sol = milp(cost, integrality=integ, bounds=Bounds(lo, hi),
                   constraints=LinearConstraint(A, -np.inf, np.array(rhs)),
                   options={'time_limit': FORCED_TIME_S})
        # past the time limit the solver's dual bound is still a bound
        v = getattr(sol, 'mip_dual_bound', None)
        if sol.status == 0 and sol.fun is not None:
            v = sol.fun if v is None else min(v, sol.fun)
        if v is None or not np.isfinite(v):
            return None, sol.status
        v = float(v) * lb.US
        if len(reps) < n_reps:
            # min(V, that MILP): the copy-only value takes a fraction of one tensor, which
            # the MILP may not, so the MILP can lie above it
            v = min(v, most)
        return v, sol.status

    def best_pinch(self, scored, best=0.0, best_op=None):
        """The largest forced_at over scored (ranked(), per op), at most
        FORCED_OPS tried, the likeliest by two orders; the MILP is at most `most`, the
        copy-only value, so an op where that is no more than best is skipped."""
        tries = sorted(scored, key=lambda s: -s[0])[:FORCED_OPS // 2]
        tries += sorted(scored, key=lambda s: -s[1])[:FORCED_OPS // 2]
        done = set()
        for _, most, o, X, cands in tries:
            if most <= best or o in done:
                continue
            done.add(o)
            v, _ = self.forced_at(o, X, cands, most)
            if v is not None and v > best:
                best, best_op = v, o
        return best, best_op

    def ranked(self, o, X, cands):
        """What best_pinch orders pinch op o by: (copy-only value with the cheap replays
        free, copy-only value, o, X, cands)."""
        return (self.copy_only(o, X, cands, self.cheap_replays(cands)),
                self.copy_only(o, X, cands), o, X, cands)

    def pinched(self, budget):
        """{o: (X, cands)} for the pinch ops whose X_o stays above 0 once the candidates
        free to be off are: what forced() and forced_out() both look at."""
        out = {}
        for o, X in self.pinch(budget).items():
            cands, free = self.candidates(o)
            if X - free > 0:
                out[o] = (X - free, cands)
        return out

    def forced(self, pinched):
        """forced_ns (FORCED COPIES) over pinched(), its pinch op and the earlier one added
        to it (TWO PINCHES); (0, None, None) when no op pinches."""
        best, best_op = 0.0, None
        for o, (X, cands) in pinched.items():
            acts = {c for c in cands if self.tr.kind[c[0]] == 'activation'}
            v = self.copy_only(o, X, cands, acts)
            if v > best:
                best, best_op = v, o
        best, best_op = self.best_pinch([self.ranked(o, X, c) for o, (X, c) in pinched.items()],
                                        best, best_op)
        if best_op is None:
            return 0.0, None, None
        # TWO PINCHES: an earlier op's copies and replays due by best_op's start
        first = []
        for o, (X, cands) in pinched.items():
            due = [c for c in cands if c[2] <= best_op]
            Xd = X - sum(self.tr.size[c[0]] for c in cands if c[2] > best_op)
            if o < best_op and Xd > 0:
                first.append(self.ranked(o, Xd, due))
        more, first_op = self.best_pinch(first)
        return best + more, best_op, first_op

    def out_only(self, o, X, cands):
        """The time COPIES OUT FIRST inserts before o with every byte off copied: the
        earliest evicted first (fractions allowed), the most any threshold is late."""
        tr = self.tr
        left, off = X, []
        for x, a, _ in sorted(cands, key=lambda c: c[1]):
            if left <= 0:
                break
            off.append((a, min(left, tr.size[x])))
            left -= tr.size[x]
        worst, acc = 0.0, 0.0
        for a, b in sorted(off, reverse=True):
            acc += b
            worst = max(worst, acc / lb.D2H_GBPS - (tr.ts[o] - tr.te[a]))
        return worst

    def forced_out(self, pinched):
        """forced_out_ns (COPIES OUT FIRST) over pinched() and its pinch op; (0, None) when
        no op pinches. The FORCED_OPS pinch ops tried are those of the largest copy-only
        values, out and back in."""
        scored = [(self.out_only(o, X, cands) + self.copy_only(o, X, cands), o, X, cands)
                  for o, (X, cands) in pinched.items() if cands]
        best, best_op = 0.0, None
        for _, o, X, cands in sorted(scored, key=lambda s: -s[0])[:FORCED_OPS]:
            v, _ = self.forced_at(o, X, cands, float('inf'), out=True)
            if v is not None and v > best:
                best, best_op = v, o
        return best, best_op

    def solve(self, budget, verbose=False):
        C, _ = self.checkpoints(budget)          # the same checkpoints solve() will use
        Cl, W = C.tolist(), len(C) + 1
        orig = lb.linprog

        def linprog(c, A_ub, b_ub, A_eq, b_eq, bounds, **kw):
            ncol = A_ub.shape[1]
            rch_row = {}                          # window -> row "R_w - charges <= 0"
            Acsc = A_ub.tocsc()
            for w in range(W):
                col = Acsc.getcol(W + w)
                for r, v in zip(col.indices, col.data):
                    if v == 1.0:
                        rch_row[w] = r
            # lower_bound.py's charges (dur(p) per restored fraction, or z[p,w] for a
            # multi-output p) are replaced by one charge per op and window below
            c = c.copy()
            c[2 * W:] = 0.0
            A = A_ub.tocoo()
            win = np.full(A_ub.shape[0], -1)
            for w, r in rch_row.items():
                win[r] = w
            keep = (win[A.row] < 0) | (A.col == W + win[A.row])
            rr, cc, vv = A.row[keep].tolist(), A.col[keep].tolist(), A.data[keep].tolist()
            nrow = A_ub.shape[0]
            ycol, cost = {}, []
            for (B_bytes, a, b, x), (x2, a2, b2, ssw, _, src0) in zip(self._kept_gaps(Cl),
                                                                      self.gap_cols):
                assert (x, a, b) == (x2, a2, b2)
                if src0 is None:
                    continue
                B, L = B_bytes / lb.MB, len(ssw)
                k1 = lb.bisect.bisect_right(Cl, a)
                # a restore counted at a checkpoint runs at an op after c_k1
                ops = self.closure(x, a, Cl[k1] + 1)
                restores = [(k1 + 1 + i, src0 + L + i) for i in range(L - 1)]
                restores.append((k1 + L, src0 + L - 1))
                for w, col in restores:
                    for o in ops:
                        y = ycol.get((o, w))
                        if y is None:             # y[o,w]: fraction of op o run in window w
                            y = ycol[(o, w)] = ncol + len(cost)
                            d = self.tr.dur[o] / lb.US
                            cost.append(d)
                            rr.append(rch_row[w]); cc.append(y); vv.append(-d)
                        rr += [nrow, nrow]; cc += [col, y]; vv += [1.0 / B, -1.0]
                        nrow += 1
            ny = len(cost)
            A_ub = lb.sp.csr_matrix((vv, (rr, cc)), shape=(nrow, ncol + ny))
            b_ub = np.concatenate([b_ub, np.zeros(nrow - len(b_ub))])
            c = np.concatenate([c, np.array(cost)])
            bounds = np.concatenate([bounds, np.tile([0.0, np.inf], (ny, 1))])
            if A_eq is not None:
                A_eq = lb.sp.hstack([A_eq, lb.sp.csr_matrix((A_eq.shape[0], ny))]).tocsr()
            self.n_charges, self.ycol = ny, ycol
            return orig(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, **kw)

        lb.linprog = linprog
        try:
            res = super().solve(budget, verbose)
        finally:
            lb.linprog = orig
        res['charge'] = 'replay_closure'
        res['closure_max'] = CLOSURE_MAX
        if res.get('status') == 'optimal':
            pinched = self.pinched(budget)
            f, op, first_op = self.forced(pinched)
            res['lp_extra_ns'] = res['extra_ns']
            res['forced_ns'], res['forced_op'] = round(f, 1), op
            res['forced_first_op'] = first_op
            fo, fo_op = self.forced_out(pinched)
            res['forced_out_ns'], res['forced_out_op'] = round(fo, 1), fo_op
            res['extra_ns'] = max(res['extra_ns'], f, fo)
        return res

    def _kept_gaps(self, Cl):
        for g in self.gaps:                      # the gaps solve() keeps, in its order
            if lb.bisect.bisect_right(Cl, g[1]) <= lb.bisect.bisect_left(Cl, g[2]) - 1:
                yield g


def check_plan(trace, plan_path):
    """Restores of a plan (a list's own tensor, or a by-product: a fresh output of a listed op
    whose drop gap holds the list's back-access) whose list lacks an op of the closure charged
    for it (at the list's own op, the exact case of the bound's)."""
    tr = lb.Trace(trace)
    b = TightBound(tr)
    lists = [a for a in json.load(open(plan_path))['actions']
             if a['method'] == 'recompute' and a['recompute_ops']]
    gap = lambda a: tr.acc[a['tensor']][a['evict_after_access'] - 1:][:2]  # noqa: E731
    drops = defaultdict(list)
    for a in lists:
        drops[a['tensor']].append(gap(a))
    restores = []                                # (tensor, evicted after, list's op, list)
    for a in lists:
        L, (_, back) = set(a['recompute_ops']), gap(a)
        restores.append((a['tensor'], gap(a)[0], back, L))
        for op in a['recompute_ops']:
            for y in tr.fresh[op]:
                restores += [(y, ay, back, L) for ay, by in drops.get(y, [])
                             if y != a['tensor'] and ay < back <= by]
    # a drop restored by an earlier list's by-product: its own list never runs
    first = {}
    for y, ay, back, _ in restores:
        first[(y, ay)] = min(first.get((y, ay), back), back)
    n_by = len(restores) - len(lists)
    bad = n_ops = 0
    for y, ay, back, L in restores:
        if back > first[(y, ay)]:
            continue
        need = b.closure(y, ay, back)
        n_ops += len(need)
        missing = [q for q in need if q not in L]
        if missing:
            bad += 1
            print(f'tensor {y} (evicted after op {ay}) restored at op {back}: the list lacks '
                  f'ops {missing}')
    print(f'{len(lists)} lists, {n_by} by-product restores, {n_ops} charged ops, '
          f'{bad} restores missing a charged op')
    return 1 if bad else 0


def compare(bound_path, tight_path, cap_path):
    key = lambda t, ep, p: (t, bool(ep), float(p))  # noqa: E731
    rows = {}
    for path, tag in ((bound_path, 'lb'), (tight_path, 'tight')):
        for line in open(path):
            r = json.loads(line)
            k = key(r['trace'], r['mode'] == 'evict-persistent', r['pct'])
            rows.setdefault(k, {})[tag] = r['lb_overhead_pct']
    for line in open(cap_path):
        r = json.loads(line)
        k = key(r['trace'], r['evict_persistent'], r['pct'])
        if k in rows:
            rows[k]['cap'] = r['capuchin_pct'] if r['feasible'] else None
    fam = {'resnet50': 'cnn', 'inception_v3': 'cnn', 'mobilenet_v2': 'cnn', 'vgg16': 'vgg16'}
    ratios, by_fam = [], defaultdict(lambda: ([], [], []))
    f = lambda v: '-' if v is None else f'{v:.3f}'  # noqa: E731
    print(f"{'trace':14} {'mode':8} {'pct':>4} {'bound%':>8} {'tight%':>8} {'rise':>6} "
          f"{'capuchin%':>9} {'cap/lb':>7} {'cap/tight':>9}")
    for k in sorted(rows):
        d = rows[k]
        lbv, tv, cv = d.get('lb'), d.get('tight'), d.get('cap')
        if k[2] >= 100 or (lbv is None and tv is None):
            continue
        rise = f'{tv / lbv:.2f}x' if lbv and tv is not None else '-'
        r1 = f'{cv / lbv:.2f}x' if lbv and cv is not None else '-'
        r2 = f'{cv / tv:.2f}x' if tv and cv is not None else '-'
        name = k[0].replace('.trace', '')
        print(f"{name:14} {'evict' if k[1] else 'default':8} {k[2]:4.0f} {f(lbv):>8} {f(tv):>8} "
              f"{rise:>6} {f(cv):>9} {r1:>7} {r2:>9}")
        if tv and cv is not None:
            ratios.append(cv / tv)
            fl = by_fam[fam.get(name, 'transformer')]
            fl[0].append(cv / tv); fl[1].append(cv / lbv); fl[2].append(tv / lbv)
    if ratios:
        print(f'capuchin / tight over {len(ratios)} cells with a bound > 0: median '
              f'{statistics.median(ratios):.3f}x, worst {max(ratios):.2f}x')
    for name, (rt, rl, rise) in sorted(by_fam.items()):
        print(f'{name}: {len(rt)} cells, bound rises median {statistics.median(rise):.2f}x '
              f'(max {max(rise):.2f}x); capuchin/bound median {statistics.median(rl):.2f}x, '
              f'capuchin/tight median {statistics.median(rt):.2f}x, worst {max(rt):.2f}x')


if __name__ == '__main__':
    if len(sys.argv) == 5 and sys.argv[1] == '--compare':
        compare(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == '--check-plan':
        sys.exit(check_plan(*sys.argv[2:]))
    else:
        lb.LowerBound = TightBound               # main() builds the LP through this name
        lb.main()
