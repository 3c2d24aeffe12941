"""Llama 3.1 8B's shape as a torch module, for the projection's layer table only: built on the meta
device by make_layer_tables.py (shapes, FLOPs, saved activations), never trained by the lab and
never imported by the projection package itself (it needs torch).

The architecture as torchtitan writes it (`torchtitan/models/llama3/model/model.py`, whose module
names it keeps: tok_embeddings, layers.N.attention.wq/wk/wv/wo, layers.N.feed_forward.w1/w2/w3,
attention_norm, ffn_norm, norm, output): pre-norm blocks with RMSNorm, grouped-query attention
with rotary position embeddings (RoPE), a SwiGLU feed-forward, an output head not tied to the
embedding, no biases. Llama 3.1 8B (Meta's model card; torchtitan's `llama3_configs["8B"]`):
32 layers, width 4,096, 32 heads of 128, 8 KV heads, feed-forward 14,336 (torchtitan: 4 x 4,096
x 2/3 x ffn_dim_multiplier 1.3, rounded up to a multiple of 1,024), vocabulary 128,256, RoPE theta
500,000: 8,030,261,248 parameters.

RoPE is applied with real cos/sin tables (rotate-half), not torchtitan's complex multiply: the
same arithmetic, which FLOP counting leaves out either way (elementwise), and real tensors run
on the meta device without complex kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    width: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    context: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


LLAMA3_8B = LlamaShape(layers=32, width=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, context=8192)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(shape: LlamaShape, length: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (length, head_dim), for rotate-half RoPE."""
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, device=device).float() / shape.head_dim))
    angles = torch.outer(torch.arange(length, device=device).float(), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.wq = nn.Linear(shape.width, shape.heads * shape.head_dim, bias=False)
        self.wk = nn.Linear(shape.width, shape.kv_heads * shape.head_dim, bias=False)
        self.wv = nn.Linear(shape.width, shape.kv_heads * shape.head_dim, bias=False)
        self.wo = nn.Linear(shape.heads * shape.head_dim, shape.width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.wq(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # grouped-query attention: each KV head serves heads / kv_heads query heads (torchtitan repeat_kv)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.w1 = nn.Linear(shape.width, shape.ffn, bias=False)
        self.w2 = nn.Linear(shape.ffn, shape.width, bias=False)
        self.w3 = nn.Linear(shape.width, shape.ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.attention = Attention(shape)
        self.feed_forward = FeedForward(shape)
        self.attention_norm = RMSNorm(shape.width, shape.norm_eps)
        self.ffn_norm = RMSNorm(shape.width, shape.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token ids (batch, T <= context) -> logits (batch, T, vocab)."""

    def __init__(self, shape: LlamaShape = LLAMA3_8B):
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.width)
        self.layers = nn.ModuleList(TransformerBlock(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.width, shape.norm_eps)
        self.output = nn.Linear(shape.width, shape.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[-1]
        if length > self.shape.context:
            raise ValueError(f"sequence of {length} tokens is longer than the model's context of {self.shape.context}")
        cos, sin = rope_tables(self.shape, length, ids.device)
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


def llama3_8b(vocab: int = LLAMA3_8B.vocab) -> Llama:
    """Llama 3.1 8B; build it under `torch.device("meta")` (32 GB of fp32 weights otherwise)."""
    shape = LLAMA3_8B if vocab == LLAMA3_8B.vocab else LlamaShape(**{**LLAMA3_8B.__dict__, "vocab": vocab})
    return Llama(shape)
