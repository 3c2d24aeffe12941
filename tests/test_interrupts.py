"""Interrupted sweeps: Ctrl-C (SIGINT) and a killed driver (SIGKILL) keep every finished run;
the interrupted run is marked (failed: interrupted) or left without a summary, and re-running
the same command redoes only what did not finish.

The sweep's second run is held at its first training step (tests/held_model.py) until the
signal has landed, so the signal reaches a run that trains, however fast the CPU is. Two
commands, three Ray Train runs: the first finishes one run and is interrupted in the second; the
same command again keeps the finished run, redoes only the interrupted one, and is killed in it.
That a redone run then finishes is the other resumed sweeps' proof (tests/test_sweep.py, a failed
run redone; tests/test_node_loss.py, a failed run resumed from its checkpoint on Ray): a third
command here would be one more Ray Train start for the same claim.
"""

import json
import signal
import subprocess

import pandas as pd

from tests.conftest import BIN, REPO, wait_for
from tests.held_model import held, hold

ARGS = [
    "sweep",
    "experiments/quickstart.yaml",
    "--workers",
    "1",
    "--repeats",
    "2",
    "--set",
    "model.name=tests.held_model:held_small_cnn",
    "--set",
    "data.train_samples=512",
    "--set",
    "data.val_samples=256",
    "--set",
    "train.max_epochs=1",
    "--set",
    "train.eval_every=1",
    "--set",
    "train.target_accuracy=1.0",
    "--set",
    "instrument.calibration_pairs=0",
]


def _sweep(out, env, log):
    # a file, not a pipe: a full pipe would stall the sweep while the test waits on it
    with open(log, "w") as sink:
        return subprocess.Popen(
            [str(BIN / "scaling"), *ARGS, "--out", str(out)],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )


def test_ctrl_c_and_killed_driver_keep_finished_runs_and_resume(ray_connected, tmp_path):
    ray_cluster = ray_connected
    out = tmp_path / "sweep"
    log = tmp_path / "sweep.log"
    first_summary = out / "runs" / "w1-r0" / "summary.json"
    second = out / "runs" / "w1-r1"
    # the gate lies outside the sweep directory: a sweep refuses a directory that holds anything else
    gate = hold(second, at=tmp_path)

    # Ctrl-C while the second run trains (held at its first step; the first run is done by then)
    process = _sweep(out, ray_cluster["env"], log)
    wait_for(lambda: held(gate), 300, "the second run held at its first step", process)
    assert json.loads(first_summary.read_text())["status"] == "max_epochs"
    kept = first_summary.stat().st_mtime_ns
    process.send_signal(signal.SIGINT)
    process.wait(timeout=120)
    assert process.returncode == 130, log.read_text()[-2000:]
    assert json.loads(first_summary.read_text())["status"] == "max_epochs"
    interrupted = json.loads((second / "summary.json").read_text())
    assert interrupted["status"] == "failed" and interrupted["error"] == "interrupted"

    # the same command again: it keeps the finished run and redoes only the interrupted one; the driver
    # is killed outright while that run trains: no summary is written at all
    (second / "workers" / "rank0.json").unlink()
    gate = hold(second, at=tmp_path)  # the first hold's marker is gone: the next one is this run's
    process = _sweep(out, ray_cluster["env"], log)
    wait_for(lambda: held(gate), 300, "the redone second run held at its first step", process)
    assert "resuming: 1 of 2 runs already finished, 1 to run" in log.read_text(), log.read_text()[-2000:]
    process.kill()
    process.wait(timeout=60)
    # the kill is what ended it: a sweep that had finished first would make what follows vacuous
    assert process.returncode == -signal.SIGKILL, process.returncode
    # the finished run kept as it was, and still listed as finished in the index
    assert first_summary.stat().st_mtime_ns == kept
    assert json.loads(first_summary.read_text())["status"] == "max_epochs"
    index = pd.read_parquet(out / "runs.parquet").set_index("run_key")
    assert index.loc["w1-r0", "status"] == "max_epochs"
    # the interrupted run left without a summary: the redo removed the old (interrupted) one, the
    # killed driver wrote none, so nothing claims the run finished or says how it failed
    assert (second / "workers" / "rank0.json").exists() and not (second / "summary.json").exists()
