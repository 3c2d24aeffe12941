"""A user's Ray Train job fed by Ray Data, Ray Train's recommended ingest, instrumented.

The shape of Ray's PyTorch quickstart (an MLP on 28 x 28 images, TorchTrainer, `prepare_model`,
`ray.train.report`), but its input is a Ray Dataset rather than a DataLoader: the datasets are
built in memory (`ray.data.from_items`, generated images whose class decides a pattern; no
download), handed to `TorchTrainer(datasets=...)`, and each worker reads its shard with
`ray.train.get_dataset_shard("train").iter_torch_batches(...)`. The lines marked `# scaling` are
all that measuring it takes (README, "Measure your own job"; docs/own-job.md): the shard's batches go through
`meter.batches`, so a step's `data_s` is the time the loop waited for Ray Data's next batch.

`--stall-ms` injects a known stall into the ingest, as a slow preprocessing step would: Ray
Data's batch-to-tensors step (the `collate_fn` of `iter_torch_batches`) sleeps that long per
batch. Ray Data makes the next batch in a background thread while the loop trains on the
current one (with a stall, `prefetch_batches=0`: exactly one batch ahead, its making started
when the loop takes the current one), so the loop waits for the stall less the time it spent
since taking the previous batch; tests/test_ray_data.py checks, step by step, that `data_s` is
that wait.

    python examples/ray_data_job.py --out results/ray-data/w2
    python examples/ray_data_job.py --out results/ray-data/w2-stall --stall-ms 50
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import ray.train
import ray.train.torch
import torch
from ray.data.collate_fn import DefaultCollateFn
from torch import nn

from scaling import instrument  # scaling

IMAGE_SIDE, NUM_CLASSES = 28, 10
DTYPES = {"image": torch.float32, "label": torch.long}
ROWS_PER_BLOCK = 64  # Ray Data moves blocks: a few rows each would make every batch many fetches


class NeuralNetwork(nn.Module):
    """The quickstart's MLP, narrower: a CPU test trains it in seconds."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.flatten = nn.Flatten()
        self.layers = nn.Sequential(
            nn.Linear(IMAGE_SIDE * IMAGE_SIDE, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(self.flatten(images))


def make_datasets(num_train: int = 512, num_val: int = 128, noise: float = 2.0, seed: int = 0):
    """Train and validation Ray Datasets of {"image": 28 x 28 float32, "label": int}: each class has
    a fixed random template, a sample is its class's template plus Gaussian noise (learnable, not trivial)."""
    import ray.data

    rng = np.random.default_rng(seed)
    templates = rng.standard_normal((NUM_CLASSES, IMAGE_SIDE, IMAGE_SIDE)).astype(np.float32)

    def split(count: int):
        labels = rng.integers(0, NUM_CLASSES, count)
        images = templates[labels] + noise * rng.standard_normal((count, IMAGE_SIDE, IMAGE_SIDE)).astype(np.float32)
        rows = [{"image": image, "label": int(label)} for image, label in zip(images, labels)]
        return ray.data.from_items(rows, override_num_blocks=max(1, count // ROWS_PER_BLOCK))

    return split(num_train), split(num_val)


class StalledCollate(DefaultCollateFn):
    """Ray Data's own batch-to-tensors step, after holding each batch `stall_s` (the injected stall)."""

    def __init__(self, stall_s: float):
        super().__init__(dtypes=DTYPES, combine_chunks=True)
        self.stall_s = stall_s

    def __call__(self, batch):
        time.sleep(self.stall_s)
        return super().__call__(batch)


def shard_batches(shard, batch_size: int, stall_s: float | None = None):
    """One epoch of a worker's shard as dicts of tensors, as Ray Train's guide reads it. With a
    stall (0 included: the baseline it is compared with), the stalled transform, and no block
    prefetching or collate thread pool: Ray Data's one background thread then starts making the
    next batch when the loop takes the current one (ray.data's `iter_threaded`, a buffer of one),
    so when a batch is ready follows from when the loop took the one before."""
    if stall_s is None:
        return shard.iter_torch_batches(batch_size=batch_size, dtypes=DTYPES)
    return shard.iter_torch_batches(batch_size=batch_size, prefetch_batches=0, collate_fn=StalledCollate(stall_s))


def evaluate(model, shard, batch_size: int) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in shard.iter_torch_batches(batch_size=batch_size):
            correct += (model(batch["image"]).argmax(dim=1) == batch["label"]).sum().item()
            total += len(batch["label"])
    model.train()
    return correct / max(total, 1)


def train_func(config: dict):
    """Ray Train's per-worker loop. config: lr, batch_size (per worker), epochs, run_dir, and
    optionally seed, warmup_steps, calibration_pairs, and stall_s: the injected stall per batch,
    one for every epoch or a list of one per epoch (None: no stall, the guide's plain ingest)."""
    torch.manual_seed(config.get("seed", 0))
    model = ray.train.torch.prepare_model(NeuralNetwork())
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("validation")
    batch_size, epochs, stall_s = config["batch_size"], config["epochs"], config.get("stall_s")
    stall_per_epoch = list(stall_s) if isinstance(stall_s, (list, tuple)) else [stall_s] * epochs

    def forward_backward(batch):  # scaling: one forward + backward, for the A/B overhead
        criterion(model(batch["image"]), batch["label"]).backward()  # scaling

    # scaling: the A/B calibration draws its batches from the validation shard, so the train
    # shard's epochs stay the loop's own
    calibration = lambda epoch: val_shard.iter_torch_batches(batch_size=batch_size)  # noqa: E731  # scaling
    settings = {k: config[k] for k in ("warmup_steps", "calibration_pairs") if k in config}
    meter = instrument.attach(
        model,
        optimizer,
        run_dir=config.get("run_dir"),  # scaling
        forward_backward=forward_backward,
        calibration_data=calibration,
        **settings,
    )  # scaling
    for epoch in range(epochs):
        for batch in meter.batches(shard_batches(train_shard, batch_size, stall_per_epoch[epoch])):  # scaling
            loss = criterion(model(batch["image"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        accuracy = evaluate(model, val_shard, batch_size)
        meter.end_epoch(val_accuracy=accuracy, train_loss=loss.item())  # scaling
        ray.train.report({"loss": loss.item(), "epoch": epoch, "val_accuracy": accuracy})
    meter.finish()  # scaling


def trainer_for(
    run_dir: str,
    *,
    workers: int = 2,
    epochs: int = 2,
    batch_size: int = 16,
    stall_s=None,
    num_train: int = 512,
    cpus_per_worker: float = 1.0,
    **settings,
):
    """The TorchTrainer of this job (gloo on CPU): its datasets, its loop config, its run directory."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    train_set, val_set = make_datasets(num_train=num_train)
    return TorchTrainer(
        train_func,
        train_loop_config={
            "lr": 0.01,
            "batch_size": batch_size,
            "epochs": epochs,
            "run_dir": run_dir,
            "stall_s": stall_s,
            **settings,
        },
        datasets={"train": train_set, "validation": val_set},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker={"CPU": cpus_per_worker}),
        run_config=RunConfig(storage_path=os.path.join(run_dir, "ray_train")),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the run directory the instrument writes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="per worker")
    parser.add_argument("--stall-ms", type=float, help="a stall injected per batch into the ingest (prefetching off)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.epochs < 1 or args.batch_size < 1 or (args.stall_ms or 0) < 0:
        print(
            "ray_data_job: --workers, --epochs and --batch-size must be at least 1, --stall-ms not negative",
            file=sys.stderr,
        )
        return 2
    run_dir = os.path.abspath(args.out)
    trainer_for(
        run_dir,
        workers=args.workers,
        epochs=args.epochs,
        batch_size=args.batch_size,
        stall_s=None if args.stall_ms is None else args.stall_ms / 1000,
    ).fit()
    print(f"records and summary in {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
