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
in pairs, each launched in-process with `scaling.launch.run.execute_run(cfg, dir,
launcher="local")`, i.e. what `scaling run experiments/quickstart.yaml --launcher local --workers 2
--set ...` does. Each run also records the mean number of runnable tasks while it ran
(bench/benchlib.py `RunQueue`), to show contention, and the CPU time of its processes (`TreeCpu`,
from /proc): the training workers' CPU seconds per steady-state step are a second view of the
overhead, which other jobs on the machine hardly move, with the same budget.

The verdict is the interval's, for both figures: the headline ratio is the median over adjacent
(A, B) pairs of A / B, and its 95% interval the order-statistic (sign-test) interval of that median
(bench/benchlib.py `median_order_interval`: it holds for any spread of the pair ratios, outliers
included, and exists from 6 pairs on). "pass" when the interval's upper end is <= 1.03, "miss"
when its lower end is > 1.03, else "undecided: more pairs needed". The benchmark runs `--pairs`
pairs, then adds one pair at a time while either verdict is undecided, up to `--max-pairs` and
`--max-minutes` (the verdict is then looked at after every pair, so the 95% is per look, not for
the whole sequence; the file keeps every pair ratio and the number of pairs). The ratio of the two
arms' medians is reported beside it.

    .venv/bin/python bench/instrumentation_overhead.py            # 8 to 24 pairs x 3 epochs (at most about 9 min)
    .venv/bin/python bench/instrumentation_overhead.py --quick    # 1 pair x 2 epochs (no interval: a check that it runs)
    .venv/bin/python bench/instrumentation_overhead.py --job own --max-pairs 48 --max-minutes 50  # the user's job of examples/own_job (8 to 48 pairs x 4 epochs)

`--job own` measures the same switch on a user's own job (examples/own_job: a small vision
transformer in a Ray Train quickstart-shaped train function, instrumented through the public
`scaling.instrument.attach`), under the Ray launcher, with 8,192 training samples (an epoch has
128 steps per worker), and arm B keeping the instrument attached with `step_timing=false` (only
the epoch clock, no hooks, no records). Its runs do not start processes of their own, so that
the two runs of a pair share their processes and their moment: one Ray Train run (`scaling run
examples/own_job/sweep.yaml --launcher ray --set
train.function=bench.own_job_alternation:train_func`) runs the user's whole job again and again
on the same workers, instrumented and plain in ABBA order, each run with its model, DDP wrap,
data loader and `attach` made afresh (bench/own_job_alternation.py); a pair is two adjacent runs
inside one Ray Train run. The first Ray Train run holds `--pairs` pairs; while a verdict is
undecided, further ones hold `--block` pairs each. Runs are 4 epochs long (3 measured). It
writes instrumentation_overhead_own_job.json.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

import benchlib as bl

from scaling.analysis.run_metrics import steady_step_s
from scaling.results import RunDir

NAME = "instrumentation_overhead"
BUDGET = 1.03
ARMS = {"instrumented": "instrument.step_timing=true", "plain": "instrument.step_timing=false"}



def measure(arm: str, i: int, name: str, cfg, tmp: str, launcher: str) -> dict:
    """One run of `arm`: its steady-state step time and workers' CPU per step, with its contention."""
    from scaling.launch.run import execute_run

    run_dir = Path(tmp) / f"run{i:02d}-{arm}"
    with bl.RunQueue() as rq, bl.TreeCpu([os.getpid()]) as cpu:
        summary = execute_run(cfg, run_dir, launcher=launcher)
    if summary["status"] == "failed":
        raise RuntimeError(f"{arm} run failed: {summary['error']}")
    epochs_table = RunDir(run_dir).epochs()
    step_s, epoch_rows = steady_step_s(epochs_table, cfg.global_batch)
    steady = bl.steady_cpu(cpu, epochs_table, cfg.global_batch)
    shutil.rmtree(run_dir, ignore_errors=True)  # a long sequence of runs would otherwise fill the temporary directory
    print(f"[{name}]   steady-state step {step_s * 1e3:.2f} ms, worker CPU "
          f"{steady['worker_cpu_s_per_step'] * 1e3:.1f} ms/step (runnable tasks {rq.mean}; cores {steady['cores']})",
          flush=True)
    return {"order": i, "arm": arm, "steady_step_s": step_s, "mean_runnable": rq.mean, **steady,
            "epochs": epoch_rows, "summary_step_s": summary.get("step_s")}


OWN_FUNCTION = "bench.own_job_alternation:train_func"


def measure_own_block(first_pair: int, pairs: int, overrides: list[str], workers: int, tmp: str, name: str) -> list[dict]:
    """`pairs` ABBA pairs of the user's job inside one Ray Train run (bench/own_job_alternation.py):
    each inner run's steady-state step time and workers' CPU per step."""
    import own_job_alternation as alternation

    from scaling.config import load_config
    from scaling.launch.run import execute_run

    cfg = load_config(bl.REPO / "examples/own_job/sweep.yaml", num_workers=workers, overrides=[
        *overrides, f"train.function={OWN_FUNCTION}", f"train.function_config.bench_first_pair={first_pair}",
        f"train.function_config.bench_pairs={pairs}"])
    run_dir = (Path(tmp) / f"pairs{first_pair:03d}").resolve()
    # sampled every 50 ms: a run's windows are its measured epochs (about 4 s each), and just after each
    # only the instrumented arm writes its records, whose CPU a coarser sampling smears into the window
    with bl.RunQueue() as rq, bl.TreeCpu([os.getpid()], interval_s=0.05, discover_every=40) as cpu:
        summary = execute_run(cfg, run_dir, launcher="ray")
    if summary["status"] == "failed":
        raise RuntimeError(f"the Ray Train run of pairs {first_pair}.. failed: {summary['error']}")
    runs = []
    for pair in range(first_pair, first_pair + pairs):
        for half in (0, 1):
            arm = alternation.arm(pair, half)
            epochs_table = RunDir(alternation.inner_run_dir(str(run_dir), pair, half)).epochs()
            step_s, epoch_rows = steady_step_s(epochs_table, cfg.global_batch)
            steady = bl.steady_cpu(cpu, epochs_table, cfg.global_batch)
            print(f"[{name}] pair {pair + 1} {arm}: steady-state step {step_s * 1e3:.2f} ms, worker CPU "
                  f"{steady['worker_cpu_s_per_step'] * 1e3:.1f} ms/step (cores {steady['cores']})", flush=True)
            runs.append({"order": 2 * pair + half, "arm": arm, "steady_step_s": step_s, "mean_runnable": rq.mean,
                         **steady, "epochs": epoch_rows})
    shutil.rmtree(run_dir, ignore_errors=True)
    return runs


def figures(runs: list[dict], args, launcher: str, pairs: int, epochs: int) -> list[dict]:
    """The two comparison rows (step time, workers' CPU per step), each decided by its interval."""
    sequence = [(r["arm"], r["steady_step_s"]) for r in runs]
    sequence_cpu = [(r["arm"], r["worker_cpu_s_per_step"]) for r in runs]
    pair_ratios = [a / b for a, b in bl.adjacent_pairs(sequence, "instrumented", "plain")]
    cpu_pairs = [a / b for a, b in bl.adjacent_pairs(sequence_cpu, "instrumented", "plain") if a and b]
    a_med = bl.median(v for arm, v in sequence if arm == "instrumented")
    b_med = bl.median(v for arm, v in sequence if arm == "plain")
    cpu_a = bl.median(v for arm, v in sequence_cpu if arm == "instrumented")
    cpu_b = bl.median(v for arm, v in sequence_cpu if arm == "plain")
    elsewhere = [r["cores"]["rest_of_machine_cores"] for r in runs if r["cores"]]
    return [bl.comparison(
        "instrumentation overhead (step time)", "instrumented (step_timing=true)", "plain (step_timing=false)",
        a_med, b_med, "s/step", bl.median(pair_ratios),
        "median over adjacent ABBA pairs of instrumented / plain steady-state step time",
        BUDGET, "instrumented / plain <= 1.03 on CPU, by the 95% interval of the median ratio",
        pair_ratios=pair_ratios, decided_by_interval=True,
        note=f"{args.config}, {args.workers} workers, {launcher} launcher, {pairs} pairs x {epochs} epochs; "
             f"ratio of arm medians {bl.ratio(a_med, b_med):.3f}; pair ratios {', '.join(f'{r:.3f}' for r in pair_ratios)}; "
             f"{bl.contention_note(runs)}",
    ), bl.comparison(
        "instrumentation overhead (workers' CPU per step)", "instrumented (step_timing=true)",
        "plain (step_timing=false)", cpu_a, cpu_b, "CPU s/step", bl.median(cpu_pairs),
        "median over adjacent ABBA pairs of instrumented / plain CPU seconds of the training workers per steady-state "
        "step", BUDGET, "the step-time budget, applied to CPU time (little moved by other jobs), by the 95% interval of "
        "the median ratio", pair_ratios=cpu_pairs, decided_by_interval=True,
        note=f"/proc CPU time of the {args.workers} worker processes while the epochs after the first trained; "
             f"ratio of arm medians {bl.ratio(cpu_a, cpu_b):.3f}; pair ratios {', '.join(f'{r:.3f}' for r in cpu_pairs)}"
             + (f"; the rest of the machine (other jobs) used {min(elsewhere):.2f} to {max(elsewhere):.2f} cores meanwhile"
                if elsewhere else ""),
    )]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 pair of 2-epoch runs")
    parser.add_argument("--pairs", type=int, help="A/B pairs always run (default 8; quick 1)")
    parser.add_argument("--max-pairs", type=int,
                        help="pairs at most, added one at a time while a verdict is undecided (default 24)")
    parser.add_argument("--max-minutes", type=float, default=9.0,
                        help="no pair beyond --pairs starts once the next would end after this (default 9)")
    parser.add_argument("--epochs", type=int, help="epochs per run, the first is left out (default: lab 3, own 4; quick 2)")
    parser.add_argument("--block", type=int, default=4,
                        help="--job own: pairs in each Ray Train run after the first, while undecided (default 4)")
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
    min_pairs = args.pairs or (1 if args.quick else 8)
    max_pairs = max(min_pairs, args.max_pairs or (min_pairs if args.quick else 24))
    epochs = args.epochs or (2 if args.quick else {"lab": 3, "own": 4}[args.job])

    from scaling.config import load_config

    started, load_start = time.time(), bl.load_average()
    overrides = [*bl.steady_run_overrides(epochs, args.quick), *extra]
    config_path = bl.REPO / args.config
    configs = {arm: load_config(config_path, overrides=[*overrides, switch], num_workers=args.workers)
               for arm, switch in ARMS.items()}
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        pair = 0
        while pair < max_pairs:
            elapsed = time.time() - started
            more = 1 if args.job == "lab" else min(args.block if pair else min_pairs, max_pairs - pair)
            if pair >= min_pairs:
                verdicts = [c["verdict"] for c in figures(runs, args, launcher, pair, epochs)]
                if bl.UNDECIDED not in verdicts:
                    break
                if elapsed + elapsed / pair * more > 60 * args.max_minutes:
                    print(f"[{name}] undecided after {pair} pairs, and {more} more would end after "
                          f"{args.max_minutes:g} min: stopping", flush=True)
                    break
            if args.job == "own":
                print(f"[{name}] pairs {pair + 1} to {pair + more} (of {min_pairs} to {max_pairs}) in one Ray Train run",
                      flush=True)
                runs += measure_own_block(pair, more, overrides, args.workers, tmp, name)
            else:
                for arm in ("instrumented", "plain") if pair % 2 == 0 else ("plain", "instrumented"):
                    print(f"[{name}] pair {pair + 1} (of {min_pairs} to {max_pairs}): {arm}", flush=True)
                    runs.append(measure(arm, len(runs), name, configs[arm], tmp, launcher))
            pair += more
    pairs = len(runs) // 2
    comparisons = figures(runs, args, launcher, pairs, epochs)
    cli = f".venv/bin/scaling run {args.config} --launcher {launcher} --workers {args.workers} " + " ".join(
        f"--set {shlex.quote(o)}" for o in overrides)
    step_row = comparisons[0]
    path = bl.write_result(
        name, __doc__, args.quick, started, load_start, comparisons,
        config=args.config, workers=args.workers, pairs=pairs, min_pairs=min_pairs, max_pairs=max_pairs,
        epochs_per_run=epochs, overrides=overrides,
        arms=({arm: f"{cli} --set {switch} --out DIR" for arm, switch in ARMS.items()} if args.job == "lab" else
              {"both, in turn": f"{cli} --set train.function={OWN_FUNCTION} --set train.function_config.bench_first_pair=P "
                                "--set train.function_config.bench_pairs=N --out DIR (bench/own_job_alternation.py: "
                                "the user's train_func run 2N times, step_timing true and false in ABBA order)"}),
        pair_ratios=[a / b for a, b in bl.adjacent_pairs([(r["arm"], r["steady_step_s"]) for r in runs],
                                                         "instrumented", "plain")],
        cpu_pair_ratios=[a / b for a, b in bl.adjacent_pairs([(r["arm"], r["worker_cpu_s_per_step"]) for r in runs],
                                                             "instrumented", "plain") if a and b],
        ratio_of_medians=bl.ratio(step_row["a_median"], step_row["b_median"]), runs=runs,
    )
    bl.print_comparisons(comparisons)
    print(f"[{name}] wrote {path.relative_to(bl.REPO)}", flush=True)


if __name__ == "__main__":  # the plain launcher spawns processes that re-import this module
    main()
