"""Sweeps: every run recorded, a failed run does not stop the sweep, re-running resumes, and
`repeats: auto` adds repeats until the interval is narrow or the cap. `ray job submit` of a
sweep on a real Ray head, its results found afterwards under SCALING_RESULTS_DIR, is
tests/test_own_job.py's sweep (one Ray job for both proofs)."""

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from tests.conftest import REPO


@pytest.fixture
def cli(capsys):
    """`scaling ...` in this process (scaling.cli.main), as the console script runs it, without another
    interpreter's start (its imports: seconds on 2 cores, per call): (returncode, stdout, stderr)."""
    from scaling.cli import main

    def run(*args: str) -> SimpleNamespace:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


# One epoch, one evaluation: 16 steps at 1 worker, 8 per rank at 2 (3 after the warm-up); what the
# sweep tests check is the sweep's bookkeeping, which one epoch per run exercises whole.
TINY = [
    "--set",
    "data.train_samples=1024",
    "--set",
    "data.val_samples=256",
    "--set",
    "train.max_epochs=1",
    "--set",
    "train.eval_every=1",
    "--set",
    "instrument.calibration_pairs=3",
]


def _write_sweep_config(tmp_path):
    config = (REPO / "experiments" / "quickstart.yaml").read_text()
    # one axis whose second value makes that run fail at step 3: the sweep must go on. Two
    # repeats at 1 worker give the four runs (two finished, two failed) that the bookkeeping
    # needs from one process each; sweeps over worker counts: tests/test_own_job.py (1,2) and
    # tests/test_minicluster.py
    config += "sweep:\n  workers: [1]\n  repeats: 2\n  axes:\n    instrument.fail_at_step: [-1, 3]\n"
    path = tmp_path / "sweep.yaml"
    path.write_text(config)
    return path


def test_sweep_records_failures_and_resumes(cli, tmp_path):
    config = _write_sweep_config(tmp_path)
    out = tmp_path / "sweep"
    first = cli("sweep", str(config), "--out", str(out), "--launcher", "local", *TINY)
    assert first.returncode == 1, first.stderr  # some runs failed
    index = pd.read_parquet(out / "runs.parquet")
    assert len(index) == 4
    assert sorted(index["status"]) == ["failed", "failed", "max_epochs", "max_epochs"]
    assert set(index["sweep.instrument.fail_at_step"]) == {-1, 3}
    assert {"run_key", "run_dir", "repeat", "versions.torch", "hardware.cpu_count"} <= set(index.columns)

    kept = index[index["status"] == "max_epochs"]["run_key"].tolist()
    started = {key: json.loads((out / "runs" / key / "summary.json").read_text())["started_at"] for key in kept}
    # simulate a run killed mid-way: its summary never got written
    (out / "runs" / kept[0] / "summary.json").unlink()

    second = cli("sweep", str(config), "--out", str(out), "--launcher", "local", *TINY)
    assert "resuming: 1 of 4 runs already finished, 3 to run" in second.stdout, second.stdout
    index = pd.read_parquet(out / "runs.parquet")
    assert len(index) == 4
    assert json.loads((out / "runs" / kept[1] / "summary.json").read_text())["started_at"] == started[kept[1]]
    assert (out / "runs" / kept[0] / "summary.json").exists()  # redone


def test_sweep_refuses_a_different_sweep_in_the_same_dir(cli, tmp_path):
    config = _write_sweep_config(tmp_path)
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.yaml").write_text("base: {}\nsweep: {workers: [8]}\n")
    result = cli("sweep", str(config), "--out", str(out), "--launcher", "local", *TINY)
    assert result.returncode == 2 and "different sweep" in result.stderr


def test_sweep_bad_workers_list(cli, tmp_path):
    result = cli(
        "sweep", str(REPO / "experiments" / "quickstart.yaml"), "--workers", "1,x", "--out", str(tmp_path / "s")
    )
    assert result.returncode == 2 and "--workers" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_repeats_auto_adds_repeats_until_the_interval_is_narrow_or_the_cap(cli, tmp_path):
    out = tmp_path / "auto"
    quickstart = str(REPO / "experiments" / "quickstart.yaml")
    # a width any two runs meet: the 2 first repeats are enough
    wide = cli(
        "sweep",
        quickstart,
        "--workers",
        "1",
        "--repeats",
        "auto",
        "--interval-width",
        "0.9",
        "--out",
        str(out),
        "--launcher",
        "local",
        *TINY,
    )
    assert wide.returncode == 0 and "w1: 2 repeats, throughput ±" in wide.stdout and "within ±90%" in wide.stdout
    assert len(pd.read_parquet(out / "runs.parquet")) == 2
    # The same sweep again (it resumes: its 2 runs are kept) with a width no CPU timing can reach:
    # repeats are added up to the cap, which the log names. One sweep directory for both keeps
    # this at 3 runs.
    narrow = cli(
        "sweep",
        quickstart,
        "--workers",
        "1",
        "--repeats",
        "auto",
        "--max-repeats",
        "3",
        "--interval-width",
        "0.0001",
        "--out",
        str(out),
        "--launcher",
        "local",
        *TINY,
    )
    assert narrow.returncode == 0, narrow.stderr[-2000:]
    assert "resuming: 2 of 2 runs already finished" in narrow.stdout, narrow.stdout
    index = pd.read_parquet(out / "runs.parquet")
    assert sorted(index["run_key"]) == ["w1-r0", "w1-r1", "w1-r2"]
    assert sorted(index["seed"]) == [0, 1, 2]  # repeat r runs with the base seed + r
    assert "repeats auto: w1: 2 repeats, throughput ±" in narrow.stdout and ": one more" in narrow.stdout
    assert "w1: 3 repeats (the cap)" in narrow.stdout
    bad = cli("sweep", str(REPO / "experiments" / "quickstart.yaml"), "--repeats", "some", "--out", str(tmp_path / "b"))
    assert bad.returncode == 2 and "--repeats expects a whole number or auto" in bad.stderr
