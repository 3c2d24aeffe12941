"""VGG-16 (Simonyan & Zisserman 2015, configuration D), as torchvision's `vgg16` without batch norm.

Thirteen 3x3 convolutions in five stages (64, 128, 256, 512, 512 filters, a 2x2 max pool after
each), an adaptive average pool to 7x7, and three fully connected layers (4096, 4096, classes)
with ReLU and dropout. Module names follow torchvision (`features.N`, `classifier.N`), so a
torchvision state dict loads into it. With 1000 classes: 138,357,544 parameters, 15.5 GFLOPs
(multiply-adds) per 224x224 image. Most of its gradient bytes sit in the first fully connected
layer (102.8M parameters), which backward reaches first: the model Horovod's paper scaled worst
(68% at 512 GPUs).
"""

from torch import Tensor, nn

# filters per conv, "M" a 2x2 max pool: configuration D of the paper's Table 1
VGG16_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG(nn.Module):
    def __init__(self, layout=VGG16_LAYOUT, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in layout:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(channels, item, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = item
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(4096, num_classes),
        )
        # torchvision's initialisation: He (fan-out) for convs, N(0, 0.01) for linear layers
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def vgg16(num_classes: int = 1000) -> VGG:
    return VGG(VGG16_LAYOUT, num_classes)
