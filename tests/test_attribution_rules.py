"""The attribution arithmetic on hand-built records with known answers: no training, no subprocess.

- `RunRecorder.attribute` (scaling/instrument/recorder.py): each training step's exposed
  communication split into waiting for the slowest rank and transfer, from step marks written
  by hand. Every rank is a thread of this process and the recorder's two collectives
  (`all_reduce` MAX, `all_gather`) are stood in for by a barrier-synchronised exchange that does
  what gloo's does (each rank gets the maximum, every rank gets every rank's tensor).
- The clock-offset estimate (scaling/instrument/clock_sync.py), from scripted send/receive
  times whose offset is known.
- PyTorch DDP's second opinion and the rule that says it disagrees
  (scaling/analysis/run_metrics.py `ddp_second_opinion`), either side of its threshold.
- trace.json (scaling/instrument/trace.py) against steps.parquet of the same steps: every span
  is the record's duration, on the same time base.

tests/test_attribution.py proves the same figures on real runs by injection.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from scaling.analysis.run_metrics import ddp_second_opinion, summarize_run
from scaling.instrument import clock_sync
from scaling.instrument.recorder import RunRecorder
from scaling.instrument.timing import BucketMarks, Clock, StepMarks


# --- ranks as threads, with the recorder's two collectives ------------------------------------


class ThreadWorld:
    """`size` ranks, each a thread; `member(rank)` is the `group` a rank's recorder is given."""

    def __init__(self, size: int):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * size

    def member(self, rank: int) -> SimpleNamespace:
        return SimpleNamespace(world=self, rank=rank)

    def _exchange(self, group, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.slots[group.rank] = tensor.clone()
        self.barrier.wait()
        everyone = [slot.clone() for slot in self.slots]
        self.barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return everyone

    @staticmethod
    def all_reduce(tensor, op=None, group=None):
        assert op == dist.ReduceOp.MAX  # the only reduction the recorder uses
        tensor.copy_(torch.stack(group.world._exchange(group, tensor)).max(dim=0).values)

    @staticmethod
    def all_gather(out, tensor, group=None):
        everyone = group.world._exchange(group, tensor)
        for target, source in zip(out, everyone, strict=True):
            assert target.shape == source.shape  # gloo's all_gather needs equal shapes too
            target.copy_(source)


@pytest.fixture
def threaded_collectives(monkeypatch):
    monkeypatch.setattr(dist, "all_reduce", ThreadWorld.all_reduce)
    monkeypatch.setattr(dist, "all_gather", ThreadWorld.all_gather)


def marks(
    step: int,
    start: float,
    handed_over: list[float],
    completed: list[float],
    *,
    warmup: bool = False,
    kind: str = "train",
    epoch: int = 1,
) -> StepMarks:
    """One step on a rank's own clock (seconds): data 10 ms, forward 20 ms, then backward whose
    buckets are handed over and completed at the given moments; backward ends with the last
    all-reduce, the optimizer takes 10 ms."""
    buckets = [BucketMarks(i, h, c) for i, (h, c) in enumerate(zip(handed_over, completed, strict=True))]
    backward_end = max(completed) if completed else start + 0.5
    return StepMarks.single(
        epoch, step, kind, warmup, 64, start, (start + 0.01, start + 0.03, backward_end, backward_end + 0.01), buckets
    )


def attribute(
    steps_per_rank: list[list[StepMarks]], offsets_s: list[float] | None = None
) -> tuple[list[list[dict]], dict]:
    """Every rank's records of one epoch, attributed across ranks (one thread per rank), and rank 0's epoch row."""
    size = len(steps_per_rank)
    offsets_s = offsets_s or [0.0] * size
    world = ThreadWorld(size)
    recorders = [
        RunRecorder(Clock(), rank, 0, rank, None, group=world.member(rank), world_size=size, offset_s=offsets_s[rank])
        for rank in range(size)
    ]
    rows: list[list[dict] | None] = [None] * size
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            for m in steps_per_rank[rank]:
                recorders[rank].step(m)
            rows[rank] = recorders[rank].end_epoch({"epoch": 1})
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
            world.barrier.abort()

    threads = [threading.Thread(target=work, args=(rank,)) for rank in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return rows, recorders[0].epoch_rows[-1]


def by_step(rows: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in rows if r["kind"] == "train"}


# --- recorder.attribute ----------------------------------------------------------------------


def test_a_straggler_is_the_others_waiting_on_rank_0s_clock(threaded_collectives):
    """Rank 1 hands its last bucket over 0.3 s after rank 0, every step; its clock reads 1000 s
    behind rank 0's (offset +1000 s), so only on rank 0's clock is it the later one.
    Rank 0: last hand-over at 0.5 s into the step, last all-reduce done at 0.9 s: exposed 0.4 s,
    of which waiting = min(0.4, 0.8 - 0.5) = 0.3 s and transfer 0.1 s. Rank 1: last hand-over
    at 0.8 s, done at 0.9 s: exposed 0.1 s, waiting 0 (nobody is later), transfer 0.1 s."""
    rank0 = [
        marks(k, 10.0 * k, [10.0 * k + 0.2, 10.0 * k + 0.5], [10.0 * k + 0.4, 10.0 * k + 0.9], warmup=k == 0)
        for k in range(4)
    ]
    rank1 = [
        marks(
            k,
            10.0 * k - 1000.0,
            [10.0 * k + 0.3 - 1000.0, 10.0 * k + 0.8 - 1000.0],
            [10.0 * k + 0.6 - 1000.0, 10.0 * k + 0.9 - 1000.0],
            warmup=k == 0,
        )
        for k in range(4)
    ]
    (rows0, rows1), epoch_row = attribute([rank0, rank1], offsets_s=[0.0, 1000.0])
    for k in range(4):  # warm-up steps are attributed too; only the straggler tally leaves them out
        r0, r1 = by_step(rows0)[k], by_step(rows1)[k]
        assert r0["exposed_comm_s"] == pytest.approx(0.4) and r1["exposed_comm_s"] == pytest.approx(0.1)
        assert r0["waiting_s"] == pytest.approx(0.3) and r0["transfer_s"] == pytest.approx(0.1)
        assert r1["waiting_s"] == 0.0 and r1["transfer_s"] == pytest.approx(0.1)
        assert r0["straggler_rank"] == r1["straggler_rank"] == 1
    assert epoch_row == {"epoch": 1, "straggler_rank": 1, "straggler_share": 1.0}

    # the run's figures from these records: means over steady steps and ranks, rank 1 the straggler of all 3
    epochs = pd.DataFrame(
        [
            {
                "epoch": 1,
                "train_s": 40.0,
                "samples": 512,
                "calibration_s": 0.0,
                "eval_s": 0.0,
                "val_accuracy": 0.5,
                "elapsed_wall_s": 41.0,
            }
        ]
    )
    out = summarize_run(pd.DataFrame(rows0 + rows1), epochs, target_accuracy=None, num_workers=2)
    assert out["waiting_s"] == pytest.approx(0.15) and out["transfer_s"] == pytest.approx(0.1)
    assert (out["straggler_rank"], out["straggler_share"]) == (1, 1.0)
    ranks = out["ranks"].set_index("rank")
    assert ranks.loc[0, "waiting_s"] == pytest.approx(0.3) and ranks.loc[1, "waiting_s"] == 0.0
    assert list(ranks["straggler_steps"]) == [0, 3] and list(ranks["straggler_share"]) == [0.0, 1.0]


def test_equal_hand_over_times_are_no_waiting(threaded_collectives):
    """Both ranks hand their last bucket over at 0.5 s and are done at 0.7 s: all 0.2 s of
    exposed communication is transfer on both. A tie names the lower rank (torch.argmax returns
    the first maximum)."""
    steps = [[marks(k, 10.0 * k, [10.0 * k + 0.5], [10.0 * k + 0.7]) for k in range(3)] for _ in range(2)]
    (rows0, rows1), epoch_row = attribute(steps)
    for row in rows0 + rows1:
        assert row["waiting_s"] == 0.0 and row["transfer_s"] == pytest.approx(0.2)
        assert row["straggler_rank"] == 0
    assert epoch_row["straggler_rank"] == 0 and epoch_row["straggler_share"] == 1.0


def test_waiting_is_capped_at_the_exposed_time_and_the_straggler_share_counts_steady_steps(threaded_collectives):
    """Three ranks. Step 0 (warm-up): rank 0 is last. Steps 1 and 2: rank 2 is last, 0.3 s after
    rank 0 and 0.1 s after rank 1. Step 3: rank 1 is last, 0.2 s after the others. Rank 0's
    comm is done 0.15 s after its own hand-over every step, earlier than a 0.3 s gap allows on
    one clock (as an offset estimated 0.15 s wrong would show it): waiting is then all of the
    exposed time (0.15 s) and transfer 0, never negative. Steady steps: rank 2 last in 2 of 3."""
    gaps = {0: (0.2, 0.0, 0.0), 1: (0.0, 0.2, 0.3), 2: (0.0, 0.2, 0.3), 3: (0.0, 0.2, 0.0)}  # hand-over after 0.5 s
    steps = [
        [
            marks(
                k,
                10.0 * k,
                [10.0 * k + 0.5 + gaps[k][rank]],
                [10.0 * k + 0.5 + gaps[k][rank] + (0.15 if rank == 0 else 0.4)],
                warmup=k == 0,
            )
            for k in range(4)
        ]
        for rank in range(3)
    ]
    rows, epoch_row = attribute(steps)
    r0, r1, r2 = (by_step(r) for r in rows)
    assert r0[0]["straggler_rank"] == 0 and r0[0]["waiting_s"] == 0.0
    assert r1[0]["waiting_s"] == pytest.approx(0.2) and r1[0]["transfer_s"] == pytest.approx(0.2)
    for k in (1, 2):
        assert r0[k]["waiting_s"] == pytest.approx(0.15) and r0[k]["transfer_s"] == 0.0  # capped
        assert r1[k]["waiting_s"] == pytest.approx(0.1) and r1[k]["transfer_s"] == pytest.approx(0.3)
        assert r2[k]["waiting_s"] == 0.0 and r2[k]["transfer_s"] == pytest.approx(0.4)
        assert r0[k]["straggler_rank"] == 2
    assert r0[3]["waiting_s"] == pytest.approx(0.15) and r2[3]["waiting_s"] == pytest.approx(0.2)
    assert r1[3]["waiting_s"] == 0.0 and r0[3]["straggler_rank"] == 1
    assert epoch_row["straggler_rank"] == 2 and epoch_row["straggler_share"] == pytest.approx(2 / 3)


def test_steps_without_buckets_calibration_and_unmatched_steps(threaded_collectives):
    """A step with no bucket (no all-reduce: nothing exposed, no moment its compute ended) waits
    and transfers nothing (0, so every figure averages over the same steps; straggler -1) and
    has no say in the epoch's straggler; calibration steps are not
    attributed; a step only one rank recorded (rank 1 has one training step fewer; steps are
    matched by position in the epoch) has nobody to wait for. Rank 0's tally: steps 0 and 2
    rank 1, step 3 rank 0."""
    rank0 = [
        marks(0, 0.0, [0.5], [0.7]),
        marks(1, 10.0, [], []),
        marks(2, 20.0, [20.5], [20.9]),
        marks(3, 30.0, [30.5], [30.9]),
        marks(3, 40.0, [40.5], [40.6], kind="calib_sync"),
    ]
    rank1 = [marks(0, 0.0, [0.6], [0.7]), marks(1, 10.0, [10.5], [10.7]), marks(2, 20.0, [20.6], [20.9])]
    (rows0, rows1), epoch_row = attribute([rank0, rank1])
    r0, r1 = by_step(rows0), by_step(rows1)
    for k in (0, 2):
        assert r0[k]["waiting_s"] == pytest.approx(0.1) and r0[k]["transfer_s"] == pytest.approx(0.3 if k else 0.1)
        assert r1[k]["waiting_s"] == 0.0 and r0[k]["straggler_rank"] == r1[k]["straggler_rank"] == 1
    assert r0[1]["waiting_s"] == 0.0 and r0[1]["transfer_s"] == 0.0 and r0[1]["straggler_rank"] == -1
    assert r1[1]["waiting_s"] == 0.0 and r1[1]["straggler_rank"] == 1  # rank 0 handed nothing over
    assert r0[3]["waiting_s"] == 0.0 and r0[3]["transfer_s"] == pytest.approx(0.4) and r0[3]["straggler_rank"] == 0
    calibration = [r for r in rows0 if r["kind"] == "calib_sync"]
    assert len(calibration) == 1 and "waiting_s" not in calibration[0]
    assert epoch_row["straggler_rank"] == 1 and epoch_row["straggler_share"] == pytest.approx(2 / 3)


def test_one_rank_waits_for_nobody(threaded_collectives):
    """At one rank the recorder attributes nothing (no collective, no columns); the split itself,
    over a group of one, is all transfer and names that rank."""
    steps = [marks(k, 10.0 * k, [10.0 * k + 0.5], [10.0 * k + 0.8]) for k in range(2)]
    alone = RunRecorder(Clock(), 0, 0, 0, None, group=ThreadWorld(1).member(0), world_size=1)
    for m in steps:
        alone.step(m)
    rows = alone.end_epoch({"epoch": 1})
    assert "waiting_s" not in rows[0] and alone.epoch_rows[-1] == {"epoch": 1}
    rows = [{**m.resolve(Clock()), "rank": 0} for m in steps]
    epoch_row = alone.attribute(rows)
    for row in rows:
        assert row["waiting_s"] == 0.0 and row["transfer_s"] == pytest.approx(0.3) and row["straggler_rank"] == 0
    assert epoch_row["straggler_rank"] == 0 and epoch_row["straggler_share"] == 1.0


# --- the clock offset -------------------------------------------------------------------------


class ScriptedPeer:
    """Rank 1 of 2, on another kernel (another boot id), whose clock reads `behind_s` behind rank
    0's. Round i leaves at rank-1 time 100 + i, takes `out_s[i]` to reach rank 0 (which answers
    with its own time then) and `back_s[i]` to come back."""

    def __init__(self, behind_s: float, out_s: list[float], back_s: list[float]):
        self.behind_s, self.out_s, self.back_s = behind_s, out_s, back_s
        self.round, self.sent, self.now = 0, 0, None

    def perf_counter(self) -> float:
        if self.now is None:  # a round leaves
            self.now = 100.0 + self.round
            return self.now
        arrived, self.now = self.now + self.out_s[self.round] + self.back_s[self.round], None
        self.round += 1
        return arrived

    def install(self, monkeypatch, boot_ids=("kernel-a", "kernel-b")) -> None:
        monkeypatch.setattr(clock_sync, "_boot_id", lambda: boot_ids[1])
        monkeypatch.setattr(clock_sync, "time", SimpleNamespace(perf_counter=self.perf_counter))
        monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)

        def broadcast_object_list(objects, src=0, group=None):
            objects[0] = boot_ids[0]  # rank 0's boot id

        def all_gather(out, tensor, group=None):
            out[0].copy_(torch.tensor([0.0]))
            out[1].copy_(tensor)

        def send(tensor, dst, group=None):
            assert dst == 0 and tensor.item() == self.now  # rank 1 sends its departure time
            self.sent += 1

        def recv(tensor, src, group=None):
            # rank 0's clock when the message arrived: rank 1's + behind_s, one outward leg later
            tensor[0] = self.now + self.behind_s + self.out_s[self.round]

        for name, fn in (
            ("broadcast_object_list", broadcast_object_list),
            ("all_gather", all_gather),
            ("send", send),
            ("recv", recv),
        ):
            monkeypatch.setattr(dist, name, fn)


def test_clock_offset_is_ntps_estimate_from_the_shortest_round_trip(monkeypatch):
    """Offset 5 s. Per round, estimate = t2 - (t1 + t4) / 2 = 5 + (out - back) / 2, uncertainty
    (out + back) / 2. Rounds of 300 + 100 µs give 5.0001 s +- 200 µs; one round of 20 + 40 µs
    (the shortest) gives 5 - 10 µs = 4.99999 s +- 30 µs, which is kept."""
    out = [300e-6] * clock_sync.ROUNDS
    back = [100e-6] * clock_sync.ROUNDS
    out[7], back[7] = 20e-6, 40e-6
    peer = ScriptedPeer(5.0, out, back)
    peer.install(monkeypatch)
    offset_s, uncertainty_s = clock_sync.estimate_offsets()
    assert peer.sent == clock_sync.ROUNDS
    assert offset_s == pytest.approx(4.99999, abs=1e-9)
    assert uncertainty_s == pytest.approx(30e-6, abs=1e-9)
    assert abs(offset_s - 5.0) <= uncertainty_s  # the true offset lies within the stated uncertainty


def test_clock_offset_on_one_kernel_is_zero_without_a_round_trip(monkeypatch):
    """Same boot id as rank 0: the same monotonic clock, so no estimate (and no message) at all."""
    peer = ScriptedPeer(5.0, [0.0] * clock_sync.ROUNDS, [0.0] * clock_sync.ROUNDS)
    peer.install(monkeypatch, boot_ids=("kernel-a", "kernel-a"))
    assert clock_sync.estimate_offsets() == (0.0, 0.0) and peer.sent == 0


# --- PyTorch DDP's second opinion ---------------------------------------------------------------


def ddp_records(planted: float = 1.0, spread: float = 0.02, steps: int = 8, synced: int = 1):
    """Two epochs of `steps` steady steps each on rank 0, every one timed by both instruments: the lab's
    span s (40 to 110 ms, as load moves a step) and DDP's time of the same step's `synced` iterations,
    s / planted in all (a timer `planted` times too fast or slow), each off by up to `spread`."""
    spans, samples = [], {1: [], 2: []}
    for epoch in (1, 2):
        for step in range(steps):
            span = 0.040 + 0.010 * ((step * 3 + epoch) % 8)
            wobble = 1 + spread * (((step * 5 + epoch * 3) % 7) - 3) / 3
            spans.append({"epoch": epoch, "step": step, "comm_span_s": span, "synced_micro_batches": float(synced)})
            samples[epoch] += [[epoch, step, span / planted * wobble / synced]] * synced
    epochs = pd.DataFrame(
        {
            "epoch": [1, 2],
            "ddp_comm_s": [0.07, 0.07],
            "ddp_iterations": [steps * synced] * 2,
            "ddp_exposed_comm_s": [0.01, 0.02],
            "ddp_samples": [json.dumps(samples[1]), json.dumps(samples[2])],
        }
    )
    return epochs, pd.DataFrame(spans)


@pytest.mark.parametrize("synced", [1, 2])
def test_ddp_and_the_lab_agree_on_the_same_steps_and_a_planted_error_of_1_5_fails(synced):
    agree = ddp_second_opinion(*ddp_records(synced=synced))
    assert agree["ddp_pairs"] == 16 and agree["ddp_comm_ratio"] == pytest.approx(1.0, abs=0.01)
    assert agree["ddp_comm_ratio_low"] < 1 < agree["ddp_comm_ratio_high"] and agree["ddp_disagrees"] is False
    assert agree["ddp_comm_s"] == pytest.approx(0.07) and agree["ddp_exposed_comm_s"] == pytest.approx(0.015)
    for planted in (1.5, 1 / 1.5):  # DDP's timer, or the lab's, 1.5x off
        wrong = ddp_second_opinion(*ddp_records(planted=planted, synced=synced))
        assert wrong["ddp_comm_ratio"] == pytest.approx(planted, rel=0.01) and wrong["ddp_disagrees"] is True


def test_ddp_second_opinion_gives_no_verdict_on_too_little_or_too_noisy_evidence():
    few = ddp_second_opinion(*ddp_records(steps=1))  # 2 pairs
    assert few["ddp_pairs"] == 2 and few["ddp_comm_ratio"] is not None and few["ddp_disagrees"] is None
    noisy = ddp_second_opinion(*ddp_records(planted=1.2, spread=0.6, steps=3))  # an interval across 1.25
    assert noisy["ddp_comm_ratio_low"] < 1.25 < noisy["ddp_comm_ratio_high"] and noisy["ddp_disagrees"] is None
    # a step whose synchronised iterations DDP did not all sample is no pair
    epochs, spans = ddp_records(synced=2)
    assert ddp_second_opinion(epochs, spans.assign(synced_micro_batches=3.0))["ddp_pairs"] == 0


def test_ddp_second_opinion_absent_without_ddp_timers():
    nothing = dict.fromkeys(
        ("ddp_comm_s", "ddp_exposed_comm_s", "ddp_comm_ratio", "ddp_comm_ratio_low", "ddp_comm_ratio_high")
    )
    nothing.update(ddp_pairs=0, ddp_disagrees=None)
    epochs, spans = ddp_records()
    assert ddp_second_opinion(pd.DataFrame(), spans) == nothing
    assert ddp_second_opinion(epochs.drop(columns=["ddp_samples"]), spans)["ddp_pairs"] == 0
    assert ddp_second_opinion(epochs, spans.iloc[0:0])["ddp_disagrees"] is None


# --- trace.json against steps.parquet ---------------------------------------------------------


def test_trace_spans_are_the_records_durations_on_one_time_base(tmp_path):
    """Two ranks write the records and trace events of the same hand-built steps (rank 1's clock
    2 s behind rank 0's); trace.json (µs, from the earliest event, on rank 0's clock) must hold
    for every traced step and rank the step, its four phases and its buckets with the durations
    and start times steps.parquet gives them, and nothing of the steps not traced."""
    from scaling.instrument.trace import merge_trace
    from scaling.results import STEPS_PARQUET, TRACE_JSON

    traced = range(1, 3)  # global steps 1 and 2; 0 (warm-up) and 3 are not traced
    offsets = [0.0, 2.0]
    for rank, offset in enumerate(offsets):
        recorder = RunRecorder(Clock(), rank, 0, rank, tmp_path, world_size=2, offset_s=offset, trace_steps=traced)
        for epoch, steps in ((1, (0, 1)), (2, (2, 3))):
            for k in steps:
                start = 10.0 * k - offset + 0.013 * rank
                recorder.step(
                    marks(
                        k,
                        start,
                        [start + 0.1 + 0.01 * k, start + 0.25],
                        [start + 0.2, start + 0.31 + 0.02 * rank],
                        warmup=k == 0,
                        epoch=epoch,
                    )
                )
            recorder.step(marks(steps[-1], start + 5.0, [start + 5.1], [start + 5.2], kind="calib_sync", epoch=epoch))
            recorder.end_epoch({"epoch": epoch})
    assert merge_trace(tmp_path) == tmp_path / TRACE_JSON
    spans = [e for e in json.loads((tmp_path / TRACE_JSON).read_text())["traceEvents"] if e["ph"] == "X"]
    records = pd.read_parquet(tmp_path / STEPS_PARQUET)
    train = records[(records["kind"] == "train") & records["step"].isin(traced)]
    origin_s = train["start_t"].min()
    assert len(train) == 4 and {(e["pid"], e["args"]["step"]) for e in spans} == set(zip(train["rank"], train["step"]))
    us = pytest.approx  # the trace rounds to 1e-3 µs
    for _, row in train.iterrows():
        mine = [e for e in spans if e["pid"] == row["rank"] and e["args"]["step"] == row["step"]]
        step = next(e for e in mine if e["cat"] == "step")
        assert step["ts"] == us((row["start_t"] - origin_s) * 1e6, abs=2e-3)
        assert step["dur"] == us(row["step_s"] * 1e6, abs=2e-3)
        phases = {e["name"]: e for e in mine if e["cat"] == "phase"}
        ts = step["ts"]
        for name in ("data", "forward", "backward", "optimizer"):
            assert phases[name]["ts"] == us(ts, abs=4e-3) and phases[name]["dur"] == us(
                row[f"{name}_s"] * 1e6, abs=2e-3
            )
            ts += phases[name]["dur"]
        buckets = sorted((e for e in mine if e["cat"] == "allreduce"), key=lambda e: e["ts"])
        assert len(buckets) == row["num_buckets"] == 2
        union_us = (
            buckets[0]["dur"] + buckets[1]["dur"] - max(0.0, buckets[0]["ts"] + buckets[0]["dur"] - buckets[1]["ts"])
        )
        assert union_us == us(row["allreduce_s"] * 1e6, abs=5e-3)
        last_handed_over = max(b["ts"] for b in buckets)
        assert max(b["ts"] + b["dur"] for b in buckets) - last_handed_over == us(row["exposed_comm_s"] * 1e6, abs=5e-3)
        assert last_handed_over == us((row["compute_end_t"] - origin_s) * 1e6, abs=2e-3)
