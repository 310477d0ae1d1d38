"""Activation faults take the Sampling of weight faults: ber, distribution, replace and NaN policy.

Every check reads the model's own output (two identity layers whose outputs it returns) and compares it, word by
word, with the fault-free output: which elements changed and how is worked out here with NumPy, from the documented
law of each field (ber: K ~ Binomial(bits, p) from the Philox generator of (seed, *stream); distinct sites without
replacement; a pair of draws of one bit cancels with replacement).
"""

from __future__ import annotations

import numpy as np
import pytest

import fastflip
from conftest import require
from fastflip import Sampling
from fastflip.errors import CapacityError, OptionError

pytestmark = pytest.mark.framework

BIG, SMALL = 64, 2


def two_layers():  # noqa: ANN201 - a torch module: outputs of "big" (BIG values) and "small" (SMALL values)
    torch = require("torch")
    nn = torch.nn

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big, self.small = nn.Identity(), nn.Identity()

        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.cat([self.big(x[:, :BIG] * 1), self.small(x[:, BIG:] * 1)], dim=1)

    return Two()


def run(x, **options):  # noqa: ANN001, ANN201 - (faulted output words, clean output words, log)
    torch = require("torch")
    model = two_layers()
    with torch.no_grad():
        clean = model(x).numpy().view(np.uint32).copy()
        with fastflip.injected_activations(model, selection=fastflip.Selection(layers=["big", "small"]),
                                           **options) as log:
            faulted = model(x).numpy().view(np.uint32).copy()
    return faulted, clean, log


def inputs(batch: int, seed: int = 0):  # noqa: ANN201 - values in [0.25, 0.5): no flip of bits 0-29 makes NaN/Inf
    torch = require("torch")
    return torch.from_numpy(np.random.default_rng(seed).uniform(0.25, 0.5, (batch, BIG + SMALL)).astype(np.float32))


def test_ber_flips_a_binomial_number_of_bits_per_sample() -> None:
    batch, p, seed = 6, 0.05, 17
    faulted, clean, _ = run(inputs(batch), seed=seed, per_sample=True, sampling=Sampling(ber=p, bits="0-7"))
    diff = faulted ^ clean
    assert not (diff & ~np.uint32(0xFF)).any()  # only the allowed bits 0-7
    for b in range(batch):  # per sample: K ~ Binomial(8 bits x 66 elements, p) drawn first from (seed, b)
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, b])))
        k = int(rng.binomial(8 * (BIG + SMALL), p))
        assert int(np.bitwise_count(diff[b]).sum()) == k  # distinct (element, bit) pairs: k bits changed
    assert len({int(np.bitwise_count(d).sum()) for d in diff}) > 1  # the number varies from sample to sample
    shorthand, _, _ = run(inputs(batch), seed=seed, per_sample=True, ber=p, bits="0-7")
    assert (shorthand == faulted).all()


def test_distribution_chooses_the_layer_as_it_chooses_the_tensor() -> None:
    batch = 400
    x = inputs(batch)
    hits = {}
    for dist in ("element", "tensor"):
        faulted, clean, _ = run(x, seed=3, per_sample=True, count=1, bits="30", distribution=dist)
        changed = faulted != clean
        assert (changed.sum(axis=1) == 1).all()  # one site per sample
        hits[dist] = int(changed[:, BIG:].any(axis=1).sum())  # samples whose fault is in the small layer
    # element: the small layer holds 2 of 66 elements (expected 12 of 400); tensor: each layer half the time (200)
    assert hits["element"] < 40 and 140 < hits["tensor"] < 260
    faulted, clean, _ = run(x, seed=3, per_sample=True, sampling={"count": 1, "bits": "30",
                                                                  "distribution": {"small": 1.0}})
    assert not (faulted[:, :BIG] != clean[:, :BIG]).any() and (faulted[:, BIG:] != clean[:, BIG:]).any(axis=1).all()


def test_replace_false_draws_distinct_sites_and_true_lets_pairs_cancel() -> None:
    batch, n = 50, BIG + SMALL
    x = inputs(batch)
    faulted, clean, _ = run(x, seed=5, per_sample=True, count=n, bits="3")  # every (element, bit 3) pair once
    assert ((faulted ^ clean) == np.uint32(1 << 3)).all()
    with pytest.raises(CapacityError, match=f"asked for {n + 1} distinct sites"):
        run(x, seed=5, per_sample=True, count=n + 1, bits="3")
    faulted, clean, _ = run(x, seed=5, per_sample=True, count=n, bits="3", replace=True)
    changed = ((faulted ^ clean) == np.uint32(1 << 3)).sum(axis=1)
    # n draws with repeats over n sites: an element drawn twice is flipped back; parity keeps n even - changed even
    assert ((n - changed) % 2 == 0).all() and (changed < n).all()
    assert not ((faulted ^ clean) & ~np.uint32(1 << 3)).any()


def test_nan_policy_avoid_keeps_the_output_finite() -> None:
    torch = require("torch")
    values = np.where(np.arange(BIG + SMALL) % 2 == 0, 1.5, 0.375).astype(np.float32)  # 1.5: bit 30 flip is NaN
    x = torch.from_numpy(np.tile(values, (8, 1)))
    allow, clean, _ = run(x, seed=2, per_sample=True, count=6, bits="30")
    assert not np.isfinite(allow.view(np.float32)).all()
    avoid, clean, log = run(x, seed=2, per_sample=True, sampling=Sampling(count=6, bits="30", nan_policy="avoid"))
    out = avoid.view(np.float32)
    assert np.isfinite(out).all()
    changed = avoid != clean
    assert (changed.sum(axis=1) == 6).all()  # as many sites, all on the values that stay finite
    assert (clean.view(np.float32)[changed] == np.float32(0.375)).all()
    assert log.meta["nan_policy"] == "avoid" and log.meta["count"] == 6


def test_sampling_and_a_plan_or_both_forms_are_refused() -> None:
    x = inputs(2)
    with pytest.raises(OptionError, match="give either sampling= or its fields \\(count\\), not both"):
        run(x, seed=1, sampling=Sampling(count=1), count=2)
    with pytest.raises(OptionError, match="ber flips single bits"):
        run(x, seed=1, ber=0.1, model="zero")


@pytest.mark.parametrize("sampling", [Sampling(ber=0.02, bits="0-7"), Sampling(count=3, distribution="tensor"),
                                      Sampling(count=40, bits="3", replace=True), Sampling(rate=0.1, model="zero")])
def test_each_sample_draws_what_the_sampling_draws_over_weights_of_those_shapes(sampling: Sampling) -> None:
    from fastflip.core.plan import TensorRef

    _, _, log = run(inputs(3), seed=8, per_sample=True, sampling=sampling)
    refs = [TensorRef("big", "<f4", (BIG,)), TensorRef("small", "<f4", (SMALL,))]
    for b in range(3):
        p = sampling.plan(refs, seed=8, stream=(b,))
        at = log.sample == b
        got = sorted(zip(log.layer[at].tolist(), log.index[at].tolist(), log.bits[at].tolist()))
        assert got == sorted(zip(p.tensor.tolist(), p.index.tolist(), p.bits.tolist()))
