"""The records the file-patching modules share: where a plan's sites lie in a file, and byte patches.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

:class:`SiteRoute` (built by :func:`fastflip.files.h5apply.route_sites`) says, for one tensor of a plan,
which plan positions are its sites and at which absolute byte offsets they lie (``-1``: reached through
HDF5). :class:`ChunkPatches` is the result of patching compressed storage: filtered HDF5 chunks
(:func:`fastflip.files.h5chunks.chunk_patches`) and compressed ``.npz`` members
(:func:`fastflip.files.zipmembers.member_patches`). Both sit here, below the three modules that use
them, so that those import each other in one direction only.

Examples
--------
>>> ChunkPatches().handled.tolist(), ChunkPatches().resized
([], False)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.records import Tensor

__all__ = ["SiteRoute", "ChunkPatches"]


@dataclass
class SiteRoute:
    """For one tensor of a plan: positions of its sites, and byte offsets (-1 = hdf5 path)."""

    tensor: Tensor
    positions: np.ndarray  # positions in the plan
    offsets: np.ndarray  # int64, -1 where the hdf5 path is needed


@dataclass
class ChunkPatches:
    """Byte patches of compressed storage (HDF5 chunks, ``.npz`` members), and the words of the sites they cover."""

    patches: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    handled: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # plan positions covered
    old: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # their words (same order)
    new: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    chunks: int = 0
    resized: bool = False  # some patch replaces a range by bytes of another length (a re-deflated zip member)
    notes: list[str] = field(default_factory=list)  # why some chunks were left for h5py (said where h5py writes them)
