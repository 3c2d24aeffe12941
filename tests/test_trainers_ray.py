"""The trainers' callbacks under Ray Train, as Ray's guides write the jobs, on the session's Ray head.

`scaling run` launches examples/trainers/hf_trainer.py (`transformers.Trainer`,
`ray.train.huggingface.transformers.prepare_trainer`) and examples/trainers/lightning_job.py
(`lightning.Trainer` with `ray.train.lightning.RayDDPStrategy` and `prepare_trainer`) on 2 Ray
Train workers, each measured by its one callback line, with no run directory given (the launcher
hands the run's over). What is proven, for each: the run directory is the lab's (summary, both
ranks' step records), a step is an optimizer step with the trainer's accumulation, and the
figures a user reads come out (tokens/s, MFU and the token all-gather for the HF model; the
validation loss for Lightning). tests/test_trainers.py holds the ground truths on the plain
launcher's processes: the same callbacks, the same code path below Ray.
"""

from __future__ import annotations

import pandas as pd
import pytest

from scaling.config import load_config
from scaling.launch.run import execute_run
from tests.conftest import REPO

pytest.importorskip("transformers")
pytest.importorskip("lightning")

SWEEP = REPO / "examples" / "trainers" / "hf_sweep.yaml"
JOBS = {
    # two epochs: the second epoch's first step fetches its batches after the first epoch's evaluation
    "hf": ["train.max_epochs=2", "train.function_config.num_train=128"],
    "lightning": [
        "train.function=examples.trainers.lightning_job:train_func",
        "train.max_epochs=1",
        "train.per_worker_batch=32",
        "train.function_config.num_train=1024",
        "train.function_config.accumulate=2",
        "train.function_config.target_loss=0.1",
    ],
}


@pytest.fixture(scope="module")
def runs(ray_connected, tmp_path_factory):
    out = tmp_path_factory.mktemp("trainers-ray")
    results = {}
    for name, overrides in JOBS.items():
        cfg = load_config(SWEEP, overrides=overrides, num_workers=2)
        results[name] = (out / name, execute_run(cfg, out / name, launcher="ray"))
    return results


@pytest.mark.parametrize("name", list(JOBS))
def test_a_trainer_job_under_ray_train_gets_the_labs_run_directory(runs, name):
    run_dir, summary = runs[name]
    assert summary["status"] in ("max_epochs", "reached_target"), summary.get("error")
    assert summary["num_workers"] == 2 and summary["backend"] == "gloo"
    steps = pd.read_parquet(run_dir / "steps.parquet")
    train = steps[steps["kind"] == "train"]
    assert set(train["rank"]) == {0, 1}
    # a step is an optimizer step: 2 micro-batches, the last synchronised
    assert (train["micro_batches"] == 2).all() and (train["synced_micro_batches"].dropna() == 1).all()
    assert summary["step_s"] > 0 and summary["exposed_comm_s"] is not None
    assert summary["throughput_samples_per_s"] > 0


def test_the_hf_trainer_under_ray_train_gets_tokens_mfu_and_its_token_all_gather(runs):
    run_dir, summary = runs["hf"]
    assert summary["throughput_tokens_per_s"] > 0 and summary["mfu"] > 0
    train = pd.read_parquet(run_dir / "steps.parquet").query("kind == 'train'")
    # one per optimizer step, the second epoch's first step too (its fetch follows an evaluation)
    assert set(train["epoch"]) == {1, 2}
    assert (train["token_allgathers"] == 1).all() and summary["token_allgather_s"] > 0


def test_lightning_under_ray_train_gets_its_validation_loss(runs):
    run_dir, summary = runs["lightning"]
    assert pd.read_parquet(run_dir / "epochs.parquet")["val_loss"].notna().all()
    assert summary["model"] == "Classifier" and summary["precision"] == "fp32"
