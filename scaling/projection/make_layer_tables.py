"""Generate the layer tables in scaling/projection/layers/ (one-off; needs torch).

    .venv/bin/python -m scaling.projection.make_layer_tables            # all models below
    .venv/bin/python -m scaling.projection.make_layer_tables resnet50

The projection package itself never imports torch: it reads the JSON files this script
writes. Nothing in `scaling.projection` imports this module.

For each model (`scaling.models.build_model(name, num_classes)`) the table holds, for every
leaf module that owns parameters, in the order backward makes their gradients ready:

- `forward_flops`: its FLOPs for one sample at the canonical input size, counted as the
  instrument counts a run's (`scaling.instrument.flops.training_flops_per_sample`:
  `torch.utils.flop_counter.FlopCounterMode`, multiply-add = 2 FLOPs, on a meta-device copy in
  training mode);
- `backward_flops`: 2 x forward (gradient w.r.t. the input and w.r.t. the weights) for a
  module whose input requires a gradient, 1 x forward for the first layer (the images need
  no gradient). The script checks that these add up to the backward FLOPs FlopCounterMode
  counts for the whole model (FlopCounterMode does not attribute backward FLOPs to modules);
- `params`: its parameter tensors, [name, elements], in gradient-ready order.

The gradient-ready order is *measured*: a one-rank gloo DDP on CPU (an in-process store: no
port) runs three steps, DDP
rebuilds its buckets in the order the gradients arrived, and `_get_ddp_logging_data()`
reports that order (`rebuilt_per_bucket_param_indices`) and the rebuilt bucket sizes
(`rebuilt_bucket_sizes`, stored as `ddp_bucket_bytes`, and as `ddp_bucket_bytes_cap_25` for
`bucket_cap_mb=25` given explicitly, as the lab does, which drops the 1 MiB first bucket) for
the tests to hold the pure-Python bucketing to. Gradient order does not depend on the input size, so the DDP probe runs
at a small input (`probe_size`) to be quick on a CPU.

Transformers (`TRANSFORMERS`: gpt2-tiny, gpt2-small, gpt2-medium from the registry; llama3-8b from
scaling/projection/llama.py, meta device only) get, besides `layers`, a list of FSDP `units` in
forward order, as torchtitan and the lab shard them (`fully_shard` on every block, then on the
root, which holds the embeddings, the final norm and the output head):

- `params`: the unit's parameter elements;
- `forward_flops`, `backward_flops`: per token, at the table's `seq_len` (FlopCounterMode, as
  above; backward = 2 x forward, every matmul's input needs a gradient);
- `activation_bytes_per_token`: what the unit's forward leaves saved for backward, per token, in
  bf16 compute (FSDP2's MixedPrecisionPolicy(param_dtype=bf16), as torchtitan trains), counted
  on the meta device with `saved_tensors_hooks`, one count per storage, the parameters left out:
  - `none`: no activation checkpointing;
  - `selective`: torchtitan's per-op selective checkpointing (`_apply_ac_to_transformer_block`,
    "op" mode): a block keeps its input and the outputs of every other matmul (the 1st, 3rd, ...:
    aten.mm; a bias's addmm counted as an mm), of attention and of max, and recomputes the rest;
  - `full`: the block's input only (`checkpoint` of the whole block).
  The root is never checkpointed: its figure is the same in the three. `recompute_flops` (per
  token) is what backward computes again: the whole block's forward under `full`, its forward
  less the kept matmuls and attention under `selective`. Attention is counted as
  the flash kernel a GPU runs saves it (q, k, v, the output and one fp32 log-sum-exp per row):
  on the meta device `scaled_dot_product_attention` takes the math path, which would save the
  whole T x T score matrix.

Leaf layers of a transformer are in reverse forward order (the order backward reaches them), an
estimate: DDP is not probed (llama3-8b exists only on the meta device), so these tables have no
`ddp_bucket_bytes`. A tied matrix (GPT-2's head and token embedding) counts once, at its
embedding, whose gradient is complete last. Each table also holds
`formula_flops_per_token`, torchtitan's `6 (N - embedding) + 12 L H Q T` (torchtitan
`get_nparams_and_flops`, PaLM appendix B; for GPT-2's tied head only the position table does no
matmul, as nanoGPT's `estimate_mfu` counts it), which tests/test_projection.py holds the counted
FLOPs to.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from scaling.instrument.flops import training_flops_per_sample
from scaling.models import build_model

OUT_DIR = Path(__file__).resolve().parent / "layers"

# name -> (num_classes, canonical input side, probe side, dataset, training samples per epoch)
MODELS = {
    "resnet50": (1000, 224, 64, "imagenet", 1_281_167),
    "resnet18": (1000, 224, 64, "imagenet", 1_281_167),
    "resnet101": (1000, 224, 64, "imagenet", 1_281_167),
    "vgg16": (1000, 224, 32, "imagenet", 1_281_167),
    "resnet20": (10, 32, 32, "cifar10", 50_000),
    "resnet56": (10, 32, 32, "cifar10", 50_000),
    "small_cnn": (10, 32, 32, "cifar10", 50_000),
}
# name -> (where the model comes from, vocabulary, sequence length). Sequence lengths: GPT-2's context;
# torchtitan's llama3_8b.toml (8,192); gpt2-tiny at experiments/gpt2-tiny.yaml's vocabulary and sequence,
# so that the report can project the lab's own FSDP sweeps of it.
TRANSFORMERS = {
    "gpt2-tiny": ("registry", 256, 64),
    "gpt2-small": ("registry", 50257, 1024),
    "gpt2-medium": ("registry", 50257, 1024),
    "llama3-8b": ("llama", 128256, 8192),
}
_BATCH = 2  # the DDP probe's batch: BatchNorm in training mode needs more than one value per channel


def _leaves_with_params(model: nn.Module) -> dict[str, nn.Module]:
    return {
        name: m
        for name, m in model.named_modules()
        if not any(True for _ in m.children()) and any(True for _ in m.parameters(recurse=False))
    }


def _ddp_ready_order(model: nn.Module, side: int, num_classes: int, **ddp_kwargs) -> tuple[list[int], list[int]]:
    """Parameter indices in the order DDP saw their gradients become ready; rebuilt bucket bytes."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model, **ddp_kwargs)
        for _ in range(3):
            images = torch.randn(_BATCH, 3, side, side)
            labels = torch.randint(0, num_classes, (_BATCH,))
            F.cross_entropy(ddp(images), labels).backward()
        data = ddp._get_ddp_logging_data()
    finally:
        dist.destroy_process_group()
    order = [int(i) for bucket in data["rebuilt_per_bucket_param_indices"].split(",") for i in bucket.split()]
    sizes = [int(s) for s in data["rebuilt_bucket_sizes"].split(",")]
    return order, sizes


def make_table(name: str) -> dict:
    num_classes, side, probe_side, dataset, dataset_size = MODELS[name]
    torch.manual_seed(0)
    model = build_model(name, num_classes)
    params = list(model.named_parameters())
    owner = {}  # parameter name -> leaf module name
    for mod_name, module in _leaves_with_params(model).items():
        for p_name, _ in module.named_parameters(recurse=False):
            owner[f"{mod_name}.{p_name}" if mod_name else p_name] = mod_name
    order, ddp_sizes = _ddp_ready_order(model, probe_side, num_classes)
    # the lab passes bucket_cap_mb explicitly (instrument.ddp_bucket_cap_mb), which drops DDP's 1 MiB first bucket
    order_25, ddp_sizes_25 = _ddp_ready_order(model, probe_side, num_classes, bucket_cap_mb=25.0)
    assert order_25 == order, f"{name}: gradient order differs between the two DDP probes"
    assert sorted(order) == list(range(len(params))), "DDP's order must hold every parameter once"

    counts = training_flops_per_sample(build_model(name, num_classes), (3, side, side), num_classes, per_module=True)
    flops, needs_grad = counts["module_forward_flops"], counts["module_input_needs_grad"]
    fwd_total, bwd_total = counts["forward_flops"], counts["backward_flops"]
    leaves = _leaves_with_params(model)
    parameterless = [
        k
        for k, v in flops.items()
        if v and k not in leaves and not any(k2.startswith(k + ".") for k2 in flops if k2 != k)
    ]
    assert not parameterless, f"{name}: FLOPs in modules without parameters, not placed in backward: {parameterless}"

    layers: list[dict] = []
    index_of: dict[str, int] = {}
    for i in order:
        p_name, p = params[i]
        mod = owner[p_name]
        if mod not in index_of:
            fwd = float(flops.get(mod, 0.0))
            index_of[mod] = len(layers)
            layers.append(
                {
                    "name": mod,
                    "forward_flops": fwd,
                    "backward_flops": fwd * (2.0 if needs_grad.get(mod, True) else 1.0),
                    "params": [],
                }
            )
        layers[index_of[mod]]["params"].append([p_name[len(mod) + 1 :] if mod else p_name, p.numel()])
    # a module's parameters must be contiguous in the ready order, or "layer" is ill-defined
    seen = [owner[params[i][0]] for i in order]
    runs = [m for j, m in enumerate(seen) if j == 0 or seen[j - 1] != m]
    assert len(runs) == len(set(runs)), f"{name}: a module's gradients are not contiguous in DDP's order"

    total_params = sum(p.numel() for _, p in params)
    fwd_sum = sum(layer["forward_flops"] for layer in layers)
    bwd_sum = sum(layer["backward_flops"] for layer in layers)
    assert abs(fwd_sum - fwd_total) <= 1e-6 * fwd_total, (name, fwd_sum, fwd_total)
    assert abs(bwd_sum - bwd_total) <= 1e-6 * bwd_total, (name, bwd_sum, bwd_total)
    assert sum(ddp_sizes) == 4 * total_params
    return {
        "model": name,
        "num_classes": num_classes,
        "input_shape": [3, side, side],
        "dataset": dataset,
        "dataset_size": dataset_size,
        "parameters": total_params,
        "forward_flops_per_sample": fwd_total,
        "backward_flops_per_sample": bwd_total,
        "ddp_bucket_bytes": ddp_sizes,
        "ddp_bucket_bytes_cap_25": ddp_sizes_25,
        "generated_by": (
            f"python -m scaling.projection.make_layer_tables {name} "
            f"(torch {torch.__version__}); layers in DDP's measured gradient-ready order"
        ),
        "layers": layers,
    }


def _build_transformer(name: str) -> nn.Module:
    """The model with its parameters on the meta device (shapes only)."""
    kind, vocab, _ = TRANSFORMERS[name]
    with torch.device("meta"):
        if kind == "llama":
            from scaling.projection.llama import llama3_8b

            return llama3_8b(vocab)
        return build_model(name, vocab)


def _blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The name and list of the model's transformer blocks (GPT: blocks, Llama: layers)."""
    for attr in ("blocks", "layers"):
        if isinstance(getattr(model, attr, None), nn.ModuleList):
            return attr, getattr(model, attr)
    raise ValueError(f"{type(model).__name__} has no list of blocks")


def shape_of(model: nn.Module) -> dict:
    """Layers, heads, head dimension, width and the embedding tables that do no matmul."""
    shape = model.shape
    width = getattr(shape, "width")
    tied = getattr(getattr(model, "head", None), "weight", None) is getattr(getattr(model, "tokens", None), "weight", 0)
    # embeddings whose table is only looked up: torchtitan's nparams_embedding (for a tied head,
    # the token table is the head's matmul, so only the positions are left, as nanoGPT)
    lookups = [n for n, m in model.named_children() if isinstance(m, nn.Embedding) and not (tied and n == "tokens")]
    return {
        "layers": shape.layers,
        "heads": shape.heads,
        "head_dim": width // shape.heads,
        "width": width,
        "kv_heads": getattr(shape, "kv_heads", shape.heads),
        "tied_head": bool(tied),
        "lookup_embeddings": lookups,
        "lookup_embedding_params": sum(getattr(model, n).weight.numel() for n in lookups),
    }


def formula_flops_per_token(shape: dict, parameters: int, seq_len: int) -> float:
    """torchtitan's get_nparams_and_flops: 6 (N - embedding) + 12 L H Q T (module docstring)."""
    return (
        6 * (parameters - shape["lookup_embedding_params"])
        + 12 * shape["layers"] * shape["heads"] * shape["head_dim"] * seq_len
    )


class _FlashAttention(torch.autograd.Function):
    """What a flash-attention kernel saves for backward: q, k, v, the output, an fp32 log-sum-exp per row."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        _SAC_RECORD.append(out.nbytes + lse.nbytes)  # attention's outputs: kept by torchtitan's selective policy
        batch, heads, length, dim = q.shape
        _SAC_FLOPS.append(2.0 * 2.0 * batch * heads * length * length * dim)
        return out

    @staticmethod
    def backward(ctx, grad):  # never run: the tables need forward's saved tensors only
        raise NotImplementedError


_SAC_RECORD: list[int] = []
_SAC_FLOPS: list[float] = []


def _flash_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _FlashAttention.apply(q, k, v)


def saved_activations(model: nn.Module, seq_len: int) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Per FSDP unit ("root" and each block), bytes per token saved for backward (none / selective /
    full), and the forward FLOPs per token the selective policy keeps (backward recomputes the rest)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    block_attr, blocks = _blocks(model)
    model = model.to(torch.bfloat16)
    unit = ["root"]
    saved: dict[str, dict[int, int]] = {}
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    kept: list[torch.Tensor] = []  # hold every saved tensor, so no storage address is reused

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in params:
            saved.setdefault(unit[0], {})[key] = t.untyped_storage().nbytes()
            kept.append(t)
        return t

    selective: dict[str, int] = {}
    kept_flops: dict[str, float] = {}  # FLOPs of the ops the selective policy keeps (not recomputed)
    block_input: dict[str, int] = {}
    mm_count = [0]

    class SelectivePolicy(TorchDispatchMode):
        """torchtitan's op policy: every other matmul's output (the 1st, 3rd, ...) and max are kept."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if unit[0] != "root" and func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                mm_count[0] += 1
                if mm_count[0] % 2 == 1:
                    selective[unit[0]] = selective.get(unit[0], 0) + out.nbytes
                    a, b = args[-2], args[-1]
                    kept_flops[unit[0]] = kept_flops.get(unit[0], 0.0) + 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
            elif unit[0] != "root" and func is torch.ops.aten.max.default:
                selective[unit[0]] = selective.get(unit[0], 0) + out.nbytes
            return out

    def enter(name, _module, args):
        unit[0] = name
        mm_count[0] = 0
        _SAC_RECORD.clear()
        _SAC_FLOPS.clear()
        block_input[name] = args[0].nbytes

    def leave(name, _module, _args, _output):
        selective[name] = selective.get(name, 0) + sum(_SAC_RECORD)
        # attention is kept too: its forward FLOPs (2 matmuls of T x T x head_dim per head, causal or not)
        kept_flops[name] = kept_flops.get(name, 0.0) + sum(_SAC_FLOPS)
        unit[0] = "root"

    handles = []
    for i, block in enumerate(blocks):
        name = f"{block_attr}.{i}"
        handles.append(block.register_forward_pre_hook(functools.partial(enter, name)))
        handles.append(block.register_forward_hook(functools.partial(leave, name)))
    real_sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _flash_sdpa
    try:
        ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), SelectivePolicy():
            logits = model(ids)
            # torchtitan's loss: cross-entropy over fp32 logits
            F.cross_entropy(logits.flatten(0, 1).float(), torch.zeros(seq_len, dtype=torch.long, device="meta"))
    finally:
        F.scaled_dot_product_attention = real_sdpa
        for h in handles:
            h.remove()
    out = {}
    for name in ["root", *(f"{block_attr}.{i}" for i in range(len(blocks)))]:
        none = sum(saved.get(name, {}).values()) / seq_len
        if name == "root":
            out[name] = {"none": none, "selective": none, "full": none}
        else:
            out[name] = {
                "none": none,
                "selective": (block_input[name] + selective.get(name, 0)) / seq_len,
                "full": block_input[name] / seq_len,
            }
    return out, {name: flops / seq_len for name, flops in kept_flops.items()}


def make_transformer_table(name: str) -> dict:
    _, vocab, seq_len = TRANSFORMERS[name]
    model = _build_transformer(name)
    shape = shape_of(model)
    block_attr, blocks = _blocks(model)
    total_params = sum(p.numel() for p in model.parameters())
    counts = training_flops_per_sample(model, (seq_len,), vocab, per_module=True, input_dtype=torch.int64)
    flops, fwd_total, bwd_total = counts["module_forward_flops"], counts["forward_flops"], counts["backward_flops"]
    assert counts["backward_flops"] == fwd_total * 2 or abs(bwd_total - 2 * fwd_total) <= 1e-6 * bwd_total, name
    activations, kept = saved_activations(_build_transformer(name), seq_len)

    units = []
    block_names = [f"{block_attr}.{i}" for i in range(len(blocks))]
    block_flops = [float(flops.get(b, 0.0)) for b in block_names]
    root_params = total_params - sum(p.numel() for p in blocks.parameters())
    root_flops = fwd_total - sum(block_flops)
    units.append(
        {
            "name": "root",
            "params": root_params,
            "forward_flops": root_flops / seq_len,
            "backward_flops": 2 * root_flops / seq_len,
            "activation_bytes_per_token": activations["root"],
            "recompute_flops": {"none": 0.0, "selective": 0.0, "full": 0.0},
            "holds": [n for n, _ in model.named_children() if n != block_attr],
        }
    )
    for b, block, f in zip(block_names, blocks, block_flops):
        per_token = f / seq_len
        units.append(
            {
                "name": b,
                "params": sum(p.numel() for p in block.parameters()),
                "forward_flops": per_token,
                "backward_flops": 2 * per_token,
                "activation_bytes_per_token": activations[b],
                "recompute_flops": {"none": 0.0, "selective": max(0.0, per_token - kept[b]), "full": per_token},
            }
        )

    # leaf modules with parameters in reverse forward order; a tied matrix at its embedding (module docstring)
    order: list[str] = []
    hooks = [
        m.register_forward_pre_hook(lambda mod, _a, n=n: order.append(n) if n not in order else None)
        for n, m in _leaves_with_params(model).items()
    ]
    model_copy = model
    with torch.no_grad():
        model_copy(torch.zeros(1, 8, dtype=torch.long, device="meta"))
    for h in hooks:
        h.remove()
    seen: set[int] = set()
    layers = []
    leaves = _leaves_with_params(model)
    for n in reversed(order):
        fwd = float(flops.get(n, 0.0))
        mine = []
        for p_name, p in leaves[n].named_parameters(recurse=False):
            tied_elsewhere = shape["tied_head"] and n == "head"
            if id(p) in seen or tied_elsewhere:
                continue
            seen.add(id(p))
            mine.append([p_name, p.numel()])
        layers.append({"name": n, "forward_flops": fwd, "backward_flops": 2.0 * fwd, "params": mine})
    assert sum(numel for layer in layers for _, numel in layer["params"]) == total_params, name
    attention = 12 * shape["layers"] * shape["heads"] * shape["head_dim"] * seq_len
    return {
        "model": name,
        "kind": "transformer",
        "num_classes": vocab,
        "input_shape": [seq_len],
        "seq_len": seq_len,
        "dataset": None,
        "dataset_size": None,
        "parameters": total_params,
        "shape": shape,
        "forward_flops_per_sample": fwd_total,
        "backward_flops_per_sample": bwd_total,
        "train_flops_per_token": (fwd_total + bwd_total) / seq_len,
        "formula_flops_per_token": formula_flops_per_token(shape, total_params, seq_len),
        "formula_attention_flops_per_token": attention,
        "activation_dtype": "bf16",
        "generated_by": (
            f"python -m scaling.projection.make_layer_tables {name} (torch {torch.__version__}); "
            f"units in forward order, layers in reverse forward order (estimated gradient order), "
            f"counted on the meta device"
        ),
        "units": units,
        "layers": layers,
    }


def _write(table: dict, path: Path) -> None:
    # one layer (and one unit) per line: small, and diffs stay readable
    blocks = {key: table.pop(key) for key in ("units", "layers") if key in table}
    head = json.dumps(table, indent=2)[:-2]
    parts = [head]
    for key, rows in blocks.items():
        parts.append(
            f',\n  "{key}": [\n'
            + ",\n".join("    " + json.dumps(row, separators=(", ", ": ")) for row in rows)
            + "\n  ]"
        )
    path.write_text("".join(parts) + "\n}\n")
    json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or [*MODELS, *TRANSFORMERS]
    torch.set_num_threads(1)
    OUT_DIR.mkdir(exist_ok=True)
    for name in names:
        if name in TRANSFORMERS:
            table = make_transformer_table(name)
            path = OUT_DIR / f"{name}.json"
            _write(table, path)
            print(
                f"{path}: {table['parameters']:,} parameters, {table['train_flops_per_token'] / 1e9:.3f} GFLOP per "
                f"token counted, {table['formula_flops_per_token'] / 1e9:.3f} by torchtitan's formula"
            )
            continue
        table = make_table(name)
        path = OUT_DIR / f"{name}.json"
        _write(table, path)
        print(
            f"{path}: {table['parameters']:,} parameters, {len(json.loads(path.read_text())['layers'])} layers, "
            f"DDP buckets {table['ddp_bucket_bytes']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
