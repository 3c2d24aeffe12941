"""ImageNet (or any image folder in its layout), decoded with Pillow in DataLoader workers.

`path` holds `train/<class>/*.JPEG` and `val/<class>/*.JPEG` (the layout of the ILSVRC-2012
`train` folder and of the usual re-sorted `val` folder); classes are the sorted folder names
and must be the same in both. Transforms are the standard ones of the ResNet papers and the
DAWNBench/MLPerf ResNet-50 entries, written here with Pillow because torchvision's wheels do
not load on these machines:

- training: random resized crop (area 8%..100% of the image, aspect 3/4..4/3, torchvision's
  sampling with 10 tries and a centre-crop fallback) to `image_size`, horizontal flip;
- validation: resize the shorter side to `image_size x 256/224` (256 for 224), centre crop.

Decoding runs in `loader_workers` DataLoader processes per training worker. Batches leave
the loader as uint8 NCHW (4x fewer bytes to pin and copy than float) and are normalised on
the device (`normalize`). Why not Ray Data: each training worker already owns its shard
(DistributedSampler), the DataLoader's worker processes give the same parallel Pillow
decoding without a second scheduler competing for the worker's CPUs, and its prefetching
keeps the wait visible as `data_s` in the step records (see docs/method.md).

`check_image_folder(path)` refuses a missing or empty folder, class folders that differ
between train and val, an empty class, and an unreadable image among a sample of up to
`CHECKED_IMAGES` files per split (all of them in a small folder), with one clear line,
before any worker starts. A file that fails to decode later still fails the run naming it.
"""

from __future__ import annotations

import functools
import math
import os
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from scaling.data.errors import DatasetError

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
CHECKED_IMAGES = 256  # per split: verified with Pillow before the run (evenly spaced sample)
# ImageNet per-channel mean and std (0..1 scale), as in the reference ResNet training.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)


def _class_folders(split_dir: Path) -> list[str]:
    return sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())


def _image_files(class_dir: Path) -> list[str]:
    return sorted(
        entry.path
        for entry in os.scandir(class_dir)
        if entry.is_file() and entry.name.lower().endswith(IMAGE_EXTENSIONS)
    )


def index_split(root: Path, split: str, classes: list[str] | None = None) -> tuple[list[str], list[int], list[str]]:
    """(files, labels, classes) of one split; refuses a missing or empty one."""
    split_dir = root / split
    if not split_dir.is_dir():
        raise DatasetError(f"image folder {root} has no '{split}' folder; expected {root}/{split}/<class>/*.JPEG")
    found = _class_folders(split_dir)
    if not found:
        raise DatasetError(f"{split_dir} holds no class folders; expected {split_dir}/<class>/*.JPEG")
    if classes is not None and found != classes:
        missing = sorted(set(classes) - set(found))[:3]
        extra = sorted(set(found) - set(classes))[:3]
        raise DatasetError(
            f"{split_dir} has {len(found)} class folders, train has {len(classes)}; "
            f"they must be the same (missing here: {missing or '-'}, extra here: {extra or '-'})"
        )
    files, labels = [], []
    for label, name in enumerate(found):
        class_files = _image_files(split_dir / name)
        if not class_files:
            raise DatasetError(f"class folder {split_dir / name} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        files += class_files
        labels += [label] * len(class_files)
    return files, labels, found


def _verify_sample(files: list[str]) -> None:
    step = max(1, len(files) // CHECKED_IMAGES)
    for path in files[::step]:
        try:
            with Image.open(path) as image:
                image.verify()
        except Exception as exc:  # Pillow raises several types for a bad file
            raise DatasetError(f"unreadable image {path}: {type(exc).__name__}: {exc}") from None


def check_image_folder(path: str | Path) -> dict:
    """Index both splits and verify a sample of images; returns counts for the run's log."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"image folder {root} does not exist (set data.path to the folder holding train/ and val/)")
    train_files, _, classes = index_split(root, "train")
    val_files, _, _ = index_split(root, "val", classes)
    _verify_sample(train_files)
    _verify_sample(val_files)
    return {"train": len(train_files), "val": len(val_files), "classes": len(classes)}


def _decode_rgb(path: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except Exception as exc:
        raise DatasetError(f"unreadable image {path}: {type(exc).__name__}: {exc}") from None


def random_resized_crop_box(width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a random crop, as torchvision's RandomResizedCrop samples it."""
    area = width * height
    log_ratio = (math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*CROP_SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left = rng.randint(0, width - w)
            top = rng.randint(0, height - h)
            return left, top, left + w, top + h
    # Fallback: the largest centre crop with the aspect clamped to the allowed range.
    in_ratio = width / height
    if in_ratio < CROP_RATIO[0]:
        w, h = width, int(round(width / CROP_RATIO[0]))
    elif in_ratio > CROP_RATIO[1]:
        h, w = height, int(round(height * CROP_RATIO[1]))
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def _to_chw_uint8(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).transpose(2, 0, 1).copy())


class ImageFolderSplit(torch.utils.data.Dataset):
    """One split; items are (uint8 3 x size x size tensor, label)."""

    def __init__(self, files: list[str], labels: list[int], image_size: int, train: bool):
        self.files = files
        self.labels = labels
        self.image_size = image_size
        self.train = train
        self.resize_size = int(round(image_size * 256 / 224))
        self._rng = random.Random()

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        image = _decode_rgb(self.files[index])
        size = self.image_size
        if self.train:
            # Python's `random` is reseeded per DataLoader worker by torch, from the loader's
            # generator: the crops are reproducible for a given (seed, rank, epoch).
            box = random_resized_crop_box(image.width, image.height, random)
            image = image.resize((size, size), Image.BILINEAR, box=box)
            if random.random() < 0.5:
                image = image.transpose(Image.FLIP_LEFT_RIGHT)
        else:
            scale = self.resize_size / min(image.width, image.height)
            resized = (max(size, round(image.width * scale)), max(size, round(image.height * scale)))
            image = image.resize(resized, Image.BILINEAR)
            left, top = (resized[0] - size) // 2, (resized[1] - size) // 2
            image = image.crop((left, top, left + size, top + size))
        return _to_chw_uint8(image), self.labels[index]


@functools.lru_cache(maxsize=None)
def channel_stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ImageNet mean and std as 1x3x1x1 tensors on `device`, made once per device (made per
    batch, each would be a pageable host-to-device copy: a host sync on GPU every step)."""
    return (torch.tensor(MEAN, device=device).view(1, 3, 1, 1), torch.tensor(STD, device=device).view(1, 3, 1, 1))


def normalize(images_uint8: torch.Tensor, memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
    """uint8 NCHW -> float32 normalised with the ImageNet mean and std (on the batch's device),
    in `memory_format` (channels_last: laid out in the conversion's copy)."""
    mean, std = channel_stats(images_uint8.device)
    return (images_uint8.to(torch.float32, memory_format=memory_format) / 255.0 - mean) / std
