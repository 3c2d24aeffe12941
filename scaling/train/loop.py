"""One worker's training loop: plain torch + DDP, launcher-agnostic.

`train_worker(cfg, ctx, recorder, report_epoch)` runs identically under Ray Train
(scaling/launch/ray_train.py) and a plain torch.distributed launcher (scaling/launch/local.py):
the process group must already be initialised. It times every step through marks handed to
the recorder, runs the A/B calibration window after each epoch's training, validates on all
ranks, and stops at the first epoch whose validation accuracy reaches the target.

Per epoch: train (timed: `train_s`) | calibrate (`calibration_s`) | validate (`eval_s`) |
record + report. TTA and time-per-epoch count `train_s` only.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from scaling.config import ExperimentConfig
from scaling.data import InMemoryDataset, load_dataset, steps_per_epoch, train_batches, val_shard
from scaling.instrument.recorder import RunRecorder
from scaling.instrument.timing import CommTimingHook, StepMarks, clock_for
from scaling.models import build_model

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


def _evaluate(model: torch.nn.Module, dataset: InMemoryDataset, ctx: WorkerContext) -> float:
    """Top-1 accuracy over the whole validation set: each rank its shard, summed across ranks."""
    model.eval()
    shard = val_shard(len(dataset.val_y), ctx.rank, ctx.world_size)
    indices = torch.tensor(list(shard), device=ctx.device, dtype=torch.long)
    correct = torch.zeros((), device=ctx.device, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, len(indices), EVAL_BATCH):
            batch = indices[start : start + EVAL_BATCH]
            logits = model(dataset.val_x[batch])
            correct += (logits.argmax(dim=1) == dataset.val_y[batch]).sum()
    totals = torch.stack([correct, torch.tensor(float(len(indices)), device=ctx.device, dtype=torch.float64)])
    if ctx.world_size > 1:
        dist.all_reduce(totals)
    model.train()
    return float(totals[0] / totals[1])


def _calibrate(model, hook, batches, clock, recorder, epoch: int, step: int, pairs: int) -> None:
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
        order = ("calib_nosync", "calib_sync") if pair % 2 == 0 else ("calib_sync", "calib_nosync")
        for kind in order:
            # DDP decides in forward whether the coming backward synchronises, so the whole
            # forward+backward sits inside no_sync().
            with model.no_sync() if kind == "calib_nosync" else contextlib.nullcontext():
                start = clock.mark()
                after_data = start  # the batch is already here: calibration times compute and sync only
                loss = F.cross_entropy(model(inputs), targets)
                after_forward = clock.mark()
                loss.backward()
                after_backward = clock.mark()
            model.zero_grad(set_to_none=True)
            recorder.step(
                StepMarks(epoch, step, kind, False, len(targets), start, after_data, after_forward,
                          after_backward, after_backward, hook.take(), pair=pair)
            )
    with torch.no_grad():
        for name, buf in model.named_buffers():
            buf.copy_(saved_buffers[name])


def train_worker(
    cfg: ExperimentConfig,
    ctx: WorkerContext,
    recorder: RunRecorder,
    report_epoch: Callable[[dict], None],
) -> dict:
    """Train until the target accuracy or max_epochs; returns rank 0's last epoch row."""
    if ctx.device.type == "cpu":
        set_cpu_threads(cfg.workers.cpus_per_worker)
    seed_everything(cfg.train.seed)
    dataset = load_dataset(cfg.data, ctx.device)
    model = build_model(cfg.model.name, cfg.data.num_classes).to(ctx.device)
    clock = clock_for(ctx.device)

    hook = None
    if ctx.world_size > 1:
        # forward_sync_buffers=False: BatchNorm statistics are synced once at start and then
        # stay per worker (as in Goyal et al.), so the only communication during training is
        # the gradient all-reduce that the hook times.
        model = DistributedDataParallel(
            model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            bucket_cap_mb=cfg.instrument.ddp_bucket_cap_mb,
            forward_sync_buffers=False,
        )
        hook = CommTimingHook(clock, inject_delay_s=cfg.instrument.inject_comm_delay_s)
        model.register_comm_hook(state=None, hook=hook)
    eval_model = model.module if hook is not None else model

    peak_lr = cfg.optim.lr * cfg.global_batch / cfg.optim.reference_batch
    optimizer = torch.optim.SGD(
        model.parameters(), lr=peak_lr, momentum=cfg.optim.momentum,
        nesterov=cfg.optim.momentum > 0, weight_decay=cfg.optim.weight_decay,
    )
    steps_per_ep = steps_per_epoch(len(dataset.train_y), ctx.world_size, cfg.train.per_worker_batch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, steps_per_ep, cfg))

    model.train()
    global_step = 0
    elapsed_train_s = 0.0
    run_start = time.perf_counter()
    last_row: dict = {}
    for epoch in range(1, cfg.train.max_epochs + 1):
        batches = train_batches(dataset, ctx.rank, ctx.world_size, epoch, cfg.train.seed, cfg.train.per_worker_batch)
        loss_sum = torch.zeros((), device=ctx.device)
        if clock.cuda:
            torch.cuda.synchronize()  # epoch boundaries only: train_s is host wall time
        epoch_start = time.perf_counter()
        for _ in range(steps_per_ep):
            if global_step == cfg.instrument.fail_at_step and ctx.rank == 0:
                raise InjectedFailure(f"injected failure at step {global_step} (instrument.fail_at_step)")
            start = clock.mark()
            inputs, targets = next(batches)
            after_data = clock.mark()
            loss = F.cross_entropy(model(inputs), targets)
            after_forward = clock.mark()
            loss.backward()
            after_backward = clock.mark()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            after_optimizer = clock.mark()
            loss_sum += loss.detach()  # no .item(): that would synchronize every step on GPU
            recorder.step(
                StepMarks(epoch, global_step, "train", global_step < cfg.instrument.warmup_steps,
                          len(targets), start, after_data, after_forward, after_backward,
                          after_optimizer, hook.take() if hook else [])
            )
            global_step += 1
        if clock.cuda:
            torch.cuda.synchronize()
        train_s = time.perf_counter() - epoch_start
        elapsed_train_s += train_s

        calibration_start = time.perf_counter()
        if hook is not None and cfg.instrument.calibration_pairs > 0:
            calib_batches = train_batches(dataset, ctx.rank, ctx.world_size, CALIBRATION_EPOCH_OFFSET + epoch, cfg.train.seed, cfg.train.per_worker_batch)
            _calibrate(model, hook, calib_batches, clock, recorder, epoch, global_step - 1, cfg.instrument.calibration_pairs)
            if clock.cuda:
                torch.cuda.synchronize()
        calibration_s = time.perf_counter() - calibration_start

        eval_start = time.perf_counter()
        val_accuracy = _evaluate(eval_model, dataset, ctx) if dataset.has_validation else float("nan")
        eval_s = time.perf_counter() - eval_start

        samples = steps_per_ep * cfg.global_batch
        train_loss = float(loss_sum) / steps_per_ep
        last_row = {
            "epoch": epoch,
            "train_s": train_s,
            "eval_s": eval_s,
            "calibration_s": calibration_s,
            "train_loss": train_loss,
            "val_accuracy": val_accuracy,
            "samples": samples,
            "throughput_samples_per_s": samples / train_s,
            "elapsed_train_s": elapsed_train_s,
            # wall time from the first step to the end of this epoch's validation
            "elapsed_wall_s": time.perf_counter() - run_start,
            "lr": optimizer.param_groups[0]["lr"],
        }
        recorder.end_epoch(last_row)
        if ctx.rank == 0:
            print(
                f"epoch {epoch:3d}  val_acc {val_accuracy:.4f}  loss {train_loss:.4f}  "
                f"train {train_s:.2f}s  {samples / train_s:,.0f} samples/s",
                flush=True,
            )
        report_epoch({k: v for k, v in last_row.items()})
        if dataset.has_validation and val_accuracy >= cfg.train.target_accuracy:
            break
    return last_row
