"""Faults: a worker process killed mid-epoch is restarted by Ray Train from the last checkpoint
and the run finishes with its records whole; the restart and the time it cost are in the
summary and in TTA.

One real restarted run (module fixture): every rank is held (tests/held_model.py) in epoch 2's
evaluation, after Ray Train registered epoch 1's checkpoint and before epoch 2 can end; rank 1
is SIGKILLed there and the hold let go, so the kill lands inside epoch 2 however fast the
machine is; the records then prove where it landed (the restart resumed from epoch 1). On
that run: the restart itself, and TTA = sum of train_s + time_lost_s with the run's wall clock
continuing across the restart. The test holds the run OUTAGE_S between seeing epoch 1's checkpoint
registered and the kill: an outage on its own clock that the time lost, and TTA, must hold.
"""

import json
import os
import signal
import threading
import time

import pandas as pd
import pytest

from scaling.analysis.run_metrics import restarts_and_time_lost, summarize_run
from tests.conftest import REPO, registered_checkpoint_epoch, wait_for
from tests.held_model import held, hold, release

OUTAGE_S = 2.0  # the injected outage: held between the checkpoint's registration and the kill


class _RunInThisProcess:
    """What wait_for asks of a run: whether it has ended (poll), for a run this process drives."""

    returncode = None

    def poll(self):
        return self.returncode


@pytest.fixture(scope="module")
def restarted_run(ray_connected, tmp_path_factory):
    """The run in this process (execute_run, as `scaling run` calls it, attached to the session's head:
    the console script's start, its imports and ray.init, proves nothing here); a thread holds, waits,
    kills and lets go, as the dashboard's evaluator does (the run owns the main thread: Ray Train sets
    signal handlers)."""
    from scaling.config import load_config
    from scaling.launch.run import execute_run

    run_dir = tmp_path_factory.mktemp("failures") / "killed"
    gate = hold(run_dir, after_evaluations=2)  # one evaluation per epoch (eval_every=1): the second is epoch 2's
    cfg = load_config(
        REPO / "experiments" / "quickstart.yaml",
        num_workers=2,
        overrides=[
            "model.name=tests.held_model:held_small_cnn",
            # 16 steps per rank and epoch, enough that validation accuracy rises epoch by epoch (0.25,
            # 0.29, 0.49 here): the TTA test's target, epoch 3's accuracy, is reached after the restart
            "data.train_samples=2048",
            "data.val_samples=256",
            "train.max_epochs=3",
            "train.target_accuracy=1.0",
            "instrument.calibration_pairs=2",
            # one evaluation per epoch, at its end: TTA is then sum(train_s) + time lost under either
            # TTA rule (first evaluation at target, or DAWNBench's epoch end)
            "train.eval_every=1",
            "failure.max_failures=1",
        ],
    )
    run, seen, failure = _RunInThisProcess(), {}, []

    def kill_rank_1_in_epoch_2():
        try:
            # Rank 1 held in epoch 2 and epoch 1's checkpoint registered (a kill before registration
            # would restart from scratch); epoch 2 cannot end, so no later checkpoint can exist.
            wait_for(
                lambda: held(gate, rank=1) and registered_checkpoint_epoch(run_dir),
                300,
                "rank 1 held in epoch 2 with epoch 1's checkpoint registered",
                run,
            )
            seen["registered_unix"] = time.time()  # the checkpoint the restart resumes from was taken before this
            seen["epoch"] = registered_checkpoint_epoch(run_dir)
            seen["victim"] = json.loads((run_dir / "workers" / "rank1.json").read_text())
            seen["held_pid"] = held(gate, rank=1)["pid"]
            # A known outage, injected: the run stays held this long after the checkpoint before the kill,
            # so the time lost must hold it (a ground truth the attempts' own timestamps cannot supply)
            time.sleep(OUTAGE_S)
            seen["kill_unix"] = time.time()
            os.kill(seen["victim"]["pid"], signal.SIGKILL)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)
        finally:
            release(gate)  # the restarted workers run on unheld

    killer = threading.Thread(target=kill_rank_1_in_epoch_2, daemon=True)
    killer.start()
    try:
        summary = execute_run(cfg, run_dir, launcher="ray")
    finally:
        run.returncode = 0
        killer.join(timeout=60)
        release(gate)
    assert not failure, failure
    assert seen["held_pid"] == seen["victim"]["pid"], "the held rank 1 is not the one the records name"
    assert seen["epoch"] == 1, f"epoch {seen['epoch']}'s checkpoint was registered while epoch 2 was held"
    assert summary["status"] == "max_epochs", summary["error"]
    return {"run_dir": run_dir, **seen}


def test_killed_worker_is_restarted_from_checkpoint(restarted_run):
    run_dir, victim, kill_unix = restarted_run["run_dir"], restarted_run["victim"], restarted_run["kill_unix"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "max_epochs" and summary["epochs_run"] == 3
    assert summary["restarts"] == 1 and summary["time_lost_s"] > 0 and summary["tta_includes_restarts"]
    # Where the kill landed, from the records: after epoch 1's checkpoint and before epoch 2's
    # (there is one per epoch but the last), so inside epoch 2; the restart resumed from epoch 1.
    attempts = json.loads((run_dir / "attempts.json").read_text())["attempts"]
    assert [a["resumed_from_epoch"] for a in attempts] == [None, 1], attempts
    assert attempts[1]["resume_point_unix"] < kill_unix < attempts[1]["first_step_unix"], (kill_unix, attempts)
    print(
        f"killed {kill_unix - attempts[1]['resume_point_unix']:.2f} s after epoch 1's checkpoint was taken; "
        f"restarted {attempts[1]['first_step_unix'] - kill_unix:.2f} s after the kill"
    )
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


def test_tta_of_the_restarted_run_counts_the_time_lost(restarted_run):
    """tta_s = sum of train_s + time_lost_s, and the wall clock runs on across the restart."""
    run_dir = restarted_run["run_dir"]
    summary = json.loads((run_dir / "summary.json").read_text())
    attempts = json.loads((run_dir / "attempts.json").read_text())["attempts"]
    epochs = pd.read_parquet(run_dir / "epochs.parquet").set_index("epoch")
    steps = pd.read_parquet(run_dir / "steps.parquet")

    # time lost, by definition the restart's first step minus when the checkpoint it resumed from was taken
    lost = attempts[1]["first_step_unix"] - attempts[1]["resume_point_unix"]
    assert summary["time_lost_s"] == pytest.approx(lost) and lost > 0
    # against the test's own clock: it holds the injected outage (from after the checkpoint was registered
    # to the kill, both seen here; the restart's first step comes after the kill), and no more than the
    # wall clock between epoch 1's end and epoch 2's, which also holds epoch 2's own training
    outage = restarted_run["kill_unix"] - restarted_run["registered_unix"]
    assert outage >= OUTAGE_S and lost > outage, (lost, outage)

    # The wall clock is the first attempt's: epoch 2 (the restarted attempt's first) ends after
    # epoch 1, the time lost and its own training; a clock restarted with the attempt would give less.
    wall = epochs["elapsed_wall_s"]
    assert wall.is_monotonic_increasing
    assert wall[2] >= wall[1] + lost + epochs.loc[2, "train_s"], (wall.to_dict(), lost)
    assert wall[3] >= wall[2] + epochs.loc[3, "train_s"]
    # and so is the training clock: epoch 2's elapsed training time starts from epoch 1's, not from 0
    assert epochs["elapsed_train_s"].to_numpy() == pytest.approx(epochs["train_s"].cumsum().to_numpy())

    # TTA for a target this run reached (its last epoch's accuracy; the run's own target, 1.0,
    # is out of reach so that it runs all three epochs): what summary.json would say.
    target = float(epochs.loc[3, "val_accuracy"])
    reached = int(epochs.index[epochs["val_accuracy"] >= target][0])
    assert reached == 3, (
        f"the target was reached in epoch {reached}, before the restart: the time lost is no part of it"
    )
    profile = json.loads((run_dir / "compute_profile.json").read_text())
    evals = pd.read_parquet(run_dir / "evals.parquet") if (run_dir / "evals.parquet").exists() else None
    figures = summarize_run(steps, epochs.reset_index(), target, summary["num_workers"], profile, attempts, evals=evals)
    assert figures["epochs_to_target"] == reached
    assert figures["tta_s"] == pytest.approx(epochs.loc[:reached, "train_s"].sum() + lost)
    assert figures["tta_s"] > epochs.loc[:reached, "train_s"].sum() + outage  # the outage the test injected counts
    assert figures["tta_includes_restarts"] and figures["restarts"] == 1
    # the wall clock from the first attempt's first step holds all that training and the time lost
    assert figures["tta_s"] <= figures["tta_wall_s"] <= wall[reached] + 1e-6


def test_time_lost_to_restarts_counts_in_tta():
    attempts = [
        {"first_step_unix": 100.0, "resume_point_unix": None},
        {"first_step_unix": 130.0, "resume_point_unix": 110.0},  # checkpoint at 110, back at 130: 20 s lost
    ]
    assert restarts_and_time_lost(attempts) == (1, 20.0)
    epochs = pd.DataFrame(
        {
            "epoch": [1, 2],
            "train_s": [5.0, 5.0],
            "val_accuracy": [0.5, 0.9],
            "samples": [10, 10],
            "calibration_s": [0, 0],
            "eval_s": [0, 0],
            "elapsed_wall_s": [6.0, 40.0],
        }
    )
    summary = summarize_run(pd.DataFrame(), epochs, 0.8, 2, attempts=attempts)
    assert summary["tta_s"] == 30.0 and summary["restarts"] == 1 and summary["tta_includes_restarts"]
    assert restarts_and_time_lost([{"first_step_unix": 1.0, "resume_point_unix": None}]) == (0, 0.0)


def test_a_restart_after_the_target_was_reached_is_no_part_of_tta():
    """Reached in epoch 2; the restart resumed from epoch 2's checkpoint (lost in epoch 3): the
    run lost 20 s, the time to accuracy did not. Resumed from epoch 1, it redid epoch 2: counted."""
    epochs = pd.DataFrame(
        {
            "epoch": [1, 2, 3],
            "train_s": [5.0, 5.0, 5.0],
            "val_accuracy": [0.5, 0.9, 0.95],
            "samples": [10, 10, 10],
            "calibration_s": [0, 0, 0],
            "eval_s": [0, 0, 0],
            "elapsed_wall_s": [6.0, 12.0, 40.0],
        }
    )
    after = [
        {"first_step_unix": 100.0, "resume_point_unix": None, "resumed_from_epoch": None},
        {"first_step_unix": 130.0, "resume_point_unix": 110.0, "resumed_from_epoch": 2},
    ]
    summary = summarize_run(pd.DataFrame(), epochs, 0.8, 2, attempts=after)
    assert summary["time_lost_s"] == 20.0 and summary["tta_s"] == 10.0 and not summary["tta_includes_restarts"]
    before = [after[0], {**after[1], "resumed_from_epoch": 1}]
    summary = summarize_run(pd.DataFrame(), epochs, 0.8, 2, attempts=before)
    assert summary["tta_s"] == 30.0 and summary["tta_includes_restarts"]
