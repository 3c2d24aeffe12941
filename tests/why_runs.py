"""Generated run directories with one planted fault each, for `scaling why` (tests/test_why.py).

A run of 2 ranks (or more), 3 epochs of 40 steps, each step built the way a synchronous step
is: every rank loads its batch (`data_s`), computes forward and backward, then waits at the
all-reduce for the slowest rank (`waiting_s`) and for the transfer (`transfer_s`); both are its
exposed communication, inside backward. The figures are the real `summarize_run`'s. Noise: 1 ms
(normal, seeded) on each rank's compute per step. Calibration pairs per epoch and rank: the
synchronised half costs the transfer plus `interference_s` more than the unsynchronised one.

Faults (keyword arguments of `make_run`, all 0 by default: a clean job whose only cost is a
1 ms transfer): `data_s` (every rank's input wait), `transfer_s` (exposed communication),
`slow_rank_data_s` / `slow_rank_compute_s` (rank 1 slower in its input or its compute: a
straggler), `interference_s` (with `overlap_s`, the time an all-reduce is in flight while backward
computes, from which the overlap slowdown is read; `bucket_cap_mb` small enough for the projection's
buckets to overlap backward too), `micro_batches` with `synced` (accumulation syncing every micro-batch).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import yaml

from scaling.analysis.run_metrics import summarize_run
from scaling.results import RunDir, rank_part_path, write_parquet_atomic

EPOCHS, STEPS, PAIRS, WARMUP = 3, 40, 4, 5
FORWARD_S, BACKWARD_S, OPTIMIZER_S = 0.030, 0.060, 0.002
PARAMETERS = 2_000_000
BATCH = 64


def make_run(
    path,
    *,
    workers: int = 2,
    data_s: float = 0.0005,
    transfer_s: float = 0.001,
    slow_rank_data_s: float = 0.0,
    slow_rank_compute_s: float = 0.0,
    interference_s: float = 0.0,
    overlap_s: float = 0.0,
    bucket_cap_mb: float = 25.0,
    micro_batches: int = 1,
    synced: int = 1,
    per_worker_batch: int = BATCH,
    compute_scale: float = 1.0,
    precision: str = "bf16",
    seed: int = 0,
) -> RunDir:
    rng = np.random.default_rng(seed)
    run = RunDir(path)
    run.steps_path.mkdir(parents=True)
    frames, epochs = [], []
    # a sync's cost paid once per synchronised micro-batch; compute per micro-batch, scaled to the batch
    work = compute_scale * per_worker_batch / BATCH
    for epoch in range(1, EPOCHS + 1):
        index = np.arange(STEPS) + (epoch - 1) * STEPS
        own = {}
        for rank in range(workers):
            data = np.full(STEPS, data_s * micro_batches) + (slow_rank_data_s if rank == 1 else 0.0)
            forward = np.full(STEPS, FORWARD_S * work * micro_batches) + np.abs(rng.normal(0, 0.0005, STEPS))
            backward = np.full(STEPS, BACKWARD_S * work * micro_batches) + np.abs(rng.normal(0, 0.0005, STEPS))
            backward += slow_rank_compute_s if rank == 1 else 0.0
            own[rank] = (data, forward, backward)
        ready = np.max([sum(parts) for parts in own.values()], axis=0)
        last = np.argmax([sum(parts) for parts in own.values()], axis=0)
        for rank, (data, forward, backward) in own.items():
            waiting = ready - (data + forward + backward)
            transfer = np.full(STEPS, transfer_s * synced)
            exposed = waiting + transfer
            optimizer = np.full(STEPS, OPTIMIZER_S)
            step = data + forward + backward + exposed + optimizer + interference_s * synced
            train = pd.DataFrame(
                {
                    "epoch": epoch,
                    "step": index,
                    "rank": rank,
                    "kind": "train",
                    "warmup": index < WARMUP,
                    "pair": -1,
                    "step_s": step,
                    "data_s": data,
                    "forward_s": forward,
                    "backward_s": backward + exposed + interference_s * synced,
                    "optimizer_s": optimizer,
                    "compute_s": forward + backward,
                    "allreduce_s": exposed + overlap_s * synced,
                    "exposed_comm_s": exposed,
                    "waiting_s": waiting,
                    "transfer_s": transfer,
                    "straggler_rank": last,
                    "micro_batches": float(micro_batches),
                    "synced_micro_batches": float(synced),
                }
            )
            base = FORWARD_S * work + BACKWARD_S * work
            pairs = np.arange(PAIRS)
            calib = pd.DataFrame(
                {
                    "epoch": epoch,
                    "step": -1,
                    "rank": rank,
                    "kind": np.repeat(["calib_nosync", "calib_sync"], PAIRS),
                    "warmup": False,
                    "pair": np.tile(pairs, 2),
                    "step_s": np.concatenate([np.full(PAIRS, base), np.full(PAIRS, base + transfer_s + interference_s)])
                    + np.abs(rng.normal(0, 0.0002, 2 * PAIRS)),
                    "exposed_comm_s": np.concatenate([np.full(PAIRS, np.nan), np.full(PAIRS, transfer_s)]),
                }
            )
            part = pd.concat([train, calib], ignore_index=True)
            part.to_parquet(rank_part_path(run.steps_path, rank, epoch))
            frames.append(part)
        train_s = float(np.mean([f["step_s"].sum() for f in frames[-workers:]]) / 1)
        epochs.append(
            {
                "epoch": epoch,
                "train_s": train_s,
                "samples": STEPS * workers * per_worker_batch * micro_batches,
                "steps": STEPS,
                "calibration_s": 0.5,
                "eval_s": 0.2,
                "val_accuracy": 0.5,
                "elapsed_wall_s": 1.0 * epoch,
            }
        )
    epochs = pd.DataFrame(epochs)
    write_parquet_atomic(run.epochs_path, epochs)
    profile = {
        "parameters": PARAMETERS,
        "train_flops": 6.0 * PARAMETERS,
        "forward_flops": 2.0 * PARAMETERS,
        "backward_flops": 4.0 * PARAMETERS,
        "peak_flops_per_s": 1e11,
        "precision": "fp32",
    }
    run.compute_profile_path.write_text(json.dumps(profile))
    run.config_path.write_text(yaml.safe_dump({"instrument": {"ddp_bucket_cap_mb": bucket_cap_mb}}))
    figures = summarize_run(pd.concat(frames, ignore_index=True), epochs, None, workers, profile)
    ranks = figures.pop("ranks")
    write_parquet_atomic(run.path / "ranks.parquet", ranks)
    summary = {
        "num_workers": workers,
        "per_worker_batch": per_worker_batch,
        "global_batch": workers * per_worker_batch,
        "precision": precision,  # bf16 by default: no fp32 suspicion unless a test plants it
        "model": "generated",
        "status": "max_epochs",
        "grad_compression": "none",
        "run_wall_s": float(epochs["train_s"].sum() + epochs["calibration_s"].sum() + epochs["eval_s"].sum()) + 0.1,
        "hardware": {"cpu_model": "generated"},
        **figures,
    }
    run.summary_path.write_text(json.dumps(summary, default=float))
    return run
