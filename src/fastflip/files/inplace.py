"""Non-atomic in-place injection: the words rewritten where they lie, the log committed before the first one.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

The fast path of campaign trials and scripts (``inject_file(..., in_place=True, atomic=False)``): raw storage,
or chunks/members re-encoded at their size. With a log file, every byte to be written is worked out first
(the sites' old and new words, zip CRC fields, re-encoded chunks), the file's hash now and the hash it will
have are taken from one read, the log (with the undo bytes) is committed, and only then are the words
written — in one section with SIGINT/SIGTERM deferred. Without a log file there is no evidence to order, and
the words are simply written (with ``hash_files=True`` both hashes still come from one read). With
``hash_files="regions"`` the log holds, instead of whole-file hashes, every byte range written (old and new
bytes) and a fingerprint (:mod:`fastflip.files.fingerprint`): the cost follows the flips. Used by
:func:`fastflip.files.inject.inject_file`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..core.plan import Plan
from ..errors import LogMismatchError
from .filebytes import hash_with_patches
from .fileio import Staging, deferred_signals
from .fingerprint import fingerprints
from .h5apply import apply_plan_to_file, read_words, write_words_to_file
from .layout import Tensor
from .patches import Patch, crc_patches, delta_patches, expected_new, word_patches, word_undo, write_patches
from .routes import ChunkPatches, SiteRoute

if TYPE_CHECKING:
    from .formats.zipcrc import ZipIndex

__all__ = ["predict_words", "predict_patches", "raw_positions", "write_in_place", "write_unlogged"]


def write_unlogged(src: str, plan: Plan, by_name: Mapping[str, Tensor], routes: Any, cp: Any, zipped: ZipIndex | None,
                    backend: str, hash_files: bool | str, finish: Any, algorithm: str = "sha256",
                    member_crcs: Any = None) -> tuple[str | None, str | None, np.ndarray, np.ndarray, Any]:
    """Non-atomic in place with no log file (the log stays in memory).

    With ``hash_files=True`` the file's hash now and the hash it will have come from one read, as in
    :func:`write_in_place` (with nothing staged to commit first); otherwise the plan is applied, then described
    (a fingerprint, ``"regions"``, would guard nothing without a log file). ``zipped``: the
    :func:`~fastflip.files.encoded.zip_index` of a zip container (its CRC fields follow the words), else None.
    Where bytes besides the words are written (CRC fields, re-encoded members or chunks) the log's undo holds
    every byte written, so the caller's undo (a campaign trial's) writes them back without working them out
    again."""
    if hash_files is True:
        return write_in_place(src, plan, by_name, routes, cp, zipped, backend, True, finish, Staging(), algorithm,
                              member_crcs)
    old, new, _ = apply_plan_to_file(src, plan, by_name, [r for r in routes if (r.offsets >= 0).any()], backend)
    undo = None
    crcs = crc_patches(src, routes, old, new, zipped) if zipped else []
    write_patches(src, crcs)
    if cp.patches:
        old[cp.handled], new[cp.handled] = cp.old, cp.new
        write_patches(src, cp.patches)
    if cp.patches or crcs:
        undo = word_undo(routes, old, new, cp.patches + crcs, os.path.getsize(src))
    return None, None, old, new, finish(None, None, old, new, undo)


def predict_words(src: str, plan: Plan, by_name: Mapping[str, Tensor], routes: Sequence[SiteRoute],
                  cp: ChunkPatches, zipped: ZipIndex | None
                  ) -> tuple[list[SiteRoute], np.ndarray, np.ndarray, list[Patch]]:
    """The words ``plan`` writes into ``src`` (or a copy of it), worked out from ``src`` without writing:
    ``(raw, old, new, crcs)`` — the routes with raw-storage sites, the sites' old and new words (plan order;
    re-encoded chunks' from ``cp``) and the zip CRC-field patches (``zipped``: the container's
    :func:`~fastflip.files.encoded.zip_index`; None: not a zip container)."""
    raw = [r for r in routes if (r.offsets >= 0).any()]
    old = read_words(src, plan, by_name, raw)
    new = expected_new(plan, routes, old)
    crcs = crc_patches(src, routes, old, new, zipped) if zipped else []
    if len(cp.handled):
        old[cp.handled], new[cp.handled] = cp.old, cp.new
    return raw, old, new, crcs


def predict_patches(src: str, plan: Plan, by_name: Mapping[str, Tensor], routes: Sequence[SiteRoute],
                    cp: ChunkPatches, zipped: ZipIndex | None
                    ) -> tuple[list[SiteRoute], np.ndarray, np.ndarray, list[Patch], list[Patch]]:
    """:func:`predict_words` and every same-size ``(offset, old bytes, new bytes)`` patch the plan writes:
    ``(raw, old, new, crcs, patches)``, the patches being ``cp``'s re-encoded chunks, the CRC fields and the raw
    words."""
    raw, old, new, crcs = predict_words(src, plan, by_name, routes, cp, zipped)
    return raw, old, new, crcs, cp.patches + crcs + word_patches(routes, old, new)


def raw_positions(raw: Sequence[SiteRoute]) -> np.ndarray:
    """The plan positions of the sites of ``raw`` that have a file offset (raw storage)."""
    return np.concatenate([r.positions[r.offsets >= 0] for r in raw]) if raw else np.zeros(0, np.int64)


def write_in_place(src: str, plan: Plan, by_name: Mapping[str, Tensor], routes: Any, cp: Any, zipped: ZipIndex | None,
                    backend: str, hash_files: bool | str, finish: Any, stage: Staging, algorithm: str = "sha256",
                    member_crcs: Any = None) -> tuple[str | None, str | None, np.ndarray, np.ndarray, Any]:
    """Non-atomic in place: predict every byte the plan writes, commit the log (and its undo data), then write.

    ``member_crcs`` (a :class:`fastflip.files.formats.zipcrc.MemberCrcs`, with ``hash_files=True``) is fed by the
    whole-file hash pass and verified before the log is made: the ``.npz`` members are checked on that one read."""
    raw, old, new, crcs = predict_words(src, plan, by_name, routes, cp, zipped)
    delta = word_undo(routes, old, new, cp.patches + crcs, os.path.getsize(src))  # every byte written, both ways
    regions = hash_files == "regions"  # evidence: the touched byte ranges and a fingerprint, no whole-file pass
    undo = delta if cp.patches or regions else None
    in_hash = out_hash = None
    if regions:
        result = finish(None, None, old, new, undo, fingerprint=fingerprints(src, algorithm, delta))
    else:
        if hash_files:  # one read of the file: its hash now and the hash it will have once the patches are written
            in_hash, out_hash = hash_with_patches(src, delta_patches(delta, forward=True) or [], algorithm,
                                                  feed=member_crcs)
        if member_crcs is not None:
            member_crcs.verify()  # before the log: a refused member leaves the file and its logs as they were
        result = finish(in_hash, out_hash, old, new, undo)
    with deferred_signals():  # one section: the log, then the words
        stage.commit()  # the evidence is durable before the file changes (the data need not be: it follows)
        got_old, got_new, _ = apply_plan_to_file(src, plan, by_name, raw, backend)
        write_patches(src, crcs + cp.patches)
    raw_pos = raw_positions(raw)
    if not (np.array_equal(got_old[raw_pos], old[raw_pos]) and np.array_equal(got_new[raw_pos], new[raw_pos])):
        write_words_to_file(src, plan, by_name, got_old, raw)  # changed between the read and the write: undone
        write_patches(src, crcs + cp.patches, new=False)
        raise LogMismatchError(f"{src} changed while it was being injected; its words were put back")
    return in_hash, out_hash, old, new, result
