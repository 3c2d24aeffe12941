"""Project synchronous data-parallel training (DDP) to more GPUs and nodes: step time,
time per epoch, throughput, speedup, communication overhead, scaling efficiency, and TTA.

    df = run_projection("resnet50", "p3.16xlarge", nodes=[1, 2, 4, 8, 16], per_gpu_batch=64, precision="fp32")

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
- TTA (only with an epochs-to-target table {global batch: epochs}, measured at smaller scale):
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
from dataclasses import replace
from pathlib import Path

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
from scaling.projection.compute import (
    StepCompute,
    compute_from_concurrent_runs,
    compute_from_device,
    compute_from_mfu,
    compute_from_run,
    jitter_straggler_s,
    run_model,
)
from scaling.projection.cost import (
    allreduce_s,
    fsdp_schedule,
    gather_s,
    horovod_schedule,
    hsdp_gather_s,
    hsdp_scatter_s,
    overlap_schedule,
    scatter_s,
)
from scaling.projection import tta
from scaling.projection.layers import (
    BYTES_PER_GRAD_ELEMENT,
    DEFAULT_BUCKET_CAP_MB,
    DEFAULT_FIRST_BUCKET_BYTES,
    MIB,
    load_layer_table,
    model_buckets,
    tensor_schedule,
)

COMPRESSION_BYTES = {"none": 4, "fp16": 2, "bf16": 2}  # bytes per gradient element on the wire
BACKENDS = ("ddp", "horovod", "fsdp", "hsdp")
SHARDED = ("fsdp", "hsdp")
# units resharded after forward: torchtitan's (every block but the last), FSDP2's default (every block),
# every block and the root (FSDP2 given reshard_after_forward=True explicitly for the root too), none
RESHARD = ("all-but-last", "all", "all-and-root", "none")
PROCESS_GROUPS = ("nccl", "gloo")  # how FSDP's collectives run (module docstring)
ACTIVATION_CHECKPOINTING = ("none", "selective", "full")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
TRANSFORMER_BATCH = 2  # sequences per GPU by default: torchtitan's local batch for Llama 3.1 8B
STATE_BYTES_PER_PARAMETER = 16  # fp32 parameter, fp32 gradient, AdamW's two fp32 moments
GIB = 2**30
# Horovod's defaults since 0.21 (its changelog: cycle time 5 -> 1 ms, fusion buffer 64 -> 128 MB)
HOROVOD_CYCLE_MS = 1.0
HOROVOD_FUSION_MB = 128.0  # MiB (HOROVOD_FUSION_THRESHOLD = 128 x 2**20 bytes)
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
FSDP_COLUMNS = ("allgather_s", "regather_s", "reducescatter_s")
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
# What a GPU holds beyond the tensors the model allocates (module docstring), each from its source:
# - the caching allocator's reserve: PyTorch's caching allocator keeps freed blocks and splits them, so what it
#   reserves exceeds what is allocated; GMLake (Guo et al., ASPLOS 2024, arXiv 2401.08156) measured 15% of the
#   reserved memory fragmented on average over eight LLMs' training on A100-80GB (up to 33%), the share its
#   stitching allocator recovers. reserved = allocated / (1 - 0.15).
ALLOCATOR_FRAGMENTATION = 0.15
# - the CUDA context with torch's kernels loaded: 666,632,192 bytes (pytorch/pytorch#86509, measured loading every
#   module; 287,047,680 with CUDA_MODULE_LOADING=LAZY, before a training step has loaded its kernels)
CUDA_CONTEXT_BYTES = 666_632_192
# - NCCL's buffers of one communicator (outside the caching allocator): NCCL_BUFFSIZE's default 4 MiB (NCCL's
#   environment-variable documentation) per channel and ring neighbour, 32 channels (NCCL_MAX_NCHANNELS' default)
#   x 2 neighbours: 256 MiB, an estimate (LL and LL128 buffers and proxy state not counted)
NCCL_BUFFER_BYTES = 32 * 2 * 4 * 2**20
RUNTIME_MEMORY_NOTE = (
    f"beyond the tensors (a GPU cluster): the caching allocator's reserve, allocated / (1 - "
    f"{ALLOCATOR_FRAGMENTATION:g}) (GMLake, ASPLOS 2024: 15% of reserved memory fragmented in LLM training); the "
    f"CUDA context, {CUDA_CONTEXT_BYTES / 2**30:.2f} GiB (pytorch/pytorch#86509); NCCL's buffers beyond one GPU, "
    f"{NCCL_BUFFER_BYTES / 2**30:.2f} GiB (32 channels x 2 neighbours x NCCL_BUFFSIZE's 4 MiB, an estimate); "
    f"memory_reserved_gib = the tensors and the reserve, what torch.cuda.max_memory_reserved and torchtitan's "
    f"logged memory measure; memory_gib adds the context and NCCL, what the GPU must hold"
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
    """'256:3,512:4' or {256: 3, 512: 4} -> {global batch: epochs to target}."""
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


def _resolve_compute(
    model: str,
    cluster: Cluster,
    per_gpu_batch: int | None,
    precision: str | None,
    from_run,
    samples_per_s: float | None,
    mfu: float | None = None,
    activation_checkpointing: str = "selective",
) -> tuple[StepCompute, list[str]]:
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
    elif load_layer_table(model).get("kind") == "transformer" and samples_per_s is None:
        compute = compute_from_mfu(
            cluster.device,
            model,
            precision or "bf16",
            per_gpu_batch or TRANSFORMER_BATCH,
            mfu,
            activation_checkpointing,
        )
        notes.append(
            f"compute: {compute.source}; split forward:backward by FLOPs with {activation_checkpointing} "
            f"activation checkpointing's recomputation in backward, data 0"
        )
    else:
        if mfu is not None:
            raise UsageError("give --mfu or --samples-per-s, not both")
        transformer = load_layer_table(model).get("kind") == "transformer"
        default_batch = TRANSFORMER_BATCH if transformer else 64
        compute = compute_from_device(
            cluster.device,
            model,
            precision or ("bf16" if transformer else "fp32"),
            per_gpu_batch or default_batch,
            samples_per_s,
        )
        notes.append(f"compute: {compute.source}; split forward:backward by FLOPs, optimizer memory-bound, data 0")
    return compute, notes


def run_projection(
    model: str,
    cluster: str | Path | Cluster,
    nodes: Sequence[int] | str | None = None,
    per_gpu_batch: int | None = None,
    precision: str | None = None,
    from_run=None,
    *,
    workers: Sequence[int] | str | None = None,
    samples_per_s: float | None = None,
    dataset_size: int | None = None,
    epochs_to_target: Mapping[int, float] | str | None = None,
    allreduce: str | None = None,
    grad_compression: str | None = None,
    bucket_cap_mb: float | None = None,
    straggler_s: float | None = None,
    backend: str = "ddp",
    horovod_cycle_time_ms: float | None = None,
    horovod_fusion_threshold_mb: float | None = None,
    overlap_slowdown: float | None = None,
    mfu: float | None = None,
    activation_checkpointing: str | None = None,
    reshard_after_forward: bool | str = "all-but-last",
    fsdp_reduce_dtype: str = "fp32",
    fsdp_param_dtype: str | None = None,
    fsdp_process_group: str = "nccl",
    compute: StepCompute | None = None,
    samples_to_target: tta.SamplesToTarget | None = None,
) -> pd.DataFrame:
    """One row per worker count (the 1-GPU baseline first); columns in `COLUMNS` (+ `TTA_COLUMNS`).

    model: a name with a layer table (`scaling.projection.layers.available_models()`), or a layer table
    itself (a dict of that shape: from_run.run_layer_table, a measured run's model).
    compute: one worker's step, given (from_run.project_run: a run's compute on the target), instead
    of from_run, samples_per_s or the device.
    cluster: a preset name, a cluster YAML path, or a `Cluster`.
    nodes: node counts (all GPUs of each node used); workers: worker counts instead (a count
    up to a node's GPUs stays in one node). per_gpu_batch: default the run's, else 64.
    precision: fp32 | amp (= fp16) | fp16 | bf16 (default the run's, else fp32).
    from_run: a run (its records' reader, scaling.results.RunDir) whose one-worker step times
    are the compute, or a list of one-worker runs made at the same time, one per future rank, which also give
    straggler_s (compute.compute_from_concurrent_runs); else the cluster device's published throughput,
    or `samples_per_s`. dataset_size: samples per epoch
    (default the run's, else the model's usual dataset). epochs_to_target: {global batch:
    epochs} measured at smaller scale, for TTA; samples_to_target: the noise-scale model of epochs to target
    beyond them (scaling/projection/tta.py). allreduce: ring | hierarchical (default the
    cluster's). grad_compression: none | fp16 | bf16 (DDP's compression hooks: 2 bytes per
    gradient element on the wire; default the run's, else none). bucket_cap_mb: given to DDP
    explicitly (first bucket = the same cap), default the run's `instrument.ddp_bucket_cap_mb`,
    else DDP's own default (no argument: 25 MiB, first bucket 1 MiB). The lab always passes it
    (25.0 by default), so projections from its runs have no 1 MiB first bucket.
    straggler_s: seconds per synchronous step spent waiting for the slowest rank (default: what
    concurrent runs measured, else the cluster's step jitter at each worker count), added to
    every multi-worker row's exposed communication.
    backend: "ddp" (buckets) or "horovod" (cycles and Tensor Fusion; `horovod_cycle_time_ms`,
    `horovod_fusion_threshold_mb` in MiB as the lab's `instrument.*` of the same names, default
    Horovod's current 1 ms and 128 MiB).
    overlap_slowdown: the interference term instead of the cluster's (e.g. what a multi-worker
    run measured: compute.measured_overlap_slowdown).
    backend "fsdp" or "hsdp" (a transformer: llama3-8b, gpt2-small, gpt2-medium, gpt2-tiny): FSDP's
    collectives per unit (module docstring). mfu: the compute rate of a transformer, its model
    FLOPs utilisation (default the device's published one, compute.TRANSFORMER_MFU).
    activation_checkpointing: none | selective | full (transformers; default selective,
    torchtitan's): the activations held and the recomputation in backward.
    reshard_after_forward: which blocks FSDP frees after forward and gathers again for backward:
    "all-but-last" (default, torchtitan's policy), "all" (FSDP2's default, `True`), "all-and-root"
    (the root too: FSDP2 given `reshard_after_forward=True` explicitly), "none" (`False`).
    fsdp_process_group: "nccl" (default; collectives beside compute) or "gloo" (CPUs: collectives
    hold compute; the reduce-scatter costs an all-reduce; backend fsdp only). fsdp_reduce_dtype: the gradients' dtype in
    the reduce-scatter (fp32, torchtitan's default, or bf16); fsdp_param_dtype: the parameters' in the all-gather and
    compute (default the compute precision). For transformers the per-GPU batch is in sequences (default 2) and the
    precision defaults to bf16.

    `df.attrs["notes"]` holds one line per assumption taken (compute source, bucket schedule,
    links), `df.attrs["caveats"]` the warnings to print (TTA extrapolation; at half precision, the job's
    assumptions a default took: _half_precision_caveats), `df.attrs["sharded"]`
    whether the backend shards the model (its collectives are all-gathers and reduce-scatters).
    """
    table = model if isinstance(model, dict) else load_layer_table(model)
    model = table["model"] if isinstance(model, dict) else model
    transformer = table.get("kind") == "transformer"
    if activation_checkpointing is None:
        activation_checkpointing = "selective" if transformer else "none"
    if activation_checkpointing not in ACTIVATION_CHECKPOINTING:
        raise UsageError(
            f"activation checkpointing must be one of {', '.join(ACTIVATION_CHECKPOINTING)}, "
            f"got {activation_checkpointing!r}"
        )
    if backend in SHARDED and not transformer:
        raise UsageError(
            f"backend {backend} needs a transformer's FSDP units; {model} has none "
            f"(transformers: {', '.join(m for m in available_transformers())})"
        )
    if fsdp_reduce_dtype not in ("fp32", "bf16"):
        raise UsageError(f"fsdp_reduce_dtype must be fp32 or bf16, got {fsdp_reduce_dtype!r}")
    if fsdp_process_group not in PROCESS_GROUPS:
        raise UsageError(f"fsdp_process_group must be one of {', '.join(PROCESS_GROUPS)}, got {fsdp_process_group!r}")
    if fsdp_process_group == "gloo" and backend != "fsdp":
        raise UsageError(f"fsdp_process_group gloo is modelled for backend fsdp only, not {backend}")
    if fsdp_param_dtype not in (None, "fp32", "bf16"):
        raise UsageError(f"fsdp_param_dtype must be fp32 or bf16, got {fsdp_param_dtype!r}")
    reshard_after_forward = (
        {True: "all", False: "none"}.get(reshard_after_forward, reshard_after_forward)
        if isinstance(reshard_after_forward, bool)
        else reshard_after_forward
    )
    if reshard_after_forward not in RESHARD:
        raise UsageError(
            f"reshard_after_forward must be one of {', '.join(RESHARD)} (or True / False), "
            f"got {reshard_after_forward!r}"
        )
    if not isinstance(cluster, Cluster):
        cluster = load_cluster(cluster)
    cluster = cluster.with_algorithm(allreduce)
    if overlap_slowdown is not None:
        if not (
            isinstance(overlap_slowdown, (int, float)) and math.isfinite(overlap_slowdown) and overlap_slowdown >= 0
        ):
            raise UsageError(f"overlap_slowdown must be a number >= 0, got {overlap_slowdown!r}")
        cluster = replace(cluster, overlap_slowdown=float(overlap_slowdown))
    if grad_compression is not None and grad_compression not in COMPRESSION_BYTES:
        raise UsageError(f"grad_compression must be one of {', '.join(COMPRESSION_BYTES)}, got {grad_compression!r}")
    rows_at = placements(nodes, workers, cluster.gpus_per_node)
    if any(n > 1 for n, _ in rows_at) and cluster.inter_node is None:
        raise UsageError(f"cluster {cluster.name} has no inter_node link; it cannot span more than one node")
    if compute is not None:
        compute, notes = compute.at_batch(per_gpu_batch), [f"compute: {compute.source}"]
    else:
        compute, notes = _resolve_compute(
            model, cluster, per_gpu_batch, precision, from_run, samples_per_s, mfu, activation_checkpointing
        )
    b = compute.per_worker_batch
    if backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    cycle_ms = HOROVOD_CYCLE_MS if horovod_cycle_time_ms is None else horovod_cycle_time_ms
    fusion_mb = HOROVOD_FUSION_MB if horovod_fusion_threshold_mb is None else horovod_fusion_threshold_mb
    if backend == "horovod" and not (
        isinstance(cycle_ms, (int, float)) and cycle_ms > 0 and isinstance(fusion_mb, (int, float)) and fusion_mb >= 0
    ):
        raise UsageError(
            f"Horovod cycle time must be > 0 ms and fusion threshold >= 0 MB, got {cycle_ms!r}, {fusion_mb!r}"
        )
    wait_given = straggler_s is not None  # as the caller says it, per step: not spread over collectives below
    if straggler_s is None and compute.straggler_ranks:
        straggler_s = compute.straggler_s
    elif straggler_s is not None and not (
        isinstance(straggler_s, (int, float)) and math.isfinite(straggler_s) and straggler_s >= 0
    ):
        raise UsageError(f"straggler_s must be a number >= 0, got {straggler_s!r}")
    if straggler_s:
        measured = (
            f"measured by {compute.straggler_ranks} concurrent 1-worker runs"
            if compute.straggler_ranks and straggler_s == compute.straggler_s
            else "given"
        )
        notes.append(
            f"straggler: {1e3 * straggler_s:.1f} ms per step at every worker count > 1 ({measured}): "
            f"the wait for the slowest rank, counted as exposed communication, as the lab measures it"
        )
    elif straggler_s is None and cluster.step_jitter_cv:
        notes.append(
            f"straggler: from the cluster's step jitter ({100 * cluster.step_jitter_cv:.3g}% of compute, "
            f"per rank and step), the expected wait for the slowest of n ranks, growing with n"
        )
    if (
        backend == "fsdp"
        and fsdp_process_group == "gloo"
        and not wait_given
        and (straggler_s or cluster.step_jitter_cv)
    ):
        notes.append("gloo: the wait for the slower rank paid at each collective, sqrt(K) x a step's for K of them")
    # the two assumptions a half-precision projection rests on that a user's job decides (_half_precision_caveats)
    wire_assumed = grad_compression is None and compute.grad_compression is None and from_run is None
    wait_assumed = straggler_s is None and from_run is None
    if grad_compression is None:
        grad_compression = compute.grad_compression or "none"
    cap_from_run = bucket_cap_mb is None and compute.bucket_cap_mb is not None
    if cap_from_run:
        bucket_cap_mb = compute.bucket_cap_mb

    if bucket_cap_mb is None:
        buckets = model_buckets(table)
        bucket_note = (
            f"DDP defaults: {DEFAULT_BUCKET_CAP_MB} MiB buckets, first {DEFAULT_FIRST_BUCKET_BYTES // 2**20} MiB"
        )
    else:
        if not (isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0):
            raise UsageError(f"bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        buckets = model_buckets(table, bucket_cap_mb=bucket_cap_mb, first_bucket_bytes=None)
        bucket_note = (
            f"bucket_cap_mb={bucket_cap_mb:g}{' (the run config)' if cap_from_run else ''}, "
            f"given explicitly: DDP then has no 1 MiB first bucket"
        )
    elements = [bk.elements for bk in buckets]
    fractions = [bk.ready_fraction for bk in buckets]
    schedule_source = "estimated from layer FLOPs (backward in DDP's gradient order, time proportional to FLOPs)"
    run = from_run[0] if isinstance(from_run, (list, tuple)) else from_run  # whose records the schedule comes from
    if compute.measured_ready_fractions is not None:
        fractions = list(compute.measured_ready_fractions)
        elements = [nb // BYTES_PER_GRAD_ELEMENT for nb in compute.measured_bucket_bytes]
        schedule_source = f"measured (the run's {run.buckets_path.name}: median ready time per bucket)"
    elif run is not None:
        schedule_source += f"; the run has no per-bucket records ({run.steps_path.name} holds num_buckets only)"
    if compute.measured_num_buckets is not None and round(compute.measured_num_buckets) != len(elements):
        notes.append(
            f"note: the run all-reduced {compute.measured_num_buckets:g} buckets per step, "
            f"the estimate has {len(elements)}"
        )
    wire = COMPRESSION_BYTES[grad_compression]
    wire_bytes = [e * wire for e in elements]
    on_wire = (
        f"{sum(wire_bytes) / 1e6:.1f} MB of gradients per step on the wire "
        f"({'fp32' if grad_compression == 'none' else grad_compression})"
    )
    if backend in SHARDED:
        pass
    elif backend == "ddp":
        notes.append(f"buckets: {len(elements)} ({bucket_note}); {on_wire}; ready times {schedule_source}")
    else:
        notes.append(f"{on_wire}; tensor ready times estimated from layer FLOPs")
    where = (
        f" (each value's source beside it in {cluster.source})"
        if cluster.source != cluster.name or (PRESET_DIR / f"{cluster.source}.yaml").is_file()
        else ""
    )
    notes.append(
        f"cluster {cluster.name}{where}: {cluster.gpus_per_node} GPU(s)/node, {cluster.allreduce} all-reduce; "
        + describe_link(cluster.intra_node, "intra-node")
        + "; "
        + describe_link(cluster.inter_node, "inter-node")
        + "; "
        + describe_terms(cluster)
    )
    tensors = tensor_schedule(table)
    if backend == "horovod":
        notes.append(
            f"backend horovod: {len(tensors)} gradient tensors, cycle {cycle_ms:g} ms, fusion buffer "
            f"{fusion_mb:g} MiB, one latency-bound negotiation per cycle (no DDP buckets)"
        )

    param_dtype = fsdp_param_dtype or compute.precision
    fsdp = (
        _fsdp_plan(
            table,
            compute,
            cluster,
            backend,
            activation_checkpointing,
            reshard_after_forward,
            fsdp_reduce_dtype,
            param_dtype,
            fsdp_process_group,
        )
        if backend in SHARDED
        else None
    )
    if fsdp is not None:
        notes.extend(fsdp["notes"])
        if cluster.overlap_slowdown:
            notes.append(
                f"note: the overlap slowdown ({cluster.overlap_slowdown:g}) is not applied to FSDP's "
                f"schedule (cost.py): its interference is 0 here"
            )

    samples_per_epoch = dataset_size or compute.samples_per_epoch or table["dataset_size"]
    if samples_per_epoch is None and transformer:
        notes.append("epoch: no dataset size for a transformer's table: no time per epoch (--dataset-size SEQUENCES)")
    elif not (isinstance(samples_per_epoch, int) and samples_per_epoch > 0):
        raise UsageError(f"dataset size must be a positive integer, got {samples_per_epoch!r}")
    else:
        source = (
            "given"
            if dataset_size
            else "the run's epochs"
            if compute.samples_per_epoch
            else f"{table['dataset']}, the usual dataset of {model}"
        )
        notes.append(f"epoch: {samples_per_epoch:,} {'sequences' if transformer else 'samples'} ({source})")
    capacity_gib = None
    if transformer:
        notes.append(_memory_note(backend, activation_checkpointing))
        capacity_gib = (load_devices().get(cluster.device) or {}).get("memory_GiB") if cluster.device else None

    rows = []
    for n_nodes, per_node in rows_at:
        n = n_nodes * per_node

        def cost(nbytes, n_nodes=n_nodes, per_node=per_node):
            return allreduce_s(
                nbytes,
                n_nodes,
                per_node,
                cluster.intra_node,
                cluster.inter_node,
                cluster.allreduce,
                cluster.collective_latency_s,
            )

        if n == 1:
            wait = 0.0
        elif straggler_s is not None:
            wait = straggler_s
        else:
            wait = jitter_straggler_s(
                compute.data_s + compute.forward_s + compute.backward_s, cluster.step_jitter_cv, n
            )
        sched = None
        fsdp_row = None
        if backend in SHARDED:
            fsdp_row = _fsdp_row(fsdp, compute, cluster, backend, n_nodes, per_node)
        elif n > 1 and backend == "ddp":
            sched = overlap_schedule(
                fractions, [cost(b) for b in wire_bytes], compute.backward_s, cluster.overlap_slowdown
            )
        elif n > 1:
            # negotiation: one latency-bound collective among all ranks per cycle; the cycle's phase
            # at backward's start follows from the rest of the step, the wait for the slower rank
            # included (that rank's gradients are the last a cycle waits for)
            sched = horovod_schedule(
                [f for _, f in tensors],
                [e * wire for e, _ in tensors],
                compute.backward_s,
                cost,
                cycle_ms / 1e3,
                fusion_mb * MIB,
                negotiation_s=cost(0.0),
                slowdown=cluster.overlap_slowdown,
                rest_of_step_s=compute.data_s + compute.forward_s + compute.optimizer_s + wait,
            )
        exposed = sched.exposed_s + wait if sched else 0.0
        interference = sched.interference_s if sched else 0.0
        busy = sched.busy_s + wait if sched else 0.0
        step = compute.step_s + interference + exposed
        optimizer = compute.optimizer_s
        extra = {}
        if fsdp_row is not None and fsdp["process_group"] == "gloo" and n > 1 and not wait_given:
            # every gloo collective holds both ranks' training threads: a barrier. The compute between
            # two of them diverges independently on each rank, so the wait for the slower rank is paid at
            # each of the step's K collectives; with the step's spread shared over K segments (sigma /
            # sqrt(K) each), K expected waits sum to sqrt(K) x the one a step measures
            wait *= math.sqrt(fsdp_row["collectives"])
        if fsdp_row is not None:
            optimizer = fsdp_row["optimizer_s"]
            exposed = fsdp_row["exposed_s"] + (wait if n > 1 else 0.0)
            busy = fsdp_row["busy_s"] + (wait if n > 1 else 0.0)
            step = compute.data_s + fsdp_row["end_s"] + optimizer + (wait if n > 1 else 0.0)
            ab_s = fsdp_row["ab_s"]  # the no-sync half waits for the slower rank at its all-gathers too
            extra = {k: fsdp_row[k] for k in FSDP_COLUMNS}
        if transformer:
            extra.update(
                _memory(
                    table,
                    compute,
                    backend,
                    n_nodes,
                    per_node,
                    activation_checkpointing,
                    reshard_after_forward,
                    fsdp_param_dtype or compute.precision,
                    gpu=capacity_gib is not None,
                )
            )
            extra["memory_capacity_gib"] = capacity_gib
            extra["fits"] = None if capacity_gib is None else bool(extra["memory_gib"] <= capacity_gib)
            extra["tokens_per_s_per_gpu"] = b * table["seq_len"] / step
        throughput = n * b / step
        steps_per_epoch = samples_per_epoch // (n * b) if samples_per_epoch else 0
        rows.append(
            {
                "num_nodes": n_nodes,
                "workers_per_node": per_node,
                "num_workers": n,
                "per_worker_batch": b,
                "global_batch": n * b,
                "data_s": compute.data_s,
                "forward_s": compute.forward_s,
                "backward_compute_s": compute.backward_s,
                "backward_s": compute.backward_s + interference + exposed,
                "optimizer_s": optimizer,
                "step_s": step,
                "interference_s": interference,
                "allreduce_s": busy,
                "allreduce_pct": 100 * busy / step,
                "straggler_s": wait,
                "exposed_comm_s": exposed,
                "exposed_comm_pct": 100 * exposed / step,
                "comm_overhead_pct": 100 * (ab_s if fsdp_row is not None else exposed + interference) / step,
                "throughput_samples_per_s": throughput,
                "steps_per_epoch": steps_per_epoch,
                "time_per_epoch_s": steps_per_epoch * step if steps_per_epoch else math.nan,
                "num_buckets": len(sched.finish_s) if sched else 0,
                "grad_bytes": sum(wire_bytes) if n > 1 else 0,
                "allreduce_algorithm": cluster.allreduce if n_nodes > 1 else "ring",
                "backend": backend,
                **extra,
            }
        )
        if fsdp_row is not None:
            rows[-1].update(
                num_buckets=fsdp_row["collectives"],
                grad_bytes=fsdp_row["grad_bytes"] if n > 1 else 0,
                allreduce_algorithm="hsdp" if backend == "hsdp" and n_nodes > 1 else "ring",
            )
        if fsdp_row is not None:
            # the phases as the lab records them: forward and backward with the time they waited on collectives
            rows[-1]["forward_s"] = compute.forward_s + fsdp_row["forward_wait_s"]
            rows[-1]["backward_s"] = step - compute.data_s - rows[-1]["forward_s"] - optimizer
    df = pd.DataFrame(rows)
    base = df.iloc[0]
    df["speedup_throughput"] = df["throughput_samples_per_s"] / base["throughput_samples_per_s"]
    df["efficiency_throughput"] = df["speedup_throughput"] / df["num_workers"]
    df["speedup_time_per_epoch"] = base["time_per_epoch_s"] / df["time_per_epoch_s"]
    if samples_per_epoch and (df["steps_per_epoch"] == 0).any():
        notes.append(
            f"note: at {int(df.loc[df['steps_per_epoch'] == 0, 'num_workers'].min())}+ workers the global "
            f"batch exceeds the {samples_per_epoch:,}-sample epoch (no whole step per epoch)"
        )
    columns = list(COLUMNS)
    if backend in SHARDED:
        columns += FSDP_COLUMNS
    if transformer:
        columns += TRANSFORMER_COLUMNS
    caveats = []
    table_e = parse_epochs_table(epochs_to_target)
    if table_e is not None or samples_to_target is not None:
        # each row's epochs from the measured points and the samples-to-target model (tta.py)
        caveats += tta.add_tta(df, table_e, samples_to_target, epochs_at)
        columns += TTA_COLUMNS + tta.MODEL_COLUMNS
        if table_e is not None:
            measured = ", ".join(f"{bb}: {e:g}" for bb, e in sorted(table_e.items()))
            notes.append(f"epochs to target measured at global batch {{{measured}}}")
        if samples_to_target is not None:
            notes.append(tta.describe(samples_to_target))
        if (df["epochs_extrapolated"] & ~df["epochs_source"].str.startswith("noise-scale")).any():
            caveats.append(TTA_CAVEAT)
    df = df[columns]
    if compute.precision in ("fp16", "bf16") and backend not in SHARDED and not transformer and len(df) > 1:
        caveats.extend(
            _half_precision_caveats(
                df,
                compute.precision,
                wire_assumed and grad_compression == "none",
                wait_assumed and bool(cluster.step_jitter_cv),
                cluster.step_jitter_cv,
                dict(
                    model=table,
                    cluster=cluster,
                    nodes=nodes,
                    per_gpu_batch=per_gpu_batch,
                    precision=precision,
                    workers=workers,
                    samples_per_s=samples_per_s,
                    dataset_size=dataset_size,
                    bucket_cap_mb=bucket_cap_mb,
                    straggler_s=straggler_s,
                    backend=backend,
                    horovod_cycle_time_ms=horovod_cycle_time_ms,
                    horovod_fusion_threshold_mb=horovod_fusion_threshold_mb,
                ),
            )
        )
    df.attrs.update(
        model=model,
        cluster=cluster.name,
        precision=compute.precision,
        per_gpu_batch=b,
        allreduce=cluster.allreduce,
        backend=backend,
        sharded=backend in SHARDED,
        notes=notes,
        caveats=caveats,
        schedule=schedule_source if backend not in SHARDED else "FSDP units from the layer table",
        activation_checkpointing=activation_checkpointing if transformer else None,
        seq_len=table.get("seq_len"),
    )
    return df


def _half_precision_caveats(
    df: pd.DataFrame, precision: str, wire_assumed: bool, wait_assumed: bool, jitter_cv: float, kwargs: dict
) -> list[str]:
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
    lines = []
    multi = df[df["num_workers"] > 1]
    if wire_assumed and (multi["num_nodes"] > 1).any():
        last = df.iloc[-1]
        alt = run_projection(**kwargs, grad_compression=precision).iloc[-1]
        lines.append(
            f"gradients all-reduced in fp32 ({last.grad_bytes / 1e6:.1f} MB per step), as PyTorch AMP keeps "
            f"them; a model held in {precision} (apex O2, model.half(): the DAWNBench entries) or a "
            f"compression hook sends half: --grad-compression {precision} (at {int(last.num_workers)} GPUs "
            f"{100 * alt.efficiency_throughput:.1f}% efficiency, not {100 * last.efficiency_throughput:.1f}%)"
        )
    if wait_assumed and not multi.empty:
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


def _fsdp_plan(
    table: dict,
    compute: StepCompute,
    cluster: Cluster,
    backend: str,
    checkpointing: str,
    reshard: str,
    reduce_dtype: str,
    param_dtype: str,
    process_group: str = "nccl",
) -> dict:
    """Per unit (root first): compute times, bytes gathered and reduced, reshard flags; the notes."""
    units = table["units"]
    forward_flops = sum(u["forward_flops"] for u in units)
    backward_flops = sum(u["backward_flops"] + u["recompute_flops"][checkpointing] for u in units)
    forward = [compute.forward_s * u["forward_flops"] / forward_flops for u in units]
    backward = [
        compute.backward_s * (u["backward_flops"] + u["recompute_flops"][checkpointing]) / backward_flops for u in units
    ]
    param_bytes = DTYPE_BYTES[param_dtype]
    gather_bytes = [u["params"] * param_bytes for u in units]
    scatter_bytes = [u["params"] * DTYPE_BYTES[reduce_dtype] for u in units]
    # the root is resharded only when asked explicitly (FSDP2 keeps it otherwise); torchtitan keeps the last
    # block too (its backward comes first)
    flags = [reshard == "all-and-root"] + [
        reshard in ("all", "all-and-root") or (reshard == "all-but-last" and i < len(units) - 2)
        for i in range(len(units) - 1)
    ]
    optimizer_s = compute.optimizer_s  # one GPU's step over every parameter; each GPU steps its shard
    optimizer_note = "the optimizer: the one-GPU step (compute, above) over the GPU's shard"
    resharded = sum(flags[1:])
    notes = [
        f"backend {backend}: {len(units)} units (the root{': ' if units[0].get('holds') else ''}"
        f"{', '.join(units[0].get('holds', []))}; {len(units) - 1} blocks "
        f"of {units[1]['params'] / 1e6:.3g}M parameters); all-gather in {param_dtype} "
        f"({sum(gather_bytes) / 1e9:.2f} GB per pass), reduce-scatter in {reduce_dtype} "
        f"({sum(scatter_bytes) / 1e9:.2f} GB); {resharded} blocks{' and the root' if flags[0] else ''} resharded "
        "after forward and gathered again for backward "
        f"({reshard}{': torchtitan' if reshard == 'all-but-last' else ''}); "
        + (
            "gloo: every collective holds compute (none overlaps it), a reduce-scatter costs an all-reduce of the "
            "buffer; "
            if process_group == "gloo"
            else "one unit prefetched; "
        )
        + (
            "sharded inside a node, replicated across nodes (reduce-scatter inside, all-reduce of the shards across)"
            if backend == "hsdp"
            else "sharded over every GPU"
        ),
        f"costs (cost.py, nccl-tests' definitions): all-gather and reduce-scatter (n-1)/n x S / bus bandwidth over the "
        f"slowest link in the ring, plus NCCL's latency per step and the collective latency; {optimizer_note}",
    ]
    return {
        "forward": forward,
        "backward": backward,
        "gather_bytes": gather_bytes,
        "scatter_bytes": scatter_bytes,
        "flags": flags,
        "optimizer_s": optimizer_s,
        "notes": notes,
        "process_group": process_group,
    }


def _fsdp_row(plan: dict, compute: StepCompute, cluster: Cluster, backend: str, n_nodes: int, per_node: int) -> dict:
    """One worker count's FSDP step: the schedule, with and without the reduce-scatters (the lab's A/B)."""
    n = n_nodes * per_node
    gather, scatter = (hsdp_gather_s, hsdp_scatter_s) if backend == "hsdp" else (gather_s, scatter_s)
    link = (n_nodes, per_node, cluster.intra_node, cluster.inter_node, cluster.collective_latency_s)
    if n > 1 and n_nodes > 1 and cluster.inter_node is None:
        raise UsageError(f"cluster {cluster.name} has no inter_node link; it cannot span more than one node")
    gloo = plan["process_group"] == "gloo"
    if gloo:  # gloo's reduce-scatter is an all-reduce of the buffer (cost.py)

        def scatter(nbytes, *link):
            return allreduce_s(
                nbytes,
                n_nodes,
                per_node,
                cluster.intra_node,
                cluster.inter_node,
                cluster.allreduce,
                cluster.collective_latency_s,
            )

    # an all-gather on its own fitted link where the cluster measured it apart from the all-reduce
    own = cluster.allgather_link
    gather_link = (n_nodes, per_node, own, own, cluster.collective_latency_s) if own else link
    g_cost = [gather(b, *gather_link) if n > 1 else 0.0 for b in plan["gather_bytes"]]
    s_cost = [scatter(b, *link) if n > 1 else 0.0 for b in plan["scatter_bytes"]]
    sched = fsdp_schedule(plan["forward"], plan["backward"], g_cost, s_cost, plan["flags"], synchronous=gloo)
    without = fsdp_schedule(
        plan["forward"], plan["backward"], g_cost, [0.0] * len(s_cost), plan["flags"], synchronous=gloo
    )
    shards = per_node if backend == "hsdp" else n
    return {
        "end_s": sched.end_s,
        "exposed_s": sched.exposed_s if n > 1 else 0.0,
        "busy_s": sched.busy_s if n > 1 else 0.0,
        "ab_s": max(0.0, sched.end_s - without.end_s) if n > 1 else 0.0,
        "optimizer_s": compute.optimizer_unsharded_s + (plan["optimizer_s"] - compute.optimizer_unsharded_s) / shards,
        "allgather_s": sched.seconds("all_gather"),
        "regather_s": sched.seconds("re_gather"),
        "reducescatter_s": sched.seconds("reduce_scatter"),
        "collectives": len(sched.collectives) if n > 1 else 0,
        "grad_bytes": sum(plan["scatter_bytes"]),
        "forward_wait_s": sched.forward_waited_s if n > 1 else 0.0,
        "backward_wait_s": sched.waited_s - sched.forward_waited_s if n > 1 else 0.0,
    }


def _memory(
    table: dict,
    compute: StepCompute,
    backend: str,
    n_nodes: int,
    per_node: int,
    checkpointing: str,
    reshard: str,
    param_dtype: str,
    gpu: bool = True,
) -> dict:
    """Memory per GPU (module docstring), in bytes."""
    n = n_nodes * per_node
    shards = n if backend == "fsdp" else per_node if backend == "hsdp" else 1
    units = table["units"]
    tokens = compute.per_worker_batch * table["seq_len"]
    states = STATE_BYTES_PER_PARAMETER * table["parameters"] / shards
    # the table's bytes are bf16 compute's: a block's activations scale with the compute precision (the
    # root's are mostly the loss's fp32 log-softmax, in fp32 either way)
    scale = DTYPE_BYTES[compute.precision] / 2
    blocks = units[1:]
    held = tokens * (
        units[0]["activation_bytes_per_token"][checkpointing]
        + scale * sum(u["activation_bytes_per_token"][checkpointing] for u in blocks)
    )
    # the largest transient: a checkpointed block's activations recomputed for its backward, or the
    # loss's gradient of the fp32 logits beside the saved log-softmax (4 bytes per vocabulary entry per token)
    recomputed = scale * max(
        (u["activation_bytes_per_token"]["none"] - u["activation_bytes_per_token"][checkpointing] for u in blocks),
        default=0.0,
    )
    transient = tokens * max(recomputed, 4.0 * table["num_classes"])
    buffers = 0.0
    if backend in SHARDED:
        param_bytes = DTYPE_BYTES[param_dtype]
        root, block = units[0]["params"], max((u["params"] for u in blocks), default=0)
        # gathered blocks: the one computing and the one prefetched, or, never resharded, every block to backward
        gathered = sum(u["params"] for u in blocks) if reshard == "none" else 2 * block
        buffers = 2 * param_bytes * root + param_bytes * gathered + 4 * max(root, block)
    allocated = states + held + transient + buffers
    out = {
        "memory_states_bytes": states,
        "memory_activations_bytes": held + transient,
        "memory_buffers_bytes": buffers,
        "memory_allocated_bytes": allocated,
    }
    return {**out, **_runtime_memory(allocated, gpu, n > 1)}


def _runtime_memory(allocated: float, gpu: bool, communicates: bool) -> dict:
    """What a GPU holds beyond the tensors (module docstring): the caching allocator's reserve over what it
    allocated, the CUDA context, NCCL's buffers; none of them without a GPU device (a fitted or CPU cluster)."""
    reserve = allocated * ALLOCATOR_FRAGMENTATION / (1 - ALLOCATOR_FRAGMENTATION) if gpu else 0.0
    runtime = (CUDA_CONTEXT_BYTES + (NCCL_BUFFER_BYTES if communicates else 0.0)) if gpu else 0.0
    total = allocated + reserve + runtime
    return {
        "memory_reserve_bytes": reserve,
        "memory_reserved_gib": (allocated + reserve) / GIB,
        "memory_runtime_bytes": runtime,
        "memory_bytes": total,
        "memory_gib": total / GIB,
    }


def _memory_note(backend: str, checkpointing: str) -> str:
    shard = {"fsdp": "over every GPU", "hsdp": "over a node's GPUs"}.get(backend, "not sharded (DDP: every GPU a copy)")
    return (
        f"memory per GPU: fp32 parameters, fp32 gradients and AdamW's two fp32 moments (16 bytes per parameter) "
        f"{shard}; activations under {checkpointing} activation checkpointing (the layer table, bf16) plus the "
        f"largest transient"
        + (
            "; FSDP's buffers: the root's bf16 parameters and gradients, two blocks' bf16 "
            "parameters, one unit's fp32 gradients"
            if backend in SHARDED
            else ""
        )
        + "; "
        + RUNTIME_MEMORY_NOTE
    )


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
