"""What the `scaling` commands print and write for a person: a run's one-screen summary, a projection's
table and its files. The command line (scaling/cli.py) parses and dispatches; each command hands its
result here.

    print_summary(summary, run_dir)        # `scaling run`: what ran, the target, where the time went
    print_projection(df)                   # `scaling project --model ...`
    print_run_projection(df)               # `scaling project RUN_DIR`
    write_projection(df, rows, out)        # DIR/projection.png, .svg and .json

Tables keep the terminal's width on a terminal and are never folded in a log, a pipe or CI.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

from scaling.errors import UsageError

# rich takes a pipe or a file for 80 columns and folds every wider table row over several lines;
# a log, a pipe or CI gets rows of their natural width instead (the widest report table: ~220).
UNFOLDED_WIDTH = 10_000


def output_console():
    """rich's console for stdout: a terminal's own width; a log, a pipe or CI: rows never folded."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=UNFOLDED_WIDTH)


def ms(s: float) -> str:
    return "-" if s is None or not math.isfinite(s) else f"{s * 1e3:,.1f}"


def duration(s: float) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    if s >= 3600:
        return f"{s / 3600:.2f}h"
    if s >= 60:
        return f"{s / 60:.1f}m"
    if s < 0.1:  # a small model projected onto a fast cluster: milliseconds, not "0.0s"
        return f"{1e3 * s:.1f}ms"
    return f"{s:.1f}s"


def fmt(value, spec: str = ".3f", unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:{spec}}{unit}"


def json_value(value):
    """A JSON-ready copy: numpy scalars as numbers, NaN and infinities as null (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def print_projection(df, console=None) -> None:
    """`scaling project`'s table of a projection (scaling.projection.run_projection), its notes and caveats."""
    from rich.markup import escape
    from rich.table import Table

    from scaling.plots.projection import projection_title

    console = console if console is not None else output_console()
    table = Table(title=projection_title(df), title_justify="left", header_style="bold")
    # the three communication figures, each named for what it is (scaling/projection/rows.py)
    headers = [
        "nodes",
        "GPUs",
        "batch",
        "step ms",
        "communicating %",
        "exposed %",
        "A/B overhead %",
        "samples/s",
        "speedup",
        "effic.",
        "epoch",
    ]
    tokens = "tokens_per_s_per_gpu" in df.columns
    if tokens:  # a transformer: tokens/s per GPU and memory per GPU beside the step
        headers[7] = "tokens/s/GPU"
        headers[-1] = "memory GiB/GPU"
    tta = "tta_s" in df.columns
    if tta:
        headers += ["epochs", "TTA", "TTA x"]
    for h in headers:
        table.add_column(h, justify="right", no_wrap=True)
    for _, r in df.iterrows():
        row = [
            f"{r.num_nodes}",
            f"{r.num_workers}",
            f"{r.global_batch:,}",
            ms(r.step_s),
            f"{r.allreduce_pct:.1f}",
            f"{r.exposed_comm_pct:.1f}",
            f"{r.comm_overhead_pct:.1f}",
            f"{r.throughput_samples_per_s:,.0f}",
            f"{r.speedup_throughput:.2f}",
            f"{r.efficiency_throughput:.3f}",
            duration(r.time_per_epoch_s),
        ]
        if tokens:
            too_big = r.get("fits") is False
            row[7], row[-1] = f"{r.tokens_per_s_per_gpu:,.0f}", f"{r.memory_gib:.1f}" + (" > cap." if too_big else "")
        if tta:
            row += _tta_cells(r)
        table.add_row(*row)
    console.print(table)
    _print_tta_sources(df, console)
    if df.attrs.get("sharded"):
        console.print(
            "[dim]communicating %: an all-gather or reduce-scatter in flight, hidden or not; exposed %: "
            "compute waiting on a collective; A/B overhead %: the step less the step without reduce-scatters "
            "(the lab's FSDP A/B), / t_step; batch in sequences; memory: parameters, gradients, optimizer "
            "state, activations and FSDP's buffers per GPU[/dim]",
            highlight=False,
        )
    else:
        console.print(
            "[dim]communicating %: an all-reduce in flight, hidden or not (DAWNBench's \"communication "
            'overhead"); exposed %: not hidden behind backward; A/B overhead %: (t_sync - t_no_sync) x '
            "synced micro-batches / t_step, exposed + interference[/dim]",
            highlight=False,
        )
    if tokens and "fits" in df.columns and (df["fits"] == False).any():  # noqa: E712 - None is not False
        over = df[df["fits"] == False]  # noqa: E712
        gpus = ", ".join(str(int(n)) for n in over["num_workers"])
        worst = over["memory_gib"].max()
        sharded = df.attrs.get("sharded")
        remedies = "more GPUs sharding the model" if sharded else "sharding the model (--backend fsdp)"
        console.print(
            f"[red]does not fit at {gpus} GPU(s): up to {worst:.1f} GiB per GPU projected against the "
            f"device's {over['memory_capacity_gib'].iloc[0]:g} GiB; what would make it fit: {remedies}, "
            "activation checkpointing (--activation-checkpointing full), or a smaller --per-gpu-batch[/red]",
            highlight=False,
        )
    for note in df.attrs.get("notes", []):
        console.print(f"[dim]- {escape(note)}[/dim]", highlight=False)
    for caveat in df.attrs.get("caveats", []):
        console.print(
            f"[yellow]caveat: {escape(caveat)}[/yellow]" + (" (* = extrapolated)" if tta else ""), highlight=False
        )


def write_projection(df, rows: list[dict], out: Path) -> list[Path]:
    """DIR/projection.png and .svg (the figure) and DIR/projection.json (rows, notes, caveats)."""
    from scaling.plots.figures import save
    from scaling.plots.projection import projection_figure
    from scaling.results import write_json_atomic

    try:
        out.mkdir(parents=True, exist_ok=True)
        written = save(projection_figure(df), out / "projection")
        record = {"rows": rows, "notes": list(df.attrs.get("notes", [])), "caveats": list(df.attrs.get("caveats", []))}
        write_json_atomic(out / "projection.json", record)
    except OSError as exc:
        raise UsageError(f"cannot write the projection to {out}: {exc.strerror or exc}") from None
    return [*written, out / "projection.json"]


def _tta_cells(r) -> list[str]:
    """A projection row's epochs to target (* extrapolated, ! beyond the model's support), TTA and TTA speedup,
    with the interval where the samples-to-target model gave one."""
    epochs = (
        f"{r.epochs_to_target:.1f}" + ("*" if r.epochs_extrapolated else "") + ("!" if r.get("beyond_support") else "")
    )
    speedup = f"{r.speedup_tta:.2f}"
    if r.get("speedup_tta_lo") is not None and r.speedup_tta_lo == r.speedup_tta_lo:
        speedup += f" [{r.speedup_tta_lo:.2f}, {r.speedup_tta_hi:.2f}]"
    return [epochs, duration(r.tta_s), speedup]


def _print_tta_sources(df, console) -> None:
    if "epochs_source" not in df.columns:
        return
    sources = "; ".join(f"{n}: {source}" for n, source in zip(df["num_workers"], df["epochs_source"]))
    console.print(
        f"[dim]epochs to target by GPUs: {sources} (* beyond the measured batches, ! beyond the samples-to-target "
        "model's support: docs/projection.md)[/dim]",
        highlight=False,
    )


def print_run_projection(df, console=None) -> None:
    """The table of a run's projection: each figure with its interval [low, high], then what set each parameter."""
    from rich.markup import escape
    from rich.table import Table

    console = console if console is not None else output_console()
    tokens = bool(df.attrs.get("tokens"))
    title = (
        f"{Path(df.attrs['run']).name} on {df.attrs['cluster']}, {df.attrs['backend']}: the run's job projected "
        f"(95% of its steps' compute in brackets)"
    )
    table = Table(title=title, title_justify="left", header_style="bold")
    rate = "tokens/s/GPU" if tokens else "samples/s"
    tta = "tta_s" in df.columns
    headers = ["GPUs", "step ms", rate, "communicating %", "exposed %", "A/B overhead %", "effic.", "memory GiB/GPU"]
    for h in headers + (["epochs", "TTA", "TTA x", "throughput x"] if tta else []):
        table.add_column(h, justify="right", no_wrap=True)
    per = df.attrs.get("seq_len") or 1

    def band(r, figure, fmt, scale=1.0):
        return (
            f"{fmt.format(r[figure] * scale)} [{fmt.format(r[figure + '_lo'] * scale)}, "
            f"{fmt.format(r[figure + '_hi'] * scale)}]"
        )

    for _, r in df.iterrows():
        rate_scale = per / r.num_workers if tokens else 1.0
        fits = r.get("fits")
        memory = f"{r.memory_gib:.1f}" + (" > cap." if fits is not None and fits == fits and not fits else "")
        table.add_row(
            f"{r.num_workers}",
            band(r, "step_s", "{:,.1f}", 1e3),
            band(r, "throughput_samples_per_s", "{:,.0f}", rate_scale),
            band(r, "allreduce_pct", "{:.1f}"),
            band(r, "exposed_comm_pct", "{:.1f}"),
            band(r, "comm_overhead_pct", "{:.1f}"),
            band(r, "efficiency_throughput", "{:.3f}"),
            memory,
            *([*_tta_cells(r), f"{r.speedup_throughput:.2f}"] if tta else []),
        )
    console.print(table)
    _print_tta_sources(df, console)
    console.print(
        "[dim]communicating %: a collective in flight, hidden or not; exposed %: compute waiting on one; "
        "A/B overhead %: the step less the step without gradient synchronisation, / t_step; memory: the "
        "tensors, the allocator's reserve, the CUDA context and NCCL's buffers[/dim]",
        highlight=False,
    )
    if (df["fits"] == False).any():  # noqa: E712 - None is not False
        gpus = ", ".join(str(int(n)) for n in df.loc[df["fits"] == False, "num_workers"])  # noqa: E712
        remedy = "more GPUs sharding it" if df.attrs.get("sharded") else "sharding the model (--backend fsdp)"
        console.print(
            f"[red]does not fit at {gpus} GPU(s) ({df['memory_capacity_gib'].iloc[0]:g} GiB per GPU); what "
            f"would make it fit: {remedy}, activation checkpointing, or a smaller batch[/red]",
            highlight=False,
        )
    console.print("set by (each parameter of the projection and the measured quantity or assumption behind it):")
    for name, value, source in df.attrs["parameters"]:
        console.print(
            f"[dim]- {escape(name)} = {escape(str(value))}" + (f": {escape(source)}" if source else "") + "[/dim]",
            highlight=False,
        )
    for note in df.attrs.get("notes", []):
        console.print(f"[dim]- {escape(note)}[/dim]", highlight=False)


def _noise_scale_line(summary: dict) -> str:
    """The run's gradient noise scale with its interval and what it rests on, or why it is absent."""
    if summary.get("noise_scale") is None:
        return summary.get("noise_scale_note") or "-"
    high = fmt(summary.get("noise_scale_high"), ",.0f") if summary.get("noise_scale_high") is not None else "no bound"
    return (
        f"{summary['noise_scale']:,.0f} samples [{fmt(summary.get('noise_scale_low'), ',.0f')}, {high}] over "
        f"{summary.get('noise_steps')} steps (B_simple = tr(Σ)/|G|²: the batch beyond which samples to target grow)"
    )


def not_measured(summary: dict, figure: str) -> str | None:
    """ "not measured: <reason>" for a figure the summary names in `not_measured` (schema 4), or
    an older summary's `comm_overhead_note`; None for a figure that was measured."""
    reason = (summary.get("not_measured") or {}).get(figure)
    if (
        reason is None
        and figure == "comm_overhead_pct"
        and summary.get(figure) is None
        and summary.get("comm_overhead_note")
    ):
        return summary["comm_overhead_note"].replace("A/B not measured", "not measured")
    return f"not measured: {reason}" if reason else None


def _throughput_line(summary: dict, absent) -> str:
    """The summary's throughput line: samples (and tokens) per second."""
    return absent("throughput_samples_per_s") or fmt(
        summary["throughput_samples_per_s"],
        ",.0f" if (summary["throughput_samples_per_s"] or 0) >= 100 else ".3g",
        " samples/s",
    ) + (f" ({summary['throughput_tokens_per_s']:,.0f} tokens/s)" if summary.get("throughput_tokens_per_s") else "")


def _step_line(summary: dict, absent) -> str:
    """The summary's step line: the step's phases in ms."""
    return (
        absent("step_s")
        or fmt(summary["step_s"] and summary["step_s"] * 1e3, ".2f", " ms")
        + "  = data "
        + fmt(summary["data_s"] and summary["data_s"] * 1e3, ".2f")
        + " + fwd "
        + fmt(summary["forward_s"] and summary["forward_s"] * 1e3, ".2f")
        + " + bwd "
        + fmt(summary["backward_s"] and summary["backward_s"] * 1e3, ".2f")
        + " + opt "
        + fmt(summary["optimizer_s"] and summary["optimizer_s"] * 1e3, ".2f")
        + " ms"
    )


def _communicating_line(summary: dict, absent) -> str:
    """The summary's communicating line: the share of the step with a collective in flight (each sharded kind
    beside it)."""
    from scaling.schema import COLLECTIVE_KINDS, SHARDED_KINDS

    return (
        (
            fmt(summary["comm_pct"], ".1f", "% of step")
            + " with a collective in flight ("
            + fmt(summary.get("comm_s") and summary["comm_s"] * 1e3, ".2f", " ms/step")
            + "; "
            + ", ".join(
                f"{COLLECTIVE_KINDS[kind]} " + fmt(summary.get(f"{kind}_pct"), ".1f", " %") for kind in SHARDED_KINDS
            )
            + ")"
        )
        if summary.get("comm_pct") is not None and any(summary.get(f"{kind}_pct") is not None for kind in SHARDED_KINDS)
        else absent("allreduce_pct")
        or fmt(summary.get("allreduce_pct"), ".1f", "% of step")
        + " with an all-reduce in flight ("
        + fmt(summary["allreduce_s"] and summary["allreduce_s"] * 1e3, ".2f", " ms/step")
        + ")"
    )


def _exposed_line(summary: dict, absent) -> str:
    """The summary's exposed comm line: the share of the step compute waited on communication."""
    return (
        absent("exposed_comm_pct")
        or fmt(summary["exposed_comm_pct"], ".1f", "% of step")
        + (
            " not hidden behind compute ("
            if summary.get("exposed_forward_comm_s") is not None
            else " not hidden behind backward ("
        )
        + fmt(summary["exposed_comm_s"] and summary["exposed_comm_s"] * 1e3, ".2f", " ms")
        + (
            ", of which in forward " + fmt(summary["exposed_forward_comm_s"] * 1e3, ".2f", " ms")
            if summary.get("exposed_forward_comm_s") is not None
            else ""
        )
        + ")"
    )


def _compute_line(summary: dict, absent) -> str:
    """The summary's compute line: FLOPs per sample, the rate and MFU."""
    return (
        fmt(
            summary.get("train_flops_per_sample") and summary["train_flops_per_sample"] / 1e9,
            ".3g",
            " GFLOP/sample",
        )
        + ", "
        + (
            f"rate and MFU {absent('achieved_flops_per_s')}"
            if absent("achieved_flops_per_s")
            else fmt(
                summary.get("achieved_flops_per_s") and summary["achieved_flops_per_s"] / 1e12,
                ".3g",
                " TFLOP/s per worker",
            )
            + ", MFU "
            + fmt(summary.get("mfu") and 100 * summary["mfu"], ".1f", " %")
        )
        + f" ({summary.get('precision', 'fp32')}, peak "
        + fmt(summary.get("peak_flops_per_s") and summary["peak_flops_per_s"] / 1e12, ".3g", " TFLOP/s")
        + ")"
    )


def print_summary(summary: dict, run_dir: Path) -> None:
    """One screen: what ran, whether it reached the target, and where the time went."""
    from rich.markup import escape
    from rich.table import Table

    console = output_console()
    # escaped: "[failed]" is otherwise read as a style tag and vanishes from the title
    table = Table(title=escape(f"run {summary['run_id']}  [{summary['status']}]"), show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    absent = functools.partial(not_measured, summary)  # a figure nothing measured: its reason, never a number
    rows = [
        ("model / data", f"{summary['model']} / {summary['dataset']}"),
        (
            "workers (nodes)",
            f"{summary['num_workers']} ({fmt(summary['num_nodes'], 'd')}), backend {summary['backend']}",
        ),
        ("batch", f"{summary['per_worker_batch']} per worker, {summary['global_batch']} global"),
        # a loss target (train.target_metric: val_loss) is read as a loss, lower is better
        ("val loss", f"best {fmt(summary.get('best_val_loss'), '.4f')}, target {summary['target_loss']}")
        if summary.get("target_loss") is not None
        else (
            "accuracy",
            (
                f"best {absent('best_accuracy')}"
                if absent("best_accuracy")
                else f"best {fmt(summary['best_accuracy'], '.4f')}"
            )
            + f", target {summary['target_accuracy']}",
        ),
        ("epochs", f"{summary['epochs_run']} run, target at {fmt(summary['epochs_to_target'], 'd')}"),
        (
            "TTA",
            absent("tta_s")
            or f"{fmt(summary['tta_s'], '.2f', ' s')} training ({fmt(summary['tta_wall_s'], '.2f', ' s')} wall)",
        ),
        (
            "time per epoch",
            absent("time_per_epoch_s")
            or fmt(summary["time_per_epoch_s"], ".2f", " s") + " (median, epochs after the first)",
        ),
        ("throughput", _throughput_line(summary, absent)),
        ("step", _step_line(summary, absent)),
        # the three communication figures (scaling/analysis/run_metrics.py), each by its name
        # a sharded run's collectives are all-gathers and reduce-scatters: comm_s is their union, each kind beside it
        ("communicating", _communicating_line(summary, absent)),
        ("exposed comm", _exposed_line(summary, absent)),
        (
            "comm overhead (A/B)",
            absent("comm_overhead_pct")
            or fmt(summary["comm_overhead_pct"], ".1f", " %")
            + " of step: comm_delta_s x synced_micro_batches / step_s",
        ),
        ("compute", _compute_line(summary, absent)),
        ("noise scale", _noise_scale_line(summary)),
        ("results", str(run_dir)),
    ]
    after_tta = [key for key, _ in rows].index("TTA") + 1
    if summary.get("cost_to_accuracy_usd") is not None:
        rows.insert(
            after_tta,
            (
                "cost to accuracy",
                f"${summary['cost_to_accuracy_usd']:,.2f} at ${summary['node_price_per_hour']:g}"
                f"/node-hour ({summary.get('market', 'on_demand')}), "
                f"${summary['time_lost_cost_usd']:,.2f} of it time lost",
            ),
        )
    if summary.get("restarts"):
        rows.insert(
            after_tta,
            (
                "restarts",
                f"{summary['restarts']}, {summary['time_lost_s']:.1f} s lost (counted in TTA), "
                f"workers {summary.get('workers_first_attempt')} -> {summary.get('workers_last_attempt')}",
            ),
        )
    if summary.get("error"):
        rows.insert(0, ("error", summary["error"]))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
