"""One typed config tree for a run, loaded from YAML, with `--set a.b=value` overrides.

Every field has a type, a default and a docstring-like comment with its unit. Unknown keys
and wrong types are refused with a `ConfigError` naming the key and the valid ones; values
are checked for sense (`validate`). The resolved tree is written into every run directory
(`to_yaml`), so a result can always be traced to exactly what produced it.

    cfg = load_config("experiments/quickstart.yaml", overrides=["optim.lr=0.2"])

This module is data and shape only: closed choices are `Literal` types (or a registry's values:
the backends) refused when the tree is built, `validate` checks values against each other (a
backend's own settings, and what it cannot run, beside the backend: its adapter's
`config_problems`, scaling/instrument/backends/), and nothing here reads a file other than the
config itself, imports a user's code, or asks the machine or the cluster anything. Whatever looks
at the world (datasets, import paths, cluster YAMLs, Horovod, GPUs, capacity) is the preflight,
`scaling/launch/preflight.py`, which runs before any file of a run is written.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import yaml

from scaling.errors import UsageError
from scaling.instrument.settings import InstrumentSettings
from scaling.schema import PRECISIONS


class ConfigError(UsageError):
    """A config that cannot be run. The message is one line meant for the user."""


class RegistryChoice:
    """A closed choice whose values a registry holds (`Annotated[str, RegistryChoice(...)]`), asked
    when a tree is built: the values live with what serves them, not in a list kept here."""

    def __init__(self, values):
        self.values = values  # () -> the valid values


def _backend_choices() -> tuple[str, ...]:
    from scaling.backend_choices import choices

    return choices()


# Closed choices, as types: `_coerce` refuses any other value when the tree is built.
Backend = Annotated[str, RegistryChoice(_backend_choices)]  # the backend adapters' (scaling/instrument/backends/)
Schedule = Literal["constant", "cosine"]
LrRule = Literal["linear", "sqrt", "constant"]
CompileBackend = Literal["inductor", "aot_eager"]
OptimizerName = Literal["sgd", "adamw"]
TtaRule = Literal["first_eval", "epoch_end"]
TargetMetric = Literal["top1", "top5", "val_loss"]
Precision = Literal[PRECISIONS]  # scaling/schema.py
GradCompression = Literal["none", "fp16", "bf16"]
Market = Literal["on_demand", "spot"]
FsdpDtype = Literal["float32", "bfloat16"]
FsdpShard = Literal["blocks", "root"]


@dataclass
class ModelConfig:
    # a name from scaling.models.model_names(), or a user's model by import path package.module:callable (taking
    # num_classes)
    name: str = "small_cnn"


@dataclass
class DataConfig:
    # embedded (learnable, generated from seed) | synthetic (random, throughput only) | cifar10 | imagenet | tokens
    # (token sequences by a learnable rule, generated from seed) | tokens_file (uint16 token ids, nanoGPT's
    # train.bin/val.bin or llm.c's .bin, under path) | a user's by import path package.module:callable (taking this data
    # config, returning train_x, train_y, val_x, val_y)
    name: str = "embedded"
    seed: int = 0  # generates the embedded dataset; the same seed gives the same images
    num_classes: int = 10  # token data: the vocabulary (ids in [0, num_classes); 50257 for GPT-2's tokenizer)
    image_size: int = 32  # pixels per side
    train_samples: int = 8192  # embedded: training-set size; synthetic: samples per epoch
    val_samples: int = 2048  # embedded: held-out validation-set size (ignored by synthetic)
    difficulty: float = 1.0  # embedded: noise scale; higher is harder (see scaling/data/embedded.py)
    # cifar10: the cifar-10-batches-py folder; imagenet: the folder holding train/ and val/; tokens_file: a .bin of
    # uint16 ids (its last val_samples windows validate) or a folder with train.bin and val.bin
    path: str = ""
    seq_len: int = 64  # tokens, tokens_file: tokens per sample (a window; the model's context at most)
    token_noise: float = (
        0.1  # tokens: probability that a token is drawn at random instead of by the rule (sets the loss floor)
    )
    loader_workers: int = 2  # imagenet: Pillow-decoding DataLoader processes per training worker


@dataclass
class OptimConfig:
    # sgd (Nesterov momentum) | adamw (decoupled weight decay; GPT-2's); torch's fused kernels on CUDA
    # (scaling/train/optimizer.py)
    name: OptimizerName = "sgd"
    lr: float = 0.1  # learning rate at `reference_batch`; scaled with the global batch by `lr_rule`
    reference_batch: int = 256  # global batch at which `lr` applies
    # how the peak rate follows the global batch B: linear (lr x B / reference_batch: Goyal et al. 2017) | sqrt
    # (lr x sqrt(B / reference_batch)) | constant (lr); the samples-to-target projection takes it as its input
    # (scaling/projection/tta.py: the linear rule tracks the best rate only below the gradient noise scale)
    lr_rule: LrRule = "linear"
    momentum: float = 0.9  # sgd: momentum (Nesterov); adamw: beta1, the gradient average's decay
    adam_beta2: float = 0.95  # adamw: beta2, the squared gradient average's decay (0.95: nanoGPT's and GPT-3's)
    weight_decay: float = 5e-4
    warmup_epochs: float = 1.0  # linear ramp from `lr` to the scaled lr over this many epochs
    schedule: Schedule = "constant"  # after warm-up: constant | cosine (to 0 at train.max_epochs)


@dataclass
class TrainConfig:
    per_worker_batch: int = 64  # samples per worker per step; global batch = this x workers
    max_epochs: int = 10
    target_accuracy: float = 0.8  # validation top-1 accuracy in (0, 1] that stops the run (TTA)
    seed: int = 0  # model init and data order
    # validate every this fraction of an epoch (0.25: four times per epoch), and at every epoch's end; 1/eval_every must
    # be a whole number
    eval_every: float = 1.0
    # TTA = training time to: first_eval (the first evaluation at the target) | epoch_end (the end of the first epoch at
    # the target: DAWNBench's rule, always in tta_epoch_end_s)
    tta_rule: TtaRule = "first_eval"
    # what the target applies to: top1 | top5 (validation accuracy >= target_accuracy; DAWNBench ImageNet: top5) |
    # val_loss (validation cross-entropy <= target_loss)
    target_metric: TargetMetric = "top1"
    # with target_metric val_loss: the validation loss (nats per token for a language model) that stops the run;
    # modded-nanogpt's GPT-2 speedrun: 3.28
    target_loss: float = 0.0
    precision: Precision = "fp32"  # fp32 | fp16 (autocast + GradScaler) | bf16 (autocast)
    channels_last: bool = False  # NHWC memory layout for model and inputs (faster convolutions on tensor cores)
    # torch.compile the model, with DDP or FSDP2 (scaling/train/compile.py): the first steps pay compilation; they are
    # warm-up (instrument.warmup_steps >= 2), out of the steady-state figures, and their extra time is the first epoch
    # row's compile_s
    compile: bool = False
    # with compile: inductor (generates kernels: the fast one) | aot_eager (traces forward and backward, generates
    # nothing: checks a compiled run's function in seconds on a CPU)
    compile_backend: CompileBackend = "inductor"
    label_smoothing: float = 0.0  # cross-entropy label smoothing (0.1 in the MLPerf ResNet-50 reference)
    # a user's Ray Train train function by import path (package.module:callable taking one config dict) run instead of
    # the lab's loop; "" = the lab's loop
    function: str = ""
    function_config: dict = field(
        default_factory=dict
    )  # what `function` receives as its config, plus the lab's keys (see scaling/train/user_function.py)


@dataclass
class WorkersConfig:
    num_workers: int = 1  # data-parallel workers (ranks); `--workers N` sets it
    # elastic (Ray launcher): after losing workers (a node), go on with as few as this many instead of waiting for the
    # capacity, with the same global batch (each worker's batch grows); back to num_workers when the capacity returns; 0
    # = a fixed count
    min_workers: int = 0
    cpus_per_worker: int = 1  # CPUs reserved per worker; torch's thread count is set to this
    use_gpu: bool = False  # one GPU per worker
    node_price_per_hour: float = 0.0  # USD per node-hour actually paid, for cost-to-accuracy (DAWNBench); 0 = unknown
    # on_demand | spot: the market the nodes (and node_price_per_hour) are on; spot: the price paid, not the on-demand
    # list price
    market: Market = "on_demand"
    # the cluster this runs on, for projection: a preset (p3.16xlarge, scaling/projection/presets) or a cluster YAML;
    # `scaling report` then draws projected curves over the measured points; "" = none
    cluster: str = ""
    # CPU list (taskset syntax: "0-3,6") the training threads are pinned to, on each node: local rank r takes the r-th
    # group of cpus_per_worker CPUs; keep the cluster's own processes off them (start Ray under `taskset -c`); "" = no
    # pinning
    pin_cpus: str = ""
    # minicluster only: cap every node's link to this tc rate for the run (100mbit, 1gbit, uncapped); "" = as it is
    link_bandwidth: str = ""


@dataclass
class InstrumentConfig(InstrumentSettings):
    """The instrument's settings (scaling/instrument/settings.py: warmup_steps, calibration_pairs, the
    injections, trace_steps, step_timing, telemetry_interval_s), and how the lab sets up each backend."""

    ddp_bucket_cap_mb: float = 25.0  # DDP gradient bucket size (PyTorch's default is 25)
    grad_compression: GradCompression = (
        "none"  # all-reduce gradients as: none (fp32) | fp16 | bf16 (DDP's compression hooks, still timed)
    )
    # backend horovod: tensor-fusion buffer (HOROVOD_FUSION_THRESHOLD), MiB; 0 = no fusion; 128 is Horovod's default
    horovod_fusion_threshold_mb: float = 128.0
    # backend horovod: how often Horovod's background thread negotiates and launches (HOROVOD_CYCLE_TIME), ms; 1 is
    # Horovod's default
    horovod_cycle_time_ms: float = 1.0
    horovod_timeline: bool = (
        False  # backend horovod: rank 0 writes horovod_timeline.json (Chrome trace) into the run directory
    )
    fail_at_step: int = -1  # fault injection: rank 0 raises at this global step (tests of failure handling); -1 = never


@dataclass
class FsdpConfig:
    """backend fsdp (FSDP2's fully_shard; scaling/train/backends/fsdp.py): what is sharded and how."""

    # free each block's gathered parameters after its forward and gather them again in backward (ZeRO-3); the root stays
    # gathered, FSDP2's default for it (scaling/train/backends/fsdp.py); false keeps them all to backward (fewer
    # all-gathers, more memory)
    reshard_after_forward: bool = True
    # float32 | bfloat16: the dtype parameters are gathered and computed in (MixedPrecisionPolicy.param_dtype); the
    # sharded parameters and optimizer state stay float32
    param_dtype: FsdpDtype = "float32"
    reduce_dtype: FsdpDtype = (
        "float32"  # float32 | bfloat16: the dtype gradients are reduce-scattered in (MixedPrecisionPolicy.reduce_dtype)
    )
    # blocks: fully_shard each module of the model's outermost nn.ModuleLists (a transformer's blocks), then the root |
    # root: the whole model as one unit
    shard: FsdpShard = "blocks"


@dataclass
class FailureConfig:
    # worker-group restarts Ray Train may make after a worker dies or its node is lost (Ray launcher); 0 = fail at once
    max_failures: int = 1
    # per restart, seconds to wait for the workers' resources (a lost node back, or its replacement started) before the
    # run fails with one line
    capacity_wait_s: float = 300.0
    checkpoint_every_epochs: int = (
        1  # checkpoint (model, optimizer, schedule, counters, RNG, records) every N epochs; 0 = never
    )


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    # auto (DDP; nccl on GPU, gloo on CPU) | gloo | nccl (DDP on that process group) | horovod (Horovod's
    # DistributedOptimizer; gloo, NCCL on GPU) | fsdp (FSDP2's fully_shard; gloo, NCCL on GPU; its settings under fsdp:)
    backend: Backend = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    instrument: InstrumentConfig = field(default_factory=InstrumentConfig)
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    failure: FailureConfig = field(default_factory=FailureConfig)

    @property
    def global_batch(self) -> int:
        return self.train.per_worker_batch * self.workers.num_workers

    @property
    def lr_scale(self) -> float:
        """The peak learning rate over `optim.lr`: `optim.lr_rule` at this global batch."""
        ratio = self.global_batch / self.optim.reference_batch
        return {"linear": ratio, "sqrt": ratio**0.5, "constant": 1.0}[self.optim.lr_rule]

    @property
    def resolved_backend(self) -> str:
        """The torch.distributed process-group backend the workers start with (the run's backend says which)."""
        from scaling.backend_choices import for_choice

        return for_choice(self.backend).process_group(self.backend, self.workers.use_gpu)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# --- building a typed tree from plain data ---------------------------------------------------


def _field_types(cls) -> dict[str, type]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value, expected: type, key: str):
    """Check `value` against a field's type. ints are accepted for floats, and for strings as their
    digits (`--set workers.pin_cpus=0` is the CPU list "0"); nothing else is converted. A `Literal`
    field, or one annotated with a `RegistryChoice`, takes one of its values only."""
    choices = None
    if typing.get_origin(expected) is Literal:
        choices = typing.get_args(expected)
    elif typing.get_origin(expected) is Annotated:
        expected, *marks = typing.get_args(expected)
        choices = next((mark.values() for mark in marks if isinstance(mark, RegistryChoice)), None)
    if choices is not None:
        if value not in choices or isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be one of {', '.join(map(str, choices))}; got {value!r}")
        return value
    if dataclasses.is_dataclass(expected):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        return _build(expected, value, key + ".")
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is str and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if expected is int and isinstance(value, bool):
        raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise ConfigError(f"config key '{key}' must be of type {expected.__name__}, got {value!r}")
    return value


def _build(cls, data: dict, prefix: str = ""):
    types_by_name = _field_types(cls)
    for key in data:
        if key not in types_by_name:
            raise ConfigError(f"unknown config key '{prefix}{key}'; valid keys here: {', '.join(types_by_name)}")
    kwargs = {name: _coerce(value, types_by_name[name], prefix + name) for name, value in data.items()}
    return cls(**kwargs)


def from_dict(data: dict) -> ExperimentConfig:
    if not isinstance(data, dict):
        raise ConfigError("a config file must hold a YAML mapping at the top level")
    return _build(ExperimentConfig, data)


def _parse_override(text: str) -> tuple[list[str], object]:
    if "=" not in text:
        raise ConfigError(f"--set expects key=value (e.g. optim.lr=0.2), got {text!r}")
    key, raw = text.split("=", 1)
    # YAML parsing gives the natural types: 0.2 -> float, 8 -> int, true -> bool, gloo -> str.
    return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else raw


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b=value` overrides to plain config data; unknown keys are caught by `from_dict`."""
    for text in overrides:
        path, value = _parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {text!r}: '{part}' is not a section")
            node = child
        node[path[-1]] = value
    return data


def read_config_file(path: str | Path) -> dict:
    """A config file's plain data (a mapping), or one clear ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        # PyYAML's message spans several lines (the context, a caret under the text); the one line keeps
        # where the problem is (1-based, as editors count) and what it is.
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a YAML mapping at the top level")
    return data


def load_config(
    path: str | Path, overrides: list[str] | None = None, num_workers: int | None = None
) -> ExperimentConfig:
    data = read_config_file(path)
    data.pop("sweep", None)  # the sweep grid belongs to `scaling sweep` (scaling/launch/sweep.py)
    data = apply_overrides(data, overrides or [])
    cfg = from_dict(data)
    if num_workers is not None:
        cfg.workers.num_workers = num_workers
    validate(cfg)
    return cfg


# --- sense checks --------------------------------------------------------------------------


def parse_cpu_list(text: str) -> list[int]:
    """taskset's CPU list syntax ("0-3,6") -> [0, 1, 2, 3, 6], in the order written, no repeats."""
    cpus: list[int] = []
    for part in str(text).replace(" ", "").split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()) or (sep and int(high) < int(low)):
            raise ConfigError(f"workers.pin_cpus must be a CPU list like 0-3,6; got {text!r}")
        for cpu in range(int(low), int(high if sep else low) + 1):
            if cpu not in cpus:
                cpus.append(cpu)
    return cpus


def _check_tokens(cfg: ExperimentConfig, require) -> None:
    """Token data goes to a language model and images to an image model (registry models; a user's own is not
    known here), and a sequence fits the model's context."""
    from scaling.data import TOKEN_DATASETS
    from scaling.import_path import is_import_path
    from scaling.models import context_length

    tokens = cfg.data.name in TOKEN_DATASETS
    if tokens:
        require(cfg.data.seq_len >= 1, f"data.seq_len must be >= 1, got {cfg.data.seq_len}")
        require(0.0 <= cfg.data.token_noise < 1.0, f"data.token_noise must be in [0, 1), got {cfg.data.token_noise}")
    if is_import_path(cfg.model.name) or is_import_path(cfg.data.name):
        return
    context = context_length(cfg.model.name)
    require(
        tokens or context is None,
        f"model.name {cfg.model.name} is a language model (token ids in): use data.name tokens or tokens_file, not "
        f"{cfg.data.name}",
    )
    require(
        not tokens or context is not None,
        f"data.name {cfg.data.name} gives token ids: use a language model (gpt2-tiny, gpt2-small), not "
        f"{cfg.model.name}",
    )
    if tokens:
        require(
            cfg.data.seq_len <= context,
            f"data.seq_len={cfg.data.seq_len} is longer than {cfg.model.name}'s context of {context} tokens",
        )


def validate(cfg: ExperimentConfig) -> None:
    """Refuse values that cannot give a meaningful run, naming the key and the fix.

    Shape only: values against their ranges and against each other; the selected backend's adapter
    says what of its own it cannot run (`config_problems`). A model or dataset named by import path
    is checked by the preflight (scaling/launch/preflight.py), which imports it."""
    from scaling.data import dataset_names
    from scaling.import_path import is_import_path
    from scaling.models import model_names

    def require(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    if not is_import_path(cfg.model.name):
        require(
            cfg.model.name in model_names(),
            f"unknown model.name {cfg.model.name!r}; valid: {', '.join(model_names())} "
            "or a model of your own as package.module:callable",
        )
    if not is_import_path(cfg.data.name):
        require(
            cfg.data.name in dataset_names(),
            f"unknown data.name {cfg.data.name!r}; valid: {', '.join(dataset_names())} "
            "or a dataset of your own as package.module:callable",
        )
    from scaling.backend_choices import BACKEND_CHOICES, for_choice
    from scaling.instrument.backends import ADAPTERS

    backend = for_choice(cfg.backend)
    adapter = next(a for a in ADAPTERS if a.kind == backend.kind)  # where the instrument can inject a delay
    require(
        cfg.instrument.grad_compression in backend.compressions,
        f"backend {cfg.backend} compresses gradients as {' or '.join(backend.compressions)}, "
        f"got instrument.grad_compression={cfg.instrument.grad_compression!r}",
    )
    require(cfg.workers.num_workers >= 1, f"workers must be >= 1, got {cfg.workers.num_workers}")
    require(
        cfg.workers.cpus_per_worker >= 1, f"workers.cpus_per_worker must be >= 1, got {cfg.workers.cpus_per_worker}"
    )
    require(cfg.train.per_worker_batch >= 1, f"train.per_worker_batch must be >= 1, got {cfg.train.per_worker_batch}")
    require(cfg.train.max_epochs >= 1, f"train.max_epochs must be >= 1, got {cfg.train.max_epochs}")
    require(
        0.0 < cfg.train.target_accuracy <= 1.0,
        f"train.target_accuracy must be in (0, 1], got {cfg.train.target_accuracy}",
    )
    require(cfg.optim.lr > 0, f"optim.lr must be > 0, got {cfg.optim.lr}")
    require(cfg.optim.reference_batch >= 1, f"optim.reference_batch must be >= 1, got {cfg.optim.reference_batch}")
    require(0.0 <= cfg.optim.momentum < 1.0, f"optim.momentum must be in [0, 1), got {cfg.optim.momentum}")
    require(0.0 <= cfg.optim.adam_beta2 < 1.0, f"optim.adam_beta2 must be in [0, 1), got {cfg.optim.adam_beta2}")
    require(cfg.optim.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {cfg.optim.weight_decay}")
    require(cfg.optim.warmup_epochs >= 0, f"optim.warmup_epochs must be >= 0, got {cfg.optim.warmup_epochs}")
    if cfg.workers.pin_cpus:
        cpus = parse_cpu_list(cfg.workers.pin_cpus)
        require(
            len(cpus) >= cfg.workers.cpus_per_worker,
            f"workers.pin_cpus={cfg.workers.pin_cpus!r} names {len(cpus)} CPU(s), fewer than "
            f"workers.cpus_per_worker={cfg.workers.cpus_per_worker}",
        )
    require(
        cfg.workers.node_price_per_hour >= 0,
        f"workers.node_price_per_hour must be >= 0, got {cfg.workers.node_price_per_hour}",
    )
    require(cfg.data.num_classes >= 2, f"data.num_classes must be >= 2, got {cfg.data.num_classes}")
    require(cfg.data.image_size >= 8, f"data.image_size must be >= 8, got {cfg.data.image_size}")
    require(cfg.data.difficulty > 0, f"data.difficulty must be > 0, got {cfg.data.difficulty}")
    require(cfg.data.train_samples >= 1, f"data.train_samples must be >= 1, got {cfg.data.train_samples}")
    require(
        0 < cfg.train.eval_every <= 1 and abs(1 / cfg.train.eval_every - round(1 / cfg.train.eval_every)) < 1e-9,
        f"train.eval_every must be 1/k for a whole k (1, 0.5, 0.25, ...), got {cfg.train.eval_every}",
    )
    require(
        not (cfg.train.target_metric == "top5" and cfg.data.num_classes <= 5),
        "train.target_metric top5 needs more than 5 classes",
    )
    require(
        cfg.train.target_metric != "val_loss" or cfg.train.target_loss > 0,
        "train.target_metric val_loss needs train.target_loss > 0 (the validation loss to reach), got "
        f"{cfg.train.target_loss}",
    )
    _check_tokens(cfg, require)
    require(
        not cfg.train.compile or cfg.instrument.warmup_steps >= 2,
        f"train.compile compiles in the first steps, which must be warm-up steps, with one more to time the others "
        f"by (compile_s): instrument.warmup_steps must be >= 2, got {cfg.instrument.warmup_steps}",
    )
    require(
        0.0 <= cfg.train.label_smoothing < 1.0,
        f"train.label_smoothing must be in [0, 1), got {cfg.train.label_smoothing}",
    )
    require(cfg.data.loader_workers >= 0, f"data.loader_workers must be >= 0, got {cfg.data.loader_workers}")
    require(cfg.data.val_samples >= 1, f"data.val_samples must be >= 1, got {cfg.data.val_samples}")
    require(cfg.failure.max_failures >= 0, f"failure.max_failures must be >= 0, got {cfg.failure.max_failures}")
    require(
        0 <= cfg.workers.min_workers <= cfg.workers.num_workers,
        f"workers.min_workers must be between 0 (a fixed count) and workers.num_workers ({cfg.workers.num_workers}), "
        f"got {cfg.workers.min_workers}",
    )
    if cfg.workers.min_workers:
        # the global batch is kept at every count an elastic run may take, so each must divide it
        uneven = [k for k in range(cfg.workers.min_workers, cfg.workers.num_workers + 1) if cfg.global_batch % k]
        require(
            not uneven,
            f"workers.min_workers={cfg.workers.min_workers}: an elastic run keeps the global batch "
            f"({cfg.global_batch}), which {uneven[0] if uneven else 0} workers cannot share evenly; choose "
            "train.per_worker_batch or the worker counts so that every count from min_workers to num_workers divides "
            "it",
        )
        elastic = [choice for each in BACKEND_CHOICES if each.elastic for choice in each.choices]
        require(
            backend.elastic and not cfg.train.function,
            f"workers.min_workers (elastic) is for the lab's own loop on backend {' | '.join(elastic)}: "
            f"not with backend {cfg.backend} or train.function",
        )
    require(cfg.failure.capacity_wait_s > 0, f"failure.capacity_wait_s must be > 0, got {cfg.failure.capacity_wait_s}")
    require(
        cfg.failure.checkpoint_every_epochs >= 0,
        f"failure.checkpoint_every_epochs must be >= 0, got {cfg.failure.checkpoint_every_epochs}",
    )
    # A straggler rank beyond a run's workers gets no injection (a sweep's 1-worker runs); `scaling
    # sweep` refuses one beyond its largest worker count (scaling/launch/sweep.py).
    for problem in cfg.instrument.problems(prefix="instrument."):
        require(False, problem)
    require(
        not cfg.instrument.inject_comm_delay_s or cfg.instrument.inject_comm_delay_into in adapter.injectable,
        f"instrument.inject_comm_delay_into={cfg.instrument.inject_comm_delay_into} is not offered by backend "
        f"{cfg.backend} ({adapter.wraps}): it injects into {' or '.join(adapter.injectable)}",
    )
    # The selected backend's own settings, and what it cannot run (its `config_problems`, backend_choices.py:
    # DDP's process group and buckets, Horovod's tuning, what a sharding backend cannot run).
    for problem in backend.config_problems(cfg):
        require(False, problem)
    # GradScaler multiplies the loss (65536x at the start) and the compression hooks cast the
    # scaled fp32 gradients to fp16 before averaging: above 65504 they become inf, every such
    # step is skipped and the scale pushed down, a different training from the uncompressed one.
    require(
        not (cfg.train.precision == "fp16" and cfg.instrument.grad_compression == "fp16"),
        "train.precision=fp16 scales the loss (GradScaler, up to 65536x) and instrument.grad_compression=fp16 casts "
        "the scaled gradients to fp16, where they overflow (inf: skipped steps); use grad_compression bf16 (DDP), "
        "none, or train.precision bf16",
    )
    # NCCL starts its proxy threads with the CPU mask of the thread that creates its communicator.
    # The lab's loop pins GPU workers after the backend is set up (scaling/train/loop.py); a
    # user's function creates its communicator after the pinning, so its proxy thread shares
    # the training thread's CPUs: at least two, or it takes the training thread's only one.
    require(
        not (cfg.workers.pin_cpus and cfg.workers.use_gpu and cfg.train.function and cfg.workers.cpus_per_worker < 2),
        "workers.pin_cpus with GPU workers running train.function needs workers.cpus_per_worker >= 2: NCCL's proxy "
        "thread inherits the pinned training thread's CPUs",
    )
