"""The CPU backends of the registry: Cython, Numba and NumPy (see :mod:`fastflip.kernels.registry`).

Each wraps one engine's raw kernels behind the :class:`~fastflip.kernels.registry.Backend` interface;
arguments arrive checked by :mod:`fastflip.kernels.dispatch`. The word rule is not written here: the
Cython kernels take it from ``ff_word.h``, the Numba kernels from :func:`fastflip.kernels.numba_cpu.rule`,
the NumPy backend from :func:`fastflip.core.wordrule.rule_words`.

Imports: :mod:`fastflip.core` and :mod:`fastflip.kernels.registry` (the Cython extension and Numba when
a backend loads). Used through :func:`fastflip.kernels.registry.get_backend`.

>>> import numpy as np
>>> be = NumpyBackend()
>>> buf = np.frombuffer(np.array([1.0], ">f4").tobytes(), np.uint8).copy()
>>> hex(int(be.read_words(buf, np.array([0], np.int64), 4, np.little_endian)[0]))
'0x3f800000'
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..core.dtypes import word_type
from ..core.wordrule import rule_words
from .numba_cpu import get_kernels
from .registry import Backend

__all__ = ["CythonBackend", "NumbaBackend", "NumpyBackend"]

def _empty(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)


class CythonBackend(Backend):
    """``fastflip.kernels._cython``, built from ``ext/_kernels.pyx`` (the word rule from ``ff_word.h``)."""

    name = "cython"
    checks_bounds = True  # ext/_kernels.pyx checks every offset against the buffer / extent first
    mod: Any = None

    def load(self) -> None:
        from . import _cython

        self.mod = _cython

    def read_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool) -> np.ndarray:
        out = np.empty(len(offsets), dtype=np.uint64)
        self.mod.read_words(buf, offsets, itemsize, swap, out)
        return out

    def write_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool, words: Any) -> None:
        self.mod.write_words(buf, offsets, itemsize, swap, words)

    def apply_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool,
                    and_mask: Any, or_mask: Any, xor_mask: Any) -> tuple[np.ndarray, np.ndarray]:
        old, new = _empty(len(offsets))
        self.mod.apply_words(buf, offsets, itemsize, swap, and_mask, or_mask, xor_mask, old, new)
        return old, new

    def read_ptrs(self, table: Any, sites: Any) -> np.ndarray:
        out = np.empty(len(sites), dtype=np.uint64)
        self.mod.read_ptrs(table.bases, table.itemsizes, table.swaps, table.extents, sites.tensor, sites.offsets, out)
        return out

    def write_ptrs(self, table: Any, sites: Any, words: np.ndarray) -> None:
        self.mod.write_ptrs(table.bases, table.itemsizes, table.swaps, table.extents, sites.tensor, sites.offsets,
                            words)

    def apply_ptrs(self, table: Any, sites: Any) -> tuple[np.ndarray, np.ndarray]:
        old, new = _empty(len(sites))
        self.mod.apply_ptrs(table.bases, table.itemsizes, table.swaps, table.extents, sites.tensor, sites.offsets,
                            sites.and_mask, sites.or_mask, sites.xor_mask, old, new)
        return old, new


class NumbaBackend(Backend):
    """The Numba CPU kernels of :mod:`fastflip.kernels.numba_cpu`."""

    name = "numba"
    k: Any = None

    def load(self) -> None:
        self.k = get_kernels()

    def read_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool) -> np.ndarray:
        out = np.empty(len(offsets), dtype=np.uint64)
        self.k["read_words"](buf, offsets, itemsize, swap, out)
        return out

    def write_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool, words: Any) -> None:
        self.k["write_words"](buf, offsets, itemsize, swap, words)

    def apply_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool,
                    and_mask: Any, or_mask: Any, xor_mask: Any) -> tuple[np.ndarray, np.ndarray]:
        old, new = _empty(len(offsets))
        self.k["apply_words"](buf, offsets, itemsize, swap, and_mask, or_mask, xor_mask, old, new)
        return old, new

    def read_ptrs(self, table: Any, sites: Any) -> np.ndarray:
        out = np.empty(len(sites), dtype=np.uint64)
        self.k["read_ptrs"](table.bases, table.itemsizes, table.swaps, sites.tensor, sites.offsets, out)
        return out

    def write_ptrs(self, table: Any, sites: Any, words: np.ndarray) -> None:
        self.k["write_ptrs"](table.bases, table.itemsizes, table.swaps, sites.tensor, sites.offsets, words)

    def apply_ptrs(self, table: Any, sites: Any) -> tuple[np.ndarray, np.ndarray]:
        old, new = _empty(len(sites))
        self.k["apply_ptrs"](table.bases, table.itemsizes, table.swaps, sites.tensor, sites.offsets, sites.and_mask,
                             sites.or_mask, sites.xor_mask, old, new)
        return old, new


def _byte_index(offsets: np.ndarray, itemsize: int, swap: bool) -> np.ndarray:
    """(n, itemsize) byte positions, ordered so that the bytes read form native-order words."""
    cols = np.arange(itemsize, dtype=np.int64)
    if swap:
        cols = cols[::-1]
    return offsets[:, None] + cols[None, :]


def _ptr_groups(tensor: np.ndarray) -> list[tuple[int, np.ndarray]]:
    order = np.argsort(tensor, kind="stable")
    ids, starts = np.unique(tensor[order], return_index=True)
    ends = list(starts[1:]) + [len(order)]
    return [(int(t), order[s:e]) for t, s, e in zip(ids, starts, ends)]


def _view(table: Any, t: int) -> np.ndarray:
    """The bytes of tensor ``t`` of a pointer table, as a ``uint8`` array (bounded by its extent)."""
    size = int(table.extents[t])
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(int(table.bases[t])))


class NumpyBackend(Backend):
    """Vectorised NumPy: gathers and scatters bytes, the rule from :func:`fastflip.core.wordrule.rule_words`."""

    name = "numpy"

    def read_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool) -> np.ndarray:
        raw = np.ascontiguousarray(buf[_byte_index(offsets, itemsize, swap)])
        return raw.view(word_type(f"u{itemsize}").uint).reshape(-1).astype(np.uint64)

    def write_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool, words: Any) -> None:
        native = np.ascontiguousarray(np.asarray(words).astype(word_type(f"u{itemsize}").uint))
        buf[_byte_index(offsets, itemsize, swap)] = native.view(np.uint8).reshape(-1, itemsize)

    def apply_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool,
                    and_mask: Any, or_mask: Any, xor_mask: Any) -> tuple[np.ndarray, np.ndarray]:
        old = self.read_words(buf, offsets, itemsize, swap)
        new = rule_words(old, and_mask, or_mask, xor_mask, 8 * itemsize)
        self.write_words(buf, offsets, itemsize, swap, new)
        return old, new

    def read_ptrs(self, table: Any, sites: Any) -> np.ndarray:
        out = np.empty(len(sites), dtype=np.uint64)
        for t, pos in _ptr_groups(sites.tensor):
            out[pos] = self.read_words(_view(table, t), sites.offsets[pos], int(table.itemsizes[t]),
                                       bool(table.swaps[t]))
        return out

    def write_ptrs(self, table: Any, sites: Any, words: np.ndarray) -> None:
        for t, pos in _ptr_groups(sites.tensor):
            self.write_words(_view(table, t), sites.offsets[pos], int(table.itemsizes[t]), bool(table.swaps[t]),
                             words[pos])

    def apply_ptrs(self, table: Any, sites: Any) -> tuple[np.ndarray, np.ndarray]:
        old = self.read_ptrs(table, sites)
        new = rule_words(old, sites.and_mask, sites.or_mask, sites.xor_mask,
                         8 * table.itemsizes[sites.tensor].astype(np.uint64))
        self.write_ptrs(table, sites, new)
        return old, new
