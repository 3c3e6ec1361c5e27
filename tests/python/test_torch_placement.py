"""Manager(placement=True) where placement cannot run: a torch older than 2.0
(Debian's 1.13, the CI's) or one without a CUDA device. It must raise a
RuntimeError that says why and what to do, before it changes anything, and
Manager() without it must still work in the same process. Then the
allocator's C functions (python/src/torch_alloc.c) as PyTorch would call
them, served by a client on the sim backend. Exit 77 (skipped)
without torch or the adapter, and on a CUDA torch >= 2.0, where placement
runs instead (tests/gpu/placement_check.py, from deploy/gpu-check.sh).
"""
import ctypes
import sys

try:
    import torch
    import capuchin
    from capuchin import _placement
except ImportError as e:
    print("skip: %s" % e)
    sys.exit(77)

if torch.cuda.is_available() and hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
    print("skip: this torch can place (tests/gpu/placement_check.py)")
    sys.exit(77)

fails = []


def check(what, ok):
    print("%s %s" % ("ok  " if ok else "FAIL", what), flush=True)
    if not ok:
        fails.append(what)


check("versions parse", _placement._version("2.5.1+cu124") == (2, 5)
      and _placement._version("1.13.1") == (1, 13)
      and _placement._version("2.11.0a0+git") == (2, 11))

try:
    capuchin.Manager(budget="50%", no_daemon=True, placement=True)
    check("Manager(placement=True) raises", False)
except RuntimeError as e:
    msg = str(e)
    print("  message: %s" % msg)
    check("it says placement=True", "placement=True" in msg)
    old = _placement._version(torch.__version__) < (2, 0)
    if old:
        check("it names the torch it needs and this one's version",
              ">= 2.0" in msg and torch.__version__ in msg)
    else:
        check("it says there is no CUDA device", "no CUDA device" in msg)
    check("it says how to go on", "placement off" in msg)
check("nothing was installed", not _placement._installed)

# The same process still trains under a Manager without placement.
model = torch.nn.Linear(8, 8)
mgr = capuchin.Manager(budget="100%", no_daemon=True)
for _ in range(3):
    with mgr.step():
        model(torch.ones(4, 8)).sum().backward()
check("a Manager without placement runs", len(mgr.iterations) == 3)
mgr.close()

# The allocator's two C functions, as PyTorch's CUDAPluggableAllocator calls
# them (through ctypes, which releases the GIL as PyTorch's ops may), served
# by a client on the sim backend: its "device" memory is host memory.
so = ctypes.CDLL(capuchin._client.__file__)
alloc, free = so.capuchin_torch_alloc, so.capuchin_torch_free
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]


def sim_client():
    def nop(*args):
        return None
    return capuchin.Client(job="placement-test", budget=1 << 20, no_daemon=True,
                           backend="sim", alloc=nop, release=nop, recompute=nop)


check("nothing serves device 0 before a client is bound (no GPU here)",
      alloc(4096, 0, None) is None)
c = sim_client()
c.place(0)
p = alloc(4096, 0, None)
check("the bound client serves device 0", p is not None)
if p is not None:
    ctypes.memset(p, 0xab, 4096)
    check("and the memory is usable", ctypes.string_at(p + 4095, 1) == b"\xab")
check("not another device", alloc(4096, 1, None) is None)
other = sim_client()
try:
    other.place(0)
    check("a second client cannot take the allocator", False)
except RuntimeError as e:
    check("a second client cannot take the allocator", "one Manager" in str(e))
other.close()


def destroyed(client):
    try:
        client.stats()
        return False
    except ValueError:  # "the client is closed"
        return True


c.close()
check("closed while PyTorch holds its memory: the client is kept", not destroyed(c))
check("and no longer serves allocations", alloc(4096, 0, None) is None)
free(p, 4096, 0, None)
c.close()
check("once it is all back, close destroys it", destroyed(c))

print("%d failed" % len(fails))
sys.exit(1 if fails else 0)
