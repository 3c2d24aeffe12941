"""The shapes real training jobs have, written as a user writes them, for tests/test_real_jobs.py.

Each `job_*` function trains a small model with `scaling.instrument.attach` the way the README
shows, plus one pattern real jobs use (gradient accumulation, an evaluation inside the epoch,
GradScaler, two optimizers, a siamese forward, ...), and returns what the job itself saw (its
losses, its own clock around an evaluation) beside the run directory the instrument wrote. The
same functions run at world size 1 in the test process and at world size 2 in spawned gloo
processes (`world_job`).
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES, CLASSES, BATCH = 32, 4, 16
EVAL_SLEEP_S = 0.06  # one evaluation forward's known length (SlowEvalMLP)


class SlowEvalMLP(nn.Module):
    """A small MLP with dropout whose evaluation forwards take a known time (a stand-in for a validation set)."""

    def __init__(self, sleep_in_eval: bool = False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, CLASSES))
        self.sleep_in_eval = sleep_in_eval
        self.eval_sleeps: list[tuple[float, float]] = []

    def forward(self, x):
        if self.sleep_in_eval and not (self.training and torch.is_grad_enabled()):
            begin = time.perf_counter()
            time.sleep(EVAL_SLEEP_S)
            self.eval_sleeps.append((begin, time.perf_counter()))
        return self.body(x)


def batches(count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable rule (the class is the argmax of the first CLASSES features), per rank."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        x = torch.randn(BATCH, FEATURES, generator=generator)
        out.append((x, x[:, :CLASSES].argmax(dim=1)))
    return out


def _wrap(module: nn.Module) -> nn.Module:
    return DistributedDataParallel(module) if dist.is_initialized() else module


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def job_accumulation(
    run_dir: str,
    *,
    accumulate: int = 2,
    use_no_sync: bool = True,
    delay_s: float = 0.0,
    steps_per_epoch: int = 6,
    epochs: int = 2,
    pairs: int = 3,
    bf16: bool = True,
    timing_every: int = 50,
) -> dict:
    """Gradient accumulation (DDP's no_sync on all but the last micro-batch, or not), clipping, an LR scheduler,
    bf16 autocast (or not: the ground truth's runs compare communication, which autocast does not change);
    collectives timed on every `timing_every`th step after the first (the instrument's default 50)."""
    from scaling import instrument

    torch.manual_seed(0)
    model = _wrap(SlowEvalMLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    loss_fn = nn.CrossEntropyLoss()
    data = batches(steps_per_epoch * accumulate, seed=_rank())

    def forward_backward(batch):
        (loss_fn(model(batch[0]), batch[1]) / accumulate).backward()

    with instrument.attach(
        model,
        optimizer,
        run_dir=run_dir,
        warmup_steps=2,
        calibration_pairs=pairs,
        forward_backward=forward_backward,
        calibration_data=data[:pairs],
        inject_comm_delay_s=delay_s,
        collective_timing_every=timing_every,
    ) as meter:
        for _ in range(epochs):
            for i, (x, y) in enumerate(meter.batches(data)):
                last = (i + 1) % accumulate == 0
                with model.no_sync() if (use_no_sync and not last and dist.is_initialized()) else _nothing():
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        loss = loss_fn(model(x), y) / accumulate
                    loss.backward()
                if last:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
            meter.end_epoch(val_accuracy=0.5)
    return {}


def job_slow_input(run_dir: str, *, slow_ranks: tuple[int, ...], sleep_s: float, steps: int = 12) -> dict:
    """A plain DDP loop whose batches come from an iterator that sleeps `sleep_s` before each batch on
    `slow_ranks` (a slow disk or too few loader workers): input-bound where every rank sleeps, an input
    straggler where one does."""
    from scaling import instrument

    torch.manual_seed(0)
    model = _wrap(SlowEvalMLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    data = batches(steps, seed=_rank())

    def loader():
        for batch in data:
            if _rank() in slow_ranks:
                time.sleep(sleep_s)
            yield batch

    with instrument.attach(model, optimizer, run_dir=run_dir, warmup_steps=2) as meter:
        for _ in range(2):
            for x, y in meter.batches(loader()):
                loss_fn(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
            meter.end_epoch(val_accuracy=0.5)
    return {}


def job_ddp_wrapper_work(run_dir: str, *, sleep_s: float, steps: int = 10) -> dict:
    """A DDP job whose wrapper works in every forward: `find_unused_parameters=True`, a model with a buffer
    (broadcast from rank 0 before each forward), and a forward pre-hook of the job's own on the wrapper that
    sleeps `sleep_s` (the ground truth: inside the wrapper's time before the module's forward, as a
    broadcast is). Returns each training forward's sleep as slept, in order."""
    from scaling import instrument

    torch.manual_seed(0)
    module = SlowEvalMLP()
    module.register_buffer("seen", torch.zeros(256))
    model = DistributedDataParallel(module, find_unused_parameters=True)
    slept = []

    def slow_wrapper(wrapper, args):
        if wrapper.training and torch.is_grad_enabled():
            began = time.perf_counter()
            time.sleep(sleep_s)
            slept.append(time.perf_counter() - began)

    model.register_forward_pre_hook(slow_wrapper)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    data = batches(steps, seed=_rank())
    with instrument.attach(model, optimizer, run_dir=run_dir, warmup_steps=2) as meter:
        for _ in range(2):
            for x, y in meter.batches(data):
                loss_fn(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
            meter.end_epoch(val_accuracy=0.5)
    return {"slept_s": slept}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def job_mid_epoch_eval(run_dir: str, *, steps: int = 9, every: int = 3, eval_batches: int = 2) -> dict:
    """An evaluation every `every` steps, in eval mode under no_grad, without `meter.paused()`."""
    from scaling import instrument

    torch.manual_seed(0)
    module = SlowEvalMLP(sleep_in_eval=True)
    model = _wrap(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    data, validation = batches(steps, seed=_rank()), batches(eval_batches, seed=100)
    evaluations = []
    with instrument.attach(model, optimizer, run_dir=run_dir, warmup_steps=0) as meter:
        loop_enter = time.perf_counter()
        for i, (x, y) in enumerate(meter.batches(data)):
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if (i + 1) % every == 0:
                begin = time.perf_counter()
                model.eval()
                with torch.no_grad():
                    correct = sum(int((model(vx).argmax(1) == vy).sum()) for vx, vy in validation)
                model.train()
                evaluations.append({"step": i, "begin": begin, "end": time.perf_counter(), "correct": correct})
        loop_exit = time.perf_counter()
        row = meter.end_epoch(val_accuracy=0.5)
    return {
        "loop_enter": loop_enter,
        "loop_exit": loop_exit,
        "evaluations": evaluations,
        "eval_sleeps": module.eval_sleeps,
        "train_s": row["train_s"],
        "eval_s": row["eval_s"],
    }


def job_odd_steps(run_dir: str, pattern: str, *, count: int = 8) -> dict:
    """Steps that are not one forward + one backward + one optimizer step (test_real_jobs.py lists them)."""
    from scaling import instrument

    torch.manual_seed(0)
    model = _wrap(SlowEvalMLP())
    body = model.module.body if isinstance(model, DistributedDataParallel) else model.body
    loss_fn = nn.CrossEntropyLoss()
    if pattern == "two_optimizers":  # a GAN's shape: two optimizers stepped per batch
        optimizers = [torch.optim.SGD(body[0].parameters(), lr=0.05), torch.optim.SGD(body[3].parameters(), lr=0.05)]
    else:
        optimizers = [torch.optim.SGD(model.parameters(), lr=0.05)]
    scaler = torch.amp.GradScaler("cpu") if pattern == "grad_scaler_skip" else None
    data = batches(count, seed=_rank())
    meter = instrument.attach(
        model, optimizers if len(optimizers) > 1 else optimizers[0], run_dir=run_dir, warmup_steps=0
    )
    for i, (x, y) in enumerate(meter.batches(data)):
        if pattern == "skipped_batch" and i == 3:
            continue  # a batch the job decides not to train on
        if pattern == "siamese":  # the model called 3 times per step (world size 1: DDP wants one forward per backward)
            loss = loss_fn(model(x), y) + (model(x.flip(0)) - model(x)).pow(2).mean()
        else:
            loss = loss_fn(model(x), y)
        if scaler is not None:
            if i == 2:
                loss = loss * float("nan")  # this step's gradients are not finite: GradScaler skips its step
            scaler.scale(loss).backward()
            scaler.step(optimizers[0])
            scaler.update()
        else:
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=pattern != "zero_not_none")
    meter.end_epoch(val_accuracy=0.5)
    meter.finish()
    return {}


def job_losses(run_dir: str | None, *, attached: bool, epochs: int = 2, count: int = 6) -> dict:
    """Dropout, a shuffling DataLoader and the A/B calibration on: the losses the job computes, step by step."""
    from scaling import instrument

    torch.manual_seed(0)
    model = _wrap(SlowEvalMLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.cat([b[0] for b in batches(count, seed=_rank())])
    y = x[:, :CLASSES].argmax(dim=1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)

    def forward_backward(batch):
        loss_fn(model(batch[0]), batch[1]).backward()

    meter = (
        instrument.attach(
            model,
            optimizer,
            run_dir=run_dir,
            warmup_steps=1,
            calibration_pairs=2,
            forward_backward=forward_backward,
            calibration_data=loader,
        )
        if attached
        else None
    )
    losses = []
    for _ in range(epochs):
        for xb, yb in meter.batches(loader) if meter else loader:
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        if meter:
            meter.end_epoch(val_accuracy=0.5)
    if meter:
        meter.finish()
    return {"losses": losses}


def job_fails(run_dir: str, *, fail_in_epoch: int = 2) -> dict:
    """A training loop that raises in its second epoch, inside `with attach(...)`."""
    from scaling import instrument

    torch.manual_seed(0)
    model = _wrap(SlowEvalMLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    data = batches(4, seed=_rank())
    try:
        with instrument.attach(model, optimizer, run_dir=run_dir, warmup_steps=0) as meter:
            for epoch in range(1, 4):
                for i, (x, y) in enumerate(meter.batches(data)):
                    if epoch == fail_in_epoch and i == 2:
                        raise RuntimeError("the job's own error")
                    loss_fn(model(x), y).backward()
                    optimizer.step()
                    optimizer.zero_grad()
                meter.end_epoch(val_accuracy=0.5)
    except RuntimeError as exc:
        hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
        return {"raised": str(exc), "hooks_left": hooks + len(optimizer._optimizer_step_pre_hooks)}
    return {"raised": None}


WORLD_CASES = {
    "accumulation": lambda d: job_accumulation(d),
    "accumulation_delay": lambda d: job_accumulation(d, delay_s=DELAY_S, bf16=False),
    "accumulation_sync_every_delay": lambda d: job_accumulation(d, use_no_sync=False, delay_s=DELAY_S, bf16=False),
    # every all-reduce held, its collectives timed on the first 3 steps and every 3rd after: most steps untimed
    "delay_sampled": lambda d: job_accumulation(
        d, accumulate=1, delay_s=SAMPLED_DELAY_S, bf16=False, steps_per_epoch=8, timing_every=3
    ),
    "mid_epoch_eval": job_mid_epoch_eval,
    "input_bound": lambda d: job_slow_input(d, slow_ranks=(0, 1), sleep_s=INPUT_SLEEP_S),
    "input_straggler": lambda d: job_slow_input(d, slow_ranks=(1,), sleep_s=INPUT_SLEEP_S),
    "ddp_wrapper_work": lambda d: job_ddp_wrapper_work(d, sleep_s=WRAPPER_SLEEP_S),
    **{
        f"odd_{p}": (lambda d, p=p: job_odd_steps(d, p))
        for p in ("grad_scaler_skip", "skipped_batch", "two_optimizers", "zero_not_none")
    },
    "losses_plain": lambda d: job_losses(None, attached=False),
    "losses_attached": lambda d: job_losses(d, attached=True),
    "fails": job_fails,
}
DELAY_S = 0.5  # the ground truth's delay per synchronised all-reduce
SAMPLED_DELAY_S = 0.1  # delay_sampled's
INPUT_SLEEP_S = 0.05  # a slow input's wait per batch (job_slow_input)
WRAPPER_SLEEP_S = 0.03  # the wrapper's own time planted before each training forward (job_ddp_wrapper_work)


def world_job(rank: int, port: int, tmp: str) -> None:
    """One spawned rank of 2: every case of WORLD_CASES in turn (start-up paid once); results as JSON files."""
    from scaling.launch.local import exit_without_finalization, release_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    for name, case in WORLD_CASES.items():
        began = time.perf_counter()
        result = case(os.path.join(tmp, name))
        if rank == 0:
            print(f"{name}: {time.perf_counter() - began:.1f} s", flush=True)
        with open(os.path.join(tmp, f"result-{name}.rank{rank}.json"), "w") as f:
            json.dump(result, f)
    release_process_group()
    exit_without_finalization()
