"""The embedded learnable dataset: 32x32 RGB images generated from a seed, no download.

Each class owns a few smooth random "prototype" images. A sample is one of its class's
prototypes, shifted by a few pixels, with random contrast, blended with a prototype of
another class (a distractor), plus pixel noise. A network must learn shift-tolerant
features to separate the classes, so accuracy climbs over several epochs rather than one;
with linear learning-rate scaling, a larger global batch (fewer updates per epoch) needs
more epochs to reach the same accuracy, the effect that makes TTA speedup lag throughput
speedup. `difficulty` scales the noise and the distractor weight.

The same (seed, sizes, difficulty) always gives the same tensors, on every worker, so every
worker can generate the whole dataset itself and read only its shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PROTOTYPES_PER_CLASS = 8
MAX_SHIFT_PX = 5


def _prototypes(generator: torch.Generator, num_classes: int, image_size: int) -> torch.Tensor:
    """(classes, prototypes, 3, H, W): low-frequency colour patterns, zero mean, unit std."""
    coarse = torch.randn(num_classes * PROTOTYPES_PER_CLASS, 3, 6, 6, generator=generator)
    protos = F.interpolate(coarse, size=(image_size, image_size), mode="bicubic", align_corners=False)
    protos = (protos - protos.mean(dim=(1, 2, 3), keepdim=True)) / protos.std(dim=(1, 2, 3), keepdim=True)
    return protos.view(num_classes, PROTOTYPES_PER_CLASS, 3, image_size, image_size)


def _samples(
    generator: torch.Generator, protos: torch.Tensor, count: int, difficulty: float
) -> tuple[torch.Tensor, torch.Tensor]:
    num_classes, per_class, _, size, _ = protos.shape
    labels = torch.randint(0, num_classes, (count,), generator=generator)
    which = torch.randint(0, per_class, (count,), generator=generator)
    images = protos[labels, which].clone()

    # Shift each image by up to MAX_SHIFT_PX in x and y (circularly): the network cannot
    # memorise pixel positions.
    shifts = torch.randint(-MAX_SHIFT_PX, MAX_SHIFT_PX + 1, (count, 2), generator=generator)
    for dy in range(-MAX_SHIFT_PX, MAX_SHIFT_PX + 1):
        for dx in range(-MAX_SHIFT_PX, MAX_SHIFT_PX + 1):
            mask = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            if mask.any():
                images[mask] = torch.roll(images[mask], shifts=(dy, dx), dims=(2, 3))

    # A distractor from another class, blended in: classes overlap, as in real data.
    other = (labels + torch.randint(1, num_classes, (count,), generator=generator)) % num_classes
    distractor = protos[other, torch.randint(0, per_class, (count,), generator=generator)]
    blend = 0.45 * difficulty * torch.rand(count, 1, 1, 1, generator=generator)
    contrast = 0.6 + 0.8 * torch.rand(count, 1, 1, 1, generator=generator)
    noise = torch.randn(images.shape, generator=generator) * (1.0 * difficulty)
    images = contrast * ((1 - blend) * images + blend * distractor) + noise
    return images.contiguous(), labels


def make_embedded(
    seed: int, num_classes: int, image_size: int, train_samples: int, val_samples: int, difficulty: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_x, train_y, val_x, val_y), float32 images (N, 3, H, W) and int64 labels."""
    generator = torch.Generator().manual_seed(seed)
    protos = _prototypes(generator, num_classes, image_size)
    train_x, train_y = _samples(generator, protos, train_samples, difficulty)
    val_x, val_y = _samples(generator, protos, val_samples, difficulty)
    return train_x, train_y, val_x, val_y
