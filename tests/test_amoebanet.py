"""AmoebaNet-D: published parameter counts, a forward+backward on the CPU-sized network, spatial
sizes, and the registry names.

The big networks are only built, on the meta device (shapes, no storage, no init cost), and
never run here."""

import pickle

import pytest
import torch

from scaling.models import build_model
from scaling.models.amoebanet import AmoebaNetD, Cell, amoebanet_d
from tests.one_thread import one_torch_thread  # noqa: F401  (autouse: one intra-op thread)


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _on_meta(num_layers: int, num_filters: int, num_classes: int) -> AmoebaNetD:
    with torch.device("meta"):
        return amoebanet_d(num_layers, num_filters, num_classes)


# GPipe's table 1 sizes as torchgpipe's benchmark README reports them (1000 classes, 224x224):
# (18, 208) 81.5M, (18, 416) 319.0M, (18, 544) 542.7M. 81,505,540 is torchgpipe's own model's
# exact count (checked against its published code); it rounds to 81.5M (and to GPipe's 82M).
@pytest.mark.parametrize(
    ("num_layers", "num_filters", "expected", "published_millions"),
    [
        (18, 208, 81_505_540, 81.5),
        (18, 416, 319_024_120, 319.0),
        (18, 544, 542_734_840, 542.7),
    ],
)
def test_parameter_counts_match_published(num_layers, num_filters, expected, published_millions):
    count = _num_params(_on_meta(num_layers, num_filters, 1000))
    assert count == expected
    assert round(count / 1e6, 1) == published_millions


def test_parameter_counts_of_other_shipped_sizes():
    assert _num_params(_on_meta(18, 256, 1000)) == 122_470_120
    assert _num_params(amoebanet_d(6, 64, 1000)) == 3_701_096
    assert _num_params(amoebanet_d(6, 64, 10)) == 2_686_346


def test_cell_widths():
    model = _on_meta(18, 208, 1000)
    cells = [m for m in model if isinstance(m, Cell)]
    assert len(cells) == 2 + 18 + 2  # stem cells, normal cells, reductions between the stacks
    assert [c.reduction for c in cells].count(True) == 4
    # Normal cells concatenate 4 states of F channels, reduction cells 3.
    assert model.stack1_normal1.out_channels == 4 * 208
    assert model.reduction1.out_channels == 3 * 416
    assert model.stack3_normal6.out_channels == 4 * 832
    assert model.head.fc.in_features == 16 * 208


def test_forward_backward_small():
    torch.manual_seed(0)
    model = amoebanet_d(6, 64, num_classes=7)
    logits = model(torch.randn(2, 3, 32, 32))  # CIFAR size: the last stack works on 1x1 maps
    assert logits.shape == (2, 7)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize(("size", "final_size"), [(224, 7), (64, 2), (33, 2)])
def test_spatial_sizes(size, final_size):
    # Downsampling by 32 in total, rounding up, so odd sizes line up on every path too.
    model = amoebanet_d(6, 64, num_classes=5).eval()
    seen = {}
    model.stack3_normal2.register_forward_hook(lambda _m, _i, out: seen.update(shape=out[0].shape))
    with torch.no_grad():
        assert model(torch.randn(1, 3, size, size)).shape == (1, 5)
    assert seen["shape"] == (1, 16 * 64, final_size, final_size)


def test_max_pool_is_a_max_pool():
    # torchgpipe's max_pool_3x3 is an average pool; this one is not.
    pools = [m for m in amoebanet_d(6, 64, 10).modules() if isinstance(m, torch.nn.MaxPool2d)]
    assert {m.kernel_size for m in pools} == {2, 3}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("amoebanet_d_18_208", 81_505_540),
        ("amoebanet_d_18_256", 122_470_120),
        ("amoebanet_d_6_64", 3_701_096),
    ],
)
def test_registry_names_build(name, expected):
    with torch.device("meta"):
        model = build_model(name, 1000)
    assert isinstance(model, AmoebaNetD)
    assert _num_params(model) == expected


def test_small_model_pickles():
    # Ray ships models between processes.
    model = pickle.loads(pickle.dumps(amoebanet_d(6, 64, 10)))
    assert _num_params(model) == 2_686_346


@pytest.mark.parametrize(("num_layers", "num_filters"), [(4, 64), (0, 64), (6, 60)])
def test_rejects_bad_sizes(num_layers, num_filters):
    with pytest.raises(ValueError):
        amoebanet_d(num_layers, num_filters, 10)
