"""The measured op's device timer (python/capuchin/_optimer.py) without a GPU.

CI has no GPU, so the timer's CUDA calls are played by a fake that keeps
the order of what was issued and a clock: the calibration turns the spin
kernel's measured time into the cycles for HOLD_NS; before() waits for the
device, holds the stream with the spin and records the start; after()
records the end, waits for it and gives the events' time in ns. Without
torch.cuda._sleep the timer still times with events, with no hold.
Exits 77 where torch is missing.
"""
import contextlib
import sys

try:
    import torch
except ImportError:
    print("skip: no torch")
    sys.exit(77)

from capuchin import _optimer


def check(cond, what):
    print("%s %s" % ("ok  " if cond else "FAIL", what), flush=True)
    if not cond:
        raise SystemExit(1)


class FakeCuda:
    """The calls OpTimer makes, logged; a device whose clock advances by
    the spin kernel's cycles at `ghz` and by `op_ms` for the op."""

    def __init__(self, ghz, with_sleep=True):
        self.ghz, self.now_ms, self.log = ghz, 0.0, []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                check(enable_timing, "events are made with timing on")
                self.t = None

            def record(self, stream=None):
                fake.log.append(("record", stream))
                self.t = fake.now_ms

            def synchronize(self):
                fake.log.append(("event sync",))

            def elapsed_time(self, other):
                return other.t - self.t

        self.Event = Event
        self.current_stream = lambda device=None: "compute"
        self.synchronize = lambda device=None: self.log.append(("device sync",))
        self.device = lambda d: contextlib.nullcontext()
        if with_sleep:
            self._sleep = self.sleep

    def sleep(self, cycles):
        self.log.append(("sleep", cycles))
        self.now_ms += cycles / self.ghz / 1e6

    def run_op(self, ms):
        self.log.append(("op",))
        self.now_ms += ms


@contextlib.contextmanager
def faked(fake):
    saved = {}
    for name in ("Event", "current_stream", "synchronize", "device", "_sleep"):
        saved[name] = getattr(torch.cuda, name, None)
        if hasattr(fake, name):
            setattr(torch.cuda, name, getattr(fake, name))
        elif hasattr(torch.cuda, name):
            delattr(torch.cuda, name)
    try:
        yield
    finally:
        for name, v in saved.items():
            if v is not None:
                setattr(torch.cuda, name, v)


def test_hold_and_time():
    fake = FakeCuda(ghz=1.5)
    with faked(fake):
        t = _optimer.OpTimer(torch.device("cuda", 0))
        want = _optimer.HOLD_NS * 1.5
        check(abs(t.hold_cycles - want) <= 2, "the hold is %d cycles for %d ns at 1.5 GHz (%d)" % (
            t.hold_cycles, _optimer.HOLD_NS, want))
        fake.log.clear()
        t.before()
        fake.run_op(0.25)
        ns = t.after()
    check(fake.log == [("device sync",), ("sleep", t.hold_cycles), ("record", "compute"),
                       ("op",), ("record", "compute"), ("event sync",)],
          "sync, hold, start, op, end, wait: %s" % fake.log)
    check(abs(ns - 250_000) <= 1, "the op's time is the events', 250 us (%d ns)" % ns)


def test_without_sleep():
    fake = FakeCuda(ghz=1.5, with_sleep=False)
    with faked(fake):
        t = _optimer.OpTimer(torch.device("cuda", 0))
        check(t.hold_cycles == 0, "no torch.cuda._sleep: no hold")
        fake.log.clear()
        t.before()
        fake.run_op(0.1)
        ns = t.after()
    check(("sleep", 0) not in fake.log and not any(e[0] == "sleep" for e in fake.log),
          "nothing spins: %s" % fake.log)
    check(abs(ns - 100_000) <= 1, "still timed by events (%d ns)" % ns)


if __name__ == "__main__":
    test_hold_and_time()
    test_without_sleep()
    print("0 failed")
