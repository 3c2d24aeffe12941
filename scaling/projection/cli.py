"""`scaling project`: project a model's data-parallel scaling onto a cluster.

    scaling project --model resnet50 --cluster p3.16xlarge --nodes 1,2,4,8,16
    scaling project --cluster p3.16xlarge --nodes 1,2,4 --precision amp --per-gpu-batch 256 --out proj
    scaling project --cluster my_cluster.yaml --from-run results/r50-w1 --nodes 1,2,4 --json
    scaling project --model resnet101 --cluster horovod_p100x4 --nodes 1,128 --backend horovod --horovod-cycle-time-ms 5
    python -m scaling.projection.cli ...        # the same (`main` runs `scaling project ...`)

Prints a table (rich) or, with --json, one JSON array of rows (notes and caveats go to
stderr); --out PATH writes PATH.png and PATH.svg. The command line is the lab's own
(scaling/cli.py): `add_arguments(subparser)` declares the options on its `project` subparser
(a `OneLineParser`), `run_from_args(args)` runs them, and bad input ends, as for every
`scaling` command, in one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from scaling.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from scaling.projection.cluster import preset_names
    from scaling.projection.layers import available_models

    parser.add_argument("--model", default=None,
                        help=f"model with a layer table: {', '.join(available_models())} (default: the run's, else resnet50)")
    parser.add_argument("--cluster", required=True,
                        help=f"preset ({', '.join(preset_names())}) or a cluster YAML file (scaling/projection/cluster.py)")
    parser.add_argument("--nodes", default=None, help="comma-separated node counts, e.g. 1,2,4,8,16 (default 1,2,4,8,16)")
    parser.add_argument("--workers", default=None,
                        help="comma-separated GPU counts instead of --nodes, e.g. 1,2,4,8,16 (within a node up to its GPUs)")
    parser.add_argument("--per-gpu-batch", type=int, default=None, help="samples per GPU per step (default: the run's, else 64)")
    parser.add_argument("--precision", default=None, help="fp32 | amp (= fp16) | fp16 | bf16 (default: the run's, else fp32)")
    parser.add_argument("--from-run", type=Path, nargs="+", default=None, metavar="RUN_DIR",
                        help="run directory whose step times are the compute (a 1-worker run is best); several "
                             "1-worker runs made at the same time, one per future rank, also measure the straggler wait")
    parser.add_argument("--straggler-ms", type=float, default=None,
                        help="wait for the slowest rank per synchronous step, added to exposed communication "
                             "(default: what concurrent --from-run runs measured, else the cluster's step jitter)")
    parser.add_argument("--overlap-slowdown", type=float, default=None,
                        help="backward compute runs at 1/(1 + this) while an all-reduce overlaps it (default: the "
                             "cluster's; a multi-worker run measures it: compute.measured_overlap_slowdown)")
    parser.add_argument("--samples-per-s", type=float, default=None,
                        help="one GPU's training throughput, instead of the device table or a run")
    parser.add_argument("--allreduce", choices=("ring", "hierarchical"), default=None,
                        help="all-reduce algorithm (default: the cluster's)")
    parser.add_argument("--backend", choices=("ddp", "horovod"), default="ddp",
                        help="ddp: DDP's gradient buckets; horovod: Horovod's cycles and Tensor Fusion (default ddp)")
    parser.add_argument("--horovod-cycle-time-ms", type=float, default=None,
                        help="--backend horovod: HOROVOD_CYCLE_TIME (default 1, Horovod's since 0.21; 5 before)")
    parser.add_argument("--horovod-fusion-threshold-mb", type=float, default=None,
                        help="--backend horovod: fusion buffer in MiB (default 128, Horovod's since 0.21; 64 before)")
    parser.add_argument("--grad-compression", choices=("none", "fp16", "bf16"), default=None,
                        help="DDP compression hook: gradients on the wire in 2 bytes (default: the run's, else none)")
    parser.add_argument("--bucket-cap-mb", type=float, default=None,
                        help="DDP bucket_cap_mb given explicitly (default: the run's; else DDP's default, 25 MiB with a 1 MiB first bucket)")
    parser.add_argument("--dataset-size", type=int, default=None,
                        help="samples per epoch (default: the run's, else the model's usual dataset, e.g. ImageNet 1,281,167)")
    parser.add_argument("--epochs-to-target", default=None, metavar="BATCH:EPOCHS,...",
                        help="epochs to the target accuracy measured at global batches, e.g. 256:30,1024:31, for TTA")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument("--out", type=Path, default=None, help="figure path: writes OUT.png and OUT.svg")
    return parser


def _json_value(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def rows_as_json(df) -> list[dict]:
    return [{k: _json_value(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def _ms(s: float) -> str:
    return "-" if s is None or not math.isfinite(s) else f"{s * 1e3:,.1f}"


def _duration(s: float) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    if s >= 3600:
        return f"{s / 3600:.2f}h"
    if s >= 60:
        return f"{s / 60:.1f}m"
    return f"{s:.1f}s"


def print_table(df, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from scaling.projection.figure import projection_title

    # A pipe or a job log is 80 columns to rich; the table needs about 100.
    console = console if console is not None else Console(width=None if sys.stdout.isatty() else 120)
    table = Table(title=projection_title(df), title_justify="left", header_style="bold")
    # the three communication figures, each named for what it is (scaling/projection/project.py)
    headers = ["nodes", "GPUs", "batch", "step ms", "communicating %", "exposed %", "A/B overhead %", "samples/s",
               "speedup", "effic.", "epoch"]
    tta = "tta_s" in df.columns
    if tta:
        headers += ["epochs", "TTA", "TTA x"]
    for h in headers:
        table.add_column(h, justify="right", no_wrap=True)
    for _, r in df.iterrows():
        row = [f"{r.num_nodes}", f"{r.num_workers}", f"{r.global_batch:,}", _ms(r.step_s), f"{r.allreduce_pct:.1f}",
               f"{r.exposed_comm_pct:.1f}", f"{r.comm_overhead_pct:.1f}", f"{r.throughput_samples_per_s:,.0f}",
               f"{r.speedup_throughput:.2f}", f"{r.efficiency_throughput:.3f}", _duration(r.time_per_epoch_s)]
        if tta:
            row += [f"{r.epochs_to_target:.1f}" + ("*" if r.epochs_extrapolated else ""), _duration(r.tta_s),
                    f"{r.speedup_tta:.2f}"]
        table.add_row(*row)
    console.print(table)
    console.print("[dim]communicating %: an all-reduce in flight, hidden or not (DAWNBench's \"communication "
                  "overhead\"); exposed %: not hidden behind backward; A/B overhead %: (t_sync - t_no_sync) / t_sync, "
                  "exposed + interference[/dim]", highlight=False)
    for note in df.attrs.get("notes", []):
        console.print(f"[dim]- {escape(note)}[/dim]", highlight=False)
    for caveat in df.attrs.get("caveats", []):
        console.print(f"[yellow]caveat: {escape(caveat)}[/yellow]" + (" (* = extrapolated)" if tta else ""), highlight=False)


def run_from_args(args: argparse.Namespace, console=None) -> int:
    """Run `scaling project` from parsed arguments; returns the exit status (UsageError propagates)."""
    from scaling.projection.compute import run_model
    from scaling.projection.project import run_projection

    model = args.model
    from_run = args.from_run
    if isinstance(from_run, list) and len(from_run) == 1:
        from_run = from_run[0]
    if model is None:
        first = from_run[0] if isinstance(from_run, list) else from_run
        model = (run_model(first) if first is not None else None) or "resnet50"
    nodes = args.nodes if (args.nodes is not None or args.workers is not None) else "1,2,4,8,16"
    df = run_projection(
        model, args.cluster, nodes, args.per_gpu_batch, args.precision, from_run,
        workers=args.workers, samples_per_s=args.samples_per_s, dataset_size=args.dataset_size,
        epochs_to_target=args.epochs_to_target, allreduce=args.allreduce, grad_compression=args.grad_compression,
        bucket_cap_mb=args.bucket_cap_mb,
        straggler_s=None if getattr(args, "straggler_ms", None) is None else args.straggler_ms / 1e3,
        backend=args.backend, horovod_cycle_time_ms=args.horovod_cycle_time_ms,
        horovod_fusion_threshold_mb=args.horovod_fusion_threshold_mb, overlap_slowdown=args.overlap_slowdown,
    )
    written = []
    if args.out is not None:
        from scaling.projection.figure import projection_figure, save

        try:
            written = save(projection_figure(df), args.out)
        except OSError as exc:
            raise UsageError(f"cannot write the figure to {args.out}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(rows_as_json(df), indent=1))
        for line in df.attrs.get("notes", []):
            print(f"note: {line}", file=sys.stderr)
        for line in df.attrs.get("caveats", []):
            print(f"caveat: {line}", file=sys.stderr)
        for path in written:
            print(f"figure: {path}", file=sys.stderr)
    else:
        print_table(df, console)
        if written:
            print("figure: " + ", ".join(str(p) for p in written))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`scaling project ARGV...`, through the lab's command line (its parser, errors and exit status)."""
    from scaling.cli import main as scaling_main

    return scaling_main(["project", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
