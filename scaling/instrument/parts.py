"""What the instrument takes from whoever runs the job: identity, live metrics, the run's finisher.

The instrument is a library without a launcher of its own, so three parts come from outside:

- `Identity`: this process's rank, world size, local rank and node rank. Without one,
  `identity_from_environment`: torch.distributed's rank and world size, LOCAL_RANK, and the
  node's rank from NODE_RANK (Ray Train sets it) or GROUP_RANK (torchrun sets it).
- live metrics: a factory `(run name, identity) -> object with update(step_rows, epoch_row)`,
  called at every epoch's end (the lab's launcher exports Ray gauges); without one, none.
- a finisher: `finish()` of a job that runs on its own hands it the run directory and the job's
  description, and it writes summary.json (the lab's run finalisation); without one (the lab not
  installed as a package, so no provider), `finish()` writes nothing beyond the records.

Whoever calls `attach` may pass `Parts`; a caller that passes none (a user's job) gets those the
installed providers give: each entry point in the group `scaling.instrument.parts` names a
function returning `Parts` (or None) for this process, and the lab registers one in its
pyproject.toml (scaling/launch/instrument_parts.py: Ray's identity and live metrics inside a Ray
Train worker; the lab's finisher). So a user's job gets them with no code, while this package
imports neither Ray nor the lab's analysis.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable, Protocol

PARTS_ENTRY_POINTS = "scaling.instrument.parts"


@dataclass(frozen=True)
class Identity:
    """Where this process sits in the job.

    Attributes:
        rank: the process's rank, 0 to world_size - 1.
        world_size: the number of processes in the job.
        local_rank: its rank among the job's processes on its node.
        node_rank: its node's rank among the job's nodes.
    """

    rank: int
    world_size: int
    local_rank: int
    node_rank: int


def identity_from_environment() -> Identity:
    """torch.distributed's rank and world size (1 process without a group); local rank from
    LOCAL_RANK (else the rank), node rank from NODE_RANK (Ray Train) or GROUP_RANK (torchrun), else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    node = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", 0))
    return Identity(rank, world, int(os.environ.get("LOCAL_RANK", rank)), int(node))


class LiveMetrics(Protocol):
    def update(self, rows: list[dict] | None, epoch_row: dict) -> None:
        """The epoch's step records (this rank's) and its row, at the epoch's end."""


class Finisher(Protocol):
    def __call__(
        self, run_dir, description: dict, *, status: str | None, error: str | None, started_at, wall_s: float
    ) -> dict:
        """Write the run's summary from its records; returns it."""


@dataclass(frozen=True)
class Parts:
    """What `attach(..., parts=...)` takes from outside the instrument; a part left None falls back.

    Attributes:
        identity: this process's place in the job; None: `identity_from_environment()`.
        live_metrics: a factory `(run name, identity) -> object with update(step_rows, epoch_row)`,
            called at every epoch's end; None: no live metrics.
        finisher: writes summary.json when a job that runs on its own calls `finish()`; None:
            `finish()` writes nothing beyond the records.
    """

    identity: Identity | None = None
    live_metrics: Callable[[str, Identity], LiveMetrics] | None = None
    finisher: Finisher | None = None


def installed_parts() -> Parts:
    """The parts the installed providers give this process (the first provider's answer wins per part)."""
    found: dict = {}
    for entry in entry_points(group=PARTS_ENTRY_POINTS):
        parts = entry.load()()
        if parts is None:
            continue
        for field in dataclasses.fields(Parts):
            if found.get(field.name) is None:
                found[field.name] = getattr(parts, field.name)
    return Parts(**found)
