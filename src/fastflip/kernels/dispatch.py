"""Validated entry points to the word kernels, and the choice of backend.

The kernels (the backends of :mod:`fastflip.kernels.registry`: Cython, Numba, NumPy, and the GPU
engines) trust their arguments; the functions of this module check every argument once (vectorized),
take the backend from the registry and make one kernel call. Offsets are checked against the buffer
or the tensors' extents once per call: here, or, for a backend whose kernels refuse such offsets
before touching a word (``checks_bounds``: the Cython kernels), by those kernels, a refusal then named
here as the same :class:`~fastflip.errors.OptionError`.

Two families:

- ``*_at_offsets``: one writable ``uint8`` buffer (a file mapped with ``np.memmap``,
  or any array's bytes), one word width and byte order, byte offsets into it.
- ``*_ptrs``: several tensors by base address (``arr.ctypes.data``,
  ``tensor.data_ptr()``), per-tensor word width and byte order; site ``i`` is at
  ``bases[tensor[i]] + offsets[i]``. The caller owns the addresses' validity (the
  :mod:`fastflip.live` targets check that each tensor still has the storage they were built on);
  the sites are checked against the table's extents here, and a 1-10 flip trial over many
  tensors costs one native call.

Value-level (scale) sites are computed here, vectorized, for every CPU backend:
read the old words, compute :func:`fastflip.core.wordrule.scale_words`, write the new ones.

Backends: any name of :func:`fastflip.kernels.registry.registered_backends` (``'cython'``,
``'numba'``, ``'numpy'``, ...); ``'auto'`` takes the first CPU backend that loads, in that order.

Imports: :mod:`fastflip.core`, :mod:`fastflip.errors` and :mod:`fastflip.kernels.registry`. Used by the
file layer (:mod:`fastflip.files.h5apply`) and :mod:`fastflip.live`.

Examples
--------
>>> import numpy as np
>>> buf = np.frombuffer(np.array([1.0, 2.0], dtype=">f4").tobytes(), dtype=np.uint8).copy()
>>> old, new = apply_at_offsets(buf, np.array([4]), 4, swap=np.little_endian,
...                             and_mask=[~0 & (2**64 - 1)], or_mask=[0], xor_mask=[1 << 31])
>>> buf.view(">f4").tolist(), hex(int(old[0])), hex(int(new[0]))
([1.0, -2.0], '0x40000000', '0xc0000000')
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from ..core.dtypes import WordType, word_type
from ..core.records import SiteArrays, TensorTable
from ..errors import OptionError, ReadOnlyTargetError
from ..core.wordrule import rule_words, scale_words
from .registry import AUTO_ORDER, Backend, get_backend, resolve_backend

__all__ = [
    "BACKENDS",
    "PtrTable",
    "get_backend",
    "resolve_backend",
    "apply_at_offsets",
    "read_at_offsets",
    "write_at_offsets",
    "apply_ptrs",
    "read_ptrs",
    "write_ptrs",
]

BACKENDS = AUTO_ORDER  # the CPU backends, in the order 'auto' tries them
_U64 = np.dtype(np.uint64)
_T = TypeVar("_T")


# --------------------------------------------------------------------------- validation


def _column(values: Any, dtype: np.dtype | type, n: int | None, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == object or (arr.size and arr.dtype.kind not in "iub"):
        raise OptionError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and dtype == _U64:
        arr = arr.astype(np.int64).view(np.uint64)  # ~0 and other negatives: two's complement
    arr = np.ascontiguousarray(arr.reshape(-1), dtype=dtype)
    if n is not None and len(arr) != n:
        raise OptionError(f"{name} has {len(arr)} entries, expected {n}")
    return arr


def _check_buffer(buf: np.ndarray, write: bool) -> None:
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
        raise OptionError("buf must be a 1-D numpy uint8 array (np.memmap or a byte view)")
    if not buf.flags.c_contiguous:
        raise OptionError("buf must be C-contiguous")
    if write and not buf.flags.writeable:
        raise ReadOnlyTargetError("buf is read-only: open the memmap with mode 'r+' or pass a writable array")


def _check_offsets(offsets: Any, itemsize: int) -> np.ndarray:
    if itemsize not in (1, 2, 4, 8):
        raise OptionError(f"itemsize must be 1, 2, 4 or 8, got {itemsize}")
    return _column(offsets, np.int64, None, "offsets")


def _check_span(buf: np.ndarray, offs: np.ndarray, itemsize: int) -> None:
    """Refuse offsets whose words do not lie inside ``buf``."""
    if len(offs):
        lo, hi = int(offs.min()), int(offs.max())
        if lo < 0 or hi + itemsize > len(buf):
            raise OptionError(f"byte offsets span [{lo}, {hi + itemsize}) outside the buffer of {len(buf)} bytes")


def _bounded(be: Backend, refuse: Callable[[], None], call: Callable[..., _T], *args: Any) -> _T:
    """``call(*args)``, a kernel of ``be``, with the offsets' bounds checked once: by ``refuse()`` (raises the
    OptionError that names the offending site) before the call, or, when the backend's kernels check them
    (``be.checks_bounds``), by the kernels, ``refuse()`` then naming what they refused."""
    if not be.checks_bounds:
        refuse()
        return call(*args)
    try:
        return call(*args)
    except ValueError:
        refuse()
        raise


def _masks(and_mask: Any, or_mask: Any, xor_mask: Any, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        _column(and_mask, _U64, n, "and_mask"),
        _column(or_mask, _U64, n, "or_mask"),
        _column(xor_mask, _U64, n, "xor_mask"),
    )


def _scale_positions(scale: Any, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    if scale is None:
        return None, None
    factors = np.ascontiguousarray(np.asarray(scale, dtype=np.float64).reshape(-1))
    if len(factors) != n:
        raise OptionError(f"scale has {len(factors)} entries, expected {n}")
    where = np.flatnonzero(~np.isnan(factors))
    return (where, factors) if len(where) else (None, None)


# --------------------------------------------------------------------------- one buffer


def apply_at_offsets(
    buf: np.ndarray,
    offsets: Any,
    itemsize: int,
    swap: bool,
    and_mask: Any,
    or_mask: Any,
    xor_mask: Any,
    backend: str = "auto",
    *,
    scale: Any = None,
    dtype: np.dtype | str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Apply the plan word rule to the words at ``offsets`` of ``buf``, in place.

    Parameters
    ----------
    buf : numpy.ndarray
        1-D, C-contiguous, writable ``uint8`` array (``np.memmap`` included).
    offsets : array of int
        Byte offset of each word (unaligned is fine). Offsets must be unique.
    itemsize : {1, 2, 4, 8}
        Word width in bytes.
    swap : bool
        True when the stored byte order differs from this machine's.
    and_mask, or_mask, xor_mask : array of uint64
        Per-site masks; ``new = ((old & and) | or) ^ xor``.
    backend : {'auto', 'cython', 'numba', 'numpy'}
    scale : array of float, optional
        Where not NaN, the site is value-level: ``new = word(value(old) * scale)``
        (needs ``dtype``).
    dtype : numpy dtype, optional
        The stored dtype (only needed for scale sites).

    Returns
    -------
    (old_words, new_words) : uint64 arrays in site order (native order).

    Raises
    ------
    OptionError
        Bad arguments or offsets outside the buffer (nothing is changed).
    ReadOnlyTargetError
        ``buf`` is not writable.
    """
    be = get_backend(backend)
    _check_buffer(buf, write=True)
    offs = _check_offsets(offsets, itemsize)
    masks = _masks(and_mask, or_mask, xor_mask, len(offs))
    where, factors = _scale_positions(scale, len(offs))
    refuse = lambda: _check_span(buf, offs, itemsize)  # noqa: E731
    if where is None:
        return _bounded(be, refuse, be.apply_words, buf, offs, itemsize, bool(swap), *masks)
    if dtype is None or word_type(dtype).itemsize != itemsize:
        raise OptionError("scale sites need the stored dtype (dtype=) with the given itemsize")
    old = _bounded(be, refuse, be.read_words, buf, offs, itemsize, bool(swap))
    new = rule_words(old, *masks, 8 * itemsize)
    new[where] = scale_words(old[where], factors[where], dtype)
    be.write_words(buf, offs, itemsize, bool(swap), new)
    return old, new


def read_at_offsets(buf: np.ndarray, offsets: Any, itemsize: int, swap: bool, backend: str = "auto") -> np.ndarray:
    """Words (native order, uint64) stored at ``offsets`` of ``buf``; see :func:`apply_at_offsets`.

    >>> read_at_offsets(np.array([1, 2, 3], dtype=np.uint8), [0, 1], 2, swap=False).tolist() == (
    ...     [0x0201, 0x0302] if np.little_endian else [0x0102, 0x0203])
    True
    """
    be = get_backend(backend)
    _check_buffer(buf, write=False)
    offs = _check_offsets(offsets, itemsize)
    return _bounded(be, lambda: _check_span(buf, offs, itemsize), be.read_words, buf, offs, itemsize, bool(swap))


def write_at_offsets(buf: np.ndarray, offsets: Any, itemsize: int, swap: bool, words: Any, backend: str = "auto") -> None:
    """Store ``words`` (native order) at ``offsets`` of ``buf``; see :func:`apply_at_offsets`."""
    be = get_backend(backend)
    _check_buffer(buf, write=True)
    offs = _check_offsets(offsets, itemsize)
    _bounded(be, lambda: _check_span(buf, offs, itemsize), be.write_words, buf, offs, itemsize, bool(swap),
             _column(words, _U64, len(offs), "words"))


# --------------------------------------------------------------------------- several tensors by address


class PtrTable(TensorTable):
    """Per-tensor base addresses, word widths and byte orders for the ``*_ptrs`` kernels.

    The :class:`fastflip.core.records.TensorTable` of live host tensors, its columns checked and held as
    the contiguous arrays the kernels take (``bases`` uint64, ``itemsizes`` int32, ``swaps`` uint8,
    ``extents`` int64).

    Built once per set of tensors (by :mod:`fastflip.live`); ``extents`` (bytes from each base address to
    the end of its last word) bound every site the ``*_ptrs`` functions accept (0: no host site at all).

    >>> a = np.zeros(3, dtype=">i2")
    >>> t = PtrTable([a.ctypes.data], [2], [np.little_endian], [a.nbytes], ["i2"])
    >>> len(t)
    1
    """

    def __init__(self, bases: Sequence[int], itemsizes: Sequence[int], swaps: Sequence[bool],
                 extents: Sequence[int], dtypes: Sequence[np.dtype | str]) -> None:
        super().__init__(
            itemsizes=np.ascontiguousarray(itemsizes, dtype=np.int32),
            swaps=np.ascontiguousarray(swaps, dtype=np.uint8),
            # a WordType (bfloat16 / float8 held in unsigned words) is kept: scale sites need its format
            dtypes=[d if isinstance(d, WordType) else np.dtype(d) for d in dtypes],
            bases=np.ascontiguousarray(bases, dtype=np.uint64), extents=np.ascontiguousarray(extents, dtype=np.int64))
        n = len(self.bases)
        if not (len(self.itemsizes) == len(self.swaps) == len(self.extents) == len(self.dtypes) == n):
            raise OptionError("pointer table columns must all have the same length")
        if n and not np.isin(self.itemsizes, [1, 2, 4, 8]).all():
            raise OptionError("itemsizes must be 1, 2, 4 or 8")



def _ptr_sites(table: PtrTable, tensor: Any, offsets: Any, masks: tuple[Any, Any, Any] | None = None) -> SiteArrays:
    """The sites as the record the backends take: integer columns of one length, masks (when given; reads and
    writes need none) one per site. Their tensor ids and extents are checked by :func:`_check_extents`."""
    tid = _column(tensor, np.int32, None, "tensor")
    offs = _column(offsets, np.int64, len(tid), "offsets")
    a, o, x = _masks(*masks, len(offs)) if masks is not None else (None, None, None)
    return SiteArrays(tensor=tid, offsets=offs, and_mask=a, or_mask=o, xor_mask=x)


def _check_extents(table: PtrTable, sites: SiteArrays) -> None:
    """Refuse sites whose tensor id is not in the table or whose word does not lie inside its tensor's extent."""
    tid, offs = sites.tensor, sites.offsets
    if len(tid):
        if int(tid.min()) < 0 or int(tid.max()) >= len(table):
            raise OptionError(f"tensor ids must lie in [0, {len(table)})")
        outside = (offs < 0) | (offs > table.extents[tid] - table.itemsizes[tid])
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            t = int(tid[i])
            raise OptionError(f"site {i}: byte offset {int(offs[i])} of tensor {t} lies outside its "
                              f"{int(table.extents[t])} bytes (words of {int(table.itemsizes[t])}); "
                              "nothing was changed")


def apply_ptrs(
    table: PtrTable,
    tensor: Any,
    offsets: Any,
    and_mask: Any,
    or_mask: Any,
    xor_mask: Any,
    backend: str = "auto",
    *,
    scale: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Apply the word rule at ``table.bases[tensor[i]] + offsets[i]`` for every site, in one native call.

    The addresses must lie inside live writable tensors (the caller checks plans
    against shapes); sites must be unique. Scale sites (``scale`` not NaN) use the
    tensor's dtype from ``table.dtypes``. The checked columns reach the backend as one
    :class:`fastflip.core.records.SiteArrays`.

    Returns
    -------
    (old_words, new_words) : uint64 arrays in site order.

    >>> a = np.array([1.0, 2.0], dtype=np.float32)
    >>> t = PtrTable([a.ctypes.data], [4], [False], [a.nbytes], [a.dtype])
    >>> _ = apply_ptrs(t, [0], [4], [~0], [0], [0], scale=[-0.5])
    >>> a.tolist()
    [1.0, -1.0]
    """
    be = get_backend(backend)
    sites = _ptr_sites(table, tensor, offsets, (and_mask, or_mask, xor_mask))
    where, factors = _scale_positions(scale, len(sites))
    refuse = lambda: _check_extents(table, sites)  # noqa: E731
    if where is None:
        return _bounded(be, refuse, be.apply_ptrs, table, sites)
    tid = sites.tensor
    old = _bounded(be, refuse, be.read_ptrs, table, sites)
    new = rule_words(old, sites.and_mask, sites.or_mask, sites.xor_mask, 8 * table.itemsizes[tid].astype(np.uint64))
    for t in np.unique(tid[where]):
        pos = where[tid[where] == t]
        new[pos] = scale_words(old[pos], factors[pos], table.dtypes[int(t)])
    be.write_ptrs(table, sites, new)
    return old, new


def read_ptrs(table: PtrTable, tensor: Any, offsets: Any, backend: str = "auto") -> np.ndarray:
    """Words (native order) of every site; see :func:`apply_ptrs`."""
    be, sites = get_backend(backend), _ptr_sites(table, tensor, offsets)
    return _bounded(be, lambda: _check_extents(table, sites), be.read_ptrs, table, sites)


def write_ptrs(table: PtrTable, tensor: Any, offsets: Any, words: Any, backend: str = "auto") -> None:
    """Store ``words`` (native order) at every site; see :func:`apply_ptrs`."""
    be, sites = get_backend(backend), _ptr_sites(table, tensor, offsets)
    _bounded(be, lambda: _check_extents(table, sites), be.write_ptrs, table, sites,
             _column(words, _U64, len(sites), "words"))
