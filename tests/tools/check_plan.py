#!/usr/bin/env python3
"""An outsider's check of a Capuchin plan against a trace.

Usage: check_plan.py TRACE PLAN.json [--json]

A second implementation of the plan semantics, written only from
docs/plan-semantics.md, tests/data/traces/FORMAT.md and the JSON form of a
plan (capuchin-sim --emit-plan); it shares no code with policy/ so that a
bug in the planners' walk shows up as a disagreement. Standard library only.

It applies the static rules to every action, then walks the plan op by op
(frees; on-demand prefetches; recompute lists with their input rules; the
op, and the prefetches it triggers as it starts; evictions) and prints one line per invalid
action: its index, tensor, the op where it failed, the missing source and
the reason. The last line is "N actions, M invalid". As information it also
reports the peak of device bytes at op granularity (copies are taken as
instantaneous: a swapped tensor's memory is released when its
evicted-access op ends and allocated again when its prefetch is issued);
the peak never makes a plan invalid here.

Exit status: 0 every action valid, 1 some action invalid, 64 bad usage or
unreadable input.

Readings of the document where it leaves room (also in the final report):
- "access k": the k-th op naming the tensor as input or output; an op
  naming it on both sides is one access.
- A writer of T is an op listing T as an output, except a view (an op
  listing T on both sides whose ATen name, the part before the overload,
  does not end in "_"). The producer is the first writer.
- "must not have been written in place by an op in [listed op, i)" applies
  to inputs taken from the device; an input produced earlier in the same
  list is the replay's fresh value.
- When op i names several dropped tensors, their lists run in the order
  op i names them (inputs, then outputs); a tensor restored by an earlier
  list of the same op does not run its own list.
- A free at time t with start(i) < t < end(i) is done when op i ends, before
  its evictions; any other free happens at the start of the first op whose
  start is >= t.
- An action that fails a static rule is reported and left out of the walk.
- A recompute list must be strictly ascending (no op twice).
"""

import json
import sys

EX_OK, EX_INVALID, EX_USAGE = 0, 1, 64
MIB = 1024.0 * 1024.0


class BadInput(Exception):
    pass


def usage(msg=None):
    if msg:
        sys.stderr.write("check_plan.py: %s\n" % msg)
    sys.stderr.write("usage: check_plan.py TRACE PLAN.json [--json]\n")
    sys.exit(EX_USAGE)


def is_inplace_name(name):
    """ATen name ends in '_' before the overload: aten.add_.Tensor."""
    parts = name.split(".")
    base = parts[-2] if len(parts) >= 3 else parts[-1]
    return base.endswith("_")


# --- trace ------------------------------------------------------------------

class Op(object):
    __slots__ = ("idx", "seq", "start", "end", "name", "ins", "outs", "names")


class Trace(object):
    def __init__(self, path):
        self.meta = {}
        self.tbytes = []
        self.tkind = []
        self.ops = []
        self.frees = []  # (t_ns, tensor), sorted by time
        self._parse(path)
        self._derive()

    def _ids(self, field, lineno):
        if field == "-":
            return []
        try:
            return [int(x) for x in field.split(",")]
        except ValueError:
            raise BadInput("trace line %d: bad id list %r" % (lineno, field))

    def _parse(self, path):
        try:
            with open(path, "r") as f:
                lines = f.read().splitlines()
        except (IOError, OSError, UnicodeDecodeError) as e:
            raise BadInput("cannot read trace %s: %s" % (path, e))
        if not lines or lines[0].strip() != "capuchin-trace 1":
            raise BadInput("%s: not a 'capuchin-trace 1' file" % path)
        tensors = {}
        for n, line in enumerate(lines[1:], 2):
            p = line.split()
            if not p or p[0].startswith("#"):
                continue
            try:
                if p[0] == "meta":
                    for kv in p[1:]:
                        k, _, v = kv.partition("=")
                        self.meta[k] = v
                elif p[0] == "tensor":
                    if len(p) != 4:
                        raise ValueError
                    tid, nbytes, kind = int(p[1]), int(p[2]), p[3]
                    if kind not in ("param", "input", "activation"):
                        raise ValueError
                    if tid in tensors or nbytes < 0:
                        raise ValueError
                    tensors[tid] = (nbytes, kind)
                elif p[0] == "op":
                    if len(p) != 7:
                        raise ValueError
                    op = Op()
                    op.seq, op.start, op.end = int(p[1]), int(p[2]), int(p[3])
                    op.name = p[4]
                    op.ins = self._ids(p[5], n)
                    op.outs = self._ids(p[6], n)
                    self.ops.append(op)
                elif p[0] == "free":
                    if len(p) != 3:
                        raise ValueError
                    self.frees.append((int(p[1]), int(p[2])))
                else:
                    raise ValueError
            except ValueError:
                raise BadInput("%s line %d: cannot parse %r" % (path, n, line))
        nt = len(tensors)
        if sorted(tensors) != list(range(nt)):
            raise BadInput("%s: tensor ids are not dense from 0" % path)
        self.tbytes = [tensors[i][0] for i in range(nt)]
        self.tkind = [tensors[i][1] for i in range(nt)]
        for op in self.ops:
            for t in op.ins + op.outs:
                if not 0 <= t < nt:
                    raise BadInput("%s: op %d names unknown tensor %d"
                                   % (path, op.seq, t))
        for _, t in self.frees:
            if not 0 <= t < nt:
                raise BadInput("%s: free of unknown tensor %d" % (path, t))
        self.frees.sort()

    def _derive(self):
        nt = len(self.tbytes)
        self.seq_to_idx = {}
        self.acc = [[] for _ in range(nt)]      # op indices, access order
        self.writes = [[] for _ in range(nt)]   # op indices that write t
        for i, op in enumerate(self.ops):
            op.idx = i
            if op.seq in self.seq_to_idx:
                raise BadInput("op seq %d appears twice" % op.seq)
            self.seq_to_idx[op.seq] = i
            names, seen = [], set()
            for t in op.ins + op.outs:
                if t not in seen:
                    seen.add(t)
                    names.append(t)
            op.names = names
            for t in names:
                self.acc[t].append(i)
            ins = set(op.ins)
            inplace = is_inplace_name(op.name)
            for t in set(op.outs):
                if t not in ins or inplace:
                    self.writes[t].append(i)
        freed = set(t for _, t in self.frees)
        self.persistent = [
            self.tkind[t] in ("param", "input") or t not in freed
            for t in range(nt)]


# --- plan -------------------------------------------------------------------

class Action(object):
    __slots__ = ("index", "raw", "tensor", "k", "method", "trig_tensor",
                 "trig_access", "ops", "release", "ev_op", "back_op",
                 "trig_op", "list_idx")


def load_plan(path):
    try:
        with open(path, "r") as f:
            doc = json.load(f)
    except (IOError, OSError, UnicodeDecodeError) as e:
        raise BadInput("cannot read plan %s: %s" % (path, e))
    except ValueError as e:
        raise BadInput("plan %s is not JSON: %s" % (path, e))
    if not isinstance(doc, dict) or not isinstance(doc.get("actions"), list):
        raise BadInput("plan %s: expected an object with an \"actions\" list"
                       % path)
    return doc


def _uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def describe(a):
    if a.method == "swap":
        how = "swap"
    elif a.release:
        how = "release"
    else:
        how = "recompute"
    return "action %d (tensor %s, %s after access %s)" % (
        a.index, a.tensor, how, a.k)


def static_check(tr, raw, index):
    """Returns (Action, None) or (Action-or-None, reason)."""
    a = Action()
    a.index, a.raw = index, raw
    a.tensor = a.k = a.method = None
    a.trig_tensor = a.trig_access = None
    a.ops, a.release = [], False
    a.ev_op = a.back_op = a.trig_op = None
    a.list_idx = []
    if not isinstance(raw, dict):
        return a, "action is not a JSON object"
    a.tensor = raw.get("tensor")
    a.k = raw.get("evict_after_access")
    a.method = raw.get("method")
    if not _uint(a.tensor):
        return a, "\"tensor\" missing or not a non-negative integer"
    if not _uint(a.k) or a.k < 1:
        return a, "\"evict_after_access\" missing or not an integer >= 1"
    if a.method not in ("swap", "recompute"):
        return a, "unknown method %r" % (a.method,)
    if a.method == "recompute":
        ops = raw.get("recompute_ops")
        if not isinstance(ops, list) or not all(_uint(s) for s in ops):
            return a, "\"recompute_ops\" missing or not a list of op seqs"
        a.ops = ops
        a.release = not ops
    else:
        pf = raw.get("prefetch_at")
        if pf is not None:
            if (not isinstance(pf, dict) or not _uint(pf.get("tensor"))
                    or not _uint(pf.get("access"))):
                return a, "\"prefetch_at\" needs integer tensor and access"
            a.trig_tensor, a.trig_access = pf["tensor"], pf["access"]
    t = a.tensor
    if t >= len(tr.tbytes):
        return a, "tensor %d does not exist (trace has %d)" % (
            t, len(tr.tbytes))
    acc = tr.acc[t]
    if a.k > len(acc):
        return a, "evicted-access %d does not exist (tensor %d has %d " \
            "accesses)" % (a.k, t, len(acc))
    a.ev_op = acc[a.k - 1]
    if a.release:
        if a.k != len(acc):
            return a, "release (empty recompute list) at access %d, not the " \
                "tensor's last access %d: no list produces it for access " \
                "%d" % (a.k, len(acc), a.k + 1)
        if tr.persistent[t]:
            return a, "release of persistent tensor %d (%s%s): only tensors " \
                "freed within the iteration may be released" % (
                    t, tr.tkind[t],
                    ", never freed" if tr.tkind[t] == "activation" else "")
        return a, None
    if a.k == len(acc):
        return a, "no back-access: access %d is the tensor's last" % a.k
    a.back_op = acc[a.k]
    if a.method == "swap":
        if a.trig_tensor is not None:
            pt, pa = a.trig_tensor, a.trig_access
            if pt >= len(tr.tbytes):
                return a, "in-trigger tensor %d does not exist" % pt
            if pa < 1 or pa > len(tr.acc[pt]):
                return a, "in-trigger access %d of tensor %d does not exist " \
                    "(%d accesses)" % (pa, pt, len(tr.acc[pt]))
            a.trig_op = tr.acc[pt][pa - 1]
            if a.trig_op <= a.ev_op:
                return a, "in-trigger op %d (tensor %d access %d) is not " \
                    "after the evicted-access op %d" % (
                        tr.ops[a.trig_op].seq, pt, pa, tr.ops[a.ev_op].seq)
            if a.trig_op > a.back_op:
                return a, "in-trigger op %d (tensor %d access %d) is after " \
                    "the back-access op %d" % (
                        tr.ops[a.trig_op].seq, pt, pa, tr.ops[a.back_op].seq)
        return a, None
    # recompute with a list
    idx = []
    for s in a.ops:
        if s not in tr.seq_to_idx:
            return a, "recompute op %d does not exist" % s
        idx.append(tr.seq_to_idx[s])
    for x, y in zip(idx, idx[1:]):
        if y <= x:
            return a, "recompute list not in ascending order (op %d then " \
                "op %d)" % (tr.ops[x].seq, tr.ops[y].seq)
    if idx[-1] >= a.back_op:
        return a, "recompute op %d is not before the back-access op %d" % (
            tr.ops[idx[-1]].seq, tr.ops[a.back_op].seq)
    if t not in tr.ops[idx[-1]].outs:
        return a, "last recompute op %d (%s) does not produce tensor %d" % (
            tr.ops[idx[-1]].seq, tr.ops[idx[-1]].name, t)
    inlist = set(idx)
    for w in tr.writes[t]:
        if w > a.ev_op:
            break
        if w not in inlist:
            return a, "op %d (%s) writes tensor %d before the evicted-access " \
                "op %d but is not in the recompute list" % (
                    tr.ops[w].seq, tr.ops[w].name, t, tr.ops[a.ev_op].seq)
    a.list_idx = idx
    return a, None


# --- the walk -----------------------------------------------------------------

UNBORN, DEV, HOST, COMING, DROPPED, RELEASED, FREED = range(7)


def written_between(tr, x, lo, hi):
    """Some op in [lo, hi) wrote tensor x."""
    for w in tr.writes[x]:
        if w >= hi:
            return None
        if w >= lo:
            return w
    return None


def walk(tr, actions, faults, info):
    nt = len(tr.tbytes)
    ops = tr.ops
    st = [DEV if tr.persistent[t] else UNBORN for t in range(nt)]
    by = [None] * nt      # action that took it off the device
    since = [None] * nt   # op index after which it left the device
    mem = sum(tr.tbytes[t] for t in range(nt) if st[t] == DEV)
    evict_at = {}
    trig_at = {}
    for a in actions:
        evict_at.setdefault(a.ev_op, []).append(a)
        if a.method == "swap" and a.trig_op is not None:
            trig_at.setdefault(a.trig_op, []).append(a)
    byidx = dict((a.index, a) for a in actions)
    peak, peak_op = mem, None
    stalls = lists_run = 0
    fp = 0
    frees = tr.frees

    def free(t, after):
        nonlocal mem
        if st[t] in (DEV, COMING):
            mem -= tr.tbytes[t]
        if st[t] != FREED:
            st[t] = FREED
            by[t] = None
            since[t] = after

    def reason(x, i):
        s = st[x]
        def after(j):
            return "op %d" % ops[j].seq if j is not None else "the start"
        if s == DROPPED:
            return "dropped by the plan (action %d, after %s) and not " \
                "recomputed earlier in the list" % (by[x], after(since[x]))
        if s == HOST:
            return "swapped out (action %d, after %s) with no prefetch " \
                "issued by op %d" % (by[x], after(since[x]), ops[i].seq)
        if s == FREED:
            return "freed by the framework after %s" % after(since[x])
        if s == RELEASED:
            return "released by the plan (action %d) after %s" % (
                by[x], after(since[x]))
        if s == UNBORN:
            return "not created yet"
        return None

    for i, op in enumerate(ops):
        # 1. frees with t <= start(i)
        while fp < len(frees) and frees[fp][0] <= op.start:
            free(frees[fp][1], i - 1 if i else None)
            fp += 1
        # 2. on-demand prefetches
        for t in op.names:
            if st[t] == HOST:
                st[t] = COMING
                mem += tr.tbytes[t]
                stalls += 1
        # 3. recompute lists
        for t in op.names:
            if st[t] != DROPPED:
                continue
            a = byidx[by[t]]
            lists_run += 1
            produced = set()
            fault = None
            for L in a.list_idx:
                lop = ops[L]
                for x in lop.ins:
                    if x in produced or fault is not None:
                        continue
                    why = reason(x, i)
                    if why is None:
                        w = written_between(tr, x, L, i)
                        if w is not None:
                            why = "written in place by op %d (%s) since the " \
                                "listed op ran" % (ops[w].seq, ops[w].name)
                    if why is not None:
                        fault = (lop, x, why)
                produced.update(lop.outs)
            if fault is not None:
                lop, x, why = fault
                faults.append({
                    "action": a.index, "tensor": a.tensor,
                    "method": "recompute", "evict_after_access": a.k,
                    "op": op.seq, "op_name": op.name,
                    "listed_op": lop.seq, "listed_op_name": lop.name,
                    "source": x, "reason": why,
                    "text": "%s: at op %d %s: recompute op %d %s needs tensor "
                            "%d: %s" % (describe(a), op.seq, op.name, lop.seq,
                                        lop.name, x, why)})
            # After the list: T and every dropped output are back.
            for L in a.list_idx:
                for x in ops[L].outs:
                    if st[x] == DROPPED:
                        st[x] = DEV
                        by[x] = since[x] = None
                        mem += tr.tbytes[x]
            if st[t] == DROPPED:  # defensive: the list did not produce it
                st[t] = DEV
                mem += tr.tbytes[t]
        # 4. the op starts: what it names is on the device
        for t in op.names:
            if st[t] == COMING:
                st[t] = DEV
            elif st[t] in (UNBORN, FREED, RELEASED):
                if st[t] != UNBORN:
                    info["anomalies"].append(
                        "op %d names tensor %d after it was %s" % (
                            op.seq, t,
                            "freed" if st[t] == FREED else "released"))
                st[t] = DEV
                mem += tr.tbytes[t]
        # ... and, as it starts, the prefetches it triggers are issued
        for a in trig_at.get(i, ()):
            t = a.tensor
            if st[t] == HOST and by[t] == a.index:
                st[t] = COMING
                mem += tr.tbytes[t]
        if mem > peak:
            peak, peak_op = mem, i
        # 5. frees strictly inside op i, then evictions
        while fp < len(frees) and frees[fp][0] < op.end:
            free(frees[fp][1], i)
            fp += 1
        for a in evict_at.get(i, ()):
            t = a.tensor
            if st[t] != DEV:
                continue
            mem -= tr.tbytes[t]
            by[t], since[t] = a.index, i
            if a.method == "swap":
                st[t] = HOST
            elif a.release:
                st[t] = RELEASED
            else:
                st[t] = DROPPED
    info["peak_tensor_bytes"] = peak
    info["peak_op"] = ops[peak_op].seq if peak_op is not None else None
    info["on_demand_prefetches"] = stalls
    info["lists_run"] = lists_run


def main(argv):
    args = [x for x in argv[1:] if x != "--json"]
    as_json = len(args) != len(argv) - 1
    if any(x.startswith("-") and x != "-" for x in args) or len(args) != 2:
        usage("expected TRACE PLAN.json [--json]")
    try:
        tr = Trace(args[0])
        plan = load_plan(args[1])
    except BadInput as e:
        sys.stderr.write("check_plan.py: %s\n" % e)
        return EX_USAGE

    faults = []
    good = []
    seen = {}
    for n, raw in enumerate(plan["actions"]):
        a, why = static_check(tr, raw, n)
        if why is None:
            key = (a.tensor, a.k)
            if key in seen:
                why = "a second action for tensor %d access %d (action %d " \
                    "is the first)" % (a.tensor, a.k, seen[key])
            else:
                seen[key] = n
        if why is None:
            good.append(a)
            continue
        ev = a.ev_op if a is not None else None
        faults.append({
            "action": n, "tensor": a.tensor, "method": a.method,
            "evict_after_access": a.k,
            "op": tr.ops[ev].seq if ev is not None else None,
            "source": None, "reason": "static: " + why,
            "text": "%s: static: %s" % (describe(a), why)})

    info = {"anomalies": []}
    walk(tr, good, faults, info)

    persistent_sum = sum(tr.tbytes[t] for t in range(len(tr.tbytes))
                         if tr.persistent[t])
    try:
        resident = int(tr.meta.get("resident_bytes", "0"))
    except ValueError:
        resident = 0
    extra = max(0, resident - persistent_sum)
    peak = info["peak_tensor_bytes"] + extra
    n_actions = len(plan["actions"])
    invalid = sorted(set(f["action"] for f in faults))
    faults.sort(key=lambda f: f["action"])

    if as_json:
        out = {
            "trace": args[0], "plan": args[1],
            "policy": plan.get("policy"), "actions": n_actions,
            "invalid": len(invalid), "faults": faults,
            "peak_bytes": peak, "peak_tensor_bytes": info["peak_tensor_bytes"],
            "peak_op": info["peak_op"], "untracked_resident_bytes": extra,
            "budget_bytes": plan.get("budget_bytes"),
            "predicted_peak_bytes": plan.get("predicted_peak_bytes"),
            "on_demand_prefetches": info["on_demand_prefetches"],
            "lists_run": info["lists_run"],
            "anomalies": info["anomalies"]}
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
    else:
        for f in faults:
            sys.stdout.write("INVALID %s\n" % f["text"])
        for s in info["anomalies"]:
            sys.stdout.write("note: %s\n" % s)
        budget = plan.get("budget_bytes")
        pred = plan.get("predicted_peak_bytes")
        sys.stdout.write(
            "info: peak device bytes at op granularity %d (%.1f MiB, at op "
            "%s; includes %d resident bytes not in tensors); budget %s; "
            "plan's predicted peak %s; %d on-demand prefetches; %d lists "
            "run\n" % (peak, peak / MIB, info["peak_op"], extra,
                       "%d (%.1f MiB)" % (budget, budget / MIB)
                       if _uint(budget) else "-",
                       "%d (%.1f MiB)" % (pred, pred / MIB)
                       if _uint(pred) else "-",
                       info["on_demand_prefetches"], info["lists_run"]))
        sys.stdout.write("%d actions, %d invalid\n" % (n_actions, len(invalid)))
    return EX_INVALID if invalid else EX_OK


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except BrokenPipeError:
        sys.exit(EX_USAGE)
