"""A ResNet-50-sized set of weights and a constant evaluator (the campaign overhead benchmark's target)."""

from __future__ import annotations

import numpy as np


def resnet50_shapes() -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of torchvision's ResNet-50 (25.6 M parameters, BN running stats excluded)."""
    shapes: dict[str, tuple[int, ...]] = {"conv1.weight": (64, 3, 7, 7)}

    def bn(name: str, c: int) -> None:
        shapes[f"{name}.weight"] = (c,)
        shapes[f"{name}.bias"] = (c,)

    bn("bn1", 64)
    inplanes = 64
    for li, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            p = f"layer{li}.{b}"
            shapes[f"{p}.conv1.weight"] = (planes, inplanes, 1, 1)
            bn(f"{p}.bn1", planes)
            shapes[f"{p}.conv2.weight"] = (planes, planes, 3, 3)
            bn(f"{p}.bn2", planes)
            shapes[f"{p}.conv3.weight"] = (planes * 4, planes, 1, 1)
            bn(f"{p}.bn3", planes * 4)
            if b == 0:
                shapes[f"{p}.downsample.0.weight"] = (planes * 4, inplanes, 1, 1)
                bn(f"{p}.downsample.1", planes * 4)
            inplanes = planes * 4
    shapes["fc.weight"] = (1000, 2048)
    shapes["fc.bias"] = (1000,)
    return shapes


def resnet50_weights() -> dict[str, np.ndarray]:
    """Seeded float32 weights of ResNet-50's shapes (about 98 MiB)."""
    rng = np.random.default_rng(0)
    return {k: (rng.standard_normal(s, dtype=np.float32) * 0.05) for k, s in resnet50_shapes().items()}


def constant(weights: object) -> float:
    """The overhead-only evaluator: the same answer whatever the weights."""
    return 1.0
