"""The samples-to-target model (scaling/projection/tta.py) and the projection's time to accuracy from it.

- The model: epochs grow as (1 + B/B_noise) / (1 + B0/B_noise); its interval takes the noise scale's and the
  anchor's ends, wider the further from B0; an unbounded noise scale keeps the anchor's epochs as a bound.
- Sources: a measured batch takes its measurement, a batch between two measured ones their interpolation, a
  batch beyond them the model anchored at the nearest measured batch below; each row names which.
- Support: the linear rule holds up to the noise scale's upper bound, a tuned rate everywhere, another rule only
  at the run's own batch; a row beyond says so and the projection carries the caveat.
- `scaling project --model ... --noise-scale` and `run_projection(samples_to_target=)` give `epochs_to_target`,
  `tta_s` and `speedup_tta` with intervals beside `speedup_throughput`.
"""

from __future__ import annotations

import math

import pytest

from scaling.projection import run_projection, tta
from scaling.projection.tta import epochs_at

pytestmark = pytest.mark.unit


def _model(value=1000.0, low=800.0, high=1300.0, batch=128, epochs=10.0, lo=9.5, rule="linear"):
    return tta.SamplesToTarget(tta.NoiseScale(value, low, high), batch, epochs, lo, epochs, rule)


def test_epochs_grow_by_the_models_factor_with_an_interval_from_both_inputs():
    model = _model()
    e, lo, hi = tta.epochs_by_model(model, 1024)
    assert e == pytest.approx(10.0 * (1 + 1024 / 1000) / (1 + 128 / 1000))
    assert lo == pytest.approx(9.5 * (1 + 1024 / 1300) / (1 + 128 / 1300))  # the larger noise scale, E0's low end
    assert hi == pytest.approx(10.0 * (1 + 1024 / 800) / (1 + 128 / 800))
    near, far = tta.epochs_by_model(model, 256), tta.epochs_by_model(model, 4096)
    assert (near[2] - near[1]) / near[0] < (far[2] - far[1]) / far[0]  # wider relative interval further out
    unbounded = _model(high=math.inf)
    assert tta.epochs_by_model(unbounded, 4096)[1] == pytest.approx(9.5)  # no upper bound: no growth at the low end
    below = tta.epochs_by_model(model, 32)
    assert below[0] < 10.0 and below[1] <= below[0] <= below[2]


def test_each_row_names_its_source_measured_interpolated_or_the_model():
    measured = {128: 10.0, 512: 11.0}
    rows = tta.epochs_rows([128, 256, 512, 2048], measured, _model())
    assert [r["epochs_source"] for r in rows] == [
        "measured",
        "interpolated between measured batches",
        "measured",
        "noise-scale model from batch 512",
    ]
    assert rows[0]["epochs_to_target_lo"] == 9.5  # the model's own run: its evaluation interval
    assert rows[3]["epochs_to_target"] == pytest.approx(11.0 * (1 + 2048 / 1000) / (1 + 512 / 1000))
    assert rows[3]["epochs_extrapolated"] and not rows[1]["epochs_extrapolated"]
    without = tta.epochs_rows([128, 2048], measured, None)  # no noise scale: today's rule
    assert without[1]["epochs_source"] == "extrapolated along the measured points"
    assert without[1]["epochs_to_target"] == pytest.approx(epochs_at(measured, 2048)[0])


def test_a_row_beyond_the_learning_rate_rules_support_says_so():
    assert tta.supported(_model(), 1300) and not tta.supported(_model(), 1301)  # linear: to the upper bound
    assert tta.supported(_model(rule="tuned"), 10**6)
    assert tta.supported(_model(rule="sqrt"), 128) and not tta.supported(_model(rule="sqrt"), 256)
    with pytest.raises(ValueError, match="lr_rule"):
        _model(rule="cubic")


def test_the_projection_gives_tta_speedup_with_intervals_beside_throughputs():
    model = _model(value=2000.0, low=1500.0, high=3000.0, batch=256, epochs=30.0, lo=29.0)
    df = run_projection("resnet50", "p3.16xlarge", "1,2,4,8,16", epochs_to_target="256:30", samples_to_target=model)
    for column in ("epochs_to_target", "tta_s", "speedup_tta", "speedup_throughput", "epochs_source"):
        assert column in df.columns
    assert (df["speedup_tta_lo"] <= df["speedup_tta"]).all() and (df["speedup_tta"] <= df["speedup_tta_hi"]).all()
    beyond = df[df["global_batch"] > 3000]
    assert beyond["beyond_support"].all() and tta.SUPPORT_CAVEAT in df.attrs["caveats"]
    # samples to target grow with the batch: TTA speedup falls behind throughput speedup
    last = df.iloc[-1]
    assert last["speedup_tta"] < last["speedup_throughput"]
    # (time per epoch counts whole steps: the ratio of throughputs to within a step's rounding)
    assert last["speedup_tta"] == pytest.approx(
        last["speedup_throughput"] * df.iloc[0]["epochs_to_target"] / last["epochs_to_target"], rel=0.01
    )


def test_the_command_line_takes_a_noise_scale_with_the_epochs_table(capsys):
    from scaling.cli import main

    assert (
        main(
            [
                "project",
                "--model",
                "resnet50",
                "--cluster",
                "p3.16xlarge",
                "--nodes",
                "1,16",
                "--epochs-to-target",
                "256:30",
                "--noise-scale",
                "2000:1500:3000",
                "--lr-rule",
                "tuned",
                "--json",
            ]
        )
        == 0
    )
    import json

    rows = json.loads(capsys.readouterr().out)
    assert rows[-1]["epochs_source"] == "noise-scale model from batch 256" and rows[-1]["beyond_support"] is False
    assert rows[-1]["speedup_tta_lo"] < rows[-1]["speedup_tta"] < rows[-1]["speedup_tta_hi"]


def test_a_noise_scale_without_epochs_is_refused_in_one_line(capsys):
    from scaling.cli import main

    assert main(["project", "--model", "resnet50", "--cluster", "p3.16xlarge", "--noise-scale", "2000"]) != 0
    error = capsys.readouterr().err.strip()
    assert "needs --epochs-to-target" in error and "\n" not in error


def test_a_run_directory_with_its_noise_scale_projects_tta_speedup(tmp_path, capsys, monkeypatch):
    from scaling import cli
    from scaling.projection.from_run import project_run
    from scaling.results import SUMMARY_JSON, write_json_atomic
    from tests.test_projection_from_run import BATCH, _job_run

    run = _job_run(tmp_path / "job")
    summary = run.summary()
    without = project_run(run, "p5.48xlarge", [8, 128])
    assert "tta_s" not in without.columns  # no noise scale, no epochs: no time to accuracy
    summary.update(noise_scale=64.0, noise_scale_low=40.0, noise_scale_high=100.0, epochs_to_target=3)
    summary["epochs_to_target_progress"] = 2.5
    write_json_atomic(run.path / SUMMARY_JSON, summary)
    df = project_run(run, "p5.48xlarge", [8, 128])
    assert df["epochs_source"].iloc[0] == "measured (the run)" and df["epochs_to_target"].iloc[0] == 2.5
    assert df["epochs_to_target_lo"].iloc[0] == 1.5  # back to the evaluation before: one epoch, no config
    assert df["epochs_to_target"].iloc[-1] == pytest.approx(2.5 * (1 + 128 * BATCH / 64) / (1 + BATCH / 64))
    assert df["beyond_support"].iloc[-1]  # the linear rule (assumed: no config) far past the noise scale
    said = {name: source for name, _, source in df.attrs["parameters"]}
    assert "assumed (no config)" in said["epochs to target"]
    tuned = project_run(run, "p5.48xlarge", [8, 128], lr_rule="tuned")
    assert not tuned["beyond_support"].any()
    monkeypatch.setenv("COLUMNS", "250")
    assert cli.main(["project", str(run.path), "--cluster", "p5.48xlarge", "--gpus", "8,128"]) == 0
    out = capsys.readouterr().out
    assert "TTA x" in out and "throughput x" in out and "noise-scale model from batch" in out


def test_a_sweep_directory_gives_the_measured_epochs_per_global_batch(tmp_path, capsys):
    import json

    import pandas as pd

    from scaling.cli import main

    rows = [
        {"run_id": f"r{i}", "status": status, "global_batch": batch, "epochs_to_target": epochs}
        for i, (status, batch, epochs) in enumerate(
            [("reached", 64, 30), ("reached", 64, 32), ("max_epochs", 512, None), ("reached", 512, 36)]
        )
    ]
    (tmp_path / "runs").mkdir()
    pd.DataFrame(rows).to_parquet(tmp_path / "runs.parquet")
    args = ["project", "--model", "resnet50", "--cluster", "p3.16xlarge", "--nodes", "1,16"]
    assert main([*args, "--epochs-to-target", str(tmp_path), "--json"]) == 0
    by_batch = {row["global_batch"]: row for row in json.loads(capsys.readouterr().out)}
    assert by_batch[64]["epochs_to_target"] == 31 and by_batch[512]["epochs_to_target"] == 36  # the medians
    (tmp_path / "empty").mkdir()
    assert main([*args, "--epochs-to-target", str(tmp_path / "empty")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: --epochs-to-target") and "\n" not in error, error
