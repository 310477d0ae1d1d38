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

import os
import struct
import zipfile
from dataclasses import dataclass

__all__ = ["ZipEntry", "stored_entries", "central_records"]


@dataclass(frozen=True)
class ZipEntry:
    """One archive member: its data's absolute byte offset, size, and whether it is stored raw."""

    name: str
    offset: int
    size: int
    stored: bool
    info: zipfile.ZipInfo


def stored_entries(path: str) -> dict[str, ZipEntry]:
    """Every member of the zip at ``path`` with the absolute offset of its data.

    Raises
    ------
    FormatError
        A damaged or truncated archive, a local header that disagrees with the central
        directory, or data that would lie outside the file.
    """
    from . import FormatError

    fsize = os.path.getsize(path)
    out: dict[str, ZipEntry] = {}
    try:
        with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
            for info in zf.infolist():
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
                out[info.filename] = ZipEntry(info.filename, data, int(info.file_size), stored, info)
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise FormatError(f"{path}: damaged or truncated zip archive ({exc}); nothing was read") from None
    return out


def central_records(path: str) -> dict[str, int]:
    """Absolute file offset of each entry's central-directory record (its CRC-32 is at +16)."""
    from . import FormatError

    with zipfile.ZipFile(path) as zf:
        pos = int(zf.start_dir)  # type: ignore[attr-defined]
        n = len(zf.infolist())
    out: dict[str, int] = {}
    with open(path, "rb") as fh:
        for _ in range(n):
            fh.seek(pos)
            rec = fh.read(46)
            if len(rec) != 46 or rec[:4] != b"PK\x01\x02":
                raise FormatError(f"{path}: damaged zip central directory at byte {pos}")
            flags = struct.unpack("<H", rec[8:10])[0]
            nlen, xlen, clen = struct.unpack("<HHH", rec[28:34])
            name = fh.read(nlen).decode("utf-8" if flags & 0x800 else "cp437", "replace")
            out[name] = pos
            pos += 46 + nlen + xlen + clen
    return out
