"""One worker's training loop: plain torch + DDP, launcher-agnostic.

`train_worker(cfg, ctx, recorder, checkpoints)` runs identically under Ray Train
(scaling/launch/ray_train.py) and a plain torch.distributed launcher (scaling/launch/local.py):
the process group must already be initialised. It times every step through marks handed to
the recorder, runs the A/B calibration window after each epoch's training, validates on all
ranks, and stops at the first epoch whose validation accuracy reaches the target.

Per epoch: train (timed: `train_s`) | calibrate (`calibration_s`) | validate (`eval_s`) |
record + report (with a checkpoint every `failure.checkpoint_every_epochs`). TTA and
time-per-epoch count `train_s` only (plus, for a restarted run, the time lost to restarts).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from scaling.config import ExperimentConfig
from scaling.data import load_dataset, steps_per_epoch
from scaling.errors import UsageError
from scaling.instrument.recorder import RunRecorder
from scaling.instrument.thread_usage import ThreadUsage
from scaling.instrument.timing import CommTimingHook, StepMarks, clock_for
from scaling.models import build_model
from scaling.train.precision import Precision

EVAL_BATCH = 512
# Calibration batches come from a permutation of their own, apart from any training epoch's.
CALIBRATION_EPOCH_OFFSET = 1_000_000


class InjectedFailure(RuntimeError):
    """Raised on purpose by `instrument.fail_at_step`, to test what a failed run leaves."""


@dataclass
class WorkerContext:
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    device: torch.device


def set_cpu_threads(cpus: int) -> None:
    """One torch thread per reserved CPU: oversubscription makes every timing meaningless."""
    torch.set_num_threads(cpus)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set in this process (e.g. a second run in the same worker)


def pin_training_thread(cpu_list: str, local_rank: int, cpus_per_worker: int) -> list[int]:
    """Pin the calling (training) thread to local rank's group of `cpus_per_worker` CPUs in `cpu_list`.

    Only this thread, and the threads it starts afterwards (torch's intra-op pool, with
    cpus_per_worker > 1, if not started before): the launcher's own threads in the process
    (Ray's core worker) stay where they were. Why: under Ray the
    training thread otherwise shares its core with Ray's processes, whose wake-ups preempt it
    hundreds of times a second (the `train_preemptions` column shows it; README, the lab's cost).
    """
    from scaling.config import parse_cpu_list

    cpus = parse_cpu_list(cpu_list)
    group = cpus[local_rank * cpus_per_worker:(local_rank + 1) * cpus_per_worker]
    if len(group) < cpus_per_worker:
        raise UsageError(f"workers.pin_cpus={cpu_list!r} has no group of {cpus_per_worker} CPU(s) for local rank {local_rank}; "
                         f"name at least {(local_rank + 1) * cpus_per_worker} CPUs")
    try:
        os.sched_setaffinity(0, group)  # 0: the calling thread
    except OSError as exc:
        raise UsageError(f"workers.pin_cpus: cannot pin to CPUs {group}: {exc.strerror}") from None
    return group


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def lr_multiplier(step: int, steps_per_ep: int, cfg: ExperimentConfig) -> float:
    """Learning rate at `step` as a multiple of the peak (linearly scaled) rate.

    Goyal et al. 2017: peak = lr x global_batch / reference_batch, reached by a linear ramp
    from `lr` over `warmup_epochs`; then constant, or cosine to 0 at max_epochs.
    """
    scale = cfg.global_batch / cfg.optim.reference_batch
    warmup_steps = cfg.optim.warmup_epochs * steps_per_ep
    if step < warmup_steps:
        start = min(1.0, 1.0 / scale)
        return start + (1.0 - start) * step / warmup_steps
    if cfg.optim.schedule == "cosine":
        total = cfg.train.max_epochs * steps_per_ep
        progress = min(1.0, (step - warmup_steps) / max(1.0, total - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def _evaluate(model: torch.nn.Module, dataset, ctx: WorkerContext, precision: Precision) -> dict:
    """Top-1 and top-5 accuracy over the whole validation set: each rank its shard, summed across ranks."""
    model.eval()
    totals = torch.zeros(3, device=ctx.device, dtype=torch.float64)  # top-1 correct, top-5 correct, samples
    with torch.no_grad():
        for inputs, targets in dataset.val_batches(ctx.rank, ctx.world_size, EVAL_BATCH):
            with precision.autocast():
                logits = model(precision.layout(inputs))
            top = logits.topk(min(5, logits.shape[1]), dim=1).indices
            hits = top == targets.view(-1, 1)
            totals[0] += hits[:, 0].sum()
            totals[1] += hits.any(dim=1).sum()
            totals[2] += len(targets)
    if ctx.world_size > 1:
        dist.all_reduce(totals)
    model.train()
    samples = float(totals[2])
    return {"top1": float(totals[0]) / samples, "top5": float(totals[1]) / samples}


def _calibrate(model, forward, loss_fn, precision, hook, batches, clock, recorder, epoch: int, step: int, pairs: int,
               hvd_optimizer=None) -> None:
    """A/B window: forward+backward with gradient sync off (`no_sync`) and on, alternating.

    The same batch serves both halves of a pair, and the order flips every pair (ABBA) so that
    slow drift cancels. No parameter is updated: gradients are dropped, and the BatchNorm
    buffers that the forward passes touched are restored afterwards.
    """
    saved_buffers = {name: buf.clone() for name, buf in model.named_buffers()}
    for pair in range(pairs):
        try:
            inputs, targets = next(batches)
        except StopIteration:
            break
        inputs = precision.layout(inputs)
        order = ("calib_nosync", "calib_sync") if pair % 2 == 0 else ("calib_sync", "calib_nosync")
        for kind in order:
            # DDP decides in forward whether the coming backward synchronises, so the whole
            # forward+backward sits inside no_sync(). Horovod: its hooks launch nothing inside
            # horovod_backend.no_sync(); the synchronised half waits for its all-reduces.
            if hvd_optimizer is not None:
                from scaling.train import horovod_backend

                no_sync = horovod_backend.no_sync(hvd_optimizer)
            else:
                no_sync = model.no_sync()
            with no_sync if kind == "calib_nosync" else contextlib.nullcontext():
                start = clock.mark()
                after_data = start  # the batch is already here: calibration times compute and sync only
                with precision.autocast():
                    loss = loss_fn(forward(inputs), targets)
                after_forward = clock.mark()
                precision.backward(loss)
                if hvd_optimizer is not None and kind == "calib_sync":
                    hook.synchronize()
                after_backward = clock.mark()
            model.zero_grad(set_to_none=True)
            recorder.step(
                StepMarks(epoch, step, kind, False, len(targets), start, after_data, after_forward,
                          after_backward, after_backward, hook.take(), pair=pair)
            )
    with torch.no_grad():
        for name, buf in model.named_buffers():
            buf.copy_(saved_buffers[name])


COMPRESSION_HOOKS = {
    "none": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


def _wrap_ddp(model, cfg: ExperimentConfig, ctx: WorkerContext, clock):
    """DDP with the gradient all-reduce hook chosen by config; returns (ddp_model, timing hook or None)."""
    # forward_sync_buffers=False: BatchNorm statistics are synced once at start and then
    # stay per worker (as in Goyal et al.), so the only communication during training is
    # the gradient all-reduce that the hook times.
    ddp = DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=cfg.instrument.ddp_bucket_cap_mb,
        forward_sync_buffers=False,
    )
    inner = COMPRESSION_HOOKS[cfg.instrument.grad_compression]
    if cfg.instrument.step_timing:
        hook = CommTimingHook(clock, inner_hook=inner, inject_delay_s=cfg.instrument.inject_comm_delay_s)
        ddp.register_comm_hook(state=None, hook=hook)
        return ddp, hook
    if cfg.instrument.grad_compression != "none":
        ddp.register_comm_hook(state=None, hook=inner)
    return ddp, None


def _profile_compute(cfg: ExperimentConfig, model: torch.nn.Module, ctx: WorkerContext, recorder: RunRecorder) -> dict:
    """Training FLOPs per sample (counted once, for this input size) and the device's peak.

    Every rank counts (on the meta device: no compute), so every rank's step records carry
    their FLOP rate; rank 0 also records the profile in `compute_profile.json`.
    """
    from scaling.instrument import flops

    size = cfg.data.image_size
    counts = flops.training_flops_per_sample(model, (3, size, size), cfg.data.num_classes)
    traffic = flops.training_bytes_per_sample(
        counts, cfg.train.per_worker_batch, bytes_per_element=4 if cfg.train.precision == "fp32" else 2
    )
    profile = {
        "precision": cfg.train.precision,
        "input_shape": [3, size, size],
        "per_worker_batch": cfg.train.per_worker_batch,
        **counts,
        "train_bytes_per_sample": traffic["bytes_per_sample"],
        "bytes_method": traffic["method"],
        **flops.device_roofs(ctx.device, cfg.train.precision, cfg.workers.cpus_per_worker, measure=ctx.rank == 0),
    }
    recorder.flops_per_sample = profile["train_flops"]
    recorder.write_json("compute_profile.json", profile)
    return profile


class Checkpoints:
    """Where a run's checkpoints go. This base class keeps none (the plain launcher has no restarts)."""

    def load(self) -> dict | None:
        return None

    def report(self, metrics: dict, state: dict | None) -> None:
        """End of an epoch: report metrics; `state` (rank 0's, or None) is saved as the latest checkpoint."""


def _checkpoint_state(model, optimizer, scheduler, precision, recorder, epoch, global_step, elapsed_train_s, run_first_step_unix):
    """Everything a restarted run needs to continue exactly where the checkpoint was taken."""
    return {
        "epoch": epoch,
        "global_step": global_step,
        "elapsed_train_s": elapsed_train_s,
        "run_first_step_unix": run_first_step_unix,
        "saved_unix": time.time(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": precision.scaler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "records": recorder.state_dict(),
    }


def train_worker(
    cfg: ExperimentConfig,
    ctx: WorkerContext,
    recorder: RunRecorder,
    checkpoints: Checkpoints | None = None,
) -> dict:
    """Train until the target accuracy or max_epochs; returns rank 0's last epoch row.

    With `checkpoints`, a checkpoint is taken every `failure.checkpoint_every_epochs` epochs
    and, when the launcher restarted the workers after a failure, the run resumes from the
    latest one: model, optimizer, LR schedule position, epoch and step counters, RNG state
    and the records written so far. Data order and augmentation are seeded per (seed, epoch,
    rank), so the resumed epochs see the same batches the uninterrupted run would have.
    """
    checkpoints = checkpoints or Checkpoints()
    from scaling.instrument.telemetry import start_telemetry, telemetry_available

    if cfg.workers.pin_cpus:
        pin_training_thread(cfg.workers.pin_cpus, ctx.local_rank, cfg.workers.cpus_per_worker)
    if ctx.device.type == "cpu":
        set_cpu_threads(cfg.workers.cpus_per_worker)
    seed_everything(cfg.train.seed)
    dataset = load_dataset(cfg.data, ctx.device)
    precision = Precision(cfg.train.precision, cfg.train.channels_last, ctx.device)
    model = precision.prepare_model(build_model(cfg.model.name, cfg.data.num_classes).to(ctx.device))
    clock = clock_for(ctx.device)
    _profile_compute(cfg, model, ctx, recorder)
    timing = cfg.instrument.step_timing

    hook = None  # what times communication: CommTimingHook (DDP) or HorovodCommTimer; both have take()
    use_horovod = cfg.backend == "horovod" and ctx.world_size > 1
    if use_horovod:
        from scaling.train import horovod_backend

        timeline = str(recorder.run_dir.resolve() / "horovod_timeline.json") if cfg.instrument.horovod_timeline and recorder.run_dir else None
        # Fusion threshold, cycle time and timeline are read by Horovod at init only.
        horovod_backend.setup_horovod_env_and_init(
            ctx.rank, ctx.world_size, ctx.local_rank, None, ctx.node_rank, None,
            tuning=horovod_backend.HorovodTuning.from_mb(
                cfg.instrument.horovod_fusion_threshold_mb, cfg.instrument.horovod_cycle_time_ms, timeline),
        )
    elif ctx.world_size > 1:
        model, hook = _wrap_ddp(model, cfg, ctx, clock)
    eval_model = model.module if ctx.world_size > 1 and not use_horovod else model
    # torch.compile wraps the (DDP) module for forward only; no_sync() and the hooks stay on DDP.
    forward = torch.compile(model) if cfg.train.compile else model

    def loss_fn(logits, targets):
        return F.cross_entropy(logits, targets, label_smoothing=cfg.train.label_smoothing)

    peak_lr = cfg.optim.lr * cfg.global_batch / cfg.optim.reference_batch
    optimizer = torch.optim.SGD(
        model.parameters(), lr=peak_lr, momentum=cfg.optim.momentum,
        nesterov=cfg.optim.momentum > 0, weight_decay=cfg.optim.weight_decay,
    )
    if use_horovod:
        # rank 0's parameters and buffers everywhere (as DDP's constructor does), then Horovod's optimizer
        optimizer = horovod_backend.wrap_optimizer(optimizer, model, compression=cfg.instrument.grad_compression)
        if timing:
            hook = horovod_backend.HorovodCommTimer(optimizer, clock, inject_delay_s=cfg.instrument.inject_comm_delay_s)
    steps_per_ep = steps_per_epoch(dataset.num_train, ctx.world_size, cfg.train.per_worker_batch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, steps_per_ep, cfg))

    if ctx.rank == 0 and ctx.device.type == "cpu" and cfg.train.precision == "fp16":
        print("note: fp16 autocast on CPU runs convolution backward in slow emulated kernels; "
              "bf16 is the CPU's mixed precision (train.precision=bf16)", flush=True)
    telemetry, telemetry_note = start_telemetry(ctx.device, cfg.instrument.telemetry_interval_s)
    if ctx.rank == 0 and cfg.instrument.telemetry_interval_s > 0:
        # One line: what was started on a GPU, or that a machine has no NVML to read.
        if ctx.device.type == "cuda":
            print(telemetry_note, flush=True)
        else:
            available, why_not = telemetry_available()
            if not available:
                print(why_not, flush=True)

    model.train()
    global_step = 0
    elapsed_train_s = 0.0
    first_epoch = 1
    restored = checkpoints.load()
    if restored is not None:
        eval_model.load_state_dict(restored["model"])
        optimizer.load_state_dict(restored["optimizer"])
        scheduler.load_state_dict(restored["scheduler"])
        precision.scaler.load_state_dict(restored["scaler"])
        torch.set_rng_state(restored["torch_rng"])
        random.setstate(restored["python_rng"])
        recorder.load_state_dict(restored["records"])
        global_step = restored["global_step"]
        elapsed_train_s = restored["elapsed_train_s"]
        first_epoch = restored["epoch"] + 1
    first_step_unix = time.time()  # this attempt's first step, for start-up cost (command -> first step)
    # The run's clock starts at its first attempt's first step, so wall figures include time lost to restarts.
    run_first_step_unix = restored["run_first_step_unix"] if restored else (recorder.first_attempt_unix() or first_step_unix)
    recorder.record_attempt(first_step_unix, resumed_from=restored)
    last_row: dict = {}
    try:
        for epoch in range(first_epoch, cfg.train.max_epochs + 1):
            batches = dataset.train_batches(ctx.rank, ctx.world_size, epoch, cfg.train.seed, cfg.train.per_worker_batch)
            loss_sum = torch.zeros((), device=ctx.device)
            if clock.cuda:
                torch.cuda.synchronize()  # epoch boundaries only: train_s is host wall time
            epoch_start = time.perf_counter()
            thread_usage = ThreadUsage()
            for _ in range(steps_per_ep):
                if global_step == cfg.instrument.fail_at_step and ctx.rank == 0:
                    raise InjectedFailure(f"injected failure at step {global_step} (instrument.fail_at_step)")
                start = clock.mark() if timing else None
                inputs, targets = next(batches)
                inputs = precision.layout(inputs)
                after_data = clock.mark() if timing else None
                with precision.autocast():
                    loss = loss_fn(forward(inputs), targets)
                after_forward = clock.mark() if timing else None
                precision.backward(loss)
                if use_horovod:
                    # wait for the all-reduces the backward hooks launched: the exposed part, in backward_s as with DDP
                    hook.synchronize() if hook is not None else optimizer.synchronize()
                after_backward = clock.mark() if timing else None
                if use_horovod:
                    with optimizer.skip_synchronize():
                        precision.step(optimizer)
                    optimizer.zero_grad()  # Horovod's zero_grad takes no set_to_none (it sets to None)
                else:
                    precision.step(optimizer)
                    optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                loss_sum += loss.detach()  # no .item(): that would synchronize every step on GPU
                if timing:
                    after_optimizer = clock.mark()
                    recorder.step(
                        StepMarks(epoch, global_step, "train", global_step < cfg.instrument.warmup_steps,
                                  len(targets), start, after_data, after_forward, after_backward,
                                  after_optimizer, hook.take() if hook else [])
                    )
                global_step += 1
            if clock.cuda:
                torch.cuda.synchronize()
            train_s = time.perf_counter() - epoch_start
            training_thread = thread_usage.stop()
            elapsed_train_s += train_s

            calibration_start = time.perf_counter()
            if hook is not None and cfg.instrument.calibration_pairs > 0:
                calib_batches = dataset.train_batches(ctx.rank, ctx.world_size, CALIBRATION_EPOCH_OFFSET + epoch, cfg.train.seed, cfg.train.per_worker_batch)
                _calibrate(model, forward, loss_fn, precision, hook, calib_batches, clock, recorder, epoch,
                           global_step - 1, cfg.instrument.calibration_pairs,
                           hvd_optimizer=optimizer if use_horovod else None)
                if clock.cuda:
                    torch.cuda.synchronize()
            calibration_s = time.perf_counter() - calibration_start

            eval_start = time.perf_counter()
            accuracy = _evaluate(eval_model, dataset, ctx, precision) if dataset.has_validation else {}
            eval_s = time.perf_counter() - eval_start

            samples = steps_per_ep * cfg.global_batch
            train_loss = float(loss_sum) / steps_per_ep
            val_accuracy = accuracy.get(cfg.train.target_metric, float("nan"))
            last_row = {
                "epoch": epoch,
                "train_s": train_s,
                "eval_s": eval_s,
                "calibration_s": calibration_s,
                "train_loss": train_loss,
                # the accuracy the target applies to (train.target_metric); both kinds beside it
                "val_accuracy": val_accuracy,
                "val_top1": accuracy.get("top1", float("nan")),
                "val_top5": accuracy.get("top5", float("nan")),
                "samples": samples,
                "throughput_samples_per_s": samples / train_s,
                "elapsed_train_s": elapsed_train_s,
                # wall time from the run's first step (first attempt) to the end of this epoch's validation
                "elapsed_wall_s": time.time() - run_first_step_unix,
                "lr": optimizer.param_groups[0]["lr"],
                "first_step_unix": first_step_unix,
                **training_thread,  # was the loop slow, or kept off its core? (scaling/instrument/thread_usage.py)
            }
            recorder.end_epoch(last_row, telemetry.drain() if telemetry else [])
            if ctx.rank == 0:
                print(
                    f"epoch {epoch:3d}  val_acc({cfg.train.target_metric}) {val_accuracy:.4f}  loss {train_loss:.4f}  "
                    f"train {train_s:.2f}s  {samples / train_s:,.0f} samples/s",
                    flush=True,
                )
            reached = dataset.has_validation and val_accuracy >= cfg.train.target_accuracy
            every = cfg.failure.checkpoint_every_epochs
            state = None
            if ctx.rank == 0 and every and epoch % every == 0 and not reached and epoch < cfg.train.max_epochs:
                state = _checkpoint_state(eval_model, optimizer, scheduler, precision, recorder, epoch, global_step,
                                          elapsed_train_s, run_first_step_unix)
            checkpoints.report(dict(last_row), state)
            if reached:
                break
    finally:
        if telemetry is not None:
            telemetry.stop()
    if use_horovod:
        # after a normal end only: every rank gets here together; rank 0 closes the timeline
        horovod_backend.shutdown()
    return last_row
