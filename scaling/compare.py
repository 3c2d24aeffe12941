"""`scaling compare A B`: two runs or two sweeps read, compared (scaling/analysis/compare.py), printed.

    table = compare_paths("results/before", "results/after")     # a DataFrame, one row per figure
    print_comparison(table, console)

A path is a run directory (it holds summary.json) or a sweep directory; both sides must be the same
kind. The readers are results.py's; the figures and their intervals are analysis'.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from scaling.analysis import compare
from scaling.errors import UsageError
from scaling.results import RunDir, SweepDir, resolve_sweep_dir

COLUMNS = ["epoch", "step", "kind", "warmup", "rank", "step_s", "exposed_comm_s", "allreduce_s"]


def _kind(path: Path) -> str:
    if RunDir(path).summary_path.exists():
        return "run"
    if not path.exists():
        raise UsageError(f"not found: {path}")
    return "sweep"


def _run(path: Path) -> dict:
    run = RunDir(path)
    batches = list(run.step_batches(COLUMNS))
    steps = pd.concat(batches, ignore_index=True) if batches else pd.DataFrame(columns=COLUMNS)
    return {"summary": run.summary(), "observations": compare.run_observations(steps, run.epochs())}


def compare_paths(a: str | Path, b: str | Path) -> tuple[str, pd.DataFrame]:
    """("run" or "sweep", the comparison table) of B against A; UsageError on paths that are not
    two runs or two sweeps."""
    a, b = resolve_sweep_dir(a), resolve_sweep_dir(b)
    kinds = (_kind(a), _kind(b))
    if kinds[0] != kinds[1]:
        raise UsageError(f"compare two runs or two sweeps: {a} is a {kinds[0]}, {b} a {kinds[1]}")
    if kinds[0] == "run":
        return "run", compare.compare_runs(_run(a), _run(b))
    table = compare.compare_sweeps(SweepDir(a).runs, SweepDir(b).runs)
    if table.empty:
        raise UsageError(f"{a} and {b} share no worker count with finished runs: nothing to compare")
    return "sweep", table


def _number(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.4g}"


def _change(row) -> str:
    if not math.isfinite(row.change_pct):
        return "-"
    if not math.isfinite(row.change_lo_pct):
        return f"{row.change_pct:+.1f}%"
    return f"{row.change_pct:+.1f}% [{row.change_lo_pct:+.1f}, {row.change_hi_pct:+.1f}]"


def print_comparison(table: pd.DataFrame, console, a: str, b: str) -> None:
    from rich.table import Table

    shown = Table(title=f"B = {b} against A = {a} (95% intervals)", title_justify="left")
    points = bool(table["point"].astype(bool).any())  # sweeps: per worker count
    headers = ("point", "figure", "A", "B", "change [95%]", "verdict")
    for header in headers if points else headers[1:]:
        shown.add_column(header, justify="right" if header in ("A", "B", "change [95%]") else "left")
    colours = {"worse": "red", "better": "green"}
    for row in table.itertuples():
        verdict = f"[{colours[row.verdict]}]{row.verdict}[/]" if row.verdict in colours else row.verdict
        cells = (row.figure, _number(row.a), _number(row.b), _change(row), verdict)
        shown.add_row(*((row.point, *cells) if points else cells))
    console.print(shown)
