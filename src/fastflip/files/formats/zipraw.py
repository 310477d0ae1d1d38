"""Where the bytes of a zip archive's stored (uncompressed) entries lie in the file.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Only the central directory and each entry's local header are read; entry names are
looked up, never extracted. Offsets and sizes are checked against the file size, so a
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

import contextlib
import os
import struct
import zipfile
from dataclasses import dataclass

from ...errors import FormatError

__all__ = ["ZipEntry", "stored_entries", "central_records"]


@dataclass(frozen=True)
class ZipEntry:
    """One archive member: its data's absolute byte offset, size, and whether it is stored raw."""

    name: str
    offset: int
    size: int
    stored: bool
    info: zipfile.ZipInfo


def stored_entries(path: str, zf: zipfile.ZipFile | None = None) -> dict[str, ZipEntry]:
    """Every member of the zip at ``path`` with the absolute offset of its data.

    ``zf``, the caller's :class:`zipfile.ZipFile` open on ``path``, saves reading the central
    directory again.

    Raises
    ------
    FormatError
        A damaged or truncated archive, a local header that disagrees with the central
        directory, or data that would lie outside the file.
    """
    fsize = os.path.getsize(path)
    out: dict[str, ZipEntry] = {}
    try:
        with contextlib.ExitStack() as own, open(path, "rb") as fh:
            if zf is None:
                zf = own.enter_context(zipfile.ZipFile(path))
            for info in zf.infolist():
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
            _check_disjoint(path, fh, list(out.values()), int(zf.start_dir))  # type: ignore[attr-defined]
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


def central_records(path: str) -> dict[str, int]:
    """Absolute file offset of each entry's central-directory record (its CRC-32 is at +16).

    Raises
    ------
    FormatError
        A record whose lengths run it past the directory, or that names another entry than ``zipfile`` reads
        there (the two readings of the directory must agree before any field of it is patched).
    """
    with zipfile.ZipFile(path) as zf:
        pos = int(zf.start_dir)  # type: ignore[attr-defined]
        infos = zf.infolist()
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
