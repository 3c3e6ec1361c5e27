"""Storages and their stable tensor ids (shared/traces/FORMAT.md).

A tensor id names a storage, not a tensor object: views share their base's
id, and an id is given in creation order, so that the i-th storage an
iteration creates has the same id in every iteration (the client maps the
i-th adoption of an iteration to the id the i-th of the first one got).

An id stays alive while a tensor object on one of its storages lives, or a
saved-tensor handle of it does (autograd holds the handle; the storage may
be gone to the host meanwhile). When the last goes, the client is told that
the tensor was freed. Frees are queued and reported between ops: they are
noticed by garbage collection, which may run inside a client callback, and
the client must not be re-entered from there.

In a reported step most transient storages never come here: the client's
per-op path adopts a new output storage and reports its free itself
(python/src/storages.c). This table takes such a storage over (take), with
the tensor objects on it, the first time it looks one up (a saved tensor,
a recompute's input, an op on the Python path); an address is in one of
the two tables at most.

Weights and optimizer state (persistent storages) that a plan evicts give
their memory up: the storage is resized to 0 bytes, the tensor objects on
it stay, and it is found by the storage object itself (gone) until it is
resized back for the client to copy into.
"""
import weakref

import torch


def storage_base(t):
    """Address of t's storage (not of its first element)."""
    return t.data_ptr() - t.storage_offset() * t.element_size()


class Ident:
    """A tensor id as long as something needs it."""

    __slots__ = ("id", "nbytes", "refs", "persistent", "storages", "__weakref__")

    def __init__(self, tid, nbytes, persistent):
        self.id = tid
        self.nbytes = nbytes
        self.refs = 0            # live storages (with a tensor object) + handles
        self.persistent = persistent
        self.storages = []       # Storage records mapped to this id


class _Ref(weakref.ref):
    """A tracked tensor object: st, its storage's record."""

    __slots__ = ("st",)


class Storage:
    """One storage: its address, its id and the tensor objects on it."""

    __slots__ = ("ptr", "ident", "count", "objs", "buf", "__weakref__")

    def __init__(self, ptr, ident, buf=None):
        self.ptr = ptr
        self.ident = ident
        self.count = 0      # live tracked tensor objects
        self.objs = []      # weak references to some of them (recompute finds
                            # a tensor on the storage through them)
        self.buf = buf      # the uint8 tensor the adapter allocated for the
                            # client (a tensor brought back), else None


class Tensors:
    """The storage table of one client."""

    def __init__(self, on_free):
        self.by_ptr = {}        # storage address -> Storage
        self.gone = {}          # storage key -> Storage of a persistent
                                # storage resized to 0 (its weight is out)
        self.give_up = []       # Storages the client released, resized to 0
                                # before the next op (not within the op that
                                # ran: its output may be a view the caller
                                # reads at once, as .numpy() does)
        self.pending_frees = []  # ids whose last reference went
        self.on_free = on_free   # on_free(ident): forget adapter state of it
        self._refs = {}          # id -> _Ref of each tracked object alive
        # take(address) -> (Ident, tensor objects) or None: a storage the
        # client's per-op path adopted itself (python/src/storages.c)
        # becomes this table's; None: no client.
        self.take = None

    def lookup(self, t):
        dp = t.data_ptr()
        off = t.storage_offset()
        ptr = dp - off * t.element_size() if off else dp
        st = self.by_ptr.get(ptr)
        if st is None and self.take is not None:
            st = self._take_over(ptr)
        if st is None and self.gone:
            st = self.gone.get(storage_key(t))
        if st is not None:
            d = t.__dict__
            if d.get("_cap_st") is not st:
                self._track(t, st)
            elif d.get("_cap_dp") != dp:
                t._cap_dp = dp  # a new offset on the same storage
        return st

    def _take_over(self, ptr):
        """The storage at ptr, if the per-op path holds it: taken over,
        with the tensor objects on it, else None."""
        got = self.take(ptr)
        if got is None:
            return None
        ident, objs = got
        st = Storage(ptr, ident)
        self.by_ptr[ptr] = st
        ident.storages.append(st)
        for o in objs:
            self._track(o, st)
        return st

    def _track(self, t, st):
        # _cap_st and _cap_dp: the client's per-op path (op_path.c) takes
        # the id from them while t's data_ptr() is still _cap_dp.
        try:
            t._cap_st = st
            t._cap_dp = t.data_ptr()
        except (AttributeError, RuntimeError):
            return
        if st.count == 0:
            st.ident.refs += 1
        st.count += 1
        # A weak reference whose callback counts the object's death (half
        # the cost of a weakref.finalize), kept alive until then.
        r = _Ref(t, self._ref_dead)
        r.st = st
        self._refs[id(r)] = r
        if len(st.objs) < 4:
            st.objs.append(r)
        else:
            st.objs = [o for o in st.objs if o() is not None] + [r]

    def _ref_dead(self, r):
        del self._refs[id(r)]
        self._obj_dead(r.st)

    def _obj_dead(self, st):
        st.count -= 1
        if st.count:
            return
        if st.buf is None and self.by_ptr.get(st.ptr) is st:
            # The storage itself is gone: its address may be reused.
            del self.by_ptr[st.ptr]
        self.unref(st.ident)

    def unref(self, ident):
        ident.refs -= 1
        if ident.refs == 0:
            self.pending_frees.append(ident)

    def add(self, t, ident, buf=None, ptr=None):
        """Map t's storage (at ptr, when the caller has it) to ident (a new
        storage of a new or known id)."""
        if ptr is None:
            ptr = storage_base(t) if buf is None else buf.data_ptr()
        st = Storage(ptr, ident, buf)
        self.by_ptr[ptr] = st
        ident.storages.append(st)
        if buf is None:
            self._track(t, st)
        return st

    def drop_ident(self, ident):
        """The id is freed: forget its storages that are still mapped.
        Returns the buffers the adapter had allocated for it: a copy into
        one may still be running, so the caller keeps them until the client
        has no copy in flight."""
        bufs = []
        for st in ident.storages:
            if self.by_ptr.get(st.ptr) is st:
                del self.by_ptr[st.ptr]
            if st.buf is not None:
                bufs.append(st.buf)
            st.buf = None
        ident.storages = []
        return bufs

    def tensor_of(self, st):
        """A live tensor object on storage st, or None."""
        for r in st.objs:
            t = r()
            if t is not None:
                return t
        return None

    def release_weight(self, st):
        """The client no longer needs the memory of persistent storage st
        (its copy out has finished): resize it to 0. False when PyTorch
        refuses (NumPy came to share the storage since it was adopted):
        the memory stays."""
        t = self.tensor_of(st)
        if t is None or self.by_ptr.get(st.ptr) is not st:
            return True
        try:
            resize_storage(t, 0)
        except RuntimeError:
            return False
        del self.by_ptr[st.ptr]
        self.gone[storage_key(t)] = st
        return True

    def moved(self, st, t):
        """st's storage (t's) may have moved: map it where it is now."""
        ptr = storage_base(t)
        if ptr != st.ptr and self.by_ptr.get(st.ptr) is st:
            del self.by_ptr[st.ptr]
            st.ptr = ptr
            self.by_ptr[ptr] = st

    def restore_weight(self, ident):
        """Memory for persistent ident again (the client copies into it):
        its storage's address."""
        for st in ident.storages:
            if st in self.give_up:  # not given up yet: the bytes are still there
                self.give_up.remove(st)
                return st.ptr
            if self.by_ptr.get(st.ptr) is st:  # could not be given up
                return st.ptr
            t = self.tensor_of(st)
            if t is None or self.gone.get(storage_key(t)) is not st:
                continue
            del self.gone[storage_key(t)]
            resize_storage(t, ident.nbytes)
            st.ptr = storage_base(t)
            self.by_ptr[st.ptr] = st
            return st.ptr
        return 0

    def tensor_at(self, ptr):
        """A live tensor object on the storage at ptr, or None."""
        st = self.by_ptr.get(ptr)
        if st is None and self.take is not None:
            st = self._take_over(ptr)
        if st is None:
            return None
        if st.buf is not None:
            return st.buf
        for r in st.objs:
            t = r()
            if t is not None:
                return t
        return None


if hasattr(torch.Tensor, "untyped_storage"):  # torch >= 2.0
    def storage_nbytes(t):
        return t.untyped_storage().nbytes()

    def storage_key(t):
        """The storage object's identity, which a resize keeps."""
        return t.untyped_storage()._cdata

    def resize_storage(t, nbytes):
        t.untyped_storage().resize_(nbytes)

    def storage_resizable(t):
        return t.untyped_storage().resizable()

    def bytes_of(t):
        """A flat uint8 tensor over t's whole storage."""
        s = t.untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8, device=t.device)
        flat.set_(s, 0, (s.nbytes(),), (1,))
        return flat
else:
    # (t._storage(): the untyped storage, without the TypedStorage wrapper
    # t.storage() builds in Python on every call)
    def storage_nbytes(t):
        return t._storage().nbytes()

    def storage_key(t):
        """The storage object's identity, which a resize keeps."""
        return t._storage()._cdata

    def resize_storage(t, nbytes):
        t._storage().resize_(nbytes)

    def storage_resizable(t):
        # (no resizable() yet: a resize to its own size raises where the
        # storage cannot be resized, as after tensor.numpy())
        s = t._storage()
        try:
            s.resize_(s.nbytes())
        except RuntimeError:
            return False
        return True

    def bytes_of(t):
        """A flat uint8 tensor over t's whole storage."""
        s = t.storage()
        flat = torch.empty(0, dtype=t.dtype, device=t.device)
        flat.set_(s, 0, (s.nbytes() // t.element_size(),), (1,))
        return flat.view(torch.uint8)


def view_on(buf, meta):
    """The tensor meta describes (dtype, size, stride, offset) on the uint8
    storage buf."""
    dtype, size, stride, offset = meta
    base = buf if dtype == torch.uint8 else buf.view(dtype)
    return base.as_strided(size, stride, offset)


def meta_of(t):
    return (t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())
