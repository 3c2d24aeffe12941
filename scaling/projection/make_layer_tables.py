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
the tests to hold the pure-Python bucketing to. Gradient order does not depend on the input size, so the DDP probe runs at a
small input (`probe_size`) to be quick on a CPU.
"""

from __future__ import annotations

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
_BATCH = 2  # the DDP probe's batch: BatchNorm in training mode needs more than one value per channel


def _leaves_with_params(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules()
            if not any(True for _ in m.children()) and any(True for _ in m.parameters(recurse=False))}


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
    parameterless = [k for k, v in flops.items() if v and k not in leaves and not any(k2.startswith(k + ".") for k2 in flops if k2 != k)]
    assert not parameterless, f"{name}: FLOPs in modules without parameters, not placed in backward: {parameterless}"

    layers: list[dict] = []
    index_of: dict[str, int] = {}
    for i in order:
        p_name, p = params[i]
        mod = owner[p_name]
        if mod not in index_of:
            fwd = float(flops.get(mod, 0.0))
            index_of[mod] = len(layers)
            layers.append({"name": mod, "forward_flops": fwd,
                           "backward_flops": fwd * (2.0 if needs_grad.get(mod, True) else 1.0), "params": []})
        layers[index_of[mod]]["params"].append([p_name[len(mod) + 1:] if mod else p_name, p.numel()])
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
        "generated_by": (f"python -m scaling.projection.make_layer_tables {name} "
                         f"(torch {torch.__version__}); layers in DDP's measured gradient-ready order"),
        "layers": layers,
    }


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(MODELS)
    torch.set_num_threads(1)
    OUT_DIR.mkdir(exist_ok=True)
    for name in names:
        table = make_table(name)
        path = OUT_DIR / f"{name}.json"
        # one layer per line: small, and diffs stay readable
        lines = ",\n".join("    " + json.dumps(layer, separators=(", ", ": ")) for layer in table.pop("layers"))
        head = json.dumps(table, indent=2)[:-2]
        path.write_text(head + ',\n  "layers": [\n' + lines + "\n  ]\n}\n")
        json.loads(path.read_text())
        print(f"{path}: {table['parameters']:,} parameters, {len(json.loads(path.read_text())['layers'])} layers, "
              f"DDP buckets {table['ddp_bucket_bytes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
