"""Per-dtype bit semantics: word width, bit fields, and conversions between values and raw words.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

Bit 0 is the least significant bit of the stored word, whatever the byte order on
disk (float32: 31 sign, 30-23 exponent, 22-0 mantissa). Words are handled as
native-order unsigned integers; byte order only matters when words are read from
or written to storage.

Examples
--------
>>> import numpy as np
>>> wt = word_type(np.dtype(">f4"))
>>> wt.bits, wt.kind, wt.byteorder, wt.fields["exponent-msb"]
(32, 'f', '>', (30,))
>>> int(to_words(np.array([1.0], dtype="<f4"))[0]) == 0x3F800000
True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..errors import OptionError
from .floatformats import FORMATS, format_name

__all__ = ["WordType", "word_type", "to_words", "from_words", "is_supported_dtype", "UINT_FOR_SIZE", "dtype_label"]

UINT_FOR_SIZE: Mapping[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
}

# (exponent bits, mantissa bits) of the IEEE-754 formats
_FLOAT_FIELDS = {2: (5, 10), 4: (8, 23), 8: (11, 52)}


@dataclass(frozen=True)
class WordType:
    """The bit-level description of one numeric dtype.

    Attributes
    ----------
    dtype : numpy.dtype
        The dtype as stored (byte order included).
    kind : str
        ``'f'`` float, ``'i'`` signed int, ``'u'`` unsigned int, ``'b'`` bool.
    bits : int
        Width of the stored word in bits.
    byteorder : str
        ``'<'`` or ``'>'`` (``'|'`` for one-byte types).
    fields : dict
        Named bit fields (``sign``, ``exponent``, ``exponent-msb``, ``mantissa``,
        ``all``; integers also have ``sign`` when signed, ``msb``, ``lsb``).
    format : str or None
        A float format NumPy lacks (``bfloat16``, ``float8_e4m3fn``, ``float8_e5m2``,
        see :mod:`fastflip.core.floatformats`) held in the unsigned words ``dtype``; ``kind`` is
        then ``'f'`` and the fields are the format's.
    """

    dtype: np.dtype
    kind: str
    bits: int
    byteorder: str
    fields: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    format: str | None = None

    @property
    def name(self) -> str:
        """``bfloat16`` for a format, else the NumPy name (``float32``)."""
        return self.format or self.dtype.name

    @property
    def itemsize(self) -> int:
        return self.bits // 8

    @property
    def uint(self) -> np.dtype:
        """Native-order unsigned integer dtype of the same width."""
        return UINT_FOR_SIZE[self.itemsize]

    @property
    def swapped(self) -> bool:
        """True when the stored byte order differs from this machine's."""
        return self.itemsize > 1 and self.byteorder != _NATIVE

    @property
    def full_mask(self) -> int:
        return (1 << self.bits) - 1


_NATIVE = "<" if np.little_endian else ">"


def is_supported_dtype(dtype: np.dtype) -> bool:
    """True for float16/32/64, int/uint 8-64 and bool (either byte order)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return dtype.itemsize in _FLOAT_FIELDS
    if dtype.kind in "iu":
        return dtype.itemsize in UINT_FOR_SIZE
    return dtype.kind == "b"


def word_type(dtype: "np.dtype | str | WordType", fmt: str | None = None) -> WordType:
    """Return the :class:`WordType` of a numeric dtype, or of a float format held in unsigned words (cached).

    ``dtype`` may name a format (``"bfloat16"``, ``">bfloat16"``, ``"float8_e4m3fn"``):
    its words are then native (or the given) order unsigned integers. ``fmt`` names
    the format of unsigned ``dtype`` words. A :class:`WordType` is returned as is.

    >>> wt = word_type("<u2", "bfloat16"); (wt.kind, wt.fields["exponent"][-1], wt.name)
    ('f', 14, 'bfloat16')
    >>> word_type("float8_e4m3fn").dtype.str
    '|u1'

    Raises
    ------
    OptionError
        If the dtype is not a supported numeric type, or ``fmt`` does not fit it.
    """
    if isinstance(dtype, WordType):
        return dtype
    if isinstance(dtype, str) and fmt is None:
        named = format_name(dtype)
        if named is not None:
            order = dtype.strip()[0] if dtype.strip()[:1] in "<>=|" else "="
            return _word_type(FORMATS[named].storage.newbyteorder(order), named)
    return _word_type(np.dtype(dtype), format_name(fmt) if fmt is not None else None)


def dtype_label(dtype: "np.dtype | str | WordType", fmt: str | None = None) -> str:
    """A dtype's name for messages: ``bfloat16`` for a format, else NumPy's (``int64``).

    >>> dtype_label("<u2", "bfloat16"), dtype_label("<i8")
    ('bfloat16', 'int64')
    """
    try:
        return word_type(dtype, fmt).name
    except OptionError:
        return str(np.dtype(dtype)) if not isinstance(dtype, WordType) else dtype.name


@functools.lru_cache(maxsize=256)
def _word_type(dtype: np.dtype, fmt: str | None = None) -> WordType:
    if not is_supported_dtype(dtype):
        raise OptionError(f"dtype {dtype} is not supported: use float16/32/64, bfloat16, float8_e4m3fn/e5m2, "
                          "int/uint 8-64 or bool")
    bits = dtype.itemsize * 8
    order = dtype.byteorder
    if order == "=":
        order = _NATIVE
    if dtype.itemsize == 1:
        order = "|"
    if fmt is not None:
        f = FORMATS.get(fmt)
        if f is None:
            raise OptionError(f"unknown float format {fmt!r}: use {', '.join(FORMATS)}")
        if dtype.kind != "u" or dtype.itemsize * 8 != f.bits:
            raise OptionError(f"{fmt} is held in uint{f.bits} words, not {dtype}")
        return WordType(dtype=dtype, kind="f", bits=bits, byteorder=order, fields=dict(f.fields), format=fmt)
    # bool: the value lives in bit 0; 'all' means that bit (other bits of the byte only when named)
    fields: dict[str, tuple[int, ...]] = {"all": (0,) if dtype.kind == "b" else tuple(range(bits))}
    if dtype.kind == "f":
        ne, nm = _FLOAT_FIELDS[dtype.itemsize]
        fields["sign"] = (bits - 1,)
        fields["exponent"] = tuple(range(nm, nm + ne))
        fields["exponent-msb"] = (nm + ne - 1,)
        fields["mantissa"] = tuple(range(nm))
    else:
        fields["msb"] = (bits - 1,)
        fields["lsb"] = (0,)
        if dtype.kind == "i":
            fields["sign"] = (bits - 1,)
    return WordType(dtype=dtype, kind=dtype.kind, bits=bits, byteorder=order, fields=fields)


def to_words(values: np.ndarray) -> np.ndarray:
    """Raw words of ``values`` as native-order unsigned integers (a copy).

    >>> to_words(np.array([1], dtype=">i2")).tolist()
    [1]
    """
    values = np.asarray(values)
    wt = word_type(values.dtype)
    native = values.astype(values.dtype.newbyteorder("="), copy=False) if wt.swapped else values
    return np.ascontiguousarray(native).view(wt.uint).copy()


def from_words(words: np.ndarray, dtype: np.dtype | str) -> np.ndarray:
    """Values of ``dtype`` (byte order kept) whose raw words are ``words``.

    >>> from_words(np.array([0x3F800000], dtype=np.uint32), ">f4").tolist()
    [1.0]
    """
    dtype = np.dtype(dtype)
    wt = word_type(dtype)
    words = np.ascontiguousarray(np.asarray(words).astype(wt.uint, copy=False))
    native = words.view(dtype.newbyteorder("=") if dtype.itemsize > 1 else dtype)
    return native.astype(dtype) if wt.swapped else native.copy()
