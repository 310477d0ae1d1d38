"""Significance tests between groups of trials: Fisher's exact test, Holm's correction, pairwise tables.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

* :func:`fisher_exact` — the two-sided p-value of Fisher's exact test on a 2x2 table
  ``[[a, b], [c, d]]`` (rows: the two groups; columns: failure, not failure). The
  p-value sums the hypergeometric probabilities of every table with the same margins
  that is no more probable than the observed one (the convention of R's
  ``fisher.test`` and ``scipy.stats.fisher_exact``), computed in log space with
  :func:`math.lgamma`, so it needs neither SciPy nor big integers.
* :func:`holm` — Holm's step-down adjustment of a family of p-values (controls the
  family-wise error rate without assuming independence).
* :func:`pairwise_tests` — every requested pair of groups tested on failure vs not,
  Holm-adjusted over the family, as rows ready for a CSV or a report.

Examples
--------
>>> round(fisher_exact(3, 1, 1, 3), 4)
0.4857
>>> [round(p, 3) for p in holm([0.01, 0.04, 0.03])]
[0.03, 0.06, 0.06]
>>> rows = pairwise_tests({"a": (9, 10), "b": (1, 10)})
>>> rows[0]["a"], rows[0]["b"], round(rows[0]["p_value"], 5), rows[0]["test"]
('a', 'b', 0.00109, 'fisher-exact')
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from ..errors import OptionError
from .stats import wilson_interval

__all__ = ["fisher_exact", "holm", "pairwise_tests", "format_tests", "PAIRWISE_FIELDS"]

#: Columns of :func:`pairwise_tests`'s rows.
PAIRWISE_FIELDS = ("a", "b", "a_failures", "a_trials", "a_rate", "b_failures", "b_trials", "b_rate", "difference",
                   "test", "p_value", "p_holm", "significant")


def _log_pmf(x: int, r1: int, c1: int, n: int) -> float:
    """log P(X = x) of the hypergeometric law: x failures in row 1 given the margins."""
    r2, c2 = n - r1, n - c1
    return (math.lgamma(r1 + 1) - math.lgamma(x + 1) - math.lgamma(r1 - x + 1)
            + math.lgamma(r2 + 1) - math.lgamma(c1 - x + 1) - math.lgamma(r2 - c1 + x + 1)
            - math.lgamma(n + 1) + math.lgamma(c1 + 1) + math.lgamma(c2 + 1))


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p-value of Fisher's exact test on ``[[a, b], [c, d]]``.

    >>> fisher_exact(0, 10, 0, 10)
    1.0
    >>> round(fisher_exact(10, 0, 0, 10), 8)
    1.083e-05
    """
    vals = [a, b, c, d]
    if any(isinstance(v, bool) or int(v) != v or v < 0 for v in vals):
        raise OptionError(f"fisher_exact: the table needs non-negative integer counts, got {vals}")
    a, b, c, d = (int(v) for v in vals)
    r1, c1, n = a + b, a + c, a + b + c + d
    if n == 0:
        raise OptionError("fisher_exact: the table is empty (no trials in either group)")
    lo, hi = max(0, c1 - (n - r1)), min(r1, c1)
    logs = [_log_pmf(x, r1, c1, n) for x in range(lo, hi + 1)]
    observed = logs[a - lo]
    top = max(logs)
    # tables no more probable than the observed one (relative tolerance as R and SciPy use)
    p = sum(math.exp(v - top) for v in logs if v <= observed + 1e-7 * abs(observed) + 1e-12)
    total = sum(math.exp(v - top) for v in logs)
    return min(1.0, p / total)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (each at most 1).

    >>> holm([])
    []
    >>> holm([0.5])
    [0.5]
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def pairwise_tests(
    groups: Mapping[str, tuple[int, int]],
    pairs: Iterable[tuple[str, str]] | None = None,
    *,
    alpha: float = 0.05,
    confidence: float = 0.95,
    what: str = "group",
) -> list[dict[str, Any]]:
    """Fisher's exact test of failure vs not between pairs of groups, Holm-adjusted.

    Parameters
    ----------
    groups : mapping
        Group name → ``(failures, trials)``.
    pairs : iterable of (name, name), optional
        The comparisons asked for (default: every pair, in the groups' order). A pair
        naming a group that is unknown or has no trials raises
        :class:`~fastflip.errors.OptionError`.
    alpha : float
        Family-wise level at which ``significant`` is set (on the Holm-adjusted p-value).
    what : str
        What a group is (``scenario``, ``framework``), for error messages.

    Returns
    -------
    list of dict
        One row per pair with the columns of :data:`PAIRWISE_FIELDS` plus the Wilson
        interval of each rate (``a_low, a_high, b_low, b_high``).
    """
    names = list(groups)
    if pairs is None:
        todo = [(names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))
                if groups[names[i]][1] > 0 and groups[names[j]][1] > 0]
    else:
        todo = [(str(x), str(y)) for x, y in pairs]
        for x, y in todo:
            for g in (x, y):
                if g not in groups:
                    raise OptionError(f"test {x} vs {y}: no {what} named {g!r} (known: {', '.join(names) or 'none'})")
                if groups[g][1] <= 0:
                    raise OptionError(f"test {x} vs {y}: {what} {g!r} has no trials; run it before testing it")
            if x == y:
                raise OptionError(f"test {x} vs {y}: a {what} cannot be tested against itself")
    rows = []
    for x, y in todo:
        (kx, nx), (ky, ny) = groups[x], groups[y]
        if not (0 <= kx <= nx and 0 <= ky <= ny):
            raise OptionError(f"test {x} vs {y}: failures must lie between 0 and the number of trials")
        p = fisher_exact(kx, nx - kx, ky, ny - ky)
        (lx, hx), (ly, hy) = (tuple(float(v) for v in wilson_interval(k, n, confidence)) for k, n in ((kx, nx), (ky, ny)))
        rows.append({"a": x, "b": y, "a_failures": kx, "a_trials": nx, "a_rate": kx / nx, "a_low": lx, "a_high": hx,
                     "b_failures": ky, "b_trials": ny, "b_rate": ky / ny, "b_low": ly, "b_high": hy,
                     "difference": kx / nx - ky / ny, "test": "fisher-exact", "p_value": p})
    for r, adj in zip(rows, holm([r["p_value"] for r in rows])):
        r["p_holm"] = adj
        r["significant"] = adj < alpha
    return rows


def format_tests(rows: Sequence[Mapping[str, Any]]) -> str:
    """:func:`pairwise_tests`'s rows as a plain-text table.

    >>> print(format_tests(pairwise_tests({"a": (9, 10), "b": (1, 10)})))
    comparison  failures a       failures b      Fisher p  Holm p
    a vs b      9/10 [60%, 98%]  1/10 [2%, 40%]  0.001093  0.001093 *
    """
    head = ["comparison", "failures a", "failures b", "Fisher p", "Holm p"]
    body = []
    for r in rows:
        body.append([f"{r['a']} vs {r['b']}",
                     f"{r['a_failures']}/{r['a_trials']} [{r['a_low']:.0%}, {r['a_high']:.0%}]",
                     f"{r['b_failures']}/{r['b_trials']} [{r['b_low']:.0%}, {r['b_high']:.0%}]",
                     f"{r['p_value']:.4g}", f"{r['p_holm']:.4g}" + (" *" if r["significant"] else "")])
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in [head, *body])
