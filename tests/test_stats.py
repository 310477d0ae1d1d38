"""Statistics of campaigns: hand-computed values and scipy cross-checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import require

from fastflip.errors import OptionError
from fastflip.campaign.stats import (
    sample_size,
    should_stop,
    stratified_estimate,
    wilson_half_width,
    wilson_interval,
    z_value,
)


def test_z_value_matches_scipy():
    st = require("scipy.stats")
    for c in (0.8, 0.9, 0.95, 0.99, 0.999):
        assert z_value(c) == pytest.approx(st.norm.ppf(0.5 + c / 2), rel=1e-12)


@pytest.mark.parametrize(
    "N,e,c,p",
    [(10_000, 0.05, 0.95, 0.5), (1e6, 0.01, 0.99, 0.5), (5_000_000, 0.001, 0.95, 0.1), (200, 0.02, 0.9, 0.3)],
)
def test_leveugle_formula_by_hand(N, e, c, p):
    t = {0.9: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}[c]
    n = N / (1 + e * e * (N - 1) / (t * t * p * (1 - p)))
    assert sample_size(N, margin=e, confidence=c, p=p) == math.ceil(n)


def test_leveugle_known_values():
    # Leveugle et al. Table: N huge, e=1%, 95% -> 9604 (the classic infinite-population figure)
    assert sample_size(math.inf, margin=0.01, confidence=0.95) == 9604
    assert sample_size(1e12, margin=0.01, confidence=0.95) == 9604
    # 99% / 1% -> 16588 for a large population
    assert sample_size(math.inf, margin=0.01, confidence=0.99) == 16588
    # small populations: never more than N, nearly all of it at a tight margin
    assert sample_size(10, margin=0.001) == 10
    assert sample_size(1, margin=0.05) == 1
    # monotone in N
    sizes = [sample_size(N, margin=0.01) for N in (100, 1_000, 10_000, 100_000)]
    assert sizes == sorted(sizes) and sizes[-1] <= 9604


@pytest.mark.parametrize("bad", [dict(margin=0), dict(margin=1.5), dict(confidence=1.0), dict(p=0.0)])
def test_sample_size_rejects_bad_options(bad):
    with pytest.raises(OptionError):
        sample_size(1000, **bad)
    with pytest.raises(OptionError):
        sample_size(0)


def test_wilson_matches_scipy():
    st = require("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 5000))
        k = int(rng.integers(0, n + 1))
        c = float(rng.choice([0.9, 0.95, 0.99]))
        ref = st.binomtest(k, n).proportion_ci(confidence_level=c, method="wilson")
        lo, hi = wilson_interval(k, n, c)
        assert float(lo) == pytest.approx(ref.low, abs=1e-12)
        assert float(hi) == pytest.approx(ref.high, abs=1e-12)


def test_wilson_by_hand_and_edges():
    # k=5, n=100, z=1.96: centre=(0.05+1.92/100)/(1.0384)..., computed explicitly here
    z = 1.959963984540054
    k, n = 5, 100
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    lo, hi = wilson_interval(k, n)
    assert float(lo) == pytest.approx(centre - half, rel=1e-12)
    assert float(hi) == pytest.approx(centre + half, rel=1e-12)
    lo, hi = wilson_interval([0, 7, 0], [0, 7, 3])
    assert lo.tolist()[0] == 0.0 and hi.tolist()[0] == 1.0  # no data: uninformative
    assert hi.tolist()[1] == 1.0 and lo.tolist()[2] == 0.0
    assert float(wilson_half_width(0, 3)) == pytest.approx((hi[2] - lo[2]) / 2)
    with pytest.raises(OptionError):
        wilson_interval(5, 4)


def test_stratified_estimate_by_hand():
    k = np.array([10, 2, 30])
    n = np.array([100, 50, 60])
    N = np.array([1000.0, 4000.0, 5000.0])
    W = N / N.sum()
    c = k / n
    rate = float((W * c).sum())
    var_nofpc = float((W**2 * c * (1 - c) / n).sum())
    var_fpc = float((W**2 * c * (1 - c) / n * (1 - n / N)).sum())
    e = stratified_estimate(k, n, populations=N)
    assert e.rate == pytest.approx(rate)
    assert e.variance == pytest.approx(var_fpc)
    assert e.stderr == pytest.approx(math.sqrt(var_fpc))
    assert e.low == pytest.approx(rate - 1.959963984540054 * math.sqrt(var_fpc))
    e2 = stratified_estimate(k, n, populations=N, finite_population=False)
    assert e2.variance == pytest.approx(var_nofpc)
    # equal weights by default
    e3 = stratified_estimate(k, n)
    assert e3.rate == pytest.approx(c.mean())
    # a census stratum (n == N) has no variance
    e4 = stratified_estimate([3], [10], populations=[10])
    assert e4.variance == 0.0 and e4.rate == 0.3


def test_stratified_variance_is_unbiased_ish_by_simulation():
    # the plug-in variance tracks the empirical variance of the estimator
    rng = np.random.default_rng(1)
    true = np.array([0.1, 0.4, 0.02])
    W = np.array([0.5, 0.3, 0.2])
    n = np.array([400, 300, 500])
    ests, vars_ = [], []
    for _ in range(2000):
        k = rng.binomial(n, true)
        e = stratified_estimate(k, n, weights=W)
        ests.append(e.rate)
        vars_.append(e.variance)
    assert np.mean(ests) == pytest.approx((W * true).sum(), rel=0.01)
    assert np.var(ests) == pytest.approx(np.mean(vars_), rel=0.1)


def test_stratified_errors_and_empty_stratum():
    with pytest.raises(OptionError):
        stratified_estimate([1], [0])
    with pytest.raises(OptionError):
        stratified_estimate([1, 2], [3])
    e = stratified_estimate([0, 1], [0, 10])
    assert math.isinf(e.variance) and (e.low, e.high) == (0.0, 1.0)


def test_should_stop_rule():
    hw = float(wilson_half_width(10, 100))
    assert should_stop(10, 100, half_width=hw + 1e-9).tolist() is True
    assert should_stop(10, 100, half_width=hw - 1e-9).tolist() is False
    assert should_stop(0, 10, half_width=0.4, min_trials=30).tolist() is False
    assert should_stop(50, 100, half_width=0.01, max_trials=100).tolist() is True
    with pytest.raises(OptionError):
        should_stop(1, 2, half_width=0.0)
