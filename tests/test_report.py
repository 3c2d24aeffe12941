"""`scaling report` on fake sweep directories (tests/fake_sweep.py), its error cases, and the notebooks.

report.md's table cells are checked against hand-computed values (a sweep of literal figures);
a failed run carrying partial figures stays out of every median and mean; the projected
overlay is computed from the run the rule names (the median-step smallest-worker run), by hand.
No Ray, no torch training: the sweep's records are generated and written with pandas/json.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from scaling.errors import UsageError
from scaling.report import write_report
from scaling.results import SweepDir, read_sweeps, resolve_sweep_dir
from scaling.cli import main
from tests.fake_sweep import (
    FAILED,
    FAILED_PARTIAL,
    INCOMPLETE,
    NOT_REACHED,
    REPEATS,
    WORKERS,
    make_fake_sweep,
    make_known_sweep,
)

REPO = Path(__file__).resolve().parent.parent
FIGURES = (
    "speedup",
    "comm_overhead",
    "step_breakdown",
    "accuracy_curves",
    "throughput_vs_tta",
    "tta_spread",
    "roofline",
)
NOTEBOOKS = ("scaling_figures.ipynb", "tta_stability.ipynb")


def _console() -> Console:
    return Console(file=io.StringIO(), width=200, color_system=None)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    return make_fake_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def reported(sweep):
    console, warnings_console = _console(), _console()
    path = write_report(sweep, console, warnings_console=warnings_console)
    return path, console.file.getvalue(), warnings_console.file.getvalue()  # stdout's share, stderr's (the warnings)


def test_report_writes_every_file(sweep, reported):
    path, *_ = reported
    assert path == sweep / "report" / "report.md"
    names = {p.name for p in path.parent.iterdir()}
    assert names == {"report.md"} | {f"{stem}.{ext}" for stem in FIGURES for ext in ("png", "svg")}  # no temp files
    from PIL import Image

    for stem in FIGURES:
        with Image.open(path.parent / f"{stem}.png") as image:
            assert image.format == "PNG" and image.width > 1000
            assert image.info["dpi"] == pytest.approx((200, 200), abs=0.5)
        assert (path.parent / f"{stem}.svg").read_text().lstrip().startswith("<?xml")


def test_report_markdown_embeds_figures_and_tables(reported):
    path, *_ = reported
    text = path.read_text()
    for stem in FIGURES:
        assert f"]({stem}.png)" in text
    assert text.count("\n| workers |") >= 3  # scaling, TTA and communication tables
    assert "| 4 | 2/3 |" in text  # the failed w4 repeat is counted, not used
    assert "Batch-size trade-off" in text  # the global batch grows with the workers


def test_warnings_name_incomplete_and_failed_runs(sweep, reported):
    from scaling.analysis.scaling_tables import left_out_of_figures

    _, printed, warned = reported
    read = SweepDir(sweep)
    warnings = [*read.warnings, *left_out_of_figures(read.runs)]  # the reader's, and the figures' rule
    incomplete = [w for w in warnings if INCOMPLETE in w]
    failed = [w for w in warnings if FAILED in w]
    assert incomplete and "summary.json" in incomplete[0]
    assert failed and "failed" in failed[0] and "worker 3 died" in failed[0]
    assert INCOMPLETE in warned and FAILED in warned and "warning" in warned
    assert "warning" not in printed  # stderr's, so a piped report holds only the report
    assert "w1-r0" not in " ".join(warnings)


def test_read_sweep_tables(sweep):
    read = SweepDir(sweep)
    runs, epochs = read.runs, read.epochs
    assert len(runs) == len(WORKERS) * REPEATS  # the incomplete run is not in the table
    assert {"run_id", "num_workers", "seed", "global_batch", "status"} <= set(epochs.columns)
    assert set(epochs["run_id"]) == set(runs["run_id"])
    assert (epochs.loc[epochs["run_id"] == FAILED, "status"] == "failed").all()
    assert runs.loc[runs["run_key"] == NOT_REACHED, "status"].item() == "max_epochs"
    assert (epochs["global_batch"] == 64 * epochs["num_workers"]).all()


def test_interrupted_sweep_without_index_is_built_from_summaries(tmp_path):
    sweep = make_fake_sweep(tmp_path, with_index=False)
    read = SweepDir(sweep)
    runs, warnings = read.runs, read.warnings
    assert len(runs) == len(WORKERS) * REPEATS
    assert sorted(runs["repeat"].unique()) == list(range(REPEATS))
    assert any("runs.parquet" in w for w in warnings)
    path = write_report(sweep, _console())
    assert (path.parent / "speedup.png").exists()


def test_failed_runs_stay_out_of_the_figures(sweep, reported):
    from scaling.analysis import scaling_tables as st

    read = SweepDir(sweep)
    runs, epochs = read.runs, read.epochs
    by_key = runs.set_index("run_key")
    # The failed w4 run carries partial figures far from the others' (fake_sweep.FAILED_PARTIAL):
    # a TTA of 3 s, 25 s epochs, 330 samples/s, 95% communication, 0.5 s steps.
    assert by_key.loc[FAILED, "status"] == "failed" and by_key.loc[FAILED, "tta_s"] == FAILED_PARTIAL["tta_s"]
    table = st.per_worker_count(runs).set_index("num_workers")
    assert table.loc[4, "n_failed"] == 1 and table.loc[4, "n_ok"] == 2 and table.loc[4, "n_reached"] == 1
    reached, not_reached = by_key.loc["w4-r0"], by_key.loc[NOT_REACHED]
    assert reached["status"] == "reached_target" and not_reached["status"] == "max_epochs"
    # Medians over the two finished w4 runs: the median of two values is their mean. Counted, the
    # failed run's far-off value would make the median the nearer of the two instead.
    for column in ("time_per_epoch_s", "throughput_samples_per_s", "comm_overhead_pct", "exposed_comm_pct"):
        a, b = reached[column], not_reached[column]
        assert a != b, column  # else the mean of the two could not tell them apart
        assert table.loc[4, column] == pytest.approx((a + b) / 2), column
    # TTA over the one run that reached the target (the failed run's 3 s would halve the mean)
    assert table.loc[4, "tta_mean_s"] == pytest.approx(reached["tta_s"])
    assert table.loc[4, "epochs_to_target"] == reached["epochs_to_target"] == 8
    # step phases: means over the two finished runs (the failed run's 0.5 s step would triple them)
    for column in ("step_s", "forward_s", "exposed_comm_s"):
        assert table.loc[4, column] == pytest.approx((reached[column] + not_reached[column]) / 2), column
    # the same numbers in report.md: time per epoch of w4 is the mean of the two
    rows = _table_rows(reported[0].read_text(), "Scaling: time per epoch")[1:]
    w4 = next(r for r in rows if r.split("|")[1].strip() == "4")
    assert w4.split("|")[3].strip() == f"{(reached['time_per_epoch_s'] + not_reached['time_per_epoch_s']) / 2:.2f}"
    # the spread of TTAs and the accuracy curves leave it out too
    assert FAILED not in set(st.tta_spread(runs)["run_key"])
    curves = st.accuracy_curves(epochs).set_index(["num_workers", "epoch"])
    assert curves.loc[(4, 1), "n_runs"] == 2 and curves.loc[(4, 2), "n_runs"] == 2  # the failed run ran 2 epochs


@pytest.mark.parametrize("case", ["missing", "file", "empty", "not_a_sweep", "run_dir", "nothing_finished"])
def test_errors_are_one_line(tmp_path, case):
    target = tmp_path / "target"
    if case == "file":
        target.write_text("x")
    elif case == "empty":
        target.mkdir()
    elif case == "not_a_sweep":
        (target / "runs" / "a").mkdir(parents=True)
        (target / "notes.txt").write_text("x")
    elif case == "run_dir":
        target.mkdir()
        (target / "summary.json").write_text(json.dumps({"status": "max_epochs"}))
    elif case == "nothing_finished":
        (target / "runs" / "w1-r0").mkdir(parents=True)
        (target / "sweep.yaml").write_text("sweep: {}\n")
    with pytest.raises(UsageError) as info:
        write_report(target, _console())
    message = str(info.value)
    assert "\n" not in message and str(target) in message
    expected = {
        "missing": "not found",
        "file": "not a directory",
        "empty": "empty",
        "not_a_sweep": "not a sweep",
        "run_dir": "run directory",
        "nothing_finished": "finished",
    }[case]
    assert expected in message
    assert not (target / "report").exists() if target.is_dir() else True


def test_empty_index_of_a_fresh_sweep_is_an_error(tmp_path):
    (tmp_path / "runs" / "w1-r0").mkdir(parents=True)
    pd.DataFrame().to_parquet(tmp_path / "runs.parquet")
    with pytest.raises(UsageError, match="finished"):
        SweepDir(tmp_path).read()


def test_cli_report(sweep, tmp_path, capsys):
    from scaling.cli import main

    copy = tmp_path / "qs"
    shutil.copytree(sweep, copy, ignore=shutil.ignore_patterns("report"))
    assert main(["report", str(copy)]) == 0
    assert (copy / "report" / "report.md").exists()
    printed = capsys.readouterr()
    assert "warning:" in printed.err and "warning:" not in printed.out  # a piped report holds only the report
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


def test_resolve_sweep_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "qs").mkdir(parents=True)
    assert resolve_sweep_dir("results/qs") == tmp_path / "results" / "qs"
    monkeypatch.chdir(tmp_path / "results")  # a notebook's folder: found through $SCALING_RESULTS_DIR
    monkeypatch.setenv("SCALING_RESULTS_DIR", str(tmp_path))
    assert resolve_sweep_dir("results/qs") == tmp_path / "results" / "qs"
    assert resolve_sweep_dir("/abs/path") == Path("/abs/path")
    assert resolve_sweep_dir("no/such") == Path("no/such")


# ---------------------------------------------------------------------------- notebooks


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_thin_and_without_outputs(name):
    import nbformat

    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code[0].source == 'SWEEP_DIR = "results/qs"'
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    assert not any("def " in cell.source or "class " in cell.source for cell in code)  # logic lives in scaling/


@pytest.mark.slow  # a Jupyter kernel is a process of its own
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_against_a_sweep(sweep, name):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    first = next(cell for cell in nb.cells if cell.cell_type == "code")
    first.source = f"SWEEP_DIR = {str(sweep)!r}"
    # as Jupyter runs it: from the notebook's folder
    NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}
    ).execute()
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(images) >= 2
    printed = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    assert FAILED in printed and INCOMPLETE in printed


def _rewrite_summary(sweep, key, **changes):
    path = sweep / "runs" / key / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(changes)
    path.write_text(json.dumps(summary))


def test_unreadable_schema_versions_and_corrupt_parquet_are_named_and_skipped(tmp_path):
    sweep = make_fake_sweep(tmp_path, with_index=False)  # the run table comes from the summaries
    _rewrite_summary(sweep, "w2-r0", schema_version=99)  # a future lab's run
    (sweep / "runs" / "w2-r1" / "epochs.parquet").write_bytes(b"PAR1 this is not parquet")
    read = SweepDir(sweep)
    runs, warnings = read.runs, read.warnings
    assert "w2-r0" not in set(runs["run_key"]) and "w2-r1" not in set(runs["run_key"])
    assert any("w2-r0 (schema_version 99)" in w for w in warnings)
    assert any("w2-r1" in w and "unreadable epochs.parquet" in w for w in warnings)
    assert set(runs["schema_version"]) == {1}  # version 1 runs (the fake sweep's) are still read
    assert (write_report(sweep, _console()).parent / "speedup.png").exists()  # the rest is reported


def test_corrupt_index_falls_back_to_summaries(tmp_path):
    sweep = make_fake_sweep(tmp_path)
    (sweep / "runs.parquet").write_bytes(b"garbage")
    read = SweepDir(sweep)
    runs, warnings = read.runs, read.warnings
    assert len(runs) == len(WORKERS) * REPEATS and any("runs.parquet is unreadable" in w for w in warnings)


def test_only_unreadable_versions_is_one_line(tmp_path, capsys):
    sweep = make_fake_sweep(tmp_path, with_index=False)
    for run_dir in (sweep / "runs").iterdir():
        if (run_dir / "summary.json").exists():
            _rewrite_summary(sweep, run_dir.name, schema_version=0)
    assert main(["report", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "schema version" in err


def test_results_files_carry_the_schema_version(tmp_path):
    import pyarrow.parquet as pq

    from scaling.results import PARQUET_VERSION_KEY, SCHEMA_VERSION, write_parquet_atomic

    write_parquet_atomic(tmp_path / "x.parquet", pd.DataFrame({"a": [1]}))
    assert pq.read_schema(tmp_path / "x.parquet").metadata[PARQUET_VERSION_KEY] == str(SCHEMA_VERSION).encode()


# ---------------------------------------------------------------------------- several sweeps, one report


def _table_rows(report_md: str, title: str) -> list[str]:
    section = report_md.split(f"### {title}", 1)[1].split("###", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]


def test_two_sweeps_of_different_backends_make_one_report(tmp_path):
    ddp = make_fake_sweep(tmp_path, name="ddp")
    hvd = make_fake_sweep(tmp_path, name="hvd", backend="horovod")
    console = _console()
    path = write_report([ddp, hvd], console, out=tmp_path / "both")
    assert path == tmp_path / "both" / "report.md"
    both = read_sweeps([ddp, hvd])
    runs, epochs = both.runs, both.epochs
    assert set(runs["run_key"]) >= {"ddp/w1-r0", "hvd/w1-r0"} and set(runs["sweep"]) == {"ddp", "hvd"}
    assert set(epochs["run_key"]) >= {"ddp/w1-r0", "hvd/w4-r0"}
    text = path.read_text()
    assert f"`{ddp}`, `{hvd}`" in text
    assert "backend gloo / horovod" in text or "backend horovod / gloo" in text
    rows = _table_rows(text, "Scaling: time per epoch")
    header = rows[0]
    assert "backend" in header and "| sweep |" not in header  # backend already tells the sweeps apart
    assert len(rows) - 1 == 2 * len(WORKERS)
    backends = [row.split("|")[2].strip() for row in rows[1:]]
    assert sorted(set(backends)) == ["gloo", "horovod"]
    # each backend's speedup is over its own 1-worker runs
    assert sum(row.split("|")[5].strip() == "1.00×" for row in rows[1:]) == 2
    assert {p.name for p in path.parent.iterdir()} >= {"speedup.png", "comm_overhead.svg"}
    assert not (ddp / "report").exists() and not (hvd / "report").exists()


def test_two_sweeps_of_the_same_setup_are_told_apart_by_sweep(tmp_path):
    from scaling.analysis.scaling_tables import group_keys

    first, second = make_fake_sweep(tmp_path, name="monday"), make_fake_sweep(tmp_path, name="tuesday")
    runs = read_sweeps([first, second]).runs
    assert group_keys(runs) == ("num_workers", "sweep")
    path = write_report([first, second], _console(), out=tmp_path / "both", figures=False)  # the tables'
    assert "| sweep |" in _table_rows(path.read_text(), "Scaling: time per epoch")[0]


def test_several_sweeps_need_out_and_distinct_dirs(tmp_path, capsys):
    from scaling.cli import main

    ddp = make_fake_sweep(tmp_path, name="ddp")
    hvd = make_fake_sweep(tmp_path, name="hvd", backend="horovod")
    assert main(["report", str(ddp), str(hvd)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["report", str(ddp), str(ddp), "--out", str(tmp_path / "x")]) == 2
    assert "twice" in capsys.readouterr().err
    assert main(["report", str(ddp), str(hvd), "--out", str(tmp_path / "both"), "--no-figures"]) == 0
    assert (tmp_path / "both" / "report.md").exists() and not list((tmp_path / "both").glob("*.png"))
    assert "Not drawn (`--no-figures`)." in (tmp_path / "both" / "report.md").read_text()


# ---------------------------------------------------------------------------- report.md cells by hand

# Four runs with round figures (steps in seconds, as summary.json holds them).
KNOWN_RUNS = [
    dict(
        num_workers=1,
        repeat=0,
        time_per_epoch_s=12.0,
        throughput_samples_per_s=100.0,
        tta_s=60.0,
        tta_wall_s=63.0,
        epochs_to_target=5,
        comm_overhead_pct=0.0,
        exposed_comm_pct=0.0,
        step_s=0.120,
        data_s=0.010,
        forward_s=0.040,
        backward_s=0.060,
        optimizer_s=0.010,
        exposed_comm_s=0.0,
    ),
    dict(
        num_workers=1,
        repeat=1,
        time_per_epoch_s=10.0,
        throughput_samples_per_s=120.0,
        tta_s=40.0,
        tta_wall_s=43.0,
        epochs_to_target=4,
        comm_overhead_pct=0.0,
        exposed_comm_pct=0.0,
        step_s=0.100,
        data_s=0.010,
        forward_s=0.030,
        backward_s=0.050,
        optimizer_s=0.010,
        exposed_comm_s=0.0,
    ),
    dict(
        num_workers=2,
        repeat=0,
        time_per_epoch_s=6.0,
        throughput_samples_per_s=190.0,
        tta_s=36.0,
        tta_wall_s=40.0,
        epochs_to_target=6,
        comm_overhead_pct=10.0,
        exposed_comm_pct=8.0,
        step_s=0.130,
        data_s=0.010,
        forward_s=0.040,
        backward_s=0.070,
        optimizer_s=0.010,
        exposed_comm_s=0.010,
        allreduce_pct=20.0,
    ),
    dict(
        num_workers=2,
        repeat=1,
        time_per_epoch_s=7.0,
        throughput_samples_per_s=170.0,
        tta_s=42.0,
        tta_wall_s=46.0,
        epochs_to_target=6,
        comm_overhead_pct=14.0,
        exposed_comm_pct=12.0,
        step_s=0.140,
        data_s=0.010,
        forward_s=0.040,
        backward_s=0.080,
        optimizer_s=0.010,
        exposed_comm_s=0.020,
        allreduce_s=0.042,
    ),  # a summary from before allreduce_pct: 42 of 140 ms, 30%
]


def _parsed_table(report_md: str, title: str) -> tuple[list[str], dict[str, list[str]]]:
    """(headers, {first cell: cells}) of one markdown table of report.md."""
    header, *rows = _table_rows(report_md, title)
    split = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    return split(header), {split(r)[0]: split(r) for r in rows}


def test_report_md_cells_by_hand(tmp_path):
    path = write_report(make_known_sweep(tmp_path, KNOWN_RUNS), _console(), figures=False)  # cells only
    text = path.read_text()

    headers, rows = _parsed_table(text, "Scaling: time per epoch")
    # the header pins each column's place: a swapped column fails here or in the cells below
    assert headers == [
        "workers",
        "runs ok",
        "time/epoch (s)",
        "speedup",
        "eff.",
        "throughput (samples/s)",
        "speedup",
        "eff.",
        "TTA mean (s)",
        "speedup",
        "eff.",
    ]
    # 1 worker: median(12, 10) = 11 s; median(100, 120) = 110/s; mean TTA (60 + 40) / 2 = 50 s
    assert rows["1"] == ["1", "2/2", "11.00", "1.00×", "100%", "110", "1.00×", "100%", "50.0", "1.00×", "100%"]
    # 2 workers: median(6, 7) = 6.5 s: speedup 11 / 6.5 = 1.692, eff. 1.692 / 2 = 84.6%;
    # median(190, 170) = 180/s: 180 / 110 = 1.636, 81.8%; TTA (36 + 42) / 2 = 39 s: 50 / 39 = 1.282, 64.1%
    assert rows["2"] == ["2", "2/2", "6.50", "1.69×", "85%", "180", "1.64×", "82%", "39.0", "1.28×", "64%"]

    headers, rows = _parsed_table(text, "Time to accuracy over repeats")
    assert headers[:6] == [
        "workers",
        "reached target",
        "TTA mean (s)",
        "TTA std (s)",
        "TTA CV",
        "epochs to target (median)",
    ]
    # std (ddof=1): sqrt((10² + 10²) / 1) = 14.14 s, CV 14.14 / 50 = 0.283; epochs median(5, 4) = 4.5
    assert rows["1"][:6] == ["1", "2/2", "50.0", "14.1", "0.283", "4.5"]
    # sqrt((3² + 3²) / 1) = 4.24 s, CV 4.24 / 39 = 0.109; epochs median(6, 6) = 6
    assert rows["2"][:6] == ["2", "2/2", "39.0", "4.2", "0.109", "6.0"]
    # wall-clock TTA: (63 + 43) / 2 = 53 s, (40 + 46) / 2 = 43 s
    assert headers[-2] == "TTA wall mean (s)" and rows["1"][-2] == "53.0" and rows["2"][-2] == "43.0"

    headers, rows = _parsed_table(text, "Communication and step time")
    assert headers == [
        "workers",
        "communicating: all-reduce in flight (% of step)",
        "exposed comm (% of step)",
        "comm overhead A/B (% of step)",
        "step (ms)",
        "data (ms)",
        "forward (ms)",
        "backward compute (ms)",
        "exposed comm (ms)",
        "optimizer (ms)",
    ]
    # 1 worker: steps (120 + 100) / 2 = 110 ms; forward (40 + 30) / 2 = 35; backward (60 + 50) / 2 = 55, none exposed
    assert rows["1"] == ["1", "0.0", "0.0", "0.0", "110.00", "10.00", "35.00", "55.00", "0.00", "10.00"]
    # 2 workers: overhead median(10, 14) = 12%, exposed median(8, 12) = 10%; step (130 + 140) / 2 = 135 ms;
    # backward compute mean(70 - 10, 80 - 20) = 60 ms, exposed (10 + 20) / 2 = 15 ms: 10 + 40 + 60 + 15 + 10 = 135
    # time communicating: median(20, 42 / 140 = 30) = 25%
    assert rows["2"] == ["2", "25.0", "10.0", "12.0", "135.00", "10.00", "40.00", "60.00", "15.00", "10.00"]

    headers, rows = _parsed_table(text, "Runs")
    assert headers[:3] == ["run", "workers", "seed"] and headers[-5:] == [
        "best acc.",
        "TTA (s)",
        "time/epoch (s)",
        "throughput (samples/s)",
        "comm overhead (%)",
    ]
    assert rows["w2-r1"][-5:] == ["95.00%", "42.0", "7.00", "170", "14.0"]


# ---------------------------------------------------------------------------- projected curves over measured points

CLUSTER_YAML = """
name: two-hosts-100mbit
description: one CPU worker per host, 100 Mbit/s between hosts (a test cluster)
gpus_per_node: 1
inter_node: {name: 100 Mbit/s, bandwidth_Gbps: 0.1, efficiency: 1.0, latency_us: 100}
"""


def test_report_overlays_the_projection_when_runs_name_a_cluster(tmp_path):
    from scaling.analysis.scaling_tables import prepare_runs
    from scaling.projection.overlay import project_sweep

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER_YAML)
    sweep = make_fake_sweep(tmp_path, cluster=str(cluster))
    console = _console()
    path = write_report(sweep, console)
    text = path.read_text()
    rows = _table_rows(text, "Measured against projected")
    assert rows[0] == (
        "| workers | step measured (ms) | step projected (ms) | communicating measured (%) "
        "| communicating projected (%) | exposed measured (%) | exposed projected (%) "
        "| comm overhead A/B measured (%) | comm overhead A/B projected (%) "
        "| speedup measured | speedup projected |"
    )
    assert len(rows) - 1 == len(WORKERS)
    assert "Dotted lines with crosses are projections" in text and "two-hosts-100mbit" in text

    # The rule (overlay.py): compute from the smallest-worker run with the median step time.
    # The 1-worker runs step 65 (r0), 59 (r1) and 61 ms (r2) (fake_sweep.FORWARD_EXTRA_S): w1-r2.
    runs = SweepDir(sweep).runs
    steps = runs[runs["num_workers"] == 1].set_index("run_key")["step_s"].to_dict()
    assert steps == pytest.approx({"w1-r0": 0.065, "w1-r1": 0.059, "w1-r2": 0.061})
    assert "from run w1-r2 (1 worker)" in text

    # By hand, from w1-r2: data 1 + forward 27 + backward 30 + optimizer 3 = 61 ms of compute.
    # small_cnn with DDP's defaults (the runs' config names no bucket cap): buckets of 1,059,880 and
    # 94,784 bytes; the first is ready after head.3 + head.1's backward FLOPs, 1,058,816 of
    # 11,380,736 = 0.0930358 of backward (2.7911 ms), the second at the end of backward (30 ms).
    # Link: 0.1 Gbit/s = 12.5e6 B/s, 100 us; one worker per host, so a ring over n hosts:
    #   T(S) = 2(n-1) x 100 us + 2(n-1)/n x S / 12.5e6
    # n = 2: T0 = 0.2 + 84.7904 = 84.9904 ms, T1 = 0.2 + 7.58272 = 7.78272 ms. Bucket 0 ends at
    #   2.7911 + 84.9904 = 87.7815 ms, bucket 1 starts then, ends at 95.5642 ms:
    #   exposed = 95.5642 - 30 = 65.5642 ms; step = 61 + 65.5642 = 126.5642 ms;
    #   overhead = 65.5642 / 126.5642 = 51.80%; speedup = 2 x 61 / 126.5642 = 0.9639.
    # n = 4: T0 = 0.6 + 1.5 x 84.7904 = 127.7856 ms, T1 = 0.6 + 1.5 x 7.58272 = 11.97408 ms:
    #   exposed = 2.7911 + 127.7856 + 11.97408 - 30 = 112.5508 ms; step = 173.5508 ms;
    #   overhead = 64.85%; speedup = 4 x 61 / 173.5508 = 1.4059.
    # (From the fastest run the 1-worker step would read 59.0, from the slowest 65.0; the
    # measured column is the mean over the three runs, 61.7.)
    # Time communicating (union of hand-over to finish): n = 2, 2.7911 .. 95.5642 ms = 92.7731 ms,
    #   73.30% of the step; n = 4, 2.7911 .. 142.5508 ms = 139.7597 ms, 80.53%. No interference
    #   in this cluster, so the A/B overhead is the exposed share.
    cells = {int(r.split("|")[1]): [c.strip() for c in r.split("|")[2:-1]] for r in rows[1:]}
    assert cells[1][:2] + cells[1][3:4] + cells[1][5:6] + cells[1][7:] == [
        "61.7",
        "61.0",
        "0.0",
        "0.0",
        "0.0",
        "1.00×",
        "1.00×",
    ]
    assert [cells[2][i] for i in (1, 3, 5, 7, 9)] == ["126.6", "73.3", "51.8", "51.8", "0.96×"]
    assert [cells[4][i] for i in (1, 3, 5, 7, 9)] == ["173.6", "80.5", "64.9", "64.9", "1.41×"]
    projected, notes, _ = project_sweep(
        prepare_runs(runs), ("num_workers",), lambda run: SweepDir(sweep).run(run["run_key"])
    )
    projected = projected.set_index("num_workers")
    assert projected["projected_step_s"].tolist() == pytest.approx([0.061, 0.1265642, 0.1735508], rel=1e-6)
    assert projected["projected_comm_overhead_pct"].tolist() == pytest.approx([0.0, 51.8031, 64.8518], rel=1e-5)
    assert projected["projected_allreduce_pct"].tolist() == pytest.approx([0.0, 73.3009, 80.5298], rel=1e-4)
    assert projected["projected_speedup_throughput"].tolist() == pytest.approx([1.0, 0.963938, 1.405929], rel=1e-5)
    assert projected["projected_efficiency_throughput"].tolist() == pytest.approx([1.0, 0.481969, 0.351482], rel=1e-5)
    assert "from run w1-r2" in notes[0]


def test_the_overlay_projects_horovod_runs_with_their_settings(tmp_path):
    """A Horovod sweep is projected with Horovod's cycles and fusion, at the runs' settings, as
    `scaling project --backend horovod` would: the same model in both places."""
    from scaling.analysis.scaling_tables import prepare_runs
    from scaling.projection.overlay import project_sweep
    from scaling.projection.project import run_projection

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER_YAML)
    sweep = make_fake_sweep(tmp_path, backend="horovod", cluster=str(cluster))
    runs = SweepDir(sweep).runs
    runs = runs.assign(horovod_cycle_time_ms=3.0, horovod_fusion_threshold_mb=8.0)
    projected, notes, warnings = project_sweep(
        prepare_runs(runs), ("num_workers",), lambda run: SweepDir(sweep).run(run["run_key"])
    )
    assert not warnings and "backend horovod" in notes[0] and "cycle 3 ms, fusion buffer 8 MiB" in notes[0]
    direct = run_projection(
        "small_cnn",
        str(cluster),
        workers=[1, 2, 4],
        from_run=SweepDir(sweep).run("w1-r2"),
        backend="horovod",
        horovod_cycle_time_ms=3.0,
        horovod_fusion_threshold_mb=8.0,
    )
    assert projected.set_index("num_workers")["projected_step_s"].tolist() == pytest.approx(direct["step_s"].tolist())


def test_a_sweep_without_a_cluster_has_no_projection(sweep, reported):
    path, *_ = reported
    assert "Measured against projected" not in path.read_text()


@pytest.mark.parametrize("width", [80, 100, 120])
def test_terminal_tables_fit_the_width_and_never_split_a_word(width):
    from scaling.report import _rich_tables

    headers = [
        "workers",
        "repeats",
        "speedup time/epoch",
        "speedup throughput",
        "speedup TTA",
        "TTA / throughput speedup",
        "comm overhead A/B",
        "exposed comm",
        "repeats for ±5%",
    ]
    rows = [
        ["1", "3", "base", "base", "base", "base", "0 (1 worker)", "0 (1 worker)", "-"],
        [
            "2",
            "3",
            "1.85× [1.83, 1.93]",
            "1.85× [1.83, 1.93]",
            "1.65× [1.54, 1.82]",
            "0.89× [0.82, 0.99]",
            "17.4 % [16.4, 17.9]",
            "11.6 % [11.0, 11.9]",
            "9",
        ],
    ]
    console = Console(file=io.StringIO(), width=width, color_system=None)
    parts = _rich_tables("Uncertainty", headers, rows, width)
    for part in parts:
        console.print(part)
    lines = console.file.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width
    for cell in rows[1]:
        assert any(cell in line for line in lines), cell  # a cell on one line
    for word in {word for header in headers for word in header.split()}:
        assert any(word in line for line in lines), word  # a header wraps at its spaces only
    assert len(parts) > 1 and sum("workers" in line for line in lines) == len(parts)  # each part keeps the keys


def test_coinciding_communication_figures_stay_visible():
    # At 2 workers of the demo, time communicating and exposed communication can be equal: the later
    # series would hide the earlier one. Its marker moves aside and the plot says which figures coincide.
    from scaling.plots.figures import comm_overhead_figure

    table = pd.DataFrame(
        {
            "num_workers": [1, 2],
            "allreduce_pct": [0.0, 10.7],
            "exposed_comm_pct": [0.0, 10.7],
            "comm_overhead_pct": [0.0, 14.4],
        }
    )
    fig = comm_overhead_figure(table)
    ax = fig.axes[0]
    at_two = {line.get_label(): line.get_xdata()[-1] for line in ax.get_lines() if len(line.get_xdata()) == 2}
    communicating = next(x for label, x in at_two.items() if label.startswith("communicating"))
    exposed = next(x for label, x in at_two.items() if label.startswith("exposed"))
    assert communicating == 2 and exposed > communicating
    assert any(text.get_text() == "exposed = all-reduce in flight: 10.7 %" for text in ax.texts)
