"""Where the bytes of a zip archive's stored (uncompressed) entries lie in the file.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Only the central directory and each entry's local header are read; entry names are
looked up, never extracted. The central directory is parsed by one routine, :func:`directory`, which gives
the last parse back while the directory's bytes are unchanged: the format check, the layout read, the patchers
and the CRC fix-up of one inject share one parse. Offsets and sizes are checked against the file size, so a
truncated archive or a header that points outside the file is refused before anything
is written.

Examples
--------
>>> import os, tempfile, zipfile
>>> p = os.path.join(tempfile.mkdtemp(), "a.zip")
>>> with zipfile.ZipFile(p, "w") as z:
...     z.writestr("x/data/0", b"abcd")
>>> e = stored_entries(p)["x/data/0"]
>>> open(p, "rb").read()[e.offset:e.offset + e.size]
b'abcd'
"""

from __future__ import annotations

import os
import struct
import threading
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ...errors import FormatError

__all__ = ["ZipEntry", "stored_entries", "central_records", "directory", "entry_data", "crc_refusal"]


@dataclass(frozen=True)
class ZipEntry:
    """One archive member: its data's absolute byte offset, size, and whether it is stored raw."""

    name: str
    offset: int
    size: int
    stored: bool
    info: zipfile.ZipInfo


_PARSED: "OrderedDict[str, tuple[int, int, bytes, list[zipfile.ZipInfo]]]" = OrderedDict()
_PARSED_LOCK = threading.Lock()
_KEEP = 8  # archives whose last parse is kept


def directory(path: str) -> tuple[list[zipfile.ZipInfo], int]:
    """(members in directory order, absolute offset of the central directory) of the zip at ``path``: ``zipfile``'s
    parse of its central directory, the one place fastflip parses it.

    The parse depends only on the file's size and its bytes from the directory to the end (the end records follow
    the directory); while both are those of the last parse of ``path``, that parse is given back (the bytes are
    read and compared: no time stamp is trusted). The members' :class:`zipfile.ZipInfo` are shared: read only.

    Raises
    ------
    zipfile.BadZipFile, OSError, ...
        As :class:`zipfile.ZipFile` does for a damaged or unreadable archive.
    """
    key = os.path.realpath(path)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        with _PARSED_LOCK:
            last = _PARSED.get(key)
        if last is not None and last[0] == size:
            fh.seek(last[1])
            if fh.read(size - last[1]) == last[2]:
                return last[3], last[1]
        with zipfile.ZipFile(fh) as zf:
            infos, start = zf.infolist(), int(zf.start_dir)  # type: ignore[attr-defined]
        if 0 <= start <= size:
            fh.seek(start)
            tail = fh.read(size - start)
            with _PARSED_LOCK:
                _PARSED[key] = (size, start, tail, infos)
                _PARSED.move_to_end(key)
                while len(_PARSED) > _KEEP:
                    _PARSED.popitem(last=False)
    return infos, start


def stored_entries(path: str, zf: zipfile.ZipFile | None = None,
                   listing: tuple[list[zipfile.ZipInfo], int] | None = None) -> dict[str, ZipEntry]:
    """Every member of the zip at ``path`` with the absolute offset of its data.

    ``zf``, the caller's :class:`zipfile.ZipFile` open on ``path``, or ``listing``, the caller's
    :func:`directory` of it, saves reading the central directory again (else it is :func:`directory`'s parse).

    Raises
    ------
    FormatError
        A damaged or truncated archive, a local header that disagrees with the central
        directory, or data that would lie outside the file.
    """
    fsize = os.path.getsize(path)
    out: dict[str, ZipEntry] = {}
    try:
        with open(path, "rb") as fh:
            infos, start_dir = (listing if listing is not None else directory(path) if zf is None
                                else (zf.infolist(), int(zf.start_dir)))  # type: ignore[attr-defined]
            for info in infos:
                if not 0 <= info.header_offset <= fsize - 30:
                    raise FormatError(f"{path}: zip entry {info.filename!r} has its local header at "
                                      f"{info.header_offset}, outside the file (damaged or truncated archive)")
                fh.seek(info.header_offset)
                head = fh.read(30)
                if len(head) != 30 or head[:4] != b"PK\x03\x04":
                    raise FormatError(f"{path}: zip entry {info.filename!r} has no local header at "
                                      f"{info.header_offset} (damaged or truncated archive)")
                nlen, xlen = struct.unpack("<HH", head[26:30])
                name = fh.read(nlen)
                if name.decode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace") != info.filename:
                    raise FormatError(f"{path}: zip entry {info.filename!r}: local header names another file")
                data = info.header_offset + 30 + nlen + xlen
                stored = info.compress_type == zipfile.ZIP_STORED
                if stored and info.compress_size != info.file_size:
                    raise FormatError(f"{path}: zip entry {info.filename!r}: stored sizes disagree")
                if data + info.compress_size > fsize:
                    raise FormatError(f"{path}: zip entry {info.filename!r} points past the end of the file "
                                      f"({data + info.compress_size} > {fsize} bytes): truncated archive")
                if info.external_attr & 0x10 and not info.filename.endswith("/"):  # zipfile reads a file there,
                    raise FormatError(f"{path}: zip entry {info.filename!r} is marked as a directory; the file is "
                                      "damaged or crafted")  # miniz (torch's reader) a directory without data
                if info.filename in out:  # readers differ on which copy counts (zipfile: the last, torch: another)
                    raise FormatError(f"{path}: zip entry {info.filename!r} appears more than once (which copy a "
                                      "reader takes is undefined); the file is damaged or crafted")
                out[info.filename] = ZipEntry(info.filename, data, int(info.file_size), stored, info)
            _check_disjoint(path, fh, list(out.values()), start_dir)
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError, RuntimeError) as exc:
        raise FormatError(f"{path}: damaged or truncated zip archive ({exc}); nothing was read") from None
    return out


def _descriptor_len(fh, info: zipfile.ZipInfo, end: int) -> int:  # type: ignore[no-untyped-def]
    """Bytes of the data descriptor after an entry's data (0 without flag bit 3)."""
    if not info.flag_bits & 0x08:
        return 0
    fh.seek(end)
    sig = fh.read(4) == b"PK\x07\x08"
    wide = info.file_size > 0xFFFFFFFF or info.compress_size > 0xFFFFFFFF
    return (4 if sig else 0) + 4 + (16 if wide else 8)


def _check_disjoint(path: str, fh, entries: list[ZipEntry], start_dir: int) -> None:  # type: ignore[no-untyped-def]
    """Refuse entries whose local header, data or data descriptor overlap another entry or the central directory
    (a change to one would change the other, and a revert of one would undo the other)."""
    spans = []
    for e in entries:
        end = e.offset + e.info.compress_size
        spans.append((e.info.header_offset, end + _descriptor_len(fh, e.info, end), e.name))
    spans.sort()
    for (b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise FormatError(f"{path}: zip entries {n0!r} and {n1!r} overlap (bytes {b1}..{e0}); the file is "
                              "damaged or crafted")
    if spans and spans[-1][1] > start_dir:
        raise FormatError(f"{path}: zip entry {spans[-1][2]!r} overlaps the central directory; the file is damaged "
                          "or crafted")


def central_records(path: str, listing: tuple[list[zipfile.ZipInfo], int] | None = None) -> dict[str, int]:
    """Absolute file offset of each entry's central-directory record (its CRC-32 is at +16); ``listing``: the
    caller's :func:`directory` of ``path`` (else it is read here).

    Raises
    ------
    FormatError
        A record whose lengths run it past the directory, or that names another entry than ``zipfile`` reads
        there (the two readings of the directory must agree before any field of it is patched).
    """
    infos, pos = listing if listing is not None else directory(path)
    out: dict[str, int] = {}
    with open(path, "rb") as fh:
        for info in infos:
            fh.seek(pos)
            rec = fh.read(46)
            if len(rec) != 46 or rec[:4] != b"PK\x01\x02":
                raise FormatError(f"{path}: damaged zip central directory at byte {pos}")
            flags = struct.unpack("<H", rec[8:10])[0]
            nlen, xlen, clen = struct.unpack("<HHH", rec[28:34])
            name = fh.read(nlen).decode("utf-8" if flags & 0x800 else "cp437", "replace")
            if name != info.filename or name in out:
                raise FormatError(f"{path}: zip central directory record at byte {pos} does not read as entry "
                                  f"{info.filename!r} (damaged or crafted lengths)")
            out[name] = pos
            pos += 46 + nlen + xlen + clen
    return out


def crc_refusal(path: str, name: str, reader: str = "zipfile") -> FormatError:
    """The one-line refusal of a member whose bytes do not match its recorded CRC-32, naming the ``reader`` that
    refuses such a member too (``zipfile`` checks the CRC-32 when it reaches the member's end)."""
    return FormatError(f"{path}: member {name} does not match its recorded CRC-32: the archive is damaged ({reader} "
                       "refuses this member); re-save it. Nothing was written")


def entry_data(path: str, e: ZipEntry, fh: Any, reader: str = "zipfile") -> tuple[bytes, bytes]:
    """(the entry's stored bytes, its data) of a stored or deflated, unencrypted entry, read through ``fh`` (open on
    ``path``) without another parse of the directory; the data checked against the recorded size and CRC-32
    (a mismatch refused as :func:`crc_refusal` says, naming ``reader``).

    Raises
    ------
    FormatError
        An encrypted entry, another compression method, a truncated entry, a damaged deflate stream, or data
        whose size or CRC-32 is not the recorded one.
    """
    info = e.info
    if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise FormatError(f"{path}: member {e.name} is encrypted or uses compression method {info.compress_type} "
                          "(stored and deflate members are read)")
    fh.seek(e.offset)
    raw = fh.read(info.compress_size)
    if len(raw) != info.compress_size:
        raise FormatError(f"{path}: member {e.name} is truncated; nothing was written")
    if info.compress_type == zipfile.ZIP_STORED:
        data = raw
    else:
        try:
            d = zlib.decompressobj(-15)
            data = d.decompress(raw, info.file_size + 1)
            ok = d.eof and len(data) == info.file_size
        except zlib.error as exc:
            raise FormatError(f"{path}: member {e.name} is not a valid deflate stream ({exc}); the file is damaged, "
                              "nothing was written") from None
        if not ok:
            raise FormatError(f"{path}: member {e.name} does not inflate to its recorded {info.file_size} bytes; "
                              "the file is damaged, nothing was written")
    if zlib.crc32(data) != info.CRC:
        raise crc_refusal(path, e.name, reader)
    return raw, data
