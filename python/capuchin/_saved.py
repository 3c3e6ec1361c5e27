"""Guided iterations: the activations autograd saves, carried out by the plan.

pack (torch.autograd.graph.saved_tensors_hooks) replaces a saved tensor by
a handle that holds it. When the client evicts the tensor's id (after its
evicted-access) and is done with the storage (a swap's copy has finished,
or at once for a drop) it calls release: the handle lets go of the tensor,
and the storage goes back to PyTorch's allocator once nothing else holds
it. When the client brings the id back (in-trigger prefetch, or at unpack)
it calls alloc: the adapter allocates a uint8 buffer through PyTorch and the
client copies into it (or recompute fills it). unpack asks the client for
the id (cap_client_acquire: waits for the copy in compute-stream order, or
recomputes) and returns the saved view rebuilt on that buffer.

Weights and optimizer state that a plan evicts (persistent storages) go
the same way, but their memory is given up by resizing the storage to 0
(_tensors.py) and taken back by resizing it again; the adapter brings one
back (restore_weight) before any op that uses it and at every step's end.

CAPUCHIN_VERIFY=1: every storage released while a handle held it (or a
weight's) is hashed, and the buffer it comes back in is hashed again at
unpack (at a weight's restore); a mismatch is counted and raised (never
returned).
"""
import contextlib
import weakref
import zlib

import torch

from . import _client
from ._own_ops import OwnOps
from ._tensors import Ident, bytes_of, meta_of, storage_base, view_on


class _Handle:
    __slots__ = ("ident", "t", "meta", "ptr", "hash", "owner", "__weakref__")

    def __init__(self, ident, t, owner):
        self.ident = ident
        self.t = t
        self.meta = meta_of(t)
        self.ptr = storage_base(t)
        self.hash = None
        self.owner = owner

    def __del__(self):
        # Autograd let go of the saved tensor. If the client is still
        # copying it out, the storage must outlive the copy (bury).
        if self.t is not None:
            self.owner.bury(self.t, self.ptr)
            self.t = None
        self.owner.m._tensors.unref(self.ident)


def _hash(t):
    # A copy: numpy() of the storage itself would mark it not resizable
    # for good, and a weight's must stay resizable to be given up.
    b = bytes_of(t)
    b = b.cpu() if b.device.type != "cpu" else b.clone()
    return zlib.crc32(b.numpy().tobytes())


class SavedTensors:
    def __init__(self, mgr):
        self.m = mgr
        self.handles = {}      # id -> [weakref(_Handle)]
        self.graveyard = []    # (address, tensor): storages nothing but a
                               # copy of the client uses, until its release
        self.weight_hash = {}  # id -> hash of a weight the client released
        self.mismatches = 0
        self.active = False

    def begin(self):
        self.handles = {}
        self.active = False

    def end(self):
        self.active = False

    def take_mismatches(self):
        n, self.mismatches = self.mismatches, 0
        return n

    @contextlib.contextmanager
    def hooks(self):
        self.active = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            self.active = False

    def forget(self, ident):
        self.handles.pop(ident.id, None)

    def bury(self, t, addr):
        """Nothing else uses t, the storage at addr, any more. If a copy of
        the client still does (a swap-out of it, a copy into a freed
        tensor's buffer), it is kept until the client releases addr; else
        it goes now. (Keeping every such storage until no copy at all was
        in flight held saved tensors that no copy used, and kept their
        frees from the client, for as long as an unrelated swap-out ran:
        a guided step then went over its budget by them.)"""
        c = self.m.client
        if c is not None and c.copying(addr):
            self.graveyard.append((addr, t))

    def exhume(self, addr):
        """The client released addr: the storage kept for its copy goes."""
        g = self.graveyard
        for i, (a, _) in enumerate(g):
            if a == addr:
                del g[i]  # in place: the client's op path watches it
                return

    def reap(self):
        """What a failed copy kept (no release comes for it) goes once the
        client has no copy in flight."""
        if self.graveyard and (self.m.client is None or self.m.client.poll() == 0):
            del self.graveyard[:]

    # --- hooks ------------------------------------------------------------
    def pack(self, t):
        m = self.m
        if not self.active or m._diverged or m._internal or t.dim() == 0:
            # (a 0-dim tensor may be a wrapped Python number: autograd must
            # get it back as it is)
            return t
        st = m._tensors.lookup(t)
        if st is None or st.ident.persistent or st.buf is not None:
            return t
        ident = st.ident
        h = _Handle(ident, t, self)
        ident.refs += 1
        self.handles.setdefault(ident.id, []).append(weakref.ref(h))
        return h

    def unpack(self, h):
        if not isinstance(h, _Handle):
            return h
        if h.t is not None:
            return h.t
        m = self.m
        with OwnOps(m):
            m._flush_frees()
            try:
                addr = m.client.acquire(h.ident.id)
            except _client.Error as e:
                raise RuntimeError(
                    "capuchin: saved tensor %d could not be brought back (%s); "
                    "its data is gone" % (h.ident.id, e)) from None
            st = m._tensors.by_ptr.get(addr)
            if st is None or st.buf is None:
                raise RuntimeError("capuchin: tensor %d came back at an address "
                                   "the adapter did not allocate" % h.ident.id)
            if h.hash is not None and _hash(st.buf) != h.hash:
                self.mismatches += 1
                raise RuntimeError("capuchin: CAPUCHIN_VERIFY: tensor %d came "
                                   "back with other contents" % h.ident.id)
            v = view_on(st.buf, h.meta)
            m._tensors._track(v, st)
            return v

    # --- client callbacks (owner thread, from within the client) ----------
    def alloc(self, tid, nbytes):
        m = self.m
        ident = m._idents.get(tid)
        if ident is not None and ident.persistent:
            return m._tensors.restore_weight(ident)
        if ident is None:
            # A recompute list's temporary: an output of a replayed op whose
            # tensor is no longer live. Released when the list ends.
            ident = Ident(tid, nbytes, False)
        with OwnOps(m):
            buf = torch.empty(nbytes, dtype=torch.uint8, device=m.device)
        m._tensors.add(None, ident, buf=buf)
        return buf.data_ptr()

    def release(self, tid, addr, nbytes):
        m = self.m
        if self.graveyard:
            self.exhume(addr)
        st = m._tensors.by_ptr.get(addr)
        if st is None and m._tensors.take is not None:
            # A storage of the per-op path's table (storages.c): no handle
            # holds it, PyTorch does (a gradient autograd sums later, such
            # as a tied weight's, whose part from the head waits for the
            # embedding's), so its memory cannot be given up. Taken over,
            # so that its id is this side's: the buffer the client asks for
            # when it brings the id back (alloc) then goes with the id's
            # free. (Left there, alloc took the id for a recompute list's
            # temporary, and no release comes for that buffer: GPT-2's
            # guided steps kept one of its tied embedding's gradients,
            # 147 MiB, and one hidden state's, 24 MiB, each step.)
            st = m._tensors._take_over(addr)
        if st is not None and st.ident.persistent:
            # A weight: its storage is resized to 0 before the next op.
            if m.verify:
                with OwnOps(m):
                    self.weight_hash[tid] = _hash(m._tensors.tensor_of(st))
            m._tensors.give_up.append(st)
            return
        if st is not None and st.buf is not None:
            # A buffer the adapter gave the client: no longer the client's.
            st.buf = None
            if st.count == 0:
                del m._tensors.by_ptr[addr]
            return
        with OwnOps(m):
            for r in self.handles.get(tid, ()):
                h = r()
                if h is None or h.t is None or h.ptr != addr:
                    continue
                if m.verify:
                    h.hash = _hash(h.t)
                h.t = None

    def restore_weight(self, tid):
        """Bring weight tid back (its copy in waited for), checked."""
        m = self.m
        with OwnOps(m):
            m.client.acquire(tid)
            want = self.weight_hash.pop(tid, None)
            if want is not None:
                ident = m._idents[tid]
                t = next((m._tensors.tensor_of(st) for st in ident.storages
                          if m._tensors.by_ptr.get(st.ptr) is st), None)
                if t is None or _hash(t) != want:
                    self.mismatches += 1
                    raise RuntimeError("capuchin: CAPUCHIN_VERIFY: weight %d came "
                                       "back with other contents" % tid)

    def fill(self, dst_addr, src):
        """Copy src's whole storage into the adapter's buffer at dst_addr."""
        st = self.m._tensors.by_ptr.get(dst_addr)
        if st is None or st.buf is None:
            return False
        b = bytes_of(src)
        if b.numel() != st.buf.numel():
            return False
        st.buf.copy_(b)
        return True
