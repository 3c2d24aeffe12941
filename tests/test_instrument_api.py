"""The public instrument (`scaling.instrument.attach`) on a job that is not the lab's.

Two gloo processes run a hand-written DDP loop (its own model, its own batches) with the
instrument attached, as a user's torchrun script would. What is proven:
- the phases are where the job spends its time: a loader that sleeps 40 ms shows in `data_s`,
  a model whose forward sleeps 30 ms in `forward_s`, a 20 ms pause the loop makes before
  `optimizer.step()` in `backward_s` (each at least its sleep, and not in the neighbouring
  phase); the steps tile the epoch's training time (nothing left out between them);
- a comm hook the user registers after attaching is kept (it runs, once per bucket) and timed
  (the recorded buckets are its calls); one registered before attaching is refused in one line;
- without a forward+backward function the summary's A/B figure is absent, with its reason,
  never a zero; with one, calibration pairs are recorded;
- the run directory has the lab's contract, so the lab's summary reads it.
"""

from __future__ import annotations

import json
import os
import time

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from scaling.launch.local_cluster import free_port

DATA_SLEEP_S, FORWARD_SLEEP_S, PAUSE_S = 0.04, 0.03, 0.02
STEPS = 6


class SlowForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(16, 4)

    def forward(self, x):
        time.sleep(FORWARD_SLEEP_S)
        return self.layer(x)


def slow_batches(rank: int):
    generator = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        time.sleep(DATA_SLEEP_S)
        yield torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)


def _job(rank: int, port: int, run_dir: str, mode: str, out: str) -> None:
    from scaling import instrument

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DistributedDataParallel(SlowForward())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = {"hook": 0}

    def counting_hook(state, bucket):
        calls["hook"] += 1
        return allreduce_hook(state, bucket)

    result = {}
    if mode == "hook_before":
        model.register_comm_hook(None, counting_hook)
        try:
            instrument.attach(model, optimizer, run_dir=run_dir)
        except ValueError as exc:
            result["error"] = str(exc)
    else:
        loss_fn = nn.CrossEntropyLoss()

        def forward_backward(batch):
            loss_fn(model(batch[0]), batch[1]).backward()

        with_ab = mode == "with_ab"
        meter = instrument.attach(model, optimizer, run_dir=run_dir, warmup_steps=1, calibration_pairs=2,
                                  forward_backward=forward_backward if with_ab else None,
                                  calibration_data=list(slow_batches(rank))[:2] if with_ab else None)
        model.register_comm_hook(None, counting_hook)  # after attaching: kept and timed
        for x, y in meter.batches(slow_batches(rank)):
            loss = loss_fn(model(x), y)
            loss.backward()
            time.sleep(PAUSE_S)  # e.g. gradient clipping: before the optimizer step, so backward's
            optimizer.step()
            optimizer.zero_grad()
        meter.end_epoch(val_accuracy=0.5)
        result["hook_calls"] = calls["hook"]
        result["summary"] = meter.finish()
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def _run(tmp_path, mode: str) -> tuple[list[dict], str]:
    port = free_port()
    run_dir = str(tmp_path / mode)
    out = str(tmp_path / f"result-{mode}")
    mp.start_processes(_job, args=(port, run_dir, mode, out), nprocs=2, join=True, start_method="spawn")
    return [json.loads(open(f"{out}.rank{r}.json").read()) for r in range(2)], run_dir


def test_phases_hooks_and_records_of_a_users_ddp_loop(tmp_path):
    results, run_dir = _run(tmp_path, "with_ab")
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    epochs = pd.read_parquet(os.path.join(run_dir, "epochs.parquet"))
    train = steps[steps["kind"] == "train"]
    assert sorted(train["rank"].unique()) == [0, 1] and len(train) == 2 * STEPS
    assert list(train.loc[train["rank"] == 0, "warmup"]) == [True] + [False] * (STEPS - 1)
    # each phase holds its own sleep, and not the neighbour's
    assert (train["data_s"] >= DATA_SLEEP_S).all() and (train["data_s"] < DATA_SLEEP_S + FORWARD_SLEEP_S).all()
    assert (train["forward_s"] >= FORWARD_SLEEP_S).all() and (train["forward_s"] < FORWARD_SLEEP_S + DATA_SLEEP_S).all()
    assert (train["backward_s"] >= PAUSE_S).all()
    # the steps tile rank 0's training time: their sum is within what the loop's own overhead could leave out
    rank0 = train[train["rank"] == 0]
    assert rank0["step_s"].sum() <= epochs["train_s"].iloc[0] <= 1.1 * rank0["step_s"].sum()
    # the user's hook ran once per bucket, and those calls are the timed buckets
    assert results[0]["hook_calls"] == train.loc[train["rank"] == 0, "num_buckets"].sum() + \
        steps.loc[(steps["rank"] == 0) & (steps["kind"] == "calib_sync"), "num_buckets"].sum()
    assert (train["num_buckets"] == 1).all() and (train["allreduce_s"] > 0).all()
    # A/B: pairs recorded; the summary is the lab's, written by rank 0 at finish()
    assert set(steps["kind"]) == {"train", "calib_sync", "calib_nosync"}
    summary = results[0]["summary"]
    assert results[1]["summary"] is None
    assert json.load(open(os.path.join(run_dir, "summary.json"))) == summary
    assert summary["num_workers"] == 2 and summary["model"] == "SlowForward" and summary["launcher"] == "own"
    assert summary["per_worker_batch"] == 8 and summary["ab_calibration"] is True
    assert summary["comm_delta_s"] is not None and summary["comm_overhead_note"] is None
    assert summary["step_s"] == pytest.approx(train[~train["warmup"]]["step_s"].mean())


def test_without_forward_backward_the_ab_figure_is_absent(tmp_path):
    results, run_dir = _run(tmp_path, "no_ab")
    summary = results[0]["summary"]
    assert summary["comm_overhead_pct"] is None and summary["comm_delta_s"] is None
    assert "no forward_backward" in summary["comm_overhead_note"]
    assert summary["exposed_comm_s"] is not None  # the hook still timed every bucket


def test_a_comm_hook_registered_before_attaching_is_refused_in_one_line(tmp_path):
    results, _ = _run(tmp_path, "hook_before")
    message = results[0]["error"]
    assert "counting_hook" in message and "attach the instrument first" in message and "\n" not in message
