"""A region-evidence log's byte ranges checked against its own records before a revert writes them.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A log with region evidence (:mod:`fastflip.files.fingerprint`) is verified by the file's size, the hashes of its
first and last MiB and the bytes of its touched ranges; the log itself is not signed. A log whose original bytes
were edited after the injection would have those bytes written wherever its ranges point. :func:`check_log_words`
refuses one, before anything is written, when its ranges disagree with its per-site records: at every site stored
raw (its byte offset read from the file's layout) the ranges' original and altered bytes must be the recorded old
and new word; the CRC-32 fields of the zip entries holding those words must change, in the log, by exactly what
the recorded words change the CRC by (every copy of one field alike); the chunks or members the injection
re-encoded must be, in the log, what fastflip re-encodes from the input (checked where the input is there: a
replay's input, a revert's copy once written); and no other byte may change.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import FastflipError, LogMismatchError
from .encoded import encoded_patches, zip_crc_fields
from .filebytes import ByteUndo
from .h5apply import read_words, route_sites
from .layout import read_layout
from .patches import is_zip_container, word_undo
from .routes import SiteRoute

__all__ = ["check_log_words", "check_words", "log_routes", "has_encoded"]

_CHANGED = "the log was changed after the injection"


def log_routes(lg: Any, path: str) -> list[SiteRoute]:
    """The routes of the log ``lg``'s plan sites in the file at ``path`` (its layout read once): what
    :func:`check_log_words` and :func:`check_words` take, read once for a revert or replay and its copy (a
    region log's injection keeps every chunk and member in its place and size)."""
    return route_sites(path, lg.plan, {t.path: t for t in read_layout(path).tensors})


def has_encoded(routes: Sequence[SiteRoute]) -> bool:
    """Whether some site of ``routes`` lies in compressed storage (a re-encoded HDF5 chunk or ``.npz`` member)."""
    return any((r.offsets < 0).any() for r in routes)


def _positions(offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The file offset of every byte of the ranges (``offsets``, ``lengths``), in order."""
    lengths = np.asarray(lengths, np.int64)
    starts = np.asarray(offsets, np.int64) - (np.cumsum(lengths) - lengths)
    return np.repeat(starts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def _bytes_of(patches: Sequence[tuple[int, bytes, bytes]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(file offset, first version, second version) of every byte of ``(offset, first, second)`` patches."""
    pos = _positions(np.array([p[0] for p in patches], np.int64), np.array([len(p[1]) for p in patches], np.int64))
    return (pos, np.frombuffer(b"".join(p[1] for p in patches), np.uint8),
            np.frombuffer(b"".join(p[2] for p in patches), np.uint8))


def _ranges_at(undo: ByteUndo, pos: np.ndarray, unchanged: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(original, altered, covered) bytes the log's ranges hold at the file offsets ``pos``; ``unchanged`` (and
    covered False) where no range covers one."""
    got_old, got_new = unchanged.copy(), unchanged.copy()
    inside = np.zeros(len(pos), bool)
    if len(undo.offsets):
        order = np.argsort(undo.offsets, kind="stable")
        offs, lens = undo.offsets[order], undo.lengths[order]
        first = (np.cumsum(undo.lengths) - undo.lengths)[order]  # each range's first byte in data / new_data
        i = np.clip(np.searchsorted(offs, pos, "right") - 1, 0, None)
        inside = (pos >= offs[i]) & (pos < offs[i] + lens[i])
        at = (first[i] + pos - offs[i])[inside]
        got_old[inside] = np.frombuffer(undo.data, np.uint8)[at]
        got_new[inside] = np.frombuffer(undo.new_data, np.uint8)[at]
    return got_old, got_new, inside


def _changed_bytes(undo: ByteUndo) -> np.ndarray:
    """The file offsets at which the same-size ``undo``'s original and altered bytes differ."""
    pos = _positions(undo.offsets, undo.lengths)
    return pos[np.frombuffer(undo.data, np.uint8) != np.frombuffer(undo.new_data, np.uint8)]


def _crc_fields(undo: ByteUndo, path: str, pos: np.ndarray, delta: np.ndarray, src: str, done: str) -> np.ndarray:
    """Refuse the log unless, for every stored zip entry of ``path`` holding a byte of the recorded words (file
    offsets ``pos``, ``delta`` the XOR of their old and new bytes), the log changes each copy of the entry's
    CRC-32 (central directory, local header, data descriptor) from one old value to one new value, the two
    differing by the CRC change of the words (:func:`~fastflip.files.encoded.zip_crc_fields`). The local header's
    field may be left as it is where it defers to a data descriptor (flag bit 3) or where ``path`` holds there
    neither the log's old nor its new CRC-32 (an injection writes it only where it holds the CRC; zipfile, and so
    np.load, reads the directory's): a log that leaves a field holding one of them as it is was edited. Needs only
    the log and the zip's directory. Returns the file offsets of every byte of those fields (the bytes besides the
    words the log may change)."""
    fields: list[np.ndarray] = []
    for name, spots, dcrc, deferred, local_now in zip_crc_fields(path, pos, delta):
        field = (np.array(spots, np.int64).reshape(-1, 1) + np.arange(4)).ravel()
        old, new, inside = (a.reshape(-1, 4) for a in _ranges_at(undo, field, np.zeros(len(field), np.uint8)))
        old_v, new_v = old.view("<u4").ravel(), new.view("<u4").ravel()
        kept = (~inside | (old == new)).all(axis=1)  # fields the log leaves as they are
        written = inside.all(axis=1) & (old_v ^ new_v == dcrc) & (old_v == old_v[0]) & (new_v == new_v[0])
        stale = deferred or local_now not in (old[0].tobytes(), new[0].tobytes())
        optional = np.arange(len(spots)) == 1 if stale else np.zeros(len(spots), bool)  # the local header's field
        if not (kept.all() if not dcrc else written[0] and (written | (optional & kept)).all()):
            raise LogMismatchError(f"{src}: the log's touched byte ranges do not change the CRC-32 fields of zip "
                                   f"member {name} as its recorded words do; {_CHANGED}; {done}")
        fields.append(field)
    return np.concatenate(fields) if fields else np.zeros(0, np.int64)


def _encoded(undo: ByteUndo, path: str, lg: Any, routes: Sequence[SiteRoute], zipped: bool, src: str,
             done: str) -> np.ndarray:
    """Refuse the log unless its ranges hold, over each chunk (member) the injection re-encoded, the bytes
    fastflip re-encodes from the input ``path`` (:func:`~fastflip.files.encoded.encoded_patches`): the same
    original bytes (else ``path`` is not the logged input) and the same altered ones (else the log was edited).
    Returns the file offsets of every byte of those chunks."""
    patches = encoded_patches(path, lg.plan, routes, zipped).patches
    if not patches:
        return np.zeros(0, np.int64)
    pos, now, want = _bytes_of(patches)
    got_old, got_new, _ = _ranges_at(undo, pos, now)  # a byte in no range: left as the input holds it
    if not np.array_equal(got_old, now):
        raise LogMismatchError(f"{src} is not the logged input (the bytes of a touched range differ); {done}")
    if not np.array_equal(got_new, want):
        raise LogMismatchError(f"{src}: the log's touched byte ranges do not hold the chunks (members) its recorded "
                               f"words re-encode to; {_CHANGED}; {done}")
    return pos


def check_log_words(lg: Any, path: str, src: str, side: str = "output", done: str | None = None,
                    routes: Sequence[SiteRoute] | None = None) -> None:
    """Raise :class:`~fastflip.errors.LogMismatchError` (one line) unless the region log ``lg``'s byte ranges are
    its recorded words at the raw sites of ``path``, change their zip CRC fields by what those words change the
    CRC by, and change no other byte than those and (``path`` the logged input) the re-encoded chunks or members
    of the other sites, each as fastflip re-encodes it from ``path``. ``side``: what ``path`` is (or a copy of),
    the logged "output" (a direct revert, before it writes: a log with re-encoded sites is reverted in a copy and
    checked there) or "input" (a replay, before it copies; a revert's copy once written). ``src`` is the name
    the message gives, ending with ``done`` (what was left as it was); ``routes``: :func:`log_routes` of
    ``path`` (or of the file it is a copy of), else read here."""
    undo = lg.undo
    if undo is None:
        return  # refused by the revert or replay with its own message
    done = done or ("nothing was changed" if side == "output" else "nothing was written")
    routes = routes if routes is not None else log_routes(lg, path)
    words = word_undo(routes, lg.old_words, lg.new_words, [], undo.size)  # the raw sites' stored bytes
    allowed = []
    if len(words.offsets):
        pos = _positions(words.offsets, words.lengths)
        want_old, want_new = np.frombuffer(words.data, np.uint8), np.frombuffer(words.new_data, np.uint8)
        got_old, got_new, _ = _ranges_at(undo, pos, want_new)  # a word in no range: unchanged
        if not (np.array_equal(got_old, want_old) and np.array_equal(got_new, want_new)):
            raise LogMismatchError(f"{src}: the log's touched byte ranges do not hold its recorded old and new words; "
                                   f"{_CHANGED}; {done}")
        allowed.append(pos)
    encoded = has_encoded(routes)
    if encoded and side == "output":
        return  # re-encoded from the input's chunks: known once the input is there
    zipped = is_zip_container(path)
    if len(words.offsets) and zipped:
        allowed.append(_crc_fields(undo, path, pos, want_old ^ want_new, src, done))
    if encoded:
        allowed.append(_encoded(undo, path, lg, routes, zipped, src, done))
    stray = np.setdiff1d(_changed_bytes(undo), np.concatenate(allowed) if allowed else np.zeros(0, np.int64))
    if len(stray):
        raise LogMismatchError(f"{src}: the log's touched byte ranges change {len(stray)} byte(s) that are none of its "
                               f"recorded words (first at offset {int(stray[0])}); {_CHANGED}; {done}")


def check_words(lg: Any, path: str, src: str, side: str, routes: Sequence[SiteRoute] | None = None) -> None:
    """Raise :class:`~fastflip.errors.LogMismatchError` (one line) unless ``path`` (a copy just written by a revert,
    ``side`` "input", or a replay, "output") holds the log's recorded old (new) word at every site, as the file's
    own reader decodes them (re-encoded HDF5 chunks and ``.npz`` members too), and (a revert) the log's ranges
    change no byte but those the injection re-encodes from that input (:func:`check_log_words`). ``src`` is the
    name the message gives; ``routes``: :func:`log_routes` of ``path`` or the file it is a copy of."""
    want, which = (lg.old_words, "old") if side == "input" else (lg.new_words, "new")
    verb, done = ("reverting", "nothing was changed") if side == "input" else ("replaying onto", "nothing was written")
    routes = list(routes) if routes is not None else log_routes(lg, path)
    try:
        same = np.array_equal(read_words(path, lg.plan, {}, routes), want)
    except (FastflipError, OSError, ValueError) as exc:  # the log's bytes made a chunk or member its reader refuses
        same, why = False, f" (its reader: {(str(exc).splitlines() or [type(exc).__name__])[0][:120]})"
    else:
        why = ""
    if not same:
        raise LogMismatchError(f"{verb} {src} by the log gives other words than its recorded {which} words{why}; "
                               f"{_CHANGED}; {done}")
    if side == "input":
        check_log_words(lg, path, src, "input", done, routes)
