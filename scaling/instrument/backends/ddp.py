"""PyTorch DistributedDataParallel: bucket timing, `no_sync`, and DDP's own timers.

Without a comm hook, DDP's reducer all-reduces each gradient bucket itself, in C++. The
instrument keeps it that way: on the steps whose collectives it times (and on every step while a
ground-truth delay is injected) it hands the reducer a `TimingProcessGroup` (scaling/instrument/
timing.py) that marks each bucket's all-reduce, and on the other steps the model's own group, so
they run DDP's own path with no Python per bucket. A model with a comm hook (a user's own, a
compression hook) has Python per bucket anyway: its hook is timed inside a `CommTimingHook`.
DDP allows one comm hook per model and never lets it be replaced, so the instrument must be
attached *before* a user's hook is registered: attaching wraps the model's `register_comm_hook`,
and a hook registered afterwards is kept and timed. A model that already has a hook is refused
with that one-line explanation. DDP's backward returns only once every bucket's all-reduce
completed: nothing to wait for after it.

A DDP model communicates even at world size 1 (a 1-rank NCCL group: the GPU ground truth,
docs/gpu.md), so its all-reduces are timed there too. PyTorch's own timers
(`_get_ddp_logging_data`) are the second opinion on the comm figures (`DDPTimers`).
"""

from __future__ import annotations

import json

import torch
from torch.nn.parallel import DistributedDataParallel

from scaling.instrument.backends.base import Backend
from scaling.instrument.timing import BucketMarks, Clock, CommTimingHook, TimingProcessGroup


class DDPBackend(Backend):
    """A DistributedDataParallel model (see the module docstring for the comm-hook rule)."""

    kind = "ddp"
    wraps = "a DistributedDataParallel model"
    communicates_alone = True
    samples_collectives = True

    def __init__(self, model: DistributedDataParallel, optimizer):
        super().__init__(model, optimizer)
        self._timer: CommTimingHook | TimingProcessGroup | None = None
        self._reducer_group = None  # the group the reducer all-reduces through now (TimingProcessGroup timer)
        self._buckets_counted: tuple[bool, int] | None = None  # (rebuilt?, how many): `_count_buckets`

    def per_step_settings(self) -> dict:
        """DDP's own settings that cost every step work: `find_unused_parameters` (a traversal of the
        autograd graph after each forward, and the unused map all-reduced), buffers synchronised from
        rank 0 in each forward (`forward_sync_buffers`, torch < 2.13 `broadcast_buffers`) where the
        model has buffers, and `static_graph` (which spares the traversal)."""
        model = self.model
        sync = getattr(model, "forward_sync_buffers", getattr(model, "broadcast_buffers", False))
        return {
            "find_unused_parameters": bool(getattr(model, "find_unused_parameters", False)),
            "sync_buffers": bool(sync) and any(True for _ in model.module.buffers()),
            "static_graph": bool(getattr(model, "static_graph", False)),
        }

    @classmethod
    def claims(cls, model, optimizer) -> bool:
        return isinstance(model, DistributedDataParallel)

    @property
    def plain_model(self) -> torch.nn.Module:
        return self.model.module

    def install_timer(self, clock: Clock, inject_delay_s: float = 0.0, inject_into: str = "gradients") -> None:
        registered = self.model._comm_hooks[0][0] if self.model._comm_hooks else None
        if isinstance(registered, CommTimingHook):
            # Registered at wrapping time around a compression hook (the lab's set-up,
            # scaling/train/backends/ddp.py): adopt it, on this instrument's clock.
            registered.configure(clock, inject_delay_s)
            self._timer = registered
            return
        if registered is not None:
            hook = registered
            raise ValueError(
                f"this DDP model already has a comm hook ({getattr(hook, '__name__', hook)!r}) and DDP allows only "
                "one: "
                "attach the instrument first, then register your hook (it is kept and timed)"
            )
        model = self.model
        self._timer = TimingProcessGroup(
            model.process_group, clock, inject_delay_s, bucket_count=lambda: self._buckets_counted[1]
        )
        self._reducer_group = model.process_group
        if inject_delay_s:
            model.register_forward_hook(torch.compiler.disable(self._count_buckets))  # never traced
        self.time_collectives(True)

        def register_comm_hook(state, hook):
            # The user's hook becomes a timed hook's inner hook: kept, and timed. The reducer goes back
            # to the model's own group for good (the hook issues its own collectives).
            timer = self._timer
            self._use_group(model.process_group)
            hooked = CommTimingHook(
                timer.clock, inner_hook=hook, inner_state=state, inject_delay_s=timer.inject_delay_s
            )
            hooked.timed, hooked.norms = timer.timed, timer.norms
            DistributedDataParallel.register_comm_hook(model, state=None, hook=hooked)
            self._timer = hooked

        model.register_comm_hook = register_comm_hook

    def _count_buckets(self, module, args, output) -> None:
        """After a forward (where a ground-truth delay is injected): the model's number of gradient buckets,
        which the coming backward all-reduces, the last one held. Counted at the first forward and again
        after DDP rebuilt its buckets (its second iteration's forward); never inside backward, where the
        reducer holds the lock that counting takes."""
        rebuilt = bool(getattr(self.model, "_has_rebuilt_buckets", False))
        if self._buckets_counted is None or self._buckets_counted[0] != rebuilt:
            # copies of the buckets, made twice per run, in ground-truth runs only
            self._buckets_counted = (rebuilt, len(self.model.reducer._get_zeros_like_grad_buckets()))

    def _use_group(self, group) -> None:
        if group is not self._reducer_group:
            self.model.reducer._update_process_group(group)
            self._reducer_group = group

    def no_sync(self):
        # DDP decides in forward whether the coming backward synchronises: the whole
        # forward+backward must sit inside this block.
        return self.model.no_sync()

    def take(self) -> list[BucketMarks]:
        return self._timer.take() if self._timer is not None else []

    def time_collectives(self, timed: bool) -> None:
        timer = self._timer
        if timer is None:
            return
        timer.timed = timed
        if isinstance(timer, TimingProcessGroup):
            # untimed steps without a ground truth to hold run DDP's own C++ path (module docstring)
            self._use_group(timer if timed or timer.inject_delay_s else self.model.process_group)

    def measure_norms(self, on: bool) -> None:
        if self._timer is not None:
            self._timer.norms = on

    def take_norms(self):
        return self._timer.take_norms() if self._timer is not None else None

    def take_host_s(self) -> float:
        if self._timer is None:
            return 0.0
        host_s, self._timer.host_s = self._timer.host_s, 0.0
        return host_s

    def second_opinion(self, warmup_steps: int) -> DDPTimers:
        return DDPTimers(self.model, warmup_steps)


# DDP times every this many synchronising iterations (and its first 10), as its own default samples
# every 100th: each sampled iteration costs DDP's logger its stats on the next forward (on a GPU, a
# wait for the previous backward's events) and the instrument one read of them.
DDP_TIMER_EVERY = 10


class DDPTimers:
    """PyTorch DDP's own view of the communication, a second opinion (`ddp_*` in epochs.parquet).

    DDP times its iterations 1 to 10 and then every `DDP_TIMER_EVERY`th (its sample rate), and
    logs an iteration's timers at the next synchronising forward (torch/csrc/distributed/c10d/
    reducer.cpp, `should_collect_runtime_stats`); `before_forward` counts those forwards as DDP
    does, and `after_forward` reads the timers after the forwards that logged a training step's
    (never an A/B half's), so the other forwards pay nothing. A count that drifted from DDP's
    would only skip samples: a read keeps an iteration's figures only under DDP's own number. `epoch_figures` gives the
    epoch's mean backward comm time (and its spread) and comm minus its overlap with compute,
    DDP's exposed communication (scaling/analysis/run_metrics.py, `ddp_second_opinion`).
    """

    def __init__(self, model: DistributedDataParallel, warmup_steps: int):
        self.model, self.warmup_steps = model, warmup_steps
        model._set_ddp_runtime_logging_sample_rate(DDP_TIMER_EVERY)
        # per iteration: (its step's (epoch, step), backward comm s, comm/compute overlap s)
        self._log: list[tuple[tuple[int, int], float, float]] = []
        self._forwards = 0  # DDP's iteration count (num_iterations_), mirrored
        # the sampled iterations that were training steps, each with its step's (epoch, step): an A/B half
        # is an iteration to DDP too, but not a training step (no straggler, no data), so its timers are
        # not the training's
        self._training_samples: dict[int, tuple[int, int]] = {}

    def _sampled(self, iteration: int) -> bool:
        return 0 < iteration <= 10 or iteration % DDP_TIMER_EVERY == 0

    def before_forward(self, step: tuple[int, int] | None) -> None:
        """Every forward of the DDP model, with the (epoch, step) of the training step it is in (None: an
        A/B half's): DDP counts an iteration at a forward that will synchronise."""
        if self.model.require_backward_grad_sync and torch.is_grad_enabled():
            self._forwards += 1
            if step is not None and self._sampled(self._forwards):
                self._training_samples[self._forwards] = step

    def after_forward(self) -> None:
        logged = self._forwards - 1  # the iteration whose timers DDP logged at this forward
        step = self._training_samples.get(logged)
        if step is None:
            return
        # this one, and any an A/B window's forwards logged before the job's next step could read them
        self._training_samples = {i: s for i, s in self._training_samples.items() if i > logged}
        # the integer fields only (every figure read here is one): DDP's `_get_ddp_logging_data()`
        # would also copy its ~25 strings into a dict merged with these
        data = self.model.logger._get_ddp_logging_data().ints_map
        # a count that drifted from DDP's finds another iteration here: skipped, never taken for this one
        if data.get("iteration") != logged or "backward_comm_time" not in data:
            return
        if logged > self.warmup_steps:  # steady state, as the lab's own figures
            comm, overlap = data["backward_comm_time"] / 1e9, data["backward_compute_comm_overlap_time"] / 1e9
            self._log.append((step, comm, overlap))

    def epoch_figures(self) -> dict:
        """The epoch's DDP figures: mean backward comm time per iteration (and its spread), comm minus
        overlap, and `ddp_samples`, each iteration's [epoch, step, comm s] (JSON), for the analysis to
        pair with the lab's own span of the same step (run_metrics.ddp_second_opinion)."""
        if not self._log:
            return {}
        comm = [c for _, c, _ in self._log]
        exposed = [c - o for _, c, o in self._log]
        samples = json.dumps([[epoch, step, c] for (epoch, step), c, _ in self._log])
        self._log = []
        n = len(comm)
        mean = sum(comm) / n
        std = (sum((c - mean) ** 2 for c in comm) / (n - 1)) ** 0.5 if n > 1 else float("nan")
        return {
            "ddp_comm_s": mean,
            "ddp_comm_std_s": std,
            "ddp_exposed_comm_s": sum(exposed) / n,
            "ddp_iterations": n,
            "ddp_samples": samples,
        }
