"""Faults: a worker process killed mid-epoch is restarted by Ray Train from the last checkpoint
and the run finishes with its records whole; the restart and the time it cost are in the
summary and in TTA."""

import json
import os
import signal
import subprocess
import time

import pandas as pd

from scaling.analysis.run_metrics import restarts_and_time_lost, summarize_run
from tests.conftest import BIN, REPO


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _epochs_written(run_dir):
    path = run_dir / "epochs.parquet"
    try:
        return len(pd.read_parquet(path)) if path.exists() else 0
    except Exception:  # being replaced at this instant
        return 0


def test_killed_worker_is_restarted_from_checkpoint(ray_cluster, tmp_path):
    run_dir = tmp_path / "killed"
    process = subprocess.Popen(
        [str(BIN / "scaling"), "run", "experiments/quickstart.yaml", "--workers", "2", "--out", str(run_dir),
         "--set", "data.train_samples=4096", "--set", "data.val_samples=256", "--set", "train.max_epochs=3",
         "--set", "train.target_accuracy=1.0", "--set", "instrument.calibration_pairs=2",
         "--set", "failure.max_failures=1"],
        cwd=REPO, env=ray_cluster["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        _wait_for(lambda: _epochs_written(run_dir) >= 1, 240, "epoch 1")
        victim = json.loads((run_dir / "workers" / "rank1.json").read_text())
        time.sleep(0.5)  # into epoch 2
        os.kill(victim["pid"], signal.SIGKILL)
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "max_epochs" and summary["epochs_run"] == 3
    assert summary["restarts"] == 1 and summary["time_lost_s"] > 0 and summary["tta_includes_restarts"]
    attempts = json.loads((run_dir / "attempts.json").read_text())["attempts"]
    assert [a["resumed_from_epoch"] for a in attempts] == [None, 1]
    epochs = pd.read_parquet(run_dir / "epochs.parquet")
    assert list(epochs["epoch"]) == [1, 2, 3]  # no gap, no duplicate
    steps = pd.read_parquet(run_dir / "steps.parquet")
    train = steps[steps["kind"] == "train"]
    assert sorted(train["epoch"].unique()) == [1, 2, 3]
    assert not train.duplicated(["rank", "step"]).any()
    per_rank = train.groupby("rank")["step"].agg(["min", "max", "count"])
    assert (per_rank["count"] == per_rank["max"] - per_rank["min"] + 1).all()  # the step counter continued
    # the new rank 1 is another process
    assert json.loads((run_dir / "workers" / "rank1.json").read_text())["pid"] != victim["pid"]


def test_time_lost_to_restarts_counts_in_tta():
    attempts = [
        {"first_step_unix": 100.0, "resume_point_unix": None},
        {"first_step_unix": 130.0, "resume_point_unix": 110.0},  # checkpoint at 110, back at 130: 20 s lost
    ]
    assert restarts_and_time_lost(attempts) == (1, 20.0)
    epochs = pd.DataFrame({"epoch": [1, 2], "train_s": [5.0, 5.0], "val_accuracy": [0.5, 0.9], "samples": [10, 10],
                           "calibration_s": [0, 0], "eval_s": [0, 0], "elapsed_wall_s": [6.0, 40.0]})
    summary = summarize_run(pd.DataFrame(), epochs, 0.8, 2, attempts=attempts)
    assert summary["tta_s"] == 30.0 and summary["restarts"] == 1 and summary["tta_includes_restarts"]
    assert restarts_and_time_lost([{"first_step_unix": 1.0, "resume_point_unix": None}]) == (0, 0.0)
