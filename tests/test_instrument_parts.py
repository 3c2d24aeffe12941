"""The instrument's settings and parts come from whoever runs the job, and it needs no Ray.

- settings: `attach`'s keywords over its `settings=`, else over the run a launcher handed the
  process (`LaunchedRun` in the environment, as `scaling run` hands a user's function its run),
  else the defaults; an unknown or out-of-range setting is refused in one line;
- parts: identity from torch.distributed and torchrun's / Ray Train's variables when nobody
  passes one; a launched run gets no finisher (its launcher writes the summary), a job on its own
  gets the lab's through the installed entry point;
- no module of scaling/instrument/ imports Ray, and a torchrun job (tests/without_ray_job.py) with
  Ray hidden from the import system is measured: both ranks' records, identity and the summary.
  The job runs in its own processes: importing it here would hide Ray from this one.
"""

from __future__ import annotations

import ast
import json
import subprocess

import pytest
import torch

from scaling import instrument
from scaling.instrument.parts import Identity, Parts, identity_from_environment
from scaling.instrument.settings import LaunchedRun
from scaling.results import RunDir
from tests.conftest import BIN, REPO


def _attach(**kwargs):
    model = torch.nn.Linear(4, 2)
    return instrument.attach(model, torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_keywords_override_the_launched_runs_settings_which_override_the_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("SCALING_INSTRUMENT_RUN", raising=False)
    alone = _attach(telemetry_interval_s=0)
    assert alone.settings == instrument.InstrumentSettings(telemetry_interval_s=0) and alone.run_dir is None
    assert alone.finisher is not None  # on its own: the lab's finisher, through the installed entry point
    alone.detach()
    launched = LaunchedRun(
        str(tmp_path / "run"),
        "handed",
        instrument.InstrumentSettings(warmup_steps=2, trace_steps=0, telemetry_interval_s=0),
    )
    with launched.in_environment():
        meter = _attach(calibration_pairs=3)
        assert meter.run_dir == tmp_path / "run" and meter.name == "handed"
        assert meter.settings == instrument.InstrumentSettings(
            warmup_steps=2, trace_steps=0, telemetry_interval_s=0, calibration_pairs=3
        )
        assert meter.finisher is None and meter.finish() is None  # the launcher writes this run's summary
        own = _attach(settings=instrument.InstrumentSettings(telemetry_interval_s=0), run_dir=tmp_path / "own")
        assert own.settings == instrument.InstrumentSettings(telemetry_interval_s=0)  # passed: the launcher's not read
        own.detach()


def test_the_config_tree_holds_the_instruments_settings():
    from scaling.config import ExperimentConfig

    cfg = ExperimentConfig()
    assert isinstance(cfg.instrument, instrument.InstrumentSettings)
    assert cfg.instrument.instrument_only() == instrument.InstrumentSettings()  # the lab's fields dropped


def test_unknown_and_out_of_range_settings_are_refused_in_one_line():
    valid = r"the job's: run_dir, .*; the instrument's settings: warmup_steps, "
    with pytest.raises(TypeError, match=r"attach: unknown keyword\(s\) \['warmup'\]; " + valid):
        _attach(warmup=3)
    with pytest.raises(ValueError, match="instrument setting warmup_steps must be >= 0, got -1"):
        _attach(warmup_steps=-1)


def test_identity_from_torchrun_and_ray_trains_variables(monkeypatch):
    for name in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert identity_from_environment() == Identity(0, 1, 0, 0)  # no process group: one process
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("GROUP_RANK", "2")  # torchrun
    assert identity_from_environment() == Identity(0, 1, 3, 2)
    monkeypatch.setenv("NODE_RANK", "1")  # Ray Train
    assert identity_from_environment().node_rank == 1


def test_parts_passed_are_the_parts_used(tmp_path):
    updates = []

    class Live:
        def __init__(self, name, identity):
            self.name, self.identity = name, identity

        def update(self, rows, epoch_row):
            updates.append((self.name, self.identity, epoch_row["epoch"]))

    given = Identity(rank=0, world_size=1, local_rank=5, node_rank=7)
    # a job on its own with no finisher is told, at attach, that it will get no summary (the lab
    # run from a checkout on PYTHONPATH, not installed, registers none: as on the GPU machine)
    with pytest.warns(UserWarning, match="no finisher, so .* will hold the records but no summary.json"):
        meter = _attach(
            name="given",
            parts=Parts(identity=given, live_metrics=Live),
            telemetry_interval_s=0,
            run_dir=tmp_path / "run",
        )
    for _ in meter.batches([torch.zeros(2, 4)] * 2):
        pass
    meter.end_epoch()
    assert (meter.local_rank, meter.node_rank) == (5, 7) and updates == [("given", given, 1)]
    assert meter.finish() is None  # no finisher passed: no summary
    assert not (tmp_path / "run" / "summary.json").exists()


def test_the_instrument_imports_no_ray():
    found = []
    for path in sorted((REPO / "scaling" / "instrument").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [
                f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names if n == "ray" or n.startswith("ray.")
            ]
    assert found == []


@pytest.mark.slow  # torchrun starts two worker processes
def test_a_torchrun_job_with_ray_hidden_is_measured(tmp_path):
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "tests.without_ray_job", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, view in enumerate(seen):
        assert view["ray_importable"] is False and view["ray_modules"] == []  # hidden, and never imported
        # identity from torch.distributed and torchrun's LOCAL_RANK and GROUP_RANK
        assert (view["rank"], view["world_size"], view["local_rank"], view["node_rank"]) == (rank, 2, rank, 0)
    run = RunDir(tmp_path / "run")
    steps = run.steps()
    train = steps[steps["kind"] == "train"]
    epochs, steps_per_epoch = seen[0]["epochs"], seen[0]["steps_per_epoch"]
    assert sorted(train["rank"].unique()) == [0, 1] and len(train) == 2 * epochs * steps_per_epoch
    assert {"calib_sync", "calib_nosync"} <= set(steps["kind"]) and len(run.epochs()) == epochs
    # the lab's finisher, found through the installed entry point, wrote rank 0's summary
    assert [view["summary_returned"] for view in seen] == [True, False]
    summary = run.summary()
    assert summary["launcher"] == "own" and summary["num_workers"] == 2 and summary["backend"] == "gloo"
    assert summary["status"] == "max_epochs" and summary["step_s"] is not None
