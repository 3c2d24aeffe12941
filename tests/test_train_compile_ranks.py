"""`train.compile` in the lab's loop on 2 ranks (gloo, spawned workers): DDP and FSDP2 (`scaling run
--launcher local`, gpt2-tiny, AdamW, compile_backend aot_eager: forward and backward traced by
AOTAutograd, no code generated). The compilation falls in the warm-up steps and their extra time is
the first epoch row's `compile_s`; the steady steps are short beside it; FSDP2's collectives are
still recorded under the compiled module.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # two worker processes training, compiled

SMALL = [
    "data.num_classes=64",
    "data.seq_len=32",
    "data.train_samples=192",
    "data.val_samples=32",
    "train.per_worker_batch=16",
    "train.max_epochs=1",
    "train.eval_every=1",
    "train.compile=true",
    "train.compile_backend=aot_eager",
    "optim.name=adamw",
    "optim.lr=0.01",
    "instrument.warmup_steps=2",
    "instrument.calibration_pairs=1",
]


@pytest.mark.parametrize("config", ["gpt2-tiny.yaml", "gpt2-tiny-fsdp.yaml"])
def test_a_compiled_run_keeps_compilation_in_its_warm_up_steps_and_reports_it(config, tmp_path, capsys):
    from scaling.cli import main

    out = tmp_path / "run"
    capsys.readouterr()
    code = main(
        [
            "run",
            str(REPO / "experiments" / config),
            "--workers",
            "2",
            "--launcher",
            "local",
            "--out",
            str(out),
            *[arg for override in SMALL for arg in ("--set", override)],
        ]
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] == "max_epochs"
    epochs = pd.read_parquet(out / "epochs.parquet")
    assert epochs["compile_steps"].iloc[0] == 2
    steps = pd.read_parquet(out / "steps.parquet")
    train = steps[steps["kind"] == "train"]
    warm, steady = train[train["warmup"]], train[~train["warmup"]]
    assert sorted(warm["step"].unique()) == [0, 1] and not steady.empty
    # the compiling step is a warm-up step, and its time is what compile_s reports (above the fastest warm-up step)
    assert warm["step_s"].max() > 5 * steady["step_s"].max()
    assert epochs["compile_s"].iloc[0] > 5 * steady["step_s"].median()
    assert pd.notna(epochs["train_loss"].iloc[0])
    if "fsdp" in config:
        collectives = pd.read_parquet(out / "collectives.parquet")
        assert {"all_gather", "reduce_scatter"} <= set(collectives["collective"].str.replace("-", "_"))
