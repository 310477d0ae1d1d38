"""A region-evidence log's byte ranges checked against its own records before a revert writes them.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A log with region evidence (:mod:`fastflip.files.fingerprint`) is verified by the file's size, the hashes of its
first and last MiB and the bytes of its touched ranges; the log itself is not signed. A log whose original bytes
were edited after the injection would have those bytes written wherever its ranges point. :func:`check_log_words`
refuses one, before anything is written, when its ranges disagree with its per-site records: at every site stored
raw (its byte offset read from the file's layout) the ranges' original and altered bytes must be the recorded old
and new word, and where every site is stored raw, every byte the ranges change must be one of those words or a
zip CRC field that follows them. Sites in compressed storage (re-encoded HDF5 chunks, re-deflated ``.npz``
members) are not checked here: their bytes are not words.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import FastflipError, LogMismatchError
from .encoded import encoded_patches, zip_crc_fields
from .filebytes import ByteUndo
from .h5apply import read_words, route_sites
from .layout import read_layout
from .patches import is_zip_container, word_patches

__all__ = ["check_log_words", "check_words"]


def _bytes_of(patches: Sequence[tuple[int, bytes, bytes]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(file offset, first version, second version) of every byte of ``(offset, first, second)`` patches."""
    pos = np.concatenate([np.arange(off, off + len(a), dtype=np.int64) for off, a, _ in patches])
    return (pos, np.frombuffer(b"".join(p[1] for p in patches), np.uint8),
            np.frombuffer(b"".join(p[2] for p in patches), np.uint8))


def _ranges_at(undo: ByteUndo, pos: np.ndarray, unchanged: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(original, altered) bytes the log's ranges hold at the file offsets ``pos``; ``unchanged`` where no range
    covers one."""
    got_old, got_new = unchanged.copy(), unchanged.copy()
    if len(undo.offsets):
        order = np.argsort(undo.offsets, kind="stable")
        offs, lens = undo.offsets[order], undo.lengths[order]
        first = (np.cumsum(undo.lengths) - undo.lengths)[order]  # each range's first byte in data / new_data
        i = np.clip(np.searchsorted(offs, pos, "right") - 1, 0, None)
        inside = (pos >= offs[i]) & (pos < offs[i] + lens[i])
        at = (first[i] + pos - offs[i])[inside]
        got_old[inside] = np.frombuffer(undo.data, np.uint8)[at]
        got_new[inside] = np.frombuffer(undo.new_data, np.uint8)[at]
    return got_old, got_new


def _changed_bytes(undo: ByteUndo) -> np.ndarray:
    """The file offsets at which the same-size ``undo``'s original and altered bytes differ."""
    if not len(undo.offsets):
        return np.zeros(0, np.int64)
    pos = np.concatenate([np.arange(o, o + n, dtype=np.int64)
                          for o, n in zip(undo.offsets.tolist(), undo.lengths.tolist())])
    return pos[np.frombuffer(undo.data, np.uint8) != np.frombuffer(undo.new_data, np.uint8)]


def check_log_words(lg: Any, path: str, src: str, side: str = "output", done: str | None = None) -> bool:
    """Raise :class:`~fastflip.errors.LogMismatchError` (one line) unless the region log ``lg``'s byte ranges are
    its recorded words at the raw sites of ``path`` and change no other byte than those words, their zip CRC
    fields and (``path`` the logged input) the re-encoded chunks or members of the other sites as fastflip
    re-encodes them from ``path``. ``side``: what ``path`` is (or a copy of), the logged "output" (a revert,
    before it writes) or "input" (a replay, before it copies; a revert's copy once written). ``src`` is the name
    the message gives, ending with ``done`` (what was left as it was). Returns whether that proved every byte the
    ranges change (False: ``path`` is the output and some sites are re-encoded; check the copy once written, with
    :func:`check_words` and this function given ``side`` "input")."""
    undo = lg.undo
    if undo is None:
        return True  # refused by the revert or replay with its own message
    done = done or ("nothing was changed" if side == "output" else "nothing was written")
    routes = route_sites(path, lg.plan, {t.path: t for t in read_layout(path).tensors})
    words = word_patches(routes, lg.old_words, lg.new_words)
    if words:
        pos, want_old, want_new = _bytes_of(words)
        got_old, got_new = _ranges_at(undo, pos, want_new)  # a word in no range: unchanged
        if not (np.array_equal(got_old, want_old) and np.array_equal(got_new, want_new)):
            raise LogMismatchError(f"{src}: the log's touched byte ranges do not hold its recorded old and new words; "
                                   f"the log was changed after the injection; {done}")
    encoded = any((r.offsets < 0).any() for r in routes)
    if encoded and side == "output":
        return False  # re-encoded from the input's chunks: known once the input is there
    zipped = is_zip_container(path)
    allowed = [_bytes_of(words)[0]] if words else []
    if words and zipped:
        allowed.append(zip_crc_fields(path, np.array([p[0] for p in words], np.int64)))
    if encoded:  # the chunks (members) the injection re-encoded, as fastflip re-encodes them from this input
        allowed += [np.arange(off, off + len(old), dtype=np.int64)
                    for off, old, _ in encoded_patches(path, lg.plan, routes, zipped).patches]
    stray = np.setdiff1d(_changed_bytes(undo), np.concatenate(allowed) if allowed else np.zeros(0, np.int64))
    if len(stray):
        raise LogMismatchError(f"{src}: the log's touched byte ranges change {len(stray)} byte(s) that are none of its "
                               f"recorded words (first at offset {int(stray[0])}); the log was changed after the "
                               f"injection; {done}")
    return True


def check_words(lg: Any, path: str, src: str, side: str) -> None:
    """Raise :class:`~fastflip.errors.LogMismatchError` (one line) unless ``path`` (a copy just written by a revert,
    ``side`` "input", or a replay, "output") holds the log's recorded old (new) word at every site, as the file's
    own reader decodes them (re-encoded HDF5 chunks and ``.npz`` members too), and (a revert) the log's ranges
    change no byte but those the injection re-encodes from that input (:func:`check_log_words`). ``src`` is the
    name the message gives."""
    want, which = (lg.old_words, "old") if side == "input" else (lg.new_words, "new")
    verb, done = ("reverting", "nothing was changed") if side == "input" else ("replaying onto", "nothing was written")
    try:
        same = np.array_equal(read_words(path, lg.plan, {t.path: t for t in read_layout(path).tensors}), want)
    except (FastflipError, OSError, ValueError) as exc:  # the log's bytes made a chunk or member its reader refuses
        same, why = False, f" (its reader: {(str(exc).splitlines() or [type(exc).__name__])[0][:120]})"
    else:
        why = ""
    if not same:
        raise LogMismatchError(f"{verb} {src} by the log gives other words than its recorded {which} words{why}; the "
                               f"log was changed after the injection; {done}")
    if side == "input":
        check_log_words(lg, path, src, "input", done)
