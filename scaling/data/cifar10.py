"""CIFAR-10 from its standard python-pickle batches, checked before any worker starts.

`path` is the folder the official `cifar-10-python.tar.gz` unpacks to
(`cifar-10-batches-py`): `data_batch_1` .. `data_batch_5` for training and `test_batch` for
validation, each a pickle (protocol of Python 2, hence `encoding="bytes"`) holding
`b"data"` (N x 3072 uint8, the 32x32 planes R, G, B row-major) and `b"labels"` (N ints in
0..9). Nothing is downloaded: the lab reads what is there, and refuses one clear line
(`DatasetError`) for a missing folder, a missing batch, or a batch of the wrong shape.

The whole set (50,000 + 10,000 images, 180 MB as uint8) is held on the worker's device;
training augmentation is the standard one of He et al. 2016 (pad 4 with zeros, random
32x32 crop, horizontal flip), done per batch on the device (`augment_pad_crop_flip`).
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from scaling.data.errors import DatasetError

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
IMAGE_SIZE = 32
NUM_CLASSES = 10
# Per-channel mean and std of the CIFAR-10 training set (0..1 scale).
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
PAD_PX = 4


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DatasetError(
            f"CIFAR-10 batch {path} is missing; data.path must be the cifar-10-batches-py folder "
            f"(data_batch_1..5 and test_batch)"
        )
    try:
        with path.open("rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
        data = np.asarray(batch[b"data"])
        labels = np.asarray(batch[b"labels"])
    except Exception as exc:  # unpickling errors come in many types; all mean "not a CIFAR batch"
        raise DatasetError(f"{path} is not a CIFAR-10 python batch ({type(exc).__name__}: {exc})") from None
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * IMAGE_SIZE * IMAGE_SIZE:
        raise DatasetError(
            f"{path}: data has shape {data.shape} and dtype {data.dtype}; a CIFAR-10 batch holds N x 3072 uint8"
        )
    if labels.shape != (data.shape[0],):
        raise DatasetError(f"{path}: {labels.shape[0] if labels.ndim else 0} labels for {data.shape[0]} images")
    if data.shape[0] == 0:
        raise DatasetError(f"{path} holds no images")
    if labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise DatasetError(f"{path}: labels outside 0..{NUM_CLASSES - 1} (min {labels.min()}, max {labels.max()})")
    return data, labels


def check_cifar10(path: str | Path) -> dict:
    """Read every batch once and refuse a malformed folder; returns {"train": N, "val": M}."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"CIFAR-10 folder {root} does not exist (set data.path to the cifar-10-batches-py folder)")
    sizes = {"train": 0, "val": 0}
    for name in TRAIN_BATCHES:
        sizes["train"] += len(_read_batch(root / name)[1])
    sizes["val"] = len(_read_batch(root / TEST_BATCH)[1])
    return sizes


def load_cifar10(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_x uint8 Nx3x32x32, train_y int64, val_x, val_y) on the CPU."""
    root = Path(path)

    def stack(names):
        parts = [_read_batch(root / name) for name in names]
        data = np.concatenate([p[0] for p in parts]).reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE)
        labels = np.concatenate([p[1] for p in parts]).astype(np.int64)
        return torch.from_numpy(data), torch.from_numpy(labels)

    train_x, train_y = stack(TRAIN_BATCHES)
    val_x, val_y = stack([TEST_BATCH])
    return train_x, train_y, val_x, val_y


@functools.lru_cache(maxsize=None)
def channel_stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and std as 1x3x1x1 tensors on `device`, made once per device.

    Made per batch they would be a host-to-device copy from pageable memory every step, which
    on GPU waits for the device to drain (a host sync): the host could no longer run ahead.
    """
    return (torch.tensor(MEAN, device=device).view(1, 3, 1, 1), torch.tensor(STD, device=device).view(1, 3, 1, 1))


def normalize(images_uint8: torch.Tensor, memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
    """uint8 NCHW -> float32, scaled to 0..1 and normalised per channel, in `memory_format`
    (channels_last: laid out in the conversion's copy, so the model's input needs no other)."""
    mean, std = channel_stats(images_uint8.device)
    return (images_uint8.to(torch.float32, memory_format=memory_format) / 255.0 - mean) / std


def augment_pad_crop_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Pad 4 px with zeros, take a random 32x32 crop and flip half the images, per image.

    Done for the whole batch at once with one gather (unfold would copy 81 crops per image).
    `generator` lives on the images' device and is seeded per (rank, epoch), so a run is
    reproducible.
    """
    n, c, h, w = images.shape
    padded = F.pad(images, (PAD_PX, PAD_PX, PAD_PX, PAD_PX))
    device = images.device
    dy = torch.randint(0, 2 * PAD_PX + 1, (n,), generator=generator, device=device)
    dx = torch.randint(0, 2 * PAD_PX + 1, (n,), generator=generator, device=device)
    flip = torch.rand(n, generator=generator, device=device) < 0.5
    rows = dy.view(n, 1) + torch.arange(h, device=device).view(1, h)  # n x h
    cols = torch.arange(w, device=device).view(1, w).expand(n, w)
    cols = torch.where(flip.view(n, 1), (w - 1) - cols, cols) + dx.view(n, 1)  # n x w
    batch_index = torch.arange(n, device=device).view(n, 1, 1, 1)
    channel_index = torch.arange(c, device=device).view(1, c, 1, 1)
    return padded[batch_index, channel_index, rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]
