"""The instrument's host cost per optimizer step, in microseconds: a user's DDP job whose compute is
negligible, with and without `attach`, at 1, 5, 20 and 40 gradient buckets, its steps interleaved in
one process.

Why this shape: on a GPU the host runs ahead of the device, and every microsecond of Python the
instrument spends on the training thread (its hooks, DDP's comm hook per bucket, its records)
delays a launch-bound step by as much. On a CPU with the compute made negligible (40 linear
layers 64 wide, batch 8, a 1-rank gloo DDP group, which DDP all-reduces through alone) the same
host time is what is left to see. DDP's bucket cap is set so that the 40 layers' gradients make
1, 5, 20 or 40 buckets, which separates a per-step part from a per-bucket part.

Arms, each its own DDP models in the same process (`INSTANCES` of each, one per block in turn, so that
what sets one instance apart from another, tens of microseconds here, lands in the interval, not in the
median): `bare` (no instrument), `attached` (the instrument without telemetry and trace, every step's
collectives timed: `collective_timing_every=1`)
and `sampled` (the same at the default `collective_timing_every`, 50: the first 10 steady steps and
then every 50th timed, the other steps on DDP's own C++ all-reduce path). A block
runs 10 steps of every (size, arm) in a rotating order, each arm's steps one epoch as long as the
benchmark (a job's epoch holds hundreds of steps or more: the work at an epoch's start and end, about
0.1 ms, is not a cost of each step); per block and size, an arm's extra time per step is its mean
step minus bare's mean step of the same block (wall clock, and the process's CPU time, every
thread's). Figures are medians over blocks with the 95% order-statistic interval; the per-bucket
part of a block is (extra at 40 - extra at 1) / 39.
Budgets (decided by the interval, as the other cost benchmarks): at most 250 us per step at 20
buckets and at most 10 us per extra bucket. The step records are resolved into rows at the epoch's
end, off the steps' path (on a GPU, while the device is idle): that work is measured after the
blocks, per step recorded (`resolve_us_per_step`, no budget).
Run: `.venv/bin/python bench/instrument_host_cost.py`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402

SIZES = (1, 5, 20, 40)
ARMS = ("bare", "attached", "sampled")
LAYERS, WIDTH, BATCH, STEPS_PER_BLOCK = 40, 64, 8, 10
# Models of each (size, arm), one per block in turn: two instances of one model step apart by tens of microseconds
# for reasons of their own (where their tensors lie), a bias no interval over one instance's blocks would show.
INSTANCES = 3
STEP_BUDGET_US, BUCKET_BUDGET_US = 250.0, 10.0


def build(buckets: int, arm: str):
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from scaling import instrument
    from scaling.instrument.settings import InstrumentSettings

    torch.manual_seed(0)
    module = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)])
    layer_mb = WIDTH * WIDTH * 4 / 2**20
    model = DistributedDataParallel(module, bucket_cap_mb=layer_mb * (LAYERS // buckets) * 1.001)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    meter = None
    if arm != "bare":
        meter = instrument.attach(
            model,
            optimizer,
            telemetry_interval_s=0,
            trace_steps=0,
            collective_timing_every=InstrumentSettings.collective_timing_every if arm == "sampled" else 1,
        )
    return model, optimizer, meter


def run_block(job, batch, windows: bl.StepWindows, block: int, key: str) -> None:
    model, optimizer, batches, _ = job
    start = windows.now()
    for _ in range(STEPS_PER_BLOCK):
        next(batches)
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    windows.add(block, key, start, windows.now())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="exit status: 0 measured (whatever the verdicts), 2 bad arguments"
    )
    parser.add_argument("--quick", action="store_true", help="fewer blocks (bench/results/quick/)")
    parser.add_argument(
        "--blocks", type=int, default=None, help="blocks of steps (default 240, about 4 min here; quick 16)"
    )
    args = parser.parse_args()
    blocks = args.blocks if args.blocks is not None else (16 if args.quick else 240)
    if blocks < 6:
        parser.error("--blocks must be >= 6 (the 95% interval of a median needs 6 values)")
    started, load_start = time.time(), bl.load_average()

    import warnings

    import torch
    import torch.distributed as dist

    from scaling.testbed.local_cluster import free_port

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    jobs = {}
    for size in SIZES:
        for arm in ARMS:
            for instance in range(INSTANCES):
                model, optimizer, meter = build(size, arm)
                # one epoch per job, as long as the benchmark: a job's per-epoch work is not a per-step cost
                batches = meter.batches(itertools.count()) if meter else itertools.count()
                jobs[(size, arm, instance)] = (model, optimizer, batches, meter)
    batch = torch.randn(BATCH, WIDTH)
    keys = [(size, arm) for size in SIZES for arm in ARMS]
    windows = bl.StepWindows()
    warmup_blocks = 2 * INSTANCES  # every instance's first steps
    for block in range(blocks + warmup_blocks):
        order = keys[block % len(keys) :] + keys[: block % len(keys)]
        for size, arm in order if block % 2 == 0 else order[::-1]:
            run_block(jobs[(size, arm, block % INSTANCES)], batch, windows, block, f"{size}:{arm}")
        if block % 10 == 0:
            print(f"[instrument_host_cost] block {block + 1}/{blocks + warmup_blocks}", flush=True)
    windows.close()
    resolve_us = {}  # (size, arm) -> the epoch-end resolution of its records, per step recorded
    for (size, arm, instance), (_, _, _, meter) in jobs.items():
        if meter is not None and instance == 0:
            recorder = meter.recorder
            started_resolve = time.perf_counter()
            rows = [recorder._resolved(marks) for marks in recorder._pending]
            resolve_us[(size, arm)] = (time.perf_counter() - started_resolve) / len(rows) * 1e6

    per_block: dict[int, dict[str, dict]] = {}
    for row in windows.rows:
        if row["block"] >= warmup_blocks:
            per_block.setdefault(row["block"], {})[row["arm"]] = row
    extra = {}  # (size, arm, clock) -> [us per step, one per block]
    for rows in per_block.values():
        for size in SIZES:
            bare = rows[f"{size}:bare"]
            for arm in ARMS[1:]:
                mine = rows[f"{size}:{arm}"]
                for clock in ("wall_s", "cpu_s"):
                    extra.setdefault((size, arm, clock), []).append((mine[clock] - bare[clock]) / STEPS_PER_BLOCK * 1e6)
    bare_step = {
        size: bl.median([rows[f"{size}:bare"]["wall_s"] / STEPS_PER_BLOCK * 1e6 for rows in per_block.values()])
        for size in SIZES
    }

    def verdict(values, budget):
        lo, hi = bl.median_order_interval(values)
        return bl.median(values), lo, hi, bl.interval_verdict(lo, hi, budget)

    comparisons, table = [], []
    for arm in ARMS[1:]:
        for clock, label in (("wall_s", "wall"), ("cpu_s", "CPU")):
            for size in SIZES:
                value, lo, hi, _ = verdict(extra[(size, arm, clock)], STEP_BUDGET_US)
                table.append(
                    {
                        "arm": arm,
                        "clock": label,
                        "buckets": size,
                        "extra_us_per_step": value,
                        "lo": lo,
                        "hi": hi,
                        "bare_us_per_step": bare_step[size],
                        "resolve_us_per_step": resolve_us[(size, arm)],
                    }
                )
            at20 = extra[(20, arm, clock)]
            value, lo, hi, v = verdict(at20, STEP_BUDGET_US)
            comparisons.append(
                _row(
                    f"{arm}, 20 buckets, extra {label} per step",
                    arm,
                    value,
                    lo,
                    hi,
                    v,
                    STEP_BUDGET_US,
                    "us per step",
                    bare_step[20],
                )
            )
            slope = [
                (a - b) / (SIZES[-1] - SIZES[0])
                for a, b in zip(extra[(SIZES[-1], arm, clock)], extra[(SIZES[0], arm, clock)])
            ]
            value, lo, hi, v = verdict(slope, BUCKET_BUDGET_US)
            comparisons.append(
                _row(
                    f"{arm}, extra {label} per extra bucket",
                    arm,
                    value,
                    lo,
                    hi,
                    v,
                    BUCKET_BUDGET_US,
                    "us per bucket",
                    None,
                )
            )
    path = bl.write_result(
        "instrument_host_cost",
        __doc__,
        args.quick,
        started,
        load_start,
        comparisons,
        blocks=blocks,
        steps_per_block=STEPS_PER_BLOCK,
        layers=LAYERS,
        width=WIDTH,
        batch=BATCH,
        by_size=table,
    )
    bl.print_comparisons(comparisons)
    for row in table:
        print(
            f"  {row['arm']:9s} {row['clock']:4s} {row['buckets']:2d} buckets: "
            f"+{row['extra_us_per_step']:.0f} us/step [{row['lo']:.0f}, {row['hi']:.0f}] "
            f"(bare step {row['bare_us_per_step']:.0f} us; records resolved at the epoch's end "
            f"{row['resolve_us_per_step']:.0f} us per step)"
        )
    print(f"wrote {path}")
    return 0


def _row(name, arm, value, lo, hi, verdict, budget, unit, bare_us):
    return {
        "name": name,
        "a": arm,
        "b": "bare",
        "a_median": value,
        "b_median": bare_us,
        "unit": unit,
        "ratio": None,
        "ratio_lo": lo,
        "ratio_hi": hi,
        "ratio_definition": "",
        "budget": budget,
        "budget_on": "a",
        "budget_definition": f"the median's 95% order-statistic interval [lo, hi] at most {budget:g} {unit}",
        "interval": "95% order-statistic interval of the median over blocks",
        "verdict": verdict,
        "pass": {"pass": True, "miss": False}.get(verdict),
        "within_noise": None,
        "budget_within_noise": None,
        "pairs": None,
        "note": (
            f"median {value:.1f} {unit}, 95% interval [{lo:.1f}, {hi:.1f}] over blocks of "
            f"{STEPS_PER_BLOCK} steps per arm"
            if lo is not None
            else ""
        ),
    }


if __name__ == "__main__":
    sys.exit(main())
