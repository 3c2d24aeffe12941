"""Collective timing on sampled steps (`instrument.collective_timing_every`), on a user's DDP job and FSDP2 job.

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
- the same for the job sharded with FSDP2: without a delay, an untimed step's all-gathers and
  reduce-scatters are FSDP's own (the instrument's wrappers swapped out); with one, they pass
  through the instrument unmarked; no untimed step has a row in collectives.parquet, and the delay
  holds its last reduce-scatter on every step;
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
WRAPPERS = ("ddp", "fsdp")


def _wrapped(wrapper: str) -> tuple[nn.Module, type, str]:
    """The job's model wrapped, the instrument's class its collectives pass through, and that class's method."""
    from torch.distributed.fsdp import fully_shard

    from scaling.instrument.backends.fsdp import ShardedCommTimer
    from scaling.instrument.timing import TimingProcessGroup

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    if wrapper == "ddp":
        return DistributedDataParallel(plain), TimingProcessGroup, "allreduce"
    for layer in (plain[0], plain[2]):
        fully_shard(layer)
    return fully_shard(plain), ShardedCommTimer, "reduce_scatter"


def _train(rank: int, run_dir: str, every: int, delay_s: float, wrapper: str) -> dict:
    from scaling import instrument

    # per call the instrument sees of a gradient bucket (DDP) or a reduce-scatter (FSDP2): (step, timed)
    calls = []
    model, timing_class, method = _wrapped(wrapper)
    original = getattr(timing_class, method)

    def counted(timer, *args):
        if wrapper == "ddp" and not args[0][0].is_floating_point():
            return original(timer, *args)
        before = timer.host_s
        work = original(timer, *args)
        # (step, timed, whether the instrument booked its own Python for this call, as FSDP2's timer does at once)
        calls.append((len(losses), timer.timed, timer.host_s > before))
        return work

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    batches = [
        (torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)) for _ in range(STEPS)
    ]
    losses = []
    setattr(timing_class, method, counted)
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
        setattr(timing_class, method, original)
    params = torch.cat(
        [
            p.detach().full_tensor().flatten() if hasattr(p, "full_tensor") else p.detach().flatten()
            for p in model.parameters()
        ]
    ).tolist()
    return {"losses": losses, "params": params, "calls": calls}


def _job(rank: int, port: int, tmp: str) -> None:
    from scaling.launch.local import exit_without_finalization, release_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    for wrapper in WRAPPERS:
        for name, (every, delay_s) in RUNS.items():
            result = _train(rank, os.path.join(tmp, wrapper, name), every, delay_s, wrapper)
            with open(os.path.join(tmp, f"{wrapper}-{name}.rank{rank}.json"), "w") as f:
                json.dump(result, f)
    release_process_group()
    exit_without_finalization()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sampling")
    start_workers(_job, (free_port(), str(tmp)), 2)
    return {
        (wrapper, name): (
            [json.loads((tmp / f"{wrapper}-{name}.rank{r}.json").read_text()) for r in range(2)],
            tmp / wrapper / name,
        )
        for wrapper in WRAPPERS
        for name in RUNS
    }


def _steps(run_dir) -> pd.DataFrame:
    steps = pd.read_parquet(run_dir / "steps.parquet")
    return steps[steps["kind"] == "train"].sort_values(["rank", "step"])


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_sampling_changes_nothing_the_job_computes(runs, wrapper):
    every_step = runs[(wrapper, "every1")][0]
    for name in ("sampled", "sampled_no_delay"):
        sampled = runs[(wrapper, name)][0]
        for rank in range(2):
            assert sampled[rank]["losses"] == every_step[rank]["losses"]  # bit-identical
        # the untimed steps' collectives averaged the gradients: the replicas (or gathered shards) agree
        assert sampled[0]["params"] == sampled[1]["params"]


def _timed_steps() -> list[bool]:
    return [s < WARMUP + EVERY or (s - WARMUP) % EVERY == 0 for s in range(STEPS)]


def test_untimed_ddp_steps_run_ddps_own_all_reduce_path(runs):
    timed = _timed_steps()
    for rank in range(2):
        calls = runs[("ddp", "sampled_no_delay")][0][rank]["calls"]
        steps_called = {step for step, _, _ in calls}
        assert steps_called == {s for s in range(STEPS) if timed[s]}
        assert all(timed_call for _, timed_call, _ in calls)
        # with a delay to hold, every step's buckets pass through it (the untimed ones unmarked)
        assert {step for step, _, _ in runs[("ddp", "sampled")][0][rank]["calls"]} == set(range(STEPS))


def test_untimed_fsdp_steps_run_fsdps_own_collectives(runs):
    timed = _timed_steps()
    for rank in range(2):
        # without a delay to hold, an untimed step's collectives never reach the instrument (FSDP's own objects)
        calls = runs[("fsdp", "sampled_no_delay")][0][rank]["calls"]
        assert {step for step, _, _ in calls} == {s for s in range(STEPS) if timed[s]}
        assert all(timed_call and booked for _, timed_call, booked in calls)
        # with one, every step's pass through it, the untimed ones unmarked and with no Python booked for them
        calls = runs[("fsdp", "sampled")][0][rank]["calls"]
        assert {step for step, _, _ in calls} == set(range(STEPS))
        assert all(timed_call == timed[step] == booked for step, timed_call, booked in calls)
    for name in ("sampled", "sampled_no_delay"):
        collectives = pd.read_parquet(runs[("fsdp", name)][1] / "collectives.parquet")
        assert set(collectives[collectives["step_kind"] == "train"]["step"]) == {s for s in range(STEPS) if timed[s]}


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_only_the_sampled_steps_have_communication_columns_and_none_is_a_zero(runs, wrapper):
    steps = _steps(runs[(wrapper, "sampled")][1])
    expected = _timed_steps()
    comm = "allreduce_s" if wrapper == "ddp" else "comm_s"
    for rank in range(2):
        mine = steps[steps["rank"] == rank]
        assert list(mine["comm_timed"]) == expected
        timed, untimed = mine[mine["comm_timed"]], mine[~mine["comm_timed"]]
        assert (timed["num_buckets"] >= 1).all() and (timed[comm] > 0).all()
        for column in (
            comm,
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
    every_step = _steps(runs[(wrapper, "every1")][1])
    assert every_step["comm_timed"].all() and every_step["exposed_comm_s"].notna().all()


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_the_injected_delay_holds_every_step_and_shows_in_the_timed_ones(runs, wrapper):
    steps = _steps(runs[(wrapper, "sampled")][1])
    # FSDP2's delay holds the last reduce-scatter of the module whose came last in the previous backward: none
    # in the first (backends/fsdp.py)
    steps = steps[steps["step"] >= (1 if wrapper == "fsdp" else 0)]
    timed, untimed = steps[steps["comm_timed"]], steps[~steps["comm_timed"]]
    # the delay is measured around itself on the timed steps, and exposed: backward waits for it
    assert (timed["injected_s"] >= DELAY_S).all()
    assert timed["exposed_comm_s"].min() >= DELAY_S
    # an untimed step is held as long: its backward holds the delay too
    assert untimed["backward_s"].min() >= DELAY_S


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_the_summary_says_what_the_figures_rest_on_and_what_the_instrument_cost(runs, wrapper):
    from scaling.results import RunDir

    run_dir = runs[(wrapper, "sampled")][1]
    steps = _steps(run_dir)
    summary = RunDir(run_dir).summary()
    steady = steps[steps["step"] >= WARMUP]
    assert summary["steps_recorded"] == len(steady)
    assert summary["comm_timed_steps"] == int(steady["comm_timed"].sum()) < len(steady)
    assert summary["exposed_comm_s"] == pytest.approx(steady["exposed_comm_s"].mean())
    assert (steps["instrument_host_s"] > 0).all() and (steps["instrument_host_s"] < steps["step_s"]).all()
    assert 0 < summary["instrument_host_pct"] < 100
