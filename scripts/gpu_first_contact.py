#!/usr/bin/env python3
"""GPU first contact: the lab's CUDA path run once, in one go, on a single GPU; one results file per step.

The CUDA path (CUDA-event marks, NCCL futures in the comm hook, AMP on GPU, NVML, the
device-side ground truth) was written and reviewed without a GPU. This script is the first
thing to run where there is one. It needs PyTorch with CUDA and the lab's own dependencies
(numpy, pandas, pyarrow, pyyaml, pillow, mlperf-logging; nvidia-ml-py for telemetry), no Ray:
lab runs go through the plain launcher (`--launcher local`'s code, scaling/launch/local.py).

On the GPU machine (PyTorch 2.11 + CUDA 13, Python 3.12, no Ray), from the repository root:

    PYTHONPATH=. python3 scripts/gpu_first_contact.py --out bench/results/gpu

then commit bench/results/gpu/*.json (not runs/) and copy the figures into docs/gpu.md.
About 4 minutes on an H200 (ResNet-50 with torch.compile is 2.5 of them).
On a machine without a GPU, `--dry-run` runs the parts that work on CPU (argument handling,
the results folder, the environment, the lab runs on CPU workers, the ground truth on a 1-rank
gloo group with the host-side injection); the GPU-only steps are written as skipped, with why:

    .venv/bin/python scripts/gpu_first_contact.py --dry-run --out /tmp/gpu-dry-run

Steps (`--only a,b` runs some of them), each written to OUT/NN-<step>.json with
`status` passed | failed | skipped | error, `seconds`, the figures, and the reason or error:

  01 env                versions (torch, CUDA, cuDNN, NCCL), the GPU, the modules the lab needs,
                        the spin rate of torch.cuda._sleep (the ground truth's injection)
  02 smoke              a 1-GPU lab run (quickstart model and data, 2 epochs, NVML telemetry on)
  03 resnet50           ResNet-50 on synthetic 224 px data: fp32, fp16 + channels_last,
                        bf16 + channels_last, bf16 + channels_last + torch.compile (throughput, MFU)
  04 gloo2              2 ranks over gloo with CUDA tensors on the one GPU: for function, not for
                        timing (NCCL refuses two ranks on one GPU)
  05 nccl_ground_truth  a 1-rank NCCL DDP group with the device-side injection (a spin kernel in
                        the last bucket's completion callback): exposed communication and step
                        time must grow by the injected time (measured with events) within
                        --tolerance (5%); epochs with and without it alternate (ABBA)
  06 profiler           torch.profiler: the comm hook's completion events against the end times
                        of the NCCL kernels (offsets within a run, so no clock alignment needed)
  07 sync_audit         host syncs per training step (torch.cuda sync debug mode): the lab's loop
                        at fp16 + channels_last, and a DDP step over NCCL with the comm hook; only
                        GradScaler's is intended
  08 gpt2               GPT-2 small at bf16: the lab's loop (tokens/s, MFU, peak memory) and a
                        user's FSDP2 job through `attach` on a 1-rank NCCL group (the adapter's CUDA
                        path and peak memory; FSDP2 issues no collective at world size 1)

At one rank NCCL turns an in-place sum into nothing at all, so the ground truth and the
profiler's DDP hook all-reduce with ReduceOp.AVG, which NCCL runs as a reduction kernel even
on one rank: the NCCL stream then has real work for the completion events to follow.
Exit status: 0 when no step failed, 1 otherwise, 2 for bad arguments (one line, nothing written).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import platform
import re
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The lab's own command-line parser, errors and free port; none of them imports Ray or pandas.
from scaling.cli import OneLineParser  # noqa: E402
from scaling.errors import UsageError  # noqa: E402
from scaling.testbed.local_cluster import free_port  # noqa: E402

STEPS = ("env", "smoke", "resnet50", "gloo2", "nccl_ground_truth", "profiler", "sync_audit", "gpt2")
QUICKSTART = REPO / "experiments" / "quickstart.yaml"
GPT2_TINY = REPO / "experiments" / "gpt2-tiny.yaml"
# what the lab imports on the plain launcher's path (mlperf_logging: a run's exports, scaling/launch/exports.py)
REQUIRED_MODULES = ("numpy", "pandas", "pyarrow", "yaml", "PIL", "mlperf_logging")
OPTIONAL_MODULES = ("pynvml", "ray", "torchvision")
# Kernels that carry the NCCL work of an all-reduce (multi-rank: ncclDevKernel_AllReduce_*;
# one rank: NCCL's one-rank reduction kernel). The profiler also lists its own annotation of
# each collective on the GPU's timeline ("nccl:all_reduce", as seen on an H200 with torch 2.11):
# a range, not a kernel, so it is left out.
NCCL_KERNEL = re.compile(r"^(?!nccl:).*(nccl|onerank)", re.IGNORECASE)
# Figures of a lab run's summary.json kept in the results file
RUN_FIGURES = ("status", "error", "epochs_run", "step_s", "data_s", "forward_s", "backward_s", "optimizer_s",
               "allreduce_s", "exposed_comm_s", "throughput_samples_per_s", "time_per_epoch_s", "precision",
               "train_flops_per_sample", "achieved_flops_per_s", "peak_flops_per_s", "mfu", "mfu_note",
               "tokens_per_sample", "throughput_tokens_per_s", "peak_memory_bytes", "peak_memory_method",
               "collectives_per_step")


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


# --- helpers -------------------------------------------------------------------------------


def _one_rank_group(ctx: Ctx) -> None:
    """A 1-rank process group in this process: NCCL on GPU, gloo in a dry run (created once)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if ctx.gpu:
        torch.cuda.set_device(ctx.device)
    dist.init_process_group("nccl" if ctx.gpu else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)


def avg_allreduce_hook(state, bucket):
    """A DDP comm hook: the bucket all-reduced with ReduceOp.AVG (a real NCCL kernel even at one rank)."""
    import torch.distributed as dist

    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


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
    return [(torch.randn(batch, 3, size, size, generator=generator, device=ctx.device),
             torch.randint(0, num_classes, (batch,), generator=generator, device=ctx.device)) for _ in range(count)]


def lab_run(ctx: Ctx, name: str, overrides: list[str], workers: int = 1, base: Path = QUICKSTART) -> dict:
    """One lab run of `base`'s config through the plain launcher, preflight included, as
    `scaling run --launcher local` does."""
    from scaling.config import load_config
    from scaling.launch.preflight import preflight
    from scaling.launch.run import execute_run

    common = ["instrument.warmup_steps=3"] + (["train.target_accuracy=1.0"] if base == QUICKSTART else [])
    device = (["workers.use_gpu=true", f"workers.cpus_per_worker={ctx.args.cpus_per_worker}",
               "instrument.telemetry_interval_s=0.5"] if ctx.gpu else ["workers.use_gpu=false", "workers.cpus_per_worker=1"])
    cfg = load_config(base, overrides=common + device + overrides, num_workers=workers)
    notes = preflight(cfg, "local")
    run_dir = ctx.out / "runs" / name
    started = time.perf_counter()
    summary = execute_run(cfg, run_dir, launcher="local", preflighted=True)
    result = {"run_dir": str(run_dir.relative_to(ctx.out)), "wall_s": time.perf_counter() - started, "note": " ".join(notes) or None,
              "overrides": overrides, "workers": workers}
    result.update({("run_status" if key == "status" else key): summary.get(key) for key in RUN_FIGURES})
    return result


# --- the steps -----------------------------------------------------------------------------


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
        "python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "modules": modules,
        "missing_required_modules": missing, "dry_run": ctx.dry_run,
    }
    checks = {"required modules import": not missing}
    if ctx.gpu:
        from scaling.instrument.timing import spin_cycles_per_s
        from scaling.train.precision import bf16_problem

        props = torch.cuda.get_device_properties(ctx.device)
        capability = torch.cuda.get_device_capability(ctx.device)
        nccl = torch.cuda.nccl.version()  # a tuple (major, minor, patch); an int in older torch
        result.update(
            cudnn=torch.backends.cudnn.version(), nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
            device_count=torch.cuda.device_count(), device=str(ctx.device), device_name=props.name,
            capability=list(capability), memory_gib=props.total_memory / 2**30,
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
        result["reason"] = (f"missing modules the lab needs: {', '.join(missing)} (pip install pandas pyarrow pyyaml "
                            "pillow numpy mlperf-logging, or carry a wheelhouse to a machine without network)")
    return result


def step_smoke(ctx: Ctx) -> dict:
    result = lab_run(ctx, "smoke", ["data.train_samples=2048", "data.val_samples=512", "train.max_epochs=2"])
    from scaling.results import RunDir

    telemetry = RunDir(ctx.out / result["run_dir"]).telemetry(["rank"])
    result["telemetry_rows"] = int(len(telemetry)) if not telemetry.empty else None
    checks = {"run finished": result["run_status"] == "max_epochs", "steps timed": result["step_s"] is not None}
    if ctx.gpu:
        try:
            import pynvml  # noqa: F401
            checks["NVML telemetry recorded"] = bool(result["telemetry_rows"])
        except ImportError:
            result["telemetry_note"] = "nvidia-ml-py not installed: telemetry not checked"
    result["checks"] = checks
    result["passed"] = all(checks.values())
    return result


def step_resnet50(ctx: Ctx) -> dict:
    if ctx.gpu:
        batch, steps, model, size, classes = ctx.args.resnet_batch, 20, "resnet50", 224, 1000
        variants = {"fp32": [], "fp16_cl": ["train.precision=fp16", "train.channels_last=true"],
                    "bf16_cl": ["train.precision=bf16", "train.channels_last=true"],
                    "bf16_cl_compile": ["train.precision=bf16", "train.channels_last=true", "train.compile=true"]}
        skipped = {}
    else:  # the same runs, CPU-sized: the lab's precision and layout paths on CPU workers
        batch, steps, model, size, classes = 16, 8, "small_cnn", 32, 10
        variants = {"fp32": [], "bf16_cl": ["train.precision=bf16", "train.channels_last=true"]}
        skipped = {"fp16_cl": "dry run: fp16 convolution backward is emulated on CPU (slow), GPU only",
                   "bf16_cl_compile": "dry run: torch.compile takes minutes on a small CPU; GPU only"}
    data = [f"model.name={model}", "data.name=synthetic", f"data.image_size={size}", f"data.num_classes={classes}",
            f"data.train_samples={batch * steps}", f"train.per_worker_batch={batch}", "train.max_epochs=2"]
    runs = {name: lab_run(ctx, f"resnet50-{name}", data + extra) for name, extra in variants.items()}
    checks = {f"{name} finished": run["run_status"] == "max_epochs" for name, run in runs.items()}
    return {"model": model, "image_size": size, "per_worker_batch": batch, "runs": runs, "skipped_variants": skipped,
            "checks": checks, "passed": all(checks.values())}


def step_gloo2(ctx: Ctx) -> dict:
    if (os.cpu_count() or 1) < 2:
        raise Skip("2 ranks need 2 CPUs")
    result = lab_run(ctx, "gloo2", ["backend=gloo", "data.train_samples=2048", "data.val_samples=512",
                                    "train.max_epochs=2", "instrument.calibration_pairs=2"], workers=2)
    from scaling.results import RunDir

    steps = RunDir(ctx.out / result["run_dir"]).steps()
    train = steps[steps["kind"] == "train"]
    result["buckets_per_step"] = float(train["num_buckets"].median()) if len(train) else None
    checks = {"run finished": result["run_status"] == "max_epochs",
              "both ranks recorded": len(train) and set(train["rank"]) == {0, 1},
              "all-reduces timed (for function only)": bool(len(train)) and bool((train["num_buckets"] > 0).all())}
    result["checks"] = {k: bool(v) for k, v in checks.items()}
    result["passed"] = all(result["checks"].values())
    result["meaning"] = "for function, not for timing: two ranks share the GPU and gloo's completion follows the default stream"
    return result


def step_nccl_ground_truth(ctx: Ctx) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from scaling.instrument import attach
    from scaling.instrument.timing import CommTimingHook

    _one_rank_group(ctx)
    args = ctx.args
    if ctx.gpu:
        model_name, size, classes, batch, steps, pairs = "resnet50", 224, 1000, 32, 12, 3
        inject_s, tolerance = args.inject_s, args.tolerance
    else:
        model_name, size, classes, batch, steps, pairs = "small_cnn", 32, 10, 32, 6, 2
        inject_s, tolerance = args.inject_s_dry, args.tolerance_dry
    ddp = _ddp_model(ctx, model_name, classes)
    hook = CommTimingHook(inner_hook=avg_allreduce_hook)
    ddp.register_comm_hook(state=None, hook=hook)  # the instrument adopts it (instrument/backends/ddp.py)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    run_dir = ctx.out / "runs" / "nccl_ground_truth"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    meter = attach(ddp, optimizer, run_dir=run_dir, name="ground_truth", warmup_steps=5, calibration_pairs=0,
                   telemetry_interval_s=0)
    data = _batches(ctx, steps, batch, size, classes)
    schedule = [0.0, inject_s, inject_s, 0.0] * ((pairs + 1) // 2)
    schedule = schedule[:2 * pairs]  # ABBA: drift cancels
    for delay in schedule:
        hook.configure(meter.clock, delay)  # GPU: measures the spin's cycles per second (a sync, between epochs)
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
    checks = {f"{name} grew by the injected time within {tolerance:.0%}": abs(err) <= tolerance
              for name, err in errors.items()}
    checks["no injection in the base epochs"] = bool((base["injected_s"] == 0).all())
    checks["injected steps carry injected_s"] = bool((injected["injected_s"] > 0).all())
    return {
        "backend": "nccl" if ctx.gpu else "gloo (dry run: host sleep)", "model": model_name, "per_rank_batch": batch,
        "requested_s": inject_s, "measured_injected_s": measured, "measured_over_requested": measured / inject_s,
        "spin_cycles": hook.spin_cycles if ctx.gpu else None, "estimator": "median" if ctx.gpu else "min",
        "base": {name: estimate(base[name]) for name in ("step_s", "exposed_comm_s", "allreduce_s")},
        "injected": {name: estimate(injected[name]) for name in ("step_s", "exposed_comm_s", "allreduce_s")},
        "growth_s": growth, "relative_error": errors, "tolerance": tolerance, "schedule_s": schedule,
        "steps_compared": {"base": int(len(base)), "injected": int(len(injected))},
        "run_dir": str(run_dir.relative_to(ctx.out)), "checks": checks, "passed": all(checks.values()),
    }


def _kernel_intervals(prof) -> tuple[list[tuple[str, float, float]], list[str]]:
    """(name, start_us, end_us) of the GPU kernels the profiler saw, and every kernel name.

    From the profiler's events (device-side ones); if it lists none, from Kineto's raw events.
    """
    from torch.autograd import DeviceType

    kernels = [(e.name, float(e.time_range.start), float(e.time_range.end))
               for e in prof.events() if e.device_type == DeviceType.CUDA]
    if not kernels:
        for e in prof.profiler.kineto_results.events():
            if e.device_type() == DeviceType.CUDA:
                start_ns = e.start_ns()
                kernels.append((e.name(), start_ns / 1000.0, (start_ns + e.duration_ns()) / 1000.0))
    return sorted(kernels, key=lambda k: k[1]), sorted({k[0] for k in kernels})


def step_profiler(ctx: Ctx) -> dict:
    if ctx.dry_run:
        raise Skip("dry run: NCCL kernels and CUDA events exist only on GPU")
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from scaling.instrument.timing import CommTimingHook, CudaClock

    _one_rank_group(ctx)
    ddp = _ddp_model(ctx, "resnet50", 1000)
    hook = CommTimingHook(CudaClock(), inner_hook=avg_allreduce_hook)
    ddp.register_comm_hook(state=None, hook=hook)
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
    marks = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(ctx.args.profiled_steps):
            step(data[i % len(data)])
            marks += hook.take()
        torch.cuda.synchronize()
    kernels, names = _kernel_intervals(prof)
    nccl = [k for k in kernels if NCCL_KERNEL.search(k[0])]
    result = {"profiled_steps": ctx.args.profiled_steps, "buckets": len(marks), "nccl_kernels": len(nccl),
              "nccl_kernel_names": sorted({k[0] for k in nccl}),
              "kernel_names_sample": names[:30], "tolerance_us": ctx.args.profiler_tolerance_us}
    if not nccl or len(nccl) != len(marks):
        result["checks"] = {"one NCCL kernel per bucket": False}
        result["passed"] = False
        result["reason"] = f"{len(nccl)} NCCL kernels for {len(marks)} buckets (kernel names: see nccl_kernel_names, kernel_names_sample)"
        return result
    # Offsets from the first completion / the first kernel's end: the same instant on both
    # clocks, so no alignment of the CUDA event timer with the profiler's clock is needed.
    reference = marks[0].completed
    event_offsets_us = np.array([reference.elapsed_time(m.completed) * 1000.0 for m in marks])
    kernel_offsets_us = np.array([k[2] - nccl[0][2] for k in nccl])
    difference = event_offsets_us - kernel_offsets_us
    result.update(
        max_abs_difference_us=float(np.abs(difference).max()), median_difference_us=float(np.median(difference)),
        span_us=float(kernel_offsets_us.max()),
        kernel_duration_us_median=float(np.median([k[2] - k[1] for k in nccl])),
        difference_us=[round(float(d), 1) for d in difference],
        kernel_duration_us=[round(k[2] - k[1], 1) for k in nccl],
        kernel_end_offset_us=[round(float(o), 1) for o in kernel_offsets_us],
    )
    result["checks"] = {f"completion events within {ctx.args.profiler_tolerance_us} us of the NCCL kernels' ends":
                        result["max_abs_difference_us"] <= ctx.args.profiler_tolerance_us}
    result["passed"] = all(result["checks"].values())
    return result


def step_sync_audit(ctx: Ctx) -> dict:
    import torch
    import torch.nn.functional as F

    from scaling.config import load_config
    from scaling.instrument import attach
    from scaling.instrument.timing import CommTimingHook
    from scaling.train.sync_audit import audit_lab_loop, capture_host_syncs

    if not torch.cuda.is_available() or ctx.dry_run:
        raise Skip("torch.cuda's sync debug mode needs CUDA" + (" (dry run)" if ctx.dry_run else ""))
    # (a) the lab's loop: fp16 (GradScaler's intended sync) and channels_last, one worker, this process
    cfg = load_config(QUICKSTART, overrides=[
        "workers.use_gpu=true", "train.precision=fp16", "train.channels_last=true", "train.max_epochs=2",
        "train.target_accuracy=1.0", "data.train_samples=2048", "data.val_samples=512",
        "instrument.telemetry_interval_s=0"], num_workers=1)
    lab = audit_lab_loop(cfg, ctx.device, ctx.out / "runs" / "sync_audit_loop")
    # (b) a DDP step over NCCL through the comm hook and the instrument (the lab runs DDP only at > 1 worker)
    _one_rank_group(ctx)
    ddp = _ddp_model(ctx, "small_cnn", 10)
    hook = CommTimingHook(inner_hook=avg_allreduce_hook)
    ddp.register_comm_hook(state=None, hook=hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    run_dir = ctx.out / "runs" / "sync_audit_ddp"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    meter = attach(ddp, optimizer, run_dir=run_dir, warmup_steps=3, calibration_pairs=0, telemetry_interval_s=0)
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
    checks = {"lab loop: no unintended per-step host sync": not lab["unintended_per_step"],
              "DDP + NCCL + comm hook: no per-step host sync": not ddp_per_step}
    return {"lab_loop": lab, "ddp_sites": ddp_sites, "ddp_per_step": ddp_per_step, "ddp_steps": len(data),
            "checks": checks, "passed": all(checks.values())}


def step_gpt2(ctx: Ctx) -> dict:
    """GPT-2 small on the GPU: the lab's loop at bf16 (tokens/s, MFU, peak memory), and a user's
    FSDP2 job (each block `fully_shard`ed, then the root) measured by `attach` on a 1-rank NCCL group.

    One GPU holds one NCCL rank, and FSDP2 at world size 1 issues no collective (torch's
    `_fsdp_param_group.py` copies the shard in place of the all-gather, `foreach_reduce` skips
    the reduce-scatter): the FSDP half checks the adapter's CUDA path (its events, peak memory
    from `torch.cuda.max_memory_allocated`) and says how many collectives it saw, not their timing.
    """
    import torch

    from scaling.instrument import attach
    from scaling.launch.instrument_parts import lab_parts
    from scaling.models import build_model

    if ctx.gpu:
        model_name, vocab, seq, batch, steps = "gpt2-small", 50257, 1024, 8, 12
    else:
        model_name, vocab, seq, batch, steps = "gpt2-tiny", 256, 64, 8, 6
    precision = ["train.precision=bf16"] if ctx.gpu else []
    lab = lab_run(ctx, f"{model_name}-lab", [
        f"model.name={model_name}", f"data.num_classes={vocab}", f"data.seq_len={seq}",
        f"train.per_worker_batch={batch}", f"data.train_samples={batch * steps}", f"data.val_samples={batch}",
        "train.max_epochs=2", "train.eval_every=1", "train.target_loss=0.01", "optim.schedule=constant",
        "instrument.calibration_pairs=0"] + precision, base=GPT2_TINY)

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _one_rank_group(ctx)
    torch.manual_seed(0)
    model = build_model(model_name, vocab).to(ctx.device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if ctx.gpu else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator(device=ctx.device).manual_seed(0)
    data = [torch.randint(0, vocab, (batch, seq + 1), generator=generator, device=ctx.device) for _ in range(steps)]
    run_dir = ctx.out / "runs" / f"{model_name}-fsdp-attached"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    if ctx.gpu:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    # the lab's parts handed over: on PYTHONPATH, not installed, the lab registers no entry point
    with attach(model, optimizer, run_dir=run_dir, name=f"{model_name}-fsdp", warmup_steps=3, calibration_pairs=0,
                telemetry_interval_s=0, parts=lab_parts()) as meter:
        for _ in range(2):
            for tokens in meter.batches(data):
                logits = model(tokens[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            meter.end_epoch(val_loss=loss.item())
    device_peak = torch.cuda.max_memory_allocated(ctx.device) if ctx.gpu else None
    from scaling.results import RunDir

    summary = RunDir(run_dir).summary()
    fsdp = {key: summary.get(key) for key in RUN_FIGURES if key in summary}
    fsdp.update(run_dir=str(run_dir.relative_to(ctx.out)), torch_max_memory_allocated=device_peak,
                collectives_recorded=int(len(RunDir(run_dir).collectives())))
    checks = {"lab run finished": lab["run_status"] == "max_epochs",
              "lab run: tokens/s": bool(lab.get("throughput_tokens_per_s")),
              "lab run: peak memory": bool(lab.get("peak_memory_bytes")),
              "FSDP job measured to its end": summary.get("status") == "max_epochs",
              "FSDP job: steps timed": summary.get("step_s") is not None,
              "FSDP job: peak memory": bool(summary.get("peak_memory_bytes"))}
    if ctx.gpu:
        checks["lab run: MFU"] = lab.get("mfu") is not None
    return {"model": model_name, "sequence": seq, "per_rank_batch": batch, "lab": lab, "fsdp_attached": fsdp,
            "checks": checks, "passed": all(checks.values())}


STEP_FUNCTIONS = {name: globals()[f"step_{name}"] for name in STEPS}


# --- running -------------------------------------------------------------------------------


def run_step(ctx: Ctx, number: int, name: str) -> dict:
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
    line = record.get("reason") or record.get("error") or ""
    print(f"{number:02d} {name:<18} {record['status']:<8} {record['seconds']:7.1f} s  {line}", flush=True)
    return record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="gpu_first_contact.py",
        description="Run the lab's GPU path once on a single GPU; one results file per step (module docstring).")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu", help="results folder")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: run the CPU-checkable parts on CPU, write the GPU-only steps as skipped")
    parser.add_argument("--only", help=f"comma-separated steps to run (default all): {','.join(STEPS)}")
    parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")
    parser.add_argument("--device", default="cuda:0", help="the GPU (default cuda:0)")
    parser.add_argument("--cpus-per-worker", type=int, default=min(4, os.cpu_count() or 1),
                        help="CPUs per GPU worker in the lab runs (torch's CPU threads)")
    parser.add_argument("--resnet-batch", type=int, default=64, help="ResNet-50 per-GPU batch (default 64)")
    parser.add_argument("--inject-s", type=float, default=0.05, help="the GPU ground truth's injected delay (s)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="the GPU ground truth's bar (share of the injection)")
    parser.add_argument("--inject-s-dry", type=float, default=0.2, help="the dry run's injected host sleep (s)")
    parser.add_argument("--tolerance-dry", type=float, default=0.2,
                        help="the dry run's bar (a shared CPU is noisier than a GPU)")
    parser.add_argument("--profiled-steps", type=int, default=5)
    parser.add_argument("--profiler-tolerance-us", type=float, default=20.0)
    args = parser.parse_args(argv)
    if args.only:
        chosen = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in chosen if s not in STEPS]
        if unknown:
            parser.error(f"unknown step(s) {', '.join(unknown)}; valid: {', '.join(STEPS)}")
        args.steps = [s for s in STEPS if s in chosen]
    else:
        args.steps = list(STEPS)
    for name in ("inject_s", "tolerance", "inject_s_dry", "tolerance_dry"):
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


def _run(args: argparse.Namespace) -> int:
    missing = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"gpu_first_contact.py: missing modules the lab needs: {', '.join(missing)} (pip install "
                         "pandas pyarrow pyyaml pillow numpy mlperf-logging, or carry a wheelhouse to a machine "
                         "without network)")
    import torch

    from scaling.results import write_json_atomic

    if not args.dry_run and not torch.cuda.is_available():
        raise UsageError(f"gpu_first_contact.py: torch {torch.__version__} sees no CUDA GPU here (CUDA build: "
                         f"{torch.version.cuda or 'none'}); run on the GPU machine, or with --dry-run for the "
                         "CPU-checkable parts")
    out = args.out.resolve()
    if out.exists() and not out.is_dir():
        raise UsageError(f"gpu_first_contact.py: --out {out} is not a folder")
    if out.exists() and any(out.iterdir()):
        if not args.overwrite:
            raise UsageError(f"gpu_first_contact.py: --out {out} holds results already; choose another folder or "
                             "pass --overwrite")
        for old in list(out.glob("[0-9][0-9]-*.json")) + [out / "summary.json"]:
            old.unlink(missing_ok=True)
        shutil.rmtree(out / "runs", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu") if args.dry_run else torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    ctx = Ctx(args=args, out=out, dry_run=args.dry_run, device=device)
    print(f"results: {out}  ({'dry run on CPU' if args.dry_run else device})", flush=True)
    records = [run_step(ctx, STEPS.index(name) + 1, name) for name in args.steps]
    summary = {"dry_run": args.dry_run, "steps": {r["step"]: r["status"] for r in records},
               "failed": [r["step"] for r in records if r["status"] in ("failed", "error")],
               "finished_unix": time.time()}
    write_json_atomic(out / "summary.json", summary)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    code = main()
    # Leave without interpreter finalisation once everything is written: a process group's
    # threads can still hold the comm hook's futures, and dropping them at exit aborts the
    # process (scaling/launch/local.py explains it).
    gc.collect()
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - nothing left to protect
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
