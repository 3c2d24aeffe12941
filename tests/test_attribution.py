"""Why communication costs what it does, proven by injection (scaling/instrument/recorder.py
`attribute`, scaling/analysis/run_metrics.py): the same 2-worker job (plain launcher) run twice,
as it is and with two known costs at once: a straggler (`instrument.inject_straggler_s = D_S`:
rank 1 sleeps before its backward, training steps only) and a delay in the all-reduce path
(`instrument.inject_comm_delay_s = D_C`, every rank). Each cost exceeds the checks' margin
(50 ms < D_C = 0.2 s < D_S = 0.4 s), so a cost counted in the wrong part of the split shows:

- the straggler: rank 0's waiting is D_S (+-50 ms), rank 1 (the straggler) waits for nobody,
  and rank 1 is named the straggler of the run, of every epoch and of nearly every step;
- the all-reduce delay: each rank's transfer grows by D_C (+-50 ms), not by D_C + D_S;
  rank 0's waiting holding D_S within 50 ms says the delay is not counted as waiting;
- PyTorch DDP's own timers (the second opinion) agree with the lab's on rank 0's
  communication span in both runs, and hold the injected time;
- the runs write a trace (trace.json) in the Trace Event Format whose spans nest, add up and
  are the durations steps.parquet records for the same steps.
The rules themselves, on hand-built records: tests/test_attribution_rules.py.

Which observation each check takes, so that load cannot break it:
- transfer (from the last rank's hand-over to this rank's last all-reduce done): its
  least-disturbed step, the fastest steady-state one, in each run. Other processes only ever
  add to it (a preempted gloo thread, a late wake-up from the injected sleep).
- rank 0's waiting: the median over the injected run's steady steps, against D_S. Rank 0
  waits D_S plus the difference between the two ranks' compute before their hand-overs, which
  load makes either sign; hence the median, and a batch of 16 per worker keeps that compute,
  and with it the difference, small (at 64 per worker, under load, medians 60 ms off D_S).
- the straggler's share of the steps: a step is named for rank 0 only where rank 0 was held up
  D_S longer than rank 1.

Measured here: (base, injected) pairs of runs in alternating order on the 2 cores, loaded by
other projects' tests and, in 22 of the batch-16 pairs, two busy loops (1-min load average 3.9
to 21; the base run's median step 16 to 242 ms, 15x its quiet value):
                                     batch 16 (34 pairs: D_S, D_C =     batch 64 (19 pairs:
                                     0.5, 0.2; 0.3, 0.1; 0.4, 0.2)      D_S 0.3-0.5, D_C 0.2)
    fastest transfer's growth - D_C  -3.1..+21.5 ms (either rank)      -3.1..+2.7 ms
    median waiting of rank 0 - D_S   -14..+24 ms (per step -300..+302)  -60..+28 ms
    median waiting of rank 1         0                                  0
    straggler share                  0.92 (2 runs: one step of 13)-1.0  0.92 (1 run)-1.0
    DDP ratio lab / DDP, injected    0.90..1.03 (0.94..1.00 at 0.4+0.2) 0.94..1.03
    DDP comm - (D_S + D_C)           -19..+232 ms                       -54..+66 ms
    ddp_disagrees                    never (68 runs)                    never (38 runs)
Margins: 50 ms for the waiting and the transfer (2x the worst seen at batch 16); a straggler
share above 0.75 (3 steps of 13 may go to rank 0); DDP's comm above D_S + D_C - 0.1 s and
the ratio within 0.15 of 1 (the discrepancy is tens of ms whatever D: 6% of the 0.6 s here).
The figures' errors are set by load, not by D (the same ranges at 0.3 and 0.5 s), so D is as
small as the margins allow: 16 steps of 0.6 s, 9.6 s of sleep in the injected run.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from scaling.config import load_config
from scaling.launch.run import execute_run
from tests.conftest import REPO

D_S = 0.4  # s the straggler (rank 1) sleeps before its backward, per training step
D_C = 0.2  # s added to the last bucket's all-reduce, per step, on every rank
MARGIN_S = 0.05  # what load moved the checked figures by: 24 ms at most (module docstring)
STRAGGLER_SHARE = 0.75  # seen: 0.92 (one step of 13 not named for rank 1) to 1.0
DDP_RATIO_MARGIN = 0.15  # seen: the ratio 0.90-1.03
BATCH, STEPS_PER_EPOCH, EPOCHS, WARMUP, TRACED = 16, 8, 2, 3, 6
SMALL = [
    f"data.train_samples={2 * BATCH * STEPS_PER_EPOCH}",
    f"data.val_samples={4 * BATCH}",
    f"train.per_worker_batch={BATCH}",
    f"train.max_epochs={EPOCHS}",
    "train.target_accuracy=1.0",
    "train.eval_every=1.0",
    "instrument.calibration_pairs=0",
    f"instrument.warmup_steps={WARMUP}",
    f"instrument.trace_steps={TRACED}",
]


def _run(root, name: str, extra: list[str]) -> dict:
    """The run's summary, its steady-state training steps, its per-rank table and epochs."""
    cfg = load_config(REPO / "experiments" / "quickstart.yaml", overrides=SMALL + extra, num_workers=2)
    run_dir = root / name
    summary = execute_run(cfg, run_dir, launcher="local")
    assert summary["status"] == "max_epochs", summary["error"]
    steps = pd.read_parquet(run_dir / "steps.parquet")
    steady = steps[(steps["kind"] == "train") & ~steps["warmup"]]
    assert len(steady) == 2 * (EPOCHS * STEPS_PER_EPOCH - WARMUP)  # ranks x steady steps
    return {
        "summary": summary,
        "steady": steady,
        "dir": run_dir,
        "ranks": pd.read_parquet(run_dir / "ranks.parquet").set_index("rank"),
        "epochs": pd.read_parquet(run_dir / "epochs.parquet"),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("attribution")
    return {
        "base": _run(root, "base", []),
        "injected": _run(
            root,
            "injected",
            [
                f"instrument.inject_straggler_s={D_S}",
                "instrument.straggler_rank=1",
                f"instrument.inject_comm_delay_s={D_C}",
            ],
        ),
    }


def _rank(run: dict, rank: int) -> pd.DataFrame:
    return run["steady"][run["steady"]["rank"] == rank]


def test_a_straggler_shows_as_the_others_waiting_and_is_named(runs):
    injected = runs["injected"]
    waiting = {rank: float(_rank(injected, rank)["waiting_s"].median()) for rank in (0, 1)}
    base = {rank: float(_rank(runs["base"], rank)["waiting_s"].median()) for rank in (0, 1)}
    summary = injected["summary"]
    print(
        f"straggler {D_S} s: median waiting rank 0 {waiting[0]:.4f} s, rank 1 {waiting[1]:.4f} s "
        f"(base run {base[0]:.4f}, {base[1]:.4f}); straggler rank {summary['straggler_rank']}, "
        f"share {summary['straggler_share']:.3f}"
    )
    assert waiting[0] == pytest.approx(D_S, abs=MARGIN_S)  # and so not D_S + D_C: the delay is not waiting
    assert waiting[1] < MARGIN_S  # the straggler waits for nobody
    assert summary["straggler_rank"] == 1 and summary["straggler_share"] > STRAGGLER_SHARE
    assert injected["ranks"].loc[1, "straggler_share"] > STRAGGLER_SHARE
    assert (injected["epochs"]["straggler_rank"] == 1).all()


def test_an_allreduce_delay_shows_as_transfer_not_waiting(runs):
    base, injected = runs["base"], runs["injected"]
    for rank in (0, 1):
        growth = float(_rank(injected, rank)["transfer_s"].min() - _rank(base, rank)["transfer_s"].min())
        print(f"all-reduce delay {D_C} s: rank {rank}'s fastest transfer grew {growth:.4f} s")
        assert growth == pytest.approx(D_C, abs=MARGIN_S)  # and so not D_C + D_S: the straggler is not transfer
    # the second opinion: PyTorch DDP's own reducer timers. On rank 0 its communication span,
    # from the first bucket's launch, holds the wait for the straggler and the delay.
    ddp_base, ddp = base["summary"], injected["summary"]
    print(
        f"DDP's backward comm time {ddp_base['ddp_comm_s']:.4f} s and {ddp['ddp_comm_s']:.4f} s; "
        f"lab / DDP {ddp_base['ddp_comm_ratio']:.2f} and {ddp['ddp_comm_ratio']:.2f}"
    )
    # DDP's timer holds the injected delay, and of the straggler's sleep what rank 0 was not slowed by
    # itself meanwhile (a fresh-clone run under load read 0.47 s of 0.6 s)
    assert ddp["ddp_comm_s"] > D_C + D_S / 2
    # the two instruments agree on the same steps (the summary's rule: the ratio's 95% interval within a
    # factor 1.25); the base run's few millisecond spans may give no verdict, never a disagreement
    assert ddp["ddp_disagrees"] is False and ddp_base["ddp_disagrees"] is not True
    assert ddp["ddp_comm_ratio"] == pytest.approx(1.0, abs=DDP_RATIO_MARGIN)


@pytest.mark.parametrize("name", ["base", "injected"])
def test_trace_is_trace_event_format_and_its_spans_nest_and_add_up(runs, name):
    run = runs[name]
    events = json.loads((run["dir"] / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {(r, t) for r in (0, 1) for t in ("phases", "all-reduce")}
    for e in spans:
        assert {"name", "cat", "ts", "dur", "pid", "tid", "args"} <= set(e) and e["dur"] >= 0
    steps = [e for e in spans if e["cat"] == "step"]
    assert len(steps) == 2 * TRACED  # trace_steps per rank
    records = run["steady"].set_index(["rank", "step"])
    for step in steps:
        inside = [
            e
            for e in spans
            if e["pid"] == step["pid"]
            and e["args"].get("step") == step["args"]["step"]
            and e["cat"] in ("phase", "allreduce")
        ]
        phases = [e for e in inside if e["cat"] == "phase"]
        assert [p["name"] for p in sorted(phases, key=lambda p: p["ts"])] == [
            "data",
            "forward",
            "backward",
            "optimizer",
        ]
        assert sum(p["dur"] for p in phases) == pytest.approx(step["dur"], abs=0.01)  # µs, rounding
        for e in inside:  # nest: every phase and bucket inside its step
            assert step["ts"] - 0.01 <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 0.01
        assert any(e["cat"] == "allreduce" for e in inside)
        # the same step's record (steps.parquet): the trace draws what the records hold
        record = records.loc[(step["pid"], step["args"]["step"])]
        assert step["dur"] == pytest.approx(record["step_s"] * 1e6, abs=0.01)
        for p in phases:
            assert p["dur"] == pytest.approx(record[f"{p['name']}_s"] * 1e6, abs=0.01)
        assert sum(e["cat"] == "allreduce" for e in inside) == record["num_buckets"]
