"""The instrument's host cost per optimizer step, in microseconds: a user's DDP job whose compute is
negligible, with and without `attach`, at 1, 5, 20 and 40 gradient buckets, its steps interleaved in
one process; the lab's own loop on that job; an FSDP2 job at 1, 5, 20 and 40 units, per collective;
the Hugging Face Trainer's and Lightning's callbacks.

Why this shape: on a GPU the host runs ahead of the device, and every microsecond of Python the
instrument spends on the training thread (its hooks, its Python per collective, its records)
delays a launch-bound step by as much. On a CPU with the compute made negligible (40 linear
layers 64 wide, batch 8) the same host time is what is left to see. The layers' gradients make
1, 5, 20 or 40 DDP buckets (the bucket cap) or FSDP2 units, which separates a per-step part from
a per-bucket (per-collective) part.

Four parts, one process:
- `attach` (a 1-rank gloo DDP group, which DDP all-reduces through alone). Arms, each its own DDP
  models (`INSTANCES` of each, one per block in turn, so that what sets one instance apart from
  another, tens of microseconds here, lands in the interval, not in the median): `bare` (no
  instrument), `attached` (the instrument without telemetry and trace, every step's collectives
  timed: `collective_timing_every=1`) and `sampled` (the same at the default
  `collective_timing_every`, 50: the first 10 steady steps and then every 50th timed, the others on
  DDP's own C++ all-reduce path). A block runs 10 steps of every (size, arm) in a rotating order,
  each arm's steps one epoch as long as the benchmark (a job's epoch holds hundreds of steps or
  more: the work at an epoch's start and end, about 0.1 ms, is not a cost of each step).
- `lab`: the lab's loop (scaling/train/loop.py `train_worker`, at its defaults but the A/B
  calibration, off) training the same layers (`lab_model`) on the same group, with DDP at one
  worker (where a run of one would train the plain model), against a bare DDP loop stepping before
  each of its batches (bench/benchlib.py `lab_with_bare_steps`, bench/instrumentation_overhead.py
  `BareDdp`); a block is an epoch of `LAB_STEPS_PER_EPOCH` steps, each run's first left out;
  `INSTANCES` runs per size.
- `fsdp`: the layers in FSDP2 units on torch's fake process group of two ranks (every collective
  issued as on two ranks and returned at once: what remains is host time), arms and blocks as
  `attach`'s; the per-collective part is (extra at 40 units - extra at 1) / the collectives it adds,
  counted from the records.
- `trainers`: a tiny GPT-2 through `transformers.Trainer` and a tiny LightningModule through
  `lightning.Trainer` (one process, one CPU thread), each run `TRAINER_STEPS` optimizer steps with
  its `ScalingCallback` (scaling/integrations/) or without, runs in pairs ABBA; a run's mean step is
  read from a clock callback present in both arms (the first `TRAINER_SKIPPED` steps left out), a
  pair's extra the measured run's mean minus the bare one's: what a trainer's job pays for one
  callback line, the meter it drives included. Whole runs, not interleaved steps (a trainer owns
  its loop): their spread is the interval's.
Per block and size, an arm's extra time per step is its mean step minus bare's mean step of the
same block (wall clock, and the process's CPU time, every thread's). Figures are medians over
blocks with the 95% order-statistic interval; the per-bucket part of a block is (extra at 40 -
extra at 1) / 39. Budgets (decided by the interval, as the other cost benchmarks), on every arm:
at most 250 us per step at 20 buckets (units) and at most 10 us per extra bucket (collective). The
step records are resolved into rows at the epoch's end, off the steps' path (on a GPU, while the
device is idle): that work is measured after the blocks, per step recorded (`resolve_us_per_step`,
no budget); the table also gives what the instrument measured of itself (`self_reported_us`, the
summary's `instrument_host_s`).
Run: `.venv/bin/python bench/instrument_host_cost.py` (about 5 minutes on a 2-core machine).
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
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

LAB_EPOCHS, LAB_STEPS_PER_EPOCH = 8, 96  # per run; each run's first epoch is left out
FSDP_BLOCKS = 96


def lab_model(num_classes: int):
    """The benchmark's model as a lab model (`model.name=instrument_host_cost:lab_model`): the same
    `LAYERS` linear layers, fed the first `WIDTH` values of each image, its logits the first
    `num_classes` outputs."""
    import torch
    from torch import nn

    class HostCostMlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)])

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.layers(images.flatten(1)[:, :WIDTH])[:, :num_classes]

    return HostCostMlp()


def bucket_cap_mb(buckets: int) -> float:
    """DDP's bucket cap that packs the `LAYERS` equal layers' gradients into `buckets` buckets."""
    return WIDTH * WIDTH * 4 / 2**20 * (LAYERS // buckets) * 1.001


def build(buckets: int, arm: str):
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    module = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)])
    model = DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb(buckets))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return model, optimizer, attached(model, optimizer, arm)


def attached(model, optimizer, arm: str, parts=None):
    """The arm's meter: none (`bare`), every step's collectives timed (`attached`), or the default sampling
    (`sampled`); telemetry and trace off."""
    from scaling import instrument
    from scaling.instrument.settings import InstrumentSettings

    if arm == "bare":
        return None
    every = InstrumentSettings.collective_timing_every if arm == "sampled" else 1
    return instrument.attach(
        model, optimizer, telemetry_interval_s=0, trace_steps=0, collective_timing_every=every, parts=parts
    )


def run_block(job, batch, windows: bl.StepWindows, block: int, key: str) -> None:
    model, optimizer, batches, _ = job
    start = windows.now()
    for _ in range(STEPS_PER_BLOCK):
        next(batches)
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    windows.add(block, key, start, windows.now())


def lab_config(buckets: int, epochs: int):
    """The quickstart's config, as the lab's loop trains `lab_model` at `buckets` DDP buckets: epochs of
    `LAB_STEPS_PER_EPOCH` steps, evaluations only at epochs' ends, no A/B calibration."""
    from scaling.config import load_config

    overrides = [
        *bl.steady_run_overrides(epochs, quick=False),
        "train.eval_every=1",
        "data.val_samples=64",
        f"data.train_samples={LAB_STEPS_PER_EPOCH * BATCH}",
        f"train.per_worker_batch={BATCH}",
        "model.name=instrument_host_cost:lab_model",
        f"instrument.ddp_bucket_cap_mb={bucket_cap_mb(buckets)}",
    ]
    return load_config(bl.REPO / "experiments/quickstart.yaml", overrides=overrides, num_workers=1)


def measure_lab(instances: int, epochs: int) -> dict:
    """The lab's loop against a bare DDP loop (bench/benchjobs.py's `BareDdp`), their steps
    interleaved (bench/benchlib.py `lab_with_bare_steps`), on this process's 1-rank gloo group; the lab's loop
    given its DDP backend at one worker, where a run of one trains the plain model. Per size, the runs' blocks
    (epochs), each run's first left out."""
    from benchjobs import BareDdp

    import scaling.train.loop as lab_loop
    from scaling.train.backends import for_choice
    from scaling.train.loop import WorkerContext, set_up_worker

    import tempfile

    import torch

    ctx = WorkerContext(rank=0, world_size=1, local_rank=0, node_rank=0, device=torch.device("cpu"))
    for_run = lab_loop.for_run
    lab_loop.for_run = lambda cfg, world_size: for_choice(cfg.backend)
    blocks: dict[int, list[dict]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-host-lab-") as tmp:
            # the sizes in a rotating order, so that no size always runs first
            for instance in range(instances):
                for k in range(len(SIZES)):
                    size = SIZES[(instance + k) % len(SIZES)]
                    cfg = lab_config(size, epochs)
                    set_up_worker(cfg, ctx)
                    windows = bl.StepWindows()
                    run_dir = Path(tmp) / f"lab-{size}-{instance}"
                    bl.lab_with_bare_steps(cfg, ctx, run_dir, lambda dataset: BareDdp(cfg, ctx, dataset), windows)
                    windows.close()
                    runs = [b for b in bl.block_means([windows.rows], ("lab", "bare")) if b["block"] > 1]
                    blocks.setdefault(size, []).extend(runs)
                    print(f"[instrument_host_cost] lab: {size} buckets, run {instance + 1}/{instances}", flush=True)
    finally:
        lab_loop.for_run = for_run
    return blocks


def build_fsdp(units: int, arm: str):
    """The `LAYERS` layers in `units` FSDP2 units (each `fully_shard`ed, then the root), SGD, and the arm's
    instrument as `build`'s, told it is rank 0 of 1 (`measure_fsdp`)."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from scaling.instrument import Identity, Parts

    torch.manual_seed(0)
    layers = [nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)]
    per_unit = LAYERS // units
    model = nn.Sequential(*[nn.Sequential(*layers[i : i + per_unit]) for i in range(0, LAYERS, per_unit)])
    for unit in model:
        fully_shard(unit)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return model, optimizer, attached(model, optimizer, arm, parts=Parts(identity=Identity(0, 1, 0, 0)))


def measure_fsdp(blocks: int) -> tuple[list[dict], dict]:
    """The FSDP2 part, on torch's fake process group of 2 ranks (every collective issued as on two ranks, and
    returned at once: what is left is host time). The meter is told it is rank 0 of 1, since a 2-rank meter makes
    a gloo group for its clock alignment, which the fake group's store cannot; what a step runs is the same, and
    FSDP2's adapter told it communicates alone, so the timer is installed. Returns the blocks of mean steps (each
    arm's window `STEPS_PER_BLOCK` steps) and, per "size:arm", what its records say."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from scaling.instrument.backends.fsdp import FSDPBackend

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    FSDPBackend.communicates_alone = True
    jobs = make_jobs(build_fsdp)
    windows = run_blocks(jobs, ARMS, blocks, "fsdp")
    records = {}
    for (size, arm, instance), (_, _, _, meter) in jobs.items():
        if meter is not None and instance == 0:
            resolved = [meter.recorder._resolved(marks) for marks in meter.recorder._pending]
            rows = [r for r in resolved if r["kind"] == "train" and not r["warmup"]]
            timed = [r for r in rows if r["comm_timed"]]
            records[f"{size}:{arm}"] = {
                "collectives_per_step": bl.median([r["allgathers"] + r["reducescatters"] for r in timed]),
                "self_reported_us": bl.median([r["instrument_host_s"] * 1e6 for r in rows]),
            }
    dist.destroy_process_group()
    keys = tuple(f"{size}:{arm}" for size in SIZES for arm in ARMS)
    means = [b for b in bl.block_means([windows.rows], keys) if b["block"] >= 2 * INSTANCES]
    return means, records


# --- the trainers' callbacks --------------------------------------------------------------------------------------

TRAINER_PAIRS, TRAINER_STEPS, TRAINER_SKIPPED = 24, 400, 20  # pairs of runs; steps per run; first steps left out


def _step_clock(kind: str):
    """A callback of the trainer `kind` ("hf" or "lightning") that marks each optimizer step's end (wall, CPU): in
    both arms, so that what it costs cancels."""
    marks = []

    def mark(*args, **kwargs):
        marks.append((time.perf_counter(), time.process_time()))

    if kind == "hf":
        from transformers import TrainerCallback

        clock = type("StepClock", (TrainerCallback,), {"on_step_end": mark})()
    else:
        from lightning.pytorch import Callback

        clock = type("StepClock", (Callback,), {"on_train_batch_end": mark})()
    return clock, marks


def trainer_run(kind: str, measured: bool, tmp: str) -> tuple[float, float]:
    """One run of `TRAINER_STEPS` optimizer steps of a tiny job through the trainer `kind`, with its ScalingCallback
    (`measured`) or without; its mean step after the first `TRAINER_SKIPPED`: (wall, CPU) seconds."""
    import torch

    settings = {"telemetry_interval_s": 0, "trace_steps": 0}
    clock, marks = _step_clock(kind)
    torch.manual_seed(0)
    run_dir = tempfile.mkdtemp(dir=tmp)
    if kind == "hf":
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

        from scaling.integrations.hf import ScalingCallback

        ids = torch.randint(0, 64, (TRAINER_STEPS * BATCH, 8))
        data = [{"input_ids": row, "labels": row} for row in ids]
        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=32, n_layer=1, n_head=2))
        args = TrainingArguments(
            output_dir=run_dir,
            per_device_train_batch_size=BATCH,
            num_train_epochs=1,
            save_strategy="no",
            logging_strategy="no",
            eval_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        callbacks = [clock] + ([ScalingCallback(run_dir, ab_calibration=False, **settings)] if measured else [])
        Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()
    else:
        import lightning as L

        from scaling.integrations.lightning import ScalingCallback

        class Job(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)])

            def training_step(self, batch, batch_idx):
                return self.net(batch[0]).square().mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=1e-3)

        data = torch.utils.data.TensorDataset(torch.randn(TRAINER_STEPS * BATCH, WIDTH))
        callbacks = [clock] + ([ScalingCallback(run_dir, **settings)] if measured else [])
        L.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=1,
            callbacks=callbacks,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
        ).fit(Job(), torch.utils.data.DataLoader(data, batch_size=BATCH))
    shutil.rmtree(run_dir, ignore_errors=True)
    (wall_0, cpu_0), (wall_1, cpu_1) = marks[TRAINER_SKIPPED], marks[-1]
    steps = len(marks) - 1 - TRAINER_SKIPPED
    return (wall_1 - wall_0) / steps, (cpu_1 - cpu_0) / steps


def measure_trainers(pairs: int) -> dict:
    """Per trainer and clock, the callback's extra microseconds per optimizer step, one value per pair of runs
    (bare, measured in turn, ABBA), and the bare runs' mean steps."""
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-host-trainers-") as tmp:
        for kind in ("hf", "lightning"):
            extra, bare_steps = {"wall": [], "CPU": []}, []
            trainer_run(kind, True, tmp)  # a first run of each: imports, caches
            for pair in range(pairs):
                order = (False, True) if pair % 2 == 0 else (True, False)
                result = {measured: trainer_run(kind, measured, tmp) for measured in order}
                for index, clock in enumerate(("wall", "CPU")):
                    extra[clock].append((result[True][index] - result[False][index]) * 1e6)
                bare_steps.append(result[False][0] * 1e6)
                print(
                    f"[instrument_host_cost] {kind}: pair {pair + 1}/{pairs}, callback +{extra['wall'][-1]:.0f} us "
                    f"per step (bare {bare_steps[-1]:.0f} us)",
                    flush=True,
                )
            out[kind] = (extra, bl.median(bare_steps))
    return out


def make_jobs(build_job) -> dict:
    """(size, arm, instance) -> (model, optimizer, batches, meter) of `build_job(size, arm)`, `INSTANCES` of each.
    One epoch per job, as long as the benchmark: a job's per-epoch work is not a per-step cost."""
    jobs = {}
    for size in SIZES:
        for arm in ARMS:
            for instance in range(INSTANCES):
                model, optimizer, meter = build_job(size, arm)
                batches = meter.batches(itertools.count()) if meter else itertools.count()
                jobs[(size, arm, instance)] = (model, optimizer, batches, meter)
    return jobs


def run_blocks(jobs: dict, arms: tuple[str, ...], blocks: int, label: str) -> bl.StepWindows:
    """`blocks` blocks (after 2 x `INSTANCES` of warm-up), each `STEPS_PER_BLOCK` steps of every (size, arm) in a
    rotating order, alternately reversed; the block's instance of each job in turn."""
    import torch

    batch = torch.randn(BATCH, WIDTH)
    keys = [(size, arm) for size in SIZES for arm in arms]
    windows = bl.StepWindows()
    warmup_blocks = 2 * INSTANCES  # every instance's first steps
    for block in range(blocks + warmup_blocks):
        order = keys[block % len(keys) :] + keys[: block % len(keys)]
        for size, arm in order if block % 2 == 0 else order[::-1]:
            run_block(jobs[(size, arm, block % INSTANCES)], batch, windows, block, f"{size}:{arm}")
        if block % 10 == 0:
            print(f"[instrument_host_cost] {label}: block {block + 1}/{blocks + warmup_blocks}", flush=True)
    windows.close()
    return windows


def main() -> int:
    bench = bl.Benchmark("instrument_host_cost", __doc__, quick="fewer blocks and runs")
    bench.parser.epilog = "exit status: 0 measured (whatever the verdicts), 2 bad arguments"
    bench.parser.add_argument(
        "--blocks", type=int, default=None, help="blocks of steps of the attach part (default 240; quick 16)"
    )
    bench.parser.add_argument(
        "--fsdp-blocks",
        type=int,
        default=None,
        help=f"blocks of steps of the FSDP2 part (default {FSDP_BLOCKS}; quick 8)",
    )
    args = bench.parse()
    blocks = args.blocks if args.blocks is not None else (16 if args.quick else 240)
    fsdp_blocks = args.fsdp_blocks if args.fsdp_blocks is not None else (8 if args.quick else FSDP_BLOCKS)
    if min(blocks, fsdp_blocks) < 6:
        bench.parser.error("--blocks and --fsdp-blocks must be >= 6 (the 95% interval of a median needs 6 values)")
    lab_instances, lab_epochs = (1, 3) if args.quick else (INSTANCES, LAB_EPOCHS)

    import warnings

    import torch
    import torch.distributed as dist

    from scaling.testbed.local_cluster import free_port

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)  # the DDP parts' group; the FSDP2 part has its own
    attach_table, comparisons = measure_attach(blocks)
    print("[instrument_host_cost] the lab's loop", flush=True)
    lab_blocks = measure_lab(lab_instances, lab_epochs)
    dist.destroy_process_group()
    lab_table, lab_comparisons = figures_of(
        "lab's loop",
        {
            (size, clock): [(b["lab"][key] - b["bare"][key]) * 1e6 for b in lab_blocks[size]]
            for size in SIZES
            for clock, key in (("wall", "wall_s"), ("CPU", "cpu_s"))
        },
        {size: bl.median([b["bare"]["wall_s"] * 1e6 for b in lab_blocks[size]]) for size in SIZES},
        "buckets",
        {size: SIZES[-1] - SIZES[0] for size in SIZES},
        STEP_BUDGET_US,
        BUCKET_BUDGET_US,
    )
    print("[instrument_host_cost] FSDP2", flush=True)
    fsdp_means, fsdp_records = measure_fsdp(fsdp_blocks)
    collectives = {size: fsdp_records[f"{size}:attached"]["collectives_per_step"] for size in SIZES}
    fsdp_table, fsdp_comparisons = [], []
    for arm in ARMS[1:]:
        arm_table, arm_comparisons = figures_of(
            f"FSDP2 {arm}",
            {
                (size, clock): [
                    (b[f"{size}:{arm}"][key] - b[f"{size}:bare"][key]) / STEPS_PER_BLOCK * 1e6 for b in fsdp_means
                ]
                for size in SIZES
                for clock, key in (("wall", "wall_s"), ("CPU", "cpu_s"))
            },
            {
                size: bl.median([b[f"{size}:bare"]["wall_s"] / STEPS_PER_BLOCK * 1e6 for b in fsdp_means])
                for size in SIZES
            },
            "units",
            {size: collectives[SIZES[-1]] - collectives[SIZES[0]] for size in SIZES},
            STEP_BUDGET_US,
            BUCKET_BUDGET_US,
            per_what="collective",
        )
        for row in arm_table:
            row.update(
                collectives_per_step=collectives[row["buckets"]],
                self_reported_us=fsdp_records[f"{row['buckets']}:{arm}"]["self_reported_us"],
            )
        fsdp_table += arm_table
        fsdp_comparisons += arm_comparisons
    print("[instrument_host_cost] the trainers' callbacks", flush=True)
    trainers = measure_trainers(2 if args.quick else TRAINER_PAIRS)
    trainer_table, trainer_comparisons = [], []
    for kind, label in (("hf", "HF Trainer callback"), ("lightning", "Lightning callback")):
        extra, bare_us = trainers[kind]
        for clock in ("wall", "CPU"):
            lo, hi = bl.median_order_interval(extra[clock])
            trainer_table.append(
                {
                    "arm": label,
                    "clock": clock,
                    "extra_us_per_step": bl.median(extra[clock]),
                    "lo": lo,
                    "hi": hi,
                    "bare_us_per_step": bare_us,
                    "pairs": extra[clock],
                }
            )
            name = f"{label}, extra {clock} per step"
            trainer_comparisons.append(_row(name, label, extra[clock], STEP_BUDGET_US, "us per step", bare_us))
    comparisons += lab_comparisons + fsdp_comparisons + trainer_comparisons
    bench.finish(
        comparisons,
        blocks=blocks,
        steps_per_block=STEPS_PER_BLOCK,
        layers=LAYERS,
        width=WIDTH,
        batch=BATCH,
        by_size=attach_table,
        lab_runs=lab_instances * len(SIZES),
        lab_epochs_per_run=lab_epochs,
        lab_steps_per_epoch=LAB_STEPS_PER_EPOCH,
        lab_by_size=lab_table,
        fsdp_blocks=fsdp_blocks,
        fsdp_by_size=fsdp_table,
        trainer_runs={"pairs": 2 if args.quick else TRAINER_PAIRS, "steps": TRAINER_STEPS, "skipped": TRAINER_SKIPPED},
        trainers=trainer_table,
    )
    for job, table in (("attach", attach_table), ("lab", lab_table), ("fsdp", fsdp_table), ("trainer", trainer_table)):
        for row in table:
            interval = f" [{row['lo']:.0f}, {row['hi']:.0f}]" if row["lo"] is not None else ""
            print(
                f"  {job:7s} {row['arm']:19s} {row['clock']:4s} {row.get('buckets', '-'):>2}: "
                f"+{row['extra_us_per_step']:.0f} us/step{interval} (bare step {row['bare_us_per_step']:.0f} us)",
                flush=True,
            )
    return 0


def measure_attach(blocks: int) -> tuple[list[dict], list[dict]]:
    """The DDP part: every (buckets, arm) job in this process on its 1-rank gloo group; its table and verdicts."""
    jobs = make_jobs(build)
    windows = run_blocks(jobs, ARMS, blocks, "attach")
    resolve_us, self_reported_us = {}, {}  # (size, arm) -> per step recorded
    for (size, arm, instance), (_, _, _, meter) in jobs.items():
        if meter is not None and instance == 0:
            recorder = meter.recorder
            started_resolve = time.perf_counter()
            rows = [recorder._resolved(marks) for marks in recorder._pending]
            resolve_us[(size, arm)] = (time.perf_counter() - started_resolve) / len(rows) * 1e6
            self_reported_us[(size, arm)] = bl.median(
                [r["instrument_host_s"] * 1e6 for r in rows if r["kind"] == "train" and not r["warmup"]]
            )

    per_block: dict[int, dict[str, dict]] = {}
    for row in windows.rows:
        if row["block"] >= 2 * INSTANCES:
            per_block.setdefault(row["block"], {})[row["arm"]] = row
    table, comparisons = [], []
    for arm in ARMS[1:]:
        extra = {
            (size, clock): [
                (rows[f"{size}:{arm}"][key] - rows[f"{size}:bare"][key]) / STEPS_PER_BLOCK * 1e6
                for rows in per_block.values()
            ]
            for size in SIZES
            for clock, key in (("wall", "wall_s"), ("CPU", "cpu_s"))
        }
        bare_step = {
            size: bl.median([rows[f"{size}:bare"]["wall_s"] / STEPS_PER_BLOCK * 1e6 for rows in per_block.values()])
            for size in SIZES
        }
        arm_table, arm_comparisons = figures_of(
            arm,
            extra,
            bare_step,
            "buckets",
            {size: SIZES[-1] - SIZES[0] for size in SIZES},
            STEP_BUDGET_US,
            BUCKET_BUDGET_US,
        )
        for row in arm_table:
            row.update(
                resolve_us_per_step=resolve_us[(row["buckets"], arm)],
                self_reported_us=self_reported_us[(row["buckets"], arm)],
            )
        table += arm_table
        comparisons += arm_comparisons
    return table, comparisons


def figures_of(
    arm: str,
    extra: dict,
    bare_step: dict,
    unit: str,
    slope_over: dict,
    step_budget: float | None,
    slope_budget: float | None,
    per_what: str = "bucket",
) -> tuple[list[dict], list[dict]]:
    """Per clock: a table row per size (median extra us per step, its interval) and two verdicts, the extra per step
    at 20 and the extra per extra `per_what` ((extra at the largest size - at the smallest) / `slope_over`, block by
    block)."""
    table, comparisons = [], []
    for clock in ("wall", "CPU"):
        for size in SIZES:
            values = extra[(size, clock)]
            lo, hi = bl.median_order_interval(values)
            table.append(
                {
                    "arm": arm,
                    "clock": clock,
                    "buckets": size,
                    "extra_us_per_step": bl.median(values),
                    "lo": lo,
                    "hi": hi,
                    "bare_us_per_step": bare_step[size],
                }
            )
        name = f"{arm}, 20 {unit}, extra {clock} per step"
        comparisons.append(_row(name, arm, extra[(20, clock)], step_budget, "us per step", bare_step[20]))
        slope = [
            (large - small) / slope_over[SIZES[-1]]
            for large, small in zip(extra[(SIZES[-1], clock)], extra[(SIZES[0], clock)])
        ]
        name = f"{arm}, extra {clock} per extra {per_what}"
        comparisons.append(_row(name, arm, slope, slope_budget, f"us per {per_what}", None))
    return table, comparisons


def _row(name: str, arm: str, values: list[float], budget: float | None, unit: str, bare_us) -> dict:
    """A comparison row (bench/benchlib.py's shape): the median of `values` and its 95% interval, against `budget`."""
    value = bl.median(values)
    lo, hi = bl.median_order_interval(values)
    verdict = bl.interval_verdict(lo, hi, budget) if budget is not None else None
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
        "budget_definition": (
            f"the median's 95% order-statistic interval [lo, hi] at most {budget:g} {unit}"
            if budget is not None
            else "no budget: measured to be known"
        ),
        "interval": "95% order-statistic interval of the median over blocks",
        "verdict": verdict,
        "pass": {"pass": True, "miss": False}.get(verdict),
        "within_noise": None,
        "budget_within_noise": None,
        "pairs": len(values),
        "note": (
            f"median {value:.1f} {unit}, 95% interval [{lo:.1f}, {hi:.1f}] over {len(values)} blocks"
            if lo is not None
            else ""
        ),
    }


if __name__ == "__main__":
    sys.exit(main())
