"""The header of a ``.npy`` stream (a file, a stored ``.npz`` member or an inflated one), checked.

Imports: :mod:`fastflip.files.formats` (its ``FormatError``); NumPy's ``numpy.lib.format`` reads the
header. Used by :mod:`~fastflip.files.formats.numpy_io` and :mod:`~fastflip.files.formats.npz_members`.

>>> import io, numpy as np
>>> buf = io.BytesIO(); np.save(buf, np.zeros((2, 3), ">f4")); _ = buf.seek(0)
>>> dt, fortran, shape, hlen = npy_header(buf, len(buf.getvalue()), "doc.npy")
>>> dt.str, fortran, shape, hlen
('>f4', False, (2, 3), 128)
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ...errors import FormatError
from .bounds import checked_numel

__all__ = ["npy_header"]

_MAX_HEADER = 10_000  # np.load's max_header_size without allow_pickle: a longer header it refuses


def npy_header(fh, limit: int, where: str) -> tuple[np.dtype, bool, tuple[int, ...], int]:  # type: ignore[no-untyped-def]
    """(dtype, fortran_order, shape, header length) of the ``.npy`` stream at ``fh``'s position."""
    start = fh.tell()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # a crafted header's escapes (NumPy parses it)
            shape, fortran, dtype = _read_header(fh)
    except Exception as exc:  # noqa: BLE001 - NumPy parses the header with ast/tokenize: any error is a damaged header
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise FormatError(f"{where}: damaged .npy header ({first})") from None
    hlen = fh.tell() - start
    nbytes = checked_numel(shape, f"{where}: array") * dtype.itemsize
    if dtype.hasobject:
        return dtype, fortran, tuple(shape), hlen
    if hlen + nbytes > limit:
        raise FormatError(f"{where}: array of {nbytes} bytes runs past the end of its data ({limit - hlen} bytes)")
    return dtype, fortran, tuple(shape), hlen


def _read_header(fh) -> tuple[Any, bool, np.dtype]:  # type: ignore[no-untyped-def]
    from numpy.lib import format as npf

    version = npf.read_magic(fh)
    if version == (1, 0):
        return npf.read_array_header_1_0(fh, max_header_size=_MAX_HEADER)
    if version in ((2, 0), (3, 0)):
        return npf.read_array_header_2_0(fh, max_header_size=_MAX_HEADER)
    raise ValueError(f"npy format version {version[0]}.{version[1]} (np.load reads 1.0, 2.0 and 3.0)")
