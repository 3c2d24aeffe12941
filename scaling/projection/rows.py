"""A projection's table: one row per worker count (the 1-GPU baseline first), its figures computed from the
stages' answers (compute.plan_compute, buckets.gradients_of, comm.plan_comm, memory.plan_memory) and each
defined here, where it is computed; time to accuracy last (tta.plan_tta).

The model, per worker count (weak scaling: the per-GPU batch is fixed, the global batch grows):

    step_s = data_s + forward_s + backward_compute_s + interference_s + exposed_comm_s + optimizer_s

- data, forward, backward compute, optimizer: one worker's, the same at every worker count
  (scaling/projection/compute.py: from a run or a published throughput).
- backend "ddp": the DDP buckets (scaling/projection/buckets.py) become ready during backward
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
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from scaling.errors import UsageError
from scaling.projection import tta
from scaling.projection.buckets import Gradients
from scaling.projection.comm import FSDP_COLUMNS, CommPlan
from scaling.projection.compute import StepPlan
from scaling.projection.memory import MemoryPlan
from scaling.projection.spec import SHARDED

if TYPE_CHECKING:
    from scaling.projection.spec import Resolved

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
# the figures a projection whose compute has a spread (a run's per-step, from_run.py) gives an interval
FIGURES = (
    "step_s",
    "throughput_samples_per_s",
    "allreduce_pct",
    "exposed_comm_pct",
    "comm_overhead_pct",
    "efficiency_throughput",
)
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


def table_of(
    r: Resolved, step: StepPlan, gradients: Gradients, comm: CommPlan, held: MemoryPlan | None
) -> pd.DataFrame:
    """One row per worker count; columns in `COLUMNS` (+ the backend's, a transformer's, `tta.TTA_COLUMNS`, and
    `<figure>_lo` / `_hi` for each of `FIGURES` where the spec gives its compute a spread).

    `df.attrs["notes"]` holds one line per assumption taken (compute source, bucket schedule, links), in the
    stages' order; `df.attrs["caveats"]` the warnings to print (TTA extrapolation; at half precision, the
    job's assumptions a default took: `_half_precision_caveats`); `df.attrs["sharded"]` whether the backend
    shards the model (its collectives are all-gathers and reduce-scatters).
    """
    spec, compute = r.spec, step.compute
    samples_per_epoch, epoch_note = _samples_per_epoch(r, compute)
    notes = [*step.notes, *comm.notes, *([epoch_note] if epoch_note else []), *([held.note] if held else [])]
    df = _frame(r, step, comm.terms, held, samples_per_epoch)
    if samples_per_epoch and (df["steps_per_epoch"] == 0).any():
        notes.append(
            f"note: at {int(df.loc[df['steps_per_epoch'] == 0, 'num_workers'].min())}+ workers the global "
            f"batch exceeds the {samples_per_epoch:,}-sample epoch (no whole step per epoch)"
        )
    columns = list(COLUMNS)
    if spec.backend in SHARDED:
        columns += FSDP_COLUMNS
    if r.transformer:
        columns += TRANSFORMER_COLUMNS
    half_precision = _half_precision_caveats(df, r, step, gradients, comm) if len(df) > 1 else []
    spread = _spread(r, step, comm, samples_per_epoch) if step.ends else {}
    # each row's epochs from the measured points and the samples-to-target model (tta.py)
    timed = tta.plan_tta(df, spec.epochs_to_target, spec.samples_to_target)
    df = df[columns + timed.columns]
    for name, values in spread.items():
        df[name] = values
    df.attrs.update(
        model=r.model,
        cluster=r.cluster.name,
        precision=compute.precision,
        per_gpu_batch=compute.per_worker_batch,
        allreduce=r.cluster.allreduce,
        backend=spec.backend,
        sharded=spec.backend in SHARDED,
        notes=notes + timed.notes,
        caveats=timed.caveats + half_precision,
        schedule=gradients.schedule_source if spec.backend not in SHARDED else "FSDP units from the layer table",
        activation_checkpointing=r.checkpointing if r.transformer else None,
        seq_len=r.table.get("seq_len"),
    )
    if step.parameters:  # a measured run's step on the target, part by part (from_run's table)
        df.attrs["compute_parameters"] = step.parameters
    if timed.model_text is not None:
        df.attrs["samples_to_target"] = timed.model_text
    return df


def _frame(
    r: Resolved, step: StepPlan, terms: list, held: MemoryPlan | None, samples_per_epoch: int | None
) -> pd.DataFrame:
    """The rows of one step plan: each worker count's figures, and the speedups against the first row."""
    spec, compute = r.spec, step.compute
    b = compute.per_worker_batch
    records = []
    for i, ((n_nodes, per_node), t) in enumerate(zip(r.rows_at, terms)):
        n = n_nodes * per_node
        extra = dict(t.columns)
        if held is not None:
            extra.update(held.rows[i])
            extra["tokens_per_s_per_gpu"] = b * r.table["seq_len"] / t.step_s
        steps_per_epoch = samples_per_epoch // (n * b) if samples_per_epoch else 0
        records.append(
            {
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
                "backend": spec.backend,
                **extra,
            }
        )
    df = pd.DataFrame(records)
    base = df.iloc[0]
    df["speedup_throughput"] = df["throughput_samples_per_s"] / base["throughput_samples_per_s"]
    df["efficiency_throughput"] = df["speedup_throughput"] / df["num_workers"]
    df["speedup_time_per_epoch"] = base["time_per_epoch_s"] / df["time_per_epoch_s"]
    df = pd.DataFrame(records)
    base = df.iloc[0]
    df["speedup_throughput"] = df["throughput_samples_per_s"] / base["throughput_samples_per_s"]
    df["efficiency_throughput"] = df["speedup_throughput"] / df["num_workers"]
    df["speedup_time_per_epoch"] = base["time_per_epoch_s"] / df["time_per_epoch_s"]
    return df


def _spread(r: Resolved, step: StepPlan, comm: CommPlan, samples_per_epoch: int | None) -> dict[str, np.ndarray]:
    """`<figure>_lo` and `_hi` of each of `FIGURES`: the lowest and highest over the rows at the ends of the
    compute's spread (and a transformer's tokens per second from the throughput's)."""
    frames = [_frame(r, end, terms, None, samples_per_epoch) for end, terms in zip(step.ends, comm.ends)]
    out = {}
    for figure in FIGURES:
        pair = np.vstack([frame[figure].to_numpy() for frame in frames])
        out[f"{figure}_lo"], out[f"{figure}_hi"] = pair.min(axis=0), pair.max(axis=0)
    if r.transformer:
        workers = frames[0]["num_workers"].to_numpy()
        for end in ("lo", "hi"):
            out[f"tokens_per_s_per_gpu_{end}"] = out[f"throughput_samples_per_s_{end}"] * r.table["seq_len"] / workers
    return out


def _samples_per_epoch(r: Resolved, compute) -> tuple[int | None, str | None]:
    """Samples per epoch (given, the run's, or the model's usual dataset) and the note saying which."""
    spec, table = r.spec, r.table
    samples = spec.dataset_size or compute.samples_per_epoch or table["dataset_size"]
    if samples is None and r.transformer:
        return None, "epoch: no dataset size for a transformer's table: no time per epoch (--dataset-size SEQUENCES)"
    if not (isinstance(samples, int) and samples > 0):
        raise UsageError(f"dataset size must be a positive integer, got {samples!r}")
    source = (
        "given"
        if spec.dataset_size
        else "the run's epochs"
        if compute.samples_per_epoch
        else f"{table['dataset']}, the usual dataset of {r.model}"
    )
    return samples, f"epoch: {samples:,} {'sequences' if r.transformer else 'samples'} ({source})"


def _half_precision_caveats(
    df: pd.DataFrame, r: Resolved, step: StepPlan, gradients: Gradients, comm: CommPlan
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
    precision, jitter_cv = step.compute.precision, r.cluster.step_jitter_cv
    if precision not in ("fp16", "bf16") or r.spec.backend in SHARDED or r.transformer:
        return []
    lines = []
    multi = df[df["num_workers"] > 1]
    if comm.half_wire_last is not None:
        last = df.iloc[-1]
        # the last row with 2-byte gradients on the wire (comm.plan_comm), against the same 1-GPU baseline
        half = comm.half_wire_last
        throughput = last.num_workers * last.per_worker_batch / half.step_s
        efficiency = throughput / df.iloc[0]["throughput_samples_per_s"] / last.num_workers
        lines.append(
            f"gradients all-reduced in fp32 ({last.grad_bytes / 1e6:.1f} MB per step), as PyTorch AMP keeps "
            f"them; a model held in {precision} (apex O2, model.half(): the DAWNBench entries) or a "
            f"compression hook sends half: --grad-compression {precision} (at {int(last.num_workers)} GPUs "
            f"{100 * efficiency:.1f}% efficiency, not {100 * last.efficiency_throughput:.1f}%)"
        )
    if step.wait_assumed and jitter_cv and not multi.empty:
        first = multi.iloc[0]
        lines.append(
            f"the wait for the slowest rank is the preset's {100 * jitter_cv:.3g}% step jitter "
            f"({1e3 * first.straggler_s:.1f} ms at {int(first.num_workers)} GPUs); a host-bound input "
            f"pipeline at {precision} throughput makes ranks wait longer, and a profiler counts it as time "
            f"communicating: measure it (--from-run with concurrent 1-worker runs) or give --straggler-ms"
        )
    return lines
