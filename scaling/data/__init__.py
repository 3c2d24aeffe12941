"""Datasets by name and how each worker reads its shard.

- `embedded`: the learnable dataset generated from a seed (embedded.py); has a validation split.
- `synthetic`: random tensors made on the device, for throughput-only runs (no accuracy).

Both live in device memory; a batch is an index into them, so `data_s` measures the lab's
own input path, not a disk. Sharding gives every rank a disjoint slice of each epoch's
permutation (torch's DistributedSampler with drop_last), so no sample is seen twice in one
epoch across workers, and every rank runs the same number of steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DistributedSampler

from scaling.data.embedded import make_embedded

DATASETS = ("embedded", "synthetic")


def dataset_names() -> list[str]:
    return list(DATASETS)


@dataclass
class InMemoryDataset:
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor | None  # None: no validation (synthetic)
    val_y: torch.Tensor | None

    @property
    def has_validation(self) -> bool:
        return self.val_x is not None


def load_dataset(data_cfg, device: torch.device) -> InMemoryDataset:
    if data_cfg.name == "embedded":
        train_x, train_y, val_x, val_y = make_embedded(
            data_cfg.seed, data_cfg.num_classes, data_cfg.image_size,
            data_cfg.train_samples, data_cfg.val_samples, data_cfg.difficulty,
        )
        return InMemoryDataset(train_x.to(device), train_y.to(device), val_x.to(device), val_y.to(device))
    if data_cfg.name == "synthetic":
        generator = torch.Generator(device=device).manual_seed(data_cfg.seed)
        size = data_cfg.image_size
        train_x = torch.randn(data_cfg.train_samples, 3, size, size, generator=generator, device=device)
        train_y = torch.randint(0, data_cfg.num_classes, (data_cfg.train_samples,), generator=generator, device=device)
        return InMemoryDataset(train_x, train_y, None, None)
    raise ValueError(f"unknown dataset {data_cfg.name!r}; valid: {', '.join(DATASETS)}")


def train_shard(num_samples: int, rank: int, world_size: int, epoch: int, seed: int) -> list[int]:
    """This rank's sample indices for `epoch`: disjoint across ranks, equal in length."""
    sampler = DistributedSampler(
        range(num_samples), num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def train_batches(
    dataset: InMemoryDataset, rank: int, world_size: int, epoch: int, seed: int, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Full batches of this rank's shard; the partial last batch is dropped on every rank alike."""
    indices = torch.tensor(train_shard(len(dataset.train_y), rank, world_size, epoch, seed), device=dataset.train_x.device)
    for start in range(0, len(indices) - batch_size + 1, batch_size):
        batch = indices[start : start + batch_size]
        yield dataset.train_x[batch], dataset.train_y[batch]


def steps_per_epoch(num_samples: int, world_size: int, batch_size: int) -> int:
    return (num_samples // world_size) // batch_size


def val_shard(num_samples: int, rank: int, world_size: int) -> range:
    """Every validation sample exactly once across ranks (no padding, unlike DistributedSampler)."""
    return range(rank, num_samples, world_size)
