"""What a projection is asked: one dataclass, `ProjectionSpec`, each field with its meaning and default
once, and the checks a field can make on its own (`__post_init__`); `project.project(spec)` computes it.

    from dataclasses import replace
    spec = ProjectionSpec("resnet50", "p3.16xlarge", nodes=[1, 2, 4, 8, 16])
    df = project(spec)
    fixed = project(replace(spec, bucket_cap_mb=50))  # the same projection with one field changed

A field that `scaling project` offers carries its flag in its metadata (`Flag`: the flag's name, help,
type and where its choices are defined); scaling/cli.py generates the command's options from them, so
a new projection option is one field here. Checks that need the layer table, the cluster or the
compute (a sharded backend needs a transformer; a node count needs an inter-node link) stay with the
computation (project.py), which resolves the spec's names once into a `Resolved` and hands that down.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from scaling.errors import UsageError
from scaling.projection.cluster import Cluster, preset_names
from scaling.projection.compute import PRECISION_ALIASES, MeasuredRun, StepCompute
from scaling.projection.cost import ALGORITHMS
from scaling.schema import PRECISIONS
from scaling.projection.layers import COMPRESSION_BYTES, FSDP_DTYPES, available_models
from scaling.projection.tta import SamplesToTarget

BACKENDS = ("ddp", "horovod", "fsdp", "hsdp")
DEFAULT_NODES = "1,2,4,8,16"  # a projection's node counts unless told (--nodes)
SHARDED = ("fsdp", "hsdp")
# units resharded after forward: torchtitan's (every block but the last), FSDP2's default (every block),
# every block and the root (FSDP2 given reshard_after_forward=True explicitly for the root too), none
RESHARD = ("all-but-last", "all", "all-and-root", "none")
PROCESS_GROUPS = ("nccl", "gloo")  # how FSDP's collectives run (rows.py's module docstring)
ACTIVATION_CHECKPOINTING = ("none", "selective", "full")
# Horovod's defaults since 0.21 (its changelog: cycle time 5 -> 1 ms, fusion buffer 64 -> 128 MB)
HOROVOD_CYCLE_MS = 1.0
HOROVOD_FUSION_MB = 128.0  # MiB (HOROVOD_FUSION_THRESHOLD = 128 x 2**20 bytes)


@dataclass(frozen=True)
class Flag:
    """How a field appears on `scaling project`'s command line. The flag's default is None (unset: the
    field's default, or a run directory's own) unless `set_default`: then the field's."""

    help: str
    name: str | None = None  # default: --the-field-name
    type: Callable[[str], Any] | None = None
    choices: Callable[[], Sequence[str]] | None = None  # read where the choice is defined, when the parser is built
    metavar: str | None = None
    nargs: str | None = None
    set_default: bool = False
    required: bool = False
    to_field: Callable[[Any], Any] | None = None  # the flag's value in the field's unit (milliseconds to seconds)

    def option(self, field_name: str) -> str:
        return self.name or "--" + field_name.replace("_", "-")


def _flag(default: Any = MISSING, **flag: Any) -> Any:
    """A field with its default (none: required) and, given `help`, its command-line flag (`Flag`)."""
    return field(default=default, metadata={"flag": Flag(**flag)} if flag else {})


@dataclass(frozen=True)
class ProjectionSpec:
    """One projection's question: the model, the cluster, the worker counts, and every assumption taken
    unless told. Each field's comment below says what it is and its default; rows.py's module
    docstring defines the columns computed from it."""

    model: str | dict = _flag(
        choices=available_models,
        metavar="MODEL",
        help="model with a layer table: %(choices)s (default: the run's, else resnet50)",
    )
    """A name with a layer table (`layers.available_models()`), or a layer table itself (a dict of that
    shape: from_run.run_layer_table, a measured run's model)."""
    cluster: str | Path | Cluster = _flag(
        required=True,
        help=f"preset ({', '.join(preset_names())}) or a cluster YAML file (scaling/projection/cluster.py)",
    )
    """A preset name, a cluster YAML path, or a `Cluster`."""
    nodes: Sequence[int] | str | None = _flag(
        None, help=f"comma-separated node counts, e.g. 1,2,4 (default {DEFAULT_NODES})"
    )
    """Node counts, all GPUs of each node used."""
    per_gpu_batch: int | None = _flag(
        None,
        type=int,
        help="samples (a transformer: sequences) per GPU per step (default: the run's, else 64; 2 "
        "sequences for a transformer)",
    )
    """Samples per GPU per step: default the run's, else 64 (a transformer: 2 sequences)."""
    precision: str | None = _flag(
        None,
        type=str.lower,
        choices=lambda: (*PRECISIONS, *PRECISION_ALIASES),
        help="fp32, fp16 or bf16; amp and mixed are fp16 autocast, tf32 is fp32 (default: the run's, else fp32)",
    )
    """fp32 | amp (= fp16) | fp16 | bf16: default the run's, else fp32 (a transformer: bf16)."""
    from_run: Any = _flag(
        None,
        type=Path,
        nargs="+",
        metavar="RUN_DIR",
        help="run directory whose step times are the compute (a 1-worker run is best); several "
        "1-worker runs made at the same time, one per future rank, also measure the straggler wait "
        "(default: none, the device table's throughput)",
    )
    """A run (its records' reader, scaling.results.RunDir) whose one-worker step times are the compute, or
    a list of one-worker runs made at the same time, one per future rank, which also give straggler_s
    (compute.compute_from_concurrent_runs); else the cluster device's published throughput, or
    `samples_per_s`."""
    _: KW_ONLY
    workers: Sequence[int] | str | None = _flag(
        None,
        help="comma-separated GPU counts instead of --nodes, e.g. 1,2,4,8,16 (within a node up to its GPUs) "
        "(default: none, --nodes decides)",
    )
    """Worker counts instead of `nodes` (a count up to a node's GPUs stays in one node)."""
    straggler_s: float | None = _flag(
        None,
        name="--straggler-ms",
        type=float,
        to_field=lambda ms: ms / 1e3,
        help="wait for the slowest rank per synchronous step, added to exposed communication "
        "(default: what concurrent --from-run runs measured, else the cluster's step jitter)",
    )
    """Seconds per synchronous step spent waiting for the slowest rank, added to every multi-worker row's
    exposed communication (default: what concurrent runs measured, else the cluster's step jitter at
    each worker count)."""
    overlap_slowdown: float | None = _flag(
        None,
        type=float,
        help="backward compute runs at 1/(1 + this) while an all-reduce overlaps it (default: the "
        "cluster's; a multi-worker run measures it: compute.measured_overlap_slowdown)",
    )
    """The interference term instead of the cluster's (e.g. what a multi-worker run measured)."""
    samples_per_s: float | None = _flag(
        None,
        type=float,
        help="one GPU's training throughput, instead of the device table or a run (default: the "
        "run's, else the device table's)",
    )
    """One GPU's training throughput, instead of the device table or a run."""
    allreduce: str | None = _flag(
        None, choices=lambda: ALGORITHMS, help="all-reduce algorithm (default: the cluster's)"
    )
    """ring | hierarchical: default the cluster's."""
    backend: str = _flag(
        "ddp",
        choices=lambda: BACKENDS,
        help="ddp: DDP's gradient buckets; horovod: Horovod's cycles and Tensor Fusion; fsdp: FSDP's "
        "all-gathers and reduce-scatters per block (a transformer: llama3-8b, gpt2-small, "
        "gpt2-medium); hsdp: sharded inside a node, replicated across nodes (default ddp; a run "
        "directory: the run's own, fsdp where its job sharded)",
    )
    """ddp (buckets), horovod (cycles and Tensor Fusion), fsdp or hsdp (a transformer's FSDP units)."""
    mfu: float | None = _flag(
        None,
        type=float,
        help="a transformer's compute rate as model FLOPs utilisation, e.g. 0.35 (default: the "
        "device's published one, else required)",
    )
    """A transformer's compute rate, its model FLOPs utilisation (default the device's published one,
    compute.TRANSFORMER_MFU)."""
    activation_checkpointing: str | None = _flag(
        None,
        choices=lambda: ACTIVATION_CHECKPOINTING,
        help="transformers: activations held and recomputed (default selective, torchtitan's)",
    )
    """none | selective | full: the activations held and the recomputation in backward (default
    selective, torchtitan's, for a transformer; none otherwise)."""
    reshard_after_forward: bool | str = _flag(
        "all-but-last",
        choices=lambda: RESHARD,
        help="--backend fsdp/hsdp: the blocks freed after forward and gathered again for backward "
        "(default: a run directory's own, as FSDP2 ran it, else all-but-last, torchtitan's; all: FSDP2's "
        "default; all-and-root: the root too; none: kept to backward)",
    )
    """Which blocks FSDP frees after forward and gathers again for backward: all-but-last (torchtitan's
    policy), all (FSDP2's default, `True`), all-and-root (the root too: FSDP2 given
    `reshard_after_forward=True` explicitly), none (`False`)."""
    fsdp_param_dtype: str | None = _flag(
        None,
        choices=lambda: FSDP_DTYPES,
        help="--backend fsdp/hsdp: the parameters' dtype in the all-gather (default: the precision)",
    )
    """The parameters' dtype in the all-gather and compute (default the compute precision)."""
    fsdp_reduce_dtype: str = _flag(
        "fp32",
        choices=lambda: FSDP_DTYPES,
        set_default=True,
        help="--backend fsdp/hsdp: the gradients' dtype in the reduce-scatter (default fp32, torchtitan's)",
    )
    """The gradients' dtype in the reduce-scatter: fp32 (torchtitan's MixedPrecisionPolicy default) or bf16."""
    fsdp_process_group: str = "nccl"
    """nccl (collectives beside compute) or gloo (CPUs: collectives hold compute; the reduce-scatter
    costs an all-reduce; backend fsdp only)."""
    horovod_cycle_time_ms: float | None = _flag(
        None, type=float, help="--backend horovod: HOROVOD_CYCLE_TIME (default 1, Horovod's since 0.21; 5 before)"
    )
    """Horovod's cycle time, as the lab's `instrument.horovod_cycle_time_ms` (default HOROVOD_CYCLE_MS)."""
    horovod_fusion_threshold_mb: float | None = _flag(
        None,
        type=float,
        help="--backend horovod: fusion buffer in MiB (default 128, Horovod's since 0.21; 64 before)",
    )
    """Horovod's fusion buffer in MiB, as the lab's `instrument.*` (default HOROVOD_FUSION_MB)."""
    grad_compression: str | None = _flag(
        None,
        choices=lambda: tuple(COMPRESSION_BYTES),
        help="DDP compression hook: gradients on the wire in 2 bytes (default: the run's, else none)",
    )
    """none | fp16 | bf16: DDP's compression hooks, 2 bytes per gradient element on the wire (default the
    run's, else none)."""
    bucket_cap_mb: float | None = _flag(
        None,
        type=float,
        help="DDP bucket_cap_mb given explicitly (default: the run's; else DDP's default, 25 MiB with a 1 MiB first "
        "bucket)",
    )
    """Given to DDP explicitly (first bucket = the same cap); default the run's
    `instrument.ddp_bucket_cap_mb`, else DDP's own default (no argument: 25 MiB, first bucket 1 MiB). The
    lab always passes it (25.0 by default), so projections from its runs have no 1 MiB first bucket."""
    dataset_size: int | None = _flag(
        None,
        type=int,
        help="samples per epoch (default: the run's, else the model's usual dataset, e.g. ImageNet 1,281,167)",
    )
    """Samples per epoch: default the run's, else the model's usual dataset."""
    epochs_to_target: Mapping[int, float] | str | None = _flag(
        None,
        metavar="BATCH:EPOCHS,...|SWEEP",
        help="epochs to the target accuracy measured at global batches, e.g. 256:30,1024:31, or a sweep "
        "directory whose runs measured them (the median per global batch of those that reached it), for TTA "
        "(default: none, no TTA columns)",
    )
    """{global batch: epochs} measured at smaller scale, or a sweep directory that measured them, for TTA
    (tta.parse_epochs_table)."""
    samples_to_target: SamplesToTarget | None = None
    """The samples-to-target model of epochs to target beyond the measured batches, from a measured gradient
    noise scale (scaling/projection/tta.py): a run's own (from_run), or --noise-scale with --epochs-to-target."""
    compute: StepCompute | None = None
    """One worker's step, given, instead of from_run, samples_per_s or the device."""
    measured: MeasuredRun | None = None
    """A measured run of the user's job (from_run.run_spec), whose step the compute stage puts on the target
    (compute.MeasuredRun), instead of `compute`."""
    compute_spread: tuple[float, float] | None = None
    """The ends of one worker's compute as factors of it (from_run: the run's 2.5th and 97.5th percentiles of
    per-step compute over their mean): each of rows.FIGURES gets `_lo` and `_hi` columns, the lowest and highest
    of the projection at either end. Needs `compute` or `measured`."""

    def __post_init__(self) -> None:
        if isinstance(self.reshard_after_forward, bool):
            object.__setattr__(self, "reshard_after_forward", "all" if self.reshard_after_forward else "none")
        _choice("activation checkpointing", self.activation_checkpointing, ACTIVATION_CHECKPOINTING, optional=True)
        _choice("fsdp_reduce_dtype", self.fsdp_reduce_dtype, FSDP_DTYPES)
        _choice("fsdp_process_group", self.fsdp_process_group, PROCESS_GROUPS)
        if self.fsdp_process_group == "gloo" and self.backend != "fsdp":
            raise UsageError(f"fsdp_process_group gloo is modelled for backend fsdp only, not {self.backend}")
        _choice("fsdp_param_dtype", self.fsdp_param_dtype, FSDP_DTYPES, optional=True)
        if self.reshard_after_forward not in RESHARD:
            raise UsageError(
                f"reshard_after_forward must be one of {', '.join(RESHARD)} (or True / False), "
                f"got {self.reshard_after_forward!r}"
            )
        for name in ("overlap_slowdown", "straggler_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise UsageError(f"{name} must be a number >= 0, got {value!r}")
        _choice("grad_compression", self.grad_compression, tuple(COMPRESSION_BYTES), optional=True)
        _choice("backend", self.backend, BACKENDS)
        cycle_ms, fusion_mb = self.horovod_cycle_ms, self.horovod_fusion_mb
        if self.backend == "horovod" and not (
            isinstance(cycle_ms, (int, float))
            and cycle_ms > 0
            and isinstance(fusion_mb, (int, float))
            and fusion_mb >= 0
        ):
            raise UsageError(
                f"Horovod cycle time must be > 0 ms and fusion threshold >= 0 MB, got {cycle_ms!r}, {fusion_mb!r}"
            )
        if self.measured is not None and self.compute is not None:
            raise UsageError("give a spec compute or a measured run, not both")
        if self.compute_spread is not None and self.compute is None and self.measured is None:
            raise UsageError("compute_spread needs the spec's compute or a measured run")
        if self.bucket_cap_mb is not None and not (
            isinstance(self.bucket_cap_mb, (int, float)) and self.bucket_cap_mb > 0
        ):
            raise UsageError(f"bucket_cap_mb must be a positive number, got {self.bucket_cap_mb!r}")

    @property
    def horovod_cycle_ms(self) -> float:
        return HOROVOD_CYCLE_MS if self.horovod_cycle_time_ms is None else self.horovod_cycle_time_ms

    @property
    def horovod_fusion_mb(self) -> float:
        return HOROVOD_FUSION_MB if self.horovod_fusion_threshold_mb is None else self.horovod_fusion_threshold_mb


def _choice(what: str, value: Any, choices: Sequence[str], optional: bool = False) -> None:
    if (value is not None or not optional) and value not in choices:
        raise UsageError(f"{what} must be one of {', '.join(choices)}, got {value!r}")


def flag_fields() -> list[tuple[str, Flag]]:
    """(field name, its `Flag`) for every field `scaling project` offers, in the spec's order."""
    return [(f.name, f.metadata["flag"]) for f in fields(ProjectionSpec) if "flag" in f.metadata]


@dataclass(frozen=True)
class Resolved:
    """A spec with its names resolved once (project._resolve), what every stage of a projection is handed."""

    spec: ProjectionSpec
    table: dict  # the model's layer table (layers.py), loaded once
    model: str
    transformer: bool  # the table holds FSDP units and per-token FLOPs
    checkpointing: str  # activation checkpointing: the spec's, else selective for a transformer, none otherwise
    cluster: Cluster  # with the spec's all-reduce algorithm and overlap slowdown
    rows_at: list[tuple[int, int]]  # (nodes, GPUs per node) per row, the 1-GPU baseline first
