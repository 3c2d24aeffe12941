"""Run every benchmark in bench/, one after the other, then write the summary table.

    .venv/bin/python bench/run_all.py
        # full: results in bench/results/ (docs/benchmarks.md says how long each took)
    .venv/bin/python bench/run_all.py --quick    # few minutes: results in bench/results/quick/
    .venv/bin/python bench/run_all.py --only allreduce,analysis_speed

(`make bench` and `make bench QUICK=1` call this.) Each benchmark is its own process, so one
cannot disturb the next through leftover threads or memory; a benchmark that fails is reported
and the others still run; the exit status is 1 if any failed. Last, bench/summarize.py renders
the results into their docs pages (docs/benchmarks.md, docs/projection.md, docs/clusters.md;
quick: bench/results/quick/README.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# Shortest first: a broken set-up shows within a minute.
BENCHMARKS = (
    "projection_anchors",
    "projection_torchtitan",
    "allreduce",
    "analysis_speed",
    "ddp_own_work",
    "instrumentation_overhead",
    "instrumentation_overhead_own_job",
    "instrument_host_cost",
    "noise_scale_host_cost",
    "ray_overhead",
    "cpu_scaling",
    "horovod_cycle_ground_truth",
    "fsdp_overhead",
    "projection_own_jobs",
    "tta_noise_scale",
)
ROOT_BENCHMARKS = ("projection_own_jobs",)  # a minicluster of network namespaces: root
# A benchmark that is another's script with arguments: name -> (script, arguments).
VARIANTS = {"instrumentation_overhead_own_job": ("instrumentation_overhead", ["--job", "own"])}


def committed_minutes(names) -> str:
    """What the committed results of `names` took together (their `wall_s`), in whole minutes; "?" if one is absent."""
    try:
        seconds = sum(json.loads((BENCH / "results" / f"{name}.json").read_text())["wall_s"] for name in names)
    except (OSError, ValueError, KeyError, TypeError):
        return "?"
    return f"{seconds / 60:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"A full run takes about {committed_minutes(BENCHMARKS)} minutes: what the committed results took\n"
        "together, on 2 CPUs (each benchmark's time, machine and date: docs/benchmarks.md). It overwrites\n"
        "the committed results, bench/results/<name>.json, and the tables and figures bench/summarize.py\n"
        "writes into README.md and docs/*.md; --quick writes to bench/results/quick/ instead.\n"
        f"{', '.join(ROOT_BENCHMARKS)} (about {committed_minutes(ROOT_BENCHMARKS)} minutes) builds a minicluster of "
        "network\nnamespaces and needs root; without it that benchmark fails and the others still run.\n\n"
        "exit status: 0 every benchmark ran, 1 one or more failed, 2 bad arguments",
    )
    parser.add_argument("--quick", action="store_true", help="the few-minute variant of every benchmark")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; valid: {', '.join(BENCHMARKS)}")

    started = time.perf_counter()
    durations, failed = {}, []
    for name in names:
        script, variant_args = VARIANTS.get(name, (name, []))
        command = [sys.executable, str(BENCH / f"{script}.py"), *variant_args, *(["--quick"] if args.quick else [])]
        print(f"=== {name}{' (quick)' if args.quick else ''}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.call(command, cwd=REPO)
        durations[name] = time.perf_counter() - t0
        print(f"=== {name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {durations[name]:.0f} s", flush=True)
        if code != 0:
            failed.append(name)

    subprocess.call([sys.executable, str(BENCH / "summarize.py"), *(["--quick"] if args.quick else [])], cwd=REPO)
    total = time.perf_counter() - started
    print("=== durations: " + ", ".join(f"{n} {s:.0f} s" for n, s in durations.items()) + f"; total {total:.0f} s")
    if failed:
        print(f"=== failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
