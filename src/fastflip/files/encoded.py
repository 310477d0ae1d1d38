"""Words that are not raw in the file: the entry points to the code that patches filtered HDF5 chunks
(:mod:`fastflip.files.h5chunks`) and reads and patches zip members (:mod:`fastflip.files.zipmembers`, their CRC
fields in :mod:`fastflip.files.formats.zipcrc`, whole members in :mod:`fastflip.files.formats.npz_members`), each
module imported when a plan (or a diff) has sites there.

Layer: ``files`` (may import core, kernels and files; imported by :mod:`fastflip.files.inject`,
:mod:`fastflip.files.h5apply`, :mod:`fastflip.files.patches`, :mod:`fastflip.files.diff` and above).

A plan whose sites all lie in raw storage (contiguous or unfiltered chunked HDF5, safetensors, stored members)
needs none of that code, and a command's start-up is part of its cost: ``fastflip inject`` into a contiguous
HDF5 file imports no zip reader and no chunk codec.

>>> import numpy as np
>>> from fastflip.core.plan import Plan, TensorRef
>>> from fastflip.core.records import Tensor
>>> plan = Plan.from_sites([TensorRef("/w", "<f4", (4,))], [0], [1], xor_mask=[1])
>>> t = Tensor("/w", ("/w",), np.dtype("<f4"), (4,), 4, "contiguous", offset=2048, nbytes=16)
>>> route = SiteRoute(t, np.array([0]), np.array([2052]))
>>> cp = encoded_patches("never-opened.h5", plan, [route], zipped=False)
>>> cp.patches, len(cp.handled)
([], 0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..core.plan import Plan
from .routes import ChunkPatches, SiteRoute

if TYPE_CHECKING:
    from .formats.zipcrc import MemberCrcs, ZipIndex

__all__ = ["encoded_patches", "say_h5py_notes", "member_words", "member_array", "zip_index", "zip_crc_patches",
           "zip_crc_fields", "member_crcs"]


def encoded_patches(path: str, plan: Plan, routes: Sequence[SiteRoute], zipped: bool) -> ChunkPatches:
    """Byte patches for the sites of ``routes`` without a raw file offset (offset -1): deflated members of a zip
    container (``zipped``: a torch.save file or ``.npz``) or filtered HDF5 chunks, re-encoded by
    :func:`fastflip.files.zipmembers.member_patches` or :func:`fastflip.files.h5chunks.chunk_patches`. Empty
    (and the file not opened) when every site is raw."""
    if not any((r.offsets < 0).any() for r in routes):
        return ChunkPatches()
    if zipped:
        from .zipmembers import member_patches

        return member_patches(path, plan, routes)
    from .h5chunks import chunk_patches

    return chunk_patches(path, plan, routes)


def say_h5py_notes(notes: Sequence[str], stacklevel: int = 1) -> None:
    """:func:`fastflip.files.h5chunks.say_notes`: warn why chunks go through h5py (``ChunkPatches.notes``), for the
    writer that really sends them there; ``stacklevel`` counts from the caller."""
    if notes:
        from .h5chunks import say_notes

        say_notes(notes, stacklevel + 1)


def member_words(path: str, plan: Plan, routes: Sequence[SiteRoute], out: np.ndarray) -> None:
    """:func:`fastflip.files.zipmembers.member_words`: the current words of sites in deflated zip members."""
    from .zipmembers import member_words as read

    read(path, plan, routes, out)


def zip_index(path: str) -> ZipIndex:
    """:func:`fastflip.files.formats.zipcrc.zip_index`: the zip's directory and local headers, read once for an
    inject's CRC work."""
    from .formats.zipcrc import zip_index as index

    return index(path)


def zip_crc_patches(path: str, offsets: np.ndarray, itemsize: np.ndarray, big: np.ndarray, old: np.ndarray,
                    new: np.ndarray, index: ZipIndex | None = None) -> list[tuple[int, bytes, bytes]]:
    """:func:`fastflip.files.formats.zipcrc.zip_crc_patches`: the CRC fields of a zip container that change."""
    from .formats.zipcrc import zip_crc_patches as crcs

    return crcs(path, offsets, itemsize, big, old, new, index)


def zip_crc_fields(path: str, pos: np.ndarray, delta: np.ndarray) -> list[tuple[str, list[int], int, bool, bytes]]:
    """Per stored zip entry of ``path`` holding one of the file offsets ``pos`` (bytes whose value changes by the
    XOR ``delta``): its name; the offsets of every copy of its CRC-32 where they lie by the directory, whatever
    they hold now (:func:`fastflip.files.formats.zipcrc.crc_spots` with ``check=False``: a direct injection killed
    part-way may have written some of them), the local header's field second; the change of its CRC-32 those
    bytes make (:func:`~fastflip.files.formats.zipcrc.crc_delta`); whether the local header defers to a data
    descriptor (flag bit 3: a writer may have left its field as it was); and the 4 bytes that field holds now (an
    injection writes it only where it holds the entry's CRC-32)."""
    from .formats.zipcrc import crc_spots, entry_crc_deltas, zip_index as index_of

    index = index_of(path)
    pos = np.asarray(pos, np.int64)
    out = []
    with open(path, "rb") as fh:
        for e, dcrc in entry_crc_deltas(index, pos, np.asarray(delta).astype(np.uint64), np.ones(len(pos), np.int64)):
            spots = crc_spots(fh, e, index.records[e.name], check=False)
            fh.seek(e.info.header_offset + 14)
            out.append((e.name, spots, dcrc, bool(e.info.flag_bits & 0x08), fh.read(4)))
    return out


def member_crcs(path: str, offsets: np.ndarray, index: ZipIndex | None = None) -> MemberCrcs:
    """:meth:`fastflip.files.formats.zipcrc.MemberCrcs.holding`: the CRC-32 check of the stored zip members holding
    one of the file ``offsets``, to be fed by a copy's pass over the file or read by itself."""
    from .formats.zipcrc import MemberCrcs as Crcs

    return Crcs.holding(path, offsets, index)


def member_array(path: str, key: str) -> np.ndarray:
    """:func:`fastflip.files.formats.npz_members.member_array`: the deflated ``.npz`` member of tensor ``key``,
    inflated."""
    from .formats.npz_members import member_array as inflate

    return inflate(path, key)
