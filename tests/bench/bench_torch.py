"""The PyTorch adapter's own cost, and what it does to an iteration.

    PYTHONPATH=build/python /usr/bin/python3 tests/bench/bench_torch.py \
        [--capuchind build/bin/capuchind] [--model transformer] [--ops 20000]

1. Per op: an op timed one by one under an empty TorchDispatchMode and
   inside a capuchin step (the per-op path: the mode, the storage ids, the
   op report, all in capuchin._client's dispatch), in interleaved rounds.
   The adapter's cost is the difference, median and p99. Two ops: a small
   in-place add, and an add whose result is a new storage that is freed at
   once (the storage adopted and its free reported, in capuchin._client's
   storages.c too).
2. Per budget: the iteration time (median of the guided iterations) and the
   tracked peak of a test model (tests/python/torch_models.py) at 100, 50
   and 30 %, against the same training without Capuchin; evictions, of
   them weights given up (w_out), and recomputed ops over those iterations. Needs a daemon:
   --capuchind starts one in a temporary folder (else $CAPUCHIN_SOCKET).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import capuchin

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from torch_models import build, train_step  # noqa: E402


class Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def in_place(x, y):
    x.add_(y)


def new_storage(x, y):
    return x + y  # freed at once: the next op reports the free


OPS = ((in_place, "aten.add_ on 16 floats (in place)"),
       (new_storage, "aten.add on 16 floats (a new storage, freed)"))


def per_op_ns(n, x, y, op=in_place):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        op(x, y)
        ts.append(time.perf_counter_ns() - t0)
    return ts


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100.0 * len(v)))]


def bench_ops(n, sock, op, what, rounds=20):
    """The three ways of running an op, in interleaved rounds (one step of
    each manager per round, each step the same ops, so that its guided
    steps follow the measured one) so that what else runs on the machine
    falls on all three alike."""
    x, y = torch.zeros(16), torch.ones(16)
    chunk = max(1, n // rounds)
    measured = None
    ways = [("empty TorchDispatchMode", None)]
    # Passive (no daemon: ops reported, nothing recorded for recompute) and,
    # with a daemon, guided (the plan's triggers checked at each op).
    for label, kw in (("capuchin step, passive", dict(no_daemon=True)),
                      ("capuchin step, guided", dict(socket=sock, plan_wait_s=20))):
        if "socket" in kw and not sock:
            continue
        # 1 MiB, not "100%": the ops' 64-byte tensors each take a 256-byte
        # block of the placed arena, more than 100 % of their bytes.
        mgr = capuchin.Manager(budget=1 << 20, job="bench-ops-" + op.__name__, **kw)
        for _ in range(2 if "socket" in kw else 1):  # the probe (and the measured step)
            with mgr.step():
                ts = per_op_ns(chunk, x, y, op)
            if mgr.iterations[-1]["mode"] == "measured":
                measured = ts  # (one step, outside the rounds)
        ways.append((label, mgr))
    samples = {label: [] for label, _ in ways}
    with Empty():
        per_op_ns(chunk, x, y, op)  # warm up
    for _ in range(rounds):
        for label, mgr in ways:
            if mgr is None:
                with Empty():
                    samples[label] += per_op_ns(chunk, x, y, op)
            else:
                with mgr.step():
                    samples[label] += per_op_ns(chunk, x, y, op)
    print("per op (%d ops of %s in %d rounds, this machine):" % (
        chunk * rounds, what, rounds))
    base = samples[ways[0][0]]
    bm, bp = statistics.median(base), pct(base, 99)
    rows = []
    for label, mgr in ways:
        if mgr is not None:
            modes = sorted(set(it["mode"] for it in mgr.iterations[-rounds:]))
            rows.append(("%s (%s)" % (label, ",".join(modes)), samples[label]))
            mgr.close()
        else:
            rows.append((label, samples[label]))
    if measured:
        rows.append(("capuchin step, measured (1 step)", measured))
    for label, ts in rows:
        m, p = statistics.median(ts), pct(ts, 99)
        extra = "" if ts is base else "   adapter: median %5.2f us  p99 %6.2f us" % (
            (m - bm) / 1e3, (p - bp) / 1e3)
        print("  %-40s median %5.2f us  p99 %6.2f us%s" % (label, m / 1e3, p / 1e3, extra))


def bench_budgets(model, iters, sock, gbps):
    m, o, batches = build(model)
    times = []
    for i in range(iters):
        t0 = time.perf_counter_ns()
        train_step(m, o, *batches(i))
        times.append(time.perf_counter_ns() - t0)
    plain = statistics.median(times[2:])
    print("\n%s, %d iterations, sim copy bandwidth %g GB/s:" % (model, iters, gbps))
    print("  %-8s %10s %12s %12s %8s %8s %8s  %s" % (
        "budget", "iter_ms", "peak_MiB", "budget_MiB", "evict", "w_out", "recomp", "modes"))
    print("  %-8s %10.1f %12s %12s %8s %8s %8s" % ("none", plain / 1e6, "-", "-", "-", "-", "-"))
    for pctv in (100, 50, 30):
        m, o, batches = build(model)
        mgr = capuchin.Manager(budget="%d%%" % pctv, job="bench-%s-%d" % (model, pctv),
                               socket=sock, plan_wait_s=20, sim_gbps=gbps)
        for i in range(iters):
            with mgr.step():
                train_step(m, o, *batches(i))
        its = mgr.iterations[2:]
        guided = [it for it in its if it["mode"] == "guided"] or its
        t = statistics.median(it["time_ns"] for it in guided)
        peak = max(it["peak_bytes"] for it in guided)
        print("  %-8s %10.1f %12.2f %12.2f %8d %8d %8d  %s" % (
            "%d%%" % pctv, t / 1e6, peak / 2**20, mgr.budget_bytes / 2**20,
            sum(it["evictions"] for it in guided),
            sum(it["weights_out"] for it in guided),
            sum(it["recomputed_ops"] for it in guided),
            ",".join(sorted(set(it["mode"] for it in its)))))
        mgr.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capuchind")
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--sim-gbps", type=float, default=0.05)
    a = ap.parse_args()
    sock = os.environ.get("CAPUCHIN_SOCKET")
    proc = None
    tmp = tempfile.mkdtemp()
    if a.capuchind:
        sock = os.path.join(tmp, "d.sock")
        proc = subprocess.Popen([a.capuchind, "--socket", sock, "--db", os.path.join(tmp, "d.db"),
                                 "--evict-persistent", "auto"], stderr=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
    try:
        for op, what in OPS:
            bench_ops(a.ops, sock, op, what)
        if sock:
            bench_budgets(a.model, a.iters, sock, a.sim_gbps)
        else:
            print("\n(no daemon: --capuchind or $CAPUCHIN_SOCKET for the budget table)")
    finally:
        if proc:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
