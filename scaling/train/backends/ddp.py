"""DDP as the lab runs it (`backend: auto | gloo | nccl`): DistributedDataParallel on that process group.

The wrapped model: `DistributedDataParallel` with `instrument.ddp_bucket_cap_mb` buckets, rank
0's parameters everywhere, BatchNorm buffers synced once (no buffer sync in forward: the only
communication during training is the gradient all-reduce the instrument times); the gradient
compression hook of `instrument.grad_compression`, registered inside the instrument's timing
hook (which the instrument adopts, scaling/instrument/backends/ddp.py) when steps are timed.
"""

from __future__ import annotations

import inspect

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from scaling.instrument import timing
from scaling.train.backends.base import LabBackend, unchecked_gpu_injection

COMPRESSION_HOOKS = {
    "none": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


# torch 2.13 names the switch `forward_sync_buffers` and deprecates `broadcast_buffers`; older
# torch (2.11 on the GPU machines, docs/gpu.md) knows only `broadcast_buffers`.
NO_BUFFER_SYNC_IN_FORWARD = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)


class DDP(LabBackend):
    def preflight(self, cfg) -> str | None:
        return unchecked_gpu_injection(cfg, timing.GPU_INJECTION_CHECKED)

    def communication_bytes(self, cfg, parameter_bytes: int) -> tuple[int, str]:
        return parameter_bytes, "DDP's gradient buckets"  # a copy of the gradients

    def wrap(self, cfg, ctx, model, optimizer, run_dir):
        ddp = DistributedDataParallel(
            model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            bucket_cap_mb=cfg.instrument.ddp_bucket_cap_mb,
            **NO_BUFFER_SYNC_IN_FORWARD,
        )
        # No compression: no comm hook, so the instrument times the buckets through the reducer's process
        # group on the steps it samples and the others run DDP's own C++ path (scaling/instrument/backends/ddp.py).
        if cfg.instrument.grad_compression != "none":
            inner = COMPRESSION_HOOKS[cfg.instrument.grad_compression]
            hook = timing.CommTimingHook(inner_hook=inner) if cfg.instrument.step_timing else inner
            ddp.register_comm_hook(state=None, hook=hook)  # a CommTimingHook: the instrument adopts it
        return ddp, optimizer, lambda: None
