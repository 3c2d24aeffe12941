"""The user's own data, generated (no download): images whose class decides a coloured pattern.

Each class has a fixed random 3 x 16 x 16 template; a sample is its class's template plus
Gaussian noise, so the task is learnable but not trivial at `noise` 2.
"""

import torch
from torch.utils.data import TensorDataset


def make_datasets(
    num_train: int = 2048,
    num_val: int = 512,
    num_classes: int = 10,
    image_size: int = 16,
    noise: float = 2.0,
    seed: int = 0,
) -> tuple[TensorDataset, TensorDataset]:
    generator = torch.Generator().manual_seed(seed)
    templates = torch.randn(num_classes, 3, image_size, image_size, generator=generator)

    def split(count: int) -> TensorDataset:
        labels = torch.randint(0, num_classes, (count,), generator=generator)
        images = templates[labels] + noise * torch.randn(count, 3, image_size, image_size, generator=generator)
        return TensorDataset(images, labels)

    return split(num_train), split(num_val)
