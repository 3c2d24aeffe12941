"""The lab's optimizer for a run (`optim.name`): SGD with Nesterov momentum, or AdamW; fused where it pays.

    optimizer = build_optimizer(cfg, model.parameters(), device, peak_lr)

`use_fused(device)` decides torch's `fused=True` (one multi-tensor kernel for the whole step instead
of a loop of elementwise kernels per parameter): on CUDA, where the step of a GPT-2 small with
AdamW is otherwise a few hundred small kernel launches, the well-known fast loops (nanoGPT,
torchtitan) use it. On a CPU the lab keeps torch's default (per-parameter) kernels, with which
its CPU figures were measured. The optimizer's own figures need no change: fused or not, it is
one `optimizer.step()` inside the step the instrument times.
"""

from __future__ import annotations

import torch

from scaling.config import ExperimentConfig

# Device types on which the lab asks for torch's fused optimizer kernels.
FUSED_DEVICE_TYPES = ("cuda",)


def use_fused(device: torch.device | str) -> bool:
    """Whether the optimizer on `device` is built with `fused=True`: a CUDA device, with a torch whose
    fused kernels cover it (a build without CUDA kernels answers no)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    device_type = torch.device(device).type
    return device_type in FUSED_DEVICE_TYPES and device_type in _get_fused_kernels_supported_devices()


def build_optimizer(cfg: ExperimentConfig, parameters, device: torch.device | str, lr: float) -> torch.optim.Optimizer:
    """`optim.name`'s optimizer over `parameters` at learning rate `lr` (the loop's linearly scaled peak).

    sgd: momentum `optim.momentum` (Nesterov when > 0); adamw: betas (`optim.momentum`,
    `optim.adam_beta2`). Both with `optim.weight_decay` (AdamW's decoupled), fused per `use_fused`."""
    fused = {"fused": True} if use_fused(device) else {}
    if cfg.optim.name == "adamw":
        return torch.optim.AdamW(
            parameters,
            lr=lr,
            betas=(cfg.optim.momentum, cfg.optim.adam_beta2),
            weight_decay=cfg.optim.weight_decay,
            **fused,
        )
    return torch.optim.SGD(
        parameters,
        lr=lr,
        momentum=cfg.optim.momentum,
        nesterov=cfg.optim.momentum > 0,
        weight_decay=cfg.optim.weight_decay,
        **fused,
    )
