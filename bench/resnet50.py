"""ResNet-50-sized parameter sets for benchmarks (shapes of keras.applications.ResNet50).

``resnet50_shapes()`` lists the 320 weight arrays of ResNet-50 (53 convolutions with
bias, 53 batch-norms with 4 vectors each, the 2048×1000 classifier) in the legacy
Keras naming, plus the 0-d ``optimizer_weights/iterations:0`` counter saved beside
them — 321 tensors, 25,636,713 values, 320 of them float32.

>>> shapes = resnet50_shapes()
>>> len(shapes), sum(int(np.prod(s)) for _, s, _ in shapes)
(321, 25636713)
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

__all__ = ["resnet50_shapes", "write_keras_legacy_checkpoint", "resnet50_arrays", "write_large_checkpoint"]


def _conv(name: str, k: int, cin: int, cout: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield f"{name}/kernel:0", (k, k, cin, cout)
    yield f"{name}/bias:0", (cout,)


def _bn(name: str, c: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    for v in ("gamma", "beta", "moving_mean", "moving_variance"):
        yield f"{name}/{v}:0", (c,)


def resnet50_shapes() -> list[tuple[str, tuple[int, ...], str]]:
    """(layer-qualified weight name, shape, dtype) of ResNet-50 in the legacy Keras layout."""
    out: list[tuple[str, tuple[int, ...]]] = []
    out += _conv("conv1_conv", 7, 3, 64)
    out += _bn("conv1_bn", 64)
    cin = 64
    for stage, (blocks, width) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)], start=2):
        for b in range(1, blocks + 1):
            p = f"conv{stage}_block{b}"
            if b == 1:
                out += _conv(f"{p}_0_conv", 1, cin, 4 * width)
                out += _bn(f"{p}_0_bn", 4 * width)
            out += _conv(f"{p}_1_conv", 1, cin, width)
            out += _bn(f"{p}_1_bn", width)
            out += _conv(f"{p}_2_conv", 3, width, width)
            out += _bn(f"{p}_2_bn", width)
            out += _conv(f"{p}_3_conv", 1, width, 4 * width)
            out += _bn(f"{p}_3_bn", 4 * width)
            cin = 4 * width
    out += [("predictions/kernel:0", (2048, 1000)), ("predictions/bias:0", (1000,))]
    named = [(f"model_weights/{n.split('/')[0]}/{n}", s, "<f4") for n, s in out]
    return named + [("optimizer_weights/iterations:0", (), "<i8")]


def resnet50_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Random values with the ResNet-50 shapes (float32 ~ N(0, 0.05))."""
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s, dtype=np.float32) * 0.05).astype(d) if d == "<f4" else np.zeros(s, d)
            for n, s, d in resnet50_shapes()}


def write_keras_legacy_checkpoint(path: str | os.PathLike[str], seed: int = 0) -> str:
    """A ~100 MB checkpoint in the legacy Keras ``model.save`` layout with ResNet-50's 321 tensors."""
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = "2.15.0"
        f.attrs["backend"] = "tensorflow"
        for name, arr in resnet50_arrays(seed).items():
            f.create_dataset(name, data=arr)
    return os.fspath(path)


def write_large_checkpoint(path: str | os.PathLike[str], gib: float = 2.0, tensors: int = 64) -> str:
    """A checkpoint of about ``gib`` GiB of float32 in ``tensors`` datasets, written in blocks (flat memory)."""
    import h5py

    per = int(gib * 2**30 / 4 / tensors)
    rows = 1 << 20
    block = np.random.default_rng(1).standard_normal(rows, dtype=np.float32)
    with h5py.File(path, "w") as f:
        for i in range(tensors):
            d = f.create_dataset(f"model_weights/layer{i}/layer{i}/kernel:0", shape=(per,), dtype="<f4")
            for s in range(0, per, rows):
                e = min(per, s + rows)
                d[s:e] = block[: e - s]
    return os.fspath(path)
