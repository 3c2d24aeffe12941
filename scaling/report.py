"""A sweep's report: its tables printed, report.md and the figures written.

    scaling report results/qs        # -> results/qs/report/report.md, *.png, *.svg
    scaling report results/ddp results/hvd --out results/ddp-vs-hvd   # several sweeps, one report

This module only composes. `scaling.results` reads the sweep (`read_sweeps`: runs.parquet, or
for an interrupted sweep every runs/*/summary.json, and each run's epochs, with the warnings of
what was left out); `scaling.analysis` groups and computes (`scaling_tables.group_keys`, the
same rule the notebooks use; `intervals`); `scaling.plots.figures` draws, each figure with its
caption; `write_report` lays the tables out (the column specs below), prints them with rich and
writes, atomically, into SWEEP/report/:

    report.md                 tables (markdown) and the figures, one line defining each
    speedup.{png,svg}         comm_overhead.{png,svg}    step_breakdown.{png,svg}
    accuracy_curves.{png,svg} throughput_vs_tta.{png,svg} tta_spread.{png,svg}  roofline.{png,svg}
    memory.{png,svg}             (runs that recorded their peak memory per rank)
    comm_vs_bandwidth.{png,svg}  (a minicluster sweep over link caps)

Failed runs are counted and named in a warning, and left out of the figures (the rule:
`scaling_tables.left_out_of_figures`); runs still going (a run directory without summary.json)
are named in a warning by the reader and left out.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import pandas as pd

from scaling.analysis import attribution as at
from scaling.analysis import intervals as iv
from scaling.analysis import scaling_tables as st
from scaling.schema import COLLECTIVE_KINDS, REGATHER, SHARDED_KINDS
from scaling.errors import UsageError
from scaling.results import RunDir, SweepDir, read_sweeps, write_text_atomic


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


# The three communication figures (scaling/analysis/run_metrics.py), always named for what they are.
COMM_FIGURES = (
    ("allreduce_pct", "communicating: all-reduce in flight (% of step)"),
    ("exposed_comm_pct", "exposed comm (% of step)"),
    ("comm_overhead_pct", "comm overhead A/B (% of step)"),
)
# A sharded backend's (FSDP's) collectives by kind (scaling.schema.SHARDED_KINDS), beside the all-reduce: shown where a
# run has them.
KIND_FIGURES = (
    *((f"{kind}_pct", f"communicating: {COLLECTIVE_KINDS[kind]} in flight (% of step)") for kind in SHARDED_KINDS),
    (f"{REGATHER}_pct", "backward re-gathers, among the all-gathers (% of step)"),
    *((f"exposed_{kind}_pct", f"exposed {COLLECTIVE_KINDS[kind]} (% of step)") for kind in SHARDED_KINDS),
)


MEMORY_FIGURES = (
    ("peak_memory_bytes", "peak memory, largest rank (MiB)"),
    ("peak_memory_min_bytes", "smallest rank (MiB)"),
)


def _comm_columns(keys, table: pd.DataFrame | None = None) -> list[tuple]:
    """The communication table's columns: the kinds and the peak memory where the runs recorded them."""

    def present(column: str) -> bool:
        return table is not None and _any(table, column)

    kinds = [(column, header, _num(".1f")) for column, header in KIND_FIGURES if present(column)]
    memory = [(column, header, _num(",.0f", 2**-20)) for column, header in MEMORY_FIGURES if present(column)]
    return (
        _key_columns(keys)
        + [(column, header, _num(".1f")) for column, header in COMM_FIGURES[:1]]
        + kinds
        + [(column, header, _num(".1f")) for column, header in COMM_FIGURES[1:]]
        + [
            ("step_s", "step (ms)", _num(".2f", 1e3)),
            ("data_s", "data (ms)", _num(".2f", 1e3)),
            ("forward_s", "forward (ms)", _num(".2f", 1e3)),
            ("backward_compute_s", "backward compute (ms)", _num(".2f", 1e3)),
            ("exposed_comm_s", "exposed comm (ms)", _num(".2f", 1e3)),
            ("optimizer_s", "optimizer (ms)", _num(".2f", 1e3)),
            *memory,
        ]
    )


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


def _model_gap_cell(row) -> str:
    """What the samples-to-target model expects of the TTA-to-throughput ratio from the batch alone
    (scaling_tables.add_speedup's `gap_tta_model`); "-" where the baseline measured no noise scale."""
    value = row.get("gap_tta_model")
    return f"{value:.2f}×" if isinstance(value, float) and math.isfinite(value) else "-"


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
        (_model_gap_cell, "TTA / throughput, noise-scale model", None),
        (_interval_cell("comm_overhead_pct", ".1f", " %"), "comm overhead A/B", None),
        (_interval_cell("exposed_comm_pct", ".1f", " %"), "exposed comm", None),
        (_repeats_cell, "repeats for ±5%", None),
    ]


def _gap_cause(row) -> str:
    """Whether samples-to-target growth (the noise-scale model's expected ratio) accounts for a TTA speedup
    behind the throughput speedup, or something else took the rest."""
    model = row.get("gap_tta_model")
    if not (isinstance(model, float) and math.isfinite(model)):
        return ""
    if row["gap_tta_vs_throughput_lo"] <= model <= row["gap_tta_vs_throughput_hi"]:
        return (
            f": samples-to-target growth at the larger batch explains it (the noise-scale model expects {model:.2f}×)"
        )
    return (
        f": more than samples-to-target growth explains (the noise-scale model expects {model:.2f}×): something "
        "else, e.g. the learning-rate rule at that batch, or epochs slowed by evaluation"
    )


def headline_claims(intervals: pd.DataFrame) -> list[str]:
    """One sentence per compared worker count: the speedups with their intervals, and what they can support."""
    lines = []
    for _, row in intervals.iterrows():
        if row["num_workers"] == row["base_workers"] or not math.isfinite(row["speedup_throughput"]):
            continue
        series = ", ".join(
            f"{k.removeprefix('sweep.')} {row[k]}" for k in intervals.attrs.get("group_by", ()) if k != "num_workers"
        )
        where = f"{int(row['base_workers'])}→{int(row['num_workers'])} workers" + (f" ({series})" if series else "")
        parts = [f"throughput speedup {_claim(row, 'speedup_throughput')}", f"TTA speedup {_claim(row, 'speedup_tta')}"]
        gap = row["verdict_gap_tta_vs_throughput"]
        if gap == "within noise":
            parts.append(
                "TTA and throughput speedups do not differ beyond the noise: the data cannot say whether "
                "TTA scales better or worse than throughput"
            )
        elif gap == "below":
            parts.append("TTA scales worse than throughput (outside the noise)" + _gap_cause(row))
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
        ("allreduce_pct", "communicating measured (%)", _num(".1f")),
        ("projected_allreduce_pct", "communicating projected (%)", _num(".1f")),
        ("exposed_comm_pct", "exposed measured (%)", _num(".1f")),
        ("projected_exposed_comm_pct", "exposed projected (%)", _num(".1f")),
        ("comm_overhead_pct", "comm overhead A/B measured (%)", _num(".1f")),
        ("projected_comm_overhead_pct", "comm overhead A/B projected (%)", _num(".1f")),
        ("speedup_throughput", "speedup measured", _num(".2f", suffix="×")),
        ("projected_speedup_throughput", "speedup projected", _num(".2f", suffix="×")),
    ]


BATCH_COLUMNS = [
    ("global_batch", "global batch", _text),
    ("num_workers", "workers", _text),
    ("per_worker_batch", "per-worker batch", _text),
    (lambda r: f"{int(r['n_reached'])}/{int(r['n_ok'])}", "reached target", None),
    ("epochs_to_target", "epochs to target (median)", _num(".1f")),
    ("throughput_samples_per_s", "throughput (samples/s)", _num(",.0f")),
    ("time_per_epoch_s", "time/epoch (s)", _num(".2f")),
    ("tta_mean_s", "TTA mean (s)", _num(".1f")),
    ("tta_std_s", "TTA std (s)", _num(".1f")),
]


def _any(runs: pd.DataFrame, column: str) -> bool:
    return column in runs.columns and runs[column].notna().any()


def _run_columns(runs: pd.DataFrame) -> list[tuple]:
    axes = [(c, c.removeprefix("sweep."), _text) for c in runs.columns if c.startswith("sweep.")]
    # runs of sequences (a language model's) are read per token, and a loss target by its best loss
    best_loss = [("best_val_loss", "best val loss", _num(".3f"))] if _any(runs, "target_loss") else []
    tokens = (
        [("throughput_tokens_per_s", "throughput (tokens/s)", _num(",.0f"))]
        if _any(runs, "throughput_tokens_per_s")
        else []
    )
    return [
        ("run_key", "run", _text),
        ("num_workers", "workers", _text),
        *axes,
        ("seed", "seed", _text),
        ("status", "status", _text),
        ("epochs_run", "epochs", _text),
        ("epochs_to_target", "epochs to target", _text),
        ("best_accuracy", "best acc.", _num(".2%")),
        *best_loss,
        ("tta_s", "TTA (s)", _num(".1f")),
        ("time_per_epoch_s", "time/epoch (s)", _num(".2f")),
        ("throughput_samples_per_s", "throughput (samples/s)", _num(",.0f")),
        *tokens,
        ("comm_overhead_pct", "comm overhead (%)", _num(".1f")),
    ]


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


_TABLE_EDGE, _COLUMN_FRAME = 1, 3  # rich's heavy-head box: the left edge; per column its padding and its border


def _rich_tables(title: str, headers: list[str], rows: list[list[str]], width: int, repeat: int = 1) -> list:
    """The terminal's renderables for one report table, `width` columns wide at most.

    Each column is as wide as its widest cell or its header's longest word, so a header wraps at
    its spaces and no word or cell is ever split; room left over widens the columns whose header
    then fits on fewer lines. Columns that do not fit fold into further tables ("continued"), each
    repeating the first `repeat` columns (the row's keys); report.md keeps every table whole.
    """
    from rich.cells import cell_len
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    repeat = max(1, min(repeat, len(headers)))
    widths = [
        max([cell_len(word) for word in header.split()] + [cell_len(row[i]) for row in rows] + [1])
        for i, header in enumerate(headers)
    ]
    keys = list(range(repeat))
    base = _TABLE_EDGE + sum(widths[i] + _COLUMN_FRAME for i in keys)
    groups, group, used = [], list(keys), base
    for i in range(repeat, len(headers)):
        if used + widths[i] + _COLUMN_FRAME > width and len(group) > repeat:
            groups.append(group)
            group, used = list(keys), base
        group.append(i)
        used += widths[i] + _COLUMN_FRAME
    groups.append(group)
    shown = []
    for n, columns in enumerate(groups):
        spare = width - _TABLE_EDGE - sum(widths[i] + _COLUMN_FRAME for i in columns)
        fitted = {i: widths[i] for i in columns}
        for i in sorted(columns, key=lambda i: cell_len(headers[i]) - widths[i]):  # cheapest first
            grow = cell_len(headers[i]) - widths[i]
            if 0 < grow <= spare:
                fitted[i], spare = widths[i] + grow, spare - grow
        table = Table(header_style="bold")
        for i in columns:
            table.add_column(
                headers[i], justify="left" if _left(i, headers[i]) else "right", width=fitted[i], overflow="fold"
            )
        for row in rows:
            table.add_row(*(row[i] for i in columns))
        shown.append(Group(Text(title if n == 0 else f"{title} (continued)", style="italic"), table))
    return shown


# ---------------------------------------------------------------------------- the report


def _parts_columns(keys) -> list[tuple]:
    return _key_columns(keys) + [
        ("waiting_pct", "waiting for the slowest rank (% of step)", _num(".1f")),
        ("transfer_pct", "transfer (% of step)", _num(".1f")),
        ("interference_pct", "interference: A/B beyond exposed (% of step)", _num(".1f")),
        ("straggler_rank", "straggler (rank)", _text),
        ("straggler_share", "of steps", _num(".0%")),
    ]


WHO_WAITS_COLUMNS = [
    ("rank", "rank", _text),
    ("step_s", "step (ms)", _num(".2f", 1e3)),
    ("exposed_comm_s", "exposed comm (ms)", _num(".2f", 1e3)),
    ("waiting_s", "waiting (ms)", _num(".2f", 1e3)),
    ("transfer_s", "transfer (ms)", _num(".2f", 1e3)),
    ("straggler_share", "straggler in (% of steps)", _num(".0%")),
]


def _figures(table, curves, spread, target, bandwidth) -> dict:
    """stem -> drawing function and what it draws, in report.md's order (each function carries its
    heading and caption, scaling/plots/figures.py)."""
    from scaling.plots import figures as fg

    figures = {
        "speedup": (fg.speedup_figure, table),
        "throughput_vs_tta": (fg.throughput_vs_tta_figure, table),
        "comm_overhead": (fg.comm_overhead_figure, table),
        "step_breakdown": (fg.step_breakdown_figure, table),
        "accuracy_curves": (fg.accuracy_curves_figure, curves, target),
        "roofline": (fg.roofline_figure, table),
        "tta_spread": (fg.tta_spread_figure, spread),
    }
    if _any(table, "peak_memory_bytes"):  # beside the speedup, where the runs recorded their peak memory
        figures = {"speedup": figures.pop("speedup"), "memory": (fg.memory_figure, table), **figures}
    if not bandwidth.empty:  # a minicluster sweep over link caps
        figures["comm_vs_bandwidth"] = (fg.comm_vs_bandwidth_figure, bandwidth)
    return figures


def _run_dir_of(dirs: list[Path], run: pd.Series) -> RunDir:
    """A run of the sweep: its run_dir is relative to the sweep directory (merged sweeps: already whole)."""
    path = Path(str(run["run_dir"]))
    return RunDir(path if len(dirs) > 1 else dirs[0] / path)


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

    what = ", ".join(
        filter(
            None,
            [
                each("model") and f"model {each('model')}",
                each("dataset") and f"data {each('dataset')}",
                each("backend") and f"backend {each('backend')}",
                each("launcher") and f"launcher {each('launcher')}",
                each("cluster") and f"cluster {each('cluster')}",
            ],
        )
    )
    machine = ", ".join(
        filter(
            None,
            [
                _first(runs, "hardware.cpu_model"),
                _first(runs, "hardware.gpu_name") and f"GPU {_first(runs, 'hardware.gpu_name')}",
            ],
        )
    )
    target_text = f"accuracy {target:.0%}" if target is not None else "accuracy ?"
    losses = runs["target_loss"].dropna() if "target_loss" in runs.columns else pd.Series(dtype=float)
    if not losses.empty and "target_metric" in runs.columns and (runs["target_metric"] == "val_loss").all():
        target_text = f"validation loss {float(losses.mode().iloc[0]):g}"  # reached at or below it
    return [
        (f"Sweep directory `{dirs[0]}`" if len(dirs) == 1 else "Sweep directories " + ", ".join(f"`{d}`" for d in dirs))
        + (f": {what}." if what else "."),
        f"{len(runs)} runs with a summary: {len(runs) - failed} finished ({reached} reached the target "
        f"{target_text}), {failed} failed; {len(incomplete)} incomplete."
        + (f" Machine (rank 0): {machine}." if machine else ""),
        "Every figure is defined once in `scaling/analysis/scaling_tables.py` (per run: `docs/results.md`).",
    ]


TERMINAL_RUN_ROWS = 40  # the terminal's Runs table stops here (report.md lists every run)


def _why_section(runs: pd.DataFrame, largest: RunDir | None, console) -> list[str]:
    """The report's first section: `scaling why`'s verdict on the sweep (scaling/why.py), printed and as
    markdown; a line saying why there is none where the sweep has no multi-worker run to explain."""
    from rich.markup import escape

    from scaling.why import render, verdict

    lines = ["## Why it scales as it does", ""]
    if largest is None:
        return lines + ["No finished run with more than one worker: nothing to explain.", ""]
    try:
        said = render(verdict(runs, largest, largest.path.parent.parent))
    except UsageError as exc:
        return lines + [f"Not explained: {exc}", ""]
    for line in said:
        console.print(escape(line), soft_wrap=True)
    return lines + ["```", *said, "```", "", 'Causes, figures and fixes: docs/method.md, "Why it scales".', ""]


def _figures_section(drawn: dict, figures: bool, projected: pd.DataFrame, projection_notes: list[str]) -> list[str]:
    """report.md's figures: each drawn figure with its heading and caption, and what the projection's marks are."""
    md = ["## Figures", ""]
    md += ["Each figure is also written as SVG beside the PNG.", ""] if figures else ["Not drawn (`--no-figures`).", ""]
    if figures and not projected.empty:
        md += [
            "Dotted lines with crosses are projections of the α–β model (scaling/projection/overlay.py) "
            "at the measured worker counts, from each series' smallest-worker run:",
            "",
            *[f"- {note}" for note in projection_notes],
            "",
        ]
    for stem, (draw, *_) in drawn.items():
        md += [f"### {draw.heading}", "", f"![{draw.heading}]({stem}.png)", "", draw.caption, ""]
    return md


def _tables_section(sections: list, keys: list, console) -> list[str]:
    """Each table printed on the terminal (folded to its width, the runs' table cut short) and, whole, in
    report.md's lines returned."""
    md = ["## Tables", ""]
    key_headers = {header for _, header, _ in _key_columns(keys)}  # repeated in each part of a folded table
    for title, columns, frame in sections:
        headers, rows = _cells(frame, columns)
        shown = rows
        if title == "Runs" and len(rows) > TERMINAL_RUN_ROWS:
            shown = rows[:TERMINAL_RUN_ROWS]
            title_shown = f"{title} (first {TERMINAL_RUN_ROWS} of {len(rows)}; all in report.md)"
        else:
            title_shown = title
        repeat = sum(1 for _ in itertools.takewhile(lambda h: h in key_headers, headers))
        for rich_table in _rich_tables(title_shown, headers, shown, console.width, repeat):
            console.print(rich_table)
        md += [f"### {title}", "", _markdown_table(headers, rows), ""]
    return md


def write_report(
    sweep_dirs, console=None, out: str | os.PathLike | None = None, warnings_console=None, figures: bool = True
) -> Path:
    """Print the tables and write the report directory (report.md and the figures); returns report.md's path.

    sweep_dirs: one sweep directory (the report goes to SWEEP/report/) or several, merged into
    one report (scaling.results.read_sweeps), which then needs `out`. The tables and claims go to
    `console` (stdout by default), the warnings to `warnings_console` (stderr by default), so a
    piped report holds only the report. `figures=False` (`scaling report --no-figures`): the tables only,
    without the figures, whose drawing is most of a report's time.
    """
    from rich.console import Console
    from rich.markup import escape

    from scaling.plots.figures import save
    from scaling.projection.overlay import add_projection, project_sweep

    console = console if console is not None else Console()
    warnings_console = warnings_console if warnings_console is not None else Console(stderr=True)
    dirs = [Path(d) for d in sweep_dirs] if isinstance(sweep_dirs, (list, tuple)) else [Path(sweep_dirs)]
    if len(dirs) > 1 and out is None:
        raise UsageError("several sweep directories make one report: say where it goes with --out DIR")
    sweep = read_sweeps(dirs)
    runs, epochs = sweep.runs, sweep.epochs
    warnings = [*sweep.warnings, *st.left_out_of_figures(runs), *st.measurement_caveats(runs)]

    keys = st.group_keys(runs)
    table = st.per_worker_count(runs, keys)
    projected, projection_notes, projection_warnings = project_sweep(
        st.prepare_runs(runs), keys, lambda run: _run_dir_of(dirs, run)
    )
    warnings += projection_warnings
    table = add_projection(table, projected, keys)
    intervals = iv.scaling_intervals(st.prepare_runs(runs), table)
    for column in intervals.columns:  # the intervals and verdicts beside each figure (same rows, same order)
        if column.endswith(("_lo", "_hi")) or column.startswith(("verdict_", "repeats_needed_")):
            table[column] = intervals[column].to_numpy()
    table["gap_tta_vs_throughput"] = intervals["gap_tta_vs_throughput"].to_numpy()
    intervals.attrs["group_by"] = tuple(keys)
    for warning in warnings:
        warnings_console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    curve_keys = [k for k in keys if k in epochs.columns]
    curves = st.accuracy_curves(epochs, curve_keys)
    spread = st.tta_spread(runs, keys)
    tradeoff = st.batch_tradeoff(runs)
    target = st.target_accuracy(runs)

    parts = at.parts_per_worker_count(runs, keys)
    largest = at.largest_run(runs)
    ranks = at.who_waits(_run_dir_of(dirs, largest).ranks()) if largest is not None else at.who_waits(pd.DataFrame())

    out = Path(out) if out is not None else SweepDir(dirs[0]).report_path
    out.mkdir(parents=True, exist_ok=True)
    drawn = _figures(table, curves, spread, target, st.bandwidth_series(table)) if figures else {}
    if figures and not ranks.empty:
        from scaling.plots.figures import who_waits_figure

        drawn["who_waits"] = (
            who_waits_figure,
            ranks,
            f"{largest['run_key']} ({int(largest['num_workers'])} workers)",
        )
    for stem, (draw, *data) in drawn.items():
        save(draw(*data), out / stem)

    sections = [
        (
            "Scaling: time per epoch, throughput and TTA (speedup over the smallest worker count)",
            _scaling_columns(keys),
            table,
        ),
        ("Uncertainty: 95% intervals over repeats (bootstrap over runs)", _interval_columns(keys), table),
        ("Time to accuracy over repeats", _tta_columns(keys), table),
        ("Communication and step time", _comm_columns(keys, table), table),
        ("Hardware utilisation (model FLOPs)", _utilisation_columns(keys), table),
    ]
    if not parts.empty:
        sections.append(
            (
                "Why communication costs what it does: waiting, transfer, interference (medians over runs)",
                _parts_columns(keys),
                parts,
            )
        )
    if not ranks.empty:
        sections.append(
            (
                f"Who waits for whom: {largest['run_key']} ({int(largest['num_workers'])} workers)",
                WHO_WAITS_COLUMNS,
                ranks,
            )
        )
    if not projected.empty:
        sections.append(
            (
                "Measured against projected (α–β model, scaling/projection)",
                _projection_columns(keys),
                table[table["projected_step_s"].notna()],
            )
        )
    if not tradeoff.empty:
        sections.append(("Batch-size trade-off (global batch)", BATCH_COLUMNS, tradeoff))
    sections.append(("Runs", _run_columns(runs), runs.sort_values(["num_workers", "run_key"])))

    name = _first(runs, "name") or dirs[0].name
    title = f"# Sweep report: {name}" if len(dirs) == 1 else f"# Sweep report: {', '.join(d.name for d in dirs)}"
    md = [title, "", *_header(dirs, runs, sweep.incomplete, target), ""]
    md += _why_section(runs, _run_dir_of(dirs, largest) if largest is not None else None, console)
    if warnings:
        md += ["## Warnings", "", *[f"- {w}" for w in warnings], ""]
    claims = headline_claims(intervals)
    if claims:
        md += [
            "## What the data supports",
            "",
            *[f"- {c}" for c in claims],
            "",
            "Intervals: 95%, percentile bootstrap over the runs of each worker count "
            "(scaling/analysis/intervals.py); with 2–3 repeats they are at best the observed range, "
            'so read "repeats for ±5%" in the uncertainty table before trusting a narrow one.',
            "",
        ]
        for claim in claims:
            console.print(f"[bold]{escape(claim)}[/bold]")
    md += _figures_section(drawn, figures, projected, projection_notes)
    md += _tables_section(sections, keys, console)
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
