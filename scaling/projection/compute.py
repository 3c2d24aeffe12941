"""Per-step compute time of one worker (data, forward, backward, optimizer), from a run's
records or from a published per-device throughput. Pure Python.

A run is given as its records' reader, `scaling.results.RunDir` (its `summary()`, `epochs()`,
`steps(columns)`, `buckets()` and `config`): the caller opens the run directory (the command
line, the report), the projection only reads what the reader hands it.

From a run (`compute_from_run`): the run's summary.json means (docs/results.md). At one worker
`backward_s` is pure compute; at more, backward compute = backward_s - exposed_comm_s (the
lab's own split; overlapped communication that slowed backward stays in it, so a projection
from a multi-worker run is a little pessimistic). A different per-GPU batch scales data,
forward and backward by batch / run batch (time per sample constant); the optimizer step does
not depend on the batch and is kept.

From a device (`compute_from_device`): one GPU's published training throughput T (samples/s,
scaling/devices.yaml) gives the step b / T at per-GPU batch b, assumed to hold at any batch (it was
measured at the table's `batch`; a smaller batch usually runs a little slower per sample, so
the projected compute is optimistic there). It is split as:
- data: 0 (the published numbers load with DALI, overlapped with compute);
- optimizer: SGD with momentum is memory-bound: 5 passes over 4-byte parameters (read weights,
  gradients, momentum; write weights, momentum -- SGD_MOMENTUM_PASSES in
  scaling/instrument/flops.py) at the device's memory bandwidth: 5 x 4 x P / bandwidth
  (ResNet-50 on a V100: 0.57 ms);
- forward : backward in the ratio of their FLOPs in the model's layer table (ResNet-50:
  8.18 : 16.12 GFLOP per sample, about 1 : 2 -- backward computes the gradients w.r.t. inputs
  and weights, twice the forward's work, less the first layer's input gradient).

From a model FLOPs utilisation (`compute_from_mfu`, transformers): a training step of b
sequences of T tokens does b T x `train_flops_per_token` model FLOPs (the layer table's count,
6N + 12 L H Q T by torchtitan's formula), done at MFU x the device's dense peak
(scaling/devices.yaml): compute = b T x FLOPs per token / (MFU x peak). MFU is a measured
end-to-end figure (its step includes the exposed communication and the optimizer), so taking it
as compute alone is a little pessimistic. Forward and backward split it in the ratio of their
hardware FLOPs: backward does 2x forward plus what activation checkpointing recomputes (the
table's `recompute_flops`). The optimizer is AdamW's step, memory-bound: 28 bytes per parameter
at the device's memory bandwidth (an FSDP projection divides it over the shards). The default MFU per device is a
published one (`TRANSFORMER_MFU`); where none is, `--mfu` is required.

From concurrent runs (`compute_from_concurrent_runs`): K one-worker runs started together, one
where each rank of the synchronous run will be (e.g. one per node of a minicluster), so that
every worker computes under the contention the K-rank run will see (shared cores, memory
bandwidth, the node's other processes). Only the steps of epochs that ran while every run was
training count (the runs' epoch records give each epoch's wall-clock interval). Each phase is
the mean over runs of the run's steady-state mean (the lab's step_s is a mean over ranks).
A synchronous step waits for its slowest rank at the all-reduce, so the runs also give

    straggler_s = E[max over ranks of (data + forward + backward)] - mean over ranks of it,

the expectation taken over one steady-state step drawn independently from each run (exact
over all pairs for K = 2, 20,000 seeded draws otherwise). It holds a persistent difference
between the workers (e.g. a node running more daemons) and per-step jitter alike. The lab
counts that wait as communication (a fast rank's bucket all-reduce starts at its hand-over
and ends with the slow rank's), so the projection adds it to the exposed communication of
every multi-worker row; it is measured at K ranks and applied as-is at other counts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from scaling.devices import load_devices
from scaling.errors import UsageError
from scaling.projection.cluster import Cluster
from scaling.projection.layers import BYTES_PER_GRAD_ELEMENT, COMPRESSION_BYTES
from scaling.schema import PRECISIONS

if TYPE_CHECKING:  # the stage's input type; spec.py imports this module
    from scaling.projection.spec import Resolved

ADAMW_BYTES_PER_PARAMETER = 28  # read weight, gradient, two moments; write weight and moments: 7 x fp32
# Published model FLOPs utilisation of a transformer's training step, per device (bf16 autocast / FSDP
# mixed precision); the projection's default compute rate for a transformer on that device.
TRANSFORMER_MFU = {
    "H100 SXM": {
        "mfu": 0.33,
        "precision": "bf16",
        "source": "torchtitan benchmarks/llama3_h100_202412_torchtitan.md: Llama 3.1 8B, FSDP, bf16, selective "
        "activation checkpointing, no torch.compile, 8 and 128 H100s: 33% MFU of the SXM's dense bf16 "
        "peak (39% with torch.compile)",
    },
}
SGD_MOMENTUM_PASSES = 5  # as scaling/instrument/flops.py: read weights, gradients, momentum; write weights, momentum
RUN_FIELDS = ("data_s", "forward_s", "backward_s", "optimizer_s", "per_worker_batch", "num_workers", "model")
TRANSFORMER_BATCH = 2  # sequences per GPU by default: torchtitan's local batch for Llama 3.1 8B
PRECISION_ALIASES = {"amp": "fp16", "mixed": "fp16", "tf32": "fp32"}


@dataclass(frozen=True)
class StepCompute:
    """One worker's step without communication, at `per_worker_batch` samples."""

    data_s: float
    forward_s: float
    backward_s: float  # backward compute only
    optimizer_s: float
    per_worker_batch: int
    precision: str
    source: str  # one line: where these numbers come from
    device: str | None = None
    samples_per_epoch: int | None = None  # from a run's epochs, else None
    measured_ready_fractions: tuple[float, ...] | None = None  # per bucket, of backward compute
    measured_bucket_bytes: tuple[int, ...] | None = None
    measured_num_buckets: float | None = None  # median num_buckets of a run's steps (multi-worker runs)
    epochs_to_target: float | None = None
    global_batch: int | None = None
    bucket_cap_mb: float | None = None  # a run's instrument.ddp_bucket_cap_mb (given explicitly to DDP)
    grad_compression: str | None = None  # a run's instrument.grad_compression
    straggler_s: float = 0.0  # wait for the slowest rank per synchronous step (concurrent runs; 0 otherwise)
    straggler_ranks: int | None = None  # how many concurrent runs measured straggler_s
    # of optimizer_s, what does not shrink when each GPU steps only its shard (FSDP): the per-tensor
    # launches and Python of a step that is not memory-bound (a small model's); 0: all of it shrinks
    optimizer_unsharded_s: float = 0.0

    @property
    def step_s(self) -> float:
        return self.data_s + self.forward_s + self.backward_s + self.optimizer_s

    def scaled(self, factor: float) -> StepCompute:
        """Every phase of the step at `factor` x its time (one end of an interval)."""
        return replace(
            self,
            data_s=self.data_s * factor,
            forward_s=self.forward_s * factor,
            backward_s=self.backward_s * factor,
            optimizer_s=self.optimizer_s * factor,
        )

    def at_batch(self, per_worker_batch: int | None) -> "StepCompute":
        """The same worker at another batch: data, forward, backward scale with the batch."""
        if per_worker_batch is None or per_worker_batch == self.per_worker_batch:
            return self
        if not (isinstance(per_worker_batch, int) and per_worker_batch > 0):
            raise UsageError(f"per-GPU batch must be a positive integer, got {per_worker_batch!r}")
        f = per_worker_batch / self.per_worker_batch
        return replace(
            self,
            data_s=self.data_s * f,
            forward_s=self.forward_s * f,
            backward_s=self.backward_s * f,
            straggler_s=self.straggler_s * f,
            per_worker_batch=per_worker_batch,
            source=self.source + f"; scaled from batch {self.per_worker_batch} to {per_worker_batch} per GPU",
        )


def normalize_precision(precision: str) -> str:
    """The lab's precision name (fp32 | fp16 | bf16); 'amp' is fp16 autocast, as in NVIDIA's tables."""
    p = str(precision).lower()
    p = PRECISION_ALIASES.get(p, p)
    if p not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}; valid: fp32, amp (= fp16), fp16, bf16")
    return p


def device_throughput(device: str, model: str, precision: str) -> dict | None:
    """{samples_per_s, batch, source} for one GPU of `device`, or None where nothing is published."""
    spec = load_devices().get(device) or {}
    return ((spec.get("throughput") or {}).get(model) or {}).get(normalize_precision(precision))


def forward_share(table: dict) -> float:
    """Forward FLOPs / (forward + backward FLOPs): the share of compute taken by forward (~1/3)."""
    fwd, bwd = table["forward_flops_per_sample"], table["backward_flops_per_sample"]
    return fwd / (fwd + bwd)


def optimizer_estimate_s(parameters: int, memory_bandwidth_bytes_per_s: float) -> float:
    """SGD with momentum, memory-bound: 5 passes x 4 bytes x parameters / memory bandwidth."""
    return SGD_MOMENTUM_PASSES * BYTES_PER_GRAD_ELEMENT * parameters / memory_bandwidth_bytes_per_s


def compute_from_device(
    device: str | None, table: dict, precision: str, per_worker_batch: int, samples_per_s: float | None = None
) -> StepCompute:
    """One GPU's step from the device table (or from `samples_per_s` given directly); `table`: the model's
    layer table (layers.load_layer_table)."""
    precision = normalize_precision(precision)
    model = table["model"]
    if not (isinstance(per_worker_batch, int) and per_worker_batch > 0):
        raise UsageError(f"per-GPU batch must be a positive integer, got {per_worker_batch!r}")
    if samples_per_s is not None:
        if not (isinstance(samples_per_s, (int, float)) and samples_per_s > 0):
            raise UsageError(f"--samples-per-s must be a positive number, got {samples_per_s!r}")
        throughput, source = float(samples_per_s), f"given throughput {samples_per_s:g} samples/s per GPU"
    else:
        entry = device_throughput(device, model, precision) if device else None
        if entry is None:
            where = f"{device}" if device else "this cluster (no device)"
            raise UsageError(
                f"no published {model} {precision} training throughput for {where}; "
                f"give --from-run DIR (a 1-worker run) or --samples-per-s N"
            )
        throughput = float(entry["samples_per_s"])
        where = entry.get("source", "devices.yaml")
        source = f"{device} {precision}: {throughput:g} samples/s at batch {entry['batch']} ({where})"
    step = per_worker_batch / throughput
    spec = load_devices().get(device) if device else None
    if spec:
        optimizer = optimizer_estimate_s(table["parameters"], spec["memory_bandwidth_GBps"] * 1e9)
    else:
        optimizer = 0.0
        source += "; optimizer not split out (no device memory bandwidth)"
    optimizer = min(optimizer, 0.5 * step)
    share = forward_share(table)
    compute = step - optimizer
    return StepCompute(
        data_s=0.0,
        forward_s=share * compute,
        backward_s=(1 - share) * compute,
        optimizer_s=optimizer,
        per_worker_batch=per_worker_batch,
        precision=precision,
        source=source,
        device=device,
    )


def adamw_estimate_s(parameters: float, memory_bandwidth_bytes_per_s: float) -> float:
    """AdamW's step, memory-bound: 28 bytes per parameter (fp32 weight, gradient, two moments) / bandwidth."""
    return ADAMW_BYTES_PER_PARAMETER * parameters / memory_bandwidth_bytes_per_s


def recompute_share(table: dict, activation_checkpointing: str) -> float:
    """Forward FLOPs recomputed in backward under that checkpointing, per forward FLOP (0 without)."""
    units = table.get("units") or []
    recomputed = sum(u["recompute_flops"][activation_checkpointing] for u in units)
    forward = sum(u["forward_flops"] for u in units)
    return recomputed / forward if forward else 0.0


def compute_from_mfu(
    device: str | None,
    table: dict,
    precision: str,
    per_worker_batch: int,
    mfu: float | None = None,
    activation_checkpointing: str = "selective",
) -> StepCompute:
    """One GPU's forward and backward of a transformer from a model FLOPs utilisation (module docstring);
    `table`: the model's layer table."""
    precision = normalize_precision(precision)
    model = table["model"]
    if table.get("kind") != "transformer":
        raise UsageError(f"--mfu needs a transformer's layer table; {model} has none (give --samples-per-s)")
    if not (isinstance(per_worker_batch, int) and per_worker_batch > 0):
        raise UsageError(f"per-GPU batch must be a positive integer, got {per_worker_batch!r}")
    spec = load_devices().get(device) if device else None
    peak = ((spec or {}).get("peak_tflops_per_s") or {}).get(precision)
    if not peak:
        raise UsageError(
            f"no {precision} peak for {device or 'this cluster (no device)'} in scaling/devices.yaml; "
            f"give --samples-per-s (sequences/s per GPU) or --from-run"
        )
    published = TRANSFORMER_MFU.get(device)
    if mfu is None:
        if published is None or published["precision"] != precision:
            raise UsageError(
                f"no published {precision} MFU of a transformer on {device}; give --mfu (e.g. 0.35) or --samples-per-s"
            )
        mfu, source = published["mfu"], f"MFU {100 * published['mfu']:.0f}% ({published['source']})"
    else:
        if not (isinstance(mfu, (int, float)) and 0 < mfu <= 1):
            raise UsageError(f"--mfu must be in (0, 1], got {mfu!r}")
        source = f"MFU {100 * mfu:.3g}% (given)"
    tokens = per_worker_batch * table["seq_len"]
    step = tokens * table["train_flops_per_token"] / (mfu * peak * 1e12)
    forward = table["forward_flops_per_sample"]
    backward = table["backward_flops_per_sample"] + recompute_share(table, activation_checkpointing) * forward
    bandwidth = (spec or {}).get("memory_bandwidth_GBps")
    optimizer = adamw_estimate_s(table["parameters"], bandwidth * 1e9) if bandwidth else 0.0
    source = (
        f"{device} {precision}: {table['train_flops_per_token'] / 1e9:.2f} GFLOP per token (layer table) at "
        f"{source} of {peak:g} TFLOP/s; {per_worker_batch} x {table['seq_len']} tokens per GPU; the optimizer "
        + (
            f"AdamW, memory-bound ({ADAMW_BYTES_PER_PARAMETER} bytes per parameter at {bandwidth:g} GB/s, the "
            f"datasheet's)"
            if bandwidth
            else "not split out (no device memory bandwidth)"
        )
    )
    return StepCompute(
        data_s=0.0,
        forward_s=step * forward / (forward + backward),
        backward_s=step * backward / (forward + backward),
        optimizer_s=optimizer,
        per_worker_batch=per_worker_batch,
        precision=precision,
        source=source,
        device=device,
    )


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _measured_buckets(run, backward_compute_s: float) -> tuple[tuple[float, ...], tuple[int, ...]] | None:
    """Per-bucket ready fractions from the run's buckets.parquet, if it wrote one.

    Contract (not written by the lab's schema 1 yet): one row per (rank, step, bucket) with
    `bucket` (all-reduce order), `bytes`, `ready_s` (seconds from the start of backward to the
    bucket's hand-over), optional `warmup`. Medians over rows, as fractions of backward compute.
    """
    frame = run.buckets()
    if not {"bucket", "bytes", "ready_s"} <= set(frame.columns) or frame.empty:
        return None
    if "warmup" in frame.columns:
        frame = frame[~frame["warmup"].astype(bool)]
    per = frame.groupby("bucket").agg(ready_s=("ready_s", "median"), nbytes=("bytes", "median")).sort_index()
    fractions = tuple(min(1.0, max(0.0, r / backward_compute_s)) for r in per["ready_s"])
    return fractions, tuple(int(b) for b in per["nbytes"])


def compute_from_run(run) -> StepCompute:
    """One worker's step from a run's summary.json (and its epochs/steps, if there); `run`: its RunDir."""
    path = run.summary_path
    if not path.is_file():
        raise UsageError(f"--from-run: no {path.name} in {run} (give a run directory made by scaling run)")
    try:
        summary = run.summary()
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--from-run: cannot read {path}: {exc}") from None
    missing = [k for k in RUN_FIELDS if summary.get(k) is None]
    if missing:
        raise UsageError(f"--from-run: {path} has no {missing[0]} (a failed run, or one without step timing?)")
    for key in ("data_s", "forward_s", "backward_s", "optimizer_s"):
        if not _finite(summary[key]) or summary[key] < 0:
            raise UsageError(f"--from-run: {path}: {key} is {summary[key]!r}")
    workers = int(summary["num_workers"])
    exposed = float(summary.get("exposed_comm_s") or 0.0) if workers > 1 else 0.0
    backward = max(0.0, float(summary["backward_s"]) - exposed)
    hardware = summary.get("hardware") or {}
    device = hardware.get("gpu_name") or hardware.get("cpu_model") or "unknown device"
    how = "backward_s" if workers == 1 else "backward_s - exposed_comm_s"
    source = (
        f"run {run.name}: {summary['model']} at {workers} worker(s) on {device}, "
        f"batch {summary['per_worker_batch']} per worker (backward compute = {how})"
    )
    samples_per_epoch = None
    num_buckets = None
    epochs = run.epochs()
    if "samples" in epochs.columns and not epochs.empty:
        samples_per_epoch = int(epochs["samples"].max())
    if workers > 1:
        steps = run.steps(["kind", "num_buckets"])  # empty without step records
        if "num_buckets" in steps.columns:
            train = steps[(steps["kind"] == "train") & (steps["num_buckets"] > 0)] if "kind" in steps.columns else steps
            if not train.empty:
                num_buckets = float(train["num_buckets"].median())
    measured = _measured_buckets(run, backward) if backward > 0 else None
    instrument = run.config.get("instrument") or {}
    cap = instrument.get("ddp_bucket_cap_mb")
    compression = instrument.get("grad_compression")
    return StepCompute(
        data_s=float(summary["data_s"]),
        forward_s=float(summary["forward_s"]),
        backward_s=backward,
        optimizer_s=float(summary["optimizer_s"]),
        per_worker_batch=int(summary["per_worker_batch"]),
        precision=normalize_precision(summary.get("precision") or "fp32"),
        source=source,
        device=device,
        samples_per_epoch=samples_per_epoch,
        measured_ready_fractions=measured[0] if measured else None,
        measured_bucket_bytes=measured[1] if measured else None,
        measured_num_buckets=num_buckets,
        epochs_to_target=summary.get("epochs_to_target"),
        global_batch=summary.get("global_batch"),
        bucket_cap_mb=float(cap) if _finite(cap) and cap > 0 else None,
        grad_compression=compression if compression in COMPRESSION_BYTES else None,
    )


def run_model(run) -> str | None:
    """The model a run trained (its summary.json; `run`: its RunDir), or None if unreadable."""
    try:
        return run.summary().get("model")
    except (OSError, json.JSONDecodeError):
        return None


STRAGGLER_DRAWS = 20_000
OVERLAP_FRACTION = 0.8  # an epoch counts when this much of its training ran while every run was training


def _epoch_intervals(epochs) -> list[tuple[int, float, float]]:
    """(epoch, start, end) of each epoch's training in unix seconds, from epochs.parquet.

    elapsed_wall_s runs from the run's first step to the end of the epoch's validation, so the
    training ended eval_s + calibration_s earlier and began train_s before that.
    """
    origin = float(epochs["first_step_unix"].min())
    out = []
    for row in epochs.itertuples(index=False):
        end = (
            origin
            + float(row.elapsed_wall_s)
            - float(getattr(row, "eval_s", 0.0) or 0.0)
            - float(getattr(row, "calibration_s", 0.0) or 0.0)
        )
        out.append((int(row.epoch), end - float(row.train_s), end))
    return out


def straggler_wait_s(per_run_samples, draws: int = STRAGGLER_DRAWS, seed: int = 0) -> float:
    """E[max over runs of one step's time] - mean over runs of the mean step time.

    One sample array per run (per-step seconds), drawn independently: exactly over every pair
    for two runs, by `draws` seeded random draws for more. 0 for a single run.
    """
    import numpy as np

    arrays = [np.asarray(a, dtype=float) for a in per_run_samples]
    if any(a.size == 0 for a in arrays):
        raise UsageError("straggler_wait_s: every run needs at least one step")
    mean = float(np.mean([a.mean() for a in arrays]))
    if len(arrays) == 1:
        return 0.0
    if len(arrays) == 2 and arrays[0].size * arrays[1].size <= 4_000_000:
        expected_max = float(np.maximum.outer(arrays[0], arrays[1]).mean())
    else:
        rng = np.random.default_rng(seed)
        picks = np.stack([rng.choice(a, size=draws) for a in arrays])
        expected_max = float(picks.max(axis=0).mean())
    return max(0.0, expected_max - mean)


def measured_overlap_slowdown(run) -> float:
    """The interference term a multi-worker run measured (cost.py's `overlap_slowdown`):

        slowdown = interference_s / (allreduce_s - exposed_comm_s)

    interference_s is the A/B difference beyond the exposed communication (what overlapped
    communication took from compute, scaling/analysis/run_metrics.py) and allreduce_s -
    exposed_comm_s the time an all-reduce was in flight while backward still computed: the
    stretch per second of overlap. UsageError for a one-worker run, or one whose all-reduces
    never overlapped backward (then the run cannot tell the slowdown). `run`: its RunDir.
    """
    summary = run.summary()
    needed = ("num_workers", "interference_s", "allreduce_s", "exposed_comm_s")
    if any(not _finite(summary.get(k)) for k in needed) or summary["num_workers"] < 2:
        raise UsageError(
            f"{run}: a multi-worker run with interference_s, allreduce_s and exposed_comm_s is needed "
            "to measure the overlap slowdown"
        )
    overlapped = summary["allreduce_s"] - summary["exposed_comm_s"]
    if not overlapped > 1e-6:
        raise UsageError(f"{run}: its all-reduces did not overlap backward; it cannot measure the overlap slowdown")
    return max(0.0, summary["interference_s"]) / overlapped


def expected_max_standard_normal(n: int) -> float:
    """E[max of n independent standard normal variables]: 0 for 1, 1/sqrt(pi) = 0.5642 for 2,
    1.4236 for 8, 2.6 for 128 (numerical integration of n x phi(x) Phi(x)^(n-1))."""
    import numpy as np

    if n <= 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 48_001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2)))
    density = n * phi * cdf ** (n - 1)
    return float(np.sum(x * density) * (x[1] - x[0]))


def jitter_straggler_s(compute_s: float, jitter_cv: float, n: int) -> float:
    """The wait for the slowest of n ranks when each rank's compute before the all-reduce varies
    independently from step to step with standard deviation jitter_cv x compute_s (normal):
    E[max] - mean = jitter_cv x compute_s x E[max of n standard normals]. It grows with n
    (about sqrt(2 ln n)): the jitter at large scale that a measured pair of runs cannot show."""
    return jitter_cv * compute_s * expected_max_standard_normal(n)


def compute_from_concurrent_runs(runs) -> StepCompute:
    """One worker's step, and the straggler wait, from K one-worker runs made at the same time
    (their RunDirs).

    Definitions in the module docstring. UsageError for fewer than two runs, a run that is not
    a one-worker run, different models or batches, or runs without step records.
    """
    runs = list(runs)
    if len(runs) < 2:
        raise UsageError("concurrent runs: give at least two one-worker run directories")
    singles = [compute_from_run(run) for run in runs]
    summaries = [run.summary() for run in runs]
    for run, summary in zip(runs, summaries):
        if int(summary["num_workers"]) != 1:
            raise UsageError(
                f"concurrent runs: {run} ran {summary['num_workers']} workers; each must be a one-worker run"
            )
    if (
        len({s["model"] for s in summaries}) > 1
        or len({c.per_worker_batch for c in singles}) > 1
        or len({c.precision for c in singles}) > 1
    ):
        raise UsageError("concurrent runs: the runs differ in model, batch or precision")
    steps, intervals = [], []
    for run in runs:
        frame = run.steps()
        if frame.empty or not run.epochs_path.is_file():
            raise UsageError(
                f"concurrent runs: {run} has no {run.steps_path.name} or {run.epochs_path.name} (step timing off?)"
            )
        steps.append(frame[(frame["kind"] == "train") & (~frame["warmup"].astype(bool))])
        intervals.append(_epoch_intervals(run.epochs()))
    window_start = max(iv[0][1] for iv in intervals)
    window_end = min(iv[-1][2] for iv in intervals)
    kept_steps, kept_epochs = [], []
    for frame, iv in zip(steps, intervals):
        keep = [
            e
            for e, start, end in iv
            if end > start and (min(end, window_end) - max(start, window_start)) >= OVERLAP_FRACTION * (end - start)
        ]
        chosen = frame[frame["epoch"].isin(keep)]
        if chosen.empty:
            raise UsageError("concurrent runs: the runs did not train at the same time (no epoch overlaps the others)")
        kept_steps.append(chosen)
        kept_epochs.append(keep)
    means = {
        k: float(sum(f[k].mean() for f in kept_steps) / len(kept_steps))
        for k in ("data_s", "forward_s", "backward_s", "optimizer_s")
    }
    before_allreduce = [(f["data_s"] + f["forward_s"] + f["backward_s"]).to_numpy() for f in kept_steps]
    straggler = straggler_wait_s(before_allreduce)
    per_run = ", ".join(
        f"{1e3 * float((f['data_s'] + f['forward_s'] + f['backward_s'] + f['optimizer_s']).mean()):.1f}"
        for f in kept_steps
    )
    first = singles[0]
    source = (
        f"{len(runs)} concurrent 1-worker runs ({', '.join(run.name for run in runs)}): {first.device}, batch "
        f"{first.per_worker_batch}; step {per_run} ms each (epochs "
        f"{'; '.join(','.join(map(str, k)) for k in kept_epochs)}, "
        f"those run while every run trained), phases averaged; straggler wait {1e3 * straggler:.1f} ms"
    )
    return replace(
        first,
        source=source,
        measured_num_buckets=None,
        straggler_s=straggler,
        straggler_ranks=len(runs),
        measured_ready_fractions=None,
        measured_bucket_bytes=None,
        **means,
    )


@dataclass(frozen=True)
class MeasuredRun:
    """A measured run as from_run.py reads it, for the compute stage to put its step on the target (from_run.py's
    module docstring says how): the run, or one-worker runs made at the same time; its summary and FLOP profile;
    its steady-state steps' phase means; and how the user asked the step transferred."""

    runs: tuple  # RunDirs: one, or one-worker runs made at the same time
    summary: dict
    profile: dict  # compute_profile.json, with parameters and train_flops
    means: dict[str, float]  # data_s, forward_s, backward_compute_s, optimizer_s over the steady steps
    steps: int  # how many steady steps the means are over
    on_target: bool  # the run's device is the cluster's (or the user says so: same_device)
    compute_ms: float | None = None  # one GPU's forward + backward, as the user measured it


@dataclass
class StepPlan:
    """One worker's step as a projection's rows take it (project.py's compute stage): the step, the wait for
    the slowest rank at each row's worker count, and the notes that say where both come from."""

    compute: StepCompute
    waits: list[float]  # seconds per step, one per row of the placements: 0 at one worker
    straggler_s: float | None  # given or measured by concurrent runs, per step; None: the cluster's jitter
    wait_given: bool  # said by the caller, per step: not spread over FSDP's collectives
    wait_assumed: bool  # the preset's jitter stands in for a wait nobody measured
    notes: list[str] = field(default_factory=list)
    # (name, value, what set it) for each part of a measured run's step on the target (from_run's table)
    parameters: list[tuple[str, str, str]] = field(default_factory=list)
    ends: tuple[StepPlan, ...] = ()  # the plans at the ends of the spec's compute_spread (the rows' intervals)


def plan_compute(r: Resolved) -> StepPlan:
    """The compute stage: one worker's step (given, a measured run's on the target, a transformer's MFU or the
    device's published throughput) at the spec's batch, and the wait for the slowest rank at every row."""
    spec = r.spec
    given, parameters = (spec.compute, []) if spec.measured is None else _on_target(r, spec.measured)
    if given is None:
        return _plan(r, *_resolve_compute(r))
    plan = _plan(r, given.at_batch(spec.per_gpu_batch), [f"compute: {given.source}"])
    plan.parameters = parameters
    plan.ends = tuple(_plan(r, given.scaled(f).at_batch(spec.per_gpu_batch), []) for f in spec.compute_spread or ())
    return plan


def _plan(r: Resolved, compute: StepCompute, notes: list[str]) -> StepPlan:
    """The step's plan: its wait for the slowest rank per row (given, measured, or the cluster's jitter)."""
    spec = r.spec
    straggler = compute.straggler_s if spec.straggler_s is None and compute.straggler_ranks else spec.straggler_s
    waits = [
        0.0
        if n_nodes * per_node == 1
        else straggler
        if straggler is not None
        else jitter_straggler_s(
            compute.data_s + compute.forward_s + compute.backward_s, r.cluster.step_jitter_cv, n_nodes * per_node
        )
        for n_nodes, per_node in r.rows_at
    ]
    return StepPlan(
        compute,
        waits,
        straggler,
        wait_given=spec.straggler_s is not None,
        wait_assumed=straggler is None and spec.from_run is None,
        notes=notes + _straggler_notes(r, compute, straggler),
    )


def _on_target(r: Resolved, measured: MeasuredRun) -> tuple[StepCompute, list[tuple[str, str, str]]]:
    """A measured run's step on the target (from_run.py's module docstring), and (parameter, value, set by) for
    each of its parts."""
    concurrent, run, summary, profile, cluster = (
        list(measured.runs),
        measured.runs[0],
        measured.summary,
        measured.profile,
        r.cluster,
    )
    precision, compute_ms, mfu, means = r.spec.precision, measured.compute_ms, r.spec.mfu, measured.means
    base = compute_from_concurrent_runs(concurrent) if len(concurrent) > 1 else compute_from_run(run)
    hardware = summary.get("hardware") or {}
    run_device = hardware.get("gpu_name")
    b = base.per_worker_batch
    measured_on = run_device or hardware.get("cpu_model") or "an unknown device"
    params = [("data wait", f"{1e3 * means['data_s']:.2f} ms", f"the run's data_s (mean of {measured.steps} steps)")]
    device_spec = load_devices().get(cluster.device) or {} if cluster.device else {}
    same = measured.on_target and compute_ms is None and mfu is None
    if same:
        if precision is not None and normalize_precision(precision) != base.precision:
            raise UsageError(
                f"the run ran at {base.precision} on {run_device}; --precision {precision} needs another run"
            )
        if len(concurrent) > 1:  # the phases over the epochs every run trained in (compute.py)
            compute = base
            params[0] = ("data wait", f"{1e3 * base.data_s:.2f} ms", base.source)
            params.append(("straggler wait", f"{1e3 * base.straggler_s:.2f} ms", base.source))
        else:
            compute = replace(
                base,
                data_s=means["data_s"],
                forward_s=means["forward_s"],
                backward_s=means["backward_compute_s"],
                optimizer_s=means["optimizer_s"],
            )
        params += [
            (
                "forward + backward compute",
                f"{1e3 * (compute.forward_s + compute.backward_s):.2f} ms",
                f"the run's forward_s and backward_s less exposed_comm_s, measured on {measured_on} (the target's "
                f"device)",
            ),
            ("optimizer step", f"{1e3 * compute.optimizer_s:.2f} ms", "the run's optimizer_s"),
        ]
        bandwidth = profile.get("mem_bytes_per_s")
        if bandwidth:
            # what a sharded step saves is its bytes: the rest (per-tensor launches) every shard pays
            moved = adamw_estimate_s(float(profile["parameters"]), float(bandwidth))
            compute = replace(compute, optimizer_unsharded_s=max(0.0, compute.optimizer_s - moved))
            params.append(
                (
                    "optimizer, not shrinking with shards",
                    f"{1e3 * compute.optimizer_unsharded_s:.2f} ms",
                    f"the run's optimizer_s less AdamW's bytes (28 per parameter) at the run's measured memory "
                    f"bandwidth, {float(bandwidth) / 1e9:.3g} GB/s (compute_profile.json mem_bytes_per_s)",
                )
            )
        return compute, params
    fb_measured = means["forward_s"] + means["backward_compute_s"]
    forward_share = means["forward_s"] / fb_measured if fb_measured > 0 else 1 / 3
    flops = float(profile["train_flops"]) * b
    if compute_ms is not None:
        if not (isinstance(compute_ms, (int, float)) and compute_ms > 0):
            raise UsageError(f"--compute-ms must be a positive number, got {compute_ms!r}")
        target_precision = normalize_precision(precision or base.precision)
        fb = compute_ms / 1e3
        how = f"given (--compute-ms {compute_ms:g}: one GPU's forward + backward at batch {b})"
    else:
        target_precision, rate, how = _compute_rate(
            summary, cluster, device_spec, precision, base.precision, mfu, run_device
        )
        fb = flops / rate
        how = (
            f"the run's {float(profile['train_flops']) / 1e9:.3g} GFLOP per sample x {b} (compute_profile.json) "
            f"at {how}"
        )
    params.append(
        (
            "forward + backward compute",
            f"{1e3 * fb:.3f} ms",
            how + f"; measured on {measured_on}: {1e3 * fb_measured:.2f} ms, which cannot be the GPU's",
        )
    )
    bandwidth = device_spec.get("memory_bandwidth_GBps")
    if bandwidth:
        optimizer = adamw_estimate_s(float(profile["parameters"]), bandwidth * 1e9)
        params.append(
            (
                "optimizer step",
                f"{1e3 * optimizer:.3f} ms",
                f"AdamW, memory-bound: 28 bytes x "
                f"{int(profile['parameters']):,} parameters at {bandwidth:g} GB/s ({cluster.device}'s "
                "datasheet)",
            )
        )
    else:
        optimizer = means["optimizer_s"]
        params.append(("optimizer step", f"{1e3 * optimizer:.2f} ms", "the run's optimizer_s (no device bandwidth)"))
    compute = replace(
        base,
        data_s=means["data_s"],
        forward_s=forward_share * fb,
        backward_s=(1 - forward_share) * fb,
        optimizer_s=optimizer,
        precision=target_precision,
        device=cluster.device,
        source=f"run {run.name} transferred to {cluster.device}",
    )
    params.append(
        (
            "forward : backward",
            f"{forward_share:.2f} : {1 - forward_share:.2f}",
            "the run's measured split of forward_s and backward compute",
        )
    )
    return compute, params


def _compute_rate(
    summary: dict,
    cluster: Cluster,
    spec: dict,
    precision: str | None,
    run_precision: str,
    mfu: float | None,
    run_device: str | None,
) -> tuple[str, float, str]:
    """(precision on the target, FLOP/s, how it was set) for a run measured on another device."""
    published = TRANSFORMER_MFU.get(cluster.device or "")
    if mfu is not None:
        if not (isinstance(mfu, (int, float)) and 0 < mfu <= 1):
            raise UsageError(f"--mfu must be in (0, 1], got {mfu!r}")
        target = normalize_precision(precision or run_precision)
        source = f"MFU {100 * mfu:.3g}% (given)"
    elif run_device and summary.get("mfu"):
        mfu, target = float(summary["mfu"]), normalize_precision(precision or run_precision)
        source = f"MFU {100 * mfu:.3g}%, the run's own on {run_device} (summary.json mfu)"
    elif published is not None:
        mfu, target = published["mfu"], normalize_precision(precision or published["precision"])
        source = (
            f"MFU {100 * mfu:.0f}%, {cluster.device}'s published one ({published['source'].split(':')[0]}: "
            f"Llama 3.1 8B; a small model runs far below it: give --compute-ms or --mfu)"
        )
    else:
        raise UsageError(
            f"the run ran on {run_device or 'a CPU'}, whose compute is not {cluster.device or 'the'} "
            f"GPU's, and no MFU is published for {cluster.device}: give --mfu (e.g. 0.35) or --compute-ms"
        )
    peak = (spec.get("peak_tflops_per_s") or {}).get(target)
    if not peak:
        raise UsageError(
            f"no {target} peak for {cluster.device or 'this cluster (no device)'} in "
            "scaling/devices.yaml; give --compute-ms"
        )
    return target, mfu * peak * 1e12, f"{source} of {cluster.device}'s {target} peak, {peak:g} TFLOP/s"


def _resolve_compute(r: Resolved) -> tuple[StepCompute, list[str]]:
    """One worker's step and the note on where it comes from: a run, a transformer's MFU, or the device."""
    spec, table, cluster, checkpointing = r.spec, r.table, r.cluster, r.checkpointing
    model, from_run, precision, per_gpu_batch = table["model"], spec.from_run, spec.precision, spec.per_gpu_batch
    notes = []
    runs = list(from_run) if isinstance(from_run, (list, tuple)) else None
    if runs is not None and len(runs) == 1:
        from_run, runs = runs[0], None
    if from_run is not None:
        for run in runs or [from_run]:
            trained = run_model(run)
            if trained is not None and trained != model:
                raise UsageError(f"--from-run {run} trained {trained}, not {model}; drop --model or give a {model} run")
        compute = compute_from_concurrent_runs(runs) if runs else compute_from_run(from_run)
        if precision is not None and normalize_precision(precision) != compute.precision:
            raise UsageError(
                f"--from-run {from_run} ran at {compute.precision}; --precision {precision} would need another run"
            )
        compute = compute.at_batch(per_gpu_batch)
        notes.append(f"compute: {compute.source}; the cluster's links carry its gradients")
    elif r.transformer and spec.samples_per_s is None:
        batch = per_gpu_batch or TRANSFORMER_BATCH
        compute = compute_from_mfu(cluster.device, table, precision or "bf16", batch, spec.mfu, checkpointing)
        notes.append(
            f"compute: {compute.source}; split forward:backward by FLOPs with {checkpointing} "
            f"activation checkpointing's recomputation in backward, data 0"
        )
    else:
        if spec.mfu is not None:
            raise UsageError("give --mfu or --samples-per-s, not both")
        default_batch = TRANSFORMER_BATCH if r.transformer else 64
        compute = compute_from_device(
            cluster.device,
            table,
            precision or ("bf16" if r.transformer else "fp32"),
            per_gpu_batch or default_batch,
            spec.samples_per_s,
        )
        notes.append(f"compute: {compute.source}; split forward:backward by FLOPs, optimizer memory-bound, data 0")
    return compute, notes


def _straggler_notes(r: Resolved, compute: StepCompute, straggler: float | None) -> list[str]:
    """What the wait for the slowest rank is: given, measured by concurrent runs, or the cluster's jitter."""
    spec, cluster, notes = r.spec, r.cluster, []
    if straggler:
        measured = (
            f"measured by {compute.straggler_ranks} concurrent 1-worker runs"
            if compute.straggler_ranks and straggler == compute.straggler_s
            else "given"
        )
        notes.append(
            f"straggler: {1e3 * straggler:.1f} ms per step at every worker count > 1 ({measured}): "
            f"the wait for the slowest rank, counted as exposed communication, as the lab measures it"
        )
    elif straggler is None and cluster.step_jitter_cv:
        notes.append(
            f"straggler: from the cluster's step jitter ({100 * cluster.step_jitter_cv:.3g}% of compute, "
            f"per rank and step), the expected wait for the slowest of n ranks, growing with n"
        )
    if (
        spec.backend == "fsdp"
        and spec.fsdp_process_group == "gloo"
        and spec.straggler_s is None
        and (straggler or cluster.step_jitter_cv)
    ):
        notes.append("gloo: the wait for the slower rank paid at each collective, sqrt(K) x a step's for K of them")
    return notes
