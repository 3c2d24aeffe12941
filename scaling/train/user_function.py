"""Run a user's own train function as a lab run's per-worker loop (`train.function` in a config).

The function is a Ray Train `train_func(config)` that uses the public instrument
(`scaling.instrument.attach`); the lab's launcher calls it on every worker in place of the
lab's loop (scaling/train/loop.py), after the same per-worker set-up (CPU pinning, one torch
thread per reserved CPU). It receives:

    config = {"batch_size": train.per_worker_batch, "epochs": train.max_epochs, "lr": optim.lr,
              "seed": train.seed, "target_accuracy": train.target_accuracy,
              **train.function_config}          # the config's own keys win

and `attach()` inside it takes the run directory, the run's name and the `instrument.*` settings
from the lab (`lab_context`: a `LaunchedRun` in the worker's environment,
scaling/instrument/settings.py), and its identity and live metrics from the lab's provider of
instrument parts (scaling/launch/instrument_parts.py), so the same script runs on its own or
under `scaling run` / `scaling sweep` unchanged.
"""

from __future__ import annotations

from scaling.config import ExperimentConfig
from scaling.import_path import load_callable
from scaling.instrument.settings import LaunchedRun


def function_config(cfg: ExperimentConfig) -> dict:
    return {
        "batch_size": cfg.train.per_worker_batch,
        "epochs": cfg.train.max_epochs,
        "lr": cfg.optim.lr,
        "seed": cfg.train.seed,
        "target_accuracy": cfg.train.target_accuracy,
        **cfg.train.function_config,
    }


def lab_context(cfg: ExperimentConfig, run_dir):
    """The run handed to `attach()` calls inside it (a context manager): directory, name, `instrument.*` settings."""
    return LaunchedRun(str(run_dir), cfg.name, cfg.instrument.instrument_only()).in_environment()


def run_user_function(cfg: ExperimentConfig):
    """Call `cfg.train.function` on this worker (inside `lab_context`; module docstring)."""
    train_func = load_callable(cfg.train.function, "train.function", required_args=1)
    return train_func(function_config(cfg))
