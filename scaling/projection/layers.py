"""The models' layer tables, loaded once per model: pure Python (DDP's buckets over them: buckets.py).

Layer tables (`scaling/projection/layers/<model>.json`, written by
`python -m scaling.projection.make_layer_tables`) hold, per leaf module with parameters and in
the order backward makes their gradients ready (measured from DDP), its forward and backward
FLOPs per sample and its parameter tensors. A transformer's table (`"kind": "transformer"`:
gpt2-tiny, gpt2-small, gpt2-medium, llama3-8b) also holds its FSDP `units`, per-token FLOPs, saved
activations and recomputation (make_layer_tables.py); its layers are in reverse forward order,
an estimate of the gradient order (DDP is not probed), and it has no recorded DDP bucket sizes.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from scaling.errors import UsageError

LAYER_DIR = Path(__file__).resolve().parent / "layers"
MIB = 1024 * 1024
BYTES_PER_GRAD_ELEMENT = 4  # fp32 gradients (DDP buckets are in the parameters' dtype)
COMPRESSION_BYTES = {"none": 4, "fp16": 2, "bf16": 2}  # bytes per gradient element on the wire, by DDP hook
FSDP_DTYPES = ("fp32", "bf16")  # FSDP2 MixedPrecisionPolicy: the all-gather's and reduce-scatter's dtypes


def available_models() -> list[str]:
    return sorted(p.stem for p in LAYER_DIR.glob("*.json"))


@lru_cache(maxsize=None)
def load_layer_table(model: str) -> dict:
    """The layer table of `model` (a name from `available_models()`); UsageError if unknown."""
    path = LAYER_DIR / f"{model}.json"
    if not path.is_file():
        raise UsageError(f"no layer table for model {model!r}; known: {', '.join(available_models())}")
    return json.loads(path.read_text())


def available_transformers() -> list[str]:
    """The models whose layer table holds FSDP units (backend fsdp or hsdp)."""
    return [m for m in available_models() if load_layer_table(m).get("kind") == "transformer"]
