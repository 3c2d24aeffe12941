"""AmoebaNet-D(L, D) in plain torch, the image classifier GPipe scaled up.

AmoebaNet-D is the cell found by regularized evolution in Real et al. 2019, "Regularized
Evolution for Image Classifier Architecture Search" (AAAI), and the network Huang et al. 2019,
"GPipe: Easy Scaling with Micro-Batch Pipeline Parallelism", scale up in their experiments
(table 1). `L` is the number of normal cells and `D` the number of filters of the first stack
of normal cells. The cell genotype (operations, their inputs, the concatenated outputs) is the
one of TensorFlow's reference implementation (tensorflow/tpu models/official/amoeba_net,
`model_specs.py`, cell "amoeba_net_d"), which is also the one of kakaobrain/torchgpipe's
benchmark model (benchmarks/models/amoebanet); the layout and widths are torchgpipe's. The
normal cell concatenates hidden states 0, 3, 4, 6 (TensorFlow's `used_hiddenstates` mask), not
4, 5, 6 as torchgpipe reads the paper; with 0, 3, 4, 6 the parameter counts come out as
published.

Layout (torchgpipe's), for an H x W input:

    stem        3x3 conv, stride 2, D/4 filters, + BN                         H/2
    stem cells  two reduction cells with D/2 and D filters                  H/8
    stack 1     L/3 normal cells with D filters, 4D channels out            H/8
    reduction   2D filters                                                   H/16
    stack 2     L/3 normal cells with 2D filters, 8D channels out           H/16
    reduction   4D filters                                                   H/32
    stack 3     L/3 normal cells with 4D filters, 16D channels out          H/32
    head        ReLU, global average pool, linear classifier

Every cell takes the outputs of the two cells before it, (current, previous), and returns
(its output, current), so the whole network is an `nn.Sequential` of cells that can be cut
anywhere for pipeline parallelism. A cell first maps both inputs to its filter count F
(ReLU-1x1 conv-BN; a factorized reduction when `previous` has twice the spatial size), then
builds five new hidden states, each the sum of two operations on earlier states, and
concatenates some of them (4 states in a normal cell: 4F channels; 3 in a reduction cell:
3F). In a reduction cell the operations reading the two inputs have stride 2.

Parameters with 1000 classes, the same as torchgpipe's model to the last one:

    (L, D)       parameters      torchgpipe's benchmark README   GPipe, table 1
    (18, 208)    81,505,540      81.5M                           82M
    (18, 256)    122,470,120
    (18, 416)    319,024,120     319.0M                          318M
    (18, 544)    542,734,840     542.7M                          542M
    (36, 544)    1,055,832,376   1.06B                           1.05B
    (72, 512)    1,844,858,344   1.84B                           1.8B
    (6, 64)      3,701,096       (CPU-sized; 2,686,346 with 10 classes)

Forward FLOPs per 224x224 image (convs and the classifier, 2 per multiply-add, as counted by
torch.utils.flop_counter): 20.04G for (18, 208), 30.34G for (18, 256), 0.85G for (6, 64).

Differences from torchgpipe's code, none of which changes the parameter count:
- torchgpipe's `max_pool_3x3` is an average pool (a slip); here it is a max pool, as in
  TensorFlow's implementation and the paper.
- No ReLU on the raw input image before the stem conv (torchgpipe has one; TensorFlow not).
- ReLU before the global pool, as in TensorFlow (torchgpipe omits it), and an adaptive
  global pool instead of a fixed 7x7 one, so any input size works.
- The 2x2 max pool rounds up (TensorFlow's SAME padding), so odd feature maps line up with
  the other stride-2 paths instead of coming out one row short.
- The stride-2 "none" (identity) operation is TensorFlow's ReLU-1x1 conv (stride 2)-BN;
  torchgpipe uses a factorized reduction there, which has the same parameters and MACs.

Not modelled: the auxiliary head and drop-path of the TensorFlow training recipe (torchgpipe
has neither, and its counts match GPipe's).

One layout difference between torchgpipe (followed here) and TensorFlow's reference does change
the count: TensorFlow's stem conv has 32 filters (no padding) and its two stem cells D/4 and
D/2 filters, torchgpipe's D/4, D/2 and D. By a rough count the TensorFlow layout has about 0.3M
fewer parameters at D = 208 (about 81.2M); torchgpipe's 81.5M is the one that rounds to GPipe's
82M.

Input size: the network downsamples by 32 in total (every stride-2 path rounds up), so any
input size runs, odd ones included; at 224x224 the last stack works on 7x7 feature maps, at
32x32 (CIFAR) on 1x1. With 1x1 maps, training-mode BatchNorm needs a batch of at least 2.
"""

from collections import OrderedDict

import torch
from torch import Tensor, nn

# --- genotype ---------------------------------------------------------------------------------
# Hidden states of a cell: 0 = the cell's current input, 1 = its previous input (both after the
# cell's input projection), 2..6 = the five combinations below, in order. Each combination is
# (operation, input state) for its left and its right operand; the two results are added.

NORMAL_COMBINATIONS = (
    (("conv_1x1", 1), ("max_pool_3x3", 1)),
    (("none", 1), ("conv_1x7_7x1", 0)),
    (("conv_1x1", 0), ("conv_1x7_7x1", 0)),
    (("max_pool_3x3", 2), ("none", 2)),
    (("avg_pool_3x3", 1), ("conv_1x1", 5)),
)
NORMAL_OUTPUTS = (0, 3, 4, 6)  # the unread states 3, 4, 6, plus state 0 (TensorFlow's mask)

REDUCTION_COMBINATIONS = (
    (("max_pool_2x2", 0), ("max_pool_3x3", 0)),
    (("none", 2), ("conv_3x3", 1)),
    (("conv_1x7_7x1", 2), ("max_pool_3x3", 2)),
    (("none", 3), ("max_pool_2x2", 1)),
    (("avg_pool_3x3", 2), ("conv_1x1", 3)),
)
REDUCTION_OUTPUTS = (4, 5, 6)  # the states no combination reads


# --- operations -------------------------------------------------------------------------------


def _relu_conv_bn(
    in_channels: int,
    out_channels: int,
    kernel_size: int | tuple[int, int] = 1,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
) -> list[nn.Module]:
    # No conv bias: the BN shift makes it redundant.
    return [
        nn.ReLU(),
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=False),
        nn.BatchNorm2d(out_channels),
    ]


class FactorizedReduce(nn.Module):
    """Halve the spatial size without dropping pixels: two stride-2 1x1 convs, one on the input
    and one on the input shifted by one pixel, each giving half the output channels."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        assert out_channels % 2 == 0, out_channels
        self.relu = nn.ReLU()
        self.conv_even = nn.Conv2d(in_channels, out_channels // 2, 1, stride=2, bias=False)
        self.conv_odd = nn.Conv2d(in_channels, out_channels // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(x)
        # Shift by one pixel (zero-padding the far edge) so both paths give ceil(H/2) rows.
        shifted = nn.functional.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.bn(torch.cat([self.conv_even(x), self.conv_odd(shifted)], dim=1))


def _bottleneck(channels: int, middle: list[nn.Module]) -> nn.Sequential:
    """ReLU-1x1-BN down to channels/4, the `middle` convs, ReLU-1x1-BN back up (TensorFlow's
    bottleneck around the 3x3 and 1x7+7x1 convs)."""
    quarter = channels // 4
    return nn.Sequential(*_relu_conv_bn(channels, quarter), *middle, *_relu_conv_bn(quarter, channels))


def make_operation(name: str, channels: int, stride: int) -> nn.Module:
    """One cell operation, `channels` in and out, spatial size divided by `stride` (rounded up)."""
    quarter = channels // 4
    if name == "none":
        # Identity; with stride 2 it needs a strided 1x1 conv to match shapes (TensorFlow's choice).
        return nn.Identity() if stride == 1 else nn.Sequential(*_relu_conv_bn(channels, channels, 1, stride))
    if name == "conv_1x1":
        return nn.Sequential(*_relu_conv_bn(channels, channels, 1, stride))
    if name == "conv_3x3":
        return _bottleneck(channels, _relu_conv_bn(quarter, quarter, 3, stride, 1))
    if name == "conv_1x7_7x1":
        return _bottleneck(
            channels,
            [
                *_relu_conv_bn(quarter, quarter, (1, 7), (1, stride), (0, 3)),
                *_relu_conv_bn(quarter, quarter, (7, 1), (stride, 1), (3, 0)),
            ],
        )
    if name == "avg_pool_3x3":
        # TensorFlow's SAME average pool does not count the padding.
        return nn.AvgPool2d(3, stride, padding=1, count_include_pad=False)
    if name == "max_pool_3x3":
        return nn.MaxPool2d(3, stride, padding=1)
    if name == "max_pool_2x2":
        # ceil_mode: like SAME padding, an odd row count rounds up, as every other stride-2 path.
        return nn.MaxPool2d(2, stride, ceil_mode=True)
    raise ValueError(f"unknown AmoebaNet operation {name!r}")


# --- cells ------------------------------------------------------------------------------------


class Cell(nn.Module):
    """A normal or reduction cell with `channels` filters.

    Takes (current, previous): the outputs of the last two cells, with `current_channels` and
    `previous_channels` channels; `previous` has twice the spatial size of `current` when
    `previous_is_larger` (the cell before was a reduction). Returns (output, current).
    """

    def __init__(
        self,
        current_channels: int,
        previous_channels: int,
        channels: int,
        reduction: bool,
        previous_is_larger: bool,
    ):
        super().__init__()
        self.reduction = reduction
        self.project_current = nn.Sequential(*_relu_conv_bn(current_channels, channels))
        if previous_is_larger:
            self.project_previous: nn.Module = FactorizedReduce(previous_channels, channels)
        elif previous_channels != channels:
            self.project_previous = nn.Sequential(*_relu_conv_bn(previous_channels, channels))
        else:
            self.project_previous = nn.Identity()

        combinations = REDUCTION_COMBINATIONS if reduction else NORMAL_COMBINATIONS
        self.outputs = REDUCTION_OUTPUTS if reduction else NORMAL_OUTPUTS
        self.inputs: list[tuple[int, int]] = []
        self.operations = nn.ModuleList()
        for left, right in combinations:
            self.inputs.append((left[1], right[1]))
            for op_name, state in (left, right):
                # In a reduction cell, only the operations on the cell inputs (states 0, 1) stride.
                stride = 2 if reduction and state < 2 else 1
                self.operations.append(make_operation(op_name, channels, stride))
        self.out_channels = channels * len(self.outputs)

    def forward(self, inputs: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        current, previous = inputs
        states = [self.project_current(current), self.project_previous(previous)]
        for i, (left, right) in enumerate(self.inputs):
            states.append(self.operations[2 * i](states[left]) + self.operations[2 * i + 1](states[right]))
        return torch.cat([states[i] for i in self.outputs], dim=1), current

    def extra_repr(self) -> str:
        return f"reduction={self.reduction}, inputs={self.inputs}, outputs={self.outputs}"


class Stem(nn.Module):
    """3x3 stride-2 conv + BN; returns (x, x) so the first cell sees it as both of its inputs."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = self.bn(self.conv(x))
        return x, x


class Head(nn.Module):
    """ReLU, global average pool and the linear classifier, on the last cell's output."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, inputs: tuple[Tensor, Tensor]) -> Tensor:
        x, _ = inputs
        return self.fc(torch.flatten(self.pool(self.relu(x)), 1))


# --- network ----------------------------------------------------------------------------------


class AmoebaNetD(nn.Sequential):
    """AmoebaNet-D(num_layers, num_filters): an `nn.Sequential` of stem, cells and head, whose
    children pass (current, previous) tuples between them (see the module docstring)."""

    def __init__(self, num_layers: int, num_filters: int, num_classes: int):
        if num_layers % 3 != 0 or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive multiple of 3, got {num_layers}")
        if num_filters % 8 != 0:
            # The stem cells use num_filters/4 and num_filters/2 filters; the factorized reduction
            # and the bottlenecks split those again by 2 and 4.
            raise ValueError(f"num_filters must be a multiple of 8, got {num_filters}")

        layers: OrderedDict[str, nn.Module] = OrderedDict()
        stem_channels = num_filters // 4
        layers["stem"] = Stem(stem_channels)

        # Channel bookkeeping of the last two outputs, updated as cells are appended.
        current_channels = previous_channels = stem_channels
        previous_is_larger = False

        def add_cell(name: str, channels: int, reduction: bool) -> None:
            nonlocal current_channels, previous_channels, previous_is_larger
            cell = Cell(current_channels, previous_channels, channels, reduction, previous_is_larger)
            layers[name] = cell
            previous_channels, current_channels = current_channels, cell.out_channels
            previous_is_larger = reduction

        add_cell("stem_reduction1", num_filters // 2, reduction=True)
        add_cell("stem_reduction2", num_filters, reduction=True)
        for stack in range(3):
            filters = num_filters * 2**stack
            if stack > 0:
                add_cell(f"reduction{stack}", filters, reduction=True)
            for i in range(num_layers // 3):
                add_cell(f"stack{stack + 1}_normal{i + 1}", filters, reduction=False)
        layers["head"] = Head(current_channels, num_classes)

        super().__init__(layers)
        self.num_layers = num_layers
        self.num_filters = num_filters
        _init_weights(self)


def _init_weights(model: nn.Module) -> None:
    # TensorFlow's reference uses fan-out variance scaling for the convs; BN starts at identity.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def amoebanet_d(num_layers: int, num_filters: int, num_classes: int) -> AmoebaNetD:
    """AmoebaNet-D(L=num_layers, D=num_filters) for `num_classes` classes."""
    return AmoebaNetD(num_layers, num_filters, num_classes)


# Named sizes for the registry (each a picklable callable of num_classes).


def amoebanet_d_18_208(num_classes: int) -> AmoebaNetD:
    """GPipe's AmoebaNet-D (18, 208): 81.5M parameters at 1000 classes."""
    return amoebanet_d(18, 208, num_classes)


def amoebanet_d_18_256(num_classes: int) -> AmoebaNetD:
    """AmoebaNet-D (18, 256): 122.5M parameters at 1000 classes."""
    return amoebanet_d(18, 256, num_classes)


def amoebanet_d_6_64(num_classes: int) -> AmoebaNetD:
    """A CPU-sized AmoebaNet-D (6, 64): 3.7M parameters at 1000 classes."""
    return amoebanet_d(6, 64, num_classes)
