"""Live metrics overhead: steady-state step time of the quickstart under Ray Train with the lab's live
metrics exported (gauges and per-step histograms, scaling/launch/live_metrics.py) against the same
run exporting none, 2 workers; budget: live / off <= 1.01.

The switch is the workers' environment variable SCALING_LIVE_METRICS (the job's runtime_env):
  A "live"  unset: every rank observes its steady-state steps into the histograms and sets the
            gauges at each epoch's end, and Ray's core worker exports them every few seconds.
  B "off"   SCALING_LIVE_METRICS=0: no lab metric is made, observed or exported (Ray's own remain).
Everything else is the same: experiments/quickstart.yaml at 2 workers (gloo, one CPU thread each),
`train.target_accuracy=1.0` so that every run trains `--epochs` epochs, `instrument.calibration_pairs=0`
and `data.val_samples=512` (neither is inside `train_s`), against one private Ray head started for
the benchmark (loopback, free ports, private temp dir, 2 CPUs), warm, stopped by its process id.

Measured: per run, the steady-state step time = the median `step_s` of the steady-state steps
(steps.parquet: `kind == "train"`, not warm-up) of the epochs after the first, every rank's; a
median, so a moment another job took the cores moves it little. Beside it the epochs' view, the
median over the epochs after the first of `train_s / steps` (epochs.parquet), which also holds what
falls between steps. Runs alternate A B B A ... (`--pairs` pairs; quick:
`data.train_samples=2048` too), each in this process: `ray.init` to the head with the arm's
runtime_env, `scaling.launch.run.execute_run(cfg, dir, launcher="ray")`, `ray.shutdown`. The
headline is the median over adjacent (A, B) pairs of A / B, with the 95% order-statistic interval
of that median (bench/benchlib.py `median_order_interval`, which holds for any spread of the pair
ratios): "pass" only where the whole interval is within the budget, "miss" where it is wholly
beyond it, "undecided" where it straddles it (`interval_verdict`). Beside it, the training workers' CPU seconds per
steady-state step (/proc, bench/benchlib.py `TreeCpu`), which other jobs on the machine hardly move, with the same
budget. While each run goes, the head's metrics endpoint is scraped every 10 s, as Ray's own Prometheus
configuration scrapes it (`ScrapeWatch`), in both arms alike: a scrape makes Ray's agent render
every metric, so it is part of what exporting costs, and an endpoint polled in one arm only would
load that arm alone. Each run says whether a scrape served the run's `ray_scaling_epoch`
(`exported_seen`): true in every A run and false in every B run, or the switch did not work and
the file says so.

    .venv/bin/python bench/live_metrics_overhead.py            # 10 pairs x 3 epochs
    .venv/bin/python bench/live_metrics_overhead.py --quick    # 1 pair x 2 epochs
    .venv/bin/python bench/live_metrics_overhead.py --exporter # the exporter's own CPU, 6 pairs (about 9 min)

`--exporter` measures the mechanism instead of the training, in CPU time, which other jobs on the
machine hardly move: per run, one Ray actor per rank (2) stands for a training worker, holding the
lab's metrics (A, `RayLiveMetrics` as a worker makes it) or none (B), and calls `update` with an
epoch of 64 steady-state step records every 8 s (the quickstart's epoch here) for a 40 s window,
idle otherwise, while the endpoint is scraped every 10 s in both arms. Measured: the actors' own
CPU seconds over the window (`time.process_time`: every thread of the process, Ray's exporter
included, and the epochs' `update` calls, which a real worker makes outside its steps) and the
CPU of the rest of the head's process tree (the agent that renders a scrape, the raylet, the GCS).
Per pair: the extra CPU of A over B per second, per worker (actors) and per node (the rest):
taken from a training worker's core, it would lengthen a step by at most that share. Headline:
1 + the median over pairs of (actors' + node's extra CPU per second) / workers, against the same
budget, with its interval; written to live_metrics_overhead_exporter.json.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import benchlib as bl

NAME = "live_metrics_overhead"
BUDGET = 1.01
ARMS = {"live": "1", "off": "0"}  # SCALING_LIVE_METRICS in the workers' environment
SETTLE_S = 3.0


SCRAPE_INTERVAL_S = 10.0  # Ray's prometheus.yml (ray/dashboard/modules/metrics/templates.py)


class ScrapeWatch:
    """Scrapes the head's metrics endpoint every `interval_s` while a run goes, as Prometheus would, for
    the whole run in either arm; `seen`: whether a scrape served the run's `ray_scaling_epoch`."""

    def __init__(self, url: str, run_name: str, interval_s: float = SCRAPE_INTERVAL_S):
        self.url, self.needle, self.interval_s = url, f'run="{run_name}"', interval_s
        self.seen = False
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                text = urllib.request.urlopen(self.url, timeout=5).read().decode()
            except OSError:
                continue
            self.scrapes += 1
            self.seen = self.seen or any(
                line.startswith("ray_scaling_epoch{") and self.needle in line for line in text.splitlines()
            )

    def __enter__(self) -> "ScrapeWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


EPOCH_S, WINDOW_S, STEPS_PER_EPOCH = 8.0, 40.0, 64


def exporter_probe_class():
    """A Ray actor that stands for one training worker's metrics (the `--exporter` mode)."""
    import ray

    @ray.remote(num_cpus=0)
    class ExporterProbe:
        def __init__(self, live: bool, rank: int, run_name: str):
            import random

            from scaling.instrument.parts import Identity
            from scaling.launch.live_metrics import ENABLE_ENV, RayLiveMetrics

            os.environ[ENABLE_ENV] = "1" if live else "0"
            self.metrics = RayLiveMetrics(run_name, Identity(rank, 2, rank, 0))
            random.seed(rank)
            self.rows = [
                {
                    "kind": "train",
                    "warmup": False,
                    "epoch": 1,
                    "step": i,
                    "rank": rank,
                    "step_s": random.uniform(0.10, 0.14),
                    "data_s": random.uniform(0.001, 0.003),
                    "forward_s": random.uniform(0.03, 0.04),
                    "backward_s": random.uniform(0.06, 0.09),
                    "optimizer_s": random.uniform(0.001, 0.002),
                    "allreduce_s": random.uniform(0.01, 0.03),
                    "exposed_comm_s": random.uniform(0.005, 0.02),
                    "waiting_s": random.uniform(0.0, 0.01),
                    "transfer_s": random.uniform(0.001, 0.01),
                    "straggler_rank": float(i % 2),
                    "num_buckets": 1,
                    "synced_micro_batches": 1,
                }
                for i in range(STEPS_PER_EPOCH)
            ]

        def run(self, window_s: float, epoch_s: float) -> float:
            """CPU seconds of this process over the window, an epoch's `update` every `epoch_s`."""
            cpu0, start, epoch = time.process_time(), time.monotonic(), 0
            while time.monotonic() < start + window_s:
                if time.monotonic() >= start + epoch * epoch_s:
                    epoch += 1
                    self.metrics.update(
                        self.rows,
                        {"epoch": epoch, "train_s": epoch_s, "num_workers": 2, "throughput_samples_per_s": 1000.0},
                    )
                time.sleep(0.05)
            return time.process_time() - cpu0

    return ExporterProbe


def run_exporter(args, bench: bl.Benchmark) -> None:
    import ray

    from scaling.testbed.local_cluster import PrivateRayHead

    pairs = args.pairs or (1 if args.quick else 6)
    window_s = 10.0 if args.quick else WINDOW_S
    name = bench.name = f"{NAME}_exporter"  # its own result file
    head = PrivateRayHead(num_cpus=2, settle_s=SETTLE_S, prefix="blive-")
    os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": head.address})
    runs, sequence = [], []
    try:
        head.start()
        ray.init(address=head.address, logging_level="WARNING", log_to_driver=False)
        probe = exporter_probe_class()
        port = [n for n in ray.nodes() if n["Alive"]][0]["MetricsExportPort"]
        for i, arm in enumerate(bl.abba(pairs, "live", "off")):
            run_name = f"exporter-{i:02d}-{arm}"
            actors = [probe.remote(arm == "live", rank, run_name) for rank in range(2)]
            ray.get([a.__ray_ready__.remote() for a in actors])
            with (
                bl.TreeCpu([head.process.pid]) as tree,
                ScrapeWatch(f"http://127.0.0.1:{port}/metrics", run_name) as watch,
            ):
                t0 = time.time()
                actor_cpu = sum(ray.get([a.run.remote(window_s, EPOCH_S) for a in actors]))
                t1 = time.time()
            node_cpu = tree.cpu_s("other", t0, t1) - actor_cpu  # the head's tree, the probes aside
            for a in actors:
                ray.kill(a)
            runs.append(
                {
                    "order": i,
                    "arm": arm,
                    "window_s": round(t1 - t0, 2),
                    "actors_cpu_s": actor_cpu,
                    "node_cpu_s": node_cpu,
                    "exported_seen": watch.seen,
                    "scrapes": watch.scrapes,
                }
            )
            sequence.append((arm, (actor_cpu / 2 + node_cpu / 2) / (t1 - t0)))  # per worker and second
            print(
                f"[{name}] run {i + 1}/{2 * pairs} {arm}: actors {actor_cpu:.3f} CPU s, rest of the node "
                f"{node_cpu:.3f} CPU s in {t1 - t0:.1f} s, exported {watch.seen}",
                flush=True,
            )
        ray.shutdown()
    finally:
        head.stop()
    extra = [a - b for a, b in bl.adjacent_pairs(sequence, "live", "off")]
    bound = [1.0 + x for x in extra]
    switch_worked = all(r["exported_seen"] == (r["arm"] == "live") for r in runs)
    row = bl.comparison(
        "live metrics overhead (exporter's CPU)",
        "live (lab's metrics, 2 worker stand-ins)",
        "off (none)",
        bl.median(v for arm, v in sequence if arm == "live"),
        bl.median(v for arm, v in sequence if arm == "off"),
        "CPU s/s per worker",
        bl.median(bound),
        "1 + median over adjacent ABBA pairs of the extra CPU per second per worker (the actors' and the rest of the "
        "node's, halved): the most it could lengthen a step on a busy core",
        BUDGET,
        "<= 1.01: at most 1% of a worker's core",
        pair_ratios=bound,
        decided_by_interval=True,
        note=f"{pairs} pairs of {window_s:g} s windows, an epoch of {STEPS_PER_EPOCH} steps every {EPOCH_S:g} s, "
        f"scraped every {SCRAPE_INTERVAL_S:g} s; extra CPU per worker-second per pair "
        f"{', '.join(f'{x * 1e3:+.2f} ms' for x in extra)}"
        + ("" if switch_worked else "; THE SWITCH DID NOT WORK (exported_seen per run)"),
    )
    bench.finish(
        [row],
        pairs=pairs,
        window_s=window_s,
        epoch_s=EPOCH_S,
        steps_per_epoch=STEPS_PER_EPOCH,
        switch_worked=switch_worked,
        runs=runs,
    )
    print(
        f"[{name}] {row['name']}: live {row['a_median']:.4g}, off {row['b_median']:.4g} {row['unit']}; bound "
        f"{row['ratio']:.4f}, 95% interval {bl._fmt(row['ratio_lo'])}-{bl._fmt(row['ratio_hi'])} (budget <= {BUDGET}): "
        f"{row['verdict']}",
        flush=True,
    )


def main() -> None:
    bench = bl.Benchmark(
        NAME, __doc__, quick="1 pair of 2-epoch runs", epochs=(3, 2), config="experiments/quickstart.yaml"
    )
    bench.parser.add_argument("--pairs", type=int, help="A/B pairs (default 10, --exporter 6; quick 1)")
    bench.parser.add_argument("--workers", type=int, default=2, help="data-parallel workers (default 2)")
    bench.parser.add_argument(
        "--exporter",
        action="store_true",
        help="measure the exporter's own CPU with stand-in workers instead of training (default: off)",
    )
    args = bench.parse()
    if args.exporter:
        run_exporter(args, bench)
        return
    pairs = args.pairs or (1 if args.quick else 10)
    epochs = args.epochs

    import ray

    from scaling.analysis.run_metrics import steady_step_s
    from scaling.config import load_config
    from scaling.launch.live_metrics import ENABLE_ENV
    from scaling.launch.ray_train import RAY_ENV
    from scaling.launch.run import execute_run
    from scaling.results import RunDir
    from scaling.testbed.local_cluster import PrivateRayHead

    overrides = bl.steady_run_overrides(epochs, args.quick)
    sequence, sequence_epochs, sequence_cpu, runs = [], [], [], []
    head = PrivateRayHead(num_cpus=args.workers, settle_s=SETTLE_S, prefix="blive-")
    os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": head.address})
    try:
        head.start()
        with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
            for i, arm in enumerate(bl.abba(pairs, "live", "off")):
                name = f"live-bench-{i:02d}-{arm}"
                cfg = load_config(
                    bl.REPO / args.config, overrides=[*overrides, f"name={name}"], num_workers=args.workers
                )
                run_dir = Path(tmp) / name
                print(f"[{NAME}] run {i + 1}/{2 * pairs}: {arm}", flush=True)
                ray.init(
                    address=head.address,
                    logging_level="WARNING",
                    log_to_driver=False,
                    runtime_env={"env_vars": {**RAY_ENV, ENABLE_ENV: ARMS[arm]}},
                )
                try:
                    port = [n for n in ray.nodes() if n["Alive"]][0]["MetricsExportPort"]
                    with (
                        bl.RunQueue() as rq,
                        bl.TreeCpu([os.getpid(), head.process.pid]) as cpu,
                        ScrapeWatch(f"http://127.0.0.1:{port}/metrics", name) as watch,
                    ):
                        summary = execute_run(cfg, run_dir, launcher="ray")
                finally:
                    ray.shutdown()
                if summary["status"] == "failed":
                    raise RuntimeError(f"{arm} run failed: {summary['error']}")
                epochs_table, steps = RunDir(run_dir).epochs(), RunDir(run_dir).steps()
                epoch_step_s, epoch_rows = steady_step_s(epochs_table, cfg.global_batch)
                steady_steps = steps[(steps["kind"] == "train") & ~steps["warmup"].astype(bool) & (steps["epoch"] > 1)]
                step_s = float(steady_steps["step_s"].median())
                steady = bl.steady_cpu(cpu, epochs_table, cfg.global_batch)
                sequence.append((arm, step_s))
                sequence_epochs.append((arm, epoch_step_s))
                sequence_cpu.append((arm, steady["worker_cpu_s_per_step"]))
                runs.append(
                    {
                        "order": i,
                        "arm": arm,
                        "median_step_s": step_s,
                        "steady_step_s": epoch_step_s,
                        "steps": int(len(steady_steps)),
                        "mean_runnable": rq.mean,
                        "exported_seen": watch.seen,
                        "scrapes": watch.scrapes,
                        **steady,
                        "epochs": epoch_rows,
                    }
                )
                print(
                    f"[{NAME}]   median step {step_s * 1e3:.2f} ms, train_s/steps {epoch_step_s * 1e3:.2f} ms, worker "
                    "CPU "
                    f"{steady['worker_cpu_s_per_step'] * 1e3:.1f} ms/step, exported {watch.seen} "
                    f"(runnable tasks {rq.mean})",
                    flush=True,
                )
    finally:
        head.stop()

    switch_worked = all(r["exported_seen"] == (r["arm"] == "live") for r in runs)
    pair_ratios = [a / b for a, b in bl.adjacent_pairs(sequence, "live", "off")]
    a_med = bl.median(v for arm, v in sequence if arm == "live")
    b_med = bl.median(v for arm, v in sequence if arm == "off")
    epoch_pairs = [a / b for a, b in bl.adjacent_pairs(sequence_epochs, "live", "off")]
    epoch_a = bl.median(v for arm, v in sequence_epochs if arm == "live")
    epoch_b = bl.median(v for arm, v in sequence_epochs if arm == "off")
    cpu_pairs = [a / b for a, b in bl.adjacent_pairs(sequence_cpu, "live", "off") if a and b]
    cpu_a = bl.median(v for arm, v in sequence_cpu if arm == "live")
    cpu_b = bl.median(v for arm, v in sequence_cpu if arm == "off")
    switch_note = (
        "" if switch_worked else "; THE SWITCH DID NOT WORK (exported_seen per run): the arms are not what they say"
    )
    comparisons = [
        bl.comparison(
            "live metrics overhead (step time)",
            "live (metrics exported)",
            "off (SCALING_LIVE_METRICS=0)",
            a_med,
            b_med,
            "s/step",
            bl.median(pair_ratios),
            "median over adjacent ABBA pairs of live / off median steady-state step time (steps.parquet)",
            BUDGET,
            "live / off <= 1.01 on CPU",
            pair_ratios=pair_ratios,
            decided_by_interval=True,
            note=f"{args.config}, {args.workers} workers, Ray launcher, {pairs} pairs x {epochs} epochs; ratio of arm "
            "medians "
            f"{bl.ratio(a_med, b_med):.3f}; pair ratios {', '.join(f'{r:.3f}' for r in pair_ratios)}; "
            f"{bl.contention_note(runs)}{switch_note}",
        ),
        bl.comparison(
            "live metrics overhead (train_s per step)",
            "live (metrics exported)",
            "off (SCALING_LIVE_METRICS=0)",
            epoch_a,
            epoch_b,
            "s/step",
            bl.median(epoch_pairs),
            "median over adjacent ABBA pairs of live / off steady-state train_s / steps (epochs.parquet)",
            BUDGET,
            "live / off <= 1.01 on CPU",
            pair_ratios=epoch_pairs,
            decided_by_interval=True,
            note=f"pair ratios {', '.join(f'{r:.3f}' for r in epoch_pairs)}{switch_note}",
        ),
        bl.comparison(
            "live metrics overhead (workers' CPU per step)",
            "live (metrics exported)",
            "off (SCALING_LIVE_METRICS=0)",
            cpu_a,
            cpu_b,
            "CPU s/step",
            bl.median(cpu_pairs),
            "median over adjacent ABBA pairs of live / off CPU seconds of the training workers per steady-state step",
            BUDGET,
            "the step-time budget, applied to CPU time (little moved by other jobs)",
            pair_ratios=cpu_pairs,
            decided_by_interval=True,
            note=f"/proc CPU time of the {args.workers} worker processes while the epochs after the first trained; "
            "pair "
            f"ratios {', '.join(f'{r:.3f}' for r in cpu_pairs)}{switch_note}",
        ),
    ]
    cli = f".venv/bin/scaling run {args.config} --launcher ray --workers {args.workers} " + " ".join(
        f"--set {shlex.quote(o)}" for o in overrides
    )
    bench.finish(
        comparisons,
        config=args.config,
        workers=args.workers,
        pairs=pairs,
        epochs_per_run=epochs,
        overrides=overrides,
        arms={arm: f"{ENABLE_ENV}={value} in the job's runtime_env; {cli} --out DIR" for arm, value in ARMS.items()},
        switch_worked=switch_worked,
        pair_ratios=pair_ratios,
        ratio_of_medians=bl.ratio(a_med, b_med),
        runs=runs,
    )
    for row in comparisons:
        print(
            f"[{NAME}] {row['name']}: live {row['a_median']:.4g}, off {row['b_median']:.4g} {row['unit']}; ratio "
            f"{row['ratio']:.3f}, 95% interval {bl._fmt(row['ratio_lo'])}-{bl._fmt(row['ratio_hi'])} "
            f"(budget <= {BUDGET}): {row['verdict']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
