"""Interrupted sweeps: Ctrl-C (SIGINT) and a killed driver (SIGKILL) keep every finished run;
the interrupted run is marked (failed: interrupted) or left without a summary, and re-running
the same command redoes only what did not finish."""

import json
import signal
import subprocess
import time

import pandas as pd

from tests.conftest import BIN, REPO

ARGS = ["sweep", "experiments/quickstart.yaml", "--workers", "1", "--repeats", "2",
        "--set", "data.train_samples=2048", "--set", "data.val_samples=256", "--set", "train.max_epochs=3",
        "--set", "train.target_accuracy=1.0", "--set", "instrument.calibration_pairs=0"]


def _sweep(out, env):
    return subprocess.Popen([str(BIN / "scaling"), *ARGS, "--out", str(out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_until_second_run_trains(out, timeout_s=300):
    deadline = time.time() + timeout_s
    second = out / "runs" / "w1-r1"
    while time.time() < deadline:
        if (out / "runs" / "w1-r0" / "summary.json").exists() and (second / "workers" / "rank0.json").exists():
            return
        time.sleep(0.2)
    raise AssertionError("the second run never started training")


def test_ctrl_c_and_killed_driver_keep_finished_runs_and_resume(ray_cluster, tmp_path):
    out = tmp_path / "sweep"
    first_summary = out / "runs" / "w1-r0" / "summary.json"

    # Ctrl-C while the second run trains
    process = _sweep(out, ray_cluster["env"])
    _wait_until_second_run_trains(out)
    kept = first_summary.stat().st_mtime_ns
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output[-2000:]
    assert json.loads(first_summary.read_text())["status"] == "max_epochs"
    interrupted = json.loads((out / "runs" / "w1-r1" / "summary.json").read_text())
    assert interrupted["status"] == "failed" and interrupted["error"] == "interrupted"

    # the driver killed outright while the second run trains again: no summary is written at all
    (out / "runs" / "w1-r1" / "workers" / "rank0.json").unlink()
    process = _sweep(out, ray_cluster["env"])
    _wait_until_second_run_trains(out)
    process.kill()
    process.communicate(timeout=60)
    # the kill is what ended it: a sweep that had finished first would make what follows vacuous
    assert process.returncode == -signal.SIGKILL, process.returncode
    # the finished run kept as it was, and still listed as finished in the index
    assert first_summary.stat().st_mtime_ns == kept
    assert json.loads(first_summary.read_text())["status"] == "max_epochs"
    index = pd.read_parquet(out / "runs.parquet").set_index("run_key")
    assert index.loc["w1-r0", "status"] == "max_epochs"
    # the interrupted run left without a summary: the redo removed the old (interrupted) one, the
    # killed driver wrote none, so nothing claims the run finished or says how it failed
    second = out / "runs" / "w1-r1"
    assert (second / "workers" / "rank0.json").exists() and not (second / "summary.json").exists()

    # the same command again: the finished run is kept as it was, the other one redone
    process = _sweep(out, ray_cluster["env"])
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-2000:]
    assert "1 of 2 runs already finished, 1 to run" in output, output[-2000:]
    assert first_summary.stat().st_mtime_ns == kept
    index = pd.read_parquet(out / "runs.parquet")
    assert sorted(index["run_key"]) == ["w1-r0", "w1-r1"] and set(index["status"]) == {"max_epochs"}
    epochs = pd.read_parquet(out / "runs" / "w1-r1" / "epochs.parquet")
    assert list(epochs["epoch"]) == [1, 2, 3]
