"""The preflight: every check of a config against the world, before any file of a run is written.

`scaling/config.py` checks a config's shape (types, closed choices, ranges, values against
each other). What can only be known by looking is here, in one place:

- the user's code a config names by import path (model, dataset, train function): imported,
  the model built once;
- datasets on disk (CIFAR-10, image folders): read and counted, and the training set checked
  to hold at least one global batch;
- the cluster a projection is drawn for (a preset or a cluster YAML);
- the minicluster link cap (a rate `tc` takes, and a minicluster to apply it in);
- Horovod (built, with gloo; with NCCL for GPU workers);
- GPU-only rules (the communication-delay injection on GPUs, docs/gpu.md);
- the launcher: a Ray Train function, and an elastic run, need the Ray launcher;
- capacity: the Ray cluster's CPUs and GPUs, or this host's for the plain launcher.

`scaling run` preflights its config; `scaling sweep` preflights each distinct config of the sweep
once (`preflight_sweep`: repeats differ only in their seed, which nothing here looks at) and the
capacity once, for its largest run; `execute_run` preflights a config it is handed unless the
caller says it has (`preflighted=True`). Every refusal is one line: a `ConfigError` for the config, a `UsageError` for capacity.
"""

from __future__ import annotations

import os

from scaling.config import ConfigError, ExperimentConfig
from scaling.errors import UsageError


def preflight(cfg: ExperimentConfig, launcher: str, *, capacity: bool = True, log_to_driver: bool = True,
              _dataset_counts: dict | None = None) -> list[str]:
    """Refuse (UsageError, one line) a config the world cannot run; returns notes to print.

    `capacity=False` leaves out the cluster's or host's capacity (a sweep checks it once, for its
    largest run). `_dataset_counts` caches dataset reads across the configs of one sweep."""
    check_user_code(cfg)
    check_launcher(cfg, launcher)
    check_data(cfg, _dataset_counts)
    check_backend(cfg)
    check_link_bandwidth(cfg)
    check_cluster_description(cfg)
    check_gpu_rules(cfg)
    notes = []
    if capacity:
        note = check_capacity(cfg, launcher, log_to_driver=log_to_driver)
        if note:
            notes.append(note)
    return notes


def preflight_sweep(runs: list, launcher: str, log_to_driver: bool = False) -> list[str]:
    """Preflight each distinct config of a sweep's planned runs (`scaling.launch.sweep.PlannedRun`)
    once, and the capacity once, for the largest run."""
    seen, counts = set(), {}
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
    largest = max((run.config for run in runs), key=lambda c: c.workers.num_workers * c.workers.cpus_per_worker)
    note = check_capacity(largest, launcher, log_to_driver=log_to_driver)
    return [note] if note else []


def check_launcher(cfg: ExperimentConfig, launcher: str) -> None:
    if cfg.train.function and launcher != "ray":
        raise ConfigError("train.function is a Ray Train function (prepare_model, ray.train.report): "
                          "run it with the Ray launcher (--launcher ray)")
    if cfg.workers.min_workers and launcher != "ray":
        raise ConfigError("workers.min_workers (elastic) needs Ray Train's restarts: run it with the Ray launcher (--launcher ray)")


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


def check_data(cfg: ExperimentConfig, cache: dict | None = None) -> None:
    """A path dataset must read; the training set must hold at least one global batch."""
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
            f"({cfg.train.per_worker_batch} x {cfg.workers.num_workers} workers = {cfg.global_batch}): no full step per epoch")


def check_backend(cfg: ExperimentConfig) -> None:
    if cfg.backend == "horovod":
        from scaling.train.horovod_backend import available

        ok, why_not = available(use_gpu=cfg.workers.use_gpu)
        if not ok:
            raise ConfigError(f"backend horovod: {why_not}")


def check_link_bandwidth(cfg: ExperimentConfig) -> None:
    """A cap `tc` takes, and a minicluster to apply it in."""
    if not cfg.workers.link_bandwidth:
        return
    from scaling.launch import minicluster

    if cfg.workers.link_bandwidth != "uncapped":
        try:
            minicluster.rate_bits_per_s(cfg.workers.link_bandwidth)
        except UsageError:
            raise ConfigError(f"workers.link_bandwidth must be a tc rate such as 100mbit, 1gbit or 2.5gbit, or uncapped; "
                              f"got {cfg.workers.link_bandwidth!r}") from None
    if minicluster.current() is None:
        raise ConfigError("workers.link_bandwidth needs a minicluster: run through 'scaling minicluster exec -- ...'")


def check_cluster_description(cfg: ExperimentConfig) -> None:
    if cfg.workers.cluster:
        from scaling.projection.cluster import load_cluster

        load_cluster(cfg.workers.cluster)  # an unknown preset or a bad cluster YAML: one line


def check_gpu_rules(cfg: ExperimentConfig) -> None:
    """Settings that cannot give a meaningful GPU run (docs/gpu.md says why each)."""
    from scaling.instrument.timing import GPU_INJECTION_CHECKED

    if cfg.instrument.inject_comm_delay_s > 0 and cfg.workers.use_gpu:
        if cfg.backend == "horovod":
            raise ConfigError(
                "instrument.inject_comm_delay_s with backend horovod is a host sleep, which is no GPU delay (the host runs "
                "ahead of the device): on GPU runs inject with DDP, or run the ground truth on CPU workers")
        if not GPU_INJECTION_CHECKED:
            raise ConfigError(
                "instrument.inject_comm_delay_s on GPU runs is refused until the device-side injection has run on a GPU "
                "(scripts/gpu_first_contact.py, docs/gpu.md); run the ground truth on CPU workers (gloo) for now")


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
        raise UsageError(f"{cfg.workers.num_workers} workers x {cfg.workers.cpus_per_worker} CPU exceed this host's {cpus} CPUs")
    return check_local_gpus(cfg)  # NCCL needs a GPU per worker; bf16 needs a GPU that has it
