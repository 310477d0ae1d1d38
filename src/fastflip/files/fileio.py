"""Safe file handling: atomic outputs, hashing, copying, byte-level undo records.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Outputs are written to a temporary file beside the target, flushed and fsync'ed,
then renamed over the target (and the directory fsync'ed); on any error the
temporary file is removed and the target is untouched.

Examples
--------
>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with atomic_output(os.path.join(d, "out.bin")) as tmp:
...     with open(tmp, "wb") as fh:
...         _ = fh.write(b"hello")
>>> sorted(os.listdir(d)), sha256_file(os.path.join(d, "out.bin"))[:12]
(['out.bin'], '2cf24dba5fb0')
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import (
    DiskFullError,
    FastflipError,
    InputFileError,
    LogMismatchError,
    MissingExtraError,
    OutputError,
    one_line,
)
from ..kernels.environment import missing_extra
from . import hashcache
from .paths import sweep_stale, temp_prefix

__all__ = ["atomic_output", "write_error", "as_fastflip_error", "sha256_file", "copy_with_hash", "check_input", "check_output_dir", "ByteUndo",
           "byte_diff", "fsync_path"]

_BLOCK = 8 << 20


def check_input(path: str | os.PathLike[str]) -> str:
    """Return ``path`` as a string if it is an existing readable regular file, else raise InputFileError."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise InputFileError(f"{p}: file not found; check the path")
    if not os.path.isfile(p):
        raise InputFileError(f"{p}: not a regular file")
    if not os.access(p, os.R_OK):
        raise InputFileError(f"{p}: not readable; check its permissions")
    return p


def check_output_dir(path: str | os.PathLike[str]) -> str:
    """Raise OutputError unless the directory that will hold ``path`` exists and is writable."""
    p = os.fspath(path)
    d = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(d):
        raise OutputError(f"{p}: output directory {d} does not exist; create it first")
    if not os.access(d, os.W_OK):
        raise OutputError(f"{p}: output directory {d} is not writable; choose another output path")
    if os.path.isdir(p):
        raise OutputError(f"{p}: is a directory; give a file name")
    return p


def fsync_path(path: str) -> None:
    """fsync a file or directory by path (directories: best effort)."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if os.path.isdir(path) else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(target: str | os.PathLike[str], *, suffix: str = "", durable: bool = True) -> Iterator[str]:
    """Yield a temporary path beside ``target``; on success fsync it and rename it onto ``target``.

    ``durable=False`` skips the fsyncs (the rename is still atomic: readers see the old
    or the new file, never a partial one) — for scratch files such as an experiment's
    per-run checkpoint copies, where a crash may lose them but never corrupt them.
    """
    target = check_output_dir(target)
    d = os.path.dirname(os.path.abspath(target))
    sweep_stale(d)  # temporaries a killed run left here
    try:
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp" + suffix, dir=d)
    except OSError as exc:
        raise write_error(target, exc) from None
    os.close(fd)
    try:
        yield tmp
        if durable:
            fsync_path(tmp)
        if os.path.exists(target):
            try:
                os.chmod(tmp, os.stat(target).st_mode & 0o7777)
            except OSError:
                pass
        else:
            os.chmod(tmp, new_file_mode())
        os.replace(tmp, target)
        if durable:
            fsync_path(d)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, FastflipError):
            if exc.errno is None and _full(d):  # h5py reports a failed write without errno
                exc = OSError(errno.ENOSPC, f"No space left on device ({one_line(exc)})")
            if exc.errno in _WRITE_ERRNOS:
                raise write_error(target, exc) from None
        raise


def _full(directory: str) -> bool:
    """True when the file system holding ``directory`` has (almost) no free blocks left."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (64 << 10)


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO}


def write_error(target: str, exc: OSError) -> OutputError:
    """The one-line error for an OS failure while writing ``target`` (disk full, too large, permission...)."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"{target}: disk full while writing ({reason}); free space and run again "
                             "(nothing was written)")
    if exc.errno == errno.EFBIG:
        return OutputError(f"{target}: file too large for this file system ({reason}); nothing was written")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return OutputError(f"{target}: cannot write ({reason}); check permissions or choose another path")
    return OutputError(f"{target}: write failed ({reason}); nothing was written")


def as_fastflip_error(exc: BaseException, subject: str) -> FastflipError | None:
    """Map an exception from h5py, zipfile, zlib, JSON/text decoding or OS I/O to a one-line FastflipError
    naming ``subject`` (the file being worked on); None for exceptions that are not about a file (bugs).

    >>> str(as_fastflip_error(OSError(28, "No space left on device"), "out.h5"))
    'out.h5: disk full while writing (No space left on device); free space and run again (nothing was written)'
    """
    import zipfile
    import zlib

    if isinstance(exc, FastflipError):
        return exc
    if isinstance(exc, ImportError):
        advice = missing_extra(exc)
        return MissingExtraError(f"{subject}: {advice}") if advice else None
    first = one_line(exc)
    if isinstance(exc, OSError):
        name = exc.filename if isinstance(exc.filename, str) else subject
        if exc.errno in _WRITE_ERRNOS:
            return write_error(name, exc)
        return InputFileError(f"{name}: cannot read or use the file ({first})")
    if isinstance(exc, UnicodeDecodeError):
        return InputFileError(f"{subject}: not a text file (binary bytes where text was expected); check the path")
    if isinstance(exc, (zipfile.BadZipFile, zlib.error, EOFError)):
        return InputFileError(f"{subject}: damaged archive or compressed data ({first})")
    if isinstance(exc, MemoryError):
        return InputFileError(f"{subject}: needs more memory than is available (declared sizes too large?)")
    if isinstance(exc, (OverflowError, RecursionError)):
        return InputFileError(f"{subject}: declared sizes or nesting beyond what can be handled ({first})")
    origin = _origins(exc)
    if "h5py" in origin:
        return InputFileError(f"{subject}: damaged HDF5 file ({first})")
    if "zipfile" in origin:
        return InputFileError(f"{subject}: damaged zip archive ({first})")
    return None


def _origins(exc: BaseException) -> set[str]:
    """Which of h5py / zipfile the traceback of ``exc`` passes through (their own checks of damaged input)."""
    out: set[str] = set()
    tb = exc.__traceback__
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if "/h5py/" in fn or fn.startswith("h5py/"):
            out.add("h5py")
        if fn.endswith("/zipfile.py") or "/zipfile/" in fn:
            out.add("zipfile")
        tb = tb.tb_next
    return out


def process_umask() -> int:
    """The process's umask, read without changing it where the system tells (Linux ``/proc``).

    Elsewhere it is read by setting and restoring it, which briefly changes it for every thread.
    """
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """Permission bits of a new regular file under the process's umask (as ``open(..., 'w')`` gives)."""
    return 0o666 & ~process_umask()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in blocks (memory stays flat).

    A file hashed before and unchanged since (same device, inode, size, mtime and ctime)
    is not read again: see :mod:`fastflip.files.hashcache`.
    """
    p = os.fspath(path)
    st0, t0 = os.stat(p), time.time()
    known = hashcache.lookup(p, st0)
    if known is not None:
        return known
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while True:
            b = fh.read(_BLOCK)
            if not b:
                break
            h.update(b)
    digest = h.hexdigest()
    if hashcache.same_state(st0, os.stat(p)):
        hashcache.remember(p, st0, digest, t0)
    return digest


def copy_with_hash(src: str, dst: str) -> str:
    """Copy ``src`` to ``dst`` in blocks and return the sha256 of the bytes copied (one read pass)."""
    h = hashlib.sha256()
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

    def _write(self, path: str, data: bytes, limit: int, size: int) -> None:
        with open(path, "r+b") as fh:
            pos = 0
            for off, ln in zip(self.offsets.tolist(), self.lengths.tolist()):
                n = max(0, min(ln, limit - off))
                if n:
                    fh.seek(off)
                    fh.write(data[pos : pos + n])
                pos += n
            fh.truncate(size)
            fh.flush()
            os.fsync(fh.fileno())

    def apply(self, path: str) -> None:
        """Undo: the original bytes again."""
        self._write(path, self.data, self.size, self.size)

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
