"""FSDP2 jobs for tests/test_fsdp.py, written as a user writes them: `fully_shard` each block, then
the root, and `scaling.instrument.attach(model, optimizer, ...)` with no other change.

Every case runs in one pair of spawned gloo processes (`world_job`: start-up paid once) and
writes what the job itself saw (its losses) as JSON beside the run directory the instrument
wrote. The model is a few Linear blocks, small enough that a step's compute is milliseconds and
an injected delay dominates it.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

FEATURES, CLASSES, BATCH, BLOCKS = 32, 4, 16, 3
DELAY_S = 0.5  # the ground truth's delay: per synchronised backward (gradients), per forward (parameters)
STEPS, WARMUP, PAIRS = 10, 2, 8


class Blocks(nn.Module):
    """BLOCKS residual Linear blocks and a head: what FSDP shards is each block, then the rest."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.ReLU()) for _ in range(BLOCKS))
        self.head = nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def batches(count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable rule (the class is the argmax of the first CLASSES features), per rank."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        x = torch.randn(BATCH, FEATURES, generator=generator)
        out.append((x, x[:, :CLASSES].argmax(dim=1)))
    return out


def sharded(model: nn.Module, **fsdp_options) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, **fsdp_options)
    return fully_shard(model, **fsdp_options)


def job_fsdp(run_dir: str, *, delay_s: float = 0.0, into: str = "gradients", steps: int = STEPS) -> dict:
    """An FSDP2 job measured with the A/B window; `delay_s` injected into `into` (the ground truth)."""
    from scaling import instrument

    torch.manual_seed(0)
    model = sharded(Blocks())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = batches(steps, seed=dist.get_rank())

    def forward_backward(batch):
        loss_fn(model(batch[0]), batch[1]).backward()

    with instrument.attach(
        model,
        optimizer,
        run_dir=run_dir,
        warmup_steps=WARMUP,
        calibration_pairs=PAIRS,
        forward_backward=forward_backward,
        calibration_data=data[:PAIRS],
        inject_comm_delay_s=delay_s,
        inject_comm_delay_into=into,
    ) as meter:
        for x, y in meter.batches(data):
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        with torch.no_grad():  # an evaluation: its all-gathers are not training's
            accuracy = float((model(data[0][0]).argmax(1) == data[0][1]).float().mean())
        model.train()
        meter.end_epoch(val_accuracy=accuracy)
    return {}


def job_accumulation(run_dir: str, *, steps: int = 4) -> dict:
    """Two micro-batches per optimizer step, the first without gradient synchronisation."""
    from scaling import instrument

    torch.manual_seed(0)
    model = sharded(Blocks())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    data = batches(2 * steps, seed=dist.get_rank())
    with instrument.attach(model, optimizer, run_dir=run_dir, warmup_steps=0) as meter:
        for i, (x, y) in enumerate(meter.batches(data)):
            last = i % 2 == 1
            model.set_requires_gradient_sync(last)
            (loss_fn(model(x), y) / 2).backward()
            if last:
                optimizer.step()
                optimizer.zero_grad()
        meter.end_epoch(val_accuracy=0.5)
    return {}


def job_mixed_precision(run_dir: str, *, steps: int = 3) -> dict:
    """FSDP2 computing in bf16 by its policy alone (no autocast): the instrument must see bf16."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from scaling import instrument

    torch.manual_seed(0)
    model = sharded(Blocks(), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    with instrument.attach(model, optimizer, run_dir=run_dir, warmup_steps=0) as meter:
        for x, y in meter.batches(batches(steps, seed=dist.get_rank())):
            loss_fn(model(x).float(), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        meter.end_epoch(val_accuracy=0.5)
    return {}


def job_losses(run_dir: str | None, *, wrapper: str, steps: int = 6, epochs: int = 2) -> dict:
    """The losses a job computes step by step, fp32: DDP, FSDP, or FSDP with the instrument and its A/B.
    Each epoch ends with an evaluation (a forward without gradients), after which FSDP2 keeps the root
    gathered, so the A/B window starts with the root's unsharded parameters registered."""
    from torch.nn.parallel import DistributedDataParallel

    from scaling import instrument

    torch.manual_seed(0)
    module = Blocks()
    model = DistributedDataParallel(module) if wrapper == "ddp" else sharded(module)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    data = batches(steps, seed=dist.get_rank())

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
            calibration_data=data[2:4],
        )
        if wrapper == "fsdp_attached"
        else None
    )
    losses = []
    for _ in range(epochs):
        for x, y in meter.batches(data) if meter else data:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        with torch.no_grad():
            losses.append(loss_fn(model(data[0][0]), data[0][1]).item())
        if meter:
            meter.end_epoch(val_accuracy=0.5)
    if meter:
        meter.finish()
    return {"losses": losses}


WORLD_CASES = {
    "base": lambda d: job_fsdp(d),
    "gradients_delay": lambda d: job_fsdp(d, delay_s=DELAY_S, into="gradients"),
    "parameters_delay": lambda d: job_fsdp(d, delay_s=DELAY_S, into="parameters"),
    "accumulation": job_accumulation,
    "mixed_precision": job_mixed_precision,
    "losses_ddp": lambda d: job_losses(None, wrapper="ddp"),
    "losses_fsdp": lambda d: job_losses(None, wrapper="fsdp"),
    "losses_fsdp_attached": lambda d: job_losses(d, wrapper="fsdp_attached"),
}


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
