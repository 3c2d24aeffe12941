"""Models by name: `build_model("resnet50", num_classes=1000)`.

Every model is plain torch (no Ray, no timers). Unknown names raise `UnknownModelError`
naming the valid ones. A user's own model is named by import path, `package.module:callable`
(the callable takes num_classes and returns the module).

Language models (gpt.py) take token ids, not images: for them `num_classes` is the vocabulary,
and `context_length(name)` is the longest sequence they take (None for the image models).
"""

from collections.abc import Callable

from torch import nn

from scaling.models.amoebanet import amoebanet_d_6_64, amoebanet_d_18_208, amoebanet_d_18_256
from scaling.models.gpt import GPT2_MEDIUM, GPT2_SMALL, GPT2_TINY, gpt2_medium, gpt2_small, gpt2_tiny
from scaling.models.resnet import resnet18, resnet20, resnet50, resnet56, resnet101
from scaling.models.small import SmallCNN
from scaling.models.vgg import vgg16


class UnknownModelError(ValueError):
    pass


# name -> constructor taking num_classes. Add a model here and it is selectable from configs.
MODELS: dict[str, Callable[[int], nn.Module]] = {
    "small_cnn": lambda num_classes: SmallCNN(num_classes),
    "resnet20": resnet20,
    "resnet56": resnet56,
    "resnet18": resnet18,
    "resnet50": resnet50,
    # the models of Horovod's published 512-GPU benchmark (the projection's anchors)
    "resnet101": resnet101,
    "vgg16": vgg16,
    # AmoebaNet-D (L, D), GPipe's model: 81.5M / 122.5M parameters at 1000 classes, and a
    # 3.7M-parameter (6, 64) that trains on a CPU.
    "amoebanet_d_18_208": amoebanet_d_18_208,
    "amoebanet_d_18_256": amoebanet_d_18_256,
    "amoebanet_d_6_64": amoebanet_d_6_64,
    # GPT-2-class decoders (token ids in; num_classes is the vocabulary): GPT-2 small's shapes,
    # 124M parameters at GPT-2's 50,257 tokens, GPT-2 medium's (355M), and a tiny one that trains on
    # a CPU in seconds
    "gpt2-small": gpt2_small,
    "gpt2-medium": gpt2_medium,
    "gpt2-tiny": gpt2_tiny,
}

# Models whose input is a sequence of token ids: name -> the longest sequence (context) they take.
LANGUAGE_MODELS: dict[str, int] = {
    "gpt2-small": GPT2_SMALL.context,
    "gpt2-medium": GPT2_MEDIUM.context,
    "gpt2-tiny": GPT2_TINY.context,
}


def build_model(name: str, num_classes: int) -> nn.Module:
    """A registry model, or a user's: `package.module:callable` taking num_classes (scaling/import_path.py)."""
    from scaling.import_path import is_import_path, load_callable

    if is_import_path(name):
        model = load_callable(name, "model.name", required_args=1)(num_classes)
        if not isinstance(model, nn.Module):
            raise UnknownModelError(f"model.name={name!r} returned {type(model).__name__}, not a torch.nn.Module")
        return model
    try:
        constructor = MODELS[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}; valid models: {', '.join(sorted(MODELS))}") from None
    return constructor(num_classes)


def model_names() -> list[str]:
    return sorted(MODELS)


def context_length(name: str) -> int | None:
    """A registry language model's context (tokens), None for the image models and a user's model."""
    return LANGUAGE_MODELS.get(name)
