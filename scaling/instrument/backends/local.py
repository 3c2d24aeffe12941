"""The single process: a plain module at world size 1 (as Ray's `prepare_model` returns it there).

Nothing is communicated and nothing timed: every answer is `Backend`'s. It claims a job of one
rank only: with more, a plain module and optimizer would leave the gradients unsynchronised.
"""

from __future__ import annotations

import torch.distributed as dist

from scaling.instrument.backends.base import Backend


class LocalBackend(Backend):
    """One process: nothing is communicated, nothing to time."""

    kind = "local"
    wraps = "a plain module at world size 1"

    @classmethod
    def claims(cls, model, optimizer) -> bool:
        return not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
