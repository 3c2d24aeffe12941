"""The projection's figure: projected speedup and communication overhead against workers.

    from scaling.plots.figures import save
    fig = projection_figure(run_projection(...)); save(fig, "proj")      # proj.png (200 dpi) + proj.svg

Drawn from `scaling.projection.run_projection`'s table (`scaling project --out`), with
matplotlib's object API (no pyplot, no global backend), in the lab's style: the rc STYLE, axes
(`style_axes`), worker axis (`worker_axis`, `use_log`), colours and the ideal line come from
scaling/plots/figures.py. Projected curves over a sweep's measured points are drawn by the
report (scaling/projection/overlay.py computes them, scaling/plots/figures.py draws them).
"""

from __future__ import annotations

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from scaling.plots.figures import (
    COMM_AB_COLOUR,
    COMM_EXPOSED_COLOUR,
    COMM_IN_FLIGHT_COLOUR,
    IDEAL,
    METRIC_COLOUR,
    STYLE,
    style_axes,
    use_log,
    worker_axis,
)

# The lab's colours (Okabe-Ito): throughput orange, TTA green, exposed communication vermillion
THROUGHPUT = dict(color=METRIC_COLOUR["throughput"], linestyle="-", linewidth=2.0, marker="s", markersize=5)
TTA = dict(color=METRIC_COLOUR["tta"], linestyle="-", linewidth=1.6, marker="^", markersize=6)
# the three communication figures, as the report draws them (scaling/plots/figures.py)
COMM_LINES = (
    (
        "allreduce_pct",
        "communicating: all-reduce in flight",
        dict(color=COMM_IN_FLIGHT_COLOUR, linestyle=":", marker="^"),
    ),
    (
        "comm_overhead_pct",
        "comm overhead A/B (exposed + interference)",
        dict(color=COMM_AB_COLOUR, linestyle="-", marker="o"),
    ),
    ("exposed_comm_pct", "exposed communication", dict(color=COMM_EXPOSED_COLOUR, linestyle="--", marker="s")),
)
GPUS = "GPUs (data-parallel workers)"


def projection_title(df: pd.DataFrame) -> str:
    a = df.attrs
    if not a:
        return "Projected scaling"
    # a sharded projection's collectives are NCCL's ring all-gathers and reduce-scatters, not the cluster's all-reduce
    collectives = "ring all-gather, reduce-scatter" if a.get("sharded") else f"{a.get('allreduce')} all-reduce"
    return (
        f"Projected: {a.get('model')} on {a.get('cluster')} ({collectives}), "
        f"{a.get('precision')}, batch {a.get('per_gpu_batch')}/GPU"
    )


def projection_figure(df: pd.DataFrame, title: str | None = None) -> Figure:
    """Left: throughput (and TTA) speedup over 1 GPU with the ideal line; right: the three communication figures."""
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(8.0, 3.8), layout="constrained")
        left, right = fig.subplots(1, 2)
        for ax in (left, right):
            style_axes(ax)
        df = df.sort_values("num_workers")
        n = df["num_workers"].to_numpy(dtype=float)
        log = use_log(n)
        left.plot(n, n, label="ideal (linear)", zorder=1, **IDEAL)
        left.plot(n, df["speedup_throughput"], label="throughput (efficiency %)", zorder=3, **THROUGHPUT)
        for x, y, e in zip(n, df["speedup_throughput"], df["efficiency_throughput"]):
            if x > 1:
                left.annotate(
                    f"{100 * e:.0f}%",
                    (x, y),
                    xytext=(4, -10),
                    textcoords="offset points",
                    fontsize=7,
                    color=THROUGHPUT["color"],
                )
        if "speedup_tta" in df.columns and df["speedup_tta"].notna().any():
            left.plot(n, df["speedup_tta"], label="TTA", zorder=3, **TTA)
            extrapolated = df[df["epochs_extrapolated"]]
            if not extrapolated.empty:
                left.scatter(
                    extrapolated["num_workers"],
                    extrapolated["speedup_tta"],
                    s=70,
                    facecolors="none",
                    edgecolors=TTA["color"],
                    linewidths=1.0,
                    label="TTA (epochs extrapolated)",
                    zorder=4,
                )
        if log:
            left.set_yscale("log", base=2)
            left.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        else:
            left.set_ylim(bottom=0)
        worker_axis(left, n, log, label=GPUS)
        left.set_ylabel("speedup over 1 GPU (×)")
        left.set_title("Speedup", fontsize=9)
        left.legend(loc="upper left")

        sharded = bool(df.attrs.get("sharded"))
        for column, label, line in COMM_LINES:
            if sharded and column == "allreduce_pct":  # the same figure: time with a collective in flight
                label = "communicating: all-gather or reduce-scatter in flight"
            right.plot(n, df[column], label=label, linewidth=1.8, markersize=5, **line)
        highest = float(df[[c for c, _, _ in COMM_LINES]].max().max())
        right.set_ylim(0, max(5.0, highest * 1.15))
        right.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}%"))
        worker_axis(right, n, log, label=GPUS)
        right.set_ylabel("share of step time")
        right.set_title("Communication: three figures", fontsize=9)
        right.legend(loc="upper left")
        fig.suptitle(title or projection_title(df), fontweight="bold", fontsize=10)
    return fig
