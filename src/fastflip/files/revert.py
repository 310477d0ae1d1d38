"""Revert a logged injection: the original bytes of a file given back, checked against the log.

Layer: ``files``. The Python API behind ``fastflip revert``; the injection itself is
:mod:`fastflip.files.inject`.

Examples
--------
>>> import os, tempfile, numpy as np, h5py
>>> from fastflip.files.inject import inject_file
>>> d = tempfile.mkdtemp(); src = os.path.join(d, "in.h5"); out = os.path.join(d, "out.h5")
>>> with h5py.File(src, "w") as f:
...     _ = f.create_dataset("w", data=np.ones((8, 8), "f4"))
>>> res = inject_file(src, out, seed=3, count=4, bits="sign")
>>> r = revert(res.log_path, out)
>>> r.digest == res.log.manifest["input"]["hash"], r.verified
(True, True)
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import FastflipError, LogMismatchError
from . import hashing
from .filebytes import copy_with_hash, hash_file, hash_with_patches
from .fileio import atomic_output, check_input, deferred_signals, fsync_path
from .fingerprint import revert_regions
from .h5apply import read_words, route_sites
from .archives import edit_archive
from .layout import read_layout
from .log import InjectionLog
from .outputs import REVERT_SAME, in_container, load_log, log_files, output_target, refuse_dir, writer_lock
from .logwords import check_log_words, check_words, has_encoded, log_routes
from .patches import restore_words, revert_patches, write_patches

__all__ = ["RevertResult", "revert", "revert_archive", "revert_into"]


@dataclass
class RevertResult:
    """What :func:`revert` restored.

    ``verified`` is True when the restored file's hash (``algorithm``, the one the log names) was compared
    with the logged input's
    (and the reverted file's with the logged output's); False when the log holds no hashes and
    ``verify=False`` allowed the revert anyway (only the words at the logged sites were checked).
    """

    output: str
    digest: str
    sites: int
    verified: bool = True
    algorithm: str = "sha256"
    evidence: str = "file"  # "regions": a direct in-place log's touched ranges, size and fingerprint were checked

    @property
    def sha256(self) -> str | None:
        """The digest when the log's algorithm is sha256 (None otherwise)."""
        return self.digest if self.algorithm == "sha256" else None


def _revert_target(src: str, out: Any, overwrite: bool, inputs: Sequence[str]) -> str:
    """The path a revert writes: ``src`` itself (``out`` None), else the checked output ``out``."""
    if out is None:
        return output_target(src, None, True)
    return output_target(src, out, False, overwrite, inputs, REVERT_SAME)


def revert(log: InjectionLog | str | os.PathLike[str], file: str | os.PathLike[str],
           out: str | os.PathLike[str] | None = None, *, atomic: bool | None = None, verify: bool = True,
           overwrite: bool = True) -> RevertResult:
    """Restore the original bytes of ``file`` (the logged output) and verify them against the logged input sha256.

    ``file`` is changed in place (atomically, under a :class:`fastflip.files.locks.WriterLock`) unless
    ``out`` is given (``overwrite``, default True, allows replacing an existing ``out``). With
    ``atomic=False`` the file is rewritten directly, but only after its bytes — read now, never a cached
    hash — are checked to be the logged output.

    A log with region evidence (``hash_files="regions"``, a direct in-place injection or a new file; see
    :mod:`fastflip.files.fingerprint`) is checked by its touched byte ranges, size and head/tail fingerprint
    instead of whole-file hashes, and (``atomic`` not True, no ``out``) reverted directly: only the touched
    ranges are rewritten (where every site is stored raw; a log with sites in re-encoded chunks or members is
    reverted in a copy whose words are read back first). The log's ranges are checked against its own recorded
    words before anything is written (:mod:`fastflip.files.logwords`). The result says ``evidence="regions"``. With ``verify=False`` a file of the logged
    size that fails those checks gets the logged original bytes of the touched ranges anyway; the result is
    still checked, and ``verified`` says whether it is the logged input (False: written, not proven).

    A log without hashes (``hash_files=False``) cannot prove the restored file is the original:
    it is refused unless ``verify=False``; then only the words at the logged sites are checked
    and the result says ``verified=False``.

    Raises
    ------
    LogMismatchError
        When ``file`` is not the logged output (its sha256 or its words differ), or the log holds no
        hashes and ``verify`` is True; nothing is changed.
    """
    lg = load_log(log)
    refuse_dir(file, lg)
    src = check_input(file)
    algo, want_in, want_out = hashing.logged_hashes(lg.manifest)  # one line, nothing changed, when unusable here
    regions = lg.manifest.get("evidence") == "regions" and not (want_in and want_out)
    if regions and not in_container(lg):  # a direct in-place injection: its touched ranges and fingerprint
        with writer_lock(src, "revert", out is None):
            target = _revert_target(src, out, overwrite, log_files(log))
            routes = _routes(lg, src)
            encoded = routes is None or has_encoded(routes)  # checked in the copy, once written (the words read back)
            direct = out is None and atomic is not True and not encoded
            proven = revert_regions(lg, src, target, direct, verify,
                                    before=(lambda path: check_log_words(lg, path, src, routes=routes))
                                    if verify and not encoded else None,
                                    after=(lambda path: check_words(lg, path, src, "input", routes))
                                    if verify and encoded else None)
        return RevertResult(target, "", len(lg.plan), proven, algo, evidence="regions")
    _require_hashes(src, verify, want_in, want_out)
    if in_container(lg):
        return revert_archive(lg, src, None if out is None else os.fspath(out), overwrite=overwrite,
                              log_inputs=log_files(log), want_in=want_in, want_out=want_out, algorithm=algo)
    with writer_lock(src, "revert", out is None):
        return _revert_locked(lg, src, out, atomic is not False, overwrite, log_files(log), want_in, want_out, algo)


def _routes(lg: InjectionLog, src: str) -> list[Any] | None:
    """:func:`fastflip.files.logwords.log_routes` of ``src`` for a region revert, read once; None where its layout
    cannot be read (the revert is then made in a copy, whose checks give the refusal)."""
    try:
        return log_routes(lg, src)
    except (FastflipError, OSError, ValueError):
        return None


def _require_hashes(src: str, verify: bool, want_in: str | None, want_out: str | None) -> None:
    """Refuse (``verify``) a log that holds no hashes to verify a revert with."""
    if verify and not (want_in and want_out):
        raise LogMismatchError(f"{src}: the log holds no hash of the original, so a revert cannot be verified; "
                               "give --no-verify (verify=False) to revert without that check")


def revert_into(log: InjectionLog, file: str, tmp: str, *, verify: bool = True) -> RevertResult:
    """Write ``file`` reverted by the single-file ``log`` into ``tmp``, a temporary the caller staged.

    For a writer that commits several files together (a checkpoint directory's shards,
    :func:`fastflip.files.sharded.revert_dir`): the caller's :class:`fastflip.files.fileio.Staging` fsyncs
    ``tmp`` and renames it into place; no temporary or fsync of its own. ``file`` is read, never changed, and
    checked as :func:`revert` checks it (``result.output`` is ``tmp``).

    Raises
    ------
    LogMismatchError
        As :func:`revert`; ``tmp`` may then hold partial bytes (the caller's staging removes it).
    """
    algo, want_in, want_out = hashing.logged_hashes(log.manifest)
    _require_hashes(file, verify, want_in, want_out)
    return _revert_locked(log, check_input(file), None, True, True, [], want_in, want_out, algo, into=tmp)


def _revert_locked(lg: InjectionLog, src: str, out: Any, atomic: bool, overwrite: bool, inputs: list[str],
                   want_in: str | None, want_out: str | None, algo: str = "sha256", into: str | None = None
                   ) -> RevertResult:
    """Revert ``src`` by ``lg`` into the checked target (``out``; ``src`` itself when None), or into the caller's
    staged temporary ``into``."""
    target = _revert_target(src, out, overwrite, inputs) if into is None else into

    def output() -> Any:  # where the restored bytes are written before they become ``target``
        return atomic_output(target) if into is None else contextlib.nullcontext(into)
    layout = read_layout(src)
    by_name = {t.path: t for t in layout.tensors}
    routes = route_sites(src, lg.plan, by_name)  # valid for a byte-identical copy too

    def check(path: str, digest: str) -> None:
        if want_out and digest != want_out and digest == want_in:
            raise LogMismatchError(f"{src} is not the output this log describes: it is already the logged input "
                                   f"({algo} matches; reverted before, or never injected); nothing was changed")
        if want_out and digest != want_out:
            raise LogMismatchError(f"{src} is not the output this log describes ({algo} differs); nothing was changed")
        if not np.array_equal(read_words(path, lg.plan, by_name, routes), lg.new_words):
            raise LogMismatchError(f"{src}: the words at the logged sites are not the logged new words; nothing was changed")

    def restore(path: str) -> str:
        if lg.undo is not None:
            lg.undo.apply(path)
        else:
            restore_words(path, lg.plan, by_name, lg.old_words, lg.new_words, routes)
        digest = hash_file(path, algo, cache=False)  # the bytes produced, never a remembered hash
        if want_in and digest != want_in:
            raise LogMismatchError(f"reverting {src} did not give the logged input back ({algo} differs); nothing was changed")
        return digest

    proven = bool(want_in and want_out)  # both hashes compared: the result is verified
    patches = revert_patches(src, lg.undo, routes, lg.new_words, lg.old_words) if proven else None
    if patches is not None:  # one read of the file: its hash now and the hash it will have once restored
        def predicted(after: str) -> None:
            if after != want_in:
                raise LogMismatchError(f"reverting {src} did not give the logged input back ({algo} differs); "
                                       "nothing was changed")

        if not atomic and out is None:
            now, after = hash_with_patches(src, patches, algo)  # its bytes, read now, never a remembered hash
            check(src, now)
            predicted(after)
            with deferred_signals():
                write_patches(src, patches)
                fsync_path(src)
        else:
            with output() as tmp:
                now, after = hash_with_patches(src, patches, algo, copy_to=tmp)
                check(tmp, now)
                predicted(after)
                write_patches(tmp, patches)
        return RevertResult(target, after, len(lg.plan), proven, algo)
    if not atomic and out is None:
        check(src, hash_file(src, algo, cache=False))  # the file about to be rewritten: its bytes, read now
        digest = restore(src)
    else:
        with output() as tmp:
            check(tmp, copy_with_hash(src, tmp, algo))  # the file is read once: hashed while copied
            digest = restore(tmp)
    return RevertResult(target, digest, len(lg.plan), proven, algo)


def revert_archive(log: Any, file: str, out: str | None, *, overwrite: bool = True, log_inputs: list[str] | None = None,
                   want_in: str | None = None, want_out: str | None = None, algorithm: str = "sha256") -> Any:
    """Revert a ``.keras`` log on the archive ``file`` (in place unless ``out``): the inner weights file
    gets its original bytes back (checked by sha256); other entries are kept as they are."""
    with writer_lock(file, "revert", out is None):
        target = _revert_target(file, out, overwrite, log_inputs or [])
        with edit_archive(file, target) as inner:
            res = _revert_locked(log, str(inner), None, True, True, [], want_in, want_out, algorithm)
        res.output = target
    return res
