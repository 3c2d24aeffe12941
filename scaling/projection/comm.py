"""Each backend's communication in a projection: one small class per backend computing a row's step with
its collectives (`row(n_nodes, per_node, wait_s)` -> `CommTerms`), and the notes that say what it assumed.

- `DDPComm`: DDP's buckets, ready during backward and all-reduced in order (cost.overlap_schedule).
- `HorovodComm`: every gradient tensor handed to Horovod's cycles, negotiated, fused and all-reduced
  (cost.horovod_schedule).
- `FSDPComm`: FSDP's (or HSDP's) all-gathers, re-gathers and reduce-scatters per unit (cost.fsdp_schedule),
  with and without the reduce-scatters (the lab's A/B).

`plan_comm` is project.py's communication stage: the backend's class built once, its notes, and its terms
at every row (rows.py defines the figures made of them). Nothing here reads a file: the layer table, the
cluster and the gradients come in resolved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from scaling.errors import UsageError
from scaling.projection.buckets import Gradients
from scaling.projection.cluster import PRESET_DIR, Cluster
from scaling.projection.compute import StepCompute, StepPlan
from scaling.projection.cost import (
    ALLGATHER,
    Link,
    REDUCESCATTER,
    REGATHER,
    allreduce_s,
    fsdp_schedule,
    gather_s,
    horovod_schedule,
    hsdp_gather_s,
    hsdp_scatter_s,
    overlap_schedule,
    scatter_s,
)
from scaling.projection.layers import COMPRESSION_BYTES, MIB
from scaling.projection.memory import DTYPE_BYTES
from scaling.projection.spec import SHARDED

if TYPE_CHECKING:
    from scaling.projection.spec import Resolved

# A row's FSDP transfer times, one per kind of its schedule: forward's all-gathers alone in `allgather_s`
# (a run's records count its re-gathers in theirs too), backward's re-gathers, the reduce-scatters
FSDP_KINDS = (ALLGATHER, REGATHER, REDUCESCATTER)
FSDP_COLUMNS = tuple(f"{kind}_s" for kind in FSDP_KINDS)


@dataclass
class CommTerms:
    """One worker count's step with its communication, in rows.py's columns' terms."""

    step_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    interference_s: float
    busy_s: float  # time communicating (allreduce_s), the wait for the slowest rank included
    straggler_s: float
    exposed_s: float
    overhead_s: float  # what the lab's A/B measures: comm_overhead_pct's numerator
    num_buckets: int
    grad_bytes: float
    algorithm: str
    columns: dict = field(default_factory=dict)  # the backend's own columns (FSDP_COLUMNS)


class _AllReduceComm:
    """DDP and Horovod: whole gradients all-reduced while backward runs; a subclass schedules them."""

    def __init__(self, compute: StepCompute, cluster: Cluster, gradients: Gradients):
        self.compute, self.cluster, self.gradients = compute, cluster, gradients

    def cost(self, n_nodes: int, per_node: int) -> Callable[[float], float]:
        """An all-reduce's seconds for its bytes at this placement, on the cluster's algorithm and links."""
        c = self.cluster

        def cost(nbytes: float) -> float:
            return allreduce_s(
                nbytes, n_nodes, per_node, c.intra_node, c.inter_node, c.allreduce, c.collective_latency_s
            )

        return cost

    def schedule(self, n_nodes: int, per_node: int, wait_s: float):
        raise NotImplementedError

    def row(self, n_nodes: int, per_node: int, wait_s: float) -> CommTerms:
        c = self.compute
        n = n_nodes * per_node
        sched = self.schedule(n_nodes, per_node, wait_s) if n > 1 else None  # one worker: no all-reduce
        exposed = sched.exposed_s + wait_s if sched else 0.0
        interference = sched.interference_s if sched else 0.0
        busy = sched.busy_s + wait_s if sched else 0.0
        return CommTerms(
            step_s=c.step_s + interference + exposed,
            forward_s=c.forward_s,
            backward_s=c.backward_s + interference + exposed,
            optimizer_s=c.optimizer_s,
            interference_s=interference,
            busy_s=busy,
            straggler_s=wait_s,
            exposed_s=exposed,
            overhead_s=exposed + interference,
            num_buckets=len(sched.finish_s) if sched else 0,
            grad_bytes=sum(self.gradients.wire_bytes) if n > 1 else 0,
            algorithm=self.cluster.allreduce if n_nodes > 1 else "ring",
        )


class DDPComm(_AllReduceComm):
    """DDP: the buckets become ready during backward and are all-reduced in order, one at a time."""

    def schedule(self, n_nodes: int, per_node: int, wait_s: float):
        cost = self.cost(n_nodes, per_node)
        g = self.gradients
        return overlap_schedule(
            g.ready_fractions, [cost(b) for b in g.wire_bytes], self.compute.backward_s, self.cluster.overlap_slowdown
        )

    def notes(self, cluster_note: str) -> list[str]:
        g = self.gradients
        return [
            f"buckets: {len(g.elements)} ({g.bucket_note}); {g.on_wire()}; ready times {g.schedule_source}",
            cluster_note,
        ]


class HorovodComm(_AllReduceComm):
    """Horovod: every gradient tensor handed over when ready; its cycles negotiate, fuse and all-reduce them."""

    def __init__(
        self,
        compute: StepCompute,
        cluster: Cluster,
        gradients: Gradients,
        tensors: Sequence[tuple[int, float]],
        cycle_ms: float,
        fusion_mb: float,
    ):
        super().__init__(compute, cluster, gradients)
        self.tensors, self.cycle_ms, self.fusion_mb = tensors, cycle_ms, fusion_mb

    def schedule(self, n_nodes: int, per_node: int, wait_s: float):
        c = self.compute
        cost = self.cost(n_nodes, per_node)
        # negotiation: one latency-bound collective among all ranks per cycle; the cycle's phase
        # at backward's start follows from the rest of the step, the wait for the slower rank
        # included (that rank's gradients are the last a cycle waits for)
        return horovod_schedule(
            [f for _, f in self.tensors],
            [e * self.gradients.bytes_per_element for e, _ in self.tensors],
            c.backward_s,
            cost,
            self.cycle_ms / 1e3,
            self.fusion_mb * MIB,
            negotiation_s=cost(0.0),
            slowdown=self.cluster.overlap_slowdown,
            rest_of_step_s=c.data_s + c.forward_s + c.optimizer_s + wait_s,
        )

    def notes(self, cluster_note: str) -> list[str]:
        return [
            f"{self.gradients.on_wire()}; tensor ready times estimated from layer FLOPs",
            cluster_note,
            f"backend horovod: {len(self.tensors)} gradient tensors, cycle {self.cycle_ms:g} ms, fusion buffer "
            f"{self.fusion_mb:g} MiB, one latency-bound negotiation per cycle (no DDP buckets)",
        ]


class FSDPComm:
    """FSDP and HSDP: per unit, the all-gather before forward, the re-gather before backward of a unit
    resharded after forward, the reduce-scatter after backward (rows.py's module docstring)."""

    def __init__(self, plan: dict, compute: StepCompute, cluster: Cluster, backend: str, wait_given: bool):
        self.plan, self.compute, self.cluster, self.backend = plan, compute, cluster, backend
        self.wait_given = wait_given  # the caller's wait is per step: not spread over the collectives

    def row(self, n_nodes: int, per_node: int, wait_s: float) -> CommTerms:
        c = self.compute
        n = n_nodes * per_node
        r = fsdp_row(self.plan, c, self.cluster, self.backend, n_nodes, per_node)
        if self.plan["process_group"] == "gloo" and n > 1 and not self.wait_given:
            # every gloo collective holds both ranks' training threads: a barrier. The compute between
            # two of them diverges independently on each rank, so the wait for the slower rank is paid at
            # each of the step's K collectives; with the step's spread shared over K segments (sigma /
            # sqrt(K) each), K expected waits sum to sqrt(K) x the one a step measures
            wait_s *= math.sqrt(r["collectives"])
        wait = wait_s if n > 1 else 0.0
        optimizer = r["optimizer_s"]
        step = c.data_s + r["end_s"] + optimizer + wait
        # the phases as the lab records them: forward and backward with the time they waited on collectives
        forward = c.forward_s + r["forward_wait_s"]
        return CommTerms(
            step_s=step,
            forward_s=forward,
            backward_s=step - c.data_s - forward - optimizer,
            optimizer_s=optimizer,
            interference_s=0.0,
            busy_s=r["busy_s"] + wait,
            straggler_s=wait_s,
            exposed_s=r["exposed_s"] + wait,
            overhead_s=r["ab_s"],  # the no-sync half waits for the slower rank at its all-gathers too
            num_buckets=r["collectives"],
            grad_bytes=r["grad_bytes"] if n > 1 else 0,
            algorithm="hsdp" if self.backend == "hsdp" and n_nodes > 1 else "ring",
            columns={k: r[k] for k in FSDP_COLUMNS},
        )

    def notes(self, cluster_note: str) -> list[str]:
        notes = [cluster_note, *self.plan["notes"]]
        if self.cluster.overlap_slowdown:
            notes.append(
                f"note: the overlap slowdown ({self.cluster.overlap_slowdown:g}) is not applied to FSDP's "
                f"schedule (cost.py): its interference is 0 here"
            )
        return notes


def fsdp_plan(
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


def fsdp_row(plan: dict, compute: StepCompute, cluster: Cluster, backend: str, n_nodes: int, per_node: int) -> dict:
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
        **{f"{kind}_s": sched.seconds(kind) for kind in FSDP_KINDS},
        "collectives": len(sched.collectives) if n > 1 else 0,
        "grad_bytes": sum(plan["scatter_bytes"]),
        "forward_wait_s": sched.forward_waited_s if n > 1 else 0.0,
        "backward_wait_s": sched.waited_s - sched.forward_waited_s if n > 1 else 0.0,
    }


@dataclass
class CommPlan:
    """The communication stage's answer: each row's terms, the notes, the terms at the ends of the compute's
    spread (compute.StepPlan.ends), and, where a half-precision projection sent fp32 gradients by default, the
    last row's terms with half the bytes on the wire (rows.py's caveat)."""

    terms: list[CommTerms]
    notes: list[str]
    ends: list[list[CommTerms]] = field(default_factory=list)
    half_wire_last: CommTerms | None = None


def plan_comm(r: Resolved, step: StepPlan, gradients: Gradients) -> CommPlan:
    """The communication stage: the backend's class, its notes, and its terms at every row of the placements."""
    plans = (step, *step.ends)
    backends = [_backend(r, plan, gradients) for plan in plans]
    notes = [*gradients.notes, *backends[0].notes(cluster_note(r.cluster))]
    precision = step.compute.precision
    jobs = [(backend, r.rows_at, plan.waits) for backend, plan in zip(backends, plans)]
    if (
        precision in ("fp16", "bf16")
        and r.spec.backend not in SHARDED
        and not r.transformer
        and gradients.wire_assumed
        and gradients.grad_compression == "none"
        and any(n > 1 for n, _ in r.rows_at)
    ):
        # the same step with the gradients sent in half precision: what a model held in it would send
        wire = COMPRESSION_BYTES[precision]
        halved = replace(
            gradients,
            wire_bytes=[e * wire for e in gradients.elements],
            grad_compression=precision,
            bytes_per_element=wire,
        )
        jobs.append((_backend(r, step, halved), r.rows_at[-1:], step.waits[-1:]))
    terms = [[backend.row(*at, wait) for at, wait in zip(rows_at, waits)] for backend, rows_at, waits in jobs]
    half = terms.pop()[0] if len(terms) > len(plans) else None
    return CommPlan(terms[0], notes, terms[1:], half)


def _backend(r: Resolved, step: StepPlan, gradients: Gradients) -> DDPComm | HorovodComm | FSDPComm:
    """The backend's communication, handed what it needs resolved."""
    spec, compute = r.spec, step.compute  # `step`: the compute stage's plan, or one of its ends
    if spec.backend == "ddp":
        return DDPComm(compute, r.cluster, gradients)
    if spec.backend == "horovod":
        return HorovodComm(
            compute, r.cluster, gradients, gradients.tensors, spec.horovod_cycle_ms, spec.horovod_fusion_mb
        )
    plan = fsdp_plan(
        r.table,
        compute,
        r.cluster,
        spec.backend,
        r.checkpointing,
        spec.reshard_after_forward,
        spec.fsdp_reduce_dtype,
        spec.fsdp_param_dtype or compute.precision,
        spec.fsdp_process_group,
    )
    return FSDPComm(plan, compute, r.cluster, spec.backend, step.wait_given)


def cluster_note(cluster: Cluster) -> str:
    """The cluster's links and terms in one line, naming the file that sources each value."""
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


def describe_terms(cluster: Cluster) -> str:
    """The cluster's terms beyond alpha-beta, in one line."""
    return (
        f"collective latency {cluster.collective_latency_s * 1e6:.3g} us per all-reduce; backward slowed "
        f"{100 * cluster.overlap_slowdown:.3g}% while an all-reduce overlaps it; step jitter "
        f"{100 * cluster.step_jitter_cv:.3g}% (CV)"
        + (f"; {describe_link(cluster.allgather_link, 'all-gathers')}" if cluster.allgather_link else "")
    )


def describe_link(link: Link | None, nodes_label: str) -> str:
    if link is None:
        return f"{nodes_label}: none"
    label = f" ({link.name})" if link.name else ""
    return f"{nodes_label}{label}: {link.bandwidth_bytes_per_s / 1e9:.3g} GB/s effective, {link.latency_s * 1e6:.3g} us"
