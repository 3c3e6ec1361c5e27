"""The transient storages the per-op path adopts in C (python/src/storages.c).

A passive client (no daemon): what the client holds is checked through its
device_bytes (every adopted storage counts) and the C table's own counters,
Client.storages_count() -> (storages in the table, frees due, frees lost).
Exits 77 where torch is missing.
"""
import gc
import sys

try:
    import torch
except ImportError:
    print("skip: no torch")
    sys.exit(77)

import capuchin

FLOATS = 16
NBYTES = 4 * FLOATS


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def manager():
    mgr = capuchin.Manager(budget="100%", no_daemon=True)
    x, w = torch.zeros(FLOATS), torch.ones(FLOATS)
    with mgr.step():  # the probe: x and w become persistent
        x.add_(w)
    return mgr, x, w


def live(mgr):
    return mgr.client.stats()["device_bytes"]


def test_new_storage_freed_at_next_op():
    mgr, x, w = manager()
    c = mgr.client
    with mgr.step():
        base = live(mgr)
        y = x + w
        check(c.storages_count() == (1, 0, 0), "adopted in C: %r" % (c.storages_count(),))
        check(live(mgr) == base + NBYTES, "the client holds the new storage")
        v = y.view(4, 4)  # a view: the same storage, no new id
        check(c.storages_count()[0] == 1, "a view is not a new storage")
        check(live(mgr) == base + NBYTES, "a view adds nothing")
        del y
        check(c.storages_count() == (1, 0, 0), "a view keeps the storage")
        del v
        check(c.storages_count() == (0, 1, 0), "its free is due: %r" % (c.storages_count(),))
        check(live(mgr) == base + NBYTES, "not reported within a callback")
        x.add_(w)
        check(c.storages_count() == (0, 0, 0), "reported at the next op")
        check(live(mgr) == base, "the client let it go")
    mgr.close()


def test_many_storages_address_reuse():
    """PyTorch reuses a freed address at once: each new storage there is a
    new id, and every one is freed."""
    mgr, x, w = manager()
    c = mgr.client
    with mgr.step():
        base = live(mgr)
        keep = []
        for i in range(3000):
            y = x + w
            if i % 7 == 0:
                keep.append(y)  # some live on while others die around them
            if len(keep) > 50:
                keep.pop(0)
        del y
        keep = []
        x.add_(w)
        check(c.storages_count() == (0, 0, 0), "all freed: %r" % (c.storages_count(),))
        check(live(mgr) == base, "nothing left: %d bytes" % (live(mgr) - base))
    mgr.close()


def test_taken_over_by_python():
    """A storage the Python side needs (here its lookup, as a saved tensor's
    pack or a slow op's input does) is handed over whole, and freed once."""
    mgr, x, w = manager()
    c = mgr.client
    with mgr.step():
        base = live(mgr)
        y = x + w
        v = y[4:]
        tid = next(iter(set(mgr._idents) - mgr._weights), None)
        check(tid is None, "not the Python side's yet")
        st = mgr._tensors.lookup(v)
        check(st is not None and st.count == 2, "both tensor objects taken over")
        check(c.storages_count() == (0, 0, 0), "out of the C table")
        check(mgr._idents.get(st.ident.id) is st.ident, "the id is the Python side's")
        z = y * 2  # the C path still reads y's id (the Python side's cache now)
        del y, v
        x.add_(w)
        check(live(mgr) == base + NBYTES, "z alone: %d" % (live(mgr) - base))
        del z
        x.add_(w)
        check(live(mgr) == base, "each freed once: %d" % (live(mgr) - base))
    mgr.close()


def test_survivor_disowned_at_step_end():
    mgr, x, w = manager()
    c = mgr.client
    with mgr.step():
        base = live(mgr)
        kept = x + w
    check(c.storages_count() == (0, 0, 0), "left the table at the step's end")
    check(live(mgr) == base, "and the client")
    with mgr.step():
        y = kept + w  # adopted again (by the Python path: an input it does not know)
        check(live(mgr) == base + 2 * NBYTES, "kept is adopted again, with y")
        del kept, y
        # (the Python path holds its last op's output until its next op)
        x.add_(w, alpha=1.0)
        x.add_(w)
        check(live(mgr) == base, "both freed: %d" % (live(mgr) - base))
    mgr.close()


def test_closed_client_forgets():
    mgr, x, w = manager()
    c = mgr.client
    with mgr.step():
        y = x + w
    mgr.close()
    check(c.storages_count() == (0, 0, 0), "nothing after close")
    del y  # its reference's callback finds no record
    gc.collect()


def test_training_frees_everything():
    """Autograd: saved tensors are taken over (pack), the rest stay in C;
    after a few steps nothing transient is left with the client."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    mgr = capuchin.Manager(budget="100%", no_daemon=True)
    data = torch.randn(4, 8)
    for _ in range(4):
        with mgr.step():
            loss = m(data).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
    c = mgr.client
    check(c.storages_count() == (0, 0, 0), "table empty between steps")
    check(live(mgr) == mgr.persistent_bytes,
          "only persistent storages: %d of %d" % (live(mgr), mgr.persistent_bytes))
    mgr.close()


def test_python_path_output_not_held():
    """An op that takes the adapter's Python path (an input it sees for the
    first time) holds its output no longer than the op: freed at the next
    op once nothing else holds it. (It was held until the next op on that
    path; on a GPU, whose measured step takes that path for every op,
    guided steps then held memory the plan had counted free.)"""
    mgr, x, w = manager()
    z = torch.ones(FLOATS)  # new: the op that first reads it takes the Python path
    with mgr.step():
        y = z + w
        held = live(mgr)
        del y
        x.add_(w)
        check(live(mgr) == held - NBYTES,
              "the output went at the next op: %d, want %d" % (live(mgr), held - NBYTES))
    mgr.close()


def test_off_device_storage_unmanaged():
    """A tensor off the job's device (a CUDA job's CPU scalars, an
    optimizer's step counters, .cpu() copies) is not its memory: neither
    the C path nor the Python path adopts it. Here the job's device is made
    'meta' after the probe, so that the CPU tensors are the ones elsewhere."""
    mgr, x, w = manager()
    mgr.device = torch.device("meta")
    mgr._attach()
    c = mgr.client
    with mgr.step():
        base = live(mgr)
        y = x + w  # the C path: a new output storage
        check(c.storages_count() == (0, 0, 0), "C path: not adopted: %r" % (c.storages_count(),))
        z = torch.ones(FLOATS) * 2  # an input seen the first time: the Python path
        check(live(mgr) == base, "nothing adopted: %d, want %d" % (live(mgr), base))
        check(mgr._id_of(z) is None, "Python path: no id")
        del y, z
    mgr.close()


def main():
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    for t in tests:
        t()
        print("ok", t.__name__)


if __name__ == "__main__":
    main()
