"""Where a training step's time goes on the device (train_compare --profile).

profile_steps(step, path, n) runs n steps under torch.profiler with the CPU
and, where there is one, the CUDA activity, writes the Chrome trace to path
(gzipped: open it in Perfetto or chrome://tracing) and returns summary lines:

  * the steps' wall time and the device's busy time on its compute stream
    (the stream with the most kernel time), so that "the device idled" and
    "the device was slow" can be told apart;
  * the compute stream's longest idle gaps, each with the kernel before it
    and what the host did meanwhile: waited in a CUDA runtime call for at
    least half the gap (cudaEventSynchronize, say, which drains the host's
    lead), or was late to launch (Python, hooks: its CUDA calls took less);
  * the copies by kind (bytes, time, GB/s) and the runtime calls by total
    time (the synchronising ones are what to look for).

summarize(events) does the arithmetic on the trace's events alone, so that
it can be checked without a GPU (self_test(): tests/gpu/self_test.py).
"""
import gzip
import json
import os
import tempfile
import time

import torch

GAPS = 6
CALLS = 8


def profile_steps(step, path, n=2):
    """Run step() n times under the profiler; the trace goes to path (.json.gz)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU]
    cuda = torch.cuda.is_available()
    if cuda:
        acts.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    walls = []
    with profile(activities=acts) as prof:
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as f:
            data = f.read()
    with gzip.open(path, "wb") as f:
        f.write(data)
    trace = json.loads(data)  # an object with traceEvents, or (older torch) the list
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    lines = [f"profile: {n} steps, wall {' '.join(f'{w * 1e3:.1f}' for w in walls)} ms; trace {path}"]
    return lines + summarize(events)


def _union(intervals):
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def summarize(events):
    """Summary lines from Chrome-trace events (times in microseconds)."""
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in xs if e.get("cat") == "kernel"]
    copies = [e for e in xs if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    calls = [e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    if not kernels:
        return ["profile: no device activity (no CUDA kernels in the trace)"]

    def stream(e):
        return (e.get("args") or {}).get("stream", e.get("tid"))

    by_stream = {}
    for k in kernels:
        by_stream.setdefault(stream(k), []).append(k)
    compute = max(by_stream, key=lambda s: sum(k["dur"] for k in by_stream[s]))
    ks = sorted(by_stream[compute], key=lambda k: k["ts"])
    first, last = ks[0]["ts"], max(k["ts"] + k["dur"] for k in ks)
    busy = _union((k["ts"], k["ts"] + k["dur"]) for k in ks)
    span = last - first
    out = [f"profile: compute stream {compute}: {len(ks)} kernels, busy {busy / 1e3:.1f} ms of "
           f"{span / 1e3:.1f} ms from its first kernel to its last ({100 * busy / span:.0f} %), "
           f"idle {(span - busy) / 1e3:.1f} ms"]
    for s, kl in sorted(by_stream.items(), key=lambda kv: -sum(k["dur"] for k in kv[1])):
        if s != compute:
            out.append(f"profile: stream {s}: {len(kl)} kernels, {sum(k['dur'] for k in kl) / 1e3:.1f} ms")

    gaps, end, before = [], None, None
    for k in ks:
        if end is not None and k["ts"] > end:
            gaps.append((k["ts"] - end, end, k["ts"], before, k["name"]))
        if end is None or k["ts"] + k["dur"] > end:
            end, before = k["ts"] + k["dur"], k["name"]
    gaps.sort(reverse=True)
    for g, s, e, prev, nxt in gaps[:GAPS]:
        def overlap(c):
            return min(e, c["ts"] + c["dur"]) - max(s, c["ts"])
        inside = [c for c in calls if c["ts"] < e and c["ts"] + c["dur"] > s]
        held = max(inside, key=overlap, default=None)
        if held is not None and 2 * overlap(held) >= g:
            why = f"the host waited in {held['name']} ({held['dur'] / 1e3:.2f} ms)"
        else:  # launches at most: the host had other work (Python, hooks)
            why = (f"the host was late to launch (in CUDA calls for "
                   f"{sum(overlap(c) for c in inside) / 1e3:.2f} ms of it)")
        out.append(f"profile: gap {g / 1e3:.2f} ms after {prev[:40]} before {nxt[:40]}: {why}")

    kinds = {}
    for c in copies:
        a = c.get("args") or {}
        k = kinds.setdefault(c["name"].split(" (")[0], [0, 0, 0.0, set()])
        k[0] += 1
        k[1] += int(a.get("bytes", 0) or 0)
        k[2] += c["dur"]
        k[3].add(stream(c))
    for name, (cnt, nbytes, dur, streams) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
        gbps = nbytes / (dur * 1e3) if dur else 0.0
        out.append(f"profile: {name}: {cnt} copies, {nbytes / 2**20:.1f} MiB, {dur / 1e3:.1f} ms "
                   f"({gbps:.1f} GB/s) on streams {sorted(streams, key=str)}")

    totals = {}
    for c in calls:
        t = totals.setdefault(c["name"], [0, 0.0, 0.0])
        t[0] += 1
        t[1] += c["dur"]
        t[2] = max(t[2], c["dur"])
    for name, (cnt, dur, worst) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:CALLS]:
        out.append(f"profile: {name}: {cnt} calls, {dur / 1e3:.2f} ms, longest {worst / 1e3:.2f} ms")
    return out


def self_test():
    """summarize() on a hand-made trace: two streams, a host wait in a gap."""
    ev = [
        {"ph": "X", "cat": "kernel", "name": "a", "ts": 0, "dur": 100, "args": {"stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "b", "ts": 50, "dur": 100, "args": {"stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "c", "ts": 400, "dur": 100, "args": {"stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "d", "ts": 520, "dur": 80, "args": {"stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "x", "ts": 0, "dur": 10, "args": {"stream": 9}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 0,
         "dur": 1000, "args": {"stream": 20, "bytes": 55_000_000}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": 160, "dur": 200},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 5},
    ]
    out = summarize(ev)
    text = "\n".join(out)
    want = ["busy 0.3 ms of 0.6 ms from its first kernel to its last (55 %)", "idle 0.3 ms", "stream 9: 1 kernels",
            "gap 0.25 ms after b before c: the host waited in cudaEventSynchronize (0.20 ms)",
            "gap 0.02 ms after c before d: the host was late to launch (in CUDA calls for 0.00 ms",
            "Memcpy DtoH: 1 copies", "(55.0 GB/s)", "cudaEventSynchronize: 1 calls, 0.20 ms"]
    missing = [w for w in want if w not in text]
    print(text)
    if missing or summarize([]) != ["profile: no device activity (no CUDA kernels in the trace)"]:
        print("step_profile self-test: FAIL, missing", missing)
        return 1
    print("step_profile self-test: ok")
    return 0

