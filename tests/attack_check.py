"""One verdict for an adversarial checkpoint: fastflip agrees with the framework's own loader, or refuses cleanly.

:func:`verdict` reads the file with the framework (a ``view`` of :mod:`framework_views`: ``{fastflip path: array}``)
and with fastflip, and requires one of two outcomes:

- **refused**: ``read_layout(verify=True)`` (what ``fastflip inspect`` reads) raises a
  :class:`~fastflip.errors.FastflipError` of one line; ``fastflip inspect`` and ``fastflip inject -o OUT`` (run
  in this process) exit 2 with one line on stderr (``fastflip CMD: error: ...``) and leave the input's folder
  and the work folder as :func:`conftest.snapshot` found them (no output, log, temporary or lock). Also refused: a file the framework refuses whose every tensor fastflip skips (an
  object array: ``inspect`` lists them as skipped and the injects refuse so), and a tensor fastflip lists but
  never writes (HDF5 external storage: ``inject_file`` and the CLI refuse the sites drawn there);
- **agrees**: the framework reads the file too; every tensor fastflip lists is one the framework returned (every
  alias), with its shape and word width, and the bytes at fastflip's offsets (contiguous storage; in a ``.keras``
  archive, offsets in its ``model.weights.h5``) are the framework's words, element by element; every tensor the framework returned with elements is listed or skipped
  with a reason; an injection through ``inject_file`` (``inject_dir`` for a checkpoint directory) is judged by
  the framework's reading of the output (:func:`framework_judge.judge`), and the CLI, given the same seed, writes
  what the framework reads alike (not always the same bytes: HDF5 stamps a dataset written through the library
  with the time). The tensors fastflip skips are exactly those the case names, and an "agrees" injects at least
  one element unless the case says the file lists none.

Used by ``tests/test_attack_*.py``; a case that the framework reads and fastflip reads differently fails here.
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Callable, Iterable, Mapping

import numpy as np

from fastflip.cli import main
from fastflip.errors import FastflipError
from fastflip.files.archives import is_keras_archive, read_archive
from fastflip.files.formats.hfdir import is_checkpoint_dir
from fastflip.files.inject import inject_checkpoint_file, inject_file
from fastflip.files.layout import read_layout
from fastflip.files.sharded import inject_dir
from conftest import assert_unchanged, snapshot
from framework_judge import assert_judged, compare_readings, logical_words

__all__ = ["verdict", "cli"]

View = Callable[[str], Mapping[str, np.ndarray]]


def cli(*args: str) -> tuple[int, str]:
    """(exit status, stderr) of ``fastflip ARGS``, run in this process (``fastflip.cli.main``)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(list(args))
    return rc, err.getvalue()


class _Unchanged:
    """The input's folder and the work folder as :func:`conftest.snapshot` found them when the verdict began."""

    def __init__(self, path: str, tmp: str) -> None:
        here, work = os.path.dirname(os.path.abspath(path)), os.path.abspath(tmp)
        self.where = [here] if work.startswith(here + os.sep) else [here, work]
        self.before = [snapshot(w) for w in self.where]
        self.input = snapshot(path)

    def check(self, what: str) -> None:
        for w, before in zip(self.where, self.before):
            assert_unchanged(w, before, what)


def _refused(path: str, tmp: str, exc: FastflipError, unchanged: _Unchanged, inspect: bool = True, seed: int = 1,
             count: int = 3) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg and len(msg) < 600, msg
    unchanged.check(f"refused ({msg[:200]})")
    inject = ["inject", path, "-o", os.path.join(tmp, "cli-out"), "--seed", str(seed), "--count", str(count)]
    for args in ([["inspect", path]] if inspect else []) + [inject]:
        rc, err = cli(*args)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"fastflip {args[0]}: error: ") \
            and "internal error" not in err, (args[0], rc, err[-800:])
        unchanged.check(f"fastflip {args[0]} refused")
    return "refused"


def _words_at(fh, t) -> np.ndarray:  # type: ignore[no-untyped-def]
    fh.seek(t.offset)
    raw = fh.read(t.nbytes)
    assert len(raw) == t.nbytes, (t.path, "fastflip's bytes run past the end of the file")
    return logical_words(np.frombuffer(raw, t.dtype))


def _sites_agree(path: str, lay, reading: Mapping[str, np.ndarray]) -> None:  # type: ignore[no-untyped-def]
    listed = {a for t in lay.tensors for a in t.aliases}
    skipped = {s.path for s in lay.skipped}
    unlisted = sorted(k for k, v in reading.items() if np.asarray(v).size and k not in listed | skipped)
    assert not unlisted, f"the framework reads tensors fastflip neither lists nor skips: {unlisted[:6]}"
    for t in lay.tensors:
        for a in t.aliases:
            assert a in reading, f"fastflip lists {a}, which the framework does not return ({sorted(reading)[:6]})"
            got = np.asarray(reading[a])
            assert got.shape == tuple(t.shape) and got.dtype.itemsize == t.itemsize, \
                (a, f"fastflip {t.dtype}{t.shape}, the framework {got.dtype}{got.shape}")
            if t.storage == "contiguous":  # a checkpoint directory's offsets are in the tensor's shard
                with open(lay.file_of(t) if hasattr(lay, "file_of") else path, "rb") as fh:
                    mine, theirs = _words_at(fh, t), logical_words(got)
                bad = np.flatnonzero(mine != theirs)
                assert not len(bad), (a, f"{len(bad)} element(s) differ at fastflip's offsets, first "
                                         f"[{bad[0]}]: {int(mine[bad[0]]):#x} vs the framework's "
                                         f"{int(theirs[bad[0]]):#x}")


def _suffix(path: str) -> str:
    """The name ending an output keeps so that the framework reads it alike (``.weights.h5`` for Keras)."""
    if not os.path.isfile(path):
        return ""
    return ".weights.h5" if path.endswith(".weights.h5") else os.path.splitext(path)[1]


def verdict(path: str, view: View, tmp: str, *, count: int = 12, seed: int = 7,
            expect: str | None = None, skipped: Iterable[str] = (), empty: bool = False) -> str:
    """``"agrees"`` or ``"refused"`` (see the module docstring), asserting the contract of either outcome.

    ``expect`` (optional) pins the outcome the case must have. ``skipped``: the paths fastflip must list as
    skipped (exactly these) when it reads the file. ``empty``: the case lists no tensor (an empty header, only
    metadata), so "agrees" holds without an injection; otherwise "agrees" needs at least one element to inject.
    """
    os.makedirs(tmp, exist_ok=True)
    try:
        reading = dict(view(path))  # arrays sharing memory (tied weights, views) keep sharing it
        fw_error: BaseException | None = None
    except Exception as exc:  # noqa: BLE001 - any refusal of the framework's loader
        reading, fw_error = None, exc
    unchanged = _Unchanged(path, tmp)  # after the framework's reading, which may write beside the input (Keras)
    with contextlib.ExitStack() as inner:
        try:  # a .keras archive: the sites are in the model.weights.h5 inside it
            sites_file = str(inner.enter_context(read_archive(path))) if is_keras_archive(path) else path
            lay = read_layout(sites_file, verify=True)
        except FastflipError as exc:
            out = _refused(path, tmp, exc, unchanged)
            assert expect in (None, out), (expect, str(exc))
            return out
        assert sorted({s.path for s in lay.skipped}) == sorted(set(skipped)), \
            ("fastflip skips other tensors than the case names", [(s.path, s.reason) for s in lay.skipped])
        if reading is not None:
            _sites_agree(sites_file, lay, reading)
    if reading is None and not lay.tensors:  # all skipped (an object array): listed, but an inject must refuse
        try:
            inject_file(path, os.path.join(tmp, "api-out"), seed=seed, sampling={"count": 1})
        except FastflipError as exc:
            out = _refused(path, tmp, exc, unchanged, inspect=False)
            assert expect in (None, out), (expect, str(exc))
            return out
    assert reading is not None, f"fastflip reads a file the framework refuses ({type(fw_error).__name__}: " \
                                f"{str(fw_error)[:200]})"
    total = sum(t.size for t in lay.tensors)
    assert bool(total) != empty, (f"fastflip lists {total} element(s) to inject; the case says it lists "
                                  f"{'none' if empty else 'some'}")
    if total:
        ext = _suffix(path)
        out = os.path.join(tmp, "api-out" + ext)
        inject = inject_dir if is_checkpoint_dir(path) else \
            inject_checkpoint_file if is_keras_archive(path) else inject_file  # a .keras: its archive path
        try:
            res = inject(path, out, seed=seed, sampling={"count": min(count, total)})
        except FastflipError as exc:  # listed, but refused where a site lands (external storage)
            got = _refused(path, tmp, exc, unchanged, inspect=False, seed=seed, count=min(count, total))
            assert expect in (None, got), (expect, str(exc))
            return got
        assert snapshot(path) == unchanged.input, "the inject changed its input"
        assert_judged(dict(reading), view(out), res.log, require_change=False)
        cli_out = os.path.join(tmp, "cli-out" + ext)
        rc, err = cli("inject", path, "-o", cli_out, "--seed", str(seed), "--count", str(min(count, total)), "-q")
        assert rc == 0, err[-800:]
        assert not compare_readings(view(out), view(cli_out)), "the CLI and inject_file wrote other values"
    assert expect in (None, "agrees"), (expect, "fastflip read the file")
    return "agrees"
