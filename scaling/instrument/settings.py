"""The instrument's settings, one typed dataclass, and how a launcher hands a run to a job it runs.

`InstrumentSettings` is what `attach` takes (`settings=`, and single fields as keywords on top);
the lab's config tree holds the same fields in its `instrument:` section (scaling/config.py
`InstrumentConfig` extends this class with the lab's own), so a new setting is one field here.

A launcher that runs a user's function (`scaling run` with `train.function`) hands the run to the
`attach()` inside it through the process's environment: a `LaunchedRun` (the run directory, the
run's name and the settings) as JSON in SCALING_INSTRUMENT_RUN, read by `attach` for what its
caller does not pass. The launcher writes that run's summary itself, so `finish()` writes none.
The environment, not a module-global, because it is what a process is handed by whoever starts
it (as torchrun hands RANK), and it is readable wherever the function runs.

This module imports nothing but the standard library: the config reads it without torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Literal

LAUNCHED_RUN_ENV = "SCALING_INSTRUMENT_RUN"


# The steady-state steps timed first, whatever `collective_timing_every` (a short run's communication figures rest on
# at least these): a timed step costs the instrument a Python call per gradient bucket (docs/benchmarks.md).
FIRST_TIMED_STEPS = 10


@dataclass
class InstrumentSettings:
    """What the instrument measures and injects; the defaults are the lab's."""

    warmup_steps: int = 5
    """First steps of the run flagged `warmup` and left out of steady-state figures."""
    calibration_pairs: int = 10
    """Per epoch: (no_sync, sync) step pairs for the A/B comm overhead (with `forward_backward`); 0 = off."""
    inject_comm_delay_s: float = 0.0
    """Ground truth: extra seconds added to the last gradient bucket's all-reduce, per step."""
    inject_comm_delay_into: Literal["gradients", "parameters"] = "gradients"
    """Where `inject_comm_delay_s` goes: gradients = the collective that synchronises them, once per
    synchronised backward (DDP's last bucket, Horovod's wait, FSDP's last reduce-scatter); parameters =
    FSDP's first all-gather of every training forward (the A/B cannot see it: backends/fsdp.py)."""
    pace_idle_s: float = 0.0
    """One worker only: idle this long wherever the job at more workers would wait on a collective (after
    backward; with FSDP2, at each unit's all-gather and reduce-scatter), each idle taken out of the step's
    phases as a pause (`paused_s`). The baseline of a projection onto CPU nodes, whose compute resumes
    slower after each wait (docs/projection.md); 0 = off."""
    inject_straggler_s: float = 0.0
    """Ground truth: seconds `straggler_rank` sleeps before its backward, per training step (a straggler); the
    sleep as measured is in that rank's step records (`injected_s`)."""
    straggler_rank: int = 0
    """The rank `inject_straggler_s` slows."""
    inject_data_delay_s: float = 0.0
    """Ground truth: seconds every rank waits for each training batch, inside its fetch (a slow input pipeline);
    the wait as measured is in the step records (`injected_s`)."""
    trace_steps: int = 20
    """Training steps after the warm-up drawn in trace.json (Chrome/Perfetto); 0 = none."""
    step_timing: bool = True
    """Per-step records and the A/B window; False = epoch timing only (to measure the instrument's own cost)."""
    collective_timing_every: int = 50
    """Time each collective (DDP's per-bucket all-reduces, FSDP2's all-gathers and reduce-scatters) on every
    warm-up step, every A/B step, the first N training steps after the warm-up (at most `FIRST_TIMED_STEPS`), then
    every Nth (as DDP's own logger times its first 10 iterations, then every 100th); the other steps record their
    phases only, their communication columns empty (NaN), and run the framework's own path, no Python of the
    instrument's per collective (DDP's C++ all-reduce, FSDP2's own collective objects). Horovod's are timed on every
    step. 1 = every step. The communication figures then rest on the timed steps, whose count the summary gives
    (`comm_timed_steps`); docs/method.md, and docs/benchmarks.md for what each choice costs."""
    telemetry_interval_s: float = 1.0
    """GPU telemetry (NVML) sampling period, seconds; 0 = off."""
    noise_scale: bool = True
    """One worker: the calibration window (`calibration_pairs` pairs of batches, with `forward_backward`) measures
    the gradient noise scale, from each pair's gradient after its first batch and after both (scaling/noise_scale.py).
    At more workers the noise scale comes from the gradient before and after its collective (DDP's all-reduce,
    Horovod's, FSDP2's reduce-scatter) on the steps whose collectives are timed, whatever this says. False: one
    worker runs no calibration window."""

    def problems(self, prefix: str = "") -> list[str]:
        """Values out of range, one line each naming the key (`prefix`: where the settings sit, e.g. "instrument.")."""
        at_least_zero = (
            "warmup_steps",
            "calibration_pairs",
            "inject_comm_delay_s",
            "inject_straggler_s",
            "inject_data_delay_s",
            "pace_idle_s",
            "straggler_rank",
            "trace_steps",
            "telemetry_interval_s",
        )
        problems = [
            f"{prefix}{name} must be >= 0, got {getattr(self, name)}"
            for name in at_least_zero
            if getattr(self, name) < 0
        ]
        if self.collective_timing_every < 1:
            problems.append(f"{prefix}collective_timing_every must be >= 1, got {self.collective_timing_every}")
        if self.inject_comm_delay_into not in ("gradients", "parameters"):
            problems.append(
                f"{prefix}inject_comm_delay_into must be gradients or parameters, got {self.inject_comm_delay_into!r}"
            )
        return problems

    def instrument_only(self, **overrides) -> InstrumentSettings:
        """These settings as the instrument's own (a config section's extra fields dropped), with
        `overrides` in place; None leaves a field as it is, an unknown name is refused."""
        names = [f.name for f in dataclasses.fields(InstrumentSettings)]
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise TypeError(f"unknown instrument setting(s) {unknown}; valid: {', '.join(names)}")
        return InstrumentSettings(
            **{name: overrides[name] if overrides.get(name) is not None else getattr(self, name) for name in names}
        )


@dataclass(frozen=True)
class LaunchedRun:
    """A run a launcher drives: where its records go, its name, the instrument's settings."""

    run_dir: str
    name: str
    settings: InstrumentSettings

    @classmethod
    def from_environment(cls) -> LaunchedRun | None:
        """The run this process's launcher handed it, or None (a job on its own)."""
        text = os.environ.get(LAUNCHED_RUN_ENV)
        if not text:
            return None
        data = json.loads(text)
        return cls(data["run_dir"], data["name"], InstrumentSettings(**data["settings"]))

    @contextlib.contextmanager
    def in_environment(self):
        """Hand this run to the `attach()` calls made inside the block (in this process and those it starts)."""
        previous = os.environ.get(LAUNCHED_RUN_ENV)
        os.environ[LAUNCHED_RUN_ENV] = json.dumps(
            {
                "run_dir": self.run_dir,
                "name": self.name,
                "settings": dataclasses.asdict(self.settings.instrument_only()),
            }
        )
        try:
            yield self
        finally:
            if previous is None:
                os.environ.pop(LAUNCHED_RUN_ENV, None)
            else:
                os.environ[LAUNCHED_RUN_ENV] = previous
