"""Region evidence: the touched byte ranges plus a fingerprint, so that an injection's cost follows the flips.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A whole-file hash costs a pass over the file (4 GB: seconds); ten flips cost microseconds. An injection with
region evidence — direct in place (``inject --in-place --direct``, ``inject_file(..., in_place=True,
atomic=False, hash_files="regions")``) or a new file copied in the kernel (``inject -o OUT --evidence
regions``, ``inject_file(src, dst, hash_files="regions")``, :mod:`fastflip.files.copyregions`) — therefore
records, instead of whole-file hashes:

- every byte range it writes, with its old and its new bytes (the log's undo/redo data: the words, the zip
  CRC fields, re-encoded chunks);
- the file's size;
- a fingerprint: the hash (the log's algorithm) of the file's head and tail windows, before and after — the
  first :data:`WINDOW` bytes (at least the whole safetensors header) and the last :data:`WINDOW` bytes, with
  the injection's bytes applied for the "after" one.

``revert`` of such a log checks, before it changes anything, that the file has the logged size and output
fingerprint and holds the logged new bytes in every touched range; then writes the old bytes back and checks
the ranges and the input fingerprint again. ``replay`` checks the input the same way, copies it in the kernel,
writes the logged new bytes and checks the output. What this does not see: a change elsewhere in the file
(outside the head/tail windows and the touched ranges) made after the injection, or (replay) an input that
differs from the logged one only there. Whole-file hashes (the default of a new file; ``--verify-file`` with
``--direct``) cover every byte.

Examples
--------
>>> import os, tempfile
>>> p = os.path.join(tempfile.mkdtemp(), "f.bin")
>>> with open(p, "wb") as fh:
...     _ = fh.write(bytes(range(256)) * 16)
>>> before, after = fingerprints(p, "sha256", [(10, b"\\x0a", b"\\xff")])
>>> before == fingerprint(p, "sha256", before["head_len"], before["tail_len"]), before == after
(True, False)
"""

from __future__ import annotations

import os
import struct
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import LogMismatchError
from . import hashing
from .filebytes import ByteUndo, overlay_patches
from .fileio import atomic_output, deferred_signals
from .filebytes import kernel_copy
from .rangeio import GAP, write_ranges

__all__ = ["WINDOW", "fingerprint", "fingerprints", "head_length", "check_regions", "ranges_hold", "revert_regions",
           "replay_regions", "copy_over_ranges"]

WINDOW = 1 << 20  # bytes hashed at each end of the file
_MAX_HEADER = 256 << 20  # a safetensors header larger than this is not read whole into the fingerprint


def head_length(path: str, size: int) -> int:
    """Bytes of the head window: :data:`WINDOW`, or the whole safetensors header (8-byte length + JSON) if longer."""
    n = min(WINDOW, size)
    with open(path, "rb") as fh:
        first = fh.read(9)
    if len(first) == 9:
        (hlen,) = struct.unpack("<Q", first[:8])
        if WINDOW < 8 + hlen <= min(size, _MAX_HEADER) and first[8:9] == b"{":  # a safetensors header
            n = 8 + hlen
    return n


def _windows(path: str, head_len: int, tail_len: int) -> tuple[int, bytes, int, bytes]:
    """(file size, head window, tail window's offset, tail window)."""
    size = os.path.getsize(path)
    tail_start = max(0, size - tail_len)
    with open(path, "rb") as fh:
        head = fh.read(head_len)
        fh.seek(tail_start)
        tail = fh.read(tail_len)
    return size, head, tail_start, tail


def _digest(algorithm: str, data: bytes | bytearray) -> str:
    h = hashing.new(algorithm)
    h.update(data)
    return h.hexdigest()


def _record(size: int, head_len: int, tail_len: int, head: bytes | bytearray, tail: bytes | bytearray,
            algorithm: str) -> dict[str, Any]:
    return {"size": size, "head_len": head_len, "tail_len": tail_len,
            "head": _digest(algorithm, head), "tail": _digest(algorithm, tail)}


def fingerprint(path: str, algorithm: str, head_len: int, tail_len: int) -> dict[str, Any]:
    """The file's size and the hashes of its head and tail windows (lengths as logged)."""
    size, head, _, tail = _windows(path, head_len, tail_len)
    return _record(size, head_len, tail_len, head, tail, algorithm)


def fingerprints(path: str, algorithm: str, patches: Sequence[tuple[int, bytes, bytes]] | ByteUndo
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fingerprint now, fingerprint once the same-size ``(offset, old, new)`` patches are written): two small reads.

    ``patches`` may be a same-size :class:`~fastflip.files.filebytes.ByteUndo` holding them (old bytes in
    ``data``, new in ``new_data``): only its ranges that reach into the two windows are looked at."""
    size = os.path.getsize(path)
    head_len, tail_len = head_length(path, size), min(WINDOW, size)
    size, head, tb, tail = _windows(path, head_len, tail_len)
    if isinstance(patches, ByteUndo):
        patches = _reaching(patches, [(0, head_len), (tb, size)])
    return (_record(size, head_len, tail_len, head, tail, algorithm),
            _record(size, head_len, tail_len, overlay_patches(0, head, patches), overlay_patches(tb, tail, patches),
                    algorithm))


def _reaching(undo: ByteUndo, spans: Sequence[tuple[int, int]]) -> list[tuple[int, bytes, bytes]]:
    """The ranges of a same-size ``undo`` that overlap one of the byte ``spans`` ``(lo, hi)``, as patches."""
    ends = undo.offsets + undo.lengths
    hit = np.zeros(len(ends), bool)
    for lo, hi in spans:
        hit |= (undo.offsets < hi) & (ends > lo)
    starts = np.cumsum(undo.lengths) - undo.lengths  # each range's first byte in data / new_data
    return [(off, undo.data[s : s + ln], undo.new_data[s : s + ln])
            for off, ln, s in zip(undo.offsets[hit].tolist(), undo.lengths[hit].tolist(), starts[hit].tolist())]


def ranges_hold(path: str, offsets: Any, lengths: Any, data: bytes) -> bool:
    """Whether the file holds ``data`` (concatenated) in the byte ranges (``offsets``, ``lengths``)."""
    fd = os.open(path, os.O_RDONLY)
    try:  # one pass that only reads: every range compared, none written
        return write_ranges(fd, offsets, lengths, None, data, gap=GAP) < 0
    finally:
        os.close(fd)


_NOT_CHANGED = "; nothing was changed"
_FIX = ("; give the file this log's injection wrote, or --no-verify (verify=False) to write the logged original "
        "bytes of the touched ranges anyway")


def check_regions(path: str, fp: Mapping[str, Any], undo: Any, side: str, subject: str, fix: str = "",
                  ranges: bool = True, windows: tuple[int, bytes, int, bytes] | None = None) -> None:
    """Raise :class:`~fastflip.errors.LogMismatchError` unless ``path`` is the logged ``side`` ("input" or
    "output") as far as region evidence tells: size, head/tail fingerprint, and (``ranges``) the bytes of every
    touched range. ``fix`` ends the message of a fingerprint or range that differs (what the user can do);
    ``windows``: the caller's :func:`_windows` of ``path`` at the logged lengths (else read here)."""
    want = fp[side]
    head_len, tail_len = int(want["head_len"]), int(want["tail_len"])
    size, head, _, tail = windows if windows is not None else _windows(path, head_len, tail_len)
    got = _record(size, head_len, tail_len, head, tail, fp["algorithm"])
    what = "output this log describes" if side == "output" else "logged input"
    done = _NOT_CHANGED if side == "output" else ""
    if got["size"] != want["size"]:
        raise LogMismatchError(f"{subject} is not the {what} (size {got['size']}, logged {want['size']}){done}")
    if got != want:
        raise LogMismatchError(f"{subject} is not the {what} (head/tail fingerprint differs){done}{fix}")
    if ranges and not ranges_hold(path, undo.offsets, undo.lengths, undo.new_data if side == "output" else undo.data):
        raise LogMismatchError(f"{subject} is not the {what} (the bytes of a touched range differ){done}{fix}")


def _torn(path: str, fp: Mapping[str, Any], undo: Any) -> bool:
    """Whether ``path`` is the logged output half-written by a killed direct run (``kill -9`` cannot be deferred):
    the logged size, every touched byte holding its logged old or new value, and the head/tail windows with the
    old bytes laid over them equal to the logged input's, so that reverting is proven before anything is written."""
    want = fp["input"]
    if os.path.getsize(path) != int(fp["output"]["size"]):
        return False
    restore, pos = [], 0
    with open(path, "rb") as fh:
        for off, ln in zip(undo.offsets.tolist(), undo.lengths.tolist()):
            fh.seek(off)
            now = fh.read(ln)
            old, new = undo.data[pos : pos + ln], undo.new_data[pos : pos + ln]
            got, o, n = (np.frombuffer(b, np.uint8) for b in (now, old, new))
            if len(now) != ln or not ((got == o) | (got == n)).all():
                return False
            restore.append((off, now, old))
            pos += ln
    return _windows_after(path, fp, restore)


def _windows_after(path: str, fp: Mapping[str, Any], restore: Sequence[tuple[int, bytes, bytes]],
                   windows: tuple[int, bytes, int, bytes] | None = None) -> bool:
    """Whether ``path``'s head and tail windows, with the ``(offset, now, old)`` patches' old bytes laid over them,
    hash to the logged input's fingerprint: what a revert will give, known before it writes. ``windows``: the
    caller's :func:`_windows` of ``path`` at the input's lengths (else read here)."""
    want = fp["input"]
    head_len, tail_len = int(want["head_len"]), int(want["tail_len"])
    size, head, tail_at, tail = windows if windows is not None else _windows(path, head_len, tail_len)
    return _record(size, head_len, tail_len, overlay_patches(0, head, restore), overlay_patches(tail_at, tail, restore),
                   fp["algorithm"]) == dict(want)


def _reverts_to_input(path: str, fp: Mapping[str, Any], undo: Any,
                      windows: tuple[int, bytes, int, bytes] | None = None) -> bool:
    """Whether writing the same-size ``undo``'s old bytes into ``path`` (the logged output) gives the logged input's
    size and head/tail fingerprint: a log whose old bytes were edited is refused before anything is written.
    ``windows``: as :func:`_windows_after` takes them."""
    if int(fp["input"]["size"]) != int(undo.size):
        return False
    size = os.path.getsize(path)
    spans = [(0, int(fp["input"]["head_len"])), (max(0, size - int(fp["input"]["tail_len"])), size)]
    return _windows_after(path, fp, [(off, new, old) for off, old, new in _reaching(undo, spans)], windows)


def _evidence(lg: Any, src: str, verb: str) -> tuple[Mapping[str, Any], Any]:
    """The log's fingerprint and byte ranges, refused in one line where they are incomplete."""
    fp, undo = lg.manifest.get("fingerprint"), lg.undo
    if not isinstance(fp, dict) or undo is None or undo.new_size != undo.size:
        raise LogMismatchError(f"{src}: the log's region evidence is incomplete (no fingerprint or undo ranges); "
                               f"it cannot be {verb} by regions")
    hashing.algorithm(fp["algorithm"])
    return fp, undo


def copy_over_ranges(src: str, tmp: str, undo: ByteUndo, *, writeback: bool = False) -> bool:
    """Copy ``src`` to ``tmp`` in the kernel (:func:`fastflip.files.filebytes.kernel_copy`), then write the
    same-size ``undo``'s new bytes over the copy in one pass over its touched ranges
    (:func:`fastflip.files.rangeio.write_ranges`), each read and compared with its old bytes first; return whether
    every range held them (False: the pass stopped at the first that did not, later ones left as copied)."""
    kernel_copy(src, tmp, writeback=writeback)
    fd = os.open(tmp, os.O_RDWR)
    try:  # the copy is private: ranges a page apart are one read and one write
        return write_ranges(fd, undo.offsets, undo.lengths, undo.new_data, undo.data, gap=GAP) < 0
    finally:
        os.close(fd)


def replay_regions(lg: Any, src: str, tmp: str, before: Callable[[str], None] | None = None,
                   after: Callable[[str], None] | None = None) -> None:
    """Replay a log with region evidence onto ``src`` (the logged input, as far as its size, windows and touched
    ranges tell) into ``tmp``: a kernel copy with the logged new bytes written over it in the pass that checks the
    copy's touched ranges hold the logged old bytes (:func:`copy_over_ranges`), then the copy's size and windows
    checked to be the logged output's. No whole-file pass; the touched ranges read once. ``before`` (given ``src``)
    runs after the input's checks and before the copy, ``after`` (given ``tmp``) once the copy is written: further
    checks of the log that may raise."""
    fp, undo = _evidence(lg, src, "replayed")
    fix = "; give the file this log's injection was made from"
    check_regions(src, fp, undo, "input", src, fix, ranges=False)  # its size and windows, before any write
    if before is not None:
        before(src)
    if not copy_over_ranges(src, tmp, undo):
        raise LogMismatchError(f"{src} is not the logged input (the bytes of a touched range differ){fix}")
    check_regions(tmp, fp, undo, "output", f"replaying onto {src} did not give the logged output", ranges=False)
    if after is not None:
        after(tmp)


def _check_revertible(path: str, fp: Mapping[str, Any], undo: Any, subject: str, verify: bool = True) -> None:
    """Raise :class:`~fastflip.errors.LogMismatchError` unless ``path`` is the logged output, or that output
    half-written by a killed run (:func:`_torn`), and the log's original bytes give the logged input's size and
    head/tail fingerprint (checked before anything is written); without ``verify``, only unless it has the logged
    size."""
    if not verify:
        if os.path.getsize(path) != int(fp["output"]["size"]):
            check_regions(path, fp, undo, "output", subject)  # the size message
        return
    lens = [(int(fp[side]["head_len"]), int(fp[side]["tail_len"])) for side in ("output", "input")]
    windows = _windows(path, *lens[0])  # read once: the input's windows are as long unless the log was edited
    try:
        check_regions(path, fp, undo, "output", subject, _FIX, windows=windows)
    except LogMismatchError:
        if not _torn(path, fp, undo):
            raise
        return  # a torn file: _torn proved its restored windows are the logged input's
    if not _reverts_to_input(path, fp, undo, windows if lens[1] == lens[0] else None):
        raise LogMismatchError(f"{subject}: the log's original bytes do not give the logged input (size or head/tail "
                               f"fingerprint); the log was changed after the injection{_NOT_CHANGED}")


def _gives_input(path: str, fp: Mapping[str, Any], undo: Any, subject: str, verify: bool) -> bool:
    """The after-check of a revert: whether ``path`` is the logged input (:func:`check_regions`). With
    ``verify`` a file that is not raises; without, the answer is returned (False) and nothing is raised."""
    try:
        check_regions(path, fp, undo, "input", subject)
    except LogMismatchError:
        if verify:
            raise
        return False
    return True


def revert_regions(lg: Any, src: str, target: str, direct: bool, verify: bool = True,
                   before: Callable[[str], None] | None = None, after: Callable[[str], None] | None = None) -> bool:
    """Revert a log with region evidence: ``src`` itself (``direct``: only the touched ranges are rewritten, with
    SIGINT/SIGTERM deferred) or a copy of it renamed onto ``target``; checked before (the logged output, or it
    half-written by a killed run) and after (the logged input, :func:`check_regions`). ``verify=False`` writes
    the logged original bytes of the touched ranges into a file of the logged size whatever it holds, and still
    checks the result. Returns whether the result was checked to be the logged input (always True with
    ``verify``: a failed check raises).

    ``before`` (given the path checked) runs after the checks of the file and before the write, ``after`` (given
    the copy, once written; not called when ``direct``) before the rename: further checks of the log that may
    raise. The caller decides ``direct``: a log whose write is not proven before it is made (re-encoded chunks or
    members) is reverted in a copy."""
    fp, undo = _evidence(lg, src, "reverted")
    message = f"reverting {src} did not give the logged input back: {src}"
    if direct:
        _check_revertible(src, fp, undo, src, verify)
        if before is not None:
            before(src)
        with deferred_signals():
            undo.apply(src)
        return _gives_input(src, fp, undo, message, verify)
    with atomic_output(target) as tmp:
        kernel_copy(src, tmp)
        _check_revertible(tmp, fp, undo, src, verify)
        if before is not None:
            before(tmp)
        undo.apply(tmp, durable=False)  # the commit fsyncs the copy
        if after is not None:
            after(tmp)
        return _gives_input(tmp, fp, undo, message, verify)
