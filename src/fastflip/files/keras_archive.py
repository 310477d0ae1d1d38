"""Keras ``.keras`` archives: safe access to the HDF5 weights file they hold.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A ``.keras`` file is a zip archive holding ``config.json``, ``metadata.json`` and
``model.weights.h5`` (the Keras 3 weights layout, optimizer variables included).
fastflip alters the inner HDF5 file and writes a new archive that Keras loads:

- only ``model.weights.h5`` is ever unpacked, into a private temporary directory,
  by streaming its bytes (never ``extractall``);
- an archive with an unsafe entry name (``..`` components, absolute paths, drive
  letters, backslashes) is refused as a whole, before anything is unpacked;
- the new archive keeps every other entry byte for byte, in order, with each
  entry's compression, the archive comment and any bytes before the first entry (offsets
  counted from where the archive counted them), and replaces the target atomically (a temporary file beside
  it renamed into place), so an error leaves the target untouched;
- an archive with two entries of one name is refused (which copy a reader takes is
  not defined, so it could not be kept exactly);
- every member is streamed in blocks, never read whole, under limits on its inflated
  size and its compression ratio (:data:`LIMITS`; environment variables
  ``FASTFLIP_ARCHIVE_MAX_BYTES`` and ``FASTFLIP_ARCHIVE_MAX_RATIO``, or the ``limits``
  argument): a zip bomb is refused with one line, memory stays flat.

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

import contextlib
import os
import re
import shutil
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Iterator

from ..errors import InputFileError, OutputError
from .fileio import Staging, atomic_output
from .formats import (  # torch.save files and .npz are zips too
    FormatError,
    detect_format,
    is_zip,
)
from .formats.zipraw import stored_entries
from .paths import make_temp_dir

_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)

__all__ = ["WEIGHTS_ENTRY", "UnsafeArchiveError", "ArchiveLimits", "LIMITS", "is_keras_archive", "check_archive",
           "read_archive", "edit_archive"]

WEIGHTS_ENTRY = "model.weights.h5"
_DRIVE = re.compile(r"^[A-Za-z]:")
_BLOCK = 1 << 20


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds on one archive member: inflated bytes, and inflated/compressed ratio (members over 1 MiB).

    Deflate cannot exceed a ratio of about 1032, so the default ratio bound never refuses an
    honest deflated archive; it stops bzip2/lzma bombs. The byte bound caps disk use.
    """

    max_bytes: int = 64 << 30
    max_ratio: float = 1100.0

    @classmethod
    def from_env(cls) -> "ArchiveLimits":
        """Defaults, overridden by ``FASTFLIP_ARCHIVE_MAX_BYTES`` / ``FASTFLIP_ARCHIVE_MAX_RATIO``."""
        d = cls()
        try:
            return cls(int(os.environ.get("FASTFLIP_ARCHIVE_MAX_BYTES", d.max_bytes)),
                       float(os.environ.get("FASTFLIP_ARCHIVE_MAX_RATIO", d.max_ratio)))
        except ValueError:
            raise InputFileError("FASTFLIP_ARCHIVE_MAX_BYTES / FASTFLIP_ARCHIVE_MAX_RATIO must be numbers") from None


LIMITS = ArchiveLimits()


def _limits(limits: ArchiveLimits | None) -> ArchiveLimits:
    return limits if limits is not None else ArchiveLimits.from_env()


def _zip_error(path: Any, exc: BaseException) -> InputFileError:
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    return InputFileError(f"{path}: damaged .keras archive ({first})")


def _stream_member(path: Any, zin: zipfile.ZipFile, info: zipfile.ZipInfo, dst: IO[bytes],
                   limits: ArchiveLimits) -> int:
    """Copy one member's inflated bytes to ``dst`` in blocks, enforcing ``limits``; return the byte count."""
    def refuse(n: int) -> InputFileError:
        return InputFileError(f"{path}: archive member {info.filename!r} inflates past the limit "
                              f"({n} bytes, {limits.max_bytes} allowed, ratio bound {limits.max_ratio:g}); "
                              "refusing it (raise FASTFLIP_ARCHIVE_MAX_BYTES / _MAX_RATIO if it is genuine)")

    def over(n: int) -> bool:
        return n > limits.max_bytes or (n > _BLOCK and n > limits.max_ratio * max(1, info.compress_size))

    if over(info.file_size):
        raise refuse(info.file_size)
    total = 0
    try:
        with zin.open(info) as src:
            while True:
                b = src.read(_BLOCK)
                if not b:
                    break
                total += len(b)
                if over(total):
                    raise refuse(total)
                dst.write(b)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError) as exc:
        raise _zip_error(path, exc) from None
    return total


class UnsafeArchiveError(InputFileError):
    """A ``.keras`` archive holds an entry whose name could escape a directory."""


def is_keras_archive(path: str | os.PathLike) -> bool:
    """True when ``path`` is a zip file that is not a torch.save file or .npz (what a ``.keras`` file is), whatever its name.

    >>> is_keras_archive(__file__)
    False
    """
    return _is_keras(path, None)


def _is_keras(path: str | os.PathLike, names: list[str] | None) -> bool:
    """:func:`is_keras_archive`, given the entry names when the caller has listed them already."""
    if not is_zip(path):
        return False
    try:
        return detect_format(path, zip_names=names) == "keras"
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
    try:  # the one reading of the central directory: kind, entry checks and local headers all use it
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as exc:
        _refuse_other_kind(path, None)
        raise _zip_error(path, exc) from None
    with zf:
        _refuse_other_kind(path, zf.namelist())
        infos = zf.infolist()
        _check_entries(path, infos)
        stored_entries(str(path), zf)  # local headers inside the file, agreeing with the directory, not overlapping
    return infos


def _refuse_other_kind(path: Path, names: list[str] | None) -> None:
    """Refuse a file that is not a ``.keras`` archive (``names``: its entry names when already listed)."""
    if not _is_keras(path, names):
        raise InputFileError(f"{path}: not a .keras archive (not a zip file)")


def _check_entries(path: Path, infos: list[zipfile.ZipInfo]) -> None:
    """Refuse unsafe names, compression methods fastflip cannot rewrite, duplicate names, and anything but one
    weights entry."""
    for info in infos:
        if _unsafe(info.filename):
            raise UnsafeArchiveError(f"{path}: refusing archive with unsafe entry name {info.filename!r}")
    odd = [i for i in infos if i.compress_type not in _METHODS]
    if odd:
        raise InputFileError(f"{path}: archive entry {odd[0].filename!r} uses compression method "
                             f"{odd[0].compress_type}, which fastflip cannot rewrite (stored, deflate, bzip2, lzma)")
    names = [i.filename for i in infos]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputFileError(f"{path}: archive holds entry {dup[0]!r} more than once (which copy counts is "
                             "undefined); refusing it")
    if not names or (WEIGHTS_ENTRY not in names and any(n.endswith(".npy") for n in names)):
        detect_format(path, zip_names=names)  # empty, or taken for an .npz (with a text member): says so, and why
    if names.count(WEIGHTS_ENTRY) != 1:
        raise InputFileError(
            f"{path}: taken for a .keras archive (a zip that is neither a torch.save file nor an .npz), but a .keras "
            f"archive needs exactly one {WEIGHTS_ENTRY} entry (found {names.count(WEIGHTS_ENTRY)})"
        )


def _unpack_weights(path: Path, tmpdir: str, limits: ArchiveLimits) -> Path:
    dest = Path(tmpdir) / WEIGHTS_ENTRY
    try:
        with zipfile.ZipFile(path) as zf, open(dest, "wb") as dst:
            _stream_member(path, zf, zf.getinfo(WEIGHTS_ENTRY), dst, limits)
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise _zip_error(path, exc) from None
    try:
        kind = detect_format(dest)
    except FormatError:
        kind = "unknown"
    if kind != "hdf5":  # named by the archive: the temporary copy means nothing to the user
        raise FormatError(f"{path}: its {WEIGHTS_ENTRY} is not an HDF5 file (damaged or foreign .keras archive)")
    return dest


@contextmanager
def _temp_dir() -> Iterator[str]:
    """A private ``$TMPDIR/fastflip-keras-<pid>-*`` folder, removed on exit (stale ones of dead runs swept)."""
    d = make_temp_dir("keras")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextmanager
def read_archive(path: str | os.PathLike, *, limits: ArchiveLimits | None = None) -> Iterator[Path]:
    """Yield a temporary path to a copy of the archive's ``model.weights.h5`` (read it; changes are dropped)."""
    path = Path(path)
    check_archive(path)
    with _temp_dir() as tmp:
        yield _unpack_weights(path, tmp, _limits(limits))


@contextmanager
def edit_archive(path: str | os.PathLike, out: str | os.PathLike, *,
                 limits: ArchiveLimits | None = None, stage: Staging | None = None) -> Iterator[Path]:
    """Edit the weights file inside a ``.keras`` archive and write the result to ``out``.

    Yields a temporary path to the unpacked ``model.weights.h5``; alter it in the
    ``with`` block. On a clean exit a new archive (every other entry unchanged) is
    written atomically to ``out`` (which may equal ``path`` to rewrite in place);
    on an exception nothing is written. Members are streamed under ``limits``. With a ``stage``
    (:class:`fastflip.files.fileio.Staging`) the new archive is staged there, renamed when it commits
    (after the log that describes it), not at the end of the block.
    """
    path, out = Path(path), Path(out)
    lim = _limits(limits)
    infos = check_archive(path)
    with _temp_dir() as tmp:
        weights = _unpack_weights(path, tmp, lim)
        yield weights
        if not out.parent.is_dir():
            raise OutputError(f"{out}: output directory {out.parent} does not exist; create it first")
        with contextlib.ExitStack() as own:
            tmp_out = stage.add(out) if stage is not None else own.enter_context(atomic_output(out))
            with zipfile.ZipFile(path) as zin, open(tmp_out, "wb") as raw:
                _copy_prefix(path, infos, raw)
                with zipfile.ZipFile(_Shifted(raw, _offset_base(path, zin)), "w") as zout:
                    zout.comment = zin.comment
                    _write_members(path, zin, zout, infos, weights, lim)


class _Shifted:
    """A file seen from ``base`` on: the zip writer then records offsets counted as the original archive's were
    (from its first byte, or from the end of a prefix that was prepended to it)."""

    def __init__(self, fh: IO[bytes], base: int) -> None:
        self._fh, self._base = fh, base

    def write(self, b: bytes) -> int:
        return self._fh.write(b)

    def tell(self) -> int:
        return self._fh.tell() - self._base

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._fh.seek(pos + self._base if whence == 0 else pos, whence) - self._base

    def flush(self) -> None:
        self._fh.flush()


def _offset_base(path: Path, zin: zipfile.ZipFile) -> int:
    """Where the archive's recorded offsets count from: 0, or the length of a prefix prepended after it was
    written (``cat stub.sh model.keras``), which readers add to every offset."""
    end = getattr(zipfile, "_EndRecData", None)
    if end is None:
        return 0
    with open(path, "rb") as fh:
        rec = end(fh)
    if not rec:
        return 0
    return max(0, int(zin.start_dir) - int(rec[zipfile._ECD_OFFSET]))  # type: ignore[attr-defined]


def _copy_prefix(path: Path, infos: list[zipfile.ZipInfo], dst: IO[bytes]) -> None:
    """Copy the bytes before the archive's first entry (a launcher stub, a self-extractor) to ``dst``."""
    size = min((i.header_offset for i in infos), default=0)
    with open(path, "rb") as src:
        while size > 0:
            b = src.read(min(size, _BLOCK))
            if not b:
                break
            dst.write(b)
            size -= len(b)


def _write_members(path: Path, zin: zipfile.ZipFile, zout: zipfile.ZipFile, infos: list[zipfile.ZipInfo],
                   weights: Path, lim: ArchiveLimits) -> None:
    """Write every entry of ``zin`` to ``zout`` in order, ``model.weights.h5`` from the file ``weights``."""
    for info in infos:
        new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
        new.compress_type = info.compress_type
        new.external_attr = info.external_attr
        new.comment = info.comment
        strip = getattr(zipfile, "_strip_extra", None)  # the writer adds its own zip64 record
        new.extra = strip(info.extra, (0x0001,)) if strip is not None else b""
        if info.filename == WEIGHTS_ENTRY:
            big = os.path.getsize(weights) > 2**31 - 1
            with zout.open(new, "w", force_zip64=big) as dst, open(weights, "rb") as src:
                shutil.copyfileobj(src, dst, _BLOCK)
        else:
            with zout.open(new, "w", force_zip64=info.file_size > 2**31 - 1) as dst:
                _stream_member(path, zin, info, dst, lim)
