"""The reference loops scripts/gpu_first_contact.py measures the lab against, written as a user writes them.

- `gpt2_bare`, `resnet_bare`: a plain training loop over the lab's own model (`scaling.models`; the
  same module the lab's run trains, so any difference is the loop's, not the model's), bf16
  autocast, torch's fused optimizer on CUDA, data already on the device, and no instrument. Each
  returns its mean step time over steady steps, timed by one synchronize before and one after
  them (the warm-up steps, compilation included, each end with a synchronize and are timed apart).
- `host_cost_abba`: the instrument's cost on a GPU (issue 45): two copies of one job, one bare and
  one with `scaling.instrument.attach` at its defaults (A/B calibration off), blocks of steps
  alternating bare / attached / attached / bare in one process (drift cancels), each block between
  two synchronizes; per pair of blocks, attached / bare; the median over pairs and their range.
- `hf_gpt2_job`: Hugging Face's GPT2LMHeadModel called with keywords through `attach`.
- `fsdp2_gloo_rank`: one rank of a user's FSDP2 job over gloo (the script starts two on one GPU).

Nothing here decides a pass or a fail: the script's steps do, against their goals.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(step, batches: list, device: torch.device, warmup: int, steps: int) -> dict:
    """`warmup` steps each closed by a synchronize (their times: compilation, autotuning), then `steps` steady
    steps between two synchronizes (no sync inside them); batches are taken round-robin."""
    warmup_s = []
    for i in range(warmup):
        started = time.perf_counter()
        step(batches[i % len(batches)])
        _sync(device)
        warmup_s.append(time.perf_counter() - started)
    _sync(device)
    started = time.perf_counter()
    for i in range(steps):
        step(batches[(warmup + i) % len(batches)])
    _sync(device)
    elapsed = time.perf_counter() - started
    return {
        "step_s": elapsed / steps,
        "steps": steps,
        "warmup_steps": warmup,
        "warmup_s": sum(warmup_s),
        "first_step_s": warmup_s[0] if warmup_s else None,
    }


def _fused(device: torch.device) -> dict:
    return {"fused": True} if device.type == "cuda" else {}


def _autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def gpt2_bare(
    device: torch.device,
    model_name: str,
    vocab: int,
    seq: int,
    batch: int,
    compile_backend: str | None,
    warmup: int,
    steps: int,
) -> dict:
    """A bare GPT loop over the lab's `model_name` (nanoGPT's shape of loop): bf16 autocast, fused AdamW,
    generated token ids on the device; `compile_backend` None for eager."""
    from scaling.models import build_model

    torch.manual_seed(0)
    model = build_model(model_name, vocab).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, **_fused(device))
    forward = torch.compile(model, backend=compile_backend) if compile_backend else model
    generator = torch.Generator(device=device).manual_seed(0)
    data = [torch.randint(0, vocab, (batch, seq + 1), generator=generator, device=device) for _ in range(4)]

    def step(tokens):
        with _autocast(device):
            logits = forward(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    result = timed_steps(step, data, device, warmup, steps)
    result["tokens_per_s"] = batch * seq / result["step_s"]
    return result


def resnet_bare(
    device: torch.device,
    model_name: str,
    classes: int,
    size: int,
    batch: int,
    compile_backend: str | None,
    warmup: int,
    steps: int,
) -> dict:
    """A bare image-model loop over the lab's `model_name`: bf16 autocast, channels_last, fused SGD with
    Nesterov momentum, label smoothing 0.1, synthetic images on the device."""
    from scaling.models import build_model

    torch.manual_seed(0)
    model = build_model(model_name, classes).to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4, **_fused(device)
    )
    forward = torch.compile(model, backend=compile_backend) if compile_backend else model
    generator = torch.Generator(device=device).manual_seed(0)
    data = [
        (
            torch.randn(batch, 3, size, size, generator=generator, device=device).contiguous(
                memory_format=torch.channels_last
            ),
            torch.randint(0, classes, (batch,), generator=generator, device=device),
        )
        for _ in range(2)
    ]

    def step(item):
        images, labels = item
        with _autocast(device):
            loss = F.cross_entropy(forward(images), labels, label_smoothing=0.1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    result = timed_steps(step, data, device, warmup, steps)
    result["images_per_s"] = batch / result["step_s"]
    return result


# --- the instrument's host cost (issue 45) ---------------------------------------------------


def _ddp_job(device: torch.device, build, compile_backend: str | None, compile_inner: bool):
    """(DDP model, the module the loop calls) on this process's 1-rank group, 25 MB buckets. Compiled: the DDP
    wrapper (as the lab's loop compiles it: dynamo splits the graph at the buckets), or with `compile_inner`
    the module inside an eager DDP (one graph; every bucket's gradients ready at the end of its backward)."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)  # both arms start from the same weights
    module = build().to(device)
    if compile_backend and compile_inner:
        module = torch.compile(module, backend=compile_backend)
    model = DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=25
    )
    forward = torch.compile(model, backend=compile_backend) if compile_backend and not compile_inner else model
    return model, forward


def host_cost_abba(
    device: torch.device,
    build,
    make_batch,
    loss_of,
    run_dir: Path,
    *,
    compile_backend: str | None,
    compile_inner: bool,
    optimizer: str,
    pairs: int,
    steps_per_block: int,
    warmup_blocks: int,
) -> dict:
    """attached / bare per ABBA pair of blocks (module docstring). `build()` makes the model, `make_batch(i)`
    its i-th batch, `loss_of(output, batch)` the loss. Returns the median ratio, the pairs' range, the
    per-arm mean step times and the buckets per step."""
    from scaling.instrument import attach
    from scaling.launch.instrument_parts import lab_parts

    arms = {}
    for arm in ("bare", "attached"):
        model, forward = _ddp_job(device, build, compile_backend, compile_inner)
        if optimizer == "adamw":
            opt = torch.optim.AdamW(model.parameters(), lr=6e-4, **_fused(device))
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, **_fused(device))
        meter = None
        if arm == "attached":  # at its defaults but the A/B calibration (off, as a user's loop without it)
            meter = attach(
                model,
                opt,
                run_dir=run_dir,
                forward_module=forward,
                name=run_dir.name,
                calibration_pairs=0,
                parts=lab_parts(),
            )
        arms[arm] = (model, forward, opt, meter)
    batches = [make_batch(i) for i in range(steps_per_block)]

    def block(arm: str) -> float:
        model, forward, opt, meter = arms[arm]
        _sync(device)
        started = time.perf_counter()
        for batch in meter.batches(batches) if meter is not None else batches:
            with _autocast(device):
                loss = loss_of(forward(batch[0]), batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(device)
        elapsed = time.perf_counter() - started
        if meter is not None:
            meter.end_epoch()  # its records resolved and written, outside the timed block
        return elapsed / steps_per_block

    try:
        for _ in range(warmup_blocks):  # compilation, cuDNN's autotuning, DDP's bucket rebuild, the allocator
            block("bare")
            block("attached")
        times = {"bare": [], "attached": []}
        ratios = []
        for pair in range(pairs):
            order = ("bare", "attached") if pair % 2 == 0 else ("attached", "bare")  # ABBA: drift cancels
            measured = {arm: block(arm) for arm in order}
            for arm, value in measured.items():
                times[arm].append(value)
            ratios.append(measured["attached"] / measured["bare"])
    finally:
        arms["attached"][3].detach()
    from scaling.results import RunDir

    steps = RunDir(run_dir).steps()
    buckets = float(steps["num_buckets"].median()) if len(steps) and "num_buckets" in steps else None
    return {
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
        "pairs": pairs,
        "steps_per_block": steps_per_block,
        "warmup_blocks": warmup_blocks,
        "bare_step_s": statistics.mean(times["bare"]),
        "attached_step_s": statistics.mean(times["attached"]),
        "buckets_per_step": buckets,
    }


# --- a Hugging Face model through attach (issue 46) ------------------------------------------


def hf_gpt2_job(
    device: torch.device, run_dir: Path, *, tiny: bool, batch: int, seq: int, warmup: int, steps: int
) -> dict:
    """GPT2LMHeadModel (GPT-2 small's configuration; `tiny`: 2 layers 64 wide) built from its configuration
    (no download), SDPA attention, bf16 autocast, fused AdamW, called `model(input_ids=..., labels=...).loss`
    as every Hugging Face example calls it, measured by `attach`. Returns the run's summary."""
    from transformers import AutoModelForCausalLM, GPT2Config

    from scaling.instrument import attach
    from scaling.launch.instrument_parts import lab_parts
    from scaling.results import RunDir

    config = (
        GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=seq, bos_token_id=0, eos_token_id=0)
        if tiny
        else GPT2Config(n_positions=max(seq, 1024))
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(device)  # a GPT2LMHeadModel
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, **_fused(device))
    generator = torch.Generator(device=device).manual_seed(0)
    data = [
        torch.randint(0, config.vocab_size, (batch, seq), generator=generator, device=device)
        for _ in range(warmup + steps)
    ]
    with attach(
        model,
        optimizer,
        run_dir=run_dir,
        name="hf-gpt2",
        warmup_steps=warmup,
        calibration_pairs=0,
        telemetry_interval_s=0,
        parts=lab_parts(),
    ) as meter:
        for tokens in meter.batches(data):
            with _autocast(device):
                loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        meter.end_epoch(val_loss=loss.item())
    return RunDir(run_dir).summary()


# --- FSDP2 over gloo, two ranks on one device (for function) ---------------------------------


def fsdp2_gloo_rank(rank: int, world_size: int, port: int, use_cuda: bool, run_dir: str, steps: int) -> None:
    """One rank of a user's FSDP2 job (gpt2-tiny, each block `fully_shard`ed then the root, bf16 policy) over
    gloo, through `attach`; both ranks on cuda:0 when `use_cuda` (gloo moves CUDA tensors through the host:
    for function, not for timing). Started by torch.multiprocessing; raises on failure."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from scaling.instrument import attach
    from scaling.launch.instrument_parts import lab_parts
    from scaling.models import build_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        mesh = init_device_mesh(device.type, (world_size,))
        torch.manual_seed(0)
        model = build_model("gpt2-tiny", 256).to(device)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        generator = torch.Generator(device=device).manual_seed(rank)
        data = [torch.randint(0, 256, (8, 65), generator=generator, device=device) for _ in range(steps)]
        with attach(
            model,
            optimizer,
            run_dir=Path(run_dir),
            name="fsdp2-gloo",
            warmup_steps=2,
            calibration_pairs=0,
            telemetry_interval_s=0,
            parts=lab_parts(),
        ) as meter:
            for tokens in meter.batches(data):
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            meter.end_epoch(val_loss=loss.item())
    finally:
        import gc

        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="a library: scripts/gpu_first_contact.py runs these loops"
    ).parse_args()
