"""Placement under PyTorch: Manager(placement=True) (README, "Placement under
PyTorch"; the C side is python/src/torch_alloc.c over
client/include/capuchin/framework_alloc.h).

The process's CUDA allocator is replaced by a CUDAPluggableAllocator whose
alloc and free are the extension's capuchin_torch_alloc/free: once the
Manager's client exists, a guided step's allocations that the plan placed
come from the client's placement region at base + offset, and every other
CUDA allocation of that device from the client's budgeted allocator, or from
the CUDA runtime when no client serves it (before the client exists, or past
the budget).

Why change_current_allocator and not torch.cuda.MemPool (torch >= 2.5): a
MemPool is a private pool of PyTorch's caching allocator, which asks a pool's
allocator for whole segments (an allocation rounded up to 2 MiB, 20 MiB
segments for 1-10 MiB requests) and keeps freed blocks cached for the next
allocation of the pool. Placement needs each tensor's own allocation and
its free as they happen: with a MemPool the client would see segments, and
a block it placed would be handed to another tensor by the cache without
the client knowing. The allocator is therefore the whole process's, and it
must be installed before anything is allocated on the GPU.
"""
import torch

from . import _client

_ALLOC, _FREE = "capuchin_torch_alloc", "capuchin_torch_free"
_installed = False


def _version(v):
    """(major, minor) of a torch version string ("2.5.1+cu124" -> (2, 5))."""
    out = []
    for part in v.split("+")[0].split(".")[:2]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        out.append(int(digits or 0))
    return tuple(out)


def install():
    """Route this process's CUDA allocations through capuchin (once).

    Raises RuntimeError, saying why, where placement cannot run: a torch
    older than 2.0 or without CUDAPluggableAllocator, no CUDA device, or a
    CUDA allocator already in use."""
    global _installed
    if _installed:
        return
    mem = getattr(torch.cuda, "memory", None)
    pluggable = getattr(mem, "CUDAPluggableAllocator", None)
    if _version(torch.__version__) < (2, 0) or pluggable is None:
        raise RuntimeError(
            "capuchin: Manager(placement=True) needs PyTorch >= 2.0 with CUDA "
            "(torch.cuda.memory.CUDAPluggableAllocator); this is torch %s. "
            "Leave placement off (the default) to train without it"
            % torch.__version__)
    if not torch.cuda.is_available():
        raise RuntimeError(
            "capuchin: Manager(placement=True) places CUDA allocations, and "
            "torch %s sees no CUDA device. Leave placement off (the default) "
            "to train on the CPU" % torch.__version__)
    alloc = pluggable(_client.__file__, _ALLOC, _FREE)
    try:
        mem.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError(
            "capuchin: Manager(placement=True) must replace PyTorch's CUDA "
            "allocator before anything is allocated on the GPU: create the "
            "Manager before moving the model or any tensor to the GPU (%s)"
            % e) from e
    _installed = True


def place(client, device):
    """Let client serve the CUDA allocations of device (a torch.device)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    client.place(index)
