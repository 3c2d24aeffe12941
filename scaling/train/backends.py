"""The lab's own set-up of each backend: the wrapped model and optimizer its runs train with.

The other half of each backend adapter, the part any job needs (timing, no-sync, the wait after
backward), is the instrument's: scaling/instrument/backends.py. Here is only what the lab
chooses for its own runs from the config:

    model, optimizer, close = wrap(cfg, ctx, model, optimizer, run_dir)
    ... train ...
    close()   # after a normal end, on every rank

- local (world size 1): as they are.
- ddp: `DistributedDataParallel` with `instrument.ddp_bucket_cap_mb` buckets, rank 0's
  parameters everywhere, BatchNorm buffers synced once (forward_sync_buffers=False: the only
  communication during training is the gradient all-reduce the instrument times); the
  gradient compression hook of `instrument.grad_compression`, registered inside the
  instrument's timing hook (which the instrument adopts) when steps are timed.
- horovod: Horovod's rendezvous over the torch.distributed group and `hvd.init()` with the
  run's tuning (scaling/train/horovod_backend.py), then its DistributedOptimizer.
"""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from scaling.instrument.timing import CommTimingHook
from scaling.results import HOROVOD_TIMELINE_JSON

COMPRESSION_HOOKS = {
    "none": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


def backend_name(cfg, world_size: int) -> str:
    if world_size == 1:
        return "local"
    return "horovod" if cfg.backend == "horovod" else "ddp"


def _wrap_local(cfg, ctx, model, optimizer, run_dir):
    return model, optimizer, lambda: None


def _wrap_ddp(cfg, ctx, model, optimizer, run_dir):
    ddp = DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=cfg.instrument.ddp_bucket_cap_mb,
        forward_sync_buffers=False,
    )
    inner = COMPRESSION_HOOKS[cfg.instrument.grad_compression]
    if cfg.instrument.step_timing:
        ddp.register_comm_hook(state=None, hook=CommTimingHook(inner_hook=inner))  # the instrument adopts it
    elif cfg.instrument.grad_compression != "none":
        ddp.register_comm_hook(state=None, hook=inner)
    return ddp, optimizer, lambda: None


def _wrap_horovod(cfg, ctx, model, optimizer, run_dir):
    from scaling.train import horovod_backend

    ok, why_not = horovod_backend.available(use_gpu=ctx.device.type == "cuda")
    if not ok:  # preflight refuses this (scaling/config.py); a worker that gets here anyway stops at once
        raise RuntimeError(f"backend horovod: {why_not}")
    timeline = str(run_dir / HOROVOD_TIMELINE_JSON) if cfg.instrument.horovod_timeline and run_dir else None
    # Fusion threshold, cycle time and timeline are read by Horovod at init only.
    horovod_backend.setup_horovod_env_and_init(
        ctx.rank, ctx.world_size, ctx.local_rank, None, ctx.node_rank, None,
        tuning=horovod_backend.HorovodTuning.from_mb(
            cfg.instrument.horovod_fusion_threshold_mb, cfg.instrument.horovod_cycle_time_ms, timeline),
    )
    # rank 0's parameters and buffers everywhere (as DDP's constructor does), then Horovod's optimizer
    optimizer = horovod_backend.wrap_optimizer(optimizer, model, compression=cfg.instrument.grad_compression)
    # after a normal end only: every rank gets there together; rank 0 closes the timeline
    return model, optimizer, horovod_backend.shutdown


WRAPPERS = {"local": _wrap_local, "ddp": _wrap_ddp, "horovod": _wrap_horovod}


def wrap(cfg, ctx, model, optimizer, run_dir):
    """(model, optimizer, close) for the run's backend (module docstring)."""
    return WRAPPERS[backend_name(cfg, ctx.world_size)](cfg, ctx, model, optimizer, run_dir)
