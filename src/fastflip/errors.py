"""The exception hierarchy of fastflip.

Every error fastflip raises on purpose derives from :class:`FastflipError`; each
subclass also derives from the matching built-in exception so that callers can
catch either (a missing dataset is also a :class:`KeyError`). The CLI turns any
:class:`FastflipError` into one line on stderr and a non-zero exit.

Examples
--------
>>> from fastflip.errors import SelectionError, FastflipError
>>> issubclass(SelectionError, LookupError) and issubclass(SelectionError, FastflipError)
True
"""

from __future__ import annotations

__all__ = [
    "FastflipError",
    "MissingExtraError",
    "DeviceError",
    "RepackError",
    "OptionError",
    "InputFileError",
    "NotHDF5Error",
    "FormatError",
    "UnsafeInputError",
    "SelectionError",
    "TensorNotFoundError",
    "CapacityError",
    "BitRangeError",
    "UnsupportedStorageError",
    "LogMismatchError",
    "OutputError",
    "NaNPolicyError",
    "PlanMismatchError",
    "ReadOnlyTargetError",
    "StaleTargetError",
    "StoreError",
    "CheckpointMismatchError",
    "FileLockedError",
    "one_line",
    "DiskFullError",
    "IndexRangeError",
]


class FastflipError(Exception):
    """Base class of every error fastflip raises on purpose."""


class OptionError(FastflipError, ValueError):
    """An option or argument has an invalid value (names the option and the fix)."""


class InputFileError(FastflipError, OSError):
    """An input file is missing, unreadable or damaged."""


class NotHDF5Error(InputFileError):
    """A file is not a (complete) HDF5 file."""


class SelectionError(FastflipError, LookupError):
    """A selector matched no tensor; the message names what was available."""


class TensorNotFoundError(FastflipError, KeyError):
    """A named tensor does not exist in the file or model."""

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return str(self.args[0]) if self.args else ""


class CapacityError(FastflipError, ValueError):
    """More injection sites were asked for than exist."""


class BitRangeError(FastflipError, ValueError):
    """A bit position lies outside the width of a dtype."""


class UnsupportedStorageError(FastflipError, ValueError):
    """A dataset's storage cannot be modified safely (external links or raw storage)."""


class LogMismatchError(FastflipError, ValueError):
    """An injection log does not match the file or tensors it is applied to."""


class OutputError(FastflipError, OSError):
    """An output path cannot be written."""


class NaNPolicyError(FastflipError, ValueError):
    """The NaN/Inf avoidance policy could not be satisfied."""


class PlanMismatchError(FastflipError, ValueError):
    """A plan does not fit the tensors it is applied to (name, shape or dtype)."""


class ReadOnlyTargetError(FastflipError, ValueError):
    """A live tensor cannot be written (read-only array)."""


class StaleTargetError(FastflipError, RuntimeError):
    """A live tensor's storage was replaced since its targets were built (rebuild them)."""


class StoreError(FastflipError, OSError):
    """A results store is corrupt, foreign, newer, or locked by another sweep."""


class CheckpointMismatchError(FastflipError, ValueError):
    """A checkpoint does not fit the model it is loaded into (names the tensor)."""


class FileLockedError(FastflipError, OSError):
    """Another process is writing the file (or store); the message names it (pid, command)."""


class DiskFullError(OutputError):
    """The disk (or quota) filled up while writing; nothing half-written was left behind."""


class IndexRangeError(FastflipError, IndexError):
    """An element index lies outside its tensor."""


class MissingExtraError(FastflipError, ImportError):
    """The work needs an optional extra (a framework, Numba, matplotlib, ...) that is not installed."""


class DeviceError(FastflipError, RuntimeError):
    """A GPU kernel could not be compiled or launched (no NVRTC, a CUDA error); nothing stays flipped."""


class RepackError(FastflipError, RuntimeError):
    """A ``torch.ao`` packed module refused its new words (its repack raised); the model keeps its state from
    before the call that wrote them (names the module and the cause)."""


class FormatError(NotHDF5Error):
    """A file whose format fastflip does not know, or whose structure is damaged or inconsistent.

    (A :class:`NotHDF5Error`, so callers that expect HDF5 catch it as well.)
    """


class UnsafeInputError(InputFileError):
    """A file that asks for something fastflip refuses to do (run pickled code, write outside the file)."""


def one_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (its type name when empty).

    >>> one_line(OSError("disk full\\nmore detail"))
    'disk full'
    """
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
