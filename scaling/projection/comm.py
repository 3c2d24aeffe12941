"""Each backend's communication in a projection: one small class per backend computing a row's step with
its collectives (`row(n_nodes, per_node, wait_s)` -> `CommTerms`), and the notes that say what it assumed.

- `DDPComm`: DDP's buckets, ready during backward and all-reduced in order (cost.overlap_schedule).
- `HorovodComm`: every gradient tensor handed to Horovod's cycles, negotiated, fused and all-reduced
  (cost.horovod_schedule).
- `FSDPComm`: FSDP's (or HSDP's) all-gathers, re-gathers and reduce-scatters per unit (cost.fsdp_schedule),
  with and without the reduce-scatters (the lab's A/B).

project.py resolves the spec, the compute and the cluster once and hands them here; its module docstring
defines every figure. Nothing here reads a file: the layer table comes in loaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scaling.errors import UsageError
from scaling.projection.cluster import Cluster
from scaling.projection.compute import StepCompute
from scaling.projection.cost import (
    ALLGATHER,
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
from scaling.projection.layers import MIB
from scaling.projection.memory import DTYPE_BYTES

# A row's FSDP transfer times, one per kind of its schedule: forward's all-gathers alone in `allgather_s`
# (a run's records count its re-gathers in theirs too), backward's re-gathers, the reduce-scatters
FSDP_KINDS = (ALLGATHER, REGATHER, REDUCESCATTER)
FSDP_COLUMNS = tuple(f"{kind}_s" for kind in FSDP_KINDS)


@dataclass
class CommTerms:
    """One worker count's step with its communication, in project.py's columns' terms."""

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

    def on_wire(self) -> str:
        return (
            f"{sum(self.wire_bytes) / 1e6:.1f} MB of gradients per step on the wire "
            f"({'fp32' if self.grad_compression == 'none' else self.grad_compression})"
        )


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
    resharded after forward, the reduce-scatter after backward (project.py's module docstring)."""

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
