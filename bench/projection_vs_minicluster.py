"""Benchmark: the projection, calibrated on this machine, against 2-node minicluster runs at several link caps (root).

    .venv/bin/python bench/projection_vs_minicluster.py

Brings up a 2-node minicluster (network namespaces "proj", 10.216.0.0/24, one CPU and one Ray
node each), and in this order:
1. at every cap of experiments/projection-minicluster.yaml (each node's egress capped by tc
   tbf), times gloo all-reduces of 64 KB .. 16 MB between the two nodes (one process group
   kept across caps: minicluster.AllreduceProbe), fits the ring's alpha and beta per cap
   (`fit_alpha_beta`), and times the model's own gradient size with the lab's probe
   (`minicluster.allreduce_seconds`) as a check of the fit;
2. measures the one-worker compute of the workload (the quickstart CNN, batch 64 per worker,
   one 25 MB DDP bucket holding all 1.15 MB of gradients): one 1-worker run alone, then two
   1-worker runs at once, one per node, which compute under the contention of the 2-worker run
   (both cores busy, each node's own Ray processes);
3. predicts each 2-worker run's step time and comm overhead with scaling.projection
   (`project_cluster_from_alpha_beta`, flat ring over the cap's fitted alpha and beta,
   bucket_cap_mb = 25 as the lab passes it): the headline model takes the compute from the two
   concurrent runs and adds the wait for the slower rank they measure (straggler_s); two
   simpler variants are recorded beside it (no straggler term; the solo run) -- and writes
   the predictions to the results file before any 2-worker run starts;
4. runs the 2-worker sweep (the caps are its `workers.link_bandwidth` axis; `--repeats` runs per
   cap, 3 by default), reads step_s and comm_overhead_pct from runs.parquet (per cap, the median
   over its repeats), decomposes the median repeat's step into compute, the in-run
   all-reduce and the wait for the slower rank (steps.parquet), and repeats the two
   concurrent 1-worker runs after the sweep to measure how far the machine drifted;
5. takes the cluster down (always), writes bench/results/projection_vs_minicluster.json and
   bench/results/projection_vs_minicluster.png.

Goal: predicted step time within 10% of measured, and comm overhead within 5 percentage
points, at every cap. The machine is shared (2 cores; other jobs run at the same time): the
load average is sampled every 2 s and reported per phase.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchjobs import LoadSampler, decompose, exec_command, log, run_figures, wait_or_stop, write  # noqa: E402
from benchlib import command_line, load_average  # noqa: E402

from scaling.testbed import minicluster as mc  # noqa: E402
from scaling.projection import fit_alpha_beta, project_cluster_from_alpha_beta  # noqa: E402
from scaling.projection.compute import compute_from_concurrent_runs  # noqa: E402
from scaling.results import RunDir, SweepDir  # noqa: E402

NAME = "proj"
SUBNET = "10.216.0.0/24"
CONFIG = "experiments/projection-minicluster.yaml"
MODEL = "small_cnn"
GRADIENT_BYTES = 288_666 * 4  # small_cnn's fp32 gradients: one bucket at bucket_cap_mb = 25
BUCKET_CAP_MB = 25.0
SIZES = (65_536, 262_144, 1_048_576, 4_194_304, 16_777_216)
PROBE_ITERS = 5
FIT_MIN_BURSTS = 4  # fit alpha-beta to sizes whose traffic is at least 4 token-bucket bursts (see fit_caps)
BASELINE_EPOCHS = (
    10  # 1-worker runs: 64 steps per epoch; long enough that the concurrent pair overlaps despite Ray start-up skew
)
RUN_TIMEOUT_S = (
    360  # a 1-worker run (or pair) that has not finished by then is stopped (Ray can hang fetching an object)
)
SWEEP_TIMEOUT_S = 2400
GOAL_STEP_REL = 0.10
GOAL_OVERHEAD_PP = 5.0
N = 2
OUT_JSON = REPO / "bench" / "results" / "projection_vs_minicluster.json"
OUT_PNG = REPO / "bench" / "results" / "projection_vs_minicluster.png"
SCALING = str(Path(sys.executable).parent / "scaling")


def sweep_caps(config: str = CONFIG) -> list[str]:
    import yaml

    data = yaml.safe_load((REPO / config).read_text())
    return list(data["sweep"]["axes"]["workers.link_bandwidth"])


# ---------------------------------------------------------------------------- 1. all-reduce fits


def fit_caps(caps: list[str]) -> dict:
    # its own port: the lab's probe below (allreduce_seconds) runs beside it on the default one
    probe = mc.AllreduceProbe(NAME, N, port=29512)
    fits = {}
    try:
        for cap in caps:
            mc.set_bandwidth(cap, NAME)
            results = probe.measure(SIZES, PROBE_ITERS)
            sizes = [r["bytes"] for r in results]
            medians = [r["median_s"] for r in results]
            line_rate = mc.rate_bits_per_s(cap) / 8 if cap != "uncapped" else None
            burst = mc.tbf_burst_bytes(cap)
            # A message whose traffic fits in the token bucket's burst leaves at the veth's own
            # speed, not the cap's: the ring's alpha-beta line only describes sizes the shaper
            # governs, so the fit takes those (each rank sends 2(n-1)/n S >= FIT_MIN_BURSTS bursts).
            fitted = [i for i, size in enumerate(sizes) if 2 * (N - 1) / N * size >= FIT_MIN_BURSTS * burst]
            fit = fit_alpha_beta([sizes[i] for i in fitted], [medians[i] for i in fitted], N)
            check = mc.allreduce_seconds(GRADIENT_BYTES, NAME, iters=PROBE_ITERS, nodes=N)
            fits[cap] = {
                "cap": cap,
                "line_rate_bytes_per_s": line_rate,
                "sizes_bytes": sizes,
                "median_s": medians,
                "seconds": [r["seconds"] for r in results],
                # nccl-tests: algbw = S / t, busbw = algbw x 2(n-1)/n (= algbw at n = 2)
                "busbw_bytes_per_s": [s / t * 2 * (N - 1) / N for s, t in zip(sizes, medians)],
                "tbf_burst_bytes": burst,
                "fitted_sizes_bytes": [sizes[i] for i in fitted],
                "alpha_s": fit.alpha_s,
                "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
                "beta_s_per_byte": fit.beta_s_per_byte,
                "fit_rms_relative_error": fit.rms_relative_error,
                "bandwidth_over_line_rate": fit.bandwidth_bytes_per_s / line_rate if line_rate else None,
                "gradient_allreduce_fitted_s": fit.predict_s(GRADIENT_BYTES),
                "gradient_allreduce_probe_s": check["median_s"],
                "gradient_allreduce_probe_seconds": check["seconds"],
            }
            log(
                f"{cap}: alpha {fit.alpha_s * 1e6:.0f} us, bandwidth {fit.bandwidth_bytes_per_s * 8 / 1e6:.1f} Mbit/s "
                f"(rms {100 * fit.rms_relative_error:.1f}%); {GRADIENT_BYTES / 1e6:.2f} MB: fitted "
                f"{1e3 * fit.predict_s(GRADIENT_BYTES):.1f} ms, lab probe {1e3 * check['median_s']:.1f} ms"
            )
    finally:
        probe.close()
    return fits


# ---------------------------------------------------------------------------- runs inside the cluster


def one_worker_runs(
    out_dirs: list[Path],
    logs: Path,
    epochs: int = BASELINE_EPOCHS,
    attempts: int = 2,
    config: str = CONFIG,
    name: str = NAME,
) -> None:
    """1-worker runs of `config` in cluster `name`, all started at once (Ray puts each worker on its own
    node: one CPU per node); all of them again, into fresh directories, if one fails or hangs."""
    import shutil

    for attempt in range(1, attempts + 1):
        for d in out_dirs:
            shutil.rmtree(d, ignore_errors=True)
        processes = [
            exec_command(
                ["run", config, "--workers", "1", "--out", str(d), "--set", f"train.max_epochs={epochs}"],
                logs / f"{d.name}.attempt{attempt}.log",
                name,
            )
            for d in out_dirs
        ]
        deadline = time.time() + RUN_TIMEOUT_S
        codes = [wait_or_stop(p, deadline) for p in processes]
        failed = [d for d, c in zip(out_dirs, codes) if c != 0 or not RunDir(d).has_summary]
        if not failed:
            return
        log(f"1-worker run(s) {', '.join(d.name for d in failed)} failed or hung (attempt {attempt}); logs in {logs}")
    raise RuntimeError(f"1-worker runs {', '.join(d.name for d in failed)} failed {attempts} times (logs: {logs})")


def concurrent_compute(dirs: list[Path]) -> dict:
    compute = compute_from_concurrent_runs([RunDir(d) for d in dirs])
    singles = [run_figures(d) for d in dirs]
    return {
        "runs": singles,
        "source": compute.source,
        "data_s": compute.data_s,
        "forward_s": compute.forward_s,
        "backward_s": compute.backward_s,
        "optimizer_s": compute.optimizer_s,
        "step_s": compute.step_s,
        "straggler_s": compute.straggler_s,
    }


# ---------------------------------------------------------------------------- predictions


PREDICTED = (
    "step_s",
    "comm_overhead_pct",
    "exposed_comm_s",
    "straggler_s",
    "allreduce_s",
    "data_s",
    "forward_s",
    "backward_compute_s",
    "optimizer_s",
    "num_buckets",
    "grad_bytes",
)


def predict(fit: dict, from_run, straggler_s: float | None = None) -> dict:
    df = project_cluster_from_alpha_beta(
        fit["alpha_s"],
        fit["bandwidth_bytes_per_s"],
        [1, N],
        gpus_per_node=1,
        model=MODEL,
        from_run=from_run,
        bucket_cap_mb=BUCKET_CAP_MB,
        straggler_s=straggler_s,
    )
    row = df[df["num_workers"] == N].iloc[0]
    out = {k: float(row[k]) for k in PREDICTED}
    out["notes"] = list(df.attrs.get("notes", []))
    return out


MODELS = {
    "concurrent+straggler": "headline: compute from the two concurrent 1-worker runs, plus the wait for the slower "
    "rank they measure",
    "concurrent": "compute from the two concurrent 1-worker runs, no straggler term",
    "solo": "compute from the 1-worker run alone (the projection's plain --from-run)",
}


def predictions(fits: dict, solo: Path, pair: list[Path]) -> dict:
    out = {}
    for cap, fit in fits.items():
        out[cap] = {
            "concurrent+straggler": predict(fit, [RunDir(p) for p in pair]),
            "concurrent": predict(fit, [RunDir(p) for p in pair], straggler_s=0.0),
            "solo": predict(fit, RunDir(solo)),
        }
    return out


# ---------------------------------------------------------------------------- measurements


MEASURED_FIELDS = (
    "step_s",
    "comm_overhead_pct",
    "comm_delta_s",
    "exposed_comm_s",
    "exposed_comm_pct",
    "allreduce_s",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "time_per_epoch_s",
    "run_wall_s",
)


def measured(sweep_dir: Path) -> dict:
    """Per cap: the median over its finished repeats of each figure (the lab's medians over
    repeats), the repeats' own step and comm overhead, and the decomposition of the repeat
    whose step time is the median."""
    import pandas as pd

    runs = pd.read_parquet(SweepDir(sweep_dir).index_path)
    runs = runs[runs["status"] != "failed"]
    out = {}
    for cap, group in runs.groupby("link_bandwidth", sort=False):
        row = {}
        for k in MEASURED_FIELDS:
            values = pd.to_numeric(group[k], errors="coerce").dropna() if k in group.columns else pd.Series(dtype=float)
            row[k] = float(values.median()) if not values.empty else None
        middle = group.loc[(group["step_s"] - group["step_s"].median()).abs().idxmin()]
        run_dir = Path(middle["run_dir"])
        if not run_dir.is_absolute():
            run_dir = sweep_dir / run_dir
        row.update(
            status=middle["status"],
            run_dir=str(run_dir),
            diagnosis=decompose(run_dir),
            repeats=len(group),
            per_repeat=[
                {"step_s": float(r.step_s), "comm_overhead_pct": float(r.comm_overhead_pct)} for r in group.itertuples()
            ],
        )
        out[cap] = row
    return out


# ---------------------------------------------------------------------------- comparison, figure


def compare(preds: dict, meas: dict, fits: dict, headline: str = "concurrent+straggler") -> list[dict]:
    rows = []
    for cap in preds:
        m = meas.get(cap)
        row = {"cap": cap, "line_rate_bits_per_s": mc.rate_bits_per_s(cap) if cap != "uncapped" else None}
        for model, p in preds[cap].items():
            row[f"predicted_step_s[{model}]"] = p["step_s"]
            row[f"predicted_comm_overhead_pct[{model}]"] = p["comm_overhead_pct"]
        if m and m["step_s"] and m["comm_overhead_pct"] is not None:
            row["measured_step_s"] = m["step_s"]
            row["measured_comm_overhead_pct"] = m["comm_overhead_pct"]
            for model, p in preds[cap].items():
                row[f"step_error_pct[{model}]"] = 100 * (p["step_s"] - m["step_s"]) / m["step_s"]
                row[f"overhead_error_pp[{model}]"] = p["comm_overhead_pct"] - m["comm_overhead_pct"]
            row["step_pass"] = abs(row[f"step_error_pct[{headline}]"]) <= 100 * GOAL_STEP_REL
            row["overhead_pass"] = abs(row[f"overhead_error_pp[{headline}]"]) <= GOAL_OVERHEAD_PP
            p, d = preds[cap][headline], m["diagnosis"]
            # where the step-time error sits (predicted - measured, ms), by term
            row["error_by_term_ms"] = {
                "compute": 1e3 * (p["step_s"] - p["exposed_comm_s"] - d["compute_s"]),
                "allreduce": 1e3 * (fits[cap]["gradient_allreduce_fitted_s"] - d["allreduce_in_run_s"]),
                "straggler": 1e3 * (p["straggler_s"] - d["straggler_wait_s"]),
            }
        else:
            row.update(measured_step_s=None, measured_comm_overhead_pct=None, step_pass=False, overhead_pass=False)
        rows.append(row)
    return rows


def figure(rows: list[dict], fits: dict, meas: dict, path: Path, load: dict | None = None) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    caps = [r["cap"] for r in rows]
    x = [r["line_rate_bits_per_s"] / 1e6 for r in rows]
    fig = Figure(figsize=(15, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_step, ax_ovh, ax_ar = fig.subplots(1, 3)
    styles = {
        "concurrent+straggler": dict(color="C0", lw=2, marker="o", label="predicted (concurrent + straggler)"),
        "concurrent": dict(color="C0", lw=1, ls="--", marker=".", label="predicted, no straggler term"),
        "solo": dict(color="C2", lw=1, ls=":", marker=".", label="predicted from the solo 1-worker run"),
    }
    for model, style in styles.items():
        ax_step.plot(x, [1e3 * r[f"predicted_step_s[{model}]"] for r in rows], **style)
        ax_ovh.plot(x, [r[f"predicted_comm_overhead_pct[{model}]"] for r in rows], **style)
    head = [1e3 * r["predicted_step_s[concurrent+straggler]"] for r in rows]
    ax_step.fill_between(
        x, [0.9 * h for h in head], [1.1 * h for h in head], color="C0", alpha=0.12, label="goal: ±10%"
    )
    ovh = [r["predicted_comm_overhead_pct[concurrent+straggler]"] for r in rows]
    ax_ovh.fill_between(x, [o - 5 for o in ovh], [o + 5 for o in ovh], color="C0", alpha=0.12, label="goal: ±5 pp")
    mx = [xi for xi, r in zip(x, rows) if r.get("measured_step_s")]
    repeats = max((m.get("repeats", 1) for m in meas.values()), default=1)
    of = f", median of {repeats}" if repeats > 1 else ""
    ax_step.plot(
        mx,
        [1e3 * r["measured_step_s"] for r in rows if r.get("measured_step_s")],
        "ks",
        ms=7,
        label=f"measured (2 workers, 2 nodes{of})",
    )
    ax_ovh.plot(
        mx,
        [r["measured_comm_overhead_pct"] for r in rows if r.get("measured_step_s")],
        "ks",
        ms=7,
        label=f"measured (A/B{of})",
    )
    ax_ar.plot(x, [1e3 * fits[c]["gradient_allreduce_fitted_s"] for c in caps], "C0o-", label="alpha-beta fit")
    ax_ar.plot(
        x,
        [1e3 * fits[c]["gradient_allreduce_probe_s"] for c in caps],
        "C1^",
        ms=8,
        label="idle probe (lab's allreduce_seconds)",
    )
    ax_ar.plot(
        [xi for xi, c in zip(x, caps) if c in meas],
        [1e3 * meas[c]["diagnosis"]["allreduce_in_run_s"] for c in caps if c in meas],
        "ks",
        ms=7,
        label="in the 2-worker run (slower rank's exposed)",
    )
    ax_ar.plot(
        x, [GRADIENT_BYTES * 8 / (xi * 1e6) * 1e3 for xi in x], color="0.5", lw=1, ls="--", label="S / line rate"
    )
    for ax, title, ylabel in (
        (ax_step, "step time", "ms per step"),
        (ax_ovh, "communication overhead", "% of step"),
        (ax_ar, f"all-reduce of the {GRADIENT_BYTES / 1e6:.2f} MB gradient bucket", "ms"),
    ):
        ax.set_xscale("log")
        ax.set_xticks(x, [c.replace("mbit", " Mbit/s") for c in caps])
        ax.minorticks_off()
        ax.set_xlabel("link cap per node (tc tbf)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax_ar.set_yscale("log")
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    ax_ar.yaxis.set_major_locator(FixedLocator([10, 20, 50, 100, 200, 500]))
    ax_ar.yaxis.set_major_formatter(ScalarFormatter())
    ax_ar.yaxis.set_minor_formatter(NullFormatter())
    title = (
        "small_cnn, batch 64 per worker, 2 workers on 2 minicluster nodes: projection (predicted before the runs) "
        "vs measured"
    )
    if load:
        phases = (("baseline_concurrent", "concurrent baseline"), ("sweep", "2-worker sweep"))
        title += "\nmachine load (1-min load average, 2 cores): " + ", ".join(
            f"{label} {load[key]['mean_load1']:.1f}" for key, label in phases if key in load
        )
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, default=None, help="where the runs go (default results/projection-vs-minicluster/<time>)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="2-worker runs per cap; the comparison takes their median (default 3: one run's "
        "compute moved by up to 20%% between caps on this 2-core machine)",
    )
    args = parser.parse_args()
    started = time.time()
    from benchlib import describe_machine

    load_start = load_average()
    caps = sweep_caps()
    work = (args.work or REPO / "results" / "projection-vs-minicluster" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "projection_vs_minicluster",
        "what": " ".join(__doc__.split("\n\n")[0].split()),
        "command": command_line(),
        "config": CONFIG,
        "model": MODEL,
        "gradient_bytes": GRADIENT_BYTES,
        "bucket_cap_mb": BUCKET_CAP_MB,
        "caps": caps,
        "repeats_per_cap": args.repeats,
        "goal": {
            "step_time_relative": GOAL_STEP_REL,
            "comm_overhead_pp": GOAL_OVERHEAD_PP,
            "judged_on": "concurrent+straggler",
        },
        "models": MODELS,
        "work_dir": str(work),
        "status": "started",
    }
    sampler = LoadSampler().start()
    meas, drift = {}, None
    log(f"minicluster {NAME!r} up (2 nodes, 1 CPU each, {SUBNET}); runs under {work}")
    sampler.phase = "up"
    # down also when the script is ended by SIGTERM or Ctrl-C (minicluster.running)
    try:
        with mc.running(N, None, 1, NAME, SUBNET, log=lambda m: None):
            sampler.phase = "allreduce_fits"
            fits = fit_caps(caps)
            record["fits"] = fits
            mc.set_bandwidth(None, NAME)  # 1-worker runs do not communicate; no cap
            sampler.phase = "baseline_solo"
            solo = work / "w1-solo"
            log("1-worker run alone")
            one_worker_runs([solo], logs, epochs=4)
            sampler.phase = "baseline_concurrent"
            pair = [work / "w1-concurrent-a", work / "w1-concurrent-b"]
            log("two 1-worker runs at once, one per node")
            one_worker_runs(pair, logs)
            record["baseline"] = {"solo": run_figures(solo), "concurrent": concurrent_compute(pair)}
            record["predictions"] = predictions(fits, solo, pair)
            record["status"] = "predicted"
            record["predicted_at"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
            write(record, OUT_JSON)  # the predictions are on disk before any 2-worker run starts
            for cap in caps:
                p = record["predictions"][cap]["concurrent+straggler"]
                log(f"predicted at {cap}: step {1e3 * p['step_s']:.1f} ms, comm overhead {p['comm_overhead_pct']:.1f}%")
            sampler.phase = "sweep"
            sweep_dir = work / "sweep"
            log(f"2-worker sweep over {', '.join(caps)}")
            sweep = exec_command(
                ["sweep", CONFIG, "--repeats", str(args.repeats), "--out", str(sweep_dir)], logs / "sweep.log", NAME
            )
            if wait_or_stop(sweep, time.time() + SWEEP_TIMEOUT_S) is None:
                log(f"the sweep did not finish within {SWEEP_TIMEOUT_S} s and was stopped")
            meas = measured(sweep_dir) if SweepDir(sweep_dir).index_path.is_file() else {}
            sampler.phase = "drift_check"
            mc.set_bandwidth(None, NAME)
            after = [work / "w1-concurrent-after-a", work / "w1-concurrent-after-b"]
            log("drift check: two 1-worker runs at once again")
            try:
                one_worker_runs(after, logs, attempts=1)
                drift = concurrent_compute(after)
                # after the fact, not a prediction: the same model on the baseline measured after the sweep
                drift["posthoc_predictions"] = {
                    cap: predict(fit, [RunDir(p) for p in after]) for cap, fit in record["fits"].items()
                }
            except Exception as exc:  # noqa: BLE001 -- a failed check is reported, not fatal
                drift = {"error": str(exc)}
            sampler.phase = "down"
    finally:
        sampler.stop()
    rows = compare(record["predictions"], meas, record["fits"])
    posthoc = (drift or {}).get("posthoc_predictions") or {}
    for row in rows:
        p = posthoc.get(row["cap"])
        if p and row.get("measured_step_s"):
            # diagnosis only (the baseline was measured after the sweep): how much of the error is drift
            row["posthoc_step_error_pct"] = 100 * (p["step_s"] - row["measured_step_s"]) / row["measured_step_s"]
            row["posthoc_overhead_error_pp"] = p["comm_overhead_pct"] - row["measured_comm_overhead_pct"]
    record.update(
        status="done",
        measured=meas,
        comparison=rows,
        drift_check=drift,
        goal_met=bool(rows) and all(r["step_pass"] and r["overhead_pass"] for r in rows),
        load_by_phase=sampler.by_phase(),
        date=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        wall_s=round(time.time() - started, 1),
        machine=describe_machine(load_start),
    )
    figure(rows, record["fits"], meas, OUT_PNG, record["load_by_phase"])
    write(record, OUT_JSON)
    print()
    print(f"{'cap':>9} {'pred step':>10} {'meas step':>10} {'err':>7} {'pred ovh':>9} {'meas ovh':>9} {'diff':>7}")
    for r in rows:
        if r.get("measured_step_s") is None:
            print(f"{r['cap']:>9}  no measurement")
            continue
        h = "concurrent+straggler"
        print(
            f"{r['cap']:>9} {1e3 * r[f'predicted_step_s[{h}]']:8.1f}ms {1e3 * r['measured_step_s']:8.1f}ms "
            f"{r[f'step_error_pct[{h}]']:+6.1f}% {r[f'predicted_comm_overhead_pct[{h}]']:8.1f}% "
            f"{r['measured_comm_overhead_pct']:8.1f}% {r[f'overhead_error_pp[{h}]']:+6.1f}pp "
            f"{'PASS' if r['step_pass'] and r['overhead_pass'] else 'MISS'}"
        )
    print(
        f"goal met: {record['goal_met']}; wall {record['wall_s']:.0f} s; {OUT_JSON.relative_to(REPO)}, "
        f"{OUT_PNG.relative_to(REPO)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
