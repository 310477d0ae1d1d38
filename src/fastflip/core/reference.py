"""The pure-NumPy reference of every fault model: the oracle all fast backends are tested against.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

It is deliberately simple and slow: it walks the plan site by site in Python, reads
each element's raw word through NumPy, applies the plan's word rule (see
:mod:`fastflip.core.plan`) and writes it back. Nothing here is used on a fast path.

Examples
--------
>>> import numpy as np
>>> from fastflip.core.plan import Plan, TensorRef
>>> arrays = {"w": np.ones(3, dtype=">f4")}
>>> plan = Plan.from_sites([TensorRef("w", ">f4", (3,))], [0], [1], xor_mask=[1 << 31])
>>> old, new = apply_plan(arrays, plan)
>>> arrays["w"].tolist()
[1.0, -1.0, 1.0]
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .dtypes import from_words, to_words, word_type
from .floatformats import FORMATS
from .plan import Plan

__all__ = ["word_rule", "scale_word", "format_value", "format_scale_word", "apply_plan"]


def word_rule(old: int, and_mask: int, or_mask: int, xor_mask: int, bits: int) -> int:
    """``((old & and) | or) ^ xor`` restricted to a word of ``bits`` bits.

    >>> word_rule(0b1010, (1 << 64) - 1, 0, 0b0001, 8)
    11
    """
    width = (1 << bits) - 1
    return (((old & and_mask) | or_mask) ^ xor_mask) & width


def scale_word(old: int, factor: float, dtype: np.dtype | str) -> int:
    """Raw word of ``value(old) * factor`` in ``dtype``.

    Floats: the product is computed in float64 and rounded to the dtype (overflow
    gives +-Inf). Integers: rounded half away from zero, saturated at the limits.

    >>> scale_word(0x3F800000, 2.0, "f4") == 0x40000000
    True
    >>> scale_word(100, 2.0, "i1")
    127
    """
    dtype = np.dtype(dtype)
    wt = word_type(dtype)
    value = from_words(np.array([old], dtype=wt.uint), dtype.newbyteorder("="))[0]
    with np.errstate(over="ignore", invalid="ignore"):
        product = float(value) * float(factor)
        if wt.kind == "f":
            new = np.array([product], dtype=np.float64).astype(dtype.newbyteorder("="))
        else:
            info = np.iinfo(dtype)
            if np.isnan(product):
                rounded = 0.0
            else:
                rounded = float(np.sign(product) * np.floor(abs(product) + 0.5))
            clipped = min(max(rounded, float(info.min)), float(info.max))
            # float(info.max) of 64-bit types rounds up to 2**63 / 2**64: clamp in Python ints
            as_int = max(min(int(clipped), int(info.max)), int(info.min))
            new = np.array([as_int], dtype=dtype.newbyteorder("="))
    return int(to_words(new)[0])


def format_value(word: int, fmt: str) -> float:
    """Value of one word of a float format (:mod:`fastflip.core.floatformats`), computed bit by bit in Python.

    >>> format_value(0x3F80, "bfloat16"), format_value(0x7F, "float8_e4m3fn")
    (1.0, nan)
    """
    f = FORMATS[fmt]
    sign = -1.0 if (word >> (f.bits - 1)) & 1 else 1.0
    e = (word >> f.mantissa) & ((1 << f.exponent) - 1)
    m = word & ((1 << f.mantissa) - 1)
    if e == (1 << f.exponent) - 1:
        if f.nan_all_ones:
            if m == (1 << f.mantissa) - 1:
                return math.nan
        else:
            return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * math.ldexp(m, 1 - f.bias - f.mantissa)
    return sign * math.ldexp((1 << f.mantissa) + m, e - f.bias - f.mantissa)


def format_scale_word(old: int, factor: float, fmt: str) -> int:
    """Word of ``value(old) * factor`` in a float format: nearest value by search over every word, ties to the
    even word; overflow gives Inf, or saturates where the format has none (float8_e4m3fn)."""
    f = FORMATS[fmt]
    x = format_value(old, fmt) * float(factor)
    sign = 1 << (f.bits - 1)
    if math.isnan(x):
        return sign - 1 if f.nan_all_ones else (((1 << f.exponent) - 1) << f.mantissa) | (1 << (f.mantissa - 1))
    neg = sign if math.copysign(1.0, x) < 0 else 0
    finite = [(w, format_value(w, fmt)) for w in range(sign)]
    finite = [(w, v) for w, v in finite if math.isfinite(v)]
    top_w, top = finite[-1]
    if abs(x) >= top + (top - finite[-2][1]) / 2:
        return neg | ((((1 << f.exponent) - 1) << f.mantissa) if f.has_inf else top_w)
    best = min(finite, key=lambda wv: (abs(abs(x) - wv[1]), wv[0] % 2))
    return neg | best[0]


def apply_plan(arrays: Mapping[str, np.ndarray], plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Apply ``plan`` to ``arrays`` in place, site by site; return (old words, new words) in plan order."""
    old_words = np.zeros(len(plan), dtype=np.uint64)
    new_words = np.zeros(len(plan), dtype=np.uint64)
    for i in range(len(plan)):
        ref = plan.tensors[int(plan.tensor[i])]
        arr = arrays[ref.name]
        flat = arr.reshape(-1)
        wt = word_type(arr.dtype)
        old = int(to_words(flat[int(plan.index[i]) : int(plan.index[i]) + 1])[0])
        factor = None if plan.scale is None else float(plan.scale[i])
        if factor is not None and not np.isnan(factor):
            new = format_scale_word(old, factor, ref.format) if ref.format else scale_word(old, factor, arr.dtype)
        else:
            new = word_rule(old, int(plan.and_mask[i]), int(plan.or_mask[i]), int(plan.xor_mask[i]), wt.bits)
        # store the raw word through an unsigned view in the stored byte order (exact for every bit pattern)
        raw = flat.view(np.dtype(wt.uint).newbyteorder(wt.byteorder if wt.itemsize > 1 else "="))
        raw[int(plan.index[i])] = new
        old_words[i] = old
        new_words[i] = new
    return old_words, new_words
