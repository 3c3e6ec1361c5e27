"""capuchin.Manager: train an unmodified PyTorch model under a memory budget.

    mgr = capuchin.Manager(budget="50%", job="resnet50")  # or bytes, "6GiB"
    for batch in loader:
        with mgr.step():
            loss = model(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
    print(mgr.report())

Iteration 1 is the probe: it runs unmanaged and measures the persistent
bytes (storages the step touched that outlive it: weights, gradients,
optimizer state) and the peak of everything live, which turns "50%" into
bytes (persistent + 50 % of the activation peak). The client (libcapuchin-
client through capuchin._client) is created after it with that budget.
Iteration 2 is the measured iteration: a TorchDispatchMode reports every
ATen op (forward, backward, optimizer) with the storages it read and wrote
and its time, and every free, exactly as capuchin-replay reports a trace;
the daemon plans from it. Later iterations are guided: saved-tensor hooks
hand the activations autograd saves to the client, which swaps or drops
them as the plan says and brings them back at unpack (_saved.py).

Never wrong: without a daemon, or when the daemon goes away, the client
runs passive and the step runs as without Capuchin; an iteration whose ops
or shapes leave the plan's (a smaller last batch) stops the plan for the
rest of that iteration; a tensor that cannot be brought back exactly is
never returned (CAPUCHIN_VERIFY=1 checks every one by hash).
"""
import contextlib
import os
import re
import time
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # pragma: no cover - torch < 1.13
    TorchDispatchMode = None

from . import _client, _placement
from ._optimer import OpTimer
from ._own_ops import OwnOps
from ._saved import SavedTensors
from ._tensors import (Ident, Tensors, bytes_of, meta_of, storage_base, storage_nbytes,
                       storage_resizable, view_on)

# The most guided steps in a row that leave the plan's op sequence before
# the job is measured again (the count starts at 2 and doubles).
REMEASURE_MAX = 1024
# The most times guided steps over the budget on CUDA make the plans leave
# more room for memory the adapter does not see (Manager._learn_hidden).
REBUDGET_MAX = 3

_RNG_WORDS = ("bernoulli", "dropout", "rand", "normal", "uniform", "exponential",
              "multinomial", "poisson", "geometric", "cauchy", "log_normal")


def parse_budget(budget):
    """("fraction", f) for "50%", ("bytes", n) for 123 / "6GiB" / "512MB"."""
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        if budget <= 0:
            raise ValueError("budget must be positive")
        return ("bytes", int(budget))
    if not isinstance(budget, str):
        raise TypeError("budget: bytes, \"50%\" or \"6GiB\"")
    s = budget.strip()
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*%", s)
    if m:
        f = float(m.group(1)) / 100.0
        if not 0 < f:
            raise ValueError("budget: a percentage above 0")
        return ("fraction", f)
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(i?)B?", s, re.I)
    if not m:
        raise ValueError("budget %r: bytes, \"50%%\" or \"6GiB\"" % budget)
    unit = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}[m.group(2).upper()]
    base = 1024 if m.group(3) or not m.group(2) else 1000
    return ("bytes", int(float(m.group(1)) * base ** unit))


_DETACH = torch.ops.aten.detach.default
_FUNC_INFO = {}  # op -> (name, consumes random numbers)
_SEQ = (list, tuple)


def _flatten(args, kwargs):
    """The leaves of an op's arguments and how to rebuild them (None: the
    leaves are the positional arguments, as for most ops; tree_flatten
    costs several microseconds)."""
    if not kwargs:
        for a in args:
            if isinstance(a, _SEQ) and any(isinstance(e, torch.Tensor) for e in a):
                break
            if isinstance(a, dict):
                break
        else:
            return list(args), None
    return tree_flatten((args, kwargs))


def _run(func, args, kwargs):
    out = func(*args, **kwargs)
    if func is _DETACH and not isinstance(out, torch.Tensor):
        # torch 1.13: under a dispatch mode, detach of a wrapped Python
        # number (a scalar autograd saved through saved-tensor hooks) comes
        # back as a float, which autograd refuses; give it a tensor.
        out = torch.tensor(out, dtype=args[0].dtype, device=args[0].device)
    return out


class _Op:
    """What recompute needs of one op of the current iteration."""

    __slots__ = ("name", "func", "spec", "leaves", "in_ids", "out_ids",
                 "out_pos", "rng")

    def __init__(self, name, func, spec, leaves, in_ids, out_ids, out_pos, rng):
        self.name = name
        self.func = func
        self.spec = spec
        self.leaves = leaves      # args/kwargs leaves, tensors as _Ph
        self.in_ids = in_ids
        self.out_ids = out_ids
        self.out_pos = out_pos    # id of each tensor output, in order
        self.rng = rng            # RNG state the op ran with, or None


class _Ph:
    """A tensor argument of a recorded op: its id and its view."""

    __slots__ = ("id", "meta")

    def __init__(self, tid, meta):
        self.id = tid
        self.meta = meta


if TorchDispatchMode is not None:
    class _Mode(TorchDispatchMode):
        """handler(func, types, args=(), kwargs=None) gets every op: in a
        reported step the client's own dispatch (C, op_path.c: one call per
        op), in the probe Manager._torch_dispatch."""

        def __init__(self, handler):
            super().__init__()
            self._handler = handler

        # A plain method: PyTorch 2 refuses a mode whose __torch_dispatch__
        # is not one (an instance attribute, as this once was, included).
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return self._handler(func, types, args, kwargs)


class Manager:
    """One training job under Capuchin. See the module's docstring."""

    # False: every new storage is adopted through the Python path, as
    # before storages.c (tests/python/test_torch_profiles.py compares).
    _c_storages = True
    # True: the measured step reports every op through the Python path, as
    # it does on a GPU (where it times each op between two
    # synchronisations); the tests set it to run the GPU's path on the CPU.
    _measure_in_python = False

    def __init__(self, budget="50%", job=None, socket=None, no_daemon=False,
                 plan_wait_s=0.0, verify=None, host_pool_bytes=None,
                 host_pool_cap=None, connect_timeout_ms=1000, sim_gbps=0.0,
                 evict_persistent=True, placement=False):
        if TorchDispatchMode is None:
            raise RuntimeError("capuchin needs torch >= 1.13 (TorchDispatchMode)")
        self.budget_spec = parse_budget(budget)
        # Placement (_placement.py): the plan's blocks at the addresses the
        # daemon gave them, through a CUDA allocator of capuchin's; CUDA
        # torch >= 2.0, installed before anything is on the GPU.
        self.placement = bool(placement)
        if self.placement:
            _placement.install()
        # Plans may evict weights and optimizer state (the daemon plans so
        # when nothing else fits, --evict-persistent auto): their storages
        # are resized to 0 after the copy out and back before any op uses
        # them. False keeps them on the device (such actions fall back).
        self.evict_persistent = evict_persistent
        self._weights = set()       # client ids of the persistent storages
        self._weights_out = 0       # weights given up this step
        self.job = job
        self.socket = socket
        self.no_daemon = no_daemon
        self.plan_wait_s = plan_wait_s
        self.verify = (os.environ.get("CAPUCHIN_VERIFY", "0") not in ("", "0")
                       if verify is None else bool(verify))
        # Pinned host memory for swaps: allocated (and touched) once when the
        # client starts, by default as much as the first iteration's
        # activation peak; capped, by default at twice that. A swap-out that
        # would pass the cap keeps its tensor on the device (with a warning).
        self.host_pool_bytes = host_pool_bytes
        self.host_pool_cap = host_pool_cap
        self.connect_timeout_ms = connect_timeout_ms
        # CPU only (the client's sim backend): the copy engines' modelled
        # bandwidth, GB/s each way (0: an H100's PCIe).
        self.sim_gbps = float(os.environ.get("CAPUCHIN_SIM_GBPS", sim_gbps) or 0)
        self.budget_bytes = 0
        self.persistent_bytes = 0
        self.probe_peak_bytes = 0
        self.activation_peak_bytes = 0
        self._probe_events = []
        self.iterations = []        # one dict per step (report())
        self.client = None
        self.device = None
        self._op_timer = None       # a measured op's device time (cuda)
        self._step_no = 0
        self._in_step = False
        self._internal_ = False     # the adapter's own tensor ops: not reported
        self._op_ran = False        # _report: the op ran (its output in _op_out)
        self._op_out = None
        self._probe = False
        self._tensors = Tensors(None)
        self._idents = {}           # client id -> Ident
        self._ops = {}              # seq -> _Op of this iteration (the ops
                                    # a recompute list may replay)
        self._diverged_run = 0      # guided steps in a row that left the
                                    # plan's op sequence
        self._last_diverged_at = -1
        self._remeasure_after = 2   # ... that measure the job again: doubled
                                    # by each measurement no guided step
                                    # followed to its end (REMEASURE_MAX)
        self.remeasured = 0         # times the job was measured again
        self._marks_unplanned = False  # a weight the plan in force evicts
                                    # became NumPy-shared after the step it
                                    # was planned from (measure again)
        self._guided = False
        self._mode = "probe"
        self.hidden_bytes = 0       # CUDA memory the adapter does not see
                                    # that guided steps needed (_learn_hidden)
        self._rebudgets = 0
        self._rebudget = False      # measure again under the budget less it
        self._live_bytes = 0
        self._peak_bytes = 0
        self._saved = SavedTensors(self)
        self._warned = set()
        self._off = False           # no client: steps run unmanaged
        self._stopped = False       # this step stopped reporting (an error)

    # --- the user's API ---------------------------------------------------
    @contextlib.contextmanager
    def step(self):
        """One training iteration."""
        if self._in_step:
            raise RuntimeError("capuchin: steps do not nest")
        if not self._off:
            self._begin()
        if self._off:  # no client, or it could not be made again
            self._in_step = False
            yield self
            return
        ok = False
        try:
            # Saved-tensor hooks in every reported step, guided or not: with
            # hooks autograd saves a tensor without the detach it makes
            # otherwise, and the op sequences must match.
            with _Mode(self._torch_dispatch if self._probe else self.client.dispatch):
                if not self._probe:
                    with self._saved.hooks():
                        yield self
                else:
                    yield self
            ok = True
        finally:
            self._end(ok)

    def report(self):
        """The per-iteration table."""
        # at_op: the op at the tracked peak; over: allocations PyTorch made
        # that left the tracked bytes above the budget
        cols = ("iter", "mode", "time_ms", "peak_MiB", "at_op", "budget_MiB", "out_MiB",
                "in_MiB", "evict", "w_out", "recomp", "stalls", "fallb", "over",
                "verify_bad", "note")
        # On CUDA, PyTorch's own peak of each step next to the tracked one
        # (_note_cuda_peak); "-" for a step it did not measure (the probe).
        cuda = any("cuda_peak_bytes" in it for it in self.iterations)
        if cuda:
            cols = cols[:6] + ("cuda_MiB",) + cols[6:]
        rows = [cols]
        for it in self.iterations:
            row = (str(it["iteration"]), it["mode"],
                   "%.1f" % (it["time_ns"] / 1e6),
                   "%.2f" % (it["peak_bytes"] / 2**20), str(it.get("peak_op", "-")),
                   "%.2f" % (self.budget_bytes / 2**20) if self.budget_bytes else "-",
                   "%.2f" % (it.get("bytes_out", 0) / 2**20),
                   "%.2f" % (it.get("bytes_in", 0) / 2**20),
                   str(it.get("evictions", 0)), str(it.get("weights_out", 0)),
                   str(it.get("recomputed_ops", 0)),
                   str(it.get("stalls", 0)), str(it.get("fallbacks", 0)),
                   str(it.get("over_budget_allocs", 0)),
                   str(it.get("verify_mismatches", 0)), it.get("note", ""))
            if cuda:
                peak = it.get("cuda_peak_bytes")
                row = row[:6] + ("-" if peak is None else "%.2f" % (peak / 2**20),) + row[6:]
            rows.append(row)
        w = [max(len(r[i]) for r in rows) for i in range(len(cols) - 1)]
        out = []
        for r in rows:
            out.append("  ".join(r[i].rjust(w[i]) for i in range(len(w))) + "  " + r[-1])
        head = ("capuchin: job %s, budget %s = %d bytes (persistent %d, activation "
                "peak %d)" % (self.job or "-", self._budget_text(), self.budget_bytes,
                              self.persistent_bytes, self.activation_peak_bytes))
        if self.hidden_bytes:
            head += ("; plans keep %d bytes free for memory the adapter does not "
                     "see" % self.hidden_bytes)
        return head + "\n" + "\n".join(out)

    def close(self):
        if self.client is not None:
            self._flush_frees()
            self.client.close()
            self.client = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # --- steps ------------------------------------------------------------
    def _budget_text(self):
        kind, v = self.budget_spec
        return "%g%%" % (v * 100) if kind == "fraction" else "%d bytes" % v

    def _begin(self):
        self._step_no += 1
        self._in_step = True
        self._probe = self._step_no == 1
        self._ops = {}
        self._stopped = False
        self._weights_out = 0
        self._saved.begin()
        self._t0 = time.perf_counter_ns()
        if self._probe:
            self._live_bytes = 0
            self._peak_bytes = 0
            self._probe_events = []  # (ident, +bytes at adoption / -bytes at free)
            self._guided = False
            self._mode = "probe"
            return
        diverged = self._diverged_run >= self._remeasure_after
        if diverged or self._marks_unplanned or self._rebudget:
            self._remeasure(diverged)
            if self.client is None:
                return
        self._flush_frees()
        if self._cuda_stats():
            self._reset_cuda_peak()
        self._mode = self.client.begin()
        self._guided = self._mode == "guided"
        self._sync_op_path()

    def _end(self, ok):
        self._in_step = False
        self._sync_op_path()
        self._saved.end()
        if self._probe:
            self._flush_frees()
            self._end_probe()
            self.iterations.append(dict(iteration=1, mode="probe",
                                        time_ns=time.perf_counter_ns() - self._t0,
                                        peak_bytes=self._peak_bytes))
            return
        # Between steps every weight is on the device: the caller may read
        # or save it.
        self._bring_back(self._weights)
        if self._stopped:
            self._flush_frees()
            self._disown_survivors()
            st = self.client.end()
            st["iteration"] = self._step_no
            st["note"] = "stopped reporting: " + self._stop_reason
            st["verify_mismatches"] = self._saved.take_mismatches()
            self._note_cuda_peak(st)
            self.iterations.append(st)
            return
        self._flush_frees()
        self._disown_survivors()
        st = self.client.end()
        st["verify_mismatches"] = self._saved.take_mismatches()
        notes = [n for n in (st.get("plan_note"), st.get("first_error")) if n]
        if self._diverged:
            notes.insert(0, "diverged from the plan's iteration at op %d" %
                         self.client.diverged_at)
        s = self.client.stats()
        if s.get("daemon_message"):
            notes.append(s["daemon_message"])
        st["note"] = "; ".join(notes)
        if "framework cannot give up" in st["note"]:
            self.warn_once("persistent", "the plan evicts weights or optimizer state "
                           "that stay on the device (evict_persistent=False, or a "
                           "storage NumPy shares; capuchind --evict-persistent no "
                           "plans without)")
        if "host pool cap" in st["note"]:
            self.warn_once("hostcap", "the pinned host pool's cap (%d bytes) was reached: "
                           "tensors it could not take stayed on the device" % self.host_pool_cap)
        st["connected"] = s["connected"]
        st["iteration"] = self._step_no
        st["weights_out"] = self._weights_out
        self._note_cuda_peak(st)
        if (self._guided and not self._diverged and st.get("cuda_within_budget") is False
                and self._rebudgets < REBUDGET_MAX):
            self._learn_hidden(st["cuda_peak_bytes"], st["peak_bytes"])
        if st.get("cuda_within_budget") is False:
            st["note"] = "; ".join(n for n in (st["note"], "CUDA peak over the budget") if n)
        self.iterations.append(st)
        if self._guided and self._diverged:
            self._diverged_run += 1
            self._last_diverged_at = self.client.diverged_at
        elif self._guided:  # a step the plan carried to its end
            self._diverged_run = 0
            self._remeasure_after = 2
        if st["mode"] == "measured" and self.plan_wait_s > 0:
            self.client.wait_plan(0, int(self.plan_wait_s * 1000))

    @property
    def steady(self):
        """The job runs as it will from now on: the last step was guided by
        a plan to its end, and no new measurement is due (after steps that
        left their plan, a weight NumPy came to share, or memory PyTorch
        uses beside the tracked tensors). A benchmark times from here."""
        last = self.iterations[-1] if self.iterations else None
        return (last is not None and last["mode"] == "guided" and
                self._diverged_run == 0 and not self._rebudget and
                not self._marks_unplanned)

    def _on_cuda(self):
        return self.device is not None and self.device.type == "cuda"

    def _cuda_stats(self):
        """Whether PyTorch's allocator keeps the step's peak: on CUDA, and
        not under placement, whose pluggable allocator keeps no statistics
        (PyTorch raises if asked); there every allocation of the step goes
        through the client, whose tracked peak is the step's."""
        return self._on_cuda() and not self.placement

    def _note_cuda_peak(self, st):
        """On CUDA: what PyTorch's allocator handed out at most in this step
        (weights included, its cache not; reset when the step began), and
        whether that kept to the budget. The tracked peak counts only the
        storages the adapter sees; this one counts everything, a kernel's
        workspace too. Not on CPU, whose allocator keeps no such count."""
        if not self._cuda_stats():
            return
        peak = self._cuda_peak()
        st["cuda_peak_bytes"] = peak
        st["cuda_within_budget"] = peak <= self.budget_bytes

    def _cuda_peak(self):
        return torch.cuda.max_memory_allocated(self.device)

    def _reset_cuda_peak(self):
        torch.cuda.reset_peak_memory_stats(self.device)

    def _learn_hidden(self, cuda_peak, tracked_peak):
        """A guided step's CUDA peak went over the budget: memory the
        adapter does not see (kernels' workspaces, tensors made before the
        step) was there besides the tracked bytes, at least cuda_peak -
        tracked_peak of it at that moment. The client's budget leaves that
        much free, or what went over on top of what it left already if that
        is more, and a margin (a twentieth more, at least a hundredth of the
        budget: that memory differs a little from step to step, on an H200
        ResNet-50's by 26 MiB of 3.4 GiB); the job is measured again under
        it."""
        over = cuda_peak - self.budget_bytes
        need = max(cuda_peak - tracked_peak, self.hidden_bytes + over)
        self.hidden_bytes = need + max(need // 20, self.budget_bytes // 100) + 1
        self._rebudgets += 1
        self._rebudget = True
        self.warn_once("hidden", (
            "a guided step's CUDA peak was %d bytes over the budget (memory "
            "the adapter does not see: workspaces, tensors made before the "
            "step): the plans keep %d bytes free for it from the next step, "
            "which is measured again") % (over, self.hidden_bytes))

    def _client_budget(self):
        """The budget the plans keep to: the job's, less the memory learnt
        to be beyond the adapter's sight (_learn_hidden); never below the
        persistent bytes (the daemon then says what the floor is)."""
        return max(self.budget_bytes - self.hidden_bytes, self.persistent_bytes)

    def _new_client(self):
        stream = 0
        backend = "sim"
        if self.device is not None and self.device.type == "cuda":
            backend = "cuda"
            stream = torch.cuda.current_stream(self.device).cuda_stream
        try:
            client = _client.Client(
                job=self.job, budget=self._client_budget(), socket=self.socket,
                no_daemon=self.no_daemon, backend=backend,
                connect_timeout_ms=self.connect_timeout_ms,
                host_pool_bytes=self.host_pool_bytes, alloc=self._saved.alloc,
                release=self._saved.release, recompute=self._recompute,
                compute_stream=stream, sim_gbps=self.sim_gbps,
                host_pool_cap=self.host_pool_cap)
            # A GPU's measured step times each op on the device: the
            # profile is the device's timeline, without the host's time
            # between ops (so is the CPU's stand-in for that path).
            if backend == "cuda":
                self._op_timer = OpTimer(self.device)
            if backend == "cuda" or self._measure_in_python:
                client.set_device_timeline(True)
            if self.placement and backend == "cuda":
                _placement.place(client, self.device)
            elif self.placement:
                self.warn_once("placement", "placement=True, but the step ran "
                               "on %s: nothing to place" % (self.device,))
            return client
        except _client.Error as e:
            self._off = True
            self.warn_once("client", "no client (%s): the job trains unmanaged" % (e,))
            return None

    def _remeasure(self, diverged):
        """The job no longer runs the iteration its plan was made for
        (diverged: _remeasure_after guided steps in a row left it; else a
        weight it evicts can no longer be given up): a new client session
        measures the next step, and the daemon plans that."""
        self._flush_frees()
        self.client.close()
        del self._saved.graveyard[:]
        persistent = {id(i): i for i in self._idents.values() if i.persistent}
        self._idents = {}
        self._weights = set()
        self.client = self._new_client()
        if self.client is None:
            return
        for ident in persistent.values():
            live = [st for st in ident.storages if st.count > 0]
            t = self._tensors.tensor_of(live[0]) if live else None
            if t is None:
                continue
            ident.id = self._adopt_weight(ident.nbytes, t)
            self._tensors.moved(live[0], t)
            self._idents[ident.id] = ident
        self._attach()
        if diverged:
            # Each measurement is a slow step (on a GPU every op is timed
            # between two synchronisations): a job whose steps never follow
            # one waits longer each time.
            after = min(2 * self._remeasure_after, REMEASURE_MAX)
            if self._remeasure_after > 2:
                self.warn_once("diverging", (
                    "guided steps keep leaving the plan's op sequence (last at op %d): "
                    "measured %d times; next after %d such steps in a row "
                    "(CAPUCHIN_DEBUG=1 prints the op)") % (
                        self._last_diverged_at, self.remeasured + 1, after))
            self._remeasure_after = after
        self._diverged_run = 0
        self._marks_unplanned = False
        self._rebudget = False
        self.remeasured += 1

    def _adopt_weight(self, nbytes, t):
        """t's storage becomes a persistent tensor of the client: its id.
        Plans may evict it where the adapter can give its memory up (not a
        storage NumPy shares: PyTorch refuses to resize that one)."""
        # (torch 1.13 can only tell by resizing, which moves the storage:
        # before the client is told where it is)
        evictable = self.evict_persistent and storage_resizable(t)
        cid = self.client.adopt_persistent(nbytes, storage_base(t))
        self._weights.add(cid)
        if evictable:
            self.client.set_evictable(cid, True)
        return cid

    def _end_probe(self):
        """Turn the probe into the budget and the client's persistent tensors."""
        survivors = [st for st in self._tensors.by_ptr.values()
                     if st.count > 0 and st.ident.refs > 0]
        idents = {}
        for st in survivors:
            idents[id(st.ident)] = st.ident
        self.persistent_bytes = sum(i.nbytes for i in idents.values())
        self.probe_peak_bytes = self._peak_bytes
        # The activation peak: the most bytes of the storages that did not
        # outlive the step that were live at once (gradients and optimizer
        # state created late in the first step are persistent, not part of it).
        live = peak = 0
        for ident, delta in self._probe_events:
            if id(ident) in idents:
                continue
            live += delta
            peak = max(peak, live)
        self.activation_peak_bytes = peak
        self._probe_events = []
        kind, v = self.budget_spec
        if kind == "fraction":
            self.budget_bytes = self.persistent_bytes + int(peak * v)
        else:
            self.budget_bytes = v
        if self.host_pool_bytes is None:
            self.host_pool_bytes = peak
        if self.host_pool_cap is None:
            self.host_pool_cap = 2 * peak
        self.client = self._new_client()
        if self.client is None:
            return
        # The probe's ids were its own: the storages that outlived it become
        # the client's persistent tensors now, before the measured step, so
        # that its profile holds them from its first op (gradients and
        # optimizer state were created late in the probe). What the caller
        # keeps of a step (the loss) counts too: keep it small.
        table = Tensors(None)
        for ident in idents.values():
            sts = [st for st in ident.storages if st.count > 0]
            objs = [(st, self._tensors.tensor_at(st.ptr)) for st in sts]
            objs = [(st, t) for st, t in objs if t is not None]
            if not objs:
                continue
            cid = self._adopt_weight(ident.nbytes, objs[0][1])
            new = Ident(cid, ident.nbytes, True)
            self._idents[cid] = new
            for st, t in objs:
                table.add(t, new)
        self._tensors = table
        self._attach()

    # --- ops --------------------------------------------------------------
    def _flush_frees(self):
        """The work due between ops: weights the client released are
        resized to 0, buffers no copy uses any more go, frees are reported."""
        give = self._tensors.give_up
        if give:
            sts = list(give)
            del give[:]  # in place: the op path watches it
            for st in sts:
                if self._tensors.release_weight(st):
                    self._weights_out += 1
                else:
                    # Its bytes never left: the client copies them back at
                    # once, before an op can change them, and plans no
                    # longer take it out.
                    self.client.set_evictable(st.ident.id, False)
                    self._saved.restore_weight(st.ident.id)
                    # The daemon learns of the mark from a measured step
                    # only, and the plan in force counts on the bytes
                    # leaving: measure the next step again.
                    if self._mode != "measured":
                        self._marks_unplanned = True
                    self.warn_once("resizable", "a weight's storage became "
                                   "shared with NumPy: it stays on the device")
        self._saved.reap()
        if self.client is not None:
            self.client.flush_storages()  # the per-op path's own
        pend = self._tensors.pending_frees
        if not pend:
            return
        pend = list(pend)
        del self._tensors.pending_frees[:]  # in place: the op path watches it
        for ident in pend:
            if ident.refs > 0:
                continue  # referenced again since
            bufs = self._tensors.drop_ident(ident)
            self._saved.forget(ident)
            self._report_free(ident)
            self._bury(bufs)

    def _report_free(self, ident):
        if self._probe or ident.id < 0:
            self._live_bytes -= ident.nbytes
            self._probe_events.append((ident, -ident.nbytes))
            return
        if self._idents.get(ident.id) is not ident:
            return  # disowned at a step's end; the id may be another's now
        del self._idents[ident.id]
        if self.client is not None and not ident.persistent:
            try:
                self.client.free(ident.id)
            except _client.Error:
                pass  # already gone from the client's view

    def _bury(self, bufs):
        """The buffers the adapter allocated for a freed id: after the free
        (which hands a copy still running into one over to the client's
        deferred releases), kept only while such a copy runs."""
        for buf in bufs:
            self._saved.bury(buf, buf.data_ptr())

    def _disown_survivors(self):
        """Transient storages that outlive the step (the loss the caller
        keeps) leave the client now: the next step's i-th storage must get
        the id the i-th got before, not a new one because an old tensor
        still holds it. If the next step uses one, it is adopted again."""
        self.client.disown_storages()  # the per-op path's own
        for tid, ident in list(self._idents.items()):
            if ident.persistent:
                continue
            del self._idents[tid]
            bufs = self._tensors.drop_ident(ident)
            self._saved.forget(ident)
            try:
                self.client.free(tid)
            except _client.Error:
                pass
            self._bury(bufs)

    def _id_of(self, t):
        """The id of t's storage, adopting a storage seen the first time."""
        st = self._tensors.lookup(t)
        if st is not None:
            return st.ident.id
        if t.layout != torch.strided or t.data_ptr() == 0:
            return None
        # The job's device is the first one off the CPU that the probe
        # sees (the CPU where it sees none); a tensor elsewhere (a CUDA
        # job's CPU scalars, an optimizer's step counters, a .cpu() copy,
        # the batch before it is moved) is not its memory and stays
        # unmanaged.
        if t.device != self.device:
            if self.device is not None and not (self._probe and
                                                self.device.type == "cpu"):
                return None
            self._take_device(t.device)
        nbytes = storage_nbytes(t)
        if self._probe:
            ident = Ident(-1, nbytes, False)
            self._probe_events.append((ident, nbytes))
            self._live_bytes += nbytes
            if self._live_bytes > self._peak_bytes:
                self._peak_bytes = self._live_bytes
        ptr = storage_base(t)
        if not self._probe:
            cid = self.client.adopt(nbytes, ptr)
            ident = Ident(cid, nbytes, False)
            self._idents[cid] = ident
        self._tensors.add(t, ident, ptr=ptr)
        return ident.id

    def _take_device(self, dev):
        """The probe's tensors are on dev from now on. Those it took so far
        were all on the CPU (a step that starts by moving its batch to the
        GPU): if dev is not the CPU, they are not the job's memory after
        all, and are forgotten (their frees, still to come, count nothing)."""
        if self.device is not None and dev.type != "cpu":
            for st in list(self._tensors.by_ptr.values()):
                self._tensors.drop_ident(st.ident)
                st.ident.nbytes = 0
            self._probe_events = []
            self._live_bytes = self._peak_bytes = 0
        self.device = dev

    # The per-op path: in a reported step the mode's handler is the client's
    # dispatch (C, python/src/op_path.c), which reports an ordinary op
    # itself and hands every other one to _dispatch; the probe has no client
    # and comes here directly.
    @property
    def _internal(self):
        return self._internal_

    @_internal.setter
    def _internal(self, v):
        self._internal_ = v
        self._sync_op_path()

    @property
    def _diverged(self):
        """This guided step left the plan's op sequence (the client saw it)."""
        return self.client is not None and self.client.diverged_at >= 0

    def _sync_op_path(self):
        """Whether the client's dispatch may handle ops itself: in a
        reported step that is still reporting, outside the adapter's own
        ops, and not while a measured step on a GPU times each op between
        two synchronisations (the Python path does that)."""
        if self.client is None:
            return
        self.client.on = (self._in_step and not self._probe and not self._stopped and
                          not self._internal_ and
                          not (self._mode == "measured" and
                               (self._measure_in_python or self._on_cuda())))

    def _attach(self):
        """Give the client's dispatch what it needs of this adapter. It
        adopts new transient storages itself (python/src/storages.c) and
        hands one over to the table here when the Python side needs it."""
        t = self._tensors
        self.client.set_op_path(self._dispatch, self._id_of, self._stop, t.by_ptr,
                                (t.pending_frees, t.give_up, self._saved.graveyard),
                                self._flush_frees, t.give_up, torch.Tensor,
                                frozenset([_DETACH]), t.gone, torch.strided,
                                self.device is not None and self._c_storages, self.device)
        t.take = self._take_storage

    def _take_storage(self, ptr):
        """(Ident, tensor objects) of the storage at ptr that the client's
        per-op path adopted, now the Python side's; None: not one."""
        got = self.client.take_storage(ptr) if self.client is not None else None
        if got is None:
            return None
        tid, nbytes, objs = got
        ident = Ident(tid, nbytes, False)
        self._idents[tid] = ident
        return ident, objs

    def _torch_dispatch(self, func, types, args=(), kwargs=None):
        return self._dispatch(func, args, kwargs or {})

    def _dispatch(self, func, args, kwargs):
        if self._internal or not self._in_step or self._stopped:
            return _run(func, args, kwargs)
        try:
            return self._report(func, args, kwargs)
        except _client.Error as e:
            # The client refused something (a tensor it no longer knows, an
            # op it cannot make resident): this step goes on unreported and
            # unmanaged; what the plan had taken out still comes back at
            # unpack. The op itself has not run yet unless it was reported.
            self._stop(str(e))
            if self._op_ran:
                return self._op_out
            return _run(func, args, kwargs)
        finally:
            # Held no longer than the op: it kept the output of the last op
            # that took this path alive until the next one (on the GPU, where
            # the measured step takes it for every op and guided steps do
            # not, guided steps then held memory the plan had counted free).
            self._op_out = None

    def _stop(self, why):
        self._stopped = True
        self._sync_op_path()
        self._stop_reason = why
        self.warn_once("stopped", "step %d stopped reporting (%s); it runs unmanaged" % (
            self._step_no, why))
        try:
            self.client.diverged()
        except _client.Error:
            pass
        # The ops that follow are not seen: every weight must be there now.
        self._bring_back(self._weights)

    def _bring_back(self, ids):
        """The weights among ids that the plan took out come back: before
        an op that uses them (PyTorch reads a weight wherever the op
        likes), or all of them when the step ends. A copy that finishes
        meanwhile may release another one: until none is out."""
        while True:
            out = [tid for tid in ids if not self.client.resident(tid)]
            if not out:
                return
            for tid in out:
                self._saved.restore_weight(tid)

    def _report(self, func, args, kwargs):
        self._op_ran = False
        if self._tensors.pending_frees or self._saved.graveyard or self._tensors.give_up:
            self._flush_frees()
        leaves, spec = _flatten(args, kwargs)
        probe = self._probe
        guided = self._guided and not self._diverged
        seq = 0 if probe else self.client.op_seq
        # Only ops a recompute list may replay keep their arguments (and the
        # RNG state they ran with) for the replay.
        record = guided and self.client.replayed(seq)
        if guided:
            # PyTorch allocates the op's outputs: first let the swap-outs
            # in flight release what they will take (a budget wait). Before
            # the inputs are looked at: a weight it releases comes back below.
            self.client.make_room()
        in_ids = []
        rec_leaves = list(leaves) if record else None
        for i, a in enumerate(leaves):
            if isinstance(a, torch.Tensor):
                tid = self._id_of(a)
                if tid is None:
                    continue
                if tid not in in_ids:
                    in_ids.append(tid)
                if rec_leaves is not None:
                    rec_leaves[i] = _Ph(tid, meta_of(a))
        weights = [tid for tid in in_ids if tid in self._weights]
        if weights:
            self._bring_back(weights)
        info = _FUNC_INFO.get(func)
        if info is None:
            name = str(func)
            info = _FUNC_INFO[func] = (name, any(w in name for w in _RNG_WORDS))
        name = info[0]
        rng = self._rng_state() if info[1] and record else None
        # A measured op's time on a GPU is its kernels' there (_optimer.py;
        # only in the measured step: the others are not timed).
        timer = self._op_timer if self._mode == "measured" and self._on_cuda() else None
        if timer is not None:
            timer.before()
        t0 = time.perf_counter_ns()
        out = _run(func, args, kwargs)
        self._op_ran = True
        self._op_out = out
        dur = timer.after() if timer is not None else time.perf_counter_ns() - t0
        out_ids = []
        out_pos = []
        outs = (out,) if isinstance(out, torch.Tensor) else tree_flatten(out)[0]
        for o in outs:
            if isinstance(o, torch.Tensor):
                tid = self._id_of(o)
                out_pos.append(tid)
                if tid is not None and tid not in out_ids:
                    out_ids.append(tid)
        if probe:
            return out
        in_t, out_t = tuple(in_ids), tuple(out_ids)
        if record:
            self._ops[seq] = _Op(name, func, spec, rec_leaves, in_t, out_t, out_pos, rng)
        # The client checks that a guided step still follows the plan's op
        # sequence (and stops the plan where it does not), then reports.
        self.client.op(name, in_t, out_t, dur)
        return out

    def _rng_state(self):
        if self.device is not None and self.device.type == "cuda":
            return ("cuda", torch.cuda.get_rng_state(self.device))
        return ("cpu", torch.get_rng_state())

    @contextlib.contextmanager
    def _rng_as(self, state):
        if state is None:
            yield
            return
        kind, s = state
        if kind == "cuda":
            now = torch.cuda.get_rng_state(self.device)
            torch.cuda.set_rng_state(s, self.device)
            try:
                yield
            finally:
                torch.cuda.set_rng_state(now, self.device)
        else:
            now = torch.get_rng_state()
            torch.set_rng_state(s)
            try:
                yield
            finally:
                torch.set_rng_state(now)

    # --- recompute (called by the client from within op / acquire) --------
    def _recompute(self, seq, name, in_ids, in_addrs, out_ids, out_addrs):
        """Replay op seq of this iteration into the memory at out_addrs."""
        with OwnOps(self):
            return self._replay(seq, name, in_ids, in_addrs, out_ids, out_addrs)

    def _replay(self, seq, name, in_ids, in_addrs, out_ids, out_addrs):
        op = self._ops.get(seq)
        if op is None or op.name != name or op.in_ids != tuple(in_ids) or op.out_ids != tuple(out_ids):
            return False
        addr_of = dict(zip(in_ids, in_addrs))
        leaves = list(op.leaves)
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, _Ph):
                t = self._tensor_view(addr_of.get(leaf.id), leaf.meta)
                if t is None:
                    return False
                leaves[i] = t
        if op.spec is None:
            args, kwargs = tuple(leaves), {}
        else:
            args, kwargs = tree_unflatten(leaves, op.spec)
        with torch.no_grad(), self._rng_as(op.rng):
            out = op.func(*args, **kwargs)
        dst_of = dict(zip(out_ids, out_addrs))
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if len(outs) != len(op.out_pos):
            return False
        done = set()
        for o, tid in zip(outs, op.out_pos):
            if tid is None or tid in done:
                continue
            done.add(tid)
            dst = dst_of.get(tid)
            if dst is None:
                return False
            if storage_base(o) == dst:
                continue  # in place: already there
            if not self._saved.fill(dst, o):
                return False
        return True

    def _tensor_view(self, addr, meta):
        if addr is None:
            return None
        base = self._tensors.tensor_at(addr)
        if base is None:
            return None
        if base.dtype != torch.uint8 or base.dim() != 1 or base.storage_offset() != 0:
            base = bytes_of(base)
        return view_on(base, meta)

    def warn_once(self, key, msg):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn("capuchin: " + msg, RuntimeWarning, stacklevel=3)
