"""A user's torchrun job, instrumented, with Ray hidden from the import system (tests/test_instrument_without_ray.py).

    torchrun --standalone --nproc-per-node 2 -m tests.without_ray_job OUT

Ray is hidden before anything of the lab is imported: a finder first on `sys.meta_path` refuses
`ray` and every `ray.*` module, as if Ray were not installed. Each rank trains a small DDP model
for two epochs with the instrument attached (the A/B window included), finishes the run, and
writes what it saw to OUT/rank<r>.json; the records go to OUT/run.
"""

import importlib.abc
import sys


class HideRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by tests/without_ray_job.py)", name=name)
        return None


sys.meta_path.insert(0, HideRay())

EPOCHS, STEPS, BATCH = 2, 6, 8


def main(out: str) -> None:
    import gc
    import json
    import os

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from scaling import instrument

    dist.init_process_group("gloo")  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(dist.get_rank())
    batches = [
        (torch.randn(BATCH, 16, generator=generator), torch.randint(0, 4, (BATCH,), generator=generator))
        for _ in range(STEPS)
    ]

    def forward_backward(batch):
        loss_fn(model(batch[0]), batch[1]).backward()

    meter = instrument.attach(
        model,
        optimizer,
        run_dir=os.path.join(out, "run"),
        target_accuracy=0.99,
        forward_backward=forward_backward,
        calibration_data=batches[:2],
        warmup_steps=1,
        calibration_pairs=2,
        telemetry_interval_s=0,
    )
    for _ in range(EPOCHS):
        for inputs, targets in meter.batches(batches):
            loss_fn(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
        meter.end_epoch(val_accuracy=0.5)
    summary = meter.finish()
    try:
        import ray  # noqa: F401

        ray_importable = True
    except ImportError:
        ray_importable = False
    seen = {
        "rank": meter.rank,
        "world_size": meter.world_size,
        "local_rank": meter.local_rank,
        "node_rank": meter.node_rank,
        "epochs": EPOCHS,
        "steps_per_epoch": STEPS,
        "summary_returned": summary is not None,
        "ray_importable": ray_importable,
        "ray_modules": sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")),
    }
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(seen, f)
    # gloo's threads may still hold the comm hook's futures: let them go while Python is fully
    # alive, then leave without finalisation (docs: the plain launcher, scaling/launch/local.py)
    gc.collect()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
