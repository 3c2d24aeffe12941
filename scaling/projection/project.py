"""Project synchronous data-parallel training (DDP) to more GPUs and nodes: step time,
time per epoch, throughput, speedup, communication overhead, scaling efficiency, and TTA.

    df = project(ProjectionSpec("resnet50", "p3.16xlarge", nodes=[1, 2, 4, 8, 16], per_gpu_batch=64))
    df = run_projection("resnet50", "p3.16xlarge", nodes=[1, 2, 4, 8, 16], per_gpu_batch=64)  # the same

What is asked is a `ProjectionSpec` (spec.py: each field's meaning and default); the layer table is loaded
once and handed down; each backend's communication is a class in comm.py, memory per GPU is memory.py.

The model, per worker count (weak scaling: the per-GPU batch is fixed, the global batch grows):

    step_s = data_s + forward_s + backward_compute_s + interference_s + exposed_comm_s + optimizer_s

- data, forward, backward compute, optimizer: one worker's, the same at every worker count
  (scaling/projection/compute.py: from a run or a published throughput).
- backend "ddp": the DDP buckets (scaling/projection/layers.py) become ready during backward
  and are all-reduced in order, one at a time, each at max(its ready time, the previous
  bucket's finish); backend "horovod": every gradient tensor is handed to Horovod when ready
  and its cycles negotiate, fuse and all-reduce them, in the steady state where each step's
  phase in the cycle follows from the step before (cost.horovod_schedule). Each all-reduce
  is costed with the cluster's algorithm, link latencies and bandwidths (transport efficiency
  included) and the fixed collective latency (scaling/projection/cost.py).
- backend "fsdp" (a transformer's layer table: its FSDP units, scaling/projection/cost.py
  `fsdp_schedule`): per unit, the all-gather before forward (the next unit's prefetched while
  this one computes), the re-gather before backward of a unit resharded after forward (every
  block but the last, torchtitan's default; the root only when asked), the reduce-scatter
  after backward; parameters gathered in the compute precision (bf16: 2 bytes), gradients
  reduced in fp32 (torchtitan's MixedPrecisionPolicy default; `fsdp_reduce_dtype`).
  `fsdp_process_group` "gloo" (FSDP2 on CPUs): every collective holds the training thread (no
  overlap, no prefetch ahead of compute) and a reduce-scatter costs a ring all-reduce of the
  buffer (gloo implements it so; cost.py); each collective is then a barrier, and the wait for
  the slower rank is paid at each of the step's K collectives: sqrt(K) x straggler_s (the step's
  spread shared over K independent segments). An all-gather runs on the cluster's
  `allgather_link` where all-gathers were measured apart, else on the all-reduce's links. Backend
  "hsdp": sharded inside a node, replicated across nodes (all-gather inside the node;
  reduce-scatter inside it, then an all-reduce of the shards across nodes). The optimizer steps
  its shard: 1/(GPUs sharding) of the one-GPU optimizer time, less what does not shrink with the
  shard (StepCompute.optimizer_unsharded_s: a small model's per-tensor launches). exposed_comm_s = the time compute
  waited on a collective (and for the last reduce-scatter); allreduce_s = time communicating (any
  collective in flight); comm_overhead_pct = what the lab's FSDP A/B measures: the step less the
  step without reduce-scatters (the all-gathers cannot be turned off), / step; the wait for the
  slower rank is in both halves (their all-gathers synchronise the ranks), so not in it. Columns allgather_s,
  regather_s, reducescatter_s: each kind's transfer time per step.
- memory (transformers; `memory_*_bytes`, `memory_gib` per GPU): parameters (fp32), gradients
  (fp32) and AdamW's two moments (fp32), 16 bytes per parameter, over the GPUs sharding them
  (FSDP: all; HSDP: a node's; DDP: 1); activations held for backward (the table's bytes per
  token under the activation checkpointing, x tokens per GPU) plus the largest transient (a
  checkpointed block's recomputed activations, or the loss's fp32 gradient of the logits);
  FSDP's buffers: the root's unsharded bf16 parameters and gradients (held from its forward to
  its reduce-scatter), two blocks' bf16 parameters (the one computing and the one prefetched;
  every block's when none is resharded) and one unit's fp32 gradients at its reduce-scatter. A
  block's activations in the table are bf16's; they double under fp32 compute. Those tensors are
  `memory_allocated_bytes`; on a GPU cluster the caching allocator reserves more than it allocates
  (`memory_reserve_bytes`: allocated x 0.15 / 0.85, GMLake's measured fragmentation; `memory_reserved_gib`,
  what torch.cuda.max_memory_reserved and torchtitan's logged memory measure), and the GPU also holds the
  CUDA context and NCCL's buffers (`memory_runtime_bytes`); `memory_gib` is all of it, each term's source
  at ALLOCATOR_FRAGMENTATION, CUDA_CONTEXT_BYTES, NCCL_BUFFER_BYTES. `fits`: whether `memory_gib` is within the
  cluster device's `memory_GiB` (scaling/devices.yaml; None where it gives none), `memory_capacity_gib`.
- tokens_per_s_per_gpu = per-GPU batch x sequence length / step_s (transformers).
- interference_s: how much longer backward compute takes because all-reduces overlap it
  (the cluster's overlap_slowdown; cost.overlap_schedule). 0 at one worker.
- exposed_comm_s = finish of the last all-reduce - end of (stretched) backward compute, >= 0,
  plus straggler_s. At one worker there is no all-reduce: exposed = 0.
- straggler_s: the wait for the slowest rank per synchronous step, mean over ranks: measured
  (concurrent one-worker runs, compute.py) or given; else from the cluster's step jitter,
  growing with the worker count (compute.jitter_straggler_s). The lab's per-rank exposed
  communication and A/B difference both contain it (a fast rank's all-reduce ends with the
  slow rank's), so it is part of exposed_comm_s here.

Three communication figures, the lab's three (scaling/analysis/run_metrics.py), never one number:
- allreduce_s / allreduce_pct: time communicating, an all-reduce in flight (from a bucket's
  hand-over, or a Horovod cycle's start, to its finish; union over the step) plus straggler_s
  (a fast rank spends the wait inside its all-reduce), as a share of the step: the DAWNBench
  analysis' "communication overhead" (Coleman et al. 2019), overlapped or not. Equally the
  share of an epoch (every step of an epoch is the same here).
- exposed_comm_s / exposed_comm_pct: the part backward did not hide.
- comm_overhead_pct: the A/B overhead, (t_sync - t_no_sync) / t_step = 100 x (exposed_comm_s
  + interference_s) / step_s: what communication costs the step, hidden or not.
- throughput_samples_per_s = num_workers x per-GPU batch / step_s;
  speedup_throughput = throughput(N) / throughput(1 GPU); efficiency_throughput = speedup / N.
- steps_per_epoch = floor(samples per epoch / global batch) (DistributedSampler with
  drop_last, as the lab); time_per_epoch_s = steps_per_epoch x step_s;
  speedup_time_per_epoch = time_per_epoch(1) / time_per_epoch(N).
- TTA (only with an epochs-to-target table {global batch: epochs}, measured at smaller scale, given
  as pairs or read from a sweep directory's runs: `scaling.results.SweepDir.epochs_to_target`):
  epochs_to_target at a row's global batch is interpolated linearly in log2(global batch)
  between measured points and, outside them, extrapolated along the last two points' slope
  (held constant with one point), never below the fewest measured epochs;
  tta_s = epochs_to_target x time_per_epoch_s; speedup_tta = tta(1) / tta(N). Rows beyond the
  measured batches carry epochs_extrapolated = True: large-batch training can need many more
  epochs (or fail to reach the target) beyond what was measured. With a measured noise scale
  (`samples_to_target`) rows beyond the measured batches follow the samples-to-target model
  instead, with intervals, and each row names its source (scaling/projection/tta.py).

Column names follow the lab's (docs/results.md, scaling/analysis/scaling_tables.py), so a
projection can be drawn over a sweep's measured table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pandas as pd

from scaling.devices import load_devices
from scaling.errors import UsageError
from scaling.projection.cluster import (
    PRESET_DIR,
    Cluster,
    cluster_from_alpha_beta,
    describe_link,
    describe_terms,
    load_cluster,
    normalize_precision,
)
from scaling.projection.comm import FSDP_COLUMNS, DDPComm, FSDPComm, Gradients, HorovodComm, fsdp_plan
from scaling.projection.compute import (
    StepCompute,
    compute_from_concurrent_runs,
    compute_from_device,
    compute_from_mfu,
    compute_from_run,
    jitter_straggler_s,
    run_model,
)
from scaling.projection import tta
from scaling.projection.layers import (
    BYTES_PER_GRAD_ELEMENT,
    COMPRESSION_BYTES,
    DEFAULT_BUCKET_CAP_MB,
    DEFAULT_FIRST_BUCKET_BYTES,
    load_layer_table,
    model_buckets,
    tensor_schedule,
)
from scaling.projection.memory import memory, memory_note
from scaling.projection.spec import ACTIVATION_CHECKPOINTING as ACTIVATION_CHECKPOINTING
from scaling.projection.spec import BACKENDS as BACKENDS
from scaling.projection.spec import DEFAULT_NODES as DEFAULT_NODES
from scaling.projection.spec import RESHARD as RESHARD
from scaling.projection.spec import SHARDED, ProjectionSpec

TRANSFORMER_BATCH = 2  # sequences per GPU by default: torchtitan's local batch for Llama 3.1 8B
TTA_CAVEAT = (
    "TTA beyond the measured global batches extrapolates epochs-to-target: large-batch training "
    "may need many more epochs, or not reach the target at all, beyond what was measured"
)
COLUMNS = (
    "num_nodes",
    "workers_per_node",
    "num_workers",
    "per_worker_batch",
    "global_batch",
    "data_s",
    "forward_s",
    "backward_compute_s",
    "backward_s",
    "optimizer_s",
    "step_s",
    "interference_s",
    "allreduce_s",
    "allreduce_pct",
    "straggler_s",
    "exposed_comm_s",
    "exposed_comm_pct",
    "comm_overhead_pct",
    "throughput_samples_per_s",
    "speedup_throughput",
    "efficiency_throughput",
    "steps_per_epoch",
    "time_per_epoch_s",
    "speedup_time_per_epoch",
    "num_buckets",
    "grad_bytes",
    "allreduce_algorithm",
    "backend",
)
TTA_COLUMNS = ("epochs_to_target", "epochs_extrapolated", "tta_s", "speedup_tta")
TRANSFORMER_COLUMNS = (
    "tokens_per_s_per_gpu",
    "memory_states_bytes",
    "memory_activations_bytes",
    "memory_buffers_bytes",
    "memory_allocated_bytes",
    "memory_reserve_bytes",
    "memory_reserved_gib",
    "memory_runtime_bytes",
    "memory_bytes",
    "memory_gib",
    "memory_capacity_gib",
    "fits",
)


def parse_int_list(text: str | Sequence[int], what: str) -> list[int]:
    """'1,2,4' or [1, 2, 4] -> [1, 2, 4]: positive integers, no repeats; UsageError otherwise."""
    if isinstance(text, str):
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise UsageError(f"{what} must be comma-separated positive integers, e.g. 1,2,4, got {text!r}") from None
    else:
        values = list(text)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise UsageError(f"{what} must be positive integers, got {values!r}")
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{what} must be positive integers, e.g. 1,2,4, got {text!r}")
    if len(set(values)) != len(values):
        raise UsageError(f"{what} repeats a value: {text!r}")
    return sorted(values)


def parse_epochs_table(text: str | Mapping | None) -> dict[int, float] | None:
    """'256:3,512:4' or {256: 3, 512: 4} (a sweep's: results.SweepDir.epochs_to_target) -> {global batch: epochs
    to target}."""
    if text is None:
        return None
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for part in str(text).split(","):
            batch, sep, epochs = part.partition(":")
            if not sep:
                raise UsageError(
                    f"--epochs-to-target takes GLOBAL_BATCH:EPOCHS pairs, e.g. 256:30,1024:32, got {text!r}"
                )
            items.append((batch.strip(), epochs.strip()))
    table = {}
    for batch, epochs in items:
        try:
            b, e = int(batch), float(epochs)
        except (TypeError, ValueError):
            raise UsageError(f"epochs-to-target: {batch!r}:{epochs!r} is not GLOBAL_BATCH:EPOCHS") from None
        if b < 1 or not (e > 0 and math.isfinite(e)):
            raise UsageError(f"epochs-to-target: batch must be >= 1 and epochs > 0, got {batch}:{epochs}")
        table[b] = e
    if not table:
        raise UsageError("epochs-to-target: empty table")
    return table


def epochs_at(table: Mapping[int, float], global_batch: int) -> tuple[float, bool]:
    """(epochs to target at `global_batch`, whether it was extrapolated); rule in the module docstring."""
    points = sorted((math.log2(b), e) for b, e in table.items())
    x = math.log2(global_batch)
    floor = min(e for _, e in points)
    if len(points) == 1:
        return points[0][1], global_batch != 2 ** points[0][0]
    if points[0][0] <= x <= points[-1][0]:
        for (x0, e0), (x1, e1) in zip(points, points[1:]):
            if x0 <= x <= x1:
                return (e0 + (e1 - e0) * (x - x0) / (x1 - x0) if x1 > x0 else e0), False
    (x0, e0), (x1, e1) = (points[-2], points[-1]) if x > points[-1][0] else (points[0], points[1])
    return max(floor, e0 + (e1 - e0) * (x - x0) / (x1 - x0)), True


def placements(nodes: Sequence[int] | None, workers: Sequence[int] | None, gpus_per_node: int) -> list[tuple[int, int]]:
    """(nodes, GPUs per node) per row: the 1-GPU baseline first, then full nodes or given worker counts."""
    points = {(1, 1)}
    if workers is not None:
        for w in parse_int_list(workers, "workers"):
            if w <= gpus_per_node:
                points.add((1, w))
            elif w % gpus_per_node == 0:
                points.add((w // gpus_per_node, gpus_per_node))
            else:
                raise UsageError(f"{w} workers do not fill whole nodes of {gpus_per_node} GPUs")
    if nodes is not None:
        for n in parse_int_list(nodes, "nodes"):
            points.add((n, gpus_per_node))
    if workers is None and nodes is None:
        raise UsageError("give the node counts (nodes) or worker counts (workers) to project")
    return sorted(points, key=lambda p: (p[0] * p[1], p[0]))


def _resolve_compute(spec: ProjectionSpec, table: dict, cluster: Cluster, checkpointing: str):
    """One worker's step and the note on where it comes from: a run, a transformer's MFU, or the device."""
    model, from_run, precision, per_gpu_batch = table["model"], spec.from_run, spec.precision, spec.per_gpu_batch
    notes = []
    runs = list(from_run) if isinstance(from_run, (list, tuple)) else None
    if runs is not None and len(runs) == 1:
        from_run, runs = runs[0], None
    transformer = table.get("kind") == "transformer"
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
    elif transformer and spec.samples_per_s is None:
        batch = per_gpu_batch or TRANSFORMER_BATCH
        compute = compute_from_mfu(cluster.device, table, precision or "bf16", batch, spec.mfu, checkpointing)
        notes.append(
            f"compute: {compute.source}; split forward:backward by FLOPs with {checkpointing} "
            f"activation checkpointing's recomputation in backward, data 0"
        )
    else:
        if spec.mfu is not None:
            raise UsageError("give --mfu or --samples-per-s, not both")
        default_batch = TRANSFORMER_BATCH if transformer else 64
        compute = compute_from_device(
            cluster.device,
            table,
            precision or ("bf16" if transformer else "fp32"),
            per_gpu_batch or default_batch,
            spec.samples_per_s,
        )
        notes.append(f"compute: {compute.source}; split forward:backward by FLOPs, optimizer memory-bound, data 0")
    return compute, notes


@dataclass
class _Setup:
    """What `project` resolves once from the spec and hands down: the layer table (loaded once), the
    cluster, the rows' placements, one worker's step, and the assumptions taken (with their notes)."""

    spec: ProjectionSpec
    table: dict
    model: str
    transformer: bool
    checkpointing: str
    cluster: Cluster
    rows_at: list[tuple[int, int]]
    compute: StepCompute
    notes: list[str]
    straggler_s: float | None = None
    wait_given: bool = False
    wire_assumed: bool = False
    wait_assumed: bool = False
    grad_compression: str = "none"
    bucket_cap_mb: float | None = None
    cap_from_run: bool = False
    samples_per_epoch: int | None = None
    capacity_gib: float | None = None
    schedule_source: str = ""  # where DDP's bucket ready times come from


def _setup(spec: ProjectionSpec) -> _Setup:
    """The spec resolved against its layer table, its cluster and its compute (checks needing them here)."""
    table = spec.model if isinstance(spec.model, dict) else load_layer_table(spec.model)
    model = table["model"] if isinstance(spec.model, dict) else spec.model
    transformer = table.get("kind") == "transformer"
    checkpointing = spec.activation_checkpointing or ("selective" if transformer else "none")
    if spec.backend in SHARDED and not transformer:
        raise UsageError(
            f"backend {spec.backend} needs a transformer's FSDP units; {model} has none "
            f"(transformers: {', '.join(m for m in available_transformers())})"
        )
    cluster = spec.cluster if isinstance(spec.cluster, Cluster) else load_cluster(spec.cluster)
    cluster = cluster.with_algorithm(spec.allreduce)
    if spec.overlap_slowdown is not None:
        cluster = replace(cluster, overlap_slowdown=float(spec.overlap_slowdown))
    rows_at = placements(spec.nodes, spec.workers, cluster.gpus_per_node)
    if any(n > 1 for n, _ in rows_at) and cluster.inter_node is None:
        raise UsageError(f"cluster {cluster.name} has no inter_node link; it cannot span more than one node")
    if spec.compute is not None:
        compute, notes = spec.compute.at_batch(spec.per_gpu_batch), [f"compute: {spec.compute.source}"]
    else:
        compute, notes = _resolve_compute(spec, table, cluster, checkpointing)
    s = _Setup(spec, table, model, transformer, checkpointing, cluster, rows_at, compute, notes)
    _straggler(s)
    # the two assumptions a half-precision projection rests on that a user's job decides (_half_precision_caveats)
    s.wire_assumed = spec.grad_compression is None and compute.grad_compression is None and spec.from_run is None
    s.wait_assumed = s.straggler_s is None and spec.from_run is None
    s.grad_compression = spec.grad_compression or compute.grad_compression or "none"
    s.cap_from_run = spec.bucket_cap_mb is None and compute.bucket_cap_mb is not None
    s.bucket_cap_mb = compute.bucket_cap_mb if s.cap_from_run else spec.bucket_cap_mb
    return s


def _straggler(s: _Setup) -> None:
    """The wait for the slowest rank: given, measured by concurrent runs, or from the cluster's jitter."""
    spec, compute, cluster = s.spec, s.compute, s.cluster
    s.wait_given = spec.straggler_s is not None  # as the caller says it, per step: not spread over collectives
    s.straggler_s = compute.straggler_s if spec.straggler_s is None and compute.straggler_ranks else spec.straggler_s
    if s.straggler_s:
        measured = (
            f"measured by {compute.straggler_ranks} concurrent 1-worker runs"
            if compute.straggler_ranks and s.straggler_s == compute.straggler_s
            else "given"
        )
        s.notes.append(
            f"straggler: {1e3 * s.straggler_s:.1f} ms per step at every worker count > 1 ({measured}): "
            f"the wait for the slowest rank, counted as exposed communication, as the lab measures it"
        )
    elif s.straggler_s is None and cluster.step_jitter_cv:
        s.notes.append(
            f"straggler: from the cluster's step jitter ({100 * cluster.step_jitter_cv:.3g}% of compute, "
            f"per rank and step), the expected wait for the slowest of n ranks, growing with n"
        )
    if (
        spec.backend == "fsdp"
        and spec.fsdp_process_group == "gloo"
        and not s.wait_given
        and (s.straggler_s or cluster.step_jitter_cv)
    ):
        s.notes.append("gloo: the wait for the slower rank paid at each collective, sqrt(K) x a step's for K of them")


def _gradients(s: _Setup) -> Gradients:
    """DDP's buckets over the table's gradients (or the run's measured ones) and their bytes on the wire."""
    compute, cap = s.compute, s.bucket_cap_mb
    if cap is None:
        buckets = model_buckets(s.table)
        bucket_note = (
            f"DDP defaults: {DEFAULT_BUCKET_CAP_MB} MiB buckets, first {DEFAULT_FIRST_BUCKET_BYTES // 2**20} MiB"
        )
    else:
        buckets = model_buckets(s.table, bucket_cap_mb=cap, first_bucket_bytes=None)
        bucket_note = (
            f"bucket_cap_mb={cap:g}{' (the run config)' if s.cap_from_run else ''}, "
            f"given explicitly: DDP then has no 1 MiB first bucket"
        )
    elements = [bk.elements for bk in buckets]
    fractions = [bk.ready_fraction for bk in buckets]
    source = "estimated from layer FLOPs (backward in DDP's gradient order, time proportional to FLOPs)"
    from_run = s.spec.from_run
    run = from_run[0] if isinstance(from_run, (list, tuple)) else from_run  # whose records the schedule comes from
    if compute.measured_ready_fractions is not None:
        fractions = list(compute.measured_ready_fractions)
        elements = [nb // BYTES_PER_GRAD_ELEMENT for nb in compute.measured_bucket_bytes]
        source = f"measured (the run's {run.buckets_path.name}: median ready time per bucket)"
    elif run is not None:
        source += f"; the run has no per-bucket records ({run.steps_path.name} holds num_buckets only)"
    if compute.measured_num_buckets is not None and round(compute.measured_num_buckets) != len(elements):
        s.notes.append(
            f"note: the run all-reduced {compute.measured_num_buckets:g} buckets per step, "
            f"the estimate has {len(elements)}"
        )
    wire = COMPRESSION_BYTES[s.grad_compression]
    s.schedule_source = source
    return Gradients(elements, fractions, [e * wire for e in elements], source, bucket_note, s.grad_compression, wire)


def _comm(s: _Setup, gradients: Gradients) -> DDPComm | HorovodComm | FSDPComm:
    """The backend's communication, handed what it needs resolved."""
    spec = s.spec
    if spec.backend == "ddp":
        return DDPComm(s.compute, s.cluster, gradients)
    if spec.backend == "horovod":
        tensors = tensor_schedule(s.table)
        return HorovodComm(s.compute, s.cluster, gradients, tensors, spec.horovod_cycle_ms, spec.horovod_fusion_mb)
    plan = fsdp_plan(
        s.table,
        s.compute,
        s.cluster,
        spec.backend,
        s.checkpointing,
        spec.reshard_after_forward,
        spec.fsdp_reduce_dtype,
        spec.fsdp_param_dtype or s.compute.precision,
        spec.fsdp_process_group,
    )
    return FSDPComm(plan, s.compute, s.cluster, spec.backend, s.wait_given)


def _cluster_note(cluster: Cluster) -> str:
    where = (
        f" (each value's source beside it in {cluster.source})"
        if cluster.source != cluster.name or (PRESET_DIR / f"{cluster.source}.yaml").is_file()
        else ""
    )
    return (
        f"cluster {cluster.name}{where}: {cluster.gpus_per_node} GPU(s)/node, {cluster.allreduce} all-reduce; "
        + describe_link(cluster.intra_node, "intra-node")
        + "; "
        + describe_link(cluster.inter_node, "inter-node")
        + "; "
        + describe_terms(cluster)
    )


def _epoch_and_memory(s: _Setup) -> None:
    """Samples per epoch (given, the run's, or the model's usual dataset) and the GPU's memory capacity."""
    spec, table, compute = s.spec, s.table, s.compute
    samples_per_epoch = spec.dataset_size or compute.samples_per_epoch or table["dataset_size"]
    if samples_per_epoch is None and s.transformer:
        s.notes.append("epoch: no dataset size for a transformer's table: no time per epoch (--dataset-size SEQUENCES)")
    elif not (isinstance(samples_per_epoch, int) and samples_per_epoch > 0):
        raise UsageError(f"dataset size must be a positive integer, got {samples_per_epoch!r}")
    else:
        source = (
            "given"
            if spec.dataset_size
            else "the run's epochs"
            if compute.samples_per_epoch
            else f"{table['dataset']}, the usual dataset of {s.model}"
        )
        s.notes.append(f"epoch: {samples_per_epoch:,} {'sequences' if s.transformer else 'samples'} ({source})")
    s.samples_per_epoch = samples_per_epoch
    if s.transformer:
        s.notes.append(memory_note(spec.backend, s.checkpointing))
        s.capacity_gib = (load_devices().get(s.cluster.device) or {}).get("memory_GiB") if s.cluster.device else None


def run_projection(*args, **kwargs) -> pd.DataFrame:
    """`project(ProjectionSpec(*args, **kwargs))`: the spec's fields as arguments, model, cluster, nodes,
    per_gpu_batch, precision and from_run by position (spec.py says what each is and its default)."""
    return project(ProjectionSpec(*args, **kwargs))


def project(spec: ProjectionSpec) -> pd.DataFrame:
    """One row per worker count (the 1-GPU baseline first); columns in `COLUMNS` (+ `TTA_COLUMNS`).

    `df.attrs["notes"]` holds one line per assumption taken (compute source, bucket schedule,
    links), `df.attrs["caveats"]` the warnings to print (TTA extrapolation; at half precision, the job's
    assumptions a default took: _half_precision_caveats), `df.attrs["sharded"]`
    whether the backend shards the model (its collectives are all-gathers and reduce-scatters).
    """
    s = _setup(spec)
    gradients = _gradients(s)
    comm = _comm(s, gradients)
    s.notes.extend(comm.notes(_cluster_note(s.cluster)))
    _epoch_and_memory(s)
    df = pd.DataFrame([_row(s, comm, n_nodes, per_node) for n_nodes, per_node in s.rows_at])
    return _finish(s, df)


def _row(s: _Setup, comm: DDPComm | HorovodComm | FSDPComm, n_nodes: int, per_node: int) -> dict:
    """One worker count's row: the backend's step with its communication, throughput, epoch, memory."""
    compute, cluster, b = s.compute, s.cluster, s.compute.per_worker_batch
    n = n_nodes * per_node
    if n == 1:
        wait = 0.0
    elif s.straggler_s is not None:
        wait = s.straggler_s
    else:
        wait = jitter_straggler_s(compute.data_s + compute.forward_s + compute.backward_s, cluster.step_jitter_cv, n)
    t = comm.row(n_nodes, per_node, wait)
    extra = dict(t.columns)
    if s.transformer:
        gpu = s.capacity_gib is not None
        param_dtype = s.spec.fsdp_param_dtype or compute.precision
        reshard = s.spec.reshard_after_forward
        extra.update(
            memory(s.table, compute, s.spec.backend, n_nodes, per_node, s.checkpointing, reshard, param_dtype, gpu)
        )
        extra["memory_capacity_gib"] = s.capacity_gib
        extra["fits"] = None if s.capacity_gib is None else bool(extra["memory_gib"] <= s.capacity_gib)
        extra["tokens_per_s_per_gpu"] = b * s.table["seq_len"] / t.step_s
    steps_per_epoch = s.samples_per_epoch // (n * b) if s.samples_per_epoch else 0
    return {
        "num_nodes": n_nodes,
        "workers_per_node": per_node,
        "num_workers": n,
        "per_worker_batch": b,
        "global_batch": n * b,
        "data_s": compute.data_s,
        "forward_s": t.forward_s,
        "backward_compute_s": compute.backward_s,
        "backward_s": t.backward_s,
        "optimizer_s": t.optimizer_s,
        "step_s": t.step_s,
        "interference_s": t.interference_s,
        "allreduce_s": t.busy_s,
        "allreduce_pct": 100 * t.busy_s / t.step_s,
        "straggler_s": t.straggler_s,
        "exposed_comm_s": t.exposed_s,
        "exposed_comm_pct": 100 * t.exposed_s / t.step_s,
        "comm_overhead_pct": 100 * t.overhead_s / t.step_s,
        "throughput_samples_per_s": n * b / t.step_s,
        "steps_per_epoch": steps_per_epoch,
        "time_per_epoch_s": steps_per_epoch * t.step_s if steps_per_epoch else math.nan,
        "num_buckets": t.num_buckets,
        "grad_bytes": t.grad_bytes,
        "allreduce_algorithm": t.algorithm,
        "backend": s.spec.backend,
        **extra,
    }


def _finish(s: _Setup, df: pd.DataFrame) -> pd.DataFrame:
    """The rows' speedups and efficiencies against the 1-GPU baseline, TTA, the columns, caveats, attrs."""
    spec, notes, backend = s.spec, s.notes, s.spec.backend
    base = df.iloc[0]
    df["speedup_throughput"] = df["throughput_samples_per_s"] / base["throughput_samples_per_s"]
    df["efficiency_throughput"] = df["speedup_throughput"] / df["num_workers"]
    df["speedup_time_per_epoch"] = base["time_per_epoch_s"] / df["time_per_epoch_s"]
    if s.samples_per_epoch and (df["steps_per_epoch"] == 0).any():
        notes.append(
            f"note: at {int(df.loc[df['steps_per_epoch'] == 0, 'num_workers'].min())}+ workers the global "
            f"batch exceeds the {s.samples_per_epoch:,}-sample epoch (no whole step per epoch)"
        )
    columns = list(COLUMNS)
    if backend in SHARDED:
        columns += FSDP_COLUMNS
    if s.transformer:
        columns += TRANSFORMER_COLUMNS
    caveats = []
    table_e = parse_epochs_table(spec.epochs_to_target)
    model = spec.samples_to_target
    if table_e is not None or model is not None:
        # each row's epochs from the measured points and the samples-to-target model (tta.py)
        caveats += tta.add_tta(df, table_e, model, epochs_at)
        columns += TTA_COLUMNS + tta.MODEL_COLUMNS
        if table_e is not None:
            measured = ", ".join(f"{bb}: {e:g}" for bb, e in sorted(table_e.items()))
            notes.append(f"epochs to target measured at global batch {{{measured}}}")
        if model is not None:
            notes.append(tta.describe(model))
        if (df["epochs_extrapolated"] & ~df["epochs_source"].str.startswith("noise-scale")).any():
            caveats.append(TTA_CAVEAT)
    df = df[columns]
    if s.compute.precision in ("fp16", "bf16") and backend not in SHARDED and not s.transformer and len(df) > 1:
        caveats.extend(_half_precision_caveats(df, s))
    df.attrs.update(
        model=s.model,
        cluster=s.cluster.name,
        precision=s.compute.precision,
        per_gpu_batch=s.compute.per_worker_batch,
        allreduce=s.cluster.allreduce,
        backend=backend,
        sharded=backend in SHARDED,
        notes=notes,
        caveats=caveats,
        schedule=s.schedule_source if backend not in SHARDED else "FSDP units from the layer table",
        activation_checkpointing=s.checkpointing if s.transformer else None,
        seq_len=s.table.get("seq_len"),
    )
    return df


def _half_precision_caveats(df: pd.DataFrame, s: _Setup) -> list[str]:
    """The lines that name the assumption to change where a half-precision projection of an image model
    rests on a default the user's job decides, not the cluster (docs/projection.md, the DAWNBench case).

    - Gradients on the wire: PyTorch AMP keeps fp32 parameters, so DDP and Horovod all-reduce 4-byte
      gradients, the default; a model held in half precision (apex O2, `model.half()`, the DAWNBench
      entries) or a compression hook sends 2 bytes. Across nodes on Ethernet this halves the transfer
      that sets the efficiency (16 x p3.16xlarge, ResNet-50, batch 64: 37.5% with 4 bytes, 61.9% with 2
      against 61.1% published), so the line gives the largest row's efficiency either way.
    - The wait for the slowest rank: the preset's step jitter, set on fp32. At half precision's
      throughput a host-bound input pipeline makes ranks wait longer, and a profiler counts that wait
      as NCCL kernel time (the DAWNBench analysis' 17.8% communicating inside an 8-V100 server, where the
      jitter alone gives about 5%): measured by concurrent one-worker runs, or given.
    """
    spec, precision, jitter_cv = s.spec, s.compute.precision, s.cluster.step_jitter_cv
    lines = []
    multi = df[df["num_workers"] > 1]
    if s.wire_assumed and s.grad_compression == "none" and (multi["num_nodes"] > 1).any():
        last = df.iloc[-1]
        # the same projection with 2-byte gradients, its compute resolved again (not the run's: none here)
        alt = project(
            ProjectionSpec(
                s.table,
                s.cluster,
                spec.nodes,
                spec.per_gpu_batch,
                spec.precision,
                workers=spec.workers,
                samples_per_s=spec.samples_per_s,
                dataset_size=spec.dataset_size,
                bucket_cap_mb=s.bucket_cap_mb,
                straggler_s=s.straggler_s,
                backend=spec.backend,
                horovod_cycle_time_ms=spec.horovod_cycle_time_ms,
                horovod_fusion_threshold_mb=spec.horovod_fusion_threshold_mb,
                grad_compression=precision,
            )
        ).iloc[-1]
        lines.append(
            f"gradients all-reduced in fp32 ({last.grad_bytes / 1e6:.1f} MB per step), as PyTorch AMP keeps "
            f"them; a model held in {precision} (apex O2, model.half(): the DAWNBench entries) or a "
            f"compression hook sends half: --grad-compression {precision} (at {int(last.num_workers)} GPUs "
            f"{100 * alt.efficiency_throughput:.1f}% efficiency, not {100 * last.efficiency_throughput:.1f}%)"
        )
    if s.wait_assumed and jitter_cv and not multi.empty:
        first = multi.iloc[0]
        lines.append(
            f"the wait for the slowest rank is the preset's {100 * jitter_cv:.3g}% step jitter "
            f"({1e3 * first.straggler_s:.1f} ms at {int(first.num_workers)} GPUs); a host-bound input "
            f"pipeline at {precision} throughput makes ranks wait longer, and a profiler counts it as time "
            f"communicating: measure it (--from-run with concurrent 1-worker runs) or give --straggler-ms"
        )
    return lines


def available_transformers() -> list[str]:
    """The models whose layer table holds FSDP units (backend fsdp or hsdp)."""
    from scaling.projection.layers import available_models

    return [m for m in available_models() if load_layer_table(m).get("kind") == "transformer"]


def project_cluster_from_alpha_beta(
    alpha_s: float,
    beta_bytes_per_s: float,
    nodes: Sequence[int] | str,
    gpus_per_node: int,
    model: str = "resnet50",
    per_gpu_batch: int | None = None,
    precision: str | None = None,
    from_run=None,
    device: str | None = None,
    **kwargs,
) -> pd.DataFrame:
    """`run_projection` on a cluster whose every link is a fitted alpha (s) and bandwidth
    (bytes/s), e.g. `fit_alpha_beta(...)` on the lab's all-reduce benchmark, flat ring.

    The compute comes from `from_run`, `samples_per_s=` (in kwargs), or `device`'s published
    throughput (a scaling/devices.yaml key, e.g. "V100 SXM2 16GB").
    """
    cluster = cluster_from_alpha_beta(alpha_s, beta_bytes_per_s, gpus_per_node=gpus_per_node, device=device)
    return run_projection(model, cluster, nodes, per_gpu_batch, precision, from_run, **kwargs)
