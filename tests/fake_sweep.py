"""Fake sweep directories on disk, laid out as `scaling sweep` writes them.

`make_fake_sweep`: generated records. Worker counts 1, 2, 4 x 3 repeats; each run's summary
is computed from generated epochs and steps by the real `summarize_run`. w4-r1 never reaches
the target (max_epochs), w4-r2 failed after 2 epochs (its summary keeps the partial figures of
the epochs it ran, `FAILED_PARTIAL`), and w8-r0 is still going (run directory without
summary.json, absent from runs.parquet). A larger global batch needs more epochs, so TTA
scales worse than throughput. Repeats differ in step time (`FORWARD_EXTRA_S`): r1 fastest,
r0 slowest, r2 the median.

`make_known_sweep`: runs whose summary figures are given as literals (no generated records,
no summarize_run), for checking the report's cells against hand-computed values.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from scaling.analysis.run_metrics import summarize_run
from scaling.results import SweepDir, run_key, summary_row

TARGET = 0.84
MAX_EPOCHS = 10
WORKERS = (1, 2, 4)
REPEATS = 3
FAILED, NOT_REACHED, INCOMPLETE = "w4-r2", "w4-r1", "w8-r0"
# Extra forward time per step by repeat: step_s = 59 ms + this at one worker (r0 65, r1 59, r2 61 ms),
# so the three 1-worker runs are the slowest, the fastest and the median one (the mean is 61.67 ms).
FORWARD_EXTRA_S = (0.006, 0.0, 0.002)
# The failed run's summary: what it measured before it died, far from every other w4 run's
# figures (a dying worker slowed its steps; it had crossed the target before it died), so
# that counting it anywhere would move a median or mean visibly.
FAILED_PARTIAL = dict(
    time_per_epoch_s=25.0,
    throughput_samples_per_s=330.0,
    tta_s=3.0,
    tta_wall_s=4.0,
    epochs_to_target=1,
    comm_overhead_pct=95.0,
    exposed_comm_pct=90.0,
    step_s=0.5,
    data_s=0.001,
    forward_s=0.025,
    backward_s=0.471,
    optimizer_s=0.003,
    exposed_comm_s=0.45,
)


def _epochs(num_workers: int, repeat: int, n_epochs: int | None = None, plateau: float = 0.93) -> pd.DataFrame:
    rng = np.random.default_rng(100 * num_workers + repeat)
    rate = (
        0.45 / (1 + 0.35 * np.log2(num_workers)) * (1 + 0.08 * rng.standard_normal())
    )  # a larger global batch learns less per epoch
    rows, elapsed_train, elapsed_wall = [], 0.0, 0.0
    for epoch in range(1, MAX_EPOCHS + 1):
        train_s = 8.0 / num_workers**0.85 * (1.3 if epoch == 1 else 1.0) * (1 + 0.04 * rng.standard_normal())
        accuracy = plateau - 0.6 * np.exp(-rate * epoch) + 0.01 * rng.standard_normal()
        elapsed_train += train_s
        elapsed_wall += train_s + 0.6
        rows.append(
            dict(
                epoch=epoch,
                train_s=train_s,
                eval_s=0.4,
                calibration_s=0.2,
                train_loss=2.0 * np.exp(-0.3 * epoch),
                val_accuracy=accuracy,
                samples=8192,
                throughput_samples_per_s=8192 / train_s,
                elapsed_train_s=elapsed_train,
                elapsed_wall_s=elapsed_wall,
                lr=0.05 * num_workers,
            )
        )
        if n_epochs is not None and epoch >= n_epochs:
            break
        if n_epochs is None and accuracy >= TARGET:
            break
    return pd.DataFrame(rows)


def _steps(num_workers: int, repeat: int = 0) -> pd.DataFrame:
    exposed = 0.0 if num_workers == 1 else 0.004 * np.log2(2 * num_workers)
    forward = 0.025 + FORWARD_EXTRA_S[repeat]
    rows = []
    for rank in range(num_workers):
        for step in range(8):
            backward = 0.030 + exposed
            rows.append(
                dict(
                    epoch=1,
                    step=step,
                    rank=rank,
                    node_rank=rank // 2,
                    local_rank=rank % 2,
                    kind="train",
                    pair=-1,
                    warmup=step < 2,
                    samples=64,
                    data_s=0.001,
                    forward_s=forward,
                    backward_s=backward,
                    optimizer_s=0.003,
                    step_s=0.001 + forward + backward + 0.003,
                    allreduce_s=2 * exposed,
                    exposed_comm_s=exposed,
                    compute_s=forward + backward - exposed + 0.003,
                    num_buckets=0 if num_workers == 1 else 2,
                )
            )
        if num_workers > 1:
            for pair in range(4):
                for kind, fb in (("calib_nosync", 0.055), ("calib_sync", 0.055 + 1.5 * exposed)):
                    rows.append(
                        dict(
                            epoch=1,
                            step=7,
                            rank=rank,
                            node_rank=rank // 2,
                            local_rank=rank % 2,
                            kind=kind,
                            pair=pair,
                            warmup=False,
                            samples=64,
                            data_s=0.0,
                            forward_s=0.025,
                            backward_s=fb - 0.025,
                            optimizer_s=0.0,
                            step_s=fb,
                            allreduce_s=0.0,
                            exposed_comm_s=0.0,
                            compute_s=fb,
                            num_buckets=0 if kind == "calib_nosync" else 2,
                        )
                    )
    return pd.DataFrame(rows)


def _summary(
    key: str,
    num_workers: int,
    repeat: int,
    epochs: pd.DataFrame,
    steps: pd.DataFrame,
    status=None,
    error=None,
    backend: str = "gloo",
    cluster: str | None = None,
) -> dict:
    # small_cnn's counted FLOPs and this machine's measured 1-thread roofs (compute_profile.json)
    profile = {
        "train_flops": 17_513_472.0,
        "forward_flops": 6_132_736.0,
        "train_bytes_per_sample": 2_038_933.0,
        "peak_flops_per_s": 1.0e11,
        "peak_source": "measured",
        "mem_bytes_per_s": 1.0e10,
    }
    figures = summarize_run(steps, epochs, TARGET, num_workers, profile)
    figures.pop("ranks", None)  # the per-rank table: ranks.parquet, not the summary
    if status is None:
        status = "reached_target" if figures["epochs_to_target"] is not None else "max_epochs"
    num_nodes = int(steps["node_rank"].nunique())
    return {
        "schema_version": 1,
        "run_id": key,
        "name": "quickstart",
        "model": "small_cnn",
        "dataset": "embedded",
        "backend": backend,
        "launcher": "ray",
        "num_workers": num_workers,
        "num_nodes": num_nodes,
        "workers_per_node": num_workers / num_nodes,
        "per_worker_batch": 64,
        "global_batch": 64 * num_workers,
        "seed": repeat,
        "status": status,
        "error": error,
        "target_accuracy": TARGET,
        **figures,
        "inject_comm_delay_s": 0.0,
        "node_price_per_hour": 0.5,
        "cluster": cluster,
        "started_at": "2025-01-01T00:00:00+00:00",
        "run_wall_s": float(epochs["elapsed_wall_s"].iloc[-1]) + 5.0,
        "versions": {"python": "3.11", "torch": "2.13.0", "ray": "2.60.0"},
        "hardware": {"hostname": "test", "cpu_model": "Test CPU", "cpu_count": 2, "gpu_name": None, "gpu_count": 0},
    }


def make_fake_sweep(
    root: Path, with_index: bool = True, name: str = "qs", backend: str = "gloo", cluster: str | None = None
) -> Path:
    """Write the fake sweep under root/<name> and return its path (runs of `backend`, summaries naming `cluster`)."""
    sweep = SweepDir(Path(root) / name)
    sweep.runs_path.mkdir(parents=True)
    sweep.spec_path.write_text("base: {name: quickstart}\nsweep: {workers: [1, 2, 4], repeats: 3, axes: {}}\n")
    rows = []
    for num_workers in WORKERS:
        for repeat in range(REPEATS):
            key = run_key(num_workers, {}, repeat)
            run = sweep.run(key)
            run.path.mkdir()
            steps = _steps(num_workers, repeat)
            if key == FAILED:
                epochs = _epochs(num_workers, repeat, n_epochs=2)
                summary = _summary(
                    key,
                    num_workers,
                    repeat,
                    epochs,
                    steps,
                    status="failed",
                    error="RuntimeError: worker 3 died (simulated)",
                    backend=backend,
                    cluster=cluster,
                )
                summary.update(FAILED_PARTIAL)
            elif key == NOT_REACHED:
                epochs = _epochs(num_workers, repeat, n_epochs=MAX_EPOCHS, plateau=0.80)
                summary = _summary(key, num_workers, repeat, epochs, steps, backend=backend, cluster=cluster)
            else:
                epochs = _epochs(num_workers, repeat)
                summary = _summary(key, num_workers, repeat, epochs, steps, backend=backend, cluster=cluster)
            run.config_path.write_text(f"name: quickstart\nworkers: {{num_workers: {num_workers}}}\n")
            epochs.to_parquet(run.epochs_path, index=False)
            steps.to_parquet(run.steps_path, index=False)
            run.summary_path.write_text(json.dumps(summary, indent=2))
            rows.append(summary_row(summary, key, repeat))
    # a run still going: config and a first epoch, no summary, not in the index
    running = sweep.run(INCOMPLETE)
    running.path.mkdir()
    running.config_path.write_text("name: quickstart\nworkers: {num_workers: 8}\n")
    _epochs(8, 0, n_epochs=1).to_parquet(running.epochs_path, index=False)
    if with_index:
        pd.DataFrame(rows).to_parquet(sweep.index_path, index=False)
    return sweep.path


def make_known_sweep(root: Path, runs: list[dict], name: str = "known") -> Path:
    """A sweep under root/<name> whose run summaries hold the given figures as they are.

    runs: one dict per run with at least num_workers and repeat, plus any summary fields
    (time_per_epoch_s, tta_s, step_s, ...); the rest of the summary is filled in. Each run
    gets a two-epoch epochs.parquet (for the accuracy curves) and runs.parquet lists them all.
    """
    sweep = SweepDir(Path(root) / name)
    sweep.runs_path.mkdir(parents=True)
    sweep.spec_path.write_text(f"base: {{name: {name}}}\nsweep: {{workers: [1, 2], repeats: 2, axes: {{}}}}\n")
    rows = []
    for given in runs:
        n, repeat = int(given["num_workers"]), int(given["repeat"])
        key = run_key(n, {}, repeat)
        summary = {
            "schema_version": 1,
            "run_id": key,
            "name": name,
            "model": "small_cnn",
            "dataset": "embedded",
            "backend": "gloo",
            "launcher": "ray",
            "num_workers": n,
            "num_nodes": 1,
            "workers_per_node": n,
            "per_worker_batch": 32,
            "global_batch": 32 * n,
            "seed": repeat,
            "status": "reached_target",
            "error": None,
            "target_accuracy": 0.9,
            "epochs_run": 2,
            "best_accuracy": 0.95,
            "node_price_per_hour": 0.0,
            "cluster": None,
            "hardware": {"hostname": "test", "cpu_model": "Test CPU", "cpu_count": 2, "gpu_name": None, "gpu_count": 0},
            **{k: v for k, v in given.items() if k != "repeat"},
        }
        run = sweep.run(key)
        run.path.mkdir()
        run.config_path.write_text(f"name: {name}\nworkers: {{num_workers: {n}}}\n")
        pd.DataFrame({"epoch": [1, 2], "val_accuracy": [0.5, 0.95], "train_s": [1.0, 1.0]}).to_parquet(
            run.epochs_path, index=False
        )
        run.summary_path.write_text(json.dumps(summary, indent=2))
        rows.append(summary_row(summary, key, repeat))
    pd.DataFrame(rows).to_parquet(sweep.index_path, index=False)
    return sweep.path
