"""Analysis speed: wall time of `scaling report` over a large generated sweep (200 runs x 50 epochs,
1,000 training steps per rank and run); budget: within 10 s.

The sweep is written in the on-disk format `scaling sweep` writes and `scaling report` reads
(scaling/results.py `SweepDir`, `RunDir`, `summary_row`; docs/results.md): `sweep.yaml`, `runs.parquet` (one row per
run, its summary flattened, plus run_key, run_dir, repeat and the `sweep.train.per_worker_batch` column)
and per run `config.yaml`, `summary.json`, `epochs.parquet`, `steps.parquet` and
`compute_profile.json`. Grid: workers 1, 2, 4, 8 x per-worker batch 64, 128 x 25 repeats = 200
runs; every run has 50 epochs and, per rank, 1,000 training steps (20 per epoch, the first 5
warm-up) plus 10 calibration pairs per epoch at 2+ workers; each summary is computed from its
records by the lab's own `summarize_run`. Accuracy curves reach the 84% target at the 50th
epoch, except one repeat in ten (status max_epochs). The generator is seeded: the same sweep
every time. (`scaling report` reads runs.parquet and the 200 epochs.parquet files; it does not
read steps.parquet, so the number of steps does not enter the timing. The run's own records are
this small because the lab writes them per step; a real 1,000-steps-per-epoch sweep would differ
only in steps.parquet.)

Timed, alternating A B B A ... (`--pairs` pairs):
  A "cli"        `.venv/bin/scaling report SWEEP` in a fresh process, stdout to a pipe: what a
                 person waits for, interpreter start and imports included. The budget applies here.
  B "in-process" `scaling.report.write_report(SWEEP, console=<a string buffer>)` in this process,
                 after one untimed call (imports and font cache warm).
Both print every table (rich, 80 columns) and write report.md plus 7 figures as PNG and SVG. The
figures are medians. One more in-process call runs under cProfile; its top entries (cumulative)
are kept in the JSON, and one more runs with its phases timed (reading the sweep:
`scaling.results.SweepDir.read`; drawing the figures: every `scaling.plots.figures.*_figure`;
saving them; printing the tables; the rest), to show where the time goes.

    .venv/bin/python bench/analysis_speed.py            # 200 runs, 2 pairs
    .venv/bin/python bench/analysis_speed.py --quick    # 200 runs, 1 pair, no cProfile
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl

NAME = "analysis_speed"
BUDGET_S = 10.0
WORKERS = (1, 2, 4, 8)
BATCHES = (64, 128)
EPOCHS = 50
STEPS_PER_RANK = 1000
WARMUP_STEPS = 5
CALIBRATION_PAIRS = 10
TARGET = 0.84
TRAIN_SAMPLES = 8192
# small_cnn's counted FLOPs and a 1-thread CPU's roofs, as in a compute_profile.json of this machine
PROFILE = {
    "train_flops": 17_513_472.0,
    "forward_flops": 6_132_736.0,
    "train_bytes_per_sample": 2_038_933.0,
    "peak_flops_per_s": 1.0e11,
    "peak_source": "measured",
    "mem_bytes_per_s": 1.0e10,
}


def _epochs(rng, workers: int, batch: int, reaches: bool):
    import numpy as np
    import pandas as pd

    epoch = np.arange(1, EPOCHS + 1)
    global_batch = workers * batch
    samples = (TRAIN_SAMPLES // global_batch) * global_batch
    train_s = 8.0 / workers**0.85 * (64 / batch) ** 0.1 * (1 + 0.04 * rng.standard_normal(EPOCHS))
    train_s[0] *= 1.3
    eval_s = np.full(EPOCHS, 0.4)
    calibration_s = np.full(EPOCHS, 0.0 if workers == 1 else 0.2)
    # rises towards the target, first reaching it at the last epoch (or never, for one repeat in ten)
    accuracy = TARGET * (0.55 + 0.45 * (epoch / EPOCHS) ** 0.8) + 0.006 * rng.standard_normal(EPOCHS)
    accuracy = np.minimum(accuracy, TARGET - 0.002)
    accuracy[-1] = TARGET + 0.004 if reaches else TARGET - 0.01
    wall = np.cumsum(train_s + eval_s + calibration_s + 0.1)
    return pd.DataFrame(
        {
            "epoch": epoch,
            "train_s": train_s,
            "eval_s": eval_s,
            "calibration_s": calibration_s,
            "train_loss": 2.0 * np.exp(-0.05 * epoch),
            "val_accuracy": accuracy,
            "val_top1": accuracy,
            "val_top5": np.minimum(1.0, accuracy + 0.1),
            "samples": samples,
            "throughput_samples_per_s": samples / train_s,
            "elapsed_train_s": np.cumsum(train_s),
            "elapsed_wall_s": wall,
            "lr": 0.05 * global_batch / 64,
            "first_step_unix": 1.7e9,
        }
    )


def _steps(rng, workers: int, batch: int):
    """Every rank's 1,000 training steps and, at 2+ workers, the calibration pairs, as the recorder writes them."""
    import numpy as np
    import pandas as pd

    per_epoch = STEPS_PER_RANK // EPOCHS
    frames = []
    exposed = 0.0 if workers == 1 else 0.004 * np.log2(2 * workers)
    for rank in range(workers):
        n = STEPS_PER_RANK
        step = np.arange(n)
        data = np.full(n, 0.001)
        forward = 0.025 * batch / 64 * (1 + 0.05 * rng.standard_normal(n))
        backward_compute = 0.030 * batch / 64 * (1 + 0.05 * rng.standard_normal(n))
        optimizer = np.full(n, 0.003)
        backward = backward_compute + exposed
        step_s = data + forward + backward + optimizer
        frame = pd.DataFrame(
            {
                "epoch": step // per_epoch + 1,
                "step": step,
                "rank": rank,
                "node_rank": rank // 2,
                "local_rank": rank % 2,
                "kind": "train",
                "pair": -1,
                "warmup": step < WARMUP_STEPS,
                "samples": batch,
                "data_s": data,
                "forward_s": forward,
                "backward_s": backward,
                "optimizer_s": optimizer,
                "step_s": step_s,
                "allreduce_s": 2 * exposed,
                "exposed_comm_s": exposed,
                "compute_s": forward + backward - exposed + optimizer,
                "num_buckets": 0 if workers == 1 else 2,
            }
        )
        frames.append(frame)
        if workers > 1:
            m = EPOCHS * CALIBRATION_PAIRS * 2
            index = np.arange(m)
            epoch = index // (2 * CALIBRATION_PAIRS) + 1
            pair = (index // 2) % CALIBRATION_PAIRS
            sync = index % 2 == 1
            fb = 0.055 * batch / 64 + np.where(sync, 1.5 * exposed, 0.0) + 0.001 * rng.standard_normal(m)
            frames.append(
                pd.DataFrame(
                    {
                        "epoch": epoch,
                        "step": epoch * per_epoch - 1,
                        "rank": rank,
                        "node_rank": rank // 2,
                        "local_rank": rank % 2,
                        "kind": np.where(sync, "calib_sync", "calib_nosync"),
                        "pair": pair,
                        "warmup": False,
                        "samples": batch,
                        "data_s": 0.0,
                        "forward_s": 0.025 * batch / 64,
                        "backward_s": fb - 0.025 * batch / 64,
                        "optimizer_s": 0.0,
                        "step_s": fb,
                        "allreduce_s": 0.0,
                        "exposed_comm_s": 0.0,
                        "compute_s": fb,
                        "num_buckets": np.where(sync, 2, 0),
                    }
                )
            )
    steps = pd.concat(frames, ignore_index=True)
    steps["model_flops"] = steps["samples"] * PROFILE["train_flops"]
    steps["achieved_flops_per_s"] = steps["model_flops"] / steps["step_s"]
    return steps


def make_sweep(root: Path, repeats: int) -> tuple[Path, int]:
    """Write the sweep under root/sweep; returns (its path, number of runs)."""
    import numpy as np
    import pandas as pd
    import yaml

    from scaling.analysis.run_metrics import summarize_run
    from scaling.config import read_config_file
    from scaling.results import SweepDir, run_key, summary_row

    sweep = SweepDir(root / "sweep")
    sweep.runs_path.mkdir(parents=True)
    base = read_config_file(bl.REPO / "experiments" / "quickstart.yaml")
    base.pop("sweep", None)
    base["train"].update(max_epochs=EPOCHS, target_accuracy=TARGET)
    spec = {"workers": list(WORKERS), "repeats": repeats, "axes": {"train.per_worker_batch": list(BATCHES)}}
    sweep.spec_path.write_text(yaml.safe_dump({"base": base, "sweep": spec}, sort_keys=False))
    rows = []
    for batch in BATCHES:
        for workers in WORKERS:
            for repeat in range(repeats):
                axes = {"train.per_worker_batch": batch}
                key = run_key(workers, axes, repeat)
                rng = np.random.default_rng([workers, batch, repeat])
                run = sweep.run(key)
                run.path.mkdir()
                epochs = _epochs(rng, workers, batch, reaches=repeat % 10 != 9)
                steps = _steps(rng, workers, batch)
                figures = summarize_run(steps, epochs, TARGET, workers, PROFILE)
                figures.pop("ranks", None)  # the per-rank table: ranks.parquet, not the summary
                config = {
                    **base,
                    "workers": {**base["workers"], "num_workers": workers},
                    "train": {**base["train"], "per_worker_batch": batch, "seed": repeat},
                }
                summary = {
                    "schema_version": 1,
                    "run_id": key,
                    "name": "quickstart",
                    "model": "small_cnn",
                    "dataset": "embedded",
                    "backend": "gloo",
                    "launcher": "ray",
                    "num_workers": workers,
                    "num_nodes": max(1, workers // 2),
                    "workers_per_node": workers / max(1, workers // 2),
                    "per_worker_batch": batch,
                    "global_batch": workers * batch,
                    "seed": repeat,
                    "status": "reached_target" if figures["epochs_to_target"] is not None else "max_epochs",
                    "error": None,
                    "target_accuracy": TARGET,
                    "target_metric": "top1",
                    "precision": "fp32",
                    "channels_last": False,
                    "compile": False,
                    "grad_compression": "none",
                    "step_timing": True,
                    **figures,
                    "inject_comm_delay_s": 0.0,
                    "node_price_per_hour": 0.5,
                    "started_at": "2025-01-01T00:00:00+00:00",
                    "run_wall_s": float(epochs["elapsed_wall_s"].iloc[-1]) + 5,
                    "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "ray": "2.60.0"},
                    "hardware": {
                        "hostname": "bench",
                        "cpu_model": "generated",
                        "cpu_count": 2,
                        "gpu_name": None,
                        "gpu_count": 0,
                    },
                }
                run.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
                run.compute_profile_path.write_text(json.dumps(PROFILE))
                run.summary_path.write_text(json.dumps(summary, indent=2))
                epochs.to_parquet(run.epochs_path, index=False)
                steps.to_parquet(run.steps_path, index=False)
                rows.append(summary_row(summary, key, repeat, axes))
    pd.DataFrame(rows).to_parquet(sweep.index_path, index=False)
    return sweep.path, len(rows)


def time_cli(sweep: Path) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(
        [str(Path(sys.executable).parent / "scaling"), "report", str(sweep)],
        cwd=bl.REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"scaling report failed: {out.stderr[-1500:]}")
    return elapsed


def time_in_process(sweep: Path) -> float:
    from rich.console import Console

    from scaling.report import write_report

    t0 = time.perf_counter()
    write_report(sweep, console=Console(file=io.StringIO(), width=80))
    return time.perf_counter() - t0


def breakdown_in_process(sweep: Path) -> dict:
    """One in-process report with its phases timed by wrappers (no profiler overhead): reading the
    sweep (`SweepDir.read`), drawing the figures (each `*_figure` of scaling/plots/figures.py), saving
    them (`save`: PNG + SVG), printing the tables (rich), and the rest (tables, markdown)."""
    import functools

    from rich.console import Console

    import scaling.plots.figures as figures_module
    import scaling.report as report_module
    from scaling.results import SweepDir

    spent = {"read_sweep_s": 0.0, "build_figures_s": 0.0, "save_figures_s": 0.0, "print_tables_s": 0.0}

    def timed(key, function):
        @functools.wraps(function)  # keeps a figure function's heading and caption
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - t0

        return wrapper

    class TimedConsole(Console):
        def print(self, *args, **kwargs):
            return timed("print_tables_s", super().print)(*args, **kwargs)

    # a phase whose function is gone is left at 0 (counted in other_s)
    drawing = [(figures_module, name, "build_figures_s") for name in dir(figures_module) if name.endswith("_figure")]
    targets = [(SweepDir, "read", "read_sweep_s"), *drawing, (figures_module, "save", "save_figures_s")]
    originals = [(module, attr, getattr(module, attr)) for module, attr, _ in targets if hasattr(module, attr)]
    for module, attr, key in targets:
        if hasattr(module, attr):
            setattr(module, attr, timed(key, getattr(module, attr)))
    try:
        t0 = time.perf_counter()
        report_module.write_report(sweep, console=TimedConsole(file=io.StringIO(), width=80))
        total = time.perf_counter() - t0
    finally:
        for module, attr, function in originals:
            setattr(module, attr, function)
    spent["other_s"] = total - sum(spent.values())
    spent["total_s"] = total
    return spent


def profile_in_process(sweep: Path, top: int = 25) -> tuple[float, str]:
    from rich.console import Console

    from scaling.report import write_report

    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.runcall(write_report, sweep, console=Console(file=io.StringIO(), width=80))
    elapsed = time.perf_counter() - t0
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.strip_dirs().sort_stats("cumulative").print_stats(top)
    return elapsed, text.getvalue()


def report_files(sweep: Path) -> list[str]:
    from scaling.results import SweepDir

    return sorted(p.name for p in SweepDir(sweep).report_path.iterdir())


def main() -> None:
    bench = bl.Benchmark(NAME, __doc__, quick="1 pair, no cProfile run (the sweep is the same 200 runs)", pairs=(2, 1))
    bench.parser.add_argument("--repeats", type=int, default=25, help="repeats per (workers, batch): 25 gives 200 runs")
    bench.parser.add_argument(
        "--keep", type=Path, help="write the sweep here and keep it (default: a temporary folder)"
    )
    args = bench.parse()
    pairs = args.pairs

    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp:
        root = args.keep.absolute() if args.keep else Path(tmp)
        t0 = time.perf_counter()
        sweep, n_runs = make_sweep(root, args.repeats)
        generate_s = time.perf_counter() - t0
        size_mb = sum(p.stat().st_size for p in sweep.rglob("*") if p.is_file()) / 1e6
        print(
            f"[{NAME}] generated {n_runs} runs x {EPOCHS} epochs ({size_mb:.0f} MB) in {generate_s:.1f} s", flush=True
        )
        warm_s = time_in_process(sweep)  # untimed: imports, font cache
        print(f"[{NAME}] first in-process report (untimed warm-up): {warm_s:.2f} s", flush=True)
        sequence = []
        for i, arm in enumerate(bl.abba(pairs, "cli", "in-process")):
            elapsed = time_cli(sweep) if arm == "cli" else time_in_process(sweep)
            sequence.append((arm, elapsed))
            print(f"[{NAME}] {arm}: {elapsed:.2f} s", flush=True)
        files = report_files(sweep)
        phases = breakdown_in_process(sweep)
        print(f"[{NAME}] phases: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
        profiled_s, profile_text = (None, "") if args.quick else profile_in_process(sweep)
        if profiled_s is not None:
            print(f"[{NAME}] under cProfile: {profiled_s:.2f} s", flush=True)

    cli_s = bl.median(v for arm, v in sequence if arm == "cli")
    inproc_s = bl.median(v for arm, v in sequence if arm == "in-process")
    comparisons = [
        bl.comparison(
            f"analysis speed: scaling report, {n_runs} runs x {EPOCHS} epochs",
            "`scaling report` CLI (fresh process)",
            "write_report() in-process, warm",
            cli_s,
            inproc_s,
            "s",
            bl.ratio(cli_s, inproc_s),
            "cli / in-process (the part of the CLI's time that is interpreter start and imports)",
            BUDGET_S,
            "CLI wall time <= 10 s",
            budget_on="a",
            note=f"medians of {pairs} each; report.md + 7 figures (PNG + SVG) + every table printed",
        )
    ]
    bench.finish(
        comparisons,
        sweep={
            "runs": n_runs,
            "workers": list(WORKERS),
            "per_worker_batch": list(BATCHES),
            "repeats": args.repeats,
            "epochs_per_run": EPOCHS,
            "train_steps_per_rank": STEPS_PER_RANK,
            "calibration_pairs_per_epoch": CALIBRATION_PAIRS,
            "size_mb": round(size_mb, 1),
            "generate_s": generate_s,
        },
        arms={"cli": ".venv/bin/scaling report SWEEP", "in-process": "scaling.report.write_report(SWEEP, console=...)"},
        timings=[{"order": i, "arm": arm, "s": s} for i, (arm, s) in enumerate(sequence)],
        first_in_process_s=warm_s,
        report_files=files,
        phases_in_process=phases,
        profile={"wall_s_under_cprofile": profiled_s, "top_cumulative": profile_text.splitlines()},
    )


if __name__ == "__main__":
    main()
