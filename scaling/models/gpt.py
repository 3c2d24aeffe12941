"""A GPT-2-class decoder: token ids (batch, T) in, next-token logits (batch, T, vocab) out.

GPT-2's architecture (Radford et al. 2019) as nanoGPT writes it: learned token and position
embeddings, pre-norm blocks (LayerNorm, causal self-attention, LayerNorm, a 4x-wide GELU MLP,
each added to the residual stream), a final LayerNorm, and an output head tied to the token
embedding. Attention is `torch.nn.functional.scaled_dot_product_attention` with `is_causal`,
so the fused kernels of the device run it. No dropout (the speedruns train without it).

- `gpt2-small`: 12 layers, 12 heads, 768 wide, context 1024; with GPT-2's vocabulary of 50,257
  it has 124,439,808 parameters (the tied head counted once), GPT-2's "124M", plus the 36,096 of
  the vocabulary's padding rows (below).
- `gpt2-medium`: 24 layers, 16 heads, 1024 wide, context 1024: 354,823,168 parameters at
  GPT-2's vocabulary, GPT-2's "350M" (for the projection's layer tables; it trains as gpt2-small does).
- `gpt2-tiny`: 2 layers, 2 heads, 64 wide, context 64: learns the generated token rule
  (scaling/data/tokens.py) in a few seconds on a CPU.

The registry builds each with `num_classes` as the vocabulary (data.num_classes: the token ids'
range, 50257 for GPT-2's tokenizer). Initialisation is GPT-2's: normal(0, 0.02), the projections
into the residual stream scaled by 1/sqrt(2 x layers).

The vocabulary is padded to a multiple of 64 (`VOCAB_MULTIPLE`; 50,257 -> 50,304, as nanoGPT
does): the token embedding and the tied output layer have `padded_vocab` rows, so the output
projection and its gradients are matrix multiplies of friendly shapes. 50,257 is odd, and on an
H200 (bf16, 8 x 1,024 tokens) a GPT-2 small step took 40.5 ms with it against 28.3 ms padded
(a bare loop outside the lab). The padding rows are no part of the model: they start at zero, no token id
indexes them, and `forward` returns the logits of the real vocabulary only (`vocab` columns, a
view of the padded product), so a padding id can never be predicted, and the loss, its gradients
and the accuracy are those of the unpadded model with the same weights (tests/test_gpt_speed_paths.py).
Their parameters (`padding_parameters`: 47 x 768 = 36,096 for GPT-2 small) get no gradient and
stay zero (weight decay of zero is zero).

FLOPs: MFU is taken on the model's FLOPs (PaLM's appendix B: the work of the model, not of its
implementation), so `implementation_flops` states the FLOPs the padding adds per sample, which
the FLOP counter (scaling/instrument/flops.py) subtracts from what it counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTShape:
    layers: int
    heads: int
    width: int
    context: int  # the longest sequence the position embedding covers

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


GPT2_SMALL = GPTShape(layers=12, heads=12, width=768, context=1024)
GPT2_MEDIUM = GPTShape(layers=24, heads=16, width=1024, context=1024)
GPT2_TINY = GPTShape(layers=2, heads=2, width=64, context=64)
GPT2_VOCAB = 50257
# Pad the vocabulary to a multiple of this (50,257 -> 50,304): matrix multiplies whose dimensions are
# multiples of 64 stay on the GPU's fast (tensor-core tiled) paths; an odd one falls off them.
VOCAB_MULTIPLE = 64


def padded_vocab_size(vocab: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """`vocab` rounded up to a multiple of `multiple` (1: no padding)."""
    return -(-vocab // multiple) * multiple


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.heads = shape.heads
        self.qkv = nn.Linear(shape.width, 3 * shape.width)
        self.proj = nn.Linear(shape.width, shape.width)
        self.proj.residual_projection = True  # GPT-2's scaled initialisation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        # (batch, length, 3 x width) -> three (batch, heads, length, head_dim)
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class MLP(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.up = nn.Linear(shape.width, 4 * shape.width)
        self.act = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.down = nn.Linear(4 * shape.width, shape.width)
        self.down.residual_projection = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.norm1 = nn.LayerNorm(shape.width)
        self.attn = CausalSelfAttention(shape)
        self.norm2 = nn.LayerNorm(shape.width)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token ids (batch, T <= context) -> logits (batch, T, vocab); see the module docstring.

    `vocab`: the real vocabulary (token ids in [0, vocab)); the embedding and the tied head have
    `padded_vocab` rows, a multiple of `pad_to` (1: none), and the logits `vocab` columns."""

    def __init__(self, shape: GPTShape, vocab: int, pad_to: int = VOCAB_MULTIPLE):
        super().__init__()
        self.shape, self.vocab = shape, vocab
        self.padded_vocab = padded_vocab_size(vocab, pad_to)
        self.tokens = nn.Embedding(self.padded_vocab, shape.width)
        self.positions = nn.Embedding(shape.context, shape.width)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, self.padded_vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied: one matrix embeds and unembeds
        self.apply(self._init)
        with torch.no_grad():
            self.tokens.weight[vocab:].zero_()  # the padding rows: no part of the model (module docstring)

    @property
    def padding_parameters(self) -> int:
        """Parameters of the padding rows (in `parameters()`, trained by nothing)."""
        return (self.padded_vocab - self.vocab) * self.shape.width

    def implementation_flops(self, input_shape: tuple) -> dict:
        """FLOPs per sample of `input_shape` ((T,) token ids) that the padded vocabulary adds to a
        training step and are no model FLOPs (PaLM's convention): the output layer's extra columns,
        2 x width per padding row per token forward, twice that backward (input and weight gradients)."""
        padding_flops = 2 * self.shape.width * (self.padded_vocab - self.vocab) * int(input_shape[-1])
        return {"forward_flops": padding_flops, "backward_flops": 2 * padding_flops}

    def _init(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.shape.layers) if getattr(module, "residual_projection", False) else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[-1]
        if length > self.shape.context:
            raise ValueError(f"sequence of {length} tokens is longer than the model's context of {self.shape.context}")
        positions = torch.arange(length, device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))  # (batch, T, padded_vocab): the multiply of padded shape
        # the real vocabulary's columns, a view (no copy): the padding never enters a softmax or a loss
        return logits[..., : self.vocab] if self.padded_vocab != self.vocab else logits


def gpt2_small(vocab: int = GPT2_VOCAB) -> GPT:
    return GPT(GPT2_SMALL, vocab)


def gpt2_medium(vocab: int = GPT2_VOCAB) -> GPT:
    return GPT(GPT2_MEDIUM, vocab)


def gpt2_tiny(vocab: int = 256) -> GPT:
    return GPT(GPT2_TINY, vocab)
