"""Per-trial cost of weight faults on a ResNet-18-shaped PyTorch module (torchvision's names, built in code).

One trial = draw the plan (seeded, counter-based) + inject + revert, on the live
``nn.Module`` (11.7M parameters, 102 tensors with BatchNorm's int64 counters).

Run: ``pytest bench/bench_live_models.py --benchmark-only --benchmark-columns=min,median,max,rounds``.
Figures go to bench/README.md (section "Live models: ResNet-18 weight faults").
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import fastflip  # noqa: E402
from fastflip import live  # noqa: E402

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def resnet18():
    from user_models import torch_classes

    torch.manual_seed(0)
    return torch_classes()["ResNet18"]().eval()


@pytest.mark.parametrize("flips", [1, 10])
def test_resnet18_trial_prepared(benchmark, resnet18, flips: int) -> None:
    """Targets and site space built once; per trial: plan + inject + revert."""
    tg = live.targets(resnet18)
    recs = live.select_live(tg, {"dtypes": ["float"]})
    space = fastflip.SiteSpace([t.ref() for t in recs])
    counter, k = itertools.count(), fastflip.Sampling(count=flips)

    def trial() -> None:
        live.revert(tg, live.inject(tg, space.plan(k, seed=1, stream=(next(counter),))))

    benchmark(trial)


@pytest.mark.parametrize("flips", [1, 10])
def test_resnet18_trial_injected_block(benchmark, resnet18, flips: int) -> None:
    """The one-call form: ``with fastflip.injected(model, seed=..., count=...)`` (walks the module every trial)."""
    counter = itertools.count()

    def trial() -> None:
        with fastflip.injected(resnet18, seed=next(counter), count=flips):
            pass

    benchmark(trial)


def test_resnet18_explicit_site(benchmark, resnet18) -> None:
    """``fastflip.site`` (one named element, one bit) + inject + revert on prepared targets."""
    tg = live.targets(resnet18)

    def trial() -> None:
        live.revert(tg, live.inject(tg, fastflip.site(tg, "layer4.1.conv2.weight", (0, 3, 1, 1), bits=30)))

    benchmark(trial)
