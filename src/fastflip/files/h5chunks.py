"""Chunk-level patching of filtered HDF5 data: decode the touched chunks, patch, re-encode, write raw.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

For a filtered dataset whose pipeline fastflip can encode — any of ``shuffle``,
``gzip`` (deflate) or ``lzf`` (one compressor) and ``fletcher32``, in the order the dataset lists them — each chunk
that holds plan sites is read raw from the file (its byte offset and stored size come
from the chunk index), decoded (fletcher32 checked, inflated or LZF-decoded, unshuffled), patched
with the plan's word rule, and re-encoded (shuffled, deflated at the dataset's level
or another level that fits, or LZF-encoded by the native :mod:`fastflip.kernels._lzf` along the
old stream's tokens, fletcher32 recomputed). The new encoding must fit in the
chunk's stored size; a deflate stream is made exactly that long with valid empty deflate blocks
(one compression; :func:`fastflip.files.formats.deflatefit.deflate_exact`, shared with ``.npz``
members), else padded with zero bytes, which inflate ignores after the end of the stream, and a shorter LZF stream is lengthened
(literal runs split, references partly spelled out: LZF has no end marker, so every
byte must decode), so the chunk keeps its place and size
and the file changes only inside the chunk's bytes. The change is then a byte patch
``(offset, old bytes, new bytes)``: the copy path writes it while streaming the file,
the log keeps the old chunk bytes for an exact revert, and the cost follows the
chunks touched, not the file.

A dataset whose pipeline holds another filter (szip, nbit, scaleoffset, a plugin;
lzf when the native module is not built), a chunk that HDF5 stored with a filter skipped, or a chunk whose new encoding
cannot fit, goes the h5py read-modify-write path instead (``ChunkPatches.notes`` says why; the writer that takes
that path warns once per reason and process, :func:`say_notes`). A
filter HDF5 cannot decode here is refused before anything is written; so is a chunk
whose fletcher32 checksum fails before patching.

Examples
--------
>>> fletcher32(b"abcdef").to_bytes(4, "little").hex()
'2d2a5650'
>>> import numpy as np
>>> x = np.arange(6, dtype="<u4").tobytes()
>>> unshuffle(shuffle(x, 4), 4) == x
True
"""

from __future__ import annotations

import warnings
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..core.dtypes import from_words, to_words, word_type
from ..errors import UnsupportedStorageError
from ..core.wordrule import new_words_for
from .formats.deflatefit import deflate_exact
from .h5index import touched_chunks, lookup_chunks
from .h5offsets import file_address_base
from .h5open import open_read_only
from .layout import open_dataset
from .routes import ChunkPatches, SiteRoute
from ..core.plan import Plan

try:
    from ..kernels import _lzf  # native LZF (ext/_lzf.pyx); without it lzf chunks go through h5py
except ImportError:  # pragma: no cover - a build without a C compiler
    _lzf = None

__all__ = ["ChunkPatches", "chunk_patches", "fletcher32", "shuffle", "unshuffle", "check_filters_available", "say_notes"]

_ENCODABLE = {1: "gzip", 2: "shuffle", 3: "fletcher32", 32000: "lzf"}
_COMPRESSORS = (1, 32000)
_SAID: set[str] = set()


class ChecksumError(UnsupportedStorageError):
    """A chunk's fletcher32 checksum does not match its bytes (the file is damaged)."""


def fletcher32(data: bytes | np.ndarray) -> int:
    """HDF5's Fletcher-32 checksum (``H5_checksum_fletcher32``) of ``data``, vectorised.

    16-bit words are read big-endian (an odd last byte is the high byte of a last word);
    both sums are taken modulo 65535 with HDF5's folding, which keeps a non-zero sum in
    1..65535 and a zero sum only for all-zero data.
    """
    b = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).ravel()
    n = len(b) // 2
    w = (b[: 2 * n : 2].astype(np.uint64) << np.uint64(8)) | b[1 : 2 * n : 2].astype(np.uint64)
    if len(b) % 2:
        w = np.append(w, np.uint64(int(b[-1]) << 8))
    if not len(w) or not w.any():
        return 0
    coef = np.arange(len(w), 0, -1, dtype=np.uint64) % np.uint64(65535)
    s1 = int(w.sum(dtype=np.uint64))
    s2 = int(np.sum((w * coef) % np.uint64(65535), dtype=np.uint64))
    return (((s2 - 1) % 65535 + 1) << 16) | ((s1 - 1) % 65535 + 1)


def _byte_transpose(data: bytes, itemsize: int, inverse: bool) -> bytes:
    n = len(data) // itemsize
    if itemsize <= 1 or n <= 1:
        return bytes(data)
    a = np.frombuffer(data, np.uint8, n * itemsize).reshape((itemsize, n) if inverse else (n, itemsize))
    return a.T.tobytes() + bytes(data[n * itemsize :])


def shuffle(data: bytes, itemsize: int) -> bytes:
    """HDF5's byte shuffle: byte k of every element together, k = 0..itemsize-1 (a tail is kept as is)."""
    return _byte_transpose(data, itemsize, False)


def unshuffle(data: bytes, itemsize: int) -> bytes:
    """Inverse of :func:`shuffle`."""
    return _byte_transpose(data, itemsize, True)


def _note(notes: list[str], reason: str) -> None:
    if reason not in notes:
        notes.append(reason)


def say_notes(notes: Sequence[str], stacklevel: int = 1) -> None:
    """Warn, once per reason and process, why chunks go through h5py (``ChunkPatches.notes``): for the writer
    that really takes that path, after its refusals. ``stacklevel`` counts from the caller, as in
    :func:`warnings.warn`."""
    for reason in notes:
        if reason not in _SAID:
            _SAID.add(reason)
            warnings.warn(f"fastflip: {reason}; those chunks go through h5py (whole-chunk read-modify-write)",
                          stacklevel=stacklevel + 1)


def check_filters_available(dsid: Any, name: str) -> None:
    """Refuse a dataset whose pipeline holds a filter this HDF5 cannot apply (before anything is written)."""
    from h5py import h5z

    dcpl = dsid.get_create_plist()
    for i in range(dcpl.get_nfilters()):
        code = int(dcpl.get_filter(i)[0])
        if not h5z.filter_avail(code):
            raise UnsupportedStorageError(
                f"{name}: HDF5 filter {code} is not available here (a plugin?); fastflip cannot read or rewrite it: "
                f"install the plugin (e.g. hdf5plugin) or exclude the tensor (--exclude '{name}')")


@dataclass(frozen=True)
class _ChunkInfo:
    """A chunk's address as HDF5 reports it (None: never written), stored size and filter mask."""

    byte_offset: int | None
    size: int
    filter_mask: int


def _pipeline(dsid: Any, itemsize: int, where: str) -> list[tuple[int, tuple[int, ...]]] | None:
    """The dataset's filters as (code, parameters) when fastflip can decode and re-encode them exactly as HDF5
    does; None sends its chunks through h5py. Parameters HDF5 itself would never write (a shuffle element
    size other than the type's, a deflate level outside 0..9) are refused in one line."""
    dcpl = dsid.get_create_plist()
    out = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, cd, _name = dcpl.get_filter(i)
        code, cd = int(code), tuple(int(c) for c in cd)
        if code not in _ENCODABLE or (code == 32000 and _lzf is None):
            return None
        if code == 2 and cd[:1] not in ((), (itemsize,)):
            raise UnsupportedStorageError(f"{where}: the shuffle filter declares an element size of {cd[0]} "
                                          f"for {itemsize}-byte elements (HDF5 writes the type's size); the file is "
                                          "damaged or crafted")
        if code == 1 and cd[:1] and not 0 <= cd[0] <= 9:
            raise UnsupportedStorageError(f"{where}: the deflate filter declares level {cd[0]} (HDF5 allows "
                                          "0..9); the file is damaged or crafted")
        out.append((code, cd))
    return out if sum(c in _COMPRESSORS for c, _ in out) <= 1 else None


def _decode(raw: bytes, pipe: list[tuple[int, tuple[int, ...]]], itemsize: int, nbytes: int, where: str,
            streams: dict[int, bytes]) -> bytes:
    """The chunk's data; ``streams`` gets each compressor's input stream (the LZF re-encoder follows it)."""
    data = raw
    for code, cd in reversed(pipe):
        if code == 3:
            body, stored = data[:-4], int.from_bytes(data[-4:], "little")
            mine = fletcher32(body)
            if stored not in (mine, int.from_bytes(mine.to_bytes(4, "little"), "big")):
                raise ChecksumError(f"{where}: fletcher32 checksum fails before patching (damaged file); nothing was written")
            data = body
        elif code == 1:
            try:
                data = zlib.decompressobj().decompress(data, nbytes + 1)
            except zlib.error as exc:
                raise UnsupportedStorageError(f"{where}: damaged gzip chunk ({exc}); nothing was written") from None
        elif code == 32000:
            streams[code] = data
            try:
                data = _lzf.decompress(data, nbytes)
            except ValueError as exc:
                raise UnsupportedStorageError(f"{where}: damaged lzf chunk ({exc}); nothing was written") from None
        elif code == 2:
            data = unshuffle(data, cd[0] if cd else itemsize)
    if len(data) != nbytes:
        raise UnsupportedStorageError(f"{where}: chunk decodes to {len(data)} bytes, expected {nbytes}")
    return data


def _lzf_encode(data: bytes, old: bytes, room: int) -> bytes | None:
    """An LZF stream of exactly ``room`` bytes for ``data``: along the old stream's tokens, else a fresh encoding;
    a shorter stream is lengthened (None when neither fits)."""
    z = _lzf.reencode(old, data)
    for depth in (4, 64):  # then a fresh encoding (a short search first: it is usually short enough)
        if len(z) <= room:
            break
        z = _lzf.compress(data, depth)
    if len(z) < room:
        z = _lzf.grow(z, data, room - len(z))
    return z if z is not None and len(z) == room else None


def _encode(data: bytes, pipe: list[tuple[int, tuple[int, ...]]], itemsize: int, size: int,
            streams: dict[int, bytes]) -> bytes | None:
    """The chunk encoded to exactly ``size`` bytes, or None when no encoding fits."""
    room = size - (4 if any(c == 3 for c, _ in pipe) else 0)
    out = data
    for code, cd in pipe:
        if code == 2:
            out = shuffle(out, cd[0] if cd else itemsize)
        elif code == 1:
            # one compression at the dataset's level (HDF5 uses memLevel 8) ending in valid empty blocks of the
            # exact size, else the complete stream padded with zeros (HDF5 inflates to the end marker); other
            # settings only when neither fits (files/formats/deflatefit.py, shared with .npz members)
            z = deflate_exact(out, room, cd[0] if cd else 6, wbits=15, mem_level=8, zero_pad=True)
            if z is None:
                return None
            out = z
        elif code == 32000:
            z = _lzf_encode(out, streams[code], room)
            if z is None:
                return None
            out = z
        elif code == 3:
            if len(out) != room:
                return None
            out = out + fletcher32(out).to_bytes(4, "little")
    return out if len(out) == size else None


def chunk_patches(path: str, plan: Plan, routes: Sequence[SiteRoute]) -> ChunkPatches:
    """Byte patches for the plan's sites in filtered chunks that fastflip can re-encode in place.

    Only sites with offset -1 (the hdf5 path) are considered; the rest of them (other
    filters, unallocated chunks, compact data, chunks that would grow) are left for h5py.

    Raises
    ------
    UnsupportedStorageError
        A filter this HDF5 cannot apply, or a chunk whose fletcher32 checksum fails.
    """
    out = ChunkPatches()
    todo = [r for r in routes if (r.offsets < 0).any()]
    if not todo:
        return out
    found: list[tuple[tuple[int, bytes, bytes], np.ndarray, np.ndarray, np.ndarray]] = []
    fid = open_read_only(path)  # the low-level file: no h5py.File to build and close
    try:
        with open(path, "rb") as fh:
            for r in todo:
                found += _tensor_patches(path, fid, fh, plan, r, out.notes)
    finally:
        fid.close()
    if found:
        out.patches = sorted(f[0] for f in found)
        out.handled, out.old, out.new = (np.concatenate([f[i] for f in found]) for i in (1, 2, 3))
        out.chunks = len(found)
    return out


def _tensor_patches(path: str, fid: Any, fh: Any, plan: Plan, r: SiteRoute, notes: list[str]
                    ) -> list[tuple[tuple[int, bytes, bytes], np.ndarray, np.ndarray, np.ndarray]]:
    """[(patch, plan positions, old words, new words)] per touched chunk of one tensor that fastflip re-encodes
    at its size (the tensor's other chunks, or all of them, go through h5py: why is added to ``notes``)."""
    t = r.tensor
    dsid = open_dataset(fid, t.path)
    check_filters_available(dsid, t.path)
    if t.storage != "filtered":
        return []
    pipe = _pipeline(dsid, t.itemsize, f"{path}: {t.path}")
    if pipe is None:
        _note(notes, f"{'+'.join(t.filters)} chunks cannot be re-encoded by fastflip")
        return []
    pos = r.positions[np.flatnonzero(r.offsets < 0)]
    keys, within, inv = touched_chunks(t.shape, t.chunks, plan.index[pos])  # (files/h5index.py)
    order = np.argsort(inv, kind="stable")  # the sites grouped by chunk, in plan order within each
    bounds = np.searchsorted(inv[order], np.arange(len(keys) + 1))
    nbytes = int(np.prod(np.asarray(t.chunks, np.int64))) * t.itemsize
    base = file_address_base(fid)
    addrs, sizes, masks = lookup_chunks(dsid, keys)  # the touched chunks only, in C (files/h5index.py)
    out = []
    for k, c0 in enumerate(keys):
        at = order[bounds[k] : bounds[k + 1]]
        info = _ChunkInfo(int(addrs[k]) if addrs[k] >= 0 else None, int(sizes[k]), int(masks[k]))
        if info.byte_offset is None or info.size == 0:
            continue  # never written: h5py allocates it
        if info.filter_mask:
            _note(notes, "chunks stored with a filter skipped cannot be re-encoded in place")
            continue
        address = int(info.byte_offset) + base
        fh.seek(address)
        raw = fh.read(info.size)
        where = f"{path}: {t.path} chunk at {tuple(int(x) for x in c0)}"
        if len(raw) != info.size:
            raise UnsupportedStorageError(f"{where}: the chunk index puts it past the end of the file "
                                          "(damaged or truncated HDF5 file); nothing was written")
        streams: dict[int, bytes] = {}
        buf = bytearray(_decode(raw, pipe, t.itemsize, nbytes, where, streams))
        arr = np.frombuffer(buf, t.dtype)
        old = to_words(arr[within[at]]).astype(np.uint64)
        new = new_words_for(old, plan, pos[at], word_type(t.dtype, t.format))
        arr[within[at]] = from_words(new.astype(f"u{t.itemsize}"), t.dtype)
        enc = _encode(bytes(buf), pipe, t.itemsize, info.size, streams)
        if enc is None:
            _note(notes, "a re-encoded chunk would not fit in its stored size")
            continue
        out.append(((address, raw, enc), pos[at], old, new))
    return out
