"""`scaling compare A B` (scaling/analysis/compare.py, scaling/compare.py): a planted slowdown is named,
with its interval and a non-zero exit; the same job twice is within the noise.

Runs are made of generated records: 2 ranks, 4 epochs of 40 steps of about 100 ms (± 5 ms of noise,
seeded), exposed communication 10 ms on every 5th step (the timed ones). The planted slowdown adds
10 ms to every step: 10%, where the blocks' means vary by about 1 ms.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from scaling.analysis import compare
from scaling.cli import main
from scaling.results import RunDir, rank_part_path
from tests.fake_sweep import make_fake_sweep


def _make_run(path, seed: int, slower_s: float = 0.0, epochs: int = 4, steps: int = 40) -> RunDir:
    rng = np.random.default_rng(seed)
    run = RunDir(path)
    run.steps_path.mkdir(parents=True)
    epoch_rows = []
    for epoch in range(1, epochs + 1):
        for rank in (0, 1):
            step_s = 0.100 + slower_s + rng.normal(0, 0.005, steps)
            timed = np.arange(steps) % 5 == 0
            pd.DataFrame(
                {
                    "epoch": epoch,
                    "step": np.arange(steps) + (epoch - 1) * steps,
                    "rank": rank,
                    "kind": "train",
                    "warmup": False,
                    "step_s": step_s,
                    "exposed_comm_s": np.where(timed, 0.010, np.nan),
                    "allreduce_s": np.where(timed, 0.030, np.nan),
                }
            ).to_parquet(rank_part_path(run.steps_path, rank, epoch))
        epoch_rows.append({"epoch": epoch, "train_s": steps * (0.100 + slower_s), "samples": steps * 64})
    pd.DataFrame(epoch_rows).to_parquet(run.epochs_path)
    run.summary_path.write_text(
        json.dumps({"status": "max_epochs", "tta_s": None, "mfu": 0.3, "comm_overhead_pct": 12.0})
    )
    return run


def test_a_planted_slowdown_is_worse_beyond_the_noise_and_fails_the_exit(tmp_path, capsys):
    base, same, slow = (_make_run(tmp_path / n, seed, s) for n, seed, s in (("a", 0, 0), ("b", 1, 0), ("c", 2, 0.010)))
    assert main(["compare", str(base.path), str(same.path), "--json"]) == 0
    rows = {r["figure"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["step_s"]["verdict"] == "within noise" and rows["exposed_comm_pct"]["verdict"] == "within noise"
    assert rows["mfu"]["verdict"] == "no interval"  # measured once per run

    assert main(["compare", str(base.path), str(slow.path), "--json"]) == 1
    rows = {r["figure"]: r for r in json.loads(capsys.readouterr().out)}
    step = rows["step_s"]
    assert step["verdict"] == "worse" and step["change_pct"] == pytest.approx(10.0, abs=1.5)
    assert step["change_lo_pct"] < 10 < step["change_hi_pct"] and step["change_lo_pct"] > 5
    assert rows["throughput_samples_per_s"]["verdict"] == "worse"  # fewer samples per second
    # the same exposed time over a longer step: a smaller share, which is no gain (neither better nor worse)
    assert rows["exposed_comm_pct"]["verdict"] == "lower" and rows["exposed_comm_pct"]["change_pct"] < 0

    assert main(["compare", str(base.path), str(slow.path)]) == 1  # the table, for a person
    out = capsys.readouterr().out
    assert "step_s" in out and "worse" in out and "95%" in out


def test_two_sweeps_are_compared_point_by_point(tmp_path, capsys):
    a = make_fake_sweep(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    assert main(["compare", str(a), str(b), "--json"]) == 0  # the same runs: no change at all
    rows = json.loads(capsys.readouterr().out)
    assert {r["point"] for r in rows} == {"1 workers", "2 workers", "4 workers"}
    assert all(r["change_pct"] == 0 for r in rows if r["change_pct"] is not None)
    runs = pd.read_parquet(b / "runs.parquet")
    runs["step_s"] *= 1.5  # every run of B half as slow again
    runs.to_parquet(b / "runs.parquet")
    assert main(["compare", str(a), str(b), "--json"]) == 1
    steps = [r for r in json.loads(capsys.readouterr().out) if r["figure"] == "step_s"]
    assert {r["verdict"] for r in steps} == {"worse"}
    assert all(r["change_pct"] == pytest.approx(50.0) for r in steps)


def test_a_run_and_a_sweep_are_refused_in_one_line(tmp_path, capsys):
    run = _make_run(tmp_path / "run", 0)
    sweep = make_fake_sweep(tmp_path / "sweeps")
    assert main(["compare", str(run.path), str(sweep)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compare two runs or two sweeps" in err


def test_a_change_within_one_observation_has_no_interval():
    row = compare.change(np.array([1.0]), np.array([2.0]), "mean", -1)
    assert row["verdict"] == "no interval" and row["change_pct"] == pytest.approx(100.0)
