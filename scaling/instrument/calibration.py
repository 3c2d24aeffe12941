"""The A/B calibration window: after an epoch's training, the same model and batches run with gradient
synchronisation off (`no_sync`) and on, alternating ABBA, each half recorded as a step of its kind
(`calib_nosync`, `calib_sync`), so that the communication overhead is measured and not inferred (docs/method.md).
At one worker, where there is nothing to synchronise, the same window measures the gradient noise scale
instead (scaling/noise_scale.py). Whatever it uses of the job's state it gives back: the gradients, the
module buffers and the random streams.

The meter (meter.py) owns one and calls `calibrate()` at each epoch's end; the window reads the meter's
backend, clock, recorder and the job's `forward_backward` and `calibration_data`, and the meter's forward
hooks mark each half's phases into `meter._calib` while `meter._calibrating` is set.
"""

from __future__ import annotations

import contextlib
import random

import torch

from scaling.instrument.inputs import batch_samples
from scaling.instrument.timing import StepMarks


def _numpy_rng_state():
    try:
        import numpy
    except ImportError:
        return None
    return numpy.random.get_state()


def _restore_numpy_rng_state(state) -> None:
    if state is not None:
        import numpy

        numpy.random.set_state(state)


@contextlib.contextmanager
def rng_untouched(device: torch.device):
    """Whatever the instrument draws inside this block, the job's random streams go on as without it:
    torch's (CPU, and `device`'s), Python's and NumPy's states are put back afterwards."""
    python_rng, numpy_rng = random.getstate(), _numpy_rng_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        random.setstate(python_rng)
        _restore_numpy_rng_state(numpy_rng)


class CalibrationWindow:
    """The A/B window of one meter (module docstring)."""

    def __init__(self, meter):
        self.meter = meter

    def calibrate(self) -> None:
        """The A/B window (module docstring): no_sync and sync halves alternate, ABBA. At one worker, where
        there is no synchronisation to time, the same window measures the gradient noise scale instead
        (`_noise_pairs`).

        Whatever it uses of the job's state it gives back: the gradients (set aside, then put
        back), the module buffers, and the random number generators its forwards and its
        iteration of the data draw from.
        """
        m = self.meter
        pairs = m.settings.calibration_pairs
        if not (m.timing and pairs > 0 and m.forward_backward and m.calibration_data is not None):
            return
        if m.world_size == 1 and not m.settings.noise_scale:
            return
        m._calibrating = True
        m.backend.time_collectives(True)  # the A/B halves are always timed (the next step sets its own)
        # the A/B's sync halves take no gradient norms: its difference is the synchronisation's alone
        m.backend.measure_norms(False)
        try:
            with rng_untouched(m.device), m.backend.calibration():
                # listed inside the backend's calibration(): FSDP's registers the sharded parameters there,
                # the ones whose gradients the job keeps (a unit kept gathered names its unsharded ones)
                parameters = list(m.model.parameters())
                job_gradients = [q.grad for q in parameters]
                saved_buffers = {name: buffer.clone() for name, buffer in m.model.named_buffers()}
                try:
                    if m.world_size == 1:
                        self._noise_pairs(parameters, pairs)
                    else:
                        self._calibration_pairs(parameters, pairs)
                finally:
                    with torch.no_grad():
                        for name, buffer in m.model.named_buffers():
                            buffer.copy_(saved_buffers[name])
                    for q, grad in zip(parameters, job_gradients):
                        q.grad = grad
        finally:
            m._calibrating = False
            m._calib = None
            m.backend.measure_norms(m._norms_on)

    def _noise_pairs(self, parameters: list, pairs: int) -> None:
        """One worker's noise scale (scaling/noise_scale.py): of each pair of consecutive calibration batches of
        equal size B, the gradient's squared norm after the first alone (batch B) and after both accumulated
        (their mean: batch 2B). One worker has no all-reduce to read a second batch size from, nor an A/B to
        run, so its calibration window serves this instead, at the same cost (two forward+backward per pair,
        outside training time). The job's loss is taken to average over its batch (a sum scales both norms
        alike: the noise scale holds, |G|² and tr(Σ) come in its units)."""
        m = self.meter
        data = m.calibration_data(m.epoch + 1) if callable(m.calibration_data) else m.calibration_data
        batches = iter(data)
        with_grad = [q for q in parameters if q.requires_grad]
        for _ in range(pairs):
            pair = [next(batches, None), next(batches, None)]
            if pair[1] is None:
                break
            sizes = [batch_samples(batch) for batch in pair]
            if sizes[0] != sizes[1]:  # the accumulated gradient is then no mean over 2B: the last, short batch
                continue
            norms = []
            for q in with_grad:
                q.grad = None
            for batch in pair:
                m.forward_backward(batch)
                m.backend.take()  # a 1-rank DDP group's all-reduces here are no training step's
                grads = [q.grad for q in with_grad if q.grad is not None]
                norms.append(float(sum(torch.stack(torch._foreach_norm(grads)) ** 2)) if grads else float("nan"))
            # after both: the sum of the two batches' mean gradients, twice their mean over 2B
            m._noise_window.append((norms[0], norms[1] / 4.0, float(sizes[0]), 2.0 * sizes[0]))
        for q in with_grad:
            q.grad = None

    def _calibration_pairs(self, parameters: list, pairs: int) -> None:
        """The window's halves, each timed and recorded as a step of its kind; gradients cleared after each."""
        m = self.meter
        for q in parameters:
            q.grad = None
        data = m.calibration_data(m.epoch + 1) if callable(m.calibration_data) else m.calibration_data
        batches = iter(data)
        for pair in range(pairs):
            try:
                batch = next(batches)
            except StopIteration:
                break
            samples = batch_samples(batch)
            order = ("calib_nosync", "calib_sync") if pair % 2 == 0 else ("calib_sync", "calib_nosync")
            for kind in order:
                m._calib = {}
                with m.backend.no_sync() if kind == "calib_nosync" else contextlib.nullcontext():
                    start = m.clock.mark()
                    m.forward_backward(batch)
                    if kind == "calib_sync":
                        m.backend.wait_after_backward()
                        m.backend.after_step()
                    end = m.clock.mark()
                marks, m._calib = m._calib, None
                for q in parameters:
                    q.grad = None
                segments = [
                    ("data", marks.get("forward_start", start)),
                    ("forward", marks.get("forward_end", start)),
                    ("backward", end),
                ]
                m.recorder.step(
                    StepMarks(
                        m.epoch + 1,
                        m.global_step - 1,
                        kind,
                        False,
                        samples,
                        start,
                        segments,
                        [m.backend.take()],
                        pair=pair,
                        comm_rule=m.backend.comm_rule,
                    )
                )
