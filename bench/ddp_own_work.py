"""Benchmark: DDP's own work per step at one worker on the own-job example's model, wrapped against bare.

    .venv/bin/python bench/ddp_own_work.py            # about 30 seconds
    .venv/bin/python bench/ddp_own_work.py --quick

Its step wrapped in DistributedDataParallel against the bare model's, steps interleaved in one
process. Why: Ray's `prepare_model` wraps the model in DDP only at 2 or more workers, so a 1-worker run of a
job written as Ray's quickstart trains the bare model, and a projection from it lacks DDP's own
work per step (forward checks, gradient hooks, bucket copies). On a CPU that work is part of every
step; this measures how much, on the job the projection proof uses (examples/own_job: `TinyViT`,
batch 32, Adam, one CPU thread).

Both arms live in one process: two copies of the model from the same seed, one bare, one wrapped
in `DistributedDataParallel` on a 1-process gloo group (a `HashStore`; its all-reduce of the one
bucket is part of the wrapped step, as it is of a 1-worker run wrapped at one worker). A block is
8 steps of each arm, alternating step by step with the order flipped every step (A B B A ...);
a block's ratio is the wrapped arm's median step over the bare arm's. Verdict on the median of the
block ratios with its 95% order-statistic interval; no budget: the figure is what it costs.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import benchlib as bl  # noqa: E402

RESULT = "ddp_own_work"
BATCH, STEPS_PER_BLOCK, WARMUP_STEPS = 32, 8, 10


def main() -> int:
    bench = bl.Benchmark(RESULT, __doc__, quick="20 blocks")
    bench.parser.add_argument("--blocks", type=int, default=200, help="blocks of interleaved steps (default 200)")
    args = bench.parse()
    if args.blocks < 6:
        bench.parser.error("--blocks must be at least 6 (the interval of the median needs them)")
    blocks = 20 if args.quick else args.blocks

    import torch
    import torch.distributed as dist
    from torch import nn

    from examples.own_job.vit import TinyViT

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    images, labels = torch.randn(BATCH, 3, 16, 16), torch.randint(0, 10, (BATCH,))
    criterion = nn.CrossEntropyLoss()

    def job(wrapped: bool):
        torch.manual_seed(0)
        model = TinyViT(num_classes=10)
        if wrapped:
            model = nn.parallel.DistributedDataParallel(model)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    arms = {"bare": job(False), "ddp": job(True)}

    def step(arm: str) -> float:
        model, optimizer = arms[arm]
        t0 = time.perf_counter()
        optimizer.zero_grad()
        criterion(model(images), labels).backward()
        optimizer.step()
        return time.perf_counter() - t0

    for _ in range(WARMUP_STEPS):
        step("bare"), step("ddp")
    per_block = []
    for _ in range(blocks):
        times = {"bare": [], "ddp": []}
        for arm in bl.abba(STEPS_PER_BLOCK, "ddp", "bare"):
            times[arm].append(step(arm))
        per_block.append({arm: statistics.median(ts) for arm, ts in times.items()})
    dist.destroy_process_group()

    ratios = [b["ddp"] / b["bare"] for b in per_block]
    extra_ms = [1e3 * (b["ddp"] - b["bare"]) for b in per_block]
    lo, hi = bl.median_order_interval(extra_ms)
    row = bl.comparison(
        "DDP's own work per step at one worker (own-job example)",
        "wrapped in DistributedDataParallel",
        "bare model",
        bl.median([b["ddp"] * 1e3 for b in per_block]),
        bl.median([b["bare"] * 1e3 for b in per_block]),
        "ms",
        bl.median(ratios),
        "wrapped step / bare step, median over blocks of each block's medians",
        pair_ratios=ratios,
        decided_by_interval=False,
    )
    bench.finish(
        [row],
        blocks=blocks,
        steps_per_block=STEPS_PER_BLOCK,
        extra_ms_median=bl.median(extra_ms),
        extra_ms_interval=[lo, hi],
        per_block_ms=[{arm: round(1e3 * s, 4) for arm, s in b.items()} for b in per_block],
    )
    print(f"DDP's own work: {bl.median(extra_ms):.3f} ms per step [{lo:.3f}, {hi:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
