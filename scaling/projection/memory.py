"""Memory per GPU of a transformer's projection: the model's states, the activations held for backward and
the largest transient, FSDP's buffers, and on a GPU what the runtime holds beyond the tensors (the
caching allocator's reserve, the CUDA context, NCCL's buffers). rows.py's module docstring defines the
columns (`memory_*_bytes`, `memory_gib`); each term's source is beside its constant here. `plan_memory` is
project.py's memory stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scaling.devices import load_devices
from scaling.projection.compute import StepCompute, StepPlan
from scaling.projection.spec import SHARDED

if TYPE_CHECKING:
    from scaling.projection.spec import Resolved

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
STATE_BYTES_PER_PARAMETER = 16  # fp32 parameter, fp32 gradient, AdamW's two fp32 moments
GIB = 2**30
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


def memory(
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
    return {**out, **runtime_memory(allocated, gpu, n > 1)}


def runtime_memory(allocated: float, gpu: bool, communicates: bool) -> dict:
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


def memory_note(backend: str, checkpointing: str) -> str:
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


@dataclass
class MemoryPlan:
    """The memory stage's answer: per row, the memory columns (`memory`'s, the device's capacity, whether it
    fits); its note. Only a transformer's projection has them."""

    rows: list[dict]
    note: str


def plan_memory(r: Resolved, step: StepPlan) -> MemoryPlan | None:
    """The memory stage: each row's memory per GPU against the cluster device's capacity (None: not a
    transformer)."""
    if not r.transformer:
        return None
    spec, compute = r.spec, step.compute
    capacity = (load_devices().get(r.cluster.device) or {}).get("memory_GiB") if r.cluster.device else None
    param_dtype = spec.fsdp_param_dtype or compute.precision
    rows = []
    for n_nodes, per_node in r.rows_at:
        row = memory(
            r.table,
            compute,
            spec.backend,
            n_nodes,
            per_node,
            r.checkpointing,
            spec.reshard_after_forward,
            param_dtype,
            capacity is not None,
        )
        row["memory_capacity_gib"] = capacity
        row["fits"] = None if capacity is None else bool(row["memory_gib"] <= capacity)
        rows.append(row)
    return MemoryPlan(rows, memory_note(spec.backend, r.checkpointing))
