"""The older comparator's figures (``hdf5_comparator.py -p``), computed in each dataset's own arithmetic.

Layer: ``files`` (numpy only; used by :mod:`fastflip.files.diff` for ``fastflip diff --oldtool``).

The older tool compared two HDF5 files dataset by dataset with NumPy scalars of the stored dtype: entries
whose values differ (``x != y``: NaN differs from itself, ``-0.0`` equals ``0.0``), the Euclidean distance
``numpy.linalg.norm(before - after)`` and the relative differences ``abs(y - x) / x``. Its arithmetic is
kept here, so its numbers come out: a float32 norm whose sum of squares passes 3.4e38 is ``inf``, a
distance over a NaN is ``nan``, float16 data give float16 figures (4 significant digits), ``x = 0`` gives
``inf`` (or ``nan`` when ``y`` is NaN), and integer differences wrap in the stored width before the norm
converts them to float64 (``int8``: ``100 - (-100)`` is ``-56``). Non-numeric and boolean data (which it
could not subtract) are compared as float64. :func:`old_str` prints a figure as the older tool printed it.

Examples
--------
>>> import numpy as np
>>> c = OldComparator()
>>> c.add(np.array([100, 3], "i1"), np.array([-100, 3], "i1"))
>>> r = c.result(2, scalar=False)
>>> r["diff_count"], r["euclidean_distance"], r["relative_diffs"], r["arithmetic"]
(1, 56.0, [0.56], 'float64')
>>> c = OldComparator()
>>> c.add(np.array([3e38, 1.0], "f4"), np.array([-3e38, 1.0], "f4"))
>>> c.result(2, scalar=False)["euclidean_distance"], [old_str(x, "float16") for x in (0.1, None, "-inf")]
('inf', ['0.1', 'nan', '-inf'])
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

__all__ = ["OldComparator", "old_str", "json_num"]


def json_num(x: float) -> float | str | None:
    """NaN → None, ±inf → 'inf'/'-inf' (strict JSON has neither)."""
    if math.isnan(x):
        return None
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def _from_json(x: Any) -> float:
    return math.nan if x is None else float(x)


def old_str(x: Any, arithmetic: str) -> str:
    """``x`` (a JSON number, ``None`` for NaN, ``'inf'``/``'-inf'``) as ``str()`` of a NumPy scalar of the
    ``arithmetic`` dtype printed it (the older tool's ``str(distance)``; in its list of relative differences
    NumPy 1 printed each the same way, ``[0.5, inf, nan]``):
    float32 and float16 values print their shortest digits, not those of the float64 they are stored as."""
    with np.errstate(all="ignore"):
        return str(np.dtype(arithmetic).type(_from_json(x)))


class OldComparator:
    """Running figures of one dataset pair, fed block by block (blocks of the flattened data, in order).

    The sum of squares is accumulated in the norm's own dtype across blocks (one block per 8 MiB of data per
    file, so for most datasets in one ``dot`` as the older tool computed it).
    """

    def __init__(self) -> None:
        self.n = 0
        self.sq: np.generic | None = None
        self.rel: list[np.ndarray] = []
        self.arithmetic = "float64"

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        x, y = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
        if x.dtype.kind not in "iuf":  # booleans (it could not subtract them), anything else: float64
            x, y = x.astype(np.float64), y.astype(np.float64)
        with np.errstate(all="ignore"):
            ne = x != y
            self.n += int(np.count_nonzero(ne))
            d = x - y  # the stored dtype: integers wrap, float32 stays float32
            if d.dtype.kind != "f":  # numpy.linalg.norm converts integers to float64, after the wrap
                d = d.astype(np.float64)
            part = d.dot(d)
            self.sq = part if self.sq is None else np.add(self.sq, part, dtype=part.dtype)
            self.arithmetic = part.dtype.name
            if ne.any():
                self.rel.append(np.abs(y[ne] - x[ne]) / x[ne])

    def result(self, entries: int, scalar: bool) -> dict[str, Any]:
        """``entries``, ``diff_count``, ``diff_percent``, ``euclidean_distance`` (``None`` for a scalar, as it
        printed none; NaN is ``None`` too in JSON, ``nan`` in :func:`old_str`), ``relative_diffs`` (none for a
        scalar) and ``arithmetic``, the dtype its figures were computed in."""
        with np.errstate(all="ignore"):
            dist = None if scalar or self.sq is None else json_num(float(np.sqrt(self.sq)))
        rel = np.concatenate(self.rel) if self.rel and not scalar else np.zeros(0)
        return {
            "entries": int(entries), "diff_count": self.n,
            "diff_percent": (self.n * 100 / entries) if entries else 0.0,
            "euclidean_distance": dist,
            "relative_diffs": [json_num(float(v)) for v in rel], "arithmetic": self.arithmetic,
        }
