"""`backend: fsdp` in the lab's own loop: it trains gpt2-tiny sharded, records every all-gather and
reduce-scatter per kind, resumes from a torch.distributed.checkpoint state where the checkpoint was
taken, refuses in one line what cannot work, and a sweep of DDP beside FSDP gives a report that
names each collective kind and draws peak memory per rank.

- In one pair of spawned gloo processes (start-up paid once, `world`): the lab's loop
  (`scaling.train.loop.train_worker`, what both launchers run) trains two epochs with a
  checkpoint after the first (validating uneven shards: one rank runs a forward more), then a second run resumes from
  that checkpoint and trains the second epoch again: its losses are the uninterrupted run's (what a killed worker's
  restart under Ray Train gets: the launcher hands every rank the latest checkpoint,
  scaling/launch/ray_train.py, as tests/test_failures.py proves for DDP).
- One `scaling sweep` (in process) of experiments/gpt2-tiny-fsdp.yaml on the session's Ray head (2 workers,
  backend gloo beside fsdp, the same seed and data) and its `scaling report`.
- The refusals, in process.
"""

from __future__ import annotations

import io
import json
import os

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from rich.console import Console

from scaling.config import ConfigError, load_config
from scaling.report import write_report
from scaling.launch.local import start_workers
from scaling.testbed.local_cluster import free_port
from tests.conftest import REPO

FSDP_YAML = REPO / "experiments" / "gpt2-tiny-fsdp.yaml"
# gpt2-tiny on a 64-token vocabulary, sequences of 32: 4 steps per rank and epoch at 2 workers
SMALL = [
    "data.num_classes=64",
    "data.seq_len=32",
    "data.train_samples=128",
    "data.val_samples=32",
    "train.per_worker_batch=16",
    "optim.lr=0.3",
    "optim.reference_batch=32",
    "train.eval_every=1",
    "instrument.calibration_pairs=2",
    "instrument.warmup_steps=1",
]
BLOCKS = 2  # gpt2-tiny's layers: the units fsdp.shard: blocks gives fully_shard before the root


# --- the loop, its collectives and a resume from its checkpoint (two gloo processes) ------------------------


class FileCheckpoints:
    """The launcher's side of checkpoints, as Ray Train's is (scaling/launch/ray_train.py): rank 0's state
    kept (one file per epoch here), every rank handed the one to resume from."""

    def __init__(self, directory: str, rank: int, resume_from: str | None = None):
        self.directory, self.rank, self.resume_from = directory, rank, resume_from

    def load(self):
        return torch.load(self.resume_from, weights_only=False) if self.resume_from else None

    def report(self, metrics: dict, state) -> None:
        if state is not None:
            assert self.rank == 0
            torch.save(state, os.path.join(self.directory, f"checkpoint-epoch{metrics['epoch']}.pt"))


def world_job(rank: int, port: int, tmp: str) -> None:
    """One spawned rank of 2: two epochs with a checkpoint after the first, then a run resumed from it."""
    from scaling.launch.local import exit_without_finalization, release_process_group
    from scaling.train.loop import WorkerContext, set_up_worker, train_worker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    # 33 validation samples: rank 0's shard takes two batches of 16, rank 1's one (validation in lockstep)
    cfg = load_config(
        FSDP_YAML,
        overrides=[
            *SMALL,
            "data.val_samples=33",
            "train.max_epochs=2",
            "train.target_loss=0.01",
            "failure.checkpoint_every_epochs=1",
        ],
        num_workers=2,
    )
    ctx = WorkerContext(rank=rank, world_size=2, local_rank=rank, node_rank=0, device=torch.device("cpu"))
    set_up_worker(cfg, ctx)
    rows = {}
    for name, resume in (("whole", None), ("resumed", os.path.join(tmp, "checkpoint-epoch1.pt"))):
        run_dir = os.path.join(tmp, name)
        rows[name] = train_worker(cfg, ctx, run_dir, FileCheckpoints(tmp, rank, resume))
    if rank == 0:
        with open(os.path.join(tmp, "rows.json"), "w") as f:
            json.dump(rows, f, default=float)
    release_process_group()
    exit_without_finalization()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp_lab")
    start_workers(world_job, (free_port(), str(tmp)), 2)
    return tmp


@pytest.mark.slow  # two worker processes training
def test_the_lab_loop_trains_fsdp_and_records_every_collective_per_kind(world):
    run_dir = world / "whole"
    collectives = pd.read_parquet(run_dir / "collectives.parquet")
    train = collectives[collectives["step_kind"] == "train"]
    per_step = train.groupby(["rank", "step"])
    # every step: a forward all-gather of each unit, a backward re-gather of each block (fsdp
    # reshard_after_forward: true; the root stays gathered), and a reduce-scatter of each unit's gradients
    counts = per_step.apply(
        lambda s: tuple(sorted(s.groupby(["collective", "pass"]).size().items())), include_groups=False
    )
    units = BLOCKS + 1
    assert set(counts) == {
        (
            (("all_gather", "backward"), BLOCKS),
            (("all_gather", "forward"), units),
            (("reduce_scatter", "backward"), units),
        )
    }, counts.value_counts()
    assert set(train["module"]) == {"blocks.0", "blocks.1", "root"}
    assert sorted(train["rank"].unique()) == [0, 1]
    assert (train["bytes"] > 0).all() and (train["duration_s"] >= 0).all()
    steps = pd.read_parquet(run_dir / "steps.parquet")
    steady = steps[(steps["kind"] == "train") & ~steps["warmup"]]
    assert (steady["allgathers"] == units + BLOCKS).all() and (steady["reducescatters"] == units).all()
    assert (steady["allgather_s"] > 0).all() and (steady["reducescatter_s"] > 0).all()
    assert steady["allreduce_s"].isna().all()  # FSDP all-reduces nothing
    # the forward all-gathers' waits are the exposed time inside forward (the step breakdown's split)
    forward_exposed = steady["exposed_forward_comm_s"]
    assert (
        (forward_exposed > 0) & (forward_exposed < steady["exposed_comm_s"]) & (forward_exposed <= steady["forward_s"])
    ).all()
    # the A/B window ran on the sharded model (its no_sync half without reduce-scatters)
    calibration = collectives[collectives["step_kind"] == "calib_nosync"]
    assert not calibration.empty and set(calibration["collective"]) == {"all_gather"}
    # FLOPs counted on a meta replica of the sharded model (fully_shard refuses deepcopy), as the plain model counts
    from scaling.instrument.flops import training_flops_per_sample
    from scaling.models.registry import build_model

    profile = json.loads((run_dir / "compute_profile.json").read_text())
    plain = training_flops_per_sample(build_model("gpt2-tiny", 64), (32,), 64, input_dtype=torch.long)
    assert profile.get("train_flops") == pytest.approx(plain["train_flops"]), profile.get("error")
    assert profile["counted_on"] == "meta" and profile["parameters"] == plain["parameters"]
    epochs = pd.read_parquet(run_dir / "epochs.parquet")
    assert list(epochs["epoch"]) == [1, 2] and (epochs["peak_memory_bytes"] > 0).all()
    assert (epochs["peak_memory_min_bytes"] <= epochs["peak_memory_bytes"]).all()
    # the noise scale's norms, from the reduce-scatters' inputs and outputs (tests/test_noise_scale.py checks them)
    assert (epochs["noise_steps"] > 0).all() and (epochs["grad_sq"] > 0).all(), epochs.filter(like="noise")


@pytest.mark.slow
def test_a_run_resumed_from_its_dcp_checkpoint_continues_as_the_whole_run(world):
    rows = json.loads((world / "rows.json").read_text())
    whole, resumed = rows["whole"], rows["resumed"]
    assert whole["epoch"] == resumed["epoch"] == 2
    # the same second epoch: model, optimizer (momentum), schedule, RNG and data order all restored
    for figure in ("train_loss", "val_loss", "val_top1", "lr"):
        assert resumed[figure] == pytest.approx(whole[figure], rel=1e-6, abs=1e-9), figure
    # a checkpoint holds the whole state, by parameter name, gathered on rank 0 (not rank 0's shard)
    state = torch.load(world / "checkpoint-epoch1.pt", weights_only=False)
    qkv = state["model"]["blocks.0.attn.qkv.weight"]
    assert type(qkv) is torch.Tensor and tuple(qkv.shape) == (3 * 64, 64)
    assert "momentum_buffer" in state["optimizer"]["state"]["blocks.0.attn.qkv.weight"]
    assert state["instrument"]["epoch"] == 1
    # the resumed run's records go on from the checkpoint's: its first trained epoch is the second
    epochs = pd.read_parquet(world / "resumed" / "epochs.parquet")
    assert list(epochs["epoch"]) == [1, 2]
    steps = pd.read_parquet(world / "resumed" / "steps.parquet")
    assert set(steps.loc[steps["kind"] == "train", "epoch"]) == {2}


# --- DDP beside FSDP in one sweep, and its report (the session's Ray head) ---------------------------------


@pytest.fixture(scope="module")
def sweep(ray_connected, tmp_path_factory):
    from scaling.cli import main

    out = tmp_path_factory.mktemp("fsdp_sweep") / "sweep"
    # one epoch each, to a loss below a uniform guess's (ln 64 = 4.16). `scaling sweep` in this process,
    # attached to the session's head: the console script's own start (its imports and ray.init, tens of
    # seconds here) proves nothing about FSDP beside DDP
    code = main(
        [
            "sweep",
            str(FSDP_YAML),
            "--workers",
            "2",
            "--out",
            str(out),
            *[
                arg
                for override in [*SMALL, "train.max_epochs=1", "train.target_loss=4.1"]
                for arg in ("--set", override)
            ],
        ]
    )
    assert code == 0
    write_report(out, console=Console(file=io.StringIO(), width=200))  # what `scaling report` runs
    return out


def test_ddp_and_fsdp_of_one_model_train_alike_in_one_sweep(sweep):
    runs = pd.read_parquet(sweep / "runs.parquet").set_index("backend")
    assert set(runs.index) == {"gloo", "fsdp"} and (runs["status"] == "reached_target").all()
    fsdp, ddp = runs.loc["fsdp"], runs.loc["gloo"]
    # the same seed and data, fp32: the same losses (FSDP's reduce-scatter averages as DDP's all-reduce does)
    assert fsdp["best_val_loss"] == pytest.approx(ddp["best_val_loss"], rel=1e-4)
    assert fsdp["allgather_pct"] > 0 and fsdp["reducescatter_pct"] > 0 and pd.isna(fsdp["allreduce_pct"])
    assert ddp["allreduce_pct"] > 0 and pd.isna(ddp["allgather_pct"])
    # a pandas row holds a missing figure as NaN, which `is not None` lets through: the A/B was measured
    assert pd.notna(fsdp["comm_overhead_pct"]) and pd.notna(ddp["comm_overhead_pct"]) and fsdp["exposed_comm_pct"] > 0
    assert fsdp["peak_memory_bytes"] > 0 and ddp["peak_memory_bytes"] > 0
    assert fsdp["fsdp_shard"] == "blocks" and fsdp["fsdp_reshard_after_forward"]


def test_the_report_names_each_collective_kind_and_draws_peak_memory_per_rank(sweep):
    report = (sweep / "report" / "report.md").read_text()
    section = report.split("### Communication and step time")[1].split("###")[0]
    header = section.strip().splitlines()[0]
    for kind in (
        "all-reduce in flight",
        "all-gather in flight",
        "backward re-gathers",
        "reduce-scatter in flight",
        "exposed all-gather",
        "exposed reduce-scatter",
        "peak memory, largest rank",
    ):
        assert kind in header, kind
    rows = {line.split("|")[2].strip(): line for line in section.strip().splitlines()[2:]}
    assert set(rows) == {"fsdp", "gloo"}
    assert "### Peak memory per rank" in report and (sweep / "report" / "memory.png").stat().st_size > 0
    assert (
        report.index("### Speedup")
        < report.index("### Peak memory per rank")
        < report.index("### Communication overhead")
    )


# --- refusals, in one line ---------------------------------------------------------------------------------


def _refusal(*overrides: str, workers: int = 2) -> str:
    from scaling.launch.preflight import check_backend

    with pytest.raises(ConfigError) as refused:
        check_backend(load_config(FSDP_YAML, overrides=list(overrides), num_workers=workers))
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_model_with_nothing_to_shard_per_block_is_refused_and_runs_as_one_unit():
    from scaling.launch.preflight import check_backend
    from scaling.models import build_model
    from scaling.train.backends.fsdp import shard_units

    message = _refusal("model.name=small_cnn", "data.name=embedded", "train.target_metric=top1")
    assert "model small_cnn has none with parameters: use fsdp.shard: root" in message
    check_backend(
        load_config(
            FSDP_YAML,
            overrides=["model.name=small_cnn", "data.name=embedded", "fsdp.shard=root", "train.target_metric=top1"],
            num_workers=2,
        )
    )
    with torch.device("meta"):
        assert [name for name, _ in shard_units(build_model("gpt2-tiny", 64), "blocks")] == ["blocks.0", "blocks.1"]
        assert shard_units(build_model("gpt2-tiny", 64), "root") == []


def test_a_delay_fsdp_cannot_honour_is_refused(monkeypatch):
    from scaling.instrument.backends import fsdp

    monkeypatch.setattr(fsdp, "GPU_INJECTION_CHECKED", False)  # as it stands: docs/gpu.md
    assert "inject_comm_delay_s on GPU runs is refused" in _refusal(
        "instrument.inject_comm_delay_s=0.1", "workers.use_gpu=true"
    )
    # a backend that has no such collective to delay: DDP's all-reduce carries gradients, no parameters
    with pytest.raises(ConfigError, match="inject_comm_delay_into=parameters is not offered by backend gloo"):
        load_config(
            FSDP_YAML,
            overrides=[
                "backend=gloo",
                "instrument.inject_comm_delay_s=0.1",
                "instrument.inject_comm_delay_into=parameters",
            ],
        )
    load_config(
        FSDP_YAML, overrides=["instrument.inject_comm_delay_s=0.1", "instrument.inject_comm_delay_into=parameters"]
    )


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.precision=fp16", "ShardedGradScaler"),
        ("fsdp.shard=layers", "config key 'fsdp.shard' must be one of blocks, root"),
        ("fsdp.param_dtype=float16", "config key 'fsdp.param_dtype' must be one of float32, bfloat16"),
        ("data.val_samples=1", "data.val_samples (1) must be at least the workers (2)"),
    ],
)
def test_fsdp_settings_that_cannot_run_are_one_line(override, words):
    with pytest.raises(ConfigError, match=None) as refused:
        load_config(FSDP_YAML, overrides=[override], num_workers=2)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_fsdp_holds_a_shard_of_the_model_state_in_the_memory_estimate():
    from scaling.launch.preflight import model_memory

    small = ["model.name=gpt2-small", "data.num_classes=50257", "data.seq_len=64"]
    ddp, _ = model_memory(load_config(FSDP_YAML, overrides=[*small, "backend=gloo"], num_workers=4))
    fsdp, what = model_memory(load_config(FSDP_YAML, overrides=small, num_workers=4))
    assert fsdp < ddp / 2 and "FSDP's gathered parameters" in what
