"""Why communication costs what it does, proven by injection (scaling/instrument/recorder.py
`attribute`, scaling/analysis/run_metrics.py): the same 2-worker job (plain launcher) run three
times, alternating nothing: as it is, with a straggler (`instrument.inject_straggler_s = D` on
rank 1, before its backward, training steps only) and with a delay in the all-reduce path
(`instrument.inject_comm_delay_s = D`).

- straggler: rank 0's waiting grows by D (+-15%), the transfer does not (by less than 15% of
  D), rank 1 is named the straggler of the run and of every epoch;
- all-reduce delay: the transfer grows by D, the waiting does not;
- PyTorch DDP's own timers (the second opinion) agree with the lab's on rank 0's
  communication span, with and without the delay, and the runs write a trace (trace.json) in the Trace Event Format whose spans nest and add up.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from scaling.config import load_config
from scaling.launch.run import execute_run
from tests.conftest import REPO

INJECTED_S = 0.1
SMALL = ["data.train_samples=2048", "data.val_samples=256", "train.max_epochs=2", "train.target_accuracy=1.0",
         "instrument.calibration_pairs=4", "instrument.trace_steps=6"]


def _run(root, name: str, extra: list[str]) -> tuple[dict, pd.DataFrame]:
    """The run's summary, and per rank the median over its steady-state steps of each part
    (medians: a preempted step on this shared 2-core machine does not move them)."""
    cfg = load_config(REPO / "experiments" / "quickstart.yaml", overrides=SMALL + extra, num_workers=2)
    run_dir = root / name
    summary = execute_run(cfg, run_dir, launcher="local")
    assert summary["status"] == "max_epochs", summary["error"]
    steps = pd.read_parquet(run_dir / "steps.parquet")
    steady = steps[(steps["kind"] == "train") & ~steps["warmup"]]
    ranks = pd.read_parquet(run_dir / "ranks.parquet").set_index("rank")  # the run's own per-rank table
    medians = steady.groupby("rank")[["waiting_s", "transfer_s", "exposed_comm_s"]].median()
    return summary, medians.join(ranks[["straggler_share"]])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("attribution")
    return {
        "base": _run(root, "base", []),
        "straggler": _run(root, "straggler", [f"instrument.inject_straggler_s={INJECTED_S}", "instrument.straggler_rank=1"]),
        "delay": _run(root, "delay", [f"instrument.inject_comm_delay_s={INJECTED_S}"]),
        "root": root,
    }


def test_a_straggler_shows_as_the_others_waiting_and_is_named(runs):
    (base, base_ranks), (slow, slow_ranks) = runs["base"], runs["straggler"]
    waiting = slow_ranks.loc[0, "waiting_s"] - base_ranks.loc[0, "waiting_s"]
    transfer = slow_ranks.loc[0, "transfer_s"] - base_ranks.loc[0, "transfer_s"]
    print(f"straggler {INJECTED_S} s: rank 0 waiting +{waiting:.4f} s, transfer {transfer:+.4f} s")
    assert waiting == pytest.approx(INJECTED_S, rel=0.15)
    assert abs(transfer) < 0.15 * INJECTED_S
    assert slow_ranks.loc[1, "waiting_s"] < 0.15 * INJECTED_S  # the straggler waits for nobody
    assert slow["straggler_rank"] == 1 and slow["straggler_share"] > 0.9
    assert slow_ranks.loc[1, "straggler_share"] > 0.9
    epochs = pd.read_parquet(runs["root"] / "straggler" / "epochs.parquet")
    assert (epochs["straggler_rank"] == 1).all()
    assert slow["waiting_s"] > base["waiting_s"] and slow["clock_offset_uncertainty_us"] == 0.0  # one machine: one clock


def test_an_allreduce_delay_shows_as_transfer_not_waiting(runs):
    (base, base_ranks), (delayed, delayed_ranks) = runs["base"], runs["delay"]
    for rank in (0, 1):
        transfer = delayed_ranks.loc[rank, "transfer_s"] - base_ranks.loc[rank, "transfer_s"]
        waiting = delayed_ranks.loc[rank, "waiting_s"] - base_ranks.loc[rank, "waiting_s"]
        print(f"all-reduce delay {INJECTED_S} s: rank {rank} transfer +{transfer:.4f} s, waiting {waiting:+.4f} s")
        assert transfer == pytest.approx(INJECTED_S, rel=0.15)
        assert abs(waiting) < 0.15 * INJECTED_S
    # the second opinion: PyTorch DDP's own reducer timers see the injected delay as well
    print(f"DDP's backward comm time {base['ddp_comm_s']:.4f} s and {delayed['ddp_comm_s']:.4f} s; "
          f"lab / DDP {base['ddp_comm_ratio']:.2f} and {delayed['ddp_comm_ratio']:.2f}")
    assert delayed["ddp_comm_s"] > 0.9 * INJECTED_S  # DDP's timer holds the delay too
    for run in (base, delayed):  # the two instruments agree, within the noise of their means
        assert run["ddp_disagrees"] is False
    assert 0.85 < delayed["ddp_comm_ratio"] < 1.15


@pytest.mark.parametrize("name", ["base", "straggler"])
def test_trace_is_trace_event_format_and_its_spans_nest_and_add_up(runs, name):
    trace = json.loads((runs["root"] / name / "trace.json").read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {(r, t) for r in (0, 1) for t in ("phases", "all-reduce")}
    for e in spans:
        assert {"name", "cat", "ts", "dur", "pid", "tid", "args"} <= set(e) and e["dur"] >= 0
    steps = [e for e in spans if e["cat"] == "step"]
    assert len(steps) == 2 * 6  # trace_steps per rank
    for step in steps:
        inside = [e for e in spans if e["pid"] == step["pid"] and e["args"].get("step") == step["args"]["step"]
                  and e["cat"] in ("phase", "allreduce")]
        phases = [e for e in inside if e["cat"] == "phase"]
        assert [p["name"] for p in sorted(phases, key=lambda p: p["ts"])] == ["data", "forward", "backward", "optimizer"]
        assert sum(p["dur"] for p in phases) == pytest.approx(step["dur"], abs=0.01)  # µs, rounding
        for e in inside:  # nest: every phase and bucket inside its step
            assert step["ts"] - 0.01 <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 0.01
        assert any(e["cat"] == "allreduce" for e in inside)
