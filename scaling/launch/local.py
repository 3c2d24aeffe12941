"""Plain torch.distributed launcher: N processes on this host, no Ray.

Runs the very same loop as the Ray launcher (scaling/train/loop.py), so Ray's own cost can
be measured against it and the loop runs where Ray is absent. Used by the tests for the
ground-truth injection (no Ray start-up per run).

    summary_rows = run_local(cfg, run_dir)   # rank 0's records are written to run_dir

Workers fork from a server process that has imported torch and the loop (`start_workers`, which the
tests' own process groups use too), so a sweep's runs start in a fraction of a second each.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scaling.config import ExperimentConfig, from_dict
from scaling.testbed.local_cluster import free_port
from scaling.errors import UsageError
from scaling.train.loop import WorkerContext, run_worker
from scaling.train.precision import bf16_problem


def check_local_gpus(
    cfg: ExperimentConfig, device_count: int | None = None, devices: list[tuple[str, tuple[int, int]]] | None = None
) -> str | None:
    """Refuse (UsageError, one line) a GPU run this host cannot run as asked; returns a note or None.

    The plain launcher puts rank r on GPU `r % device_count`. NCCL refuses two ranks on one GPU
    ("Duplicate GPU detected"), so NCCL (backend auto/nccl, or Horovod on GPU) needs a GPU per
    worker; gloo with CUDA tensors runs several ranks on one GPU, for function only (its
    completion marks follow the default stream's work, and the ranks share the GPU): the
    returned note says so. bf16 on a GPU without native bf16 is refused (`bf16_problem`).
    `device_count` and `devices` ([(name, (major, minor))] per GPU) default to torch's answer.
    """
    if not cfg.workers.use_gpu:
        return None
    if device_count is None:
        device_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    workers = cfg.workers.num_workers
    if device_count == 0:
        raise UsageError(
            f"workers.use_gpu: torch {torch.__version__} sees no CUDA GPU on this host "
            f"(CUDA build: {torch.version.cuda or 'none'}); set workers.use_gpu=false or run where there is one"
        )
    nccl = cfg.resolved_backend == "nccl"  # auto and horovod on GPU resolve to nccl
    if nccl and workers > device_count:
        raise UsageError(
            f"{workers} NCCL workers need {workers} GPUs on this node, it has {device_count}: NCCL refuses two ranks "
            "on one "
            f"GPU ('Duplicate GPU detected'); use --workers {device_count} or fewer, or backend=gloo, which runs them "
            "with CUDA tensors (for function, not for timing)"
        )
    if cfg.train.precision == "bf16":
        if devices is None:
            devices = [
                (torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
                for i in range(min(workers, device_count))
            ]
        for name, capability in devices:
            problem = bf16_problem(name, capability)
            if problem:
                raise UsageError(problem)
    if workers > device_count:
        return (
            f"note: {workers} gloo ranks share {device_count} GPU(s) with CUDA tensors: for function, not for timing "
            "(docs/gpu.md)"
        )
    return None


def _worker(rank: int, world_size: int, config: dict, run_dir: str, port: int) -> None:
    cfg = from_dict(config)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if cfg.workers.use_gpu:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(cfg.resolved_backend, rank=rank, world_size=world_size)
    try:
        ctx = WorkerContext(rank=rank, world_size=world_size, local_rank=rank, node_rank=0, device=device)
        run_worker(cfg, ctx, Path(run_dir))  # no checkpoints: the plain launcher does not restart workers
    finally:
        release_process_group()
    exit_without_finalization()


def release_process_group() -> None:
    """Let go of this process's process group while Python is fully alive: DDP's reducer (in
    reference cycles) holds it until a collection. None to let go of where the job released it itself
    (Accelerate's `end_training` does)."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_without_finalization() -> None:
    """End a spawned worker process, its records on disk, without interpreter finalization.

    gloo's threads can still hold Python objects (the comm hook's futures) and dropping them during
    finalization aborts the process ("terminate called without an active exception", SIGABRT;
    pytorch/pytorch#179291 describes it), which turned a finished run into a failed one about one
    time in three here, and a test's finished workers into a failed spawn. Only the streams need
    flushing. Call `release_process_group` first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# What every worker imports before it trains: torch, torch._dynamo (building any torch.optim optimizer
# imports it) and the lab's loop. About 6 s of CPU per process on a 2-core machine, paid once per
# launching process by the fork server instead of once per worker of every run.
WORKER_PRELOAD = ["torch", "torch._dynamo", "scaling.train.loop"]


def _in_callers_environment(rank: int, environment: dict, fn, *args) -> None:
    # A fork server's children inherit the server's environment, set when it started; a worker must
    # see the launching process's environment as it is now (what a spawned process would see).
    os.environ.clear()
    os.environ.update(environment)
    fn(rank, *args)


def start_workers(fn, args: tuple, nprocs: int) -> None:
    """Run `fn(rank, *args)` in `nprocs` new processes and wait for all (torch.multiprocessing's
    `start_processes`: a worker's exception is raised here, with its traceback).

    The processes fork from a server process that has imported `WORKER_PRELOAD` (multiprocessing's
    fork server, started at the first call and kept for the launching process's life), so a sweep's
    runs do not import torch once per worker each. The server has only imported modules: no CUDA
    context, no process group, no torch computation (whose thread pools a fork would not carry), the
    state a PyTorch DataLoader forks its workers from on Linux. Each worker gets the caller's
    environment of the moment, as a spawned process would."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(WORKER_PRELOAD)
    mp.start_processes(
        _in_callers_environment, args=(dict(os.environ), fn, *args), nprocs=nprocs, join=True, start_method="forkserver"
    )


def run_local(cfg: ExperimentConfig, run_dir: Path) -> None:
    """Run `cfg` on `cfg.workers.num_workers` local processes; raises if any worker fails. The
    caller has preflighted `cfg` (`execute_run` does), GPUs included (`check_local_gpus`)."""
    world_size = cfg.workers.num_workers
    start_workers(_worker, (world_size, cfg.to_dict(), str(Path(run_dir).resolve()), free_port()), world_size)
