"""Records that scale: rank 0's per-epoch recording cost against the number of ranks, and the
run summary and `scaling report` on a sweep whose largest run has 1,024 ranks x 90 epochs x 300
steps. Budgets (what a user would wait for):

- rank 0's per-epoch recording cost: at most 50 ms of CPU per epoch of 300 steps at every rank
  count measured (1% of a 5 s epoch), and it must not grow with the cluster the way the
  replaced design did (its growth from 2 to 32 ranks is reported beside the gathered design's).
- the summary of the 1,024-rank run (every rank's step records read by column, in batches,
  aggregated; 29.5 M rows in 92,160 files): <= 900 s and <= 2 GiB peak memory. It runs once,
  when a run of 90 ImageNet epochs on 1,024 GPUs (hours to days) ends; it is bound by opening
  92,160 files, and its memory must not grow with them.
- `scaling report` on the sweep: <= 30 s and <= 1 GiB: a report is read many times.

Part 1 runs N gloo processes (N = 2, 4, 8, 16, 32) of the recorder on this machine; every rank
hands it 300 training steps and 20 calibration steps per epoch (synthetic marks on the host
clock, one bucket each, as a tiny model gives) and rank 0 measures the CPU time of its process
in `end_epoch`, median over 5 epochs. CPU time, not wall time: with up to 32 processes on 2
cores, rank 0's wall time would be the other ranks' work on its cores. Arm A is the recorder
(scaling/instrument/recorder.py: each rank writes its own part); arm B is the design it replaced, re-enacted here: every
rank's rows gathered to rank 0 with `gather_object` once per epoch and written there.

Part 2 generates the sweep (runs of 1, 8, 64 and 1,024 ranks, one repeat each, realistic
column types and values; the generation is not timed), then times, each in its own process
(peak memory = its own maximum resident set size), `scaling.launch.finish.write_summary` on the
1,024-rank run and `scaling report` on the sweep.

    .venv/bin/python bench/records_scale.py            # about 10 min here (most of it generating files)
    .venv/bin/python bench/records_scale.py --quick    # 2-8 ranks; a 64-rank x 10-epoch largest run
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl

NAME = "records_scale"
STEPS, CALIB_PAIRS, EPOCHS_TIMED = 300, 10, 5
RECORDING_BUDGET_S = 0.05
SUMMARY_BUDGET_S, SUMMARY_BUDGET_GIB = 900.0, 2.0
REPORT_BUDGET_S, REPORT_BUDGET_GIB = 30.0, 1.0


# --- part 1: rank 0's per-epoch recording time ----------------------------------------------


def _marks(epoch: int, base_step: int, rank: int):
    from scaling.instrument.timing import BucketMarks, StepMarks

    marks, t = [], 1000.0 * epoch
    for i in range(STEPS):
        t += 0.05
        marks.append(
            StepMarks.single(
                epoch,
                base_step + i,
                "train",
                False,
                64,
                t,
                (t + 0.001, t + 0.012, t + 0.035, t + 0.04),
                [BucketMarks(0, t + 0.03, t + 0.034 + 0.001 * rank)],
            )
        )
    for pair in range(CALIB_PAIRS):
        for kind in ("calib_nosync", "calib_sync"):
            t += 0.05
            marks.append(
                StepMarks.single(
                    epoch,
                    base_step + STEPS - 1,
                    kind,
                    False,
                    64,
                    t,
                    (t, t + 0.012, t + 0.035, t + 0.035),
                    [BucketMarks(0, t + 0.03, t + 0.034)] if kind == "calib_sync" else [],
                    pair=pair,
                )
            )
    return marks


def _recording_worker(rank: int, world: int, port: int, arm: str, run_dir: str, out: str) -> None:
    import pandas as pd
    import torch
    import torch.distributed as dist

    from scaling.instrument.recorder import RunRecorder
    from scaling.instrument.timing import Clock
    from scaling.results import write_parquet_atomic

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    recorder = RunRecorder(Clock(), rank, 0, rank, Path(run_dir))
    times = []
    for epoch in range(1, EPOCHS_TIMED + 2):  # the first epoch warms up imports and the file system
        for marks in _marks(epoch, (epoch - 1) * STEPS, rank):
            recorder.step(marks)
        row = {"epoch": epoch, "train_s": 15.0, "samples": STEPS * 64 * world}
        dist.barrier()
        start = time.process_time()  # CPU of rank 0's process (all its threads): N processes share 2 cores here,
        # so rank 0's wall time would measure the other ranks' work on its cores, not its own cost
        if arm == "per_rank":
            recorder.end_epoch(row)
        else:  # the replaced design: every rank's rows through rank 0, once per epoch
            rows = [recorder._resolved(m) for m in recorder._pending]
            recorder._pending = []
            gathered = [None] * world if rank == 0 else None
            dist.gather_object(rows, gathered, dst=0)
            if rank == 0:
                frame = pd.DataFrame([r for part in gathered for r in part])
                write_parquet_atomic(Path(run_dir) / "steps-gathered" / f"epoch{epoch:05d}.parquet", frame)
        if arm != "per_rank":
            dist.barrier()  # the gathered design's rank 0 is done when every rank's rows are written
        elapsed = time.process_time() - start
        if epoch > 1:
            times.append(elapsed)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()
    os._exit(0)


def recording_time(world: int, arm: str, tmp: Path) -> float:
    import torch.multiprocessing as mp

    from scaling.testbed.local_cluster import free_port

    port = free_port()
    out = tmp / f"rank0-{arm}-{world}.json"
    mp.start_processes(
        _recording_worker,
        args=(world, port, arm, str(tmp / f"run-{arm}-{world}"), str(out)),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    return statistics.median(json.loads(out.read_text()))


# --- part 2: a generated sweep with a 1,024-rank run ---------------------------------------


def _write_rank_parts(args) -> None:
    run_dir, ranks, epochs, steps = args
    import numpy as np
    import pandas as pd

    from scaling.results import STEPS_PARQUET, rank_part_path, write_parquet_atomic

    rng = np.random.default_rng(ranks[0])
    for rank in ranks:
        for epoch in range(1, epochs + 1):
            n = steps + 2 * CALIB_PAIRS
            step_s = rng.normal(0.1, 0.005, n)
            frame = pd.DataFrame(
                {
                    "epoch": np.full(n, epoch),
                    "step": (epoch - 1) * steps + np.minimum(np.arange(n), steps - 1),
                    "kind": ["train"] * steps + ["calib_nosync", "calib_sync"] * CALIB_PAIRS,
                    "pair": np.r_[np.full(steps, -1), np.repeat(np.arange(CALIB_PAIRS), 2)],
                    "warmup": (epoch == 1) & (np.arange(n) < 5),
                    "samples": np.full(n, 256),
                    "data_s": rng.normal(0.002, 1e-4, n),
                    "forward_s": step_s * 0.3,
                    "backward_s": step_s * 0.6,
                    "optimizer_s": step_s * 0.1 - 0.002,
                    "step_s": step_s,
                    "allreduce_s": step_s * 0.4,
                    "exposed_comm_s": step_s * 0.05,
                    "compute_s": step_s * 0.95,
                    "num_buckets": np.full(n, 5),
                    "rank": np.full(n, rank),
                    "node_rank": np.full(n, rank // 8),
                    "local_rank": np.full(n, rank % 8),
                    "model_flops": np.full(n, 256 * 24.3e9),
                    "achieved_flops_per_s": 256 * 24.3e9 / step_s,
                }
            )
            write_parquet_atomic(rank_part_path(Path(run_dir) / STEPS_PARQUET, rank, epoch), frame)


def generate_sweep(root: Path, worker_counts: list[int], epochs: int, steps: int) -> Path:
    """A sweep directory as `scaling sweep` leaves it, with generated records (module docstring)."""
    from multiprocessing import Pool

    import pandas as pd

    from scaling.results import SweepDir, run_key, write_json_atomic, write_parquet_atomic

    sweep = SweepDir(root / "sweep")
    jobs = []
    for n in worker_counts:
        run = sweep.run(run_key(n, {}, 0))
        epoch_rows = pd.DataFrame(
            {
                "epoch": range(1, epochs + 1),
                "train_s": [steps * 0.1] * epochs,
                "eval_s": 2.0,
                "calibration_s": 1.0,
                "samples": steps * 256 * n,
                "val_accuracy": [min(0.76, 0.3 + 0.01 * e) for e in range(1, epochs + 1)],
                "elapsed_train_s": [steps * 0.1 * e for e in range(1, epochs + 1)],
                "elapsed_wall_s": [steps * 0.1 * e + 3 * e for e in range(1, epochs + 1)],
            }
        )
        write_parquet_atomic(run.epochs_path, epoch_rows)
        write_json_atomic(
            run.machine_path,
            {
                "hostname": "generated",
                "cpu_model": "generated",
                "cpu_count": 64,
                "gpu_name": "NVIDIA H100 80GB HBM3",
                "gpu_count": 8,
            },
        )
        chunks = [list(range(start, min(n, start + 16))) for start in range(0, n, 16)]
        jobs += [(str(run.path), chunk, epochs, steps) for chunk in chunks]
    with Pool(os.cpu_count() or 1) as pool:
        pool.map(_write_rank_parts, jobs, chunksize=1)
    return sweep.path


SUMMARY_CHILD = """
import json, resource, sys, time, datetime as dt
from pathlib import Path
from scaling.launch.finish import write_summary
run_dir, n = Path(sys.argv[1]), int(sys.argv[2])
start = time.perf_counter()
summary = write_summary(run_dir, {"name": "generated", "model": "resnet50", "dataset": "generated", "backend": "nccl",
                                  "launcher": "ray", "num_workers": n, "per_worker_batch": 256, "global_batch": 256 * n,
                                  "seed": 0, "target_accuracy": 0.749, "target_metric": "top1"},
                        status=None, error=None, started_at=dt.datetime.now(dt.timezone.utc), wall_s=0.0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss_bytes": peak,
                  "step_s": summary["step_s"], "num_nodes": summary["num_nodes"]}))
"""

REPORT_CHILD = """
import json, resource, sys, time
from rich.console import Console
from scaling.report import write_report
start = time.perf_counter()
write_report(sys.argv[1], Console(file=open("/dev/null", "w")))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss_bytes": peak}))
"""


def _child(code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=bl.REPO)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    bench = bl.Benchmark(NAME, __doc__, quick="2-8 ranks; a 64-rank x 10-epoch largest run")
    args = bench.parse()
    worlds = [2, 4, 8] if args.quick else [2, 4, 8, 16, 32]
    sweep_counts, epochs = ([1, 8, 64], 10) if args.quick else ([1, 8, 64, 1024], 90)
    from scaling.results import SweepDir, run_key

    comparisons, measured, costs = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-records-") as tmp:
        tmp = Path(tmp)
        for world in worlds:
            for arm in ("per_rank", "gathered"):
                measured[(arm, world)] = recording_time(world, arm, tmp)
                print(
                    f"[{NAME}] {world:3d} ranks, {arm:9s}: rank 0's end_epoch {measured[(arm, world)] * 1e3:.1f} ms "
                    "CPU",
                    flush=True,
                )
        small, large = worlds[0], worlds[-1]
        growth = measured[("per_rank", large)] / measured[("per_rank", small)]
        gathered_growth = measured[("gathered", large)] / measured[("gathered", small)]
        worst = max(measured[("per_rank", w)] for w in worlds)
        comparisons.append(
            bl.comparison(
                f"rank 0's per-epoch recording CPU, {small} to {large} ranks (worst)",
                "per-rank parts",
                "",
                worst,
                None,
                "CPU s/epoch",
                growth,
                f"rank 0's CPU time in end_epoch at {large} ranks / at {small} ranks (median over {EPOCHS_TIMED} "
                "epochs of "
                f"{STEPS} steps); the replaced design (every rank's rows gathered to rank 0): {gathered_growth:.2f}",
                RECORDING_BUDGET_S,
                f"<= {RECORDING_BUDGET_S * 1e3:g} ms CPU per epoch at every rank count",
                budget_on="a",
                note="; ".join(
                    f"{w} ranks: per-rank parts {measured[('per_rank', w)] * 1e3:.1f} ms, gathered to rank 0 "
                    f"{measured[('gathered', w)] * 1e3:.1f} ms"
                    for w in worlds
                ),
            )
        )

        t0 = time.perf_counter()
        sweep = generate_sweep(tmp, sweep_counts, epochs, STEPS)
        largest = sweep_counts[-1]
        print(
            f"[{NAME}] generated the sweep ({largest} ranks x {epochs} epochs x {STEPS} steps in the largest run) "
            f"in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        for n in sweep_counts:  # summaries of the smaller runs (not timed), so that the sweep is reportable
            result = _child(SUMMARY_CHILD, str(SweepDir(sweep).run(run_key(n, {}, 0)).path), str(n))
        rows = largest * epochs * (STEPS + 2 * CALIB_PAIRS)
        print(
            f"[{NAME}] summary of the {largest}-rank run ({rows:,} step rows): {result['seconds']:.1f} s, "
            f"peak {result['peak_rss_bytes'] / 2**30:.2f} GiB",
            flush=True,
        )
        comparisons.append(
            bl.comparison(
                f"run summary of a {largest}-rank x {epochs}-epoch x {STEPS}-step run",
                "write_summary",
                "",
                result["seconds"],
                None,
                "s",
                None,
                "",
                SUMMARY_BUDGET_S,
                f"<= {SUMMARY_BUDGET_S:g} s and <= {SUMMARY_BUDGET_GIB:g} GiB peak",
                budget_on="a",
                note=f"{rows:,} step rows in {largest * epochs:,} files, read by column in batches; peak resident "
                "memory "
                f"{result['peak_rss_bytes'] / 2**30:.2f} GiB (budget {SUMMARY_BUDGET_GIB:g} GiB: "
                f"{'pass' if result['peak_rss_bytes'] <= SUMMARY_BUDGET_GIB * 2**30 else 'miss'})",
            )
        )
        costs["summary"] = result
        report = _child(REPORT_CHILD, str(sweep))
        print(
            f"[{NAME}] scaling report on the sweep: {report['seconds']:.1f} s, peak "
            f"{report['peak_rss_bytes'] / 2**30:.2f} GiB",
            flush=True,
        )
        comparisons.append(
            bl.comparison(
                f"scaling report on the sweep (largest run {largest} ranks)",
                "scaling report",
                "",
                report["seconds"],
                None,
                "s",
                None,
                "",
                REPORT_BUDGET_S,
                f"<= {REPORT_BUDGET_S:g} s and <= {REPORT_BUDGET_GIB:g} GiB peak",
                budget_on="a",
                note=f"runs of {', '.join(map(str, sweep_counts))} ranks; peak resident memory "
                f"{report['peak_rss_bytes'] / 2**30:.2f} GiB (budget {REPORT_BUDGET_GIB:g} GiB: "
                f"{'pass' if report['peak_rss_bytes'] <= REPORT_BUDGET_GIB * 2**30 else 'miss'})",
            )
        )
        costs["report"] = report
    bench.finish(
        comparisons,
        recording_s={f"{arm}@{w}": v for (arm, w), v in measured.items()},
        summary=costs["summary"],
        report=costs["report"],
        sweep_worker_counts=sweep_counts,
        epochs=epochs,
        steps=STEPS,
    )


if __name__ == "__main__":  # the spawned recorder processes re-import this module
    main()
