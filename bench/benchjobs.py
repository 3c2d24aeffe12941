"""What the benchmarks share beyond their records (benchlib.py): the jobs and measurements more than one
benchmark runs, kept here so that no benchmark imports another.

- `measure` / `sizes_bytes`: the 2-rank all-reduce timing of bench/allreduce.py (torch.distributed gloo
  and Horovod), which bench/horovod_cycle_ground_truth.py fits its links from;
- `BareDdp`: a hand-written DDP job made as the lab's loop makes its model (instrumentation_overhead.py,
  instrument_host_cost.py);
- the minicluster's driver processes and a run's figures (projection_vs_minicluster.py,
  projection_own_jobs.py): `exec_command`, `wait_or_stop`, `LoadSampler`, `run_figures`, `decompose`,
  `log`, `write`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import REPO, load_average

from scaling.results import RunDir
from scaling.testbed.local_cluster import free_port

KIB = 1024
WORLD = 2  # the all-reduce timing's ranks
SCALING = str(Path(sys.executable).parent / "scaling")


def sizes_bytes(max_bytes: int) -> list[int]:
    sizes, size = [], 4 * KIB
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def _allreduce_rank(
    rank: int,
    port: int,
    sizes: list[int],
    backends: list[str],
    rounds: int,
    warmup: int,
    target_s: float,
    out_path: str,
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    reduce = {"torch_gloo": lambda t: dist.all_reduce(t)}
    horovod_error = None
    if "horovod_gloo" in backends:
        try:
            import horovod.torch as hvd

            from scaling.train import horovod_backend as hb

            hb.setup_horovod_env_and_init(rank, WORLD, rank, WORLD, 0)
            reduce["horovod_gloo"] = lambda t: hvd.allreduce_(t, op=hvd.Sum)
        except Exception as exc:  # measured without it; the reason goes into the JSON
            horovod_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    ok = torch.tensor([0 if horovod_error else 1])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # both ranks measure the same backends
    active = [b for b in backends if b == "torch_gloo" or int(ok) == 1]
    times: dict[str, dict[int, list[float]]] = {b: {size: [] for size in sizes} for b in active}
    try:
        for r in range(rounds):
            for size in sizes if r % 2 == 0 else list(reversed(sizes)):
                tensor = torch.ones(size // 4, dtype=torch.float32)
                for backend in active if r % 2 == 0 else list(reversed(active)):
                    run = reduce[backend]
                    tensor.fill_(1.0)
                    run(tensor)
                    if not bool((tensor == WORLD).all()):
                        raise RuntimeError(f"{backend}: all-reduce of {size} bytes gave a wrong sum")
                    warm = []
                    for _ in range(warmup):
                        tensor.fill_(1.0)
                        dist.barrier()
                        t0 = time.perf_counter()
                        run(tensor)
                        warm.append(time.perf_counter() - t0)
                    estimate = torch.tensor([min(warm) if warm else 1e-3], dtype=torch.float64)
                    dist.all_reduce(estimate, op=dist.ReduceOp.MAX)  # both ranks agree on the iteration count
                    iters = int(min(50, max(3, target_s / max(float(estimate), 1e-6))))
                    elapsed = torch.zeros(iters, dtype=torch.float64)
                    for i in range(iters):
                        tensor.fill_(1.0)  # keep values finite over the iterations
                        dist.barrier()
                        t0 = time.perf_counter()
                        run(tensor)
                        elapsed[i] = time.perf_counter() - t0
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # an iteration ends when its slower rank ends
                    times[backend][size] += elapsed.tolist()
                del tensor
        if rank == 0:
            Path(out_path).write_text(
                json.dumps(
                    {
                        "times": {b: {str(k): v for k, v in per.items()} for b, per in times.items()},
                        "horovod_error": horovod_error,
                    }
                )
            )
    finally:
        if "horovod_gloo" in reduce:
            from scaling.train import horovod_backend as hb

            hb.shutdown()
        dist.destroy_process_group()


def measure(
    sizes: list[int], backends: list[str], rounds: int, warmup: int, target_s: float
) -> tuple[dict, str | None]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="bench-ar-") as tmp:
        out = Path(tmp) / "times.json"
        mp.start_processes(
            _allreduce_rank,
            args=(free_port(), sizes, backends, rounds, warmup, target_s, str(out)),
            nprocs=WORLD,
            join=True,
            start_method="spawn",
        )
        data = json.loads(out.read_text())
    times = {b: {int(k): v for k, v in per.items()} for b, per in data["times"].items()}
    return times, data["horovod_error"]


class BareDdp:
    """A hand-written DDP job made as the lab's loop makes its model, over the lab's dataset's batches."""

    def __init__(self, cfg, ctx, dataset):
        import torch
        from torch.nn.parallel import DistributedDataParallel

        from scaling.models import build_model
        from scaling.train.backends.ddp import NO_BUFFER_SYNC_IN_FORWARD
        from scaling.train.precision import Precision

        self.cfg, self.ctx, self.dataset = cfg, ctx, dataset
        self.precision = Precision(cfg.train.precision, cfg.train.channels_last, ctx.device)
        with torch.random.fork_rng():  # its own initial weights, leaving the generator the lab's loop seeded alone
            torch.manual_seed(cfg.train.seed + 1)
            plain = self.precision.prepare_model(build_model(cfg.model.name, cfg.data.num_classes).to(ctx.device))
        self.model = DistributedDataParallel(
            plain, bucket_cap_mb=cfg.instrument.ddp_bucket_cap_mb, **NO_BUFFER_SYNC_IN_FORWARD
        )
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=cfg.optim.lr * cfg.global_batch / cfg.optim.reference_batch,
            momentum=cfg.optim.momentum,
            nesterov=cfg.optim.momentum > 0,
            weight_decay=cfg.optim.weight_decay,
        )

    def batches(self, epoch: int):
        return self.dataset.train_batches(
            self.ctx.rank, self.ctx.world_size, epoch, self.cfg.train.seed, self.cfg.train.per_worker_batch
        )

    def step(self, inputs, targets) -> None:
        import torch.nn.functional as F

        with self.precision.autocast():
            loss = F.cross_entropy(
                self.model(self.precision.layout(inputs)), targets, label_smoothing=self.cfg.train.label_smoothing
            )
        self.precision.backward(loss)
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad()


class LoadSampler:
    """/proc/loadavg's 1-minute figure every `period` s, tagged with the phase running."""

    def __init__(self, period: float = 2.0):
        self.period, self.phase, self.samples = period, "start", []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            load = load_average()
            if load:
                self.samples.append((time.time(), self.phase, load[0]))
            self._stop.wait(self.period)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def by_phase(self) -> dict:
        out = {}
        for phase in dict.fromkeys(p for _, p, _ in self.samples):
            values = [v for _, p, v in self.samples if p == phase]
            out[phase] = {
                "mean_load1": round(sum(values) / len(values), 2),
                "max_load1": max(values),
                "samples": len(values),
            }
        return out


def exec_command(args: list[str], log_path: Path, name: str) -> subprocess.Popen:
    """`scaling ARGS` as a driver inside cluster `name` (the head's namespace), in its own process group."""
    log_file = open(log_path, "w")
    return subprocess.Popen(
        [SCALING, "minicluster", "exec", "--name", name, "--", SCALING, *args],
        cwd=REPO,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_or_stop(process: subprocess.Popen, deadline: float) -> int | None:
    """The exit status, or None after stopping the process group (SIGINT, then SIGKILL) at the deadline."""
    import signal

    try:
        return process.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        return None


def run_figures(run_dir: Path) -> dict:
    summary = RunDir(run_dir).summary()
    keys = ("step_s", "data_s", "forward_s", "backward_s", "optimizer_s", "time_per_epoch_s", "run_wall_s")
    return {"run_dir": str(run_dir), **{k: summary.get(k) for k in keys}}


def decompose(run_dir: Path) -> dict:
    """Each steady-state step of a 2-worker run cut into compute, the all-reduce and the wait.

    Per step, the slower rank hands its bucket over last and its exposed time is the all-reduce
    itself (min over ranks of exposed_comm_s); the faster rank's exposed time also holds its
    wait for the slower one. Means over steps and ranks, as the lab's step_s.
    """
    steps = RunDir(run_dir).steps()
    train = steps[(steps["kind"] == "train") & (~steps["warmup"].astype(bool))].copy()
    train["own_compute_s"] = train["step_s"] - train["exposed_comm_s"]
    exposed = train.pivot_table(index="step", columns="rank", values="exposed_comm_s").dropna()
    transfer = exposed.min(axis=1)
    wait = exposed.sub(transfer, axis=0).mean(axis=1)
    per_rank = train.groupby("rank")["own_compute_s"].mean()
    calib = steps[steps["kind"] == "calib_nosync"].groupby("rank")["step_s"].median()
    return {
        "compute_s": float(per_rank.mean()),
        "compute_s_per_rank": [float(v) for v in per_rank],
        "allreduce_in_run_s": float(transfer.mean()),
        "allreduce_in_run_median_s": float(transfer.median()),
        "straggler_wait_s": float(wait.mean()),
        "calib_nosync_fwd_bwd_s_per_rank": [float(v) for v in calib],
    }


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def write(record: dict, path: Path) -> None:
    """The record as JSON at `path`, atomically (numpy scalars as numbers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=lambda v: v.item() if hasattr(v, "item") else str(v)) + "\n")
    os.chmod(tmp, 0o644)
    tmp.replace(path)


if __name__ == "__main__":
    # A library, not a benchmark: run as a script it only says so (and answers --help).
    import argparse

    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="A library the benchmarks import; it measures nothing itself. Run them with bench/run_all.py.",
    ).parse_args()
    print("bench/benchjobs.py is the benchmarks' shared jobs; run them with bench/run_all.py (see --help)")
