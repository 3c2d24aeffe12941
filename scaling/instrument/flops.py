"""Model FLOPs, an estimate of the bytes a training step moves, device peaks, and MFU.

Definitions (once, here):

- `forward_flops`, `train_flops`: the FLOPs of one sample's forward pass, and of its forward +
  backward (loss = cross-entropy), counted by PyTorch's `torch.utils.flop_counter.FlopCounterMode`
  on a copy of the model in training mode. The input is the first batch's shape and dtype: float
  inputs are random floats; integer inputs are token ids in [0, the smallest nn.Embedding's
  size) (or [0, outputs) for a model with none), so a language model's embedding runs. A model
  whose output is one row of logits per input position (token ids (T,) in, (T, V) out) is a
  language model: its loss is cross-entropy over the vocabulary per token, and a sample is a
  sequence of T tokens (`tokens_per_sample`, `train_flops_per_token` = train_flops / T). The
  model is called as the job calls it: positionally, or by the keyword its input came by
  (`model(input_ids=ids)`, a Hugging Face model); its logits are the output itself or, in a
  structured output (`ModelOutput`, a dict), its `logits` (`output_logits`). A multiply-add counts as 2 FLOPs (ResNet-50
  at 224x224: 8.18 GFLOP forward = the usual 4.09 GMAC). FlopCounterMode counts matmuls and
  convolutions (and attention) only; normalisation, activations, pooling, elementwise adds and
  the loss are not counted (of the order of 1% of a ResNet's arithmetic: they weigh on
  memory traffic, not on FLOPs). The optimizer step is not counted either. Attention
  (`scaled_dot_product_attention`) is counted over the whole T x T score matrix, causal or
  not, as PaLM's 6N + 12·L·H·Q·T per token counts it (tests/test_transformer.py checks a
  GPT-2's count against that formula, tests/test_hf_models.py Hugging Face GPT-2 and Llama
  configurations). `train_flops` is a
  little under 3x `forward_flops`: backward costs 2x forward per layer (gradient w.r.t. the
  input and w.r.t. the weights), except the first layer, whose input (the images) needs no
  gradient.
- achieved FLOP/s per worker = `train_flops` x trained samples per second of that worker.
- MFU (model FLOPs utilisation, PaLM's definition, Chowdhery et al. 2022, appendix B) =
  achieved FLOP/s / peak FLOP/s of the device; computed in scaling/analysis/run_metrics.py
  (`mfu`), which refuses a value above 1: a peak below the achieved rate is no peak. Model FLOPs, not hardware FLOPs:
  work the implementation adds (activation recomputation, padding) is not counted; a model states what its
  implementation adds as `implementation_flops(input_shape)` (a GPT's vocabulary padded to a multiple
  of 64: scaling/models/gpt.py), which the count subtracts.
- `bytes_per_sample` (`training_bytes_per_sample`): an *estimate* of the DRAM traffic of one
  training step, per sample, for unfused ops: each tensor an op touches crosses DRAM once
  (perfect reuse inside the op, none between ops). It leaves things out (below), so it is a
  lower bound on a GPU's traffic; on a CPU whose last-level cache holds a small model's
  activations it can over-count. Two parts:
    activations: A = elements of the outputs of the leaf modules in one sample's forward. Each
      is written in forward and read by its consumer (2 passes), then in backward read again
      (saved for backward), and its gradient written and read (3 passes): 5 A x bytes/element.
      Functional ops inside `forward` (the residual add of a ResNet block, flatten) are not
      leaf modules and are not counted.
    parameters, per step, shared by the batch: P parameters read in forward, read again in
      backward (for the input gradient), gradients written (3 passes), and an optimizer step
      that reads weights, gradients and momentum and writes weights and momentum (5 passes for
      SGD with momentum, the lab's optimizer): 8 P x bytes/element / batch size.
  Communication (DDP's copies into and out of its gradient buckets) and autocast's casts of
  the weights are not counted.
- arithmetic intensity = `train_flops` / `bytes_per_sample` (FLOPs per byte), the x axis of a
  roofline; attainable FLOP/s = min(peak FLOP/s, intensity x memory bandwidth) (the roof the
  report's roofline figure draws: scaling/plots/figures.py).

Peaks: scaling/devices.yaml holds NVIDIA's datasheet numbers for the GPUs the lab runs on (dense,
without 2:4 sparsity; the projection's device table too); `measure_cpu_peak` measures a CPU's (the fastest of several
matmul and convolution kernels in the run's precision and in fp32, and its copy bandwidth), since a CPU's
datasheet peak is neither published uniformly nor reached by torch.
"""

from __future__ import annotations

import copy
import functools
import itertools
import time
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from scaling.devices import load_devices, match_device
from scaling.schema import PEAK_PRECISIONS

# Memory passes over each tensor, as defined in the module docstring.
ACTIVATION_PASSES = 5  # forward write + read, backward read + gradient write + read
PARAMETER_PASSES = 3  # weights read in forward and in backward, gradients written
SGD_MOMENTUM_PASSES = 5  # read weights, gradients, momentum; write weights, momentum

# A batch of 2, not 1: a real (non-meta) BatchNorm in training mode refuses a single value
# per channel. FLOPs and activation sizes are linear in the batch, so dividing is exact.
_COUNT_BATCH = 2


def _leaf_hooks(model: nn.Module) -> tuple[list, list[int], dict[str, bool]]:
    """Forward hooks on every leaf module: adding up their output elements, and recording, per
    leaf name, whether its input needed a gradient (the first layer's, the images, does not)."""
    total = [0]
    input_needs_grad: dict[str, bool] = {}

    def hook(name, _module, inputs, output):
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        total[0] += sum(o.numel() for o in outputs if isinstance(o, torch.Tensor))
        input_needs_grad[name] = bool(inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].requires_grad)

    leaves = [(name, m) for name, m in model.named_modules() if not any(True for _ in m.children())]
    return [m.register_forward_hook(functools.partial(hook, name)) for name, m in leaves], total, input_needs_grad


# Attributes by which a module refers to what runs it, not to its own structure: a LightningModule's
# trainer (`_trainer`, `_fabric`), through which a deep copy would take the strategy with its DDP wrapper,
# the loaders and the callbacks (DDP's unpickling then fails on the module half rebuilt: "'Classifier'
# object has no attribute '_parameters'"). The copy gets None, as the module has before `fit`; its
# forward does not need the trainer. The instrument's own hooks on the module would drag the meter
# (and the DDP model it holds) in the same way: `_watchers`.
_RUNNER_ATTRIBUTES = ("_trainer", "_fabric")


def _watchers(model: nn.Module) -> dict:
    """id -> object, for the objects outside the model whose methods are hooks on its modules: those
    watching it (this instrument's forward hooks, a profiler's), not part of its arithmetic."""
    found = {}
    for module in model.modules():
        for name in _HOOK_DICTS:
            for hook in (module.__dict__.get(name) or {}).values():
                owner = getattr(hook, "__self__", None)
                if owner is not None and not isinstance(owner, nn.Module):
                    found[id(owner)] = owner
    return found


def _detached_memo(model: nn.Module, watchers: dict) -> dict:
    """A deepcopy memo that leaves out (as None) what runs the model (`_RUNNER_ATTRIBUTES`) and shares
    its `watchers` (their hooks are then taken off the copy: `_unwatched`) instead of copying them."""
    memo: dict = dict(watchers)
    for module in model.modules():
        for name in _RUNNER_ATTRIBUTES:
            runner = module.__dict__.get(name)
            if runner is not None and not isinstance(runner, (nn.Module, torch.Tensor)):
                memo[id(runner)] = None
    return memo


def _unwatched(copied: nn.Module, watchers: dict) -> nn.Module:
    """`copied` without the hooks that are methods of `watchers` (the copy counts, nobody watches it)."""
    for module in copied.modules():
        dicts = [module.__dict__.get(name) for name in _HOOK_DICTS]
        gone = {
            key
            for hooks in dicts
            if hooks
            for key, hook in hooks.items()
            if id(getattr(hook, "__self__", None)) in watchers
        }
        for hooks in dicts:
            for key in gone & set(hooks or ()):
                del hooks[key]
    return copied


def _detached_copy(model: nn.Module, memo: dict | None = None) -> nn.Module:
    """A deep copy of `model` (its tensors as `memo` gives them) without what runs or watches it."""
    watchers = _watchers(model)
    return _unwatched(copy.deepcopy(model, {**_detached_memo(model, watchers), **(memo or {})}), watchers)


def _meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` whose parameters and buffers live on the meta device.

    The memo hands deepcopy data-less meta tensors in place of the parameters and buffers,
    so the weights are never copied (ResNet-50's 100 MB would cost most of a second); what
    runs the model or watches it is left out (`_detached_copy`).
    """
    memo: dict = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        meta = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, nn.Parameter):
            meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    try:
        return _detached_copy(model, memo).to("meta")
    except Exception:  # noqa: BLE001 - a module that refuses deepcopy (a sharded one): rebuild its structure
        # plain meta tensors of each parameter's global shape (a sharded parameter's empty_like would stay sharded)
        plain: dict = {}
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            meta = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="meta")
            plain[id(tensor)] = (
                nn.Parameter(meta, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta
            )
        return _meta_replica(model, plain)


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def _meta_replica(module: nn.Module, memo: dict) -> nn.Module:
    """The module tree of `module` rebuilt without copying it: each module a new instance of its class
    (made without calling its constructor) sharing its plain attributes, with the meta tensors of
    `memo` for its parameters and buffers, its children replicated, and no hooks.

    For a module that refuses deepcopy: FSDP2's `fully_shard` does, and its per-module hooks
    (which all-gather and reshard) are what the replica leaves out. A sharded parameter's meta
    stand-in has the parameter's global shape (a DTensor's `shape`), so the replica computes as
    the unsharded model does, which is what a rank computes between its all-gathers.
    """
    replica = object.__new__(type(module))  # not type(module)(...): a wrapper class's __new__ may rebuild it
    attributes = dict(module.__dict__)
    attributes["_parameters"] = {name: memo.get(id(p), p) for name, p in module._parameters.items()}
    attributes["_buffers"] = {name: memo.get(id(b), b) for name, b in module._buffers.items()}
    children = {}
    for name, child in module._modules.items():
        if child is not None and id(child) not in memo:  # a module used twice is replicated once
            memo[id(child)] = _meta_replica(child, memo)
        children[name] = None if child is None else memo[id(child)]
    attributes["_modules"] = children
    for hooks in _HOOK_DICTS:
        if hooks in attributes:
            attributes[hooks] = type(attributes[hooks])()
    replica.__dict__.update(attributes)
    return replica


def is_token_input(dtype: torch.dtype) -> bool:
    """Whether a model input of `dtype` holds ids (integers) rather than values (floats)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _id_range(model: nn.Module, num_classes: int) -> int:
    """Ids valid for every embedding table of `model`: its values do not change the FLOPs, only
    whether a lookup (run for real when meta fails) is in range."""
    sizes = [m.num_embeddings for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    return max(1, min(sizes or [num_classes]))


def _sample_input(
    model: nn.Module, device: str, input_shape: tuple, num_classes: int, dtype: torch.dtype
) -> torch.Tensor:
    if is_token_input(dtype):
        ids = torch.randint(0, _id_range(model, num_classes), (_COUNT_BATCH, *input_shape), device=device)
        return ids.to(dtype)
    return torch.randn(_COUNT_BATCH, *input_shape, device=device)


def output_logits(output) -> torch.Tensor | None:
    """The model's logits in its output: the output itself (a tensor), a structured output's
    `logits` (a Hugging Face `ModelOutput` or any dict), else its first tensor of at least one
    dimension (a scalar loss, as `ModelOutput.loss` comes first when labels were given, is skipped)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        logits = output.get("logits")
        if isinstance(logits, torch.Tensor):
            return logits
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        for item in output:
            found = output_logits(item)
            if found is not None and found.dim() >= 1:
                return found
    return None


def _loss(output, inputs: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Cross-entropy: per token over the vocabulary for a language model's logits (one row per
    input position: token ids (B, T) in, (B, T, V) out), else per sample over the classes."""
    outputs = output_logits(output)
    if outputs is None:
        raise ValueError(f"no logits in the model's output ({type(output).__name__})")
    device = outputs.device
    if is_token_input(inputs.dtype) and outputs.dim() == inputs.dim() + 1 and outputs.shape[:-1] == inputs.shape:
        targets = torch.randint(0, outputs.shape[-1], inputs.shape, device=device)
        return F.cross_entropy(outputs.flatten(0, -2), targets.flatten())
    return F.cross_entropy(outputs, torch.randint(0, num_classes, (_COUNT_BATCH,), device=device))


def _count(
    model: nn.Module,
    device: str,
    input_shape: tuple,
    num_classes: int,
    per_module: bool = False,
    input_dtype: torch.dtype = torch.float32,
    input_keyword: str | None = None,
) -> dict:
    model.train()  # a training step: BatchNorm uses batch statistics, as in training
    inputs = _sample_input(model, device, input_shape, num_classes, input_dtype)
    handles, activations, input_needs_grad = _leaf_hooks(model)
    try:
        with FlopCounterMode(display=False) as forward_counter:
            output = model(**{input_keyword: inputs}) if input_keyword else model(inputs)
            loss = _loss(output, inputs, num_classes)
    finally:
        for h in handles:
            h.remove()
    with FlopCounterMode(display=False) as backward_counter:
        loss.backward()
    forward = forward_counter.get_total_flops() / _COUNT_BATCH
    backward = backward_counter.get_total_flops() / _COUNT_BATCH
    counts = {
        "forward_flops": forward,
        "train_flops": forward + backward,
        "backward_flops": backward,
        "train_to_forward": (forward + backward) / forward if forward else None,
        "activation_elements": activations[0] / _COUNT_BATCH,
        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    if is_token_input(input_dtype) and len(input_shape) == 1:  # a sequence of token ids: per token too
        counts["tokens_per_sample"] = int(input_shape[0])
        counts["train_flops_per_token"] = counts["train_flops"] / int(input_shape[0])
    if per_module:
        # FlopCounterMode names a module by its path under the model's class name ("ResNet.layer1.0.conv1")
        prefix = type(model).__name__ + "."
        counts["module_forward_flops"] = {
            name[len(prefix) :]: sum(ops.values()) / _COUNT_BATCH
            for name, ops in forward_counter.get_flop_counts().items()
            if name.startswith(prefix)
        }
        counts["module_input_needs_grad"] = input_needs_grad
    return counts


def training_flops_per_sample(
    model: nn.Module,
    input_shape: tuple,
    num_classes: int,
    per_module: bool = False,
    input_dtype: torch.dtype = torch.float32,
    input_keyword: str | None = None,
) -> dict:
    """Forward and training-step FLOPs of one sample, counted on a copy of `model`.

    `input_shape` is one sample's, (channels, height, width) for images, (T,) for a sequence of
    token ids; `input_dtype` the input's (an integer dtype: token ids, module docstring);
    `input_keyword` the keyword the job passes it by (`input_ids` for a Hugging Face model,
    `model(input_ids=...)`), None: positionally; the output may be a tensor of logits or a
    structured output holding them (`output_logits`). `num_classes` the model's output width.
    `model` is the plain module (not a DDP
    wrapper) and is left untouched: the counting runs on a deep copy moved to the meta device,
    where tensors have shapes but no data, so even ResNet-50 costs no arithmetic. If the meta
    device fails (an op without a meta kernel), it counts on a CPU copy with a real batch.

    Returns {"forward_flops", "train_flops", "backward_flops", "train_to_forward",
    "activation_elements" (per sample), "parameters" (trainable), "method": "FlopCounterMode",
    "counted_on": "meta" or "cpu (...why meta failed)"}, and for a sequence of token ids
    "tokens_per_sample" and "train_flops_per_token"; `per_module` adds, per leaf module by
    name, "module_forward_flops" (per sample) and "module_input_needs_grad" (the projection's layer
    tables: scaling/projection/make_layer_tables.py).
    """
    try:
        counts = _count(_meta_copy(model), "meta", input_shape, num_classes, per_module, input_dtype, input_keyword)
        counts["counted_on"] = "meta"
    except Exception as meta_error:  # noqa: BLE001 - any failure on meta: count for real
        counts = _count(
            _detached_copy(model).to("cpu"), "cpu", input_shape, num_classes, per_module, input_dtype, input_keyword
        )
        counts["counted_on"] = f"cpu (meta device failed: {type(meta_error).__name__}: {meta_error})"
    counts["method"] = "FlopCounterMode"
    return _model_flops_only(counts, model, input_shape)


def _model_flops_only(counts: dict, model: nn.Module, input_shape: tuple) -> dict:
    """`counts` less the FLOPs a model declares its implementation adds (`model.implementation_flops(input_shape)`:
    {"forward_flops", "backward_flops"} per sample; a GPT's padded vocabulary, scaling/models/gpt.py): MFU is on
    model FLOPs (module docstring). What was subtracted is kept as `implementation_flops_excluded`."""
    declared = getattr(model, "implementation_flops", None)
    if not callable(declared):
        return counts
    extra = declared(input_shape)
    counts["forward_flops"] -= extra["forward_flops"]
    counts["backward_flops"] -= extra["backward_flops"]
    counts["train_flops"] = counts["forward_flops"] + counts["backward_flops"]
    counts["train_to_forward"] = counts["train_flops"] / counts["forward_flops"] if counts["forward_flops"] else None
    if "tokens_per_sample" in counts:
        counts["train_flops_per_token"] = counts["train_flops"] / counts["tokens_per_sample"]
    counts["implementation_flops_excluded"] = extra["forward_flops"] + extra["backward_flops"]
    return counts


def training_bytes_per_sample(
    counts: dict,
    batch_size: int,
    bytes_per_element: int = 4,
    param_bytes_per_element: int = 4,
    optimizer_passes: int = SGD_MOMENTUM_PASSES,
) -> dict:
    """Estimated DRAM bytes per trained sample and the arithmetic intensity (module docstring).

    `counts` is `training_flops_per_sample`'s result. `bytes_per_element` is the activations'
    (4 for fp32, 2 under fp16/bf16 autocast); `param_bytes_per_element` the weights',
    gradients' and optimizer state's (4: fp32 master weights, also under autocast).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    activation_bytes = ACTIVATION_PASSES * counts["activation_elements"] * bytes_per_element
    param_bytes_per_step = (PARAMETER_PASSES + optimizer_passes) * counts["parameters"] * param_bytes_per_element
    bytes_per_sample = activation_bytes + param_bytes_per_step / batch_size
    return {
        "batch_size": batch_size,
        "bytes_per_element": bytes_per_element,
        "activation_bytes_per_sample": activation_bytes,
        "param_bytes_per_step": param_bytes_per_step,
        "bytes_per_sample": bytes_per_sample,
        "arithmetic_intensity": counts["train_flops"] / bytes_per_sample,
        "method": "estimate: unfused ops, each tensor an op touches crosses DRAM once",
    }


# --- device peaks ---------------------------------------------------------------------------


def _tf32_note() -> str:
    # torch's defaults: matmuls in fp32 (allow_tf32 False), but cuDNN convolutions in TF32
    # (cudnn.allow_tf32 True). A conv net "in fp32" on Ampere or newer thus runs nearly all
    # its FLOPs on TF32 tensor cores, whose peak is then the one to compare with.
    matmul = torch.backends.cuda.matmul.allow_tf32
    conv = torch.backends.cudnn.allow_tf32
    return (
        f"fp32 CUDA-core peak; this torch runs fp32 matmuls in {'TF32' if matmul else 'fp32'} "
        f"and cuDNN convolutions in {'TF32' if conv else 'fp32'}"
        + ("; for a model whose FLOPs are mostly TF32 ops pass precision='tf32'" if matmul or conv else "")
    )


def device_peak(device_name: str, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s, note) for a GPU by name and precision, or (None, why not).

    `precision`: fp32 (the CUDA-core peak), tf32, bf16 or fp16 (tensor cores). Never guesses:
    a device or precision without a datasheet peak in scaling/devices.yaml gives None.
    """
    precision = precision.lower()
    if precision not in PEAK_PRECISIONS:
        return None, f"unknown precision {precision!r}; valid: {', '.join(PEAK_PRECISIONS)}"
    devices = load_devices()
    key = match_device(device_name)
    peaks = (devices[key].get("peak_tflops_per_s") or {}) if key is not None else {}
    if not peaks:
        known = ", ".join(k for k, spec in devices.items() if spec.get("peak_tflops_per_s"))
        return None, f"no datasheet peak for {device_name!r} (known: {known}); MFU not computed"
    if peaks.get(precision) is None:
        return None, f"{key} has no {precision} tensor cores; MFU not computed"
    peak = peaks[precision] * 1e12
    if precision == "fp32" and peaks.get("tf32") is not None:
        return peak, f"{key} {_tf32_note()}"
    return peak, f"{key} {precision} dense datasheet peak"


def device_mem_bandwidth(device_name: str) -> tuple[float | None, str]:
    """(datasheet memory bandwidth in bytes/s, note) for a GPU by name, or (None, why not)."""
    key = match_device(device_name)
    if key is None:
        return None, f"no datasheet bandwidth for {device_name!r}"
    return load_devices()[key]["memory_bandwidth_GBps"] * 1e9, f"{key} datasheet memory bandwidth"


# --- CPU peak, measured ---------------------------------------------------------------------

_MATMUL_N = 1024  # 2.1 GFLOP per matmul: long enough to time, short enough to repeat
# A 3x3 convolution of 64 channels on 56x56 maps (a ResNet stage-1 layer) at batch 8: 0.93 GFLOP.
_CONV_SHAPE = (8, 64, 56, 56)

# Precisions at least as exact as each run precision: a kernel in any of them can carry the
# run's arithmetic, so the fastest of them bounds what the hardware can do for it.
_AT_LEAST_AS_EXACT = {
    torch.float32: (torch.float32,),
    torch.bfloat16: (torch.bfloat16, torch.float32),
    torch.float16: (torch.float16, torch.float32),
}


def _l3_bytes() -> int | None:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()  # e.g. "107520K"
    except OSError:
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _best_rate(work, amount: float, budget_s: float, per_round: int, min_rounds: int = 2) -> float:
    """Best `amount` per second over rounds of `per_round` calls to `work`, within `budget_s`.

    A kernel whose warm-up call alone outlasts the budget (bf16 emulated on a CPU without it:
    seconds a call) is rated by that call: it is far below the fastest kernel, which the roof
    takes, and more calls would only cost time (they cost a worker tens of seconds)."""
    began = time.perf_counter()
    work()  # warm-up: first-touch page faults, thread pool start-up, kernel selection
    warm_up_s = time.perf_counter() - began
    if warm_up_s > budget_s:
        return amount / warm_up_s
    best, rounds = 0.0, 0
    deadline = time.perf_counter() + budget_s
    while rounds < min_rounds or time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(per_round):
            work()
        best = max(best, per_round * amount / (time.perf_counter() - start))
        rounds += 1
    return best


def _kernel_rates(dtype: torch.dtype, budget_s: float) -> dict[str, float]:
    """FLOP/s of a large matmul and of a ResNet-like convolution in `dtype` (best round each)."""
    a = torch.randn(_MATMUL_N, _MATMUL_N).to(dtype)
    b = torch.randn(_MATMUL_N, _MATMUL_N).to(dtype)
    out = torch.empty(_MATMUL_N, _MATMUL_N, dtype=dtype)
    name = str(dtype).removeprefix("torch.")
    rates = {f"{name} matmul": _best_rate(lambda: torch.mm(a, b, out=out), 2 * _MATMUL_N**3, budget_s / 2, per_round=2)}
    n, c, h, w = _CONV_SHAPE
    x = torch.randn(*_CONV_SHAPE).to(dtype)
    weight = torch.randn(c, c, 3, 3).to(dtype)
    conv_flops = 2 * n * c * c * 9 * h * w
    with torch.no_grad():
        rates[f"{name} conv3x3"] = _best_rate(
            lambda: F.conv2d(x, weight, padding=1), conv_flops, budget_s / 2, per_round=1
        )
    return rates


@functools.lru_cache(maxsize=None)  # a CPU's roofs do not change within a process: measured once per precision
def measure_cpu_peak(threads: int, seconds: float = 0.5, dtype: torch.dtype = torch.float32) -> dict:
    """Measure this CPU's compute roof for `dtype` and its copy bandwidth with `threads` torch threads.

    The compute roof is the fastest of several measured kernels: a 1024x1024 matmul and a
    ResNet-like 3x3 convolution, each in `dtype` and in every precision at least as exact
    (fp32 for bf16/fp16 runs). Why several: one kernel can be far from what the machine does
    for a run. A CPU without native bf16 emulates bf16 matmuls (0.9 GFLOP/s seen on an AMD
    EPYC, against 72 in fp32) while its convolutions reach 3 GFLOP/s, so a bf16-matmul "peak"
    gave an MFU of 3.2. The hardware can always carry bf16 arithmetic at its fp32 rate, so the
    fastest of these bounds the run's rate from above in practice; `run_metrics.mfu` still
    refuses an MFU where the achieved rate exceeds the measured roof.

    The memory roof is the copy bandwidth (bytes read + written by copying a tensor several
    times the size of the last-level cache). Both are what this process's threads get with the
    rest of the machine idle: workers sharing a socket will contend for memory bandwidth in a
    real run. Takes about `seconds` per precision plus set-up. torch's thread count is restored.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernels: dict[str, float] = {}
        precisions = _AT_LEAST_AS_EXACT[dtype]
        for each in precisions:
            kernels.update(_kernel_rates(each, seconds / len(precisions)))
        best_kernel = max(kernels, key=kernels.get)

        # Source and destination together 4x the L3, so the copy streams from and to DRAM.
        l3 = _l3_bytes()
        nbytes = min(max(2 * l3 if l3 else 128 << 20, 64 << 20), 512 << 20)
        source = torch.ones(nbytes // 4)
        copy = functools.partial(torch.empty_like(source).copy_, source)  # holds both tensors
        del source
        bandwidth = _best_rate(copy, 2 * nbytes, seconds / 2, per_round=1)
        del copy  # up to 1 GiB, freed before the function returns
    finally:
        torch.set_num_threads(previous)
    rates = ", ".join(f"{name} {rate / 1e9:.3g}" for name, rate in kernels.items())
    return {
        "peak_flops": kernels[best_kernel],
        "kernel_flops_per_s": kernels,
        "mem_bytes_per_s": bandwidth,
        "threads": threads,
        "method": f"measured: fastest of {len(kernels)} kernels ({rates} GFLOP/s; best {best_kernel}); "
        f"copy of {nbytes >> 20} MiB, bytes read + written per second",
    }


def device_roofs(device: torch.device, precision: str, threads: int, measure: bool = True) -> dict:
    """The compute and memory roofs a run's MFU and roofline are taken against.

    GPU: the datasheet peak for the run's precision. An "fp32" run on a GPU with TF32 tensor
    cores is taken against the TF32 peak when cuDNN may use TF32 (`torch.backends.cudnn.
    allow_tf32`, True by default), because a convolutional network's FLOPs are then TF32
    convolutions: the fp32 peak would make its MFU look several times too high.
    CPU: the measured compute roof for the run's precision (`measure_cpu_peak`: the fastest of
    several kernels in that precision and in fp32) and copy bandwidth of `threads` threads
    (only where `measure`: one rank measures, the others would disturb it; they report None).
    """
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        key = precision
        if precision == "fp32" and torch.backends.cudnn.allow_tf32 and device_peak(name, "tf32")[0] is not None:
            key = "tf32"
        peak, note = device_peak(name, key)
        bandwidth, _ = device_mem_bandwidth(name)
        return {
            "device_name": name,
            "peak_flops_per_s": peak,
            "peak_precision": key,
            "peak_source": note,
            "mem_bytes_per_s": bandwidth,
        }
    if not measure:
        return {
            "device_name": "cpu",
            "peak_flops_per_s": None,
            "peak_precision": precision,
            "peak_source": "not measured on this rank",
            "mem_bytes_per_s": None,
        }
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    measured = measure_cpu_peak(threads, dtype=dtype)
    return {
        "device_name": "cpu",
        "peak_flops_per_s": measured["peak_flops"],
        "peak_precision": precision,
        "peak_source": f"{measured['method']} ({threads} thread{'s' if threads > 1 else ''})",
        "mem_bytes_per_s": measured["mem_bytes_per_s"],
    }
