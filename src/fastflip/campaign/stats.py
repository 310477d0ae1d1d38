"""Statistics of fault-injection campaigns: sample sizes, intervals, stratified totals, stopping.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

* :func:`sample_size` — the number of trials that estimates a rate within a margin ``e``
  at a confidence level, after Leveugle et al., "Statistical fault injection: quantified
  error and confidence" (DATE 2009)::

      n = N / (1 + e**2 * (N - 1) / (t**2 * p * (1 - p)))

  where ``N`` is the population (the number of possible fault sites), ``t`` the two-sided
  normal quantile of the confidence level and ``p`` the expected rate (0.5 is the safe,
  largest choice).
* :func:`wilson_interval` — the Wilson score interval of a binomial proportion (sound near
  0 and 1 and for small ``n``, unlike the normal approximation).
* :func:`stratified_estimate` — the stratified total ``sum_h W_h * c_h`` over cells (strata)
  with weights ``W_h = N_h / N`` and variance ``sum_h W_h**2 * c_h (1 - c_h) / n_h`` (times the
  finite population correction ``1 - n_h / N_h`` when the strata sizes are known).
* :func:`should_stop` — the sequential stopping rule: a cell stops once its Wilson
  half-width reaches a target.

Only the standard library and NumPy are used (the normal quantile comes from
:class:`statistics.NormalDist`).

Examples
--------
>>> sample_size(10_000, margin=0.05, confidence=0.95)
370
>>> lo, hi = wilson_interval(5, 100)
>>> round(float(lo), 4), round(float(hi), 4)
(0.0215, 0.1118)
>>> est = stratified_estimate([10, 0], [100, 50], populations=[1000, 1000])
>>> round(est.rate, 3)
0.05
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

from ..errors import OptionError

__all__ = [
    "z_value",
    "sample_size",
    "wilson_interval",
    "wilson_half_width",
    "StratifiedEstimate",
    "stratified_estimate",
    "should_stop",
]


def _check_confidence(confidence: float) -> float:
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise OptionError(f"confidence must lie strictly between 0 and 1, got {confidence!r} (e.g. 0.95)")
    return c


def z_value(confidence: float = 0.95) -> float:
    """Two-sided standard-normal quantile ``t`` of a confidence level (0.95 → 1.959964…).

    >>> round(z_value(0.95), 6)
    1.959964
    """
    c = _check_confidence(confidence)
    return NormalDist().inv_cdf(0.5 + c / 2.0)


def sample_size(
    population: int | float,
    *,
    margin: float = 0.01,
    confidence: float = 0.95,
    p: float = 0.5,
) -> int:
    """Trials needed to estimate a rate within ``±margin`` (Leveugle et al., DATE 2009).

    Parameters
    ----------
    population : int or float
        ``N``, the number of distinct fault sites (``math.inf`` for an unbounded population).
    margin : float
        ``e``, the error margin (half-width) wanted, e.g. 0.01 for ±1 %.
    confidence : float
        Confidence level (0.95 gives ``t`` = 1.96).
    p : float
        Expected rate; 0.5 maximises ``p(1-p)`` and is the conservative default.

    Returns
    -------
    int
        ``ceil(n)``, never more than ``N``.

    Examples
    --------
    >>> sample_size(math.inf, margin=0.01)
    9604
    >>> sample_size(100, margin=0.01)
    99
    """
    N = float(population)
    if not N >= 1:
        raise OptionError(f"population must be at least 1, got {population!r}")
    e = float(margin)
    if not 0.0 < e < 1.0:
        raise OptionError(f"margin must lie strictly between 0 and 1, got {margin!r} (e.g. 0.01 for ±1 %)")
    p = float(p)
    if not 0.0 < p < 1.0:
        raise OptionError(f"expected rate p must lie strictly between 0 and 1, got {p!r} (0.5 is the safe choice)")
    t = z_value(confidence)
    n0 = t * t * p * (1.0 - p) / (e * e)
    if math.isinf(N):
        n = n0
    else:
        n = N / (1.0 + e * e * (N - 1.0) / (t * t * p * (1.0 - p)))
    # guard against float noise just above an integer (e.g. 9604.000000000002)
    n_int = math.ceil(n - 1e-9)
    if not math.isinf(N):
        n_int = min(n_int, int(N))
    return max(1, n_int)


def wilson_interval(
    successes: "int | Sequence[int] | np.ndarray",
    trials: "int | Sequence[int] | np.ndarray",
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval ``(low, high)`` of ``successes / trials`` (vectorised).

    Where ``trials`` is 0 the interval is the uninformative ``(0, 1)``.

    >>> lo, hi = wilson_interval([0, 10], [10, 10])
    >>> [round(float(x), 4) for x in lo], [round(float(x), 4) for x in hi]
    ([0.0, 0.7225], [0.2775, 1.0])
    """
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if np.any(k < 0) or np.any(n < 0) or np.any(k > n):
        raise OptionError("wilson_interval: need 0 <= successes <= trials")
    z = z_value(confidence)
    z2 = z * z
    with np.errstate(divide="ignore", invalid="ignore"):
        phat = np.where(n > 0, k / np.where(n > 0, n, 1), 0.0)
        denom = 1.0 + z2 / np.where(n > 0, n, 1)
        centre = (phat + z2 / (2 * np.where(n > 0, n, 1))) / denom
        half = z * np.sqrt(phat * (1 - phat) / np.where(n > 0, n, 1) + z2 / (4 * np.where(n > 0, n, 1) ** 2)) / denom
    lo = np.where(n > 0, np.clip(centre - half, 0.0, 1.0), 0.0)
    hi = np.where(n > 0, np.clip(centre + half, 0.0, 1.0), 1.0)
    # exact bounds at the edges (avoid 1e-17 noise)
    lo = np.where((k == 0) & (n > 0), 0.0, lo)
    hi = np.where((k == n) & (n > 0), 1.0, hi)
    return lo, hi


def wilson_half_width(
    successes: "int | np.ndarray", trials: "int | np.ndarray", confidence: float = 0.95
) -> np.ndarray:
    """Half the width of the Wilson interval (what a precision target is compared with).

    >>> round(float(wilson_half_width(50, 100)), 4)
    0.0962
    """
    lo, hi = wilson_interval(successes, trials, confidence)
    return (hi - lo) / 2.0


@dataclass(frozen=True)
class StratifiedEstimate:
    """A stratified rate: estimate, variance, standard error and a normal-approximation interval."""

    rate: float
    variance: float
    stderr: float
    low: float
    high: float
    confidence: float
    weights: tuple[float, ...]


def stratified_estimate(
    successes: "Sequence[int] | np.ndarray",
    trials: "Sequence[int] | np.ndarray",
    *,
    populations: "Sequence[float] | np.ndarray | None" = None,
    weights: "Sequence[float] | np.ndarray | None" = None,
    confidence: float = 0.95,
    finite_population: bool = True,
    fpc_populations: "Sequence[float | None] | np.ndarray | None" = None,
) -> StratifiedEstimate:
    """Stratified total ``sum_h W_h * c_h`` over strata (campaign cells) and its variance.

    Parameters
    ----------
    successes, trials : sequences
        Per stratum: the count of the outcome of interest and the trials run.
    populations : sequence, optional
        Stratum sizes ``N_h`` (fault sites per cell); the weights are ``N_h / sum N``.
    weights : sequence, optional
        Explicit weights (normalised to sum to 1); used when ``populations`` is not given.
        Without either, strata weigh the same.
    confidence : float
        Level of the interval ``rate ± t * stderr`` (clipped to [0, 1]).
    finite_population : bool
        Multiply each stratum's variance by ``1 - n_h / N_h`` (needs ``populations``).
        This is right only when a stratum's trials are distinct sites drawn without
        replacement from its ``N_h`` (the campaign's permutation sampling of single
        deterministic sites); ``n_h = N_h`` is then an exhaustive stratum with variance 0.
    fpc_populations : sequence, optional
        The population each stratum's trials were drawn from without replacement, when it
        differs from ``populations`` (``None`` or ``inf`` for a stratum drawn with
        replacement: no correction). Defaults to ``populations``.

    Notes
    -----
    ``Var = sum_h W_h**2 * c_h (1 - c_h) / n_h`` (the plug-in estimate; with ``n_h - 1``
    in the denominator it would be unbiased, but undefined at ``n_h = 1``). A stratum with
    no trial contributes its weight with rate 0 and is reported through ``variance = inf``.

    >>> e = stratified_estimate([1, 3], [10, 10], weights=[3, 1])
    >>> round(e.rate, 4), round(e.variance, 6)
    (0.15, 0.006375)
    """
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if k.shape != n.shape or k.ndim != 1 or len(k) == 0:
        raise OptionError("stratified_estimate: successes and trials must be equal-length, non-empty 1-D sequences")
    if np.any(k < 0) or np.any(k > n):
        raise OptionError("stratified_estimate: need 0 <= successes <= trials in every stratum")
    if populations is not None:
        N = np.asarray(populations, dtype=np.float64)
        if N.shape != k.shape or np.any(N <= 0):
            raise OptionError("stratified_estimate: populations must be positive, one per stratum")
        w = N / N.sum()
    elif weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != k.shape or np.any(w < 0) or w.sum() <= 0:
            raise OptionError("stratified_estimate: weights must be non-negative, one per stratum, not all 0")
        w = w / w.sum()
        N = None
    else:
        w = np.full(len(k), 1.0 / len(k))
        N = None
    safe_n = np.where(n > 0, n, 1.0)
    c = np.where(n > 0, k / safe_n, 0.0)
    var_h = c * (1.0 - c) / safe_n
    if finite_population and (N is not None or fpc_populations is not None):
        if fpc_populations is not None:
            F = np.array([np.inf if f is None else float(f) for f in fpc_populations], dtype=np.float64)
            if F.shape != k.shape or np.any(F <= 0):
                raise OptionError("stratified_estimate: fpc_populations must be positive (or None), one per stratum")
        else:
            F = N
        var_h = var_h * np.clip(1.0 - n / F, 0.0, 1.0)
    var_h = np.where(n > 0, var_h, np.inf)
    rate = float(np.sum(w * c))
    variance = float(np.sum(np.where(w > 0, w * w * var_h, 0.0)))
    se = math.sqrt(variance) if math.isfinite(variance) else math.inf
    t = z_value(confidence)
    low = max(0.0, rate - t * se) if math.isfinite(se) else 0.0
    high = min(1.0, rate + t * se) if math.isfinite(se) else 1.0
    return StratifiedEstimate(rate, variance, se, low, high, float(confidence), tuple(float(x) for x in w))


def should_stop(
    successes: "int | np.ndarray",
    trials: "int | np.ndarray",
    *,
    half_width: float,
    confidence: float = 0.95,
    min_trials: int = 30,
    max_trials: int | None = None,
) -> np.ndarray:
    """Sequential stopping rule: True where a cell's Wilson half-width is ``<= half_width``.

    A cell never stops before ``min_trials`` and always stops at ``max_trials``.

    >>> should_stop([0, 5], [400, 40], half_width=0.01).tolist()
    [True, False]
    """
    if not 0.0 < float(half_width) < 0.5:
        raise OptionError(f"half_width must lie strictly between 0 and 0.5, got {half_width!r}")
    n = np.asarray(trials)
    hw = wilson_half_width(successes, trials, confidence)
    stop = (hw <= float(half_width)) & (n >= int(min_trials))
    if max_trials is not None:
        stop = stop | (n >= int(max_trials))
    return np.asarray(stop, dtype=bool)
