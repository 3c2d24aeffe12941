"""Sweep tables (scaling.analysis.scaling_tables) on hand-built runs with known answers."""

import math

import numpy as np
import pandas as pd
import pytest

from scaling.analysis.scaling_tables import (
    accuracy_curves,
    batch_tradeoff,
    default_group_by,
    per_worker_count,
    target_accuracy,
    tta_spread,
)


def _run(
    num_workers,
    repeat,
    status="reached_target",
    tpe=10.0,
    thr=100.0,
    tta=None,
    epochs=None,
    price=3.0,
    nodes=1,
    comm=0.0,
    exposed_pct=0.0,
    exposed_s=0.0,
    **extra,
):
    return dict(
        run_key=f"w{num_workers}-r{repeat}",
        run_dir=f"runs/w{num_workers}-r{repeat}",
        repeat=repeat,
        seed=repeat,
        num_workers=num_workers,
        num_nodes=nodes,
        backend="gloo",
        per_worker_batch=32,
        global_batch=32 * num_workers,
        status=status,
        target_accuracy=0.84,
        time_per_epoch_s=tpe,
        throughput_samples_per_s=thr,
        tta_s=tta,
        tta_wall_s=None if tta is None else tta + 5,
        epochs_to_target=epochs,
        comm_overhead_pct=comm,
        exposed_comm_pct=exposed_pct,
        step_s=0.1,
        data_s=0.01,
        forward_s=0.03,
        backward_s=0.05,
        optimizer_s=0.01,
        exposed_comm_s=exposed_s,
        node_price_per_hour=price,
        **extra,
    )


def _failed(num_workers, repeat, **extra):
    """A run that failed after some epochs: it still carries the (partial) figures of the epochs it ran.

    Every figure is far from the other runs' (slow epochs, a huge throughput, a TTA of 1 s, 90%
    communication, 1 s steps), so counting the run anywhere would move that figure visibly.
    """
    partial = dict(tpe=50.0, thr=5000.0, tta=1.0, epochs=1, price=3.0, comm=90.0, exposed_pct=90.0, exposed_s=0.5)
    row = _run(num_workers, repeat, status="failed", **{**partial, **extra})
    row.update(step_s=1.0, data_s=0.1, forward_s=0.3, backward_s=0.5, optimizer_s=0.1)
    return row


@pytest.fixture
def runs():
    return pd.DataFrame(
        [
            _run(1, 0, tpe=9.0, tta=40.0, epochs=4),
            _run(1, 1, tpe=11.0, tta=60.0, epochs=6),
            _run(2, 0, tpe=5.0, thr=180.0, tta=30.0, epochs=6, price=0.0, comm=12.0, exposed_pct=20.0, exposed_s=0.02),
            _run(2, 1, tpe=5.0, thr=180.0, tta=50.0, epochs=10, price=0.0, comm=14.0, exposed_pct=20.0, exposed_s=0.02),
            _run(2, 2, status="max_epochs", tpe=6.0, thr=200.0, price=0.0, comm=16.0, exposed_pct=30.0, exposed_s=0.02),
            _failed(2, 3),  # partial figures (see _failed): each would move its median or mean if counted
        ]
    )


def test_counts_and_repeats(runs):
    table = per_worker_count(runs).set_index("num_workers")
    assert list(table.index) == [1, 2]
    assert table.loc[2, ["n_runs", "n_failed", "n_ok", "n_reached"]].tolist() == [4, 1, 3, 2]
    assert table.loc[1, "reached_fraction"] == 1.0
    assert table.loc[2, "reached_fraction"] == pytest.approx(2 / 3)  # failed runs are not repeats


def test_medians_and_tta_statistics(runs):
    table = per_worker_count(runs).set_index("num_workers")
    # w2 time per epoch: median(5, 5, 6) = 5; throughput: median(180, 180, 200) = 180
    assert table.loc[1, "time_per_epoch_s"] == 10.0 and table.loc[2, "time_per_epoch_s"] == 5.0
    assert table.loc[2, "throughput_samples_per_s"] == 180.0
    assert table.loc[1, "tta_mean_s"] == 50.0
    assert table.loc[1, "tta_std_s"] == pytest.approx(math.sqrt(200))  # ddof=1
    assert table.loc[1, "tta_cv"] == pytest.approx(math.sqrt(200) / 50)
    assert table.loc[2, "tta_mean_s"] == 40.0  # the max_epochs repeat has no TTA
    assert table.loc[2, "tta_cv"] == pytest.approx(math.sqrt(200) / 40)
    assert table.loc[2, "epochs_to_target"] == 8.0
    assert table.loc[1, "tta_wall_mean_s"] == 55.0
    assert table.loc[2, "comm_overhead_pct"] == 14.0 and table.loc[1, "comm_overhead_pct"] == 0.0
    assert table.loc[2, "exposed_comm_pct"] == 20.0


def test_failed_runs_are_left_out_of_every_figure(runs):
    """The failed w2 run carries partial figures (tpe 50, throughput 5000, TTA 1 s in 1 epoch, 90% comm,
    1 s steps); every w2 figure is the hand-computed one of the three other runs only."""
    w2 = per_worker_count(runs).set_index("num_workers").loc[2]
    assert (w2["n_runs"], w2["n_failed"], w2["n_ok"], w2["n_reached"]) == (4, 1, 3, 2)  # counted, not a repeat
    # medians over the 3 finished runs; in brackets what counting the failed one would give
    assert w2["time_per_epoch_s"] == 5.0  # median(5, 5, 6)          [median(5, 5, 6, 50) = 5.5]
    assert w2["throughput_samples_per_s"] == 180.0  # median(180, 180, 200)  [median(.., 5000) = 190]
    assert w2["comm_overhead_pct"] == 14.0  # median(12, 14, 16)       [median(.., 90) = 15]
    assert w2["exposed_comm_pct"] == 20.0  # median(20, 20, 30)        [median(.., 90) = 25]
    # TTA figures over the 2 repeats that reached the target (30 s in 6 epochs, 50 s in 10)
    assert w2["tta_mean_s"] == 40.0  # (30 + 50) / 2                   [(30 + 50 + 1) / 3 = 27]
    assert w2["tta_wall_mean_s"] == 45.0  # (35 + 55) / 2              [(35 + 55 + 6) / 3 = 32]
    assert w2["epochs_to_target"] == 8.0  # median(6, 10)              [median(6, 10, 1) = 6]
    assert w2["reached_fraction"] == pytest.approx(2 / 3)  # 2 reached of 3 finished   [3/4]
    # step phases: means over the 3 finished runs, all 0.1 s steps   [(3 x 0.1 + 1.0) / 4 = 0.325]
    assert w2["step_s"] == pytest.approx(0.1) and w2["data_s"] == pytest.approx(0.01)
    assert w2["forward_s"] == pytest.approx(0.03) and w2["optimizer_s"] == pytest.approx(0.01)
    assert w2["exposed_comm_s"] == pytest.approx(0.02)  # [(3 x 0.02 + 0.5) / 4 = 0.14]
    assert w2["backward_compute_s"] == pytest.approx(0.05 - 0.02)
    # speedups: 10 / 5 = 2.0 per epoch, 180 / 100 = 1.8 throughput, 50 / 40 = 1.25 TTA
    speedups = (w2["speedup_time_per_epoch"], w2["speedup_throughput"], w2["speedup_tta"])
    assert speedups == pytest.approx((2.0, 1.8, 1.25))
    # the price of w2 is 0 (unknown): no cost, although the failed run names $3/h
    assert math.isnan(w2["cost_to_accuracy_usd"])


def test_cv_ratio_says_where_tta_varies(runs):
    table = per_worker_count(runs).set_index("num_workers")
    # epochs [4, 6]: CV = sqrt(2)/5; time per epoch [9, 11]: CV = sqrt(2)/10
    assert table.loc[1, "epochs_cv"] == pytest.approx(math.sqrt(2) / 5)
    assert table.loc[1, "time_per_epoch_cv"] == pytest.approx(math.sqrt(2) / 10)
    assert table.loc[1, "tta_cv_ratio"] == pytest.approx(2.0)
    assert math.isnan(table.loc[2, "tta_cv_ratio"])  # time per epoch did not vary at all


def test_cv_is_nan_with_one_value():
    table = per_worker_count(pd.DataFrame([_run(1, 0, tta=40.0, epochs=4), _run(1, 1, status="max_epochs")]))
    assert table.loc[0, "n_reached"] == 1 and table.loc[0, "tta_mean_s"] == 40.0
    assert math.isnan(table.loc[0, "tta_std_s"]) and math.isnan(table.loc[0, "tta_cv"])
    assert table.loc[0, "reached_fraction"] == 0.5


def test_speedup_and_efficiency(runs):
    table = per_worker_count(runs).set_index("num_workers")
    assert table["base_workers"].tolist() == [1, 1]
    assert table.loc[1, ["speedup_time_per_epoch", "speedup_throughput", "speedup_tta"]].tolist() == [1, 1, 1]
    assert table.loc[2, "speedup_time_per_epoch"] == pytest.approx(2.0)
    assert table.loc[2, "efficiency_time_per_epoch"] == pytest.approx(1.0)
    assert table.loc[2, "speedup_throughput"] == pytest.approx(1.8)
    assert table.loc[2, "efficiency_throughput"] == pytest.approx(0.9)
    assert table.loc[2, "speedup_tta"] == pytest.approx(50 / 40)
    assert table.loc[2, "efficiency_tta"] == pytest.approx(0.625)


def test_cost_to_accuracy(runs):
    table = per_worker_count(runs).set_index("num_workers")
    # 1 node at $3/h: 40 s and 60 s -> mean 50 s -> 50/3600 x 3
    assert table.loc[1, "cost_to_accuracy_usd"] == pytest.approx(50 / 3600 * 3.0)
    assert math.isnan(table.loc[2, "cost_to_accuracy_usd"])  # price 0 = unknown
    two_nodes = per_worker_count(pd.DataFrame([_run(4, 0, tta=36.0, epochs=3, nodes=2, price=10.0)]))
    assert two_nodes.loc[0, "cost_to_accuracy_usd"] == pytest.approx(36 / 3600 * 2 * 10.0)


def test_step_breakdown_adds_up(runs):
    table = per_worker_count(runs).set_index("num_workers")
    assert table.loc[2, "backward_compute_s"] == pytest.approx(0.03)
    assert table.loc[2, "exposed_comm_s"] == pytest.approx(0.02)
    parts = ["data_s", "forward_s", "backward_compute_s", "exposed_comm_s", "optimizer_s"]
    np.testing.assert_allclose(table[parts].sum(axis=1), table["step_s"])


def test_exposed_comm_is_zero_at_one_worker_when_missing():
    row = _run(1, 0, tta=40.0, epochs=4)
    row["exposed_comm_s"] = None
    table = per_worker_count(pd.DataFrame([row]))
    assert table.loc[0, "exposed_comm_s"] == 0.0 and table.loc[0, "backward_compute_s"] == pytest.approx(0.05)


def test_baseline_is_smallest_count_with_a_finished_run():
    runs = pd.DataFrame(
        [_failed(1, 0), _run(2, 0, tpe=8.0, tta=80.0, epochs=8), _run(4, 0, tpe=4.0, tta=48.0, epochs=10)]
    )
    table = per_worker_count(runs).set_index("num_workers")
    assert table.loc[1, "n_failed"] == 1 and math.isnan(table.loc[1, "speedup_time_per_epoch"])
    assert table.loc[4, "base_workers"] == 2
    assert table.loc[4, "speedup_time_per_epoch"] == pytest.approx(2.0)
    assert table.loc[4, "efficiency_tta"] == pytest.approx((80 / 48) / 2)


def test_sweep_axis_groups_have_their_own_baseline():
    rows = []
    for batch, slow in ((32, 1.0), (64, 2.0)):
        for n, tpe in ((1, 10.0), (2, 4.0)):
            rows.append(
                _run(
                    n,
                    0,
                    tpe=tpe * slow,
                    tta=tpe * slow * 4,
                    epochs=4,
                    **{"sweep.train.per_worker_batch": batch, "sweep.data.seed": 0},
                )
            )
    runs = pd.DataFrame(rows)
    keys = default_group_by(runs)
    assert keys == ("num_workers", "sweep.train.per_worker_batch")  # sweep.data.seed has a single value
    table = per_worker_count(runs, keys)
    assert len(table) == 4
    assert table["base_workers"].tolist() == [1, 1, 1, 1]
    np.testing.assert_allclose(
        table.sort_values(["sweep.train.per_worker_batch", "num_workers"])["speedup_time_per_epoch"],
        [1.0, 2.5, 1.0, 2.5],
    )
    with pytest.raises(ValueError, match="num_workers"):
        per_worker_count(runs, ("backend",))


def test_batch_tradeoff(runs):
    table = batch_tradeoff(runs)
    assert table["global_batch"].tolist() == [32, 64]
    assert table.set_index("global_batch").loc[64, "epochs_to_target"] == 8.0
    assert table.set_index("global_batch").loc[64, "per_worker_batch"] == 32
    one_batch = runs[runs["num_workers"] == 1]
    assert batch_tradeoff(one_batch).empty


def test_accuracy_curves_leave_out_failed_runs():
    epochs = pd.DataFrame(
        [
            dict(run_id="a", num_workers=1, seed=0, status="reached_target", epoch=1, val_accuracy=0.5),
            dict(run_id="a", num_workers=1, seed=0, status="reached_target", epoch=2, val_accuracy=0.8),
            dict(run_id="b", num_workers=1, seed=1, status="reached_target", epoch=1, val_accuracy=0.7),
            dict(run_id="c", num_workers=1, seed=2, status="failed", epoch=1, val_accuracy=0.1),
            dict(run_id="d", num_workers=2, seed=0, status="max_epochs", epoch=1, val_accuracy=0.4),
        ]
    )
    curves = accuracy_curves(epochs).set_index(["num_workers", "epoch"])
    assert curves.loc[(1, 1), "val_accuracy_mean"] == pytest.approx(0.6)
    assert curves.loc[(1, 1), "val_accuracy_std"] == pytest.approx(math.sqrt(0.02))
    assert curves.loc[(1, 1), ["val_accuracy_min", "val_accuracy_max", "n_runs"]].tolist() == pytest.approx(
        [0.5, 0.7, 2]
    )
    assert curves.loc[(1, 2), "n_runs"] == 1 and math.isnan(curves.loc[(1, 2), "val_accuracy_std"])
    assert curves.loc[(2, 1), "val_accuracy_mean"] == pytest.approx(0.4)
    assert accuracy_curves(pd.DataFrame()).empty


def test_tta_spread_and_target(runs):
    spread = tta_spread(runs)
    assert len(spread) == 5 and (spread["status"] != "failed").all()
    assert spread.loc[spread["num_workers"] == 2, "tta_s"].notna().sum() == 2
    assert target_accuracy(runs) == 0.84


def test_json_nulls_from_parquet_are_handled(runs):
    # A sweep where no run reached the target: the TTA columns are all None (object dtype).
    # (the failed run stays failed: it is not a run that missed the target)
    runs = runs.assign(
        tta_s=None,
        tta_wall_s=None,
        epochs_to_target=None,
        status=runs["status"].where(runs["status"] == "failed", "max_epochs"),
    )
    table = per_worker_count(runs)
    assert table["n_reached"].tolist() == [0, 0]
    assert table["tta_mean_s"].isna().all() and table["speedup_tta"].isna().all()
    assert table.loc[1, "speedup_throughput"] == pytest.approx(1.8)


def test_a_run_whose_worker_count_changed_is_no_fixed_count_point(runs):
    """An elastic run that lost a node (2 workers, then 1) finished, but it belongs to no worker count:
    counted (n_resized), left out of every figure, and the fixed-count runs' figures unchanged."""
    before = per_worker_count(runs).set_index("num_workers")
    elastic = _run(
        2,
        4,
        tpe=40.0,
        thr=50.0,
        tta=500.0,
        epochs=8,
        worker_count_changed=True,
        workers_first_attempt=2,
        workers_last_attempt=1,
    )
    with_elastic = pd.concat([runs.assign(worker_count_changed=False), pd.DataFrame([elastic])], ignore_index=True)
    table = per_worker_count(with_elastic).set_index("num_workers")
    assert table.loc[2, ["n_runs", "n_failed", "n_resized", "n_ok", "n_reached"]].tolist() == [5, 1, 1, 3, 2]
    for figure in ("time_per_epoch_s", "throughput_samples_per_s", "tta_mean_s", "speedup_throughput", "speedup_tta"):
        assert table.loc[2, figure] == pytest.approx(before.loc[2, figure]), figure
    assert "w2-r4" not in set(tta_spread(with_elastic)["run_key"])


def test_a_run_whose_timing_perturbed_its_steps_or_whose_ddp_timers_disagree_is_named():
    from scaling.analysis.scaling_tables import measurement_caveats

    runs = pd.DataFrame(
        {
            "run_key": ["w2-r0", "w2-r1", "w4-r0"],
            "timing_perturbs_steps": [True, False, None],
            "timing_effect_s": [0.0031, 0.0, None],
            "timing_effect_half_width_s": [0.0012, 0.001, None],
            "ddp_disagrees": [None, False, True],
            "ddp_comm_ratio": [0.9, 1.0, 1.6],
        }
    )
    perturbed, disagree = measurement_caveats(runs)
    assert "perturbed step: w2-r0 (+3.10 ± 1.20 ms)" in perturbed and "w2-r1" not in perturbed
    assert disagree.endswith("on the same steps: w4-r0 (lab / DDP 1.60)")
    assert measurement_caveats(runs.drop(columns=["timing_perturbs_steps", "ddp_disagrees"])) == []
