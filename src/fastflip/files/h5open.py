"""Open an HDF5 file with every failure turned into a one-line fastflip error.

Imports: :mod:`fastflip.errors` (h5py lazily). Used by :mod:`fastflip.files.layout`,
:mod:`fastflip.files.roles` and the rest of the file layer.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import InputFileError, NotHDF5Error

__all__ = ["open_h5", "open_read_only"]


def open_h5(path: str | os.PathLike[str], mode: str = "r") -> Any:
    """Open an HDF5 file, turning every failure into a one-line fastflip error.

    Raises
    ------
    InputFileError
        The file does not exist or cannot be read.
    NotHDF5Error
        The file is not HDF5, or is truncated/damaged.
    """
    import h5py

    p = os.fspath(path)
    if not os.path.exists(p):
        raise InputFileError(f"{p}: file not found")
    if os.path.isdir(p):
        raise InputFileError(f"{p}: is a directory, not an HDF5 file")
    if not os.access(p, os.R_OK):
        raise InputFileError(f"{p}: permission denied")
    try:
        is_h5 = h5py.is_hdf5(p)
    except OSError as exc:
        raise InputFileError(f"{p}: cannot be read ({exc})") from None
    if not is_h5:
        import zipfile

        if zipfile.is_zipfile(p):
            raise NotHDF5Error(
                f"{p}: not an HDF5 file but a zip archive (a Keras .keras file? its weights are the "
                "model.weights.h5 inside)"
            )
        raise NotHDF5Error(f"{p}: not an HDF5 file (no HDF5 signature found)")
    if mode != "r" and not os.access(p, os.W_OK):
        raise InputFileError(f"{p}: not writable (permission denied)")
    try:
        return h5py.File(p, mode)
    except OSError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "unable to lock file" in first.lower():
            raise InputFileError(
                f"{p}: HDF5 file is locked ({first}); is another process writing it? "
                "(HDF5_USE_FILE_LOCKING=FALSE disables locking on file systems without it)"
            ) from None
        raise NotHDF5Error(f"{p}: truncated or damaged HDF5 file ({first})") from None


def open_read_only(path: str) -> Any:
    """The file's low-level ``FileID``, read-only (a third of the cost of an ``h5py.File`` open and close); a file
    HDF5 cannot open gets :func:`open_h5`'s one-line error. The caller closes it."""
    from h5py import h5f

    try:
        return h5f.open(os.fsencode(path), h5f.ACC_RDONLY)
    except OSError:
        return open_h5(path).id
