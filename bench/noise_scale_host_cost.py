"""The noise scale's host cost per gradient bucket: DDP's buckets timed with and without their two squared norms.

What it adds (scaling/instrument/timing.py, `squared_norm`): on the steps whose collectives are timed (the
default `collective_timing_every` times the first 10 steady steps, then every 50th), one `torch.dot` of each
bucket with itself before its all-reduce, on the training thread, and one after it, in the all-reduce's
completion callback (which DDP's backward waits for). Nothing on the other steps. Measured as
bench/instrument_host_cost.py measures the instrument's cost: a DDP job whose compute is negligible (40
linear layers 64 wide, batch 8) on a 1-rank gloo group, its gradients in 1 or 40 buckets, every step's
collectives timed by the instrument's `TimingProcessGroup`, blocks of steps with the norms on and off
alternating in one process; per block the extra time per step of the norms, at 1 and 40 buckets, and the
per-bucket part (extra at 40 - extra at 1) / 39, and the training thread's own time inside the all-reduce calls
per bucket (the group's `host_s`: the norm before the all-reduce and its bookkeeping); medians over blocks with
the 95% order-statistic interval. No budget on a timed bucket (every-step timing already exceeds
instrument_host_cost's, its `attached` arm); the budget is held on the default arm: the wall cost on 1 step in
`collective_timing_every`, added to instrument_host_cost's committed `sampled` figure, at most its 10 µs per
extra bucket. The norm op alone, by bucket size, beside it (no budget).
Run: `.venv/bin/python bench/noise_scale_host_cost.py` (about a minute on a 2-core machine; --quick: seconds).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402

LAYERS, WIDTH, BATCH, STEPS_PER_BLOCK = 40, 64, 8, 20
SIZES = (1, 40)
BUCKET_BUDGET_US = 10.0  # instrument_host_cost's per-bucket budget


def main() -> int:
    bench = bl.Benchmark("noise_scale_host_cost", __doc__, quick="few blocks: a check that it runs")
    args = bench.parse()
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from scaling.instrument.settings import InstrumentSettings
    from scaling.instrument.timing import Clock, TimingProcessGroup, squared_norm
    from scaling.testbed.local_cluster import free_port

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    models = {}
    for buckets in SIZES:
        torch.manual_seed(0)
        layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
        # a bucket cap just above one layer's gradients (4,160 floats) puts the 40 layers in 40 buckets
        cap_mb = 1000.0 if buckets == 1 else (WIDTH * WIDTH + WIDTH) * 4 * 1.01 / 2**20
        model = DistributedDataParallel(layers, bucket_cap_mb=cap_mb)
        timer = TimingProcessGroup(model.process_group, Clock())
        model.reducer._update_process_group(timer)
        models[buckets] = (model, timer, torch.optim.SGD(model.parameters(), lr=0.0))
    x = torch.randn(BATCH, WIDTH)

    def block(buckets: int, norms: bool) -> tuple[float, float]:
        """(wall µs per step, the training thread's µs per step inside the group's all-reduce calls: `host_s`)."""
        model, timer, optimizer = models[buckets]
        timer.norms = norms
        timer.host_s = 0.0
        begin = time.perf_counter()
        for _ in range(STEPS_PER_BLOCK):
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            timer.take()
            timer.take_norms()
        wall = (time.perf_counter() - begin) / STEPS_PER_BLOCK * 1e6
        return wall, timer.host_s / STEPS_PER_BLOCK * 1e6

    for buckets in SIZES:  # warm-up: DDP rebuilds its buckets at the second iteration
        block(buckets, False)
        block(buckets, True)
    seen = {b: len(models[b][0].reducer._get_zeros_like_grad_buckets()) for b in SIZES}
    blocks = 6 if args.quick else 60
    extra = {b: [] for b in SIZES}  # wall µs per step, norms on - off, per block
    thread = []  # the training thread's µs per bucket inside the all-reduce calls, norms on - off, at 40 buckets
    for i in range(blocks):
        for buckets in SIZES if i % 2 == 0 else SIZES[::-1]:
            order = (False, True) if i % 2 == 0 else (True, False)
            us = {norms: block(buckets, norms) for norms in order}
            extra[buckets].append(us[True][0] - us[False][0])
            if buckets == 40:
                thread.append((us[True][1] - us[False][1]) / seen[40])
    slope = [(a - b) / (seen[40] - seen[1]) for a, b in zip(extra[40], extra[1])]

    def row(name: str, values: list[float], definition: str, budget: float | None, note: str) -> dict:
        lo, hi = bl.median_order_interval(values)
        verdict = bl.interval_verdict(lo, hi, budget) if budget is not None else None
        return {
            "name": name,
            "a": "timed buckets with the two squared norms",
            "b": "timed buckets without",
            "a_median": bl.median(values),
            "b_median": 0.0,
            "unit": "us per bucket",
            "ratio": None,
            "ratio_lo": lo,
            "ratio_hi": hi,
            "ratio_definition": definition,
            "within_noise": None if lo is None else bool(lo <= 0.0 <= hi),
            "budget_within_noise": None if verdict is None else verdict == bl.UNDECIDED,
            "budget": budget,
            "budget_on": "a",
            "budget_definition": f"the median's 95% order-statistic interval [lo, hi] at most {budget:g} us"
            if budget is not None
            else "no budget: measured to be known",
            "pass": {"pass": True, "miss": False}.get(verdict) if verdict else None,
            "verdict": verdict,
            "interval": "95% order-statistic (sign-test) interval of the median over blocks",
            "pairs": len(values),
            "note": note,
        }

    # the default arm: instrument_host_cost's committed `sampled` figure per extra bucket, plus this cost on the
    # share of steps whose collectives are timed at the default (1 in `collective_timing_every`)
    every = InstrumentSettings().collective_timing_every
    committed = json.loads((bl.RESULTS / "instrument_host_cost.json").read_text())["comparisons"]
    sampled_us = next(c["a_median"] for c in committed if c["name"] == "sampled, extra wall per extra bucket")
    comparisons = [
        row(
            "noise scale norms, training thread, per timed bucket",
            thread,
            "the training thread's time inside the all-reduce calls (the group's host_s), on - off, / 40 buckets",
            None,
            "the norm before each all-reduce and its bookkeeping; the norm after runs in the completion callback",
        ),
        row(
            "noise scale norms, wall, per timed bucket",
            slope,
            "(wall extra per step at 40 buckets - extra at 1) / 39, median over blocks",
            None,
            "both norms, the callback's included, on a step whose every bucket is timed",
        ),
        row(
            "noise scale norms, default arm, per extra bucket",
            [v / every for v in slope],
            f"the wall per timed bucket / {every} (collective_timing_every): what the default arm adds",
            BUCKET_BUDGET_US - sampled_us,
            f"budget: instrument_host_cost's {BUCKET_BUDGET_US:g} us less its committed sampled arm's "
            f"{sampled_us:.1f} us per extra bucket",
        ),
    ]
    per_op = []
    for floats in (1_000, 100_000, 1_000_000):
        t = torch.randn(floats)
        for _ in range(20):
            squared_norm(t)
        reps = 2000 if floats < 1e6 else 100
        begin = time.perf_counter()
        for _ in range(reps):
            squared_norm(t)
        per_op.append({"floats": floats, "us": (time.perf_counter() - begin) / reps * 1e6})
    dist.destroy_process_group()
    for row in per_op:
        print(f"squared_norm of {row['floats']:,} floats: {row['us']:.1f} us", flush=True)
    extra_by_size = {str(b): {"buckets": seen[b], "extra_us_median": bl.median(extra[b])} for b in SIZES}
    bench.finish(
        comparisons,
        layers=LAYERS,
        width=WIDTH,
        batch=BATCH,
        blocks=blocks,
        steps_per_block=STEPS_PER_BLOCK,
        extra_by_size=extra_by_size,
        squared_norm_us=per_op,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
