"""Refuse HDF5 files whose datasets (or chunks) share stored bytes.

Layer: ``files``. :func:`fastflip.files.layout.read_layout` calls :func:`refuse_shared_bytes` on every HDF5 file it
walks: a flip in bytes two datasets share would change both (h5py reads each from the same bytes), and the log,
which names one, could not describe it. Contiguous data and allocated chunks are checked, up to
:data:`MAX_CHUNKS_CHECKED` chunks in all.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.records import Tensor
from ..errors import NotHDF5Error
from .h5index import native_available, walk_chunks
from .h5offsets import chunk_address_base

__all__ = ["MAX_CHUNKS_CHECKED", "refuse_shared_bytes"]

MAX_CHUNKS_CHECKED = 1_000_000  # chunks whose byte ranges are checked for overlaps when a file is read


def _stored_spans(f: Any, tensors: list[Tensor]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(start, end, owner) arrays of every contiguous dataset's data and every allocated chunk, and the owners'
    paths (up to :data:`MAX_CHUNKS_CHECKED` chunks in all: a file with more is checked for its first datasets
    only). Chunk indexes are walked by :func:`fastflip.files.h5index.walk_chunks` (in C where built)."""
    paths: list[str] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    owners: list[np.ndarray] = []

    def add(path: str, start: np.ndarray, size: np.ndarray) -> None:
        starts.append(start.astype(np.int64))
        ends.append(start.astype(np.int64) + size.astype(np.int64))
        owners.append(np.full(len(start), len(paths), np.int64))
        paths.append(path)

    for t in tensors:
        if t.storage == "contiguous" and t.offset is not None:
            add(t.path, np.array([t.offset]), np.array([t.nbytes]))
    budget = MAX_CHUNKS_CHECKED
    for t in tensors:
        if t.storage not in ("chunked", "filtered"):
            continue
        ds = f[t.path]
        # the chunk grid bounds the count: only a dataset that could exceed the budget has its index counted
        # (H5Dget_num_chunks walks the whole index, as the walk below does again)
        most = _grid_chunks(t.shape, t.chunks)
        n = most if most <= budget else ds.id.get_num_chunks()
        if n > budget or not (native_available()[1] or hasattr(ds.id, "chunk_iter")):
            break
        _coords, addr, size, _mask = walk_chunks(ds.id)
        budget -= len(addr)
        add(t.path, addr + chunk_address_base(ds), size)
    if not paths:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), paths
    return np.concatenate(starts), np.concatenate(ends), np.concatenate(owners), paths


def _grid_chunks(shape: tuple[int, ...], chunks: tuple[int, ...] | None) -> int:
    """How many chunks a dataset of ``shape`` in ``chunks`` can hold (its allocated chunks are at most this).

    >>> _grid_chunks((100, 64), (16, 64)), _grid_chunks((0, 8), (4, 8))
    (7, 0)
    """
    n = 1
    for extent, c in zip(shape, chunks or shape):
        n *= -(-int(extent) // max(1, int(c)))
    return n


def refuse_shared_bytes(path: str, f: Any, tensors: list[Tensor]) -> None:
    """Refuse datasets (or chunks) whose stored bytes overlap: a flip in one would change the other (h5py reads
    both from the same bytes) and the log, which names one, could not describe it."""
    try:
        start, end, owner, paths = _stored_spans(f, tensors)
    except (OSError, RuntimeError, KeyError, ValueError, TypeError, OverflowError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise NotHDF5Error(f"{path}: damaged HDF5 file ({first})") from None
    order = np.lexsort((end, start))  # sorted by start: disjoint iff each span ends before the next begins
    start, end, owner = start[order], end[order], owner[order]
    bad = np.flatnonzero(start[1:] < end[:-1])
    if len(bad):
        i = int(bad[0])
        n0, n1 = paths[int(owner[i])], paths[int(owner[i + 1])]
        what = f"datasets {n0} and {n1}" if n0 != n1 else f"two chunks of dataset {n0}"
        raise NotHDF5Error(f"{path}: {what} share bytes {int(start[i + 1])}..{int(min(end[i], end[i + 1]))} of the "
                           "file (damaged or crafted HDF5 file); nothing was written")
