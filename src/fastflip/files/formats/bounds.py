"""Sizes declared by a file, checked with bounded arithmetic before any product is formed.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A checkpoint header declares shapes, strides and offsets; a hostile one declares
negative sizes (whose product can come out positive), or thousands of dimensions of
2**64 each (whose exact product takes minutes to form). Every reader turns declared
numbers into element counts through :func:`checked_numel` and :func:`checked_ints`, which
look at each number on its own first (an integer, not negative, below :data:`MAX_DIM`) and
stop multiplying as soon as the product passes :data:`MAX_ELEMENTS`, so the work is
bounded by the number of dimensions, whatever their values.

Examples
--------
>>> checked_numel((3, 4), "w.pt: tensor /a")
12
>>> checked_numel((2, 0, 2**62), "x")
0
>>> try:
...     checked_numel((-5,), "w.npy: array")
... except FormatError as e:
...     print(e)
w.npy: array declares dimension -5 (negative); the file is damaged or crafted
"""

from __future__ import annotations

from typing import Any, Sequence

from ...errors import FormatError

__all__ = ["MAX_DIM", "MAX_ELEMENTS", "MAX_NDIM", "checked_ints", "checked_numel"]

MAX_DIM = 2**62  # one declared size, offset or stride
MAX_ELEMENTS = 2**60  # elements of one tensor (x 8 bytes x 8 bits stays below 2**66: still addressable checks)
MAX_NDIM = 1024  # dimensions of one tensor (torch allows 64, NumPy 64, HDF5 32)


def checked_ints(values: Any, where: str, what: str, *, lo: int = 0) -> tuple[int, ...]:
    """``values`` as a tuple of plain ints in ``[lo, MAX_DIM]``, at most :data:`MAX_NDIM` of them.

    Raises
    ------
    FormatError
        Not a sequence of integers (bools and floats are not integers), too many, or one out of range.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise FormatError(f"{where} declares a malformed {what} ({type(values).__name__}, not a list of integers)")
    if len(values) > MAX_NDIM:
        raise FormatError(f"{where} declares a {what} of {len(values)} entries (more than {MAX_NDIM}); "
                          "the file is damaged or crafted")
    out = []
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise FormatError(f"{where} declares a malformed {what} (entry of type {type(v).__name__})")
        if v < lo:
            kind = "negative" if v < 0 else f"below {lo}"
            raise FormatError(f"{where} declares {_what1(what)} {_short(v)} ({kind}); the file is damaged or crafted")
        if v > MAX_DIM:
            raise FormatError(f"{where} declares {_what1(what)} {_short(v)} (more than 2**62); the file is damaged "
                              "or crafted")
        out.append(int(v))
    return tuple(out)


def checked_numel(shape: Any, where: str) -> int:
    """The element count of ``shape``, refused (one line) when a size is negative or the count passes
    :data:`MAX_ELEMENTS`; the product is never formed past that bound."""
    dims = checked_ints(shape, where, "shape")
    if 0 in dims:
        return 0
    n = 1
    for d in dims:
        n *= d
        if n > MAX_ELEMENTS:
            raise FormatError(f"{where} declares shape {_short(list(dims))}: more than 2**60 elements; the file is "
                              "damaged or crafted")
    return n


def _what1(what: str) -> str:
    return {"shape": "dimension", "strides": "stride"}.get(what, what)


def _short(v: Any) -> str:
    """A declared value for a message, cut short (a 1,000-digit number is not printed in full)."""
    if isinstance(v, int) and v.bit_length() > 64:
        return f"of {v.bit_length()} bits"
    text = repr(v) if not isinstance(v, int) else str(v)
    return text if len(text) <= 60 else text[:57] + "..."
