"""FSDP2 as the lab runs it (`backend: fsdp`): `fully_shard` on the run's process group, by its `fsdp:` settings.

What is sharded (`fsdp.shard`): `blocks` gives `fully_shard` each module of the model's
outermost `nn.ModuleList`s that holds parameters (a transformer's blocks: this lab's GPT's
`blocks`, nanoGPT's `transformer.h`, torchtitan's `layers`), then the root, which holds the rest
(embeddings, final norm, head); `root` gives it the whole model as one unit (one all-gather of
every parameter per pass). `shard_units` is the one rule, used by the preflight and by `wrap`.

`fsdp.reshard_after_forward`: true frees each block's gathered parameters after its forward
and gathers them again in backward (ZeRO-3); the root is left to FSDP2's own rule for it and
stays gathered, since backward needs it first (the projection calls this "all"), unless it is
the only unit (`shard: root`), which is then resharded as asked. false keeps them to backward
(one all-gather per unit and pass less, the whole parameters held between forward and
backward). `fsdp.param_dtype` / `fsdp.reduce_dtype`: FSDP2's `MixedPrecisionPolicy`, the dtype
the parameters are gathered and computed in, and the one the gradients are reduce-scattered
in; the sharded parameters and the optimizer state stay float32.

Every rank builds the model from the same seed (scaling/train/loop.py), so every rank's shard
comes from the same whole tensors: nothing to broadcast, unlike DDP's rank-0 copy.
`fully_shard` replaces the module's parameters with sharded ones (DTensors), so the optimizer
the loop made over the plain parameters is made again, with its settings, over the sharded ones.

Checkpoints (`sharded`): every rank takes part in making one, through
`torch.distributed.checkpoint.state_dict.get_state_dict` with full state dicts gathered on rank
0 (scaling/instrument/backends/fsdp.py `checkpoint_state`); the launcher keeps rank 0's state as
it does DDP's, and after a restart every rank loads it and `set_state_dict` takes each rank's
shard of it. A checkpoint is therefore the whole model and optimizer state keyed by parameter
name, which loads at any worker count.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from scaling.instrument.backends import fsdp as fsdp_instrument
from scaling.train.backends.base import LabBackend, unchecked_gpu_injection

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def shard_units(model: nn.Module, shard: str) -> list[tuple[str, nn.Module]]:
    """(name, module) of what `fully_shard` gets before the root: the module docstring's rule."""
    if shard == "root":
        return []
    units: list[tuple[str, nn.Module]] = []
    inside: list[str] = []  # the ModuleLists taken so far: one inside them is not outermost
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or any(name.startswith(outer + ".") for outer in inside):
            continue
        inside.append(name)
        units += [
            (f"{name}.{index}", block) for index, block in enumerate(module) if any(True for _ in block.parameters())
        ]
    return units


def _meta_model(cfg) -> nn.Module:
    """The run's model with its tensors on the meta device (shapes only, nothing allocated)."""
    from scaling.models import build_model

    try:
        with torch.device("meta"):
            return build_model(cfg.model.name, cfg.data.num_classes)
    except Exception:  # noqa: BLE001 - a user's constructor that needs real tensors
        return build_model(cfg.model.name, cfg.data.num_classes)


class FSDP(LabBackend):
    sharded = True

    def preflight(self, cfg) -> str | None:
        refusal = unchecked_gpu_injection(cfg, fsdp_instrument.GPU_INJECTION_CHECKED)
        if refusal:
            return refusal
        if cfg.fsdp.shard == "blocks" and not shard_units(_meta_model(cfg), "blocks"):
            return (
                f"backend fsdp with fsdp.shard: blocks shards each module of the model's nn.ModuleLists, and model "
                f"{cfg.model.name} has none with parameters: use fsdp.shard: root (the whole model as one unit)"
            )
        return None

    def describe(self, cfg) -> dict:
        return {
            "backend": "fsdp",
            "process_group": cfg.resolved_backend,
            "fsdp_shard": cfg.fsdp.shard,
            "fsdp_reshard_after_forward": cfg.fsdp.reshard_after_forward,
            "fsdp_param_dtype": cfg.fsdp.param_dtype,
            "fsdp_reduce_dtype": cfg.fsdp.reduce_dtype,
        }

    def state_share(self, cfg) -> float:
        return 1.0 / cfg.workers.num_workers

    def communication_bytes(self, cfg, parameter_bytes: int) -> tuple[int, str]:
        # the gathered parameters: all of them between forward and backward without resharding;
        # else a unit and the next one prefetched, at most the whole model (shard: root)
        scale = 0.5 if cfg.fsdp.param_dtype == "bfloat16" else 1.0
        if not cfg.fsdp.reshard_after_forward or cfg.fsdp.shard == "root":
            return int(parameter_bytes * scale), "FSDP's gathered parameters"
        units = shard_units(_meta_model(cfg), cfg.fsdp.shard)
        largest = max((sum(p.numel() * p.element_size() for p in unit.parameters()) for _, unit in units), default=0)
        return int(min(parameter_bytes, 2 * largest) * scale), "FSDP's gathered parameters (two blocks)"

    def wrap(self, cfg, ctx, model, optimizer, run_dir):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        settings = cfg.fsdp
        policy = MixedPrecisionPolicy(
            param_dtype=DTYPES[settings.param_dtype], reduce_dtype=DTYPES[settings.reduce_dtype]
        )
        for _, unit in shard_units(model, settings.shard):
            fully_shard(unit, reshard_after_forward=settings.reshard_after_forward, mp_policy=policy)
        # None is FSDP2's default for the root (kept gathered after forward); True given explicitly would
        # reshard the root too and gather it again at once in backward, a collective per step for nothing
        keep_root = settings.reshard_after_forward and settings.shard != "root"
        fully_shard(
            model, reshard_after_forward=None if keep_root else settings.reshard_after_forward, mp_policy=policy
        )
        # fully_shard replaced the parameters the optimizer holds: the same optimizer over the sharded ones
        groups = optimizer.param_groups
        if len(groups) != 1:
            raise ValueError(
                "backend fsdp makes the loop's optimizer again over the sharded parameters, "
                f"which takes one parameter group, not {len(groups)}"
            )
        # its constructor's own arguments from its defaults (AdamW keeps one it does not take: decoupled_weight_decay)
        accepted = inspect.signature(type(optimizer)).parameters
        sharded = type(optimizer)(model.parameters(), **{k: v for k, v in optimizer.defaults.items() if k in accepted})
        return model, sharded, lambda: None
