"""What a batch and a forward's input hold, as the instrument reads them: the samples a batch counts (its
first tensor's first dimension) and which argument of a model's forward is its input (for the FLOPs profile
and the job's description). Read by the meter (steps, the first training forward) and the A/B window.
"""

from __future__ import annotations

import torch


def first_tensor(value):
    """The first tensor in a batch (a tensor, or one inside a tuple, list or dict, depth first), or None."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


# Keywords of a Hugging Face model's forward that go beside its input, never are it.
_BESIDE_INPUT = frozenset(
    {
        "attention_mask",
        "labels",
        "token_type_ids",
        "position_ids",
        "head_mask",
        "encoder_attention_mask",
        "decoder_attention_mask",
        "cache_position",
        "past_key_values",
    }
)


def model_input(args, kwargs) -> tuple:
    """(input tensor, the keyword it came by or None, a reason or None) of a training forward's arguments.

    The input is the first positional tensor (`model(x)`, as before); else `input_ids=`
    (`model(input_ids=tokens, attention_mask=mask, labels=tokens)`, the Hugging Face call); else
    the one keyword tensor that is not an attention mask, labels or the like (`pixel_values=`).
    Anything else cannot be told apart: no input, and the reason in one line.
    """
    first = first_tensor(args)
    if first is not None:
        return first, None, None
    kwargs = kwargs or {}
    ids = kwargs.get("input_ids")
    if isinstance(ids, torch.Tensor):
        return ids, "input_ids", None
    candidates = [
        name for name, value in kwargs.items() if isinstance(value, torch.Tensor) and name not in _BESIDE_INPUT
    ]
    if len(candidates) == 1:
        return kwargs[candidates[0]], candidates[0], None
    given = ", ".join(f"{name}=" for name, value in kwargs.items() if isinstance(value, torch.Tensor))
    if not given:
        return None, None, "the model's first training forward got no tensor (positional or keyword): no input to count"
    return (
        None,
        None,
        (
            f"the model's first training forward got no positional tensor and no input_ids, only "
            f"{given}: which is the input is not known"
        ),
    )


def batch_samples(batch) -> int:
    """The samples a batch holds: its first tensor's first dimension (1 for a batch with no tensor, or a scalar)."""
    first = first_tensor(batch)
    return int(first.shape[0]) if first is not None and first.dim() else 1
