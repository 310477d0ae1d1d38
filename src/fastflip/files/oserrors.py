"""OS, h5py, zip and decoding errors as one-line errors (:class:`~fastflip.errors.FastflipError`) naming the file.

Layer: ``files``. :func:`write_error` for a failed write (disk full, too large, permissions), used by the commits
of :mod:`fastflip.files.fileio`; :func:`as_fastflip_error` for any exception met while working on a file (the CLI's
last line of defence).

>>> str(write_error("out.h5", OSError(30, "Read-only file system")))
'out.h5: cannot write (Read-only file system); check permissions or choose another path'
"""

from __future__ import annotations

import errno
import os

from ..errors import DiskFullError, FastflipError, InputFileError, MissingExtraError, OutputError, one_line
from ..kernels.environment import missing_extra

__all__ = ["WRITE_ERRNOS", "write_error", "as_fastflip_error"]

# The errnos of a failed write (reported by write_error rather than as a bug).
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO}


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
        if exc.errno in WRITE_ERRNOS:
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
