"""Ray Train's overhead: the same quickstart run (same loop, same config) launched with Ray Train
against the plain torch.distributed launcher, 2 workers; steady-state step time (budget: ray / local
<= 1.05) and start-up cost (command start -> first training step).

Arms (each run is the CLI, a fresh process, exactly as a user types it):
  A "ray"    scaling run experiments/quickstart.yaml --launcher ray   --workers 2 --set ... --out DIR
  B "local"  scaling run experiments/quickstart.yaml --launcher local --workers 2 --set ... --out DIR
with `train.target_accuracy=1.0` (every run trains `--epochs` epochs), `instrument.calibration_pairs=0`
and `data.val_samples=512` (neither is inside `train_s`). Runs alternate A B B A ... (at least
`--pairs` pairs; quick: `data.train_samples=2048` too); each records the mean number of runnable
tasks while it ran (bench/benchlib.py `RunQueue`), to show contention.

Why whole runs, and how they are judged. The other cost benchmarks interleave their arms' steps
in the same processes (bench/instrumentation_overhead.py, bench/fsdp_overhead.py: the machine's
speed moves from one stretch of seconds to the next, and steps taken turn about see the same
stretches). Here the arms are two launchers: a process is started by one or the other, so the
closest they can be is whole runs back to back, alternating A B B A so that a drift in the
machine's speed falls on both arms alike. Each pair (adjacent runs) gives one ratio, and the
verdict is the interval's, as in the step-interleaved benchmarks: the median pair ratio and its
95% order-statistic (sign-test) interval (bench/benchlib.py `median_order_interval`: it holds for
any spread of the ratios, a disturbed run included, and exists from 6 pairs on); "pass" when its
upper end is <= 1.05, "miss" when its lower end is > 1.05, else "undecided: more pairs needed",
in which case another pair runs, up to `--max-minutes` from the start. Ray's share of the step,
(ray - local) / ray = 1 - 1 / ratio, is written beside it (`ray_share_of_step`), with the same
interval.

- Steady-state step time: per run, the median over the epochs after the first of `train_s / steps`
  (epochs.parquet). Headline: median over adjacent (ray, local) pairs of ray / local.
- Start-up: `first_step_unix` (epochs.parquet: time.time() on rank 0 when its training loop began)
  minus time.time() taken just before the command was started. It includes the Python start and
  imports of the CLI, config checks and, for Ray, connecting the driver (`ray.init` to the running
  cluster), the Train controller and the worker group (actors, torch process group); for both, the
  per-worker set-up that precedes training (dataset generation, model build, FLOP count and the
  measured CPU roof). Ray runs against a private head started once for the benchmark (`ray start
  --head`, loopback, free ports, private temp dir, 2 CPUs, RAY_AUTH_MODE=disabled), warm: started
  before the first run, stopped by its process id at the end. The head runs during the local runs
  too, so both arms see its background load.
- CPU (bench/benchlib.py `TreeCpu`): while each run goes, the CPU time of the driver's and the
  Ray head's process trees is sampled from /proc. Over the training of the epochs after the first
  (windows from epochs.parquet): the training workers' CPU seconds per step, a view of the
  overhead that other jobs on the machine hardly move (headline: median over pairs of ray /
  local); and the cores used by everything but the training workers (Ray: the GCS, raylet,
  dashboard, Train controller and helper actors; both: the `scaling run` driver), with what the
  rest of the machine used meanwhile. On a 2-core machine whatever Ray runs beside the 2 workers
  is taken from them.
- Training thread (scaling/instrument/thread_usage.py, columns of epochs.parquet): rank 0's
  training thread's CPU seconds, involuntary context switches (preemptions) and minor page
  faults per step in the epochs after the first, and the share of the training wall time it was
  off its core. Under Ray the same loop needs the same CPU per step; what it loses is time
  preempted by Ray's own processes on its core (docs/benchmarks.md).
- `--pin`: the head (so every Ray process: GCS, raylet, dashboard, controller, helper actors,
  and the workers' own Ray threads) and both arms' drivers run under `taskset -c <last CPU>`, and
  the training threads are pinned to CPUs 0..workers-1 (`workers.pin_cpus`): the fix, where a
  CPU can be spared for Ray. Writes <name>_pinned.json.
- Cold cluster: separately, in a fresh process each, the time of `ray.init(address="local")`
  starting a new local cluster (private temp dir, its own ports, dashboard included as in a plain
  `ray.init()`), and of `ray.shutdown()`; and, for the benchmark's head, the time of `ray start
  --head` until `ray status` and the dashboard answer. A run on a new cluster pays about this on
  top of the warm start-up.

    .venv/bin/python bench/ray_overhead.py
        # 6 pairs x 3 epochs (about 4 min on 2 CPUs), more while a verdict is undecided, at most 25 min
    .venv/bin/python bench/ray_overhead.py --workers 1 --pairs 4   # a core left to Ray: ray_overhead_w1.json
    .venv/bin/python bench/ray_overhead.py --workers 1 --pin       # Ray on its own CPU: ray_overhead_w1_pinned.json
    .venv/bin/python bench/ray_overhead.py --quick    # 1 pair x 2 epochs (no interval: a check that it runs)
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl

from scaling.analysis.run_metrics import steady_step_s
from scaling.results import RunDir
from scaling.testbed.local_cluster import BIN, PrivateRayHead, ray_env

NAME = "ray_overhead"
DEFAULT_WORKERS = 2
# The fewest pairs with a 95% order-statistic interval of the median ratio (then [min, max]); pairs of
# runs have spread about +-15% on a busy 2-CPU VM, so more are added while the verdict is undecided.
DEFAULT_PAIRS = 6
DEFAULT_MAX_MINUTES = 25.0
STEP_BUDGET = 1.05
SETTLE_S = 3.0  # after the head answers, before the first run: its start-up work (dashboard, agent) settles


# Run in a fresh interpreter: a new local cluster, its start and its shutdown timed.
RAY_INIT_PROBE = r"""
import json, logging, sys, time
from scaling.testbed.local_cluster import free_port
t0 = time.time()
import ray
t1 = time.time()
ray.init(address="local", num_cpus=2, _temp_dir=sys.argv[1], dashboard_port=free_port(), logging_level=logging.WARNING)
t2 = time.time()
ray.shutdown()
t3 = time.time()
print(json.dumps({"import_ray_s": t1 - t0, "ray_init_local_s": t2 - t1, "ray_shutdown_s": t3 - t2}))
"""


def measure_ray_init() -> dict:
    temp_dir = tempfile.mkdtemp(prefix="brin-", dir="/tmp")
    env = ray_env()
    env.pop("RAY_ADDRESS", None)
    try:
        out = subprocess.run(
            [sys.executable, "-c", RAY_INIT_PROBE, temp_dir], env=env, capture_output=True, text=True, timeout=300
        )
        if out.returncode != 0:
            raise RuntimeError(f"ray.init probe failed: {out.stderr[-800:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def training_thread(epochs, global_batch: int) -> dict:
    """Rank 0's training thread in the epochs after the first (epochs.parquet, scaling/instrument/
    thread_usage.py): its CPU seconds, preemptions and minor page faults per step, and the share of
    the training wall time it was off its core."""
    steady = epochs[epochs["epoch"] > 1]
    steps = float((steady["samples"] / global_batch).sum())
    cpu, wall = float(steady["train_thread_cpu_s"].sum()), float(steady["train_s"].sum())
    return {
        "thread_cpu_s_per_step": cpu / steps,
        "thread_preemptions_per_step": float(steady["train_preemptions"].sum()) / steps,
        "thread_minor_faults_per_step": float(steady["train_minor_faults"].sum()) / steps,
        "thread_off_core_share": 1.0 - cpu / wall,
    }


def main() -> None:
    bench = bl.Benchmark(
        NAME,
        __doc__,
        quick="1 pair of 2-epoch runs, one ray.init probe",
        pairs=(DEFAULT_PAIRS, 1),
        epochs=(3, 2),
        config="experiments/quickstart.yaml",
    )
    bench.parser.add_argument(
        "--max-minutes",
        type=float,
        default=DEFAULT_MAX_MINUTES,
        help=f"while the step-time verdict is undecided, another pair runs unless it would end after this many "
        f"minutes from the start (default {DEFAULT_MAX_MINUTES:g}; quick: no more pairs)",
    )
    bench.parser.add_argument("--init-probes", type=int, help="cold ray.init measurements (default 2; quick 1)")
    bench.parser.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help=f"training workers (default {DEFAULT_WORKERS}; another count writes ray_overhead_w<N>.json)",
    )
    bench.parser.add_argument(
        "--pin",
        action="store_true",
        help="the Ray head (so every Ray process) and both arms' drivers on the last CPU, the training threads "
        "pinned to CPUs 0..workers-1 (workers.pin_cpus); needs a CPU to spare; writes <name>_pinned.json",
    )
    args = bench.parse()
    cpus = os.cpu_count() or 1
    if args.pin and args.workers >= cpus:
        bench.parser.error(
            f"--pin leaves the last CPU to Ray: use --workers {cpus - 1} or fewer on this {cpus}-CPU machine"
        )
    pairs, epochs = max(1, args.pairs), args.epochs
    probes = args.init_probes if args.init_probes is not None else (1 if args.quick else 2)

    print(f"[{NAME}] cold ray.init(address='local'): {probes} probe(s)", flush=True)
    init_probes = [measure_ray_init() for _ in range(probes)]

    overrides = [
        f"train.max_epochs={epochs}",
        "train.target_accuracy=1.0",
        "instrument.calibration_pairs=0",
        "data.val_samples=512",
        *(["data.train_samples=2048"] if args.quick else []),
    ]
    taskset = ["taskset", "-c", str(cpus - 1)] if args.pin else []
    if args.pin:
        overrides.append(f"workers.pin_cpus=0-{args.workers - 1}")
    head = PrivateRayHead(num_cpus=max(2, args.workers), taskset=taskset, settle_s=SETTLE_S, prefix="bray-")
    sequence_step, sequence_start, sequence_cpu, sequence_thread, runs = [], [], [], [], []
    tmp = tempfile.mkdtemp(prefix="bench-ray-")
    try:
        head.start()
        print(f"[{NAME}] private Ray head at {head.address} (up in {head.start_s:.1f} s)", flush=True)
        env = {**head.env, "RAY_ADDRESS": head.address}

        def run_one(i: int, arm: str) -> None:
            run_dir = Path(tmp) / f"run{i:02d}-{arm}"
            command = [
                *taskset,
                str(BIN / "scaling"),
                "run",
                args.config,
                "--launcher",
                arm,
                "--workers",
                str(args.workers),
                *[x for o in overrides for x in ("--set", o)],
                "--out",
                str(run_dir),
            ]
            print(f"[{NAME}] run {i + 1} (pair {i // 2 + 1}): {arm}", flush=True)
            log = Path(tmp) / f"run{i:02d}-{arm}.log"
            with open(log, "w") as out, bl.RunQueue() as rq, bl.TreeCpu([head.process.pid]) as cpu:
                launch_unix = time.time()
                proc = subprocess.Popen(command, cwd=bl.REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
                cpu.roots.append(proc.pid)
                proc.wait(timeout=900)
                end_unix = time.time()
            run = RunDir(run_dir)
            summary = run.summary() if run.has_summary else {}
            if proc.returncode != 0 or summary.get("status") == "failed":
                raise RuntimeError(f"{arm} run failed (exit {proc.returncode}):\n{log.read_text()[-2000:]}")
            epochs_table = run.epochs()
            step_s, epoch_rows = steady_step_s(epochs_table, summary["global_batch"])
            startup_s = float(epochs_table["first_step_unix"].iloc[0]) - launch_unix
            steady = bl.steady_cpu(cpu, epochs_table, summary["global_batch"])
            thread = training_thread(epochs_table, summary["global_batch"])
            sequence_thread.append((arm, thread))
            sequence_step.append((arm, step_s))
            sequence_start.append((arm, startup_s))
            sequence_cpu.append((arm, steady["worker_cpu_s_per_step"]))
            runs.append(
                {
                    "order": i,
                    "arm": arm,
                    "steady_step_s": step_s,
                    "startup_s": startup_s,
                    "mean_runnable": rq.mean,
                    **steady,
                    **thread,
                    "command_wall_s": end_unix - launch_unix,
                    "epochs": epoch_rows,
                }
            )
            print(
                f"[{NAME}]   steady-state step {step_s * 1e3:.2f} ms, start-up {startup_s:.2f} s, worker CPU "
                f"{steady['worker_cpu_s_per_step'] * 1e3:.1f} ms/step; rank 0's training thread "
                f"{thread['thread_cpu_s_per_step'] * 1e3:.1f} "
                f"ms CPU, {thread['thread_preemptions_per_step']:.1f} preemptions, "
                f"{thread['thread_minor_faults_per_step']:.0f} page "
                f"faults per step, off its core {thread['thread_off_core_share']:.1%} (runnable tasks {rq.mean}; cores "
                f"{steady['cores']})",
                flush=True,
            )

        def undecided() -> bool:
            """Whether a verdict by the order-statistic interval over the pairs so far is still open."""
            verdicts = [
                bl.interval_verdict(
                    *bl.median_order_interval(a / b for a, b in bl.adjacent_pairs(seq, "ray", "local") if a and b),
                    STEP_BUDGET,
                )
                for seq in (sequence_step, sequence_cpu)
            ]
            return bl.UNDECIDED in verdicts

        measured, pairs_started = 0, time.time()
        while True:
            if measured >= pairs:
                if args.quick or not undecided():
                    break
                elapsed, per_pair = time.time() - bench.started, (time.time() - pairs_started) / measured
                if elapsed + per_pair > 60 * args.max_minutes:
                    print(
                        f"[{NAME}] undecided after {measured} pairs, and one more would end after "
                        f"{args.max_minutes:g} min: stopping",
                        flush=True,
                    )
                    break
            # A B, then B A: over two pairs each arm runs first and second once (ABBA)
            for arm in ("ray", "local") if measured % 2 == 0 else ("local", "ray"):
                run_one(len(runs), arm)
            measured += 1
        pairs = measured
    finally:
        head.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    step_pairs = [a / b for a, b in bl.adjacent_pairs(sequence_step, "ray", "local")]
    cpu_pairs = [a / b for a, b in bl.adjacent_pairs(sequence_cpu, "ray", "local") if a and b]
    cpu_a = bl.median(v for arm, v in sequence_cpu if arm == "ray")
    cpu_b = bl.median(v for arm, v in sequence_cpu if arm == "local")
    start_pairs = [a / b for a, b in bl.adjacent_pairs(sequence_start, "ray", "local")]
    step_a = bl.median(v for arm, v in sequence_step if arm == "ray")
    step_b = bl.median(v for arm, v in sequence_step if arm == "local")
    start_a = bl.median(v for arm, v in sequence_start if arm == "ray")
    start_b = bl.median(v for arm, v in sequence_start if arm == "local")
    init_s = bl.median(p["ray_init_local_s"] for p in init_probes)
    background = {
        arm: bl.median(r["cores"]["lab_and_ray_other_cores"] for r in runs if r["arm"] == arm and r["cores"])
        for arm in ("ray", "local")
    }
    elsewhere = [r["cores"]["rest_of_machine_cores"] for r in runs if r["cores"]]
    where = f"quickstart, {args.workers} workers, {pairs} pairs x {epochs} epochs"
    # Another worker count is another question (e.g. 1 worker: a core left to Ray's own processes):
    # its own result file and row names, beside the default 2-worker ones.
    bench.name = (NAME if args.workers == DEFAULT_WORKERS else f"{NAME}_w{args.workers}") + (
        "_pinned" if args.pin else ""
    )
    of = "" if args.workers == DEFAULT_WORKERS else f", {args.workers} worker{'s' if args.workers > 1 else ''}"
    of += ", Ray on its own CPU, training threads pinned" if args.pin else ""
    if args.pin:
        where += f"; Ray head and drivers under `taskset -c {cpus - 1}`, --set workers.pin_cpus=0-{args.workers - 1}"

    def thread_row(key: str, what: str, unit: str) -> dict:
        a = bl.median(t[key] for arm, t in sequence_thread if arm == "ray")
        b = bl.median(t[key] for arm, t in sequence_thread if arm == "local")
        pairs = [
            x / y for x, y in bl.adjacent_pairs([(arm, t[key]) for arm, t in sequence_thread], "ray", "local") if y
        ]
        shares = {
            arm: bl.median(t["thread_off_core_share"] for a_, t in sequence_thread if a_ == arm)
            for arm in ("ray", "local")
        }
        return bl.comparison(
            f"rank 0's training thread: {what}{of}",
            "Ray Train (--launcher ray)",
            "plain torch.distributed (--launcher local)",
            a,
            b,
            unit,
            bl.median(pairs) if pairs else None,
            "median over adjacent ABBA pairs of ray / local",
            None,
            "",
            pair_ratios=pairs,
            note=f"{where}; getrusage(RUSAGE_THREAD) over the epochs after the first (epochs.parquet); share of the "
            f"training wall time the thread was off its core: ray {shares['ray']:.1%}, local {shares['local']:.1%}",
        )

    comparisons = [
        bl.comparison(
            f"Ray Train overhead (step time{of})",
            "Ray Train (--launcher ray)",
            "plain torch.distributed (--launcher local)",
            step_a,
            step_b,
            "s/step",
            bl.median(step_pairs),
            "median over adjacent ABBA pairs of ray / local steady-state step time",
            STEP_BUDGET,
            "ray / local <= 1.05",
            pair_ratios=step_pairs,
            decided_by_interval=True,
            note=f"{where}; ratio of arm medians {bl.ratio(step_a, step_b):.3f}; pair ratios "
            f"{', '.join(f'{r:.3f}' for r in step_pairs)}; {bl.contention_note(runs)}",
        ),
        bl.comparison(
            f"Ray Train overhead (training workers' CPU per step{of})",
            "Ray Train (--launcher ray)",
            "plain torch.distributed (--launcher local)",
            cpu_a,
            cpu_b,
            "CPU s/step",
            bl.median(cpu_pairs),
            "median over adjacent ABBA pairs of ray / local CPU seconds of the training workers per steady-state step",
            STEP_BUDGET,
            "the step-time budget, applied to CPU time (little moved by other jobs)",
            pair_ratios=cpu_pairs,
            decided_by_interval=True,
            note=f"{where}; /proc CPU time of the training worker processes in the epochs after the first, training "
            f"only; pair ratios {', '.join(f'{r:.3f}' for r in cpu_pairs)}",
        ),
        thread_row("thread_cpu_s_per_step", "CPU per step", "CPU s/step"),
        thread_row("thread_preemptions_per_step", "preemptions per step", "preemptions/step"),
        bl.comparison(
            f"CPU besides the training workers, steady state{of}",
            "Ray Train (--launcher ray)",
            "plain torch.distributed (--launcher local)",
            background["ray"],
            background["local"],
            "cores",
            None,
            "",
            note=f"{where}; cores used while the epochs after the first trained by the driver and the Ray head's "
            f"processes (GCS, raylet, dashboard, Train controller and helper actors; the head is up in both arms), "
            f"not counting the training workers; the rest of the machine (other jobs) used "
            f"{min(elsewhere):.2f}-{max(elsewhere):.2f} cores meanwhile"
            if elsewhere
            else where,
        ),
        bl.comparison(
            f"start-up, warm cluster (command -> first step{of})",
            "Ray Train (--launcher ray)",
            "plain torch.distributed (--launcher local)",
            start_a,
            start_b,
            "s",
            bl.median(start_pairs),
            "median over adjacent ABBA pairs of ray / local start-up",
            None,
            "",
            note=f"{where}; Ray's includes connecting to the running cluster and creating the Train controller "
            f"and worker group; difference of medians {start_a - start_b:+.2f} s",
        ),
        bl.comparison(
            "start-up of a new local Ray cluster",
            "ray.init(address='local')",
            "",
            init_s,
            None,
            "s",
            None,
            "",
            None,
            "",
            note=f"fresh process, median of {probes}; a run on a new cluster pays this on top of the warm start-up; "
            f"`ray start --head` until `ray status` and the dashboard answered took {head.start_s:.1f} s",
        ),
    ]
    step_row = comparisons[0]

    def share(ratio_value):
        return None if ratio_value is None else 1.0 - 1.0 / ratio_value

    # Ray's share of the step under Ray: (ray - local) / ray, a monotone function of the ratio, so
    # the ratio's interval maps onto it end to end.
    ray_share_of_step = {
        "median": share(step_row["ratio"]),
        "lo": share(step_row["ratio_lo"]),
        "hi": share(step_row["ratio_hi"]),
        "definition": "(ray - local) / ray steady-state step time = 1 - 1 / ratio, at the median pair ratio and at "
        "the ends of its 95% order-statistic interval",
    }
    cli = (
        " ".join(taskset + [""])
        + f".venv/bin/scaling run {args.config} --workers {args.workers} "
        + " ".join(f"--set {shlex.quote(o)}" for o in overrides)
    )
    bench.finish(
        comparisons,
        config=args.config,
        workers=args.workers,
        pairs=pairs,
        epochs_per_run=epochs,
        overrides=overrides,
        pinned=args.pin,
        arms={
            "ray": f"RAY_ADDRESS=<private head{' started under ' + ' '.join(taskset) if taskset else ''}> {cli} "
            "--launcher ray --out DIR",
            "local": f"{cli} --launcher local --out DIR",
        },
        startup_definition="first_step_unix (rank 0, epochs.parquet) - time.time() just before the command started; "
        "for Ray it includes the driver's connection to the warm cluster, the Train controller and "
        "worker-group creation (worker actors, torch process group)",
        step_pair_ratios=step_pairs,
        ray_share_of_step=ray_share_of_step,
        max_minutes=args.max_minutes,
        startup_pair_ratios=start_pairs,
        ray_head={
            "start_s": head.start_s,
            "num_cpus": head.num_cpus,
            "how": "ray start --head --block, 127.0.0.1, free ports, private --temp-dir, RAY_AUTH_MODE=disabled; "
            "stopped by process id",
        },
        ray_init_probes=init_probes,
        runs=runs,
    )


if __name__ == "__main__":
    main()
