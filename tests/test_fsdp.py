"""FSDP2 through the public instrument: every all-gather and reduce-scatter, the exposed time, the
A/B window, peak memory; the ground truth; DDP and FSDP train alike.

At world size 2 (two spawned gloo processes running every case of tests/fsdp_jobs.py in turn,
start-up paid once), what is proven:
- **every collective is recorded, per module and per pass**: per training step, an all-gather
  of each sharded module in forward, a re-gather of each block in backward (FSDP keeps the
  root's parameters after forward), a reduce-scatter of each module's gradients; their bytes
  are the whole buffers (nccl-tests' size), the parameters' bytes exactly; on CPU each call holds
  the training thread, so each is exposed in full; an evaluation's all-gathers (no_grad, eval
  mode) are not training's; the no_sync half of the A/B has the all-gathers and no
  reduce-scatter; the trace has a track per kind; peak memory per rank is recorded per epoch;
- **the ground truth**: a delay D in the last reduce-scatter of every synchronised backward
  grows the exposed time (and its reduce-scatter part) and the A/B difference by D (+-15%); a
  delay D in the first all-gather of every forward grows the exposed time (its all-gather part)
  by D and the A/B by nothing (within 15% of D): the A/B cannot see the all-gathers, as
  docs/method.md says;
- accumulation with `set_requires_gradient_sync(False)` on the first micro-batch: each step has
  2 micro-batches, 1 synchronised, and one set of reduce-scatters;
- **DDP and FSDP train alike**: the same losses step by step (fp32, AdamW, the same seed and
  data; within float rounding: DDP divides the gradients before its all-reduce, FSDP's
  reduce-scatter averages), and the instrument with its A/B window (both orders) changes
  nothing in an FSDP job's losses, bit for bit.
The rule itself (the sharded exposed time, on a CPU and on a GPU-like timeline, and the
attribution across ranks) is checked in process, on hand-made marks.

Timing checks compare the fastest observations (tests/test_ground_truth.py says why) against a
delay that dwarfs a step of this model; none assumes how fast the machine is.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from scaling.instrument.backends.fsdp import ShardedCommRule
from scaling.instrument.recorder import RunRecorder
from scaling.instrument.timing import BucketMarks, Clock, StepMarks
from scaling.launch.local import start_workers
from scaling.testbed.local_cluster import free_port
from tests import fsdp_jobs
from tests.test_attribution_rules import ThreadWorld

BLOCKS = fsdp_jobs.BLOCKS
FORWARD_ALLGATHERS, REGATHERS, REDUCESCATTERS = BLOCKS + 1, BLOCKS, BLOCKS + 1


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """case -> (each rank's result, run directory), from one pair of gloo processes."""
    tmp = tmp_path_factory.mktemp("fsdp")
    start_workers(fsdp_jobs.world_job, (free_port(), str(tmp)), 2)
    return {
        name: ([json.loads((tmp / f"result-{name}.rank{r}.json").read_text()) for r in range(2)], tmp / name)
        for name in fsdp_jobs.WORLD_CASES
    }


def _steps(run_dir) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "steps.parquet")


def _fastest(run_dir) -> dict:
    """The least-disturbed observations: the fastest steady step's exposed times, and the fastest
    synchronised calibration half minus the fastest no_sync one."""
    steps = _steps(run_dir)
    train = steps[(steps["kind"] == "train") & ~steps["warmup"]]
    calib = steps[steps["kind"] != "train"]
    return {
        "exposed_comm_s": train["exposed_comm_s"].min(),
        "exposed_reducescatter_s": train["exposed_reducescatter_s"].min(),
        "exposed_allgather_s": train["exposed_allgather_s"].min(),
        "ab_s": calib.loc[calib["kind"] == "calib_sync", "step_s"].min()
        - calib.loc[calib["kind"] == "calib_nosync", "step_s"].min(),
    }


def _parameter_bytes() -> tuple[int, int]:
    """(one block's, the root's own) parameter bytes, fp32: what an all-gather gathers."""
    model = fsdp_jobs.Blocks()
    block = sum(p.numel() for p in model.blocks[0].parameters()) * 4
    return block, sum(p.numel() for p in model.head.parameters()) * 4


@pytest.mark.slow
def test_every_collective_is_recorded_per_module_and_pass(world):
    run_dir = world["base"][1]
    steps = _steps(run_dir)
    train = steps[steps["kind"] == "train"]
    assert len(train) == 2 * fsdp_jobs.STEPS
    assert (train["allgathers"] == FORWARD_ALLGATHERS + REGATHERS).all()
    assert (train["regathers"] == REGATHERS).all() and (train["reducescatters"] == REDUCESCATTERS).all()
    block, root = _parameter_bytes()
    assert (train["allgather_bytes"] == BLOCKS * block + root + REGATHERS * block).all()
    assert (train["regather_bytes"] == REGATHERS * block).all()
    assert (train["reducescatter_bytes"] == BLOCKS * block + root).all()
    assert train["allreduce_s"].isna().all() and (train["synced_micro_batches"] == 1).all()
    # on CPU every call holds the training thread: all of it is exposed, and it lies inside the step
    assert (train["exposed_comm_s"] - train["comm_s"]).abs().max() < 1e-9
    assert (
        train["exposed_allgather_s"] + train["exposed_reducescatter_s"] - train["exposed_comm_s"]
    ).abs().max() < 1e-9
    assert (train["exposed_comm_s"] <= train["forward_s"] + train["backward_s"] + 1e-9).all()
    assert (train["allgather_busbw_bytes_per_s"] > 0).all() and (train["reducescatter_busbw_bytes_per_s"] > 0).all()
    # the units as a projection reads them where a run issued no collectives: the root (keeping its
    # parameters after forward) first, then each block (resharded), as the collectives name them
    units = json.loads((run_dir / "compute_profile.json").read_text())["sharded_units"]
    assert units == [["root", root // 4, False]] + [[f"blocks.{i}", block // 4, True] for i in range(BLOCKS)]
    # the A/B's no_sync half all-gathers as a synchronised one and reduce-scatters nothing. The
    # evaluation's forward after training (no_grad, eval mode) is not recorded; FSDP keeps the root
    # gathered after it, and the window reshards it (the job's gradients are on the sharded
    # parameters), so every half, the first too, all-gathers every module
    calib = steps[steps["kind"] != "train"].sort_values(["rank", "pair"], kind="stable")
    nosync, sync = calib[calib["kind"] == "calib_nosync"], calib[calib["kind"] == "calib_sync"]
    assert len(nosync) == len(sync) == 2 * fsdp_jobs.PAIRS
    assert (nosync["reducescatters"] == 0).all() and (nosync["synced_micro_batches"] == 0).all()
    assert (sync["reducescatters"] == REDUCESCATTERS).all()
    assert (calib["allgathers"] == FORWARD_ALLGATHERS + REGATHERS).all()

    collectives = pd.read_parquet(run_dir / "collectives.parquet")
    mine = collectives[(collectives["rank"] == 0) & (collectives["step_kind"] == "train")]
    assert len(mine) == fsdp_jobs.STEPS * (FORWARD_ALLGATHERS + REGATHERS + REDUCESCATTERS)
    per_pass = mine[mine["step"] == fsdp_jobs.WARMUP].groupby(["collective", "pass"])["module"].apply(sorted).to_dict()
    blocks = [f"blocks.{i}" for i in range(BLOCKS)]
    assert per_pass == {
        ("all_gather", "forward"): sorted([*blocks, "root"]),
        ("all_gather", "backward"): blocks,
        ("reduce_scatter", "backward"): sorted([*blocks, "root"]),
    }
    assert ((mine["waited_s"] - mine["duration_s"]).abs() < 1e-9).all()  # CPU: blocking, all exposed
    by_step = mine.groupby("step")["duration_s"].sum()
    rank0 = train[train["rank"] == 0].set_index("step")
    assert (by_step - rank0["exposed_comm_s"]).abs().max() < 1e-6  # one after the other on the thread

    trace = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert {"all-gather", "reduce-scatter"} <= tracks
    assert any(e.get("name") == "reduce-scatter root (backward)" for e in trace)

    epochs = pd.read_parquet(run_dir / "epochs.parquet")
    assert (epochs["peak_memory_bytes"] > 0).all()
    assert (epochs["peak_memory_min_bytes"] <= epochs["peak_memory_bytes"]).all()
    for rank in (0, 1):
        memory = json.loads((run_dir / "workers" / f"rank{rank}-memory.json").read_text())["epochs"]
        assert memory[0]["peak_memory_bytes"] > 0 and memory[0]["peak_memory_method"].startswith(("VmHWM", "ru_maxrss"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["backend"] == "fsdp" and summary["allreduce_s"] is None and summary["exposed_comm_s"] > 0
    assert summary["waiting_s"] <= summary["exposed_comm_s"] + 1e-9


@pytest.mark.slow
@pytest.mark.parametrize(
    "into, part, ab_growth", [("gradients", "exposed_reducescatter_s", 1.0), ("parameters", "exposed_allgather_s", 0.0)]
)
def test_injected_delay_moves_the_exposed_time_and_the_ab_as_defined(world, into, part, ab_growth):
    base, injected = _fastest(world["base"][1]), _fastest(world[f"{into}_delay"][1])
    delay = fsdp_jobs.DELAY_S
    growth = {name: injected[name] - base[name] for name in base}
    print(f"{into}: injected {delay} s; growth of the fastest {growth}")
    assert growth["exposed_comm_s"] == pytest.approx(delay, rel=0.15)
    assert growth[part] == pytest.approx(delay, rel=0.15)
    # a reduce-scatter's delay is in the synchronised half only; an all-gather's in both halves
    assert growth["ab_s"] == pytest.approx(ab_growth * delay, abs=0.15 * delay)
    steps = _steps(world[f"{into}_delay"][1])
    steady = steps[(steps["kind"] == "train") & ~steps["warmup"]]
    assert steady["injected_s"].min() == pytest.approx(delay, rel=0.15)


@pytest.mark.slow
def test_accumulation_without_gradient_sync_is_one_step(world):
    steps = _steps(world["accumulation"][1])
    train = steps[steps["kind"] == "train"]
    assert len(train) == 2 * 4
    assert (train["micro_batches"] == 2).all() and (train["synced_micro_batches"] == 1).all()
    assert (train["reducescatters"] == REDUCESCATTERS).all()
    assert (train["allgathers"] == 2 * (FORWARD_ALLGATHERS + REGATHERS)).all()


@pytest.mark.slow
def test_a_bf16_policy_without_autocast_is_measured_as_bf16(world):
    # an H200 run of GPT-2 small under MixedPrecisionPolicy(param_dtype=bf16) was labelled fp32,
    # its MFU taken against the TF32 peak (scripts/gpu_first_contact.py, step 08)
    run_dir = world["mixed_precision"][1]
    assert json.loads((run_dir / "compute_profile.json").read_text())["precision"] == "bf16"
    assert json.loads((run_dir / "summary.json").read_text())["precision"] == "bf16"


@pytest.mark.slow
def test_ddp_and_fsdp_train_alike_and_the_instrument_changes_nothing(world):
    ddp, fsdp, attached = (world[f"losses_{case}"][0] for case in ("ddp", "fsdp", "fsdp_attached"))
    for rank in (0, 1):
        assert fsdp[rank]["losses"] == pytest.approx(ddp[rank]["losses"], rel=1e-5)
        assert attached[rank]["losses"] == fsdp[rank]["losses"]  # bit for bit, A/B window included
    steps = _steps(world["losses_fsdp_attached"][1])
    assert (steps["kind"] == "calib_nosync").sum() == 2 * 2 * 2  # ranks x epochs x pairs: the A/B ran


# --- the rule, in process ----------------------------------------------------------------------


def _collective(kind, issued, done, waited_from=None, *, nbytes=1000, module="m", backward=False, index=0):
    return BucketMarks(
        index=index,
        handed_over=issued,
        completed=done,
        kind=kind,
        nbytes=nbytes,
        module=module,
        backward=backward,
        waited_from=waited_from,
    )


def _step(buckets, rule, start=0.0, end=3.0, step=0) -> StepMarks:
    return StepMarks.single(
        1, step, "train", False, 16, start, (start, start + 1.0, start + 2.5, end), buckets, comm_rule=rule
    )


def test_on_cpu_every_blocking_collective_is_exposed_in_full():
    rule = ShardedCommRule(ranks=2)
    buckets = [
        _collective("all_gather", 0.1, 0.3, 0.1, nbytes=4000),
        _collective("all_gather", 1.1, 1.2, 1.1, backward=True, nbytes=4000),
        _collective("reduce_scatter", 1.4, 1.8, 1.4, backward=True, nbytes=8000),
    ]
    row = _step(buckets, rule).resolve(Clock())
    assert row["exposed_comm_s"] == pytest.approx(0.7) and row["comm_s"] == pytest.approx(0.7)
    assert row["exposed_allgather_s"] == pytest.approx(0.3) and row["exposed_reducescatter_s"] == pytest.approx(0.4)
    assert row["allgather_s"] == pytest.approx(0.3) and row["regather_s"] == pytest.approx(0.1)
    assert row["allgathers"] == 2 and row["regathers"] == 1 and row["reducescatters"] == 1
    # nccl-tests: busbw = size / time x (n-1)/n
    assert row["allgather_busbw_bytes_per_s"] == pytest.approx(8000 / 0.3 * 0.5)
    assert row["reducescatter_busbw_bytes_per_s"] == pytest.approx(8000 / 0.4 * 0.5)
    assert row["compute_s"] == pytest.approx(3.0 - 0.7) and row["allreduce_s"] != row["allreduce_s"]
    assert row["synced_micro_batches"] == 1 and row["num_buckets"] == 3
    assert [p for p, _ in row["sync_points"]] == pytest.approx([0.1, 1.1, 1.4])


def test_beside_compute_only_the_wait_is_exposed():
    """A GPU's timeline (marks as seconds): collectives on their own streams, compute waiting at
    FSDP's wait points. A prefetched all-gather done before compute needs it exposes nothing; one
    not prefetched in time exposes from compute's wait to its end; a reduce-scatter from the next
    module's post-backward (or, the last, from its own gradients' readiness) to its end."""
    rule = ShardedCommRule(ranks=4)
    buckets = [
        _collective("all_gather", 0.0, 0.3, 0.2),  # compute waited 0.1
        _collective("all_gather", 0.3, 0.5, 0.6),  # prefetched: done before it was needed
        _collective("reduce_scatter", 1.0, 1.4, 1.2, backward=True),  # the next post-backward waits 0.2
        _collective("reduce_scatter", 1.5, 1.9, 1.6, backward=True),
    ]  # the end of backward waits 0.3
    row = _step(buckets, rule).resolve(Clock())
    assert row["exposed_allgather_s"] == pytest.approx(0.1)
    assert row["exposed_reducescatter_s"] == pytest.approx(0.5)
    assert row["exposed_comm_s"] == pytest.approx(0.6)
    assert row["allgather_s"] == pytest.approx(0.5) and row["reducescatter_s"] == pytest.approx(0.8)
    assert row["comm_s"] == pytest.approx(1.3)
    assert [w for _, w in row["sync_points"]] == pytest.approx([0.1, 0.0, 0.2, 0.3])


def test_a_micro_batch_without_reduce_scatter_did_not_synchronise():
    rule = ShardedCommRule(ranks=2)
    step = StepMarks(
        1,
        0,
        "train",
        False,
        32,
        0.0,
        [
            ("data", 0.0),
            ("forward", 0.5),
            ("backward", 1.0),
            ("data", 1.0),
            ("forward", 1.5),
            ("backward", 2.0),
            ("optimizer", 2.2),
        ],
        [
            [_collective("all_gather", 0.1, 0.2, 0.1)],
            [_collective("all_gather", 1.1, 1.2, 1.1), _collective("reduce_scatter", 1.8, 1.9, 1.8, backward=True)],
        ],
        comm_rule=rule,
    )
    row = step.resolve(Clock())
    assert row["micro_batches"] == 2 and row["synced_micro_batches"] == 1
    assert row["exposed_comm_s"] == pytest.approx(0.3)


@pytest.fixture
def threaded_collectives(monkeypatch):
    monkeypatch.setattr(dist, "all_reduce", ThreadWorld.all_reduce)
    monkeypatch.setattr(dist, "all_gather", ThreadWorld.all_gather)


def test_waiting_is_summed_over_every_collective(threaded_collectives):
    """Two collectives per step, each exposed in full (CPU). Rank 1 arrives 0.1 s after rank 0 at
    both; rank 0 waits 0.1 s at each: waiting 0.2 s of its 0.5 s exposed, and rank 1 is the
    straggler. DDP's single point would see only the last collective."""
    rule = ShardedCommRule(ranks=2)
    steps = {
        0: [
            _step(
                [_collective("all_gather", 0.1, 0.4, 0.1), _collective("reduce_scatter", 1.5, 1.7, 1.5)], rule, step=k
            )
            for k in range(3)
        ],
        1: [
            _step(
                [_collective("all_gather", 0.2, 0.4, 0.2), _collective("reduce_scatter", 1.6, 1.7, 1.6)], rule, step=k
            )
            for k in range(3)
        ],
    }
    import threading

    world = ThreadWorld(2)
    recorders = [RunRecorder(Clock(), rank, 0, rank, None, group=world.member(rank), world_size=2) for rank in (0, 1)]
    rows: dict[int, list[dict]] = {}

    def work(rank):
        for m in steps[rank]:
            recorders[rank].step(m)
        rows[rank] = recorders[rank].end_epoch({"epoch": 1})

    threads = [threading.Thread(target=work, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for row in rows[0]:
        assert row["exposed_comm_s"] == pytest.approx(0.5)
        assert row["waiting_s"] == pytest.approx(0.2) and row["transfer_s"] == pytest.approx(0.3)
        assert row["straggler_rank"] == 1 and "sync_points" not in row
    for row in rows[1]:
        assert row["waiting_s"] == pytest.approx(0.0) and row["transfer_s"] == pytest.approx(0.3)
    assert recorders[0].epoch_rows[-1]["straggler_rank"] == 1


def test_an_adapter_refuses_a_delay_where_it_cannot_put_it():
    from scaling import instrument
    from scaling.instrument.parts import Parts

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="inject_comm_delay_into='parameters' is not offered"):
        instrument.attach(
            model,
            optimizer,
            parts=Parts(),
            telemetry_interval_s=0,
            inject_comm_delay_s=0.1,
            inject_comm_delay_into="parameters",
        )
    with pytest.raises(ValueError, match="inject_comm_delay_into must be gradients or parameters"):
        instrument.attach(model, optimizer, parts=Parts(), inject_comm_delay_into="weights")
