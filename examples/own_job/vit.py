"""A small vision transformer: the user's own model, not in the lab's registry.

Patches of `patch` x `patch` pixels are embedded linearly (a strided convolution), a class
token and learned position embeddings are added, `depth` pre-norm transformer encoder layers
follow, and a linear head reads the class token (Dosovitskiy et al. 2021, at toy size).
"""

import torch
from torch import nn


class TinyViT(nn.Module):
    def __init__(
        self, num_classes: int = 10, image_size: int = 16, patch: int = 4, dim: int = 64, depth: int = 2, heads: int = 4
    ):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        tokens = (image_size // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2)  # (batch, tokens, dim)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.position
        return self.head(self.norm(self.encoder(x))[:, 0])


def tiny_vit(num_classes: int) -> TinyViT:
    """The constructor a lab config can name: `model.name: examples.own_job.vit:tiny_vit`."""
    return TinyViT(num_classes)
