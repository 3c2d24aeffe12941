"""Run a user's own train function as a lab run's per-worker loop (`train.function` in a config).

The function is a Ray Train `train_func(config)` that uses the public instrument
(`scaling.instrument.attach`); the lab's launcher calls it on every worker in place of the
lab's loop (scaling/train/loop.py), after the same per-worker set-up (CPU pinning, one torch
thread per reserved CPU). It receives:

    config = {"batch_size": train.per_worker_batch, "epochs": train.max_epochs, "lr": optim.lr,
              "seed": train.seed, "target_accuracy": train.target_accuracy,
              **train.function_config}          # the config's own keys win

and `attach()` inside it takes the run directory and the `instrument.*` settings from the lab
(`scaling.instrument.meter.lab_settings`), so the same script runs on its own or under
`scaling run` / `scaling sweep` unchanged.
"""

from __future__ import annotations

import contextlib

from scaling.config import ExperimentConfig
from scaling.import_path import load_callable
from scaling.instrument import meter


def function_config(cfg: ExperimentConfig) -> dict:
    return {
        "batch_size": cfg.train.per_worker_batch,
        "epochs": cfg.train.max_epochs,
        "lr": cfg.optim.lr,
        "seed": cfg.train.seed,
        "target_accuracy": cfg.train.target_accuracy,
        **cfg.train.function_config,
    }


@contextlib.contextmanager
def lab_context(cfg: ExperimentConfig, ctx, run_dir):
    """The run directory, `instrument.*` settings and worker identity for `attach()` inside a lab run."""
    meter.lab_settings.clear()
    meter.lab_settings.update(
        run_dir=str(run_dir), name=cfg.name, local_rank=ctx.local_rank, node_rank=ctx.node_rank,
        warmup_steps=cfg.instrument.warmup_steps, calibration_pairs=cfg.instrument.calibration_pairs,
        inject_comm_delay_s=cfg.instrument.inject_comm_delay_s, step_timing=cfg.instrument.step_timing,
        telemetry_interval_s=cfg.instrument.telemetry_interval_s, target_accuracy=cfg.train.target_accuracy,
        inject_straggler_s=cfg.instrument.inject_straggler_s, straggler_rank=cfg.instrument.straggler_rank,
        trace_steps=cfg.instrument.trace_steps,
    )
    try:
        yield
    finally:
        meter.lab_settings.clear()


def run_user_function(cfg: ExperimentConfig):
    """Call `cfg.train.function` on this worker (inside `lab_context`; module docstring)."""
    train_func = load_callable(cfg.train.function, "train.function", required_args=1)
    return train_func(function_config(cfg))
