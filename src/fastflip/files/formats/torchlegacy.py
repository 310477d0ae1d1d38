"""Legacy (PyTorch < 1.6, non-zip) ``torch.save`` files read without running their pickle.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

The legacy format is a run of pickles followed by raw storages: the magic number
``0x1950a86a20f9469cfc6c``, the protocol version (1001), a ``sys_info`` dict (byte order,
type sizes), the saved object (tensors as persistent ids naming storages, exactly as in
the zip format), the sorted list of storage keys, then for each key in that order an
8-byte little-endian element count and the storage's bytes (little-endian). Every pickle
is read by :class:`~fastflip.files.formats.torchsave.RestrictedUnpickler` (nothing runs;
anything but tensor rebuilds and plain containers is refused), and the storages are
located by walking the counts, never reading their data. Tensors then lie at fixed byte
offsets, as in the zip format, and take the raw path; there is no checksum to update.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from ...errors import FormatError
from .torchsave import TORCH_DTYPES, layout_from_records, records_of, restricted_loads

__all__ = ["read_legacy_layout", "LEGACY_MAGIC"]

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_PROTOCOL = 1001


def read_legacy_layout(path: str) -> Any:
    """The :class:`~fastflip.core.records.Layout` of a legacy ``torch.save`` file (metadata and pickles only).

    Raises
    ------
    FormatError
        Not the legacy format, a big-endian file, storages missing or running past the end of the file.
    UnsafeInputError
        A pickle asks for anything but tensor rebuilds and plain containers.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        if restricted_loads(fh, path, legacy=True) != LEGACY_MAGIC:
            raise FormatError(f"{path}: not a legacy torch.save file (magic number differs)")
        if restricted_loads(fh, path, legacy=True) != _PROTOCOL:
            raise FormatError(f"{path}: legacy torch.save protocol other than {_PROTOCOL}")
        info = restricted_loads(fh, path, legacy=True)
        if not isinstance(info, dict) or info.get("little_endian") is not True:
            raise FormatError(f"{path}: legacy torch.save file written on a big-endian machine; load and re-save it")
        obj = restricted_loads(fh, path, legacy=True)
        keys = restricted_loads(fh, path, legacy=True)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise FormatError(f"{path}: legacy torch.save file with a malformed storage list")
        if len(set(keys)) != len(keys):  # torch would read the later copy over the earlier one
            raise FormatError(f"{path}: legacy torch.save file lists a storage twice; the file is damaged or crafted")
        recs = records_of(obj)
        itemsize, declared = {}, {}
        for _, rec in recs:
            if rec.storage.dtype in TORCH_DTYPES:
                itemsize[rec.storage.key] = int(TORCH_DTYPES[rec.storage.dtype][-1])
                declared[rec.storage.key] = rec.storage.numel
        storages: dict[str, tuple[int, int]] = {}
        at = fh.tell()
        for key in keys:
            fh.seek(at)
            head = fh.read(8)
            if len(head) != 8:
                raise FormatError(f"{path}: storage {key!r} runs past the end of the file (truncated)")
            (numel,) = struct.unpack("<q", head)
            if key not in itemsize:  # the counts that follow could not be walked
                raise FormatError(f"{path}: storage {key!r} has no element type fastflip reads; load and re-save "
                                  "the file with torch.save (zip format)")
            nbytes = numel * itemsize[key]
            if numel < 0 or at + 8 + nbytes > size:
                raise FormatError(f"{path}: storage {key!r} of {nbytes} bytes runs past the end of the file (truncated)")
            if numel != declared[key]:  # torch refuses a storage whose stored size differs from the pickle's
                raise FormatError(f"{path}: storage {key!r} holds {numel} elements but the pickle declares "
                                  f"{declared[key]}; the file is damaged or crafted")
            storages[key] = (at + 8, nbytes)
            at += 8 + nbytes
    return layout_from_records(path, obj, recs, storages, "little", "torch-legacy")
