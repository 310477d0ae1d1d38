"""A new file with region evidence: the input copied in the kernel, only the touched bytes written from here.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Copy mode (a new file, or ``--in-place`` through a copy) with ``hash_files="regions"`` (the CLI's ``--evidence
regions``): the input is copied file to file in the kernel (:func:`fastflip.files.filebytes.kernel_copy`: its
bytes never pass through this process), then the plan's words, the zip CRC fields and the re-encoded chunks are
checked and written into the copy in one pass over the touched ranges (:mod:`fastflip.files.rangeio`), and the
log holds what :mod:`fastflip.files.fingerprint` describes: every touched byte range with its old and new bytes,
the size, and the head/tail fingerprints of the input and of the output. No whole-file hash is taken of either,
so the cost is the copy's.

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
from .fingerprint import check_regions, copy_over_ranges, fingerprints
from .inplace import predict_patches
from .layout import Tensor
from .patches import patch_undo
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
                       cp: ChunkPatches, zipped: Any, finish: Any, algorithm: str,
                       writeback: bool = False) -> tuple[None, None, np.ndarray, np.ndarray, Any]:
    """Write ``src`` with ``plan`` applied to ``tmp`` (kernel copy, then the touched bytes) and call
    ``finish(None, None, old, new, undo, fingerprint=(input, output))``, which stages the log.

    Every byte written is worked out from ``src`` first (:func:`fastflip.files.inplace.predict_patches`), with the
    input's fingerprint. The copy is then checked once: one pass over the touched ranges
    (:func:`fastflip.files.rangeio.write_ranges`, native where built) reads each range, compares it with the
    logged old bytes and writes the logged new bytes (words, zip CRC fields and re-encoded chunks alike), and
    refuses at the first range that differs. Before ``finish``: the input unchanged since the start (its size,
    times and inode), and the copy's size and head/tail windows those of the output the log describes (the
    touched ranges hold the new bytes this pass wrote in full).
    """
    st0 = os.stat(src)
    _, old, new, _, patches = predict_patches(src, plan, by_name, routes, cp, zipped)
    patches = sorted(patches)
    undo = patch_undo(patches, st0.st_size)
    fp_in, fp_out = fingerprints(src, algorithm, patches)
    held = copy_over_ranges(src, tmp, undo, writeback=writeback)
    if not held or not hashcache.same_state(st0, os.stat(src)):  # the logged old bytes are not the input's
        raise LogMismatchError(f"{src} changed while it was being copied; nothing was written")
    fp = {"algorithm": algorithm, "input": fp_in, "output": fp_out}
    check_regions(tmp, fp, undo, "output", f"the new copy of {src}", ranges=False)  # the output it describes
    return None, None, old, new, finish(None, None, old, new, undo, fingerprint=(fp_in, fp_out))
