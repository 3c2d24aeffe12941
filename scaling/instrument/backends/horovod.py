"""Horovod's DistributedOptimizer: its timed wait, its no-sync, and its communication timer.

Horovod's per-parameter all-reduces start in backward hooks and are waited for in
`synchronize()`, which `step()` would call; the adapter calls it (timed) when the optimizer
step begins, then lets that step skip its own synchronize (Horovod would otherwise all-reduce
every gradient a second time), also when steps are not timed. On GPU its per-tensor
completions cannot be timed from the host (`HorovodCommTimer`): `allreduce_s` is absent there,
`exposed_comm_s` is kept, and Horovod's timeline has the all-reduces.

Horovod is imported lazily: this module imports without it.
"""

from __future__ import annotations

import contextlib
import time

from scaling.instrument.backends.base import Backend
from scaling.instrument.timing import BucketMarks, Clock, squared_norm


class HorovodBackend(Backend):
    """A horovod.torch DistributedOptimizer (see the module docstring)."""

    kind = "horovod"
    wraps = "Horovod's DistributedOptimizer"
    waits_at_step = True

    def __init__(self, model, optimizer):
        super().__init__(model, optimizer)
        self._timer: HorovodCommTimer | None = None

    @classmethod
    def claims(cls, model, optimizer) -> bool:
        return hasattr(optimizer, "_allreduce_grad_async") and hasattr(optimizer, "synchronize")

    def install_timer(self, clock: Clock, inject_delay_s: float = 0.0, inject_into: str = "gradients") -> None:
        self._timer = HorovodCommTimer(self.optimizer, clock, inject_delay_s=inject_delay_s)

    def no_sync(self):
        return horovod_no_sync(self.optimizer)

    def wait_after_backward(self) -> None:
        # Wait here, timed, so the exposed wait is part of backward as with DDP; the step that
        # follows must not synchronise again.
        if self._timer is not None:
            self._timer.synchronize()
        else:
            self.optimizer.synchronize()
        self.optimizer._should_synchronize = False

    def after_step(self) -> None:
        self.optimizer._should_synchronize = True

    def take(self) -> list[BucketMarks]:
        return self._timer.take() if self._timer is not None else []

    def measure_norms(self, on: bool) -> None:
        if self._timer is not None:
            self._timer.norms = on

    def take_norms(self):
        return self._timer.take_norms() if self._timer is not None else None

    def observed_backend(self) -> str:
        return "horovod"


@contextlib.contextmanager
def horovod_no_sync(optimizer):
    """A backward inside this block launches no all-reduce: gradients stay rank-local.

    DistributedOptimizer's hooks count backward passes down from `backward_passes_per_step`
    and launch a parameter's all-reduce when its count reaches 0; here the count is raised so
    that it cannot, then restored, and the placeholders the hooks left are dropped (else
    `zero_grad()` would refuse, and `step()` would all-reduce what was meant to stay local).
    Gradients accumulate as usual: a later synchronised backward all-reduces their sum, as
    after DDP's `no_sync()`; calibration zeroes them. Every rank must use it for the same
    passes (the all-reduces of the others would wait for it).
    """
    if not hasattr(optimizer, "_allreduce_delay"):
        raise TypeError("no_sync needs horovod.torch.DistributedOptimizer (not the Adasum one)")
    if getattr(optimizer, "_handles", None):
        raise RuntimeError("no_sync entered with all-reduces in flight: synchronize() first")
    passes = optimizer.backward_passes_per_step
    optimizer.set_backward_passes_per_step(1 << 30)
    try:
        yield optimizer
    finally:
        optimizer._handles.clear()  # (None, None) placeholders: nothing was launched
        optimizer.set_backward_passes_per_step(passes)


class HorovodCommTimer:
    """Per-step communication marks of a DistributedOptimizer, in the form DDP's hook gives them.

    Installs itself on the optimizer: it wraps the instance's `_allreduce_grad_async`, which the
    backward hooks call, and marks each parameter's hand-over. Horovod reports no completion
    time, so completion is *observed*: at every hand-over the oldest all-reduces still open are
    polled (`hvd.poll`, oldest first, stopping at the first still running: amortised one poll
    per tensor), and a finished one gets that moment's mark; `synchronize()` (which replaces
    `optimizer.synchronize()`) polls once more when backward has returned, waits, and gives
    what was still open the end of the wait. A completion mark is therefore an upper bound,
    late by at most the gap between two hooks during backward.

    `take()` returns `BucketMarks` (one per parameter tensor) for `StepMarks`, so the
    definitions are DDP's: `exposed_comm_s` = last completion - last hand-over (the wait in
    synchronize() plus the moment between the last hook and backward's return); `allreduce_s`
    = union of the [hand-over, completion] intervals (a tensor waiting in Horovod's queue for
    the next cycle counts as in flight). `last_wait_s` is the bare wait of the last synchronize().

    `inject_delay_s` (ground truth, CPU only) sleeps inside the timed wait after the
    all-reduces completed: a known exposed cost per synchronised step. Unlike DDP's it is not
    inside the communication path (Horovod's C++ thread owns that).

    With `norms` on (the gradient noise scale: scaling/noise_scale.py) and Horovod averaging, each parameter's
    gradient is squared at its hand-over (this rank's, before the in-place all-reduce may touch it) and again
    after `synchronize()` (the average), as 0-d tensors read once per epoch (`take_norms`).

    On GPU (a CUDA clock) a mark is an event recorded on the default stream, and an event
    recorded at a later hook lands behind everything the host has queued there by then: a
    completion observed at a hook would be late by the GPU's backlog, and `allreduce_s` inflated
    by it. So on GPU no completion is observed per tensor: every tensor gets the end of the wait
    in `synchronize()` with `completion_known=False`, which makes the step's `allreduce_s` absent
    (NaN; the summary's figure None). `exposed_comm_s` stays right: the last hand-over event
    follows the last gradient on the stream, and the end-of-wait event is recorded once the host
    saw every all-reduce done, with backward's kernels already run (the all-reduces waited for
    them). Horovod's own record of the all-reduces on GPU is its timeline
    (`instrument.horovod_timeline`, `horovod_backend.parse_timeline`).
    """

    def __init__(self, optimizer, clock: Clock, inject_delay_s: float = 0.0):
        import horovod.torch as hvd

        if inject_delay_s and clock.cuda:
            raise ValueError("inject_comm_delay_s is implemented for CPU (gloo) runs only")
        self._hvd = hvd
        self.optimizer = optimizer
        self.clock = clock
        self.observe_completions = not clock.cuda  # see the class docstring
        self.inject_delay_s = inject_delay_s
        self._open: list = []  # [BucketMarks, handle] handed over, completion not yet seen; oldest first
        self._done: list = []  # BucketMarks complete, not yet taken
        self._count = 0
        self.last_wait_s = 0.0
        self.norms = False
        self._normed: list = []  # (parameter, its gradient's squared norm at hand-over) since the last synchronize
        self._norms: list = []  # [[before, after], ...] since the last take_norms
        inner = optimizer._allreduce_grad_async  # bound method of the class

        def timed_allreduce_grad_async(p):
            mark = self.clock.mark()
            self._observe(mark)
            marks = BucketMarks(index=self._count, handed_over=mark)
            self._count += 1
            if self.norms and p.grad is not None and getattr(optimizer, "op", None) == hvd.Average:
                self._normed.append((p, squared_norm(p.grad)))
            handle, ctx = inner(p)
            self._open.append((marks, handle))
            return handle, ctx

        optimizer._allreduce_grad_async = timed_allreduce_grad_async

    def _observe(self, mark) -> None:
        """Give `mark` to the oldest open all-reduces that have finished, up to the first that has not."""
        if not self.observe_completions:
            return
        finished = 0
        for marks, handle in self._open:
            if not self._hvd.poll(handle):
                break
            marks.completed = mark
            finished += 1
        if finished:
            self._done.extend(m for m, _ in self._open[:finished])
            del self._open[:finished]

    def synchronize(self) -> None:
        """optimizer.synchronize(), timed: call it right after backward."""
        returned = self.clock.mark()
        started = time.perf_counter()
        self._observe(returned)
        self.optimizer.synchronize()  # may hand over parameters no hook fired for: they are in _open too
        if self.inject_delay_s:
            time.sleep(self.inject_delay_s)
        end = self.clock.mark()
        self.last_wait_s = time.perf_counter() - started
        for marks, _ in self._open:
            marks.completed = end
            marks.completion_known = self.observe_completions
        self._done.extend(m for m, _ in self._open)
        self._open = []
        self._count = 0
        if self._normed:  # every gradient now holds the average
            self._norms.extend([before, squared_norm(p.grad)] for p, before in self._normed)
            self._normed = []

    def handed_over(self) -> int:
        """Parameters handed to Horovod since the last synchronize()."""
        return self._count

    def take(self) -> list:
        taken, self._done = self._done, []
        return sorted(taken, key=lambda m: m.index)

    def take_norms(self) -> tuple[list, list, float] | None:
        """The gradients' squared norms since the last call, ([before ...], [after ...], 1.0) as the DDP timer's
        (timing.py); None where none were taken."""
        taken, self._norms = self._norms, []
        if not taken:
            return None
        return [before for before, _ in taken], [after for _, after in taken], 1.0
