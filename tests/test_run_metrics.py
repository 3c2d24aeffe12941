"""The timing arithmetic, on hand-built records with known answers."""

import math

import pandas as pd
import pytest

from scaling.analysis.run_metrics import comm_delta_s, summarize_run
from scaling.instrument.timing import BucketMarks, StepMarks, interval_union_s


def test_interval_union_counts_overlap_once():
    assert interval_union_s([]) == 0
    assert interval_union_s([(0, 1), (2, 3)]) == 2
    assert interval_union_s([(0, 2), (1, 3)]) == 3  # a bucket queued behind another
    assert interval_union_s([(0, 4), (1, 2)]) == 4


def test_step_marks_resolve_phases_and_exposed_comm():
    from scaling.instrument.timing import Clock

    # data 0-1, forward 1-3, backward 3-10, optimizer 10-11 (seconds since an origin of 100)
    buckets = [BucketMarks(0, 105.0, 107.0), BucketMarks(1, 108.0, 109.5), BucketMarks(2, 109.0, 109.8)]
    marks = StepMarks.single(1, 0, "train", False, 32, 100.0, (101.0, 103.0, 110.0, 111.0), buckets)
    row = marks.resolve(Clock())
    assert row["data_s"] == 1 and row["forward_s"] == 2 and row["backward_s"] == 7 and row["optimizer_s"] == 1
    assert row["step_s"] == 11
    assert row["allreduce_s"] == pytest.approx(2.0 + 1.8)  # [5,7] and [8,9.8]
    # backward compute ended when the last bucket was handed over (9); comm ended at 9.8
    assert row["exposed_comm_s"] == pytest.approx(0.8)
    assert row["compute_s"] == pytest.approx(2 + 7 - 0.8 + 1)
    assert row["num_buckets"] == 3


def _step(epoch, step, rank, kind="train", warmup=False, step_s=1.0, exposed=0.1, allreduce=0.2, pair=-1):
    return dict(
        epoch=epoch,
        step=step,
        rank=rank,
        node_rank=0,
        local_rank=rank,
        kind=kind,
        warmup=warmup,
        pair=pair,
        samples=32,
        data_s=0.1,
        forward_s=0.3,
        backward_s=0.5,
        optimizer_s=0.1,
        step_s=step_s,
        allreduce_s=allreduce,
        exposed_comm_s=exposed,
        compute_s=step_s - 0.1 - exposed,
        num_buckets=1,
    )


def _epochs(train_s, acc):
    rows, elapsed = [], 0.0
    for i, (t, a) in enumerate(zip(train_s, acc), start=1):
        elapsed += t + 0.5
        rows.append(
            dict(
                epoch=i,
                train_s=t,
                eval_s=0.3,
                calibration_s=0.2,
                train_loss=1.0,
                val_accuracy=a,
                samples=1000,
                throughput_samples_per_s=1000 / t,
                elapsed_train_s=sum(train_s[:i]),
                elapsed_wall_s=elapsed,
                lr=0.1,
            )
        )
    return pd.DataFrame(rows)


def test_summary_excludes_warmup_and_calibration_from_step_figures():
    steps = pd.DataFrame(
        [_step(1, 0, r, warmup=True, step_s=9.0) for r in (0, 1)]
        + [_step(1, s, r, step_s=1.0 + 0.2 * r) for s in (1, 2) for r in (0, 1)]
        + [_step(1, 2, r, kind="calib_sync", step_s=0.9, pair=p) for r in (0, 1) for p in range(3)]
        + [_step(1, 2, r, kind="calib_nosync", step_s=0.6, pair=p) for r in (0, 1) for p in range(3)]
    )
    out = summarize_run(steps, _epochs([10.0], [0.5]), target_accuracy=0.9, num_workers=2)
    assert out["step_s"] == pytest.approx(1.1)  # mean of 1.0 and 1.2: warm-up (9 s) left out
    assert out["comm_delta_s"] == pytest.approx(0.3)
    assert out["comm_overhead_pct"] == pytest.approx(100 * 0.3 / 1.1)
    assert out["exposed_comm_pct"] == pytest.approx(100 * 0.1 / 1.1)


def test_three_communication_figures_side_by_side():
    # per training step: 0.4 s with an all-reduce in flight, 0.1 s of it exposed; the A/B pairs
    # differ by 0.25 s (interference: 0.15 s beyond the calibration steps' own 0.1 s exposed)
    steps = pd.DataFrame(
        [_step(1, s, r, step_s=1.0, exposed=0.1, allreduce=0.4) for s in (1, 2) for r in (0, 1)]
        + [_step(1, 3, r, kind="calib_sync", step_s=0.9, exposed=0.1, pair=p) for r in (0, 1) for p in range(3)]
        + [_step(1, 3, r, kind="calib_nosync", step_s=0.65, exposed=0.0, pair=p) for r in (0, 1) for p in range(3)]
    )
    out = summarize_run(steps, _epochs([10.0], [0.5]), target_accuracy=0.9, num_workers=2)
    assert out["allreduce_pct"] == pytest.approx(40.0)  # time communicating (DAWNBench's figure)
    assert out["exposed_comm_pct"] == pytest.approx(10.0)  # what backward did not hide
    assert out["comm_overhead_pct"] == pytest.approx(25.0)  # A/B: what communication costs the step
    assert out["interference_pct"] == pytest.approx(15.0)
    one = summarize_run(
        steps[steps["rank"] == 0].assign(allreduce_s=0.0, exposed_comm_s=0.0),
        _epochs([10.0], [0.5]),
        target_accuracy=0.9,
        num_workers=1,
    )
    assert (one["allreduce_pct"], one["exposed_comm_pct"], one["comm_overhead_pct"]) == (0.0, 0.0, 0.0)


def _sampled_steps(untimed_step_s: float, timed_step_s: float = 1.0, jitter: float = 0.01) -> pd.DataFrame:
    """Two ranks' 100 steady steps, collectives timed on every 10th (NaN communication columns on
    the others, as instrument.collective_timing_every leaves them); each timed step exposes 0.1 s and
    has 0.4 s in flight, of a step of `timed_step_s` (± `jitter`); the untimed ones last `untimed_step_s`."""
    rows = []
    for step in range(100):
        timed = step % 10 == 0
        for rank in (0, 1):
            wobble = jitter * ((step * 7 + rank * 3) % 5 - 2) / 2
            row = _step(1, step, rank, step_s=(timed_step_s if timed else untimed_step_s) + wobble)
            if timed:
                row.update(exposed_comm_s=0.1 + wobble / 10, allreduce_s=0.4)
            else:
                row.update(exposed_comm_s=float("nan"), allreduce_s=float("nan"), compute_s=float("nan"))
            rows.append(row)
    return pd.DataFrame(rows)


def test_a_share_rests_on_the_steps_that_timed_it_whatever_the_others_do():
    # a planted drift: the untimed steps twice as slow, or half as fast, as the timed ones. The shares
    # are those of the timed steps (10% and 40%) either way; a mean over the timed steps over a mean over
    # all steps would move from 10% to 5.3% and 18.2%.
    epochs = _epochs([10.0], [0.5])
    figures = [summarize_run(_sampled_steps(u), epochs, target_accuracy=None, num_workers=2) for u in (1.0, 2.0, 0.5)]
    for out in figures:
        assert out["exposed_comm_pct"] == pytest.approx(10.0, rel=5e-3)  # the timed steps jitter by 0.25% on average
        assert out["allreduce_pct"] == pytest.approx(40.0, rel=5e-3)
        assert out["comm_timed_steps"] == 20 and out["steps_recorded"] == 200  # what each figure rests on
        assert 0 < out["exposed_comm_pct_half_width"] < 0.5  # the interval of a share over 20 timed steps
    drifted = figures[1]
    naive = 100 * drifted["exposed_comm_s"] / drifted["step_s"]
    assert naive == pytest.approx(100 * 0.1 / 1.9, rel=1e-2)  # what the old definition said


def test_the_observers_effect_on_its_timed_steps_is_measured_and_flagged():
    epochs = _epochs([10.0], [0.5])
    same = summarize_run(_sampled_steps(1.0), epochs, target_accuracy=None, num_workers=2)
    assert same["timing_effect_s"] == pytest.approx(0.0, abs=0.01) and same["timing_perturbs_steps"] is False
    slower = summarize_run(
        _sampled_steps(1.0, timed_step_s=1.05), epochs, target_accuracy=None, num_workers=2
    )  # timing costs 5%
    assert slower["timing_effect_s"] == pytest.approx(0.05, abs=0.01)
    assert slower["timing_effect_half_width_s"] < 0.05 and slower["timing_perturbs_steps"] is True
    assert slower["timed_step_s"] == pytest.approx(1.05, abs=0.01) and slower["untimed_step_s"] == pytest.approx(
        1.0, abs=0.01
    )
    every = summarize_run(
        _sampled_steps(1.0).dropna(subset=["exposed_comm_s"]), epochs, target_accuracy=None, num_workers=2
    )
    assert every["timing_perturbs_steps"] is None and every["timing_effect_s"] is None  # nothing untimed


def test_interference_compares_the_ab_with_the_exposed_time_it_removes():
    # FSDP's A/B keeps the all-gathers: both halves expose 0.1 s of them; the sync half adds 0.05 s
    # of exposed reduce-scatters. A/B 0.2 s: 0.15 s beyond what the synchronisation exposes (taking
    # the sync half's whole 0.15 s exposed time would say 0.05 s).
    steps = pd.DataFrame(
        [_step(1, s, r, step_s=1.0, exposed=0.15, allreduce=0.4) for s in (1, 2) for r in (0, 1)]
        + [_step(1, 3, r, kind="calib_sync", step_s=0.9, exposed=0.15, pair=p) for r in (0, 1) for p in range(3)]
        + [_step(1, 3, r, kind="calib_nosync", step_s=0.7, exposed=0.1, pair=p) for r in (0, 1) for p in range(3)]
    )
    out = summarize_run(steps, _epochs([10.0], [0.5]), target_accuracy=0.9, num_workers=2)
    assert out["comm_overhead_pct"] == pytest.approx(20.0)
    assert out["interference_pct"] == pytest.approx(15.0)


def test_comm_delta_is_median_over_epochs_of_rank_means():
    rows = []
    for epoch, (sync, nosync) in enumerate([(1.0, 0.5), (1.0, 0.8), (1.0, 0.7)], start=1):
        for rank in (0, 1):
            for pair in range(3):
                rows += [_step(epoch, 0, rank, kind="calib_sync", step_s=sync, pair=pair)]
                rows += [_step(epoch, 0, rank, kind="calib_nosync", step_s=nosync, pair=pair)]
    assert comm_delta_s(pd.DataFrame(rows)) == pytest.approx(0.3)  # deltas 0.5, 0.2, 0.3


def test_comm_delta_pairs_sync_with_its_own_no_sync():
    # a slow drift across pairs: unpaired medians would mix it in; paired differences do not
    rows = []
    for pair, base in enumerate([0.5, 0.9, 1.3, 1.7, 2.1]):
        rows += [
            _step(1, 0, 0, kind="calib_nosync", step_s=base, pair=pair),
            _step(1, 0, 0, kind="calib_sync", step_s=base + 0.1 + 0.01 * pair, pair=pair),
        ]
    assert comm_delta_s(pd.DataFrame(rows)) == pytest.approx(0.12)


def test_tta_time_per_epoch_and_throughput():
    steps = pd.DataFrame([_step(1, s, 0) for s in range(3)])
    epochs = _epochs([12.0, 10.0, 11.0, 10.5], [0.3, 0.6, 0.85, 0.9])
    out = summarize_run(steps, epochs, target_accuracy=0.8, num_workers=1)
    assert out["epochs_to_target"] == 3
    assert out["tta_s"] == pytest.approx(33.0)  # evaluation and calibration excluded
    assert out["tta_wall_s"] == pytest.approx(33.0 + 3 * 0.5)
    assert out["time_per_epoch_s"] == pytest.approx(10.5)  # median of epochs 2..4
    assert out["throughput_samples_per_s"] == pytest.approx(1000 / 10.5)
    assert out["comm_overhead_pct"] == 0.0 and out["comm_delta_s"] == 0.0  # one worker: 0 by definition
    assert out["best_accuracy"] == pytest.approx(0.9)


def test_target_never_reached_has_no_tta():
    out = summarize_run(pd.DataFrame([_step(1, 0, 0)]), _epochs([1.0, 1.0], [0.1, 0.2]), 0.9, 1)
    assert out["tta_s"] is None and out["epochs_to_target"] is None and out["tta_wall_s"] is None


def test_empty_records_give_none_not_nan():
    out = summarize_run(pd.DataFrame(), pd.DataFrame(), 0.9, 2)
    assert out["epochs_run"] == 0 and out["step_s"] is None and out["comm_overhead_pct"] is None
    assert not any(isinstance(v, float) and math.isnan(v) for v in out.values())


def test_worker_counts_before_and_after_restarts():
    from scaling.analysis.run_metrics import worker_counts

    kept = [
        {"num_workers": 2, "first_step_unix": 0.0, "resume_point_unix": None},
        {"num_workers": 2, "first_step_unix": 50.0, "resume_point_unix": 20.0},
    ]
    assert worker_counts(kept) == {"workers_first_attempt": 2, "workers_last_attempt": 2, "worker_count_changed": False}
    shrunk_and_back = [{"num_workers": 4}, {"num_workers": 2}, {"num_workers": 4}]
    assert worker_counts(shrunk_and_back) == {
        "workers_first_attempt": 4,
        "workers_last_attempt": 4,
        "worker_count_changed": True,
    }
    # records from before attempts kept their size: unknown, not guessed
    assert worker_counts([{"first_step_unix": 0.0}])["worker_count_changed"] is None
    assert worker_counts(None)["workers_first_attempt"] is None


def test_cost_to_accuracy_at_the_price_paid_with_the_time_lost():
    from scaling.analysis.run_metrics import node_cost_usd, run_costs

    # 2 spot p3.16xlarge at $7.344/h; 3000 s of training + 600 s lost = 3600 s of TTA
    costs = run_costs(3600.0, 600.0, 2, 7.344)
    assert costs["cost_to_accuracy_usd"] == pytest.approx(14.688)  # 1 h x 2 nodes x $7.344
    assert costs["time_lost_cost_usd"] == pytest.approx(2.448)  # 600/3600 h x 2 x $7.344
    assert run_costs(3600.0, 0.0, 2, 0.0) == {"cost_to_accuracy_usd": None, "time_lost_cost_usd": None}  # price unknown
    assert run_costs(None, 600.0, 2, 7.344)["cost_to_accuracy_usd"] is None  # the target not reached
    # the report's per-run cost is the same function over columns
    tta, nodes, price = pd.Series([1800.0, 1800.0]), pd.Series([4, 4]), pd.Series([24.48, 0.0])
    cost = node_cost_usd(tta, nodes, price)
    assert cost.iloc[0] == pytest.approx(48.96) and math.isnan(cost.iloc[1])


def test_count_columns_of_timed_and_sampled_epochs_read_together(tmp_path):
    # an epoch whose steps were all timed holds whole counts; one with untimed steps NaN among them
    # (instrument.collective_timing_every): the parts of one table still read as one column
    from scaling.results import STEPS_PARQUET, RunDir

    parts = tmp_path / STEPS_PARQUET
    parts.mkdir()
    pd.DataFrame({"step": [0, 1], "num_buckets": [3, 3]}).to_parquet(parts / "rank00000-epoch00001.parquet")
    sampled = pd.DataFrame({"step": [2, 3], "num_buckets": [3.0, float("nan")]})
    sampled.to_parquet(parts / "rank00000-epoch00002.parquet")
    batches = list(RunDir(tmp_path).step_batches(["step", "num_buckets"]))
    read = pd.concat(batches)
    assert list(read["step"]) == [0, 1, 2, 3]
    assert list(read["num_buckets"][:3]) == [3, 3, 3] and pd.isna(read["num_buckets"].iloc[3])


def test_the_per_rank_table_tells_a_rank_waiting_for_its_input_from_one_computing_slower():
    # rank 1 waits 0.2 s more for its data each step, rank 0 computes as usual: the table holds each rank's phases
    rows = [_step(1, s, r) for s in range(4) for r in (0, 1)]
    for row in rows:
        if row["rank"] == 1:
            row.update(data_s=0.3, step_s=1.2)
    out = summarize_run(pd.DataFrame(rows), _epochs([10.0], [0.5]), target_accuracy=None, num_workers=2)
    ranks = out["ranks"].set_index("rank")
    assert list(ranks.columns[:5]) == ["step_s", "data_s", "forward_s", "backward_s", "optimizer_s"]
    assert ranks.loc[1, "data_s"] == pytest.approx(0.3) and ranks.loc[0, "data_s"] == pytest.approx(0.1)
    assert ranks.loc[1, "backward_s"] == ranks.loc[0, "backward_s"] == pytest.approx(0.5)
