"""Per-trial cost of the campaign's site sampling: keyed permutation (distinct sites) vs independent draws.

Both sample one (element, bit) site of a cell over ResNet-50-sized float32 weights (25.6 M values × 32 bits,
``resnet50.resnet50_arrays``) and build the trial's plan, trial by trial, exactly as a sweep's worker does:

* ``permutation``: :func:`fastflip.campaign.cells.trial_sites` (Feistel permutation keyed by (seed, cell,
  pass), cached per worker) then ``SiteSpace.plan_sites`` (Philox of (seed, cell, trial) for random parts);
* ``independent``: fastflip 0.1's ``SiteSpace.plan(Sampling(count=1), seed, stream=(cell, trial))``.

Run: ``pytest bench/bench_sampling_design.py --benchmark-only --benchmark-columns=min,median,max,rounds``
"""

from __future__ import annotations

import os
import sys

import pytest

from fastflip.campaign.cells import Cell, trial_sites
from fastflip.core.plan import TensorRef
from fastflip.core.sampling import SiteSpace
from fastflip.core.spec import Sampling

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
TRIALS = 2000


@pytest.fixture(scope="module")
def space():
    from resnet50 import resnet50_arrays

    arrays = resnet50_arrays()
    refs = [TensorRef(n, a.dtype.str, a.shape) for n, a in arrays.items()]
    sp = SiteSpace(refs, bits="all")
    cell = Cell("all", "none", None, tuple(r.name for r in refs), 1, "flip", None, sp.n_pairs, "permutation",
                sp.n_pairs)
    return sp, cell


def test_permutation_sampler(benchmark, space):
    sp, cell = space
    perms: dict = {}
    n = sp.n_sites("flip")

    def run():
        for t in range(TRIALS):
            sp.plan_sites(trial_sites(perms, 1, 0, cell, t, n), seed=1, stream=(0, t), model="flip")

    benchmark.pedantic(run, rounds=5, iterations=1)
    benchmark.extra_info["per_trial_us"] = benchmark.stats.stats.min / TRIALS * 1e6


def test_independent_draw(benchmark, space):
    sp, _ = space

    one = Sampling(count=1, model="flip")

    def run():
        for t in range(TRIALS):
            sp.plan(one, seed=1, stream=(0, t))

    benchmark.pedantic(run, rounds=5, iterations=1)
    benchmark.extra_info["per_trial_us"] = benchmark.stats.stats.min / TRIALS * 1e6


BLOCK = 4096


def test_permutation_block_planner(benchmark, space):
    """The same permutation design, planned ``BLOCK`` trials per call (:mod:`fastflip.core.blockplan`)."""
    import numpy as np

    from fastflip.core.blockplan import plan_sites_block
    from fastflip.campaign.cells import block_trial_sites

    sp, cell = space
    n = sp.n_sites("flip")
    trials = np.arange(BLOCK * 5)

    def run():
        perms: dict = {}
        for s in range(0, len(trials), BLOCK):
            t = trials[s : s + BLOCK]
            sites = block_trial_sites(perms, 1, 0, cell, t, n)
            plan_sites_block(sp, sites, seed=1, streams=[(0, x) for x in t.tolist()], model="flip")

    benchmark.pedantic(run, rounds=5, iterations=1)
    benchmark.extra_info["per_trial_us"] = benchmark.stats.stats.min / len(trials) * 1e6
