"""The projection's Horovod term on this machine: 2-worker Horovod runs of the quickstart at cycle
times long enough that the cycle dominates (1 ms, Horovod's default; 20 ms; 50 ms) and one run
without Tensor Fusion (threshold 0 at 1 ms), each predicted by `scaling.projection` before any
of them runs, then measured and compared arm by arm and, above all, between arms (the cycle's cost).

The term (scaling/projection/cost.py, `horovod_schedule`): Horovod's background thread wakes every
`HOROVOD_CYCLE_TIME`, negotiates which gradient tensors every rank has ready (one latency-bound
collective), fuses them into buffers up to `HOROVOD_FUSION_THRESHOLD` and all-reduces them; a
gradient handed over just after a cycle started waits for the next one. Steps:

1. all-reduce cost: gloo all-reduces of 4 KiB .. 4 MiB between 2 local processes, one thread each
   (bench/allreduce.py's `measure`, torch.distributed gloo: the transfer Horovod's GLOO_ALLREDUCE
   makes; Horovod's own `allreduce_` at its default 1 ms cycle is timed beside it and recorded, as
   it includes the cycle and the negotiation the model adds itself), then `fit_alpha_beta`;
2. compute: one 1-worker run alone, then two 1-worker runs at once (each computes under the
   contention the 2-worker run will see: 2 ranks on 2 cores; they also measure the wait for the
   slower rank), all under Ray Train on a private Ray head, as the 2-worker runs;
3. predictions per arm (`project_cluster_from_alpha_beta`, backend horovod, the arm's cycle time
   and fusion threshold; headline: compute from the concurrent pair plus their straggler wait;
   beside it, compute from the solo run), written to the results file before any 2-worker run;
4. the 2-worker runs (backend horovod, Ray launcher), `--repeats` rounds over the arms, the arm
   order reversed every other round (A B C D, D C B A, ...), so that a drift of the machine touches
   every arm; per arm the medians over repeats of step time, time communicating (`allreduce_s`),
   exposed communication and the A/B difference (t_sync - t_no_sync), and the spread;
5. comparisons: predicted vs measured per arm, and the differences between arms: step(20 ms) -
   step(1 ms), step(50 ms) - step(1 ms) (tens of ms: well above the noise) and no fusion - fusion;
6. a diagnosis after the fact, not a prediction: the same model fed with each 2-worker run's own
   compute (`--from-run` of that run: data, forward, backward less exposed communication,
   optimizer), which takes the compute's error (1-worker runs vs 2 ranks, Horovod's thread and
   other jobs on 2 cores) out and leaves the cycle and fusion term alone against the measurement.

No budget: a measurement on 2 cores shared with other jobs (the runnable-task count per run is
recorded). The JSON keeps every run's figures and the per-step distribution of step times.

    .venv/bin/python bench/horovod_cycle_ground_truth.py
        # 3 repeats x 4 arms x 2 epochs (15 min here, loaded)
    .venv/bin/python bench/horovod_cycle_ground_truth.py --quick    # 1 repeat x 4 arms x 1 short epoch
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl

NAME = "horovod_cycle_ground_truth"
CONFIG = "experiments/quickstart.yaml"
MODEL = "small_cnn"
WORLD = 2
# arm -> (HOROVOD_CYCLE_TIME in ms, HOROVOD_FUSION_THRESHOLD in MiB); 128 MiB is Horovod's default
ARMS = {
    "cycle 1 ms": (1.0, 128.0),
    "cycle 20 ms": (20.0, 128.0),
    "cycle 50 ms": (50.0, 128.0),
    "cycle 1 ms, no fusion": (1.0, 0.0),
}
BASELINE_ARM = "cycle 1 ms"
DIFFERENCES = (("cycle 20 ms", BASELINE_ARM), ("cycle 50 ms", BASELINE_ARM), ("cycle 1 ms, no fusion", BASELINE_ARM))
FIT_MAX_BYTES = 4 * 1024 * 1024  # the model's gradients are 1.15 MB: fit the sizes around them
FIGURES = (
    "step_s",
    "allreduce_s",
    "exposed_comm_s",
    "comm_delta_s",
    "comm_overhead_pct",
    "allreduce_pct",
    "exposed_comm_pct",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
)
PREDICTED = (
    "step_s",
    "allreduce_s",
    "exposed_comm_s",
    "interference_s",
    "straggler_s",
    "backward_compute_s",
    "comm_overhead_pct",
    "num_buckets",
)
RUN_TIMEOUT_S = 300


def log(message: str) -> None:
    print(f"[{NAME} {time.strftime('%H:%M:%S')}] {message}", flush=True)


def fit_allreduce(quick: bool) -> dict:
    """gloo (and Horovod) all-reduce times between 2 local processes; alpha-beta fitted to gloo's."""
    from benchjobs import measure, sizes_bytes

    from scaling.projection import fit_alpha_beta

    sizes = sizes_bytes(FIT_MAX_BYTES)
    times, horovod_error = measure(
        sizes, ["torch_gloo", "horovod_gloo"], rounds=2, warmup=3, target_s=0.1 if quick else 0.3
    )
    gloo = [bl.median(times["torch_gloo"][s]) for s in sizes]
    fit = fit_alpha_beta(sizes, gloo, WORLD)
    horovod = [bl.median(times["horovod_gloo"][s]) for s in sizes] if "horovod_gloo" in times else None
    # the model's isolated Horovod all-reduce: handed over at a random point of the 1 ms cycle (half
    # a cycle's wait on average), one negotiation (the fit's latency term), then the transfer
    model = [0.5e-3 + fit.predict_s(0.0) + fit.predict_s(s) for s in sizes]
    return {
        "sizes_bytes": sizes,
        "gloo_median_s": gloo,
        "horovod_1ms_median_s": horovod,
        "horovod_1ms_model_s": model,
        "horovod_error": horovod_error,
        "alpha_s": fit.alpha_s,
        "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
        "fit_rms_relative_error": fit.rms_relative_error,
    }


def one_worker_runs(run_dirs: list[Path], overrides: list[str], env: dict) -> None:
    """1-worker runs of the quickstart, all started at once, each `scaling run` its own Ray driver."""
    scaling = str(Path(sys.executable).parent / "scaling")
    processes = []
    for d in run_dirs:
        command = [scaling, "run", CONFIG, "--workers", "1", "--launcher", "ray", "--out", str(d)]
        for override in overrides:
            command += ["--set", override]
        with open(d.with_suffix(".log"), "w") as log_file:  # the child keeps its own copy of the descriptor
            processes.append(
                subprocess.Popen(command, cwd=bl.REPO, env=env, stdout=subprocess.DEVNULL, stderr=log_file)
            )
    for d, p in zip(run_dirs, processes):
        if p.wait(timeout=RUN_TIMEOUT_S) != 0:
            raise RuntimeError(f"1-worker run {d.name} failed: {d.with_suffix('.log').read_text()[-600:]}")


def predict(fit: dict, run_dirs, cycle_ms: float, fusion_mb: float) -> dict:
    """The projection's Horovod prediction from a run directory's compute, or from concurrent runs' (a list)."""
    from scaling.projection import project_cluster_from_alpha_beta
    from scaling.results import RunDir

    from_run = [RunDir(d) for d in run_dirs] if isinstance(run_dirs, list) else RunDir(run_dirs)
    df = project_cluster_from_alpha_beta(
        fit["alpha_s"],
        fit["bandwidth_bytes_per_s"],
        [1, WORLD],
        gpus_per_node=1,
        model=MODEL,
        from_run=from_run,
        backend="horovod",
        horovod_cycle_time_ms=cycle_ms,
        horovod_fusion_threshold_mb=fusion_mb,
    )
    row = df[df["num_workers"] == WORLD].iloc[0]
    compute = df[df["num_workers"] == 1].iloc[0]
    return {
        **{k: float(row[k]) for k in PREDICTED},
        "compute_step_s": float(compute["step_s"]),
        "comm_delta_s": float(row["step_s"] - compute["step_s"]),
        "notes": list(df.attrs.get("notes", [])),
    }


def step_distribution(run_dir: Path) -> dict:
    """Quantiles of the steady-state training steps (every rank): the cycle shows as steps bunched
    at whole numbers of cycles."""
    from scaling.results import RunDir

    steps = RunDir(run_dir).steps()
    train = steps[(steps["kind"] == "train") & (~steps["warmup"].astype(bool))]["step_s"]
    nosync = steps[steps["kind"] == "calib_nosync"]["step_s"]
    return {
        "steps": int(len(train)),
        **{f"p{q}_s": float(train.quantile(q / 100)) for q in (10, 25, 50, 75, 90)},
        "calib_nosync_median_s": float(nosync.median()) if len(nosync) else None,
    }


def spread(values: list[float]) -> list[float] | None:
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else None


def main() -> None:
    bench = bl.Benchmark(NAME, __doc__, quick="1 repeat of 1-epoch runs on a quarter of the data", epochs=(2, 1))
    bench.parser.add_argument("--repeats", type=int, help="rounds over the arms (default 3; quick 1)")
    args = bench.parse()
    repeats = args.repeats or (1 if args.quick else 3)
    epochs = args.epochs

    from scaling.config import load_config
    from scaling.testbed.local_cluster import private_ray_head
    from scaling.launch.ray_train import connect
    from scaling.launch.run import execute_run
    from scaling.train import horovod_backend

    usable, why = horovod_backend.available()
    if not usable:
        raise SystemExit(f"[{NAME}] needs Horovod (`make horovod`): {why}")

    data = ["train.target_accuracy=1.0", "data.val_samples=512", *(["data.train_samples=2048"] if args.quick else [])]
    log("all-reduce fit: gloo and Horovod between 2 local processes")
    fit = fit_allreduce(args.quick)
    log(
        f"alpha {fit['alpha_s'] * 1e6:.0f} us, bandwidth {fit['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s "
        f"(rms {100 * fit['fit_rms_relative_error']:.0f}%)"
    )
    if fit["horovod_1ms_median_s"]:
        log(
            "isolated Horovod all-reduce at its 1 ms cycle, measured / model: "
            + ", ".join(
                f"{s // 1024} KiB {1e3 * m:.2f} / {1e3 * p:.2f} ms"
                for s, m, p in zip(fit["sizes_bytes"], fit["horovod_1ms_median_s"], fit["horovod_1ms_model_s"])
            )
        )
    record = {
        "config": CONFIG,
        "model": MODEL,
        "world_size": WORLD,
        "arms": {a: {"horovod_cycle_time_ms": c, "horovod_fusion_threshold_mb": f} for a, (c, f) in ARMS.items()},
        "repeats": repeats,
        "epochs_per_run": epochs,
        "allreduce_fit": fit,
        "status": "started",
    }
    runs = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-hvd-cycle-") as tmp,
        private_ray_head(num_cpus=WORLD, timeout_s=120, prefix="hvdcyc-") as head,
    ):
        env = {**head.env, "RAY_ADDRESS": head.address, "PYTHONPATH": os.environ.get("PYTHONPATH", str(bl.REPO))}
        solo, pair = Path(tmp) / "w1-solo", [Path(tmp) / "w1-concurrent-a", Path(tmp) / "w1-concurrent-b"]
        baseline = [*data, f"train.max_epochs={2 if args.quick else 3}"]
        log("1-worker run alone")
        one_worker_runs([solo], baseline, env)
        log("two 1-worker runs at once")
        one_worker_runs(pair, baseline, env)
        predictions = {
            arm: {
                "concurrent+straggler": predict(fit, [str(p) for p in pair], c, f),
                "solo": predict(fit, str(solo), c, f),
            }
            for arm, (c, f) in ARMS.items()
        }
        record.update(
            predictions=predictions,
            status="predicted",
            predicted_at=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        )
        # the predictions are on disk before any 2-worker run starts
        bl.write_result(bench.name, bench.doc, bench.quick, bench.started, bench.load_start, [], **record)
        for arm, p in predictions.items():
            h = p["concurrent+straggler"]
            log(
                f"predicted {arm}: step {1e3 * h['step_s']:.1f} ms (compute {1e3 * h['compute_step_s']:.1f}, exposed "
                f"{1e3 * h['exposed_comm_s']:.1f}, communicating {1e3 * h['allreduce_s']:.1f}); from the solo run "
                f"{1e3 * p['solo']['step_s']:.1f} ms"
            )

        os.environ.update({"RAY_ADDRESS": head.address, "RAY_AUTH_MODE": "disabled"})
        connect(log_to_driver=False)
        order = list(ARMS)
        for r in range(repeats):
            for arm in order if r % 2 == 0 else order[::-1]:
                cycle_ms, fusion_mb = ARMS[arm]
                overrides = [
                    *data,
                    f"train.max_epochs={epochs}",
                    "backend=horovod",
                    f"instrument.horovod_cycle_time_ms={cycle_ms}",
                    f"instrument.horovod_fusion_threshold_mb={fusion_mb}",
                ]
                cfg = load_config(bl.REPO / CONFIG, overrides=overrides, num_workers=WORLD)
                run_dir = Path(tmp) / f"r{r}-{arm.replace(' ', '_').replace(',', '')}"
                with bl.RunQueue() as rq:
                    summary = execute_run(cfg, run_dir, launcher="ray")
                if summary["status"] == "failed":
                    raise RuntimeError(f"{arm} (repeat {r + 1}) failed: {summary['error']}")
                own = predict(fit, str(run_dir), cycle_ms, fusion_mb)
                runs.append(
                    {
                        "arm": arm,
                        "repeat": r + 1,
                        "mean_runnable": rq.mean,
                        **{k: summary.get(k) for k in FIGURES},
                        "step_distribution": step_distribution(run_dir),
                        "posthoc": {k: own[k] for k in ("step_s", "exposed_comm_s", "allreduce_s", "compute_step_s")},
                    }
                )
                log(
                    f"repeat {r + 1}, {arm}: step {1e3 * summary['step_s']:.1f} ms, communicating "
                    f"{1e3 * summary['allreduce_s']:.1f} ms, exposed {1e3 * summary['exposed_comm_s']:.1f} ms, "
                    f"A/B {1e3 * summary['comm_delta_s']:.1f} ms; {rq.mean} runnable tasks; the model on this "
                    f"run's own compute ({1e3 * own['compute_step_s']:.1f} ms): step {1e3 * own['step_s']:.1f} ms"
                )

    by_arm = {}
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        by_arm[arm] = {
            **{k: bl.median([r[k] for r in rs]) for k in FIGURES},
            "spread": {
                k: spread([r[k] for r in rs]) for k in ("step_s", "allreduce_s", "exposed_comm_s", "comm_delta_s")
            },
        }
    comparisons, rows = compare(predictions, runs, by_arm)
    record.update(status="done", runs=runs, measured=by_arm, table=rows, note=bl.contention_note(runs))
    bench.finish(comparisons, **record)
    print(
        f"{'arm':<40}{'step pred/meas':>16}{'exposed pred/meas':>20}{'communicating pred/meas':>26}"
        f"{'step, own compute':>20}"
    )
    for row in rows:
        print(
            f"{row['arm']:<40}{row['step_ms'][0]:7.1f} /{row['step_ms'][1]:7.1f}"
            f"{row['exposed_ms'][0]:11.1f} /{row['exposed_ms'][1]:7.1f}"
            f"{row['communicating_ms'][0]:15.1f} /{row['communicating_ms'][1]:7.1f}"
            f"{row['step_own_compute_ms']:18.1f}"
        )


def compare(predictions: dict, runs: list[dict], by_arm: dict) -> tuple[list[dict], list[dict]]:
    """Comparison rows (benchlib) per arm and per difference between arms, and a per-arm table in ms."""
    headline = "concurrent+straggler"
    comparisons, rows = [], []
    for arm in ARMS:
        p, m = predictions[arm][headline], by_arm[arm]
        rs = [r for r in runs if r["arm"] == arm]
        rows.append(
            {
                "arm": arm,
                "step_ms": [1e3 * p["step_s"], 1e3 * m["step_s"]],
                "exposed_ms": [1e3 * p["exposed_comm_s"], 1e3 * m["exposed_comm_s"]],
                "communicating_ms": [1e3 * p["allreduce_s"], 1e3 * m["allreduce_s"]],
                "ab_delta_ms": [1e3 * p["comm_delta_s"], 1e3 * m["comm_delta_s"]],
                "step_from_solo_ms": 1e3 * predictions[arm]["solo"]["step_s"],
                "step_own_compute_ms": 1e3 * bl.median([r["posthoc"]["step_s"] for r in rs]),
                "measured_step_ms_per_repeat": [1e3 * r["step_s"] for r in rs],
            }
        )
        spread_ms = ", ".join(f"{1e3 * r['step_s']:.1f}" for r in rs)
        comparisons.append(
            bl.comparison(
                f"Horovod {arm}: step time",
                "predicted (projection)",
                "measured (2 workers)",
                p["step_s"],
                m["step_s"],
                "s/step",
                bl.ratio(p["step_s"], m["step_s"]),
                "predicted / measured step time",
                pair_ratios=[bl.ratio(p["step_s"], r["step_s"]) for r in rs],
                note=f"measured per repeat {spread_ms} ms; predicted from the solo run "
                f"{1e3 * predictions[arm]['solo']['step_s']:.1f} ms",
            )
        )
        comparisons.append(
            bl.comparison(
                f"Horovod {arm}: exposed communication",
                "predicted (projection)",
                "measured (2 workers)",
                p["exposed_comm_s"],
                m["exposed_comm_s"],
                "s/step",
                bl.ratio(p["exposed_comm_s"], m["exposed_comm_s"]),
                "predicted / measured exposed communication per step",
                note=f"time communicating predicted {1e3 * p['allreduce_s']:.1f} ms, measured "
                f"{1e3 * m['allreduce_s']:.1f} "
                f"ms per step; A/B difference predicted {1e3 * p['comm_delta_s']:.1f} ms, measured "
                f"{1e3 * m['comm_delta_s']:.1f} ms",
            )
        )
        own = bl.median([r["posthoc"]["step_s"] for r in rs])
        comparisons.append(
            bl.comparison(
                f"Horovod {arm}: step time, the model on each run's own compute (after the fact)",
                "model on the run's compute",
                "measured (2 workers)",
                own,
                m["step_s"],
                "s/step",
                bl.ratio(own, m["step_s"]),
                "median over runs of model / measured step time",
                pair_ratios=[bl.ratio(r["posthoc"]["step_s"], r["step_s"]) for r in rs],
                note="a diagnosis, not a prediction: compute (data, forward, backward less exposed, optimizer) taken "
                "from the 2-worker run itself, "
                + ", ".join(f"{1e3 * r['posthoc']['compute_step_s']:.1f}" for r in rs)
                + " ms",
            )
        )
    for arm, base in DIFFERENCES:
        predicted = predictions[arm][headline]["step_s"] - predictions[base][headline]["step_s"]
        # per repeat: the two arms ran in the same round, one after the other
        pairs = [
            (a, b) for a in runs if a["arm"] == arm for b in runs if b["arm"] == base and b["repeat"] == a["repeat"]
        ]
        paired = [a["step_s"] - b["step_s"] for a, b in pairs]
        measured = bl.median(paired)
        own = bl.median([a["posthoc"]["step_s"] - b["posthoc"]["step_s"] for a, b in pairs])
        rows.append(
            {
                "arm": f"{arm} minus {base}",
                "step_ms": [1e3 * predicted, 1e3 * measured],
                "exposed_ms": [
                    1e3
                    * (predictions[arm][headline]["exposed_comm_s"] - predictions[base][headline]["exposed_comm_s"]),
                    1e3 * (by_arm[arm]["exposed_comm_s"] - by_arm[base]["exposed_comm_s"]),
                ],
                "communicating_ms": [
                    1e3 * (predictions[arm][headline]["allreduce_s"] - predictions[base][headline]["allreduce_s"]),
                    1e3 * (by_arm[arm]["allreduce_s"] - by_arm[base]["allreduce_s"]),
                ],
                "step_own_compute_ms": 1e3 * own,
                "measured_step_difference_ms_per_repeat": [1e3 * d for d in paired],
            }
        )
        comparisons.append(
            bl.comparison(
                f"Horovod step time, {arm} minus {base}",
                "predicted (projection)",
                "measured (same repeat)",
                predicted,
                measured,
                "s/step",
                bl.ratio(predicted, measured),
                "predicted / measured difference",
                note="measured per repeat " + ", ".join(f"{1e3 * d:+.1f}" for d in paired) + f" ms; the model on each "
                f"run's own compute (after the fact) {1e3 * own:+.1f} ms",
            )
        )
    return comparisons, rows


if __name__ == "__main__":  # bench/allreduce.py's measure spawns processes that re-import this module
    main()
