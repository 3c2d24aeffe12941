"""Horovod as the lab runs it (`backend: horovod`): its DistributedOptimizer over the run's process group.

Horovod's rendezvous goes over the torch.distributed group the launcher set up, then `hvd.init()`
with the run's tuning (fusion threshold, cycle time, timeline: scaling/train/horovod_backend.py),
then its DistributedOptimizer, with rank 0's parameters everywhere. Horovod is imported only
when a run uses it.
"""

from __future__ import annotations

from scaling.results import HOROVOD_TIMELINE_JSON
from scaling.train import horovod_backend
from scaling.train.backends.base import LabBackend


class Horovod(LabBackend):
    def preflight(self, cfg) -> str | None:
        ok, why_not = horovod_backend.available(use_gpu=cfg.workers.use_gpu)
        if not ok:
            return f"backend horovod: {why_not}"
        if cfg.instrument.inject_comm_delay_s > 0 and cfg.workers.use_gpu:
            return (
                "instrument.inject_comm_delay_s with backend horovod is a host sleep, which is no GPU delay (the host "
                "runs ahead of the device): on GPU runs inject with DDP, or run the ground truth on CPU workers"
            )
        return None

    def describe(self, cfg) -> dict:
        return {
            "backend": "horovod",
            "horovod_fusion_threshold_mb": cfg.instrument.horovod_fusion_threshold_mb,
            "horovod_cycle_time_ms": cfg.instrument.horovod_cycle_time_ms,
        }

    def communication_bytes(self, cfg, parameter_bytes: int) -> tuple[int, str]:
        return min(parameter_bytes, int(cfg.instrument.horovod_fusion_threshold_mb * 2**20)), "Horovod's fusion buffer"

    def wrap(self, cfg, ctx, model, optimizer, run_dir):
        ok, why_not = horovod_backend.available(use_gpu=ctx.device.type == "cuda")
        if not ok:  # the preflight refuses this; a worker that gets here anyway stops at once
            raise RuntimeError(f"backend horovod: {why_not}")
        timeline = str(run_dir / HOROVOD_TIMELINE_JSON) if cfg.instrument.horovod_timeline and run_dir else None
        # Fusion threshold, cycle time and timeline are read by Horovod at init only.
        horovod_backend.setup_horovod_env_and_init(
            ctx.rank,
            ctx.world_size,
            ctx.local_rank,
            None,
            ctx.node_rank,
            None,
            tuning=horovod_backend.HorovodTuning.from_mb(
                cfg.instrument.horovod_fusion_threshold_mb, cfg.instrument.horovod_cycle_time_ms, timeline
            ),
        )
        # rank 0's parameters and buffers everywhere (as DDP's constructor does), then Horovod's optimizer
        optimizer = horovod_backend.wrap_optimizer(optimizer, model, compression=cfg.instrument.grad_compression)
        # after a normal end only: every rank gets there together; rank 0 closes the timeline
        return model, optimizer, horovod_backend.shutdown
