"""Per-step compute time of one worker (data, forward, backward, optimizer), from a run
directory or from a published per-device throughput. Pure Python (pandas to read a run).

From a run (`compute_from_run`): the run's summary.json means (docs/results.md). At one worker
`backward_s` is pure compute; at more, backward compute = backward_s - exposed_comm_s (the
lab's own split; overlapped communication that slowed backward stays in it, so a projection
from a multi-worker run is a little pessimistic). A different per-GPU batch scales data,
forward and backward by batch / run batch (time per sample constant); the optimizer step does
not depend on the batch and is kept.

From a device (`compute_from_device`): one GPU's published training throughput T (samples/s,
devices.yaml) gives the step b / T at per-GPU batch b, assumed to hold at any batch (it was
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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from scaling.errors import UsageError
from scaling.projection.cluster import device_throughput, load_devices, normalize_precision
from scaling.projection.layers import BYTES_PER_GRAD_ELEMENT, forward_share, load_layer_table

SGD_MOMENTUM_PASSES = 5  # as scaling/instrument/flops.py: read weights, gradients, momentum; write weights, momentum
RUN_FIELDS = ("data_s", "forward_s", "backward_s", "optimizer_s", "per_worker_batch", "num_workers", "model")


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

    @property
    def step_s(self) -> float:
        return self.data_s + self.forward_s + self.backward_s + self.optimizer_s

    def at_batch(self, per_worker_batch: int | None) -> "StepCompute":
        """The same worker at another batch: data, forward, backward scale with the batch."""
        if per_worker_batch is None or per_worker_batch == self.per_worker_batch:
            return self
        if not (isinstance(per_worker_batch, int) and per_worker_batch > 0):
            raise UsageError(f"per-GPU batch must be a positive integer, got {per_worker_batch!r}")
        f = per_worker_batch / self.per_worker_batch
        return replace(self, data_s=self.data_s * f, forward_s=self.forward_s * f, backward_s=self.backward_s * f,
                       per_worker_batch=per_worker_batch,
                       source=self.source + f"; scaled from batch {self.per_worker_batch} to {per_worker_batch} per GPU")


def optimizer_estimate_s(parameters: int, memory_bandwidth_bytes_per_s: float) -> float:
    """SGD with momentum, memory-bound: 5 passes x 4 bytes x parameters / memory bandwidth."""
    return SGD_MOMENTUM_PASSES * BYTES_PER_GRAD_ELEMENT * parameters / memory_bandwidth_bytes_per_s


def compute_from_device(device: str | None, model: str, precision: str, per_worker_batch: int,
                        samples_per_s: float | None = None) -> StepCompute:
    """One GPU's step from the device table (or from `samples_per_s` given directly)."""
    precision = normalize_precision(precision)
    table = load_layer_table(model)
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
            raise UsageError(f"no published {model} {precision} training throughput for {where}; "
                             f"give --from-run DIR (a 1-worker run) or --samples-per-s N")
        throughput = float(entry["samples_per_s"])
        source = f"{device} {precision}: {throughput:g} samples/s at batch {entry['batch']} ({entry.get('source', 'devices.yaml')})"
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
    return StepCompute(data_s=0.0, forward_s=share * compute, backward_s=(1 - share) * compute,
                       optimizer_s=optimizer, per_worker_batch=per_worker_batch, precision=precision,
                       source=source, device=device)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _measured_buckets(run_dir: Path, backward_compute_s: float) -> tuple[tuple[float, ...], tuple[int, ...]] | None:
    """Per-bucket ready fractions from DIR/buckets.parquet, if the run wrote one.

    Contract (not written by the lab's schema 1 yet): one row per (rank, step, bucket) with
    `bucket` (all-reduce order), `bytes`, `ready_s` (seconds from the start of backward to the
    bucket's hand-over), optional `warmup`. Medians over rows, as fractions of backward compute.
    """
    path = run_dir / "buckets.parquet"
    if not path.is_file():
        return None
    import pandas as pd

    frame = pd.read_parquet(path)
    if not {"bucket", "bytes", "ready_s"} <= set(frame.columns) or frame.empty:
        return None
    if "warmup" in frame.columns:
        frame = frame[~frame["warmup"].astype(bool)]
    per = frame.groupby("bucket").agg(ready_s=("ready_s", "median"), nbytes=("bytes", "median")).sort_index()
    fractions = tuple(min(1.0, max(0.0, r / backward_compute_s)) for r in per["ready_s"])
    return fractions, tuple(int(b) for b in per["nbytes"])


def compute_from_run(run_dir: str | Path) -> StepCompute:
    """One worker's step from a run directory's summary.json (and its epochs/steps, if there)."""
    run_dir = Path(run_dir)
    path = run_dir / "summary.json"
    if not path.is_file():
        raise UsageError(f"--from-run: no summary.json in {run_dir} (give a run directory made by scaling run)")
    try:
        summary = json.loads(path.read_text())
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
    source = (f"run {run_dir.name}: {summary['model']} at {workers} worker(s) on {device}, "
              f"batch {summary['per_worker_batch']} per worker (backward compute = {how})")
    samples_per_epoch = None
    epochs_path = run_dir / "epochs.parquet"
    num_buckets = None
    if epochs_path.is_file():
        import pandas as pd

        epochs = pd.read_parquet(epochs_path)
        if "samples" in epochs.columns and not epochs.empty:
            samples_per_epoch = int(epochs["samples"].max())
    steps_path = run_dir / "steps.parquet"
    if workers > 1 and steps_path.is_file():
        import pandas as pd

        steps = pd.read_parquet(steps_path, columns=None)
        if "num_buckets" in steps.columns:
            train = steps[(steps["kind"] == "train") & (steps["num_buckets"] > 0)] if "kind" in steps.columns else steps
            if not train.empty:
                num_buckets = float(train["num_buckets"].median())
    measured = _measured_buckets(run_dir, backward) if backward > 0 else None
    instrument = _run_config(run_dir).get("instrument") or {}
    cap = instrument.get("ddp_bucket_cap_mb")
    compression = instrument.get("grad_compression")
    return StepCompute(
        data_s=float(summary["data_s"]), forward_s=float(summary["forward_s"]), backward_s=backward,
        optimizer_s=float(summary["optimizer_s"]), per_worker_batch=int(summary["per_worker_batch"]),
        precision=normalize_precision(summary.get("precision") or "fp32"), source=source, device=device,
        samples_per_epoch=samples_per_epoch,
        measured_ready_fractions=measured[0] if measured else None,
        measured_bucket_bytes=measured[1] if measured else None,
        measured_num_buckets=num_buckets,
        epochs_to_target=summary.get("epochs_to_target"),
        global_batch=summary.get("global_batch"),
        bucket_cap_mb=float(cap) if _finite(cap) and cap > 0 else None,
        grad_compression=compression if compression in ("none", "fp16", "bf16") else None,
    )


def _run_config(run_dir: Path) -> dict:
    """The run's resolved config.yaml (empty if absent or unreadable)."""
    import yaml

    try:
        data = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def run_model(run_dir: str | Path) -> str | None:
    """The model a run trained (summary.json), or None if unreadable."""
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text()).get("model")
    except (OSError, json.JSONDecodeError):
        return None
