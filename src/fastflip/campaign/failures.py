"""Failures that are not trial outcomes: out of memory and the environment.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

A fault can make a model raise (an index out of range, a shape check): that trial is a DUE. But an
evaluator that runs out of memory, cannot import a module or finds a file missing says nothing about
the fault; counting it as a DUE would bias the campaign's rates. :func:`environment_failure` names such
errors and the trial runner raises :class:`TrialAborted` for them: the sweep stops with one line,
keeps every finished trial, and a rerun resumes (``docs/outcomes.md``).

>>> environment_failure(MemoryError()), environment_failure(ModuleNotFoundError("x")), environment_failure(IndexError())
('out of memory', 'an import failed', None)
"""

from __future__ import annotations

import errno

from ..errors import FastflipError

__all__ = ["TrialAborted", "environment_failure", "is_oom"]

#: OSError numbers that are the machine's state, not the trial's (a corrupted file read in checkpoint mode
#: raises OSErrors without these and stays a DUE).
_ENV_ERRNOS = {errno.ENOSPC, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EROFS, errno.EACCES, errno.EPERM,
               errno.ENOENT, getattr(errno, "EDQUOT", errno.ENOSPC)}


class TrialAborted(FastflipError):
    """An evaluator failed for a reason outside the trial; the sweep stops (finished trials are kept)."""


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (host or device)."""
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    return name == "OutOfMemoryError" or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def environment_failure(exc: BaseException) -> str | None:
    """Why ``exc`` is not a trial outcome (out of memory, an import, the file system), or None (it is a DUE)."""
    if is_oom(exc):
        return "out of memory"
    if isinstance(exc, ImportError):
        return "an import failed"
    if isinstance(exc, OSError) and (isinstance(exc, (FileNotFoundError, PermissionError))
                                     or exc.errno in _ENV_ERRNOS):
        return "the environment failed"
    return None
