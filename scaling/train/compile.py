"""`train.compile`: torch.compile in the lab's loop, and the time compilation takes (`compile_s`).

    forward = compile_forward(cfg, model)          # the (DDP- or FSDP2-wrapped) model, compiled
    clock = CompileClock(cfg.instrument.warmup_steps, device)
    clock.start(); ...one training step...; clock.stop()
    meter.end_epoch(..., **clock.columns())       # compile_s, compile_steps: once, in the epoch they end

Compilation happens in the first steps a process trains: dynamo traces and the backend
(`train.compile_backend`; inductor generates kernels) compiles the forward at the first call,
and AOTAutograd compiles the backward at the first backward. Those steps are the instrument's
warm-up steps (`instrument.warmup_steps`, flagged `warmup` in the step records and left out of
every steady-state figure), which is why `validate` asks for at least two of them with
`train.compile`. `CompileClock` times the warm-up steps on the host, each closed by one device
synchronisation (warm-up steps only; the steady steps are never synchronised), and reports
their time above the fastest of them: `compile_s` = sum(t_i) - n x min(t_i), the extra time
the first steps took, mostly compilation (on a GPU also cuDNN's autotuning and the allocator's
first growth, which an eager run's warm-up steps pay too). A process restarted from a
checkpoint compiles again: its clock times the first steps it trains.

How the compiled module sits with each backend: DDP: `torch.compile(ddp_model)`; dynamo
compiles the inner module and leaves DDP's forward (no_sync, the instrument's comm hook) eager,
splitting the graph at the gradient buckets (`torch._dynamo.config.optimize_ddp`) so that
all-reduces still overlap backward. FSDP2: `torch.compile(sharded_model)`; its per-module
all-gathers and reduce-scatters still run and are still recorded by the instrument's collective
hooks (tests/test_train_compile_ranks.py: 2 gloo ranks, aot_eager). Either way the
instrument watches the compiled wrapper's forward (`forward_module`): hooks on a module inside
a graph would be traced, not called.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from scaling.config import ExperimentConfig


def compile_forward(cfg: ExperimentConfig, model: nn.Module) -> nn.Module:
    """`model` (wrapped by its backend) compiled with `train.compile_backend`, or `model` itself
    without `train.compile`."""
    if not cfg.train.compile:
        return model
    return torch.compile(model, backend=cfg.train.compile_backend)


class CompileClock:
    """Host wall time of the first `steps` training steps of this process (module docstring)."""

    def __init__(self, steps: int, device: torch.device):
        self.steps, self.device = steps, device
        self.times: list[float] = []
        self._started: float | None = None
        self._reported = False

    @property
    def timing(self) -> bool:
        return len(self.times) < self.steps

    def start(self) -> None:
        if self.timing:
            self._started = time.perf_counter()

    def stop(self) -> None:
        if self.timing and self._started is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # warm-up steps only: the step's work is done, not just queued
            self.times.append(time.perf_counter() - self._started)
            self._started = None

    def columns(self) -> dict:
        """{"compile_s", "compile_steps"} once all its steps are timed (for that epoch's row), else {}."""
        if self._reported or self.timing or not self.times:
            return {}
        self._reported = True
        return {"compile_s": sum(self.times) - len(self.times) * min(self.times), "compile_steps": len(self.times)}
