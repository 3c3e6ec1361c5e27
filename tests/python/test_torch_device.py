"""The job's device, as the adapter's probe step decides it.

It is the first device off the CPU that the probe sees, the CPU where it
sees none. A GPU job's step often starts on the CPU (the batch is moved to
the GPU inside the step): the storages the probe took until then are not
the job's memory, and are forgotten. No GPU is needed: a tensor subclass
says it is on cuda:0 (the probe only reads its device, address and size).
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


class OnGpu(torch.Tensor):
    @property
    def device(self):
        return torch.device("cuda", 0)


def check(cond, what):
    print("%s %s" % ("ok  " if cond else "FAIL", what), flush=True)
    if not cond:
        raise SystemExit(1)


def main():
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


if __name__ == "__main__":
    main()
