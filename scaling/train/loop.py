"""One worker's training loop: plain torch + DDP, Horovod or FSDP2 (scaling/train/backends/), launcher-agnostic.

`train_worker(cfg, ctx, run_dir, checkpoints)` runs identically under Ray Train
(scaling/launch/ray_train.py) and a plain torch.distributed launcher (scaling/launch/local.py):
the process group must already be initialised. It is a client of the public instrument
(`scaling.instrument.attach`), like a user's own job: the instrument times every step, runs
the A/B calibration window at each epoch's end and writes the records. The loop validates on
all ranks and stops at the first epoch whose validation metric reaches the target: accuracy at
or above `train.target_accuracy`, or (`train.target_metric: val_loss`) the validation loss at or
below `train.target_loss`.

A language model (token data: scaling/data/tokens.py) is trained and validated as a classifier
of every position: logits (batch, T, vocab) against next-token targets (batch, T), cross-entropy
and top-k accuracy per token; `val_loss` is the mean cross-entropy per token (per sample for a
classifier), in every epoch's and evaluation's record.

Per epoch: train (timed: `train_s`) | validate (`eval_s`) | calibrate (`calibration_s`) |
record + report (with a checkpoint every `failure.checkpoint_every_epochs`). TTA and
time-per-epoch count `train_s` only (plus, for a restarted run, the time lost to restarts).
"""

from __future__ import annotations

import math
import os
import random
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scaling.config import ExperimentConfig
from scaling.data import TOKEN_DATASETS, load_dataset, steps_per_epoch
from scaling.errors import UsageError
from scaling.models import build_model
from scaling.train.backends import for_run
from scaling.train.compile import CompileClock, compile_forward
from scaling.train.optimizer import build_optimizer
from scaling.train.precision import Precision, bf16_problem

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
    group = cpus[local_rank * cpus_per_worker : (local_rank + 1) * cpus_per_worker]
    if len(group) < cpus_per_worker:
        raise UsageError(
            f"workers.pin_cpus={cpu_list!r} has no group of {cpus_per_worker} CPU(s) for local rank {local_rank}; "
            f"name at least {(local_rank + 1) * cpus_per_worker} CPUs"
        )
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

    Goyal et al. 2017: peak = lr x global_batch / reference_batch (`optim.lr_rule` linear; or its
    square root, or 1: `cfg.lr_scale`), reached by a linear ramp from `lr` over `warmup_epochs`;
    then constant, or cosine to 0 at max_epochs.
    """
    scale = cfg.lr_scale
    warmup_steps = cfg.optim.warmup_epochs * steps_per_ep
    if step < warmup_steps:
        start = min(1.0, 1.0 / scale)
        return start + (1.0 - start) * step / warmup_steps
    if cfg.optim.schedule == "cosine":
        total = cfg.train.max_epochs * steps_per_ep
        progress = min(1.0, (step - warmup_steps) / max(1.0, total - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def _per_position(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows of logits, their targets): a language model's (batch, T, vocab) logits as batch x T rows."""
    return logits.flatten(0, -2), targets.flatten()


def _in_lockstep(batches, ctx: WorkerContext):
    """`batches`, with every rank taking as many forwards as the rank with the most: a sharded model's forward
    gathers its parameters with every rank, so a rank whose shard ran out runs its last batch again (None: its
    result is not counted) until all have ended, which a flag all-reduced per batch tells."""
    batches, last = iter(batches), None
    while True:
        batch = next(batches, None)
        more = torch.tensor([batch is not None], dtype=torch.int32, device=ctx.device)
        dist.all_reduce(more, op=dist.ReduceOp.MAX)
        if not more.item():
            return
        if batch is not None:
            last = batch
            yield batch
        else:
            yield None, last


def _evaluate(
    model: torch.nn.Module,
    dataset,
    ctx: WorkerContext,
    precision: Precision,
    batch_size: int = EVAL_BATCH,
    lockstep: bool = False,
) -> dict:
    """Top-1 and top-5 accuracy and the mean cross-entropy (`loss`) over the whole validation set, per
    sample (per token for a language model): each rank its shard, summed across ranks. `lockstep`:
    every rank takes the same number of forwards (a sharded model's: `_in_lockstep`)."""
    model.eval()
    totals = torch.zeros(4, device=ctx.device, dtype=torch.float64)  # top-1 correct, top-5 correct, loss sum, rows
    batches = dataset.val_batches(ctx.rank, ctx.world_size, batch_size)
    with torch.no_grad():
        for item in _in_lockstep(batches, ctx) if lockstep else batches:
            if item[0] is None:  # this rank's shard ended: a forward the others need, not counted
                with precision.autocast():
                    model(precision.layout(item[1][0]))
                continue
            inputs, targets = item
            with precision.autocast():
                logits = model(precision.layout(inputs))
            logits, targets = _per_position(logits, targets)
            top = logits.topk(min(5, logits.shape[1]), dim=1).indices
            hits = top == targets.view(-1, 1)
            totals[0] += hits[:, 0].sum()
            totals[1] += hits.any(dim=1).sum()
            totals[2] += F.cross_entropy(logits.float(), targets, reduction="sum")
            totals[3] += len(targets)
    if ctx.world_size > 1:
        dist.all_reduce(totals)
    model.train()
    rows = float(totals[3])
    return {"top1": float(totals[0]) / rows, "top5": float(totals[1]) / rows, "loss": float(totals[2]) / rows}


def _target_value(evaluation: dict, cfg: ExperimentConfig) -> float:
    """The figure the target applies to (`train.target_metric`)."""
    return evaluation.get("loss" if cfg.train.target_metric == "val_loss" else cfg.train.target_metric, float("nan"))


def _reached(evaluation: dict, cfg: ExperimentConfig) -> bool:
    """Accuracy at or above train.target_accuracy; a loss at or below train.target_loss (lower is better)."""
    if not evaluation:
        return False
    if cfg.train.target_metric == "val_loss":
        return evaluation["loss"] <= cfg.train.target_loss
    return evaluation[cfg.train.target_metric] >= cfg.train.target_accuracy


def _accuracy_column(evaluation: dict, cfg: ExperimentConfig) -> float:
    """`val_accuracy` of the records: the accuracy train.target_metric names, top-1 for a loss target."""
    return evaluation.get("top1" if cfg.train.target_metric == "val_loss" else cfg.train.target_metric, float("nan"))


class Checkpoints:
    """Where a run's checkpoints go. This base class keeps none (the plain launcher has no restarts)."""

    def load(self) -> dict | None:
        return None

    def report(self, metrics: dict, state: dict | None) -> None:
        """End of an epoch: report metrics; `state` (rank 0's, or None) is saved as the latest checkpoint."""


def _checkpoint_state(scheduler, precision, meter, device: torch.device, model_state: dict | None = None) -> dict:
    """Everything a restarted run needs to continue exactly where the checkpoint was taken.

    `model_state`: the model's and the optimizer's, as the backend keeps them (`meter.backend.checkpoint_state()`,
    asked here when not given; a sharded model's is made by every rank beforehand)."""
    return {
        **(model_state if model_state is not None else meter.backend.checkpoint_state()),
        "scheduler": scheduler.state_dict(),
        "scaler": precision.scaler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        # the worker's GPU generator (dropout and any torch.rand on the device); None on CPU
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "python_rng": random.getstate(),
        "instrument": meter.state_dict(),  # epoch and step counters, the run's clock, the records so far
    }


def _restore_rng(state: dict, device: torch.device) -> None:
    """The RNG states of `_checkpoint_state` (a checkpoint from before cuda_rng was kept has none)."""
    torch.set_rng_state(state["torch_rng"])
    if device.type == "cuda" and state.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(state["cuda_rng"], device)
    random.setstate(state["python_rng"])


def pins_after_backend(cfg: ExperimentConfig, ctx: WorkerContext) -> bool:
    """Whether the training thread is pinned after the backend is set up rather than at the worker's start.

    GPU workers of the lab's loop: NCCL starts its proxy threads (and Horovod its background
    thread) with the CPU mask of the thread that creates the communicator, which DDP's
    constructor does; pinned first, they would share the training thread's CPUs. A user's
    function creates its own communicator: pinned at the start, with the two or more CPUs
    per worker that preflight requires (scaling/config.py).
    """
    return ctx.device.type == "cuda" and not cfg.train.function


def set_up_worker(cfg: ExperimentConfig, ctx: WorkerContext) -> None:
    """The worker's CPU and device set-up, before any model or data is made."""
    if cfg.workers.pin_cpus and not pins_after_backend(cfg, ctx):
        pin_training_thread(cfg.workers.pin_cpus, ctx.local_rank, cfg.workers.cpus_per_worker)
    # GPU workers too: torch's default pool is one thread per core of the machine, whoever else
    # (other workers, DataLoader processes) runs on it.
    set_cpu_threads(cfg.workers.cpus_per_worker)
    if ctx.device.type == "cuda" and not cfg.train.function:
        # The lab's training batches all have one shape (drop_last, fixed image size), so
        # cuDNN's autotuning is paid once per shape (the first steps: warm-up) and then reused.
        torch.backends.cudnn.benchmark = True


def run_worker(
    cfg: ExperimentConfig, ctx: WorkerContext, run_dir, checkpoints: Checkpoints | None = None, live_metrics=None
):
    """A launcher's per-worker entry: the worker's CPU set-up, then the lab's loop or the user's function.

    `live_metrics`: the launcher's live metrics for the instrument (scaling/instrument/parts.py), or
    None; a user's function gets its parts from the lab's provider instead."""
    set_up_worker(cfg, ctx)
    from scaling.train.user_function import lab_context, run_user_function

    with lab_context(cfg, run_dir):
        if cfg.train.function:
            return run_user_function(cfg)
        return train_worker(cfg, ctx, run_dir, checkpoints, live_metrics)


def _start_notes(cfg, ctx, meter) -> None:
    """Rank 0's lines before training: a bf16 the GPU runs slowly, fp16 emulated on a CPU, and what telemetry
    started (or why none)."""
    if ctx.device.type == "cuda" and cfg.train.precision == "bf16":
        # Under Ray only the workers see their GPUs; the plain launcher refused this at preflight.
        problem = bf16_problem(torch.cuda.get_device_name(ctx.device), torch.cuda.get_device_capability(ctx.device))
        if problem:
            print(f"warning: {problem}", file=sys.stderr, flush=True)
    if ctx.device.type == "cpu" and cfg.train.precision == "fp16":
        print(
            "note: fp16 autocast on CPU runs convolution backward in slow emulated kernels; "
            "bf16 is the CPU's mixed precision (train.precision=bf16)",
            file=sys.stderr,
            flush=True,
        )
    if cfg.instrument.telemetry_interval_s > 0:
        # One line: what was started on a GPU, or that a machine has no NVML to read.
        from scaling.instrument.telemetry import telemetry_available

        available, why_not = telemetry_available()
        if ctx.device.type == "cuda" or not available:
            print(meter.telemetry_note if ctx.device.type == "cuda" else why_not, flush=True)


def _print_epoch(cfg, epoch: int, row: dict, evaluation: dict | None, train_loss: float) -> None:
    """Rank 0's line per epoch: the target's figure (none for a dataset without validation, rather than
    "nan"), the training loss and time, and the throughput (with tokens for token data)."""
    rate = f"{row['throughput_samples_per_s']:,.0f} samples/s"
    if cfg.data.name in TOKEN_DATASETS:
        rate += f" ({row['throughput_samples_per_s'] * cfg.data.seq_len:,.0f} tokens/s)"
    figure = "val_loss" if cfg.train.target_metric == "val_loss" else f"val_acc({cfg.train.target_metric})"
    validation = f"  {figure} {_target_value(evaluation, cfg):.4f}" if evaluation is not None else ""
    print(f"epoch {epoch:3d}{validation}  loss {train_loss:.4f}  train {row['train_s']:.2f}s  {rate}", flush=True)


def train_worker(
    cfg: ExperimentConfig, ctx: WorkerContext, run_dir, checkpoints: Checkpoints | None = None, live_metrics=None
) -> dict:
    """Train until the target accuracy or max_epochs; returns rank 0's last epoch row.

    The loop is a client of the public instrument (scaling/instrument/meter.py), like any
    user's job: it attaches to the wrapped model and optimizer, iterates `meter.batches`, and
    hands `end_epoch` the validation accuracy; the backend is behind scaling/train/backends/
    (the wrapped model and optimizer) and the instrument's adapter (checkpoint state).

    With `checkpoints`, a checkpoint is taken every `failure.checkpoint_every_epochs` epochs
    and, when the launcher restarted the workers after a failure, the run resumes from the
    latest one: model, optimizer, LR schedule position, epoch and step counters, RNG state
    and the records written so far. Data order and augmentation are seeded per (seed, epoch,
    rank), so the resumed epochs see the same batches the uninterrupted run would have.
    """
    from scaling.instrument import Identity, Parts, attach

    checkpoints = checkpoints or Checkpoints()
    seed_everything(cfg.train.seed)
    # channels_last batches come out of the loader in that layout (made in a copy the batch
    # needs anyway), so `precision.layout` finds them laid out and copies nothing
    dataset = load_dataset(cfg.data, ctx.device, channels_last=cfg.train.channels_last)
    precision = Precision(cfg.train.precision, cfg.train.channels_last, ctx.device)
    plain_model = precision.prepare_model(build_model(cfg.model.name, cfg.data.num_classes).to(ctx.device))
    peak_lr = cfg.optim.lr * cfg.lr_scale
    optimizer = build_optimizer(cfg, plain_model.parameters(), ctx.device, peak_lr)  # fused on CUDA
    lab_backend = for_run(cfg, ctx.world_size)
    model, optimizer, close_backend = lab_backend.wrap(cfg, ctx, plain_model, optimizer, run_dir)
    lockstep = lab_backend.sharded  # a sharded model (FSDP) validates with every rank's forward together
    if cfg.workers.pin_cpus and pins_after_backend(cfg, ctx):
        pin_training_thread(cfg.workers.pin_cpus, ctx.local_rank, cfg.workers.cpus_per_worker)
    # torch.compile wraps the (DDP or FSDP2) module; no_sync() and the hooks stay on the wrapper, and
    # the instrument watches the compiled wrapper's forward (hooks inside a graph would be traced).
    forward = compile_forward(cfg, model)
    # compilation happens in the first steps, which are warm-up; their extra time is `compile_s`
    compile_clock = CompileClock(cfg.instrument.warmup_steps if cfg.train.compile else 0, ctx.device)

    def loss_fn(logits, targets):
        return F.cross_entropy(*_per_position(logits, targets), label_smoothing=cfg.train.label_smoothing)

    def forward_backward(batch):
        """One calibration pass (the A/B window): forward, loss and backward, no step."""
        inputs, targets = batch
        with precision.autocast():
            loss = loss_fn(forward(precision.layout(inputs)), targets)
        precision.backward(loss)

    def calibration_batches(epoch: int):
        # Calibration batches come from a permutation of their own, apart from any training epoch's.
        return dataset.train_batches(
            ctx.rank, ctx.world_size, CALIBRATION_EPOCH_OFFSET + epoch, cfg.train.seed, cfg.train.per_worker_batch
        )

    meter = attach(
        model,
        optimizer,
        run_dir=run_dir,
        forward_module=forward,
        name=cfg.name,
        target_accuracy=cfg.train.target_accuracy,
        target_loss=cfg.train.target_loss if cfg.train.target_metric == "val_loss" else None,
        forward_backward=forward_backward,
        calibration_data=calibration_batches,
        settings=cfg.instrument,
        # the launcher writes the run's summary: no finisher
        parts=Parts(
            identity=Identity(ctx.rank, ctx.world_size, ctx.local_rank, ctx.node_rank), live_metrics=live_metrics
        ),
    )
    steps_per_ep = steps_per_epoch(dataset.num_train, ctx.world_size, cfg.train.per_worker_batch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, steps_per_ep, cfg))

    if ctx.rank == 0:
        _start_notes(cfg, ctx, meter)

    # Evaluations inside an epoch (train.eval_every < 1), after these steps; the epoch's end always evaluates.
    evaluations = round(1 / cfg.train.eval_every)
    # A sequence's logits are T x vocab: validate in training-sized batches (what fits for training fits here).
    tokens = cfg.data.name in TOKEN_DATASETS
    eval_batch = cfg.train.per_worker_batch if tokens else EVAL_BATCH
    mid_epoch_evals = {round(k * steps_per_ep / evaluations) for k in range(1, evaluations)} - {0, steps_per_ep}
    model.train()
    restored = checkpoints.load()
    if restored is not None:
        meter.backend.load_checkpoint_state(restored)
        scheduler.load_state_dict(restored["scheduler"])
        precision.scaler.load_state_dict(restored["scaler"])
        _restore_rng(restored, ctx.device)
        meter.load_state_dict(restored["instrument"])
    last_row: dict = {}
    try:
        for epoch in range(meter.epoch + 1, cfg.train.max_epochs + 1):
            batches = dataset.train_batches(ctx.rank, ctx.world_size, epoch, cfg.train.seed, cfg.train.per_worker_batch)
            loss_sum = torch.zeros((), device=ctx.device)
            for step_in_epoch, (inputs, targets) in enumerate(meter.batches(batches), start=1):
                if meter.global_step - 1 == cfg.instrument.fail_at_step and ctx.rank == 0:
                    raise InjectedFailure(f"injected failure at step {meter.global_step - 1} (instrument.fail_at_step)")
                compile_clock.start()
                with precision.autocast():
                    loss = loss_fn(forward(precision.layout(inputs)), targets)
                precision.backward(loss)
                precision.step(optimizer)  # fp16: GradScaler's inf check is this loop's one intended host sync per step
                optimizer.zero_grad()  # set_to_none (torch's default; Horovod's takes no argument)
                scheduler.step()
                compile_clock.stop()  # with train.compile, the warm-up steps only: one device sync each
                loss_sum += loss.detach()  # no .item(): that would synchronize every step on GPU
                if step_in_epoch in mid_epoch_evals and dataset.has_validation:
                    with meter.paused():  # outside train_s, the step and TTA
                        mid = _evaluate(plain_model, dataset, ctx, precision, eval_batch, lockstep)
                        meter.record_eval(
                            _accuracy_column(mid, cfg),
                            epoch_progress=epoch - 1 + step_in_epoch / steps_per_ep,
                            val_top1=mid["top1"],
                            val_top5=mid["top5"],
                            val_loss=mid["loss"],
                        )
            evaluation = (
                _evaluate(plain_model, dataset, ctx, precision, eval_batch, lockstep) if dataset.has_validation else {}
            )
            train_loss = float(loss_sum) / steps_per_ep
            last_row = meter.end_epoch(
                val_accuracy=_accuracy_column(evaluation, cfg),
                samples=steps_per_ep * cfg.global_batch,
                train_loss=train_loss,
                # both kinds of accuracy and the loss beside the figure the target applies to (train.target_metric)
                val_top1=evaluation.get("top1", float("nan")),
                val_top5=evaluation.get("top5", float("nan")),
                val_loss=evaluation.get("loss", float("nan")),
                lr=optimizer.param_groups[0]["lr"],
                **compile_clock.columns(),  # compile_s, compile_steps: in the epoch whose steps compiled
            )
            if ctx.rank == 0:
                _print_epoch(cfg, epoch, last_row, evaluation if dataset.has_validation else None, train_loss)
            reached = dataset.has_validation and _reached(evaluation, cfg)
            every = cfg.failure.checkpoint_every_epochs
            state = None
            due = every and epoch % every == 0 and not reached and epoch < cfg.train.max_epochs
            # a sharded model (FSDP): every rank gives its shards to the state rank 0 keeps
            if due and (ctx.rank == 0 or lab_backend.sharded):
                model_state = meter.backend.checkpoint_state()
                if ctx.rank == 0:
                    state = _checkpoint_state(scheduler, precision, meter, ctx.device, model_state)
            checkpoints.report(dict(last_row), state)
            if reached:
                break
    finally:
        meter.detach()
    close_backend()
    return last_row
