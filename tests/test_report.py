"""`scaling report` on a fake sweep directory (tests/fake_sweep.py), its error cases, and the notebooks.

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
from scaling.report import load_sweep, resolve_sweep_dir, write_report
from tests.conftest import run_cli
from tests.fake_sweep import FAILED, INCOMPLETE, NOT_REACHED, REPEATS, WORKERS, make_fake_sweep

REPO = Path(__file__).resolve().parent.parent
FIGURES = ("speedup", "comm_overhead", "step_breakdown", "accuracy_curves", "throughput_vs_tta", "tta_spread", "roofline")
NOTEBOOKS = ("scaling_figures.ipynb", "tta_stability.ipynb")


def _console() -> Console:
    return Console(file=io.StringIO(), width=200, color_system=None)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    return make_fake_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def reported(sweep):
    console = _console()
    path = write_report(sweep, console)
    return path, console.file.getvalue()


def test_report_writes_every_file(sweep, reported):
    path, _ = reported
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
    path, _ = reported
    text = path.read_text()
    for stem in FIGURES:
        assert f"]({stem}.png)" in text
    assert text.count("\n| workers |") >= 3  # scaling, TTA and communication tables
    assert "| 4 | 2/3 |" in text  # the failed w4 repeat is counted, not used
    assert "Batch-size trade-off" in text  # the global batch grows with the workers


def test_warnings_name_incomplete_and_failed_runs(sweep, reported):
    _, printed = reported
    _, _, warnings = load_sweep(sweep)
    incomplete = [w for w in warnings if INCOMPLETE in w]
    failed = [w for w in warnings if FAILED in w]
    assert incomplete and "summary.json" in incomplete[0]
    assert failed and "failed" in failed[0] and "worker 3 died" in failed[0]
    assert INCOMPLETE in printed and FAILED in printed and "warning" in printed
    assert "w1-r0" not in " ".join(warnings)


def test_load_sweep_tables(sweep):
    runs, epochs, _ = load_sweep(sweep)
    assert len(runs) == len(WORKERS) * REPEATS  # the incomplete run is not in the table
    assert {"run_id", "num_workers", "seed", "global_batch", "status"} <= set(epochs.columns)
    assert set(epochs["run_id"]) == set(runs["run_id"])
    assert (epochs.loc[epochs["run_id"] == FAILED, "status"] == "failed").all()
    assert runs.loc[runs["run_key"] == NOT_REACHED, "status"].item() == "max_epochs"
    assert (epochs["global_batch"] == 64 * epochs["num_workers"]).all()


def test_interrupted_sweep_without_index_is_built_from_summaries(tmp_path):
    sweep = make_fake_sweep(tmp_path, with_index=False)
    runs, epochs, warnings = load_sweep(sweep)
    assert len(runs) == len(WORKERS) * REPEATS
    assert sorted(runs["repeat"].unique()) == list(range(REPEATS))
    assert any("runs.parquet" in w for w in warnings)
    path = write_report(sweep, _console())
    assert (path.parent / "speedup.png").exists()


def test_failed_runs_stay_out_of_the_figures(sweep):
    from scaling.analysis.scaling_tables import per_worker_count

    runs, _, _ = load_sweep(sweep)
    table = per_worker_count(runs).set_index("num_workers")
    assert table.loc[4, "n_failed"] == 1 and table.loc[4, "n_ok"] == 2 and table.loc[4, "n_reached"] == 1
    failed_tta = runs.loc[runs["run_key"] == FAILED, "tta_s"].item()
    reached_tta = runs.loc[(runs["num_workers"] == 4) & (runs["status"] == "reached_target"), "tta_s"]
    assert table.loc[4, "tta_mean_s"] == pytest.approx(reached_tta.mean()) != failed_tta


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
    expected = {"missing": "not found", "file": "not a directory", "empty": "empty", "not_a_sweep": "not a sweep",
                "run_dir": "run directory", "nothing_finished": "finished"}[case]
    assert expected in message
    assert not (target / "report").exists() if target.is_dir() else True


def test_empty_index_of_a_fresh_sweep_is_an_error(tmp_path):
    (tmp_path / "runs" / "w1-r0").mkdir(parents=True)
    pd.DataFrame().to_parquet(tmp_path / "runs.parquet")
    with pytest.raises(UsageError, match="finished"):
        load_sweep(tmp_path)


def test_cli_report(sweep, tmp_path, capsys):
    from scaling.cli import main

    copy = tmp_path / "qs"
    shutil.copytree(sweep, copy, ignore=shutil.ignore_patterns("report"))
    assert main(["report", str(copy)]) == 0
    assert (copy / "report" / "report.md").exists()
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


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_against_a_sweep(sweep, name):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    first = next(cell for cell in nb.cells if cell.cell_type == "code")
    first.source = f"SWEEP_DIR = {str(sweep)!r}"
    # as Jupyter runs it: from the notebook's folder
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
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
    runs, _, warnings = load_sweep(sweep)
    assert "w2-r0" not in set(runs["run_key"]) and "w2-r1" not in set(runs["run_key"])
    assert any("w2-r0 (schema_version 99)" in w for w in warnings)
    assert any("w2-r1" in w and "unreadable epochs.parquet" in w for w in warnings)
    assert set(runs["schema_version"]) == {1}  # version 1 runs (the fake sweep's) are still read
    assert (write_report(sweep, _console()).parent / "speedup.png").exists()  # the rest is reported


def test_corrupt_index_falls_back_to_summaries(tmp_path):
    sweep = make_fake_sweep(tmp_path)
    (sweep / "runs.parquet").write_bytes(b"garbage")
    runs, _, warnings = load_sweep(sweep)
    assert len(runs) == len(WORKERS) * REPEATS and any("runs.parquet is unreadable" in w for w in warnings)


def test_only_unreadable_versions_is_one_line(tmp_path):
    sweep = make_fake_sweep(tmp_path, with_index=False)
    for run_dir in (sweep / "runs").iterdir():
        if (run_dir / "summary.json").exists():
            _rewrite_summary(sweep, run_dir.name, schema_version=0)
    result = run_cli("report", str(sweep))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "schema version" in result.stderr


def test_results_files_carry_the_schema_version(tmp_path):
    from scaling.results import SCHEMA_VERSION, parquet_schema_version, write_parquet_atomic

    write_parquet_atomic(tmp_path / "x.parquet", pd.DataFrame({"a": [1]}))
    assert parquet_schema_version(tmp_path / "x.parquet") == SCHEMA_VERSION


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
    runs, epochs, _ = load_sweep([ddp, hvd])
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
    from scaling.report import group_keys

    first, second = make_fake_sweep(tmp_path, name="monday"), make_fake_sweep(tmp_path, name="tuesday")
    runs, _, _ = load_sweep([first, second])
    assert group_keys(runs) == ("num_workers", "sweep")
    path = write_report([first, second], _console(), out=tmp_path / "both")
    assert "| sweep |" in _table_rows(path.read_text(), "Scaling: time per epoch")[0]


def test_several_sweeps_need_out_and_distinct_dirs(tmp_path, capsys):
    from scaling.cli import main

    ddp = make_fake_sweep(tmp_path, name="ddp")
    hvd = make_fake_sweep(tmp_path, name="hvd", backend="horovod")
    assert main(["report", str(ddp), str(hvd)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["report", str(ddp), str(ddp), "--out", str(tmp_path / "x")]) == 2
    assert "twice" in capsys.readouterr().err
    assert main(["report", str(ddp), str(hvd), "--out", str(tmp_path / "both")]) == 0
    assert (tmp_path / "both" / "report.md").exists()


# ---------------------------------------------------------------------------- projected curves over measured points

CLUSTER_YAML = """
name: two-hosts-100mbit
description: one CPU worker per host, 100 Mbit/s between hosts (a test cluster)
gpus_per_node: 1
inter_node: {name: 100 Mbit/s, bandwidth_Gbps: 0.1, efficiency: 1.0, latency_us: 100}
"""


def test_report_overlays_the_projection_when_runs_name_a_cluster(tmp_path):
    from scaling.projection.project import run_projection

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER_YAML)
    sweep = make_fake_sweep(tmp_path, cluster=str(cluster))
    console = _console()
    path = write_report(sweep, console)
    text = path.read_text()
    rows = _table_rows(text, "Measured against projected")
    assert "step projected (ms)" in rows[0] and len(rows) - 1 == len(WORKERS)
    assert "Dotted lines with crosses are projections" in text and "two-hosts-100mbit" in text
    # the overlay is the projection from the 1-worker run with the median step, rebased to 1 worker
    runs, _, _ = load_sweep(sweep)
    base = runs[(runs["num_workers"] == 1)].sort_values("step_s").iloc[1]
    direct = run_projection("small_cnn", str(cluster), workers=list(WORKERS), from_run=sweep / base["run_dir"])
    direct = direct.set_index("num_workers")
    cells = {int(r.split("|")[1]): [c.strip() for c in r.split("|")[2:-1]] for r in rows[1:]}
    for n in WORKERS:
        assert cells[n][1] == f"{direct.loc[n, 'step_s'] * 1e3:.1f}"
        assert cells[n][3] == f"{direct.loc[n, 'comm_overhead_pct']:.1f}"
    assert cells[1][5] == "1.00×" and float(cells[4][5].rstrip("×")) < 4
    assert float(cells[4][3]) > 0  # 100 Mbit/s cannot hide small_cnn's gradients


def test_a_sweep_without_a_cluster_has_no_projection(sweep, reported):
    path, _ = reported
    assert "Measured against projected" not in path.read_text()
