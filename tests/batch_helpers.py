"""Factories and data for batched-trial tests: models as users write them, real data, and models that cannot batch.

* ``digits_net``: a user subclass (nested block, BatchNorm1d in eval mode, the trained digits MLP's weights) on
  scikit-learn's bundled digits (``digits_data``);
* ``resnet18``: ``user_models.ResNet18`` (width 8, 10 classes, BatchNorm statistics set) on generated images
  (``images``, labels = the fault-free predictions so that accuracy starts at 1);
* ``tied_lm``: ``user_models.TinyLM`` (output projection tied to the embedding) on token ids (``tokens``);
* ``branchy``: control flow on a faulted layer's values (vmap cannot batch it);
* ``inplace``: writes to its own parameter in ``forward``;
* ``traced_off``: control flow on the input's values (torch.fx cannot trace it);
* ``sizes``: reads the batch size before its faulted layers (no golden prefix to reuse; batches).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import digits_helpers
import user_models


def digits_net() -> Any:
    import torch
    from torch import nn

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 32)
            self.bn = nn.BatchNorm1d(32)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.bn(self.fc(x)))

    class DigitsNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = Hidden()
            self.out = nn.Linear(32, 10)

        def forward(self, x: Any) -> Any:
            return self.out(self.hidden(x))

    w = digits_helpers.weights()
    m = DigitsNet()
    with torch.no_grad():
        m.hidden.fc.weight.copy_(torch.from_numpy(w["hidden/kernel"].T.copy()))
        m.hidden.fc.bias.copy_(torch.from_numpy(w["hidden/bias"]))
        m.hidden.bn.running_mean.fill_(0.05)  # identity-ish BatchNorm with real statistics to flip
        m.hidden.bn.running_var.fill_(1.1)
        m.out.weight.copy_(torch.from_numpy(w["out/kernel"].T.copy()))
        m.out.bias.copy_(torch.from_numpy(w["out/bias"]))
    return m.eval()


def digits_data() -> tuple[np.ndarray, np.ndarray]:
    x, y = digits_helpers.heldout()
    return x[:200], y[:200]


def resnet18(width: int = 8) -> Any:
    import torch

    torch.manual_seed(0)
    m = user_models.torch_classes()["ResNet18"](width=width, classes=10)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    return m.eval()


def images(n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    import torch

    x = np.random.default_rng(5).standard_normal((n, 3, 32, 32), dtype=np.float32)
    with torch.no_grad():
        y = resnet18()(torch.from_numpy(x)).argmax(1).numpy()
    return x, y


def tied_lm() -> Any:
    import torch

    torch.manual_seed(1)
    return user_models.torch_classes()["TinyLM"]().eval()


def tokens() -> tuple[np.ndarray, np.ndarray]:
    import torch

    ids = np.random.default_rng(2).integers(0, 50, size=(24, 6))
    with torch.no_grad():
        y = tied_lm()(torch.from_numpy(ids)).argmax(-1).numpy()
    return ids, y


def _small() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(3)
    return nn.Linear(64, 16), nn.Linear(16, 10)


def branchy() -> Any:
    import torch
    from torch import nn

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = _small()

        def forward(self, x: Any) -> Any:
            h = self.a(x)
            if h.abs().max() > 1e6:  # data-dependent control flow on a faulted layer's values
                h = torch.zeros_like(h)
            return self.b(torch.relu(h))

    return Branchy().eval()


def inplace() -> Any:
    import torch
    from torch import nn

    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = _small()

        def forward(self, x: Any) -> Any:
            with torch.no_grad():
                self.a.weight.clamp_(-3e38, 3e38)  # in-place write to a parameter (a "weight clipping" forward)
            return self.b(torch.relu(self.a(x)))

    return InPlace().eval()


def traced_off() -> Any:
    import torch
    from torch import nn

    class TracedOff(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = _small()

        def forward(self, x: Any) -> Any:
            if x.shape[0] > 0 and float(x.sum()) > -1e9:  # control flow on the input: symbolic tracing fails
                x = x * 1.0
            return self.b(torch.relu(self.a(x)))

    return TracedOff().eval()


def sizes() -> Any:
    import torch
    from torch import nn

    class Sizes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = _small()

        def forward(self, x: Any) -> Any:
            n = x.size(0)
            return self.b(torch.relu(self.a(x))).view(n, -1)

    return Sizes().eval()


def digits_eval(model: Any) -> float:
    """A user evaluator function: accuracy on the digits, computed by running the model itself."""
    import torch

    x, y = digits_data()
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
