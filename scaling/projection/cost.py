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
  the pace: the inter-node link when N > 1 (alpha_inter, B_inter), NVLink/PCIe when N = 1.
  B_inter is the node's network bandwidth: NCCL's several rings (channels) share the NIC.
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

Not modelled (each makes the projection optimistic): contention between NCCL kernels and
compute for SMs and memory bandwidth while they overlap; NCCL's lower bandwidth on small
messages (protocol switch-over, fewer channels); stragglers and jitter at large n; network
congestion from other tenants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scaling.errors import UsageError

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


def allreduce_s(nbytes: float, nodes: int, gpus_per_node: int, intra: Link | None, inter: Link | None,
                algorithm: str = "ring") -> float:
    """Time of one all-reduce of `nbytes` over `nodes` x `gpus_per_node` ranks (definitions: module docstring)."""
    n = nodes * gpus_per_node
    if n <= 1:
        return 0.0
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown all-reduce algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")
    if nodes == 1:
        if intra is None:
            raise UsageError("the cluster has no intra_node link but a node holds more than one GPU")
        return ring_allreduce_s(nbytes, n, intra.latency_s, intra.bandwidth_bytes_per_s)
    if inter is None:
        raise UsageError("the cluster has no inter_node link; it cannot span more than one node")
    if algorithm == "ring" or gpus_per_node == 1:
        return ring_allreduce_s(nbytes, n, inter.latency_s, inter.bandwidth_bytes_per_s)
    if intra is None:
        raise UsageError("the cluster has no intra_node link but a node holds more than one GPU")
    inside = 2 * reduce_scatter_s(nbytes, gpus_per_node, intra.latency_s, intra.bandwidth_bytes_per_s)
    return inside + ring_allreduce_s(nbytes, nodes, inter.latency_s, inter.bandwidth_bytes_per_s)


@dataclass(frozen=True)
class Schedule:
    """When each bucket's all-reduce ran, relative to the start of backward."""

    start_s: tuple[float, ...]
    finish_s: tuple[float, ...]
    backward_s: float

    @property
    def exposed_s(self) -> float:
        """Communication not hidden behind backward compute: last finish - end of backward, >= 0."""
        return max(0.0, self.finish_s[-1] - self.backward_s) if self.finish_s else 0.0

    @property
    def busy_s(self) -> float:
        """Time with an all-reduce in flight (the buckets run one at a time: the sum of their costs)."""
        return sum(f - s for s, f in zip(self.start_s, self.finish_s))


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
    return Schedule(tuple(starts), tuple(finishes), backward_s)


def simulate(bucket_bytes: Sequence[float], ready_s: Sequence[float], backward_s: float,
             cost: Callable[[float], float]) -> Schedule:
    """The schedule of buckets of `bucket_bytes` ready at `ready_s`, each costing `cost(bytes)`."""
    return schedule_buckets(ready_s, [cost(b) for b in bucket_bytes], backward_s)


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted ring all-reduce: T(S) = 2(n-1) alpha + 2(n-1)/n S / bandwidth."""

    alpha_s: float
    bandwidth_bytes_per_s: float
    n: int
    rms_relative_error: float

    @property
    def beta_s_per_byte(self) -> float:
        return 1.0 / self.bandwidth_bytes_per_s

    def predict_s(self, nbytes: float) -> float:
        return ring_allreduce_s(nbytes, self.n, self.alpha_s, self.bandwidth_bytes_per_s)


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float], n: int,
                   relative: bool = True) -> AlphaBeta:
    """Least squares of the ring formula to measured all-reduce times over `n` ranks.

    T = a x + b y with x = 2(n-1), y = 2(n-1)/n S, unknowns a = alpha and b = 1/bandwidth.
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
    x = np.full_like(sizes, 2.0 * (n - 1))
    y = 2.0 * (n - 1) / n * sizes
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
    return AlphaBeta(alpha_s=float(alpha), bandwidth_bytes_per_s=float(1.0 / beta), n=int(n), rms_relative_error=rms)
