"""What device memory Python still reaches after a run (train_compare --census).

census(device) lists the tensors the garbage collector can reach on the
device, by shape and dtype (distinct storages counted once), against what
PyTorch says is allocated: memory that grows step after step shows up as a
group whose count grows, and the referrers of one of its tensors say what
holds them. Memory no Python object reaches (held in C, or by an autograd
graph) shows as the difference from torch.cuda.memory_allocated().
self_test() checks it on CPU tensors (tests/gpu/self_test.py).
"""
import gc
import sys

import torch

GROUPS = 8
MIN_BYTES = 8 << 20


def _storage(t):
    try:
        return t.untyped_storage()
    except AttributeError:  # torch < 2.0
        return t.storage()


def _on(dev, want):
    """dev is want, or one of its devices: torch.device("cuda") names the
    current one, and != torch.device("cuda:0")."""
    return dev.type == want.type and (want.index is None or dev.index == want.index)


def _what(o):
    name = type(o).__name__
    if isinstance(o, dict):
        keys = list(o.keys())[:3]
        return f"dict({len(o)} keys, e.g. {keys!r:.60})"
    if isinstance(o, (list, tuple)):
        return f"{name}(len {len(o)})"
    return f"{type(o).__module__}.{name}"


def census(device):
    """Summary lines."""
    gc.collect()
    seen, groups = set(), {}
    for o in gc.get_objects():
        if not isinstance(o, torch.Tensor) or not _on(o.device, device):
            continue
        try:
            st = _storage(o)
            ptr, nbytes = st.data_ptr(), st.nbytes()
        except Exception:  # a tensor without storage (meta, sparse)
            continue
        if ptr == 0 or ptr in seen:
            continue
        seen.add(ptr)
        g = groups.setdefault((tuple(o.shape), str(o.dtype)), [0, 0, o])
        g[0] += 1
        g[1] += nbytes
    reached = sum(g[1] for g in groups.values())
    out = []
    if device.type == "cuda":
        alloc = torch.cuda.memory_allocated(device)
        out.append(f"census: {len(seen)} storages reached from Python, {reached / 2**20:.1f} MiB; "
                   f"PyTorch has {alloc / 2**20:.1f} MiB allocated "
                   f"({(alloc - reached) / 2**20:.1f} MiB no Python object reaches)")
    else:
        out.append(f"census: {len(seen)} storages reached from Python, {reached / 2**20:.1f} MiB")
    big = sorted(((k, g) for k, g in groups.items() if g[1] >= MIN_BYTES), key=lambda kv: -kv[1][1])
    for (shape, dtype), (n, nbytes, _) in big[:GROUPS]:
        out.append(f"census: {n} x {list(shape)} {dtype}: {nbytes / 2**20:.1f} MiB")
    # What holds the most repeated big group (a leak repeats).
    rep = [kv for kv in big if kv[1][0] > 1]
    if rep:
        (shape, dtype), (n, _, t) = max(rep, key=lambda kv: kv[1][0])
        out.append(f"census: one of the {n} x {list(shape)} is held by:")
        frame = sys._getframe()
        level, nxt = [t], []
        ours = {id(groups), id(big), id(rep), id(level), id(nxt)} | {id(g) for g in groups.values()}
        for depth in range(3):
            for o in level:
                for r in gc.get_referrers(o):
                    if id(r) in ours or r is frame or type(r) is type(frame):
                        continue
                    out.append(f"census:   {'  ' * depth}{_what(r)}")
                    nxt.append(r)
            if not nxt:
                break
            level[:] = nxt[:4]
            ours.update(id(x) for x in nxt)
            del nxt[:]
        del level, nxt, t
    return out


def self_test():
    """A repeated group found with what holds it; devices compared by parts."""
    keep = {"held": [torch.empty(3 << 20) for _ in range(3)]}
    out = census(torch.device("cpu"))
    print("\n".join(out))
    ok = ("3 x [3145728] torch.float32: 36.0 MiB" in "\n".join(out)
          and any("list(len 3)" in line for line in out)
          and _on(torch.device("cuda", 0), torch.device("cuda"))
          and not _on(torch.device("cuda", 1), torch.device("cuda", 0))
          and not _on(torch.device("cpu"), torch.device("cuda")))
    del keep
    print("live_census self-test: " + ("ok" if ok else "FAIL"))
    return 0 if ok else 1

