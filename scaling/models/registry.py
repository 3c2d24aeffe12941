"""Models by name: `build_model("resnet50", num_classes=1000)`.

Every model is plain torch (no Ray, no timers). Unknown names raise `UnknownModelError`
naming the valid ones.
"""

from collections.abc import Callable

from torch import nn

from scaling.models.resnet import resnet18, resnet20, resnet50, resnet56
from scaling.models.small import SmallCNN


class UnknownModelError(ValueError):
    pass


# name -> constructor taking num_classes. Add a model here and it is selectable from configs.
MODELS: dict[str, Callable[[int], nn.Module]] = {
    "small_cnn": lambda num_classes: SmallCNN(num_classes),
    "resnet20": resnet20,
    "resnet56": resnet56,
    "resnet18": resnet18,
    "resnet50": resnet50,
}


def build_model(name: str, num_classes: int) -> nn.Module:
    try:
        constructor = MODELS[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}; valid models: {', '.join(sorted(MODELS))}") from None
    return constructor(num_classes)


def model_names() -> list[str]:
    return sorted(MODELS)
