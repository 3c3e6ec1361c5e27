"""A measured op's time on the GPU: what its kernels take there, without the
host's time to launch them.

The plan is made from the measured step's timeline, and copies overlap the
device's compute, not the host's. Timed on the host between two
synchronisations, an op's time also holds the Python dispatch and the
launch of its kernels, during which the device is idle: the first GPU runs
recorded ResNet-50's 60 ms step as 91 ms of ops (155 ms with the host's time
between them), and plans counted on that time to hide their copies.

So the stream is held while the op is launched: a spin kernel
(torch.cuda._sleep) of a fixed time runs first, then a start event, the
op's kernels and an end event; the host launches the op while the spin
runs, and the events then see the kernels back to back. The spin's length
in clock cycles is calibrated once against the events. Without
torch.cuda._sleep (a private function) the events time the op with its
launch, which is still closer than the host's clock.
"""
import torch

# How long the stream is held while the host launches an op (a convolution
# takes up to about 250 us to launch under the adapter on an H200).
HOLD_NS = 400_000
_CALIBRATION_CYCLES = 2_000_000


class OpTimer:
    def __init__(self, device):
        self.device = device
        self.stream = torch.cuda.current_stream(device)
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.hold_cycles = self._calibrate()

    def _calibrate(self):
        """Clock cycles of torch.cuda._sleep for HOLD_NS; 0 without it."""
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return 0
        with torch.cuda.device(self.device):
            torch.cuda.synchronize()
            self.start.record(self.stream)
            sleep(_CALIBRATION_CYCLES)
            self.end.record(self.stream)
            self.end.synchronize()
        ms = self.start.elapsed_time(self.end)
        if ms <= 0:
            return 0
        return int(_CALIBRATION_CYCLES * HOLD_NS / (ms * 1e6)) + 1

    def before(self):
        """Call just before the op is run."""
        with torch.cuda.device(self.device):
            torch.cuda.synchronize()
            if self.hold_cycles:
                torch.cuda._sleep(self.hold_cycles)
        self.start.record(self.stream)

    def after(self):
        """Call just after the op was run: its time on the device, in ns."""
        self.end.record(self.stream)
        self.end.synchronize()
        return max(0, int(self.start.elapsed_time(self.end) * 1e6))
