"""Benchmark: the FSDP projection, calibrated on this machine, against measured 2-node minicluster runs of gpt2-tiny at two link caps (root).

    .venv/bin/python bench/projection_vs_minicluster_fsdp.py
        # about 17 minutes on a quiet machine (it prints its estimate)
    .venv/bin/python bench/projection_vs_minicluster_fsdp.py --quick
        # about 5 minutes: the pieces run, no measurement

The FSDP half of the minicluster proof; bench/projection_vs_minicluster.py is the DDP half, and
this script takes its shared pieces from there (the load sampler, commands inside the cluster,
the 1-worker runs and their concurrent baseline, the results file). It brings up a 2-node
minicluster (network namespaces "pfsdp", 10.217.0.0/24, one CPU and one Ray node each), and in
this order:
1. at every cap of experiments/projection-minicluster-fsdp.yaml (its `workers.link_bandwidth`
   axis) caps each node's egress with a tc token bucket of LINK_BURST_BYTES (`cap_links`), times
   gloo all-reduces of 16 KB .. 2 MB and of each FSDP unit's buffer between the two nodes (one
   process group kept across caps: minicluster.AllreduceProbe) and fits the ring's alpha and beta
   per cap (`fit_alpha_beta`). Gloo's reduce-scatter is an all-reduce of the whole buffer (torch's
   ProcessGroupGloo::reduce_scatter_tensor_coalesced), so the probe at a unit's size times that
   unit's reduce-scatter itself: the check of the fit. The all-gathers (a ring all-gather moves
   half an all-reduce's traffic, nccl-tests' definitions) come from the same alpha and beta; the
   testbed's probe times all-reduces only, so they are checked after the fact, against their
   times inside the 2-worker runs (collectives.parquet);
2. measures the one-worker compute (the lab trains the plain model at one worker): one 1-worker
   run alone, then two at once, one per node, which compute under the contention of the 2-worker
   run (both cores busy, each node's own Ray processes);
3. predicts each 2-worker run's step time and exposed communication with scaling.projection
   (`project_cluster_from_alpha_beta`, backend fsdp, `fsdp_process_group="gloo"`: every
   collective holds the training thread, so all of it is exposed, and the reduce-scatter costs an
   all-reduce; the root re-gathered too, as FSDP2 does when given `reshard_after_forward=True`):
   the headline model takes the compute from the two concurrent runs and adds the wait for the
   slower rank they measure (straggler_s); two simpler variants are recorded beside it (no
   straggler term; the solo run). The predictions are written to the results file before any
   2-worker run starts;
4. runs the 2-worker runs, `--repeats` per cap (3 by default) with `scaling run`, and reads each
   run's step_s and exposed_comm_pct (and the A/B overhead, the reduce-scatters' cost, reported
   beside) from its summary, the median over repeats per cap; cuts the median repeat's step into
   compute, each collective kind's transfer and the wait for the slower rank (steps.parquet,
   collectives.parquet); then repeats the two concurrent 1-worker runs to measure how far the
   machine drifted;
5. takes the cluster down (always, on SIGTERM and Ctrl-C too: minicluster.running), writes
   bench/results/projection_vs_minicluster_fsdp.json and .png (`--quick`: bench/results/quick/).

Why the script caps the links itself: the testbed's token bucket holds 64 KB or 4 ms of traffic
(minicluster.tbf_burst_bytes), and every FSDP collective of gpt2-tiny sends 41-200 KB per rank,
each after some compute that refills the bucket: a third to a half of each would leave at the
veth's speed and the cap would not be the link the fit measures (at 50 Mbit/s a 200 KB
all-gather took 16.5 ms back to back and 10 ms after a 20 ms pause; with a 3 KB bucket 18-20 ms
both ways). A 4 KB bucket, under a tenth of the smallest collective, leaves the cap a link of that
rate. The runs are `scaling run`s of the config's base (no link axis), so no run re-caps the
links with the testbed's bucket; each run's summary still records the cap (the cluster's state).

Goal (issue 32): predicted step time within 5% of measured and exposed communication within 3
percentage points, at both caps. The machine is shared (2 cores; other jobs run at the same
time): the load average is sampled every 2 s and reported per phase.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import benchlib as bl  # noqa: E402
from projection_vs_minicluster import (  # noqa: E402
    LoadSampler,
    concurrent_compute,
    exec_command,
    log,
    one_worker_runs,
    run_figures,
    sweep_caps,
    wait_or_stop,
    write,
)

from scaling.projection import fit_alpha_beta, project_cluster_from_alpha_beta  # noqa: E402
from scaling.projection.cost import reduce_scatter_s  # noqa: E402
from scaling.projection.layers import load_layer_table  # noqa: E402
from scaling.results import RunDir  # noqa: E402
from scaling.testbed import minicluster as mc  # noqa: E402

RESULT = "projection_vs_minicluster_fsdp"
NAME = "pfsdp"
SUBNET = "10.217.0.0/24"
CONFIG = "experiments/projection-minicluster-fsdp.yaml"
MODEL = "gpt2-tiny"
N = 2
LINK_BURST_BYTES = 4096  # the token bucket of every cap (module docstring: why not the testbed's)
PROBE_PORT = 29514  # the DDP half's probe takes 29512
FIT_SIZES = (16_384, 32_768, 65_536, 131_072, 262_144, 524_288, 1_048_576, 2_097_152)
PROBE_ITERS = 9
SOLO_EPOCHS = 3  # 1-worker runs: 64 steps of about 0.1 s per epoch
PAIR_EPOCHS = 8  # about 50 s: the pair overlaps despite Ray's start-up skew (16 s seen)
RUN_TIMEOUT_S = 480  # a run (or the pair) that has not finished by then is stopped (Ray can hang fetching an object)
GOAL_STEP_REL = 0.05
GOAL_EXPOSED_PP = 3.0
HEADLINE = "concurrent+straggler"
MODELS = {
    HEADLINE: "headline: compute from the two concurrent 1-worker runs, plus the wait for the slower rank they measure",
    "concurrent": "compute from the two concurrent 1-worker runs, no straggler term",
    "solo": "compute from the 1-worker run alone (the projection's plain --from-run)",
}
KINDS = ("all_gather", "re_gather", "reduce_scatter")  # the projection's names; the lab's columns below
KIND_COLUMNS = {"all_gather": "allgather_s", "re_gather": "regather_s", "reduce_scatter": "reducescatter_s"}
# Seconds per phase, for the printed estimate (this machine, 2 shared cores): a Ray run's start and
# finish, an epoch at 1 and at 2 workers (with the A/B pairs and the evaluation), the rest.
START_S, EPOCH_1W_S, EPOCH_2W_S, UP_DOWN_S, FIT_S = 45, 9, 16, 90, 20


def unit_bytes() -> list[int]:
    """Each FSDP unit's fp32 parameter buffer in bytes (root first): what it all-gathers and reduce-scatters."""
    return [u["params"] * 4 for u in load_layer_table(MODEL)["units"]]


def projection_settings() -> dict:
    """run_projection's FSDP arguments for CONFIG's `fsdp:`; ValueError where the bench cannot model it."""
    from scaling.config import load_config

    fsdp = load_config(REPO / CONFIG).fsdp
    dtypes = {"float32": "fp32", "bfloat16": "bf16"}
    if fsdp.shard != "blocks" or fsdp.param_dtype != "float32" or fsdp.reduce_dtype != "float32":
        raise ValueError(f"{CONFIG}: the bench projects fsdp.shard blocks in float32 (its probe times fp32 units)")
    # the lab's loop reshards every block when true and keeps the root gathered (FSDP2's default for it)
    return {
        "backend": "fsdp",
        "fsdp_process_group": "gloo",
        "reshard_after_forward": "all" if fsdp.reshard_after_forward else "none",
        "fsdp_param_dtype": dtypes[fsdp.param_dtype],
        "fsdp_reduce_dtype": dtypes[fsdp.reduce_dtype],
        "activation_checkpointing": "none",
    }


# ---------------------------------------------------------------------------- 1. the links and their fit


def _tc(namespace: str, *args: str) -> str:
    result = subprocess.run(["ip", "netns", "exec", namespace, "tc", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} in {namespace} failed: {result.stderr.strip()}")
    return result.stdout


def cap_links(cap: str | None, name: str = NAME) -> str:
    """Every node's egress of cluster `name` capped at `cap` with a LINK_BURST_BYTES token bucket (None:
    uncapped); returns node 0's qdisc as tc shows it."""
    cluster = mc.set_bandwidth(cap, name)  # the testbed's cap first: the cluster's state records it for the runs
    if cap is None:
        return "uncapped"
    for node in cluster.nodes:
        _tc(
            node.namespace,
            "qdisc",
            "replace",
            "dev",
            mc.NODE_IFACE,
            "root",
            "tbf",
            "rate",
            cap,
            "burst",
            str(LINK_BURST_BYTES),
            "latency",
            "200ms",
        )
    return _tc(cluster.nodes[0].namespace, "qdisc", "show", "dev", mc.NODE_IFACE).strip()


def fit_caps(caps: list[str], units: list[int]) -> dict:
    sizes = sorted(set(FIT_SIZES) | set(units))
    probe = mc.AllreduceProbe(NAME, N, port=PROBE_PORT)
    fits = {}
    try:
        for cap in caps:
            qdisc = cap_links(cap)
            results = probe.measure(sizes, PROBE_ITERS)
            medians = {r["bytes"]: r["median_s"] for r in results}
            fit = fit_alpha_beta(sizes, [medians[s] for s in sizes], N)
            line_rate = mc.rate_bits_per_s(cap) / 8
            units_check = {
                str(nbytes): {
                    "reduce_scatter_fitted_s": fit.predict_s(nbytes),  # gloo's: an all-reduce of the buffer
                    "reduce_scatter_probe_s": medians[nbytes],
                    "all_gather_fitted_s": reduce_scatter_s(nbytes, N, fit.alpha_s, fit.bandwidth_bytes_per_s),
                }
                for nbytes in sorted(set(units))
            }
            fits[cap] = {
                "cap": cap,
                "qdisc": qdisc,
                "line_rate_bytes_per_s": line_rate,
                "sizes_bytes": sizes,
                "median_s": [medians[s] for s in sizes],
                "seconds": [r["seconds"] for r in results],
                "busbw_bytes_per_s": [s / medians[s] * 2 * (N - 1) / N for s in sizes],  # nccl-tests' all-reduce busbw
                "alpha_s": fit.alpha_s,
                "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
                "beta_s_per_byte": fit.beta_s_per_byte,
                "fit_rms_relative_error": fit.rms_relative_error,
                "bandwidth_over_line_rate": fit.bandwidth_bytes_per_s / line_rate,
                "units": units_check,
            }
            log(
                f"{cap}: alpha {fit.alpha_s * 1e6:.0f} us, bandwidth {fit.bandwidth_bytes_per_s * 8 / 1e6:.1f} Mbit/s "
                f"(rms {100 * fit.rms_relative_error:.1f}%); reduce-scatter per unit, fitted / probe: "
                + ", ".join(
                    f"{int(b) / 1e3:.0f} KB {1e3 * c['reduce_scatter_fitted_s']:.1f} / "
                    f"{1e3 * c['reduce_scatter_probe_s']:.1f} ms"
                    for b, c in units_check.items()
                )
            )
    finally:
        probe.close()
    return fits


# ---------------------------------------------------------------------------- 3. predictions


PREDICTED = (
    "step_s",
    "exposed_comm_s",
    "exposed_comm_pct",
    "comm_overhead_pct",
    "allreduce_s",
    "straggler_s",
    "allgather_s",
    "regather_s",
    "reducescatter_s",
    "data_s",
    "forward_s",
    "backward_s",
    "backward_compute_s",
    "optimizer_s",
    "num_buckets",
    "grad_bytes",
)


def predict(fit: dict, from_run, settings: dict, straggler_s: float | None = None) -> dict:
    df = project_cluster_from_alpha_beta(
        fit["alpha_s"],
        fit["bandwidth_bytes_per_s"],
        [1, N],
        gpus_per_node=1,
        model=MODEL,
        from_run=from_run,
        straggler_s=straggler_s,
        **settings,
    )
    row = df[df["num_workers"] == N].iloc[0]
    out = {k: float(row[k]) for k in PREDICTED}
    out["notes"] = list(df.attrs.get("notes", []))
    return out


def predictions(fits: dict, solo: Path, pair: list[Path], settings: dict) -> dict:
    return {
        cap: {
            HEADLINE: predict(fit, [RunDir(p) for p in pair], settings),
            "concurrent": predict(fit, [RunDir(p) for p in pair], settings, straggler_s=0.0),
            "solo": predict(fit, RunDir(solo), settings),
        }
        for cap, fit in fits.items()
    }


# ---------------------------------------------------------------------------- 4. the 2-worker runs


MEASURED_FIELDS = (
    "step_s",
    "exposed_comm_s",
    "exposed_comm_pct",
    "comm_overhead_pct",
    "comm_delta_s",
    "comm_s",
    "allgather_s",
    "regather_s",
    "reducescatter_s",
    "exposed_forward_comm_s",
    "waiting_s",
    "transfer_s",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "compute_s",
    "time_per_epoch_s",
    "run_wall_s",
)


def two_worker_runs(cap: str, repeats: int, work: Path, logs: Path, overrides: list[str]) -> list[Path]:
    """`repeats` 2-worker runs of CONFIG at `cap` (seeds 0, 1, ...), one after the other; a run that fails or
    hangs is made once more."""
    import shutil

    qdisc = cap_links(cap)
    log(f"{cap}: {qdisc}")
    done = []
    for repeat in range(repeats):
        run_dir = work / f"w2-{cap}-r{repeat}"
        for attempt in (1, 2):
            shutil.rmtree(run_dir, ignore_errors=True)
            process = exec_command(
                [
                    "run",
                    CONFIG,
                    "--workers",
                    str(N),
                    "--out",
                    str(run_dir),
                    "--set",
                    f"train.seed={repeat}",
                    *overrides,
                ],
                logs / f"{run_dir.name}.attempt{attempt}.log",
                NAME,
            )
            code = wait_or_stop(process, time.time() + RUN_TIMEOUT_S)
            if code == 0 and RunDir(run_dir).has_summary and RunDir(run_dir).summary().get("step_s"):
                done.append(run_dir)
                log(
                    f"{cap} repeat {repeat}: step {1e3 * RunDir(run_dir).summary()['step_s']:.1f} ms, exposed "
                    f"{RunDir(run_dir).summary()['exposed_comm_pct']:.1f}%"
                )
                break
            log(f"{cap} repeat {repeat} failed or hung (attempt {attempt}); log in {logs}")
    return done


def measured(cap: str, run_dirs: list[Path]) -> dict:
    """The median over the cap's runs of each figure (the lab's medians over repeats), each run's step and
    exposed communication, and the decomposition of the run whose step time is the median."""
    import statistics

    summaries = {d: RunDir(d).summary() for d in run_dirs}
    row = {}
    for key in MEASURED_FIELDS:
        values = [s[key] for s in summaries.values() if isinstance(s.get(key), (int, float))]
        row[key] = statistics.median(values) if values else None
    middle = min(run_dirs, key=lambda d: abs(summaries[d]["step_s"] - row["step_s"]))
    row.update(
        cap=cap,
        repeats=len(run_dirs),
        run_dir=str(middle),
        diagnosis=decompose(middle),
        link_bandwidth=summaries[middle].get("link_bandwidth"),
        per_repeat=[
            {
                "step_s": s["step_s"],
                "exposed_comm_pct": s["exposed_comm_pct"],
                "comm_overhead_pct": s.get("comm_overhead_pct"),
            }
            for s in summaries.values()
        ],
    )
    return row


def decompose(run_dir: Path) -> dict:
    """Each steady-state step of a 2-worker run cut into compute, each collective kind's transfer and the
    wait for the slower rank.

    Gloo's collectives hold both ranks' training threads, so each is a sync point: the rank that
    issued it last spent only the transfer in it (the shorter duration of the two ranks'), the
    other rank also its wait for that rank (the difference). Transfers and waits are summed per
    step, compute = step - exposed per rank (the lab's compute_s); means over steps and ranks,
    as the lab's step_s. Per unit and kind: the median transfer of one collective.
    """
    run = RunDir(run_dir)
    steps = run.steps()
    train = steps[(steps["kind"] == "train") & (~steps["warmup"].astype(bool))]
    compute = (train["step_s"] - train["exposed_comm_s"]).groupby(train["rank"]).mean()
    frame = run.collectives()
    frame = frame[(frame["step_kind"] == "train") & (~frame["warmup"].astype(bool))].copy()
    frame["kind"] = frame["collective"].where(
        ~((frame["collective"] == "all_gather") & (frame["pass"] == "backward")), "re_gather"
    )
    keys = ["epoch", "step", "index"]
    durations = frame.pivot_table(index=keys, columns="rank", values="duration_s").dropna()
    labels = frame.drop_duplicates(keys).set_index(keys)[["kind", "module", "bytes"]]
    per = labels.join(durations.min(axis=1).rename("transfer_s"), how="inner")
    per["wait_s"] = durations.sub(durations.min(axis=1), axis=0).mean(axis=1)
    count = len(per.index.droplevel("index").unique())
    by_kind = per.groupby("kind")[["transfer_s", "wait_s"]].sum() / count
    per_unit = per.groupby(["kind", "module"]).agg(bytes=("bytes", "first"), transfer_s=("transfer_s", "median"))
    return {
        "steps": int(count),
        "compute_s": float(compute.mean()),
        "compute_s_per_rank": [float(v) for v in compute],
        "transfer_s": float(by_kind["transfer_s"].sum()),
        "wait_s": float(by_kind["wait_s"].sum()),
        "by_kind": {
            k: {"transfer_s": float(by_kind.loc[k, "transfer_s"]), "wait_s": float(by_kind.loc[k, "wait_s"])}
            for k in KINDS
            if k in by_kind.index
        },
        "per_unit": [
            {"kind": k, "module": m, "bytes": int(r["bytes"]), "transfer_s": float(r["transfer_s"])}
            for (k, m), r in per_unit.iterrows()
        ],
    }


# ---------------------------------------------------------------------------- comparison, figure


def compare(preds: dict, meas: dict) -> list[dict]:
    rows = []
    for cap in preds:
        m = meas.get(cap)
        row = {"cap": cap, "line_rate_bits_per_s": mc.rate_bits_per_s(cap)}
        for model, p in preds[cap].items():
            row[f"predicted_step_s[{model}]"] = p["step_s"]
            row[f"predicted_exposed_comm_pct[{model}]"] = p["exposed_comm_pct"]
        row["predicted_comm_overhead_pct"] = preds[cap][HEADLINE]["comm_overhead_pct"]
        if not (m and m.get("step_s") and m.get("exposed_comm_pct") is not None):
            row.update(measured_step_s=None, measured_exposed_comm_pct=None, step_pass=False, exposed_pass=False)
            rows.append(row)
            continue
        row.update(
            measured_step_s=m["step_s"],
            measured_exposed_comm_pct=m["exposed_comm_pct"],
            measured_comm_overhead_pct=m["comm_overhead_pct"],
        )
        for model, p in preds[cap].items():
            row[f"step_error_pct[{model}]"] = 100 * (p["step_s"] - m["step_s"]) / m["step_s"]
            row[f"exposed_error_pp[{model}]"] = p["exposed_comm_pct"] - m["exposed_comm_pct"]
        row["step_pass"] = abs(row[f"step_error_pct[{HEADLINE}]"]) <= 100 * GOAL_STEP_REL
        row["exposed_pass"] = abs(row[f"exposed_error_pp[{HEADLINE}]"]) <= GOAL_EXPOSED_PP
        p, d = preds[cap][HEADLINE], m["diagnosis"]
        # where the step-time error sits (predicted - measured, ms), by term
        row["error_by_term_ms"] = {
            "compute": 1e3 * (p["step_s"] - p["exposed_comm_s"] - d["compute_s"]),
            **{
                kind: 1e3 * (p[KIND_COLUMNS[kind]] - d["by_kind"].get(kind, {}).get("transfer_s", 0.0))
                for kind in KINDS
            },
            "straggler": 1e3 * (p["straggler_s"] - d["wait_s"]),
        }
        rows.append(row)
    return rows


def figure(rows: list[dict], preds: dict, meas: dict, path: Path, load: dict | None = None) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    x = list(range(len(rows)))
    caps = [r["cap"] for r in rows]
    fig = Figure(figsize=(15, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_step, ax_exp, ax_kind = fig.subplots(1, 3)
    styles = {
        HEADLINE: dict(color="C0", lw=2, marker="o", label="predicted (concurrent + straggler)"),
        "concurrent": dict(color="C0", lw=1, ls="--", marker=".", label="predicted, no straggler term"),
        "solo": dict(color="C2", lw=1, ls=":", marker=".", label="predicted from the solo 1-worker run"),
    }
    for model, style in styles.items():
        ax_step.plot(x, [1e3 * r[f"predicted_step_s[{model}]"] for r in rows], **style)
        ax_exp.plot(x, [r[f"predicted_exposed_comm_pct[{model}]"] for r in rows], **style)
    head = [1e3 * r[f"predicted_step_s[{HEADLINE}]"] for r in rows]
    ax_step.fill_between(
        x,
        [(1 - GOAL_STEP_REL) * h for h in head],
        [(1 + GOAL_STEP_REL) * h for h in head],
        color="C0",
        alpha=0.12,
        label=f"goal: ±{100 * GOAL_STEP_REL:.0f}%",
    )
    exp = [r[f"predicted_exposed_comm_pct[{HEADLINE}]"] for r in rows]
    ax_exp.fill_between(
        x,
        [e - GOAL_EXPOSED_PP for e in exp],
        [e + GOAL_EXPOSED_PP for e in exp],
        color="C0",
        alpha=0.12,
        label=f"goal: ±{GOAL_EXPOSED_PP:g} pp",
    )
    have = [(xi, r) for xi, r in zip(x, rows) if r.get("measured_step_s")]
    repeats = max((m.get("repeats", 1) for m in meas.values()), default=1)
    of = f", median of {repeats}" if repeats > 1 else ""
    ax_step.plot(
        [xi for xi, _ in have],
        [1e3 * r["measured_step_s"] for _, r in have],
        "ks",
        ms=7,
        label=f"measured (2 workers, 2 nodes{of})",
    )
    ax_exp.plot(
        [xi for xi, _ in have], [r["measured_exposed_comm_pct"] for _, r in have], "ks", ms=7, label=f"measured{of}"
    )
    width = 0.12
    for k, kind in enumerate(KINDS):
        offset = (k - 1) * 2.2 * width
        ax_kind.bar(
            [xi + offset - width / 2 for xi in x],
            [1e3 * preds[c][HEADLINE][KIND_COLUMNS[kind]] for c in caps],
            width,
            color=f"C{k}",
            alpha=0.45,
            label=f"{kind.replace('_', '-')}: fitted",
        )
        ax_kind.bar(
            [xi + offset + width / 2 for xi, c in zip(x, caps)],
            [
                1e3
                * ((meas.get(c) or {}).get("diagnosis") or {}).get("by_kind", {}).get(kind, {}).get("transfer_s", 0.0)
                for c in caps
            ],
            width,
            color=f"C{k}",
            label=f"{kind.replace('_', '-')}: in the run",
        )
    for ax, title, ylabel in (
        (ax_step, "step time", "ms per step"),
        (ax_exp, "exposed communication", "% of step"),
        (ax_kind, "collectives per step, by kind (transfer)", "ms per step"),
    ):
        ax.set_xticks(x, [c.replace("mbit", " Mbit/s") for c in caps])
        ax.set_xlabel("link cap per node (tc tbf, 4 KB bucket)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    title = "gpt2-tiny, FSDP2 on gloo, batch 32 per worker, 2 workers on 2 minicluster nodes: projection (predicted before the runs) vs measured"
    if load:
        phases = (("baseline_concurrent", "concurrent baseline"), ("runs", "2-worker runs"))
        title += "\nmachine load (1-min load average, 2 cores): " + ", ".join(
            f"{label} {load[key]['mean_load1']:.1f}" for key, label in phases if key in load
        )
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------- main


def expected_minutes(caps: int, runs_per_cap: int, epochs_2w: int, solo: int, pair: int, drift: bool) -> float:
    one_worker = 2 * START_S + EPOCH_1W_S * (solo + pair) + (START_S + EPOCH_1W_S * pair if drift else 0)
    return (UP_DOWN_S + FIT_S * caps + one_worker + caps * runs_per_cap * (START_S + EPOCH_2W_S * epochs_2w)) / 60


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="where the runs go (default results/projection-vs-minicluster-fsdp/<time>)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="2-worker runs per cap; the comparison takes their median (default: the config's sweep.repeats, 3)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke check of every piece (the first cap, 1 run of 1 epoch, short baselines, no drift "
        "check), written to bench/results/quick/; not a measurement",
    )
    args = parser.parse_args()
    started = time.time()
    load_start = bl.load_average()
    import yaml

    caps = sweep_caps(CONFIG)
    sweep = yaml.safe_load((REPO / CONFIG).read_text())["sweep"]
    try:
        settings = projection_settings()
    except ValueError as exc:
        parser.error(str(exc))
    units = unit_bytes()
    repeats = 1 if args.quick else (args.repeats or int(sweep["repeats"]))
    run_caps = caps[:1] if args.quick else caps
    epochs_2w = 1 if args.quick else None  # None: the config's train.max_epochs
    solo_epochs, pair_epochs = (1, 5) if args.quick else (SOLO_EPOCHS, PAIR_EPOCHS)
    overrides = ["--set", f"train.max_epochs={epochs_2w}"] if epochs_2w else []
    from scaling.config import load_config

    epochs_full = epochs_2w or load_config(REPO / CONFIG).train.max_epochs
    out_json = bl.results_dir(args.quick) / f"{RESULT}.json"
    out_png = out_json.with_suffix(".png")
    work = (args.work or REPO / "results" / "projection-vs-minicluster-fsdp" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": RESULT,
        "what": bl.what(__doc__),
        "command": bl.command_line(),
        "quick": args.quick,
        "config": CONFIG,
        "model": MODEL,
        "unit_bytes": units,
        "link_burst_bytes": LINK_BURST_BYTES,
        "caps": caps,
        "run_caps": run_caps,
        "repeats_per_cap": repeats,
        "projection_settings": settings,
        "goal": {"step_time_relative": GOAL_STEP_REL, "exposed_comm_pp": GOAL_EXPOSED_PP, "judged_on": HEADLINE},
        "models": MODELS,
        "work_dir": str(work),
        "status": "started",
    }
    minutes = expected_minutes(len(run_caps), repeats, epochs_full, solo_epochs, pair_epochs, not args.quick)
    log(
        f"expected duration: about {minutes:.0f} minutes ({len(run_caps)} cap(s) x {repeats} run(s) of {epochs_full} "
        f"epoch(s), baselines of {solo_epochs} and {pair_epochs} epochs{'' if args.quick else ', drift check'})"
    )
    sampler = LoadSampler().start()
    meas, drift = {}, None
    log(f"minicluster {NAME!r} up (2 nodes, 1 CPU each, {SUBNET}); runs under {work}")
    sampler.phase = "up"
    try:
        # down also when the script is ended by SIGTERM or Ctrl-C (minicluster.running)
        with mc.running(N, None, 1, NAME, SUBNET, log=lambda m: None):
            sampler.phase = "fits"
            fits = fit_caps(caps, units)
            record["fits"] = fits
            cap_links(None)  # 1-worker runs do not communicate; no cap
            sampler.phase = "baseline_solo"
            solo = work / "w1-solo"
            log("1-worker run alone")
            one_worker_runs([solo], logs, epochs=solo_epochs, config=CONFIG, name=NAME)
            sampler.phase = "baseline_concurrent"
            pair = [work / "w1-concurrent-a", work / "w1-concurrent-b"]
            log("two 1-worker runs at once, one per node")
            one_worker_runs(pair, logs, epochs=pair_epochs, config=CONFIG, name=NAME)
            record["baseline"] = {"solo": run_figures(solo), "concurrent": concurrent_compute(pair)}
            record["predictions"] = predictions(fits, solo, pair, settings)
            record["status"] = "predicted"
            record["predicted_at"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
            write(record, out_json)  # the predictions are on disk before any 2-worker run starts
            for cap in caps:
                p = record["predictions"][cap][HEADLINE]
                log(
                    f"predicted at {cap}: step {1e3 * p['step_s']:.1f} ms, exposed {p['exposed_comm_pct']:.1f}% "
                    f"(all-gather {1e3 * p['allgather_s']:.1f}, re-gather {1e3 * p['regather_s']:.1f}, reduce-scatter "
                    f"{1e3 * p['reducescatter_s']:.1f}, straggler {1e3 * p['straggler_s']:.1f} ms)"
                )
            sampler.phase = "runs"
            for cap in run_caps:
                done = two_worker_runs(cap, repeats, work, logs, overrides)
                if done:
                    meas[cap] = measured(cap, done)
            if not args.quick:
                sampler.phase = "drift_check"
                cap_links(None)
                after = [work / "w1-concurrent-after-a", work / "w1-concurrent-after-b"]
                log("drift check: two 1-worker runs at once again")
                try:
                    one_worker_runs(after, logs, epochs=pair_epochs, attempts=1, config=CONFIG, name=NAME)
                    drift = concurrent_compute(after)
                    # after the fact, not a prediction: the same model on the baseline measured after the runs
                    drift["posthoc_predictions"] = {
                        cap: predict(fit, [RunDir(p) for p in after], settings) for cap, fit in fits.items()
                    }
                except Exception as exc:  # noqa: BLE001 -- a failed check is reported, not fatal
                    drift = {"error": str(exc)}
            sampler.phase = "down"
    finally:
        sampler.stop()
    rows = compare({c: record["predictions"][c] for c in run_caps}, meas)
    posthoc = (drift or {}).get("posthoc_predictions") or {}
    for row in rows:
        p = posthoc.get(row["cap"])
        if p and row.get("measured_step_s"):
            # diagnosis only (the baseline was measured after the runs): how much of the error is drift
            row["posthoc_step_error_pct"] = 100 * (p["step_s"] - row["measured_step_s"]) / row["measured_step_s"]
            row["posthoc_exposed_error_pp"] = p["exposed_comm_pct"] - row["measured_exposed_comm_pct"]
    record.update(
        status="done",
        measured=meas,
        comparison=rows,
        drift_check=drift,
        goal_met=bool(rows) and all(r["step_pass"] and r["exposed_pass"] for r in rows),
        load_by_phase=sampler.by_phase(),
        date=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        wall_s=round(time.time() - started, 1),
        machine=bl.describe_machine(load_start),
    )
    figure(rows, record["predictions"], meas, out_png, record["load_by_phase"])
    write(record, out_json)
    print()
    print(f"{'cap':>9} {'pred step':>10} {'meas step':>10} {'err':>7} {'pred exp':>9} {'meas exp':>9} {'diff':>7}")
    for r in rows:
        if r.get("measured_step_s") is None:
            print(f"{r['cap']:>9}  no measurement")
            continue
        print(
            f"{r['cap']:>9} {1e3 * r[f'predicted_step_s[{HEADLINE}]']:8.1f}ms {1e3 * r['measured_step_s']:8.1f}ms "
            f"{r[f'step_error_pct[{HEADLINE}]']:+6.1f}% {r[f'predicted_exposed_comm_pct[{HEADLINE}]']:8.1f}% "
            f"{r['measured_exposed_comm_pct']:8.1f}% {r[f'exposed_error_pp[{HEADLINE}]']:+6.1f}pp "
            f"{'PASS' if r['step_pass'] and r['exposed_pass'] else 'MISS'}  by term (ms): "
            + ", ".join(f"{k} {v:+.1f}" for k, v in r["error_by_term_ms"].items())
        )
    print(
        f"goal met: {record['goal_met']}{' (quick: not a measurement)' if args.quick else ''}; wall "
        f"{record['wall_s']:.0f} s; {out_json.relative_to(REPO)}, {out_png.relative_to(REPO)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
