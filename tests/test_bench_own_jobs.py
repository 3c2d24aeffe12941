"""The own-jobs proof's bookkeeping (bench/projection_own_jobs.py): each round's prediction is kept and
compared with its own round's 2-worker run, the headline compares the medians over rounds, and the goal
is judged on the headline alone."""

import importlib
import sys

import pytest


@pytest.fixture()
def own_jobs(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts bench/ first on it
    return importlib.import_module("bench.projection_own_jobs")


def _prediction(step_ms: float, exposed_pct: float) -> dict:
    step = step_ms / 1e3
    exposed = step * exposed_pct / 100
    return {"step_s": step, "exposed_comm_pct": exposed_pct, "exposed_comm_s": exposed, "straggler_s": 0.001}


def test_rounds_are_compared_one_by_one_and_the_headline_by_medians(own_jobs):
    rounds = [_prediction(36.0, 75.0), _prediction(37.0, 74.0), _prediction(40.0, 70.0), _prediction(38.0, 76.0)]
    head = own_jobs.median_prediction(rounds)
    assert head["step_s"] == pytest.approx(0.0375) and head["exposed_comm_pct"] == pytest.approx(74.5)
    measured_by_round = {"0": (37.0, 73.0), "1": (37.0, 90.0), "2": (38.0, 72.0), "3": (39.0, 71.0)}
    measured = {
        "step_s": 0.0375,
        "exposed_comm_pct": 72.5,
        "per_round": {r: {"step_s": s / 1e3, "exposed_comm_pct": e} for r, (s, e) in measured_by_round.items()},
        "diagnosis": {"compute_s": 0.009, "allreduce_in_run_s": 0.026, "straggler_wait_s": 0.001},
    }
    entry = {"paced": head, "unpaced": _prediction(34.0, 78.0), "solo": _prediction(32.0, 80.0), "rounds": rounds}
    (row,) = own_jobs.compare({"backend": "ddp"}, {"100mbit": entry}, {"100mbit": measured})
    pairs = [(36.0, 37.0), (37.0, 37.0), (40.0, 38.0), (38.0, 39.0)]  # each round's prediction, its measurement
    assert row["step_error_pct_by_round"] == pytest.approx([100 * (p - m) / m for p, m in pairs])
    assert row["exposed_error_pp_by_round"] == pytest.approx([2.0, -16.0, -2.0, 5.0])
    assert row["step_error_pct[paced]"] == pytest.approx(0.0) and row["exposed_error_pp[paced]"] == pytest.approx(2.0)
    assert row["step_pass"] and row["exposed_pass"]  # one round's 90% exposed share does not decide the goal
    assert row["step_error_pct[solo]"] == pytest.approx(100 * (32.0 - 37.5) / 37.5)
    measured["exposed_comm_pct"] = 70.0
    (row,) = own_jobs.compare({"backend": "ddp"}, {"100mbit": entry}, {"100mbit": measured})
    assert not row["exposed_pass"]  # 4.5 pp
