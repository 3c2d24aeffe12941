"""The lab's backends: what the preflight, the run's summary and the lab's loop ask of each.

    backend = for_choice(cfg.backend)          # the preflight's check, the summary's description, memory
    model, optimizer, close = for_run(cfg, world_size).wrap(cfg, ctx, model, optimizer, run_dir)
    ... train ...
    close()   # after a normal end, on every rank

`LabBackend` (base.py) says what each answers; one module per backend (ddp.py, horovod.py, fsdp.py),
registered in `LAB_BACKENDS` by its kind: how a run names it, with what it offers and cannot run, is
scaling/backend_choices.py; timing, no-sync and checkpoint state are the instrument's adapter's
(scaling/instrument/backends/).
A new backend is one module here and its line in `LAB_BACKENDS` (docs/architecture.md).
"""

from __future__ import annotations

from scaling import backend_choices
from scaling.train.backends.base import LabBackend
from scaling.train.backends.ddp import DDP
from scaling.train.backends.fsdp import FSDP
from scaling.train.backends.horovod import Horovod

# keyed by the backend's kind (scaling/backend_choices.py; the instrument adapter's `kind`)
LAB_BACKENDS: dict[str, LabBackend] = {"ddp": DDP(), "horovod": Horovod(), "fsdp": FSDP()}
# One worker trains the module and optimizer as they are, whatever the choice: nothing to synchronise.
SINGLE_PROCESS = LabBackend()


def for_choice(choice: str) -> LabBackend:
    """The lab's side of the backend a run's `backend: <choice>` selects."""
    return LAB_BACKENDS[backend_choices.for_choice(choice).kind]


def for_run(cfg, world_size: int) -> LabBackend:
    """The lab's side of the backend a worker group of `world_size` trains with."""
    return SINGLE_PROCESS if world_size == 1 else for_choice(cfg.backend)
