"""Advisory writer locks on real files (by inode, not by name), with a record of who holds them.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

:class:`WriterLock` takes a Linux open-file-description lock (``F_OFD_SETLK``) on the whole
file: it belongs to the file (its inode), so a symlink or a hard link to the same file meets
the same lock, and it does not interfere with HDF5's own ``flock`` on the file (a process may
hold the lock and still open the file with h5py). A second writer is refused at once with a
:class:`~fastflip.errors.FileLockedError` naming the holder: the pid, command and start time
come from a small record ``.fastflip-<dev>-<inode>.lock`` in the folder of the real file (so
every name of the file in that folder finds it; a hard link in another folder meets the lock
but its message cannot name the pid). The record is removed on release; one left by a killed
process does no harm (the kernel drops the lock with the process, the next holder rewrites the
record) and :func:`fastflip.files.paths.sweep_stale` removes it.

Where OFD locks do not exist (non-Linux), ``fcntl.flock`` is used instead on a descriptor of
the file (also per inode).

Examples
--------
>>> import os, tempfile
>>> p = os.path.join(tempfile.mkdtemp(), "f.bin"); open(p, "wb").close()
>>> with WriterLock(p):
...     try:
...         with WriterLock(p):
...             pass
...     except FileLockedError as exc:
...         print("refused:", "pid %d" % os.getpid() in str(exc))
refused: True
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import struct
import sys
from typing import Any

from ..errors import FileLockedError, OutputError

__all__ = ["WriterLock", "lock_record_path", "FileLockedError"]


def lock_record_path(fd: int, real: str) -> str:
    """Where the holder's record of a lock on the open file ``fd`` (at ``real``) lives: by device and inode."""
    st = os.fstat(fd)
    return os.path.join(os.path.dirname(real), f".fastflip-{st.st_dev}-{st.st_ino}.lock")


def _try_lock(fd: int) -> bool:
    import fcntl

    if hasattr(fcntl, "F_OFD_SETLK"):
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOLCK):
                raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise


class WriterLock:
    """Exclusive advisory lock on the real file behind ``path`` while a writer works on it.

    Parameters
    ----------
    path : path
        The file to lock (it must exist; symlinks are resolved).
    what : str
        What the writer does (kept in the record, e.g. ``'inject --in-place'``).

    Raises
    ------
    FileLockedError
        Another process holds the lock; the message names its pid and command.
    OutputError
        The file cannot be opened for writing.
    """

    def __init__(self, path: str | os.PathLike[str], what: str | None = None) -> None:
        self.path = os.fspath(path)
        self.real = os.path.realpath(self.path)
        self.what = what or " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv[:3]))
        self.fd: int | None = None
        self._record: str | None = None

    def _holder(self, fd: int) -> str:
        try:
            with open(lock_record_path(fd, self.real)) as fh:
                rec = json.load(fh)
            return f"pid {int(rec['pid'])} ({rec.get('what', '?')}, since {rec.get('since', '?')})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def acquire(self) -> "WriterLock":
        for _ in range(8):
            try:
                fd = os.open(self.real, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
            except PermissionError:
                raise OutputError(f"{self.path}: not writable (permission denied); fix its permissions") from None
            except OSError as exc:
                raise OutputError(f"{self.path}: cannot open for writing ({exc.strerror or exc})") from None
            if not _try_lock(fd):
                holder = self._holder(fd)
                os.close(fd)
                raise FileLockedError(f"{self.path}: {holder} is writing this file; "
                                      "wait for it to finish (or stop it) and run again")
            try:  # the name may have been given another file (atomic rename) before we locked: lock that one
                same = os.stat(self.real).st_ino == os.fstat(fd).st_ino
            except OSError:
                same = False
            if same:
                self.fd = fd
                self._write_record(fd)
                return self
            os.close(fd)
        raise FileLockedError(f"{self.path}: the file keeps being replaced by another process; run again later")

    def _write_record(self, fd: int) -> None:
        rec = {"pid": os.getpid(), "what": self.what, "path": self.real,
               "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        path = lock_record_path(fd, self.real)
        try:
            with open(path, "w") as fh:
                fh.write(json.dumps(rec))
            self._record = path
        except OSError:
            self._record = None  # a read-only folder: the lock still holds, the message names no pid

    def release(self) -> None:
        if self._record is not None:
            try:
                with open(self._record) as fh:
                    mine = json.load(fh).get("pid") == os.getpid()
                if mine:
                    os.unlink(self._record)
            except (OSError, ValueError, AttributeError):
                pass
            self._record = None
        if self.fd is not None:
            os.close(self.fd)  # closing the description drops the lock
            self.fd = None

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
