"""Models as users write them, for the activation-fault tests and benchmarks (PyTorch, built in code).

- :func:`resnet18`: torchvision's ResNet-18 architecture written out (BasicBlock with one
  ``relu`` module called twice, ``downsample`` Sequential, BatchNorm), random weights.
- :func:`small_net`: an ``nn.Module`` subclass with nested blocks, BatchNorm and a
  residual connection.
"""

from __future__ import annotations

from typing import Any


def _torch() -> Any:
    from conftest import require

    return require("torch")


def resnet18(num_classes: int = 10, seed: int = 0) -> Any:
    """ResNet-18 (torchvision's layout and module names), eval mode; input 3x32x32 works."""
    torch = _torch()
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):  # type: ignore[no-untyped-def]
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            cin, stages = 64, []
            for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
                stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
                cin = cout
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    torch.manual_seed(seed)
    model = ResNet()
    with torch.no_grad():  # non-trivial BatchNorm statistics, as a trained model has
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def small_net(seed: int = 0) -> Any:
    """A user-style subclass: stem conv + BN, a nested residual block, a head; input 3x8x8."""
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1)
            self.bn = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.relu(x + self.conv2(torch.relu(self.bn(self.conv1(x)))))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))
            self.body = nn.ModuleDict({"block": Block(8)})
            self.head = nn.Linear(8 * 8 * 8, 10)
            self.unused = nn.Linear(3, 3)  # defined, never called

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = self.body["block"](torch.relu(self.stem(x)))
            return self.head(torch.flatten(x, 1))

    torch.manual_seed(seed)
    return Net().eval()
