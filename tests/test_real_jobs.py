"""Real jobs' shapes through the public instrument: figures that agree, and a training left unchanged.

The jobs are in tests/real_jobs.py, written as a user writes them. At world size 2 (two spawned
gloo processes running every case in turn, start-up paid once) and at world size 1 (in this
process, the unit tier), what is proven:
- **a step is an optimizer step**: with gradient accumulation over 2 micro-batches (DDP's
  `no_sync` on the first), clipping, an LR scheduler and bf16 autocast, each step record holds
  2 micro-batches, 1 of them synchronised; the ground truth, a delay D injected into every
  synchronised all-reduce, grows the exposed communication per step and the A/B difference by D
  (+-15%), once per optimizer step; a job that synchronises every micro-batch grows them by 2D
  per step and D per micro-batch; in the runs where D dominates, the three views agree: the A/B
  overhead and the exposed share within a factor 1.5 (the summary's pooled A/B under load; the
  factor 2 of micro-batches counted as steps fails it), waiting no more than the exposed time,
  PyTorch DDP's own timers agreeing with the lab's on the same steps (the summary's rule);
- **an evaluation inside the epoch without `paused()`** (eval mode, no_grad, every 3 steps) is
  out of the step's phases and out of `train_s`: each step that holds one is paused for at
  least the evaluation's forwards, and its phases plus the pause tile the time to the next step;
- **odd steps** keep defined, non-negative phases: a step GradScaler skips (non-finite
  gradients) is a step with `optimizer_steps` 0; a batch the job skips joins the next step; two
  optimizers stepped per batch are one step with 2; `zero_grad(set_to_none=False)` changes
  nothing; a model called three times per step (siamese) is one forward phase;
- **the instrument changes nothing in the training**: with dropout, a shuffling DataLoader and
  the A/B calibration iterating it, the losses are the same, bit for bit, with and without it;
- **a run that fails is recorded**: `with attach(...)` around a loop that raises detaches every
  hook and writes a summary with `status: failed`, the error and the epoch that finished;
- `torch.compile` (through `forward_module`) and fp16 autocast with GradScaler are measured;
- `scaling why` names accumulation that syncs every micro-batch as the first cause of such a job, a
  slow input on every rank as input-bound steps, and a slow input on one rank as its straggler;
- **DDP's own work per step** (`wrapper_s`): with `find_unused_parameters` and a buffer, each step's
  wrapper time holds the job's own sleep planted on the wrapper, and `scaling why` prices the
  settings at its share; without such settings it is not timed (NaN).

Checks that involve time compare a duration with a sleep inside it, moments on one clock, or a
growth against the injected delay (which dwarfs what load adds: tests/test_ground_truth.py
measured the spread); none assumes how fast the machine is.
"""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
import torch

from scaling.launch.local import start_workers
from scaling.testbed.local_cluster import free_port
from tests import real_jobs

EPS_S = 1e-6
PHASE_COLUMNS = ["data_s", "forward_s", "backward_s", "optimizer_s", "step_s"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """case -> (each rank's result, run directory), from one pair of gloo processes."""
    tmp = tmp_path_factory.mktemp("real_jobs")
    start_workers(real_jobs.world_job, (free_port(), str(tmp)), 2)
    return {
        name: ([json.loads((tmp / f"result-{name}.rank{r}.json").read_text()) for r in range(2)], tmp / name)
        for name in real_jobs.WORLD_CASES
    }


def _train(run_dir) -> pd.DataFrame:
    steps = pd.read_parquet(run_dir / "steps.parquet")
    return steps[steps["kind"] == "train"].sort_values(["rank", "epoch", "step"])


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _fastest(run_dir) -> dict:
    """The least-disturbed observations (tests/test_ground_truth.py says why): the fastest steady
    step's exposed time, and the fastest synchronised calibration half minus the fastest no_sync one."""
    steps = pd.read_parquet(run_dir / "steps.parquet")
    train = steps[(steps["kind"] == "train") & ~steps["warmup"]]
    calib = steps[steps["kind"] != "train"]
    return {
        "exposed_comm_s": train["exposed_comm_s"].min(),
        "ab_s": calib.loc[calib["kind"] == "calib_sync", "step_s"].min()
        - calib.loc[calib["kind"] == "calib_nosync", "step_s"].min(),
    }


def _phases_defined(train: pd.DataFrame) -> None:
    assert not train.empty
    assert (train[PHASE_COLUMNS] >= 0).all().all(), train[PHASE_COLUMNS]
    sums = train[["data_s", "forward_s", "backward_s", "optimizer_s"]].sum(axis=1)
    assert (sums - train["step_s"]).abs().max() < EPS_S


@pytest.mark.slow
def test_a_step_is_an_optimizer_step_with_its_micro_batches(world):
    train = _train(world["accumulation"][1])
    assert len(train) == 2 * 2 * 6  # ranks x epochs x optimizer steps (12 micro-batches an epoch)
    assert (train["micro_batches"] == 2).all() and (train["synced_micro_batches"] == 1).all()
    assert (train["optimizer_steps"] == 1).all() and (train["samples"] == 2 * real_jobs.BATCH).all()
    _phases_defined(train)
    summary = _summary(world["accumulation"][1])
    assert summary["micro_batches"] == 2 and summary["synced_micro_batches"] == 1
    assert summary["waiting_s"] <= summary["exposed_comm_s"] + EPS_S
    epochs = pd.read_parquet(world["accumulation"][1] / "epochs.parquet")
    assert (epochs["steps"] == 6).all()


@pytest.mark.slow
@pytest.mark.parametrize("case, synced_per_step", [("accumulation_delay", 1), ("accumulation_sync_every_delay", 2)])
def test_injected_delay_shows_once_per_synchronised_micro_batch(world, case, synced_per_step):
    base, injected = _fastest(world["accumulation"][1]), _fastest(world[case][1])
    delay = real_jobs.DELAY_S
    growth = {name: injected[name] - base[name] for name in base}
    print(f"{case}: injected {delay} s per synchronised micro-batch; growth {growth}")
    assert growth["exposed_comm_s"] == pytest.approx(synced_per_step * delay, rel=0.15)  # per optimizer step
    assert growth["ab_s"] == pytest.approx(delay, rel=0.15)  # the calibration times one micro-batch
    summary = _summary(world[case][1])
    assert summary["synced_micro_batches"] == synced_per_step and summary["micro_batches"] == 2
    # Where the delay dominates, the three views of the communication agree. The summary's A/B is
    # pooled from medians, not from the fastest halves, and load biases it: the synchronised half
    # sleeps D and waits for its core back (tests/test_ground_truth.py measured comm_delta_s
    # -28..+50% of D under load), hence a factor 1.5 either way here, which still tells the
    # factor 2 of counting micro-batches as steps; the +-15% is the ground truth's, above.
    assert 1 / 1.5 <= summary["comm_overhead_pct"] / summary["exposed_comm_pct"] <= 1.5
    assert summary["waiting_pct"] <= summary["exposed_comm_pct"] + 1e-9
    # DDP's own timers agree with the lab's by the summary's rule: on the same steps, the ratio's 95% interval
    # within a factor 1.25 either way (run_metrics.ddp_second_opinion). Compared over different steps, as it
    # was before 2026-12-02, one slow sampled iteration under the suite's load read 0.83 (CI, 2026-11-29) and
    # flagged a disagreement (CI, 2026-12-01); paired, these runs read 0.993-1.003
    print(f"{case}: lab / DDP {summary['ddp_comm_ratio']:.3f} over {summary['ddp_pairs']} steps")
    assert summary["ddp_disagrees"] is False, summary


@pytest.mark.slow
def test_why_names_accumulation_that_syncs_every_micro_batch(world):
    """`scaling why` on these `attach` runs: the job that syncs both micro-batches (each all-reduce held
    DELAY_S) has that as its first cause, with DDP's no_sync as the fix; the job that uses no_sync has
    its one sync's exposed communication first, and no accumulation cause."""
    from scaling.why import explain

    def ranked(case):
        return [f for f in explain(world[case][1])["findings"] if f["decided"] and f["of"] == "step"]

    every = ranked("accumulation_sync_every_delay")
    assert every[0]["cause"] == "accumulation_syncs", [(f["cause"], f["cost"]["pct"]) for f in every]
    assert "no_sync" in every[0]["fix"] and every[0]["cost"]["pct"] > 20
    once = ranked("accumulation_delay")
    assert once[0]["cause"] == "exposed_comm" and "accumulation_syncs" not in {f["cause"] for f in once}
    # the wrapper's per-step settings as the instrument read them (DDP's defaults; the MLP has no buffers)
    job = json.loads((world["accumulation_sync_every_delay"][1] / "job.json").read_text())
    assert job["per_step_settings"] == {"find_unused_parameters": False, "sync_buffers": False, "static_graph": False}
    # so the wrapper's own time is not timed: no hook, and NaN, never a zero
    assert _train(world["accumulation_sync_every_delay"][1])["wrapper_s"].isna().all()


@pytest.mark.slow
def test_the_wrappers_own_work_is_timed_and_prices_its_settings(world):
    """A DDP job with find_unused_parameters=True and a buffer, whose own forward pre-hook on the wrapper
    sleeps WRAPPER_SLEEP_S (the ground truth, where DDP broadcasts its buffers): every training step's
    `wrapper_s` holds that step's sleep as slept, and in the median little more (the search for unused
    parameters of a 3-layer MLP, the broadcast, DDP's bookkeeping); `scaling why` ranks the DDP settings
    first, with both fixes, priced at the share of the step the sleeps took."""
    from scaling.why import explain

    results, run_dir = world["ddp_wrapper_work"]
    job = json.loads((run_dir / "job.json").read_text())
    assert job["per_step_settings"] == {"find_unused_parameters": True, "sync_buffers": True, "static_graph": False}
    train = _train(run_dir)  # by rank, then in step order: each rank's sleeps in the order it slept them
    train["slept_s"] = [slept for result in results for slept in result["slept_s"]]
    assert (train["wrapper_s"] >= train["slept_s"] - EPS_S).all(), train[["wrapper_s", "slept_s"]]
    # The rest is DDP's own: the search, the bookkeeping, and the broadcast, a collective, so a rank waits in it
    # for the other to arrive. Measured (3 runs, one beside four busy loops): median 1.0-2.3 ms, the largest
    # 5.9-48.6 ms (a preempted rank); a mark misplaced by a phase would hold the forward, every step.
    extra = train["wrapper_s"] - train["slept_s"]
    assert extra.median() < 0.2 * real_jobs.WRAPPER_SLEEP_S, extra.describe()
    ranked = [f for f in explain(run_dir)["findings"] if f["decided"] and f["of"] == "step"]
    first = ranked[0]
    assert first["cause"] == "ddp_settings", [(f["cause"], f["cost"]["pct"]) for f in ranked]
    assert "find_unused_parameters=False" in first["fix"] and "forward_sync_buffers=False" in first["fix"]
    per_step = train[~train["warmup"].astype(bool)].groupby(["epoch", "step"])[["step_s", "slept_s"]].mean()
    planted = 100 * per_step["slept_s"].sum() / per_step["step_s"].sum()
    # measured (the same 3 runs): 1.06-1.14
    assert 0.9 < first["cost"]["pct"] / planted < 1.35, (first["cost"], planted)


@pytest.mark.slow
def test_why_prices_exposed_communication_from_the_steps_that_timed_it(world):
    """Every all-reduce held SAMPLED_DELAY_S, collectives timed on a few steps only: exposed communication is
    the first cause, and the projection that prices its fix gives the run's own step at its own worker count
    (its compute read from the timed steps; an untimed step's backward holds the held all-reduce, which read as
    compute projected 1.5 x the step)."""
    from scaling.why import explain

    run_dir = world["delay_sampled"][1]
    ranked = [f for f in explain(run_dir)["findings"] if f["decided"] and f["of"] == "step"]
    first = ranked[0]
    assert first["cause"] == "exposed_comm", [(f["cause"], f["cost"]["pct"]) for f in ranked]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["comm_timed_steps"] < summary["steps_recorded"], summary  # some steps untimed
    gain = first["gain"]
    assert gain["how"].startswith("projected"), gain
    assert abs(gain["step_s"] / summary["step_s"] - 1) < 0.15, (gain["step_s"], summary["step_s"])


@pytest.mark.slow
def test_why_names_a_slow_input_and_whose_it_is(world):
    """`scaling why` on `attach` runs whose data iterator sleeps INPUT_SLEEP_S per batch: on every rank, the
    steps are input-bound, first, with the loader as the fix; on rank 1 alone, rank 1 is the straggler
    and its input the reason (the others wait for it in the all-reduce, so their data wait stays small)."""
    from scaling.why import explain

    def ranked(case):
        return [f for f in explain(world[case][1])["findings"] if f["decided"] and f["of"] == "step"]

    both = ranked("input_bound")
    assert both[0]["cause"] == "input_bound", [(f["cause"], f["cost"]["pct"]) for f in both]
    assert "DataLoader" in both[0]["fix"] and both[0]["cost"]["pct"] > 20
    one = ranked("input_straggler")
    assert one[0]["cause"] == "straggler", [(f["cause"], f["cost"]["pct"]) for f in one]
    assert "rank 1" in one[0]["figure"] and "its input" in one[0]["figure"], one[0]["figure"]
    assert "input" in one[0]["fix"]


@pytest.mark.slow
def test_an_evaluation_inside_the_epoch_is_not_training(world):
    results, run_dir = world["mid_epoch_eval"]
    job = results[0]
    train = _train(run_dir)
    rank0 = train[train["rank"] == 0].reset_index(drop=True)
    assert len(rank0) == 9
    _phases_defined(train)
    sleeps = job["eval_sleeps"]
    assert len(sleeps) == 3 * 2  # 3 evaluations x 2 validation batches
    for evaluation in job["evaluations"]:
        inside = [s for s in sleeps if evaluation["begin"] <= s[0] and s[1] <= evaluation["end"]]
        step = rank0.iloc[evaluation["step"]]
        # the step holds the evaluation as a pause, at least as long as its forwards slept ...
        assert step["paused_s"] >= sum(b - a for a, b in inside) - EPS_S
        # ... and its phases plus the pause still tile the time to the next step's start
        if evaluation["step"] + 1 < len(rank0):
            gap = rank0.iloc[evaluation["step"] + 1]["start_t"] - step["start_t"]
            assert step["step_s"] + step["paused_s"] == pytest.approx(gap, abs=1e-5)
    untouched = rank0.drop(index=[e["step"] for e in job["evaluations"]])
    assert (untouched["paused_s"] == 0).all()
    slept = sum(b - a for a, b in sleeps)
    assert job["train_s"] <= job["loop_exit"] - job["loop_enter"] - slept + EPS_S
    assert job["eval_s"] >= slept - EPS_S


@pytest.mark.slow
@pytest.mark.parametrize(
    "pattern, rows, optimizer_steps",
    [
        ("grad_scaler_skip", 8, [1, 1, 0, 1, 1, 1, 1, 1]),
        ("skipped_batch", 7, [1] * 7),
        ("two_optimizers", 8, [2] * 8),
        ("zero_not_none", 8, [1] * 8),
    ],
)
def test_odd_steps_keep_defined_phases(world, pattern, rows, optimizer_steps):
    train = _train(world[f"odd_{pattern}"][1])
    _phases_defined(train)
    for rank in (0, 1):
        mine = train[train["rank"] == rank]
        assert len(mine) == rows
        assert mine["optimizer_steps"].tolist() == optimizer_steps
    if pattern == "skipped_batch":  # the skipped batch's time and samples are the next step's
        after = train[(train["rank"] == 0)].iloc[3]
        assert after["micro_batches"] == 1 and after["samples"] == 2 * real_jobs.BATCH


@pytest.mark.slow
def test_the_instrument_changes_nothing_in_the_training(world):
    plain, attached = world["losses_plain"][0], world["losses_attached"][0]
    for rank in (0, 1):
        assert attached[rank]["losses"] == plain[rank]["losses"]  # bit for bit, A/B calibration included
    calib = pd.read_parquet(world["losses_attached"][1] / "steps.parquet")
    assert (calib["kind"] == "calib_sync").sum() == 2 * 2 * 2  # ranks x epochs x pairs: the calibration did run


@pytest.mark.slow
def test_a_run_that_raises_is_recorded_as_failed(world):
    results, run_dir = world["fails"]
    assert all(r["raised"] == "the job's own error" and r["hooks_left"] == 0 for r in results)
    summary = _summary(run_dir)
    assert summary["status"] == "failed" and "the job's own error" in summary["error"]
    assert summary["epochs_run"] == 1


# --- world size 1, in this process (the unit tier) -----------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, rows, optimizer_steps",
    [
        ("grad_scaler_skip", 8, [1, 1, 0, 1, 1, 1, 1, 1]),  # told by the gradients cleared after the skipped step
        ("siamese", 8, [1] * 8),
        ("skipped_batch", 7, [1] * 7),
        ("two_optimizers", 8, [2] * 8),
    ],
)
def test_odd_steps_at_one_worker(tmp_path, pattern, rows, optimizer_steps):
    real_jobs.job_odd_steps(str(tmp_path), pattern)
    train = _train(tmp_path)
    _phases_defined(train)
    assert len(train) == rows and train["optimizer_steps"].tolist() == optimizer_steps


def test_accumulation_at_one_worker_groups_micro_batches(tmp_path):
    real_jobs.job_accumulation(str(tmp_path), epochs=1, pairs=0)
    train = _train(tmp_path)
    assert len(train) == 6 and (train["micro_batches"] == 2).all() and (train["synced_micro_batches"] == 0).all()


def test_losses_unchanged_at_one_worker(tmp_path):
    assert real_jobs.job_losses(str(tmp_path), attached=True) == real_jobs.job_losses(None, attached=False)


def test_an_evaluation_inside_the_epoch_at_one_worker(tmp_path):
    job = real_jobs.job_mid_epoch_eval(str(tmp_path))
    slept = sum(b - a for a, b in job["eval_sleeps"])
    assert job["train_s"] <= job["loop_exit"] - job["loop_enter"] - slept + EPS_S
    assert job["eval_s"] >= slept - EPS_S


COMPILED_FORWARD_SLEEP_S = 0.02


class _SleepsThenRuns(torch.nn.Module):
    """A known cost inside the compiled call but outside the module the meter is given: only marks
    on the compiled module (forward_module) put it in forward_s."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        time.sleep(COMPILED_FORWARD_SLEEP_S)  # a graph break: runs as Python, every call
        return self.inner(x)


def test_a_compiled_model_is_measured_through_forward_module(tmp_path):
    """The forward phase is the compiled call's (an order, not a duration: the sleep inside it lies
    inside each step's forward_s), not the inner model's, whose hooks a compiled graph may skip."""
    from scaling import instrument

    torch.manual_seed(0)
    model = real_jobs.SlowEvalMLP()
    compiled = torch.compile(_SleepsThenRuns(model), backend="aot_eager")  # no code generation: no compiler process
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    with instrument.attach(model, optimizer, run_dir=str(tmp_path), forward_module=compiled, warmup_steps=0) as meter:
        for x, y in meter.batches(real_jobs.batches(6, seed=0)):
            loss_fn(compiled(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        meter.end_epoch(val_accuracy=0.5)
    train = _train(tmp_path)
    _phases_defined(train)
    assert len(train) == 6 and (train["forward_s"] >= COMPILED_FORWARD_SLEEP_S).all(), train["forward_s"].tolist()


def test_fp16_autocast_with_grad_scaler_is_measured(tmp_path):
    from scaling import instrument

    torch.manual_seed(0)
    model = real_jobs.SlowEvalMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    loss_fn = torch.nn.CrossEntropyLoss()
    with instrument.attach(model, optimizer, run_dir=str(tmp_path), warmup_steps=0) as meter:
        for x, y in meter.batches(real_jobs.batches(6, seed=0)):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        meter.end_epoch(val_accuracy=0.5)
    train = _train(tmp_path)
    _phases_defined(train)
    assert len(train) == 6
    assert json.loads((tmp_path / "job.json").read_text())["precision"] == "fp16"
