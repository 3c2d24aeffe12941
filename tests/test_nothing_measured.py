"""A run that measured nothing reports nothing: absent with the reason, never 0 (issue 28).

The summary's figures of a run that finished no epoch, built from empty records in process
(no training), and what `scaling run`'s screen prints for them; the definitional 0 of the A/B
overhead at one worker, kept where steps were recorded; the sweep tables and the report with
such runs among the others; and, in the slow tier, a real run that fails at its first step.
The preflight's memory refusal is in tests/test_config.py.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math

import pandas as pd
import pytest
from rich.console import Console

from scaling.analysis.run_metrics import AB_FIGURES, EPOCH_FIGURES, NO_EPOCH, STEP_FIGURES, summarize_run
from scaling.config import load_config
from scaling.launch.finish import write_summary
from scaling.launch.run import run_description
from scaling.results import RunDir, SweepDir
from tests.conftest import REPO

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
MEASURED_FIGURES = STEP_FIGURES + AB_FIGURES + EPOCH_FIGURES


def _train_steps(n: int = 4) -> pd.DataFrame:
    """Training-step records of one rank (no epoch finished), as the recorder writes them."""
    return pd.DataFrame(
        [
            dict(
                kind="train",
                warmup=False,
                epoch=1,
                rank=0,
                node_rank=0,
                step_s=0.1,
                data_s=0.01,
                forward_s=0.03,
                backward_s=0.05,
                optimizer_s=0.01,
                compute_s=0.1,
                allreduce_s=0.0,
                exposed_comm_s=0.0,
            )
            for _ in range(n)
        ]
    )


@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_run_with_no_records_has_every_figure_absent_with_its_reason(num_workers):
    out = summarize_run(pd.DataFrame(), pd.DataFrame(), target_accuracy=0.8, num_workers=num_workers)
    assert out["epochs_run"] == 0
    for figure in MEASURED_FIGURES:
        assert out[figure] is None, figure  # not 0.0: nothing was measured
        assert out["not_measured"][figure] == NO_EPOCH, figure
    assert out["comm_overhead_note"] == "A/B not measured: no epoch finished"
    assert out["mfu_note"] == NO_EPOCH


def test_the_definitional_zero_at_one_worker_needs_recorded_steps():
    out = summarize_run(_train_steps(), pd.DataFrame(), target_accuracy=0.8, num_workers=1)
    # steps were recorded (a run that died in its first epoch after writing them): the step
    # figures are measured, the 1-worker A/B overhead is 0 by definition, the epoch figures absent
    assert out["step_s"] == pytest.approx(0.1) and out["comm_overhead_pct"] == 0.0 and out["comm_delta_s"] == 0.0
    assert not set(STEP_FIGURES + AB_FIGURES) & set(out["not_measured"])
    assert {f: out["not_measured"][f] for f in EPOCH_FIGURES} == dict.fromkeys(EPOCH_FIGURES, NO_EPOCH)
    assert out["comm_overhead_note"] is None
    # at two workers the same steps without calibration pairs measure no A/B
    two = summarize_run(_train_steps(), pd.DataFrame(), target_accuracy=0.8, num_workers=2)
    assert (
        two["comm_overhead_pct"] is None and two["not_measured"]["comm_overhead_pct"] == "no calibration steps recorded"
    )


def _failed_summary(run_dir, overrides=(), **description) -> dict:
    cfg = load_config(QUICKSTART, overrides=list(overrides), num_workers=1)
    return write_summary(
        run_dir,
        {**run_description(cfg, "local"), **description},
        status="failed",
        error="RuntimeError: the worker died making its dataset",
        started_at=dt.datetime.now(dt.timezone.utc),
        wall_s=3.0,
    )


def test_the_summary_of_a_run_that_finished_no_epoch_says_null_and_why(tmp_path):
    """write_summary on a run directory with no records (the run of issue 28, whose worker died
    allocating its dataset): summary.json holds null and the reason, never 0."""
    summary = _failed_summary(tmp_path)
    on_disk = json.loads(RunDir(tmp_path).summary_path.read_text())
    assert on_disk["schema_version"] == 4 and on_disk["status"] == "failed"
    assert on_disk["comm_overhead_pct"] is None and on_disk["comm_delta_s"] is None
    assert on_disk["not_measured"]["comm_overhead_pct"] == "no epoch finished"
    assert on_disk["not_measured"] == summary["not_measured"]
    assert {f for f in MEASURED_FIGURES if on_disk[f] is None} == set(on_disk["not_measured"])


def test_step_timing_off_names_itself_as_the_reason(tmp_path):
    run = RunDir(tmp_path)
    epochs = pd.DataFrame(
        dict(
            epoch=[1, 2],
            train_s=[2.0, 1.5],
            samples=[1024, 1024],
            calibration_s=[0.0, 0.0],
            eval_s=[0.2, 0.2],
            val_accuracy=[0.5, 0.7],
            elapsed_train_s=[2.0, 3.5],
            elapsed_wall_s=[2.5, 4.5],
        )
    )
    epochs.to_parquet(run.epochs_path, index=False)
    summary = _failed_summary(tmp_path, ["instrument.step_timing=false"])
    assert summary["time_per_epoch_s"] == pytest.approx(1.5)  # the epochs were measured
    assert summary["step_s"] is None and summary["comm_overhead_pct"] is None  # no steps: no definitional 0
    assert summary["not_measured"]["step_s"] == "instrument.step_timing is off (epoch timing only)"
    assert summary["comm_overhead_note"] == "A/B not measured: instrument.step_timing is off (epoch timing only)"
    assert "time_per_epoch_s" not in summary["not_measured"]


def test_the_run_screen_says_not_measured_instead_of_a_number(tmp_path, capsys):
    from scaling.console import print_summary

    summary = _failed_summary(tmp_path)
    print_summary(summary, tmp_path)
    screen = capsys.readouterr().out
    for row in ("comm overhead (A/B)", "TTA", "time per epoch", "throughput", "step", "exposed comm"):
        line = next(line for line in screen.splitlines() if line.strip().startswith(row + " "))
        assert line.split(row, 1)[1].strip() == "not measured: no epoch finished", screen
    assert "0.0 %" not in screen and "[failed]" in screen


def test_the_screen_keeps_the_definitional_zero_and_reads_older_summaries(tmp_path, capsys):
    from scaling.console import print_summary

    summary = _failed_summary(tmp_path)
    measured = {
        **summary,
        "not_measured": {},
        "comm_overhead_pct": 0.0,
        "comm_delta_s": 0.0,
        "comm_overhead_note": None,
    }
    print_summary(measured, tmp_path)
    assert "comm overhead (A/B)  0.0 %" in capsys.readouterr().out
    # a schema-3 summary: no `not_measured`, the A/B reason in comm_overhead_note
    older = {k: v for k, v in summary.items() if k != "not_measured"}
    older.update(comm_overhead_note="A/B not measured: no calibration steps recorded", schema_version=3)
    print_summary(older, tmp_path)
    assert "comm overhead (A/B)  not measured: no calibration steps recorded" in capsys.readouterr().out


def test_sweep_tables_and_the_report_take_runs_with_absent_figures(tmp_path):
    """A sweep whose runs include one that finished no epoch (null figures, failed) and one at
    two workers without an A/B figure: the index, the tables, the intervals and the report are
    made, the absent figures are NaN (never 0) and the measured ones are unchanged."""
    from scaling.analysis.scaling_tables import per_worker_count
    from scaling.report import write_report
    from tests.fake_sweep import make_known_sweep

    nothing = {f: None for f in MEASURED_FIGURES}
    runs = [
        dict(
            num_workers=1,
            repeat=0,
            time_per_epoch_s=10.0,
            throughput_samples_per_s=100.0,
            tta_s=30.0,
            epochs_to_target=3,
            step_s=0.1,
            comm_overhead_pct=0.0,
            exposed_comm_pct=0.0,
        ),
        dict(
            num_workers=1,
            repeat=1,
            time_per_epoch_s=11.0,
            throughput_samples_per_s=95.0,
            tta_s=33.0,
            epochs_to_target=3,
            step_s=0.1,
            comm_overhead_pct=0.0,
            exposed_comm_pct=0.0,
        ),
        dict(
            num_workers=1,
            repeat=2,
            status="failed",
            error="RuntimeError: died",
            epochs_run=0,
            **nothing,
            not_measured=dict.fromkeys(MEASURED_FIGURES, NO_EPOCH),
        ),
        dict(
            num_workers=2,
            repeat=0,
            time_per_epoch_s=6.0,
            throughput_samples_per_s=170.0,
            tta_s=24.0,
            epochs_to_target=4,
            step_s=0.12,
            comm_overhead_pct=None,
            exposed_comm_pct=5.0,
            not_measured={"comm_overhead_pct": "no calibration steps recorded"},
        ),
        dict(
            num_workers=2,
            repeat=1,
            time_per_epoch_s=6.5,
            throughput_samples_per_s=160.0,
            tta_s=26.0,
            epochs_to_target=4,
            step_s=0.12,
            comm_overhead_pct=None,
            exposed_comm_pct=6.0,
            not_measured={"comm_overhead_pct": "no calibration steps recorded"},
        ),
    ]
    sweep_path = make_known_sweep(tmp_path, runs)
    sweep = SweepDir(sweep_path)
    index = sweep.runs
    assert index.loc[index["run_key"] == "w1-r2", "not_measured.comm_overhead_pct"].item() == NO_EPOCH
    table = per_worker_count(index).set_index("num_workers")
    assert table.loc[1, "time_per_epoch_s"] == pytest.approx(10.5)  # the failed run counts nowhere
    assert table.loc[1, "comm_overhead_pct"] == 0.0  # measured at one worker: 0 by definition
    assert math.isnan(table.loc[2, "comm_overhead_pct"])  # never measured: NaN, not 0
    console = Console(file=io.StringIO(), width=200, color_system=None)
    report = write_report(sweep_path, console).read_text()

    def run_row(key: str) -> list[str]:  # the report's table of runs: one row per run
        line = next(line for line in report.splitlines() if line.startswith(f"| {key} |"))
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    failed = run_row("w1-r2")
    assert failed[3:5] == ["failed", "0"] and set(failed[5:]) == {"-"}  # absent, not 0
    assert run_row("w2-r0")[-1] == "-" and run_row("w1-r0")[-1] == "0.0"  # comm overhead: absent / measured 0


@pytest.mark.slow
def test_a_real_run_that_dies_at_its_first_step_reports_no_figure_it_did_not_measure(tmp_path, capsys):
    """The plain launcher, one worker, failing at its first step (`instrument.fail_at_step=0`,
    before any epoch ends): summary.json and the screen give every figure as not measured, and
    the A/B overhead is not the 1-worker 0 (issue 28's run said "comm overhead (A/B) 0.0 %")."""
    from scaling import cli

    out = tmp_path / "run"
    code = cli.main(
        [
            "run",
            str(QUICKSTART),
            "--launcher",
            "local",
            "--workers",
            "1",
            "--out",
            str(out),
            "--set",
            "instrument.fail_at_step=0",
            "--set",
            "data.train_samples=256",
            "--set",
            "data.val_samples=64",
            "--set",
            "instrument.telemetry_interval_s=0",
        ]
    )
    screen = capsys.readouterr().out
    assert code == 1, screen
    summary = RunDir(out).summary()
    assert summary["status"] == "failed" and "injected failure at step 0" in summary["error"]
    assert summary["epochs_run"] == 0 and summary["comm_overhead_pct"] is None and summary["time_per_epoch_s"] is None
    assert summary["not_measured"] == dict.fromkeys(MEASURED_FIGURES, NO_EPOCH)
    line = next(line for line in screen.splitlines() if line.strip().startswith("comm overhead (A/B) "))
    assert line.split("comm overhead (A/B)", 1)[1].strip() == "not measured: no epoch finished", screen
