"""Deflated ``.npz`` members (``np.savez_compressed``): checked reading.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A member of a compressed ``.npz`` is a raw deflate stream of a ``.npy`` file. This module
reads such members safely — the archive must not need zip64 (members and directory below
4 GiB; NumPy's zip64 *local* extra fields are fine), members must not be encrypted, must be
deflated or stored, must inflate to their recorded size and CRC-32. A patched member is
re-deflated by :func:`fastflip.files.formats.deflatefit.deflate_exact` (the one deflate-to-size
routine, which the HDF5 chunk patcher calls too) to exactly the member's old compressed size when
a stream of that size exists: the data deflated once, then valid empty deflate blocks worth exactly
the bytes left. Then the member keeps its place and size and the change is a byte patch of the member and
its CRC fields, like the raw path's. Otherwise the member is rewritten at its new size
(see :mod:`fastflip.files.zipmembers`).

Imports :mod:`.zipraw`, :mod:`.npyheader` helpers and :mod:`fastflip.errors`.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from typing import Any

from ...errors import UnsupportedStorageError
from ...errors import FormatError
from .npyheader import npy_header
from .zipraw import ZipEntry, entry_data, stored_entries

__all__ = ["check_rewritable", "read_member", "member_npy_header", "member_array", "zip64_fields"]

def zip64_fields(extra: bytes) -> tuple[int, int] | None:
    """(start, length) of the zip64 extended-information field's data inside ``extra``, or None."""
    i = 0
    while i + 4 <= len(extra):
        tag, n = struct.unpack("<HH", extra[i:i + 4])
        if tag == 0x0001:
            return i + 4, n
        i += 4 + n
    return None


def _zip64_directory(path: str, fh: Any, info: zipfile.ZipInfo) -> bool:
    """True when the member's central-directory record, or the archive's end record, needs zip64."""
    if zip64_fields(info.extra) is not None:
        return True
    fh.seek(0, 2)
    end = fh.tell()
    fh.seek(max(0, end - (1 << 16) - 22))
    tail = fh.read()
    k = tail.rfind(b"PK\x05\x06")
    return k >= 20 and tail[k - 20:k - 16] == b"PK\x06\x07"


def check_rewritable(path: str, e: ZipEntry, fh: Any) -> None:
    """Refuse (one line) a member fastflip cannot rewrite exactly: encrypted, zip64 directory, other method."""
    info = e.info
    if info.flag_bits & 0x1:
        raise UnsupportedStorageError(f"{path}: member {info.filename} is encrypted; fastflip does not rewrite "
                                      "encrypted archives (save it with np.savez_compressed, no password)")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise UnsupportedStorageError(f"{path}: member {info.filename} uses compression method {info.compress_type} "
                                      "(only stored and deflate members are rewritten); save it with np.savez_compressed")
    if _zip64_directory(path, fh, info):
        raise UnsupportedStorageError(f"{path}: zip64 archive (a member or the directory beyond 4 GiB); fastflip "
                                      "rewrites compressed members of smaller archives only: save with np.savez (stored)")


def read_member(path: str, e: ZipEntry, fh: Any) -> tuple[bytes, bytes]:
    """(the member's stored bytes, its data), checked against the recorded size and CRC-32
    (:func:`fastflip.files.formats.zipraw.entry_data`: a mismatch is refused, as ``np.load`` refuses the member)
    once it is one fastflip can rewrite."""
    check_rewritable(path, e, fh)
    return entry_data(path, e, fh, "np.load")


def member_npy_header(path: str, e: ZipEntry, fh: Any) -> tuple[Any, bool, tuple[int, ...], int]:
    """(dtype, fortran_order, shape, header length) of a deflated member, from its first inflated bytes."""
    fh.seek(e.offset)
    d = zlib.decompressobj(-15)
    head = b""
    try:
        while len(head) < min(e.info.file_size, (1 << 20) + 16) and not d.eof:
            chunk = fh.read(1 << 16)
            if not chunk:
                break
            head += d.decompress(chunk, (1 << 20) + 16 - len(head))
            if len(head) >= 16 and head[:6] == b"\x93NUMPY":
                hl = (struct.unpack("<H", head[8:10])[0] + 10 if head[6] == 1
                      else struct.unpack("<I", head[8:12])[0] + 12)
                if len(head) >= hl:
                    break
    except zlib.error as exc:
        raise FormatError(f"{path}: member {e.name} is not a valid deflate stream ({exc})") from None
    return npy_header(io.BytesIO(head), e.info.file_size, f"{path}:{e.name}")


def member_array(path: str, key: str) -> Any:
    """The array of the ``.npz`` member whose tensor path is ``key`` (``/name``), inflated and CRC-checked."""
    import numpy as np

    e = stored_entries(path).get(key[1:] + ".npy")
    if e is None:
        raise FormatError(f"{path}: no member {key[1:]}.npy")
    with open(path, "rb") as fh:
        _, data = read_member(path, e, fh)
    dt, _fortran, shape, hlen = npy_header(io.BytesIO(data), len(data), f"{path}:{e.name}")
    return np.frombuffer(data, dt, int(np.prod(shape)), hlen).reshape(shape)
