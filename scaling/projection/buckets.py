"""What an all-reducing backend (DDP, Horovod) sends per step, and when backward makes it ready: the model's
gradients as DDP buckets them, or as Horovod receives them tensor by tensor (project.py's gradients stage).

DDP's buckets (torch.nn.parallel.DistributedDataParallel, torch 2.x; checked against torch
2.13's `distributed.py` and the reducer's `compute_bucket_assignment_by_size`):

- `bucket_cap_mb` defaults to 25 MiB (`_DEFAULT_BUCKET_CAP_MB`, 1 MiB = 2**20 bytes); with the
  default, the first bucket is capped at `dist._DEFAULT_FIRST_BUCKET_BYTES` = 1 MiB, "such that
  their gradients don't spill into a much larger bucket, adding unnecessary latency after
  gradient computation finishes" (torch's comment).
- After the first iteration DDP rebuilds its buckets in the order the gradients actually
  became ready (roughly reverse parameter order). Tensors are added to the open bucket one by
  one; once its size reaches the current limit (>=), it is closed: a bucket can overshoot its
  cap by one tensor (ResNet-50's first bucket is fc's 8.2 MB, over the 1 MiB cap).
- Bucket sizes are in the parameters' dtype (fp32: 4 bytes per element, also under autocast,
  whose master weights and gradients stay fp32); a compression hook (fp16/bf16) halves the
  bytes on the wire but not the bucketing.

- A `bucket_cap_mb` given explicitly (the lab always passes `instrument.ddp_bucket_cap_mb`,
  25.0 by default) sets the first bucket's cap to the same value: no 1 MiB first bucket.

For ResNet-50 this gives 5 buckets with DDP's defaults, 8,196,000 / 31,502,336 / 28,356,608 /
26,288,128 / 7,885,056 bytes, and 4 with bucket_cap_mb=25 given, 30,257,056 / 27,291,648 /
27,330,560 / 17,348,864: exactly what DDP reports after its rebuild (held by
tests/test_projection.py against the sizes make_layer_tables.py recorded from DDP).

Ready time (estimate): backward runs the layers in the table's order, each taking time in
proportion to its backward FLOPs; a bucket is ready when backward has processed all its
parameters' layers: ready_k = t_backward x (backward FLOPs of the layers up to and including
the last layer holding a parameter of bucket k) / (all backward FLOPs). BatchNorm layers
count 0 FLOPs (FlopCounterMode counts matmuls and convolutions only), so their gradients are
ready when the layer before them in backward order is done. The last bucket holds the stem,
so it is ready when backward compute ends (fraction 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scaling.projection.layers import BYTES_PER_GRAD_ELEMENT, COMPRESSION_BYTES, MIB

if TYPE_CHECKING:  # the stage's input types; spec.py and compute.py do not import this module
    from scaling.projection.compute import StepPlan
    from scaling.projection.spec import Resolved

DEFAULT_BUCKET_CAP_MB = 25  # torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class Bucket:
    """One DDP gradient bucket: its elements, bytes (parameter dtype) and ready fraction of backward."""

    index: int
    elements: int
    bytes: int
    ready_fraction: float  # of backward compute time, in [0, 1]


def tensor_schedule(table: dict) -> list[tuple[int, float]]:
    """(elements, ready fraction of backward) per parameter tensor, in gradient-ready order."""
    total = sum(layer["backward_flops"] for layer in table["layers"])
    done = 0.0
    out = []
    for layer in table["layers"]:
        done += layer["backward_flops"]
        fraction = done / total if total else 1.0
        out.extend((int(numel), fraction) for _name, numel in layer["params"])
    return out


def assign_buckets(
    tensor_elements: list[int],
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_MB * MIB,
    first_bucket_bytes: int | None = DEFAULT_FIRST_BUCKET_BYTES,
    bytes_per_element: int = BYTES_PER_GRAD_ELEMENT,
) -> list[list[int]]:
    """Tensor indices per bucket, as DDP's `compute_bucket_assignment_by_size` forms them.

    Tensors are taken in the given (gradient-ready) order; the first bucket's limit is
    `first_bucket_bytes` (None: the same cap, as DDP does for a user-given bucket_cap_mb), the
    others' `bucket_cap_bytes`; a bucket closes once its size reaches its limit.
    """
    limits = [first_bucket_bytes if first_bucket_bytes is not None else bucket_cap_bytes]
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, numel in enumerate(tensor_elements):
        current.append(i)
        size += numel * bytes_per_element
        limit = limits[0] if not buckets else bucket_cap_bytes
        if size >= limit:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def model_buckets(
    table: dict,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
    first_bucket_bytes: int | None = DEFAULT_FIRST_BUCKET_BYTES,
) -> list[Bucket]:
    """The model's DDP buckets in all-reduce order, with their estimated ready fractions.

    `first_bucket_bytes=None` when bucket_cap_mb is set by the user (DDP then drops the 1 MiB
    first bucket); the default arguments are DDP's defaults.
    """
    schedule = tensor_schedule(table)
    elements = [numel for numel, _ in schedule]
    out = []
    for k, indices in enumerate(assign_buckets(elements, int(bucket_cap_mb * MIB), first_bucket_bytes)):
        n = sum(elements[i] for i in indices)
        out.append(
            Bucket(
                index=k,
                elements=n,
                bytes=n * BYTES_PER_GRAD_ELEMENT,
                ready_fraction=max(schedule[i][1] for i in indices),
            )
        )
    return out


@dataclass
class Gradients:
    """What an all-reducing backend sends per step: DDP's buckets (estimated or the run's measured)."""

    elements: list[int]
    ready_fractions: list[float]
    wire_bytes: list[float]  # each bucket's bytes on the wire, after any compression hook
    schedule_source: str  # where the ready times come from
    bucket_note: str  # how the buckets were assigned
    grad_compression: str
    bytes_per_element: int  # on the wire (layers.COMPRESSION_BYTES)
    tensors: list[tuple[int, float]] | None = None  # Horovod's: (elements, ready fraction) per gradient tensor
    bucket_cap_mb: float | None = None  # given to DDP (the spec's or the run's); None: DDP's defaults
    wire_assumed: bool = False  # fp32 on the wire by default, where the user's job decides it
    notes: list[str] = field(default_factory=list)

    def on_wire(self) -> str:
        return (
            f"{sum(self.wire_bytes) / 1e6:.1f} MB of gradients per step on the wire "
            f"({'fp32' if self.grad_compression == 'none' else self.grad_compression})"
        )


def gradients_of(r: Resolved, step: StepPlan) -> Gradients:
    """The gradients stage: DDP's buckets over the table's gradients (or the run's measured ones), their bytes on
    the wire, and for Horovod every tensor with its ready time."""
    spec, compute = r.spec, step.compute
    cap_from_run = spec.bucket_cap_mb is None and compute.bucket_cap_mb is not None
    cap = compute.bucket_cap_mb if cap_from_run else spec.bucket_cap_mb
    if cap is None:
        buckets = model_buckets(r.table)
        bucket_note = (
            f"DDP defaults: {DEFAULT_BUCKET_CAP_MB} MiB buckets, first {DEFAULT_FIRST_BUCKET_BYTES // 2**20} MiB"
        )
    else:
        buckets = model_buckets(r.table, bucket_cap_mb=cap, first_bucket_bytes=None)
        bucket_note = (
            f"bucket_cap_mb={cap:g}{' (the run config)' if cap_from_run else ''}, "
            f"given explicitly: DDP then has no 1 MiB first bucket"
        )
    elements = [bk.elements for bk in buckets]
    fractions = [bk.ready_fraction for bk in buckets]
    source = "estimated from layer FLOPs (backward in DDP's gradient order, time proportional to FLOPs)"
    from_run = spec.from_run
    run = from_run[0] if isinstance(from_run, (list, tuple)) else from_run  # whose records the schedule comes from
    if compute.measured_ready_fractions is not None:
        fractions = list(compute.measured_ready_fractions)
        elements = [nb // BYTES_PER_GRAD_ELEMENT for nb in compute.measured_bucket_bytes]
        source = f"measured (the run's {run.buckets_path.name}: median ready time per bucket)"
    elif run is not None:
        source += f"; the run has no per-bucket records ({run.steps_path.name} holds num_buckets only)"
    notes = []
    if compute.measured_num_buckets is not None and round(compute.measured_num_buckets) != len(elements):
        notes.append(
            f"note: the run all-reduced {compute.measured_num_buckets:g} buckets per step, "
            f"the estimate has {len(elements)}"
        )
    compression = spec.grad_compression or compute.grad_compression or "none"
    wire = COMPRESSION_BYTES[compression]
    return Gradients(
        elements,
        fractions,
        [e * wire for e in elements],
        source,
        bucket_note,
        compression,
        wire,
        tensors=tensor_schedule(r.table) if spec.backend == "horovod" else None,
        bucket_cap_mb=cap,
        # the wire's bytes a default took where the user's job decides them (rows.py's half-precision caveat)
        wire_assumed=spec.grad_compression is None and compute.grad_compression is None and spec.from_run is None,
        notes=notes,
    )
