"""A model's gradient buckets and when backward makes each one ready: pure Python.

Layer tables (`scaling/projection/layers/<model>.json`, written by
`python -m scaling.projection.make_layer_tables`) hold, per leaf module with parameters and in
the order backward makes their gradients ready (measured from DDP), its forward and backward
FLOPs per sample and its parameter tensors. A transformer's table (`"kind": "transformer"`:
gpt2-tiny, gpt2-small, gpt2-medium, llama3-8b) also holds its FSDP `units`, per-token FLOPs, saved
activations and recomputation (make_layer_tables.py); its layers are in reverse forward order,
an estimate of the gradient order (DDP is not probed), and it has no recorded DDP bucket sizes.

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

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from scaling.errors import UsageError

LAYER_DIR = Path(__file__).resolve().parent / "layers"
MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25  # torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BYTES_PER_GRAD_ELEMENT = 4  # fp32 gradients (DDP buckets are in the parameters' dtype)
COMPRESSION_BYTES = {"none": 4, "fp16": 2, "bf16": 2}  # bytes per gradient element on the wire, by DDP hook
FSDP_DTYPES = ("fp32", "bf16")  # FSDP2 MixedPrecisionPolicy: the all-gather's and reduce-scatter's dtypes


@dataclass(frozen=True)
class Bucket:
    """One DDP gradient bucket: its elements, bytes (parameter dtype) and ready fraction of backward."""

    index: int
    elements: int
    bytes: int
    ready_fraction: float  # of backward compute time, in [0, 1]


def available_models() -> list[str]:
    return sorted(p.stem for p in LAYER_DIR.glob("*.json"))


@lru_cache(maxsize=None)
def load_layer_table(model: str) -> dict:
    """The layer table of `model` (a name from `available_models()`); UsageError if unknown."""
    path = LAYER_DIR / f"{model}.json"
    if not path.is_file():
        raise UsageError(f"no layer table for model {model!r}; known: {', '.join(available_models())}")
    return json.loads(path.read_text())


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
    model: str | dict,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
    first_bucket_bytes: int | None = DEFAULT_FIRST_BUCKET_BYTES,
) -> list[Bucket]:
    """The model's DDP buckets in all-reduce order, with their estimated ready fractions.

    `first_bucket_bytes=None` when bucket_cap_mb is set by the user (DDP then drops the 1 MiB
    first bucket); the default arguments are DDP's defaults.
    """
    table = load_layer_table(model) if isinstance(model, str) else model
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


def forward_share(model: str | dict) -> float:
    """Forward FLOPs / (forward + backward FLOPs): the share of compute taken by forward (~1/3)."""
    table = load_layer_table(model) if isinstance(model, str) else model
    fwd, bwd = table["forward_flops_per_sample"], table["backward_flops_per_sample"]
    return fwd / (fwd + bwd)
