"""Models written the way users write them (subclasses, nesting, BatchNorm, tied weights), for tests and benchmarks.

Nothing here is wrapped in ``nn.Sequential`` for the library's sake: these are the
shapes of torchvision's ResNet, a Hugging-Face-style language model with its output
projection tied to the embedding, and a Keras subclassed model.
"""

from __future__ import annotations

from typing import Any


def torch_classes() -> dict[str, Any]:
    """The PyTorch model classes (defined on first use so that importing this module needs no torch)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(c)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.bn(self.conv(x))) + x

    class Net(nn.Module):
        """A user-defined subclass with nested blocks and BatchNorm (int64 num_batches_tracked)."""

        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.blocks = nn.ModuleList([Block(8), Block(8)])
            self.head = nn.Sequential()
            self.head.add_module("pool", nn.AdaptiveAvgPool2d(1))
            self.fc = nn.Linear(8, 10)

        def forward(self, x: Any) -> Any:
            x = self.stem(x)
            for b in self.blocks:
                x = b(x)
            return self.fc(self.head(x).flatten(1))

    class TinyLM(nn.Module):
        """A language model whose output projection is tied to its embedding (as in GPT-2 / BERT heads)."""

        def __init__(self, vocab: int = 50, dim: int = 16) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.norm = nn.LayerNorm(dim)
            self.mlp = nn.Linear(dim, dim)
            self.lm_head = nn.Linear(dim, vocab, bias=False)
            self.lm_head.weight = self.embed.weight  # tied

        def forward(self, ids: Any) -> Any:
            return self.lm_head(torch.tanh(self.mlp(self.norm(self.embed(ids)))))

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet18(nn.Module):
        """torchvision's ResNet-18 topology and parameter names, built in code (``width=64`` is the real size)."""

        def __init__(self, width: int = 64, classes: int = 1000) -> None:
            super().__init__()
            w = width
            self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(w)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            chans = [w, 2 * w, 4 * w, 8 * w]
            cin = w
            for i, c in enumerate(chans, start=1):
                stride = 1 if i == 1 else 2
                setattr(self, f"layer{i}", nn.Sequential(BasicBlock(cin, c, stride), BasicBlock(c, c, 1)))
                cin = c
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return {"Net": Net, "TinyLM": TinyLM, "ResNet18": ResNet18, "BasicBlock": BasicBlock}


def keras_subclassed() -> Any:
    """A Keras 3 subclassed model with a nested custom layer and BatchNormalization, built and trained one step."""
    import keras
    import numpy as np

    class Block(keras.layers.Layer):
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self.inner = keras.layers.Dense(6, name="inner")
            self.bn = keras.layers.BatchNormalization(name="bn")

        def call(self, x: Any, training: bool = False) -> Any:
            return self.bn(self.inner(x), training=training)

    class Classifier(keras.Model):
        def __init__(self) -> None:
            super().__init__(name="classifier")
            self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
            self.block = Block(name="block")
            self.out = keras.layers.Dense(3, name="out")

        def call(self, x: Any, training: bool = False) -> Any:
            return self.out(self.block(self.hidden(x), training=training))

    keras.utils.set_random_seed(0)
    model = Classifier()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(16, 5)).astype("float32"), rng.integers(0, 3, 16), epochs=1, verbose=0)
    return model


def torch_net() -> Any:
    """A campaign factory: the nested-block ``Net`` with BatchNorm (seeded)."""
    import torch

    torch.manual_seed(0)
    return torch_classes()["Net"]().eval()


def evaluate_net(model: Any) -> tuple[Any, float]:
    """A campaign evaluator for ``torch_net``: logits and accuracy on a fixed batch of images."""
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 3, 8, 8, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    with torch.no_grad():
        logits = model(x)
    return logits.numpy(), float(np.mean(logits.argmax(1).numpy() == y.numpy()))
