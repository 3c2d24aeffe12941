"""The projection's interference term on this machine: 2 gloo ranks on 2 shared CPU cores, where
gloo's communication threads take cores from backward compute while an all-reduce overlaps it.

The term (scaling/projection/cost.py, Echo's interference-induced slowdown): while an all-reduce
is in flight during backward, backward compute runs at 1/(1 + slowdown) of its speed. A run
measures it (`scaling.projection.compute.measured_overlap_slowdown`):

    slowdown = interference_s / (allreduce_s - exposed_comm_s)

the A/B difference beyond the exposed communication, per second of all-reduce overlapping
backward. The benchmark runs the quickstart (local launcher, one thread per worker) at 2
workers with two DDP bucket caps, A = 0.25 MB (5 buckets of its 1.15 MB of gradients) and B =
0.05 MB (23 buckets: more all-reduces, more of them overlapping backward), alternating
A B B A ... (`--pairs`), and reports per arm the three communication figures and the measured
slowdown. If the term is a property of the machine rather than of one configuration, the
slowdown measured on A predicts B's interference from B's own overlap:
interference_B ~ slowdown_A x (allreduce_s - exposed_comm_s)_B, and the error is reported.
No budget: it is a measurement on a machine shared with other jobs (the runnable-task count
per run is recorded).

    .venv/bin/python bench/interference_ground_truth.py            # 2 pairs x 3 epochs (about 5 min here)
    .venv/bin/python bench/interference_ground_truth.py --quick    # 1 pair x 2 epochs
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import benchlib as bl

NAME = "interference_ground_truth"
CAPS_MB = {"A": 0.25, "B": 0.05}
FIGURES = (
    "step_s",
    "allreduce_s",
    "allreduce_pct",
    "exposed_comm_s",
    "exposed_comm_pct",
    "comm_delta_s",
    "comm_overhead_pct",
    "interference_s",
    "num_buckets",
)


def main() -> None:
    bench = bl.Benchmark(
        NAME, __doc__, quick="1 pair of 2-epoch runs", pairs=(2, 1), epochs=(3, 2), config="experiments/quickstart.yaml"
    )
    args = bench.parse()
    pairs, epochs = args.pairs, args.epochs

    from scaling.config import load_config
    from scaling.launch.run import execute_run
    from scaling.projection.compute import measured_overlap_slowdown
    from scaling.results import RunDir

    base = [
        f"train.max_epochs={epochs}",
        "train.target_accuracy=1.0",
        "data.val_samples=512",
        *(["data.train_samples=2048"] if args.quick else []),
    ]
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-interference-") as tmp:
        for i, arm in enumerate(bl.abba(pairs, "A", "B")):
            overrides = [*base, f"instrument.ddp_bucket_cap_mb={CAPS_MB[arm]}"]
            cfg = load_config(bl.REPO / args.config, overrides=overrides, num_workers=2)
            print(f"[{NAME}] run {i + 1}/{2 * pairs}: arm {arm}, bucket cap {CAPS_MB[arm]} MB", flush=True)
            run_dir = Path(tmp) / f"run{i:02d}-{arm}"
            with bl.RunQueue() as rq:
                summary = execute_run(cfg, run_dir, launcher="local")
            if summary["status"] == "failed":
                raise RuntimeError(f"arm {arm} failed: {summary['error']}")
            try:
                slowdown = measured_overlap_slowdown(RunDir(run_dir))
            except Exception as exc:  # a run without overlap cannot measure it: recorded, not fatal
                slowdown, why = None, str(exc)
            else:
                why = None
            runs.append(
                {
                    "arm": arm,
                    "bucket_cap_mb": CAPS_MB[arm],
                    "mean_runnable": rq.mean,
                    "overlap_slowdown": slowdown,
                    "overlap_slowdown_note": why,
                    **{k: summary.get(k) for k in FIGURES},
                }
            )
            print(
                f"[{NAME}]   communicating {summary.get('allreduce_pct'):.1f}%, exposed "
                f"{summary.get('exposed_comm_pct'):.1f}%, A/B {summary.get('comm_overhead_pct'):.1f}%, "
                f"slowdown {slowdown}",
                flush=True,
            )

    arms = {arm: [r for r in runs if r["arm"] == arm] for arm in CAPS_MB}
    slowdown_a = bl.median([r["overlap_slowdown"] for r in arms["A"]])
    predicted, measured = [], []
    for r in arms["B"]:
        if slowdown_a is not None and r["interference_s"] is not None:
            predicted.append(slowdown_a * (r["allreduce_s"] - r["exposed_comm_s"]))
            measured.append(r["interference_s"])
    summary_by_arm = {
        arm: {k: bl.median([r[k] for r in rs]) for k in (*FIGURES, "overlap_slowdown")} for arm, rs in arms.items()
    }
    comparison = bl.comparison(
        "interference predicted from A's slowdown vs measured (arm B, 0.05 MB buckets)",
        "predicted: slowdown(A) x overlap(B)",
        "measured interference_s (B)",
        bl.median(predicted),
        bl.median(measured),
        "s/step",
        bl.ratio(bl.median(predicted), bl.median(measured)),
        "predicted / measured interference per step",
        note=f"slowdown measured on arm A (0.25 MB buckets): {slowdown_a}; 2 gloo ranks sharing 2 CPU cores",
    )
    bench.finish(
        [comparison],
        runs=runs,
        by_arm=summary_by_arm,
        slowdown_from_a=slowdown_a,
        interference_b_predicted_s=predicted,
        interference_b_measured_s=measured,
    )
    print(
        f"[{NAME}] slowdown measured on A: {slowdown_a}; B interference predicted {bl.median(predicted)} s, "
        f"measured {bl.median(measured)} s"
    )


if __name__ == "__main__":  # the plain launcher spawns processes that re-import this module
    main()
