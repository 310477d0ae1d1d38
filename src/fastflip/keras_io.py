"""Keras ``.keras`` archives: safe access to the HDF5 weights file they hold.

A ``.keras`` file is a zip archive holding ``config.json``, ``metadata.json`` and
``model.weights.h5`` (the Keras 3 weights layout, optimizer variables included).
fastflip alters the inner HDF5 file and writes a new archive that Keras loads:

- only ``model.weights.h5`` is ever unpacked, into a private temporary directory,
  by streaming its bytes (never ``extractall``);
- an archive with an unsafe entry name (``..`` components, absolute paths, drive
  letters, backslashes) is refused as a whole, before anything is unpacked;
- the new archive keeps every other entry byte for byte, in order, with each
  entry's compression, and replaces the target atomically (a temporary file beside
  it renamed into place), so an error leaves the target untouched.

Examples
--------
>>> import os, tempfile, zipfile, h5py
>>> d = tempfile.mkdtemp()
>>> src = os.path.join(d, "m.keras")
>>> inner = os.path.join(d, "w.h5")
>>> with h5py.File(inner, "w") as f:
...     _ = f.create_dataset("layers/dense/vars/0", data=[1.0, 2.0])
>>> with zipfile.ZipFile(src, "w") as z:
...     z.writestr("config.json", "{}")
...     z.write(inner, "model.weights.h5")
>>> with edit_archive(src, os.path.join(d, "out.keras")) as weights:
...     with h5py.File(weights, "r+") as f:
...         f["layers/dense/vars/0"][0] = -1.0
>>> with read_archive(os.path.join(d, "out.keras")) as weights:
...     with h5py.File(weights, "r") as f:
...         print(f["layers/dense/vars/0"][:].tolist())
[-1.0, 2.0]
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from .errors import InputFileError, OutputError
from .fileio import atomic_output

__all__ = ["WEIGHTS_ENTRY", "UnsafeArchiveError", "is_keras_archive", "check_archive", "read_archive", "edit_archive",
           "inject_checkpoint_file"]

WEIGHTS_ENTRY = "model.weights.h5"
_DRIVE = re.compile(r"^[A-Za-z]:")


class UnsafeArchiveError(InputFileError):
    """A ``.keras`` archive holds an entry whose name could escape a directory."""


def is_keras_archive(path: str | os.PathLike) -> bool:
    """True when ``path`` is a zip file that is not a torch.save file or .npz (what a ``.keras`` file is), whatever its name.

    >>> is_keras_archive(__file__)
    False
    """
    try:
        if not zipfile.is_zipfile(path):
            return False
    except OSError:
        return False
    from .formats import FormatError, detect_format  # torch.save files and .npz are zips too

    try:
        return detect_format(path) == "keras"
    except FormatError:
        return True  # a damaged or foreign zip: check_archive names the problem


def _unsafe(name: str) -> bool:
    if not name or name.startswith(("/", "\\")) or "\\" in name or _DRIVE.match(name) or "\x00" in name:
        return True
    return any(part == ".." for part in PurePosixPath(name).parts)


def check_archive(path: str | os.PathLike) -> list[zipfile.ZipInfo]:
    """Validate a ``.keras`` archive and return its entries.

    Raises
    ------
    InputFileError
        Missing, not a zip, or without ``model.weights.h5``.
    UnsafeArchiveError
        An entry name holds ``..``, is absolute, or uses a drive letter or backslash.
    """
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"{path}: no such file")
    if not is_keras_archive(path):
        raise InputFileError(f"{path}: not a .keras archive (not a zip file)")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputFileError(f"{path}: damaged .keras archive: {exc}") from exc
    for info in infos:
        if _unsafe(info.filename):
            raise UnsafeArchiveError(f"{path}: refusing archive with unsafe entry name {info.filename!r}")
    names = [i.filename for i in infos]
    if names.count(WEIGHTS_ENTRY) != 1:
        raise InputFileError(
            f"{path}: a .keras archive needs exactly one {WEIGHTS_ENTRY} entry (found {names.count(WEIGHTS_ENTRY)})"
        )
    return infos


def _unpack_weights(path: Path, tmpdir: str) -> Path:
    dest = Path(tmpdir) / WEIGHTS_ENTRY
    with zipfile.ZipFile(path) as zf, zf.open(WEIGHTS_ENTRY) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return dest


@contextmanager
def read_archive(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to a copy of the archive's ``model.weights.h5`` (read it; changes are dropped)."""
    path = Path(path)
    check_archive(path)
    with tempfile.TemporaryDirectory(prefix="fastflip-keras-") as tmp:
        yield _unpack_weights(path, tmp)


@contextmanager
def edit_archive(path: str | os.PathLike, out: str | os.PathLike) -> Iterator[Path]:
    """Edit the weights file inside a ``.keras`` archive and write the result to ``out``.

    Yields a temporary path to the unpacked ``model.weights.h5``; alter it in the
    ``with`` block. On a clean exit a new archive (every other entry unchanged) is
    written atomically to ``out`` (which may equal ``path`` to rewrite in place);
    on an exception nothing is written.
    """
    path, out = Path(path), Path(out)
    infos = check_archive(path)
    with tempfile.TemporaryDirectory(prefix="fastflip-keras-") as tmp:
        weights = _unpack_weights(path, tmp)
        yield weights
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot write {out}: {exc}") from exc
        with atomic_output(out) as tmp_out:
            with zipfile.ZipFile(path) as zin, zipfile.ZipFile(tmp_out, "w") as zout:
                for info in infos:
                    if info.filename == WEIGHTS_ENTRY:
                        new = zipfile.ZipInfo(WEIGHTS_ENTRY, date_time=info.date_time)
                        new.compress_type = info.compress_type
                        new.external_attr = info.external_attr
                        big = os.path.getsize(weights) > 2**31 - 1
                        with zout.open(new, "w", force_zip64=big) as dst, open(weights, "rb") as src:
                            shutil.copyfileobj(src, dst, 1 << 20)
                    else:
                        zout.writestr(info, zin.read(info.filename))


def inject_checkpoint_file(src: str | os.PathLike, dst: str | os.PathLike, **inject_kwargs: Any) -> Any:
    """:func:`fastflip.inject.inject_file` for an HDF5 checkpoint or a ``.keras`` archive.

    A ``.keras`` archive is altered through its inner ``model.weights.h5`` and
    written to ``dst`` as a new archive; pass ``log_path`` to keep the log (the
    default log beside a temporary inner file would be lost).
    """
    from .inject import inject_file

    if is_keras_archive(src):
        with edit_archive(src, dst) as inner:
            return inject_file(inner, in_place=True, **inject_kwargs)
    return inject_file(src, dst, **inject_kwargs)
