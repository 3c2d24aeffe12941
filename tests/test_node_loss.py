"""A node lost mid-run, as a spot preemption loses it, on the minicluster (2 namespaced Ray nodes).

While a 2-worker run is in its second epoch (epoch 1's checkpoint registered by Ray Train's
controller), node 1 is preempted: its link goes down and every process in its namespace is
SIGKILLed (`minicluster.preempt`), no clean shutdown. The run is held in epoch 2's evaluation
(tests/held_model.py) until the preemption has landed, so it lands in epoch 2 however fast the
machine trains, and the runs can be small (1024 samples). Two outcomes, one run each:

- the node comes back (`minicluster.rejoin`, as an autoscaler's replacement would) within
  `failure.capacity_wait_s`: the run waits, resumes from epoch 1's checkpoint on 2 workers and
  finishes with every epoch once; the summary holds the restart, the time lost (at least the
  outage) and the worker counts, and TTA counts the time lost;
- it does not: the run fails once `failure.capacity_wait_s` has run out, with one line saying so,
  and the sweep it belongs to finishes (exit 1, the failure in its index); re-run once the node is
  back, the sweep resumes that run from its checkpoint. (That a re-run sweep keeps the runs that had
  finished, and goes on past a failed one, is proven without a minicluster: tests/test_sweep.py and
  tests/test_interrupts.py; a 1-worker run here, 45 s of Ray Train's start on 2 cores, added no claim.)

Runs on the session's minicluster (tests/conftest.py), whose head declares a silent node dead
within seconds (`minicluster.HEALTH_CHECK`); each test waits on states it observes (a checkpoint
registered, the node seen gone, the restart asking for its workers), never on a sleep. Needs
root with network-admin rights: skips with the reason where the probe finds none, fails where
`.ci/run` requires it. The numbers of a run are printed (pytest -s).
"""

import json
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from scaling.analysis.run_metrics import summarize_run
from tests.conftest import BIN, REPO, make_whole, registered_checkpoint_epoch, wait_for
from tests.held_model import held, hold, release

RUN_TIMEOUT_S = 480


RUN_SETTINGS = [
    "--set",
    "data.train_samples=1024",
    "--set",
    "data.val_samples=256",
    "--set",
    "train.max_epochs=2",
    # out of reach, so that a run trains both epochs; TTA is checked for a reached target below
    "--set",
    "train.target_accuracy=1.0",
    "--set",
    "train.eval_every=1",
    "--set",
    "instrument.calibration_pairs=2",
    "--set",
    "failure.max_failures=1",
]


def _in_cluster(name: str, *command: str) -> list[str]:
    return [str(BIN / "scaling"), "minicluster", "exec", "--name", name, "--", str(BIN / "scaling"), *command]


def _start_run(name: str, run_dir, capacity_wait_s: float, log) -> subprocess.Popen:
    return subprocess.Popen(
        _in_cluster(
            name,
            "run",
            "experiments/quickstart.yaml",
            "--workers",
            "2",
            "--out",
            str(run_dir),
            *RUN_SETTINGS,
            *HELD,
            "--set",
            f"failure.capacity_wait_s={capacity_wait_s}",
        ),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


# What Ray Train's controller says (its log reaches the driver's output) each time it asks for a
# worker group: the first start, then the restart after the lost node.
GROUP_START = "Attempting to start training worker group"


def _restart_asks_for_workers(log_path) -> bool:
    """The restart after the failure has asked for its worker group (and, the node being away,
    waits for room): the controller's second start of a group.

    Each line counts once: the minicluster's nodes share one temp dir, so node 1's log monitor
    forwards the head's log lines too, tagged `ip=<node 1>` (the driver, on the head, tags its own
    node's lines with no ip); counting those copies took the first start for the restart."""
    lines = Path(log_path).read_text(errors="replace").splitlines()
    return sum(GROUP_START in line and ", ip=" not in line for line in lines) >= 2


# The preempted runs' model: held at the gate the test makes (tests/held_model.py).
HELD = ["--set", "model.name=tests.held_model:held_small_cnn"]


def _hold_in_epoch_2(run_dir, at=None) -> Path:
    """Hold the run in `run_dir` in epoch 2's evaluation (one evaluation per epoch, eval_every=1:
    the second is epoch 2's), after epoch 1's checkpoint and before epoch 2 can end."""
    return hold(run_dir, after_evaluations=2, at=at)


def _preempt_in_epoch_2(name: str, run_dir, process, gate) -> float:
    """Preempt node 1 once epoch 1's checkpoint is registered and rank 1 (on node 1) is held in
    epoch 2, then let the run go on; returns when the node was lost."""
    from scaling.testbed import minicluster as mc

    try:
        wait_for(
            lambda: registered_checkpoint_epoch(run_dir) and held(gate, rank=1),
            300,
            "rank 1 held in epoch 2 with epoch 1's checkpoint registered",
            process,
        )
        epoch = registered_checkpoint_epoch(run_dir)
        lost_unix = mc.preempt(name, 1)
    finally:
        release(gate)  # rank 0 goes on (into the lost rank), the restarted workers run unheld
    assert epoch == 1, f"epoch {epoch}'s checkpoint was registered while epoch 2 was held"
    return lost_unix


@pytest.fixture(scope="module")
def node_back_in_time(minicluster, tmp_path_factory):
    """Node 1 lost in epoch 2, back once the head saw it gone and the restart waits for room;
    the run waits (up to 300 s)."""
    from scaling.testbed import minicluster as mc

    name = minicluster
    make_whole(name)
    run_dir = tmp_path_factory.mktemp("node_loss") / "rejoined"
    log_path = run_dir.parent / "output.log"
    gate = _hold_in_epoch_2(run_dir)
    with open(log_path, "w") as log:
        process = _start_run(name, run_dir, 300, log)
    try:
        lost_unix = _preempt_in_epoch_2(name, run_dir, process, gate)
        cluster = mc.load(name)
        wait_for(lambda: mc.alive_nodes(cluster) == 1, 120, "the head to see node 1 gone", process)
        seen_gone_unix = time.time()
        wait_for(lambda: _restart_asks_for_workers(log_path), 120, "the restart to ask for its workers", process)
        waiting_unix = time.time()
        mc.rejoin(name, 1)
        back_unix = time.time()
        process.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log_path.read_text()
    assert process.returncode == 0, output[-3000:]
    print(
        f"node 1 lost; head saw it gone after {seen_gone_unix - lost_unix:.1f} s; the restart waited for room "
        f"after {waiting_unix - lost_unix:.1f} s; back after {back_unix - lost_unix:.1f} s"
    )
    return {"run_dir": run_dir, "lost_unix": lost_unix, "back_unix": back_unix, "output": output}


def test_run_survives_a_lost_node_that_comes_back(node_back_in_time):
    run_dir, lost_unix, back_unix = (
        node_back_in_time["run_dir"],
        node_back_in_time["lost_unix"],
        node_back_in_time["back_unix"],
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        {
            k: summary[k]
            for k in (
                "status",
                "epochs_run",
                "restarts",
                "time_lost_s",
                "workers_first_attempt",
                "workers_last_attempt",
                "worker_count_changed",
                "num_nodes",
                "time_per_epoch_s",
                "run_wall_s",
            )
        }
    )
    assert summary["status"] == "max_epochs" and summary["epochs_run"] == 2 and summary["error"] is None
    assert summary["restarts"] == 1 and summary["tta_includes_restarts"]
    assert (summary["workers_first_attempt"], summary["workers_last_attempt"], summary["worker_count_changed"]) == (
        2,
        2,
        False,
    )
    # The time lost runs from epoch 1's checkpoint (taken before the preemption) to the restarted
    # group's first step (after the node was back): it holds the whole outage.
    assert summary["time_lost_s"] >= back_unix - lost_unix
    attempts = json.loads((run_dir / "attempts.json").read_text())["attempts"]
    assert [a["resumed_from_epoch"] for a in attempts] == [None, 1]
    assert attempts[1]["resume_point_unix"] < lost_unix < back_unix < attempts[1]["first_step_unix"]

    # every epoch once, on both nodes, each with its worker count
    epochs = pd.read_parquet(run_dir / "epochs.parquet")
    assert list(epochs["epoch"]) == [1, 2] and list(epochs["num_workers"]) == [2, 2]
    steps = pd.read_parquet(run_dir / "steps.parquet")
    train = steps[steps["kind"] == "train"]
    assert not train.duplicated(["rank", "step"]).any()
    assert train.groupby("epoch")["node_rank"].nunique().tolist() == [2, 2]

    # TTA counts the time lost for a target first reached after the restart (which resumed from
    # epoch 1), and not for one reached in epoch 1. Both cases on this run's own clocks, the target
    # placed by setting the accuracies (0 before the epoch that reaches it, 1 from it on): the run's
    # own accuracies may reach any target in epoch 1, which left only the case without the restart.
    evals = pd.read_parquet(run_dir / "evals.parquet")
    for reached in (1, 2):
        figures = summarize_run(
            steps,
            epochs.assign(val_accuracy=(epochs["epoch"] >= reached).astype(float)),
            0.5,
            2,
            attempts=attempts,
            evals=evals.assign(val_accuracy=(evals["epoch"] >= reached).astype(float)),
        )
        training = float(epochs.loc[epochs["epoch"] <= reached, "train_s"].sum())
        lost = summary["time_lost_s"] if reached == 2 else 0.0
        assert summary["time_lost_s"] > 0 and figures["epochs_to_target"] == reached
        assert figures["tta_s"] == pytest.approx(training + lost) and figures["tta_includes_restarts"] == (reached == 2)
        print(
            f"TTA reached in epoch {reached}: {figures['tta_s']:.1f} s = {training:.1f} s training "
            f"+ {lost:.1f} s lost; wall {figures['tta_wall_s']:.1f} s"
        )


def test_a_sweep_run_that_lost_its_node_fails_in_one_line_then_resumes(whole_minicluster, tmp_path):
    """The node stays away longer than failure.capacity_wait_s: the run fails with one line, the
    sweep finishes; once the node is back, re-running the sweep resumes that run from its
    checkpoint. One 2-worker run: a sweep's keeping its finished runs is tests/test_sweep.py's."""
    from scaling.testbed import minicluster as mc

    name = whole_minicluster
    capacity_wait_s = 10
    sweep_dir = tmp_path / "sweep"
    sweep = (
        "sweep",
        "experiments/quickstart.yaml",
        "--workers",
        "2",
        "--repeats",
        "1",
        "--out",
        str(sweep_dir),
        *RUN_SETTINGS,
        *HELD,
        "--set",
        f"failure.capacity_wait_s={capacity_wait_s}",
    )
    log_path = tmp_path / "output.log"
    # the gate lies outside the sweep directory (a sweep refuses a directory that holds anything else)
    gate = _hold_in_epoch_2(sweep_dir / "runs" / "w2-r0", at=tmp_path)
    with open(log_path, "w") as log:
        process = subprocess.Popen(_in_cluster(name, *sweep), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        lost_unix = _preempt_in_epoch_2(name, sweep_dir / "runs" / "w2-r0", process, gate)
        process.wait(timeout=RUN_TIMEOUT_S)
        ended_unix = time.time()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    mc.rejoin(name, 1)
    back_unix = time.time()
    assert process.returncode == 1, log_path.read_text()[-3000:]  # a run failed; the sweep finished
    runs = pd.read_parquet(sweep_dir / "runs.parquet").set_index("run_key")
    assert list(runs.index) == ["w2-r0"] and runs.loc["w2-r0", "status"] == "failed"
    assert runs.loc["w2-r0", "epochs_run"] == 1
    error = runs.loc["w2-r0", "error"]
    # The restart waited for room as long as it was told, by Ray Train's own account: this error is
    # made only from Ray Train's worker-group start timeout (launch.ray_train.capacity_timeout),
    # which the lab sets to capacity_wait_s. A hang would hit RUN_TIMEOUT_S; no wall-clock bound
    # that load could break.
    assert "\n" not in error and f"failure.capacity_wait_s={capacity_wait_s} s" in error and "2 workers" in error, error
    print(f"failed {ended_unix - lost_unix:.1f} s after the preemption: {error}")

    again = subprocess.run(_in_cluster(name, *sweep), cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "run w2-r0: resuming from its epoch 1 checkpoint" in again.stdout
    assert pd.read_parquet(sweep_dir / "runs.parquet").set_index("run_key").loc["w2-r0", "status"] == "max_epochs"
    run_dir = sweep_dir / "runs" / "w2-r0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "max_epochs" and summary["epochs_run"] == 2 and summary["error"] is None
    attempts = json.loads((run_dir / "attempts.json").read_text())["attempts"]
    assert [a["resumed_from_epoch"] for a in attempts] == [None, 1]
    # the time lost runs from epoch 1's checkpoint to the resumed run's first step: the failed wait,
    # the node's absence and the gap before the sweep was re-run, all of it
    assert summary["restarts"] == 1 and summary["time_lost_s"] >= back_unix - lost_unix
    epochs = pd.read_parquet(run_dir / "epochs.parquet")
    assert list(epochs["epoch"]) == [1, 2]
    train = pd.read_parquet(run_dir / "steps.parquet").query("kind == 'train'")
    assert not train.duplicated(["rank", "step"]).any() and sorted(train["epoch"].unique()) == [1, 2]


def test_an_elastic_run_goes_on_with_the_workers_left(whole_minicluster, tmp_path):
    """workers.min_workers=1: the run does not wait for node 1; it resumes from epoch 1's checkpoint
    on the one worker left, with the same global batch, and says so per epoch and in the summary."""
    name = whole_minicluster
    run_dir = tmp_path / "elastic"
    log_path = tmp_path / "output.log"
    gate = _hold_in_epoch_2(run_dir)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            _in_cluster(
                name,
                "run",
                "experiments/quickstart.yaml",
                "--workers",
                "2",
                "--out",
                str(run_dir),
                *RUN_SETTINGS,
                *HELD,
                "--set",
                "workers.min_workers=1",
                "--set",
                "failure.capacity_wait_s=300",
            ),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        _preempt_in_epoch_2(name, run_dir, process, gate)
        process.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, log_path.read_text()[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        {
            k: summary[k]
            for k in (
                "status",
                "restarts",
                "time_lost_s",
                "workers_first_attempt",
                "workers_last_attempt",
                "worker_count_changed",
                "global_batch",
            )
        }
    )
    assert summary["status"] == "max_epochs" and summary["restarts"] == 1
    assert (summary["workers_first_attempt"], summary["workers_last_attempt"], summary["worker_count_changed"]) == (
        2,
        1,
        True,
    )
    epochs = pd.read_parquet(run_dir / "epochs.parquet")
    assert list(epochs["epoch"]) == [1, 2] and list(epochs["num_workers"]) == [2, 1]
    # the same global batch throughout: the same samples and steps per epoch at either count
    assert epochs["samples"].nunique() == 1 and epochs["steps"].nunique() == 1
    train = pd.read_parquet(run_dir / "steps.parquet").query("kind == 'train'")
    assert sorted(train.groupby("epoch")["rank"].nunique()) == [1, 2]
    assert not train.duplicated(["rank", "step"]).any()


# ---- without a minicluster ----------------------------------------------------------------------


def test_capacity_timeout_is_one_line_naming_the_setting():
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
    from ray.train.v2.api.exceptions import ControllerError

    from scaling.config import ExperimentConfig
    from scaling.launch.ray_train import capacity_timeout

    cfg = ExperimentConfig()
    cfg.failure.capacity_wait_s = 45.0
    error = capacity_timeout(ControllerError(WorkerGroupStartupTimeoutError(num_workers=4)), cfg)
    assert "\n" not in str(error) and "no room for 4 workers within failure.capacity_wait_s=45 s" in str(error)
    assert capacity_timeout(ControllerError(RuntimeError("something else")), cfg) is None
    assert capacity_timeout(RuntimeError("a worker's own error"), cfg) is None


def test_the_head_cannot_be_preempted(monkeypatch, tmp_path):
    import os

    from scaling.errors import UsageError
    from scaling.testbed import minicluster as mc

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(mc, "STATE_ROOT", tmp_path)
    cluster = mc.MiniCluster(
        name="n24x",
        subnet="10.216.0.0/24",
        bridge="smn24xbr",
        bridge_ip="10.216.0.1",
        bandwidth=None,
        cpus_per_node=1,
        nodes=[mc.Node(i, f"scaling-n24x-n{i}", f"10.216.0.{10 + i}", f"smn24xh{i}") for i in range(2)],
    )
    mc._save(cluster)
    for action in (mc.preempt, mc.rejoin):
        with pytest.raises(UsageError, match="node 0 is the head"):
            action("n24x", 0)
        with pytest.raises(UsageError, match="1 to 1"):
            action("n24x", 2)
