"""Mixed precision, channels_last and gradient compression: steps on CPU that PyTorch supports,
bf16 compression putting DDP's averaged gradients through bf16 (a 1-rank gloo group in this
process), and a 2-worker run (plain launcher) whose compressed all-reduce is still timed and whose
summary reports FLOPs and MFU or why not; the same with step timing off."""

import gc
import json

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from scaling.results import read_table
from scaling.config import load_config
from scaling.launch.run import execute_run
from scaling.models import build_model
from scaling.train.precision import Precision
from tests.one_thread import one_torch_thread  # noqa: F401  (autouse: one intra-op thread)

QUICKSTART = "experiments/quickstart.yaml"
SMALL = ["data.train_samples=512", "data.val_samples=256", "train.max_epochs=2", "instrument.calibration_pairs=2"]


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_one_training_step_per_precision(name):
    torch.manual_seed(0)
    precision = Precision(name, channels_last=True, device=torch.device("cpu"))
    model = precision.prepare_model(build_model("small_cnn", 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = precision.layout(torch.randn(4, 3, 32, 32))
    assert inputs.is_contiguous(memory_format=torch.channels_last)
    before = [p.detach().clone() for p in model.parameters()]
    with precision.autocast():
        logits = model(inputs)
        loss = F.cross_entropy(logits, torch.tensor([0, 1, 2, 3]))
    assert logits.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
    precision.backward(loss)
    precision.step(optimizer)
    # master weights stay fp32 and were updated (fp16: the scaler found no overflow at its start scale)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _run(tmp_path, name, overrides):
    cfg = load_config(QUICKSTART, overrides=SMALL + overrides, num_workers=2)
    summary = execute_run(cfg, tmp_path / name, launcher="local")
    assert summary["status"] == "max_epochs", summary.get("error")
    return summary, tmp_path / name


def _check_mfu(summary):
    """MFU is achieved / peak and at most 1 (run_metrics.mfu); on a CPU both rates are known, so MFU is absent
    for one reason only, said in mfu_note: the achieved rate exceeded the peak taken (no upper bound then)."""
    assert summary["peak_flops_per_s"] > 0 and summary["achieved_flops_per_s"] > 0
    if summary["mfu"] is None:
        assert summary["achieved_flops_per_s"] > summary["peak_flops_per_s"], summary
        assert "exceeds the peak" in summary["mfu_note"], summary["mfu_note"]
    else:
        assert 0 < summary["mfu"] <= 1 and summary["mfu_note"] is None
        assert summary["mfu"] == pytest.approx(summary["achieved_flops_per_s"] / summary["peak_flops_per_s"])


def test_bf16_run_with_grad_compression_is_timed_and_reports_mfu_or_why_not(tmp_path):
    """The run's all-reduce is timed with the compression hook inside the timing hook, and its
    summary gives FLOPs and MFU (or the one reason MFU is absent). That the gradients went through
    bf16 the records cannot show: test_bf16_compression_puts_the_averaged_gradients_through_bf16."""
    summary, run_dir = _run(
        tmp_path, "bf16", ["train.precision=bf16", "train.channels_last=true", "instrument.grad_compression=bf16"]
    )
    assert summary["precision"] == "bf16" and summary["grad_compression"] == "bf16"
    steps = pd.read_parquet(run_dir / "steps.parquet")
    train = steps[steps["kind"] == "train"]
    assert (train["num_buckets"] > 0).all() and (train["allreduce_s"] > 0).all()
    assert summary["comm_overhead_pct"] is not None
    # FLOPs: small_cnn's training FLOPs per sample (counted, tests/test_flops_telemetry.py)
    assert summary["train_flops_per_sample"] == pytest.approx(17_513_472)
    _check_mfu(summary)
    assert (train["model_flops"] == train["samples"] * summary["train_flops_per_sample"]).all()
    profile = json.loads((run_dir / "compute_profile.json").read_text())
    assert profile["peak_precision"] == "bf16"


def test_bf16_compression_puts_the_averaged_gradients_through_bf16(tmp_path):
    """What `instrument.grad_compression=bf16` does to a step, which the run above cannot show (its
    records hold times, not the wire's dtype): the lab's DDP model (scaling/train/backends/ddp.py,
    its compression hook inside the instrument's timing hook, as in a run) on a 1-rank gloo group in
    this process. The gradients DDP hands the optimizer went through bf16 with it (each one a bf16
    number) and did not without it: a hook that dropped the compression fails here."""
    import torch.distributed as dist

    from scaling.train.backends.ddp import DDP
    from scaling.train.loop import WorkerContext

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for compression in ("none", "bf16"):
            cfg = load_config(QUICKSTART, overrides=[f"instrument.grad_compression={compression}"], num_workers=1)
            torch.manual_seed(0)
            model = build_model("small_cnn", 10)
            ctx = WorkerContext(rank=0, world_size=1, local_rank=0, node_rank=0, device=torch.device("cpu"))
            ddp, _, _ = DDP().wrap(cfg, ctx, model, torch.optim.SGD(model.parameters(), lr=0.1), tmp_path)
            F.cross_entropy(ddp(torch.randn(8, 3, 32, 32)), torch.arange(8)).backward()
            grads = [p.grad for p in ddp.parameters()]
            in_bf16 = [torch.equal(g, g.to(torch.bfloat16).float()) for g in grads]
            # DDP's reducer holds the group: freed here, before the group is destroyed (a reducer freed after it
            # hung once in ~ProcessGroupGloo's join of its threads, in a CI run)
            del ddp, grads
            gc.collect()
            assert all(in_bf16) if compression == "bf16" else not any(in_bf16), (compression, in_bf16)
    finally:
        dist.destroy_process_group()


def test_step_timing_off_keeps_epoch_figures(tmp_path):
    summary, run_dir = _run(tmp_path, "untimed", ["instrument.step_timing=false"])
    assert summary["step_s"] is None and summary["comm_overhead_pct"] is None
    assert summary["time_per_epoch_s"] > 0 and summary["achieved_flops_per_s"] > 0
    assert read_table(run_dir / "steps.parquet").empty and not (run_dir / "steps.parquet").exists()


@pytest.mark.parametrize(
    "model, flops_per_sample",
    [
        ("resnet50", 3 * 8.18e9 * (64 / 224) ** 2),  # ~3x forward; forward scales with the pixel count
        ("amoebanet_d_6_64", None),
    ],
)
def test_full_scale_models_run_on_synthetic_data_and_report_mfu(tmp_path, model, flops_per_sample):
    # The full-scale networks through the whole run path with 2 CPU workers; small images keep it quick.
    summary, run_dir = _run(
        tmp_path,
        model,
        [
            f"model.name={model}",
            "data.name=synthetic",
            "data.image_size=64",
            "data.num_classes=1000",
            "data.train_samples=16",
            "train.per_worker_batch=2",
            "train.max_epochs=1",
            "instrument.warmup_steps=1",
            "instrument.calibration_pairs=1",
        ],
    )
    assert summary["epochs_run"] == 1 and summary["best_accuracy"] is None  # synthetic: no validation
    _check_mfu(summary)
    if flops_per_sample:
        assert summary["train_flops_per_sample"] == pytest.approx(flops_per_sample, rel=0.05)
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert len(steps[steps["kind"] == "train"]) == 2 * 4  # 16 samples / 2 workers / batch 2, per rank
