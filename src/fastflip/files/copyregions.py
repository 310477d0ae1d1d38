"""A new file with region evidence: the input copied in the kernel, only the touched bytes written from here.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Copy mode (a new file, or ``--in-place`` through a copy) with ``hash_files="regions"`` (the CLI's ``--evidence
regions``): the input is copied file to file in the kernel (:func:`fastflip.files.filebytes.kernel_copy`: its
bytes never pass through this process), then the plan's words, the zip CRC fields and the re-encoded chunks are
written into the copy (a page per site), and the log holds what :mod:`fastflip.files.fingerprint` describes:
every touched byte range with its old and new bytes, the size, and the head/tail fingerprints of the input and of
the output. No whole-file hash is taken of either, so the cost is the copy's.

Only patches that keep every byte where it is qualify (raw storage, chunks and members re-encoded at their size);
a plan that needs the HDF5 library's read-modify-write (other filters, compact data) or a member that changes
size is refused before anything is written. Used by :func:`fastflip.files.inject.write_plan`.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.plan import Plan
from ..errors import LogMismatchError, OptionError
from . import hashcache
from .fingerprint import check_regions, fingerprints, ranges_hold
from .filebytes import kernel_copy
from .h5apply import write_words_to_file
from .inplace import predict_patches, raw_positions
from .layout import Tensor
from .patches import patch_undo, write_patches
from .routes import ChunkPatches, SiteRoute

__all__ = ["write_copy_regions", "refuse_moving_bytes"]


def refuse_moving_bytes(src: str, h5_rest: Sequence[SiteRoute], cp: ChunkPatches, what: str,
                        needs: str = "region evidence") -> None:
    """Raise :class:`~fastflip.errors.OptionError` (one line, naming ``src`` and the fix ``what``) when ``needs``
    (region evidence, a direct in-place write) cannot describe or make the change: sites only the HDF5 library can
    rewrite, or a member whose size changes."""
    if h5_rest or cp.resized:
        why = "a member whose re-encoded size differs" if cp.resized else "other filtered or compact HDF5 data"
        raise OptionError(f"{src}: {needs} needs every changed byte to stay where it is (raw storage, or "
                          f"chunks/members re-encoded at their size); this plan touches {why}: {what}")


def write_copy_regions(src: str, tmp: str, plan: Plan, by_name: Mapping[str, Tensor], routes: list[SiteRoute],
                       cp: ChunkPatches, zipped: bool, finish: Any, algorithm: str,
                       writeback: bool = False) -> tuple[None, None, np.ndarray, np.ndarray, Any]:
    """Write ``src`` with ``plan`` applied to ``tmp`` (kernel copy, then the touched bytes) and call
    ``finish(None, None, old, new, undo, fingerprint=(input, output))``, which stages the log.

    Every byte written is worked out from ``src`` first (:func:`fastflip.files.inplace.predict_patches`), with the
    input's fingerprint; the words are stored in the copy natively (a page per site), the CRC fields and chunks as
    byte patches. Before ``finish``: the copy is checked to have held the logged old bytes in every touched range,
    the input unchanged since the start (its size, times and inode), and the copy to be the output the log
    describes (its windows and every touched range).
    """
    st0 = os.stat(src)
    raw, old, new, crcs, patches = predict_patches(src, plan, by_name, routes, cp, zipped)
    patches = sorted(patches)
    undo = patch_undo(patches, st0.st_size)
    fp_in, fp_out = fingerprints(src, algorithm, patches)
    kernel_copy(src, tmp, writeback=writeback)
    changed = f"{src} changed while it was being copied; nothing was written"
    encoded = crcs + cp.patches  # zip CRC fields and re-encoded chunks; the words are written natively
    held = patch_undo(encoded, st0.st_size)
    if not ranges_hold(tmp, held.offsets, held.lengths, held.data):  # the old bytes the log keeps are the input's
        raise LogMismatchError(changed)
    sites = [SiteRoute(r.tensor, r.positions[r.offsets >= 0], r.offsets[r.offsets >= 0]) for r in raw]
    prev, _ = write_words_to_file(tmp, plan, by_name, new, sites)  # returns the words the copy held before
    pos = raw_positions(sites)
    if not np.array_equal(prev[pos], old[pos]):
        raise LogMismatchError(changed)
    write_patches(tmp, encoded)
    if not hashcache.same_state(st0, os.stat(src)):
        raise LogMismatchError(changed)
    fp = {"algorithm": algorithm, "input": fp_in, "output": fp_out}
    check_regions(tmp, fp, undo, "output", f"the new copy of {src}")  # and the copy is the output it describes
    return None, None, old, new, finish(None, None, old, new, undo, fingerprint=(fp_in, fp_out))
