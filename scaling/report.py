"""A sweep's report: read the sweep directory, print its tables, write report.md and the figures.

    scaling report results/qs        # -> results/qs/report/report.md, *.png, *.svg
    scaling report results/ddp results/hvd --out results/ddp-vs-hvd   # several sweeps, one report

The I/O side of the analysis: `load_sweep` reads `runs.parquet` (or, for an interrupted
sweep without it, every `runs/*/summary.json`) and each run's `epochs.parquet`;
`scaling.analysis.scaling_tables` computes, `scaling.plots.figures` draws, and
`write_report` prints the tables with rich and writes, atomically, into SWEEP/report/:

    report.md                 tables (markdown) and the figures, one line defining each
    speedup.{png,svg}         comm_overhead.{png,svg}    step_breakdown.{png,svg}
    accuracy_curves.{png,svg} throughput_vs_tta.{png,svg} tta_spread.{png,svg}

Failed runs are counted and named in a warning, and left out of the figures; runs still
going (a run directory without summary.json) are named in a warning and left out.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from scaling.analysis import intervals as iv
from scaling.analysis import scaling_tables as st
from scaling.errors import UsageError
from scaling.results import READABLE_SCHEMA_VERSIONS, write_text_atomic

REPORT_DIR = "report"
# Columns of a run copied onto each of its epochs (the keys the accuracy curves may group by).
EPOCH_KEYS = ("run_key", "num_workers", "seed", "global_batch", "repeat", "status", "backend", "num_nodes")
RESULTS_ROOT_ENV = "SCALING_RESULTS_DIR"  # as in scaling.launch.run: where relative result paths live


@dataclass
class _Sweep:
    runs: pd.DataFrame
    epochs: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)


def resolve_sweep_dir(path: str | os.PathLike) -> Path:
    """A sweep path as typed by a person: absolute, or relative to the working directory, to
    $SCALING_RESULTS_DIR, or to the repository root (a notebook runs in notebooks/); the first
    that exists. Unchanged if none does (load_sweep then says so)."""
    path = Path(path)
    if path.is_absolute():
        return path
    roots = [Path.cwd()]
    if os.environ.get(RESULTS_ROOT_ENV):
        roots.append(Path(os.environ[RESULTS_ROOT_ENV]))
    roots.append(Path(__file__).resolve().parent.parent)  # the repository root of an editable install
    for root in roots:
        if (root / path).exists():
            return root / path
    return path


def load_sweep(sweep_dir: str | os.PathLike | list) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(runs, epochs, warnings): the run table, every run's epochs with its keys, what was left out.

    sweep_dir: one sweep directory, or a list of them, merged (see `_merge`: run keys become
    `<sweep>/<run key>` and a `sweep` column names the directory).

    runs: one row per run with a summary (runs.parquet, or built from runs/*/summary.json).
    epochs: epochs.parquet rows of those runs plus run_id, run_key, num_workers, seed,
    global_batch, repeat, status, backend, num_nodes and the sweep.* columns.
    Raises UsageError when the directory is missing, empty or not a sweep.
    """
    sweep = _load_any(sweep_dir)
    return sweep.runs, sweep.epochs, sweep.warnings


def _load_any(sweep_dirs) -> _Sweep:
    if isinstance(sweep_dirs, (list, tuple)):
        sweep_dirs = [Path(d) for d in sweep_dirs]
        return _load(sweep_dirs[0]) if len(sweep_dirs) == 1 else _merge(sweep_dirs)
    return _load(Path(sweep_dirs))


def _load(sweep_dir: Path) -> _Sweep:
    if not sweep_dir.exists():
        raise UsageError(f"sweep directory not found: {sweep_dir}")
    if not sweep_dir.is_dir():
        raise UsageError(f"{sweep_dir} is not a directory; give a sweep directory (made by scaling sweep)")
    if not any(sweep_dir.iterdir()):
        raise UsageError(f"{sweep_dir} is empty: no sweep to report (make one with: scaling sweep CONFIG --out {sweep_dir})")
    index_path = sweep_dir / "runs.parquet"
    run_dirs = sorted(p for p in (sweep_dir / "runs").iterdir() if p.is_dir()) if (sweep_dir / "runs").is_dir() else []
    with_summary = [p for p in run_dirs if (p / "summary.json").is_file()]
    if not index_path.exists() and not with_summary:
        if (sweep_dir / "summary.json").exists():
            raise UsageError(f"{sweep_dir} is a run directory, not a sweep (no runs.parquet, no runs/*/summary.json)")
        if (sweep_dir / "sweep.yaml").exists():
            raise UsageError(f"{sweep_dir}: no run of this sweep has finished yet (no runs/*/summary.json)")
        raise UsageError(f"{sweep_dir} is not a sweep directory: no runs.parquet and no runs/*/summary.json")

    warnings: list[str] = []
    runs = pd.DataFrame()
    if index_path.exists():
        try:
            runs = pd.read_parquet(index_path)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            warnings.append(f"runs.parquet is unreadable ({type(exc).__name__}); the run table was built from runs/*/summary.json")
    if runs.empty:
        runs = _runs_from_summaries(with_summary, sweep_dir, warnings)
        if index_path.exists() and not runs.empty:
            warnings.append(f"runs.parquet lists no runs; the run table was built from {len(runs)} runs/*/summary.json")
        elif not runs.empty:
            warnings.append(f"no runs.parquet (interrupted sweep?); the run table was built from {len(runs)} "
                            "runs/*/summary.json, without the sweep axes")
    if runs.empty:
        raise UsageError(f"{sweep_dir}: no run of this sweep has finished yet")
    if "run_key" not in runs.columns:
        runs["run_key"] = runs["run_id"] if "run_id" in runs.columns else [f"run{i}" for i in range(len(runs))]
    if "run_dir" not in runs.columns:
        runs["run_dir"] = "runs/" + runs["run_key"].astype(str)
    if "status" not in runs.columns:
        runs["status"] = "failed"
    runs = _readable_versions(runs, warnings)

    listed = set(runs["run_key"].astype(str))
    incomplete = [p.name for p in run_dirs if not (p / "summary.json").is_file() and p.name not in listed]
    if incomplete:
        warnings.append(f"incomplete runs (no summary.json yet), left out: {', '.join(incomplete)}")
    unlisted = [p.name for p in with_summary if p.name not in listed]
    if unlisted:
        warnings.append(f"runs with a summary.json that runs.parquet does not list yet, left out: {', '.join(unlisted)}")
    failed = runs[runs["status"] == "failed"]
    if not failed.empty:
        named = ", ".join(f"{row.run_key} ({_short_error(row)})" for row in failed.itertuples())
        warnings.append(f"failed runs, counted but left out of the figures: {named}")

    epochs, corrupt = _read_epochs(sweep_dir, runs, warnings)
    if corrupt:
        runs = runs[~runs["run_key"].astype(str).isin(corrupt)]
        if runs.empty:
            raise UsageError(f"{sweep_dir}: every run's records are unreadable ({', '.join(corrupt)})")
    return _Sweep(runs.reset_index(drop=True), epochs, warnings, incomplete)


def _merge(sweep_dirs: list[Path]) -> _Sweep:
    """Several sweeps as one: runs and epochs concatenated, each run's key prefixed with its sweep.

    The column `sweep` names the directory each run came from. It becomes a group key (its own
    series in every table and figure) only where the other keys do not already tell the sweeps
    apart: a DDP sweep and a `--set backend=horovod` sweep differ by `backend` already.
    """
    labels = [d.name or str(d) for d in sweep_dirs]
    if len(set(labels)) < len(labels):
        labels = [str(d) for d in sweep_dirs]
    if len(set(labels)) < len(labels):
        raise UsageError(f"the same sweep directory is given twice: {' '.join(map(str, sweep_dirs))}")
    runs, epochs, warnings, incomplete = [], [], [], []
    for label, sweep_dir in zip(labels, sweep_dirs):
        sweep = _load(sweep_dir)
        prefix = f"{label}/"
        runs.append(sweep.runs.assign(run_key=prefix + sweep.runs["run_key"].astype(str),
                                      run_dir=[str(sweep_dir / d) for d in sweep.runs["run_dir"].astype(str)],
                                      sweep=label))
        if not sweep.epochs.empty:
            epochs.append(sweep.epochs.assign(run_key=prefix + sweep.epochs["run_key"].astype(str), sweep=label))
        warnings += [f"{label}: {w}" for w in sweep.warnings]
        incomplete += [prefix + name for name in sweep.incomplete]
    merged = pd.concat(runs, ignore_index=True)
    merged_epochs = pd.concat(epochs, ignore_index=True) if epochs else sweep.epochs
    return _Sweep(merged, merged_epochs, warnings, incomplete)


def group_keys(runs: pd.DataFrame) -> tuple[str, ...]:
    """The report's group keys: scaling_tables.default_group_by, plus `sweep` (the source
    directory of a merged report) where the other keys leave runs of different sweeps together."""
    keys = st.default_group_by(runs)
    if "sweep" in runs.columns and runs["sweep"].nunique() > 1:
        others = [k for k in keys if k != "num_workers"]
        mixed = runs.groupby(others, dropna=False)["sweep"].nunique().gt(1).any() if others else True
        if mixed:
            keys = (*keys, "sweep")
    return keys


def _readable_versions(runs: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """Keep runs whose schema version this lab reads; name the others (results.READABLE_SCHEMA_VERSIONS)."""
    if "schema_version" not in runs.columns:
        warnings.append("runs without a schema_version: read as version 1")
        return runs
    version = pd.to_numeric(runs["schema_version"], errors="coerce")
    unreadable = runs[~version.isin(READABLE_SCHEMA_VERSIONS)]
    if unreadable.empty:
        return runs
    named = ", ".join(f"{row.run_key} (schema_version {row.schema_version})" for row in unreadable.itertuples())
    readable = ", ".join(str(v) for v in READABLE_SCHEMA_VERSIONS)
    if len(unreadable) == len(runs):
        raise UsageError(f"no run here has a schema version this lab reads ({readable}): {named}; "
                         "report them with the version of the lab that wrote them")
    warnings.append(f"runs of a schema version this lab cannot read (reads {readable}), left out: {named}")
    return runs[version.isin(READABLE_SCHEMA_VERSIONS)]


def _short_error(row) -> str:
    error = getattr(row, "error", None)
    if not isinstance(error, str) or not error:
        return "no error recorded"
    return error if len(error) <= 100 else error[:97] + "..."


def _runs_from_summaries(run_dirs: list[Path], sweep_dir: Path, warnings: list[str]) -> pd.DataFrame:
    rows = []
    for run_dir in run_dirs:
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            warnings.append(f"unreadable summary.json in {run_dir.relative_to(sweep_dir)}, left out: {exc}")
            continue
        row = pd.json_normalize(summary, sep=".").iloc[0].to_dict()
        repeat = re.search(r"-r(\d+)$", run_dir.name)  # the sweep's run keys end in -r<repeat>
        row.update(run_key=run_dir.name, run_dir=f"runs/{run_dir.name}", repeat=int(repeat.group(1)) if repeat else None)
        rows.append(row)
    return pd.DataFrame(rows)


def _read_epochs(sweep_dir: Path, runs: pd.DataFrame, warnings: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """Every run's epochs with its keys, and the runs whose epochs.parquet is unreadable (named in a warning).

    Each file is read with pyarrow and the tables are joined once: a pandas read plus a column
    assign per run took 1.5 s of a 200-run report (bench/analysis_speed.py).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = [c for c in EPOCH_KEYS if c in runs.columns] + [c for c in runs.columns if c.startswith("sweep.")]
    runs = runs.reset_index(drop=True)
    tables, missing, corrupt = [], [], []
    for position, (run_key, run_dir, status) in enumerate(zip(runs["run_key"].astype(str), runs["run_dir"].astype(str),
                                                              runs["status"])):
        path = sweep_dir / run_dir / "epochs.parquet"
        if not path.is_file():
            if status != "failed":
                missing.append(run_key)
            continue
        try:
            table = pq.ParquetFile(path).read()
        except Exception as exc:  # a damaged file: name the run and report the rest
            corrupt.append(run_key)
            warnings.append(f"run {run_key}: unreadable {path.name} ({type(exc).__name__}), left out")
            continue
        if table.num_rows:
            tables.append(table.append_column(_RUN_POSITION, pa.array([position] * table.num_rows, pa.int64())))
    if missing:
        warnings.append(f"runs without epochs.parquet (no accuracy curve): {', '.join(missing)}")
    if not tables:
        return pd.DataFrame(columns=["run_id", *keys, "epoch", "val_accuracy"]), corrupt
    epochs = pa.concat_tables(tables, promote_options="default").to_pandas()
    run_ids = runs["run_id"] if "run_id" in runs.columns else runs["run_key"]
    run_ids = run_ids.where(run_ids.map(lambda v: isinstance(v, str)), runs["run_key"])
    per_run = runs[keys].assign(run_id=run_ids)[["run_id", *keys]]
    epochs = epochs.drop(columns=[c for c in per_run.columns if c in epochs.columns])
    epochs = epochs.join(per_run, on=_RUN_POSITION).drop(columns=_RUN_POSITION)
    return epochs, corrupt


_RUN_POSITION = "__run_position"


# ---------------------------------------------------------------------------- tables

def _num(spec: str, scale: float = 1.0, suffix: str = ""):
    def fmt(value) -> str:
        try:
            value = float(value)
        except (TypeError, ValueError):
            return "-"
        return "-" if not math.isfinite(value) else f"{value * scale:{spec}}{suffix}"
    return fmt


def _text(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _key_columns(keys) -> list[tuple]:
    return [(k, "workers" if k == "num_workers" else k.removeprefix("sweep."), _text) for k in keys]


def _scaling_columns(keys) -> list[tuple]:
    return _key_columns(keys) + [
        (lambda r: f"{int(r['n_ok'])}/{int(r['n_runs'])}", "runs ok", None),
        ("time_per_epoch_s", "time/epoch (s)", _num(".2f")),
        ("speedup_time_per_epoch", "speedup", _num(".2f", suffix="×")),
        ("efficiency_time_per_epoch", "eff.", _num(".0%")),
        ("throughput_samples_per_s", "throughput (samples/s)", _num(",.0f")),
        ("speedup_throughput", "speedup", _num(".2f", suffix="×")),
        ("efficiency_throughput", "eff.", _num(".0%")),
        ("tta_mean_s", "TTA mean (s)", _num(".1f")),
        ("speedup_tta", "speedup", _num(".2f", suffix="×")),
        ("efficiency_tta", "eff.", _num(".0%")),
    ]


def _tta_columns(keys) -> list[tuple]:
    return _key_columns(keys) + [
        (lambda r: f"{int(r['n_reached'])}/{int(r['n_ok'])}", "reached target", None),
        ("tta_mean_s", "TTA mean (s)", _num(".1f")),
        ("tta_std_s", "TTA std (s)", _num(".1f")),
        ("tta_cv", "TTA CV", _num(".3f")),
        ("epochs_to_target", "epochs to target (median)", _num(".1f")),
        ("epochs_cv", "CV epochs", _num(".3f")),
        ("time_per_epoch_cv", "CV time/epoch", _num(".3f")),
        ("tta_cv_ratio", "CV ratio", _num(".2f")),
        ("tta_wall_mean_s", "TTA wall mean (s)", _num(".1f")),
        ("cost_to_accuracy_usd", "cost to accuracy (USD)", _num(".4f")),
    ]


def _comm_columns(keys) -> list[tuple]:
    return _key_columns(keys) + [
        ("comm_overhead_pct", "comm overhead A/B (%)", _num(".1f")),
        ("exposed_comm_pct", "exposed comm (%)", _num(".1f")),
        ("step_s", "step (ms)", _num(".2f", 1e3)),
        ("data_s", "data (ms)", _num(".2f", 1e3)),
        ("forward_s", "forward (ms)", _num(".2f", 1e3)),
        ("backward_compute_s", "backward compute (ms)", _num(".2f", 1e3)),
        ("exposed_comm_s", "exposed comm (ms)", _num(".2f", 1e3)),
        ("optimizer_s", "optimizer (ms)", _num(".2f", 1e3)),
    ]


def _interval_cell(figure: str, spec: str, suffix: str = ""):
    """'1.53× [1.41, 1.66] within noise'; '1.00× (base)' for the base row's speedups."""
    def cell(row) -> str:
        if figure.startswith(("speedup_", "gap_")) and row["num_workers"] == row["base_workers"]:
            return "base"
        if figure.endswith("comm_pct") or figure == "comm_overhead_pct":
            if row["num_workers"] == 1:
                return "0 (1 worker)"
        text = iv.format_interval(row[figure], row[f"{figure}_lo"], row[f"{figure}_hi"], spec, suffix)
        verdict = row[f"verdict_{figure}"]
        return text + (" within noise" if verdict == "within noise" else "")
    return cell


def _repeats_cell(row) -> str:
    needed = [row[f"repeats_needed_{f}"] for f in ("speedup_throughput", "speedup_tta", "comm_overhead_pct")]
    needed = [n for n in needed if isinstance(n, float) and math.isfinite(n)]
    return str(int(max(needed))) if needed else "-"


def _interval_columns(keys) -> list[tuple]:
    return _key_columns(keys) + [
        (lambda r: str(int(r["n_ok"])), "repeats", None),
        (_interval_cell("speedup_time_per_epoch", ".2f", "×"), "speedup time/epoch", None),
        (_interval_cell("speedup_throughput", ".2f", "×"), "speedup throughput", None),
        (_interval_cell("speedup_tta", ".2f", "×"), "speedup TTA", None),
        (_interval_cell("gap_tta_vs_throughput", ".2f", "×"), "TTA / throughput speedup", None),
        (_interval_cell("comm_overhead_pct", ".1f", " %"), "comm overhead A/B", None),
        (_interval_cell("exposed_comm_pct", ".1f", " %"), "exposed comm", None),
        (_repeats_cell, "repeats for ±5%", None),
    ]


def headline_claims(intervals: pd.DataFrame) -> list[str]:
    """One sentence per compared worker count: the speedups with their intervals, and what they can support."""
    lines = []
    for _, row in intervals.iterrows():
        if row["num_workers"] == row["base_workers"] or not math.isfinite(row["speedup_throughput"]):
            continue
        series = ", ".join(f"{k.removeprefix('sweep.')} {row[k]}" for k in intervals.attrs.get("group_by", ())
                           if k != "num_workers")
        where = f"{int(row['base_workers'])}→{int(row['num_workers'])} workers" + (f" ({series})" if series else "")
        parts = [f"throughput speedup {_claim(row, 'speedup_throughput')}", f"TTA speedup {_claim(row, 'speedup_tta')}"]
        gap = row["verdict_gap_tta_vs_throughput"]
        if gap == "within noise":
            parts.append("TTA and throughput speedups do not differ beyond the noise: the data cannot say whether "
                         "TTA scales better or worse than throughput")
        elif gap == "below":
            parts.append("TTA scales worse than throughput (outside the noise)")
        elif gap == "above":
            parts.append("TTA scales better than throughput (outside the noise)")
        else:
            parts.append("no interval for the throughput-vs-TTA gap (fewer than 2 repeats reached the target)")
        lines.append(f"{where}: " + "; ".join(parts) + ".")
    return lines


def _claim(row, figure: str) -> str:
    text = iv.format_interval(row[figure], row[f"{figure}_lo"], row[f"{figure}_hi"], ".2f", "×")
    verdict = row[f"verdict_{figure}"]
    if verdict == "within noise":
        return text + ", within noise (the interval includes 1×: no speedup shown)"
    return text


def _utilisation_columns(keys) -> list[tuple]:
    return _key_columns(keys) + [
        ("achieved_flops_per_s", "achieved (TFLOP/s per worker)", _num(".3f", 1e-12)),
        ("peak_flops_per_s", "peak (TFLOP/s)", _num(".3f", 1e-12)),
        ("mfu", "MFU", _num(".1%")),
        ("arithmetic_intensity", "intensity (FLOP/B, est.)", _num(".1f")),
        ("mem_bytes_per_s", "memory roof (GB/s)", _num(".1f", 1e-9)),
    ]


def _projection_columns(keys) -> list[tuple]:
    return _key_columns(keys) + [
        ("step_s", "step measured (ms)", _num(".1f", 1e3)),
        ("projected_step_s", "step projected (ms)", _num(".1f", 1e3)),
        ("comm_overhead_pct", "comm overhead measured (%)", _num(".1f")),
        ("projected_comm_overhead_pct", "comm overhead projected (%)", _num(".1f")),
        ("speedup_throughput", "speedup measured", _num(".2f", suffix="×")),
        ("projected_speedup_throughput", "speedup projected", _num(".2f", suffix="×")),
    ]


BATCH_COLUMNS = [
    ("global_batch", "global batch", _text),
    ("num_workers", "workers", _text),
    ("per_worker_batch", "per-worker batch", _text),
    (lambda r: f"{int(r['n_reached'])}/{int(r['n_runs'] - r['n_failed'])}", "reached target", None),
    ("epochs_to_target", "epochs to target (median)", _num(".1f")),
    ("throughput_samples_per_s", "throughput (samples/s)", _num(",.0f")),
    ("time_per_epoch_s", "time/epoch (s)", _num(".2f")),
    ("tta_mean_s", "TTA mean (s)", _num(".1f")),
    ("tta_std_s", "TTA std (s)", _num(".1f")),
]


def _run_columns(runs: pd.DataFrame) -> list[tuple]:
    axes = [(c, c.removeprefix("sweep."), _text) for c in runs.columns if c.startswith("sweep.")]
    return [("run_key", "run", _text), ("num_workers", "workers", _text), *axes, ("seed", "seed", _text),
            ("status", "status", _text), ("epochs_run", "epochs", _text), ("epochs_to_target", "epochs to target", _text),
            ("best_accuracy", "best acc.", _num(".2%")), ("tta_s", "TTA (s)", _num(".1f")),
            ("time_per_epoch_s", "time/epoch (s)", _num(".2f")),
            ("throughput_samples_per_s", "throughput (samples/s)", _num(",.0f")),
            ("comm_overhead_pct", "comm overhead (%)", _num(".1f"))]


def _cells(frame: pd.DataFrame, columns: list[tuple]) -> tuple[list[str], list[list[str]]]:
    headers = [header for _, header, _ in columns]
    rows = []
    for _, row in frame.iterrows():
        cells = []
        for column, _, fmt in columns:
            if callable(column):
                cells.append(column(row))
            else:
                cells.append(fmt(row[column]) if column in row.index else "-")
        rows.append(cells)
    return headers, rows


def _left(index: int, header: str) -> bool:
    """Names left, numbers right."""
    return index == 0 or header in ("status", "backend")


def _markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    def escape(cell: str) -> str:
        return cell.replace("|", "\\|")

    align = ["---" if _left(i, h) else "---:" for i, h in enumerate(headers)]
    lines = ["| " + " | ".join(escape(h) for h in headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _rich_table(title: str, headers: list[str], rows: list[list[str]]):
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if _left(i, header) else "right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


# ---------------------------------------------------------------------------- the report

FIGURES = (  # file stem, heading, the one line that defines it
    ("speedup", "Speedup",
     "Speedup over the smallest worker count: time per epoch(base) / time per epoch(N), throughput(N) / throughput(base) "
     "and mean TTA(base) / mean TTA(N); the dashed line is ideal linear scaling, N / N_base."),
    ("throughput_vs_tta", "Throughput speedup vs. TTA speedup",
     "The same throughput and TTA speedups side by side per worker count; the gap is the extra epochs a larger global "
     "batch needs to reach the target (black line: ideal)."),
    ("comm_overhead", "Communication overhead",
     "Median over repeats of the A/B communication overhead, (t_sync − t_no_sync) / t_step, and of the exposed "
     "communication (all-reduce not hidden behind backward) as a share of the step time."),
    ("step_breakdown", "Step breakdown",
     "Mean time of a steady-state training step per worker count, split into data loading, forward, backward compute, "
     "exposed communication and optimizer (ms; the label is the whole step)."),
    ("accuracy_curves", "Accuracy curves",
     "Validation top-1 accuracy after each epoch: mean over repeats (line) and min–max (band); runs stop at the "
     "target (dashed), so later epochs hold only the slower repeats."),
    ("roofline", "Roofline",
     "Achieved model FLOP/s per worker against the estimated arithmetic intensity of a training step (FLOPs per byte "
     "moved), under the device's roof min(peak FLOP/s, intensity × memory bandwidth); MFU = achieved / peak."),
    ("tta_spread", "TTA over repeats",
     "Time to accuracy (training time to the end of the first epoch at the target) of every repeat, its mean ± std, "
     "and how many repeats reached the target."),
)


BANDWIDTH_FIGURE = (
    "comm_vs_bandwidth", "Communication overhead against link bandwidth",
    "Median A/B communication overhead per worker count at each link cap of the minicluster's nodes "
    "(`workers.link_bandwidth`; tc token-bucket on each node's egress).",
)


def _figures(table, curves, spread, target) -> dict:
    from scaling.plots import figures as fg

    return {
        "speedup": fg.speedup_figure(table),
        "throughput_vs_tta": fg.throughput_vs_tta_figure(table),
        "comm_overhead": fg.comm_overhead_figure(table),
        "step_breakdown": fg.step_breakdown_figure(table),
        "accuracy_curves": fg.accuracy_curves_figure(curves, target),
        "tta_spread": fg.tta_spread_figure(spread),
        "roofline": fg.roofline_figure(table),
    }


def _first(runs: pd.DataFrame, column: str) -> str | None:
    if column not in runs.columns:
        return None
    values = runs[column].dropna()
    return str(values.mode().iloc[0]) if not values.empty else None


def _header(dirs: list[Path], runs: pd.DataFrame, incomplete: list[str], target: float | None) -> list[str]:
    failed = int((runs["status"] == "failed").sum())
    reached = int((runs["status"] == "reached_target").sum())
    def each(column: str) -> str | None:  # every value, most common first
        if column not in runs.columns:
            return None
        values = runs[column].dropna().astype(str).value_counts().index.tolist()
        return " / ".join(values) if values else None

    what = ", ".join(filter(None, [
        each("model") and f"model {each('model')}",
        each("dataset") and f"data {each('dataset')}",
        each("backend") and f"backend {each('backend')}",
        each("launcher") and f"launcher {each('launcher')}",
        each("cluster") and f"cluster {each('cluster')}",
    ]))
    machine = ", ".join(filter(None, [_first(runs, "hardware.cpu_model"),
                                      _first(runs, "hardware.gpu_name") and f"GPU {_first(runs, 'hardware.gpu_name')}"]))
    target_text = f"{target:.0%}" if target is not None else "?"
    return [
        (f"Sweep directory `{dirs[0]}`" if len(dirs) == 1 else
         "Sweep directories " + ", ".join(f"`{d}`" for d in dirs)) + (f": {what}." if what else "."),
        f"{len(runs)} runs with a summary: {len(runs) - failed} finished ({reached} reached the target accuracy "
        f"{target_text}), {failed} failed; {len(incomplete)} incomplete." + (f" Machine (rank 0): {machine}." if machine else ""),
        "Every figure is defined once in `scaling/analysis/scaling_tables.py` (per run: `docs/results.md`).",
    ]


TERMINAL_RUN_ROWS = 40  # the terminal's Runs table stops here (report.md lists every run)


def write_report(sweep_dirs, console=None, out: str | os.PathLike | None = None) -> Path:
    """Print the tables and write the report directory (report.md and the figures); returns report.md's path.

    sweep_dirs: one sweep directory (the report goes to SWEEP/report/) or several, merged into
    one report (`_merge`), which then needs `out`.
    """
    from rich.console import Console
    from rich.markup import escape

    from scaling.plots.figures import save
    from scaling.projection.overlay import add_projection, project_sweep

    console = console if console is not None else Console()
    dirs = [Path(d) for d in sweep_dirs] if isinstance(sweep_dirs, (list, tuple)) else [Path(sweep_dirs)]
    if len(dirs) > 1 and out is None:
        raise UsageError("several sweep directories make one report: say where it goes with --out DIR")
    sweep = _load_any(dirs)
    runs, epochs = sweep.runs, sweep.epochs
    warnings = list(sweep.warnings)

    keys = group_keys(runs)
    table = st.per_worker_count(runs, keys)
    projected, projection_notes, projection_warnings = project_sweep(
        st.prepare_runs(runs), keys, lambda run: dirs[0] / str(run["run_dir"]))
    warnings += projection_warnings
    table = add_projection(table, projected, keys)
    intervals = iv.scaling_intervals(st.prepare_runs(runs), table)
    for column in intervals.columns:  # the intervals and verdicts beside each figure (same rows, same order)
        if column.endswith(("_lo", "_hi")) or column.startswith(("verdict_", "repeats_needed_")):
            table[column] = intervals[column].to_numpy()
    table["gap_tta_vs_throughput"] = intervals["gap_tta_vs_throughput"].to_numpy()
    intervals.attrs["group_by"] = tuple(keys)
    for warning in warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    curve_keys = [k for k in keys if k in epochs.columns]
    curves = st.accuracy_curves(epochs, curve_keys)
    spread = st.tta_spread(runs, keys)
    tradeoff = st.batch_tradeoff(runs)
    target = st.target_accuracy(runs)

    out = Path(out) if out is not None else dirs[0] / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    figures = _figures(table, curves, spread, target)
    listed = list(FIGURES)
    bandwidth = st.bandwidth_series(table)
    if not bandwidth.empty:  # a minicluster sweep over link caps
        from scaling.plots.figures import comm_vs_bandwidth_figure

        figures["comm_vs_bandwidth"] = comm_vs_bandwidth_figure(bandwidth)
        listed.append(BANDWIDTH_FIGURE)
    for stem, fig in figures.items():
        save(fig, out / stem)

    sections = [
        ("Scaling: time per epoch, throughput and TTA (speedup over the smallest worker count)", _scaling_columns(keys), table),
        ("Uncertainty: 95% intervals over repeats (bootstrap over runs)", _interval_columns(keys), table),
        ("Time to accuracy over repeats", _tta_columns(keys), table),
        ("Communication and step time", _comm_columns(keys), table),
        ("Hardware utilisation (model FLOPs)", _utilisation_columns(keys), table),
    ]
    if not projected.empty:
        sections.append(("Measured against projected (α–β model, scaling/projection)", _projection_columns(keys),
                         table[table["projected_step_s"].notna()]))
    if not tradeoff.empty:
        sections.append(("Batch-size trade-off (global batch)", BATCH_COLUMNS, tradeoff))
    sections.append(("Runs", _run_columns(runs), runs.sort_values(["num_workers", "run_key"])))

    name = _first(runs, "name") or dirs[0].name
    title = f"# Sweep report: {name}" if len(dirs) == 1 else f"# Sweep report: {', '.join(d.name for d in dirs)}"
    md = [title, "", *_header(dirs, runs, sweep.incomplete, target), ""]
    if warnings:
        md += ["## Warnings", "", *[f"- {w}" for w in warnings], ""]
    claims = headline_claims(intervals)
    if claims:
        md += ["## What the data supports", "", *[f"- {c}" for c in claims],
               "", "Intervals: 95%, percentile bootstrap over the runs of each worker count "
               "(scaling/analysis/intervals.py); with 2–3 repeats they are at best the observed range, "
               "so read \"repeats for ±5%\" in the uncertainty table before trusting a narrow one.", ""]
        for claim in claims:
            console.print(f"[bold]{escape(claim)}[/bold]")
    md += ["## Figures", "", "Each figure is also written as SVG beside the PNG.", ""]
    if not projected.empty:
        md += ["Dotted lines with crosses are projections of the α–β model (scaling/projection/overlay.py) "
               "at the measured worker counts, from each series' smallest-worker run:", "",
               *[f"- {note}" for note in projection_notes], ""]
    for stem, heading, definition in listed:
        md += [f"### {heading}", "", f"![{heading}]({stem}.png)", "", definition, ""]
    md += ["## Tables", ""]
    for title, columns, frame in sections:
        headers, rows = _cells(frame, columns)
        shown = rows
        if title == "Runs" and len(rows) > TERMINAL_RUN_ROWS:
            shown = rows[:TERMINAL_RUN_ROWS]
            title_shown = f"{title} (first {TERMINAL_RUN_ROWS} of {len(rows)}; all in report.md)"
        else:
            title_shown = title
        console.print(_rich_table(title_shown, headers, shown))
        md += [f"### {title}", "", _markdown_table(headers, rows), ""]
    md += [
        "Uncertainty: [lo, hi] is the 95% interval over repeats; 'within noise' marks an interval that includes the "
        "comparison (1× for a speedup or for the TTA / throughput speedup ratio, 0 % for an overhead); 'no interval' "
        "where a worker count has fewer than 2 repeats; repeats for ±5% = repeats per worker count that would narrow "
        "the widest of the throughput speedup, TTA speedup and A/B overhead intervals to ±5% (half-width ∝ 1/√n). "
        "Speedup and efficiency: over the smallest worker count of the same series; eff. = speedup / (N / N_base). "
        "CV = std / mean over the repeats that reached the target (ddof=1); CV ratio = CV(epochs to target) / "
        "CV(time per epoch): above 1, TTA varies mostly through the number of epochs. Cost = TTA / 3600 × nodes × "
        "price per node-hour ('-' when the price is unknown).",
        "",
    ]
    path = out / "report.md"
    write_text_atomic(path, "\n".join(md))
    return path
