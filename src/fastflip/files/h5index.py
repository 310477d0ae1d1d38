"""HDF5 chunk index: the touched chunks looked up, or the whole index walked, in C when built.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

The native module :mod:`fastflip.kernels._h5chunks` (ext/_h5chunks.pyx) calls the HDF5 library that
h5py loaded — its function addresses are resolved here with ctypes through h5py's own extension
module, so the two always agree — under h5py's global lock, with no Python call per chunk:

* :func:`lookup_chunks` — ``H5Dget_chunk_info_by_coord`` for a batch of chunk corners (only the
  chunks a plan touches: a few B-tree or array lookups, whatever the number of chunks);
* :func:`walk_chunks` — ``H5Dchunk_iter`` over the whole index into NumPy arrays;
* :func:`object_info` — an object's address and type without the metadata sizes that h5py's
  ``h5o.get_info`` asks for (for a chunked dataset those make HDF5 walk its whole chunk index).

Without the native module (no compiler), or with an HDF5 that lacks a function (``H5Dchunk_iter``
before 1.14; ``H5Oget_info_by_name3`` before 1.12), the same results come from h5py, one call per
chunk; ``FASTFLIP_H5_NATIVE=0`` forces that path (the tests compare both).

Addresses are HDF5's, as h5py's ``get_chunk_info`` gives them: before HDF5 1.14.4 they exclude the
user block (see :func:`fastflip.files.h5offsets.chunk_address_base`); callers add the base.

Examples
--------
>>> import os, tempfile, h5py, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "c.h5")
>>> with h5py.File(p, "w") as f:
...     _ = f.create_dataset("w", data=np.arange(100, dtype="f4"), chunks=(10,))
>>> with h5py.File(p, "r") as f:
...     addr, size, mask = lookup_chunks(f["w"].id, np.array([[0], [90]]))
...     bool((addr > 0).all()), size.tolist(), mask.tolist()
(True, [40, 40], [0, 0])
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import NotHDF5Error

__all__ = ["native_available", "lookup_chunks", "walk_chunks", "object_info", "element_offsets",
           "tensor_element_offsets", "chunk_grid", "touched_chunks", "IndexLocation"]

try:
    from ..kernels import _h5chunks  # ext/_h5chunks.pyx; without it, h5py per chunk
except ImportError:  # pragma: no cover - a build without a C compiler
    _h5chunks = None

_BOUND: tuple[bool, bool, bool] | None = None
_ABSOLUTE = False  # set by _bind: HDF5 >= 1.14.4 reports chunk addresses with the user block


def _bind() -> tuple[bool, bool, bool]:
    """Resolve the HDF5 functions from the library h5py loaded (once): (lookup, walk, object_info) usable."""
    global _BOUND
    if _BOUND is None:
        _BOUND = (False, False, False)
        if _h5chunks is not None:
            import ctypes

            import h5py
            from h5py import h5d

            global _ABSOLUTE
            v = h5py.version.hdf5_version_tuple
            _ABSOLUTE = v >= (1, 14, 4)
            try:  # dlsym through h5py's extension module searches the libhdf5 it was linked with
                lib = ctypes.CDLL(h5d.__file__)
            except OSError:  # pragma: no cover - a platform where an extension cannot be reopened
                return _BOUND

            def addr(name: str, since: tuple[int, ...]) -> int:
                if v < since:
                    return 0
                try:
                    return int(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0)
                except AttributeError:  # pragma: no cover - a library built without it
                    return 0

            # H5Dchunk_iter's callback takes (unsigned mask, haddr_t, hsize_t size) from 1.10.10, 1.12.3 and 1.14
            # (as h5py declares it); the 1.13 development releases had another one
            iter_ok = (1, 10, 10) <= v < (1, 11) or (1, 12, 3) <= v < (1, 13) or v >= (1, 14)
            _h5chunks.bind(addr("H5Dget_chunk_info_by_coord", (1, 10, 5)),
                           addr("H5Dchunk_iter", (1, 10, 10)) if iter_ok else 0,
                           addr("H5Oget_info_by_name3", (1, 12, 0)), addr("H5VLnative_token_to_addr", (1, 12, 0)))
            _BOUND = tuple(bool(b) for b in _h5chunks.bound())  # type: ignore[assignment]
    return _BOUND


def native_available() -> tuple[bool, bool, bool]:
    """Whether (lookup, walk, object_info) run in C here (False for each with ``FASTFLIP_H5_NATIVE=0``)."""
    if os.environ.get("FASTFLIP_H5_NATIVE", "1") == "0":
        return (False, False, False)
    return _bind()


_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _superblock(fd: int) -> tuple[int, int, int]:
    """(sizeof offsets, sizeof lengths, base address) from the superblock (at 0, 512, 1024, ... bytes)."""
    end, at = os.fstat(fd).st_size, 0
    while at + 48 <= end:
        head = os.pread(fd, 48, at)
        if head[:8] == _SIGNATURE:
            ver = head[8]
            sa, sl, pos = (head[13], head[14], 24 + (4 if ver == 1 else 0)) if ver < 2 else (head[9], head[10], 12)
            if sa not in (2, 4, 8) or sl not in (2, 4, 8):
                break
            return sa, sl, int.from_bytes(head[pos:pos + sa], "little")
        at = 512 if at == 0 else at * 2
    raise ValueError("no HDF5 superblock")


def _messages(fd: int, at: int, sa: int, sl: int, base: int) -> Any:
    """(type, data) of every message of the object header at file offset ``at`` (continuations followed;
    their addresses are relative to ``base``)."""
    blocks: list[tuple[int, int, int]] = []  # (file offset, length, header version)
    head = os.pread(fd, 32, at)
    if head[:4] == b"OHDR":
        flags = head[5]
        pos = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        w = 1 << (flags & 3)
        blocks.append((at + pos + w, int.from_bytes(head[pos:pos + w], "little"), 2))
    elif head[0] == 1:
        flags = 0
        blocks.append((at + 16, int.from_bytes(head[8:12], "little"), 1))
    else:
        raise ValueError("unknown object header version")
    seen = 0
    while blocks:
        start, length, ver = blocks.pop(0)
        seen += 1
        if seen > 1000 or length > 1 << 24:
            raise ValueError("object header too long")
        buf = os.pread(fd, length, start)
        i = 0
        stop = length - (4 if ver == 2 else 0)  # version 2 blocks end with a checksum
        while i + (4 if ver == 2 else 8) <= stop:
            if ver == 1:
                mtype, size = int.from_bytes(buf[i:i + 2], "little"), int.from_bytes(buf[i + 2:i + 4], "little")
                i += 8
            else:
                mtype, size = buf[i], int.from_bytes(buf[i + 1:i + 3], "little")
                i += 4 + (2 if flags & 0x04 else 0)
            data = buf[i:i + size]
            i += size
            if mtype == 0x10:  # continuation: (address, length)
                addr, ln = int.from_bytes(data[:sa], "little"), int.from_bytes(data[sa:sa + sl], "little")
                blocks.append((base + addr + (4 if ver == 2 else 0), ln - (4 if ver == 2 else 0), ver))
            else:
                yield mtype, data


def _index(fd: int, obj_addr: int) -> tuple[Any, ...]:
    """(index type, index address, chunk dims, sizeof offsets, sizeof lengths, base, extra) of a chunked dataset."""
    sa, sl, base = _superblock(fd)
    for mtype, d in _messages(fd, base + obj_addr, sa, sl, base):
        if mtype != 8:
            continue
        if d[0] == 3 and d[1] == 2:
            ndim = d[2]
            addr = int.from_bytes(d[3:3 + sa], "little")
            dims = [int.from_bytes(d[3 + sa + 4 * k:7 + sa + 4 * k], "little") for k in range(ndim)]
            return "btree1", addr, dims[:-1], sa, sl, base, None
        if d[0] == 4 and d[1] == 2:
            flags, ndim, enc = d[2], d[3], d[4]
            dims = [int.from_bytes(d[5 + enc * k:5 + enc * (k + 1)], "little") for k in range(ndim)]
            p = 5 + enc * ndim
            kind = d[p]
            extra_len = {1: (sl + 4 if flags & 2 else 0), 2: 0, 3: 1, 4: 5, 5: 6}.get(kind)
            if extra_len is None:
                break
            extra = d[p + 1:p + 1 + extra_len]
            addr = int.from_bytes(d[p + 1 + extra_len:p + 1 + extra_len + sa], "little")
            name = {1: "single", 2: "implicit", 3: "farray", 4: "earray", 5: "btree2"}[kind]
            return name, addr, dims[:-1], sa, sl, base, (flags, extra)
        break
    raise ValueError("no chunked layout message")


@dataclass(frozen=True)
class IndexLocation:
    """Where a chunked dataset's index lies, as the native reader needs it (file metadata, like an offset)."""

    kind: str  # btree1, farray, single
    addr: int  # index (or single chunk) address, relative to base; all ones: no chunk written
    sa: int  # sizeof offsets
    sl: int  # sizeof lengths
    base: int  # the base address (user block)
    chunk: tuple[int, ...]
    grid: tuple[int, ...]  # chunks along each axis of the maximum shape (fixed array element order)
    filtered: bool
    nbytes: int  # an unfiltered chunk's size
    extra: Any = None


def _locate(dsid: Any) -> IndexLocation | None:
    """The dataset's :class:`IndexLocation` from its object header, or None where the native reader does not apply
    (a file open for writing, another driver or index kind, anything unexpected)."""
    import h5py
    from h5py import h5f, h5fd

    fid = h5py.h5i.get_file_id(dsid)
    if fid.get_intent() != h5f.ACC_RDONLY or fid.get_access_plist().get_driver() != h5fd.SEC2:
        return None
    obj_addr, _ = object_info(dsid, b".")
    try:  # the sec2 driver's own descriptor: the very file HDF5 reads (pread only)
        kind, addr, chunk, sa, sl, base, extra = _index(int(fid.get_vfd_handle()), obj_addr)
    except (ValueError, OSError, IndexError):
        return None
    dcpl = dsid.get_create_plist()
    if kind not in ("btree1", "farray", "single") or list(chunk) != list(dcpl.get_chunk()):
        return None
    maxshape = dsid.get_space().get_simple_extent_dims(True)
    return IndexLocation(kind, addr, sa, sl, base, tuple(int(c) for c in chunk),
                         chunk_grid(maxshape, chunk), dcpl.get_nfilters() > 0,
                         int(np.prod(chunk)) * dsid.get_type().get_size(), extra)


def _read_index(fd: int, loc: IndexLocation, corners: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(address relative to the base, size, filter mask) per corner, read from the file (ValueError: malformed)."""
    n = len(corners)
    if loc.addr == (1 << (8 * loc.sa)) - 1:
        return np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.uint32)
    if loc.kind == "btree1":  # (its keys hold each chunk's size and filter mask)
        return _h5chunks.btree1_lookup(fd, loc.base, loc.addr, loc.sa, corners, 65535)
    if loc.kind == "farray":
        linear = np.ravel_multi_index(tuple((corners // np.asarray(loc.chunk, np.int64)).T), loc.grid)
        return _h5chunks.farray_lookup(fd, loc.base, loc.addr, loc.sa, loc.sl, linear.astype(np.int64),
                                       loc.filtered, loc.nbytes)
    flags, ex = loc.extra  # single chunk: in the layout message
    size = int.from_bytes(ex[:loc.sl], "little") if flags & 2 else loc.nbytes
    fm = int.from_bytes(ex[loc.sl:loc.sl + 4], "little") if flags & 2 else 0
    zero = (corners == 0).all(axis=1)
    return (np.where(zero, loc.addr, -1).astype(np.int64), np.where(zero, size, 0).astype(np.int64),
            np.where(zero, fm, 0).astype(np.uint32))


def _native_lookup(dsid: Any, corners: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The chunk index read from the file by ext/_h5chunks.pyx (v1 B-tree, fixed array, single chunk), or None
    where it does not apply; addresses as this HDF5 reports them."""
    import h5py

    loc = _locate(dsid)
    if loc is None:
        return None
    try:
        out = _read_index(int(h5py.h5i.get_file_id(dsid).get_vfd_handle()), loc, corners)
    except (ValueError, OSError, IndexError):
        return None
    return _absolute(out, loc.base)


def _absolute(out: tuple[np.ndarray, np.ndarray, np.ndarray], base: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The addresses as this HDF5 reports them: from 1.14.4 with the base address (the user block) added."""
    if _ABSOLUTE and base:
        return np.where(out[0] >= 0, out[0] + base, -1), out[1], out[2]
    return out


def lookup_chunks(dsid: Any, corners: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(address, stored size, filter mask) of the chunks whose corners (int64, (n, rank)) are given.

    Address -1 (size 0) for a chunk never written. Corners must be multiples of the chunk shape inside
    the dataset; HDF5 refuses others (RuntimeError). Natively, the index is read from the file where its
    kind allows (a few reads a chunk); else HDF5's ``H5Dget_chunk_info_by_coord`` runs in a C loop (it
    visits the index up to the chunk: slow for a chunk far into a large index).
    """
    from h5py._objects import phil

    corners = np.ascontiguousarray(corners, np.int64).reshape(len(corners), -1)
    try:
        if native_available()[0]:
            with phil:
                out = _native_lookup(dsid, corners) if native_available()[2] else None
                return out if out is not None else _h5chunks.lookup(dsid.id, corners)
        n = len(corners)
        addr, size, mask = np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.uint32)
        for i, c in enumerate(corners.tolist()):
            info = dsid.get_chunk_info_by_coord(tuple(c))
            if info.byte_offset is not None:
                addr[i], size[i], mask[i] = info.byte_offset, info.size, info.filter_mask
        return addr, size, mask
    except (RuntimeError, OSError, ValueError) as exc:
        from h5py import h5i

        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise NotHDF5Error(f"{os.fsdecode(h5i.get_file_id(dsid).name)}: damaged HDF5 file (the chunk index of "
                           f"{os.fsdecode(h5i.get_name(dsid) or b'?')} cannot be read: {first}); nothing was written"
                           ) from None


def walk_chunks(dsid: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(corners int64 (n, rank), address, size, filter mask) of every allocated chunk, in index order.

    Raises
    ------
    RuntimeError
        The index holds more chunks than HDF5's own count of it (a damaged file).
    """
    from h5py._objects import phil

    nd = dsid.rank
    n = int(dsid.get_num_chunks())
    if native_available()[1]:
        with phil:
            coords, addr, size, mask = _h5chunks.walk(dsid.id, nd, n)
    else:
        coords, addr = np.empty((n, nd), np.int64), np.empty(n, np.int64)
        size, mask = np.empty(n, np.int64), np.empty(n, np.uint32)
        if hasattr(dsid, "chunk_iter"):
            pos = [0]

            def visit(info: Any) -> None:
                i = pos[0]
                if i < n:
                    coords[i], addr[i], size[i], mask[i] = info.chunk_offset, info.byte_offset, info.size, \
                        info.filter_mask
                pos[0] = i + 1

            dsid.chunk_iter(visit)
            if pos[0] != n:
                raise RuntimeError(f"the chunk index holds {pos[0]} chunks, HDF5 counts {n}")
        else:  # pragma: no cover - HDF5 < 1.12.3: one index search per chunk
            for i in range(n):
                info = dsid.get_chunk_info(i)
                coords[i], addr[i], size[i], mask[i] = info.chunk_offset, info.byte_offset, info.size, info.filter_mask
    if len(addr) != n:
        raise RuntimeError(f"the chunk index holds {len(addr)} chunks or more, HDF5 counts {n}")
    return coords, addr, size, mask


def object_info(gid: Any, name: bytes) -> tuple[int, int]:
    """(address, h5o type) of the object a link ``name`` of group ``gid`` names (KeyError: dangling link)."""
    if native_available()[2]:
        from h5py._objects import phil

        with phil:
            return _h5chunks.object_info(gid.id, name)
    from h5py import h5o

    try:
        info = h5o.get_info(gid, name)
    except (RuntimeError, OSError, ValueError) as exc:
        raise KeyError(name) from exc
    return int(info.addr), int(info.type)


def tensor_element_offsets(path: str, tensor: Any, flat: np.ndarray, open_dataset: Callable[[], Any],
                           base_of: Callable[[Any], int]) -> np.ndarray:
    """:func:`element_offsets` for a layout's chunked ``tensor`` of the file ``path``, without opening it in HDF5
    when it can: the index's location is file metadata, kept on the tensor record like a contiguous tensor's
    offset (a layout is remembered only while the file's metadata is unchanged), and the index itself is read
    from the file each time. ``open_dataset()`` gives the dataset where HDF5 is needed (the first time, other
    index kinds, no native module); ``base_of(dataset)`` what to add to HDF5's addresses.
    """
    loc = tensor.__dict__.get("_h5index_location")
    ds = None
    if loc is None and native_available()[2]:
        from h5py._objects import phil

        ds = open_dataset()
        with phil:
            loc = _locate(ds.id) or False
        object.__setattr__(tensor, "_h5index_location", loc)  # (not a field: equality and hashing ignore it)
    touched = None
    if loc:
        touched = touched_chunks(tensor.shape, tensor.chunks, flat)
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = _read_index(fd, loc, touched[0])[0]
        except (ValueError, OSError, IndexError):
            addr = None
        finally:
            os.close(fd)
        if addr is not None:
            return _element_addresses(addr, touched, tensor.itemsize, loc.base)
    ds = ds if ds is not None else open_dataset()
    if touched is None:
        return element_offsets(ds.id, tensor.shape, tensor.chunks, tensor.itemsize, flat, base_of(ds))
    return _element_addresses(lookup_chunks(ds.id, touched[0])[0], touched, tensor.itemsize, base_of(ds))


def chunk_grid(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[int, ...]:
    """Chunks along each axis of a dataset of ``shape`` cut into ``chunks`` (the last ones may be partial).

    >>> chunk_grid((10, 7), (4, 7))
    (3, 1)
    """
    return tuple(-(-int(s) // int(c)) for s, c in zip(shape, chunks))


Touched = tuple[np.ndarray, np.ndarray, np.ndarray]


def touched_chunks(shape: tuple[int, ...], chunks: tuple[int, ...], flat: np.ndarray) -> Touched:
    """(corners (int64, (chunks touched, rank), C-contiguous) of the touched chunks in C grid order, each
    element's position in its chunk, element → touched chunk), from one computation of the chunk grid."""
    flat = np.asarray(flat, np.int64)
    grid = chunk_grid(shape, chunks)
    key = np.zeros(flat.shape, np.int64)
    within = np.zeros(flat.shape, np.int64)
    for x, c, g in zip(np.unravel_index(flat, shape) if len(shape) > 1 else (flat,), chunks, grid):
        q = x // c
        key = key * g + q
        within = within * int(c) + (x - q * c)
    keys, inv = np.unique(key, return_inverse=True)
    corners = np.stack(np.unravel_index(keys, grid), axis=1).astype(np.int64) * np.asarray(chunks, np.int64)
    return np.ascontiguousarray(corners), within, inv.reshape(-1)


def _element_addresses(addr: np.ndarray, touched: Touched, itemsize: int, base: int) -> np.ndarray:
    """File offsets of the elements of ``touched`` from their chunks' addresses (-1: chunk never written)."""
    _corners, within, inv = touched
    start = addr[inv]
    return np.where(start >= 0, start + base + within * itemsize, -1)


def element_offsets(dsid: Any, shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int, flat: np.ndarray,
                    base: int) -> np.ndarray:
    """File offsets of flat C-order elements of an unfiltered chunked dataset, -1 where the chunk is unallocated.

    Only the chunks the elements fall in are looked up (:func:`lookup_chunks`); ``base`` is added to the
    addresses HDF5 reports (the user block before HDF5 1.14.4, see ``h5offsets.chunk_address_base``).
    """
    flat = np.asarray(flat, np.int64)
    if flat.size == 0:
        return np.empty(flat.shape, np.int64)
    touched = touched_chunks(shape, chunks, flat)
    return _element_addresses(lookup_chunks(dsid, touched[0])[0], touched, itemsize, base)
