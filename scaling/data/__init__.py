"""Datasets by name, and how each worker reads its shard.

- `embedded`: the learnable dataset generated from a seed (embedded.py); has a validation split.
- `synthetic`: random tensors made on the device, for throughput-only runs (no accuracy).
- `cifar10`: the standard python-pickle batches under `data.path` (cifar10.py), held on the
  device, augmented per batch on the device.
- `imagenet`: `data.path/{train,val}/<class>/*.JPEG`, decoded with Pillow in DataLoader
  worker processes (imagefolder.py).
- `tokens`: token sequences generated from a seed by a learnable rule, for language models
  (tokens.py; `data.num_classes` is the vocabulary, `data.seq_len` the tokens per sample).
- `tokens_file`: a local tokenized text file of uint16 ids, nanoGPT's `train.bin`/`val.bin` or
  llm.c's `.bin` with its header, under `data.path` (tokens.py), read through a memmap.
- a user's own, by import path `package.module:callable`: called with the data config, it
  returns tensors (train_x, train_y, val_x, val_y) held on the device like `embedded`.

Every source gives the loop the same three things: `num_train`, `train_batches(...)` and
`val_batches(...)`, yielding batches on the worker's device: images as floats, normalised;
token data as int64 ids (batch, seq_len) with next-token targets of the same shape. Sharding gives
every rank a disjoint slice of each epoch's permutation (torch's DistributedSampler with
drop_last), so no sample is seen twice in one epoch across workers and every rank runs the
same number of steps; validation covers every sample exactly once across ranks.

`check_dataset(data_cfg)` reads what a path-based dataset needs before any worker starts
and raises `DatasetError` (one line) for a missing, empty or malformed one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from scaling.data import cifar10, imagefolder
from scaling.data.embedded import make_embedded
from scaling.data.errors import DatasetError
from scaling.data.tokens import TokenFile, make_token_rule

DATASETS = ("embedded", "synthetic", "cifar10", "imagenet", "tokens", "tokens_file")
PATH_DATASETS = ("cifar10", "imagenet", "tokens_file")
# Sequences of token ids (a language model's input), not images.
TOKEN_DATASETS = ("tokens", "tokens_file")

Batch = tuple[torch.Tensor, torch.Tensor]


def dataset_names() -> list[str]:
    return list(DATASETS)


def train_shard(num_samples: int, rank: int, world_size: int, epoch: int, seed: int) -> list[int]:
    """This rank's sample indices for `epoch`: disjoint across ranks, equal in length."""
    return list(_train_sampler(num_samples, rank, world_size, epoch, seed))


def _train_sampler(num_samples: int, rank: int, world_size: int, epoch: int, seed: int) -> DistributedSampler:
    sampler = DistributedSampler(
        range(num_samples), num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    sampler.set_epoch(epoch)
    return sampler


def steps_per_epoch(num_samples: int, world_size: int, batch_size: int) -> int:
    return (num_samples // world_size) // batch_size


def val_shard(num_samples: int, rank: int, world_size: int) -> range:
    """Every validation sample exactly once across ranks (no padding, unlike DistributedSampler)."""
    return range(rank, num_samples, world_size)


def _batch_generator(device: torch.device, seed: int, rank: int, epoch: int) -> torch.Generator:
    # Distinct, reproducible augmentation randomness per (seed, rank, epoch).
    return torch.Generator(device=device).manual_seed(hash((seed, rank, epoch)) & 0x7FFF_FFFF_FFFF)


@dataclass
class InMemoryDataset:
    """A dataset held whole on the worker's device; a batch is an index into it.

    `augment` (training only) transforms a stored batch with a seeded generator; `prepare`
    then turns it into model input (e.g. uint8 -> normalised float).
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor | None  # None: no validation (synthetic)
    val_y: torch.Tensor | None
    prepare: Callable[[torch.Tensor, torch.memory_format], torch.Tensor] | None = None
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    # Layout of the batches (channels_last, or as stored): `prepare` makes it in its copy; without
    # `prepare` the stored tensors are laid out so once (`load_dataset`), and indexing keeps it.
    memory_format: torch.memory_format = torch.preserve_format

    @property
    def has_validation(self) -> bool:
        return self.val_x is not None

    @property
    def num_train(self) -> int:
        return len(self.train_y)

    def _prepared(self, x: torch.Tensor) -> torch.Tensor:
        return self.prepare(x, self.memory_format) if self.prepare is not None else x

    def train_batches(self, rank: int, world_size: int, epoch: int, seed: int, batch_size: int) -> Iterator[Batch]:
        """Full batches of this rank's shard; the partial last batch is dropped on every rank alike."""
        device = self.train_x.device
        indices = torch.tensor(train_shard(self.num_train, rank, world_size, epoch, seed), device=device)
        generator = _batch_generator(device, seed, rank, epoch) if self.augment is not None else None
        for start in range(0, len(indices) - batch_size + 1, batch_size):
            batch = indices[start : start + batch_size]
            x = self.train_x[batch]
            if self.augment is not None:
                x = self.augment(x, generator)
            yield self._prepared(x), self.train_y[batch]

    def val_batches(self, rank: int, world_size: int, batch_size: int) -> Iterator[Batch]:
        indices = torch.tensor(
            list(val_shard(len(self.val_y), rank, world_size)), device=self.val_x.device, dtype=torch.long
        )
        for start in range(0, len(indices), batch_size):
            batch = indices[start : start + batch_size]
            yield self._prepared(self.val_x[batch]), self.val_y[batch]


class FolderDataset:
    """An image folder read through DataLoader worker processes (Pillow decode)."""

    has_validation = True

    def __init__(
        self,
        root: str,
        image_size: int,
        loader_workers: int,
        device: torch.device,
        memory_format: torch.memory_format = torch.preserve_format,
    ):
        train_files, train_labels, classes = imagefolder.index_split(Path(root), "train")
        val_files, val_labels, _ = imagefolder.index_split(Path(root), "val", classes)
        self.train = imagefolder.ImageFolderSplit(train_files, train_labels, image_size, train=True)
        self.val = imagefolder.ImageFolderSplit(val_files, val_labels, image_size, train=False)
        self.num_classes = len(classes)
        self.loader_workers = loader_workers
        self.device = device
        self.memory_format = memory_format

    @property
    def num_train(self) -> int:
        return len(self.train)

    def _loader(self, dataset, batch_size: int, sampler=None, drop_last: bool = False, seed: int = 0) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=self.loader_workers,
            pin_memory=self.device.type == "cuda",
            generator=torch.Generator().manual_seed(seed),
            prefetch_factor=4 if self.loader_workers else None,
        )

    def _to_device(self, loader: DataLoader) -> Iterator[Batch]:
        for images, labels in loader:
            images = images.to(self.device, non_blocking=True)
            yield imagefolder.normalize(images, self.memory_format), labels.to(self.device, non_blocking=True)

    def train_batches(self, rank: int, world_size: int, epoch: int, seed: int, batch_size: int) -> Iterator[Batch]:
        sampler = _train_sampler(self.num_train, rank, world_size, epoch, seed)
        loader = self._loader(
            self.train, batch_size, sampler, drop_last=True, seed=hash((seed, rank, epoch)) & 0x7FFF_FFFF
        )
        return self._to_device(loader)

    def val_batches(self, rank: int, world_size: int, batch_size: int) -> Iterator[Batch]:
        shard = Subset(self.val, list(val_shard(len(self.val), rank, world_size)))
        return self._to_device(self._loader(shard, batch_size))


def check_dataset(data_cfg) -> dict:
    """Refuse (DatasetError) a path-based dataset that cannot be read; {} for generated ones."""
    if data_cfg.name not in PATH_DATASETS:
        return {}
    if not data_cfg.path:
        raise DatasetError(f"data.name {data_cfg.name} needs data.path (the dataset's folder)")
    if data_cfg.name == "tokens_file":
        tokens = TokenFile(data_cfg.path, data_cfg.seq_len, data_cfg.val_samples)
        largest = tokens.largest_id()
        if largest >= data_cfg.num_classes:
            raise DatasetError(
                f"{data_cfg.path} holds token id {largest}; set data.num_classes (the vocabulary) above it "
                f"(50257 for GPT-2's tokenizer), got {data_cfg.num_classes}"
            )
        return {"train": tokens.train_windows, "val": tokens.val_windows}
    if data_cfg.name == "cifar10":
        counts = cifar10.check_cifar10(data_cfg.path)
        classes = cifar10.NUM_CLASSES
        if data_cfg.image_size != cifar10.IMAGE_SIZE:
            raise DatasetError(f"CIFAR-10 images are 32x32; set data.image_size: 32 (got {data_cfg.image_size})")
    else:
        counts = imagefolder.check_image_folder(data_cfg.path)
        classes = counts["classes"]
    if data_cfg.num_classes != classes:
        raise DatasetError(
            f"{data_cfg.path} has {classes} classes; set data.num_classes: {classes} (got {data_cfg.num_classes})"
        )
    return counts


def _laid_out(images: torch.Tensor | None, channels_last: bool) -> torch.Tensor | None:
    """Stored images in the batches' layout, converted once (a 4-D tensor; others as they are)."""
    if channels_last and images is not None and images.dim() == 4:
        return images.contiguous(memory_format=torch.channels_last)
    return images


def load_dataset(data_cfg, device: torch.device, loader_workers: int | None = None, channels_last: bool = False):
    """The source named by `data_cfg.name`, on `device` (see the module docstring).

    `channels_last`: batches come out in NHWC memory layout, made once for stored tensors or in
    the uint8-to-float copy of datasets normalised per batch, so that the loop's
    `Precision.layout` finds them laid out and copies nothing per batch.
    """
    from scaling.import_path import is_import_path, load_callable

    memory_format = torch.channels_last if channels_last else torch.preserve_format

    if is_import_path(data_cfg.name):
        # A user's dataset: a callable taking the data config and returning tensors
        # (train_x, train_y, val_x, val_y), val_x and val_y None for no validation split.
        parts = load_callable(data_cfg.name, "data.name", required_args=1)(data_cfg)
        if not (isinstance(parts, tuple) and len(parts) == 4):
            raise DatasetError(f"data.name={data_cfg.name!r} must return (train_x, train_y, val_x, val_y)")
        train_x, train_y, val_x, val_y = (t.to(device) if t is not None else None for t in parts)
        return InMemoryDataset(_laid_out(train_x, channels_last), train_y, _laid_out(val_x, channels_last), val_y)
    if data_cfg.name == "embedded":
        train_x, train_y, val_x, val_y = make_embedded(
            data_cfg.seed,
            data_cfg.num_classes,
            data_cfg.image_size,
            data_cfg.train_samples,
            data_cfg.val_samples,
            data_cfg.difficulty,
        )
        return InMemoryDataset(
            _laid_out(train_x.to(device), channels_last),
            train_y.to(device),
            _laid_out(val_x.to(device), channels_last),
            val_y.to(device),
        )
    if data_cfg.name == "tokens":
        train_x, train_y, val_x, val_y = make_token_rule(
            data_cfg.seed,
            data_cfg.num_classes,
            data_cfg.seq_len,
            data_cfg.train_samples,
            data_cfg.val_samples,
            data_cfg.token_noise,
        )
        return InMemoryDataset(train_x.to(device), train_y.to(device), val_x.to(device), val_y.to(device))
    if data_cfg.name == "tokens_file":
        return TokenFile(data_cfg.path, data_cfg.seq_len, data_cfg.val_samples, device)
    if data_cfg.name == "synthetic":
        generator = torch.Generator(device=device).manual_seed(data_cfg.seed)
        size = data_cfg.image_size
        train_x = torch.randn(data_cfg.train_samples, 3, size, size, generator=generator, device=device)
        train_y = torch.randint(0, data_cfg.num_classes, (data_cfg.train_samples,), generator=generator, device=device)
        return InMemoryDataset(_laid_out(train_x, channels_last), train_y, None, None)
    if data_cfg.name == "cifar10":
        train_x, train_y, val_x, val_y = cifar10.load_cifar10(data_cfg.path)
        return InMemoryDataset(
            train_x.to(device),
            train_y.to(device),
            val_x.to(device),
            val_y.to(device),
            prepare=cifar10.normalize,
            augment=cifar10.augment_pad_crop_flip,
            memory_format=memory_format,
        )
    if data_cfg.name == "imagenet":
        workers = data_cfg.loader_workers if loader_workers is None else loader_workers
        return FolderDataset(data_cfg.path, data_cfg.image_size, workers, device, memory_format)
    raise DatasetError(f"unknown dataset {data_cfg.name!r}; valid: {', '.join(DATASETS)}")
