#!/usr/bin/env python3
"""GPU first contact: every GPU row the lab's open issues ask for, measured in one run of at most 8 minutes.

It needs PyTorch with CUDA and the lab's own dependencies (numpy, pandas, pyarrow, pyyaml, pillow,
mlperf-logging; nvidia-ml-py for telemetry; transformers for step 09), no Ray: lab runs go through
the plain launcher (`--launcher local`'s code, scaling/launch/local.py). On the GPU machine, from the
repository root (docs/gpu.md has the exact command and what to carry there):

    PYTHONPATH=. python3 scripts/gpu_first_contact.py --out bench/results/gpu

Each step runs in a child process of its own (forked before anything touches CUDA), under a
timeout: a step that crashes, hangs or runs out of time is recorded as an error and the next step
starts on a clean device. Steps (`--only a,b` runs some), each written to OUT/NN-<step>.json with
`status` passed | failed | skipped | error, `seconds`, `budget_s`, its figures, checks and goals:

  01 env                versions (torch, CUDA, cuDNN, NCCL), the GPU, the modules, the spin rate of
                        torch.cuda._sleep (the ground truth's injection)
  02 gpt2_eager         GPT-2 small (1,024 tokens, bf16), batch 8 and 32, eager: the lab's run
                        (experiments/gpu-gpt2-small.yaml) against a bare loop (scripts/gpu_loops.py);
                        goal: lab step within 3% of bare
  03 gpt2_compiled      the same, compiled; goals: within 3%, lab MFU >= 0.35 at batch 32
  04 resnet50           ResNet-50 bf16 + channels_last + compiled, batch 256, synthetic 224 px: the
                        lab's run (experiments/gpu-resnet50.yaml) against a bare loop; goals: >= 3,000
                        img/s, within 3%
  05 nccl_ground_truth  a 1-rank NCCL DDP group with the device-side injection (a spin kernel in the
                        last bucket's completion callback): exposed communication and step time must
                        grow by the injected time (measured with events) within --tolerance (5%);
                        epochs with and without it alternate (ABBA)
  06 profiler           torch.profiler: the comm hook's completion events against the NCCL kernels'
                        ends; reports each bucket's lag and judges what the figures rest on (docs/gpu.md)
  07 sync_audit         host syncs per training step (torch.cuda sync debug mode): the lab's loop at
                        fp16 + channels_last, and a DDP step over NCCL with the comm hook
  08 host_cost          the instrument's cost (issue 45): bare vs `attach` blocks alternating (ABBA) in
                        one process, GPT-2 small batch 8 eager and compiled, ResNet-50 batch 32;
                        goal: attached / bare <= 1.01 (median of pairs, with their range)
  09 hf_gpt2            Hugging Face GPT2LMHeadModel called with keywords through `attach` (issue 46):
                        tokens/s, MFU and precision bf16 in the summary
  10 fsdp2_gloo         a user's FSDP2 job through `attach`, 2 ranks over gloo on the one GPU (for
                        function: NCCL refuses two ranks on one GPU)

`--dry-run` runs every step's code on CPU with tiny shapes (no CUDA; the lab's runs in the step's
process rather than a spawned one, compilation with aot_eager); steps 06 and 07 need CUDA's profiler
kernels and sync debug mode and are written as skipped with why. tests/test_gpu_path.py runs it:

    .venv/bin/python scripts/gpu_first_contact.py --dry-run --out /tmp/gpu-dry-run

At one rank NCCL turns an in-place sum into nothing at all, so the ground truth's and the profiler's
DDP hook all-reduce with ReduceOp.AVG, which NCCL runs as a reduction kernel even on one rank.
OUT/summary.json (and summary.md) hold one table of every goal with pass/fail and the run's wall time.
Exit status: 0 when no step failed, 1 otherwise, 2 for bad arguments (one line, nothing written).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import platform
import re
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "scripts"):  # the lab, and gpu_loops.py beside this script (also when loaded by path)
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# The lab's own command-line parser, errors and free port; none of them imports Ray or pandas.
from scaling.cli import OneLineParser  # noqa: E402
from scaling.errors import UsageError  # noqa: E402
from scaling.testbed.local_cluster import free_port  # noqa: E402


@dataclass(frozen=True)
class StepPlan:
    """A step's expected time on an H100/H200 (`budget_s`, the sum fits the 8 minutes) and its hard limit."""

    name: str
    budget_s: float
    timeout_s: float


# Budgets from the H200 run of 2026-11-27 (a lab run of GPT-2 small: 15 s; ResNet-50 compiled: 52 s)
# plus compilation (the bare loop compiles first, the lab's run then finds inductor's cache warm).
PLANS = (
    StepPlan("env", 15, 60),
    StepPlan("gpt2_eager", 50, 100),
    StepPlan("gpt2_compiled", 130, 200),
    StepPlan("resnet50", 80, 150),
    StepPlan("nccl_ground_truth", 25, 60),
    StepPlan("profiler", 15, 60),
    StepPlan("sync_audit", 20, 60),
    StepPlan("host_cost", 85, 150),
    StepPlan("hf_gpt2", 25, 60),
    StepPlan("fsdp2_gloo", 25, 60),
)
STEPS = tuple(plan.name for plan in PLANS)
TOTAL_BUDGET_S = 480.0  # issue 47: one run of at most 8 minutes
DRY_RUN_TIMEOUT_SCALE = 5  # a dry run's timeouts: the GPU's, times this
QUICKSTART = REPO / "experiments" / "quickstart.yaml"
GPU_GPT2 = REPO / "experiments" / "gpu-gpt2-small.yaml"
GPU_RESNET50 = REPO / "experiments" / "gpu-resnet50.yaml"
# what the lab imports on the plain launcher's path (mlperf_logging: a run's exports, scaling/launch/exports.py)
REQUIRED_MODULES = ("numpy", "pandas", "pyarrow", "yaml", "PIL", "mlperf_logging")
OPTIONAL_MODULES = ("pynvml", "ray", "torchvision", "transformers")
# Kernels that carry the NCCL work of an all-reduce (multi-rank: ncclDevKernel_AllReduce_*;
# one rank: NCCL's one-rank reduction kernel). The profiler also lists its own annotation of
# each collective on the GPU's timeline ("nccl:all_reduce", as seen on an H200 with torch 2.11):
# a range, not a kernel, so it is left out.
NCCL_KERNEL = re.compile(r"^(?!nccl:).*(nccl|onerank)", re.IGNORECASE)
# Figures of a lab run's summary.json kept in the results file
RUN_FIGURES = (
    "status",
    "error",
    "epochs_run",
    "step_s",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "allreduce_s",
    "exposed_comm_s",
    "throughput_samples_per_s",
    "time_per_epoch_s",
    "precision",
    "train_flops_per_sample",
    "achieved_flops_per_s",
    "peak_flops_per_s",
    "mfu",
    "mfu_note",
    "tokens_per_sample",
    "throughput_tokens_per_s",
    "peak_memory_bytes",
    "peak_memory_method",
    "collectives_per_step",
    "instrument_host_s",
)
# Goals (issues 45 and 47)
WITHIN_BARE = 1.03  # the lab's step at most 3% longer than a bare loop's
GPT2_MFU_GOAL = 0.35
RESNET_IMAGES_GOAL = 3000.0
HOST_COST_GOAL = 1.01


class Skip(Exception):
    """The step cannot run here; the message says why."""


@dataclass
class Ctx:
    args: argparse.Namespace
    out: Path
    dry_run: bool
    device: object  # torch.device

    @property
    def gpu(self) -> bool:
        return not self.dry_run


def goal(name: str, value: float | None, target: str, passed: bool | None) -> dict:
    """One row of the summary's goal table (value None: not measured)."""
    return {"goal": name, "value": value, "target": target, "passed": None if value is None else bool(passed)}


# --- helpers -------------------------------------------------------------------------------


def _one_rank_group(ctx: Ctx) -> None:
    """A 1-rank process group in this process: NCCL on GPU, gloo in a dry run (created once)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if ctx.gpu:
        torch.cuda.set_device(ctx.device)
    dist.init_process_group(
        "nccl" if ctx.gpu else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )


def _ddp_model(ctx: Ctx, model_name: str, num_classes: int):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from scaling.models import build_model

    torch.manual_seed(0)
    model = build_model(model_name, num_classes).to(ctx.device)
    return DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.gpu else None, bucket_cap_mb=25)


def _batches(ctx: Ctx, count: int, batch: int, size: int, num_classes: int) -> list:
    import torch

    generator = torch.Generator(device=ctx.device).manual_seed(0)
    return [
        (
            torch.randn(batch, 3, size, size, generator=generator, device=ctx.device),
            torch.randint(0, num_classes, (batch,), generator=generator, device=ctx.device),
        )
        for _ in range(count)
    ]


def _run_local_in_this_process(cfg, run_dir) -> None:
    """The plain launcher's worker for a 1-worker CPU run, in this process (dry run: a spawned interpreter
    costs seconds of imports per run on a small CPU; the loop, its records and the summary are the same)."""
    import torch
    import torch.distributed as dist

    from scaling.launch.local import release_process_group
    from scaling.train.loop import WorkerContext, run_worker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group(cfg.resolved_backend, rank=0, world_size=1)
    try:
        run_worker(
            cfg,
            WorkerContext(rank=0, world_size=1, local_rank=0, node_rank=0, device=torch.device("cpu")),
            Path(run_dir),
        )
    finally:
        release_process_group()


def lab_run(ctx: Ctx, name: str, base: Path, overrides: list[str]) -> dict:
    """One 1-worker lab run of `base`'s config through the plain launcher, preflight included, as
    `scaling run --launcher local` does; its summary's figures."""
    from scaling.config import load_config
    from scaling.launch.preflight import preflight
    from scaling.launch.run import execute_run

    device = (
        [
            "workers.use_gpu=true",
            f"workers.cpus_per_worker={ctx.args.cpus_per_worker}",
            "instrument.telemetry_interval_s=0.5",
        ]
        if ctx.gpu
        else ["workers.use_gpu=false", "workers.cpus_per_worker=1", "instrument.telemetry_interval_s=0"]
    )
    cfg = load_config(base, overrides=device + overrides, num_workers=1)
    notes = preflight(cfg, "local")
    if ctx.dry_run:
        import scaling.launch.local

        scaling.launch.local.run_local = _run_local_in_this_process  # this step's own process: nothing else runs here
    run_dir = ctx.out / "runs" / name
    started = time.perf_counter()
    summary = execute_run(cfg, run_dir, launcher="local", preflighted=True)
    result = {
        "run_dir": str(run_dir.relative_to(ctx.out)),
        "wall_s": time.perf_counter() - started,
        "note": " ".join(notes) or None,
        "overrides": overrides,
    }
    result.update({("run_status" if key == "status" else key): summary.get(key) for key in RUN_FIGURES})
    return result


def _compile_backend(ctx: Ctx, lab: bool = False) -> str:
    """inductor on a GPU. A dry run: the lab's runs with aot_eager (traces forward and backward as inductor
    does, generates nothing; the choices `train.compile_backend` offers), the bare loops with dynamo alone."""
    if ctx.gpu:
        return "inductor"
    return "aot_eager" if lab else "eager"


def _gpt2_shapes(ctx: Ctx) -> dict:
    if ctx.gpu:
        return {"model": "gpt2-small", "vocab": 50257, "seq": 1024, "batches": (8, 32)}
    return {"model": "gpt2-tiny", "vocab": 256, "seq": 64, "batches": (2,)}  # one batch: the same code


def _gpt2_against_bare(ctx: Ctx, compiled: bool) -> dict:
    """The lab's GPT-2 run against the bare loop, per batch: the bare loop first (with compilation it fills
    inductor's cache, so the lab's run compiles the same graphs from it), then the lab's run."""
    from gpu_loops import gpt2_bare

    shapes = _gpt2_shapes(ctx)
    warmup = (10 if compiled else 5) if ctx.gpu else 2
    steps = 30 if ctx.gpu else 3
    backend = _compile_backend(ctx) if compiled else None
    label = "compiled" if compiled else "eager"
    rows, goals, checks = {}, [], {}
    for batch in shapes["batches"]:
        bare = gpt2_bare(
            ctx.device,
            shapes["model"],
            shapes["vocab"],
            shapes["seq"],
            batch,
            backend,
            warmup,
            steps if batch == shapes["batches"][0] else steps * 2 // 3,
        )
        _free_cuda_memory(ctx)
        overrides = [
            f"model.name={shapes['model']}",
            f"data.num_classes={shapes['vocab']}",
            f"data.seq_len={shapes['seq']}",
            f"train.per_worker_batch={batch}",
            f"data.train_samples={batch * (warmup + steps)}",
            f"data.val_samples={batch}",
            "train.max_epochs=1",
            f"train.compile={str(compiled).lower()}",
            f"train.compile_backend={_compile_backend(ctx, lab=True)}",
            f"instrument.warmup_steps={warmup}",
            "instrument.calibration_pairs=0",
        ]
        lab = lab_run(ctx, f"gpt2-{label}-b{batch}", GPU_GPT2, overrides)
        ratio = lab["step_s"] / bare["step_s"] if lab.get("step_s") else None
        peak, flops = lab.get("peak_flops_per_s"), lab.get("train_flops_per_sample")
        bare["mfu"] = batch * flops / bare["step_s"] / peak if (peak and flops) else None  # the lab's FLOP count
        rows[f"b{batch}"] = {"batch": batch, "bare": bare, "lab": lab, "lab_over_bare": ratio}
        checks[f"batch {batch}: lab run finished"] = lab["run_status"] == "max_epochs"
        goals.append(
            goal(
                f"GPT-2 small {label} b{batch}: lab / bare step",
                ratio,
                f"<= {WITHIN_BARE}",
                ratio is not None and ratio <= WITHIN_BARE,
            )
        )
        if compiled and batch == shapes["batches"][-1]:
            mfu = lab.get("mfu")
            goals.append(
                goal(
                    f"GPT-2 small compiled b{batch}: lab MFU",
                    mfu,
                    f">= {GPT2_MFU_GOAL}",
                    mfu is not None and mfu >= GPT2_MFU_GOAL,
                )
            )
    if ctx.gpu:
        checks["lab runs: MFU"] = all(row["lab"].get("mfu") is not None for row in rows.values())
    return {
        "model": shapes["model"],
        "sequence": shapes["seq"],
        "compile_backend": backend,
        "runs": rows,
        "checks": checks,
        "goals": goals,
        "passed": all(checks.values()),
    }


def _free_cuda_memory(ctx: Ctx) -> None:
    """Give the bare loop's memory back before the lab's run (a process of its own on the same GPU)."""
    import gc

    gc.collect()
    if ctx.gpu:
        import torch

        torch.cuda.empty_cache()


def step_env(ctx: Ctx) -> dict:
    import importlib

    import torch

    modules = {}
    for name in REQUIRED_MODULES + OPTIONAL_MODULES:
        try:
            module = importlib.import_module(name)
            modules[name] = getattr(module, "__version__", "present")
        except Exception as exc:  # noqa: BLE001 - any import failure is "absent", with why
            modules[name] = None
            modules[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
    missing = [name for name in REQUIRED_MODULES if modules[name] is None]
    result = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "modules": modules,
        "missing_required_modules": missing,
        "dry_run": ctx.dry_run,
    }
    checks = {"required modules import": not missing}
    if ctx.gpu:
        from scaling.instrument.timing import spin_cycles_per_s
        from scaling.train.precision import bf16_problem

        props = torch.cuda.get_device_properties(ctx.device)
        capability = torch.cuda.get_device_capability(ctx.device)
        nccl = torch.cuda.nccl.version()  # a tuple (major, minor, patch); an int in older torch
        result.update(
            cudnn=torch.backends.cudnn.version(),
            nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
            device_count=torch.cuda.device_count(),
            device=str(ctx.device),
            device_name=props.name,
            capability=list(capability),
            memory_gib=props.total_memory / 2**30,
            device_uuid=str(getattr(props, "uuid", "")),
            bf16_native=bf16_problem(props.name, capability) is None,
            spin_cycles_per_s=spin_cycles_per_s(ctx.device),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
        checks["torch.cuda._sleep exists (the device-side injection)"] = hasattr(torch.cuda, "_sleep")
        checks["sync debug mode exists"] = hasattr(torch.cuda, "set_sync_debug_mode")
    result["checks"] = checks
    result["passed"] = all(checks.values())
    if missing:
        result["reason"] = (
            f"missing modules the lab needs: {', '.join(missing)} (pip install pandas pyarrow pyyaml "
            "pillow numpy mlperf-logging, or carry a wheelhouse to a machine without network)"
        )
    return result


def step_gpt2_eager(ctx: Ctx) -> dict:
    result = _gpt2_against_bare(ctx, compiled=False)
    if ctx.gpu:  # the plain launcher's NVML telemetry on a GPU (every 0.5 s)
        from scaling.results import RunDir

        run = result["runs"][f"b{_gpt2_shapes(ctx)['batches'][-1]}"]["lab"]
        telemetry = RunDir(ctx.out / run["run_dir"]).telemetry(["rank"])
        result["telemetry_rows"] = int(len(telemetry))
        if importlib.util.find_spec("pynvml") is not None:
            result["checks"]["NVML telemetry recorded"] = bool(len(telemetry))
            result["passed"] = all(result["checks"].values())
    return result


def step_gpt2_compiled(ctx: Ctx) -> dict:
    return _gpt2_against_bare(ctx, compiled=True)


def step_resnet50(ctx: Ctx) -> dict:
    """ResNet-50 bf16 + channels_last + compiled on synthetic images: the bare loop, then the lab's run."""
    from gpu_loops import resnet_bare

    if ctx.gpu:
        model, size, classes, batch, warmup, steps = "resnet50", 224, 1000, ctx.args.resnet_batch, 10, 20
    else:  # the lab's precision, layout and compile paths, CPU-sized
        model, size, classes, batch, warmup, steps = "small_cnn", 32, 10, 8, 2, 3
    bare = resnet_bare(ctx.device, model, classes, size, batch, _compile_backend(ctx), warmup, steps)
    _free_cuda_memory(ctx)
    lab = lab_run(
        ctx,
        f"{model}-compiled-b{batch}",
        GPU_RESNET50,
        [
            f"model.name={model}",
            f"data.image_size={size}",
            f"data.num_classes={classes}",
            f"train.per_worker_batch={batch}",
            f"data.train_samples={batch * (warmup + steps)}",
            "train.max_epochs=1",
            f"train.compile_backend={_compile_backend(ctx, lab=True)}",
            f"instrument.warmup_steps={warmup}",
            "instrument.calibration_pairs=0",
        ],
    )
    ratio = lab["step_s"] / bare["step_s"] if lab.get("step_s") else None
    rate = lab.get("throughput_samples_per_s")
    goals = [
        goal(
            f"{model} bf16 cl compiled b{batch}: lab img/s",
            rate,
            f">= {RESNET_IMAGES_GOAL:,.0f}",
            rate is not None and rate >= RESNET_IMAGES_GOAL,
        ),
        goal(
            f"{model} compiled b{batch}: lab / bare step",
            ratio,
            f"<= {WITHIN_BARE}",
            ratio is not None and ratio <= WITHIN_BARE,
        ),
    ]
    checks = {"lab run finished": lab["run_status"] == "max_epochs"}
    return {
        "model": model,
        "image_size": size,
        "per_worker_batch": batch,
        "bare": bare,
        "lab": lab,
        "lab_over_bare": ratio,
        "checks": checks,
        "goals": goals,
        "passed": all(checks.values()),
    }


def step_nccl_ground_truth(ctx: Ctx) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from scaling.instrument import attach

    _one_rank_group(ctx)
    args = ctx.args
    if ctx.gpu:
        model_name, size, classes, batch, steps, pairs = "resnet50", 224, 1000, 32, 12, 3
        inject_s, tolerance = args.inject_s, args.tolerance
    else:
        model_name, size, classes, batch, steps, pairs = "small_cnn", 32, 10, 32, 6, 2
        inject_s, tolerance = args.inject_s_dry, args.tolerance_dry
    ddp = _ddp_model(ctx, model_name, classes)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    run_dir = ctx.out / "runs" / "nccl_ground_truth"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    # DDP's own path, as a user's job runs it: no comm hook, the buckets timed through the instrument's
    # process group on every step (instrument/backends/ddp.py); attached with a delay so that the group
    # knows the last bucket, then the delay set per epoch
    meter = attach(
        ddp,
        optimizer,
        run_dir=run_dir,
        name="ground_truth",
        warmup_steps=5,
        calibration_pairs=0,
        telemetry_interval_s=0,
        collective_timing_every=1,
        inject_comm_delay_s=inject_s,
    )
    timer = meter.backend._timer
    data = _batches(ctx, steps, batch, size, classes)
    schedule = [0.0, inject_s, inject_s, 0.0] * ((pairs + 1) // 2)
    schedule = schedule[: 2 * pairs]  # ABBA: drift cancels
    spin_cycles = 0  # the injected epochs' spin (GPU)
    for delay in schedule:
        timer.configure(meter.clock, delay)  # GPU: measures the spin's cycles per second (a sync, between epochs)
        spin_cycles = max(spin_cycles, timer.spin_cycles)
        for inputs, targets in meter.batches(data):
            F.cross_entropy(ddp(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
        meter.end_epoch()
    meter.detach()
    from scaling.results import RunDir

    records = RunDir(run_dir).steps()
    train = records[(records["kind"] == "train") & ~records["warmup"]].copy()
    train["delay_s"] = train["epoch"].map(lambda e: schedule[int(e) - 1])
    base, injected = train[train["delay_s"] == 0], train[train["delay_s"] > 0]
    # GPU: medians (the device's step times vary little). CPU: the fastest steps, as
    # tests/test_ground_truth.py explains: on a shared CPU other processes only add time.
    estimate = (lambda s: float(np.median(s))) if ctx.gpu else (lambda s: float(np.min(s)))
    measured = float(np.median(injected["injected_s"]))
    growth = {name: estimate(injected[name]) - estimate(base[name]) for name in ("exposed_comm_s", "step_s")}
    errors = {name: (value - measured) / measured for name, value in growth.items()}
    checks = {
        f"{name} grew by the injected time within {tolerance:.0%}": abs(err) <= tolerance
        for name, err in errors.items()
    }
    checks["no injection in the base epochs"] = bool((base["injected_s"] == 0).all())
    checks["injected steps carry injected_s"] = bool((injected["injected_s"] > 0).all())
    return {
        "backend": "nccl" if ctx.gpu else "gloo (dry run: host sleep)",
        "model": model_name,
        "per_rank_batch": batch,
        "requested_s": inject_s,
        "measured_injected_s": measured,
        "measured_over_requested": measured / inject_s,
        "spin_cycles": spin_cycles if ctx.gpu else None,
        "estimator": "median" if ctx.gpu else "min",
        "base": {name: estimate(base[name]) for name in ("step_s", "exposed_comm_s", "allreduce_s")},
        "injected": {name: estimate(injected[name]) for name in ("step_s", "exposed_comm_s", "allreduce_s")},
        "growth_s": growth,
        "relative_error": errors,
        "tolerance": tolerance,
        "schedule_s": schedule,
        "steps_compared": {"base": int(len(base)), "injected": int(len(injected))},
        "run_dir": str(run_dir.relative_to(ctx.out)),
        "checks": checks,
        "passed": all(checks.values()),
    }


def _kernel_intervals(prof) -> tuple[list[tuple[str, float, float]], list[str]]:
    """(name, start_us, end_us) of the GPU kernels the profiler saw, and every kernel name.

    From the profiler's events (device-side ones); if it lists none, from Kineto's raw events.
    """
    from torch.autograd import DeviceType

    kernels = [
        (e.name, float(e.time_range.start), float(e.time_range.end))
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    ]
    if not kernels:
        for e in prof.profiler.kineto_results.events():
            if e.device_type() == DeviceType.CUDA:
                start_ns = e.start_ns()
                kernels.append((e.name(), start_ns / 1000.0, (start_ns + e.duration_ns()) / 1000.0))
    return sorted(kernels, key=lambda k: k[1]), sorted({k[0] for k in kernels})


def judge_completion_lags(
    event_offsets_us: list[list[float]], kernel_end_offsets_us: list[list[float]], tolerance_us: float
) -> dict:
    """Step 06's rule, on offsets per profiled step and bucket (both from one common first instant, so no
    clock alignment): an event's lag behind its NCCL kernel's end, relative to that step's last bucket.

    What each figure rests on (docs/gpu.md): `exposed_comm_s` ends at the last bucket's completion event, so
    (1) the last buckets' events must track their kernels' ends across steps within `tolerance_us`, and
    (2) no earlier bucket's event may come after the last one's (exposure would take its lag).
    `allreduce_s` sums each bucket's span to its event, so an overlapped bucket's extra lag is reported as
    the bound on how much it overstates `allreduce_s` per step, not judged against a bar."""
    import numpy as np

    events, kernels = np.asarray(event_offsets_us, float), np.asarray(kernel_end_offsets_us, float)
    difference = events - kernels  # each event's lag, less the first event's (unknown, common to all)
    last = difference[:, -1]
    relative = difference - last[:, None]  # each bucket's lag beyond its step's last bucket's
    overlapped = relative[:, :-1]
    last_spread = float(last.max() - last.min())
    ordered = bool((events[:, :-1] <= events[:, -1:]).all())
    result = {
        "last_bucket_spread_us": last_spread,
        "overlapped_lag_us_median": float(np.median(overlapped)) if overlapped.size else None,
        "overlapped_lag_us_max": float(overlapped.max()) if overlapped.size else None,
        "allreduce_overstatement_bound_s_per_step": float(np.median(np.clip(overlapped, 0, None).sum(axis=1))) / 1e6
        if overlapped.size
        else 0.0,
        "lag_beyond_last_bucket_us": [[round(float(v), 1) for v in row] for row in relative],
        "checks": {
            f"last bucket's completion event tracks its NCCL kernel's end within {tolerance_us:g} us "
            "across steps (exposed_comm_s)": last_spread <= tolerance_us,
            "no earlier bucket's event after the last bucket's": ordered,
        },
    }
    result["passed"] = all(result["checks"].values())
    return result


def step_profiler(ctx: Ctx) -> dict:
    if ctx.dry_run:
        raise Skip(
            "dry run: NCCL kernels and CUDA events exist only on GPU (the rule: judge_completion_lags, tested on CPU)"
        )
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from scaling.instrument.timing import CudaClock, TimingProcessGroup

    _one_rank_group(ctx)
    ddp = _ddp_model(ctx, "resnet50", 1000)
    # the instrument's timed path, as the DDP backend sets it on a timed step (instrument/backends/ddp.py)
    hook = TimingProcessGroup(ddp.process_group, CudaClock())
    ddp.reducer._update_process_group(hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = _batches(ctx, 4, 32, 224, 1000)

    def step(batch):
        F.cross_entropy(ddp(batch[0]), batch[1]).backward()
        optimizer.step()
        optimizer.zero_grad()

    for i in range(6):  # DDP rebuilds its buckets after the first iteration; cuDNN picks its kernels
        step(data[i % len(data)])
    torch.cuda.synchronize()
    hook.take()
    per_step = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(ctx.args.profiled_steps):
            step(data[i % len(data)])
            per_step.append(hook.take())
        torch.cuda.synchronize()
    kernels, names = _kernel_intervals(prof)
    nccl = [k for k in kernels if NCCL_KERNEL.search(k[0])]
    marks = [m for step_marks in per_step for m in step_marks]
    buckets = {len(step_marks) for step_marks in per_step}
    result = {
        "profiled_steps": ctx.args.profiled_steps,
        "buckets": len(marks),
        "nccl_kernels": len(nccl),
        "nccl_kernel_names": sorted({k[0] for k in nccl}),
        "kernel_names_sample": names[:30],
        "tolerance_us": ctx.args.profiler_tolerance_us,
    }
    if not nccl or len(nccl) != len(marks) or len(buckets) != 1:
        result["checks"] = {"one NCCL kernel per bucket, as many buckets each step": False}
        result["passed"] = False
        result["reason"] = (
            f"{len(nccl)} NCCL kernels for {len(marks)} buckets, buckets per step {sorted(buckets)} "
            "(kernel names: see nccl_kernel_names, kernel_names_sample)"
        )
        return result
    # Offsets from the first completion / the first kernel's end: the same instant on both
    # clocks, so no alignment of the CUDA event timer with the profiler's clock is needed.
    width = buckets.pop()
    reference = marks[0].completed
    event_offsets_us = np.array([reference.elapsed_time(m.completed) * 1000.0 for m in marks]).reshape(-1, width)
    kernel_offsets_us = np.array([k[2] - nccl[0][2] for k in nccl]).reshape(-1, width)
    result.update(
        buckets_per_step=width,
        kernel_duration_us_median=float(np.median([k[2] - k[1] for k in nccl])),
        difference_us=[[round(float(d), 1) for d in row] for row in event_offsets_us - kernel_offsets_us],
        kernel_end_offset_us=[[round(float(o), 1) for o in row] for row in kernel_offsets_us],
    )
    result.update(
        judge_completion_lags(event_offsets_us.tolist(), kernel_offsets_us.tolist(), ctx.args.profiler_tolerance_us)
    )
    result["goals"] = [
        goal(
            "06 completion lag of overlapped buckets (us, median; reported)",
            result["overlapped_lag_us_median"],
            "reported, not judged",
            True,
        ),
        goal(
            "06 last bucket's event spread across steps (us)",
            result["last_bucket_spread_us"],
            f"<= {ctx.args.profiler_tolerance_us:g}",
            result["last_bucket_spread_us"] <= ctx.args.profiler_tolerance_us,
        ),
    ]
    return result


def step_sync_audit(ctx: Ctx) -> dict:
    import torch
    import torch.nn.functional as F

    from scaling.config import load_config
    from scaling.instrument import attach
    from scaling.train.sync_audit import audit_lab_loop, capture_host_syncs

    if not torch.cuda.is_available() or ctx.dry_run:
        raise Skip("torch.cuda's sync debug mode needs CUDA" + (" (dry run)" if ctx.dry_run else ""))
    # (a) the lab's loop: fp16 (GradScaler's intended sync) and channels_last, one worker, this process
    cfg = load_config(
        QUICKSTART,
        overrides=[
            "workers.use_gpu=true",
            "train.precision=fp16",
            "train.channels_last=true",
            "train.max_epochs=2",
            "train.target_accuracy=1.0",
            "data.train_samples=2048",
            "data.val_samples=512",
            "instrument.telemetry_interval_s=0",
        ],
        num_workers=1,
    )
    lab = audit_lab_loop(cfg, ctx.device, ctx.out / "runs" / "sync_audit_loop")
    # (b) a DDP step over NCCL through the instrument, every step's buckets timed (the lab runs DDP only at > 1
    # worker)
    _one_rank_group(ctx)
    ddp = _ddp_model(ctx, "small_cnn", 10)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    run_dir = ctx.out / "runs" / "sync_audit_ddp"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    meter = attach(
        ddp,
        optimizer,
        run_dir=run_dir,
        warmup_steps=3,
        calibration_pairs=0,
        telemetry_interval_s=0,
        collective_timing_every=1,
    )
    data = _batches(ctx, 16, 64, 32, 10)

    def train_epoch():
        for inputs, targets in meter.batches(data):
            F.cross_entropy(ddp(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()

    train_epoch()  # warm-up: DDP rebuilds its buckets after the first iteration (a sync, once)
    meter.end_epoch()
    with capture_host_syncs() as syncs:
        train_epoch()
    meter.end_epoch()
    meter.detach()
    ddp_sites = syncs.sites()
    ddp_per_step = [s for s in ddp_sites if s["count"] >= len(data) and not s["intended"]]
    checks = {
        "lab loop: no unintended per-step host sync": not lab["unintended_per_step"],
        "DDP + NCCL + the instrument: no per-step host sync": not ddp_per_step,
    }
    return {
        "lab_loop": lab,
        "ddp_sites": ddp_sites,
        "ddp_per_step": ddp_per_step,
        "ddp_steps": len(data),
        "checks": checks,
        "passed": all(checks.values()),
    }


def step_host_cost(ctx: Ctx) -> dict:
    """The instrument's cost on a GPU (issue 45): bare vs attached blocks, ABBA, one process, a 1-rank DDP group
    (NCCL; gloo in a dry run) with 25 MB buckets; the attached arm at `attach`'s defaults, calibration off."""
    import torch
    import torch.nn.functional as F

    from gpu_loops import host_cost_abba
    from scaling.models import build_model

    _one_rank_group(ctx)
    shapes = _gpt2_shapes(ctx)
    batch = shapes["batches"][0]
    vocab, seq, device = shapes["vocab"], shapes["seq"], ctx.device
    pairs, steps, warmup_blocks = (8, 10, 2) if ctx.gpu else (2, 3, 1)

    def tokens(i):
        generator = torch.Generator(device=device).manual_seed(i)
        ids = torch.randint(0, vocab, (batch, seq + 1), generator=generator, device=device)
        return ids[:, :-1], ids[:, 1:]

    def lm_loss(logits, item):
        return F.cross_entropy(logits.flatten(0, 1), item[1].flatten())

    image_model, size, classes, image_batch = ("resnet50", 224, 1000, 32) if ctx.gpu else ("small_cnn", 32, 10, 8)

    def images(i):
        generator = torch.Generator(device=device).manual_seed(i)
        return (
            torch.randn(image_batch, 3, size, size, generator=generator, device=device).contiguous(
                memory_format=torch.channels_last
            ),
            torch.randint(0, classes, (image_batch,), generator=generator, device=device),
        )

    jobs = {
        f"gpt2_b{batch}_eager": (lambda: build_model(shapes["model"], vocab), tokens, lm_loss, None, "adamw"),
        f"gpt2_b{batch}_compiled": (
            lambda: build_model(shapes["model"], vocab),
            tokens,
            lm_loss,
            _compile_backend(ctx),
            "adamw",
        ),
        f"{image_model}_b{image_batch}_eager": (
            lambda: build_model(image_model, classes).to(memory_format=torch.channels_last),
            images,
            lambda logits, item: F.cross_entropy(logits, item[1]),
            None,
            "sgd",
        ),
    }
    rows, goals = {}, []
    for name, (build, make_batch, loss_of, backend, optimizer) in jobs.items():
        run_dir = ctx.out / "runs" / f"host_cost-{name}"
        measure = functools.partial(
            host_cost_abba,
            device,
            build,
            make_batch,
            loss_of,
            run_dir,
            compile_backend=backend,
            optimizer=optimizer,
            pairs=pairs,
            steps_per_block=steps,
            warmup_blocks=warmup_blocks,
        )
        try:
            row = measure(compile_inner=False)
            row["compiled"] = "the DDP wrapper" if backend else None
        except Exception as exc:  # noqa: BLE001 - recorded; a compiled job is measured again the other way
            if not backend:
                raise
            # torch.compile of the DDP wrapper traces DDP's forward, and with it whatever the instrument put
            # there; the module compiled inside an eager DDP keeps the instrument out of the graph
            failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            shutil.rmtree(run_dir, ignore_errors=True)
            _free_cuda_memory(ctx)
            row = measure(compile_inner=True)
            row.update(compiled="the module inside an eager DDP", compiling_the_ddp_wrapper_failed=failed)
        rows[name] = row
        goals.append(
            goal(
                f"host cost {name}: attached / bare (pairs {row['ratio_min']:.3f}-{row['ratio_max']:.3f})",
                row["ratio_median"],
                f"<= {HOST_COST_GOAL}",
                row["ratio_median"] <= HOST_COST_GOAL,
            )
        )
        _free_cuda_memory(ctx)
    checks = {f"{name}: every pair measured": len(row["ratios"]) == pairs for name, row in rows.items()}
    return {
        "design": f"{pairs} pairs of blocks of {steps} steps, ABBA, after {warmup_blocks} warm-up blocks per arm",
        "bf16_autocast": True,
        "jobs": rows,
        "checks": checks,
        "goals": goals,
        "passed": all(checks.values()),
    }


def step_hf_gpt2(ctx: Ctx) -> dict:
    if importlib.util.find_spec("transformers") is None:
        raise Skip("transformers is not installed here")
    from gpu_loops import hf_gpt2_job

    batch, seq, warmup, steps = (8, 1024, 5, 20) if ctx.gpu else (2, 32, 1, 3)
    run_dir = ctx.out / "runs" / "hf-gpt2"
    summary = hf_gpt2_job(ctx.device, run_dir, tiny=ctx.dry_run, batch=batch, seq=seq, warmup=warmup, steps=steps)
    figures = {key: summary.get(key) for key in RUN_FIGURES if key in summary}
    tokens_per_s, mfu, precision = (
        summary.get("throughput_tokens_per_s"),
        summary.get("mfu"),
        summary.get("precision"),
    )
    checks = {
        "measured to its end": summary.get("status") == "max_epochs",
        "tokens per sample from input_ids": summary.get("tokens_per_sample") == seq,
    }
    goals = [
        goal("HF GPT2LMHeadModel (keywords) via attach: tokens/s", tokens_per_s, "measured", tokens_per_s is not None),
        goal("HF GPT2LMHeadModel: precision is bf16", 1.0 if precision == "bf16" else 0.0, "bf16", precision == "bf16"),
        goal("HF GPT2LMHeadModel: MFU", mfu, "measured", mfu is not None),
    ]
    if not ctx.gpu:  # no datasheet peak for a CPU: MFU is a GPU figure
        goals[-1] = goal("HF GPT2LMHeadModel: MFU", None, "measured (GPU)", None)
    return {
        "per_rank_batch": batch,
        "sequence": seq,
        "run_dir": str(run_dir.relative_to(ctx.out)),
        "summary": figures,
        "not_measured": summary.get("not_measured"),
        "checks": checks,
        "goals": goals,
        "passed": all(checks.values()),
    }


def step_fsdp2_gloo(ctx: Ctx) -> dict:
    """A user's FSDP2 job, 2 ranks over gloo sharing the one GPU (CPU in a dry run), through `attach`."""
    if (os.cpu_count() or 1) < 2:
        raise Skip("2 ranks need 2 CPUs")
    import torch.multiprocessing as mp

    from gpu_loops import fsdp2_gloo_rank
    from scaling.results import RunDir

    run_dir = ctx.out / "runs" / "fsdp2-gloo"
    steps = 8 if ctx.gpu else 4
    # fork: this step's process has not touched CUDA, and a fork skips two interpreters' imports
    mp.start_processes(
        fsdp2_gloo_rank, args=(2, free_port(), ctx.gpu, str(run_dir), steps), nprocs=2, join=True, start_method="fork"
    )
    records = RunDir(run_dir)
    train = records.steps()
    train = train[train["kind"] == "train"] if len(train) else train
    collectives = records.collectives()
    result = {
        "run_dir": str(run_dir.relative_to(ctx.out)),
        "steps_recorded": int(len(train)),
        "collectives_recorded": int(len(collectives)),
        "collective_kinds": sorted(set(collectives["kind"])) if "kind" in collectives else None,
        "meaning": "for function, not for timing: two gloo ranks share one GPU",
    }
    checks = {
        "both ranks recorded steps": bool(len(train)) and set(train["rank"]) == {0, 1},
        "collectives recorded": bool(len(collectives)),
    }
    result.update(
        checks=checks,
        passed=all(checks.values()),
        goals=[
            goal(
                "FSDP2 2 gloo ranks on one GPU via attach: collectives recorded",
                float(len(collectives)),
                "> 0 (for function)",
                bool(len(collectives)),
            )
        ],
    )
    return result


STEP_FUNCTIONS = {name: globals()[f"step_{name}"] for name in STEPS}


# --- running -------------------------------------------------------------------------------


def run_step(ctx: Ctx, number: int, name: str) -> dict:
    """Run one step in this process and write its record (OUT/NN-<step>.json)."""
    from scaling.results import write_json_atomic

    started = time.perf_counter()
    record = {"step": name, "number": number, "dry_run": ctx.dry_run}
    try:
        details = STEP_FUNCTIONS[name](ctx)
        record["status"] = "passed" if details.pop("passed", True) else "failed"
        record.update(details)
    except Skip as skip:
        record.update(status="skipped", reason=str(skip))
    except Exception as exc:  # noqa: BLE001 - a step's crash is its result; the next step still runs
        record.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    record["seconds"] = time.perf_counter() - started
    write_json_atomic(ctx.out / f"{number:02d}-{name}.json", record)
    return record


def run_isolated(ctx: Ctx, plan: StepPlan, timeout_s: float) -> dict:
    """`plan`'s step in a forked child process of its own process group, killed with its children (lab
    workers, compile workers) after `timeout_s`. The parent never touches CUDA, so each child starts its own
    CUDA context on a device the previous step has left; a crash or a hang costs only that step."""
    import json

    from scaling.results import write_json_atomic

    number = STEPS.index(plan.name) + 1
    path = ctx.out / f"{number:02d}-{plan.name}.json"
    started = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: run, write, leave without interpreter finalisation (process groups' threads)
        code = 0
        try:
            os.setpgid(0, 0)
            run_step(ctx, number, plan.name)
        except BaseException:  # noqa: BLE001 - whatever happens, the parent records it
            traceback.print_exc()
            code = 3
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    try:
        os.setpgid(pid, pid)  # also from here: the child may not have run yet when a timeout comes
    except OSError:
        pass
    timed_out, status = False, 0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() - started > timeout_s:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            break
        time.sleep(0.2)
    seconds = time.perf_counter() - started
    record = json.loads(path.read_text()) if path.exists() and not timed_out else None
    if record is None:
        record = {
            "step": plan.name,
            "number": number,
            "dry_run": ctx.dry_run,
            "status": "error",
            "error": (
                f"timed out after {timeout_s:.0f} s (budget {plan.budget_s:.0f} s): killed"
                if timed_out
                else f"the step's process ended without a result (wait status {status})"
            ),
        }
    record.update(budget_s=plan.budget_s, timeout_s=timeout_s, wall_s=seconds)
    write_json_atomic(path, record)
    line = record.get("reason") or record.get("error") or ""
    print(
        f"{number:02d} {plan.name:<18} {record['status']:<8} {seconds:7.1f} s (budget {plan.budget_s:4.0f})  "
        f"{line.splitlines()[0] if line else ''}",
        flush=True,
    )
    return record


def summary_table(records: list[dict], dry_run: bool) -> list[dict]:
    """One row per goal of every step (dry run: CPU figures, not judged), and a row per step that has none."""
    rows = []
    for record in records:
        goals = record.get("goals") or []
        for row in goals:
            rows.append({"step": record["step"], **row, **({"passed": None} if dry_run else {})})
        if not goals:
            rows.append(
                {
                    "step": record["step"],
                    "goal": f"step {record['step']}: its checks",
                    "value": None,
                    "target": "passed",
                    "passed": None if dry_run or record["status"] == "skipped" else record["status"] == "passed",
                }
            )
        elif record["status"] in ("failed", "error"):
            rows.append(
                {
                    "step": record["step"],
                    "goal": f"step {record['step']}: its checks",
                    "value": None,
                    "target": "passed",
                    "passed": False,
                }
            )
    return rows


def _markdown(rows: list[dict], header: str) -> str:
    def cell(row):
        value = row["value"]
        shown = "not measured" if value is None else (f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}")
        verdict = {True: "pass", False: "**fail**", None: "–"}[row["passed"]]
        return f"| {row['step']} | {row['goal']} | {shown} | {row['target']} | {verdict} |"

    return (
        "\n".join(
            [header, "", "| step | goal | value | target | verdict |", "|---|---|---:|---|---|", *map(cell, rows)]
        )
        + "\n"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="gpu_first_contact.py",
        description="Measure every GPU row of the lab's open issues on one GPU; one results file per step "
        "(module docstring).",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu", help="results folder")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: run every step's code on CPU with tiny shapes; CUDA-only steps skipped",
    )
    parser.add_argument("--only", help=f"comma-separated steps to run (default all): {','.join(STEPS)}")
    parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")
    parser.add_argument("--device", default="cuda:0", help="the GPU (default cuda:0)")
    parser.add_argument(
        "--cpus-per-worker",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="CPUs per GPU worker in the lab runs (torch's CPU threads)",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=TOTAL_BUDGET_S,
        help="the whole run's limit: a step's timeout is cut to what is left, and a step with less "
        "than 10 s left is not started (default 480)",
    )
    parser.add_argument(
        "--resnet-batch", type=int, default=256, help="ResNet-50 per-GPU batch of step 04 (default 256)"
    )
    parser.add_argument("--inject-s", type=float, default=0.05, help="the GPU ground truth's injected delay (s)")
    parser.add_argument(
        "--tolerance", type=float, default=0.05, help="the GPU ground truth's bar (share of the injection)"
    )
    parser.add_argument("--inject-s-dry", type=float, default=0.2, help="the dry run's injected host sleep (s)")
    parser.add_argument(
        "--tolerance-dry", type=float, default=0.2, help="the dry run's bar (a shared CPU is noisier than a GPU)"
    )
    parser.add_argument("--profiled-steps", type=int, default=5)
    parser.add_argument(
        "--profiler-tolerance-us",
        type=float,
        default=20.0,
        help="step 06: how closely the last bucket's completion events track their kernels (us)",
    )
    args = parser.parse_args(argv)
    if args.only:
        chosen = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in chosen if s not in STEPS]
        if unknown:
            parser.error(f"unknown step(s) {', '.join(unknown)}; valid: {', '.join(STEPS)}")
        args.steps = [s for s in STEPS if s in chosen]
    else:
        args.steps = list(STEPS)
    for name in ("inject_s", "tolerance", "inject_s_dry", "tolerance_dry", "deadline_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 when no step failed, 1 otherwise, 2 for bad arguments (one line on stderr, nothing written)."""
    try:
        return _run(parse_args(argv))
    except UsageError as refusal:
        print(refusal, file=sys.stderr)
        return 2


def _cuda_available() -> bool:
    """torch's answer, asked in a forked child: asking here would start CUDA's driver in this process, and
    the steps' forked children could then not use CUDA."""
    import torch

    if not torch.version.cuda:
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(0 if torch.cuda.is_available() else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    missing = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"gpu_first_contact.py: missing modules the lab needs: {', '.join(missing)} (pip install "
            "pandas pyarrow pyyaml pillow numpy mlperf-logging, or carry a wheelhouse to a machine "
            "without network)"
        )
    import torch

    from scaling.results import write_json_atomic, write_text_atomic

    if not args.dry_run and not _cuda_available():
        raise UsageError(
            f"gpu_first_contact.py: torch {torch.__version__} sees no CUDA GPU here (CUDA build: "
            f"{torch.version.cuda or 'none'}); run on the GPU machine, or with --dry-run for the "
            "CPU-checkable parts"
        )
    out = args.out.resolve()
    if out.exists() and not out.is_dir():
        raise UsageError(f"gpu_first_contact.py: --out {out} is not a folder")
    if out.exists() and any(out.iterdir()):
        if not args.overwrite:
            raise UsageError(
                f"gpu_first_contact.py: --out {out} holds results already; choose another folder or pass --overwrite"
            )
        for old in list(out.glob("[0-9][0-9]-*.json")) + [out / "summary.json", out / "summary.md"]:
            old.unlink(missing_ok=True)
        shutil.rmtree(out / "runs", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu") if args.dry_run else torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    ctx = Ctx(args=args, out=out, dry_run=args.dry_run, device=device)
    print(f"results: {out}  ({'dry run on CPU' if args.dry_run else device})", flush=True)
    records = []
    for plan in (p for p in PLANS if p.name in args.steps):
        left = args.deadline_s - (time.perf_counter() - started)
        if left < 10:
            records.append(
                {
                    "step": plan.name,
                    "status": "skipped",
                    "budget_s": plan.budget_s,
                    "reason": f"not started: {left:.0f} s left of --deadline-s {args.deadline_s:g}",
                }
            )
            write_json_atomic(out / f"{STEPS.index(plan.name) + 1:02d}-{plan.name}.json", records[-1])
            print(f"{STEPS.index(plan.name) + 1:02d} {plan.name:<18} skipped  {records[-1]['reason']}", flush=True)
            continue
        # a dry run's CPU-sized steps take longer than their GPU budgets on a small shared CPU (imports, tracing)
        records.append(
            run_isolated(ctx, plan, min(plan.timeout_s * (DRY_RUN_TIMEOUT_SCALE if args.dry_run else 1), left))
        )
    wall_s = time.perf_counter() - started
    table = summary_table(records, args.dry_run)
    summary = {
        "dry_run": args.dry_run,
        "steps": {r["step"]: r["status"] for r in records},
        "failed": [r["step"] for r in records if r["status"] in ("failed", "error")],
        "goals": table,
        "goals_failed": [row["goal"] for row in table if row["passed"] is False],
        "wall_s": wall_s,
        "deadline_s": args.deadline_s,
        "within_deadline": wall_s <= args.deadline_s,
        "finished_unix": time.time(),
    }
    write_json_atomic(out / "summary.json", summary)
    header = (
        f"{'Dry run on CPU (figures not judged)' if args.dry_run else device}: {len(records)} steps, "
        f"{wall_s:.0f} s of {args.deadline_s:.0f}"
    )
    markdown = _markdown(table, header)
    write_text_atomic(out / "summary.md", markdown)
    print(markdown, flush=True)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
