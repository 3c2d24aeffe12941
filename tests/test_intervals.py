"""Intervals, the "within noise" call and the repeats a claim needs (scaling/analysis/intervals.py),
on hand-built runs with a known spread; TTA at quarter-epoch evaluations against hand-computed
values (scaling/analysis/run_metrics.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scaling.analysis import intervals as iv
from scaling.analysis import scaling_tables as st
from scaling.analysis.run_metrics import summarize_run


def _runs(rows: list[tuple[int, float, float | None, float]]) -> pd.DataFrame:
    """(num_workers, throughput, tta_s, comm_overhead_pct) per run; time per epoch = 1000 / throughput."""
    return pd.DataFrame(
        [
            {
                "num_workers": n,
                "status": "reached_target" if tta is not None else "max_epochs",
                "run_key": f"w{n}-r{i}",
                "throughput_samples_per_s": thr,
                "time_per_epoch_s": 1000.0 / thr,
                "tta_s": tta,
                "comm_overhead_pct": comm,
                "exposed_comm_pct": comm / 2,
            }
            for i, (n, thr, tta, comm) in enumerate(rows)
        ]
    )


def _intervals(runs: pd.DataFrame) -> pd.DataFrame:
    table = st.per_worker_count(runs)
    return iv.scaling_intervals(st.prepare_runs(runs), table).set_index("num_workers")


def test_two_repeats_each_the_interval_is_the_range_of_the_ratios_and_includes_1_within_noise():
    # base throughput 90 and 110, two workers 95 and 105: the median of a resample of two runs
    # is one of them or their mean, so the ratio's extremes are 95/110 and 105/90; each comes up
    # in 1/16 of the resamples (6.25% > 2.5%), so they are the interval's ends.
    runs = _runs([(1, 90.0, None, 0.0), (1, 110.0, None, 0.0), (2, 95.0, None, 10.0), (2, 105.0, None, 12.0)])
    two = _intervals(runs).loc[2]
    assert two["speedup_throughput"] == pytest.approx(1.0)  # 100 / 100
    assert two["speedup_throughput_lo"] == pytest.approx(95 / 110)
    assert two["speedup_throughput_hi"] == pytest.approx(105 / 90)
    assert two["verdict_speedup_throughput"] == "within noise"
    assert two["efficiency_throughput_hi"] == pytest.approx(105 / 90 / 2)
    # A/B overhead of the 2-worker runs: 10 and 12 %, interval [10, 12], clear of 0
    assert (two["comm_overhead_pct_lo"], two["comm_overhead_pct_hi"]) == (pytest.approx(10.0), pytest.approx(12.0))
    assert two["verdict_comm_overhead_pct"] == "above"
    # no TTA (no run reached the target): no interval, and said so
    assert two["verdict_speedup_tta"] == "no interval"


def test_one_repeat_gives_no_interval_never_a_zero_width_one():
    runs = _runs([(1, 100.0, 50.0, 0.0), (2, 180.0, 30.0, 8.0)])
    two = _intervals(runs).loc[2]
    assert two["speedup_throughput"] == pytest.approx(1.8)
    assert np.isnan(two["speedup_throughput_lo"]) and two["verdict_speedup_throughput"] == "no interval"
    assert iv.format_interval(1.8, np.nan, np.nan, ".2f", "×") == "1.80× (no interval)"


def test_a_known_spread_gives_an_interval_around_the_truth_and_a_clear_speedup():
    rng = np.random.default_rng(7)
    # 20 repeats per point, throughput with a 5% spread: true speedup 1.8
    base = rng.normal(100.0, 5.0, 20)
    two = rng.normal(180.0, 9.0, 20)
    runs = _runs([(1, t, None, 0.0) for t in base] + [(2, t, None, 10.0) for t in two])
    row = _intervals(runs).loc[2]
    assert row["speedup_throughput_lo"] < 1.8 < row["speedup_throughput_hi"]
    half_width = (row["speedup_throughput_hi"] - row["speedup_throughput_lo"]) / 2 / row["speedup_throughput"]
    # the median's standard error is about 1.25 x 5% / sqrt(20) per group: a ±3-4% interval on the ratio
    assert 0.015 < half_width < 0.08
    assert row["verdict_speedup_throughput"] == "above"
    # already within ±5%: no more repeats needed than the 20 measured
    assert row["repeats_needed_speedup_throughput"] == 20


def test_the_tta_vs_throughput_gap_is_called_only_outside_the_noise():
    # throughput 1.5x with no spread; TTA 1.2x with no spread: the gap 0.8 is real
    clear = _runs([(1, 100.0, 60.0, 0.0)] * 2 + [(2, 150.0, 50.0, 9.0)] * 2)
    row = _intervals(clear).loc[2]
    assert row["gap_tta_vs_throughput"] == pytest.approx(0.8)
    assert row["verdict_gap_tta_vs_throughput"] == "below"
    # TTA of the 1-worker runs 40 and 80 (mean 60), 2 workers 30 and 70 (mean 50): the gap's interval spans 1
    noisy = _runs([(1, 100.0, 40.0, 0.0), (1, 100.0, 80.0, 0.0), (2, 150.0, 30.0, 9.0), (2, 150.0, 70.0, 9.0)])
    row = _intervals(noisy).loc[2]
    assert row["speedup_tta"] == pytest.approx(1.2)
    # TTA speedup extremes: 40/70 and 80/30; over the throughput speedup 1.5
    assert row["speedup_tta_lo"] == pytest.approx(40 / 70) and row["speedup_tta_hi"] == pytest.approx(80 / 30)
    assert row["verdict_gap_tta_vs_throughput"] == "within noise"


def test_repeats_needed_by_hand():
    # estimate 1.5, interval [1.35, 1.65] from 3 repeats: half-width 0.15 = 10% of 1.5; for ±5%:
    # 3 x (0.10 / 0.05)^2 = 12
    assert iv.repeats_needed(1.5, 1.35, 1.65, 3, width=0.05) == 12
    assert iv.repeats_needed(1.5, 1.49, 1.51, 3) == 3  # already narrower: what was measured
    assert np.isnan(iv.repeats_needed(1.5, np.nan, np.nan, 1))


def test_report_says_within_noise_instead_of_a_conclusion(tmp_path):
    from tests.fake_sweep import make_known_sweep
    from scaling.report import write_report

    runs = []
    for n, values in ((1, [(100.0, 40.0), (100.0, 80.0)]), (2, [(150.0, 30.0), (150.0, 70.0)])):
        for repeat, (throughput, tta) in enumerate(values):
            runs.append(
                {
                    "num_workers": n,
                    "repeat": repeat,
                    "throughput_samples_per_s": throughput,
                    "time_per_epoch_s": 1000 / throughput,
                    "tta_s": tta,
                    "status": "reached_target",
                }
            )
    sweep = make_known_sweep(tmp_path, runs)
    text = write_report(sweep, figures=False).read_text()
    assert "1→2 workers" in text
    assert "the data cannot say whether TTA scales better or worse than throughput" in text
    assert "TTA speedup 1.20× [0.57, 2.67], within noise" in text


# --- TTA at quarter-epoch evaluations ----------------------------------------------------------


def test_tta_at_a_quarter_epoch_evaluation_by_hand():
    # two epochs of 4 s training each; evaluations every quarter epoch after 1, 2, ..., 8 s of training.
    epochs = pd.DataFrame(
        {
            "epoch": [1, 2],
            "train_s": [4.0, 4.0],
            "val_accuracy": [0.70, 0.92],
            "samples": [100, 100],
            "calibration_s": [0.0, 0.0],
            "eval_s": [0.5, 0.5],
            "elapsed_wall_s": [5.0, 10.0],
        }
    )
    evals = pd.DataFrame(
        {
            "epoch": [1, 1, 1, 1, 2, 2, 2, 2],
            "epoch_progress": [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0],
            "elapsed_train_s": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
            "elapsed_wall_s": [1.2, 2.4, 3.6, 5.0, 6.2, 7.4, 8.6, 10.0],
            "val_accuracy": [0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.91, 0.92],
        }
    )
    first = summarize_run(pd.DataFrame(), epochs, 0.9, 2, evals=evals)
    # first evaluation at >= 0.9: 1.75 epochs, after 7.0 s of training (not the epoch's end, 8.0 s)
    assert first["tta_rule"] == "first_eval"
    assert first["tta_s"] == 7.0 and first["epochs_to_target_progress"] == 1.75 and first["tta_wall_s"] == 8.6
    assert first["tta_epoch_end_s"] == 8.0 and first["epochs_to_target"] == 2
    dawnbench = summarize_run(pd.DataFrame(), epochs, 0.9, 2, evals=evals, tta_rule="epoch_end")
    assert dawnbench["tta_rule"] == "epoch_end" and dawnbench["tta_s"] == 8.0 and dawnbench["tta_wall_s"] == 10.0
    # a restart's lost time counts in both rules: 3 s lost
    attempts = [
        {"first_step_unix": 0.0, "resume_point_unix": None},
        {"first_step_unix": 13.0, "resume_point_unix": 10.0},
    ]
    restarted = summarize_run(pd.DataFrame(), epochs, 0.9, 2, attempts=attempts, evals=evals)
    assert restarted["tta_s"] == 10.0 and restarted["tta_epoch_end_s"] == 11.0
