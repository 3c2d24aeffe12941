"""Step timing: clocks, the DDP communication-timing hook, and per-step records.

A step is cut into phases by *marks* taken between them: data | forward | backward |
optimizer. On CPU a mark is `time.perf_counter()` read after the work returned (CPU ops are
synchronous, and DDP's backward returns only once every bucket's all-reduce completed). On
GPU a mark is a CUDA event recorded on the current stream; events are resolved into seconds
at the end of the epoch, after one synchronize, never with a synchronize per phase.

`CommTimingHook` wraps a DDP communication hook (PyTorch's own `allreduce_hook` by default)
and marks, for every gradient bucket, when it was handed over (its gradients are ready) and
when its all-reduce completed. From those marks (definitions, once, here):

- `allreduce_s`: time during which at least one bucket's all-reduce was in flight (the union
  of the per-bucket intervals, so a bucket queued behind another is not counted twice). It
  overlaps backward compute, so it does not add to the other phases.
- `exposed_comm_s`: time from the end of backward compute (the last bucket handed over) until
  the last all-reduce completed: what backward did not hide. Part of `backward_s`.
- `compute_s` = forward_s + (backward_s - exposed_comm_s) + optimizer_s.

`inject_delay_s` is the ground truth: it holds the last bucket's all-reduce for a known time
inside the all-reduce path, so the exposed communication and the A/B overhead must grow by
exactly that much (tests/test_ground_truth.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook


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


def clock_for(device: torch.device) -> Clock:
    return CudaClock() if device.type == "cuda" else Clock()


@dataclass
class BucketMarks:
    index: int
    handed_over: object  # mark: the bucket's gradients are ready, its all-reduce starts
    completed: object = None  # mark: its all-reduce finished (set on the communication thread)


class CommTimingHook:
    """A DDP comm hook that times every bucket's all-reduce around an inner hook.

    Register with `ddp_model.register_comm_hook(state=None, hook=CommTimingHook(...))` before
    the first backward. `take()` returns and clears the buckets marked since the last call.
    """

    def __init__(self, clock: Clock | None = None, inner_hook=allreduce_hook, inner_state=None, inject_delay_s: float = 0.0):
        clock = clock or Clock()
        if inject_delay_s and clock.cuda:
            raise ValueError("inject_comm_delay_s is implemented for CPU (gloo) runs only")
        self.clock = clock
        self.inner_hook = inner_hook
        self.inner_state = inner_state
        self.inject_delay_s = inject_delay_s
        self._buckets: list[BucketMarks] = []
        # DDP logs the hook's name; give it the inner hook's, marked as timed.
        self.__name__ = self.__qualname__ = f"timed_{getattr(inner_hook, '__name__', 'hook')}"

    def wrap(self, inner_hook, inner_state=None) -> None:
        """Time `inner_hook` (a user's own comm hook, a compression hook) from now on."""
        self.inner_hook, self.inner_state = inner_hook, inner_state
        self.__name__ = self.__qualname__ = f"timed_{getattr(inner_hook, '__name__', 'hook')}"

    def __call__(self, state, bucket):
        marks = BucketMarks(index=bucket.index(), handed_over=self.clock.mark())
        self._buckets.append(marks)
        delay_s = self.inject_delay_s if bucket.is_last() else 0.0
        future = self.inner_hook(self.inner_state, bucket)

        def on_complete(fut):
            # Runs when the all-reduce has finished (on gloo, on its communication thread).
            # DDP waits for the future returned here, so an injected delay is exposed unless
            # backward compute still runs behind it.
            if delay_s:
                time.sleep(delay_s)
            marks.completed = self.clock.mark()
            return fut.value()

        return future.then(on_complete)

    def take(self) -> list[BucketMarks]:
        taken, self._buckets = self._buckets, []
        return taken


def interval_union_s(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of [start, end] intervals (overlaps counted once)."""
    total, covered_until = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= covered_until:
            continue
        total += end - max(start, covered_until)
        covered_until = end
    return total


@dataclass
class StepMarks:
    """The raw marks of one step, resolved into a record once the clock can be read."""

    epoch: int
    step: int  # global training-step counter of this rank (0-based); calibration steps reuse the last one
    kind: str  # train | calib_sync | calib_nosync
    warmup: bool
    samples: int
    start: object
    after_data: object
    after_forward: object
    after_backward: object
    after_optimizer: object
    buckets: list[BucketMarks] = field(default_factory=list)
    pair: int = -1  # calibration: index of the (no_sync, sync) pair within the epoch; -1 for training steps

    def resolve(self, clock: Clock) -> dict:
        def since_start(mark) -> float:
            return clock.seconds(self.start, mark)

        data_s = since_start(self.after_data)
        forward_end = since_start(self.after_forward)
        backward_end = since_start(self.after_backward)
        step_s = since_start(self.after_optimizer)
        intervals = [(since_start(b.handed_over), since_start(b.completed)) for b in self.buckets]
        allreduce_s = interval_union_s(intervals)
        if intervals:
            compute_end = max(start for start, _ in intervals)
            comm_end = max(end for _, end in intervals)
            exposed_comm_s = max(0.0, comm_end - compute_end)
        else:
            exposed_comm_s = 0.0
        forward_s = forward_end - data_s
        backward_s = backward_end - forward_end
        optimizer_s = step_s - backward_end
        return {
            "epoch": self.epoch,
            "step": self.step,
            "kind": self.kind,
            "pair": self.pair,
            "warmup": self.warmup,
            "samples": self.samples,
            "data_s": data_s,
            "forward_s": forward_s,
            "backward_s": backward_s,
            "optimizer_s": optimizer_s,
            "step_s": step_s,
            "allreduce_s": allreduce_s,
            "exposed_comm_s": exposed_comm_s,
            "compute_s": forward_s + backward_s - exposed_comm_s + optimizer_s,
            "num_buckets": len(self.buckets),
        }
