"""Byte ranges of an open file written in one pass, each checked to hold its previous bytes first when asked.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

:func:`write_ranges` takes a batch of ranges (offsets, lengths, their bytes concatenated, as a
:class:`~fastflip.files.filebytes.ByteUndo` holds them) and writes them into a file descriptor with
``pwrite``; given the bytes the ranges should hold now, it reads each range first and stops at the first
that does not hold them. Ranges that follow each other are one read and one write. The native version
(``write_ranges`` of ``ext/_kernels.pyx``, built as :mod:`fastflip.kernels._cython`) runs the whole batch
in one call; where that module is not built (an installation without a C compiler) the same ranges are
written by NumPy, a span at a time, with the same result byte for byte (tested).

Used by :mod:`fastflip.files.copyregions` (the touched bytes of a new file's copy, checked and written at
once), :class:`~fastflip.files.filebytes.ByteUndo` (undo and redo) and
:func:`fastflip.files.fingerprint.ranges_hold` (checking only).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

__all__ = ["GAP", "write_ranges", "native_available", "read_at", "write_at"]

SPAN = 1 << 20  # the most bytes the native pass reads at once (its one buffer)
GAP = 4096  # ranges this close are worth one read: a system call costs about what copying a page does

try:
    from ..kernels._cython import write_ranges as _NATIVE  # ext/_kernels.pyx
except ImportError:  # pragma: no cover - a build without a C compiler
    _NATIVE = None


def native_available() -> bool:
    """Whether :func:`write_ranges` runs natively here."""
    return _NATIVE is not None


def write_ranges(fd: int, offsets: Any, lengths: Any, new: bytes | None, old: bytes | None = None, *,
                 gap: int = 0, native: bool | None = None) -> int:
    """Write range ``i``'s bytes at ``offsets[i]`` of the open file ``fd``; return -1, or the index of the
    first range that did not hold its bytes in ``old``.

    Parameters
    ----------
    fd : int
        A file descriptor open for writing (for reading only where ``new`` is None).
    offsets, lengths : array of int
        The ranges, in the order they are checked and written; ranges checked against ``old`` must not overlap.
    new : bytes or None
        Every range's new bytes, concatenated; None writes nothing (``old`` is only checked).
    old : bytes, optional
        Every range's present bytes, concatenated: each range is read and compared before it is written. At
        the first that differs (or lies past the end of the file) the pass stops: that range and those after
        it are left as they are, those before it hold their new bytes.
    gap : int
        Ranges at most this many bytes apart are read as one span (:data:`GAP`: fewer system calls) and, with
        ``new``, written back whole, the bytes between them as they were read: for a file no other process
        writes (a private copy). The bytes the file ends with are the same whatever the gap.
    native : bool, optional
        True or False forces the native or the Python pass (tests); None takes the native one where built.

    Returns
    -------
    int
        -1 when every range was written (or, without ``new``, held ``old``); else the first range that did not.
    """
    offs = np.ascontiguousarray(offsets, np.int64)
    lens = np.ascontiguousarray(lengths, np.int64)
    if len(offs) == len(lens) and len(lens) and not lens.all() and (lens >= 0).all():
        # empty ranges hold and write nothing: left out, a span never reaches one (past the end of the file, the
        # span's write would lengthen the file by the gap before it)
        kept = np.flatnonzero(lens)
        bad = write_ranges(fd, offs[kept], lens[kept], new, old, gap=gap, native=native)
        return bad if bad < 0 else int(kept[bad])
    fn = _NATIVE if native is None or native else None
    if native and fn is None:
        raise ImportError("fastflip.kernels._cython is not built here")
    if fn is not None:
        return int(fn(fd, offs, lens, b"" if new is None else new, b"" if old is None else old, new is not None,
                      old is not None, gap, SPAN))
    return _write_ranges_py(fd, offs, lens, new, old, gap)


def _write_ranges_py(fd: int, offs: np.ndarray, lens: np.ndarray, new: bytes | None, old: bytes | None,
                     gap: int) -> int:
    """:func:`write_ranges` in NumPy: ranges that follow each other, or lie at most ``gap`` bytes apart in one
    ``SPAN`` block of the file, are one ``os.pread`` (where they are checked or have gaps) and one ``os.pwrite``."""
    n = len(offs)
    if len(lens) != n or (n and (int(offs.min()) < 0 or int(lens.min()) < 0)) or gap < 0:
        raise ValueError(f"write_ranges: {n} offsets and {len(lens)} lengths (gap {gap}) are not byte ranges")
    pos = np.concatenate(([0], np.cumsum(lens)))
    for data, what in ((new, "new"), (old, "old")):
        if data is not None and len(data) != int(pos[-1]):
            raise ValueError(f"write_ranges: {len(data)} {what} bytes for ranges of {int(pos[-1])}")
    ends = offs + lens
    step = offs[1:] - ends[:-1]  # the gap before each range (negative: it overlaps or goes back)
    cut = (step < 0) | (step > gap) | ((step > 0) & (offs[1:] // SPAN != offs[:-1] // SPAN))
    cuts = np.concatenate(([0], np.flatnonzero(cut) + 1, [n]))
    gapped = np.concatenate(([0], np.cumsum(step > 0)))  # gaps before each range, counted from the first
    inner = (gapped[cuts[1:] - 1] > gapped[cuts[:-1]]).tolist() if n else []  # a span with gaps inside
    at, posl, data = offs.tolist(), pos.tolist(), None if new is None else memoryview(new)
    for a, b, gaps in zip(cuts[:-1].tolist(), cuts[1:].tolist(), inner):
        if old is None and not gaps:  # adjacent ranges: their new bytes follow each other
            if data is not None:
                write_at(fd, at[a], [data[posl[a] : posl[b]]])
            continue
        bad = _span(fd, offs[a:b], lens[a:b], pos[a : b + 1], new, old)
        if bad >= 0:
            return a + bad
    return -1


def _span(fd: int, offs: np.ndarray, lens: np.ndarray, pos: np.ndarray, new: bytes | None, old: bytes | None) -> int:
    """One span of :func:`_write_ranges_py` read whole: its ranges checked against ``old`` and written; -1 or the
    first range (of this span) that did not hold its old bytes."""
    start, size, p, total = int(offs[0]), int(offs[-1] + lens[-1] - offs[0]), int(pos[0]), int(pos[-1] - pos[0])
    buf = bytearray(size)  # past the end of the file: missing for a check, zeros for a write
    got = read_at(fd, memoryview(buf), start)
    at = np.repeat(offs - start - (pos[:-1] - p), lens) + np.arange(total)  # each range byte's place in buf
    view = np.frombuffer(buf, np.uint8)
    bad, done = -1, total
    if old is not None:
        differ = (view[at] != np.frombuffer(old, np.uint8, total, p)) | (at >= got)
        if differ.any():
            done = int(np.argmax(differ))
            bad = int(np.searchsorted(pos[1:] - p, done, side="right"))
            done = int(pos[bad] - p)  # the bytes of the ranges before it
    if new is not None:
        view[at[:done]] = np.frombuffer(new, np.uint8, done, p)
        write_at(fd, start, [memoryview(buf)[: int(offs[bad]) - start if bad >= 0 else size]])
    return bad


def read_at(fd: int, view: memoryview, at: int) -> int:
    """Fill ``view`` (a writable byte buffer) from offset ``at`` of the file ``fd``, reading again after a short
    read; return the bytes read: fewer than ``len(view)`` only where the file ends."""
    done, n = 0, len(view)
    while done < n:
        got = os.preadv(fd, [view[done:]], at + done)
        if not got:
            break
        done += got
    return done


def write_at(fd: int, at: int, pieces: Sequence[Any]) -> int:
    """Write ``pieces`` (buffers) one after the other from offset ``at`` of the file ``fd``, writing again after a
    short write; return the bytes written."""
    start = at
    for chunk in pieces:
        mv = memoryview(chunk).cast("B")
        n = 0
        while n < len(mv):
            n += os.pwrite(fd, mv[n:], at + n)
        at += len(mv)
    return at - start
