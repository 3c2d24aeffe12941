"""Project a measured run of the user's own job (made by `attach`, the lab's loop, or a trainer's
callback) onto a cluster preset: step time, throughput, the three communication figures and memory
per GPU at 1-128 GPUs, for DDP or FSDP2, each with an interval from the run's own per-step spread.

    from scaling.results import RunDir
    from scaling.projection.from_run import project_run
    df = project_run(RunDir("results/my-job"), "p5.48xlarge", [8, 32, 128])  # the run's own: DDP or FSDP2

Nothing here models communication: the run becomes a layer table and its measured step (`compute.MeasuredRun`)
in a `ProjectionSpec` (`run_spec`), and `project.project` projects it with the collective cost model, the
cluster presets and the overlap and FSDP schedules every other projection uses; its compute stage puts the
measured step on the target. What the run gives:

- **the model's size**: compute_profile.json's `parameters` (trainable) and, per FSDP2 unit, the
  run's collectives.parquet (`reduce_scatter` bytes per module: the unit's gradients; their issue
  order is the units' order), or, where it issued none (FSDP2 on one worker), compute_profile.json's
  `sharded_units` (each `fully_shard`ed module's parameters, as the instrument found them). DDP
  buckets: DDP's own assignment (buckets.py) over the gradients in equal tensors of at most 1 MiB,
  each ready in proportion to its bytes through backward, unless the run wrote buckets.parquet
  (measured bytes and ready times). FSDP2 compute per unit is split in
  proportion to its parameters. A run without FSDP2 records needs `fsdp_units` (its blocks, split evenly).
- **the compute**: the run's steady-state training steps (steps.parquet: `data_s`, `forward_s`,
  `backward_s` less `exposed_comm_s`, `optimizer_s`; at more than one worker only the steps whose collectives
  were timed, `instrument.collective_timing_every`). A run on the target's GPU is taken as measured.
  Any other device (a CPU) cannot give the GPU's compute, so forward and backward are the run's
  FLOPs (compute_profile.json: training FLOPs per sample x the batch) at a model FLOPs utilisation of
  the target's peak: `mfu` given, else the run's own MFU where it ran on a GPU, else the target's
  published one (compute.TRANSFORMER_MFU, torchtitan's Llama 3.1 8B on H100: a small model runs far
  below it); or `compute_ms`, one GPU's forward + backward as the user measured it. The optimizer
  off the target is AdamW's memory-bound step (compute.adamw_estimate_s); the data wait stays the
  run's (the host's loader, not the GPU).
- **the interval**: the projection again with every step's compute at the 2.5th and 97.5th
  percentiles of the run's per-step compute (the same scale on each phase): the middle 95% of the
  run's steps, carried through the model. Columns `<figure>_lo` and `<figure>_hi`.
- **jitter**: on the target's GPU the run's per-step coefficient of variation of compute is the
  cluster's `step_jitter_cv` (the wait for the slowest of n ranks); measured elsewhere it is not the
  GPU's, and the preset's stays.
- **memory**: the tensors from the run's parameters (fp32 weights, gradients, AdamW's two moments)
  and activations (compute_profile.json's `activation_elements` per sample, 2 bytes each under
  bf16/fp16, 4 under fp32), FSDP's buffers, and on a GPU the allocator's reserve, the CUDA context
  and NCCL's buffers (memory.py, each with its source). No interval: nothing per step sets it.

`df.attrs["parameters"]` lists every parameter of the projection with its value and the measured
quantity (or assumption) that set it; `df.attrs["notes"]` what `project` adds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from scaling.devices import match_device
from scaling.errors import UsageError
from scaling.projection.cluster import Cluster, load_cluster
from scaling.projection.compute import MeasuredRun
from scaling.projection.tta import NoiseScale, SamplesToTarget
from scaling.projection.layers import BYTES_PER_GRAD_ELEMENT, FSDP_DTYPES, MIB
from scaling.projection.memory import DTYPE_BYTES
from scaling.projection.project import project
from scaling.projection.spec import ProjectionSpec

BACKENDS = ("ddp", "fsdp")
DEFAULT_GPUS = "1,2,4,8,16,32,64,128"  # a run's projection's GPU counts unless told (--gpus)


def run_backend(run) -> str:
    """The backend a run projects with unless told: FSDP2 where the run's job sharded (job.json
    `data_parallel`, which the instrument records), else DDP (DDP, a bare model, Horovod: every
    rank all-reduces whole gradients)."""
    return "fsdp" if (run.job() or {}).get("data_parallel") == "fsdp" else "ddp"


INTERVAL_PERCENTILES = (2.5, 97.5)
MAX_TENSOR_BYTES = MIB  # the equal gradient tensors DDP's buckets are assigned from


def _profile(run) -> dict:
    profile = run.compute_profile()
    if not profile or profile.get("error") or not profile.get("parameters") or not profile.get("train_flops"):
        why = (profile or {}).get("error") or "no compute_profile.json"
        raise UsageError(
            f"{run}: the run's model size and FLOPs are unknown ({why}); a run made with the "
            "instrument's FLOP counting is needed"
        )
    return profile


def _steps(run, workers: int) -> pd.DataFrame:
    """The steady-state training steps, with `compute_s` (data + forward + backward compute + optimizer); at more
    than one worker those whose communication was timed."""
    steps = run.steps()
    if steps.empty or "kind" not in steps.columns:
        raise UsageError(f"{run}: no step records (steps.parquet); the interval needs the run's per-step times")
    steps = steps[(steps["kind"] == "train") & ~steps["warmup"].astype(bool)].copy()
    if len(steps) < 2:
        raise UsageError(f"{run}: {len(steps)} steady-state training step(s); at least 2 are needed")
    exposed = 0.0
    if workers > 1 and "exposed_comm_s" in steps:
        # a step whose collectives were not timed (instrument.collective_timing_every) holds its wait for them in
        # backward_s, unmeasured: its compute is unknown, so the run's compute rests on the timed steps
        steps = steps[steps["exposed_comm_s"].notna()]
        if len(steps) < 2:
            raise UsageError(
                f"{run}: {len(steps)} steady-state training step(s) with timed communication; at least 2 are "
                "needed (instrument.collective_timing_every)"
            )
        exposed = steps["exposed_comm_s"]
    steps["backward_compute_s"] = (steps["backward_s"] - exposed).clip(lower=0.0)
    steps["compute_s"] = steps["data_s"] + steps["forward_s"] + steps["backward_compute_s"] + steps["optimizer_s"]
    return steps


def _fsdp_units(run, profile: dict, reduce_bytes: int, fsdp_units: int | None) -> tuple[list[tuple[str, int]], str]:
    """(module, parameters) per FSDP unit, the root first; and what set them."""
    parameters = int(profile["parameters"])
    frame = run.collectives(["step_kind", "warmup", "rank", "collective", "module", "bytes", "index", "step"])
    scatters = frame[frame["collective"] == "reduce_scatter"] if "collective" in frame.columns else frame
    if not scatters.empty:
        first = scatters[(scatters["rank"] == scatters["rank"].min())]
        first = first[first["step"] == first["step"].max()]
        per = first.groupby("module").agg(nbytes=("bytes", "median"), index=("index", "min"))
        # reduce-scatters run in backward order: the last issued is the first unit in forward; the root first
        order = per.sort_values("index", ascending=False)
        names = ["root"] + [m for m in order.index if m != "root"] if "root" in per.index else list(order.index)
        units = [(m, int(per.loc[m, "nbytes"] // reduce_bytes)) for m in names]
        return units, (
            f"{len(units)} FSDP2 units and their parameters from the run's collectives.parquet "
            f"(reduce-scatter bytes per module / {reduce_bytes} bytes per gradient element)"
        )
    recorded = profile.get("sharded_units")
    if recorded and fsdp_units is None:
        # a run that issued no collectives (FSDP2 on one worker): the units as the instrument found them
        units = [(str(unit[0]), int(unit[1])) for unit in recorded]
        return units, (
            f"{len(units)} FSDP2 units and their parameters from the run's compute_profile.json "
            "sharded_units (the run issued no collectives)"
        )
    if fsdp_units is None:
        raise UsageError(
            f"{run}: no FSDP2 per-module records (collectives.parquet, compute_profile.json sharded_units); "
            "give --fsdp-units N (the model's blocks, each sharded) to split its parameters evenly"
        )
    if not (isinstance(fsdp_units, int) and fsdp_units >= 1):
        raise UsageError(f"--fsdp-units must be a positive integer, got {fsdp_units!r}")
    share = parameters // (fsdp_units + 1)
    units = [("root", parameters - fsdp_units * share)] + [(f"unit{i}", share) for i in range(fsdp_units)]
    return units, (
        f"{fsdp_units} blocks and the root of equal parameters (given: --fsdp-units; the run has no "
        f"FSDP2 per-module records)"
    )


def run_layer_table(
    run, profile: dict, backend: str, fsdp_units: int | None = None, reduce_bytes: int = 4
) -> tuple[dict, str]:
    """A layer table (layers.py's shape) of the run's model from its records; and what set its units. Its
    samples per epoch are the run's compute's (compute.compute_from_run: its epochs), not the table's."""
    parameters = int(profile["parameters"])
    seq_len = int(profile.get("tokens_per_sample") or 1)
    forward, backward = float(profile["forward_flops"]), float(profile["backward_flops"])
    # gradients in equal tensors of at most 1 MiB, in backward order, each ready in proportion to its bytes
    count = max(1, math.ceil(parameters * BYTES_PER_GRAD_ELEMENT / MAX_TENSOR_BYTES))
    sizes = [parameters // count + (1 if i < parameters % count else 0) for i in range(count)]
    layers = [
        {"name": f"grad{i}", "backward_flops": float(n), "params": [[f"grad{i}", n]]} for i, n in enumerate(sizes)
    ]
    if backend == "fsdp":
        named, units_source = _fsdp_units(run, profile, reduce_bytes, fsdp_units)
    else:
        named, units_source = [("root", parameters)], "one unit: the whole model (DDP keeps every parameter)"
    # activations: the run's count per sample, as bf16 bytes per token (the table's convention: run_projection
    # doubles them under fp32), spread over the units by parameters
    activation_bytes = 2.0 * float(profile.get("activation_elements") or 0.0) / seq_len
    total = sum(p for _, p in named) or 1
    units = []
    for name, params in named:
        share = params / total
        held = activation_bytes * share
        units.append(
            {
                "name": name,
                "params": params,
                "forward_flops": forward * share / seq_len,
                "backward_flops": backward * share / seq_len,
                "activation_bytes_per_token": {"none": held, "selective": held, "full": held},
                "recompute_flops": {"none": 0.0, "selective": 0.0, "full": 0.0},
            }
        )
    table = {
        "model": run.name,
        "kind": "transformer",
        "num_classes": 0,
        "seq_len": seq_len,
        "dataset": f"the run {run.name}",
        "dataset_size": None,
        "parameters": parameters,
        "forward_flops_per_sample": forward,
        "backward_flops_per_sample": backward,
        "train_flops_per_token": (forward + backward) / seq_len,
        "layers": layers,
        "units": units,
    }
    return table, units_source


def reshard_policy(units: list | None) -> str | None:
    """run_projection's `reshard_after_forward` for the units an instrument recorded ([module, parameters,
    resharded], the root first); None where they do not say, or say a policy it has no name for."""
    if not units or any(len(unit) < 3 for unit in units):
        return None
    root, blocks = bool(units[0][2]), [bool(unit[2]) for unit in units[1:]]
    if all(blocks):
        return "all-and-root" if root else "all"
    if not root and not any(blocks):
        return "none"
    if not root and blocks and not blocks[-1] and all(blocks[:-1]):
        return "all-but-last"
    return None


def _same_device(run_device: str | None, target: str | None) -> bool:
    """Whether the run's GPU (its name as CUDA reports it) is the cluster's device (a devices.yaml key)."""
    return bool(run_device and target) and match_device(run_device) == target


@dataclass
class RunSpec:
    """A run's projection as asked: the spec, what set each of its parameters, and the steps its interval
    rests on."""

    spec: ProjectionSpec
    parameters: list[tuple[str, str, str]]  # (name, value, the measured quantity or assumption that set it)
    steps: pd.DataFrame  # the runs' steady-state steps, `compute_s` each
    runs: list  # the RunDirs: one, or one-worker runs made at the same time
    lr_rule_source: str = ""  # where the samples-to-target model's learning-rate rule comes from


def project_run(run, cluster: str | Cluster, gpus: Sequence[int] | str, backend: str | None = None, **options):
    """`project` of the run's spec (`run_spec`, the same arguments), with `<figure>_lo` / `_hi` columns: the
    projection at either end of the run's per-step spread of compute (rows.FIGURES)."""
    asked = run_spec(run, cluster, gpus, backend, **options)
    df = project(asked.spec)
    backend_line, *rest = asked.parameters
    parameters = [backend_line, *df.attrs.pop("compute_parameters"), *rest]
    model_text = df.attrs.pop("samples_to_target", None)
    if model_text is not None:
        parameters.append(("epochs to target", model_text, f"summary.json; rule {asked.lr_rule_source}"))
    low, high = asked.spec.compute_spread
    parameters.append(
        (
            "interval",
            f"compute x {low:.3f} to x {high:.3f}",
            f"the {INTERVAL_PERCENTILES[0]:g}th and {INTERVAL_PERCENTILES[1]:g}th percentiles of the run's "
            f"{len(asked.steps)} steady-state steps' compute over their mean",
        )
    )
    df.attrs.update(parameters=parameters, run=", ".join(map(str, asked.runs)), tokens=asked.spec.model["seq_len"] > 1)
    if asked.spec.backend == "ddp" and (asked.runs[0].job() or {}).get("data_parallel") == "local":
        df.attrs["notes"] = [*df.attrs.get("notes", []), BARE_MODEL_NOTE]
    return df


def run_spec(
    run,
    cluster: str | Cluster,
    gpus: Sequence[int] | str,
    backend: str | None = None,
    *,
    compute_ms: float | None = None,
    fsdp_units: int | None = None,
    same_device: bool = False,
    lr_rule: str | None = None,
    **kwargs,
) -> RunSpec:
    """The projection the run's job asks (module docstring): a `ProjectionSpec` of its layer table and its
    measured step (`compute.MeasuredRun`, which the compute stage puts on the target).

    run: its RunDir, or the RunDirs of one-worker runs of the job made at the same time, one per
    node (their compute under each other's load, and the wait for the slower one they measure:
    compute.compute_from_concurrent_runs; their steps pooled for the interval). gpus: GPU counts (a
    count up to a node's GPUs stays in one node). backend: ddp or fsdp (None: the run's own,
    `run_backend`). compute_ms, and the spec's mfu and precision: how the compute transfers to the target
    (module docstring). fsdp_units: blocks to split the model into where the run has no FSDP2 records.
    same_device: the cluster's workers are the run's own device (a minicluster of the machine it ran on), so
    its compute and jitter are taken as measured, whatever the cluster's device. lr_rule: how the job's
    learning rate follows the global batch (default the run's optim.lr_rule, else linear), for the time to
    accuracy of a run whose summary has a noise scale and epochs to target (scaling/projection/tta.py).
    kwargs are the spec's other fields (mfu, precision, bucket_cap_mb, reshard_after_forward, ...).
    """
    if backend is not None and backend not in BACKENDS:
        raise UsageError(f"a run's projection has backends {', '.join(BACKENDS)}, got {backend!r}")
    kwargs = {k: v for k, v in kwargs.items() if v is not None}  # None: not given (the CLI's unset options)
    if not isinstance(cluster, Cluster):
        cluster = load_cluster(cluster)
    concurrent = list(run) if isinstance(run, (list, tuple)) else [run]
    run = concurrent[0]
    recorded = (run.job() or {}).get("data_parallel") or "not recorded"
    backend_source = (
        f"given (the run's data_parallel: {recorded})" if backend else f"the run's data_parallel: {recorded}"
    )
    backend = backend or run_backend(run)
    try:
        summary = run.summary()
    except (OSError, ValueError):
        raise UsageError(f"{run}: no readable summary.json (give a finished run directory)") from None
    profile = _profile(run)
    workers = int(summary.get("num_workers") or 1)
    steps = pd.concat([_steps(r, workers) for r in concurrent], ignore_index=True)
    parameters = [("backend", backend, backend_source)]
    reduce_dtype = kwargs.get("fsdp_reduce_dtype") or summary.get("fsdp_reduce_dtype") or "fp32"
    table, units_source = run_layer_table(run, profile, backend, fsdp_units, DTYPE_BYTES.get(reduce_dtype, 4))
    parameters += _model_lines(table, profile, backend, units_source)
    on_target = same_device or _same_device((summary.get("hardware") or {}).get("gpu_name"), cluster.device)
    measured_only = compute_ms is None and kwargs.get("mfu") is None
    cluster, jitter_line = _jitter(steps, cluster, measured_only=measured_only, on_target=on_target)
    parameters.append(jitter_line)
    if backend == "fsdp":
        _fsdp_settings(kwargs, summary, profile, reduce_dtype, parameters)
    kwargs.setdefault("activation_checkpointing", "none")
    samples_to_target, rule_source = _samples_to_target(run, summary, lr_rule)
    if samples_to_target is not None:
        kwargs["samples_to_target"] = samples_to_target
    means = {k: float(steps[k].mean()) for k in ("data_s", "forward_s", "backward_compute_s", "optimizer_s")}
    measured = MeasuredRun(tuple(concurrent), summary, profile, means, len(steps), on_target, compute_ms)
    spread = tuple(
        float(np.percentile(steps["compute_s"], q)) / float(steps["compute_s"].mean()) for q in INTERVAL_PERCENTILES
    )
    spec = ProjectionSpec(
        table, cluster, workers=gpus, measured=measured, compute_spread=spread, backend=backend, **kwargs
    )
    return RunSpec(spec, parameters, steps, concurrent, rule_source)


def _model_lines(table: dict, profile: dict, backend: str, units_source: str) -> list[tuple[str, str, str]]:
    """The "set by" lines of the model a run's projection carries: its size, units and activations."""
    return [
        (
            "model size",
            f"{table['parameters']:,} parameters, {4 * table['parameters'] / 1e6:.1f} MB of fp32 gradients",
            "compute_profile.json parameters (trainable)",
        ),
        (
            "FSDP units" if backend == "fsdp" else "gradient tensors",
            units_source if backend == "fsdp" else f"{len(table['layers'])} of at most 1 MiB",
            "" if backend == "fsdp" else "the model size; DDP's bucket assignment over them (no per-parameter record)",
        ),
        (
            "activations",
            f"{float(profile.get('activation_elements') or 0):,.0f} elements per sample",
            "compute_profile.json activation_elements, at the compute precision's bytes",
        ),
    ]


def _jitter(steps: pd.DataFrame, cluster: Cluster, *, measured_only: bool, on_target: bool):
    """The cluster with the run's per-step spread of compute where it ran on the target's device (the wait
    for the slowest of n ranks), else the preset's; and its "set by" line. `measured_only`: the compute is
    the run's own (no --compute-ms or --mfu given)."""
    cv = float(steps["compute_s"].std() / steps["compute_s"].mean())
    if measured_only and on_target:
        line = (
            "step jitter (CV)",
            f"{100 * cv:.2f}%",
            f"the run's {len(steps)} steps' compute, std / mean: the wait for the slowest of n ranks",
        )
        return replace(cluster, step_jitter_cv=cv), line
    line = (
        "step jitter (CV)",
        f"{100 * cluster.step_jitter_cv:.2g}%",
        f"the preset {cluster.name}'s (the run's {100 * cv:.1f}% was measured on another device)",
    )
    return cluster, line


def _fsdp_settings(kwargs: dict, summary: dict, profile: dict, reduce_dtype: str, parameters: list) -> None:
    """FSDP2's settings the run ran with, into the spec's `kwargs` where not given: resharding after forward
    (the lab's config, else each unit's as recorded) and the gradients' reduce dtype."""
    reshard = summary.get("fsdp_reshard_after_forward")
    if "reshard_after_forward" not in kwargs:
        if reshard is not None:  # the lab's loop: its config's fsdp.reshard_after_forward
            kwargs["reshard_after_forward"] = "all" if reshard else "none"
        elif policy := reshard_policy(profile.get("sharded_units")):
            kwargs["reshard_after_forward"] = policy
            parameters.append(
                ("resharded after forward", policy, "compute_profile.json sharded_units, each unit's as FSDP2 ran it")
            )
    if "fsdp_reduce_dtype" not in kwargs and reduce_dtype in FSDP_DTYPES:
        kwargs["fsdp_reduce_dtype"] = reduce_dtype


def _config_rule(run) -> str | None:
    return (run.config.get("optim") or {}).get("lr_rule")


def _samples_to_target(run, summary: dict, lr_rule: str | None) -> tuple[SamplesToTarget | None, str]:
    """The samples-to-target model from the run's own noise scale and epochs to target (None without either),
    and where its learning-rate rule comes from. E0's interval: back to the evaluation before (the run's
    train.eval_every; a job without the lab's config: one epoch)."""
    batch = summary.get("global_batch") or (summary.get("num_workers") or 1) * (
        _profile(run).get("per_worker_batch") or 0
    )
    rule = "given" if lr_rule else ("the run's optim.lr_rule" if _config_rule(run) else "assumed (no config)")
    if not batch:
        return None, rule
    eval_every = (run.config.get("train") or {}).get("eval_every")
    return from_summary(summary, int(batch), lr_rule or _config_rule(run) or "linear", eval_every), rule


def from_summary(summary: Mapping, global_batch: int, lr_rule: str, eval_every: float | None) -> SamplesToTarget | None:
    """The model from a run's summary.json (its `noise_scale` with interval, its epochs to target), or None where
    either is missing. E0's interval: from the evaluation before the target to the one that reached it."""
    value = summary.get("noise_scale")
    epochs = summary.get("epochs_to_target_progress") or summary.get("epochs_to_target")
    if value is None or not epochs or not value > 0:
        return None
    low = summary.get("noise_scale_low")
    high = summary.get("noise_scale_high")
    noise = NoiseScale(
        float(value), max(0.0, float(low)) if low is not None else 0.0, float(high) if high is not None else math.inf
    )
    step = float(eval_every or 1.0)
    return SamplesToTarget(
        noise, int(global_batch), float(epochs), max(float(epochs) - step, 1e-9), float(epochs), lr_rule
    )


# A 1-worker run under Ray's `prepare_model` trains the bare model: DDP wraps it only at 2+ workers.
BARE_MODEL_NOTE = (
    "DDP's own work per step (its forward checks, gradient hooks and bucket copies) is not in this run: its "
    "1 worker trained the bare model. On a GPU that work runs on the host ahead of the device; on CPU nodes it "
    "lengthens the step. To measure it, wrap the model in DistributedDataParallel at one worker too "
    "(docs/own-job.md)"
)
