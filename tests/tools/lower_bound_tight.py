#!/usr/bin/python3
"""lower_bound.py's LP with a tighter charge for a replay: its in-place writers too.

usage: lower_bound_tight.py TRACE [any lower_bound.py option]     (same rows, same --json)
       lower_bound_tight.py --compare BOUND.jsonl TIGHT.jsonl CAPUCHIN.jsonl  (bench_bound --jsonl)
       lower_bound_tight.py --check-plan TRACE PLAN.json   (capuchin-sim --emit-plan: the ASSUMPTION)

Imports /work/shared/tools/lower_bound.py (or $LOWER_BOUND_DIR) and changes one thing: a
restore of gap g = (T, access a -> b) is charged dur(p) (as there) PLUS dur(q) for every
in-place writer q of T with p < q <= a: an op listing T as input and output whose ATen name
ends in '_' (policy/src/profile.c name_is_inplace; view ops are not writers). These are the
ops cap_plan_validate demands in T's list ("every op that wrote T ... up to the
evicted-access"); writes after a belong to later versions and are not charged.  (A writer
listing T only as output would be a second fresh writer, which lower_bound.py refuses.)  Only
"exclusive" writers are charged: q that writes no other tensor a replay could restore (no
fresh activation output, no other activation written in place).  Writers shared with another
tensor (batch norm updating its running statistics while producing its output) are left out,
as one run could serve two restores.  The charge enters both the cost (per restored fraction,
on the gap's dropped amount) and the window's R_w row, exactly like dur(p) for a one-output p.

WHY IT IS STILL A LOWER BOUND.  lower_bound.py's argument (1), (2), (4) are untouched; in (3)
a restore of T in window w is a recompute list run in w.  If T is the list's own tensor,
cap_plan_validate makes the list contain p and every in-place writer of T up to a, and the
simulator (sim.c run_list) charges each listed op its duration.  A writer q charged here is
exclusive to T, and restores of one tensor in one window amount to <= 1 (gaps of T restore in
disjoint windows), so the runs of q in w take >= dur(q) * (restored fraction of T in w): the
new charge is <= the real replay time in w, Delta_w >= 0 still holds, and the LP optimum is
<= the extra time of the plan.  ASSUMPTION: the walk (plan_walk.c run_list) also restores, for
free, every dropped output of a listed op (a tensor T' whose producer is in another tensor's
list) and checks nothing about T''s in-place writers there.  A by-product restore that skips
them hands T''s back-access the wrong value: the plan is wrong (FORMAT.md: a replay must
reproduce the version read) but the simulator accepts it.  The bound here holds for every
accepted plan whose restores all reproduce the version read at the back-access; for an
accepted plan that breaks this, lower_bound.py's bound still holds and this one may not.
Capuchin's own plans keep it: at every CNN and vgg16 budget of bench_bound, both modes, no list
restores a dropped tensor without the writers charged here (--check-plan on each plan).
Still ignored: replay inputs that are evicted or modified (fetch/replay of sources).
"""
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.environ.get('LOWER_BOUND_DIR', '/work/shared/tools'))
import lower_bound as lb  # noqa: E402


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


class TightBound(lb.LowerBound):
    def __init__(self, tr, *args, **kw):
        super().__init__(tr, *args, **kw)
        writes = defaultdict(list)                # T -> in-place writers after its producer
        users = defaultdict(set)                  # op -> tensors a replay of it could restore
        for i, (_, _, name, ins, outs) in enumerate(tr.ops):
            for x in tr.fresh[i]:
                users[i].add(x)
            if name_is_inplace(name):
                for x in set(ins) & set(outs):
                    if tr.kind[x] == 'activation' and x in tr.producer and i > tr.producer[x]:
                        writes[x].append(i)
                        users[i].add(x)
        self.writes = writes
        self.excl = {x: [q for q in qs if users[q] == {x}] for x, qs in writes.items()}
        self.n_shared = sum(len(qs) - len(self.excl[x]) for x, qs in writes.items())

    def extra_us(self, x, a):
        """Charge added to a restore of T = x evicted after op a (us)."""
        return sum(self.tr.dur[q] for q in self.excl.get(x, ()) if q <= a) / lb.US

    def solve(self, budget, verbose=False):
        C, _ = self.checkpoints(budget)          # the same checkpoints solve() will use
        Cl, W = C.tolist(), len(C) + 1
        orig = lb.linprog

        def linprog(c, A_ub, b_ub, A_eq, b_eq, bounds, **kw):
            rch_row = {}                          # window -> row "R_w - charges <= 0"
            Acsc = A_ub.tocsc()
            for w in range(W):
                col = Acsc.getcol(W + w)
                for r, v in zip(col.indices, col.data):
                    if v == 1.0:
                        rch_row[w] = r
            c = c.copy()
            rr, cc, vv = [], [], []
            added = 0.0
            for (B_bytes, a, b, x), (x2, a2, b2, ssw, _, src0) in zip(self._kept_gaps(Cl),
                                                                      self.gap_cols):
                assert (x, a, b) == (x2, a2, b2)
                e = self.extra_us(x, a) if src0 is not None else 0.0
                if e <= 0:
                    continue
                B, L = B_bytes / lb.MB, len(ssw)
                k1 = lb.bisect.bisect_right(Cl, a)
                c[src0] += e / B                  # per dropped (= restored) fraction
                added += e
                restores = [(k1 + 1 + i, src0 + L + i) for i in range(L - 1)]
                restores.append((k1 + L, src0 + L - 1))
                for w, col in restores:           # R_w may cover the new charge
                    rr.append(rch_row[w]); cc.append(col); vv.append(-e / B)
            if rr:
                A_ub = (A_ub + lb.sp.csr_matrix((vv, (rr, cc)), shape=A_ub.shape)).tocsr()
            self.added_us = added
            return orig(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, **kw)

        lb.linprog = linprog
        try:
            res = super().solve(budget, verbose)
        finally:
            lb.linprog = orig
        res['charge'] = 'producer+inplace_writers'
        res['n_shared_writers_skipped'] = self.n_shared
        return res

    def _kept_gaps(self, Cl):
        for g in self.gaps:                      # the gaps solve() keeps, in its order
            if lb.bisect.bisect_right(Cl, g[1]) <= lb.bisect.bisect_left(Cl, g[2]) - 1:
                yield g


def check_plan(trace, plan_path):
    """Lists of a plan that restore a dropped tensor (their own, or a by-product: a fresh output
    of a listed op whose drop gap holds the list's back-access) without its charged writers."""
    tr = lb.Trace(trace)
    b = TightBound(tr)
    lists = [a for a in json.load(open(plan_path))['actions']
             if a['method'] == 'recompute' and a['recompute_ops']]
    gap = lambda a: tr.acc[a['tensor']][a['evict_after_access'] - 1:][:2]  # noqa: E731
    drops = defaultdict(list)
    for a in lists:
        drops[a['tensor']].append(gap(a))
    n_by = bad = 0
    for a in lists:
        L, (_, back) = set(a['recompute_ops']), gap(a)
        todo = [(a['tensor'], gap(a)[0])]
        for op in a['recompute_ops']:
            for y in tr.fresh[op]:
                todo += [(y, ay) for ay, by in drops.get(y, []) if y != a['tensor'] and ay < back <= by]
        n_by += len(todo) - 1
        bad += sum(any(q <= ay and q not in L for q in b.excl.get(y, ())) for y, ay in todo)
    print(f'{len(lists)} lists, {n_by} by-product restores, {bad} restores missing a charged writer')
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
