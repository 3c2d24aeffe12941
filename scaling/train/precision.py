"""Numeric precision and memory layout of a training step: fp32, AMP fp16 or bf16, channels_last.

One object the loop asks for the three places precision enters a step: the autocast context
around forward and loss, the (scaled) backward, and the optimizer step. fp16 uses a
GradScaler (dynamic loss scaling, so small gradients do not flush to zero); bf16 has fp32's
exponent range and needs none. Parameters, gradients and optimizer state stay fp32 in every
mode (AMP), so the gradient all-reduce moves fp32 unless `instrument.grad_compression` says
otherwise.
"""

from __future__ import annotations

import contextlib

import torch

AUTOCAST_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# Compute capability from which a GPU has bf16 arithmetic of its own (Ampere, sm_80); before
# it (V100 is sm_70) torch emulates bf16, far slower than fp16.
NATIVE_BF16_CAPABILITY = (8, 0)


def bf16_problem(device_name: str, capability: tuple[int, int]) -> str | None:
    """Why bf16 is the wrong precision for this GPU (one line), or None.

    Refused at the plain launcher's preflight (scaling/launch/local.py), which sees the GPUs;
    under Ray the workers' GPUs are seen only by the workers, which print it as a warning.
    """
    if tuple(capability) >= NATIVE_BF16_CAPABILITY:
        return None
    return (
        f"train.precision=bf16 on {device_name} (compute capability {capability[0]}.{capability[1]}) is emulated, "
        "far slower than fp16: GPUs have native bf16 from compute capability 8.0 (A100); use train.precision=fp16"
    )


class Precision:
    def __init__(self, name: str, channels_last: bool, device: torch.device):
        self.name = name
        self.device_type = device.type
        self.dtype = AUTOCAST_DTYPES[name]
        self.channels_last = channels_last
        self.scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def layout(self, inputs: torch.Tensor) -> torch.Tensor:
        """Inputs in the model's memory layout (a no-op unless channels_last).

        The lab's loaders already emit channels_last batches when asked (`load_dataset`), and
        `contiguous` returns such a tensor itself: no per-batch copy. Other inputs are copied.
        """
        if self.channels_last and inputs.dim() == 4:
            return inputs.contiguous(memory_format=torch.channels_last)
        return inputs

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """optimizer.step(), skipped by the scaler when fp16 gradients overflowed.

        Intended host sync (fp16 only): GradScaler reads its found-inf flag on the host
        (`.item()` in `GradScaler._maybe_opt_step`) to decide whether to step, so with fp16 on
        GPU the host waits here for backward and the all-reduces once per step. It is the only
        per-step host sync in the lab's loop (scaling/train/sync_audit.py checks that on GPU).
        """
        self.scaler.step(optimizer)
        self.scaler.update()
