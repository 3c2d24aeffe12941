"""The public instrument (`scaling.instrument.attach`) on a job that is not the lab's.

Two gloo processes run a hand-written DDP loop (its own model, its own batches) with the
instrument attached, as a user's torchrun script would. What is proven:
- the phases are where the job spends its time: a loader that sleeps 40 ms shows in `data_s`,
  a model whose forward sleeps 30 ms in `forward_s`, a 20 ms pause the loop makes before
  `optimizer.step()` in `backward_s`: each sleep's own interval (the job's `perf_counter`
  around it) lies inside its step's phase, as the step's start (`start_t`) and phase durations
  place it, so no phase holds a neighbour's sleep; the steps tile the epoch's training time
  (each starts where the previous ended; what `train_s` holds beyond them lies before the
  first or after the last, inside the job's own loop);
- a comm hook the user registers after attaching is kept (it runs, once per bucket) and timed
  (the recorded buckets are its calls); one registered before attaching is refused in one line;
- without a forward+backward function the summary's A/B figure is absent, with its reason,
  never a zero; with one, calibration pairs are recorded;
- the run directory has the lab's contract, so the lab's summary reads it.

Every check compares moments on one process's clock, or a duration with the sleep inside it:
load only lengthens phases and moves no sleep out of its phase, so none of them assumes how
fast the machine is. The three cases (hook before attaching, with and without the A/B) run
one after another in the same two processes, so their start-up (spawning, importing torch
and the lab) is paid once.
"""

from __future__ import annotations

import itertools
import json
import os
import time

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from scaling.launch.local import start_workers
from scaling.testbed.local_cluster import free_port

DATA_SLEEP_S, FORWARD_SLEEP_S, PAUSE_S = 0.04, 0.03, 0.02
STEPS = 6
MODES = ("hook_before", "with_ab", "no_ab")
# Moments are compared on one clock; the records keep them as differences and sums of the same
# perf_counter readings (and rank 1's clock offset added, then taken off here), so they agree to
# float rounding, far below this.
EPS_S = 1e-6


def _timed_sleep(seconds: float, log: list | None) -> None:
    begin = time.perf_counter()
    time.sleep(seconds)
    if log is not None:
        log.append((begin, time.perf_counter()))


class SlowForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(16, 4)
        self.sleeps: list[tuple[float, float]] = []

    def forward(self, x):
        _timed_sleep(FORWARD_SLEEP_S, self.sleeps)
        return self.layer(x)


def slow_batches(rank: int, log: list | None = None):
    generator = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        _timed_sleep(DATA_SLEEP_S, log)
        yield torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)


def _case(rank: int, run_dir: str, mode: str) -> dict:
    from scaling import instrument

    torch.manual_seed(0)
    module = SlowForward()
    model = DistributedDataParallel(module)
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
        return result
    loss_fn = nn.CrossEntropyLoss()

    def forward_backward(batch):
        loss_fn(model(batch[0]), batch[1]).backward()

    with_ab = mode == "with_ab"
    meter = instrument.attach(
        model,
        optimizer,
        run_dir=run_dir,
        warmup_steps=1,
        calibration_pairs=2,
        forward_backward=forward_backward if with_ab else None,
        calibration_data=list(itertools.islice(slow_batches(rank), 2)) if with_ab else None,
    )
    model.register_comm_hook(None, counting_hook)  # after attaching: kept and timed
    data_sleeps, pauses = [], []
    module.sleeps.clear()
    loop_enter = time.perf_counter()
    for x, y in meter.batches(slow_batches(rank, data_sleeps)):
        loss = loss_fn(model(x), y)
        loss.backward()
        _timed_sleep(PAUSE_S, pauses)  # e.g. gradient clipping: before the optimizer step, so backward's
        optimizer.step()
        optimizer.zero_grad()
    loop_exit = time.perf_counter()
    forward_sleeps = list(module.sleeps)  # the training loop's forwards only (calibration's come after)
    meter.end_epoch(val_accuracy=0.5)
    result.update(
        hook_calls=calls["hook"],
        summary=meter.finish(),
        clock_offset_s=meter.clock_offset_s,
        loop_enter=loop_enter,
        loop_exit=loop_exit,
        data_sleeps=data_sleeps,
        forward_sleeps=forward_sleeps,
        pauses=pauses,
    )
    return result


def _job(rank: int, port: int, tmp: str) -> None:
    from scaling.launch.local import exit_without_finalization, release_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    for mode in MODES:
        result = _case(rank, os.path.join(tmp, mode), mode)
        with open(os.path.join(tmp, f"result-{mode}.rank{rank}.json"), "w") as f:
            json.dump(result, f)
    release_process_group()
    exit_without_finalization()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[list[dict], str]]:
    """mode -> (each rank's result, run directory), from one pair of processes."""
    tmp = tmp_path_factory.mktemp("own_loop")
    start_workers(_job, (free_port(), str(tmp)), 2)
    return {
        mode: ([json.loads((tmp / f"result-{mode}.rank{r}.json").read_text()) for r in range(2)], str(tmp / mode))
        for mode in MODES
    }


def _inside(interval, begin: float, end: float) -> bool:
    return begin - EPS_S <= interval[0] and interval[1] <= end + EPS_S


def test_phases_hooks_and_records_of_a_users_ddp_loop(runs):
    results, run_dir = runs["with_ab"]
    steps = pd.read_parquet(os.path.join(run_dir, "steps.parquet"))
    epochs = pd.read_parquet(os.path.join(run_dir, "epochs.parquet"))
    assert len(epochs) == 1  # the epoch's row, written by rank 0
    train = steps[steps["kind"] == "train"]
    assert sorted(train["rank"].unique()) == [0, 1] and len(train) == 2 * STEPS
    assert list(train.loc[train["rank"] == 0, "warmup"]) == [True] + [False] * (STEPS - 1)
    # each phase holds at least its own sleep ...
    assert (train["data_s"] >= DATA_SLEEP_S).all() and (train["forward_s"] >= FORWARD_SLEEP_S).all()
    assert (train["backward_s"] >= PAUSE_S).all()
    for rank, result in enumerate(results):
        mine = train[train["rank"] == rank].sort_values("step")
        # ... and each sleep lies inside its own step's phase, on this rank's clock (the records
        # put start_t on rank 0's clock by adding the rank's offset): so not in a neighbour's
        start = (mine["start_t"] - result["clock_offset_s"]).to_numpy()
        data_end = start + mine["data_s"].to_numpy()
        forward_end = data_end + mine["forward_s"].to_numpy()
        backward_end = forward_end + mine["backward_s"].to_numpy()
        end = start + mine["step_s"].to_numpy()
        assert len(result["data_sleeps"]) == len(result["forward_sleeps"]) == len(result["pauses"]) == STEPS
        for k in range(STEPS):
            assert _inside(result["data_sleeps"][k], start[k], data_end[k]), (rank, k, "data")
            assert _inside(result["forward_sleeps"][k], data_end[k], forward_end[k]), (rank, k, "forward")
            assert _inside(result["pauses"][k], forward_end[k], backward_end[k]), (rank, k, "backward")
        # the steps tile the epoch's training time: each starts where the previous one ended, and
        # what rank 0's train_s (the epoch's row) holds beyond the steps lies between entering
        # the loop and the first step, or between the last step's end and leaving the loop
        assert abs(start[1:] - end[:-1]).max() <= EPS_S
        if rank == 0:
            train_s = epochs["train_s"].iloc[0]
            outside_steps_s = (start[0] - result["loop_enter"]) + (result["loop_exit"] - end[-1])
            assert mine["step_s"].sum() - EPS_S <= train_s <= mine["step_s"].sum() + outside_steps_s + EPS_S
    # the user's hook ran once per bucket, and those calls are the timed buckets
    assert (
        results[0]["hook_calls"]
        == train.loc[train["rank"] == 0, "num_buckets"].sum()
        + steps.loc[(steps["rank"] == 0) & (steps["kind"] == "calib_sync"), "num_buckets"].sum()
    )
    assert (train["num_buckets"] == 1).all() and (train["allreduce_s"] > 0).all()
    # A/B: pairs recorded; the summary is the lab's, written by rank 0 at finish()
    assert set(steps["kind"]) == {"train", "calib_sync", "calib_nosync"}
    summary = results[0]["summary"]
    assert results[1]["summary"] is None
    assert json.load(open(os.path.join(run_dir, "summary.json"))) == summary
    assert summary["num_workers"] == 2 and summary["model"] == "SlowForward" and summary["launcher"] == "own"
    assert summary["per_worker_batch"] == 8 and summary["ab_calibration"] is True
    assert summary["data_parallel"] == "ddp"
    assert summary["comm_delta_s"] is not None and summary["comm_overhead_note"] is None
    assert summary["step_s"] == pytest.approx(train[~train["warmup"]]["step_s"].mean())


def test_without_forward_backward_the_ab_figure_is_absent(runs):
    results, _ = runs["no_ab"]
    summary = results[0]["summary"]
    assert summary["comm_overhead_pct"] is None and summary["comm_delta_s"] is None
    assert "no forward_backward" in summary["comm_overhead_note"]
    assert summary["exposed_comm_s"] is not None  # the hook still timed every bucket


def test_a_comm_hook_registered_before_attaching_is_refused_in_one_line(runs):
    results, _ = runs["hook_before"]
    message = results[0]["error"]
    assert "counting_hook" in message and "attach the instrument first" in message and "\n" not in message
