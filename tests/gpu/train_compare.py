#!/usr/bin/env python3
"""Train real models under a memory budget three ways and print a table.

    python3 tests/gpu/train_compare.py [--device cuda|cpu] [--smoke]
        [--models resnet50,gpt2] [--budgets 100,50,30] [--iterations N]
        [--warmup N] [--methods capuchin,save_on_cpu,checkpoint] [--json F]
        [--profile DIR] [--census]

For each model and budget:

  * unmanaged: plain training, once per model. It gives the memory the
    budgets are taken from: "N %" means the persistent bytes (weights and
    optimizer state, allocated before a step starts) plus N % of the step's
    transient peak, as everywhere else in Capuchin.
  * capuchin: the PyTorch adapter (`capuchin.Manager(budget="N%", job=...)`,
    one `with mgr.step():` per iteration), each run in a fresh process of
    this script so that the adapter starts on a clean CUDA state. When
    `import capuchin` fails the row says "capuchin adapter not importable"
    and the baselines still run.
  * save_on_cpu: `torch.autograd.graph.save_on_cpu(pin_memory=True)` around
    the forward of the first k blocks of the model, and
  * checkpoint: `torch.utils.checkpoint.checkpoint(use_reentrant=False)` of
    the first k blocks, where k is the smallest count of blocks whose peak
    fits the same budget ("at the same memory"), found by bisection with one
    trial run per probe. The blocks are ResNet's 16 bottleneck blocks and
    GPT-2's 12 transformer blocks. When even all blocks do not fit, the row
    shows the run with all of them and "no" under "fits".

Throughput is samples per second over the timed iterations (median
iteration time; warm-up iterations, which include the adapter's measured
first iteration and the wait for its plan, are not timed). Peak memory is the most that
torch.cuda.max_memory_allocated() reported in a timed iteration. On the CPU
(--device cpu, for checking the script where there is no GPU) the peak is
the persistent bytes plus the largest running sum of the allocations the
PyTorch profiler attributes to the step's ops: an estimate, good enough to
exercise the budget search; save_on_cpu cannot lower it (the "device" is the
host already).

--profile DIR: 2 more steps of the unmanaged and of each capuchin run
under torch.profiler, their Chrome traces in DIR and a summary printed: the
compute stream's busy and idle time, its longest gaps with what the host
was doing then, the copies and the CUDA runtime calls (step_profile.py).

--census: at the end of each capuchin run, the device memory Python still
reaches, by shape, against what PyTorch has allocated, and what holds the
most repeated group (live_census.py): for memory that grows step by step.

--smoke: tiny sizes. The models are then a small CNN and a small
transformer written here, plus torchvision's resnet18 and a 2-layer GPT-2
when torchvision and transformers are installed. Without --smoke the models
are torchvision ResNet-50 (batch 128, 224x224) and Hugging Face GPT-2 small
(random weights: the machine has no internet; batch 8 x 1024 tokens). A
model whose package is missing is skipped with a line saying so.
"""
import argparse
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


# ---------------------------------------------------------------- models
class Spec:
    """A model to train: build() -> (model, optimizer, blocks); batch();
    loss(model, batch) -> scalar; samples per batch; key: its --models name."""

    def __init__(self, name, build, batch, loss, samples):
        self.name, self.build, self.batch, self.loss, self.samples = name, build, batch, loss, samples
        self.key = name


def ce_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def lm_loss(model, batch):
    # Hugging Face causal LM: labels are the inputs (shifted inside).
    return model(input_ids=batch, labels=batch, use_cache=False).loss


def own_lm_loss(model, batch):
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


class SmallCNN(nn.Module):
    """Conv-BN-ReLU blocks (in-place ReLU, as torchvision's)."""

    def __init__(self, width=16, n_blocks=4, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
            for _ in range(n_blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(dim=(2, 3)))


class Block(nn.Module):
    """A pre-norm transformer block: attention, MLP, dropout."""

    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.1))

    def forward(self, x):
        h = self.ln1(x)
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class SmallLM(nn.Module):
    def __init__(self, vocab=256, d=64, heads=4, n_blocks=3, ctx=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(n_blocks))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def resnet_blocks(m):
    return [blk for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for blk in layer]


def specs(args, device):
    """The models to run, and lines for those skipped."""
    out, skipped = [], []
    smoke = args.smoke

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

    def adamw(m):
        return torch.optim.AdamW(m.parameters(), lr=1e-4)

    def images(n, hw, classes):
        def batch():
            return (torch.randn(n, 3, hw, hw, device=device), torch.randint(0, classes, (n,), device=device))
        return batch

    def tokens(n, seq, vocab):
        return lambda: torch.randint(0, vocab, (n, seq), device=device)

    wanted = args.models.split(",") if args.models else (
        ["cnn", "transformer", "resnet", "gpt2"] if smoke else ["resnet50", "gpt2"])
    for name in wanted:
        if name == "cnn":
            def build():
                m = SmallCNN().to(device)
                return m, sgd(m), list(m.blocks)
            out.append(Spec("cnn", build, images(8, 32, 10), ce_loss, 8))
        elif name == "transformer":
            def build():
                m = SmallLM().to(device)
                return m, adamw(m), list(m.blocks)
            out.append(Spec("transformer", build, tokens(4, 65, 256), own_lm_loss, 4))
        elif name in ("resnet", "resnet50"):
            try:
                import torchvision
            except ImportError as e:
                skipped.append(f"skipped {name}: torchvision is not installed ({e})")
                continue
            arch = "resnet18" if smoke else "resnet50"
            n = args.batch or (4 if smoke else 128)
            hw = 64 if smoke else 224

            def build(arch=arch):
                m = getattr(torchvision.models, arch)(weights=None).to(device)
                return m, sgd(m), resnet_blocks(m)
            out.append(Spec(arch, build, images(n, hw, 1000), ce_loss, n))
        elif name == "gpt2":
            try:
                import transformers
            except ImportError as e:
                skipped.append(f"skipped gpt2: transformers is not installed ({e})")
                continue
            n = args.batch or (2 if smoke else 8)
            seq = args.seq_len or (64 if smoke else 1024)
            if smoke:
                cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128)
            else:
                cfg = transformers.GPT2Config()  # GPT-2 small: 12 layers, 768 wide, 124 M parameters

            def build(cfg=cfg):
                m = transformers.GPT2LMHeadModel(cfg).to(device)
                return m, adamw(m), list(m.transformer.h)
            out.append(Spec("gpt2" if not smoke else "gpt2-tiny", build, tokens(n, seq, cfg.vocab_size),
                            lm_loss, n))
        else:
            raise SystemExit(f"train_compare: unknown model {name}")
        if out:
            out[-1].key = name
    return out, skipped


# ---------------------------------------------------------- measurement
class Meter:
    """Times one training iteration and measures its peak device memory."""

    def __init__(self, device):
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def run(self, step, profile_memory):
        """(seconds, peak bytes or None)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.sync()
        t0 = time.perf_counter()
        if not self.cuda and profile_memory:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
            dt = time.perf_counter() - t0
            # The running sum of the allocations each op made itself, in the
            # order the ops started: the step's transient peak (estimate).
            cur = peak = 0
            for e in sorted(prof.events(), key=lambda e: e.time_range.start):
                cur += e.self_cpu_memory_usage
                peak = max(peak, cur)
            return dt, peak
        step()
        self.sync()
        dt = time.perf_counter() - t0
        return dt, (torch.cuda.max_memory_allocated() if self.cuda else None)

    def persistent(self, model, opt):
        """Bytes allocated between steps: weights, optimizer state."""
        if self.cuda:
            return torch.cuda.memory_allocated()
        n = sum(p.numel() * p.element_size() for p in model.parameters())
        for st in opt.state.values():
            n += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
        return n


def release():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def wrap_blocks(blocks, k, method):
    """Apply save_on_cpu or checkpoint to the forward of the first k blocks."""
    def saved_on_cpu(fwd, *a, **kw):
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return fwd(*a, **kw)

    def checkpointed(fwd, *a, **kw):
        return torch.utils.checkpoint.checkpoint(fwd, *a, use_reentrant=False, **kw)

    how = saved_on_cpu if method == "save_on_cpu" else checkpointed
    for b in blocks[:k]:
        b.forward = functools.partial(how, b.forward)  # instance attribute: nn.Module calls it


STEADY_EXTRA = 10


def profile_path(args, spec, label):
    return os.path.join(args.profile, f"{spec.name}-{label}.json.gz") if args.profile else None


def train(spec, meter, iterations, warmup, method="unmanaged", k=0, mgr_budget=None, args=None,
          profile=None, census=False):
    """Train a fresh model; returns a dict with times, peaks, persistent.
    profile: a path for the trace of 2 more steps (step_profile.py), whose
    summary is printed; census: print what device memory Python still
    reaches at the end (live_census.py)."""
    release()
    torch.manual_seed(0)
    model, opt, blocks = spec.build()
    model.train()
    if method in ("save_on_cpu", "checkpoint"):
        wrap_blocks(blocks, k, method)
    batch = spec.batch()
    mgr = None
    if method == "capuchin":
        import capuchin  # checked by the caller
        # plan_wait_s: the step after the measured one waits for the plan, so
        # that the timed iterations run under it, as all but the first
        # seconds of a long job would (planning takes about a second on the
        # GPU machine's CPU: a short run would otherwise end before it).
        mgr = capuchin.Manager(budget=mgr_budget, plan_wait_s=60,
                               job=f"train-compare-{spec.name}-{mgr_budget.rstrip('%')}")

    def one_step():
        loss = spec.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def step():
        if mgr is None:
            one_step()
        else:
            with mgr.step():
                one_step()

    times, peaks, persistent = [], [], 0
    # Capuchin warms up until its plan is in force and nothing is due to be
    # measured again (Manager.steady: a re-measure for memory PyTorch uses
    # beside the tracked tensors, say), at most STEADY_EXTRA steps more: the
    # timed steps are the job's steady state, as the others' are.
    i, extra = 0, 0
    while len(times) < iterations:
        persistent = meter.persistent(model, opt)
        timed = i >= warmup and (mgr is None or mgr.steady or extra >= STEADY_EXTRA)
        if i >= warmup and not timed:
            extra += 1
        # On the CPU the profiler slows the step: time the iterations without
        # it, and measure memory in one more iteration below.
        dt, peak = meter.run(step, profile_memory=False)
        i += 1
        if timed:
            times.append(dt)
            if peak is not None:
                peaks.append(peak)
    if not meter.cuda:
        persistent = meter.persistent(model, opt)
        _, transient = meter.run(step, profile_memory=True)
        peaks.append(persistent + transient)
    if profile:
        from step_profile import profile_steps
        for line in profile_steps(step, profile):
            print("    " + line if mgr is None else line, flush=True)
    if census:
        from live_census import census as live
        for line in live(meter.device):
            print(line, flush=True)
    report = mgr.report() if mgr is not None else None
    n_blocks = len(blocks)
    del model, opt, blocks, batch, mgr
    release()
    return {"time_s": statistics.median(times) if times else float("nan"),
            "peak": max(peaks), "persistent": persistent, "report": report, "n_blocks": n_blocks}


def fit_blocks(spec, meter, method, n_blocks, target, trial_iters):
    """Smallest k whose peak is within target, by bisection (the peak falls
    as k grows). Returns (k, fits)."""
    def peak(k):
        r = train(spec, meter, 1, trial_iters - 1, method, k)
        print(f"    {method}: {k}/{n_blocks} blocks -> peak {r['peak'] / 2**20:.1f} MiB", flush=True)
        return r["peak"]

    if peak(n_blocks) > target:
        return n_blocks, False
    lo, hi = 0, n_blocks  # peak(hi) fits; is there a smaller k?
    while lo < hi:
        mid = (lo + hi) // 2
        if peak(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return hi, True


def capuchin_in_child(spec, args, budget, iterations, warmup):
    """Train under the adapter in a fresh process: its allocator, hooks and
    CUDA state start clean (a pluggable allocator must be installed before
    CUDA's first allocation, which the unmanaged run has made), and a crash
    of the adapter is a row of the table, not the end of it."""
    cmd = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--models", spec.key,
           "--child-capuchin", str(budget), "--iterations", str(iterations), "--warmup", str(warmup)]
    if args.smoke:
        cmd.append("--smoke")
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    if args.seq_len:
        cmd += ["--seq-len", str(args.seq_len)]
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.census:
        cmd.append("--census")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result = None
    for line in p.stdout.splitlines():
        if line.startswith(CHILD_RESULT):
            result = json.loads(line[len(CHILD_RESULT):])
        else:
            print("    " + line)  # the adapter's report
    err = p.stderr.strip().splitlines()
    failed = p.returncode != 0 or result is None
    # The adapter's own lines (CAPUCHIN_DEBUG's divergences, warnings), and
    # on a failure the end of what the child wrote (its traceback).
    shown = err[-40:] if failed else [l for l in err if "capuchin" in l][:40]
    for line in shown:
        print("    ! " + line)
    if failed:
        raise RuntimeError(f"child exited {p.returncode}: {(err or ['no output'])[-1]}")
    return result


CHILD_RESULT = "train_compare-result: "


# --------------------------------------------------------------- driver
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny models and sizes")
    ap.add_argument("--models", help="comma list: resnet50 (resnet), gpt2, cnn, transformer")
    ap.add_argument("--budgets", default="100,50,30", help="comma list of %% budgets")
    ap.add_argument("--methods", default="capuchin,save_on_cpu,checkpoint")
    ap.add_argument("--iterations", type=int, help="timed iterations (default 10; --smoke 2)")
    ap.add_argument("--warmup", type=int, help="untimed iterations first (default 5; --smoke 3)")
    ap.add_argument("--trial-iterations", type=int, default=2,
                    help="iterations of each probe of the block search (the last is measured)")
    ap.add_argument("--batch", type=int, help="batch size (default: 128 for resnet50, 8 for gpt2)")
    ap.add_argument("--seq-len", type=int, help="GPT-2 sequence length (default 1024)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--profile", metavar="DIR",
                    help="after the timed iterations of the unmanaged and the capuchin runs, "
                         "2 more under torch.profiler: Chrome traces in DIR and a summary of where "
                         "the device's time went (tests/gpu/step_profile.py)")
    ap.add_argument("--census", action="store_true",
                    help="after each capuchin run, the device memory Python still reaches, by "
                         "shape, and what holds the most repeated (tests/gpu/live_census.py)")
    ap.add_argument("--child-capuchin", type=int, metavar="BUDGET", help=argparse.SUPPRESS)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_compare: --device cuda, but torch.cuda.is_available() is False")
    iterations = args.iterations or (2 if args.smoke else 10)
    # The adapter measures iteration 1 and is guided from the 2nd or 3rd on.
    warmup = args.warmup if args.warmup is not None else (3 if args.smoke else 5)
    budgets = [int(b) for b in args.budgets.split(",")]
    methods = args.methods.split(",")
    meter = Meter(device)

    if args.child_capuchin is not None:  # one capuchin run, for the parent
        spec = specs(args, device)[0][0]
        r = train(spec, meter, iterations, warmup, "capuchin", mgr_budget=f"{args.child_capuchin}%",
                  profile=profile_path(args, spec, f"capuchin-{args.child_capuchin}"),
                  census=args.census)
        if r["report"]:
            print(str(r["report"]))
        print(CHILD_RESULT + json.dumps({k: r[k] for k in ("time_s", "peak", "persistent")}), flush=True)
        return 0

    adapter_error = None
    if "capuchin" in methods:
        try:
            import capuchin
            capuchin.Manager  # noqa: B018 - the API this script uses
        except Exception as e:  # ImportError, or a package without Manager
            adapter_error = f"{type(e).__name__}: {e}"
            print(f"capuchin adapter not importable ({adapter_error}); running the baselines only")
        else:
            from capuchin import _own_ops
            print("train_compare: the adapter's own ops %s the dispatch mode" % (
                "skip" if _own_ops.bypasses_mode() else "go through"))

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"train_compare: torch {torch.__version__} on {name}; {iterations} timed iterations "
          f"after {warmup} warm-up")
    if device.type != "cuda":
        print("train_compare: on the CPU, peak memory is the profiler's estimate and "
              "save_on_cpu cannot lower it (the device is the host)")
    models, skipped = specs(args, device)
    for s in skipped:
        print(s)
    rows = []

    def row(spec, budget, target, method, setting, r=None, fits=None, note=""):
        d = {"model": spec.name, "budget": budget, "target_bytes": target, "method": method,
             "setting": setting, "samples_per_s": None, "peak_bytes": None, "fits": fits, "note": note}
        if r is not None:
            d["samples_per_s"] = spec.samples / r["time_s"]
            d["peak_bytes"] = r["peak"]
            if fits is None and target:
                d["fits"] = r["peak"] <= target
        rows.append(d)
        print_row(d)

    print_header()
    for spec in models:
        try:
            base = train(spec, meter, iterations, 1, profile=profile_path(args, spec, "unmanaged"))
        except torch.cuda.OutOfMemoryError if hasattr(torch.cuda, "OutOfMemoryError") else RuntimeError as e:
            print(f"skipped {spec.name}: unmanaged training failed ({e})")
            continue
        transient = base["peak"] - base["persistent"]
        row(spec, 100, None, "unmanaged", "-", base, None,
            f"persistent {base['persistent'] / 2**20:.1f} MiB")
        n_blocks = base["n_blocks"]
        for b in budgets:
            target = base["persistent"] + transient * b // 100
            for method in methods:
                try:
                    if method == "capuchin":
                        if adapter_error:
                            row(spec, b, target, method, "-", note="capuchin adapter not importable")
                            continue
                        r = capuchin_in_child(spec, args, b, iterations, warmup)
                        row(spec, b, target, method, f"{b}%", r)
                    elif method in ("save_on_cpu", "checkpoint"):
                        if b >= 100:
                            k, fits = 0, True  # the unmanaged peak is the target
                        else:
                            k, fits = fit_blocks(spec, meter, method, n_blocks, target, args.trial_iterations)
                        r = train(spec, meter, iterations, warmup, method, k)
                        row(spec, b, target, method, f"{k}/{n_blocks} blocks", r,
                            r["peak"] <= target if fits else False,
                            "" if fits else "no block count fits")
                    else:
                        raise SystemExit(f"train_compare: unknown method {method}")
                except SystemExit:
                    raise
                except Exception as e:  # an OOM or an adapter error is a result, not a crash
                    row(spec, b, target, method, "-", note=f"failed: {type(e).__name__}: {str(e)[:120]}")
                    release()
    # The table again in one piece (the block search's lines interleave above).
    print("\n== train_compare: results")
    print_header()
    for d in rows:
        print_row(d)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


def print_header():
    print(f"\n{'model':<12} {'budget':>6} {'target MiB':>10}  {'method':<11} {'setting':<16} "
          f"{'samples/s':>10} {'peak MiB':>9} {'fits':>4}  note")


def print_row(d):
    def mib(x):
        return f"{x / 2**20:.1f}" if x else "-"
    sps = f"{d['samples_per_s']:.1f}" if d["samples_per_s"] else "-"
    fits = {True: "yes", False: "no", None: "-"}[d["fits"]]
    print(f"{d['model']:<12} {str(d['budget']) + '%':>6} {mib(d['target_bytes']):>10}  {d['method']:<11} "
          f"{d['setting']:<16} {sps:>10} {mib(d['peak_bytes']):>9} {fits:>4}  {d['note']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
