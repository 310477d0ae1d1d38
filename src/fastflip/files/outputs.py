"""Where an injection, replay or revert writes, and the log it starts from.

Layer: ``files``. Shared by :mod:`fastflip.files.inject`, :mod:`fastflip.files.replay`,
:mod:`fastflip.files.revert` and :mod:`fastflip.files.sharded`: the default log path, the checked output and log
paths (:func:`fastflip.files.paths.resolve_output`), the writer lock on a file rewritten in place, and a log
given as an :class:`~fastflip.files.log.InjectionLog` or a path.

>>> default_log_path("model.faulty.h5")
'model.faulty.h5.fflog'
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Sequence

from ..errors import InputFileError, OptionError
from .formats.hfdir import is_checkpoint_dir
from .locks import WriterLock
from .log import InjectionLog
from .paths import resolve_output

__all__ = ["default_log_path", "refuse_dir", "output_target", "REVERT_SAME", "log_target", "writer_lock", "load_log",
           "in_container", "log_files"]


def default_log_path(output: str, keep_existing: bool = False) -> str:
    """``<output>.fflog``; with ``keep_existing`` the first free ``<output>.<k>.fflog`` (k = 2, 3, ...)
    when that exists, so that repeated in-place injections never overwrite the log that reverts an earlier one.
    """
    base = os.fspath(output)
    path = base + ".fflog"
    k = 2
    while keep_existing and os.path.exists(path):
        path = f"{base}.{k}.fflog"
        k += 1
    return path


def refuse_dir(path: Any, lg: InjectionLog | None = None) -> None:
    """A checkpoint directory (or a log of one) is the business of :mod:`fastflip.files.sharded`: say so."""
    if is_checkpoint_dir(path) or (lg is not None and lg.manifest.get("checkpoint_dir")):
        raise InputFileError(f"{os.fspath(path)}: a checkpoint directory (or its log); use fastflip.inject_dir, "
                             "replay_dir and revert_dir for it (the fastflip command does)")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def output_target(src: str, dst: str | os.PathLike[str] | None, in_place: bool, overwrite: bool = True,
                  inputs: Sequence[str] = (), same: str = "use --in-place to change the input") -> str:
    """The real path to write: ``src`` itself (symlinks resolved) in place, else the checked output
    (``same``: the fix named when the output is the input)."""
    if in_place:
        if dst is not None and not _same_file(src, os.fspath(dst)):
            raise OptionError("give either an output path or in_place=True (--in-place), not both")
        return resolve_output(src, inputs=inputs, in_place_of=src)
    if dst is None:
        raise OptionError("give an output path (-o OUT); the input is only changed with --in-place")
    dst = os.fspath(dst)
    if os.path.exists(dst) and _same_file(src, dst):
        raise OptionError(f"{dst}: the output is the input; {same}")
    return resolve_output(dst, inputs=[src, *inputs], overwrite=overwrite, hint=same)


# The fix named when a revert's output is the file itself.
REVERT_SAME = "leave out -o to restore the file itself"


def log_target(lp: str, src: str, target: str, inputs: Sequence[str] = ()) -> str:
    """The checked real path of a log: never an input, never the output."""
    return resolve_output(lp, inputs=[src, *inputs], others={"output": target}, what="log")


def writer_lock(path: str, what: str, on: bool) -> Any:
    """A :class:`WriterLock` on ``path`` when ``on`` (an existing file being rewritten), else nothing."""
    return WriterLock(path, what) if on and os.path.exists(path) else contextlib.nullcontext()


def load_log(log: InjectionLog | str | os.PathLike[str]) -> InjectionLog:
    """The log itself, or the one saved at the path ``log``."""
    return log if isinstance(log, InjectionLog) else InjectionLog.load(log)


def in_container(lg: InjectionLog) -> bool:
    """True when the log describes the weights file inside a container (a ``.keras`` archive)."""
    return lg.manifest.get("container") is not None


def log_files(log: InjectionLog | str | os.PathLike[str]) -> list[str]:
    """The log's file (``[]`` for a log in memory): an input no output may overwrite."""
    return [] if isinstance(log, InjectionLog) else [os.fspath(log)]

