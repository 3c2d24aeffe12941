"""Every rank's clock offset to rank 0, so that marks of different ranks (and nodes) share one time base.

The instrument's marks are `time.perf_counter()` (CLOCK_MONOTONIC): one clock per machine,
with an arbitrary origin on each. Attribution of communication to waiting for the slowest rank
compares the moments different ranks finished their backward compute, so each rank's marks are
shifted by its offset to rank 0 before they are compared.

Estimate (NTP's, Mills 1991): rank r sends its time t1 to rank 0, rank 0 answers with its time
t2 at once, r reads t4 on arrival: offset = t2 - (t1 + t4) / 2, exact if the two legs take
equally long; the error is at most half the round trip, (t4 - t1) / 2. `ROUNDS` round trips
per rank, the one with the shortest round trip kept. Ranks take turns with rank 0 (a cost of
ROUNDS round trips per rank, once, at attach). On one machine the offsets come out near 0 and
the uncertainty is the loopback round trip (tens of µs here).

Limits: the offsets are estimated once; two machines' monotonic clocks drift apart by up to
tens of ppm (tens of ms per hour), which the uncertainty does not include.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

ROUNDS = 16


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # not Linux: never assume a shared clock
        import uuid

        return uuid.uuid4().hex


def estimate_offsets(group=None) -> tuple[float, float]:
    """(this rank's offset to rank 0, its uncertainty), in seconds: rank-0 time = local time + offset.

    Collective over `group` (a CPU-capable group: gloo). Rank 0 gets (0.0, 0.0).
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world == 1:
        return 0.0, 0.0
    root_boot = [_boot_id() if rank == 0 else None]
    dist.broadcast_object_list(root_boot, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    other_clock = torch.tensor([float(_boot_id() != root_boot[0])])
    flags = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(flags, other_clock, group=group)
    if rank != 0 and not other_clock.item():
        return 0.0, 0.0  # the same kernel's monotonic clock as rank 0
    buffer = torch.zeros(1, dtype=torch.float64)
    best = (0.0, float("inf"))
    if rank == 0:
        for peer in (p for p in range(1, world) if flags[p].item()):
            peer_global = dist.get_global_rank(group, peer) if group is not None else peer
            for _ in range(ROUNDS):
                dist.recv(buffer, src=peer_global, group=group)
                buffer[0] = time.perf_counter()
                dist.send(buffer, dst=peer_global, group=group)
        return 0.0, 0.0
    root = dist.get_global_rank(group, 0) if group is not None else 0
    for _ in range(ROUNDS):
        t1 = time.perf_counter()
        buffer[0] = t1
        dist.send(buffer, dst=root, group=group)
        dist.recv(buffer, src=root, group=group)
        t4 = time.perf_counter()
        round_trip = t4 - t1
        if round_trip < best[1]:
            best = (float(buffer[0]) - (t1 + t4) / 2, round_trip)
    return best[0], best[1] / 2
