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
        """Inputs in the model's memory layout (a no-op unless channels_last)."""
        if self.channels_last and inputs.dim() == 4:
            return inputs.contiguous(memory_format=torch.channels_last)
        return inputs

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """optimizer.step(), skipped by the scaler when fp16 gradients overflowed."""
        self.scaler.step(optimizer)
        self.scaler.update()
