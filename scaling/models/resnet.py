"""ResNets in plain torch: the CIFAR family of He et al. 2016 and torchvision's ImageNet family.

- `resnet20`, `resnet56`: the CIFAR-10 networks of He et al. 2016, "Deep Residual Learning for
  Image Recognition", section 4.2. A 3x3 conv stem of 16 filters, three stages of n basic
  blocks (n = 3 and 9) with 16/32/64 filters, global average pooling and a linear classifier.
  Shortcuts are option A: identity, with stride-2 subsampling and zero-padded channels where
  the shape changes, so shortcuts hold no parameters. With 10 classes: 269,722 parameters
  (ResNet-20, the paper's 0.27M) and 853,018 (ResNet-56, 0.85M). The often-quoted 272,474 and
  855,770 are option B counts (1x1 conv + BN projections on the two shape-changing blocks,
  2,752 parameters more), which the paper does not use on CIFAR. Meant for 32x32 inputs.
- `resnet18`, `resnet50`, `resnet101`: the ImageNet networks, layer for layer and name for name
  the same as torchvision's `resnet18` / `resnet50` / `resnet101` (v1.5: the stride of a
  bottleneck sits on its 3x3 conv), so a torchvision state dict loads into them. With 1000
  classes: 11,689,512, 25,557,032 and 44,549,160 parameters. Adaptive average pooling lets them take any input size of
  at least 32x32.

torchvision itself is not a dependency; these are written out so the lab needs only torch.
"""

import torch.nn.functional as F
from torch import Tensor, nn


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    # No bias: every conv is followed by a BatchNorm, whose shift makes a bias redundant.
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)


def _init_weights(model: nn.Module) -> None:
    # torchvision's init; the Linear layer keeps torch's default, as in torchvision.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)


# --- CIFAR ResNets (He et al. 2016, section 4.2) ---------------------------------------------


class PadShortcut(nn.Module):
    """Option A shortcut: subsample by `stride` and append zero channels up to `out_channels`.

    A module rather than a lambda so that models pickle (Ray ships them between processes).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.extra_channels = out_channels - in_channels
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        # Strided slicing gives ceil(H / stride) rows, the same as the 3x3 stride-2 pad-1 conv
        # on the residual branch, so the two always add up for any input size.
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))


class CifarBasicBlock(nn.Module):
    """Two 3x3 convs with BN, added to a parameter-free (option A) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = PadShortcut(in_channels, out_channels, stride)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 inputs: stem, three stages of `n` blocks (16/32/64 filters), pool, fc."""

    def __init__(self, n: int, num_classes: int = 10):
        super().__init__()
        self.conv1 = _conv3x3(3, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_stage(16, 16, n, stride=1)
        self.layer2 = self._make_stage(16, 32, n, stride=2)
        self.layer3 = self._make_stage(32, 64, n, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)
        _init_weights(self)

    @staticmethod
    def _make_stage(in_channels: int, out_channels: int, n: int, stride: int) -> nn.Sequential:
        # Only the first block of a stage changes the shape; the rest keep it.
        blocks = [CifarBasicBlock(in_channels, out_channels, stride)]
        blocks += [CifarBasicBlock(out_channels, out_channels) for _ in range(n - 1)]
        return nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.avgpool(x).flatten(1))


# --- ImageNet ResNets (torchvision's architecture) -------------------------------------------


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: two 3x3 convs, projection shortcut (`downsample`) when shapes change."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (ResNet v1.5): 1x1 reduce, 3x3, 1x1 expand by 4.

    The stride sits on the 3x3 conv, not the first 1x1 as in the original paper: a strided 1x1
    would discard three quarters of its input, and v1.5 is what torchvision's counts refer to.
    """

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        width = planes
        self.conv1 = _conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ImageNet ResNet: 7x7/2 stem and 3x3/2 max pool, four stages, pool, fc."""

    def __init__(self, block: type[BasicBlock | Bottleneck], layers: list[int], num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        _init_weights(self)

    def _make_layer(
        self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int = 1
    ) -> nn.Sequential:
        downsample = None
        # A projection is needed whenever the residual changes shape; for bottlenecks that
        # includes layer1's first block, where 64 channels expand to 256 at stride 1.
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet20(num_classes: int = 10) -> CifarResNet:
    return CifarResNet(n=3, num_classes=num_classes)


def resnet56(num_classes: int = 10) -> CifarResNet:
    return CifarResNet(n=9, num_classes=num_classes)


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes)


def resnet101(num_classes: int = 1000) -> ResNet:
    # Horovod's published 512-GPU benchmark model (Sergeev & Del Balso 2018), for the projection's anchors
    return ResNet(Bottleneck, [3, 4, 23, 3], num_classes)
