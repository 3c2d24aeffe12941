"""The preflight: every check of a config against the world, before any file of a run is written.

`scaling/config.py` checks a config's shape (types, closed choices, ranges, values against
each other). What can only be known by looking is here, in one place:

- the user's code a config names by import path (model, dataset, train function): imported,
  the model built once;
- datasets on disk (CIFAR-10, image folders): read and counted, and the training set checked
  to hold at least one global batch;
- the cluster a projection is drawn for (a preset or a cluster YAML);
- the minicluster link cap (a rate `tc` takes, and a minicluster to apply it in);
- the backend's own checks (scaling/train/backends/: Horovod built, with gloo, with NCCL for GPU
  workers; the communication-delay injection on GPUs, docs/gpu.md; FSDP's shard units in the
  model, built on the meta device);
- the launcher: a Ray Train function, and an elastic run, need the Ray launcher;
- capacity: the Ray cluster's CPUs and GPUs, or this host's for the plain launcher;
- memory: what each worker must hold for its datasets and its model (`estimate_worker_memory`)
  against the memory the workers have (`check_memory`).

`scaling run` preflights its config; `scaling sweep` preflights each distinct config of the sweep
once (`preflight_sweep`: repeats differ only in their seed, which nothing here looks at), the
capacity once, for its largest run, and the memory of each distinct config; `execute_run`
preflights a config it is handed unless the caller says it has (`preflighted=True`). Every
refusal is one line: a `ConfigError` for the config, a `UsageError` for capacity and memory.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

from scaling.config import ConfigError, ExperimentConfig
from scaling.errors import UsageError


def preflight(
    cfg: ExperimentConfig,
    launcher: str,
    *,
    capacity: bool = True,
    log_to_driver: bool = True,
    _dataset_counts: dict | None = None,
) -> list[str]:
    """Refuse (UsageError, one line) a config the world cannot run; returns notes to print.

    `capacity=False` leaves out the cluster's or host's capacity (a sweep checks it once, for its
    largest run). `_dataset_counts` caches dataset reads across the configs of one sweep."""
    check_user_code(cfg)
    check_launcher(cfg, launcher)
    counts = check_data(cfg, _dataset_counts)
    check_backend(cfg)
    check_link_bandwidth(cfg)
    check_cluster_description(cfg)
    notes = []
    if capacity:
        note = check_capacity(cfg, launcher, log_to_driver=log_to_driver)
        if note:
            notes.append(note)
        check_memory(cfg, launcher, counts)
    return notes


def preflight_sweep(runs: list, launcher: str, log_to_driver: bool = False) -> list[str]:
    """Preflight each distinct config of a sweep's planned runs (`scaling.launch.sweep.PlannedRun`)
    once, and the capacity once, for the largest run."""
    seen, counts, distinct = set(), {}, []
    for run in runs:
        data = run.config.to_dict()
        data["train"]["seed"] = None  # repeats differ only in their seed
        key = repr(data)
        if key in seen:
            continue
        seen.add(key)
        try:
            preflight(run.config, launcher, capacity=False, _dataset_counts=counts)
        except ConfigError as exc:
            raise ConfigError(f"sweep run {run.key}: {exc}") from None
        distinct.append(run)
    largest = max((run.config for run in runs), key=lambda c: c.workers.num_workers * c.workers.cpus_per_worker)
    note = check_capacity(largest, launcher, log_to_driver=log_to_driver)
    for run in distinct:  # memory differs with the workers sharing a host, the model and the data: each config
        try:
            check_memory(run.config, launcher, counts.get(repr(run.config.data)))
        except UsageError as exc:
            raise UsageError(f"sweep run {run.key}: {exc}") from None
    return [note] if note else []


def check_launcher(cfg: ExperimentConfig, launcher: str) -> None:
    if cfg.train.function and launcher != "ray":
        raise ConfigError(
            "train.function is a Ray Train function (prepare_model, ray.train.report): "
            "run it with the Ray launcher (--launcher ray)"
        )
    if cfg.workers.min_workers and launcher != "ray":
        raise ConfigError(
            "workers.min_workers (elastic) needs Ray Train's restarts: run it with the Ray launcher (--launcher ray)"
        )


def check_user_code(cfg: ExperimentConfig) -> None:
    """Import what the config names by import path; build a user's model once (one line if it fails)."""
    from scaling.import_path import is_import_path, load_callable

    if is_import_path(cfg.model.name):
        from scaling.models import build_model

        try:
            build_model(cfg.model.name, cfg.data.num_classes)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's constructor failed
            raise ConfigError(f"model.name={cfg.model.name!r} does not build: {type(exc).__name__}: {exc}") from None
    if is_import_path(cfg.data.name):
        load_callable(cfg.data.name, "data.name", required_args=1)
    if cfg.train.function:
        load_callable(cfg.train.function, "train.function", required_args=1)


def check_data(cfg: ExperimentConfig, cache: dict | None = None) -> dict:
    """A path dataset must read; the training set must hold at least one global batch.

    Returns the dataset's counts ({"train": N, "val": M} for a path dataset, {} for generated ones)."""
    from scaling.data import check_dataset

    key = repr(cfg.data)
    if cache is not None and key in cache:
        counts = cache[key]
    else:
        counts = check_dataset(cfg.data)
        if cache is not None:
            cache[key] = counts
    num_train = counts.get("train", cfg.data.train_samples)
    source = f"{cfg.data.path}/train" if counts else "data.train_samples"
    if num_train // cfg.global_batch < 1:
        raise ConfigError(
            f"the training set ({source}: {num_train} samples) is smaller than the global batch "
            f"({cfg.train.per_worker_batch} x {cfg.workers.num_workers} workers = {cfg.global_batch}): no full step "
            "per epoch"
        )
    return counts


def check_backend(cfg: ExperimentConfig) -> None:
    """What the run's backend can only know by looking (scaling/train/backends/)."""
    from scaling.train.backends import for_choice

    refusal = for_choice(cfg.backend).preflight(cfg)
    if refusal:
        raise ConfigError(refusal)


def check_link_bandwidth(cfg: ExperimentConfig) -> None:
    """A cap `tc` takes, and a minicluster to apply it in."""
    if not cfg.workers.link_bandwidth:
        return
    from scaling.testbed import minicluster

    if cfg.workers.link_bandwidth != "uncapped":
        try:
            minicluster.rate_bits_per_s(cfg.workers.link_bandwidth)
        except UsageError:
            raise ConfigError(
                f"workers.link_bandwidth must be a tc rate such as 100mbit, 1gbit or 2.5gbit, or uncapped; "
                f"got {cfg.workers.link_bandwidth!r}"
            ) from None
    if minicluster.current() is None:
        raise ConfigError("workers.link_bandwidth needs a minicluster: run through 'scaling minicluster exec -- ...'")


def check_cluster_description(cfg: ExperimentConfig) -> None:
    if cfg.workers.cluster:
        from scaling.projection.cluster import load_cluster

        load_cluster(cfg.workers.cluster)  # an unknown preset or a bad cluster YAML: one line


def check_capacity(cfg: ExperimentConfig, launcher: str, log_to_driver: bool = True) -> str | None:
    """Refuse at once what the cluster (or this host) cannot place; returns a note or None."""
    if launcher == "ray":
        from scaling.launch.ray_train import check_capacity as check_ray_capacity, connect

        connect(log_to_driver=log_to_driver)
        check_ray_capacity(cfg)
        return None
    from scaling.launch.local import check_local_gpus

    cpus = os.cpu_count() or 1
    if cfg.workers.num_workers * cfg.workers.cpus_per_worker > cpus:
        raise UsageError(
            f"{cfg.workers.num_workers} workers x {cfg.workers.cpus_per_worker} CPU exceed this host's {cpus} CPUs"
        )
    return check_local_gpus(cfg)  # NCCL needs a GPU per worker; bf16 needs a GPU that has it


# ---------------------------------------------------------------------------- memory

FLOAT32_BYTES, UINT8_BYTES, LABEL_BYTES = 4, 1, 8  # the lab's images as generated / as stored; int64 labels
# The embedded generator (scaling/data/embedded.py `_samples`) holds six image-sized tensors of a
# split at once while it blends it (the images, the distractors, the noise and the blend's three
# temporaries): peak RSS measured here at 5.9x the stored split, for 100,000 32x32 samples.
EMBEDDED_GENERATION_COPIES = 6
LOADER_PREFETCH_BATCHES = 4  # per DataLoader worker process (scaling/data FolderDataset's prefetch_factor)


def _gb(num_bytes: float) -> str:
    gb = num_bytes / 1e9
    return f"{gb:,.0f} GB" if gb >= 100 else f"{gb:.2f} GB" if gb >= 1 else f"{gb:#.3g} GB"


@dataclass(frozen=True)
class MemoryEstimate:
    """What one worker must hold, in bytes (`estimate_worker_memory` says what is counted)."""

    dataset_bytes: int  # the datasets as held while training
    dataset_peak_bytes: int  # the datasets at their peak while they are made (generated, concatenated, laid out)
    made_on_host: bool  # a GPU worker makes the dataset in host memory, then moves it (all but synthetic)
    model_bytes: int  # parameters, gradients, optimizer state and gradient-communication buffers
    on_device: bool  # GPU workers: the dataset and the model live in the GPU's memory
    dataset_what: str  # the config keys and numbers behind dataset_bytes (for a refusal)
    dataset_keys: str  # the keys that set the dataset's size
    model_what: str

    @property
    def host_bytes(self) -> int:
        """A lower bound of the worker's peak in host memory. The dataset is made before the
        model is built (scaling/train/loop.py), so both its making peak and its held size plus
        the model are needed at some moment."""
        if not self.on_device:
            return max(self.dataset_peak_bytes, self.dataset_bytes + self.model_bytes)
        return self.dataset_peak_bytes if self.made_on_host else 0

    @property
    def device_bytes(self) -> int:
        """GPU workers: what the GPU must hold (the held dataset and the model state); 0 on CPU."""
        return self.dataset_bytes + self.model_bytes if self.on_device else 0

    def parts(self, on_device: bool = False) -> str:
        dataset = f"datasets {_gb(self.dataset_bytes)} held"
        if self.dataset_peak_bytes > self.dataset_bytes and not on_device:
            dataset += f", {_gb(self.dataset_peak_bytes)} while made"
        return f"{dataset}; model, gradients and optimizer state {_gb(self.model_bytes)}"


def dataset_memory(cfg: ExperimentConfig, counts: dict | None = None) -> tuple[int, int, bool, str, str]:
    """(held bytes, peak bytes while made, made on the host, what, keys) of one worker's datasets.

    Every worker holds the whole dataset (scaling/data: each makes or loads it and reads its
    shard), so this is per worker whatever the worker count. `counts`: a path dataset's sample
    counts (`check_data`)."""
    from scaling.import_path import is_import_path

    data = cfg.data
    size = data.image_size
    if is_import_path(data.name):
        return 0, 0, True, f"data.name={data.name} (a user's dataset, not counted)", "the dataset's size"
    if data.name in ("embedded", "synthetic"):
        image = 3 * size * size * FLOAT32_BYTES
        train_images, train_labels = data.train_samples * image, data.train_samples * LABEL_BYTES
        if data.name == "synthetic":  # drawn on the worker's device directly; no validation split
            held = train_images + train_labels
            peak = held + (train_images if cfg.train.channels_last else 0)  # the channels_last copy beside the original
            return (
                held,
                peak,
                False,
                f"data.name=synthetic with data.train_samples={data.train_samples:,} (3x{size}x{size} float32 images)",
                "data.train_samples",
            )
        val_images, val_labels = data.val_samples * image, data.val_samples * LABEL_BYTES
        held = train_images + train_labels + val_images + val_labels
        # the training split is generated first, then the validation split beside it
        peak = max(
            EMBEDDED_GENERATION_COPIES * train_images + train_labels,
            train_images + train_labels + EMBEDDED_GENERATION_COPIES * val_images + val_labels,
        )
        return (
            held,
            peak,
            True,
            f"data.name=embedded with data.train_samples={data.train_samples:,} and "
            f"data.val_samples={data.val_samples:,} (3x{size}x{size} float32 images)",
            "data.train_samples or data.val_samples",
        )
    if data.name == "cifar10":
        counts = counts or {}
        train, val = counts.get("train", 50_000), counts.get("val", 10_000)
        image = 3 * size * size * UINT8_BYTES
        held = (train + val) * (image + LABEL_BYTES)
        peak = held + train * image  # the batch files and their concatenation (scaling/data/cifar10.py load_cifar10)
        return (
            held,
            peak,
            True,
            f"data.name=cifar10 ({train:,} + {val:,} uint8 images in {data.path})",
            "the dataset at data.path",
        )
    if data.name == "imagenet":
        # decoded in DataLoader processes: what is held is the batches in flight, uint8
        batches = data.loader_workers * LOADER_PREFETCH_BATCHES if data.loader_workers else 1
        held = batches * cfg.train.per_worker_batch * (3 * size * size * UINT8_BYTES + LABEL_BYTES)
        return (
            held,
            held,
            True,
            f"data.name=imagenet with {batches} prefetched batches of train.per_worker_batch="
            f"{cfg.train.per_worker_batch} (data.loader_workers={data.loader_workers}, 3x{size}x{size} uint8)",
            "train.per_worker_batch or data.loader_workers",
        )
    return 0, 0, True, f"data.name={data.name} (not counted)", "the dataset's size"


@functools.lru_cache(maxsize=None)
def _model_sizes(name: str, num_classes: int) -> tuple[int, int, int]:
    """(parameter bytes, buffer bytes, parameter count) of a model, built with its tensors on the
    meta device (no memory; AmoebaNet-D's cells still take a few tenths of a second to build,
    hence once per model in a sweep). A user's model that cannot be built there is built as it
    is (the preflight built it once already)."""
    import torch

    from scaling.models import build_model

    try:
        with torch.device("meta"):
            model = build_model(name, num_classes)
    except Exception:  # noqa: BLE001 - a user's constructor that needs real tensors
        model = build_model(name, num_classes)
    return (
        sum(p.numel() * p.element_size() for p in model.parameters()),
        sum(b.numel() * b.element_size() for b in model.buffers()),
        sum(p.numel() for p in model.parameters()),
    )


def model_memory(cfg: ExperimentConfig) -> tuple[int, str]:
    """(bytes, what) of the model's state on one worker: parameters, their gradients, SGD's
    momentum buffer (optim.momentum > 0), and at more than one worker the backend's communication
    buffers (`communication_bytes`: DDP's gradient buckets, Horovod's fusion buffer, FSDP's gathered
    parameters); plus buffers. FSDP holds a 1/N shard of the weights, gradients and momentum (`state_share`)."""
    params, buffers, count = _model_sizes(cfg.model.name, cfg.data.num_classes)
    copies = ["weights", "gradients"] + (["momentum"] if cfg.optim.momentum > 0 else [])
    total = len(copies) * params + buffers
    if cfg.workers.num_workers > 1:
        from scaling.train.backends import for_choice

        backend = for_choice(cfg.backend)
        share = backend.state_share(cfg)  # FSDP: each worker holds its shard of the three
        if share < 1:
            total = int(len(copies) * params * share) + buffers
            copies = [f"{', '.join(copies)} (a {share:.2g} shard)"]
        extra, what = backend.communication_bytes(cfg, params)
        total += extra
        copies.append(what)
    return total, f"model.name={cfg.model.name} ({count:,} parameters: {', '.join(copies)})"


def estimate_worker_memory(cfg: ExperimentConfig, counts: dict | None = None) -> MemoryEstimate | None:
    """The memory one worker must hold for its datasets and its model; None for a user's
    train function (it makes its own model and data, which the config does not describe).

    Counted, from the config alone (the model is built on the meta device: no memory, no time):
    - the datasets every worker holds whole: samples x bytes per sample, training and validation
      splits, images and int64 labels: `embedded` and `synthetic` float32 (3 x image_size^2 x 4
      bytes), `cifar10` uint8 as stored (counts read from data.path); `imagenet` streams from
      disk, so only its batches in flight (loader_workers x 4 prefetched batches, uint8);
    - their peak while they are made: the embedded generator holds six image-sized tensors of
      a split at once (EMBEDDED_GENERATION_COPIES, measured), CIFAR-10 its batch files beside
      their concatenation, a channels_last copy of synthetic images beside the original;
    - the model's state: parameters, gradients, SGD momentum, DDP's gradient buckets or
      Horovod's fusion buffer at more than one worker, buffers (`model_memory`).
    Not counted, so this is a lower bound (a refusal is certain; a pass is no promise):
    activations and autograd's saved tensors (they grow with train.per_worker_batch and the
    model), autocast's low-precision weight copies, the Python and torch process itself (a few
    hundred MB), a CUDA context, DataLoader processes' own memory, the records, a user's dataset
    named by import path (it is only called in the workers).
    """
    if cfg.train.function:
        return None
    held, peak, made_on_host, dataset_what, dataset_keys = dataset_memory(cfg, counts)
    model_bytes, model_what = model_memory(cfg)
    return MemoryEstimate(
        held, peak, made_on_host, model_bytes, cfg.workers.use_gpu, dataset_what, dataset_keys, model_what
    )


def _cgroup_room_bytes() -> int | None:
    """Bytes this process's memory cgroup has left (limit less usage), if it sets a limit."""
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_path).read_text().strip()
            usage = int(Path(usage_path).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max", or v1's page-rounded 2^63: no limit
            return max(0, int(limit) - usage)
    return None


def host_available_bytes() -> int | None:
    """Memory this host can give new processes now: the kernel's MemAvailable (psutil's
    `available` where there is no /proc), lowered to the memory cgroup's room when a limit is
    set; None when neither can be read."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    if available is None:
        try:
            import psutil

            available = int(psutil.virtual_memory().available)
        except ImportError:
            return None
    room = _cgroup_room_bytes()
    return min(available, room) if room is not None else available


def ray_node_resources() -> list[dict]:
    """Each alive Ray node's resources (CPU, GPU, `memory`: what Ray counts as the node's memory
    for tasks and actors, its available memory when it started less the object store's share)."""
    import ray

    return [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]


def workers_that_fit(nodes: list[dict], need_bytes: int, cpus_per_worker: int, use_gpu: bool) -> int:
    """How many workers the nodes can place with `need_bytes` of memory each (a node's workers
    share its memory; a node without a `memory` figure is limited by its CPUs/GPUs only)."""
    placed = 0
    for resources in nodes:
        slots = int(resources.get("CPU", 0) // cpus_per_worker)
        if use_gpu:
            slots = min(slots, int(resources.get("GPU", 0)))
        memory = resources.get("memory")
        if memory and need_bytes > 0:
            slots = min(slots, int(memory // need_bytes))
        placed += slots
    return placed


def memory_refusal(
    estimate: MemoryEstimate, num_workers: int, available_bytes: int, where: str = "this host"
) -> str | None:
    """The refusal's one line when `num_workers` workers sharing `available_bytes` of host memory
    cannot hold what each needs (`estimate.host_bytes`); None when they can."""
    need = estimate.host_bytes
    if need * num_workers <= available_bytes:
        return None
    share = f", {_gb(available_bytes / num_workers)} for each of its {num_workers} workers" if num_workers > 1 else ""
    return (
        f"{estimate.dataset_what} and {estimate.model_what} need {_gb(need)} per worker ({estimate.parts()}), "
        f"but {where} has {_gb(available_bytes)} of memory available{share}: lower {estimate.dataset_keys}, "
        "or use fewer workers, a smaller model or a machine with more memory"
    )


def check_memory(
    cfg: ExperimentConfig,
    launcher: str,
    counts: dict | None = None,
    *,
    available_bytes: int | None = None,
    nodes: list[dict] | None = None,
) -> None:
    """Refuse (UsageError, one line naming the config keys and the numbers) a config whose
    workers cannot hold their datasets and model (`estimate_worker_memory`, a lower bound).

    The plain launcher: every worker on this host shares its available memory
    (`host_available_bytes`; `available_bytes` overrides it); GPU workers also need their share
    of a GPU's total memory (rank r on GPU r % count). The Ray launcher: each node holds as many
    workers as its CPUs (GPUs) and its memory as Ray reports it allow (`nodes` overrides
    `ray_node_resources`); the GPUs' memory is not checked there (Ray does not report it).
    Nodes sharing one machine (the minicluster) each report the machine's memory, so there the
    check is looser than the machine.
    """
    estimate = estimate_worker_memory(cfg, counts)
    if estimate is None:
        return
    workers = cfg.workers.num_workers
    if launcher == "ray":
        nodes = ray_node_resources() if nodes is None else nodes
        fit = workers_that_fit(nodes, estimate.host_bytes, cfg.workers.cpus_per_worker, cfg.workers.use_gpu)
        by_cpus = workers_that_fit(nodes, 0, cfg.workers.cpus_per_worker, cfg.workers.use_gpu)
        if fit < workers <= by_cpus:  # more workers than CPUs is check_capacity's refusal
            memory = ", ".join(_gb(n["memory"]) for n in nodes if n.get("memory")) or "none reported"
            raise UsageError(
                f"{estimate.dataset_what} and {estimate.model_what} need {_gb(estimate.host_bytes)} per worker "
                f"({estimate.parts()}), but the Ray cluster's nodes can hold {fit} of the {workers} workers (memory "
                "per "
                f"node as Ray reports it: {memory}): lower {estimate.dataset_keys}, or use fewer workers, a smaller "
                "model or more nodes"
            )
        return
    available = host_available_bytes() if available_bytes is None else available_bytes
    if available is not None:
        refusal = memory_refusal(estimate, workers, available)
        if refusal:
            raise UsageError(refusal)
    if cfg.workers.use_gpu:
        check_gpu_memory(estimate, workers)


def check_gpu_memory(estimate: MemoryEstimate, num_workers: int, gpu_bytes: list[int] | None = None) -> None:
    """GPU workers of the plain launcher: rank r on GPU r % count; each GPU's total memory shared
    by its ranks must hold their datasets and model state (`gpu_bytes` overrides torch's answer)."""
    if gpu_bytes is None:
        import torch

        try:
            gpu_bytes = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
        except (RuntimeError, AssertionError):  # no CUDA here: check_local_gpus refused a GPU run already
            return
    if not gpu_bytes:
        return
    per_gpu = math.ceil(num_workers / len(gpu_bytes))
    smallest = min(gpu_bytes[: min(num_workers, len(gpu_bytes))])
    if estimate.device_bytes * per_gpu > smallest:
        share = f" shared by {per_gpu} workers" if per_gpu > 1 else ""
        raise UsageError(
            f"{estimate.dataset_what} and {estimate.model_what} need {_gb(estimate.device_bytes)} of GPU memory per "
            f"worker ({estimate.parts(on_device=True)}), but a GPU here has {_gb(smallest)}{share}: lower "
            f"{estimate.dataset_keys}, or use fewer workers or a smaller model"
        )
