"""`backend: horovod` through the whole lab: the same 2-worker run with DDP (plain launcher)
and with Horovod (Ray Train, rendezvous through its process group) must train identically
(both average gradients: the same math), and the Horovod run must carry its own timing
records, A/B calibration and timeline.

Needs Horovod (`make horovod`); skips with the reason when it does not import.
"""

import math

import pandas as pd
import pytest

from scaling.config import load_config
from scaling.launch.run import execute_run
from scaling.train import horovod_backend as hb
from tests.conftest import REPO

HOROVOD_OK, HOROVOD_WHY = hb.available()
pytestmark = pytest.mark.skipif(not HOROVOD_OK, reason=HOROVOD_WHY or "horovod unavailable")

# 8 steps per rank and epoch (3 after the warm-up in epoch 1); two epochs: the same math across an
# epoch boundary (the LR warm-up ends there)
BASE = [
    "data.train_samples=1024",
    "data.val_samples=256",
    "train.max_epochs=2",
    "train.target_accuracy=1.0",
    "train.eval_every=1",
    "instrument.calibration_pairs=2",
]


def test_horovod_run_trains_like_ddp_and_is_timed(ray_connected, tmp_path):
    quickstart = REPO / "experiments" / "quickstart.yaml"
    ddp = execute_run(load_config(quickstart, overrides=BASE, num_workers=2), tmp_path / "ddp", launcher="local")
    cfg = load_config(
        quickstart, overrides=BASE + ["backend=horovod", "instrument.horovod_timeline=true"], num_workers=2
    )
    hvd = execute_run(cfg, tmp_path / "hvd", launcher="ray")
    assert ddp["status"] == hvd["status"] == "max_epochs", (ddp["error"], hvd["error"])
    assert hvd["backend"] == "horovod" and ddp["backend"] == "gloo"
    assert hvd["horovod_fusion_threshold_mb"] == 128.0 and hvd["horovod_cycle_time_ms"] == 1.0

    # same math: rank 0's losses and the validation accuracy, epoch by epoch
    e_ddp = pd.read_parquet(tmp_path / "ddp" / "epochs.parquet").sort_values("epoch")
    e_hvd = pd.read_parquet(tmp_path / "hvd" / "epochs.parquet").sort_values("epoch")
    assert list(e_ddp["epoch"]) == list(e_hvd["epoch"]) == [1, 2]
    assert e_hvd["train_loss"].to_numpy() == pytest.approx(e_ddp["train_loss"].to_numpy(), rel=1e-4)
    assert e_hvd["val_accuracy"].to_numpy() == pytest.approx(e_ddp["val_accuracy"].to_numpy(), abs=1e-9)

    # timing: one mark per parameter tensor on synchronised steps, none on no_sync ones
    steps = pd.read_parquet(tmp_path / "hvd" / "steps.parquet")
    params = steps.loc[steps["kind"] == "train", "num_buckets"]
    assert params.nunique() == 1 and params.iloc[0] > 1
    nosync = steps[steps["kind"] == "calib_nosync"]
    assert len(nosync) > 0 and (nosync["num_buckets"] == 0).all() and (nosync["exposed_comm_s"] == 0).all()
    assert (steps.loc[steps["kind"] == "calib_sync", "num_buckets"] == params.iloc[0]).all()
    # measured: a real number (None is what the summary holds when the A/B window found nothing, NaN
    # what an empty mean gives); its sign is the noise's to choose on 2 cores
    assert (
        isinstance(hvd["exposed_comm_s"], float) and math.isfinite(hvd["exposed_comm_s"]) and hvd["exposed_comm_s"] > 0
    )
    assert isinstance(hvd["comm_overhead_pct"], float) and math.isfinite(hvd["comm_overhead_pct"]), hvd[
        "comm_overhead_pct"
    ]

    timeline = hb.parse_timeline(tmp_path / "hvd" / "horovod_timeline.json")
    assert timeline["tensor"].str.startswith("allreduce.").all()
    assert timeline["tensor"].nunique() == params.iloc[0]
