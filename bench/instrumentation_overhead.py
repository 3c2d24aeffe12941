"""Instrumentation overhead: steady-state step time of the quickstart with the lab's full per-step
instrumentation against the same run with none, plain launcher, 2 workers; budget: instrumented /
plain <= 1.03.

The switch is the config field `instrument.step_timing`:
  A "instrumented"  true:  a mark between the phases of every step, the comm-timing DDP hook
                    (CommTimingHook around allreduce_hook) and one step record per rank and step.
  B "plain"         false: no marks, no hook (DDP's built-in all-reduce), no step records.
Epoch timing is the same in both. Everything else is the same config: experiments/quickstart.yaml
at 2 workers (gloo, one CPU thread each), `train.target_accuracy=1.0` so that every run trains
`--epochs` epochs, `instrument.calibration_pairs=0` (calibration is outside `train_s` anyway; off
in both arms to save time) and `data.val_samples=512` (validation is outside `train_s` too).

Measured: per run, the steady-state step time = median over the epochs after the first of
`train_s / steps` (epochs.parquet; steps = samples / global batch). Runs alternate A B B A ...
(`--pairs` pairs; quick: `data.train_samples=2048` too), each launched in-process with
`scaling.launch.run.execute_run(cfg, dir, launcher="local")`, i.e. what `scaling run
experiments/quickstart.yaml --launcher local --workers 2 --set ...` does. The headline ratio is
the median over adjacent (A, B) pairs of A / B; the ratio of the two arms' medians is reported
beside it. Each run also records the mean number of runnable tasks while it ran (bench/benchlib.py
`RunQueue`), to show contention, and the CPU time of its processes (`TreeCpu`, from /proc): the
training workers' CPU seconds per steady-state step are a second view of the overhead, which other
jobs on the machine hardly move (reported beside the wall-time ratio, with the same budget).

    .venv/bin/python bench/instrumentation_overhead.py            # 3 pairs x 3 epochs (about 3 min here)
    .venv/bin/python bench/instrumentation_overhead.py --quick    # 1 pair x 2 epochs
    .venv/bin/python bench/instrumentation_overhead.py --job own  # the user's job of examples/own_job

`--job own` measures the same switch on a user's own job (examples/own_job/sweep.yaml: a small
vision transformer in a Ray Train quickstart-shaped train function, instrumented through the
public `scaling.instrument.attach`), with the Ray launcher (a user's train function is a Ray
Train function) and 8,192 training samples, so an epoch has 128 steps per worker. Arm B keeps
the instrument attached with `step_timing=false`: only the epoch clock, no hooks, no records.
It writes instrumentation_overhead_own_job.json.
"""

from __future__ import annotations

import argparse
import os
import shlex
import tempfile
import time
from pathlib import Path

import benchlib as bl

from scaling.analysis.run_metrics import steady_step_s
from scaling.results import RunDir

NAME = "instrumentation_overhead"
BUDGET = 1.03
ARMS = {"instrumented": "instrument.step_timing=true", "plain": "instrument.step_timing=false"}


def base_overrides(epochs: int, quick: bool) -> list[str]:
    return [
        f"train.max_epochs={epochs}",
        "train.target_accuracy=1.0",
        "instrument.calibration_pairs=0",
        "data.val_samples=512",
        *(["data.train_samples=2048"] if quick else []),  # quick: shorter epochs (the step is the same)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 pair of 2-epoch runs")
    parser.add_argument("--pairs", type=int, help="A/B pairs (default 3; quick 1)")
    parser.add_argument("--epochs", type=int, help="epochs per run, the first is left out (default 3; quick 2)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--config", default="experiments/quickstart.yaml")
    parser.add_argument("--job", choices=("lab", "own"), default="lab",
                        help="lab: the lab's loop on --config; own: the user's job of examples/own_job (Ray launcher)")
    args = parser.parse_args()
    name, launcher = NAME, "local"
    extra = []
    if args.job == "own":
        name, launcher, args.config = f"{NAME}_own_job", "ray", "examples/own_job/sweep.yaml"
        extra = ["train.function_config.num_train=8192"]
    pairs = args.pairs or (1 if args.quick else 3)
    epochs = args.epochs or (2 if args.quick else 3)

    from scaling.config import load_config
    from scaling.launch.run import execute_run

    started, load_start = time.time(), bl.load_average()
    overrides = [*base_overrides(epochs, args.quick), *extra]
    config_path = bl.REPO / args.config
    sequence, sequence_cpu, runs = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        for i, arm in enumerate(bl.abba(pairs, "instrumented", "plain")):
            cfg = load_config(config_path, overrides=[*overrides, ARMS[arm]], num_workers=args.workers)
            run_dir = Path(tmp) / f"run{i:02d}-{arm}"
            print(f"[{name}] run {i + 1}/{2 * pairs}: {arm}", flush=True)
            with bl.RunQueue() as rq, bl.TreeCpu([os.getpid()]) as cpu:
                summary = execute_run(cfg, run_dir, launcher=launcher)
            if summary["status"] == "failed":
                raise RuntimeError(f"{arm} run failed: {summary['error']}")
            epochs_table = RunDir(run_dir).epochs()
            step_s, epoch_rows = steady_step_s(epochs_table, cfg.global_batch)
            steady = bl.steady_cpu(cpu, epochs_table, cfg.global_batch)
            sequence.append((arm, step_s))
            sequence_cpu.append((arm, steady["worker_cpu_s_per_step"]))
            runs.append({"order": i, "arm": arm, "steady_step_s": step_s, "mean_runnable": rq.mean, **steady,
                         "epochs": epoch_rows, "summary_step_s": summary.get("step_s")})
            print(f"[{name}]   steady-state step {step_s * 1e3:.2f} ms, worker CPU "
                  f"{steady['worker_cpu_s_per_step'] * 1e3:.1f} ms/step (runnable tasks {rq.mean}; cores {steady['cores']})",
                  flush=True)

    pair_values = bl.adjacent_pairs(sequence, "instrumented", "plain")
    pair_ratios = [a / b for a, b in pair_values]
    a_med = bl.median(v for arm, v in sequence if arm == "instrumented")
    b_med = bl.median(v for arm, v in sequence if arm == "plain")
    headline = bl.median(pair_ratios)
    cpu_pairs = [a / b for a, b in bl.adjacent_pairs(sequence_cpu, "instrumented", "plain") if a and b]
    cpu_a = bl.median(v for arm, v in sequence_cpu if arm == "instrumented")
    cpu_b = bl.median(v for arm, v in sequence_cpu if arm == "plain")
    elsewhere = [r["cores"]["rest_of_machine_cores"] for r in runs if r["cores"]]
    comparisons = [bl.comparison(
        "instrumentation overhead (step time)", "instrumented (step_timing=true)", "plain (step_timing=false)",
        a_med, b_med, "s/step", headline,
        "median over adjacent ABBA pairs of instrumented / plain steady-state step time",
        BUDGET, "instrumented / plain <= 1.03 on CPU", pair_ratios=pair_ratios,
        note=f"{args.config}, {args.workers} workers, {launcher} launcher, {pairs} pairs x {epochs} epochs; "
             f"ratio of arm medians {bl.ratio(a_med, b_med):.3f}; pair ratios {', '.join(f'{r:.3f}' for r in pair_ratios)}; "
             f"{bl.contention_note(runs)}",
    ), bl.comparison(
        "instrumentation overhead (workers' CPU per step)", "instrumented (step_timing=true)",
        "plain (step_timing=false)", cpu_a, cpu_b, "CPU s/step", bl.median(cpu_pairs),
        "median over adjacent ABBA pairs of instrumented / plain CPU seconds of the training workers per steady-state "
        "step", BUDGET, "the step-time budget, applied to CPU time (little moved by other jobs)", pair_ratios=cpu_pairs,
        note=f"/proc CPU time of the 2 worker processes while the epochs after the first trained; pair ratios "
             f"{', '.join(f'{r:.3f}' for r in cpu_pairs)}" + (f"; the rest of the machine (other jobs) used "
             f"{min(elsewhere):.2f}-{max(elsewhere):.2f} cores meanwhile" if elsewhere else ""),
    )]
    cli = f".venv/bin/scaling run {args.config} --launcher {launcher} --workers {args.workers} " + " ".join(
        f"--set {shlex.quote(o)}" for o in overrides)
    path = bl.write_result(
        name, __doc__, args.quick, started, load_start, comparisons,
        config=args.config, workers=args.workers, pairs=pairs, epochs_per_run=epochs, overrides=overrides,
        arms={arm: f"{cli} --set {switch} --out DIR" for arm, switch in ARMS.items()},
        pair_ratios=pair_ratios, ratio_of_medians=bl.ratio(a_med, b_med), runs=runs,
    )
    bl.print_comparisons(comparisons)
    print(f"[{name}] wrote {path.relative_to(bl.REPO)}", flush=True)


if __name__ == "__main__":  # the plain launcher spawns processes that re-import this module
    main()
