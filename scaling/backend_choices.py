"""How a lab run names its data-parallel backend: the config's `backend:` values, each with what the lab
offers on it (its torch.distributed process group, gradient compressions, elastic restarts) and what of a
run's config it cannot run. These are the lab's facts, not the instrument's: a user's job attached with
`scaling.instrument.attach` already holds its wrapped model, and the instrument's adapters
(scaling/instrument/backends/) detect it from that; the lab's config (scaling/config.py) and its backends
(scaling/train/backends/, keyed by `kind`) read this module. It imports nothing, so a config validates
without torch.

    choice = for_choice(cfg.backend)        # the backend a run's `backend: <value>` selects
    choice.process_group(cfg.backend, use_gpu), choice.compressions, choice.elastic
    choice.config_problems(cfg)             # what of the run's config it cannot run, one line each
"""

from __future__ import annotations


class BackendChoice:
    """One backend as a lab run names it; the defaults are a backend with no settings of its own."""

    kind = ""  # the instrument adapter's `kind` and the records' name (ddp, fsdp, horovod)
    choices: tuple[str, ...] = ()  # the config's `backend` values that select it
    compressions: tuple[str, ...] = ("none",)  # gradient compressions it can all-reduce with
    elastic = False  # its worker group can shrink and grow between restarts (the lab's workers.min_workers)

    @classmethod
    def process_group(cls, choice: str, use_gpu: bool) -> str:
        """The torch.distributed process-group backend its workers start with, for the run's `choice`."""
        return "nccl" if use_gpu else "gloo"

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        """What of a lab run's config (scaling/config.py's tree, handed in) this backend cannot run, one line
        each naming the key; the config's `validate` refuses the first. The model's shape is the preflight's
        (scaling/train/backends/)."""
        return []


class DDPChoice(BackendChoice):
    kind = "ddp"
    choices = ("auto", "gloo", "nccl")  # DDP on that process group; auto: nccl on GPU, gloo on CPU
    compressions = ("none", "fp16", "bf16")  # PyTorch's compression hooks
    elastic = True

    @classmethod
    def process_group(cls, choice: str, use_gpu: bool) -> str:
        return choice if choice != "auto" else super().process_group(choice, use_gpu)

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        problems = super().config_problems(cfg)
        if cls.process_group(cfg.backend, cfg.workers.use_gpu) == "nccl" and not cfg.workers.use_gpu:
            problems.append("backend nccl needs workers.use_gpu: true")
        if not cfg.instrument.ddp_bucket_cap_mb > 0:  # NaN too
            problems.append(f"instrument.ddp_bucket_cap_mb must be > 0, got {cfg.instrument.ddp_bucket_cap_mb}")
        return problems


class FSDPChoice(BackendChoice):
    kind = "fsdp"
    choices = ("fsdp",)  # FSDP2 on the run's process group: nccl on GPU, gloo on CPU

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        """What the lab's loop cannot run with the parameters sharded."""
        problems = super().config_problems(cfg)
        if cfg.train.precision == "fp16":
            problems.append(
                "train.precision=fp16 scales the loss with GradScaler, whose inf check each shard would make alone "
                f"(torch's ShardedGradScaler is not used by the lab's loop): with backend {cfg.backend} use "
                "train.precision bf16 or fp32 (or fsdp.param_dtype bfloat16)"
            )
        if cfg.data.val_samples < cfg.workers.num_workers:
            problems.append(
                f"backend {cfg.backend} validates with every rank's forward gathering parameters together, so each "
                f"needs a validation sample: data.val_samples ({cfg.data.val_samples}) must be at least the workers "
                f"({cfg.workers.num_workers})"
            )
        return problems


class HorovodChoice(BackendChoice):
    kind = "horovod"
    # The lab runs Horovod's rendezvous over a torch.distributed group (gloo, NCCL on GPU).
    choices = ("horovod",)
    compressions = ("none", "fp16")  # horovod.torch.Compression has no bf16

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        problems = super().config_problems(cfg)
        if not cfg.instrument.horovod_fusion_threshold_mb >= 0:  # NaN too
            problems.append(
                f"instrument.horovod_fusion_threshold_mb must be >= 0, got {cfg.instrument.horovod_fusion_threshold_mb}"
            )
        if not cfg.instrument.horovod_cycle_time_ms > 0:
            problems.append(f"instrument.horovod_cycle_time_ms must be > 0, got {cfg.instrument.horovod_cycle_time_ms}")
        return problems


# In this order, their choices are the config's.
BACKEND_CHOICES: tuple[type[BackendChoice], ...] = (DDPChoice, FSDPChoice, HorovodChoice)


def choices() -> tuple[str, ...]:
    """Every value a run's `backend` setting takes (the lab's config: scaling/config.py)."""
    return tuple(choice for backend in BACKEND_CHOICES for choice in backend.choices)


def for_choice(choice: str) -> type[BackendChoice]:
    """The backend a run's `backend: <choice>` selects."""
    for backend in BACKEND_CHOICES:
        if choice in backend.choices:
            return backend
    raise KeyError(f"backend {choice!r} is none of {', '.join(choices())}")
