"""The sweep's figures, drawn only from `scaling.analysis.scaling_tables` outputs.

    table = per_worker_count(runs, default_group_by(runs))
    fig = speedup_figure(table); save(fig, Path("report/speedup"))   # speedup.png + speedup.svg

Each function returns a matplotlib `Figure` built without pyplot (rendered by Agg when
saved; no global backend is set, so notebooks still show them inline). What each plotted
figure means is defined in scaling/analysis/scaling_tables.py; what a figure shows, in one
line for a reader, is its caption, given beside the function (`@captioned`: the function's
`heading` and `caption`; report.md prints them under the figure). Sizes and fonts are for
print: about 6.5 x 4 inches, 8-10 pt text, PNG at 200 dpi plus SVG. Colours are the
Okabe-Ito colour-blind-safe palette, one fixed colour per metric and per step phase; worker
counts run along viridis (few -> many); lines also differ by marker and dash so the figures
survive greyscale printing. Worker-count axes carry integer ticks at the counts that were
run (log2 when they span 8x or more). When a table holds more than one series (a sweep axis
besides the worker count) each series gets its own panel and the legend goes below them: the
figures drawn per series share that scaffold (`_per_series`) and draw only a panel's contents.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator, PercentFormatter

from scaling.schema import COLLECTIVE_KINDS
from scaling.analysis.scaling_tables import SPEEDUP_METRICS, group_columns
from scaling.results import write_atomic

DPI = 200
STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "legend.framealpha": 0.9,
    "legend.edgecolor": "#cccccc",
    "lines.linewidth": 1.8,
    "lines.markersize": 6,
    "svg.hashsalt": "scaling",  # stable ids: the same figure gives the same SVG
}
GRID = dict(color="#d9d9d9", linewidth=0.6)

METRIC_LABEL = {"time_per_epoch": "time per epoch", "throughput": "throughput", "tta": "time to accuracy (TTA)"}
METRIC_COLOUR = {"time_per_epoch": "#0072B2", "throughput": "#E69F00", "tta": "#009E73"}
# Time-per-epoch and throughput speedups coincide when every epoch trains the same samples;
# a thin dash-dot line with hollow markers drawn over a thick solid one keeps both visible.
METRIC_LINE = {
    "time_per_epoch": dict(
        color=METRIC_COLOUR["time_per_epoch"],
        linestyle="-.",
        linewidth=1.2,
        marker="o",
        markersize=8,
        markerfacecolor="none",
        markeredgewidth=1.4,
        zorder=4,
    ),
    "throughput": dict(
        color=METRIC_COLOUR["throughput"], linestyle="-", linewidth=2.4, marker="s", markersize=5, zorder=3
    ),
    "tta": dict(color=METRIC_COLOUR["tta"], linestyle="-", linewidth=1.8, marker="^", markersize=6, zorder=3),
}
PHASES = (  # column, legend label, colour: bottom of the stack first
    ("data_s", "data loading", "#999999"),
    ("forward_compute_s", "forward (compute)", "#56B4E9"),
    ("backward_compute_s", "backward (compute)", "#0072B2"),
    ("exposed_comm_s", "exposed communication", "#D55E00"),
    ("optimizer_s", "optimizer", "#F0E442"),
)
COMM_AB_COLOUR, COMM_EXPOSED_COLOUR, COMM_IN_FLIGHT_COLOUR = "#CC79A7", "#D55E00", "#0072B2"
# Time in flight per collective kind (scaling.schema.COLLECTIVE_KINDS): DDP's and Horovod's all-reduce; FSDP's
# all-gathers (backward re-gathers included) and reduce-scatters. A kind without a style of its own gets
# KIND_STYLE_ELSE.
KIND_STYLE = {  # colour, marker
    "allreduce": (COMM_IN_FLIGHT_COLOUR, "^"),
    "allgather": ("#56B4E9", "v"),
    "reducescatter": ("#009E73", "D"),
}
KIND_STYLE_ELSE = ("#777777", "P")
IN_FLIGHT = tuple(  # column, legend label, colour, marker
    (f"{kind}_pct", f"communicating: {name} in flight / t_step", *KIND_STYLE.get(kind, KIND_STYLE_ELSE))
    for kind, name in COLLECTIVE_KINDS.items()
)
# Projected curves (scaling/projection/overlay.py) over measured points: thin, dotted, grey-toned.
PROJECTED_LINE = dict(linestyle=":", linewidth=1.4, marker="x", markersize=6, zorder=5)
IDEAL = dict(color="black", linestyle="--", linewidth=1.0)


# ---------------------------------------------------------------------------- helpers


def captioned(heading: str, caption: str):
    """Give a figure function its heading and its caption: the one line that says what the figure shows."""

    def attach(draw):
        draw.heading, draw.caption = heading, caption
        return draw

    return attach


def _figure(ncols: int, width: float = 6.5, height: float = 4.0) -> tuple[Figure, list]:
    width = max(width, 3.6 * ncols) if ncols > 1 else width
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False, sharey=True)[0]
    for ax in axes:
        style_axes(ax)
    return fig, list(axes)


def style_axes(ax) -> None:
    """The lab's axes: light grid behind the data, small outward ticks, no top or right spine."""
    # Set explicitly (not only through rcParams): ticks are created lazily at draw time,
    # possibly outside the rc_context, e.g. when a notebook displays the figure.
    ax.grid(True, **GRID)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=8, direction="out", length=3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _series(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(panel title, rows) per combination of the group keys other than num_workers."""
    keys = [k for k in group_columns(table) if table[k].nunique(dropna=False) > 1]
    if not keys:
        return [("", table)]
    panels = []
    for values, part in table.groupby(keys, dropna=False, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        panels.append((", ".join(f"{k.removeprefix('sweep.')} = {_fmt_value(v)}" for k, v in zip(keys, values)), part))
    return panels


def _fmt_value(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _workers_label(n) -> str:
    n = int(n)
    return f"{n} worker" if n == 1 else f"{n} workers"


def worker_axis(ax, counts, log: bool, label: str = "workers (data-parallel ranks)") -> None:
    """Integer ticks at the worker counts that were run, nothing in between (log2 if `log`)."""
    counts = sorted({int(c) for c in counts})
    if log:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(counts))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{int(round(x))}"))
    ax.xaxis.set_minor_locator(NullLocator())
    if len(counts) == 1:
        ax.set_xlim(
            counts[0] * (0.5 if log else 1) - (0 if log else 1), counts[0] * (2 if log else 1) + (0 if log else 1)
        )
    ax.set_xlabel(label)


def use_log(counts) -> bool:
    """A log2 worker axis when the counts span 8x or more."""
    counts = [c for c in counts if c > 0]
    return bool(counts) and max(counts) / min(counts) >= 8


def _worker_colours(counts) -> dict:
    """One colour per worker count, ordered along a perceptually uniform map (few -> many)."""
    counts = sorted({int(c) for c in counts})
    cmap = mpl.colormaps["viridis"]
    if len(counts) == 1:
        return {counts[0]: cmap(0.25)}
    return {c: cmap(0.8 * i / (len(counts) - 1)) for i, c in enumerate(counts)}


def _legend(fig: Figure, axes: list, **inside) -> None:
    """One legend: inside the axes for one panel, below all panels (once) for several."""
    handles, labels = {}, []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    if not labels:
        return
    if len(axes) == 1:
        axes[0].legend(**inside)
    else:
        # As many columns as fit the figure's width (about 14 characters of 8 pt text per inch, 6 for the handle).
        fits = int(fig.get_figwidth() * 14 // (max(len(label) for label in labels) + 6))
        fig.legend(
            [handles[label] for label in labels],
            labels,
            loc="outside lower center",
            ncols=max(1, min(len(labels), 4, fits)),
        )


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="#555555")


def _base_label(part: pd.DataFrame) -> str:
    base = part["base_workers"].dropna()
    return _workers_label(base.iloc[0]) if not base.empty else "the smallest worker count"


def _projected(ax, part: pd.DataFrame, column: str, label: str, colour: str) -> bool:
    """Draw a projected column (scaling/projection/overlay.py) if the table has one; True if drawn."""
    if column not in part.columns:
        return False
    values = part[column].to_numpy(dtype=float)
    keep = np.isfinite(values)
    if not keep.any():
        return False
    ax.plot(part["num_workers"].to_numpy(dtype=float)[keep], values[keep], color=colour, label=label, **PROJECTED_LINE)
    return True


# ---------------------------------------------------------------------------- figures


def _yerr(part: pd.DataFrame, column: str, values: np.ndarray) -> np.ndarray | None:
    """Error bars from the 95% interval columns `<column>_lo` / `_hi` (scaling/analysis/intervals.py), if any."""
    if f"{column}_lo" not in part.columns:
        return None
    lo = part[f"{column}_lo"].to_numpy(dtype=float)
    hi = part[f"{column}_hi"].to_numpy(dtype=float)
    err = np.vstack([values - lo, hi - values])
    return np.where(np.isfinite(err), np.clip(err, 0, None), 0.0)


def _errorbars(ax, xs, values, yerr, colour) -> None:
    if yerr is not None and yerr.any():
        ax.errorbar(xs, values, yerr=yerr, fmt="none", ecolor=colour, elinewidth=1.0, capsize=3, zorder=3)


COMM_SHORT_NAMES = {
    **{f"{kind}_pct": f"{name} in flight" for kind, name in COLLECTIVE_KINDS.items()},
    "comm_overhead_pct": "A/B overhead",
    "exposed_comm_pct": "exposed",
}
COINCIDE = 0.015  # markers closer than this share of the y axis would hide one another


def _dodge(ax, xs: np.ndarray, ys: np.ndarray, name: str, placed: list, y_top: float, log: bool) -> np.ndarray:
    """Where a point would sit on a marker already drawn (two figures with the same value, e.g. time
    communicating and exposed communication when backward hides nothing), move it a little to the right
    and say on the plot which figures coincide, so that every series stays visible; `placed` collects
    (x, y, name) of the markers drawn so far. Returns the x positions to draw at."""
    shifted = xs.astype(float).copy()
    for i, (x, y) in enumerate(zip(xs, ys)):
        same = [other for px, py, other in placed if px == x and abs(py - y) <= COINCIDE * y_top]
        if same:
            shifted[i] = x * 2 ** (0.05 * len(same)) if log else x + 0.04 * len(same) * max(1.0, xs.max() - xs.min())
            if y != 0:  # at 0 (one worker) every figure is 0 by definition: the markers suffice
                ax.annotate(
                    f"{name} = {same[0]}: {y:.1f} %",
                    (shifted[i], y),
                    xytext=(6, -10),
                    textcoords="offset points",
                    fontsize=7,
                    color="#444444",
                )
        placed.append((x, y, name))
    return shifted


def _per_series(
    table: pd.DataFrame, draw, *, title: str, ylabel: str, legend="upper left", width: float = 6.5
) -> Figure:
    """The scaffold every per-series figure shares: one panel per series of `table` (`_series`: a
    sweep axis besides the worker count; the panels share y), each drawn by `draw(ax, rows)` and
    titled with its series; one legend (`legend`: where `_legend` puts it inside a single panel,
    or a function of (fig, axes) that places its own); the y label on the first panel; the title."""
    with mpl.rc_context(STYLE):
        panels = _series(table)
        fig, axes = _figure(len(panels), width=width)
        for ax, (series, rows) in zip(axes, panels):
            draw(ax, rows)
            ax.set_title(series, fontsize=9, fontweight="normal")
        if callable(legend):
            legend(fig, axes)
        else:
            _legend(fig, axes, loc=legend)
        axes[0].set_ylabel(ylabel)
        fig.suptitle(title, fontweight="bold", fontsize=10)
    return fig


@captioned(
    "Speedup",
    "Speedup over the smallest worker count: time per epoch(base) / time per epoch(N), throughput(N) / "
    "throughput(base) and mean TTA(base) / mean TTA(N); the dashed line is ideal linear scaling, N / N_base.",
)
def speedup_figure(table: pd.DataFrame) -> Figure:
    """Speedup vs workers for time per epoch, throughput and TTA, with the ideal linear line and 95% intervals."""
    log = use_log(table["num_workers"])

    def draw(ax, part):
        part = part.sort_values("num_workers")
        counts = part["num_workers"].to_numpy(dtype=float)
        base = part["base_workers"].dropna()
        if not base.empty:
            xs = counts[counts >= base.iloc[0]]
            ax.plot(xs, xs / base.iloc[0], label="ideal (linear)", zorder=1, **IDEAL)
        missing = []
        for metric in SPEEDUP_METRICS:
            values = part[f"speedup_{metric}"].to_numpy(dtype=float)
            keep = np.isfinite(values)
            if not keep.any():
                missing.append(METRIC_LABEL[metric])
                continue
            ax.plot(counts[keep], values[keep], label=METRIC_LABEL[metric], **METRIC_LINE[metric])
            yerr = _yerr(part, f"speedup_{metric}", values)
            _errorbars(
                ax,
                counts[keep],
                values[keep],
                yerr[:, keep] if yerr is not None else None,
                METRIC_LINE[metric].get("color", METRIC_COLOUR[metric]),
            )
        label = "throughput, projected (α–β model)"
        _projected(ax, part, "projected_speedup_throughput", label, METRIC_COLOUR["throughput"])
        if log:
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        else:
            ax.set_ylim(bottom=0)
        worker_axis(ax, counts, log)
        if missing:
            ax.text(
                0.98,
                0.03,
                "no data: " + ", ".join(missing),
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                fontsize=7.5,
                color="#555555",
            )

    return _per_series(
        table, draw, title="Speedup vs. number of workers", ylabel=f"speedup over {_base_label(table)} (×)"
    )


@captioned(
    "Communication overhead",
    "Three figures, medians over repeats, each a share of the step time: time communicating, per collective "
    "kind (an all-reduce in flight for DDP and Horovod; an all-gather of parameters, backward re-gathers "
    "included, and a reduce-scatter of gradients for FSDP; hidden or not: the DAWNBench analysis' "
    '"communication overhead"), the A/B communication overhead, (t_sync − t_no_sync) / t_step (FSDP\'s '
    "removes the reduce-scatters, not the all-gathers), and the exposed communication (what compute "
    "waited for). Where two figures have the same value (time communicating equals exposed communication "
    "when backward hides none of it), the later marker sits a little to the right and the plot names the "
    "figures that coincide.",
)
def comm_overhead_figure(table: pd.DataFrame) -> Figure:
    """Time communicating, communication overhead (A/B, headline) and exposed communication, % of step time."""
    log = use_log(table["num_workers"])
    # The panels share y: one limit over every panel's values, at least 0-5 % (an all-zero sweep stays readable).
    values = table[
        [
            c
            for c in (
                *(kind[0] for kind in IN_FLIGHT),
                "comm_overhead_pct",
                "exposed_comm_pct",
                "projected_comm_overhead_pct",
                "projected_allreduce_pct",
            )
            if c in table.columns
        ]
    ].to_numpy(dtype=float)
    highest = np.nanmax(values) if np.isfinite(values).any() else 0.0

    top = max(5.0, highest * 1.15)

    def draw(ax, part):
        part = part.sort_values("num_workers")
        counts = part["num_workers"].to_numpy(dtype=float)
        drawn = False
        placed: list[tuple[float, float, str]] = []  # (workers, value, short name) of every marker drawn so far
        for column, label, colour, marker, style in (
            *((column, label, colour, marker, ":") for column, label, colour, marker in IN_FLIGHT),
            ("comm_overhead_pct", "comm overhead, A/B: (t_sync − t_no_sync) / t_step", COMM_AB_COLOUR, "o", "-"),
            ("exposed_comm_pct", "exposed communication / t_step", COMM_EXPOSED_COLOUR, "s", "--"),
        ):
            if column not in part.columns:
                continue
            values = part[column].to_numpy(dtype=float)
            keep = np.isfinite(values)
            if keep.any():
                xs = _dodge(ax, counts[keep], values[keep], COMM_SHORT_NAMES[column], placed, top, log)
                ax.plot(xs, values[keep], marker=marker, linestyle=style, color=colour, label=label)
                yerr = _yerr(part, column, values)
                _errorbars(ax, xs, values[keep], yerr[:, keep] if yerr is not None else None, colour)
                drawn = True
        drawn = (
            _projected(ax, part, "projected_comm_overhead_pct", "comm overhead A/B, projected (model)", COMM_AB_COLOUR)
            or drawn
        )
        drawn = (
            _projected(ax, part, "projected_allreduce_pct", "communicating, projected (model)", COMM_IN_FLIGHT_COLOUR)
            or drawn
        )
        if not drawn:
            _no_data(ax, "no communication figures")
        worker_axis(ax, counts, log)
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
        ax.set_ylim(0, top)

    return _per_series(
        table,
        draw,
        title="Communication overhead vs. number of workers",
        ylabel="share of step time (%, median over repeats, 95% interval)",
    )


@captioned(
    "Peak memory per rank",
    "Peak memory of a rank over an epoch's training (the largest over the run's epochs; median over repeats), "
    "the largest rank's (solid) and the smallest rank's (dotted), per series: what sharding saves. On a GPU "
    "the tensors' max allocated; on a CPU the process's resident high-water mark, interpreter and libraries "
    "included (scaling/instrument/memory.py).",
)
def memory_figure(table: pd.DataFrame) -> Figure:
    """Peak memory per rank against the worker count, every series on one panel (DDP beside FSDP)."""
    log = use_log(table["num_workers"])
    with mpl.rc_context(STYLE):
        fig, axes = _figure(1)
        ax = axes[0]
        keys = [k for k in group_columns(table) if table[k].nunique(dropna=False) > 1]
        parts = (
            [
                (", ".join(_fmt_value(v) for v in (values if isinstance(values, tuple) else (values,))), part)
                for values, part in table.groupby(keys, dropna=False, sort=True)
            ]
            if keys
            else [("", table)]
        )
        colours = mpl.colormaps["tab10"]
        drawn = False
        for i, (series, part) in enumerate(parts):
            part = part.sort_values("num_workers")
            counts = part["num_workers"].to_numpy(dtype=float)
            for column, style, what in (
                ("peak_memory_bytes", "-", "largest rank"),
                ("peak_memory_min_bytes", ":", "smallest rank"),
            ):
                if column not in part.columns:
                    continue
                values = part[column].to_numpy(dtype=float) / 2**20
                keep = np.isfinite(values)
                if keep.any():
                    label = f"{series}: {what}" if series else what
                    ax.plot(
                        counts[keep],
                        values[keep],
                        linestyle=style,
                        marker="os"[i % 2],
                        color=colours(i % 10),
                        label=label,
                    )
                    drawn = True
        if not drawn:
            _no_data(ax, "no peak memory recorded")
        worker_axis(ax, table["num_workers"], log)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("peak memory per rank (MiB)")
        _legend(fig, axes, loc="lower left")
        fig.suptitle("Peak memory per rank vs. number of workers", fontweight="bold", fontsize=10)
    return fig


@captioned(
    "Step breakdown",
    "Mean time of a steady-state training step per worker count, split into data loading, forward compute, "
    "backward compute, exposed communication (what compute waited for, in backward or, for FSDP's "
    "all-gathers, in forward) and optimizer (ms; the label is the whole step).",
)
def step_breakdown_figure(table: pd.DataFrame) -> Figure:
    """Stacked bars per worker count: data, forward, backward compute, exposed communication, optimizer (ms/step)."""

    def draw(ax, part):
        part = part.sort_values("num_workers")
        positions = np.arange(len(part))
        bottom = np.zeros(len(part))
        for column, label, colour in PHASES:
            if column not in part.columns:  # a table made before forward's exposed part was split off
                column = {"forward_compute_s": "forward_s"}.get(column, column)
            values = np.nan_to_num(part[column].to_numpy(dtype=float) * 1e3)
            ax.bar(positions, values, 0.6, bottom=bottom, color=colour, edgecolor="#333333", linewidth=0.5, label=label)
            bottom += values
        for x, total in zip(positions, bottom):
            if total > 0:
                ax.annotate(
                    f"{total:.1f}",
                    (x, total),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7.5,
                )
        ax.set_xticks(positions, [str(int(n)) for n in part["num_workers"]])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(False, axis="x")
        ax.set_xlabel("workers (data-parallel ranks)")
        ax.margins(y=0.1)
        if not bottom.any():
            _no_data(ax, "no step records")

    def legend(fig, axes):  # the stack's order, top phase first, right of the last panel
        handles, labels = axes[0].get_legend_handles_labels()
        axes[-1].legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)

    return _per_series(
        table,
        draw,
        title="Where a training step's time goes",
        ylabel="time per step (ms, mean over repeats)",
        legend=legend,
        width=7.0,
    )


@captioned(
    "Accuracy curves",
    "Validation top-1 accuracy after each epoch: mean over repeats (line) and min–max (band); runs stop "
    "at the target (dashed), so later epochs hold only the slower repeats.",
)
def accuracy_curves_figure(curves: pd.DataFrame, target_accuracy: float | None = None) -> Figure:
    """Validation accuracy per epoch: mean line and min–max band over repeats, one colour per worker count."""
    colours = _worker_colours(curves["num_workers"]) if not curves.empty else {}

    def draw(ax, part):
        for n, rows in part.groupby("num_workers", sort=True):
            rows = rows.sort_values("epoch")
            epoch = rows["epoch"].to_numpy(dtype=float)
            colour = colours[int(n)]
            ax.fill_between(
                epoch,
                rows["val_accuracy_min"] * 100,
                rows["val_accuracy_max"] * 100,
                color=colour,
                alpha=0.18,
                linewidth=0,
            )
            repeats = int(rows["n_runs"].max())
            ax.plot(
                epoch,
                rows["val_accuracy_mean"] * 100,
                marker="o",
                markersize=3.5,
                color=colour,
                label=f"{_workers_label(n)} (n = {repeats})",
            )
        if target_accuracy is not None:
            ax.axhline(
                target_accuracy * 100,
                color="black",
                linestyle="--",
                linewidth=1.0,
                label=f"target {target_accuracy:.0%}",
            )
        if part.empty:
            _no_data(ax, "no validation accuracy recorded")
            ax.set_xlim(0.5, 2.5)
            ax.set_ylim(0, 100)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))

    return _per_series(
        curves,
        draw,
        title="Validation accuracy per epoch (line: mean, band: min–max over repeats)",
        ylabel="validation accuracy (top-1, %)",
        legend="lower right",
    )


@captioned(
    "Throughput speedup vs. TTA speedup",
    "The same throughput and TTA speedups side by side per worker count; the gap is the extra epochs a "
    "larger global batch needs to reach the target (black line: ideal; purple dots, where the baseline measured a "
    "gradient noise scale: the TTA speedup the samples-to-target model expects from the batch alone).",
)
def throughput_vs_tta_figure(table: pd.DataFrame) -> Figure:
    """Throughput speedup beside TTA speedup per worker count (grouped bars), with the ideal."""
    width = 0.36
    one_panel = len(_series(table)) == 1

    def draw(ax, part):
        part = part.sort_values("num_workers")
        positions = np.arange(len(part))
        labelled = one_panel and len(part) <= 6  # value labels only where they fit; the table has them all
        both = part[["speedup_throughput", "speedup_tta"]].to_numpy(dtype=float)
        top = np.nanmax(both) if np.isfinite(both).any() else 1.0
        for offset, metric in ((-width / 2, "throughput"), (width / 2, "tta")):
            values = part[f"speedup_{metric}"].to_numpy(dtype=float)
            yerr = _yerr(part, f"speedup_{metric}", values)
            bars = ax.bar(
                positions + offset,
                np.nan_to_num(values),
                width,
                color=METRIC_COLOUR[metric],
                edgecolor="#333333",
                linewidth=0.5,
                label=f"{METRIC_LABEL[metric]} speedup",
                yerr=yerr,
                error_kw={"elinewidth": 1.0, "capsize": 3, "ecolor": "#222222"},
            )
            for bar, value in zip(bars, values if labelled else []):
                # inside the bar's top, clear of the ideal mark above it; above a bar too short to hold it
                x = bar.get_x() + bar.get_width() / 2
                if not math.isfinite(value):
                    ax.annotate(
                        "n/a", (x, 0), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7
                    )
                elif value > 0.12 * top:
                    ax.annotate(
                        f"{value:.2f}×",
                        (x, value),
                        xytext=(0, -3),
                        textcoords="offset points",
                        ha="center",
                        va="top",
                        fontsize=7,
                    )
                else:
                    ax.annotate(
                        f"{value:.2f}×",
                        (x, value),
                        xytext=(0, 2),
                        textcoords="offset points",
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
        ideal = (part["num_workers"] / part["base_workers"]).to_numpy(dtype=float)
        for i, (x, y) in enumerate(zip(positions, ideal)):
            if math.isfinite(y):
                ax.hlines(y, x - width - 0.06, x + width + 0.06, label="ideal (linear)" if i == 0 else None, **IDEAL)
        # the model's TTA speedup: the measured throughput speedup times the gap samples-to-target growth explains
        if "gap_tta_model" in part.columns:
            model = (part["speedup_throughput"] * part["gap_tta_model"]).to_numpy(dtype=float)
            drawn = [(x, y) for x, y in zip(positions, model) if math.isfinite(y)]
            for i, (x, y) in enumerate(drawn):
                label = "TTA speedup, noise-scale model" if i == 0 else None
                ax.hlines(y, x, x + width, colors="#7b3294", linestyles=":", linewidth=2.2, label=label)
        ax.set_xticks(positions, [str(int(n)) for n in part["num_workers"]])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(False, axis="x")
        ax.set_xlabel("workers (data-parallel ranks)")
        ax.margins(y=0.12)
        ax.set_ylim(bottom=0)

    return _per_series(
        table,
        draw,
        title="Throughput speedup vs. time-to-accuracy speedup",
        ylabel=f"speedup over {_base_label(table)} (×)",
    )


@captioned(
    "TTA over repeats",
    "Time to accuracy (training time until the target is reached, by the run's `train.tta_rule`) of every "
    "repeat, its mean ± std, and how many repeats reached the target.",
)
def tta_spread_figure(spread: pd.DataFrame) -> Figure:
    """TTA of every repeat per worker count (points), with mean ± std; how many repeats reached the target."""
    colours = _worker_colours(spread["num_workers"]) if not spread.empty else {}
    reached_any = spread["tta_s"].notna().any()
    top = float(np.nanmax(spread["tta_s"].to_numpy(dtype=float))) if reached_any else 1.0

    def draw(ax, part):
        counts = sorted(int(n) for n in part["num_workers"].unique())
        ticks, labelled = [], False
        for i, n in enumerate(counts):
            rows = part[part["num_workers"] == n]
            tta = rows["tta_s"].dropna().to_numpy(dtype=float)
            # a deterministic spread of the points across the column, so repeats do not hide each other
            jitter = np.linspace(-0.12, 0.12, len(tta)) if len(tta) > 1 else np.zeros(len(tta))
            ax.scatter(
                i + jitter,
                tta,
                s=22,
                color=colours[n],
                edgecolor="white",
                linewidth=0.5,
                zorder=3,
                label="one repeat" if len(tta) and not labelled else None,
            )
            if len(tta) >= 1:
                std = tta.std(ddof=1) if len(tta) >= 2 else 0.0
                ax.errorbar(
                    i + 0.28,
                    tta.mean(),
                    yerr=std,
                    fmt="_",
                    color="black",
                    markersize=12,
                    capsize=3,
                    linewidth=1.0,
                    zorder=4,
                    label=None if labelled else "mean ± std",
                )
                labelled = True
            ticks.append(f"{n}\n{len(tta)}/{len(rows)}")
        ax.set_xticks(range(len(counts)), ticks)
        ax.set_xlim(-0.6, len(counts) - 0.4)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(False, axis="x")
        ax.set_xlabel("workers\n(repeats that reached the target / repeats)")
        ax.set_ylim(bottom=0, top=top * 1.1)
        if not part["tta_s"].notna().any():
            _no_data(ax, "no repeat reached the target")

    return _per_series(
        spread,
        draw,
        title="Time to accuracy over repeated seeds",
        ylabel="time to accuracy (s, training time)",
        legend="lower right",
    )


@captioned(
    "Roofline",
    "Achieved model FLOP/s per worker against the estimated arithmetic intensity of a training step "
    "(FLOPs per byte moved), under the device's roof min(peak FLOP/s, intensity × memory bandwidth); "
    "MFU = achieved / peak.",
)
def roofline_figure(table: pd.DataFrame) -> Figure:
    """Achieved FLOP/s per worker vs. arithmetic intensity, one point per worker count, under the roof."""
    with mpl.rc_context(STYLE):
        fig, (ax,) = _figure(1)
        needed = ("arithmetic_intensity", "achieved_flops_per_s", "peak_flops_per_s", "mem_bytes_per_s")
        points = (
            table.dropna(subset=[c for c in needed if c in table.columns])
            if set(needed) <= set(table.columns)
            else table.iloc[0:0]
        )
        if points.empty:
            _no_data(ax, "no FLOP counts or device roofs in these runs")
            return fig
        peak = float(points["peak_flops_per_s"].median())
        bandwidth = float(points["mem_bytes_per_s"].median())
        ridge = peak / bandwidth
        intensity = points["arithmetic_intensity"].astype(float)
        low = min(intensity.min(), ridge) / 8
        high = max(intensity.max(), ridge) * 8
        xs = np.geomspace(low, high, 200)
        ax.plot(
            xs / 1.0,
            np.minimum(peak, xs * bandwidth) / 1e12,
            color="black",
            linewidth=1.4,
            label=f"roof: {peak / 1e12:.3g} TFLOP/s, {bandwidth / 1e9:.3g} GB/s",
        )
        colours = _worker_colours(points["num_workers"])
        for _, part in _series(points):
            for _, row in part.iterrows():
                n = int(row["num_workers"])
                ax.plot(
                    row["arithmetic_intensity"],
                    row["achieved_flops_per_s"] / 1e12,
                    linestyle="none",
                    marker="o",
                    markersize=7,
                    color=colours[n],
                    markeredgecolor="black",
                    markeredgewidth=0.6,
                    label=f"{_workers_label(n)} (MFU {row['mfu']:.1%})"
                    if pd.notna(row.get("mfu"))
                    else _workers_label(n),
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP per byte moved, estimated)")
        ax.set_ylabel("model FLOP/s per worker (TFLOP/s)")
        ax.set_title("Roofline: achieved model FLOP/s per worker")
        _legend(fig, [ax], loc="lower right")
        return fig


@captioned(
    "Who waits for whom",
    "Per rank of the sweep's largest run: its exposed communication per step split into waiting for the slowest "
    "rank to finish backward compute (no faster network helps) and the transfer once every rank was ready; "
    "the diamonds, right axis, say how often the rank was that slowest rank (the straggler).",
)
def who_waits_figure(ranks: pd.DataFrame, run_label: str = "") -> Figure:
    """Stacked waiting and transfer per rank (ms per step), with each rank's straggler share."""
    with mpl.rc_context(STYLE):
        fig, axes = _figure(1, width=max(6.5, 0.35 * len(ranks) + 3))
        ax = axes[0]
        if ranks.empty:
            _no_data(ax, "no per-rank records (one worker, or step timing off)")
        else:
            positions = np.arange(len(ranks))
            waiting = ranks["waiting_s"].to_numpy(dtype=float) * 1e3
            transfer = ranks["transfer_s"].to_numpy(dtype=float) * 1e3
            ax.bar(
                positions,
                np.nan_to_num(waiting),
                0.7,
                color="#E69F00",
                edgecolor="#333333",
                linewidth=0.5,
                label="waiting for the slowest rank",
            )
            ax.bar(
                positions,
                np.nan_to_num(transfer),
                0.7,
                bottom=np.nan_to_num(waiting),
                color="#D55E00",
                edgecolor="#333333",
                linewidth=0.5,
                label="transfer (all ranks ready)",
            )
            ax.set_xticks(positions, [str(int(r)) for r in ranks["rank"]])
            ax.set_xlabel("rank")
            ax.set_ylabel("exposed communication per step (ms)")
            share = ax.twinx()
            share.plot(
                positions,
                ranks["straggler_share"].to_numpy(dtype=float) * 100,
                color="black",
                marker="D",
                linestyle="none",
                label="straggler (share of steps)",
            )
            share.set_ylim(0, 105)
            share.set_ylabel("steps as the straggler (%)")
            share.yaxis.set_major_formatter(PercentFormatter(decimals=0))
            share.grid(False)
            handles = ax.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0]
            labels = ax.get_legend_handles_labels()[1] + share.get_legend_handles_labels()[1]
            ax.legend(handles, labels, loc="upper left", fontsize=8)
        fig.suptitle(f"Who waits for whom{': ' + run_label if run_label else ''}", fontweight="bold", fontsize=10)
    return fig


@captioned(
    "Communication overhead against link bandwidth",
    "Median A/B communication overhead per worker count at each link cap of the minicluster's nodes "
    "(`workers.link_bandwidth`; tc token-bucket on each node's egress).",
)
def comm_vs_bandwidth_figure(series: pd.DataFrame) -> Figure:
    """Comm overhead % against each node's link bandwidth, one line per worker count (bandwidth_series)."""
    with mpl.rc_context(STYLE):
        fig, (ax,) = _figure(1)
        if series.empty:
            _no_data(ax, "these runs did not vary the link bandwidth")
            return fig
        capped = series["link_bandwidth_bits_per_s"].dropna()
        # Uncapped runs sit at a labelled position right of the fastest cap.
        uncapped_x = (capped.max() if not capped.empty else 1e9) * 4
        colours = _worker_colours(series["num_workers"])
        for n, part in series.groupby("num_workers", sort=True):
            xs = part["link_bandwidth_bits_per_s"].fillna(uncapped_x)
            ax.plot(xs / 1e6, part["comm_overhead_pct"], marker="o", color=colours[int(n)], label=_workers_label(n))
        ticks = sorted(set(capped)) + ([uncapped_x] if series["link_bandwidth_bits_per_s"].isna().any() else [])
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([t / 1e6 for t in ticks]))
        ax.xaxis.set_major_formatter(
            FuncFormatter(
                lambda x, _: (
                    "uncapped"
                    if abs(x - uncapped_x / 1e6) < 1e-9 * uncapped_x
                    else (f"{x / 1e3:g} Gbit/s" if x >= 1e3 else f"{x:g} Mbit/s")
                )
            )
        )
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("link bandwidth per node (tc cap)")
        ax.set_ylabel("comm overhead, A/B (% of step)")
        ax.set_ylim(bottom=0)
        ax.set_title("Communication overhead against link bandwidth")
        _legend(fig, [ax], loc="upper right")
        return fig


# ---------------------------------------------------------------------------- output


def save(fig: Figure, path_without_suffix: Path | str, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    """Write `<path>.png` (200 dpi) and `<path>.svg`, each atomically (scaling.results.write_atomic);
    a .png or .svg suffix on the path is dropped.

    The figure's layout is fixed after the first format: save a figure once, or draw it anew."""
    stem = Path(path_without_suffix)
    if stem.suffix.lower() in (".png", ".svg"):
        stem = stem.with_suffix("")
    written = []
    with mpl.rc_context(STYLE):
        for fmt in formats:
            path = stem.with_name(stem.name + f".{fmt}")
            metadata = {"Date": None} if fmt == "svg" else {"Software": None}
            write_atomic(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DPI, metadata=metadata, facecolor="white"))
            # The first save ran the constrained layout; keep its positions for the other formats
            # rather than solve it again (half the time of a 7-figure report, bench/analysis_speed.py).
            if fig.get_layout_engine() is not None:
                fig.set_layout_engine("none")
            written.append(path)
    return written
