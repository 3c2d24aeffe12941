"""A model that holds its run at a chosen point until the test lets it go.

A test that must catch a run in a given state (interrupted while it trains, a worker killed
inside an epoch, its live metrics scraped while the workers are alive) holds the run there
instead of racing it: the state lasts until the test has acted, however fast the CPU trains.

    model.name: tests.held_model:held_small_cnn        (in the run's config, or --set on the CLI)

    gate = hold(run_dir, after_evaluations=1)          # before the run starts
    wait_for(lambda: held(gate, rank=1), ...)          # the run is held: act on it
    release(gate)                                      # the run goes on

The model is the lab's small_cnn behind a forward that, once this process has started
`after_evaluations` evaluations (calls to `.eval()`; 0: at once), waits while the gate file
exists, after writing a marker (`held(gate, rank)`) that says where it waits, with its pid.
The gate is `<run dir name>.hold` in the directory above the run directory or one of the two
above that: a sweep's run (`<out>/runs/<key>`) finds a gate made before the sweep directory
exists. A gate nobody releases fails the run after HOLD_LIMIT_S instead of hanging the suite.
A new process (a restarted worker) counts its evaluations from 0 again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from torch import nn

HOLD_LIMIT_S = 300.0
POLL_S = 0.02


def gate_path(run_dir: Path) -> Path:
    """Where `hold` puts the gate of the run in `run_dir` (beside the run directory)."""
    run_dir = Path(run_dir)
    return run_dir.parent / f"{run_dir.name}.hold"


def hold(run_dir: Path, after_evaluations: int = 0, at: Path | None = None) -> Path:
    """Make the gate for the run in `run_dir` (in `at`, default the run directory's parent); returns it."""
    run_dir = Path(run_dir)
    gate = (Path(at) / f"{run_dir.name}.hold") if at is not None else gate_path(run_dir)
    gate.parent.mkdir(parents=True, exist_ok=True)
    _forget(gate)  # a marker of an earlier hold at this gate says nothing about this one
    gate.write_text(json.dumps({"after_evaluations": after_evaluations}))
    return gate


def marker(gate: Path, rank: int) -> Path:
    return gate.with_name(f"{gate.name}.rank{rank}")


def held(gate: Path, rank: int = 0) -> dict | None:
    """The marker of `rank` held at the gate ({"pid", "evaluations"}), or None while it is not held."""
    try:
        return json.loads(marker(gate, rank).read_text())
    except (OSError, ValueError):
        return None


def release(gate: Path) -> None:
    """Let the run go on."""
    gate.unlink(missing_ok=True)
    _forget(gate)


def _forget(gate: Path) -> None:
    for stale in gate.parent.glob(f"{gate.name}.rank*"):
        stale.unlink(missing_ok=True)


def _find_gate(run_dir: Path) -> Path | None:
    name = f"{run_dir.name}.hold"
    for directory in list(run_dir.parents)[:3]:
        if (directory / name).exists():
            return directory / name
    return None


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class HeldModel(nn.Module):
    def __init__(self, model: nn.Module, run_dir: Path):
        super().__init__()
        self.model = model
        self.run_dir = Path(run_dir)
        self.evaluations = 0

    def train(self, mode: bool = True):
        if not mode:
            self.evaluations += 1
        return super().train(mode)

    def forward(self, inputs):
        if inputs.device.type != "meta":  # the FLOPs count runs a copy on the meta device: never held
            self._wait_at_gate()
        return self.model(inputs)

    def _wait_at_gate(self) -> None:
        gate = _find_gate(self.run_dir)
        if gate is None:
            return
        try:
            after = json.loads(gate.read_text())["after_evaluations"]
        except (OSError, ValueError, KeyError):
            return  # released while being read
        if self.evaluations < after:
            return
        mark = marker(gate, _rank())
        tmp = mark.with_name(mark.name + ".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "evaluations": self.evaluations}))
        tmp.replace(mark)  # whole or absent: the test reads it while it is written
        deadline = time.monotonic() + HOLD_LIMIT_S
        while gate.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"held at {gate} for {HOLD_LIMIT_S:g} s: the test never released the run")
            time.sleep(POLL_S)


def held_small_cnn(num_classes: int) -> nn.Module:
    """small_cnn, held at the gate of the run being built (module docstring)."""
    from scaling.instrument.settings import LaunchedRun
    from scaling.models import build_model

    run = LaunchedRun.from_environment()
    if run is None:  # built outside a lab run (the preflight's check of the constructor): nothing to hold
        return build_model("small_cnn", num_classes)
    return HeldModel(build_model("small_cnn", num_classes), Path(run.run_dir))
