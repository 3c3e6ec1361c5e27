"""The adapter's own tensor ops inside a step: buffers it allocates for the
client, views it rebuilds at unpack, copies, recomputes.

They are not reported (Manager._internal), and where torch allows they do
not reach the step's dispatch mode at all: a round trip through the mode
(PyTorch's Python dispatch, the client's dispatch, the Python path that
lets the op run) costs about 15 us of host time per op on the CPU, and a
guided ResNet-50 step on a GPU makes several hundred such ops while
autograd unpacks its saved tensors. torch._C._DisableTorchDispatch keeps
ops from the Python dispatch key while the guard object lives (torch 1.13
and 2.x alike; PyTorch's own no_dispatch() uses it so). Where it is missing
or does not keep an op from a mode (checked once, at import), the ops take
the round trip as before; CAPUCHIN_OWN_OPS_VIA_MODE=1 makes them take it
anyway, to measure what the guard saves.
"""
import os

import torch

try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # pragma: no cover - torch < 1.13
    TorchDispatchMode = None


def _working_guard():
    """torch._C._DisableTorchDispatch if an op made while one lives skips
    an active dispatch mode, and the mode sees ops again once it is gone;
    else None."""
    guard = getattr(torch._C, "_DisableTorchDispatch", None)
    if guard is None or TorchDispatchMode is None:
        return None
    if os.environ.get("CAPUCHIN_OWN_OPS_VIA_MODE") == "1":
        return None
    seen = []

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    try:
        x = torch.zeros(2)
        with Probe():
            g = guard()
            x.view(-1)
            del g
            x.view(-1)
    except Exception:  # an unknown torch: keep the round trip
        return None
    return guard if len(seen) == 1 else None


_GUARD = _working_guard()


class OwnOps:
    """with OwnOps(mgr): the ops run in the block are the adapter's own.
    Nests; each use needs its own object."""

    __slots__ = ("m", "prev", "guard")

    def __init__(self, m):
        self.m = m

    def __enter__(self):
        m = self.m
        self.prev = m._internal_
        if not self.prev:
            m._internal = True  # (the setter turns the client's op path off)
        self.guard = _GUARD() if _GUARD is not None else None
        return self

    def __exit__(self, *exc):
        # The guard ends here, not whenever this object goes: inner blocks
        # end theirs first, as the thread-local key set they restore needs.
        self.guard = None
        if not self.prev:
            self.m._internal = False
        return False


def bypasses_mode():
    """Whether the adapter's own ops skip the dispatch mode (tests)."""
    return _GUARD is not None
