"""Collective timing on sampled steps (`instrument.collective_timing_every`), on a user's DDP job.

Two gloo processes train the same small DDP job three times from the same seed: with every
step's all-reduces timed, then with the first three steady-state steps' and every third after
(`collective_timing_every=3`), the instrument attached each time with a ground-truth delay
injected into every step's last bucket; then sampled as before without a delay. What is proven:
- the job computes the same: the losses are bit-identical between the runs, and the
  parameters agree across ranks after training (the untimed steps still all-reduce, averaged);
- the timed steps are the warm-up steps, the first three steady ones and every third after; the
  others have their phases, and every communication column NaN (never a zero that would pull a
  mean down); the summary counts what the figures rest on (`comm_timed_steps`);
- without a delay to hold, an untimed step's buckets never reach the instrument's process group
  (DDP's own C++ all-reduce path: no Python per bucket), and a timed step's all do;
- the injected delay holds every step's last bucket, timed or not, and shows in the timed
  steps' exposed communication: their fastest exposed time is at least the delay;
- the instrument's own time (`instrument_host_s`) is recorded on every step, positive and
  below the step's time, and the summary gives its share of the step.
Every check is on records or on values the job computed; none assumes the machine's speed.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scaling.launch.local import start_workers
from scaling.testbed.local_cluster import free_port

pytestmark = pytest.mark.slow  # two spawned gloo processes

STEPS, WARMUP, EVERY, DELAY_S = 14, 2, 3, 0.02
RUNS = {"every1": (1, DELAY_S), "sampled": (EVERY, DELAY_S), "sampled_no_delay": (EVERY, 0.0)}


def _train(rank: int, run_dir: str, every: int, delay_s: float) -> dict:
    from scaling import instrument
    from scaling.instrument.timing import TimingProcessGroup

    calls = []  # per call of the instrument's process group with a gradient bucket: (step, timed)
    allreduce = TimingProcessGroup.allreduce

    def counted(group, tensors, opts):
        if tensors[0].is_floating_point():
            calls.append((len(losses), group.timed))
        return allreduce(group, tensors, opts)

    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    batches = [
        (torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)) for _ in range(STEPS)
    ]
    losses = []
    TimingProcessGroup.allreduce = counted
    try:
        with instrument.attach(
            model,
            optimizer,
            run_dir=run_dir,
            warmup_steps=WARMUP,
            collective_timing_every=every,
            inject_comm_delay_s=delay_s,
            telemetry_interval_s=0,
        ) as meter:
            for x, y in meter.batches(batches):
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                losses.append(loss.item())
            meter.end_epoch()
    finally:
        TimingProcessGroup.allreduce = allreduce
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    return {"losses": losses, "params": params, "calls": calls}


def _job(rank: int, port: int, tmp: str) -> None:
    from scaling.launch.local import exit_without_finalization, release_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    for name, (every, delay_s) in RUNS.items():
        result = _train(rank, os.path.join(tmp, name), every, delay_s)
        with open(os.path.join(tmp, f"{name}.rank{rank}.json"), "w") as f:
            json.dump(result, f)
    release_process_group()
    exit_without_finalization()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sampling")
    start_workers(_job, (free_port(), str(tmp)), 2)
    return {
        name: ([json.loads((tmp / f"{name}.rank{r}.json").read_text()) for r in range(2)], tmp / name) for name in RUNS
    }


def _steps(run_dir) -> pd.DataFrame:
    steps = pd.read_parquet(run_dir / "steps.parquet")
    return steps[steps["kind"] == "train"].sort_values(["rank", "step"])


def test_sampling_changes_nothing_the_job_computes(runs):
    every_step = runs["every1"][0]
    for name in ("sampled", "sampled_no_delay"):
        sampled = runs[name][0]
        for rank in range(2):
            assert sampled[rank]["losses"] == every_step[rank]["losses"]  # bit-identical
        assert sampled[0]["params"] == sampled[1]["params"]  # the untimed steps' all-reduces averaged the gradients


def _timed_steps() -> list[bool]:
    return [s < WARMUP + EVERY or (s - WARMUP) % EVERY == 0 for s in range(STEPS)]


def test_untimed_steps_run_ddps_own_all_reduce_path(runs):
    timed = _timed_steps()
    for rank in range(2):
        calls = runs["sampled_no_delay"][0][rank]["calls"]
        steps_called = {step for step, _ in calls}
        assert steps_called == {s for s in range(STEPS) if timed[s]}
        assert all(timed_call for _, timed_call in calls)
        # with a delay to hold, every step's buckets pass through it (the untimed ones unmarked)
        assert {step for step, _ in runs["sampled"][0][rank]["calls"]} == set(range(STEPS))


def test_only_the_sampled_steps_have_communication_columns_and_none_is_a_zero(runs):
    steps = _steps(runs["sampled"][1])
    expected = _timed_steps()
    for rank in range(2):
        mine = steps[steps["rank"] == rank]
        assert list(mine["comm_timed"]) == expected
        timed, untimed = mine[mine["comm_timed"]], mine[~mine["comm_timed"]]
        assert (timed["num_buckets"] >= 1).all() and (timed["allreduce_s"] > 0).all()
        for column in (
            "allreduce_s",
            "exposed_comm_s",
            "comm_span_s",
            "num_buckets",
            "injected_s",
            "synced_micro_batches",
            "compute_s",
            "waiting_s",
            "transfer_s",
        ):
            assert untimed[column].isna().all(), column
        assert (untimed["step_s"] > 0).all() and untimed["backward_s"].notna().all()
    every_step = _steps(runs["every1"][1])
    assert every_step["comm_timed"].all() and every_step["exposed_comm_s"].notna().all()


def test_the_injected_delay_holds_every_step_and_shows_in_the_timed_ones(runs):
    steps = _steps(runs["sampled"][1])
    timed, untimed = steps[steps["comm_timed"]], steps[~steps["comm_timed"]]
    # the delay is measured around itself on the timed steps, and exposed: backward waits for it
    assert (timed["injected_s"] >= DELAY_S).all()
    assert timed["exposed_comm_s"].min() >= DELAY_S
    # an untimed step is held as long: its backward holds the delay too
    assert untimed["backward_s"].min() >= DELAY_S


def test_the_summary_says_what_the_figures_rest_on_and_what_the_instrument_cost(runs):
    from scaling.results import RunDir

    steps = _steps(runs["sampled"][1])
    summary = RunDir(runs["sampled"][1]).summary()
    steady = steps[steps["step"] >= WARMUP]
    assert summary["steps_recorded"] == len(steady)
    assert summary["comm_timed_steps"] == int(steady["comm_timed"].sum()) < len(steady)
    assert summary["exposed_comm_s"] == pytest.approx(steady["exposed_comm_s"].mean())
    assert (steps["instrument_host_s"] > 0).all() and (steps["instrument_host_s"] < steps["step_s"]).all()
    assert 0 < summary["instrument_host_pct"] < 100
