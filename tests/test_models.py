"""Model zoo: published parameter counts, a forward+backward for every registered image model, and
the error for an unknown name. The language models (token ids in) have theirs in
tests/test_transformer.py."""

import pytest
import torch

from scaling.models import UnknownModelError, build_model, context_length, model_names
from scaling.models.resnet import PadShortcut
from tests.one_thread import one_torch_thread  # noqa: F401  (autouse: one intra-op thread)


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# CIFAR: He et al. 2016 table 6 gives 0.27M and 0.85M; the exact figures are the option A
# (parameter-free shortcut) counts. 272,474 / 855,770, also seen quoted, are option B counts
# (2,752 more for the 1x1 conv + BN projections), which would mean the wrong shortcut.
# ImageNet: torchvision's model cards.
@pytest.mark.parametrize(
    ("name", "num_classes", "expected"),
    [
        ("resnet20", 10, 269_722),
        ("resnet56", 10, 853_018),
        ("resnet18", 1000, 11_689_512),
        ("resnet50", 1000, 25_557_032),
        ("resnet101", 1000, 44_549_160),
        ("vgg16", 1000, 138_357_544),
    ],
)
def test_parameter_counts(name, num_classes, expected):
    with torch.device("meta"):  # shapes only: no storage, no initialisation (VGG-16 alone is 138M parameters)
        model = build_model(name, num_classes)
    assert _num_params(model) == expected


def test_cifar_shortcuts_hold_no_parameters():
    model = build_model("resnet20", 10)
    shortcuts = [m for m in model.modules() if isinstance(m, PadShortcut)]
    assert len(shortcuts) == 2  # the first block of stages 2 and 3
    assert all(_num_params(m) == 0 for m in shortcuts)


def test_imagenet_resnets_use_torchvision_module_names():
    with torch.device("meta"):
        resnet50, resnet18 = build_model("resnet50", 1000), build_model("resnet18", 1000)
    names = set(resnet50.state_dict())
    for key in (
        "conv1.weight",
        "bn1.running_mean",
        "layer1.0.downsample.0.weight",
        "layer1.0.downsample.1.weight",
        "layer2.0.conv2.weight",
        "layer4.2.bn3.bias",
        "fc.weight",
        "fc.bias",
    ):
        assert key in names
    assert resnet50.layer2[0].conv1.stride == (1, 1)
    assert resnet50.layer2[0].conv2.stride == (2, 2)  # v1.5: the stride sits on the 3x3
    assert "layer1.0.downsample.0.weight" not in resnet18.state_dict()


# ImageNet models get 64x64 to stay fast; adaptive average pooling makes any size >= 32 work.
# AmoebaNet-D also pools adaptively; at 32x32 its last stack works on 1x1 maps, which is enough for
# training-mode BatchNorm at batch 2.
_INPUT_SIZE = {
    "small_cnn": 32,
    "resnet20": 32,
    "resnet56": 32,
    "resnet18": 64,
    "resnet50": 64,
    "resnet101": 64,
    "vgg16": 32,
    "amoebanet_d_6_64": 32,
    "amoebanet_d_18_208": 32,
    "amoebanet_d_18_256": 32,
}

# 81.5M and 122.5M parameters: a CPU forward+backward takes tens of seconds even at 32x32.
# amoebanet_d_6_64 runs the same cells here, and tests/test_amoebanet.py checks that these build
# and have the published parameter counts.
_TOO_SLOW_ON_CPU = {"amoebanet_d_18_208", "amoebanet_d_18_256"}
IMAGE_MODELS = [name for name in model_names() if context_length(name) is None]


def test_every_registered_image_model_has_an_input_size():
    assert set(IMAGE_MODELS) == set(_INPUT_SIZE)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="too slow on a CPU: runs where a CUDA GPU is"
            ),
        )
        if name in _TOO_SLOW_ON_CPU
        else name
        for name in IMAGE_MODELS
    ],
)
def test_forward_backward(name):
    torch.manual_seed(0)
    device = torch.device("cuda" if name in _TOO_SLOW_ON_CPU else "cpu")  # the full-size ones on the GPU
    num_classes, batch = 7, 2
    model = build_model(name, num_classes).to(device)
    size = _INPUT_SIZE[name]
    logits = model(torch.randn(batch, 3, size, size, device=device))
    assert logits.shape == (batch, num_classes)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1], device=device)).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname


def test_unknown_model_lists_valid_names():
    with pytest.raises(UnknownModelError) as excinfo:
        build_model("nope", 10)
    message = str(excinfo.value)
    assert "nope" in message
    for name in model_names():
        assert name in message
