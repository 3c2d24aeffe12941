"""Launch one run on the current Ray cluster with Ray Train V2's TorchTrainer.

The cluster is the one `ray.init()` finds: `RAY_ADDRESS` (set inside `ray job submit`), a
running `ray start` cluster, or a new local one. Before anything is created, `check_capacity`
refuses a run that asks for more CPUs or GPUs than the cluster has (Ray would wait forever).

Workers run `scaling.train.loop.train_worker`; the process group (gloo on CPU, nccl on GPU)
is set up by Ray's TorchConfig. Rank 0 writes the records into the run directory, which
must therefore be on storage every node sees (a shared filesystem on multi-node clusters).
"""

from __future__ import annotations

import logging
import math
import os
import signal
from pathlib import Path

from scaling.config import ExperimentConfig, from_dict
from scaling.errors import UsageError
from scaling.results import MACHINE_JSON, RAY_TRAIN_DIR, write_json_atomic

# ray.train.report() is a barrier whose latency follows the controller's health-check
# interval (about 2 s by default); the lab reports once per epoch, and this keeps the
# per-epoch cost near 0.1 s.
RAY_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1"}


REACH_TIMEOUT_S = 5.0


def check_reachable(address: str | None, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Refuse within `timeout_s` a RAY_ADDRESS nothing listens on (ray.init would wait for minutes).

    Applies to host:port, ray://host:port and http(s)://host:port forms; None and "auto" are
    Ray's own discovery of a local cluster and are left to ray.init.
    """
    import socket
    from urllib.parse import urlsplit

    if not address or address == "auto" or address.startswith("local"):
        return
    parsed = urlsplit(address if "://" in address else f"tcp://{address}")
    if parsed.hostname is None or parsed.port is None:
        raise UsageError(f"RAY_ADDRESS={address} is not host:port (e.g. 10.0.0.5:6379)")
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__).lower()
        raise UsageError(
            f"cannot reach the Ray cluster at RAY_ADDRESS={address} ({reason} within {timeout_s:g} s); "
            "start it, fix the address, or unset RAY_ADDRESS to use a local cluster"
        ) from None


def starts_own_head(address: str | None) -> bool:
    """Whether ray.init(address) starts a new local head: no address (or "local") and no running cluster found."""
    if address not in (None, "local"):
        return False
    try:
        from ray._private.services import canonicalize_bootstrap_address  # Ray's own test, as ray.init makes it
    except ImportError:  # moved in another Ray version: leave the setting to Ray
        return False
    return canonicalize_bootstrap_address(address) is None


def decide_own_head_auth() -> None:
    """The setting of a head the lab starts itself: token authentication, Ray 2.60's default for such heads,
    set explicitly so that Ray does not open every run with a warning about its default. A caller's
    RAY_AUTH_MODE wins (the tests' private heads: disabled)."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    # Ray read its configuration when it was imported: refreshed, so that ray.init sees token mode and creates
    # ~/.ray/auth_token where none exists (else its GCS starts in token mode with no token, and dies: a machine
    # that never ran Ray). What Ray's own default does (ray/_private/authentication/authentication_token_setup.py).
    try:
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):  # another Ray version: its own default applies
        pass


def connect(log_to_driver: bool = True) -> None:
    """Attach to (or start) the Ray cluster; one clear error when it cannot be reached."""
    import ray

    if ray.is_initialized():
        return
    os.environ.update(RAY_ENV)
    address = os.environ.get("RAY_ADDRESS")
    check_reachable(address)
    if starts_own_head(address):
        decide_own_head_auth()
    try:
        ray.init(
            address=address,
            logging_level=logging.WARNING,
            runtime_env={"env_vars": dict(RAY_ENV)},
            configure_logging=True,
            log_to_driver=log_to_driver,
        )
    except Exception as exc:  # ray raises ConnectionError, RuntimeError, ... depending on the cause
        where = f"RAY_ADDRESS={address}" if address else "a local Ray cluster"
        raise UsageError(
            f"cannot connect to {where}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None


def check_capacity(cfg: ExperimentConfig) -> None:
    """Refuse at once a run the cluster cannot place, instead of letting Ray wait forever."""
    import ray

    total = ray.cluster_resources()
    workers = cfg.workers.num_workers
    cpus_needed = workers * cfg.workers.cpus_per_worker
    cpus = int(total.get("CPU", 0))
    if cpus_needed > cpus:
        raise UsageError(
            f"{workers} workers x {cfg.workers.cpus_per_worker} CPU need {cpus_needed} CPUs, but the Ray cluster has "
            f"{cpus}; "
            f"use --workers {max(1, cpus // cfg.workers.cpus_per_worker)} or fewer, or add nodes"
        )
    if cfg.workers.use_gpu:
        gpus = int(total.get("GPU", 0))
        if workers > gpus:
            raise UsageError(
                f"{workers} workers need {workers} GPUs, but the Ray cluster has {gpus}; use --workers {gpus} or fewer"
            )


class RayCheckpoints:
    """Checkpoints through Ray Train: reported with the epoch's metrics, restored after a restart.

    Rank 0 saves the state (`torch.save`, one file) into a temporary directory that
    `ray.train.report` copies into the run's storage (run_dir/ray_train/...); every rank
    reports, as Ray Train V2 requires. After a worker died, Ray Train restarts the worker
    group (failure.max_failures times at most) and `ray.train.get_checkpoint()` hands every
    rank the latest checkpoint.
    """

    def __init__(self, rank: int):
        self.rank = rank

    def load(self) -> dict | None:
        import ray.train
        import torch

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as directory:
            return torch.load(Path(directory) / "state.pt", weights_only=False, map_location="cpu")

    def report(self, metrics: dict, state: dict | None) -> None:
        import tempfile

        import ray.train
        import torch

        if state is None:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="scaling-ckpt-") as directory:
            torch.save(state, Path(directory) / "state.pt")
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


def at_world_size(cfg: ExperimentConfig, world_size: int) -> ExperimentConfig:
    """An elastic run's config for the worker group it got: the same global batch, shared by
    `world_size` workers (workers.min_workers); unchanged at the config's own count."""
    if world_size == cfg.workers.num_workers:
        return cfg
    resized = from_dict(cfg.to_dict())
    resized.train.per_worker_batch = cfg.global_batch // world_size
    resized.workers.num_workers = world_size
    return resized


def _worker_entry(loop_config: dict) -> dict:
    """Runs on every Ray Train worker."""
    import ray.train
    import ray.train.torch

    from scaling.import_path import add_import_root
    from scaling.launch.machine import describe_hardware
    from scaling.launch.live_metrics import RayLiveMetrics
    from scaling.train.loop import WorkerContext, run_worker

    # Ray Train logs every report at INFO on each worker; the loop prints its own epoch line.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    add_import_root(loop_config["import_root"])  # a user's model, data or train function, by import path
    cfg = from_dict(loop_config["config"])
    run_dir = Path(loop_config["run_dir"])  # absolute: Ray workers chdir into their own folder
    context = ray.train.get_context()
    device = ray.train.torch.get_device()
    cfg = at_world_size(cfg, context.get_world_size())
    ctx = WorkerContext(
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        local_rank=context.get_local_rank(),
        node_rank=context.get_node_rank(),
        device=device,
    )
    if ctx.rank == 0:
        write_json_atomic(run_dir / MACHINE_JSON, describe_hardware())
    return run_worker(cfg, ctx, run_dir, checkpoints=RayCheckpoints(ctx.rank), live_metrics=RayLiveMetrics)


# Ray Train V2 reads this in its controller (propagated there from the driver's environment):
# how long starting a worker group waits for its placement group before it gives up.
WORKER_GROUP_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
# An elastic run's tries at starting its group: Ray Train's elastic policy sees the cluster through
# Ray's AutoscalingCoordinator, which refreshes its view every 20 s, so its first try after a lost
# node may still count the node's resources and wait for them; short tries let it count again.
# A try waits only for the group's resources (its placement group), not for its workers to start,
# so a short one costs a retry, not a run: at 30 s the restart after a lost node waited out the
# whole first try at the old size; at 10 s it asks again within the view's next refresh.
ELASTIC_START_TRY_S = 10.0


def capacity_wait(cfg: ExperimentConfig) -> tuple[float, int]:
    """(seconds one worker-group start may wait, start timeouts Ray Train may retry) for `cfg`.

    A fixed count: one try of failure.capacity_wait_s, never retried. Elastic: tries of at most
    ELASTIC_START_TRY_S, as many as fit in failure.capacity_wait_s (a budget for the whole run,
    as Ray Train counts start timeouts over the run).
    """
    wait_s = cfg.failure.capacity_wait_s
    if not cfg.workers.min_workers:
        return wait_s, 0
    try_s = min(wait_s, ELASTIC_START_TRY_S)
    return try_s, math.ceil(wait_s / try_s) - 1


class CapacityTimeout(RuntimeError):
    """A restart found no room for its workers within `failure.capacity_wait_s` (a lost node not back)."""


def capacity_timeout(exc: BaseException, cfg: ExperimentConfig) -> CapacityTimeout | None:
    """The lab's one line for Ray Train's worker-group start timeout, or None for any other failure."""
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

    cause = getattr(exc, "controller_failure", None)
    if not isinstance(cause, WorkerGroupStartupTimeoutError):
        return None
    return CapacityTimeout(
        f"no room for {cause.num_workers} workers within failure.capacity_wait_s={cfg.failure.capacity_wait_s:g} s "
        "after the worker group was lost (a node gone and not back); the latest checkpoint is kept in the run directory"
    )


def run_ray(cfg: ExperimentConfig, run_dir: Path) -> None:
    """Run `cfg` with TorchTrainer; raises whatever made training fail.

    After a failure (a worker killed, a node lost) Ray Train restarts the worker group from
    the latest checkpoint, at most `failure.max_failures` times. Each restart waits for its
    workers' resources at most `failure.capacity_wait_s` (`capacity_wait`): left alone, Ray
    Train's controller retries a start that timed out for ever (`controller_failure_limit` -1),
    so a run that lost a node for good would wait for ever; here it fails with `CapacityTimeout`.
    An elastic run (`workers.min_workers`) goes on with the workers that fit instead.
    """
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    start_timeout_s, start_retries = capacity_wait(cfg)
    os.environ[WORKER_GROUP_START_TIMEOUT_ENV] = str(start_timeout_s)

    trainer = TorchTrainer(
        train_loop_per_worker=_worker_entry,
        train_loop_config={
            "config": cfg.to_dict(),
            "run_dir": str(Path(run_dir).resolve()),
            "import_root": os.getcwd(),
        },
        torch_config=TorchConfig(backend=cfg.resolved_backend),
        scaling_config=ScalingConfig(
            # elastic: Ray Train starts (and restarts) the group with as many workers as fit, from
            # min_workers to num_workers, and grows it again when room appears
            num_workers=(
                (cfg.workers.min_workers, cfg.workers.num_workers)
                if cfg.workers.min_workers
                else cfg.workers.num_workers
            ),
            use_gpu=cfg.workers.use_gpu,
            resources_per_worker={"CPU": cfg.workers.cpus_per_worker, **({"GPU": 1} if cfg.workers.use_gpu else {})},
        ),
        run_config=RunConfig(
            name=RAY_TRAIN_DIR,
            storage_path=str(Path(run_dir).resolve()),
            # one bound for every restart: a node drained ahead of a preemption (Ray's own budget,
            # unlimited by default) counts like a worker that died; starts that found no room are
            # retried only within capacity_wait_s (`capacity_wait`)
            failure_config=FailureConfig(
                max_failures=cfg.failure.max_failures,
                max_preemption_failures=cfg.failure.max_failures,
                controller_failure_limit=start_retries,
            ),
            checkpoint_config=CheckpointConfig(num_to_keep=2),  # the latest is all a restart needs
        ),
    )
    interrupted = []

    def register_sigint(controller) -> None:
        # Ray Train V2 installs a SIGINT handler in fit() that aborts the run and then exits the
        # process (sys.exit), which would skip the run's summary and the sweep's bookkeeping. The
        # lab's handler aborts the run the same graceful way, then fit() returns and the run
        # ends as an interruption (KeyboardInterrupt), so it is marked and the sweep can resume.
        import ray

        def on_sigint(signum, frame):
            interrupted.append(signum)
            if len(interrupted) > 1:
                raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the graceful abort
            try:
                ray.get(controller.abort.remote(), timeout=60)
            except Exception:  # the controller is already gone: nothing left to abort
                pass

        signal.signal(signal.SIGINT, on_sigint)

    trainer._register_sigint_handler = register_sigint  # Ray's hook point for this (data_parallel_trainer.py)
    previous = signal.getsignal(signal.SIGINT)
    try:
        trainer.fit()
    except Exception as exc:
        if not interrupted:
            timeout = capacity_timeout(exc, cfg)
            if timeout is not None:
                raise timeout from exc
            raise
    finally:
        signal.signal(signal.SIGINT, previous)  # Ray leaves its handler installed after fit()
    if interrupted:
        raise KeyboardInterrupt
