"""Sampling without replacement within a cell: the keyed permutation, distinct sites, uniform marginals,
exact regeneration of one trial, exhaustive cells, and the finite-population correction it justifies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import require
from test_campaign import make

from fastflip.campaign.cells import trial_sites
from fastflip.campaign.summary import group_vulnerability, stratified_rate
from fastflip.campaign.sweep import campaign_cells
from fastflip.campaign.trials import TrialRunner
from fastflip.errors import OptionError
from fastflip.core.permutation import Permutation
from fastflip.campaign.stats import stratified_estimate, wilson_interval


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 17, 80, 1000, 4097])
def test_permutation_is_a_bijection_and_both_paths_agree(n):
    p = Permutation(n, (3, n))
    v = p(np.arange(n))
    assert sorted(v.tolist()) == list(range(n))
    assert [p.value(i) for i in range(n)] == v.tolist()
    assert Permutation(n, (3, n))(np.arange(n)).tolist() == v.tolist()  # keyed: the same key, the same order
    if n > 16:
        assert Permutation(n, (4, n))(np.arange(n)).tolist() != v.tolist()
    with pytest.raises(OptionError):
        p(np.array([n]))


def test_permutation_marginals_and_pairs_are_uniform():
    st = require("scipy.stats")
    for n, pos in ((3, 0), (80, 0), (80, 57), (1000, 999)):
        c = np.bincount([Permutation(n, (s, 9)).value(pos) for s in range(8000)], minlength=n)
        assert st.chisquare(c).pvalue > 1e-3, (n, pos)
    n = 6
    joint = np.zeros((n, n), int)
    for s in range(12000):
        a, b = Permutation(n, (s, 1))(np.array([0, 1]))
        joint[a, b] += 1
    assert np.trace(joint) == 0
    assert st.chisquare(joint[~np.eye(n, dtype=bool)]).pvalue > 1e-3


def test_cell_trials_draw_distinct_sites_then_a_new_pass():
    c = make(cells={"bits": ["exponent"], "group_by": "tensor", "flips": [3]})
    cells = campaign_cells(c)
    cell = [x for x in cells if x.tensors == ("out/kernel",)][0]  # 32 elements x 8 exponent bits = 256 pairs
    perms: dict = {}
    per_pass = cell.population // 3
    sites = [trial_sites(perms, 11, 2, cell, t, cell.population) for t in range(2 * per_pass)]
    first = np.concatenate(sites[:per_pass])
    assert len(set(first.tolist())) == 3 * per_pass  # no site twice within a pass
    assert all(len(set(s.tolist())) == 3 for s in sites)  # nor within a trial of the next pass
    second = np.concatenate(sites[per_pass:])
    assert len(set(second.tolist())) == 3 * per_pass and set(second.tolist()) != set(first.tolist())
    # any trial alone, from a fresh cache, in any order
    for t in (5, 0, per_pass + 1):
        assert trial_sites({}, 11, 2, cell, t, cell.population).tolist() == sites[t].tolist()


def test_campaign_sites_are_uniform_over_the_cell_and_distinct(tmp_path):
    st = require("scipy.stats")
    c = make(cells={"bits": ["30", "0"], "group_by": "tensor"}, trials={"per_cell": 20})
    cells = campaign_cells(c)
    cid = [i for i, x in enumerate(cells) if x.tensors == ("out/kernel",) and x.bits == "30"][0]  # 32 sites
    counts = np.zeros(32, int)
    for seed in range(300):
        r = TrialRunner(make(seed=seed, cells={"bits": ["30", "0"], "group_by": "tensor"}, trials={"per_cell": 20}),
                        cells)
        idx = [int(r.plan(cid, t).index[0]) for t in range(20)]
        assert len(set(idx)) == 20  # distinct sites across the cell's trials
        counts[idx] += 1
    assert st.chisquare(counts).pvalue > 1e-3  # every site equally likely to be drawn


def test_fpc_matches_the_variance_of_permutation_sampling():
    """Sampling n of N sites through the permutation has the variance of simple random sampling without
    replacement, (N-n)/(N-1) p(1-p)/n; the plug-in with the (1-n/N) correction estimates it, the
    uncorrected formula (independent draws) would double it at n = N/2."""
    N, n, K = 80, 40, 20
    fail = np.zeros(N, bool)
    fail[:K] = True
    est = [fail[Permutation(N, (s, 0))(np.arange(n))].mean() for s in range(4000)]
    p = K / N
    srswor = (N - n) / (N - 1) * p * (1 - p) / n
    assert np.mean(est) == pytest.approx(p, abs=0.005)
    assert np.var(est) == pytest.approx(srswor, rel=0.1)
    plug_in = stratified_estimate([K // 2], [n], populations=[N]).variance  # at the mean rate
    assert plug_in == pytest.approx((1 - n / N) * p * (1 - p) / n)
    assert plug_in == pytest.approx(srswor, rel=0.05)
    # a stratum drawn with replacement gets no correction
    assert stratified_estimate([10], [40], populations=[80], fpc_populations=[None]).variance == pytest.approx(
        p * (1 - p) / n)


def test_exhaustive_cells_report_the_exact_rate(tmp_path):
    from fastflip.campaign.summary import summarize
    from fastflip.campaign.sweep import sweep

    c = make(cells={"bits": ["30"], "group_by": "tensor"}, trials={"per_cell": 100})
    sweep(c, str(tmp_path / "e.db"), workers=0, progress=False)
    s = summarize(str(tmp_path / "e.db"))
    by_tensor = {x["grp"]: x for x in s["cells"]}
    for name, pop in (("dense/bias", 8), ("out/kernel", 32)):
        x = by_tensor[name]
        assert x["sampling"] == "exhaustive" and x["trials"] == x["planned"] == pop
        assert x["failure_low"] == x["failure_high"] == x["failure_rate"]
    assert by_tensor["dense/kernel"]["sampling"] == "permutation" and by_tensor["dense/kernel"]["trials"] == 100


def test_stratified_and_group_numbers_against_independent_formulas():
    st = require("scipy.stats")
    cells = [
        {"grp": "a", "group_by": "layer", "flips": 1, "fault": "flip", "epoch": None, "population": 500,
         "trials": 100, "failures": 7, "sampling": "permutation", "fpc_population": 500},
        {"grp": "a", "group_by": "layer", "flips": 1, "fault": "flip", "epoch": None, "population": 1500,
         "trials": 100, "failures": 30, "sampling": "permutation", "fpc_population": 1500},
        {"grp": "b", "group_by": "layer", "flips": 1, "fault": "flip", "epoch": None, "population": 40,
         "trials": 40, "failures": 4, "sampling": "exhaustive", "fpc_population": 40},
    ]
    Ns = np.array([500, 1500, 40.0])
    ks, ns = np.array([7, 30, 4.0]), np.array([100, 100, 40.0])
    W = Ns / Ns.sum()
    c = ks / ns
    rate = float((W * c).sum())
    var = float((W ** 2 * c * (1 - c) / ns * (1 - ns / Ns)).sum())
    tot = stratified_rate(cells)
    assert tot["rate"] == pytest.approx(rate) and tot["variance"] == pytest.approx(var)
    rows = {r["group"]: r for r in group_vulnerability(cells)}
    wa = Ns[:2] / Ns[:2].sum()
    ra = float((wa * c[:2]).sum())
    assert rows["a"]["rate"] == pytest.approx(ra)
    assert rows["a"]["share"] == pytest.approx(2000 / 2040)
    assert rows["b"]["rate"] == 0.1 and rows["b"]["low"] == rows["b"]["high"] == 0.1 and rows["b"]["exact"]
    assert sum(r["contribution"] for r in rows.values()) == pytest.approx(rate)
    assert rows["a"]["relative"] == pytest.approx(ra / rate)
    # a single permutation cell: Wilson's interval, equal to scipy's
    one = stratified_rate(cells[:1])
    ci = st.binomtest(7, 100).proportion_ci(confidence_level=0.95, method="wilson")
    assert (one["low"], one["high"]) == pytest.approx((ci.low, ci.high))
    lo, hi = wilson_interval(7, 100)
    assert (float(lo), float(hi)) == pytest.approx((ci.low, ci.high))
    # pooled cells: Wilson at Kish's effective size p(1-p)/Var, inside [0, 1] and around the rate
    va = float((wa ** 2 * c[:2] * (1 - c[:2]) / 100 * (1 - 100 / Ns[:2])).sum())
    n_eff = ra * (1 - ra) / va
    z = st.norm.ppf(0.975)
    centre = (ra + z * z / (2 * n_eff)) / (1 + z * z / n_eff)
    half = z / (1 + z * z / n_eff) * math.sqrt(ra * (1 - ra) / n_eff + z * z / (4 * n_eff ** 2))
    assert (rows["a"]["low"], rows["a"]["high"]) == pytest.approx((centre - half, centre + half))
