"""The alpha-beta cost of an all-reduce, the bucket schedule that overlaps it with backward, and
a least-squares fit of alpha and beta to measured all-reduce times. Pure Python (numpy for the fit).

Notation: a link has a latency alpha (seconds per message step) and an effective bandwidth B
(bytes per second; 1/B is the classic beta, seconds per byte). S is the message in bytes.

- Ring all-reduce over n ranks (reduce-scatter then all-gather, 2(n-1) steps of S/n bytes):
      T_ring(S, n) = 2(n-1) alpha + 2(n-1)/n * S / B
  With B taken as the "bus bandwidth" of nccl-tests (busbw = S/T * 2(n-1)/n), this is exactly
  how nccl-tests defines it, so a measured busbw can be plugged in as B.
- Reduce-scatter (or all-gather) alone: T_rs(S, n) = (n-1) alpha + (n-1)/n * S / B.
- Flat ring over N nodes x g GPUs (n = N g): the ring crosses each node boundary once per
  ring, and every step moves S/n bytes over every edge in lock-step, so the slowest edge sets
  the bandwidth term: the inter-node link when N > 1 (B_inter), NVLink/PCIe when N = 1.
  B_inter is the node's network bandwidth: NCCL's several rings (channels) share the NIC.
  The latency term is NCCL's own ring model (src/graph/tuning.cc, `ncclTopoTuneModel`): of the
  2(n-1) steps, nInterSteps = 2(N-1) cross the network and pay alpha_inter, the other
  2(n-N) stay inside a node and pay alpha_intra:
      T_flat = 2(N-1) alpha_inter + 2(n-N) alpha_intra + 2(n-1)/n * S / B_inter
  (with one GPU per node every step is an inter-node step: 2(n-1) alpha_inter, as before).
- Every collective also pays a fixed `collective_latency_s` (NCCL's baseLat: launch and
  protocol set-up, 8.4 us for the Simple protocol's ring in tuning.cc), once per bucket: a model
  with many small buckets or fused buffers pays it many times.
- Hierarchical (2-level): reduce-scatter inside each node (each GPU then owns S/g summed over
  its node), g concurrent ring all-reduces of S/g across the N nodes (one per local rank;
  together they push S/N per step through the node's NIC), then all-gather inside the node:
      T_hier = 2 T_rs,intra(S, g) + 2(N-1) alpha_inter + 2(N-1)/N * S / B_inter
  It trades the flat ring's 2(Ng-1) inter-node latencies for 2(N-1), and sends 2(N-1)/N S
  per node over the network instead of 2(Ng-1)/(Ng) S.

Bucket schedule (DDP): buckets are all-reduced in bucket order, one at a time (one NCCL
stream), each as soon as it is ready and the previous one is done:
      start_k = max(ready_k, finish_{k-1}),  finish_k = start_k + T(S_k)
and exposed communication = max(0, finish_last - end of backward compute): the part backward
did not hide, which the step waits for (DDP's backward returns when every bucket is reduced).

Interference (`overlap_schedule`): while an all-reduce is in flight during backward, backward
compute runs slower, at 1 / (1 + slowdown) of its speed (Echo, Feng et al. 2024, "Echo:
Simulating Distributed Training At Scale", models this interference-induced computation
slowdown of overlapped compute and communication kernels; on GPUs NCCL's kernels take SMs and
memory bandwidth, on the lab's CPUs gloo's threads take cores). Ready times and the end of
backward compute stretch by it; the A/B overhead (t_sync - t_no_sync) is then
      exposed communication + (stretched backward - backward compute),
so it exceeds the exposed time by the stretch, as the lab measures (`interference_s`).
With slowdown = 0 the schedule is `schedule_buckets` exactly.

Horovod (`horovod_schedule`): no DDP buckets. Each gradient tensor is submitted when backward
produces it; Horovod's background thread wakes every `cycle_time_s`, negotiates which tensors
every rank has ready (one latency-bound round: `negotiation_s`), fuses them into buffers of at
most `fusion_bytes` (Horovod's Tensor Fusion: first tensors that fit, in order) and all-reduces
them one after the other; the next cycle starts `cycle_time_s` after the last one started, or
when its all-reduces are done, whichever is later (horovod/common/operations.cc `RunLoopOnce`).
Defaults differ by release: 5 ms and 64 MiB until 0.21, 1 ms and 128 MiB since (Horovod's
changelog, v0.21.0). The thread cycles all along, idle between steps too, so where a step's
backward starts in the cycle is set by the step before: `optimizer.synchronize()` returns when
a cycle's all-reduces finish, and the next backward starts `rest_of_step_s` later (optimizer,
the next step's data and forward). The schedule is the steady state of that: steps are chained
until the phase repeats. A step then lasts a whole number of cycles whenever its all-reduces
fit in a cycle (the training loop locks onto the cycle): with compute C per step and the last
cycle's negotiation and all-reduce c, the step is ceil((C + c) / cycle) cycles, not C plus a
fraction of a cycle (measured on this machine: bench/horovod_cycle_ground_truth.py).

FSDP (`fsdp_schedule`): each sharded unit (a transformer block; the root: embeddings, final
norm, output head) is all-gathered before its forward, all-gathered again before its backward
when it was resharded after forward, and its gradients reduce-scattered after its backward.
Costs by NCCL's definitions (nccl-tests' PERFORMANCE.md: all-gather and reduce-scatter move
(n-1)/n of the full buffer S through every rank, busbw = algbw (n-1)/n):
      T_ag(S, n) = T_rs(S, n) = (n-1)/n * S / B  +  latency
over a flat ring of N nodes x g GPUs with B the slowest edge (the node's network when N > 1,
NVLink inside one node) and NCCL's latency split: (N-1) network steps at alpha_inter and (n-N)
NVLink steps at alpha_intra, plus the collective latency once (`gather_s`, `scatter_s`).
HSDP (`hsdp_gather_s`, `hsdp_scatter_s`: shard inside a node, replicate across nodes): the
all-gather stays inside the node (over g); the reduce-scatter inside the node is followed by an
all-reduce of each GPU's shard across the N nodes, the node's g shards sharing its network:
      T_hsdp_rs = T_rs,intra(S, g) + 2(N-1) alpha_inter + 2(N-1)/N * S / B_inter
The schedule: collectives run one at a time in the order they are issued (one link, FIFO:
FSDP2's all-gather and reduce-scatter streams can overlap, but they share the link's bandwidth,
so the sum is the same); compute runs one unit at a time. Forward: the root and the first block
are gathered at once, and each next block's all-gather is issued when the block before it starts
computing (prefetch of one unit, FSDP2's default); a block computes once its all-gather is done
and the block before it has finished; the root's own compute (the head and the loss) comes last.
Backward: the root (not resharded: FSDP2 keeps the root unsharded after forward) computes
first, then the blocks in reverse; a resharded block's re-gather is issued when the block after
it (in forward order) starts its backward, and each block's reduce-scatter when its backward
ends; the root's reduce-scatter is issued when backward compute ends (the embedding's gradient
is the last). Exposed communication is the time compute waited on a collective (a unit waiting
for its gather) plus the wait after backward compute for the last reduce-scatter; time
communicating is the union of the intervals from each collective's issue to its finish.
A root resharded after forward (FSDP2 does it when `reshard_after_forward=True` is passed to the
root explicitly) is gathered again before its backward, the first backward
compute, so compute waits for it.
Synchronous collectives (`synchronous=True`: FSDP2 on CPU with gloo, which calls every
collective on the training thread, `async_op=False`, with no second stream to run it on): each
collective holds compute from its issue to its finish, nothing overlaps, and every unit's
all-gather is issued when compute reaches the unit (no prefetch ahead of compute). The step is
then compute plus every collective, and all of it is exposed. Gloo's reduce-scatter all-reduces
the whole buffer and keeps the rank's shard (torch's ProcessGroupGloo::reduce_scatter_tensor_coalesced;
timed here between two minicluster nodes: the same time as an all-reduce of the buffer at every
size), so it costs T_ring(S, n), twice a ring reduce-scatter's traffic (comm.py passes that cost).

Not modelled (each makes the projection optimistic): NCCL's lower bandwidth on small messages
(protocol switch-over, fewer channels); network congestion from other tenants; in FSDP, the
all-gather and reduce-scatter kernels' share of the SMs (the interference term is not applied to
FSDP's schedule) and the copy-in/copy-out of FSDP's flat buffers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scaling.errors import UsageError
from scaling.schema import REGATHER, SHARDED_KINDS

# An FSDP schedule's collective kinds, by the record schema's column stems (scaling/schema.py): forward's
# all-gathers, backward's re-gathers of resharded units, backward's reduce-scatters.
ALLGATHER, REDUCESCATTER = SHARDED_KINDS

ALGORITHMS = ("ring", "hierarchical")


@dataclass(frozen=True)
class Link:
    """A link class: effective bandwidth (bytes/s, the all-reduce bus bandwidth) and latency (s)."""

    bandwidth_bytes_per_s: float
    latency_s: float
    name: str = ""


def ring_allreduce_s(nbytes: float, n: int, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """2(n-1) alpha + 2(n-1)/n S/B; 0 for a single rank."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes / bandwidth_bytes_per_s


def reduce_scatter_s(nbytes: float, n: int, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """(n-1) alpha + (n-1)/n S/B (an all-gather costs the same); 0 for a single rank."""
    if n <= 1:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / n * nbytes / bandwidth_bytes_per_s


def _intra_link(intra: Link | None) -> Link:
    """The cluster's link inside a node, which a collective among a node's GPUs needs."""
    if intra is None:
        raise UsageError("the cluster has no intra_node link but a node holds more than one GPU")
    return intra


def _inter_link(inter: Link | None) -> Link:
    """The cluster's link between nodes, which a collective across nodes needs."""
    if inter is None:
        raise UsageError("the cluster has no inter_node link; it cannot span more than one node")
    return inter


def allreduce_s(
    nbytes: float,
    nodes: int,
    gpus_per_node: int,
    intra: Link | None,
    inter: Link | None,
    algorithm: str = "ring",
    collective_latency_s: float = 0.0,
) -> float:
    """Time of one all-reduce of `nbytes` over `nodes` x `gpus_per_node` ranks (definitions: module docstring)."""
    n = nodes * gpus_per_node
    if n <= 1:
        return 0.0
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown all-reduce algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")
    if nodes == 1:
        intra = _intra_link(intra)
        return collective_latency_s + ring_allreduce_s(nbytes, n, intra.latency_s, intra.bandwidth_bytes_per_s)
    inter = _inter_link(inter)
    if gpus_per_node == 1:
        return collective_latency_s + ring_allreduce_s(nbytes, n, inter.latency_s, inter.bandwidth_bytes_per_s)
    intra = _intra_link(intra)
    if algorithm == "ring":
        inter_steps, intra_steps = 2 * (nodes - 1), 2 * (n - nodes)
        latency = inter_steps * inter.latency_s + intra_steps * intra.latency_s
        return collective_latency_s + latency + 2 * (n - 1) / n * nbytes / inter.bandwidth_bytes_per_s
    inside = 2 * reduce_scatter_s(nbytes, gpus_per_node, intra.latency_s, intra.bandwidth_bytes_per_s)
    return collective_latency_s + inside + ring_allreduce_s(nbytes, nodes, inter.latency_s, inter.bandwidth_bytes_per_s)


def interval_union_s(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by (start, end) intervals, overlaps counted once."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@dataclass(frozen=True)
class Schedule:
    """When each collective ran, relative to the start of backward.

    `ready_s`: when its gradients were handed over (DDP: the bucket's ready time; Horovod: the
    cycle that launched the fused buffer); `start_s`/`finish_s`: when the all-reduce ran;
    `backward_s`: when backward compute ended (stretched by interference, see the module
    docstring); `compute_backward_s`: backward compute alone, with no communication.
    """

    start_s: tuple[float, ...]
    finish_s: tuple[float, ...]
    backward_s: float
    ready_s: tuple[float, ...] = ()
    compute_backward_s: float | None = None

    @property
    def exposed_s(self) -> float:
        """Communication not hidden behind backward compute: last finish - end of backward, >= 0."""
        return max(0.0, self.finish_s[-1] - self.backward_s) if self.finish_s else 0.0

    @property
    def busy_s(self) -> float:
        """Time communicating: the union of the intervals from hand-over to finish (an all-reduce
        queued behind another counts from its hand-over, as the lab's `allreduce_s` does)."""
        starts = self.ready_s or self.start_s
        return interval_union_s(list(zip(starts, self.finish_s)))

    @property
    def interference_s(self) -> float:
        """How much longer backward compute took because communication overlapped it."""
        base = self.backward_s if self.compute_backward_s is None else self.compute_backward_s
        return max(0.0, self.backward_s - base)


def schedule_buckets(ready_s: Sequence[float], cost_s: Sequence[float], backward_s: float) -> Schedule:
    """All-reduce the buckets in order, one at a time: start_k = max(ready_k, finish_{k-1})."""
    if len(ready_s) != len(cost_s):
        raise ValueError("one ready time per bucket cost")
    starts, finishes = [], []
    finish = 0.0
    for ready, cost in zip(ready_s, cost_s):
        start = max(ready, finish)
        finish = start + cost
        starts.append(start)
        finishes.append(finish)
    return Schedule(tuple(starts), tuple(finishes), backward_s, ready_s=tuple(ready_s), compute_backward_s=backward_s)


def _time_at_work(work_s: float, busy: Sequence[tuple[float, float]], slowdown: float) -> float:
    """When backward has done `work_s` seconds of its compute, running at 1/(1 + slowdown) of its
    speed inside the `busy` intervals (all-reduces in flight, one at a time, in time order)."""
    t, done = 0.0, 0.0
    for start, end in busy:
        if start > t:
            free = start - t
            if done + free >= work_s:
                return t + (work_s - done)
            done, t = done + free, start
        if end > t:
            slow = (end - t) / (1.0 + slowdown)
            if done + slow >= work_s:
                return t + (work_s - done) * (1.0 + slowdown)
            done, t = done + slow, end
    return t + (work_s - done)


def overlap_schedule(
    ready_fractions: Sequence[float], cost_s: Sequence[float], backward_s: float, slowdown: float = 0.0
) -> Schedule:
    """DDP's bucket schedule with compute interference: start_k = max(ready_k, finish_{k-1}),
    where ready_k is when backward has done ready_fraction_k of its compute, slowed by
    `slowdown` while an all-reduce is in flight (module docstring). slowdown = 0 gives
    `schedule_buckets` with ready_k = fraction_k x backward_s.
    """
    if len(ready_fractions) != len(cost_s):
        raise ValueError("one ready fraction per bucket cost")
    busy: list[tuple[float, float]] = []
    readies, starts, finishes = [], [], []
    finish = 0.0
    for fraction, cost in zip(ready_fractions, cost_s):
        ready = _time_at_work(fraction * backward_s, busy, slowdown)
        start = max(ready, finish)
        finish = start + cost
        busy.append((start, finish))
        readies.append(ready)
        starts.append(start)
        finishes.append(finish)
    end = _time_at_work(backward_s, busy, slowdown)
    return Schedule(tuple(starts), tuple(finishes), end, ready_s=tuple(readies), compute_backward_s=backward_s)


def fuse(tensor_bytes: Sequence[float], fusion_bytes: float) -> list[float]:
    """Horovod's Tensor Fusion of the tensors ready in one cycle, in order: a buffer takes tensors
    while they fit in `fusion_bytes`; a tensor larger than the buffer goes alone (0 disables fusion)."""
    buffers: list[float] = []
    current = 0.0
    for nbytes in tensor_bytes:
        if current and current + nbytes > fusion_bytes:
            buffers.append(current)
            current = 0.0
        current += nbytes
        if fusion_bytes <= 0:
            buffers.append(current)
            current = 0.0
    if current:
        buffers.append(current)
    return buffers


def horovod_schedule(
    tensor_fractions: Sequence[float],
    tensor_bytes: Sequence[float],
    backward_s: float,
    cost: Callable[[float], float],
    cycle_time_s: float,
    fusion_bytes: float,
    negotiation_s: float = 0.0,
    slowdown: float = 0.0,
    rest_of_step_s: float = 0.0,
) -> Schedule:
    """Horovod's cycles over the gradient tensors in the steady state (module docstring); one entry
    per fused buffer, times relative to the start of backward.

    tensor_fractions: per tensor, in the order backward produces them, the fraction of backward
    compute done when it is ready. rest_of_step_s: from the end of a step's last all-reduce to
    the start of the next step's backward (optimizer, data, forward, and any wait for a slower
    rank). A buffer's `ready_s` is its cycle's start, so the time communicating counts
    negotiation and the all-reduce, as Horovod's timeline draws them.

    The first step assumes a cycle starts with backward; each step sets the next one's phase (the
    next cycle after the last all-reduce, then one every `cycle_time_s`), and steps are chained
    until a phase comes back (a few steps: the phase depends only on what the last cycle of a
    step carries). The step at which it comes back is returned; where the phases cycle through
    several values (a step within rounding of a whole number of cycles), that is one of them.
    """
    if len(tensor_fractions) != len(tensor_bytes):
        raise ValueError("one ready fraction per tensor")
    if not cycle_time_s > 0:
        raise UsageError(f"Horovod cycle time must be > 0, got {cycle_time_s!r}")
    phases: list[float] = []
    phase = 0.0
    while True:
        schedule, next_cycle_s = _horovod_step(
            tensor_fractions, tensor_bytes, backward_s, cost, cycle_time_s, fusion_bytes, negotiation_s, slowdown, phase
        )
        if not schedule.finish_s:
            return schedule
        next_backward_s = max(schedule.finish_s[-1], schedule.backward_s) + rest_of_step_s
        # idle cycles tick every cycle_time_s until the next backward has begun
        waits = max(0, math.ceil((next_backward_s - next_cycle_s) / cycle_time_s - 1e-9))
        phase = next_cycle_s + waits * cycle_time_s - next_backward_s
        if any(abs(phase - seen) <= 1e-9 * cycle_time_s for seen in phases) or len(phases) > 100:
            return schedule
        phases.append(phase)


def _horovod_step(
    tensor_fractions: Sequence[float],
    tensor_bytes: Sequence[float],
    backward_s: float,
    cost: Callable[[float], float],
    cycle_time_s: float,
    fusion_bytes: float,
    negotiation_s: float,
    slowdown: float,
    first_cycle_s: float,
) -> tuple[Schedule, float]:
    """One step whose first cycle starts `first_cycle_s` after backward starts; with the start of
    the cycle after its last one (both relative to this step's backward start)."""
    busy: list[tuple[float, float]] = []
    readies, starts, finishes = [], [], []
    sent = 0
    cycle_start = first_cycle_s
    while sent < len(tensor_bytes):
        ready_now = sent
        while (
            ready_now < len(tensor_bytes)
            and _time_at_work(tensor_fractions[ready_now] * backward_s, busy, slowdown) <= cycle_start + 1e-15
        ):
            ready_now += 1
        t = cycle_start
        if ready_now > sent:
            t += negotiation_s
            for nbytes in fuse(tensor_bytes[sent:ready_now], fusion_bytes):
                start, finish = t, t + cost(nbytes)
                busy.append((start, finish))
                readies.append(cycle_start)
                starts.append(start)
                finishes.append(finish)
                t = finish
            sent = ready_now
        cycle_start = max(cycle_start + cycle_time_s, t)
    end = _time_at_work(backward_s, busy, slowdown)
    schedule = Schedule(tuple(starts), tuple(finishes), end, ready_s=tuple(readies), compute_backward_s=backward_s)
    return schedule, cycle_start


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted ring all-reduce, T(S) = 2(n-1) alpha + 2(n-1)/n S / bandwidth, or all-gather,
    T(S) = (n-1) alpha + (n-1)/n S / bandwidth (S: the gathered buffer)."""

    alpha_s: float
    bandwidth_bytes_per_s: float
    n: int
    rms_relative_error: float
    collective: str = "all_reduce"

    @property
    def beta_s_per_byte(self) -> float:
        return 1.0 / self.bandwidth_bytes_per_s

    def predict_s(self, nbytes: float) -> float:
        if self.collective == "all_gather":
            return reduce_scatter_s(nbytes, self.n, self.alpha_s, self.bandwidth_bytes_per_s)
        return ring_allreduce_s(nbytes, self.n, self.alpha_s, self.bandwidth_bytes_per_s)


def fit_alpha_beta(
    sizes_bytes: Sequence[float],
    times_s: Sequence[float],
    n: int,
    relative: bool = True,
    collective: str = "all_reduce",
) -> AlphaBeta:
    """Least squares of the ring formula to measured all-reduce (or all-gather) times over `n` ranks.

    T = a x + b y with x = 2(n-1), y = 2(n-1)/n S (an all-gather: x = n-1, y = (n-1)/n S),
    unknowns a = alpha and b = 1/bandwidth, the bus bandwidth of nccl-tests' definitions.
    `relative=True` (default) minimises the relative error, sum((T_fit - T)/T)^2: measured
    sizes span orders of magnitude, and plain least squares would fit the largest messages
    only and leave alpha to chance. alpha is kept >= 0 (refitted with alpha = 0 when the free
    fit goes negative). UsageError when the data cannot give a bandwidth.
    """
    import numpy as np

    sizes = np.asarray(sizes_bytes, dtype=float)
    times = np.asarray(times_s, dtype=float)
    if n < 2:
        raise UsageError(f"fit_alpha_beta needs n >= 2 ranks, got {n}")
    if sizes.shape != times.shape or sizes.ndim != 1 or len(sizes) < 2:
        raise UsageError("fit_alpha_beta needs two equally long lists of at least 2 sizes and times")
    if not (np.all(np.isfinite(sizes)) and np.all(np.isfinite(times)) and np.all(sizes >= 0) and np.all(times > 0)):
        raise UsageError("fit_alpha_beta: sizes must be >= 0 and times > 0, all finite")
    if collective not in ("all_reduce", "all_gather"):
        raise UsageError(f"fit_alpha_beta: collective must be all_reduce or all_gather, got {collective!r}")
    passes = 2.0 if collective == "all_reduce" else 1.0  # a ring all-reduce: a reduce-scatter and an all-gather
    x = np.full_like(sizes, passes * (n - 1))
    y = passes * (n - 1) / n * sizes
    w = 1.0 / times if relative else np.ones_like(times)
    design = np.column_stack([x * w, y * w])
    (alpha, beta), *_ = np.linalg.lstsq(design, times * w, rcond=None)
    if alpha < 0:
        alpha = 0.0
        beta = float(np.dot(y * w, times * w) / np.dot(y * w, y * w))
    if not beta > 0:
        raise UsageError("fit_alpha_beta: the times do not grow with the message size; no bandwidth to fit")
    fitted = alpha * x + beta * y
    rms = float(math.sqrt(np.mean(((fitted - times) / times) ** 2)))
    return AlphaBeta(
        alpha_s=float(alpha),
        bandwidth_bytes_per_s=float(1.0 / beta),
        n=int(n),
        rms_relative_error=rms,
        collective=collective,
    )


# ---------------------------------------------------------------------------- FSDP


def gather_s(
    nbytes: float,
    nodes: int,
    gpus_per_node: int,
    intra: Link | None,
    inter: Link | None,
    collective_latency_s: float = 0.0,
) -> float:
    """One all-gather (or reduce-scatter: the same cost) of a full buffer of `nbytes` over
    nodes x gpus_per_node ranks, flat ring (module docstring); 0 for one rank."""
    n = nodes * gpus_per_node
    if n <= 1:
        return 0.0
    if nodes == 1:
        intra = _intra_link(intra)
        return collective_latency_s + reduce_scatter_s(nbytes, n, intra.latency_s, intra.bandwidth_bytes_per_s)
    inter = _inter_link(inter)
    intra_latency = intra.latency_s if intra is not None else 0.0
    latency = (nodes - 1) * inter.latency_s + (n - nodes) * intra_latency
    return collective_latency_s + latency + (n - 1) / n * nbytes / inter.bandwidth_bytes_per_s


scatter_s = gather_s  # a ring reduce-scatter moves what a ring all-gather moves (nccl-tests' PERFORMANCE.md)


def hsdp_gather_s(
    nbytes: float,
    nodes: int,
    gpus_per_node: int,
    intra: Link | None,
    inter: Link | None,
    collective_latency_s: float = 0.0,
) -> float:
    """HSDP's all-gather: inside the node only (the parameters are sharded over its g GPUs)."""
    return gather_s(nbytes, 1, gpus_per_node, intra, inter, collective_latency_s)


def hsdp_scatter_s(
    nbytes: float,
    nodes: int,
    gpus_per_node: int,
    intra: Link | None,
    inter: Link | None,
    collective_latency_s: float = 0.0,
) -> float:
    """HSDP's gradient reduction: reduce-scatter inside the node, then the shards all-reduced across
    the nodes (each of the g GPUs its own S/g, together S through the node's network)."""
    inside = gather_s(nbytes, 1, gpus_per_node, intra, inter, collective_latency_s)
    if nodes <= 1:
        return inside
    inter = _inter_link(inter)
    return (
        inside
        + collective_latency_s
        + 2 * (nodes - 1) * inter.latency_s
        + 2 * (nodes - 1) / nodes * nbytes / inter.bandwidth_bytes_per_s
    )


@dataclass(frozen=True)
class Collective:
    """One FSDP collective: kind (the record schema's column stems: allgather, regather, reducescatter), unit, and times
    (issue, start, finish) in seconds from the start of the step's forward."""

    kind: str
    unit: int
    issue_s: float
    start_s: float
    finish_s: float


@dataclass(frozen=True)
class FsdpSchedule:
    """A step of FSDP without the optimizer: forward and backward compute and their collectives."""

    collectives: tuple[Collective, ...]
    compute_s: float  # forward + backward compute alone
    end_s: float  # when the last reduce-scatter finished or backward compute ended, whichever is later
    waited_s: float  # compute waiting on a gather, plus the wait after backward for the last reduce-scatter
    forward_waited_s: float = 0.0  # the part of waited_s in forward

    @property
    def exposed_s(self) -> float:
        return self.waited_s

    @property
    def busy_s(self) -> float:
        """Time communicating: the union of every collective's issue-to-finish interval."""
        return interval_union_s([(c.issue_s, c.finish_s) for c in self.collectives])

    def seconds(self, kind: str) -> float:
        """Transfer time of the collectives of one kind (their start to finish, summed)."""
        return sum(c.finish_s - c.start_s for c in self.collectives if c.kind == kind)


def fsdp_schedule(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    gather_cost_s: Sequence[float],
    scatter_cost_s: Sequence[float],
    reshard_after_forward: Sequence[bool],
    synchronous: bool = False,
) -> FsdpSchedule:
    """FSDP's step (module docstring). Per unit, in forward order with the root first (index 0):
    its forward and backward compute (backward including any recomputation), the cost of its
    all-gather and of its reduce-scatter, and whether it is resharded after forward (then gathered
    again for backward). The root's forward compute runs after the blocks' (the head and the loss).
    synchronous: every collective holds compute until it is done (gloo on CPU; module docstring)."""
    units = len(forward_s)
    if not (len(backward_s) == len(gather_cost_s) == len(scatter_cost_s) == len(reshard_after_forward) == units):
        raise ValueError("one forward, backward, gather and scatter cost and reshard flag per unit")
    collectives: list[Collective] = []
    link = [0.0]

    def run(kind: str, unit: int, issue: float, cost: float) -> float:
        start = max(issue, link[0])
        link[0] = start + cost
        collectives.append(Collective(kind, unit, issue, start, link[0]))
        return link[0]

    if synchronous:
        return _synchronous_fsdp_schedule(
            forward_s, backward_s, gather_cost_s, scatter_cost_s, reshard_after_forward, run, collectives
        )
    waited, t = 0.0, 0.0
    gathered = {0: run(ALLGATHER, 0, 0.0, gather_cost_s[0])}
    blocks = list(range(1, units))
    if blocks:
        gathered[blocks[0]] = run(ALLGATHER, blocks[0], 0.0, gather_cost_s[blocks[0]])
    # forward: the blocks in order, each prefetching the next one's all-gather, then the root's compute
    for k, unit in enumerate(blocks):
        start = max(t, gathered[unit], gathered[0])
        waited += start - t
        if k + 1 < len(blocks):
            gathered[blocks[k + 1]] = run(ALLGATHER, blocks[k + 1], start, gather_cost_s[blocks[k + 1]])
        t = start + forward_s[unit]
    start = max(t, gathered[0])
    waited += start - t
    t = start + forward_s[0]
    forward_waited = waited
    # backward: the root first (unsharded), then the blocks in reverse
    order = list(reversed(blocks))
    ready: dict[int, float] = {}

    def prefetch(i: int, at: float) -> None:
        if i < len(order) and reshard_after_forward[order[i]]:
            ready[order[i]] = run(REGATHER, order[i], at, gather_cost_s[order[i]])

    if reshard_after_forward[0]:  # the root's backward (the head's) computes first: nothing hides its re-gather
        start = run(REGATHER, 0, t, gather_cost_s[0])
        waited += start - t
        t = start
    prefetch(0, t)
    t += backward_s[0]
    for i, unit in enumerate(order):
        start = max(t, ready.get(unit, 0.0))
        waited += start - t
        prefetch(i + 1, start)
        t = start + backward_s[unit]
        run(REDUCESCATTER, unit, t, scatter_cost_s[unit])
    last = run(REDUCESCATTER, 0, t, scatter_cost_s[0])
    waited += max(0.0, last - t)
    return FsdpSchedule(tuple(collectives), sum(forward_s) + sum(backward_s), max(t, last), waited, forward_waited)


def _synchronous_fsdp_schedule(
    forward_s, backward_s, gather_cost_s, scatter_cost_s, reshard_after_forward, run: Callable, collectives: list
) -> FsdpSchedule:
    """`fsdp_schedule` with every collective issued when compute reaches it and compute waiting for it."""
    waited, t = 0.0, 0.0

    def hold(kind: str, unit: int, cost: float) -> None:
        nonlocal waited, t
        finish = run(kind, unit, t, cost)
        waited += finish - t
        t = finish

    blocks = range(1, len(forward_s))
    hold(ALLGATHER, 0, gather_cost_s[0])
    for unit in blocks:
        hold(ALLGATHER, unit, gather_cost_s[unit])
        t += forward_s[unit]
    t += forward_s[0]
    forward_waited = waited
    if reshard_after_forward[0]:
        hold(REGATHER, 0, gather_cost_s[0])
    t += backward_s[0]
    for unit in reversed(blocks):
        if reshard_after_forward[unit]:
            hold(REGATHER, unit, gather_cost_s[unit])
        t += backward_s[unit]
        hold(REDUCESCATTER, unit, scatter_cost_s[unit])
    hold(REDUCESCATTER, 0, scatter_cost_s[0])
    return FsdpSchedule(tuple(collectives), sum(forward_s) + sum(backward_s), t, waited, forward_waited)
