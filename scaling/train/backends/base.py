"""What the lab needs of each backend to run it, beyond what its instrument adapter answers.

How a run names a backend (the config's `backend` values), its process group and what it offers
(gradient compressions, elastic restarts) are scaling/backend_choices.py's: the config asks it. A
`LabBackend` adds what only the lab's runs need: what only looking at the machine can refuse (for the
preflight), what a run's summary says of it, its communication buffers (for the preflight's memory
estimate), and the wrapped model and optimizer the lab's loop trains with.
"""

from __future__ import annotations


def unchecked_gpu_injection(cfg, checked: bool) -> str | None:
    """The preflight's refusal of a GPU run's injected delay where the instrument adapter's device-side injection
    has not yet run on a GPU (`checked`: the adapter's GPU_INJECTION_CHECKED), or None."""
    if cfg.instrument.inject_comm_delay_s > 0 and cfg.workers.use_gpu and not checked:
        return (
            "instrument.inject_comm_delay_s on GPU runs is refused until the device-side injection has run on a "
            "GPU (scripts/gpu_first_contact.py, docs/gpu.md); run the ground truth on CPU workers (gloo) for now"
        )
    return None


class LabBackend:
    """One backend as the lab runs it; the defaults are a backend without settings of its own."""

    # Whether each rank holds only its shard of the model (FSDP): then every forward gathers the
    # parameters with every rank (the loop validates in lockstep) and every rank takes part in
    # making a checkpoint's state; a replica's (DDP, Horovod) rank 0 makes it alone.
    sharded = False

    def preflight(self, cfg) -> str | None:
        """What only looking at this machine can refuse (one line), or None."""
        return None

    def describe(self, cfg) -> dict:
        """What a run's summary.json says of its backend: `backend` (the name its records use) and its settings."""
        return {"backend": cfg.resolved_backend}

    def state_share(self, cfg) -> float:
        """The share of the model's parameters, gradients and optimizer state one worker holds: 1 for a replica."""
        return 1.0

    def communication_bytes(self, cfg, parameter_bytes: int) -> tuple[int, str]:
        """(bytes, what) each worker holds for communication beyond the model's state, at more than one worker."""
        return 0, ""

    def wrap(self, cfg, ctx, model, optimizer, run_dir):
        """(model, optimizer, close): what the lab's loop trains with, and what it calls after a normal end."""
        return model, optimizer, lambda: None
