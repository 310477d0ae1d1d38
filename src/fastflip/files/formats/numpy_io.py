"""NumPy ``.npy`` files and ``.npz`` archives: where each array's bytes lie.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A ``.npy`` file is a magic string, a header (dtype, fortran_order, shape) and the raw
array; an ``.npz`` file is a zip of ``.npy`` members. Members stored uncompressed
(``np.savez``) have fixed byte offsets in the archive and take the raw path; members of
``np.savez_compressed`` archives are deflated: they are listed with ``storage='filtered'``
and ``filters=('deflate',)``, and the touched ones are inflated, patched and re-deflated
(:mod:`fastflip.files.zipmembers`). Object arrays are never unpickled; Fortran-ordered
arrays are skipped (their flat order is not C order).

Examples
--------
>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "w.npz")
>>> np.savez(p, conv1_weight=np.ones((2, 2), ">f8"), step=np.int64(3))
>>> [(t.path, t.dtype.str, t.shape) for t in read_numpy_layout(p, "npz").tensors]
[('/conv1_weight', '>f8', (2, 2)), ('/step', '<i8', ())]
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from ...core.dtypes import is_supported_dtype
from ...core.records import Layout, Skipped, Tensor
from ...core.records import natural_key as _natural_key
from ...errors import FormatError
from .bounds import checked_numel
from .naming import label_tensors
from .npyheader import npy_header
from .npz_members import member_npy_header
from .zipcrc import check_every_crc
from .zipraw import stored_entries

__all__ = ["npy_header", "read_numpy_layout"]


def _tensor(name: str, dt: np.dtype, fortran: bool, shape: tuple[int, ...], offset: int | None,
            skipped: list[Skipped]) -> Tensor | None:
    if dt.hasobject:
        skipped.append(Skipped(name, "object array (never unpickled)"))
    elif not is_supported_dtype(dt) or dt.fields is not None:
        skipped.append(Skipped(name, f"unsupported dtype {dt}"))
    elif fortran and sum(s > 1 for s in shape) > 1:
        skipped.append(Skipped(name, "Fortran-ordered array (flat order is not C order); save np.ascontiguousarray"))
    elif (size := checked_numel(shape, name)) == 0:
        skipped.append(Skipped(name, "empty"))
    else:
        if offset is None:  # a deflated member: one "chunk", the whole array
            return Tensor(path=name, aliases=(name,), dtype=dt, shape=shape, size=size, storage="filtered",
                          chunks=shape, filters=("deflate",), nbytes=size * dt.itemsize)
        return Tensor(path=name, aliases=(name,), dtype=dt, shape=shape, size=size, storage="contiguous",
                      offset=offset, nbytes=size * dt.itemsize)
    return None


def read_numpy_layout(path: str, fmt: str, verify: bool = False) -> Layout:
    """Tensors of a ``.npy`` file (one, named ``/array``) or an ``.npz`` archive (``/<member>``).

    Headers only, unless ``verify``: then every member of an ``.npz`` is read once as ``np.load`` reads it (its
    CRC-32 checked, :func:`fastflip.files.formats.zipcrc.check_every_crc`) and an archive holding a member
    ``np.load`` refuses is refused. An inject checks the members it flips instead.
    """
    tensors: list[Tensor] = []
    skipped: list[Skipped] = []
    if fmt == "npy":
        with open(path, "rb") as fh:
            dt, fortran, shape, hlen = npy_header(fh, os.path.getsize(path), path)
        t = _tensor("/array", dt, fortran, shape, hlen, skipped)
        tensors = [t] if t else []
    else:
        entries = stored_entries(path)
        for name in entries:  # np.load looks "k" up as "k", then "k.npy": member "k.npy.npy" would be out of its reach
            if name.endswith(".npy") and name[:-4] in entries:
                raise FormatError(f"{path}: members {name[:-4]!r} and {name!r} both answer to the key {name[:-8]!r} or "
                                  f"{name[:-4]!r} in np.load; the file is damaged or crafted")
        with open(path, "rb") as fh:
            for name, e in entries.items():
                key = "/" + (name[:-4] if name.endswith(".npy") else name)
                if e.info.flag_bits & 0x1:
                    raise FormatError(f"{path}: member {name} is encrypted; fastflip reads unencrypted archives only")
                if not e.stored and e.info.compress_type != zipfile.ZIP_DEFLATED:
                    skipped.append(Skipped(key, f"zip compression method {e.info.compress_type} (only stored and "
                                                "deflate members are read)"))
                    continue
                if e.stored:
                    fh.seek(e.offset)
                    dt, fortran, shape, hlen = npy_header(fh, e.size, f"{path}:{name}")
                else:
                    dt, fortran, shape, hlen = member_npy_header(path, e, fh)
                t = _tensor(key, dt, fortran, shape, e.offset + hlen if e.stored else None, skipped)
                if t:
                    tensors.append(t)
        if verify:
            check_every_crc(path, "np.load")
    tensors.sort(key=lambda t: _natural_key(t.path))
    skipped.sort(key=lambda s: s.path)
    return Layout(file=path, tensors=label_tensors(tensors, None), skipped=skipped, framework=None, format=fmt)
