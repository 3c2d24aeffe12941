"""What every backend adapter answers: the interface the instrument and the lab's loop call.

`Backend` holds the single process's answers (nothing communicates, nothing to time, the
model's and optimizer's own state); an adapter overrides what differs for its framework
(scaling/instrument/backends/__init__.py lists them).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from scaling.instrument.timing import ALL_REDUCE_RULE, BucketMarks, Clock, CommRule


class Backend:
    """One job's data-parallel framework, as the instrument sees it."""

    kind = ""  # its short name in a run's job.json `data_parallel` (ddp, fsdp, horovod, local)
    wraps = ""  # what the adapter claims, for the refusal of a job none claims ("a DistributedDataParallel model")
    # A 1-rank job of this kind still communicates, and its communication is timed (DDP on a
    # 1-rank group: the GPU ground truth, docs/gpu.md). Otherwise only > 1 rank communicates.
    communicates_alone = False
    # Whether the backend idles a paced 1-worker run (`pace_idle_s`) at its own collective points
    # (`set_pace`); otherwise the meter idles once per step, after backward.
    paces_collectives = False
    # The wait for backward's communication moves to the optimizer step's start even when steps
    # are not timed (Horovod: its step would otherwise all-reduce a second time).
    waits_at_step = False
    # Where `inject_comm_delay_s` can go (the settings' `inject_comm_delay_into`): "gradients", the
    # collective that synchronises them (DDP's last bucket, Horovod's wait, FSDP's last reduce-scatter);
    # "parameters", FSDP's all-gathers.
    injectable: tuple[str, ...] = ("gradients",)
    # Its collectives can go untimed on the steps the meter does not sample (DDP's comm hook:
    # scaling/instrument/timing.py `CommTimingHook`); otherwise every step's are timed.
    samples_collectives = False

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        # whether the loop cleared the gradients between two batches is asked of this parameter
        self._grad_probe = next((q for q in self.plain_model.parameters() if q.requires_grad), None)

    @classmethod
    def claims(cls, model, optimizer) -> bool:
        """Whether this adapter is the one for a job training `model` with `optimizer`."""
        raise NotImplementedError

    @property
    def plain_model(self) -> torch.nn.Module:
        """The user's module inside any wrapper (FLOPs, the model's name, checkpoints)."""
        return self.model

    def install_timer(self, clock: Clock, inject_delay_s: float = 0.0, inject_into: str = "gradients") -> None:
        """Time every collective from now on (`inject_delay_s`: the ground truth's delay, into `inject_into`)."""
        if inject_delay_s:
            raise ValueError(
                "inject_comm_delay_s needs communication: a DDP model or a Horovod optimizer at world size > 1"
            )

    @property
    def comm_rule(self) -> CommRule:
        """How a step's collectives become its figures (timing.py): the all-reduces' rule here."""
        return ALL_REDUCE_RULE

    def no_sync(self):
        """A forward+backward inside this block synchronises no gradients (the A/B window's no_sync half)."""
        return contextlib.nullcontext()

    def calibration(self):
        """Around the whole A/B window: sets aside, and puts back after, gradient state of the job's
        that the meter cannot see in `model.parameters()`. Nothing here."""
        return contextlib.nullcontext()

    def gradients_cleared(self) -> bool:
        """Whether the job holds no gradients (zero_grad set them to None): after a batch with no
        optimizer step, a step GradScaler skipped rather than accumulation (meter.py's rule)."""
        probe = self._grad_probe
        return probe is None or probe.grad is None

    def wait_after_backward(self) -> None:
        """Wait (timed) for the all-reduces backward launched. Nothing launched here."""

    def after_step(self) -> None:
        """The optimizer step ended: undo what `wait_after_backward` changed. Nothing here."""

    def take(self) -> list[BucketMarks]:
        """The all-reduces' marks since the last take."""
        return []

    def time_collectives(self, timed: bool) -> None:
        """Time the collectives from now on, or not (`samples_collectives`); nothing to choose here."""

    # whether `take_norms`'s after-norms are this rank's shard of the averaged gradient (FSDP2's), summed over
    # the ranks by the meter, rather than the whole averaged gradient (DDP's)
    norms_sharded = False

    def measure_norms(self, on: bool) -> None:
        """Take the gradient's squared norms before and after its collective on the timed steps from now on, or
        not (the noise scale: scaling/noise_scale.py). A backend that cannot read them (nothing here) ignores it,
        and its `take_norms` gives None."""

    def take_norms(self) -> tuple[list, list, float] | None:
        """The squared norms since the last take, ([before, per bucket], [after], factor of before): timing.py's
        `take_norms`; None where none were taken."""
        return None

    def take_host_s(self) -> float:
        """Seconds its collective timer spent in its own Python since the last take (the instrument's cost)."""
        return 0.0

    def second_opinion(self, warmup_steps: int):
        """The framework's own communication timers (`before_forward()`, `after_forward()`,
        `epoch_figures()`), or None."""
        return None

    def compute_dtype(self) -> torch.dtype | None:
        """The dtype the backend makes the model compute in (FSDP2's mixed-precision policy); None:
        the parameters' own, or autocast's, which the meter sees itself."""
        return None

    def set_pace(self, pace) -> None:
        """Call `pace()` wherever the job at more workers would wait on a collective (paces_collectives)."""
        raise NotImplementedError

    def sharded_units(self) -> list[tuple[str, int, bool]] | None:
        """(module, parameters, resharded after forward) of each unit the backend shards and gathers
        as one (FSDP2's `fully_shard`ed modules, the root first); None: nothing is sharded. Recorded in
        compute_profile.json, so a projection knows the units of a run that issued no collectives
        (FSDP2 on one worker)."""
        return None

    def per_step_settings(self) -> dict:
        """The wrapper's settings that cost work in every step whatever the job computes (job.json
        `per_step_settings`, which `scaling why` names): {} where the backend has none to say."""
        return {}

    def observed_backend(self) -> str:
        """The communication backend a run's records name (job.json, summary.json)."""
        return dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"

    def checkpoint_state(self) -> dict:
        """The model's and optimizer's state for a checkpoint."""
        return {"model": self.plain_model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_checkpoint_state(self, state: dict) -> None:
        """Restore `checkpoint_state()`'s model and optimizer (a restarted run, before its first step)."""
        self.plain_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
