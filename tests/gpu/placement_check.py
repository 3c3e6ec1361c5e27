#!/usr/bin/env python3
"""Manager(placement=True) on a GPU (README, "Placement under PyTorch").

    python3 tests/gpu/placement_check.py [--device cuda|cpu] [--budgets 100,50]
        [--iterations N] [--json F]

Trains an MLP (8 layers of 1024, batch 256, SGD with momentum) once without
Capuchin and once per budget under capuchin.Manager(placement=True,
verify=True), each in a fresh process of this script (the CUDA allocator is
the process's, installed before anything is on the GPU), against the daemon
at $CAPUCHIN_SOCKET. Deterministic algorithms are on, so the runs must
agree bit for bit. Prints, per managed iteration: mode, allocations placed
at their planned address, placement misses, peak against the budget, and
verify mismatches. Fails when a loss or a gradient differs from the
unmanaged run, when a tensor came back different, when no iteration was
guided, or when no guided iteration placed anything.

--device cpu (gpu-check --cpu-smoke): placement cannot run there, and the
check is that Manager(placement=True) refuses with a clear error.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

WIDTH, DEPTH, BATCH = 1024, 8, 256


def train(device, iterations, step=None):
    """Losses (hex) and a hash of every iteration's gradients."""
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(4)]
    losses, grads = [], []
    for i in range(iterations):
        x, y = (t.to(device) for t in data[i % len(data)])
        with (step() if step else _nothing()):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            h = hashlib.sha256()
            for p in model.parameters():
                h.update(p.grad.detach().cpu().numpy().tobytes())
            opt.step()
            opt.zero_grad()
            losses.append(loss.item().hex())
        grads.append(h.hexdigest())
    return losses, grads


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_one(args):
    """One process: --reference, or --run BUDGET under the Manager."""
    if args.reference:
        losses, grads = train(args.device, args.iterations)
        print(json.dumps({"losses": losses, "grads": grads}))
        return 0
    import capuchin
    # Before anything is on the GPU: the allocator is replaced here.
    mgr = capuchin.Manager(budget=args.run + "%", job="placement-check-%s" % args.run,
                           verify=True, plan_wait_s=30, placement=True)
    losses, grads = train(args.device, args.iterations, mgr.step)
    rows = [{k: it.get(k) for k in ("iteration", "mode", "peak_bytes", "placed_allocs",
                                    "placement_misses", "verify_mismatches", "note")}
            for it in mgr.iterations]
    print(json.dumps({"losses": losses, "grads": grads, "budget": mgr.budget_bytes,
                      "rows": rows}))
    mgr.close()
    return 0


def child(argv):
    r = subprocess.run([sys.executable, os.path.abspath(__file__)] + argv,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1:] or ["exit %d" % r.returncode]
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budgets", default="100,50")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference or args.run:
        return run_one(args)
    fails, out = [], {"device": args.device, "runs": {}}
    if args.device != "cuda":
        import capuchin
        try:
            capuchin.Manager(budget="50%", no_daemon=True, placement=True)
            fails.append("Manager(placement=True) did not refuse on %s" % args.device)
        except RuntimeError as e:
            print("placement-check: refused on %s, as it must be: %s" % (args.device, e))
    else:
        print("placement-check: %s, torch %s" % (torch.cuda.get_device_name(), torch.__version__))
        common = ["--device", args.device, "--iterations", str(args.iterations)]
        ref, err = child(common + ["--reference"])
        if ref is None:
            fails.append("the unmanaged run failed: %s" % err)
        for b in args.budgets.split(",") if ref else []:
            got, err = child(common + ["--run", b])
            if got is None:
                fails.append("%s %%: the run failed: %s" % (b, err))
                continue
            out["runs"][b] = got
            print("\n%s %% (budget %d bytes)" % (b, got["budget"]))
            print("%4s %8s %7s %6s %9s %6s  %s" % ("iter", "mode", "placed", "misses",
                                                  "peak MiB", "verify", "note"))
            for r in got["rows"]:
                print("%4s %8s %7s %6s %9.1f %6s  %s" % (
                    r["iteration"], r["mode"], r.get("placed_allocs") or 0,
                    r.get("placement_misses") or 0, (r["peak_bytes"] or 0) / 2**20,
                    r.get("verify_mismatches") or 0, r.get("note") or ""))
            guided = [r for r in got["rows"] if r["mode"] == "guided"]
            if got["losses"] != ref["losses"] or got["grads"] != ref["grads"]:
                fails.append("%s %%: losses or gradients differ from the unmanaged run" % b)
            if any(r.get("verify_mismatches") for r in got["rows"]):
                fails.append("%s %%: a tensor came back different" % b)
            if not guided:
                fails.append("%s %%: no guided iteration" % b)
            elif not any(r.get("placed_allocs") for r in guided):
                fails.append("%s %%: no guided iteration placed anything" % b)
    out["fails"] = fails
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    for f in fails:
        print("placement-check: FAIL %s" % f)
    print("placement-check: %s" % ("FAIL" if fails else "ok"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
