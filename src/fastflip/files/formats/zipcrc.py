"""CRC-32 fields of zip entries updated from the changed words alone (cost follows the flips).

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Zip archives (torch.save files, ``.npz``) record each entry's CRC-32 in its local header,
its central-directory record and, when flag bit 3 is set, a data descriptor. After
words inside a stored entry change, these fields must change too, or readers that
check them (Python's ``zipfile``, ``np.load``) refuse the file.

CRC-32 is affine over GF(2): for messages of equal length,
``crc(M xor D) = crc(M) xor L(D)`` where ``L`` is the register process run from state 0
without the final xor. ``D`` is zero except at the changed words, so ``L(D)`` is the XOR,
over changed words, of (the register after the word's delta bytes) advanced over the
zero bytes that follow it in the entry — an advance by ``k`` zero bytes is a 32×32 GF(2)
matrix, ``Z**k``, applied by square-and-multiply, vectorised over all sites. No entry data
is read. (The same algebra is zlib's ``crc32_combine``.)

Examples
--------
>>> import zlib, numpy as np
>>> msg = bytearray(b"hello world, hello zip")
>>> new = bytearray(msg); new[6] ^= 0x20; new[7] ^= 0x01
>>> delta = crc_delta(np.array([6]), np.array([0x0120], np.uint64), np.array([2]), len(msg))
>>> (zlib.crc32(msg) ^ delta) == zlib.crc32(new)
True
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Collection, Iterator

import numpy as np

from ...errors import FormatError, UnsupportedStorageError
from ..rangeio import read_at
from .zipraw import ZipEntry, central_records, crc_refusal, directory, stored_entries

__all__ = ["ZipIndex", "zip_index", "MemberCrcs", "crc_delta", "entry_crc_deltas", "zip_crc_patches", "crc_spots", "descriptor_at",
           "check_patch_bytes", "check_every_crc"]

_POLY = 0xEDB88320
_READ = 1 << 22  # bytes read at a time by MemberCrcs.read


@dataclass(frozen=True)
class ZipIndex:
    """One reading of a zip's central directory and local headers, for the CRC work of one inject (the check of the
    touched members, the CRC-field patches): ``entries`` in data order, ``starts`` their data offsets, ``records``
    each entry's central-directory record (:func:`fastflip.files.formats.zipraw.central_records`). Valid while the
    file's directory and headers stay as read: the words an inject writes and their CRC fields keep every offset."""

    entries: list[ZipEntry]
    starts: np.ndarray
    records: dict[str, int]

    def holding(self, offsets: np.ndarray) -> np.ndarray:
        """Index into ``entries`` of the entry whose data starts at or before each absolute file offset (-1:
        before the first)."""
        return np.searchsorted(self.starts, np.asarray(offsets, np.int64), side="right") - 1


def zip_index(path: str) -> ZipIndex:
    """The :class:`ZipIndex` of the zip at ``path``: its directory read once (:func:`fastflip.files.formats.zipraw.directory`).

    Raises
    ------
    FormatError
        A damaged or crafted archive (:func:`fastflip.files.formats.zipraw.stored_entries`,
        :func:`~fastflip.files.formats.zipraw.central_records`).
    """
    try:
        listing = directory(path)
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError, RuntimeError) as exc:
        raise FormatError(f"{path}: damaged or truncated zip archive ({exc}); nothing was read") from None
    entries = sorted(stored_entries(path, listing=listing).values(), key=lambda e: e.offset)
    return ZipIndex(entries, np.array([e.offset for e in entries], np.int64), central_records(path, listing))


@lru_cache(maxsize=1)
def _table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint64)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ _POLY, t >> 1)
    return t.astype(np.uint64)


@lru_cache(maxsize=1)
def _zero_powers() -> list[np.ndarray]:
    """Z**(2**k), k = 0..63, as byte tables (4 × 256 words each), where Z advances the register over one
    zero byte: a matrix times v is the XOR of the tables' entries for v's four bytes."""
    tab = _table()
    e = np.uint64(1) << np.arange(32, dtype=np.uint64)
    cols = tab[(e & np.uint64(0xFF)).astype(np.int64)] ^ (e >> np.uint64(8))  # Z applied to each basis vector
    out = []
    for _ in range(64):
        out.append(_byte_tables(cols))
        cols = _apply_cols(cols, cols)  # (Z^m)^2: apply the matrix to its own columns
    return out


def _apply_cols(cols: np.ndarray, v: np.ndarray) -> np.ndarray:
    """GF(2) matrix (columns ``cols``) times each 32-bit vector in ``v`` (bit by bit: for building tables)."""
    r = np.zeros_like(v)
    for j in range(32):
        r ^= np.where((v >> np.uint64(j)) & np.uint64(1), cols[j], np.uint64(0))
    return r


def _byte_tables(cols: np.ndarray) -> np.ndarray:
    b = np.arange(256, dtype=np.uint64)
    return np.stack([_apply_cols(cols, b << np.uint64(8 * j)) for j in range(4)])


def _apply(tables: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The matrix of ``tables`` times each 32-bit vector in ``v``: four lookups and three XORs."""
    i = v.astype(np.int64)
    return tables[0][i & 0xFF] ^ tables[1][(i >> 8) & 0xFF] ^ tables[2][(i >> 16) & 0xFF] ^ tables[3][(i >> 24) & 0xFF]


def crc_delta(offsets: np.ndarray, deltas: np.ndarray, widths: np.ndarray, length: int) -> int:
    """``crc32(M) ^ crc32(M')`` for a message of ``length`` bytes whose bytes at ``offsets[i]`` ..
    ``offsets[i] + widths[i] - 1`` changed by ``deltas[i]`` (little-endian: byte k = bits 8k..8k+7)."""
    offsets = np.asarray(offsets, np.int64)
    deltas = np.asarray(deltas, np.uint64)
    widths = np.asarray(widths, np.int64)
    if not len(offsets):
        return 0
    tab = _table()
    v = np.zeros(len(offsets), np.uint64)
    for k in range(int(widths.max())):
        live = widths > k
        b = (deltas >> np.uint64(8 * k)) & np.uint64(0xFF)
        step = tab[((v ^ b) & np.uint64(0xFF)).astype(np.int64)] ^ (v >> np.uint64(8))
        v = np.where(live, step, v)
    rest = (length - offsets - widths).astype(np.uint64)
    for k, tables in enumerate(_zero_powers()):
        bit = (rest >> np.uint64(k)) & np.uint64(1)
        if not bit.any():
            if not (rest >> np.uint64(k)).any():
                break
            continue
        at = np.flatnonzero(bit)
        v[at] = _apply(tables, v[at])
    return int(np.bitwise_xor.reduce(v))


def _stored_delta_bytes(old: np.ndarray, new: np.ndarray, itemsize: np.ndarray, big: np.ndarray) -> np.ndarray:
    """old ^ new as the stored bytes read little-endian (big-endian words byte-reversed)."""
    d = np.asarray(old, np.uint64) ^ np.asarray(new, np.uint64)
    out = d.copy()
    for w in (2, 4, 8):
        at = np.flatnonzero(big & (itemsize == w))
        if len(at):
            u = d[at].astype(f"<u{w}")
            out[at] = u.byteswap().astype(np.uint64)
    return out


def entry_crc_deltas(index: ZipIndex, offsets: np.ndarray, deltas: np.ndarray, widths: np.ndarray,
                     path: str | None = None) -> Iterator[tuple[ZipEntry, int]]:
    """Per entry of ``index`` holding one of the absolute file ``offsets`` (words of ``widths`` bytes whose stored
    bytes change by the XOR ``deltas``, read little-endian): the entry and the change of its CRC-32 those words
    make (:func:`crc_delta`), in data order. ``path``: the file a refusal names, for a caller about to patch it;
    without it, offsets before the first entry are skipped and nothing is refused.

    Raises
    ------
    UnsupportedStorageError
        (``path``) A word outside every stored entry, or reaching past its entry's end.
    """
    which = index.holding(offsets)
    for i in np.unique(which).tolist():
        if i < 0:
            if path is None:
                continue
            raise UnsupportedStorageError(f"{path}: a changed word lies outside every stored entry")
        e, at = index.entries[i], np.flatnonzero(which == i)
        if path is not None and ((offsets[at] + widths[at] > e.offset + e.size).any() or not e.stored):
            raise UnsupportedStorageError(f"{path}: a changed word lies outside stored entry {e.name}")
        yield e, crc_delta(offsets[at] - e.offset, deltas[at], widths[at], e.size)


def zip_crc_patches(path: str, offsets: np.ndarray, itemsize: np.ndarray, big: np.ndarray, old: np.ndarray,
                    new: np.ndarray, index: ZipIndex | None = None) -> list[tuple[int, bytes, bytes]]:
    """(file offset, old 4 bytes, new 4 bytes) of every CRC field that changes when the words at
    absolute ``offsets`` change from ``old`` to ``new`` (native-order word values); ``index``: the caller's
    :func:`zip_index` of ``path`` (else it is read here)."""
    index = index if index is not None else zip_index(path)
    offsets = np.asarray(offsets, np.int64)
    deltas = _stored_delta_bytes(old, new, np.asarray(itemsize), np.asarray(big, bool))
    patches: list[tuple[int, bytes, bytes]] = []
    with open(path, "rb") as fh:
        for e, dcrc in entry_crc_deltas(index, offsets, deltas, np.asarray(itemsize), path):
            if not dcrc:
                continue
            ob, nb = struct.pack("<I", e.info.CRC), struct.pack("<I", e.info.CRC ^ dcrc)
            patches.extend((s, ob, nb) for s in crc_spots(fh, e, index.records[e.name]))
        check_patch_bytes(path, fh, patches)
    patches.sort()
    return patches


class MemberCrcs:
    """The CRC-32 of the stored entries of a zip that hold some file offsets, worked out from their bytes as a
    reader hands them over (:meth:`feed`, in file order: a copy's one pass over the file, or :meth:`read`), then
    compared with the recorded ones (:meth:`verify`): ``np.load`` refuses an entry that does not match it.
    ``label``: the file a refusal names (default ``path``; a campaign names the checkpoint its scratch copy is of)."""

    def __init__(self, path: str, entries: list[ZipEntry]) -> None:
        self.path, self.entries, self.label = path, entries, path
        self.crcs, self.seen = [0] * len(entries), [0] * len(entries)
        self._at = 0  # the first entry not yet fed in full

    @classmethod
    def holding(cls, path: str, offsets: np.ndarray, index: ZipIndex | None = None) -> "MemberCrcs":
        """The stored entries of the zip at ``path`` that hold one of the absolute file ``offsets`` (deflated ones
        are checked where they are inflated); ``index``: the caller's :func:`zip_index` (else it is read here)."""
        offsets = np.asarray(offsets, np.int64)
        if not len(offsets):
            return cls(path, [])
        index = index if index is not None else zip_index(path)
        which = np.unique(index.holding(offsets))
        return cls(path, [e for e in (index.entries[i] for i in which[which >= 0].tolist()) if e.stored])

    def feed(self, base: int, data: memoryview) -> None:
        """The file's bytes ``data`` from offset ``base``; successive calls hand over increasing offsets."""
        end = base + len(data)
        while self._at < len(self.entries):
            e = self.entries[self._at]
            if e.offset >= end:
                return
            lo, hi = max(e.offset, base), min(e.offset + e.size, end)
            if hi > lo:
                self.crcs[self._at] = zlib.crc32(data[lo - base : hi - base], self.crcs[self._at])
                self.seen[self._at] += hi - lo
            if e.offset + e.size > end:
                return
            self._at += 1

    def read(self) -> None:
        """Read each entry from the file once, in blocks, and :meth:`feed` it."""
        if not self.entries:
            return
        buf = memoryview(bytearray(min(_READ, max([e.size for e in self.entries] or [0]))))
        with open(self.path, "rb", buffering=0) as fh:  # read, not mapped: a file truncated meanwhile is a short read
            for e in self.entries:
                at = e.offset
                while at < e.offset + e.size:
                    n = read_at(fh.fileno(), buf[:min(e.offset + e.size - at, len(buf))], at)
                    if not n:
                        break
                    self.feed(at, buf[:n])
                    at += n

    def verify(self) -> None:
        """Refuse the archive at the first entry whose bytes, as fed, are not its recorded CRC-32 (or were not all
        fed: a file truncated meanwhile).

        Raises
        ------
        FormatError
            :func:`fastflip.files.formats.zipraw.crc_refusal` of that entry (``np.load`` refuses it).
        """
        for e, crc, n in zip(self.entries, self.crcs, self.seen):
            if n != e.size or crc != e.info.CRC:
                raise crc_refusal(self.label, e.name, "np.load")

    def check(self) -> None:
        """:meth:`read`, then :meth:`verify`: the entries read from the file by themselves."""
        self.read()
        self.verify()


def check_every_crc(path: str, reader: str = "np.load") -> None:
    """Read every member of the zip at ``path`` as ``zipfile`` reads it (in blocks; the CRC-32 checked at each
    member's end) and refuse the archive at the first member ``zipfile``, and so ``reader``, refuses: a read of the
    whole archive, for a listing that must agree with the framework's reading of every member. Members whose
    compression ``zipfile`` cannot undo are left to the caller (it skips or refuses them).

    Raises
    ------
    FormatError
        A member whose bytes do not match its CRC-32 (:func:`fastflip.files.formats.zipraw.crc_refusal`), or one
        that does not decompress.
    """
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            try:
                with z.open(info) as fh:
                    while fh.read(1 << 22):
                        pass
            except (NotImplementedError, RuntimeError):  # a method zipfile lacks, or encrypted: not read here
                continue
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
                if "CRC" in str(exc):
                    raise crc_refusal(path, info.filename, reader) from None
                raise FormatError(f"{path}: member {info.filename} does not decompress ({str(exc)[:120]}): the "
                                  f"archive is damaged ({reader} refuses this member); re-save it") from None


def check_patch_bytes(path: str, fh, patches: list[tuple[int, bytes, bytes]],  # type: ignore[no-untyped-def]
                      read: Collection[int] = ()) -> None:
    """Refuse patches whose "old bytes" are not the file's bytes there, or that overlap one another: the log keeps
    the old bytes for the revert, so they must be exactly what the patch replaces.

    ``read`` holds the offsets of patches whose old bytes the caller has just read from ``fh`` at that offset
    (a deflated member's stored bytes): they are not read again, only checked for overlap.
    """
    last_end, last_at = -1, -1
    for at, old, _new in sorted(patches, key=lambda p: p[0]):
        if at not in read:
            fh.seek(at)
            if fh.read(len(old)) != old:
                raise FormatError(f"{path}: the zip fields at byte {at} do not hold what the directory says (the file "
                                  "is damaged or crafted); nothing was written")
        if at < last_end and at != last_at:
            raise FormatError(f"{path}: zip fields overlap at byte {at} (the file is damaged or crafted); nothing "
                              "was written")
        last_end, last_at = max(last_end, at + len(old)), at


def descriptor_at(fh, e: "ZipEntry") -> int | None:  # type: ignore[no-untyped-def]
    """File offset of the CRC field of the entry's data descriptor (flag bit 3), or None without one."""
    if not e.info.flag_bits & 0x08:
        return None
    end = e.offset + e.info.compress_size
    fh.seek(end)
    return end + (4 if fh.read(4) == b"PK\x07\x08" else 0)  # the signature is optional


def crc_spots(fh, e: "ZipEntry", cd_record: int, check: bool = True) -> list[int]:  # type: ignore[no-untyped-def]
    """File offsets of every copy of the entry's CRC-32: central directory, local header (unless it defers
    to a data descriptor), data descriptor. ``check=False``: where they lie by the directory (the local header's
    always, the descriptor's unchecked), whatever they hold now, for a reader of a log whose file may hold either
    CRC (a direct injection killed part-way may have written some of them).

    Raises
    ------
    FormatError
        (``check``) A data descriptor (flag bit 3) whose CRC field does not hold the entry's CRC-32: patching it
        would write over bytes that are not a CRC, and the log could not restore them.
    """
    spots = [cd_record + 16]
    fh.seek(e.info.header_offset + 14)
    if not check or fh.read(4) == struct.pack("<I", e.info.CRC):
        spots.append(e.info.header_offset + 14)
    desc = descriptor_at(fh, e)
    if desc is not None:
        fh.seek(desc)
        if check and fh.read(4) != struct.pack("<I", e.info.CRC):
            raise FormatError(f"zip entry {e.name!r}: its data descriptor does not hold the entry's CRC-32 (the file "
                              "is damaged or crafted); nothing was written")
        spots.append(desc)
    return spots
