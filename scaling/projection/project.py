"""Project synchronous data-parallel training (DDP, Horovod, FSDP, HSDP) to more GPUs and nodes: step time,
time per epoch, throughput, speedup, communication overhead, scaling efficiency, memory and TTA.

    df = project(ProjectionSpec("resnet50", "p3.16xlarge", nodes=[1, 2, 4, 8, 16], per_gpu_batch=64))
    df = run_projection("resnet50", "p3.16xlarge", nodes=[1, 2, 4, 8, 16], per_gpu_batch=64)  # the same

What is asked is a `ProjectionSpec` (spec.py: each field's meaning and default). `project` resolves its
names once (the layer table, the cluster, the rows' placements: `Resolved`) and hands them down a line of
stages, each in its own module, none calling back:

    compute.plan_compute   one worker's step, and the wait for the slowest rank at each row
    buckets.gradients_of   what an all-reducing backend sends per step, and when it is ready
    comm.plan_comm         the backend's collectives at each row (cost.py's alpha-beta costs)
    memory.plan_memory     memory per GPU at each row (a transformer's)
    rows.table_of          the table: every figure, defined in rows.py's module docstring; TTA (tta.py) last
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pandas as pd

from scaling.errors import UsageError
from scaling.projection.buckets import gradients_of
from scaling.projection.cluster import Cluster, cluster_from_alpha_beta, load_cluster, placements
from scaling.projection.comm import plan_comm
from scaling.projection.compute import plan_compute
from scaling.projection.layers import available_transformers, load_layer_table
from scaling.projection.memory import plan_memory
from scaling.projection.rows import table_of
from scaling.projection.spec import SHARDED, ProjectionSpec, Resolved


def project(spec: ProjectionSpec) -> pd.DataFrame:
    """One row per worker count (the 1-GPU baseline first): rows.table_of's columns and attrs."""
    r = _resolve(spec)
    step = plan_compute(r)
    gradients = gradients_of(r, step)
    comm = plan_comm(r, step, gradients)
    held = plan_memory(r, step)
    return table_of(r, step, gradients, comm, held)


def _resolve(spec: ProjectionSpec) -> Resolved:
    """The spec's names resolved once: its layer table, its cluster and the rows' placements (the checks that
    need them here)."""
    table = spec.model if isinstance(spec.model, dict) else load_layer_table(spec.model)
    model = table["model"] if isinstance(spec.model, dict) else spec.model
    transformer = table.get("kind") == "transformer"
    if spec.backend in SHARDED and not transformer:
        raise UsageError(
            f"backend {spec.backend} needs a transformer's FSDP units; {model} has none "
            f"(transformers: {', '.join(m for m in available_transformers())})"
        )
    cluster = spec.cluster if isinstance(spec.cluster, Cluster) else load_cluster(spec.cluster)
    cluster = cluster.with_algorithm(spec.allreduce)
    if spec.overlap_slowdown is not None:
        cluster = replace(cluster, overlap_slowdown=float(spec.overlap_slowdown))
    rows_at = placements(cluster, spec.nodes, spec.workers)
    checkpointing = spec.activation_checkpointing or ("selective" if transformer else "none")
    return Resolved(spec, table, model, transformer, checkpointing, cluster, rows_at)


def run_projection(*args, **kwargs) -> pd.DataFrame:
    """`project(ProjectionSpec(*args, **kwargs))`: the spec's fields as arguments, model, cluster, nodes,
    per_gpu_batch, precision and from_run by position (spec.py says what each is and its default)."""
    return project(ProjectionSpec(*args, **kwargs))


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
