"""The entry points to ``.keras`` archives for inject, replay, revert and diff: the archive code
(:mod:`fastflip.files.keras_archive`, and with it zip reading and writing) is imported when a file is one.

Layer: ``files`` (may import core, kernels and files; imported by :mod:`fastflip.files.inject`,
:mod:`fastflip.files.replay`, :mod:`fastflip.files.revert`, :mod:`fastflip.files.diff` and above).

:func:`is_keras_archive` asks the format registry first (:func:`fastflip.files.formats.may_be_keras`: the first
bytes of the file), so a command on an HDF5, safetensors or npy file imports no zip code to learn that it is not
an archive. :func:`read_archive` and :func:`edit_archive` are those of :mod:`fastflip.files.keras_archive`.

>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "w.npy")
>>> np.save(p, np.zeros(2))
>>> is_keras_archive(p)
False
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ContextManager

from .formats import is_zip, may_be_keras

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["is_keras_archive", "read_archive", "edit_archive"]


def is_keras_archive(path: str | os.PathLike[str]) -> bool:
    """The answer of :func:`fastflip.files.keras_archive.is_keras_archive` (a zip that is not a torch.save file or
    ``.npz``) without importing it: False for a file whose content is another format, else whether it is a zip
    (a ``.keras`` archive, or a damaged or foreign zip that the archive code refuses in one line)."""
    # the content says another format (its zip directory listed once, if a zip); else keras_archive's pre-check
    return may_be_keras(path) and is_zip(path)


def read_archive(path: str | os.PathLike[str], **options: Any) -> ContextManager[Path]:
    """:func:`fastflip.files.keras_archive.read_archive`: a temporary copy of the archive's weights file."""
    from .keras_archive import read_archive as read

    return read(path, **options)


def edit_archive(path: str | os.PathLike[str], out: str | os.PathLike[str], **options: Any) -> ContextManager[Path]:
    """:func:`fastflip.files.keras_archive.edit_archive`: alter the archive's weights file, write a new archive."""
    from .keras_archive import edit_archive as edit

    return edit(path, out, **options)
