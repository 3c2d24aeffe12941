"""One real 2-worker Ray Train run on gloo, checked against the run-directory contract.

Also: a cluster too small for the request is refused at once (exit 2, one line, nothing
written), and a run that fails mid-way leaves summary.json with status `failed`.
"""

import json
import os
import time

import pandas as pd
import pytest
import yaml

from scaling.config import load_config
from scaling.launch.run import execute_run
from tests.conftest import REPO, run_cli

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
SMALL = ["data.train_samples=2048", "data.val_samples=512", "train.max_epochs=3", "instrument.calibration_pairs=4"]

SUMMARY_KEYS = {
    "run_id", "model", "dataset", "backend", "num_workers", "num_nodes", "per_worker_batch", "global_batch",
    "status", "target_accuracy", "best_accuracy", "epochs_run", "epochs_to_target", "tta_s", "tta_wall_s",
    "time_per_epoch_s", "throughput_samples_per_s", "step_s", "compute_s", "allreduce_s", "exposed_comm_s",
    "comm_overhead_pct", "versions", "hardware",
}
EPOCH_COLUMNS = {"epoch", "train_s", "eval_s", "calibration_s", "train_loss", "val_accuracy", "samples",
                 "throughput_samples_per_s", "elapsed_train_s"}
STEP_COLUMNS = {"data_s", "forward_s", "backward_s", "optimizer_s", "step_s", "allreduce_s", "exposed_comm_s",
                "samples", "epoch", "step", "rank", "warmup"}


@pytest.fixture(scope="module")
def ray_run(ray_connected, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ray") / "run"
    # a low target, so that the run stops at the target (and the TTA path is exercised)
    cfg = load_config(QUICKSTART, overrides=SMALL + ["train.target_accuracy=0.3"], num_workers=2)
    summary = execute_run(cfg, run_dir, launcher="ray")
    return run_dir, summary


def test_run_directory_matches_contract(ray_run):
    run_dir, summary = ray_run
    assert summary["status"] == "reached_target", summary["error"]
    assert SUMMARY_KEYS <= set(summary)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["run_id"] == summary["run_id"]
    assert summary["num_workers"] == 2 and summary["num_nodes"] == 1 and summary["global_batch"] == 128
    assert summary["backend"] == "gloo"
    assert set(summary["versions"]) == {"python", "torch", "ray"} and summary["versions"]["ray"] == "2.60.0"
    assert summary["hardware"]["cpu_count"] >= 1 and summary["hardware"]["gpu_count"] == 0
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["workers"]["num_workers"] == 2 and resolved["train"]["target_accuracy"] == 0.3


def test_records_are_complete_and_consistent(ray_run):
    run_dir, summary = ray_run
    epochs = pd.read_parquet(run_dir / "epochs.parquet")
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert EPOCH_COLUMNS <= set(epochs.columns) and STEP_COLUMNS <= set(steps.columns)
    assert not (run_dir / "parts").exists()
    assert list(epochs["epoch"]) == list(range(1, summary["epochs_run"] + 1))
    assert summary["epochs_to_target"] == summary["epochs_run"]
    assert summary["tta_s"] == pytest.approx(epochs["train_s"].sum())
    train = steps[steps["kind"] == "train"]
    # both ranks, the same steps each: 2048 samples / 2 ranks / 64 per step = 16 steps per epoch
    assert sorted(train["rank"].unique()) == [0, 1]
    assert train.groupby("rank").size().tolist() == [16 * summary["epochs_run"]] * 2
    assert train["warmup"].sum() == 2 * 5
    phases = train[["data_s", "forward_s", "backward_s", "optimizer_s"]].sum(axis=1)
    assert (phases - train["step_s"]).abs().max() < 1e-9
    assert (train["exposed_comm_s"] <= train["backward_s"] + 1e-9).all()
    assert (train["allreduce_s"] > 0).all() and (train["num_buckets"] >= 1).all()
    calib = steps[steps["kind"] != "train"]
    assert set(calib["kind"]) == {"calib_sync", "calib_nosync"}
    assert (calib.loc[calib["kind"] == "calib_nosync", "allreduce_s"] == 0).all()
    assert summary["comm_overhead_pct"] is not None and summary["allreduce_s"] > 0
    # the training thread's CPU time: some, and never more than the epoch's wall time
    assert (epochs["train_thread_cpu_s"] > 0).all()
    assert (epochs["train_thread_cpu_s"] <= epochs["train_s"] + 0.01).all()
    assert (epochs[["train_preemptions", "train_minor_faults"]] >= 0).all().all()


def test_exports_dawnbench_and_mlperf(ray_run):
    from scaling.exports import read_mlperf_log

    run_dir, summary = ray_run
    tsv = pd.read_csv(run_dir / "dawnbench.tsv", sep="\t")
    assert list(tsv.columns) == ["epoch", "hours", "top1Accuracy", "top5Accuracy"] and len(tsv) == summary["epochs_run"]
    assert tsv["hours"].iloc[-1] * 3600 == pytest.approx(summary["tta_s"], rel=1e-3)
    assert json.loads((run_dir / "dawnbench.json").read_text())["model"] == "small_cnn"
    events = read_mlperf_log((run_dir / "mlperf.log").read_text())
    keys = [e["key"] for e in events]
    assert keys[0] == "submission_division" and events[0]["value"] == "open"
    assert keys.count("eval_accuracy") == summary["epochs_run"] and keys[-1] == "run_stop"
    assert events[-1]["metadata"]["status"] == "success"


def test_too_many_workers_refused_at_once(ray_cluster, tmp_path):
    out = tmp_path / "run"
    result = run_cli("run", str(QUICKSTART), "--workers", "64", "--out", str(out), env=ray_cluster["env"], timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "64 workers" in lines[0] and "2" in lines[0], result.stderr
    assert not out.exists()


def test_gpus_the_cluster_lacks_refused_at_once(ray_cluster, tmp_path):
    out = tmp_path / "run"
    result = run_cli("run", str(QUICKSTART), "--workers", "1", "--set", "workers.use_gpu=true", "--out", str(out),
                     env=ray_cluster["env"], timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "GPUs" in result.stderr and "has 0" in result.stderr
    assert not out.exists()


def test_unreachable_ray_address_answered_in_bounded_time(tmp_path):
    out = tmp_path / "run"
    start = time.monotonic()
    # a port nothing listens on: refused at once; ray.init alone would wait minutes for the GCS
    result = run_cli("run", str(QUICKSTART), "--out", str(out), env={**os.environ, "RAY_ADDRESS": "127.0.0.1:9"}, timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "cannot reach the Ray cluster at RAY_ADDRESS=127.0.0.1:9" in result.stderr
    assert time.monotonic() - start < 60 and not out.exists()


def test_failed_run_leaves_failed_summary(ray_connected, tmp_path):
    cfg = load_config(QUICKSTART, overrides=SMALL + ["instrument.fail_at_step=20"], num_workers=2)
    summary = execute_run(cfg, tmp_path / "run", launcher="ray")
    assert summary["status"] == "failed"
    assert "injected failure at step 20" in summary["error"]
    assert summary["epochs_run"] == 1  # epoch 1 (steps 0-15) was recorded before the failure
    assert (tmp_path / "run" / "summary.json").exists()
