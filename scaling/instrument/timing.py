"""Step timing: clocks, the DDP communication-timing hook, and per-step records.

A step is cut into phases by *marks* taken between them: data | forward | backward |
optimizer. On CPU a mark is `time.perf_counter()` read after the work returned (CPU ops are
synchronous, and DDP's backward returns only once every bucket's all-reduce completed). On
GPU a mark is a CUDA event recorded on the current stream; events are resolved into seconds
at the end of the epoch, after one synchronize, never with a synchronize per phase.

`CommTimingHook` wraps a DDP communication hook (by default it does PyTorch's own
`allreduce_hook`'s work itself, with one Python callback per bucket rather than two) and marks,
for every gradient bucket, when it was handed over (its gradients are ready) and
when its all-reduce completed. From those marks (definitions, once, here):

- `allreduce_s`: time during which at least one bucket's all-reduce was in flight (the union
  of the per-bucket intervals, so a bucket queued behind another is not counted twice). It
  overlaps backward compute, so it does not add to the other phases.
- `exposed_comm_s`: time from the end of backward compute (the last bucket handed over) until
  the last all-reduce completed: what backward did not hide. Part of `backward_s`.
- `compute_s` = forward_s + (backward_s - exposed_comm_s) + optimizer_s.
- `injected_s`: the ground-truth delays planted in this step on this rank, each measured around
  it: the hold in its communication (below), and the meter's straggler sleep and batch delay
  (`StepMarks.planted_s`); 0 in real runs, NaN on a step whose collectives were not timed.
- `wrapper_s`: DDP's own work around the module's forward (part of `forward_s`): before it, from
  the wrapper's forward to the module's (its buffers broadcast from rank 0, where `broadcast_buffers`
  and the model has buffers), and after it, to the wrapper's return (its search of the autograd
  graph for unused parameters, where `find_unused_parameters` without `static_graph`). Timed only
  where one of those settings is on (schema.DDP_SETTINGS_WITH_WORK), else NaN; it also holds the
  wrapper's few microseconds of bookkeeping that every step pays, any forward pre-hook the job put
  on the wrapper, and, the broadcast being a collective, a rank's wait in it for the others to
  arrive. On GPU its marks are events: the broadcast's device time, and the host's search where the
  device waits for it.

Those are the all-reduce rule's (`CommRule`, DDP's and Horovod's). A backend whose collectives
are not all-reduces gives its steps a rule of its own (`StepMarks.comm_rule`, from the adapter):
FSDP's all-gathers and reduce-scatters, with their exposed time, are defined in
scaling/instrument/backends/fsdp.py.

`inject_delay_s` is the ground truth: it holds the last bucket's all-reduce for a known time
inside the all-reduce path, so the exposed communication and the A/B overhead must grow by
exactly that much (tests/test_ground_truth.py). Where it runs, in the last bucket's completion
callback (which DDP's finalisation waits for):
- CPU (gloo): a host sleep; the callback runs on gloo's thread once the all-reduce is done.
- GPU (NCCL): device work, not a host sleep (the host runs ahead of the device, so a host sleep
  would only delay the enqueueing, which the GPU's backlog hides). The callback of an NCCL
  future runs with pool streams current that wait for the all-reduce; a spin kernel
  (`torch.cuda._sleep`, its length in cycles measured once per hook: `spin_cycles_per_s`) is
  queued there, and the future DDP waits for completes after it.
Either way the injected time is measured around the delay on the run's clock (events on GPU)
and recorded per step as `injected_s`, so a ground truth compares the figures' growth with
what was really injected. The GPU injection has run on a GPU (`GPU_INJECTION_CHECKED`): on an
H200, scripts/gpu_first_contact.py's NCCL ground truth saw the exposed communication grow by
the measured spin to within 0.002% (docs/gpu.md), so the lab's preflight accepts it on GPU runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from scaling.schema import NOISE_COLUMNS, PHASES

# DDP's device-side injection, checked on a GPU by scripts/gpu_first_contact.py's NCCL ground truth
# (H200, 2026-11-27, docs/gpu.md). False refuses instrument.inject_comm_delay_s on GPU runs at
# preflight. FSDP2's injection has a flag of its own (scaling/instrument/backends/fsdp.py).
GPU_INJECTION_CHECKED = True


class Clock:
    """Marks on the host clock (CPU runs)."""

    cuda = False

    def mark(self):
        return time.perf_counter()

    @staticmethod
    def seconds(start, end) -> float:
        return end - start

    def resolve(self) -> None:
        """Make every mark taken so far readable. Nothing to do on the host clock."""

    def anchor(self) -> None:
        """Tie the marks to the host clock (CUDA: call after a synchronize). Nothing to do here."""

    def host_time(self, mark) -> float:
        """A mark as seconds on this process's host clock (`time.perf_counter`)."""
        return mark


class CudaClock(Clock):
    """Marks as CUDA events on the current stream (GPU runs); read after `resolve()`."""

    cuda = True

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(start, end) -> float:
        return start.elapsed_time(end) / 1000.0

    def resolve(self) -> None:
        # One synchronize per epoch, at its end, so every event recorded in it has completed.
        torch.cuda.synchronize()

    def anchor(self) -> None:
        # With the device idle (the caller synchronised), an event recorded now completes now:
        # the host time read beside it places every later event on the host clock.
        self._anchor_event = self.mark()
        torch.cuda.synchronize()
        self._anchor_host = time.perf_counter()

    def host_time(self, mark) -> float:
        return self._anchor_host + self._anchor_event.elapsed_time(mark) / 1000.0


def clock_for(device: torch.device) -> Clock:
    return CudaClock() if device.type == "cuda" else Clock()


def spin_cycles_per_s(device=None, probe_s: float = 0.02) -> float:
    """GPU clock cycles per second of `torch.cuda._sleep` on `device`, measured with CUDA events.

    The spin counts SM clock cycles, so its length in seconds follows the clock the GPU runs at
    now: measured (a warm-up spin, then spins lengthened until one lasts `probe_s`), not taken
    from the datasheet. Synchronises the device: call it before training, never inside a step.
    """
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        cycles, seconds = 1 << 20, 0.0
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000.0
            if seconds >= probe_s:
                break
            cycles = int(cycles * 1.2 * probe_s / max(seconds, 1e-6))
        return cycles / seconds


@dataclass(slots=True)  # slots: one made per collective, one per step; no per-instance dict to build or collect
class BucketMarks:
    """One collective's marks: a DDP bucket's all-reduce, a Horovod tensor's, or a sharded job's
    all-gather or reduce-scatter (backends/fsdp.py, which also sets the fields after `completion_known`)."""

    index: int
    handed_over: object  # mark: the bucket's gradients are ready, its all-reduce starts
    completed: object = None  # mark: its all-reduce finished (set on the communication thread)
    injected: tuple | None = None  # (start, end) marks around a ground-truth delay in this bucket's path
    # False where the completion mark is only an upper bound too loose to time the all-reduce
    # (Horovod on GPU: backends/horovod.py); the step's allreduce_s is then absent (NaN), exposed_comm_s stays.
    completion_known: bool = True
    kind: str = "all_reduce"  # all_reduce | all_gather | reduce_scatter
    nbytes: int = 0  # nccl-tests' size: the whole gathered (all-gather) or reduced (reduce-scatter) buffer
    module: str = ""  # the sharded module whose parameters or gradients it moves
    backward: bool = False  # issued in backward (a re-gather, a reduce-scatter), else in forward
    waited_from: object = None  # mark: compute began to wait for it (the sharded rule's exposed time); None: never


_work_from_future = torch._C._distributed_c10d._create_work_from_future  # a Work whose wait is the future's


def squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    """A gradient bucket's squared L2 norm as a 0-d tensor, not read (no wait for the device): one fused op.

    `torch.dot` of the flat buffer with itself: measured on a CPU core (2026-12-06) 2 µs for a 1,000-element
    bucket against 9 µs for `pow(2).sum()` (which allocates the squares) and 3 µs for `torch._foreach_norm`;
    bench/noise_scale_host_cost.py measures what the two norms cost a timed bucket. Buffers that are not a flat
    float buffer take the general path.
    """
    if tensor.dim() == 1 and tensor.dtype in (torch.float32, torch.float64):
        return torch.dot(tensor, tensor)
    return tensor.float().pow(2).sum()


def _future_tensor(value) -> torch.Tensor:
    """The all-reduced bucket of a future's value: a process group's future holds a list, a comm hook's a tensor."""
    return value[0] if isinstance(value, (list, tuple)) else value


def _hold_on_host(delay_s: float):
    """A completion callback that holds an all-reduce's future for `delay_s` (the ground truth on an untimed step)."""

    def hold(fut):
        time.sleep(delay_s)
        return fut.value()

    return hold


def _hold_on_device(spin_cycles: int):
    def hold(fut):
        torch.cuda._sleep(spin_cycles)
        return fut.value()

    return hold


class _BucketTimer:
    """What the comm hook and the timing process group share: the clock, the ground-truth delay,
    the `timed` flag, the marks taken since the last `take()` and the Python time spent (`host_s`)."""

    def _init_timer(self, clock: Clock | None, inject_delay_s: float) -> None:
        self._buckets: list[BucketMarks] = []
        self.timed = True
        self.host_s = 0.0
        # The gradient noise scale's two norms (scaling/noise_scale.py): on timed steps where `norms` is set (more
        # than one rank), each bucket's squared norm before its all-reduce (this rank's gradient, times
        # `local_norm_factor` where the reducer divided it by the world size first) and after it (the global
        # batch's), as 0-d tensors read once per epoch: [[before, after], ...] since the last `take_norms()`.
        self.norms = False
        self.local_norm_factor = 1.0
        self._norms: list[list] = []
        self.configure(clock or Clock(), inject_delay_s)

    def configure(self, clock: Clock, inject_delay_s: float = 0.0) -> None:
        """Mark on `clock` and inject `inject_delay_s` per step from the next bucket on.

        On a CUDA clock a delay is a spin of the current device whose cycle count is measured
        here (`spin_cycles_per_s`, which synchronises): configure before training, not in a step.
        """
        if inject_delay_s < 0:
            raise ValueError(f"inject_delay_s must be >= 0, got {inject_delay_s}")
        self.clock = clock
        self.inject_delay_s = inject_delay_s
        self.spin_cycles = int(round(inject_delay_s * spin_cycles_per_s())) if (inject_delay_s and clock.cuda) else 0
        if not inject_delay_s:
            self._hold = None
        else:
            self._hold = _hold_on_device(self.spin_cycles) if clock.cuda else _hold_on_host(inject_delay_s)

    def _marked(self, index: int, last: bool, issue, buffer: torch.Tensor | None = None):
        """The future of a bucket's all-reduce, issued by `issue()` once its hand-over is marked,
        followed by the callback that marks its completion (and holds it for the ground-truth delay
        if it is the step's last bucket): what DDP then waits on. Its value is the all-reduce's.
        With `norms` on, `buffer`'s squared norm is taken before the all-reduce (in place: it is
        overwritten) and the result's in the callback."""
        clock = self.clock
        marks = BucketMarks(index=index, handed_over=clock.mark())
        self._buckets.append(marks)
        norms = None
        if self.norms and buffer is not None:
            norms = [squared_norm(buffer), None]
            self._norms.append(norms)
        future = issue()
        delay_s = self.inject_delay_s if last else 0.0
        spin_cycles = self.spin_cycles if last else 0

        def on_complete(fut):
            # gloo: runs on its communication thread once the all-reduce has finished. NCCL:
            # runs on the host when the all-reduce is enqueued, with pool streams current that
            # wait for it, so an event recorded here lands at the all-reduce's end on the GPU.
            # DDP waits for the future returned here, so an injected delay is exposed unless
            # backward compute still runs behind it.
            if delay_s:
                before = clock.mark()
                if clock.cuda:
                    torch.cuda._sleep(spin_cycles)  # device work on this callback's stream (module docstring)
                else:
                    time.sleep(delay_s)
                marks.completed = clock.mark()
                marks.injected = (before, marks.completed)
            else:
                marks.completed = clock.mark()
            value = fut.value()
            if norms is not None:  # the all-reduced bucket, before DDP copies it out (off the training thread on gloo)
                norms[1] = squared_norm(_future_tensor(value))
            return value

        return future.then(on_complete)

    def take(self) -> list[BucketMarks]:
        taken = self._buckets
        if not taken:
            return ()  # an untimed step's: nothing allocated
        self._buckets = []
        return taken

    def take_norms(self) -> tuple[list, list, float] | None:
        """The buckets' squared norms since the last call, ([before ...], [after ...], `local_norm_factor`), the
        norms 0-d tensors, not read; None where none were taken. Every bucket's completion is in once DDP's
        backward returned: call it between steps."""
        taken = self._norms
        if not taken:
            return None
        self._norms = []
        return [before for before, _ in taken], [after for _, after in taken], self.local_norm_factor


class TimingProcessGroup(dist.ProcessGroup, _BucketTimer):
    """The process group a DDP model's reducer all-reduces its buckets through on the steps whose
    collectives are timed (and on every step while a ground-truth delay is injected): each call
    is the real group's all-reduce, marked when handed over and when completed.

    Why a process group and not a comm hook: DDP's reducer all-reduces each bucket itself, in C++,
    when the model has no comm hook; a comm hook, once registered, runs Python for every bucket of
    every step for good. The reducer's group can be swapped between steps
    (`Reducer._update_process_group`, a pointer swap): the DDP backend hands it this group on the
    steps it times and the real one on the others, which then run exactly DDP's own C++ path
    (scaling/instrument/backends/ddp.py). The reducer divides the gradients by the world size
    itself on that path, so this group only all-reduces.

    The reducer calls it for its buckets in index order, one call each per synchronising backward,
    and for two other things: the map of unused parameters (`find_unused_parameters`, an integer
    tensor: passed on, never a bucket) and the first iteration's broadcast of the rebuilt
    buckets' order (passed on). The step's last bucket, where the ground truth holds, is the call
    whose number is `bucket_count()`, the model's number of buckets (every synchronising backward
    all-reduces every bucket), given by the backend where a delay is injected.
    """

    # Called from C++ (the reducer), also inside a compiled DDP forward (the first iteration's broadcast) and
    # from an eager backward inside a compiled step: never traced, always run as written. Disabled at the first
    # instance, not at import: `torch.compiler.disable` imports torch._dynamo, seconds on a small CPU, which a
    # process that trains imports anyway (its first optimizer step does) but a CLI that launches runs need not.
    _NEVER_COMPILED = ("allreduce", "broadcast", "barrier")
    _compilation_disabled = False

    def __init__(self, group, clock: Clock | None = None, inject_delay_s: float = 0.0, bucket_count=None):
        cls = TimingProcessGroup
        if not cls._compilation_disabled:
            for name in cls._NEVER_COMPILED:
                setattr(cls, name, torch.compiler.disable(getattr(cls, name)))
            cls._compilation_disabled = True
        super().__init__(group.rank(), group.size())
        self.group = group
        self.bucket_count = bucket_count
        self._calls = 0  # bucket all-reduces since the last `take()`
        self._init_timer(clock, inject_delay_s)
        # the reducer hands this group each bucket divided by the world size already: the rank's own gradient
        # is the bucket times the world size
        self.local_norm_factor = float(group.size()) ** 2

    def allreduce(self, tensors, opts):
        entered = time.perf_counter()
        if not tensors[0].is_floating_point():  # the reducer's map of unused parameters, not a bucket
            return self.group.allreduce(tensors, opts)
        index, self._calls = self._calls, self._calls + 1
        last = self._hold is not None and self._calls == self.bucket_count()
        group = self.group
        if self.timed:
            future = self._marked(index, last, lambda: group.allreduce(tensors, opts).get_future(), tensors[0])
        else:
            work = group.allreduce(tensors, opts)
            if not (last and self._hold is not None):
                self.host_s += time.perf_counter() - entered
                return work
            future = work.get_future().then(self._hold)  # the ground truth holds every step's last bucket
        # the reducer waits on this work's future: the callback above (a mark, a hold) is on its path
        work = _work_from_future(future)
        self.host_s += time.perf_counter() - entered
        return work

    def broadcast(self, tensors, opts):
        return self.group.broadcast(tensors, opts)

    def barrier(self, opts):
        return self.group.barrier(opts)

    def getBackendName(self):
        return self.group.name()

    def take(self) -> list[BucketMarks]:
        self._calls = 0
        return super().take()


class CommTimingHook(_BucketTimer):
    """A DDP comm hook that times every bucket's all-reduce around a user's own comm hook (or a
    compression hook), on the steps asked.

    Used only where the model has a comm hook of its own to run (scaling/instrument/backends/ddp.py):
    without one, `TimingProcessGroup` times the buckets and the untimed steps run no Python at all.
    Register with `ddp_model.register_comm_hook(state=None, hook=CommTimingHook(...))` before
    the first backward. `timed` says whether the buckets from now on are timed (the meter sets
    it per step: scaling/instrument/meter.py, `collective_timing_every`); `take()` returns and
    clears the buckets marked since the last call. An untimed bucket runs the inner hook and
    nothing else: no mark, no callback (but the ground truth's hold on the last bucket). `host_s`
    sums the time spent inside this hook's Python, less the inner hook's own (the job's cost, not
    the observer's: a hook of its own, and whatever runs inline inside it); bench/instrument_host_cost.py
    measures the whole cost.
    """

    def __init__(
        self, clock: Clock | None = None, inner_hook=allreduce_hook, inner_state=None, inject_delay_s: float = 0.0
    ):
        self.inner_hook = inner_hook
        self.inner_state = inner_state
        self._init_timer(clock, inject_delay_s)
        # DDP logs the hook's name; give it the inner hook's, marked as timed.
        self.__name__ = self.__qualname__ = f"timed_{getattr(inner_hook, '__name__', 'hook')}"

    def __call__(self, state, bucket):
        entered = time.perf_counter()
        job_s = 0.0  # the job's own hook, and what runs inline inside it: the job's cost, not the observer's

        def inner_hook():
            nonlocal job_s
            began = time.perf_counter()
            try:
                return self.inner_hook(self.inner_state, bucket)
            finally:
                job_s = time.perf_counter() - began

        if self.timed:
            future = self._marked(bucket.index(), bucket.is_last(), inner_hook, bucket.buffer())
        else:
            future = inner_hook()
            if self._hold is not None and bucket.is_last():
                # the ground truth holds every step's last bucket, timed or not (the module docstring)
                future = future.then(self._hold)
        self.host_s += time.perf_counter() - entered - job_s
        return future


def interval_union_s(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of [start, end] intervals (overlaps counted once)."""
    total, covered_until = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= covered_until:
            continue
        total += end - max(start, covered_until)
        covered_until = end
    return total


class CommRule:
    """How a step's collectives become its communication figures: DDP's and Horovod's all-reduces.

    `step_columns(micro_buckets, since_start)` gets each micro-batch's `BucketMarks` and a
    function giving a mark's seconds since the step's start; it returns `allreduce_s`,
    `exposed_comm_s`, `comm_span_s`, `num_buckets`, `compute_end` and `comm_end` (seconds since
    the start; NaN without communication) as the module docstring defines them, plus any columns
    of its own. A rule may add `sync_points`, [(moment, waited s)] per collective every rank runs
    in the same order, for the attribution across ranks (recorder.attribute); without them a step
    has one, its last hand-over. `synchronised` tells a micro-batch that synchronised its
    gradients (`synced_micro_batches`). `collective_rows` gives one row per collective where a backend
    records them (`per_collective`; none here: DDP's buckets are summed per step).
    """

    per_collective = False

    def synchronised(self, buckets: list) -> bool:
        """Whether a micro-batch with these collectives synchronised its gradients (any all-reduce did)."""
        return bool(buckets)

    def step_columns(self, micro_buckets: list, since_start) -> dict:
        intervals, exposed_comm_s, comm_span_s = [], 0.0, 0.0
        compute_end = comm_end = float("nan")
        known = True
        for buckets in micro_buckets:
            if not buckets:
                continue
            spans = [(since_start(b.handed_over), since_start(b.completed)) for b in buckets]
            intervals += spans
            known = known and all(b.completion_known for b in buckets)
            # per communicating micro-batch: from the last bucket handed over (backward compute
            # done) to the last all-reduce done; the attribution across ranks uses the last one
            compute_end = max(start for start, _ in spans)
            comm_end = max(end for _, end in spans)
            exposed_comm_s += max(0.0, comm_end - compute_end)
            # first hand-over to last completion: the span PyTorch DDP's own timers call backward comm time
            comm_span_s += comm_end - min(start for start, _ in spans)
        return {
            "allreduce_s": interval_union_s(intervals) if known else float("nan"),
            "exposed_comm_s": exposed_comm_s,
            "comm_span_s": comm_span_s,
            "num_buckets": len(intervals),
            "compute_end": compute_end,
            "comm_end": comm_end,
        }

    def collective_rows(self, marks: StepMarks, clock: Clock) -> list[dict]:
        """One row per collective of the step (collectives.parquet); none for all-reduces."""
        return []


ALL_REDUCE_RULE = CommRule()


def _overlap_s(begin: float, end: float, intervals: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(begin, a)) for a, b in intervals)


@dataclass(slots=True)
class StepMarks:
    """The raw marks of one step, resolved into a record once the clock can be read.

    A step is cut into segments, each a phase (`PHASES`) ending at a mark; the first begins at
    `start`. An optimizer step made of several micro-batches (gradient accumulation) has a
    data | forward | backward run per micro-batch, then optimizer: the phases sum over them.
    `pauses` are evaluations inside the step (start, end marks), taken out of whatever phase
    they fall in. `micro_buckets` holds each micro-batch's all-reduces (empty for one that
    communicated nothing, e.g. under DDP's `no_sync`).
    """

    epoch: int
    step: int  # global training-step counter of this rank (0-based); calibration steps reuse the last one
    kind: str  # train | calib_sync | calib_nosync
    warmup: bool
    samples: int
    start: object
    segments: list  # [(phase, end mark)], in order
    micro_buckets: list  # [[BucketMarks]] per micro-batch
    pauses: list = field(default_factory=list)  # [(start mark, end mark)]
    optimizer_steps: int = 1  # optimizer.step() calls that ran (0: skipped, e.g. by GradScaler on inf)
    pair: int = -1  # calibration: index of the (no_sync, sync) pair within the epoch; -1 for training steps
    comm_rule: CommRule | None = None  # how its collectives become figures (the backend's); None: ALL_REDUCE_RULE
    # False: its collectives were not timed (a step the meter did not sample: `collective_timing_every`), so
    # every communication column is NaN, never a zero; its phases are measured as on any step
    comm_timed: bool = True
    instrument_host_s: float = float("nan")  # the instrument's own Python inside the step (meter.py)
    # the ground truth the meter planted on this rank's host in this step, as slept: a straggler's sleep and
    # its batches' delay (settings.py's inject_straggler_s, inject_data_delay_s); part of `injected_s`
    planted_s: float = 0.0
    # [(start, end) marks]: DDP's own work around the module's forward in each of the step's forwards, where a
    # setting makes it (schema.DDP_SETTINGS_WITH_WORK; the meter times nothing otherwise): `wrapper_s`
    wrapper: list = field(default_factory=list)
    # collectives the job runs beside its gradients', each timed on the host by the job's integration
    # (`StepMeter.record_job_collective`): kind -> [seconds, count], the columns `<kind>_s` and `<kind>s`
    job_collectives: dict | None = None
    # the gradient noise scale's two squared norms (scaling/noise_scale.py): taken as the timer's
    # ([before], [after], factor, B_small, B_big), read by the meter at the epoch's end into
    # (|G_small|², |G_big|², B_small, B_big): the columns NOISE_COLUMNS (NaN on the steps without)
    grad_norms: tuple | None = None

    @classmethod
    def single(
        cls,
        epoch: int,
        step: int,
        kind: str,
        warmup: bool,
        samples: int,
        start,
        phase_ends: tuple,
        buckets: list | None = None,
        pair: int = -1,
        comm_rule: CommRule | None = None,
    ) -> StepMarks:
        """A step of one micro-batch and one optimizer step, from the marks that end each of its phases
        (`phase_ends`: after the data, the forward, the backward and the optimizer, in PHASES' order)."""
        segments = list(zip(PHASES, phase_ends, strict=True))
        return cls(
            epoch, step, kind, warmup, samples, start, segments, [list(buckets or [])], pair=pair, comm_rule=comm_rule
        )

    def _resolved_segments(self, clock: Clock) -> tuple[list[tuple[str, float, float]], list[tuple[float, float]]]:
        """(phase, begin, end) in seconds since `start`, never running backwards; pauses likewise."""
        segments, begin = [], 0.0
        for phase, mark in self.segments:
            end = max(begin, clock.seconds(self.start, mark))
            segments.append((phase, begin, end))
            begin = end
        pauses = [(clock.seconds(self.start, a), clock.seconds(self.start, b)) for a, b in self.pauses]
        return segments, pauses

    def resolve(self, clock: Clock, offset_s: float = 0.0) -> dict:
        """The step's record; `offset_s` puts its moments (`*_t`) on rank 0's clock (clock_sync.py)."""
        segments, pauses = self._resolved_segments(clock)
        phase_s = dict.fromkeys(PHASES, 0.0)
        for phase, begin, end in segments:
            phase_s[phase] += (end - begin) - _overlap_s(begin, end, pauses)
        step_s = sum(phase_s.values())

        def since_start(mark) -> float:
            return clock.seconds(self.start, mark)

        rule = self.comm_rule or ALL_REDUCE_RULE
        comm = rule.step_columns(self.micro_buckets, since_start)
        if not self.comm_timed:
            comm = {name: [] if name == "sync_points" else float("nan") for name in comm}
        compute_end, comm_end = comm.pop("compute_end"), comm.pop("comm_end")
        allreduce_s, exposed_comm_s = comm.pop("allreduce_s"), comm.pop("exposed_comm_s")
        comm_span_s, num_buckets = comm.pop("comm_span_s"), comm.pop("num_buckets")
        injected_s = (
            sum(
                (
                    clock.seconds(*b.injected)
                    for buckets in self.micro_buckets
                    for b in buckets
                    if b.injected is not None
                ),
                self.planted_s,
            )
            if self.comm_timed
            else float("nan")
        )
        # counts as floats on every step, timed or not (NaN where untimed): one column type in every file
        synced = (
            float(sum(1 for buckets in self.micro_buckets if rule.synchronised(buckets)))
            if self.comm_timed
            else float("nan")
        )
        num_buckets = float(num_buckets)
        start_t = clock.host_time(self.start) + offset_s
        if "sync_points" in comm:  # moments since the step's start -> on rank 0's clock (recorder.attribute)
            comm["sync_points"] = [(start_t + moment, waited) for moment, waited in comm["sync_points"]]
        return {
            "epoch": self.epoch,
            "step": self.step,
            "kind": self.kind,
            "pair": self.pair,
            "warmup": self.warmup,
            "samples": self.samples,
            "micro_batches": len(self.micro_buckets),
            "synced_micro_batches": synced,
            "optimizer_steps": self.optimizer_steps,
            **{f"{phase}_s": phase_s[phase] for phase in PHASES},
            "step_s": step_s,
            "paused_s": sum(b - a for a, b in pauses),
            "allreduce_s": allreduce_s,
            "exposed_comm_s": exposed_comm_s,
            "comm_span_s": comm_span_s,
            "compute_s": step_s - phase_s["data"] - exposed_comm_s,
            "num_buckets": num_buckets,
            "injected_s": injected_s,
            "comm_timed": self.comm_timed,
            "instrument_host_s": self.instrument_host_s,
            "wrapper_s": sum(clock.seconds(a, b) for a, b in self.wrapper) if self.wrapper else float("nan"),
            **dict(zip(NOISE_COLUMNS, self._noise_values())),
            **{
                column: value
                for kind, (seconds, count) in (self.job_collectives or {}).items()
                for column, value in ((f"{kind}_s", seconds), (f"{kind}s", float(count)))
            },
            **comm,  # a rule's own columns (the sharded one's per collective kind: backends/fsdp.py)
            # moments on rank 0's clock (s), for attribution across ranks (recorder.py):
            # the step's start, this rank's last bucket handed over (its backward compute done)
            # and its last all-reduce done
            "start_t": start_t,
            "compute_end_t": start_t + compute_end,
            "comm_end_t": start_t + comm_end,
        }

    def _noise_values(self) -> tuple:
        norms = self.grad_norms
        if norms is None or len(norms) != len(NOISE_COLUMNS):  # none, or never read (not a steady step)
            return (float("nan"),) * len(NOISE_COLUMNS)
        return tuple(float(value) for value in norms)

    def trace_events(self, clock: Clock, offset_s: float, rank: int) -> list[dict]:
        """Chrome trace events (times in s on rank 0's clock; scaling/instrument/trace.py writes µs):
        the step's phases (and evaluations inside it) on track "phases", each bucket's all-reduce
        on track "all-reduce"."""
        start_t = clock.host_time(self.start) + offset_s
        segments, pauses = self._resolved_segments(clock)
        end_s = segments[-1][2] if segments else 0.0
        events = [
            {
                "name": f"step {self.step}",
                "cat": "step",
                "track": "phases",
                "rank": rank,
                "start_s": start_t,
                "end_s": start_t + end_s,
                "args": {"epoch": self.epoch, "step": self.step},
            }
        ]
        for phase, begin, end in segments:
            events.append(
                {
                    "name": phase,
                    "cat": "phase",
                    "track": "phases",
                    "rank": rank,
                    "start_s": start_t + begin,
                    "end_s": start_t + end,
                    "args": {"step": self.step},
                }
            )
        for begin, end in pauses:
            events.append(
                {
                    "name": "evaluation",
                    "cat": "pause",
                    "track": "phases",
                    "rank": rank,
                    "start_s": start_t + begin,
                    "end_s": start_t + end,
                    "args": {"step": self.step},
                }
            )
        for buckets in self.micro_buckets:
            for bucket in buckets:
                if bucket.completed is None:
                    continue
                event = {
                    "name": f"bucket {bucket.index}",
                    "cat": "allreduce",
                    "track": "all-reduce",
                    "rank": rank,
                    "start_s": start_t + clock.seconds(self.start, bucket.handed_over),
                    "end_s": start_t + clock.seconds(self.start, bucket.completed),
                    "args": {"step": self.step, "bucket": bucket.index},
                }
                if bucket.kind != "all_reduce":  # a sharded job's: one track per kind, named by module and pass
                    track = bucket.kind.replace("_", "-")
                    event.update(
                        name=f"{track} {bucket.module or 'root'} ({'backward' if bucket.backward else 'forward'})",
                        cat=bucket.kind,
                        track=track,
                        args={
                            "step": self.step,
                            "index": bucket.index,
                            "module": bucket.module,
                            "bytes": bucket.nbytes,
                        },
                    )
                events.append(event)
        return events
