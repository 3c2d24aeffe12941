"""CPU scaling of the quickstart: training throughput at 1 and 2 workers (one CPU thread each, gloo,
plain launcher), speedup = throughput(2) / throughput(1) and scaling efficiency = speedup / 2.

Arms: A = 1 worker, B = 2 workers, the same config otherwise: experiments/quickstart.yaml with
`train.target_accuracy=1.0` (no early stop: every run trains `--epochs` epochs),
`instrument.calibration_pairs=0` and `data.val_samples=512` (neither is inside `train_s`). The
per-worker batch stays 64, so the global batch doubles at 2 workers (weak scaling of the batch,
as in the lab's sweeps). Throughput per run is the summary's `throughput_samples_per_s`: the
median over the epochs after the first of samples / `train_s`, all workers together. Runs
alternate A B B A ... (`--pairs` pairs; quick: `data.train_samples=2048` too), in-process through
`scaling.launch.run.execute_run(cfg, dir, launcher="local")`; the headline speedup is the median
over adjacent (A, B) pairs of B / A. Each run also records the mean number of runnable tasks while
it ran (bench/benchlib.py `RunQueue`), to show contention.
On this 2-core machine the 2 workers share the cores with gloo's communication threads (and with
anything else running), so the efficiency measures that too. No budget: it is a measurement.

    .venv/bin/python bench/cpu_scaling.py            # 2 pairs x 3 epochs (about 3 min here)
    .venv/bin/python bench/cpu_scaling.py --quick    # 1 pair x 2 epochs
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

import benchlib as bl

NAME = "cpu_scaling"


def main() -> None:
    bench = bl.Benchmark(
        NAME, __doc__, quick="1 pair of 2-epoch runs", pairs=(2, 1), epochs=(3, 2), config="experiments/quickstart.yaml"
    )
    args = bench.parse()
    pairs, epochs = args.pairs, args.epochs

    from scaling.config import load_config
    from scaling.launch.run import execute_run

    overrides = [
        f"train.max_epochs={epochs}",
        "train.target_accuracy=1.0",
        "instrument.calibration_pairs=0",
        "data.val_samples=512",
        *(["data.train_samples=2048"] if args.quick else []),
    ]
    sequence, runs = [], []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        for i, workers in enumerate(bl.abba(pairs, 1, 2)):
            cfg = load_config(bl.REPO / args.config, overrides=overrides, num_workers=workers)
            print(f"[{NAME}] run {i + 1}/{2 * pairs}: {workers} worker(s)", flush=True)
            with bl.RunQueue() as rq:
                summary = execute_run(cfg, Path(tmp) / f"run{i:02d}-w{workers}", launcher="local")
            if summary["status"] == "failed":
                raise RuntimeError(f"{workers}-worker run failed: {summary['error']}")
            throughput = summary["throughput_samples_per_s"]
            sequence.append((workers, throughput))
            runs.append(
                {
                    "order": i,
                    "workers": workers,
                    "throughput_samples_per_s": throughput,
                    "mean_runnable": rq.mean,
                    "time_per_epoch_s": summary["time_per_epoch_s"],
                    "step_s": summary["step_s"],
                    "global_batch": summary["global_batch"],
                    "comm_exposed_s": summary.get("exposed_comm_s"),
                }
            )
            print(f"[{NAME}]   {throughput:,.0f} samples/s (runnable tasks {rq.mean})", flush=True)

    speedups = [b / a for a, b in bl.adjacent_pairs(sequence, 1, 2)]
    a_med = bl.median(v for w, v in sequence if w == 1)
    b_med = bl.median(v for w, v in sequence if w == 2)
    speedup = bl.median(speedups)
    comparisons = [
        bl.comparison(
            "CPU scaling, throughput speedup 1 -> 2 workers",
            "1 worker",
            "2 workers",
            a_med,
            b_med,
            "samples/s",
            speedup,
            "speedup: median over adjacent ABBA pairs of throughput(2) / throughput(1); ideal 2",
            None,
            "",
            note=f"scaling efficiency {speedup / 2:.0%} (speedup / 2); quickstart, local launcher, 1 thread per "
            "worker, "
            f"{pairs} pairs x {epochs} epochs; pair speedups {', '.join(f'{s:.3f}' for s in speedups)}; "
            f"{bl.contention_note(runs)}",
        )
    ]
    cli = f".venv/bin/scaling run {args.config} --launcher local " + " ".join(
        f"--set {shlex.quote(o)}" for o in overrides
    )
    bench.finish(
        comparisons,
        config=args.config,
        pairs=pairs,
        epochs_per_run=epochs,
        overrides=overrides,
        arms={"1 worker": f"{cli} --workers 1 --out DIR", "2 workers": f"{cli} --workers 2 --out DIR"},
        speedup=speedup,
        efficiency=speedup / 2 if speedup else None,
        pair_speedups=speedups,
        runs=runs,
    )


if __name__ == "__main__":  # the plain launcher spawns processes that re-import this module
    main()
