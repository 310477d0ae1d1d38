"""A file's bytes read in blocks: hashes, hashed copies, hashes predicted for patches, byte diffs and undo, and
copies made in the kernel.

Layer: ``files``. Every pass reads the file once, in blocks of 8 MiB (memory stays flat): :func:`hash_file` (with
:mod:`fastflip.files.hashcache`), :func:`copy_with_hash`, :func:`hash_with_patches` (the hash now and the hash once
patched, from one read), and :func:`byte_diff` (the :class:`ByteUndo` that turns an altered copy back into its
original, or the original into the copy). :class:`SpanCopier` copies byte spans of one file to the same offsets of
another in the kernel (``os.copy_file_range``: the bytes never pass through this process), falling back to bytes
the caller holds or to a buffer where the kernel refuses; :func:`kernel_copy` copies a whole file with it.

Examples
--------
>>> import os, tempfile
>>> d = tempfile.mkdtemp(); p = os.path.join(d, "a.bin")
>>> _ = open(p, "wb").write(b"hello")
>>> sha256_file(p)[:12]
'2cf24dba5fb0'
>>> import hashlib
>>> now, after = hash_with_patches(p, [(0, b"h", b"j")])
>>> now == sha256_file(p), after == hashlib.sha256(b"jello").hexdigest()
(True, True)
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import LogMismatchError
from . import hashcache, hashing
from .fileio import start_writeback
from .rangeio import read_at, write_at, write_ranges

__all__ = ["sha256_file", "hash_file", "overlay_patches", "hash_with_patches", "copy_with_hash", "ByteUndo",
           "byte_diff", "SpanCopier", "kernel_copy"]

_BLOCK = 8 << 20


def sha256_file(path: str | os.PathLike[str], *, cache: bool = True) -> str:
    """Hex sha256 of a file: :func:`hash_file` with sha256."""
    return hash_file(path, "sha256", cache=cache)


def hash_file(path: str | os.PathLike[str], algorithm: str | None = None, *, cache: bool = True) -> str:
    """Hex digest of a file with ``algorithm`` (default :func:`fastflip.files.hashing.default_algorithm`), read in
    blocks (memory stays flat).

    With ``cache`` (default), a file hashed before and unchanged since (same device, inode, size,
    mtime and ctime, and no shared writable mapping: see :mod:`fastflip.files.hashcache`) is not read
    again. ``cache=False`` reads the bytes: for a file that is about to be changed, or was just written.
    """
    p = os.fspath(path)
    name = algorithm or hashing.default_algorithm()
    st0, t0 = os.stat(p), time.time()
    known = hashcache.lookup(p, st0, name) if cache else None
    if known is not None:
        return known
    h = hashing.new(name)
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    with open(p, "rb") as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
    digest = h.hexdigest()
    if cache and hashcache.same_state(st0, os.stat(p)):
        hashcache.remember(p, st0, digest, t0, name)
    return digest


def overlay_patches(base: int, data: bytes, patches: Sequence[tuple[int, bytes, bytes]]) -> bytearray:
    """``data`` (the file's bytes from offset ``base``) with the new bytes of the ``(offset, old, new)`` patches
    laid over the part of each that falls inside it."""
    buf = bytearray(data)
    end = base + len(buf)
    for off, _, nb in [p for p in patches if p[0] < end and p[0] + len(p[2]) > base]:
        lo, hi = max(off, base), min(off + len(nb), end)
        buf[lo - base : hi - base] = nb[lo - off : hi - off]
    return buf


def hash_with_patches(path: str, patches: "list[tuple[int, bytes, bytes]]", algorithm: str = "sha256", *,
                      copy_to: str | None = None, feed: Any = None) -> tuple[str, str]:
    """(digest of the file now, digest it will have once each same-size ``(offset, old, new)`` patch is
    written), from one read of its bytes (the cache is not used: the file is about to change).

    ``copy_to``: the bytes read are also written, unpatched, to that file (a copy about to be patched). ``feed``:
    its ``feed(offset, bytes)`` is handed the bytes read, unpatched, in file order (a zip members' CRC-32 check,
    :class:`fastflip.files.formats.zipcrc.MemberCrcs`).
    """
    ps = sorted(patches)
    starts = np.array([p[0] for p in ps], np.int64)
    ends = starts + np.array([len(p[2]) for p in ps], np.int64)
    from concurrent.futures import ThreadPoolExecutor

    h_in, h_out = hashing.new(algorithm), hashing.new(algorithm)
    base = 0
    pending: list[Any] = []
    with open(path, "rb") as fh, (open(copy_to, "wb") if copy_to else contextlib.nullcontext()) as out, \
            ThreadPoolExecutor(2) as helper:  # the second hash and the copy side by side with the read
        while True:
            b = fh.read(_BLOCK)
            if not b:
                break
            for f in pending:
                f.result()
            pending = [helper.submit(out.write, b)] if out is not None else []
            if feed is not None:
                feed.feed(base, memoryview(b))
            h_in.update(b)
            end = base + len(b)
            hit = np.flatnonzero((starts < end) & (ends > base)).tolist()
            if hit:
                b = bytes(overlay_patches(base, b, [ps[k] for k in hit]))
            pending.append(helper.submit(h_out.update, b))
            base = end
        for f in pending:
            f.result()
    return h_in.hexdigest(), h_out.hexdigest()


def copy_with_hash(src: str, dst: str, algorithm: str = "sha256") -> str:
    """Copy ``src`` to ``dst`` in blocks and return the digest of the bytes copied (one read pass)."""
    h = hashing.new(algorithm)
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while True:
            n = fin.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            fout.write(view[:n])
    return h.hexdigest()


@dataclass
class ByteUndo:
    """The byte ranges in which an altered copy differs from its original, with both versions.

    ``apply`` (undo) writes the original bytes back and truncates to ``size``;
    ``redo`` writes the altered bytes and sets the length to ``new_size``. Either
    turns one file into the other exactly, whatever HDF5 wrote (re-encoded chunks,
    moved blocks, or bytes it leaves uninitialised).
    """

    offsets: np.ndarray  # int64 start of each range
    lengths: np.ndarray  # int64 length of each range (old and new versions alike; past a file's end, the other's)
    data: bytes  # original bytes of all ranges that lie inside the original, concatenated
    size: int  # original file size
    new_data: bytes = b""  # altered bytes of all ranges that lie inside the altered file
    new_size: int = -1  # altered file size (-1: unknown, redo impossible)

    def _write(self, path: str, data: bytes, limit: int, size: int, durable: bool = True) -> None:
        with open(path, "r+b") as fh:  # each range's bytes that lie before ``limit``, in one pass
            write_ranges(fh.fileno(), self.offsets, np.clip(np.minimum(self.lengths, limit - self.offsets), 0, None),
                         data)
            fh.truncate(size)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())

    def apply(self, path: str, durable: bool = True) -> None:
        """Undo: the original bytes again (``durable=False``: not fsynced, for a scratch copy such as a campaign's
        working copy)."""
        self._write(path, self.data, self.size, self.size, durable)

    def redo(self, path: str) -> None:
        """Redo: the altered bytes again (on a copy of the original)."""
        if self.new_size < 0:
            raise LogMismatchError("this delta holds no altered bytes (a log written before redo data was kept)")
        with open(path, "r+b") as fh:
            fh.truncate(max(self.new_size, os.fstat(fh.fileno()).st_size))
        self._write(path, self.new_data, self.new_size, self.new_size)


def byte_diff(original: str, altered: str) -> ByteUndo:
    """Compare two files block by block and record every differing byte range, both versions."""
    offsets: list[int] = []
    lengths: list[int] = []
    old_chunks: list[bytes] = []
    new_chunks: list[bytes] = []
    size = os.path.getsize(original)
    new_size = os.path.getsize(altered)
    common = min(size, new_size)
    with open(original, "rb") as fa, open(altered, "rb") as fb:
        base = 0
        while base < common:
            a = fa.read(min(_BLOCK, common - base))
            b = fb.read(len(a))
            if a != b:
                diff = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
                # group differing bytes into ranges (gaps of < 16 bytes are merged)
                brk = np.flatnonzero(np.diff(diff) > 16)
                starts = np.concatenate([[diff[0]], diff[brk + 1]])
                ends = np.concatenate([diff[brk], [diff[-1]]]) + 1
                for s_, e in zip(starts.tolist(), ends.tolist()):
                    offsets.append(base + s_)
                    lengths.append(e - s_)
                    old_chunks.append(a[s_:e])
                    new_chunks.append(b[s_:e])
            base += len(a)
        if size != new_size:  # the tail only one of them has
            offsets.append(common)
            lengths.append(abs(size - new_size))
            (old_chunks if size > new_size else new_chunks).append((fa if size > new_size else fb).read())
    return ByteUndo(np.array(offsets, np.int64), np.array(lengths, np.int64), b"".join(old_chunks), size,
                    b"".join(new_chunks), new_size)


# ----------------------------------------------------------------------------------- copies made in the kernel

_PIECE = 16 << 20  # bytes per copy_file_range call (and per writeback request)
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF}


def _copy_range(fd_in: int, fd_out: int, at: int, n: int) -> int:
    """Copy ``n`` bytes at offset ``at`` of one file to the same offset of another in the kernel
    (``os.copy_file_range``); the bytes copied before the kernel refused (another file system, an old kernel):
    ``n`` when it never did."""
    done = 0
    while done < n:
        try:
            got = os.copy_file_range(fd_in, fd_out, n - done, at + done, at + done)
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY:
                raise
            return done
        if not got:
            raise OSError(errno.EIO, f"the input ended {n - done} bytes early while it was copied")
        done += got
    return done


class SpanCopier:
    """Copies byte spans of the open file ``fd_in`` to the same offsets of ``fd_out``.

    Each span goes file to file in the kernel (``os.copy_file_range``) while the kernel accepts; where it refuses
    (another file system, an old kernel: ``EXDEV``, ``ENOSYS``...), that span's rest and every later span are
    written from the bytes the caller already holds (``held``) or else read here through a buffer (bytes a caller
    that also reads the input then reads twice); the kernel is not asked again. Other errors (``EIO``, ``ENOSPC``) surface. ``writeback=True`` (an
    output that will be fsynced) asks the kernel to start writing each span to disk at once
    (:func:`fastflip.files.fileio.start_writeback`), so the fsync at the commit waits for little.
    """

    def __init__(self, fd_in: int, fd_out: int, *, writeback: bool = False) -> None:
        self.fd_in, self.fd_out, self.writeback = fd_in, fd_out, writeback
        self.in_kernel = hasattr(os, "copy_file_range")
        self._buf: bytearray | None = None

    def copy(self, at: int, n: int, held: Any = None, *, fall_back: bool = True) -> bool:
        """Copy the ``n`` bytes at ``at``; ``held`` (a buffer of those bytes, optional) is written where the
        kernel refuses. With ``fall_back=False`` a refusal leaves the span to the caller: False is returned and
        nothing is written from here."""
        done = _copy_range(self.fd_in, self.fd_out, at, n) if self.in_kernel else 0
        if done < n:
            self.in_kernel = False
            if not fall_back:
                return False
            if held is not None:
                write_at(self.fd_out, at + done, [memoryview(held).cast("B")[done:n]])
            else:
                self._read_through(at + done, n - done)
        if self.writeback:
            start_writeback(self.fd_out, at, n)
        return True

    def write(self, at: int, pieces: Sequence[Any]) -> None:
        """Write ``pieces`` from offset ``at`` of the output (changed bytes: never through the kernel copy)."""
        n = write_at(self.fd_out, at, pieces)
        if self.writeback:
            start_writeback(self.fd_out, at, n)

    def _read_through(self, at: int, n: int) -> None:
        if self._buf is None:
            self._buf = bytearray(min(_PIECE, n))
        view = memoryview(self._buf)
        while n:
            k = min(n, len(view))
            got = read_at(self.fd_in, view[:k], at)
            if got != k:  # the file ended (a short read is read on)
                raise OSError(errno.EIO, f"the input ended {n - got} bytes early while it was copied")
            write_at(self.fd_out, at, [view[:k]])
            at, n = at + k, n - k


def kernel_copy(src: str, dst: str, *, writeback: bool = False, piece: int = _PIECE) -> int:
    """Copy the file ``src`` over ``dst`` file to file in the kernel, piece by piece (:class:`SpanCopier`): its
    bytes never pass through this process where the OS can do that; return the bytes copied.

    Where the OS has no ``copy_file_range``, ``shutil.copyfile`` copies it (its fastest way there).
    """
    if not hasattr(os, "copy_file_range"):
        import shutil  # only on systems without copy_file_range

        shutil.copyfile(src, dst)
        return os.path.getsize(dst)
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        size = os.fstat(fin.fileno()).st_size
        copier = SpanCopier(fin.fileno(), fout.fileno(), writeback=writeback)
        for at in range(0, size, piece):
            copier.copy(at, min(piece, size - at))
    return size
