"""The job's device, as the adapter's probe step decides it.

It is the first device off the CPU that the probe sees, the CPU where it
sees none. A GPU job's step often starts on the CPU (the batch is moved to
the GPU inside the step): the storages the probe took until then are not
the job's memory, and are forgotten. After the probe, an op that reads a
tensor off the job's device stays on the C per-op path. No GPU is needed: a tensor subclass
says it is on cuda:0 (the probe only reads its device, address and size).
Exits 77 where torch is missing.
"""
import contextlib
import gc
import sys

try:
    import torch
except ImportError:
    print("skip: no torch")
    sys.exit(77)

import capuchin


class OnGpu(torch.Tensor):
    # results stay plain tensors (no conversion to the subclass)
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return torch.device("cuda", 0)


@contextlib.contextmanager
def python_path_calls():
    """The ops the adapter's Python path (Manager._dispatch) takes, by name,
    while in the block."""
    calls = []
    slow = capuchin.Manager._dispatch

    def counted(self, func, args, kwargs):
        calls.append(str(func))
        return slow(self, func, args, kwargs)

    capuchin.Manager._dispatch = counted
    try:
        yield calls
    finally:
        capuchin.Manager._dispatch = slow


@contextlib.contextmanager
def second_step():
    """Inside the second step of a Manager without a daemon (the probe has
    run): (the manager, a tensor the C path knows)."""
    x = torch.ones(16)
    mgr = capuchin.Manager(budget="100%", no_daemon=True)
    with mgr.step():  # the probe
        x.add_(1)
    with mgr.step():
        x.add_(1)  # the C path knows x now
        yield mgr, x
    mgr.close()


def check(cond, what):
    print("%s %s" % ("ok  " if cond else "FAIL", what), flush=True)
    if not cond:
        raise SystemExit(1)


def test_probe_takes_first_device_off_cpu():
    batch = torch.ones(16)                           # 64 bytes, on the CPU
    weight = torch.ones(64).as_subclass(OnGpu)       # 256 bytes, "on the GPU"
    mgr = capuchin.Manager(budget="100%", no_daemon=True)
    with mgr.step():
        check(mgr._id_of(batch) is not None, "a CPU tensor first: taken")
        check(mgr.device == torch.device("cpu"), "the device is the CPU so far")
        check(mgr._live_bytes == 64, "its bytes count")
        check(mgr._id_of(weight) is not None, "then one on the GPU: taken")
        check(mgr.device == torch.device("cuda", 0), "the job's device is the GPU")
        check(mgr._live_bytes == 256, "the CPU tensor's bytes no longer count")
        check(len(mgr._tensors.by_ptr) == 1, "only the GPU storage is held")
        check(mgr._id_of(batch) is None, "the CPU tensor is unmanaged now")
        del batch
        gc.collect()
        torch.ones(1).add_(1)  # an op: the frees due are reported
        check(mgr._live_bytes == 256, "its free counts nothing")
        check(mgr._id_of(torch.ones(4)) is None, "a new CPU tensor is unmanaged")
        # (the rest of the probe runs on the CPU: the client is a sim one)
        mgr.device = torch.device("cpu")
    mgr.close()


def test_off_device_input_keeps_c_path():
    """After the probe, an op reading a tensor off the job's device (a CUDA
    job's CPU scalar) stays on the C per-op path: that tensor is not the
    job's memory, and the Python path (Manager._dispatch) would only say so
    more slowly."""
    other = torch.ones(16).as_subclass(OnGpu)  # "on the GPU": not this job's
    with python_path_calls() as calls, second_step() as (_, x):  # a CPU job
        before = len(calls)
        y = x + other
        on_c = len(calls) == before
        check(on_c, "an op with an input off the job's device stays on the C path "
              "(Python path took: %r)" % calls[before:])
        check(torch.equal(y, torch.full((16,), 4.0)), "and computes what it must")


def test_empty_input_keeps_c_path():
    """An input with no memory (an empty tensor, data_ptr 0: cuDNN's batch
    norm reserve space, which every cudnn_batch_norm_backward reads on a
    GPU) is not the job's memory either, as the Python path's _id_of says:
    the op stays on the C per-op path."""
    empty = torch.empty(0)
    check(empty.data_ptr() == 0, "an empty tensor has no memory")
    with python_path_calls() as calls, second_step() as (_, x):
        before = len(calls)
        y = torch.add(x, empty.sum())
        check(len(calls) == before, "ops reading an empty tensor stay on the C path "
              "(Python path took: %r)" % calls[before:])
        check(torch.equal(y, torch.full((16,), 3.0)), "and compute what they must")


def test_given_up_storage_takes_python_path():
    """A tensor with elements whose storage has no memory is a weight the
    plan took out (the adapter resized its storage to 0), not an empty
    tensor: an op reading it goes to the Python path, which finds it by its
    storage and brings it back first. (The C path once took it for an
    empty tensor and would run the op on no memory: with detach on the C
    path, a detach of such a weight left the plan's op sequence in 5 of 6
    runs of the budget tests.)"""
    with python_path_calls() as calls, second_step():
        gone = torch.ones(16)
        storage = gone.untyped_storage() if hasattr(gone, "untyped_storage") \
            else gone.storage()
        storage.resize_(0)
        check(gone.data_ptr() == 0 and gone.numel() == 16,
              "a storage resized to 0 under a tensor with elements")
        before = len(calls)
        gone.view(4, 4)  # (metadata only: no op reads the missing bytes)
        check(len(calls) == before + 1, "an op reading it goes to the Python path "
              "(took: %r)" % calls[before:])


def test_own_ops_skip_the_mode():
    """The adapter's own ops in a step (capuchin._own_ops.OwnOps: buffers,
    views at unpack, recomputes) skip the dispatch mode where torch allows,
    nested blocks too, and ops after the block reach it again."""
    from capuchin import _own_ops
    with python_path_calls() as calls, second_step() as (mgr, x):
        before = len(calls)
        with _own_ops.OwnOps(mgr):
            check(mgr._internal, "in the block the ops are the adapter's own")
            x.detach()  # (detach always takes the Python path otherwise)
            with _own_ops.OwnOps(mgr):
                x.view(torch.uint8)
            x.detach()
            took = calls[before:]
        check(not mgr._internal, "after the block they are not")
        if _own_ops.bypasses_mode():
            check(took == [], "own ops skip the mode (Python path took: %r)" % took)
        else:
            print("note: this torch cannot keep ops from the mode")
            check(len(took) >= 3, "own ops take the round trip (took: %r)" % took)
        before = len(calls)
        x.detach()
        check(len(calls) > before, "an op after the block reaches the mode again (%r)" % calls[before:])


if __name__ == "__main__":
    test_probe_takes_first_device_off_cpu()
    test_off_device_input_keeps_c_path()
    test_empty_input_keeps_c_path()
    test_given_up_storage_takes_python_path()
    test_own_ops_skip_the_mode()
