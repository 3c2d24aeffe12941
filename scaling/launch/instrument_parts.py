"""The lab's parts for an instrument it did not attach itself: a user's job, or a user's function under `scaling run`.

Registered in pyproject.toml as the entry point `scaling.instrument.parts` (`lab`), which
`attach` asks when its caller passes no parts (scaling/instrument/parts.py says why this way):

- inside a Ray Train worker: Ray's identity of the worker and Ray's live metrics
  (scaling/launch/live_metrics.py); elsewhere neither (the instrument falls back to
  torch.distributed and torchrun's variables, and exports nothing live);
- the lab's run finalisation (`scaling.launch.finish.write_summary`: summary.json, the merged
  trace, the exports), which `finish()` of a job on its own calls.

Ray is looked for only where it is already imported (a Ray worker imports it before any user
code): a torchrun job never imports it, installed or not.
"""

from __future__ import annotations

import sys

from scaling.instrument.parts import Identity, Parts
from scaling.launch.finish import write_summary


def ray_train_identity() -> Identity | None:
    """This Ray Train worker's identity; None outside a Ray Train training function."""
    if "ray" not in sys.modules:
        return None
    import ray.train

    try:
        context = ray.train.get_context()
    except RuntimeError:  # Ray, but not inside a function launched by trainer.fit()
        return None
    return Identity(
        context.get_world_rank(), context.get_world_size(), context.get_local_rank(), context.get_node_rank()
    )


def lab_parts() -> Parts:
    identity = ray_train_identity()
    if identity is None:
        return Parts(finisher=write_summary)
    from scaling.launch.live_metrics import RayLiveMetrics

    return Parts(identity=identity, live_metrics=RayLiveMetrics, finisher=write_summary)
