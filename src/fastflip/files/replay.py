"""Replay a logged injection: the logged input made into the logged output again, bit for bit.

Layer: ``files``. The Python API behind ``fastflip replay``; the injection itself is
:mod:`fastflip.files.inject`, its undo :mod:`fastflip.files.revert`.

Examples
--------
>>> import os, tempfile, numpy as np, h5py
>>> from fastflip.files.inject import inject_file
>>> d = tempfile.mkdtemp()
>>> src, out, again = (os.path.join(d, n) for n in ("in.h5", "out.h5", "again.h5"))
>>> with h5py.File(src, "w") as f:
...     _ = f.create_dataset("w", data=np.ones((8, 8), "f4"))
>>> res = inject_file(src, out, seed=3, count=4, bits="sign")
>>> open(replay(res.log_path, src, again).output, "rb").read() == open(out, "rb").read()
True
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import LogMismatchError
from . import hashing
from .filebytes import copy_with_hash, hash_file, hash_with_patches
from .fingerprint import replay_regions
from .fileio import atomic_output, check_input, staged
from .h5apply import read_words
from .inject import InjectionResult, write_plan
from .archives import edit_archive
from .layout import read_layout
from .logwords import check_log_words, check_words, has_encoded, log_routes
from .log import InjectionLog
from .outputs import (default_log_path, in_container, load_log, log_files, log_target, output_target, refuse_dir,
                      writer_lock)
from .patches import delta_patches, write_patches

__all__ = ["replay", "replay_archive"]


def replay(log: InjectionLog | str | os.PathLike[str], file: str | os.PathLike[str],
           out: str | os.PathLike[str] | None = None, *, in_place: bool = False,
           log_path: str | os.PathLike[str] | bool | None = False, overwrite: bool = True) -> InjectionResult:
    """Re-apply a logged injection to ``file`` (the logged input); the output equals the logged one bit for bit.

    ``overwrite`` (default True; the CLI's ``--force``) allows replacing an existing output.
    In place, the file is locked (:class:`fastflip.files.locks.WriterLock`) while it is rewritten.

    Raises
    ------
    LogMismatchError
        When ``file`` is not the logged input, or the result differs from the logged output.
    """
    lg = load_log(log)
    refuse_dir(file, lg)
    src = check_input(file)
    if in_container(lg):

        return replay_archive(lg, src, None if out is None else os.fspath(out), in_place=in_place,
                              overwrite=overwrite, log_inputs=log_files(log))
    with writer_lock(src, "replay --in-place", in_place):
        return _replay_locked(lg, src, out, in_place, log_path, overwrite, log_files(log))


def _replay_locked(lg: InjectionLog, src: str, out: Any, in_place: bool, log_path: Any, overwrite: bool,
                   inputs: list[str]) -> InjectionResult:
    algo, want_in, want_out = hashing.logged_hashes(lg.manifest)  # one line before anything is read
    target = output_target(src, out, in_place, overwrite, inputs)
    new_lp = None if log_path in (None, False) else log_target(
        default_log_path(target) if log_path is True else os.fspath(log_path), src, target, inputs)

    def check_input_hash(in_hash: str | None) -> None:  # hashed while copied: the input is read once
        if want_in and in_hash != want_in:
            raise LogMismatchError(f"{src} is not the input this log was made from ({algo} differs); give the original file")

    def check(old: np.ndarray, new: np.ndarray, out_hash: str | None) -> None:
        if not np.array_equal(new, lg.new_words) or not np.array_equal(old, lg.old_words):
            raise LogMismatchError(f"replaying onto {src} gave other words than the log records; the file is not the logged input")
        if want_out and out_hash != want_out:
            raise LogMismatchError(f"the replayed output differs from the logged output ({algo}); nothing was written")

    def finish(in_hash: str | None, out_hash: str | None, old: np.ndarray, new: np.ndarray, undo: Any) -> InjectionLog:
        check_input_hash(in_hash)
        check(old, new, out_hash)
        manifest = dict(lg.manifest, output=hashing.file_entry(os.path.abspath(target), out_hash, algo),
                        replayed_from=lg.manifest.get("created"))
        new_log = InjectionLog(manifest, lg.plan, old, new, undo)
        if new_lp is not None:
            new_log.save(new_lp)
        return new_log

    if lg.manifest.get("evidence") == "regions" and not want_in:  # region evidence: checked by regions, no hash
        with atomic_output(target) as tmp:
            routes: list[Any] = []  # read once from the input (the copy keeps its layout: chunks keep their place)

            def before(path: str) -> None:
                routes[:] = log_routes(lg, path)
                check_log_words(lg, path, src, "input", routes=routes)

            def after(path: str) -> None:  # raw sites only: the check before the copy proved every changed byte
                if has_encoded(routes):
                    check_words(lg, path, src, "output", routes)
            replay_regions(lg, src, tmp, before, after)
            new_log = finish(None, None, lg.old_words, lg.new_words, lg.undo)
        return InjectionResult(target, new_log, None, dict(lg.manifest.get("counts", {})))
    if lg.undo is not None and lg.undo.new_size >= 0:
        # the HDF5 path was used: replay the logged byte delta (HDF5 need not write the same bytes twice)
        forward = delta_patches(lg.undo, forward=True)
        with atomic_output(target) as tmp:
            if forward is None:  # bytes move: the delta applied, then the result read again
                in_hash = copy_with_hash(src, tmp, algo)
                check_input_hash(in_hash)
                lg.undo.redo(tmp)
                out_hash = hash_file(tmp, algo, cache=False)
            else:  # one read: the input's hash and the hash the copy has once the delta is written
                in_hash, out_hash = hash_with_patches(src, forward, algo, copy_to=tmp)
                check_input_hash(in_hash)
                write_patches(tmp, forward)
            after = {t.path: t for t in read_layout(tmp).tensors}  # chunks may have moved
            new = read_words(tmp, lg.plan, after)
            new_log = finish(in_hash, out_hash, lg.old_words, new, lg.undo)
        return InjectionResult(target, new_log, None, dict(lg.manifest.get("counts", {})))
    by_name = {t.path: t for t in read_layout(src).tensors}
    with staged() as stage:
        _, _, _, _, new_log = write_plan(src, target, in_place, True, lg.plan, by_name, "auto", True, finish,
                                         stage, algorithm=algo)
    return InjectionResult(target, new_log, None, dict(lg.manifest.get("counts", {})))


def replay_archive(log: Any, file: str, out: str | None, *, in_place: bool = False, overwrite: bool = True,
                   log_inputs: list[str] | None = None) -> Any:
    """Replay a ``.keras`` log onto the archive ``file``: the inner weights file is checked against
    the logged hashes and the new archive is written to ``out`` (or ``file`` in place)."""
    with writer_lock(file, "replay --in-place", in_place):
        target = output_target(file, out, in_place, overwrite, log_inputs or [])
        with edit_archive(file, target) as inner:
            res = _replay_locked(log, str(inner), None, True, False, True, [])
        res.output = target
        res.log.manifest["output"]["path"] = os.path.abspath(target)
    return res

