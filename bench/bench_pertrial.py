"""One statistical trial through the public per-trial API next to a hand-written NumPy trial.

Run: ``pytest bench/bench_pertrial.py --benchmark-only --benchmark-columns=min,median,max,rounds``.
Figures go to bench/README.md (section "Per-trial API next to hand-written NumPy").

The model is ResNet-50-sized (``bench/resnet50.py``: 320 float32 tensors, 25.6M values) held as NumPy
arrays. A trial draws one site (or ten), flips it, and flips it back:

- ``api``: ``space.plan(Sampling(count=k), seed, stream=(i,))`` + ``live.inject`` + ``live.revert`` (targets and site
  space built once), the loop that harnesses embedding fastflip run; ``plan``: its planning call alone;
- ``hand, keyed``: what a harness writes by hand when trial ``i`` must be regenerated from ``(seed, i)``: a
  generator keyed by ``(seed, i)`` (the same Philox/SeedSequence fastflip uses), uniform element and bit,
  XOR, XOR back;
- ``hand, running``: the same with one generator for all trials (not regenerable per trial: the floor).
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
def model() -> tuple[live.Targets, SiteSpace, list[np.ndarray], np.ndarray]:
    arrays = resnet50_arrays()
    tg = live.targets(arrays)
    floats = [r for r in tg.refs() if r.dtype == "<f4"]
    words = [arrays[r.name].reshape(-1).view(np.uint32) for r in floats]
    starts = np.concatenate([[0], np.cumsum([w.size for w in words])])
    return tg, SiteSpace(floats), words, starts


def _hand_trial(rng: np.random.Generator, words: list[np.ndarray], starts: np.ndarray, k: int) -> None:
    elem = rng.integers(0, int(starts[-1]), size=k)
    bit = rng.integers(0, 32, size=k).astype(np.uint32)
    t = np.searchsorted(starts, elem, side="right") - 1
    for j in range(k):
        w, i = words[int(t[j])], int(elem[j] - starts[t[j]])
        w[i] ^= np.uint32(1) << bit[j]
    for j in range(k):
        w, i = words[int(t[j])], int(elem[j] - starts[t[j]])
        w[i] ^= np.uint32(1) << bit[j]


@pytest.mark.parametrize("flips", [1, 10])
def test_pertrial_api(benchmark, model, flips: int) -> None:
    """The public per-trial API: plan (seeded by (seed, i)) + inject + revert."""
    tg, space, _, _ = model
    counter, k = itertools.count(), Sampling(count=flips)  # the spec is built once, like a campaign cell's
    benchmark(lambda: live.revert(tg, live.inject(tg, space.plan(k, seed=3, stream=(next(counter),)))))


@pytest.mark.parametrize("flips", [1, 10])
def test_pertrial_plan(benchmark, model, flips: int) -> None:
    """The planning part of the API trial alone: ``space.plan(Sampling(count=k), seed, stream=(i,))``."""
    _, space, _, _ = model
    counter, k = itertools.count(), Sampling(count=flips)
    benchmark(lambda: space.plan(k, seed=3, stream=(next(counter),)))


@pytest.mark.parametrize("flips", [1, 10])
def test_pertrial_hand_keyed(benchmark, model, flips: int) -> None:
    """Hand-written NumPy trial, its generator keyed by (seed, i) like fastflip's."""
    _, _, words, starts = model
    counter = itertools.count()

    def trial() -> None:
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([3, next(counter)])))
        _hand_trial(rng, words, starts, flips)

    benchmark(trial)


@pytest.mark.parametrize("flips", [1, 10])
def test_pertrial_hand_running(benchmark, model, flips: int) -> None:
    """Hand-written NumPy trial with one running generator (not regenerable per trial)."""
    _, _, words, starts = model
    rng = np.random.default_rng(3)
    benchmark(lambda: _hand_trial(rng, words, starts, flips))
