"""The lab's backends: what the preflight, the run's summary and the lab's loop ask of each.

    backend = for_choice(cfg.backend)          # the preflight's check, the summary's description, memory
    model, optimizer, close = for_run(cfg, world_size).wrap(cfg, ctx, model, optimizer, run_dir)
    ... train ...
    close()   # after a normal end, on every rank

`LabBackend` (base.py) says what each answers; one module per backend (ddp.py, horovod.py, fsdp.py),
registered in `LAB_BACKENDS` beside the instrument's adapter it goes with
(scaling/instrument/backends/: how a run names the backend, timing, no-sync, checkpoint state).
A new backend is one module here and its line in `LAB_BACKENDS` (docs/architecture.md).
"""

from __future__ import annotations

from scaling.instrument import backends as adapters
from scaling.instrument.backends.ddp import DDPBackend
from scaling.instrument.backends.fsdp import FSDPBackend
from scaling.instrument.backends.horovod import HorovodBackend
from scaling.train.backends.base import LabBackend
from scaling.train.backends.ddp import DDP
from scaling.train.backends.fsdp import FSDP
from scaling.train.backends.horovod import Horovod

LAB_BACKENDS: dict[type[adapters.Backend], LabBackend] = {
    DDPBackend: DDP(),
    HorovodBackend: Horovod(),
    FSDPBackend: FSDP(),
}
# One worker trains the module and optimizer as they are, whatever the choice: nothing to synchronise.
SINGLE_PROCESS = LabBackend()


def for_choice(choice: str) -> LabBackend:
    """The lab's side of the backend a run's `backend: <choice>` selects."""
    return LAB_BACKENDS[adapters.for_choice(choice)]


def for_run(cfg, world_size: int) -> LabBackend:
    """The lab's side of the backend a worker group of `world_size` trains with."""
    return SINGLE_PROCESS if world_size == 1 else for_choice(cfg.backend)
