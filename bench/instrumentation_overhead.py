"""The instrument's cost, with the arms' steps interleaved in the same processes: the lab's loop
on the quickstart against a bare DDP loop (plain launcher, 2 workers), and `--job own` the user's
job of examples/own_job with the instrument against the same job without it (Ray launcher);
budget: <= 1.03 on both.

The lab's loop (default): what each worker of `scaling run experiments/quickstart.yaml --launcher
local --workers 2` runs (scaling/train/loop.py `train_worker`: its instrument with per-step
timing, the DDP timing hook, its LR schedule and bookkeeping), with a bare DDP job stepping before
each of its batches is handed over (bench/benchlib.py `lab_with_bare_steps`). The bare job
(`BareDdp`) is the same model from the registry made the same way (the config's precision and
memory layout), wrapped in `DistributedDataParallel` with the config's bucket size and no comm
hook, the same SGD, over the same dataset object's batches: per step forward, cross-entropy,
backward, `optimizer.step()`, `zero_grad()`. The lab's window runs from the end of one bare step
to the start of the next (one whole lab step and the making of its next batch), the bare window
is the bare step; both timed by wall clock on rank 0 and by the processes' CPU time, summed over
the ranks (`StepWindows`). `train.eval_every=1` (no evaluation inside an epoch),
`train.target_accuracy=1.0` (every epoch trains), `instrument.calibration_pairs=0`,
`data.val_samples=512`: what the epoch's end does lies outside the windows, as outside `train_s`.

A block is an epoch (64 steps per worker and arm); its ratio the lab's mean step over the bare
one's; each run's first epoch is left out. The verdict is the interval's, for both figures: the
median block ratio and its 95% order-statistic (sign-test) interval (bench/benchlib.py
`median_order_interval`: it holds for any spread of the ratios, outliers included, and exists
from 6 blocks on); "pass" when its upper end is <= 1.03, "miss" when its lower end is > 1.03,
else "undecided: more pairs needed", in which case another pair of processes runs, up to
`--max-minutes`.

Why steps and not whole runs: run against run, this benchmark's pairs (the same runs with
`instrument.step_timing` true and false, alternating) spread 0.87 to 1.09 on a quiet 2-CPU VM
and read 0.950 [0.883, 1.005] (the committed result before the interleaved design): the machine's
speed moves from one stretch of seconds to the next, and steps taken turn about see the same
stretches (bench/fsdp_overhead.py's docstring has a null comparison).

    .venv/bin/python bench/instrumentation_overhead.py
        # 16 epochs (about 4 min), more while undecided, at most 15 min
    .venv/bin/python bench/instrumentation_overhead.py --quick      # 2 short epochs (no interval: a check that it runs)
    .venv/bin/python bench/instrumentation_overhead.py --job own    # the user's job (runs of 13 epochs, at most 20 min)

`--job own` measures the instrument on a user's own job (examples/own_job: a small vision
transformer in a Ray Train quickstart-shaped train function, instrumented through the public
`scaling.instrument.attach`), under the Ray launcher, with 8,192 training samples (an epoch has
128 steps per worker), against the same job without the instrument at all. Its two jobs run in
one Ray Train run, their steps interleaved one by one on the same workers
(bench/own_job_interleaved.py: `scaling run examples/own_job/sweep.yaml --launcher ray --set
train.function=bench.own_job_interleaved:train_func`): a block is one epoch, its ratio the
instrumented job's mean step over the bare job's in that epoch (wall clock on rank 0; CPU, the
processes' CPU time summed over the ranks); each run's first epoch is left out; the verdict is
the interval of the median block ratio, as above. The first run holds `--epochs` epochs; while a
verdict is undecided, another run does, up to `--max-minutes`. Why steps and not whole runs:
pairs of whole runs of this job, even inside one Ray Train run, spread 0.84 to 1.21 (48 pairs:
the committed result before this design, docs/benchmarks.md), from one stretch of seconds to
the next; steps of the two jobs interleaved see the same stretches (bench/fsdp_overhead.py's
docstring). It writes instrumentation_overhead_own_job.json.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from pathlib import Path

import benchlib as bl
from benchjobs import BareDdp

NAME = "instrumentation_overhead"
BUDGET = 1.03
CONFIG = "experiments/quickstart.yaml"
WORKERS = 2


def lab_overrides(epochs: int, quick: bool) -> list[str]:
    """The quickstart as a timing run of `epochs` epochs: every epoch trains, evaluations only at epochs' ends."""
    return [*bl.steady_run_overrides(epochs, quick), "train.eval_every=1"]


def _lab_worker(rank: int, world_size: int, port: int, config: dict, tmp: str, tag: str) -> None:
    """One rank: the lab's loop with the bare job's steps interleaved; its windows to JSON."""
    import torch
    import torch.distributed as dist

    from scaling.config import from_dict
    from scaling.launch.local import exit_without_finalization, release_process_group
    from scaling.train.loop import WorkerContext, set_up_worker

    cfg = from_dict(config)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    ctx = WorkerContext(rank=rank, world_size=world_size, local_rank=rank, node_rank=0, device=torch.device("cpu"))
    set_up_worker(cfg, ctx)  # as the plain launcher's worker (scaling/train/loop.py run_worker)
    windows = bl.StepWindows()
    bl.lab_with_bare_steps(cfg, ctx, Path(tmp) / f"{tag}-lab", lambda dataset: BareDdp(cfg, ctx, dataset), windows)
    windows.close()
    Path(tmp, f"{tag}-rank{rank}.json").write_text(json.dumps(windows.rows))
    release_process_group()
    exit_without_finalization()  # as the plain launcher's workers leave (gloo's threads at finalization)


def measure_lab_pair(index: int, cfg, tmp: str) -> list[dict]:
    """One pair of processes: its blocks (epochs after the first), each with both arms' mean step."""
    import torch.multiprocessing as mp

    from scaling.testbed.local_cluster import free_port

    tag = f"pair{index:02d}"
    mp.spawn(_lab_worker, args=(WORKERS, free_port(), cfg.to_dict(), tmp, tag), nprocs=WORKERS, join=True)
    per_rank = [json.loads(Path(tmp, f"{tag}-rank{rank}.json").read_text()) for rank in range(WORKERS)]
    blocks = [b for b in bl.block_means(per_rank, ("lab", "bare")) if b["block"] > 1]
    for b in blocks:
        b["processes"] = index
        print(
            f"[{NAME}] processes {index + 1}, epoch {b['block']}: lab / bare step "
            f"{b['lab']['wall_s'] / b['bare']['wall_s']:.3f} ({b['lab']['wall_s'] * 1e3:.1f} / "
            f"{b['bare']['wall_s'] * 1e3:.1f} ms), CPU {b['lab']['cpu_s'] / b['bare']['cpu_s']:.3f}",
            flush=True,
        )
    for path in Path(tmp).glob(f"{tag}-*"):
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
    return blocks


def interleaved_rows(blocks: list[dict], arm: str, label: str, bare_label: str, what: str, origin: str) -> list[dict]:
    """Two rows (step time, workers' CPU per step) of `arm` / bare over the blocks, each decided by its interval."""
    rows = []
    for key, unit, figure, measured in (
        ("wall_s", "s/step", "step time", "mean step, wall clock on rank 0"),
        ("cpu_s", "CPU s/step", "workers' CPU per step", "mean CPU seconds per step, summed over the ranks"),
    ):
        ratios = [b[arm][key] / b["bare"][key] for b in blocks if b["bare"][key] > 0]
        gc_share = {
            x: sum(b[x]["gc_s"] * b[x]["steps"] for b in blocks)
            / max(1e-12, sum(b[x]["wall_s"] * b[x]["steps"] for b in blocks))
            for x in (arm, "bare")
        }
        rows.append(
            bl.comparison(
                f"instrumentation overhead ({figure})",
                label,
                bare_label,
                bl.median(b[arm][key] for b in blocks),
                bl.median(b["bare"][key] for b in blocks),
                unit,
                bl.median(ratios),
                f"median over epochs of {arm} / bare {measured}, the two arms' steps interleaved in the epoch",
                BUDGET,
                f"{arm} / bare <= {BUDGET:g} on CPU, by the 95% interval of the median ratio",
                pair_ratios=ratios,
                decided_by_interval=True,
                note=f"{what}; {len(blocks)} epochs (blocks) from {origin}, the first left out; garbage collection "
                f"{100 * gc_share[arm]:.2f}% of the {arm} windows, {100 * gc_share['bare']:.2f}% of the bare ones; "
                f"block ratios {', '.join(f'{r:.3f}' for r in ratios)}",
            )
        )
    return rows


def lab_figures(blocks: list[dict], epochs: int) -> list[dict]:
    pairs = len({b["processes"] for b in blocks})
    return interleaved_rows(
        blocks,
        "lab",
        "lab's loop (scaling run, step timing on)",
        "bare DDP loop",
        f"{CONFIG}, {WORKERS} workers, the lab's loop with a bare DDP job stepping before each of its batches",
        f"{pairs} pair(s) of processes of {epochs} epochs",
    )


def main_lab(args, bench: bl.Benchmark) -> None:
    """The lab's loop: pairs of processes while a verdict is undecided."""
    from scaling.config import load_config

    epochs = args.epochs or (2 if args.quick else 16)
    overrides = lab_overrides(epochs, args.quick)
    cfg = load_config(bl.REPO / CONFIG, overrides=overrides, num_workers=WORKERS)
    blocks: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        bl.measure_until_decided(
            lambda index: blocks.extend(measure_lab_pair(index, cfg, tmp)),
            lambda: lab_figures(blocks, epochs),
            bench.started,
            args.max_minutes,
            NAME,
            f"a pair of processes, {epochs} epochs",
            once=args.quick,
        )
    comparisons = lab_figures(blocks, epochs)
    cli = f".venv/bin/scaling run {CONFIG} --launcher local --workers {WORKERS} " + " ".join(
        f"--set {shlex.quote(o)}" for o in overrides
    )
    bench.finish(
        comparisons,
        config=CONFIG,
        workers=WORKERS,
        epochs_per_run=epochs,
        overrides=overrides,
        arms={
            "lab": f"scaling/train/loop.py train_worker, as `{cli} --out DIR` runs it on each worker",
            "bare": "bench/instrumentation_overhead.py BareDdp",
        },
        block_ratios={key: [b["lab"][key] / b["bare"][key] for b in blocks] for key in ("wall_s", "cpu_s")},
        blocks=blocks,
    )


OWN_FUNCTION = "bench.own_job_interleaved:train_func"
OWN_ARMS = ("instrumented", "bare")


def measure_own_run(index: int, overrides: list[str], workers: int, tmp: str, name: str) -> list[dict]:
    """One Ray Train run of the two interleaved jobs (bench/own_job_interleaved.py): its blocks
    (epochs after the first), each with both jobs' mean step."""
    import json

    import own_job_interleaved as interleaved

    from scaling.config import load_config
    from scaling.launch.run import execute_run

    cfg = load_config(
        bl.REPO / "examples/own_job/sweep.yaml",
        num_workers=workers,
        overrides=[*overrides, f"train.function={OWN_FUNCTION}"],
    )
    run_dir = (Path(tmp) / f"run{index:02d}").resolve()
    summary = execute_run(cfg, run_dir, launcher="ray")
    if summary["status"] == "failed":
        raise RuntimeError(f"Ray Train run {index + 1} failed: {summary['error']}")
    per_rank = [json.loads(Path(interleaved.windows_file(str(run_dir), rank)).read_text()) for rank in range(workers)]
    blocks = [b for b in bl.block_means(per_rank, OWN_ARMS) if b["block"] > 1]
    for b in blocks:
        b["run"] = index
        a, bare = b["instrumented"], b["bare"]
        print(
            f"[{name}] run {index + 1}, epoch {b['block']}: instrumented / bare step "
            f"{a['wall_s'] / bare['wall_s']:.3f} "
            f"({a['wall_s'] * 1e3:.1f} / {bare['wall_s'] * 1e3:.1f} ms), CPU {a['cpu_s'] / bare['cpu_s']:.3f}",
            flush=True,
        )
    shutil.rmtree(run_dir, ignore_errors=True)
    return blocks


def own_figures(blocks: list[dict], workers: int, epochs: int) -> list[dict]:
    runs = len({b["run"] for b in blocks})
    return interleaved_rows(
        blocks,
        "instrumented",
        "instrumented (attach, as examples/own_job attaches it)",
        "bare (the same job, no instrument)",
        f"examples/own_job/sweep.yaml, {workers} workers, ray launcher, the job twice in one Ray Train run "
        "(bench/own_job_interleaved.py)",
        f"{runs} run(s) of {epochs} epochs",
    )


def main_own(args, bench: bl.Benchmark) -> None:
    """--job own: Ray Train runs of the interleaved jobs, another while a verdict is undecided."""
    name = bench.name = f"{NAME}_own_job"  # its own result file
    epochs = args.epochs or (2 if args.quick else 13)
    overrides = [*bl.steady_run_overrides(epochs, args.quick), "train.function_config.num_train=8192"]
    blocks: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-instr-own-") as tmp:
        bl.measure_until_decided(
            lambda index: blocks.extend(measure_own_run(index, overrides, args.workers, tmp, name)),
            lambda: own_figures(blocks, args.workers, epochs),
            bench.started,
            args.max_minutes,
            name,
            f"a Ray Train run, {epochs} epochs of both jobs",
            once=args.quick,
        )
    comparisons = own_figures(blocks, args.workers, epochs)
    cli = f".venv/bin/scaling run examples/own_job/sweep.yaml --launcher ray --workers {args.workers} " + " ".join(
        f"--set {shlex.quote(o)}" for o in [*overrides, f"train.function={OWN_FUNCTION}"]
    )
    bench.finish(
        comparisons,
        config="examples/own_job/sweep.yaml",
        workers=args.workers,
        epochs_per_run=epochs,
        overrides=overrides,
        arms={"both, interleaved": f"{cli} --out DIR (bench/own_job_interleaved.py)"},
        block_ratios={key: [b["instrumented"][key] / b["bare"][key] for b in blocks] for key in ("wall_s", "cpu_s")},
        blocks=blocks,
    )


def main() -> None:
    bench = bl.Benchmark(NAME, __doc__, quick="one run of 2 short epochs (a check that it runs)")
    bench.parser.add_argument(
        "--max-minutes",
        type=float,
        help="no further pair of processes (own: run) starts once it would end after this (default 15; own 20)",
    )
    bench.parser.add_argument(
        "--epochs",
        type=int,
        help="epochs per pair of processes (own: per run), the first left out (default: lab 16, own 13; quick 2)",
    )
    bench.parser.add_argument("--workers", type=int, default=2, help="--job own: workers (default 2)")
    bench.parser.add_argument(
        "--job",
        choices=("lab", "own"),
        default="lab",
        help="lab: the lab's loop on the quickstart; own: the user's job of examples/own_job (Ray launcher)",
    )
    args = bench.parse()
    if args.epochs is not None and args.epochs < 2:
        bench.parser.error("--epochs must be 2 or more: the first epoch is left out")
    if args.max_minutes is None:
        args.max_minutes = 20.0 if args.job == "own" else 15.0
    (main_own if args.job == "own" else main_lab)(args, bench)


if __name__ == "__main__":  # torch.multiprocessing and Ray Train's workers re-import this module
    main()
