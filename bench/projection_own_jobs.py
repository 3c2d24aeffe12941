"""Benchmark: `scaling project` from a user's own 1-worker run against its 2-worker runs on the minicluster (root).

    .venv/bin/python bench/projection_own_jobs.py            # both jobs, about 40 minutes
    .venv/bin/python bench/projection_own_jobs.py --jobs fsdp
    .venv/bin/python bench/projection_own_jobs.py --quick    # about 7 minutes: the pieces run, no measurement

The projection is what a user gets from `scaling project RUN_DIR` (scaling/projection/from_run.py
`project_run`), here on jobs nobody on the project wrote the model of: the own-job example
(examples/own_job/train.py: a small ViT under Ray Train's `prepare_model`, DDP, which it wraps at one
worker too, so its 1-worker run holds DDP's own work per step) and an FSDP2 job on a Hugging Face
GPT-2 (examples/own_job/gpt2_fsdp.py: each block `fully_shard`ed, then the root; the job shards at
one worker too, so its 1-worker run holds FSDP2's own work per step). Each is measured with
`attach`, as its file shows, and driven by the lab (`scaling run CONFIG`).

The script brings up a minicluster (network namespaces "pown", 10.218.0.0/24) of a head that runs no
workers and 2 worker nodes, each of one CPU and held to its own core (`minicluster.up` `pin_cpus`,
`head_cpus=0`: the head's processes and each run's Ray Train controller spread over both cores,
as they would sit on a machine of their own; two 1-worker runs at once put two controllers where a
2-worker run puts one), and, in this order:
1. per job, its 1-worker runs, links uncapped (they do not communicate): one alone (`solo`), then
   two at once, one per node (`concurrent`): each computes beside the other and the head's work,
   as the ranks of a 2-worker run do on this machine's 2 cores, and together they measure the wait
   for the slower one (scaling/projection/compute.py `compute_from_concurrent_runs`);
2. per cap, `--rounds` rounds (4 by default); in each, first the links as they are now: each node's
   egress capped with a tc token bucket of 4 KB (below: why not the testbed's 64 KB), gloo
   all-reduces of 16 KB .. 2 MB and of each job's own buffers (its DDP bucket, each FSDP2 unit) timed
   between the nodes and the ring's alpha and beta fitted over their means (`fit_links`; a step's time
   is a mean, so it holds each collective's mean, tail included), all-reduces and all-gathers apart
   (nccl-tests, too, report each collective's bus bandwidth), and each of the jobs' buffers
   all-reduced and all-gathered right after compute, as a synchronous step issues them (the probe's
   `time_interleaved`): the FSDP2 job's links are fitted over its own sizes so timed
   (`job_link_fits`). The links are probed in every round, as the compute is: a capped link's mean
   drifts as the machine does (the DDP bucket's all-reduce averaged 13.5 ms in one run's 2-worker runs
   where a probe 20-40 minutes before them gave 14.2 ms), and a median over rounds that share one probe
   cannot remove that probe's error;
3. then per job, `project_run` on the job's run directories, onto the cluster of the round's fitted
   alpha and beta (`cluster_from_alpha_beta`, one worker per node) with `same_device` (the minicluster
   is the machine the runs ran on: their compute is taken as measured). In the first round, the
   unpaced pair's and the solo run's projections. A rank of a 2-worker run idles through every
   collective, and on this machine a step's compute resumes slower after an idle (a 25 ms idle per
   step made the own-job step 21% slower): so the concurrent pair runs again, paced
   (`instrument.pace_idle_s`: idle at each point the job would wait on a collective, as long as the
   unpaced pair's projection says one takes there). FSDP2 with `fsdp_process_group="gloo"` (every
   collective holds the training thread). The units, their sizes and their resharding come from the
   run (compute_profile.json `sharded_units`), not from a table;
4. each round, per job: a paced pair, its projection written to the results file, then one 2-worker
   run: prediction and measurement alternate, as an A/B comparison on a shared machine must (the
   2-worker step of the same job and cap moved 5% within minutes, and three runs of a script that
   made every prediction first, then every 2-worker run, met the goal at 4, 3 and 0 of its 4
   points). The headline prediction is the median over rounds of each figure (`median_prediction`),
   the measurement the median of the 2-worker runs' step_s and exposed_comm_pct (their summaries),
   and each round's own error is kept beside them; the median run's step is cut into compute,
   transfers and the wait for the slower rank (steps.parquet, collectives.parquet);
5. takes the cluster down (always, on SIGTERM and Ctrl-C too: minicluster.running), writes
   bench/results/projection_own_jobs.json and .png (`--quick`: bench/results/quick/).

Why the script caps the links itself: the testbed's token bucket holds 64 KB or 4 ms of traffic
(minicluster.tbf_burst_bytes), and every FSDP collective here sends 41-200 KB per rank, each after
some compute that refills the bucket: a third to a half of each would leave at the veth's speed
and the cap would not be the link the fit measures (at 50 Mbit/s a 200 KB all-gather took 16.5 ms
back to back and 10 ms after a 20 ms pause; with a 3 KB bucket 18-20 ms both ways). A 4 KB bucket,
under a tenth of the smallest collective, leaves the cap a link of that rate. The runs are plain
`scaling run`s, so no run re-caps the links with the testbed's bucket.

Goal: predicted step time within 5% of measured and exposed
communication within 3 percentage points, at every cap, for both jobs. The machine is shared
(2 cores): the load average is sampled every 2 s and reported per phase.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import benchlib as bl  # noqa: E402
from benchjobs import LoadSampler, exec_command, log, run_figures, wait_or_stop, write  # noqa: E402
from benchjobs import decompose as decompose_ddp  # noqa: E402

from scaling.projection import fit_alpha_beta  # noqa: E402
from scaling.projection.from_run import project_run  # noqa: E402
from scaling.projection.project import cluster_from_alpha_beta  # noqa: E402
from scaling.results import RunDir  # noqa: E402
from scaling.testbed import minicluster as mc  # noqa: E402

RESULT = "projection_own_jobs"
NAME = "pown"
SUBNET = "10.218.0.0/24"
N = 2
CAPS = ("100mbit", "200mbit")
KINDS = ("all_gather", "re_gather", "reduce_scatter")  # FSDP2's collectives, as the decomposition names them
LINK_BURST_BYTES = 4096  # the token bucket of every cap (module docstring: why not the testbed's)
PROBE_PORT = 29516  # the lab's other minicluster benches take 29512 and 29514
FIT_SIZES = (16_384, 32_768, 65_536, 131_072, 262_144, 524_288, 1_048_576, 2_097_152)
PROBE_ITERS = 30  # enough for a mean with its tail: the fits are over means (fit_caps)
INTERLEAVED, INTERLEAVED_ITERS = {"compute_s": 0.005, "segments": 8}, 8  # a step's pattern (probe's time_interleaved)
RUN_TIMEOUT_S = 480  # a run (or the pair) that has not finished by then is stopped (Ray can hang fetching an object)
GOAL_STEP_REL = 0.05
GOAL_EXPOSED_PP = 3.0
HEADLINE = "paced"
MODELS = {
    HEADLINE: "headline: the median over rounds of `project_run` on a pair of concurrent 1-worker runs paced for "
    "the cap (instrument.pace_idle_s: idle at each collective point for the projected collective's mean time), each "
    "pair run just before its round's 2-worker run: their compute as it runs between waits, and the wait for the "
    "slower one they measure",
    "unpaced": "`project_run` on two concurrent 1-worker runs that never idle",
    "solo": "`project_run` on the 1-worker run alone (the wait from its steps' spread)",
}
# per job: its lab config, the projection's backend and settings, epochs of the 1-worker runs (each pair
# long enough to overlap despite Ray's start-up skew of up to 16 s; a paced epoch is longer) and of the
# 2-worker runs
JOBS = {
    "ddp": {
        "config": "examples/own_job/sweep.yaml",
        "what": "examples/own_job/train.py: a ViT of 70k parameters, DDP by Ray Train's prepare_model, batch 32",
        "backend": "ddp",
        "settings": {},
        "solo_epochs": 4,
        "pair_epochs": 36,
        "paced_epochs": 20,
        "epochs": 3,
    },
    "fsdp": {
        "config": "examples/own_job/gpt2_fsdp.yaml",
        "what": "examples/own_job/gpt2_fsdp.py: Hugging Face GPT-2 of 121k parameters, each block and the root "
        "fully_shard-ed, batch 32 x 64 tokens",
        "backend": "fsdp",
        "settings": {"fsdp_process_group": "gloo"},
        "solo_epochs": 3,
        "pair_epochs": 10,
        "paced_epochs": 6,
        "epochs": 3,
    },
}
PREDICTED = (
    "step_s",
    "step_s_lo",
    "step_s_hi",
    "exposed_comm_s",
    "exposed_comm_pct",
    "exposed_comm_pct_lo",
    "exposed_comm_pct_hi",
    "comm_overhead_pct",
    "straggler_s",
    "allreduce_s",
    "allgather_s",
    "regather_s",
    "reducescatter_s",
    "data_s",
    "forward_s",
    "backward_compute_s",
    "optimizer_s",
    "num_buckets",
    "grad_bytes",
)
MEASURED_FIELDS = (
    "step_s",
    "exposed_comm_s",
    "exposed_comm_pct",
    "comm_overhead_pct",
    "allreduce_s",
    "allgather_s",
    "regather_s",
    "reducescatter_s",
    "waiting_s",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "time_per_epoch_s",
)
# seconds per phase, for the printed estimate (this machine, 2 shared cores): a Ray run's start and
# finish, an epoch at 1 and 2 workers (with the A/B pairs and the evaluation), bringing the cluster up
# and down, one round's probe of a cap's links
START_S, EPOCH_1W_S, EPOCH_2W_S, UP_DOWN_S, FIT_S = 25, 3, 6, 90, 30


# ---------------------------------------------------------------------------- runs inside the cluster


def lab_run(config: str, workers: int, out: Path, epochs: int, log_path: Path, seed: int = 0) -> bool:
    """`scaling run CONFIG` inside the cluster; True when it finished with a summary."""
    process = exec_command(
        [
            "run",
            config,
            "--workers",
            str(workers),
            "--out",
            str(out),
            "--set",
            f"train.max_epochs={epochs}",
            "--set",
            f"train.seed={seed}",
        ],
        log_path,
        NAME,
    )
    return wait_or_stop(process, time.time() + RUN_TIMEOUT_S) == 0 and RunDir(out).has_summary


def one_worker_runs(
    config: str, dirs: list[Path], epochs: int, logs: Path, pace_s: float = 0.0, attempts: int = 2
) -> None:
    """1-worker runs of `config`, all started at once (Ray puts each on its own node: one CPU per
    node), paced by `pace_s` (instrument.pace_idle_s); all again, into fresh directories, if one
    fails or hangs."""
    pace = ["--set", f"instrument.pace_idle_s={pace_s:.6f}"] if pace_s else []
    for attempt in range(1, attempts + 1):
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        processes = [
            exec_command(
                ["run", config, "--workers", "1", "--out", str(d), "--set", f"train.max_epochs={epochs}", *pace],
                logs / f"{d.name}.attempt{attempt}.log",
                NAME,
            )
            for d in dirs
        ]
        deadline = time.time() + RUN_TIMEOUT_S
        codes = [wait_or_stop(p, deadline) for p in processes]
        failed = [d.name for d, c in zip(dirs, codes) if c != 0 or not RunDir(d).has_summary]
        if not failed:
            return
        log(f"1-worker run(s) {', '.join(failed)} failed or hung (attempt {attempt}); logs in {logs}")
    raise RuntimeError(f"1-worker runs {', '.join(failed)} failed {attempts} times (logs: {logs})")


def job_buffers(run: RunDir, backend: str) -> list[int]:
    """The bytes the job's collectives move per call, from its 1-worker run: DDP's one bucket (the
    jobs here hold under DDP's 1 MiB first bucket), or each FSDP2 unit's fp32 buffer."""
    profile = run.compute_profile()
    if backend == "fsdp":
        return sorted({4 * int(unit[1]) for unit in profile["sharded_units"]})
    return [4 * int(profile["parameters"])]


def two_worker_run(job: dict, run_dir: Path, logs: Path, seed: int) -> Path | None:
    """A 2-worker run of the job, once more if it fails or hangs; its directory, or None."""
    for attempt in (1, 2):
        shutil.rmtree(run_dir, ignore_errors=True)
        if lab_run(job["config"], N, run_dir, job["epochs"], logs / f"{run_dir.name}.attempt{attempt}.log", seed):
            return run_dir
        log(f"{run_dir.name} failed or hung (attempt {attempt}); log in {logs}")
    return None


# ---------------------------------------------------------------------------- the links and their fit


def _tc(namespace: str, *args: str) -> str:
    result = subprocess.run(["ip", "netns", "exec", namespace, "tc", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} in {namespace} failed: {result.stderr.strip()}")
    return result.stdout


def cap_links(cap: str | None, name: str = NAME) -> str:
    """Every node's egress of cluster `name` capped at `cap` with a LINK_BURST_BYTES token bucket (None:
    uncapped); returns a worker node's qdisc as tc shows it."""
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
    return _tc(cluster.nodes[1].namespace, "qdisc", "show", "dev", mc.NODE_IFACE).strip()


def fit_links(cap: str, buffers: list[int], round_index: int) -> dict:
    """The links under `cap` as they are now: all-reduces and all-gathers of 16 KB .. 2 MB and of the jobs'
    own buffers timed between the nodes (a probe of this round's own), the ring's alpha and beta fitted
    over their means, and each buffer's collectives timed right after compute."""
    sizes = sorted(set(FIT_SIZES) | set(buffers))
    qdisc = cap_links(cap, NAME)
    with mc.AllreduceProbe(NAME, N, port=PROBE_PORT, first_node=1) as probe:
        # a step's time is a mean, so it holds each collective's mean, tail included: over the capped
        # link the DDP job's 288 KB all-reduce averaged 1.4 ms above its median (60 timed), and 14% of
        # its 2-worker steps ran 5 ms or more long in backward, where the all-reduce is
        results = probe.measure(sizes, PROBE_ITERS)
        gathered = probe.measure(sizes, PROBE_ITERS, "all_gather")
        # each buffer's collectives timed as a synchronous step issues them, right after compute
        interleaved = {
            kind: probe.measure(buffers, INTERLEAVED_ITERS, kind, INTERLEAVED) for kind in ("all_reduce", "all_gather")
        }
    medians = {r["bytes"]: r["median_s"] for r in results}
    means = {r["bytes"]: r["mean_s"] for r in results}
    fit = fit_alpha_beta(sizes, [means[s] for s in sizes], N)
    gathers = {r["bytes"]: r["mean_s"] for r in gathered}
    # over every size, for the record: gloo's all-gather strays from one line (predict() fits the job's own sizes)
    gather_fit = fit_alpha_beta(sizes, [gathers[s] for s in sizes], N, collective="all_gather")
    line_rate = mc.rate_bits_per_s(cap) / 8
    log(
        f"{cap} round {round_index + 1}: alpha {fit.alpha_s * 1e6:.0f} us, bandwidth "
        f"{fit.bandwidth_bytes_per_s * 8 / 1e6:.1f} Mbit/s (rms {100 * fit.rms_relative_error:.1f}%); all-gather: "
        f"alpha {gather_fit.alpha_s * 1e6:.0f} us, bus bandwidth {gather_fit.bandwidth_bytes_per_s * 8 / 1e6:.1f} "
        f"Mbit/s (rms {100 * gather_fit.rms_relative_error:.1f}%)"
    )
    return {
        "cap": cap,
        "round": round_index,
        "probed_at": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "qdisc": qdisc,
        "line_rate_bytes_per_s": line_rate,
        "sizes_bytes": sizes,
        "median_s": [medians[s] for s in sizes],
        "mean_s": [means[s] for s in sizes],
        "alpha_s": fit.alpha_s,
        "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
        "fit_rms_relative_error": fit.rms_relative_error,
        "bandwidth_over_line_rate": fit.bandwidth_bytes_per_s / line_rate,
        "allgather_median_s": [r["median_s"] for r in gathered],
        "allgather_mean_s": [gathers[s] for s in sizes],
        "allgather_alpha_s": gather_fit.alpha_s,
        "allgather_bandwidth_bytes_per_s": gather_fit.bandwidth_bytes_per_s,
        "allgather_fit_rms_relative_error": gather_fit.rms_relative_error,
        "interleaved": interleaved,
        "buffers": {str(b): {"allreduce_fitted_s": fit.predict_s(b), "allreduce_probe_s": means[b]} for b in buffers},
    }


# ---------------------------------------------------------------------------- predictions


def pace_s(predicted: dict) -> float:
    """How long a paced 1-worker run idles at each collective point: the mean transfer of the
    step's collectives in the projection (a DDP job here: its one bucket's all-reduce)."""
    collectives = max(1.0, predicted["num_buckets"])
    transfers = predicted["exposed_comm_s"] - predicted["straggler_s"]
    return max(0.0005, transfers / collectives)


def job_link_fits(job: dict, fit: dict) -> dict | None:
    """An FSDP2 job on gloo: its all-reduces (gloo's reduce-scatter) and all-gathers fitted apart, each
    over the job's own buffer sizes as timed right after compute (`time_interleaved`, their means),
    the way its synchronous collectives are issued: in that pattern a 200 KB all-gather took about 2
    ms more than back to back, and gloo's all-gather follows no one line from 16 KB to 2 MB (a 200 KB
    and a 260 KB gather took the same time). None for a DDP job: its bucket goes to gloo's own thread
    during backward, and the all-reduce line over every size is the one it meets."""
    sizes = job["buffers"]
    if job["backend"] != "fsdp" or len(sizes) < 2:
        return None
    fits = {}
    for kind in ("all_reduce", "all_gather"):
        timed = {r["bytes"]: r["collective_interleaved_mean_s"] for r in fit["interleaved"][kind]}
        fits[kind] = fit_alpha_beta(sizes, [timed[s] for s in sizes], N, collective=kind)
    return fits


def predict(job: dict, fit: dict, runs) -> dict:
    links = job_link_fits(job, fit)
    if links:
        reduce, gather = links["all_reduce"], links["all_gather"]
        cluster = cluster_from_alpha_beta(
            reduce.alpha_s,
            reduce.bandwidth_bytes_per_s,
            gpus_per_node=1,
            allgather_alpha_s=gather.alpha_s,
            allgather_bytes_per_s=gather.bandwidth_bytes_per_s,
        )
    else:
        cluster = cluster_from_alpha_beta(fit["alpha_s"], fit["bandwidth_bytes_per_s"], gpus_per_node=1)
    df = project_run(runs, cluster, [1, N], job["backend"], same_device=True, **job["settings"])
    row = df[df["num_workers"] == N].iloc[0]
    out = {k: float(row[k]) for k in PREDICTED if k in row.index}
    if links:
        out["link_fits"] = {
            kind: {
                "sizes_bytes": job["buffers"],
                "alpha_s": f.alpha_s,
                "bandwidth_bytes_per_s": f.bandwidth_bytes_per_s,
            }
            for kind, f in links.items()
        }
    out["parameters"] = [list(p) for p in df.attrs["parameters"]]
    out["notes"] = list(df.attrs.get("notes", []))
    return out


def median_prediction(rounds: list[dict]) -> dict:
    """The median over the rounds' projections, figure by figure, as the measurement is the median of
    the rounds' 2-worker runs (a round's paced pair moved by 3 ms from one run of the script to the
    next, as much as the FSDP2 job's 5% goal). The parameters, notes and
    `predicted_at` are the first round's (each round's own are under the entry's `rounds`)."""
    import statistics

    median = dict(rounds[0])
    for key in PREDICTED:
        values = [p[key] for p in rounds if isinstance(p.get(key), (int, float))]
        if values:
            median[key] = statistics.median(values)
    return median


# ---------------------------------------------------------------------------- measurements


def measured(job: dict, run_dirs: dict[int, Path]) -> dict:
    """The median over the runs (by round) of each figure, each run's own step and exposed
    communication, and the decomposition of the run whose step time is the median."""
    import statistics

    summaries = {d: RunDir(d).summary() for d in run_dirs.values()}
    row = {}
    for key in MEASURED_FIELDS:
        values = [s[key] for s in summaries.values() if isinstance(s.get(key), (int, float))]
        row[key] = statistics.median(values) if values else None
    middle = min(summaries, key=lambda d: abs(summaries[d]["step_s"] - row["step_s"]))
    decompose = decompose_fsdp if job["backend"] == "fsdp" else decompose_ddp
    row.update(
        repeats=len(run_dirs),
        run_dir=str(middle),
        diagnosis=decompose(middle),
        per_round={
            str(r): {"step_s": summaries[d]["step_s"], "exposed_comm_pct": summaries[d]["exposed_comm_pct"]}
            for r, d in run_dirs.items()
        },
    )
    return row


def decompose_fsdp(run_dir: Path) -> dict:
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


def error_by_term_ms(job: dict, p: dict, d: dict) -> dict:
    """Where the step's error sits (predicted - measured, ms per step), by term."""
    terms = {"compute": 1e3 * (p["step_s"] - p["exposed_comm_s"] - d["compute_s"])}
    if job["backend"] == "fsdp":
        columns = {"all_gather": "allgather_s", "re_gather": "regather_s", "reduce_scatter": "reducescatter_s"}
        for kind, column in columns.items():
            terms[kind] = 1e3 * (p[column] - d["by_kind"].get(kind, {}).get("transfer_s", 0.0))
        terms["straggler"] = 1e3 * (p["straggler_s"] - d["wait_s"])
    else:
        terms["allreduce"] = 1e3 * (p["exposed_comm_s"] - p["straggler_s"] - d["allreduce_in_run_s"])
        terms["straggler"] = 1e3 * (p["straggler_s"] - d["straggler_wait_s"])
    return terms


def compare(job: dict, preds: dict, meas: dict) -> list[dict]:
    rows = []
    for cap, entry in preds.items():
        row = {"cap": cap}
        by_model = {model: entry[model] for model in MODELS if model in entry}
        for model, p in by_model.items():
            row[f"predicted_step_s[{model}]"] = p["step_s"]
            row[f"predicted_exposed_comm_pct[{model}]"] = p["exposed_comm_pct"]
        head = by_model[HEADLINE]
        row.update(
            predicted_step_interval_s=[head.get("step_s_lo"), head.get("step_s_hi")],
            predicted_exposed_interval_pct=[head.get("exposed_comm_pct_lo"), head.get("exposed_comm_pct_hi")],
        )
        m = meas.get(cap)
        if not (m and m.get("step_s") and m.get("exposed_comm_pct") is not None):
            row.update(measured_step_s=None, measured_exposed_comm_pct=None, step_pass=False, exposed_pass=False)
            rows.append(row)
            continue
        row.update(measured_step_s=m["step_s"], measured_exposed_comm_pct=m["exposed_comm_pct"])
        for model, p in by_model.items():
            row[f"step_error_pct[{model}]"] = 100 * (p["step_s"] - m["step_s"]) / m["step_s"]
            row[f"exposed_error_pp[{model}]"] = p["exposed_comm_pct"] - m["exposed_comm_pct"]
        # each round's prediction against its own 2-worker run: the spread the headline's median sits in
        by_round = [
            (entry["rounds"][int(r)], got) for r, got in m["per_round"].items() if int(r) < len(entry["rounds"])
        ]
        row["step_error_pct_by_round"] = [100 * (p["step_s"] - got["step_s"]) / got["step_s"] for p, got in by_round]
        row["exposed_error_pp_by_round"] = [p["exposed_comm_pct"] - got["exposed_comm_pct"] for p, got in by_round]
        row["step_pass"] = abs(row[f"step_error_pct[{HEADLINE}]"]) <= 100 * GOAL_STEP_REL
        row["exposed_pass"] = abs(row[f"exposed_error_pp[{HEADLINE}]"]) <= GOAL_EXPOSED_PP
        row["error_by_term_ms"] = error_by_term_ms(job, head, m["diagnosis"])
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------- figure


def figure(record: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    jobs = [j for j in record["jobs"] if record["comparison"].get(j)]
    fig = Figure(figsize=(11, 4.0 * len(jobs)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(jobs), 2, squeeze=False)
    for (ax_step, ax_exp), name in zip(axes, jobs):
        rows = record["comparison"][name]
        x = list(range(len(rows)))
        for model, style in (
            (HEADLINE, dict(color="C0", lw=2, marker="o", label="predicted from the paced concurrent 1-worker runs")),
            ("unpaced", dict(color="C0", lw=1, ls="--", marker=".", label="... from unpaced ones")),
            ("solo", dict(color="C2", lw=1, ls=":", marker=".", label="predicted from the solo 1-worker run")),
        ):
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
        ax_step.plot(
            [xi for xi, _ in have], [1e3 * r["measured_step_s"] for _, r in have], "ks", ms=7, label="measured"
        )
        ax_exp.plot(
            [xi for xi, _ in have], [r["measured_exposed_comm_pct"] for _, r in have], "ks", ms=7, label="measured"
        )
        for ax, title, ylabel in (
            (ax_step, "step time", "ms per step"),
            (ax_exp, "exposed communication", "% of step"),
        ):
            ax.set_xticks(x, [r["cap"].replace("mbit", " Mbit/s") for r in rows])
            ax.set_xlabel("link cap per node (tc tbf, 4 KB bucket)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{name}: {title}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(
        "the user's own jobs, 2 workers on 2 minicluster nodes:\n`scaling project` from 1-worker runs "
        "(median over rounds, each written before its round's 2-worker run) vs measured (median of the rounds)",
        fontsize=10,
    )
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------- main


def expected_minutes(jobs: list[str], caps: int, rounds: int) -> float:
    seconds = UP_DOWN_S + FIT_S * caps * rounds
    for name in jobs:
        job = JOBS[name]
        seconds += 2 * START_S + EPOCH_1W_S * (job["solo_epochs"] + job["pair_epochs"])
        # a paced epoch idles about as long as a 2-worker epoch communicates
        seconds += caps * rounds * (2 * START_S + EPOCH_2W_S * (job["paced_epochs"] + job["epochs"]))
    return seconds / 60


def main() -> int:
    bench = bl.Benchmark(
        RESULT,
        __doc__,
        quick="a smoke check of every piece (the first cap, 1 short run, short baselines); not a measurement",
    )
    bench.parser.add_argument(
        "--jobs", default="ddp,fsdp", help="which jobs, comma-separated: ddp, fsdp (default both)"
    )
    bench.parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="rounds per job and cap, each a paced pair of 1-worker runs (a prediction) then a 2-worker run; "
        "the medians are compared (default 4)",
    )
    bench.parser.add_argument(
        "--work", type=Path, default=None, help="where the runs go (default results/projection-own-jobs/<time>)"
    )
    args = bench.parse()
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown or not jobs:
        bench.parser.error(f"--jobs: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(JOBS)}")
    if args.rounds < 1:
        bench.parser.error("--rounds must be at least 1")
    caps = list(CAPS[:1] if args.quick else CAPS)
    rounds = 1 if args.quick else args.rounds
    if args.quick:
        for name in jobs:
            JOBS[name].update(solo_epochs=1, pair_epochs=8, paced_epochs=4, epochs=1)
    out_json = bl.results_dir(args.quick) / f"{RESULT}.json"
    out_png = out_json.with_suffix(".png")
    work = (args.work or REPO / "results" / "projection-own-jobs" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": RESULT,
        "what": bl.what(__doc__),
        "command": bl.command_line(),
        "quick": args.quick,
        "jobs": {name: {k: v for k, v in JOBS[name].items()} for name in jobs},
        "caps": caps,
        "link_burst_bytes": LINK_BURST_BYTES,
        "rounds_per_cap": rounds,
        "goal": {"step_time_relative": GOAL_STEP_REL, "exposed_comm_pp": GOAL_EXPOSED_PP, "judged_on": HEADLINE},
        "models": MODELS,
        "work_dir": str(work),
        "status": "started",
    }
    log(f"expected duration: about {expected_minutes(jobs, len(caps), rounds):.0f} minutes")
    sampler = LoadSampler().start()
    baselines, meas = {}, {name: {} for name in jobs}
    log(f"minicluster {NAME!r} up (a head and 2 nodes, each on its own CPU, {SUBNET}); runs under {work}")
    sampler.phase = "up"
    try:
        with mc.running(N + 1, None, 1, NAME, SUBNET, log=lambda m: None, pin_cpus=True, head_cpus=0) as cluster:
            record["node_cpus"] = cluster.node_cpus
            cap_links(None, NAME)  # 1-worker runs do not communicate; no cap
            for name in jobs:
                job = JOBS[name]
                solo, pair = work / f"{name}-w1-solo", [work / f"{name}-w1-concurrent-{s}" for s in "ab"]
                sampler.phase = "baseline_solo"
                log(f"{name}: 1-worker run alone")
                one_worker_runs(job["config"], [solo], job["solo_epochs"], logs)
                sampler.phase = "baseline_concurrent"
                log(f"{name}: two 1-worker runs at once, one per node")
                one_worker_runs(job["config"], pair, job["pair_epochs"], logs)
                baselines[name] = {"solo": solo, "pair": pair}
            record["baseline"] = {
                name: {"solo": run_figures(b["solo"]), "concurrent": [run_figures(d) for d in b["pair"]]}
                for name, b in baselines.items()
            }
            for name in jobs:
                JOBS[name]["buffers"] = job_buffers(RunDir(baselines[name]["solo"]), JOBS[name]["backend"])
                record["jobs"][name]["buffers"] = JOBS[name]["buffers"]
            buffers = sorted({b for name in jobs for b in JOBS[name]["buffers"]})
            fits = {cap: [] for cap in caps}
            predictions, paces = {name: {} for name in jobs}, {name: {} for name in jobs}
            two_worker = {name: {cap: {} for cap in caps} for name in jobs}
            record.update(fits=fits, paced_baselines=paces, predictions=predictions, status="rounds")
            for cap in caps:
                for r in range(rounds):
                    # every input of a round's prediction is measured in that round, the links too (their
                    # means drift by several percent within half an hour, as the compute does), so the
                    # median over rounds is over independent predictions
                    sampler.phase = "fits"
                    fit = fit_links(cap, buffers, r)
                    fits[cap].append(fit)
                    for name in jobs:
                        job = JOBS[name]
                        if r == 0:
                            unpaced = predict(job, fit, [RunDir(d) for d in baselines[name]["pair"]])
                            # the pair again, idling at each collective point as long as the projection says
                            # a collective there takes (its mean): their compute as it runs between waits
                            paces[name][cap] = {"pace_s": pace_s(unpaced), "runs": []}
                            predictions[name][cap] = {
                                "unpaced": unpaced,
                                "solo": predict(job, fit, RunDir(baselines[name]["solo"])),
                                "rounds": [],
                            }
                        pace, entry = paces[name][cap]["pace_s"], predictions[name][cap]
                        sampler.phase = "baseline_paced"
                        pair = [work / f"{name}-w1-paced-{cap}-{r}{s}" for s in "ab"]
                        log(f"{name} {cap} round {r + 1}/{rounds}: a pair paced by {1e3 * pace:.1f} ms")
                        one_worker_runs(job["config"], pair, job["paced_epochs"], logs, pace_s=pace)
                        paces[name][cap]["runs"] += [run_figures(d) for d in pair]
                        prediction = predict(job, fit, [RunDir(d) for d in pair])
                        prediction["predicted_at"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
                        entry["rounds"].append(prediction)
                        write(record, out_json)  # the round's prediction is on disk before its 2-worker run
                        sampler.phase = "runs"
                        run_dir = two_worker_run(job, work / f"{name}-w2-{cap}-r{r}", logs, seed=r)
                        if run_dir:
                            two_worker[name][cap][r] = run_dir
                            got = RunDir(run_dir).summary()
                            log(
                                f"{name} {cap} round {r + 1}: predicted {1e3 * prediction['step_s']:.1f} ms, "
                                f"{prediction['exposed_comm_pct']:.1f}% exposed; measured {1e3 * got['step_s']:.1f} "
                                f"ms, {got['exposed_comm_pct']:.1f}%"
                            )
            for name in jobs:
                for cap in caps:
                    entry = predictions[name][cap]
                    entry[HEADLINE] = median_prediction(entry["rounds"])
                    if two_worker[name][cap]:
                        meas[name][cap] = measured(JOBS[name], two_worker[name][cap])
            sampler.phase = "down"
    finally:
        sampler.stop()
    comparison = {name: compare(JOBS[name], record["predictions"][name], meas[name]) for name in jobs}
    record.update(
        status="done",
        measured=meas,
        comparison=comparison,
        goal_met=all(r["step_pass"] and r["exposed_pass"] for rows in comparison.values() for r in rows),
        load_by_phase=sampler.by_phase(),
        date=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        wall_s=round(time.time() - bench.started, 1),
        machine=bl.describe_machine(bench.load_start),
    )
    figure(record, out_png)
    write(record, out_json)
    print()
    print(
        f"{'job':>5} {'cap':>9} {'pred step':>10} {'meas step':>10} {'err':>7} {'pred exp':>9} "
        f"{'meas exp':>9} {'diff':>7}"
    )
    for name, rows in comparison.items():
        for r in rows:
            if r.get("measured_step_s") is None:
                print(f"{name:>5} {r['cap']:>9}  no measurement")
                continue
            print(
                f"{name:>5} {r['cap']:>9} {1e3 * r[f'predicted_step_s[{HEADLINE}]']:8.1f}ms "
                f"{1e3 * r['measured_step_s']:8.1f}ms {r[f'step_error_pct[{HEADLINE}]']:+6.1f}% "
                f"{r[f'predicted_exposed_comm_pct[{HEADLINE}]']:8.1f}% {r['measured_exposed_comm_pct']:8.1f}% "
                f"{r[f'exposed_error_pp[{HEADLINE}]']:+6.1f}pp "
                f"{'PASS' if r['step_pass'] and r['exposed_pass'] else 'MISS'}"
                "  by term (ms): " + ", ".join(f"{k} {v:+.1f}" for k, v in r["error_by_term_ms"].items())
            )
    print(
        f"goal met: {record['goal_met']}{' (quick: not a measurement)' if args.quick else ''}; wall "
        f"{record['wall_s']:.0f} s; {out_json.relative_to(REPO)}, {out_png.relative_to(REPO)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
