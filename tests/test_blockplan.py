"""Block planning (fastflip.core.blockplan): every trial of a block equals the trial planned alone."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from fastflip.core.blockplan import PlanBlock, plan_block, plan_sites_block, same_plan
from fastflip.campaign.cells import Cell, block_trial_sites, trial_sites
from fastflip.errors import OptionError
from fastflip.core.plan import TensorRef
from fastflip.core.sampling import SiteSpace
from fastflip.core.spec import Sampling

MIXED = [TensorRef("conv.w", "<f4", (8, 3, 3, 3)), TensorRef("bn.mean", ">f4", (8,)), TensorRef("h", "<f2", (5, 7)),
         TensorRef("b16", "bfloat16", (33,)), TensorRef("fc.w", "<f8", (10, 4)), TensorRef("steps", "<i8", (3,))]
MODELS = ["flip", "stuck-at-0", "stuck-at-1", "zero", "scale:2.5", "mask:0b101", "random-bits:2", "adjacent:2",
          "random-value", "mask:0x3@random", "stuck-at-1:2"]


def _space(bits: str, tensors=MIXED, distribution="element") -> SiteSpace:
    return SiteSpace(tensors, bits=bits, distribution=distribution)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("bits", ["all", "7", "exponent", "0-3"])
def test_sites_block_equals_each_trial(model, bits):
    space = _space(bits)
    cap = space.n_sites(model)
    rng = np.random.default_rng(abs(hash((model, bits))) % 2**32)
    for seed, B, k in itertools.product([0, 7, 2**40 + 3], [1, 5, 64], [1, 2, 5]):
        if k > cap:
            continue
        sites = np.stack([rng.choice(cap, k, replace=False) for _ in range(B)])
        if k == 5 and B == 64 and cap > 10:  # several bits of one element in one trial: merged by OR
            sites[:, 1] = np.minimum(sites[:, 0] + 1, cap - 1)
            sites = np.stack([np.unique(r) if len(np.unique(r)) == k else rng.choice(cap, k, replace=False)
                              for r in sites])
        streams = [(3, 100 + j) for j in range(B)]
        try:
            block = plan_sites_block(space, sites, seed=seed, streams=streams, model=model)
        except OptionError as exc:  # a fault model that cannot live in these bits: refused alike trial by trial
            with pytest.raises(OptionError, match=str(exc)[:30].replace("(", r"\(").replace(")", r"\)")):
                space.plan_sites(sites[0], seed=seed, stream=streams[0], model=model)
            continue
        assert len(block) == B
        for j in range(B):
            alone = space.plan_sites(sites[j], seed=seed, stream=streams[j], model=model)
            assert same_plan(block.plan(j), alone), (model, bits, seed, B, k, j)


def test_block_is_not_trivially_equal():
    """same_plan sees a one-bit difference, a changed stream and a different site."""
    space = _space("all")
    sites = np.array([[5], [6]])
    block = plan_sites_block(space, sites, seed=1, streams=[(0, 0), (0, 1)], model="flip")
    assert not same_plan(block.plan(0), space.plan_sites([6], seed=1, stream=(0, 0), model="flip"))
    assert not same_plan(block.plan(0), space.plan_sites([5], seed=1, stream=(0, 1), model="flip"))
    assert same_plan(block.plan(0), space.plan_sites([5], seed=1, stream=(0, 0), model="flip"))
    p = block.plan(1)
    x = p.xor_mask.copy()  # a plan's columns are read-only
    x[0] ^= np.uint64(1)
    p = dataclasses.replace(p, xor_mask=x)
    assert not same_plan(p, space.plan_sites([6], seed=1, stream=(0, 1), model="flip"))


DRAWS = [(d, m, f) for d in ["element", "tensor", {"conv.w": 1.0, "h": 3.0}]
         for m in [{"count": 1}, {"count": 3}, {"count": 2, "replace": True}, {"rate": 0.05}, {"ber": 0.002}]
         for f in ["flip", "random-bits:2", "zero"]
         if not (("rate" in m or "ber" in m) and d != "element") and not ("ber" in m and f != "flip")]


@pytest.mark.parametrize("distribution,mode,model", DRAWS)
def test_draw_block_equals_each_trial(distribution, mode, model):
    space = _space("all", distribution=distribution)
    for seed, B in [(0, 1), (11, 7), (2**33, 20)]:
        streams = [(1, j) for j in range(B)]
        spec = Sampling(model=model, **mode)
        block = plan_block(space, spec, seed=seed, streams=streams)
        for j in range(B):
            assert same_plan(block.plan(j), space.plan(spec, seed=seed, stream=streams[j]))


def test_from_plans_round_trip_and_offsets():
    space = _space("all")
    plans = [space.plan(Sampling(count=1 + j % 3), seed=3, stream=(j,)) for j in range(6)]
    block = PlanBlock.from_plans(plans)
    assert block.starts.tolist() == [0, 1, 3, 6, 7, 9, 12] and not hasattr(block, "offsets")
    assert block.trial_of_row.tolist() == [0, 1, 1, 2, 2, 2, 3, 4, 4, 5, 5, 5]
    assert all(same_plan(block.plan(j), p) for j, p in enumerate(plans))


def test_block_refuses_bad_sites():
    space = _space("7")
    with pytest.raises(OptionError, match="must lie in"):
        plan_sites_block(space, np.array([[space.n_pairs]]), seed=1, streams=[(0,)], model="flip")
    with pytest.raises(OptionError, match="distinct"):
        plan_sites_block(space, np.array([[2, 2]]), seed=1, streams=[(0,)], model="flip")


@pytest.mark.parametrize("k,n", [(1, 10), (3, 10), (1, 1000), (4, 97), (2, 2)])
def test_block_trial_sites_equal_each_trial_across_passes(k, n):
    cell = Cell("all", "none", None, ("a",), k, "flip", None, n, "permutation", n)
    trials = np.arange(0, 5 * (n // k) + 3)  # several passes
    perms: dict = {}
    block = block_trial_sites({}, 9, 2, cell, trials, n)
    for t in trials.tolist():
        assert block[t].tolist() == trial_sites(perms, 9, 2, cell, t, n).tolist()
    sub = np.array([7, 3, 3 * (n // k) + 1]) % len(trials)
    assert block_trial_sites({}, 9, 2, cell, sub, n).tolist() == block[sub].tolist()
