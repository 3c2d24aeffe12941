"""The run's figures, live, in Ray's own metrics: each worker exports them through `ray.util.metrics`.

The instrument's live metrics (scaling/instrument/parts.py) in a Ray Train worker: the Ray
launcher hands them to the lab's loop, and the lab's provider of instrument parts
(scaling/launch/instrument_parts.py) to a user's job under Ray Train. Every rank sets gauges at
the end of each epoch, tagged with the run's name, its rank and node rank:

    ray_scaling_step_seconds              mean steady-state step time of the epoch
    ray_scaling_exposed_comm_seconds      mean exposed communication per step
    ray_scaling_waiting_seconds           of which waiting for the slowest rank (recorder.py)
    ray_scaling_allreduce_seconds         mean time with an all-reduce in flight per step
    ray_scaling_throughput_samples_per_second   the epoch's training throughput (all ranks)

Ray exports them on each node's metrics endpoint (`ray start --metrics-export-port`), so they
show on the cluster's Prometheus and dashboard next to Ray's own metrics (Ray prefixes `ray_`).
Made outside an initialised Ray, they set nothing.
"""

from __future__ import annotations

import math

GAUGES = {
    "step_s": ("scaling_step_seconds", "mean steady-state training step time of the last epoch (s)"),
    "exposed_comm_s": ("scaling_exposed_comm_seconds", "mean communication per step not hidden behind backward (s)"),
    "waiting_s": ("scaling_waiting_seconds", "mean exposed communication per step spent waiting for the slowest rank (s)"),
    "allreduce_s": ("scaling_allreduce_seconds", "mean time per step with a gradient all-reduce in flight (s)"),
}
THROUGHPUT = ("scaling_throughput_samples_per_second", "training throughput of the last epoch, all ranks (samples/s)")


class RayLiveMetrics:
    def __init__(self, run: str, identity):
        self.tags = {"run": str(run), "rank": str(identity.rank), "node_rank": str(identity.node_rank)}
        self.gauges = {}
        import ray
        from ray.util.metrics import Gauge

        if not ray.is_initialized():
            return
        keys = tuple(self.tags)
        self.gauges = {field: Gauge(name, description=text, tag_keys=keys) for field, (name, text) in GAUGES.items()}
        self.gauges["throughput"] = Gauge(THROUGHPUT[0], description=THROUGHPUT[1], tag_keys=keys)

    def update(self, rows: list[dict] | None, epoch_row: dict) -> None:
        """Set the gauges from the epoch's step records (this rank's) and its row."""
        if not self.gauges:
            return
        steady = [r for r in rows or [] if r.get("kind") == "train" and not r.get("warmup")]
        for field in GAUGES:
            values = [r[field] for r in steady if r.get(field) is not None and not math.isnan(r[field])]
            if values:
                self.gauges[field].set(sum(values) / len(values), tags=self.tags)
        throughput = epoch_row.get("throughput_samples_per_s")
        if throughput is not None and not math.isnan(throughput):
            self.gauges["throughput"].set(throughput, tags=self.tags)
