"""Vectorized NumPy form of the plan's word rule (see :mod:`fastflip.core.plan`).

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

Used where whole columns of words must be computed without touching storage: the
NaN/Inf-avoidance check during sampling, value-level (scale) sites on every CPU
backend, and NaN/Inf counting. The site-by-site oracle stays in
:mod:`fastflip.core.reference`; tests check these against it.

Examples
--------
>>> import numpy as np
>>> old = np.array([0x3F800000], dtype=np.uint64)
>>> hex(int(rule_words(old, ~np.zeros(1, np.uint64), np.zeros(1, np.uint64), np.array([1 << 31], np.uint64), 32)[0]))
'0xbf800000'
>>> hex(int(scale_words(old, np.array([2.0]), "f4")[0]))
'0x40000000'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .dtypes import WordType, word_type
from .floatformats import FORMATS, decode, encode, nonfinite_words

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["rule_words", "new_words", "new_words_for", "scale_words", "words_to_values", "nonfinite", "became_nonfinite",
           "WordCounts"]


def rule_words(old: np.ndarray, and_mask: np.ndarray, or_mask: np.ndarray, xor_mask: np.ndarray, bits: int | np.ndarray) -> np.ndarray:
    """``(((old & and) | or) ^ xor)`` truncated to the word width (uint64 columns)."""
    bits_arr = np.asarray(bits, dtype=np.uint64)
    width = np.where(bits_arr >= 64, np.uint64(0xFFFFFFFFFFFFFFFF), (np.uint64(1) << (bits_arr % np.uint64(64))) - np.uint64(1))
    return (((old & and_mask) | or_mask) ^ xor_mask) & width


def new_words(old: np.ndarray, and_mask: np.ndarray, or_mask: np.ndarray, xor_mask: np.ndarray,
              scale: np.ndarray | None, dtype: Any) -> np.ndarray:
    """The words a rule makes from ``old`` words of one word type (a WordType for bfloat16/float8 words):
    the masks' bit rule, and the value-level rule where ``scale`` is given and not NaN."""
    new = rule_words(old, and_mask, or_mask, xor_mask, word_type(dtype).bits)
    if scale is not None:
        at = ~np.isnan(scale)
        if at.any():
            new[at] = scale_words(old[at], scale[at], dtype)
    return new


def new_words_for(old: np.ndarray, plan: Plan, pos: np.ndarray, dtype: Any) -> np.ndarray:
    """The words the plan's rule makes from ``old`` at plan positions ``pos`` (one word type; see :func:`new_words`)."""
    return new_words(old, plan.and_mask[pos], plan.or_mask[pos], plan.xor_mask[pos],
                     None if plan.scale is None else plan.scale[pos], dtype)


def words_to_values(words: np.ndarray, dtype: "np.dtype | str | WordType") -> np.ndarray:
    """Values (native byte order) whose raw words are the uint64 column ``words``.

    Float formats NumPy lacks (bfloat16, float8) decode exactly to float64.
    """
    wt = word_type(dtype)
    if wt.format:
        return decode(np.asarray(words, dtype=np.uint64), FORMATS[wt.format])
    native = wt.dtype.newbyteorder("=") if wt.itemsize > 1 else wt.dtype
    return np.ascontiguousarray(words.astype(wt.uint)).view(native)


def scale_words(old: np.ndarray, factors: np.ndarray, dtype: "np.dtype | str | WordType") -> np.ndarray:
    """New words of ``value(old) * factor`` (same rounding/saturation as :func:`fastflip.core.reference.scale_word`)."""
    wt = word_type(dtype)
    if wt.format:
        f = FORMATS[wt.format]
        with np.errstate(over="ignore", invalid="ignore"):
            return encode(decode(np.asarray(old, dtype=np.uint64), f) * np.asarray(factors, dtype=np.float64), f)
    values = words_to_values(np.asarray(old, dtype=np.uint64), dtype)
    native = values.dtype
    with np.errstate(over="ignore", invalid="ignore"):
        product = values.astype(np.float64) * np.asarray(factors, dtype=np.float64)
        if wt.kind == "f":
            new = product.astype(native)
        else:
            info = np.iinfo(native)
            rounded = np.where(np.isnan(product), 0.0, np.sign(product) * np.floor(np.abs(product) + 0.5))
            new = np.empty(len(rounded), dtype=native)
            hi = rounded >= float(info.max)
            lo = rounded <= float(info.min)
            mid = ~(hi | lo)
            new[mid] = rounded[mid].astype(native)
            new[hi] = info.max
            new[lo] = info.min
    return np.ascontiguousarray(new).view(wt.uint).astype(np.uint64)


def nonfinite(words: np.ndarray, dtype: "np.dtype | str | WordType") -> tuple[np.ndarray, np.ndarray]:
    """Boolean columns (is NaN, is Inf) of the values of ``words``; all False for integers.

    Float formats follow their own rules (float8_e4m3fn: no Inf, NaN only at S.1111.111).
    """
    wt = word_type(dtype)
    if wt.format:
        return nonfinite_words(np.asarray(words, dtype=np.uint64), FORMATS[wt.format])
    if wt.kind != "f":
        z = np.zeros(len(words), dtype=bool)
        return z, z.copy()
    values = words_to_values(np.asarray(words, dtype=np.uint64), dtype)
    return np.isnan(values), np.isinf(values)


def became_nonfinite(old: np.ndarray, new: np.ndarray, dtype: np.dtype | str) -> tuple[int, int]:
    """How many sites became NaN and how many became +-Inf (they were not before).

    >>> became_nonfinite(np.array([0x3F800000], np.uint64), np.array([0x7FC00000], np.uint64), "f4")
    (1, 0)
    """
    old_nan, old_inf = nonfinite(old, dtype)
    new_nan, new_inf = nonfinite(new, dtype)
    return int((new_nan & ~old_nan).sum()), int((new_inf & ~old_inf).sum())


class WordCounts:
    """Counts shared by logs with ``old_words`` / ``new_words`` columns and a ``_became() -> (nan, inf)``."""

    old_words: np.ndarray
    new_words: np.ndarray

    def _became(self) -> tuple[int, int]:  # pragma: no cover - each log defines it
        raise NotImplementedError

    @property
    def nan_count(self) -> int:
        """Sites whose value became NaN (it was not before)."""
        return self._became()[0]

    @property
    def inf_count(self) -> int:
        """Sites whose value became +-Inf (it was not before)."""
        return self._became()[1]

    @property
    def changed(self) -> int:
        """Sites whose word changed (a stuck-at bit already at its value is touched, not changed)."""
        return int((self.old_words != self.new_words).sum())
