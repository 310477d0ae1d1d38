"""Float formats NumPy lacks: bfloat16, float8_e4m3fn and float8_e5m2 held as unsigned words.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

Such a tensor is stored (in memory and in HDF5) as ``uint16`` / ``uint8`` words; its
*format* says how to read them. Each format has its own sign/exponent/mantissa fields
and its own NaN/Inf rules:

=================  =====  ========  ========  =====================================  =====
format             bits   exponent  mantissa  NaN                                    Inf
=================  =====  ========  ========  =====================================  =====
bfloat16           16     8 (14-7)  7 (6-0)   exponent all ones, mantissa not zero   yes
float8_e5m2        8      5 (6-2)   2 (1-0)   exponent all ones, mantissa not zero   yes
float8_e4m3fn      8      4 (6-3)   3 (2-0)   only S.1111.111                        none
=================  =====  ========  ========  =====================================  =====

float8_e4m3fn ("fn": finite, NaN only at all-ones) uses the all-ones exponent for
normal numbers up to 448. Values are decoded exactly into float64; encoding rounds to
nearest, ties to even; beyond the largest finite value it gives Inf where the format
has one and saturates at the largest finite value in float8_e4m3fn (±448, Inf
included), as PyTorch's conversion does.

Examples
--------
>>> import numpy as np
>>> f = FORMATS["bfloat16"]
>>> f.fields["exponent-msb"], decode(np.array([0x3F80, 0x7F80, 0x7FC0]), f).tolist()
((14,), [1.0, inf, nan])
>>> decode(np.array([0x7E, 0x7F, 0x78]), FORMATS["float8_e4m3fn"]).tolist()
[448.0, nan, 256.0]
>>> [hex(int(w)) for w in encode(np.array([1.0, 1e6, -0.0]), FORMATS["float8_e4m3fn"])]
['0x38', '0x7e', '0x80']
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

__all__ = ["FloatFormat", "FORMATS", "decode", "encode", "nonfinite_words", "format_name"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format of ``bits`` bits: 1 sign, ``exponent``, ``mantissa`` bits."""

    name: str
    bits: int
    exponent: int
    mantissa: int
    has_inf: bool = True
    nan_all_ones: bool = False  # NaN only where every exponent and mantissa bit is set (e4m3fn)
    fields: Mapping[str, tuple[int, ...]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        m, e = self.mantissa, self.exponent
        object.__setattr__(self, "fields", {
            "all": tuple(range(self.bits)), "sign": (self.bits - 1,), "exponent": tuple(range(m, m + e)),
            "exponent-msb": (m + e - 1,), "mantissa": tuple(range(m)),
        })

    @property
    def bias(self) -> int:
        return (1 << (self.exponent - 1)) - 1

    @property
    def storage(self) -> np.dtype:
        """The unsigned word dtype that holds the format."""
        return np.dtype(f"u{self.bits // 8}")


FORMATS: Mapping[str, FloatFormat] = {
    "bfloat16": FloatFormat("bfloat16", 16, 8, 7),
    "float8_e5m2": FloatFormat("float8_e5m2", 8, 5, 2),
    "float8_e4m3fn": FloatFormat("float8_e4m3fn", 8, 4, 3, has_inf=False, nan_all_ones=True),
}


def format_name(name: str | None) -> str | None:
    """The canonical format name of ``name`` (``torch.bfloat16``, ``bf16``, ``bfloat16`` ...), or None.

    >>> format_name("torch.float8_e4m3fn"), format_name("bf16"), format_name("float32")
    ('float8_e4m3fn', 'bfloat16', None)
    """
    if name is None:
        return None
    n = str(name).strip().lower().replace("torch.", "").lstrip("<>=|")
    n = {"bf16": "bfloat16", "fp8_e4m3fn": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "e4m3fn": "float8_e4m3fn",
         "e5m2": "float8_e5m2"}.get(n, n)
    return n if n in FORMATS else None


def _parts(words: np.ndarray, f: FloatFormat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = np.asarray(words).astype(np.uint64) & np.uint64((1 << f.bits) - 1)
    sign = (w >> np.uint64(f.bits - 1)) & np.uint64(1)
    exp = (w >> np.uint64(f.mantissa)) & np.uint64((1 << f.exponent) - 1)
    man = w & np.uint64((1 << f.mantissa) - 1)
    return sign, exp, man


def nonfinite_words(words: np.ndarray, f: FloatFormat) -> tuple[np.ndarray, np.ndarray]:
    """(is NaN, is Inf) of raw words, by the format's own rules."""
    _, exp, man = _parts(words, f)
    top = exp == np.uint64((1 << f.exponent) - 1)
    if f.nan_all_ones:
        nan = top & (man == np.uint64((1 << f.mantissa) - 1))
        return nan, np.zeros(len(nan), dtype=bool)
    return top & (man != 0), top & (man == 0)


def decode(words: np.ndarray, f: FloatFormat) -> np.ndarray:
    """Exact float64 values of raw words."""
    sign, exp, man = _parts(words, f)
    e = exp.astype(np.int64)
    m = man.astype(np.float64)
    frac = np.where(e == 0, m / (1 << f.mantissa), 1.0 + m / (1 << f.mantissa))
    scale = np.ldexp(1.0, np.where(e == 0, 1 - f.bias, e - f.bias))
    out = np.where(sign == 1, -1.0, 1.0) * frac * scale
    nan, inf = nonfinite_words(words, f)
    out[nan] = np.nan
    out[inf] = np.where(sign[inf] == 1, -np.inf, np.inf)
    return out


@functools.lru_cache(maxsize=8)
def _table(f: FloatFormat) -> tuple[np.ndarray, np.ndarray]:
    """Words 0 .. largest finite positive, and their values (increasing)."""
    words = np.arange(1 << (f.bits - 1), dtype=np.uint64)
    values = decode(words, f)
    finite = np.isfinite(values)
    last = int(np.flatnonzero(finite)[-1])
    return words[: last + 1], values[: last + 1]


def encode(values: np.ndarray, f: FloatFormat) -> np.ndarray:
    """Raw words (uint64 column) of float64 ``values`` rounded to nearest, ties to even."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    words, table = _table(f)
    mag = np.abs(x)
    hi = np.clip(np.searchsorted(table, mag, side="left"), 0, len(table) - 1)  # first >= mag
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = mag - table[lo], table[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (words[hi] % 2 == 0))
    out = np.where(pick_hi | (hi == lo), words[hi], words[lo])
    top = table[-1]
    half_ulp = (top - table[-2]) / 2
    over = mag >= top + half_ulp
    special = np.uint64((1 << (f.bits - 1)) - 1)  # e4m3fn NaN magnitude (S.1111.111)
    inf_word = np.uint64(((1 << f.exponent) - 1) << f.mantissa)
    out = np.where(over, inf_word if f.has_inf else words[-1], out)
    out = np.where(np.isnan(x), special if f.nan_all_ones else inf_word | np.uint64(1 << (f.mantissa - 1)), out)
    sign = np.signbit(x).astype(np.uint64) << np.uint64(f.bits - 1)
    return (out.astype(np.uint64) | sign).astype(np.uint64)
