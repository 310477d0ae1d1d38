"""Fisher's exact test and Holm's correction against SciPy and a direct enumeration."""

from __future__ import annotations

import itertools
from fractions import Fraction
from math import comb

import numpy as np
import pytest

from conftest import require
from fastflip.errors import OptionError
from fastflip.campaign.significance import fisher_exact, holm, pairwise_tests


def _fisher_by_enumeration(a, b, c, d):
    """Exact rational arithmetic over every table with the observed margins."""
    r1, c1, n = a + b, a + c, a + b + c + d
    pmf = {x: Fraction(comb(r1, x) * comb(n - r1, c1 - x), comb(n, c1))
           for x in range(max(0, c1 - (n - r1)), min(r1, c1) + 1)}
    obs = pmf[a]
    return float(sum(p for p in pmf.values() if p <= obs * Fraction(1 + 10**-7)))


def test_fisher_matches_scipy_and_enumeration():
    stats = require("scipy.stats")
    rng = np.random.default_rng(3)
    tables = [(0, 0, 0, 1), (0, 5, 0, 5), (5, 0, 0, 5), (1, 0, 0, 0), (30, 0, 0, 30), (12, 18, 0, 30)]
    tables += [tuple(int(v) for v in rng.integers(0, 25, 4)) for _ in range(300)]
    tables += [tuple(int(v) for v in rng.integers(0, 400, 4)) for _ in range(30)]
    for t in tables:
        got = fisher_exact(*t)
        want = stats.fisher_exact([[t[0], t[1]], [t[2], t[3]]]).pvalue
        assert got == pytest.approx(want, rel=1e-9, abs=1e-300), t
        if sum(t) <= 100:
            assert got == pytest.approx(_fisher_by_enumeration(*t), rel=1e-9, abs=1e-300), t


def test_fisher_rejects_bad_tables():
    with pytest.raises(OptionError, match="non-negative integer counts"):
        fisher_exact(-1, 2, 3, 4)
    with pytest.raises(OptionError, match="empty"):
        fisher_exact(0, 0, 0, 0)


def _holm_by_definition(p):
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adj = {}
    for k, i in enumerate(order):
        adj[i] = min(1.0, max((m - j) * p[order[j]] for j in range(k + 1)))
    return [adj[i] for i in range(m)]


def test_holm_matches_its_definition():
    rng = np.random.default_rng(1)
    for m in range(1, 9):
        for _ in range(50):
            p = list(rng.random(m) ** 3)
            assert holm(p) == pytest.approx(_holm_by_definition(p), abs=1e-15)
    assert holm([0.01, 0.02, 0.03, 0.04]) == pytest.approx([0.04, 0.06, 0.06, 0.06])


def test_pairwise_tests_family_and_errors():
    groups = {"a": (10, 20), "b": (2, 20), "c": (9, 20), "empty": (0, 0)}
    rows = pairwise_tests(groups)
    assert [(r["a"], r["b"]) for r in rows] == [("a", "b"), ("a", "c"), ("b", "c")]  # no-trial group left out
    raw = [r["p_value"] for r in rows]
    assert [r["p_holm"] for r in rows] == pytest.approx(_holm_by_definition(raw))
    assert rows[0]["significant"] and not rows[1]["significant"]
    assert rows[0]["a_rate"] == 0.5 and rows[0]["difference"] == pytest.approx(0.4)
    with pytest.raises(OptionError, match="^test a vs empty: scenario 'empty' has no trials; run it before testing it$"):
        pairwise_tests(groups, [("a", "empty")], what="scenario")
    with pytest.raises(OptionError, match="no scenario named 'zz'"):
        pairwise_tests(groups, [("a", "zz")], what="scenario")
    for x, y in itertools.combinations("abc", 2):
        assert pairwise_tests(groups, [(x, y)])[0]["p_holm"] == pairwise_tests(groups, [(x, y)])[0]["p_value"]
