"""Live-tensor injection speed: per-trial cost, bulk flips/s, and PyTorchFI side by side.

Run: ``pytest bench/bench_live.py --benchmark-only --benchmark-columns=min,median,max,rounds``.
Figures go to bench/README.md (section "Live tensors and word kernels").
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fastflip import live
from fastflip.core.sampling import SiteSpace
from fastflip.core.spec import Sampling
from resnet50 import resnet50_arrays


@pytest.fixture(scope="module")
def resnet() -> tuple[live.Targets, SiteSpace, dict[str, np.ndarray]]:
    arrays = resnet50_arrays()  # 321 tensors, 25.6M values (320 float32 + one int64 counter)
    tg = live.targets(arrays)
    floats = [r for r in tg.refs() if r.dtype == "<f4"]
    return tg, SiteSpace(floats), arrays


@pytest.mark.parametrize("flips", [1, 10])
def test_trial_same_plan(benchmark, resnet, flips: int) -> None:
    """One trial = inject + revert of a plan generated once and applied many times."""
    tg, space, arrays = resnet
    plan = space.plan(Sampling(count=flips), seed=1)
    benchmark(lambda: live.revert(tg, live.inject(tg, plan)))


@pytest.mark.parametrize("flips", [1, 10])
def test_trial_fresh_plan(benchmark, resnet, flips: int) -> None:
    """inject + revert of a plan never seen before (its validation included; sampling not included)."""
    tg, space, arrays = resnet
    k = Sampling(count=flips)
    plans = iter([space.plan(k, seed=2, stream=(i,)) for i in range(3000)])
    benchmark.pedantic(lambda p: live.revert(tg, live.inject(tg, p)), setup=lambda: ((next(plans),), {}),
                       rounds=2500, warmup_rounds=0)


@pytest.mark.parametrize("flips", [1, 10])
def test_trial_sample_inject_revert(benchmark, resnet, flips: int) -> None:
    """A whole statistical trial: draw the plan (seeded), inject, revert."""
    tg, space, arrays = resnet
    counter, k = itertools.count(), Sampling(count=flips)
    benchmark(lambda: live.revert(tg, live.inject(tg, space.plan(k, seed=3, stream=(next(counter),)))))


def test_bulk_inject_1m(benchmark, resnet) -> None:
    """1M flips: inject alone (the plan prepared once; each round reverts outside the timing)."""
    tg, space, arrays = resnet
    plan = space.plan(Sampling(count=1_000_000), seed=4)
    state = {}

    def setup():
        if "log" in state:
            live.revert(tg, state.pop("log"))
        return (), {}

    def run():
        state["log"] = live.inject(tg, plan)

    benchmark.pedantic(run, setup=setup, rounds=20, warmup_rounds=1)
    live.revert(tg, state.pop("log"))
    benchmark.extra_info["flips"] = 1_000_000


def test_bulk_inject_revert_1m(benchmark, resnet) -> None:
    tg, space, arrays = resnet
    plan = space.plan(Sampling(count=1_000_000), seed=5)
    benchmark.pedantic(lambda: live.revert(tg, live.inject(tg, plan)), rounds=20, warmup_rounds=1)


# ------------------------------------------------------------------ the same model in PyTorch, and PyTorchFI


def torch_resnet50():
    """ResNet-50 (torchvision's architecture, written out here; random weights, no download)."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int, down: bool) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, 4 * width, 1, bias=False), nn.BatchNorm2d(4 * width)
            self.downsample = (nn.Sequential(nn.Conv2d(cin, 4 * width, 1, stride, bias=False), nn.BatchNorm2d(4 * width))
                               if down else None)

        def forward(self, x):  # type: ignore[no-untyped-def]
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return torch.relu(y + (x if self.downsample is None else self.downsample(x)))

    layers, cin = [], 64
    for blocks, width, stride in [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)]:
        stage = []
        for b in range(blocks):
            stage.append(Bottleneck(cin, width, stride if b == 0 else 1, b == 0))
            cin = 4 * width
        layers.append(nn.Sequential(*stage))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                          *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))
    return model.eval()


@pytest.fixture(scope="module")
def torch_model():
    return torch_resnet50()


@pytest.mark.parametrize("flips", [1, 10])
def test_torch_module_trial_fastflip(benchmark, torch_model, flips: int) -> None:
    """fastflip on the PyTorch ResNet-50 module: plan drawn over its weight tensors, inject + revert."""
    tg = live.targets(torch_model)
    convs = [r for r in tg.refs() if r.name.endswith(".weight") and len(r.shape) == 4]
    space = SiteSpace(convs)
    counter, k = itertools.count(), Sampling(count=flips)
    benchmark(lambda: live.revert(tg, live.inject(tg, space.plan(k, seed=6, stream=(next(counter),)))))


@pytest.mark.parametrize("flips", [1, 10])
def test_torch_module_trial_pytorchfi(benchmark, torch_model, flips: int) -> None:
    """PyTorchFI's per-trial weight injection on the same module (it deep-copies the model every trial)."""
    core = pytest.importorskip("pytorchfi.core", reason="pytorchfi not installed (pip install --no-deps pytorchfi==0.6.0)")
    torch = pytest.importorskip("torch")
    pfi = core.fault_injection(torch_model, 1, input_shape=[3, 224, 224], layer_types=[torch.nn.Conv2d], use_cuda=False)
    rng = np.random.default_rng(7)
    shapes = [pfi.get_weights_size(i) for i in range(pfi.get_total_layers())]

    def trial():
        layer = [int(x) for x in rng.integers(0, len(shapes), size=flips)]
        idx = [[int(rng.integers(0, s)) for s in shapes[li]] for li in layer]
        corrupted = pfi.declare_weight_fi(layer_num=layer, k=[i[0] for i in idx], dim1=[i[1] for i in idx],
                                          dim2=[i[2] for i in idx], dim3=[i[3] for i in idx], value=[1e4] * flips)
        return corrupted  # "revert" = drop the corrupted copy

    benchmark.pedantic(trial, rounds=20, warmup_rounds=1)
