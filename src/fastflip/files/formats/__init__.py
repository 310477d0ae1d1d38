"""Checkpoint formats by content: one "where are the bytes" contract per format.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Every reader turns a file into a :class:`fastflip.files.layout.Layout` whose tensors say
where their bytes lie in the file (``storage='contiguous'`` and an absolute byte
``offset``: element ``i`` at ``offset + i * itemsize``), with dtype, shape, aliases,
layer and role. The raw path of :mod:`fastflip.files.h5apply` then injects, replays and
reverts any of them the same way, exactly and atomically.

Formats (detected by content, never by the file name):

``hdf5``
    HDF5 signature at byte 0 (or a user block of 512·2^k bytes); walked by :mod:`fastflip.files.layout`.
``torch``
    ``torch.save`` zip archive (``<name>/data.pkl`` + stored ``<name>/data/<key>`` entries);
    the pickle is read by a restricted reader that never runs code (:mod:`.torchsave`).
``torch-legacy``
    the pre-1.6 ``torch.save`` format: pickles then raw storages, read the same way (:mod:`.torchlegacy`).
``safetensors``
    8-byte little-endian header length, a JSON header, one raw buffer (:mod:`.safetensors_io`).
``npy`` / ``npz``
    NumPy array files and uncompressed zip archives of them (:mod:`.numpy_io`).
``keras``
    A Keras 3 ``.keras`` zip: handled by :mod:`fastflip.files.keras_archive` (its inner HDF5 file).

This package sits in the file layer: it imports :mod:`fastflip.core.records` and
:mod:`fastflip.errors` only (no framework; torch is never imported to read a file). Its readers import
nothing from this registry (:class:`~fastflip.errors.FormatError` lives in :mod:`fastflip.errors`), so the
registry can import each reader when a file of its format is read.

Examples
--------
>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "w.bin")    # the extension does not matter
>>> np.save(open(p, "wb"), np.arange(4, dtype="<f4"))
>>> detect_format(p)
'npy'
>>> t = read_layout(p).tensors[0]
>>> t.path, t.storage, t.offset
('/array', 'contiguous', 128)
"""

from __future__ import annotations

import os
import struct
from typing import Sequence

from ...errors import FormatError, InputFileError, NotHDF5Error, UnsafeInputError
from ...core.records import Layout

__all__ = ["FORMATS", "FormatError", "UnsafeInputError", "detect_format", "read_layout", "supported_formats_line",
           "may_be_keras", "is_zip"]

FORMATS = ("hdf5", "torch", "torch-legacy", "safetensors", "npy", "npz", "keras")
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
NPY_MAGIC = b"\x93NUMPY"
# pickle protocol 2, then the LONG1 magic number 0x1950a86a20f9469cfc6c of the legacy torch.save format
TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"


def supported_formats_line() -> str:
    return ("HDF5 (.h5, .weights.h5, torch layout, Chainer), torch.save (.pt/.pth, zip and legacy), safetensors, "
            "NumPy .npy/.npz, Keras .keras")


def _has_hdf5_signature(fh, size: int) -> bool:  # type: ignore[no-untyped-def]
    off = 0
    while off + 8 <= size:
        fh.seek(off)
        if fh.read(8) == HDF5_SIGNATURE:
            return True
        off = 512 if off == 0 else off * 2
    return False


def _zip_kind(path: str, names: Sequence[str] | None = None) -> str:
    if names is None:
        import zipfile  # a zip's central directory is listed only for a file that starts like a zip

        from .zipraw import directory  # the one parse of the central directory (kept for the reader)

        try:
            names = [info.filename for info in directory(path)[0]]
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as exc:
            raise FormatError(f"{path}: damaged or truncated zip archive ({exc}); nothing was read") from None
    if any(n.endswith("/data.pkl") and n.count("/") == 1 for n in names) or "data.pkl" in names:
        return "torch"
    if "model.weights.h5" in names:
        return "keras"
    if names and all(n.endswith(".npy") for n in names):
        return "npz"
    if not names:
        raise FormatError(f"{path}: an empty zip archive (no members): no tensors to read")
    other = next(n for n in names if not n.endswith(".npy"))
    if any(n.endswith(".npy") for n in names):
        raise FormatError(f"{path}: taken for an .npz (a zip of .npy arrays), but its member {other!r} is not a .npy "
                          "array; fastflip reads .npz archives whose every member is one (save them with np.savez)")
    raise FormatError(f"{path}: a zip archive but not a torch.save file (no data.pkl), an .npz (no .npy members) or "
                      f"a .keras archive (no model.weights.h5); supported formats: {supported_formats_line()}")


def detect_format(path: str | os.PathLike[str], *, zip_names: Sequence[str] | None = None) -> str:
    """The format of the file at ``path`` from its first bytes (one of :data:`FORMATS`).

    A zip archive's kind follows from its entry names; a caller that has already listed them
    (its own :class:`zipfile.ZipFile` open) passes them as ``zip_names`` and the central
    directory is not read again.

    Raises
    ------
    InputFileError
        The file is missing or unreadable.
    FormatError
        The content matches no supported format (the message names them), or a zip is damaged.
    """
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise InputFileError(f"{p}: file not found" if not os.path.exists(p) else f"{p}: not a regular file")
    try:
        size = os.path.getsize(p)
        with open(p, "rb") as fh:
            head = fh.read(16)
            if _has_hdf5_signature(fh, size):
                return "hdf5"
    except OSError as exc:
        raise InputFileError(f"{p}: cannot be read ({exc.strerror or exc})") from None
    if head.startswith(NPY_MAGIC):
        return "npy"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return _zip_kind(p, zip_names)
    if head.startswith(TORCH_LEGACY_MAGIC):
        return "torch-legacy"
    if len(head) >= 9:
        (n,) = struct.unpack("<Q", head[:8])
        if n + 8 <= size and head[8:9] == b"{":
            return "safetensors"
    raise FormatError(f"{p}: not an HDF5 file nor another known checkpoint format (no known signature); supported formats: {supported_formats_line()}")


def may_be_keras(path: str | os.PathLike[str]) -> bool:
    """False when the file at ``path`` is by its content another format than a ``.keras`` archive (HDF5,
    safetensors, npy, torch.save, .npz): then :func:`fastflip.files.keras_archive.is_keras_archive` is False too,
    and a caller need not import the archive code to ask. True for a ``.keras`` archive and wherever the content
    does not decide (a missing or unreadable path, a directory, a damaged zip).

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "w.npy")
    >>> np.save(p, np.zeros(2))
    >>> may_be_keras(p), may_be_keras(os.path.dirname(p))
    (False, True)
    """
    try:
        return detect_format(path) == "keras"
    except (FormatError, InputFileError):
        return True


def is_zip(path: str | os.PathLike[str]) -> bool:
    """Whether ``zipfile`` reads ``path`` as a zip (its end record found); False where ``zipfile.is_zipfile`` says
    no or raises (an unreadable path, a directory, a ZIP64 locator that names several disks): no archive the
    ``.keras`` code reads. The one zip pre-check of :func:`fastflip.files.archives.is_keras_archive` (after
    :func:`may_be_keras`) and :mod:`fastflip.files.keras_archive`."""
    import zipfile  # only for content that may be a .keras archive: a command on another format imports no zip code

    try:
        return zipfile.is_zipfile(path)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return False


def read_layout(path: str | os.PathLike[str], fmt: str | None = None, *, verify: bool = False) -> Layout:
    """The :class:`~fastflip.files.layout.Layout` of a non-HDF5 checkpoint (format detected unless given).

    HDF5 files go through :func:`fastflip.files.layout.read_layout` (which calls this for other formats).
    ``verify``: read an ``.npz``'s members too, refusing one ``np.load`` refuses (a bad CRC-32).
    """
    p = os.fspath(path)
    fmt = fmt or detect_format(p)
    if fmt == "torch":
        from .torchsave import read_torch_layout

        return read_torch_layout(p)
    if fmt == "safetensors":
        from .safetensors_io import read_safetensors_layout

        return read_safetensors_layout(p)
    if fmt in ("npy", "npz"):
        from .numpy_io import read_numpy_layout

        return read_numpy_layout(p, fmt, verify)
    if fmt == "torch-legacy":
        from .torchlegacy import read_legacy_layout

        return read_legacy_layout(p)
    if fmt == "keras":
        raise FormatError(f"{p}: a Keras .keras archive; its tensors are in the model.weights.h5 inside "
                          "(fastflip inspect/inject handle .keras archives)")
    raise FormatError(f"{p}: format {fmt!r} has no tensor reader; supported formats: {supported_formats_line()}")
