"""Compressed ``.npz`` members (``np.savez_compressed``) patched: inflate, patch, re-deflate, fix the zip fields.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Only the members that hold plan sites are touched. Each is read raw, checked (not
encrypted, no zip64 directory, inflates to its recorded size and CRC-32), inflated,
patched with the plan's word rule and re-deflated. When a stream of the member's old
compressed size can be made (:func:`fastflip.files.formats.deflatefit.deflate_exact`), the
member keeps its place: the change is a same-size byte patch of the member's bytes and
of its CRC-32 fields, the copy path writes it while streaming the file, and the log keeps
the old member bytes, so revert is exact and the cost follows the members touched.
Otherwise the member is re-deflated at its own size: its bytes, its CRC-32 and size
fields, the local-header offsets of the members after it and the directory offset change
(``resized``), the output is spliced while streaming, and the log keeps the changed
byte ranges (from the first resized member to the end) for the exact revert.
Untouched members' bytes are copied as they are.

Imports :mod:`fastflip.files.formats`, :mod:`fastflip.core.wordrule` (the word rule)
and :mod:`fastflip.files.routes` (the site routes and the result type shared with chunk patching).
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from typing import Sequence

import numpy as np

from ..core.dtypes import from_words, to_words, word_type
from ..errors import LogMismatchError
from .formats import FormatError
from .formats.deflatefit import deflate_exact, deflate_smallest
from .formats.npz_members import read_member, zip64_fields
from .formats.numpy_io import npy_header
from .formats.zipcrc import check_patch_bytes, crc_spots, descriptor_at
from .formats.zipraw import ZipEntry, central_records, stored_entries
from .routes import ChunkPatches, SiteRoute
from ..core.wordrule import new_words_for
from ..core.plan import Plan

__all__ = ["member_patches", "member_words"]

Patch = tuple[int, bytes, bytes]
_LEVEL = {0: 6, 1: 9, 2: 1, 3: 1}  # deflate option bits (1-2) of the general-purpose flags → zlib level


def _members(path: str, routes: Sequence[SiteRoute]) -> list[tuple[SiteRoute, ZipEntry]]:
    todo = [r for r in routes if (r.offsets < 0).any()]
    if not todo:
        return []
    by_key = {"/" + (n[:-4] if n.endswith(".npy") else n): e for n, e in stored_entries(path).items()}
    out = []
    for r in todo:
        e = by_key.get(r.tensor.path)
        if e is None:
            raise LogMismatchError(f"tensor {r.tensor.path} is not a member of {path}")
        out.append((r, e))
    return out


def _array(path: str, r: SiteRoute, e: ZipEntry, data: bytes | bytearray) -> np.ndarray:
    t = r.tensor
    dt, _fortran, shape, hlen = npy_header(io.BytesIO(data), len(data), f"{path}:{e.name}")
    if dt != t.dtype or tuple(shape) != tuple(t.shape):
        raise LogMismatchError(f"{path}: member {e.name} holds {dt} {shape}, expected {t.dtype} {t.shape}")
    return np.frombuffer(data, t.dtype, t.size, hlen)


def member_words(path: str, plan: Plan, routes: Sequence[SiteRoute], out: np.ndarray) -> None:
    """Store the current words of the plan's sites in deflated members into ``out`` (plan order)."""
    members = _members(path, routes)
    with open(path, "rb") as fh:
        for r, e in members:
            _, data = read_member(path, e, fh)
            pos = r.positions[r.offsets < 0]
            out[pos] = to_words(_array(path, r, e, data)[plan.index[pos]]).astype(np.uint64)


def _size_patches(fh, e: ZipEntry, new_size: int) -> list[Patch]:  # type: ignore[no-untyped-def]
    """Patches of every copy of the entry's compressed size (local header or its zip64 field, descriptor)."""
    old, out = e.info.compress_size, []
    h = e.info.header_offset
    fh.seek(h)
    head = fh.read(30)
    nlen, xlen = struct.unpack("<HH", head[26:30])
    local = struct.unpack("<I", head[18:22])[0]
    if local == 0xFFFFFFFF:  # the sizes are in the local zip64 field: uncompressed (8 bytes), compressed (8)
        fh.seek(h + 30 + nlen)
        z = zip64_fields(fh.read(xlen))
        if z is None or z[1] < 16:
            raise FormatError(f"member {e.name}: local header points to a zip64 size it does not hold")
        at = h + 30 + nlen + z[0] + 8
        fh.seek(at)
        if fh.read(8) == struct.pack("<Q", old):  # (zeros when a data descriptor holds the sizes)
            out.append((at, struct.pack("<Q", old), struct.pack("<Q", new_size)))
    elif local == old:
        out.append((h + 18, struct.pack("<I", old), struct.pack("<I", new_size)))
    desc = descriptor_at(fh, e)
    if desc is not None:
        wide = local == 0xFFFFFFFF
        fmt = "<Q" if wide else "<I"
        out.append((desc + 4, struct.pack(fmt, old), struct.pack(fmt, new_size)))
    return out


def member_patches(path: str, plan: Plan, routes: Sequence[SiteRoute]) -> ChunkPatches:
    """Byte patches for the plan's sites in deflated members of the ``.npz`` at ``path``.

    ``resized`` is set when a member could not keep its size: then some patches replace
    a range by bytes of another length (the copy path splices them in).

    Raises
    ------
    FormatError, UnsupportedStorageError
        A member that is truncated, fails its CRC-32 or does not inflate, is encrypted, or
        lies in a zip64 archive: nothing is written.
    """
    out = ChunkPatches()
    members = _members(path, routes)
    if not members:
        return out
    cd = central_records(path)
    handled, olds, news = [], [], []
    read: set[int] = set()  # offsets of member bytes read by read_member: the check does not read them again
    shifts: list[tuple[int, int]] = []  # (old data offset, size change)
    with open(path, "rb") as fh:
        for r, e in members:
            raw, data = read_member(path, e, fh)
            buf = bytearray(data)
            arr = _array(path, r, e, buf)
            t = r.tensor
            pos = r.positions[r.offsets < 0]
            idx = plan.index[pos]
            old = to_words(arr[idx]).astype(np.uint64)
            new = new_words_for(old, plan, pos, word_type(t.dtype, t.format))
            arr[idx] = from_words(new.astype(f"u{t.itemsize}"), t.dtype)
            handled.append(pos)
            olds.append(old)
            news.append(new)
            out.chunks += 1
            crc = zlib.crc32(buf)
            if crc == e.info.CRC and bytes(buf) == data:
                continue  # nothing changed (e.g. stuck-at bits already set)
            if e.info.compress_type == zipfile.ZIP_STORED:
                enc: bytes | None = bytes(buf)
            else:
                level = _LEVEL[(e.info.flag_bits >> 1) & 3]
                enc = deflate_exact(bytes(buf), len(raw), level)
                if enc is None:
                    enc = deflate_smallest(bytes(buf), level)
            out.patches.append((e.offset, raw, enc))
            read.add(e.offset)
            ob, nb = struct.pack("<I", e.info.CRC), struct.pack("<I", crc)
            out.patches.extend((s, ob, nb) for s in crc_spots(fh, e, cd[e.name]))
            if len(enc) != len(raw):
                out.resized = True
                out.patches.extend(_size_patches(fh, e, len(enc)))
                nb_size = struct.pack("<I", len(enc))
                out.patches.append((cd[e.name] + 20, struct.pack("<I", len(raw)), nb_size))
                shifts.append((e.offset, len(enc) - len(raw)))
        if shifts:
            out.patches.extend(_offset_patches(path, fh, cd, shifts))
        check_patch_bytes(path, fh, out.patches, read)
    out.handled = np.concatenate(handled)
    out.old = np.concatenate(olds)
    out.new = np.concatenate(news)
    out.patches.sort()
    return out


def _offset_patches(path: str, fh, cd: dict[str, int], shifts: list[tuple[int, int]]) -> list[Patch]:  # type: ignore[no-untyped-def]
    """New local-header offsets (central directory) of members after resized ones, and the new directory offset."""
    starts = np.array([s for s, _ in sorted(shifts)], np.int64)
    cum = np.cumsum([d for _, d in sorted(shifts)])
    out: list[Patch] = []
    last = 0
    for name, rec in cd.items():
        fh.seek(rec)
        head = fh.read(46)
        (lho,) = struct.unpack("<I", head[42:46])
        k = int(np.searchsorted(starts, lho, side="right"))  # resized members whose data lie before this header
        if k:
            out.append((rec + 42, head[42:46], struct.pack("<I", lho + int(cum[k - 1]))))
        nlen, xlen, clen = struct.unpack("<HHH", head[28:34])
        last = max(last, rec + 46 + nlen + xlen + clen)
    fh.seek(last)
    eocd = fh.read(22)
    if eocd[:4] != b"PK\x05\x06":
        raise FormatError(f"{path}: no end-of-directory record after the central directory; nothing was written")
    (cd_at,) = struct.unpack("<I", eocd[16:20])
    out.append((last + 16, eocd[16:20], struct.pack("<I", cd_at + int(cum[-1]))))
    return out
