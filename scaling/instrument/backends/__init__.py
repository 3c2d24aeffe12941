"""Backend adapters: what differs between DDP, FSDP2, Horovod and a single process, behind one interface.

The instrument (scaling/instrument/meter.py) and the lab's loop (scaling/train/loop.py) never ask
which backend runs; they call the adapter `detect` picks from the objects a job already holds:

    backend = detect(model, optimizer)
    backend.install_timer(clock, inject_delay_s)  # time every collective from now on
    with backend.no_sync(): ...                   # a forward+backward that synchronises no gradients (A/B)
    backend.wait_after_backward()                 # wait for the all-reduces backward launched (timed)
    backend.take()                                # the BucketMarks of the collectives since the last take
    backend.comm_rule                             # how a step's collectives become its figures (timing.py)
    backend.second_opinion(warmup_steps)          # the framework's own comm timers, or None
    backend.checkpoint_state()                    # model and optimizer state for a checkpoint

`Backend` (base.py) documents each method and holds the single process's answers; one module per
adapter overrides what differs: local.py, ddp.py, fsdp.py, horovod.py. A new backend is one more module
here and its line in `ADAPTERS`; the lab's side of it (building the wrapped model and optimizer
from a config) is scaling/train/backends/ (docs/architecture.md lists the files).
"""

from __future__ import annotations

from scaling.instrument.backends.base import Backend
from scaling.instrument.backends.ddp import DDPBackend
from scaling.instrument.backends.fsdp import FSDPBackend
from scaling.instrument.backends.horovod import HorovodBackend
from scaling.instrument.backends.local import LocalBackend

# Asked in this order; the first that claims the job adapts it (the single process, last, claims
# any job of one rank). How a lab run names a backend is the lab's (scaling/backend_choices.py).
ADAPTERS: tuple[type[Backend], ...] = (DDPBackend, FSDPBackend, HorovodBackend, LocalBackend)


def detect(model, optimizer) -> Backend:
    """The adapter for the objects a job trains with."""
    for adapter in ADAPTERS:
        if adapter.claims(model, optimizer):
            return adapter(model, optimizer)
    known = ", ".join(adapter.wraps for adapter in ADAPTERS)
    raise ValueError(
        f"world size > 1 but no backend adapter claims this model and optimizer (it knows {known}): "
        "nothing synchronises the gradients (wrap the model first, e.g. ray.train.torch.prepare_model)"
    )


__all__ = ["ADAPTERS", "Backend", "detect"]
