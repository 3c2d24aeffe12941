"""Tiny datasets in the real on-disk formats, generated from a seed (nothing is downloaded).

For tests and for trying the CIFAR-10 and ImageNet paths of the lab without the real data:

    python -m scaling.data.fake cifar10 /tmp/cifar-10-batches-py --per-batch 200
    python -m scaling.data.fake imagenet /tmp/tiny-imagenet --classes 10 --per-class 20

Images are class-coloured noise (each class its own mean colour), so a model can learn them
and accuracy means something, in the same formats the loaders read: CIFAR-10's python
pickles (`data_batch_1..5`, `test_batch`, with `b"data"` N x 3072 uint8 and `b"labels"`) and
an ImageNet-style `train/<class>/*.JPEG`, `val/<class>/*.JPEG` folder of varied sizes.
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import numpy as np
from PIL import Image

from scaling.data.cifar10 import TEST_BATCH, TRAIN_BATCHES


def _class_images(
    rng: np.random.Generator, label: int, count: int, height: int, width: int, num_classes: int
) -> np.ndarray:
    hue = np.array([np.sin(label * 2.1), np.sin(label * 2.1 + 2.0), np.sin(label * 2.1 + 4.0)])
    base = 128 + 60 * hue * (1 + label // 3 / num_classes)
    noise = rng.normal(0, 40, size=(count, height, width, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def make_cifar10(root: str | Path, per_batch: int = 100, seed: int = 0) -> Path:
    """Write the six CIFAR-10 batches, `per_batch` images each, into `root`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in (*TRAIN_BATCHES, TEST_BATCH):
        labels = rng.integers(0, 10, size=per_batch)
        images = np.concatenate([_class_images(rng, int(label), 1, 32, 32, 10) for label in labels])
        data = images.transpose(0, 3, 1, 2).reshape(per_batch, 3072)  # planes R, G, B, row-major
        with (root / name).open("wb") as handle:
            pickle.dump({b"data": data, b"labels": labels.tolist(), b"batch_label": name.encode()}, handle)
    return root


def make_image_folder(
    root: str | Path, classes: int = 4, per_class: int = 6, val_per_class: int = 2, seed: int = 0
) -> Path:
    """Write `train/` and `val/` folders of JPEGs (sizes vary, as ImageNet's do) into `root`."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("val", val_per_class)):
        for label in range(classes):
            folder = root / split / f"n{label:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                height, width = int(rng.integers(48, 96)), int(rng.integers(48, 96))
                pixels = _class_images(rng, label, 1, height, width, classes)[0]
                Image.fromarray(pixels).save(folder / f"{split}_{label}_{index}.JPEG", quality=90)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("format", choices=("cifar10", "imagenet"))
    parser.add_argument("out")
    parser.add_argument("--per-batch", type=int, default=100, help="cifar10: images per batch file")
    parser.add_argument("--classes", type=int, default=4, help="imagenet: class folders")
    parser.add_argument("--per-class", type=int, default=6, help="imagenet: training images per class")
    parser.add_argument("--val-per-class", type=int, default=2, help="imagenet: validation images per class")
    args = parser.parse_args()
    if args.format == "cifar10":
        print(make_cifar10(args.out, args.per_batch))
    else:
        print(make_image_folder(args.out, args.classes, args.per_class, args.val_per_class))


if __name__ == "__main__":
    main()
