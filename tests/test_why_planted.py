"""`scaling why` on real runs of the lab's loop with a fault planted (the quickstart CNN, 2 workers, the
plain launcher, 2 epochs of 8 steps): rank 1 sleeping before its backward every step is ranked first
as a straggler whose compute is slower, with a gain the projection prices; a delay held in every
step's all-reduce is ranked first as exposed communication; a delay in every batch's fetch is ranked
first as input-bound steps. The generated-record cases, the clean job
and the sweep's causes are tests/test_why.py's (unit tier); the fix applied and re-run is
bench/why_planted_faults.py's.

The planted costs (60 ms in a step of about 110 ms on 2 shared cores) are held against their share of each
run's own steps, as slept (`injected_s`): load moves both with the figures, and no comparison between
runs is made here.
"""

from __future__ import annotations

import pandas as pd
import pytest

from scaling.config import load_config
from scaling.launch.run import execute_run
from scaling.why import explain
from tests.conftest import REPO

pytestmark = pytest.mark.slow  # training runs: the slow tier

PLANTED_S = 0.06


def _verdict(tmp_path, name: str, overrides: list[str]) -> dict:
    cfg = load_config(
        REPO / "experiments" / "quickstart.yaml",
        overrides=[
            "data.train_samples=1024",
            "data.val_samples=256",
            "train.max_epochs=2",
            "train.target_accuracy=1.0",
            "instrument.calibration_pairs=4",
            "instrument.warmup_steps=4",
            *overrides,
        ],
        num_workers=2,
    )
    summary = execute_run(cfg, tmp_path / name, launcher="local")
    assert summary["status"] == "max_epochs", summary["error"]
    verdict = explain(tmp_path / name)
    return [f for f in verdict["findings"] if f["decided"] and f["of"] == "step"]


LANDED_LIMIT = 1.5  # rank 1's compute excess over its sleep beyond which other work, not the sleep, made it slow


def test_a_slow_rank_is_the_first_cause_and_its_compute_is_named(tmp_path):
    planting = [f"instrument.inject_straggler_s={PLANTED_S}", "instrument.straggler_rank=1"]
    ranked = _verdict(tmp_path, "straggler", planting)
    # The ground truth below is the sleep. Where rank 1's compute exceeded rank 0's by much more than it slept,
    # other work on the cores made it slow too, the fault did not land as planted, and the run is made once more
    # (a CI run beside a loaded test session priced 2.9x the sleep's share, its second epoch 2.4x as long as its
    # first). Measured: 1.005x on a quiet machine, 0.73x beside four busy loops
    landed = _landed(tmp_path / "straggler")
    if landed > LANDED_LIMIT:
        ranked = _verdict(tmp_path, "straggler-again", planting)
        landed = _landed(tmp_path / "straggler-again")
    run_dir = tmp_path / ("straggler-again" if (tmp_path / "straggler-again").exists() else "straggler")
    assert landed <= LANDED_LIMIT, f"rank 1 computed {landed:.2f}x its sleep more than rank 0 in both runs"
    first = ranked[0]
    assert first["cause"] == "straggler", [(f["cause"], f["cost"]["pct"]) for f in ranked]
    assert "rank 1" in first["figure"] and "its compute" in first["figure"]
    gain = first["gain"]
    assert gain["how"].startswith("projected"), gain
    # The fix's ground truth: without the planted sleep each step is shorter by it, the planted share of this
    # run's own steps (a loaded machine lengthens the step and shrinks both alike). Held to the rule:
    # within the projected interval, or within 25% of the projected gain. Measured (5 runs, beside 0, 2 and 4
    # busy loops): gain / planted 0.99-1.08, the planted share inside the interval in all 5.
    planted = _planted_share(run_dir)
    inside = gain["step_pct_lo"] <= planted <= gain["step_pct_hi"]
    assert inside or abs(gain["step_pct"] / planted - 1) <= 0.25, (gain, planted)


def _landed(run_dir) -> float:
    """Rank 1's compute (forward + backward less exposed communication) beyond rank 0's, over what it slept,
    summed over the steady timed steps: about 1 where the planted sleep is what made it slow."""
    steps = pd.read_parquet(run_dir / "steps.parquet")
    timed = steps[(steps["kind"] == "train") & ~steps["warmup"].astype(bool) & steps["exposed_comm_s"].notna()]
    compute = (
        (timed["forward_s"] + timed["backward_s"] - timed["exposed_comm_s"])
        .groupby([timed["epoch"], timed["step"], timed["rank"]])
        .sum()
        .unstack("rank")
    )
    slept = timed[timed["rank"] == 1].set_index(["epoch", "step"])["injected_s"]
    return float((compute[1] - compute[0]).sum() / slept.reindex(compute.index).sum())


def _planted_share(run_dir) -> float:
    """The planted delay as a share (%) of the run's own steady steps: the ground truth the figures are held
    against. The delay as slept (`injected_s`, each rank's, measured: a loaded machine oversleeps a 60 ms
    sleep by a fifth), on the steps whose collectives were timed (the others leave it NaN); each step
    lengthened by the longest of its ranks'."""
    steps = pd.read_parquet(run_dir / "steps.parquet")
    train = steps[(steps["kind"] == "train") & ~steps["warmup"].astype(bool)]
    per_step = train.groupby(["epoch", "step"]).agg(step_s=("step_s", "mean"), injected_s=("injected_s", "max"))
    timed = per_step.dropna()
    assert len(timed) >= len(per_step) // 2 and (timed["injected_s"] >= PLANTED_S).all(), per_step
    return 100 * timed["injected_s"].sum() / timed["step_s"].sum()


def test_a_delay_in_the_all_reduce_is_the_first_cause(tmp_path):
    ranked = _verdict(tmp_path, "delay", [f"instrument.inject_comm_delay_s={PLANTED_S}"])
    first = ranked[0]
    assert first["cause"] == "exposed_comm", [(f["cause"], f["cost"]["pct"]) for f in ranked]
    assert "bf16" in first["fix"]
    # Held against the planted share of this run's own steps, not a fixed percentage: a loaded machine
    # lengthens the step and shrinks both alike. Measured (5 runs, beside 0, 2 and 4 busy loops): exposed /
    # planted 1.06-1.11; the bounds leave room for the real all-reduce.
    ratio = first["cost"]["pct"] / _planted_share(tmp_path / "delay")
    assert 0.9 < ratio < 1.35, (first["cost"], ratio)


def test_a_delay_in_every_batchs_fetch_is_the_first_cause(tmp_path):
    ranked = _verdict(tmp_path, "input", [f"instrument.inject_data_delay_s={PLANTED_S}"])
    first = ranked[0]
    assert first["cause"] == "input_bound", [(f["cause"], f["cost"]["pct"]) for f in ranked]
    assert "DataLoader workers" in first["fix"]
    # the data wait's share against the planted share of the run's own steps (the real fetch adds a little).
    # Measured (5 runs, beside 0, 2 and 4 busy loops): 0.98-1.02
    ratio = first["cost"]["pct"] / _planted_share(tmp_path / "input")
    assert 0.9 < ratio < 1.35, (first["cost"], ratio)
