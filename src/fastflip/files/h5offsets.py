"""Where the elements of an HDF5 dataset lie in the file: the chunk index and element byte offsets.

Layer: ``files``. For a tensor of :func:`fastflip.files.layout.read_layout` with storage ``contiguous`` (element
``i`` at ``offset + i * itemsize``) or ``chunked`` (unfiltered chunks, located through a :class:`ChunkIndex`);
:func:`chunk_address_base` turns the chunk addresses HDF5 reports into file offsets.

Examples
--------
>>> import os, tempfile, numpy as np, h5py
>>> from fastflip.files.layout import read_layout
>>> path = os.path.join(tempfile.mkdtemp(), "doc.h5")
>>> with h5py.File(path, "w") as f:
...     _ = f.create_dataset("c", data=np.arange(64, dtype="<i4").reshape(8, 8), chunks=(4, 4))
>>> t = read_layout(path).tensors[0]
>>> offs = element_byte_offsets(path, t, np.array([9, 63]))
>>> with open(path, "rb") as fh:
...     _ = fh.seek(int(offs[1])); np.frombuffer(fh.read(4), "<i4").tolist()
[63]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.records import Tensor
from ..errors import IndexRangeError, NotHDF5Error, UnsupportedStorageError
from .h5index import chunk_grid, walk_chunks
from .h5open import open_h5

__all__ = ["ChunkIndex", "chunk_index", "chunk_address_base", "file_address_base", "element_byte_offsets"]


_DENSE_MAX = 1 << 24  # chunk-grid cells held as a dense offset table (128 MiB); larger grids use a lookup


@dataclass(frozen=True)
class ChunkIndex:
    """Where the allocated chunks of an unfiltered chunked dataset lie in the file.

    Attributes
    ----------
    shape, chunks : tuple of int
        Dataset shape and chunk shape.
    coords : int64 array, shape (n, ndim)
        Element coordinates of each allocated chunk's first element.
    offsets : int64 array, shape (n,)
        Absolute file byte offset of each allocated chunk.
    itemsize : int
    """

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    coords: np.ndarray
    offsets: np.ndarray
    itemsize: int

    @property
    def grid(self) -> tuple[int, ...]:
        """Number of chunks along each axis (edge chunks included)."""
        return chunk_grid(self.shape, self.chunks)

    @property
    def dense(self) -> np.ndarray:
        """int64 array of shape :attr:`grid`: chunk byte offset, -1 where unallocated."""
        cached = self.__dict__.get("_dense")
        if cached is None:
            cached = np.full(self.grid, -1, dtype=np.int64)
            if len(self.offsets):
                idx = tuple((self.coords // np.asarray(self.chunks, dtype=np.int64)).T)
                cached[idx] = self.offsets
            object.__setattr__(self, "_dense", cached)
        return cached

    def byte_offsets(self, flat_index: np.ndarray) -> np.ndarray:
        """Absolute byte offsets of flat C-order elements (-1 where the chunk is unallocated)."""
        flat = np.asarray(flat_index, dtype=np.int64)
        if flat.size == 0:
            return np.empty(flat.shape, dtype=np.int64)
        coords = np.unravel_index(flat, self.shape)
        ch = [np.int64(c) for c in self.chunks]
        chunk_pos = tuple(c // k for c, k in zip(coords, ch))
        within = np.ravel_multi_index(tuple(c % k for c, k in zip(coords, ch)), self.chunks)
        if math.prod(self.grid) > _DENSE_MAX:  # a huge, sparse chunk grid: look allocated chunks up by coordinates
            have = {tuple(r): int(o) for r, o in zip((self.coords // np.asarray(ch)).tolist(), self.offsets.tolist())}
            base = np.array([have.get(k, -1) for k in zip(*(c.tolist() for c in chunk_pos))], np.int64)
        else:
            base = self.dense[chunk_pos]
        out = base + within.astype(np.int64) * self.itemsize
        out[base < 0] = -1
        return out


def _dataset(file_or_dset: Any, tensor: Tensor) -> tuple[Any, Any]:
    """(dataset, file-to-close-or-None) from a path, an open file/group or a dataset."""
    import h5py

    if isinstance(file_or_dset, h5py.Dataset):
        return file_or_dset, None
    if isinstance(file_or_dset, (h5py.File, h5py.Group)):
        return file_or_dset[tensor.path], None
    f = open_h5(file_or_dset)
    return f[tensor.path], f


def chunk_address_base(dset: Any) -> int:
    """What to add to the chunk addresses HDF5 reports to make them file offsets (every user of
    ``H5Dchunk_iter``, ``H5Dget_chunk_info`` or ``H5Dget_chunk_info_by_coord`` adds it).

    Before HDF5 1.14.4, those calls gave addresses relative to the base address, i.e. without the
    user block (HDFGroup/hdf5 PR 4236); later versions give absolute ones.
    """
    return file_address_base(dset.file.id)


def file_address_base(fid: Any) -> int:
    """:func:`chunk_address_base` of every dataset of the file whose low-level ``FileID`` is ``fid``."""
    import h5py

    if h5py.version.hdf5_version_tuple >= (1, 14, 4):
        return 0
    return int(fid.get_create_plist().get_userblock())


def chunk_index(file_or_dset: Any, tensor: Tensor | None = None) -> ChunkIndex:
    """Build the :class:`ChunkIndex` of an unfiltered chunked dataset (one pass over its chunk index).

    Parameters
    ----------
    file_or_dset : str, h5py.File or h5py.Dataset
        Where the dataset is (``tensor`` names it unless a dataset is given).
    tensor : Tensor, optional
    """
    if tensor is None:
        dset, owned = file_or_dset, None
    else:
        dset, owned = _dataset(file_or_dset, tensor)
    try:
        if dset.chunks is None:
            raise UnsupportedStorageError(f"{dset.name}: not chunked")
        nd = len(dset.shape)
        try:  # in C where built (files/h5index.py), else h5py's chunk_iter
            coords, offsets, _size, _mask = walk_chunks(dset.id)
        except RuntimeError as exc:
            raise NotHDF5Error(f"{dset.file.filename}: damaged HDF5 file (the chunk index of {dset.name}: {exc})") from None
        n = len(offsets)
        coords = coords.reshape(n, nd)
        if n:
            offsets = offsets + chunk_address_base(dset)
        if n and (bool((coords < 0).any()) or bool((coords >= np.asarray(dset.shape, np.int64)).any())
                  or bool((coords % np.asarray(dset.chunks, np.int64)).any()) or bool((offsets < 0).any())):
            raise NotHDF5Error(f"{dset.file.filename}: damaged HDF5 file (the chunk index of {dset.name} names "
                               "a chunk outside the dataset)")
        return ChunkIndex(
            shape=tuple(int(s) for s in dset.shape),
            chunks=tuple(int(c) for c in dset.chunks),
            coords=coords,
            offsets=offsets,
            itemsize=int(dset.dtype.itemsize),
        )
    finally:
        if owned is not None:
            owned.close()


def element_byte_offsets(file_or_dset: Any, tensor: Tensor, flat_index: np.ndarray) -> np.ndarray:
    """Absolute file byte offsets of elements given by flat C-order indices.

    Parameters
    ----------
    file_or_dset : str, h5py.File or h5py.Dataset
        Only needed for chunked storage (to read the chunk index).
    tensor : Tensor
        A tensor with storage ``'contiguous'`` or ``'chunked'``.
    flat_index : array of int
        Flat indices in ``[0, tensor.size)``.

    Returns
    -------
    int64 array
        Byte offsets, ``-1`` for elements whose chunk is not allocated.

    Raises
    ------
    UnsupportedStorageError
        For filtered, compact, external, virtual or unallocated storage.
    IndexRangeError
        (an :class:`IndexError`) For indices outside the tensor.
    """
    flat = np.asarray(flat_index, dtype=np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= tensor.size):
        raise IndexRangeError(f"{tensor.path}: element index out of range [0, {tensor.size})")
    if tensor.storage == "contiguous":
        assert tensor.offset is not None
        return tensor.offset + flat * tensor.itemsize
    if tensor.storage == "chunked":
        return chunk_index(file_or_dset, tensor).byte_offsets(flat)
    raise UnsupportedStorageError(
        f"{tensor.path}: storage {tensor.storage!r} has no fixed byte offsets "
        "(only contiguous and unfiltered chunked data do)"
    )
