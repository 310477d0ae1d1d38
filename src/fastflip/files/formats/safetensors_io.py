"""safetensors files: an 8-byte little-endian header length, a JSON header, one raw buffer.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Each header entry ``{"dtype", "shape", "data_offsets": [begin, end]}`` places a tensor
at ``8 + header_length + begin`` in the file. The header is checked before anything is
used, as the ``safetensors`` library checks it: the sizes match dtype and shape, the ranges tile the data buffer
(no overlap, no gap, nothing after the last), the dtypes are the library's, ``__metadata__`` maps strings to
strings, and the header is strict JSON (no NaN, no lone surrogate escape). BF16 and the float8
types are listed as their unsigned words (``<u2``, ``|u1``) with their ``format`` (BF16, F8_E4M3, F8_E5M2). The ``safetensors``
package is not needed to read or inject; it is used by :mod:`fastflip.frameworks.convert` and tests.

Examples
--------
>>> import os, json, struct, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
>>> head = json.dumps({"fc.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
>>> _ = open(p, "wb").write(struct.pack("<Q", len(head)) + head + np.ones(2, "<f4").tobytes())
>>> t = read_safetensors_layout(p).tensors[0]
>>> t.path, t.role, t.layer, t.offset == 8 + len(head)
('/fc.weight', 'weight', 'fc', True)
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from ...core.records import Layout, Skipped, Tensor
from ...core.records import natural_key as _natural_key
from ...errors import FormatError
from .bounds import checked_ints, checked_numel
from .naming import label_tensors

__all__ = ["SAFETENSORS_DTYPES", "read_safetensors_header", "read_safetensors_layout"]

# words whose float format NumPy lacks: read as that format (fields, values, NaN/Inf) by fastflip.core.floatformats
_FLOAT_FORMATS = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
SAFETENSORS_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "|i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "|u1", "BOOL": "|b1",
    "F8_E4M3": "|u1", "F8_E5M2": "|u1", "F8_E8M0": "|u1",
}
_MAX_HEADER = 100 << 20
#: Bits of an element of the dtypes the safetensors library knows and fastflip skips (sizes still checked as it does).
_OTHER_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "C64": 64}


def read_safetensors_header(path: str) -> tuple[int, dict]:
    """(byte offset of the data buffer, header dict) of a safetensors file, checked for consistency."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise FormatError(f"{path}: truncated safetensors file (no header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise FormatError(f"{path}: safetensors header length {n} points outside the file ({size} bytes)")
        text = fh.read(n)
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        if b"\\u" in text:  # a lone surrogate ("\ud800") can come only from an escape: it is not UTF-8
            json.dumps(header, ensure_ascii=False).encode("utf-8")
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError, MemoryError) as exc:
        raise FormatError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: safetensors header is not a JSON object")
    base = 8 + n
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise FormatError(f"{path}: safetensors __metadata__ is not a map of strings to strings (the safetensors "
                          "library refuses it); the file is damaged or crafted")
    spans = []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name[:80]!r}"
        if not isinstance(e, dict) or not isinstance(e.get("dtype"), str) or "shape" not in e \
                or "data_offsets" not in e:
            raise FormatError(f"{path}: safetensors header entry {name[:80]!r} is malformed (needs a dtype string, "
                              "a shape and data_offsets)")
        dtype = e["dtype"]
        numel = checked_numel(e["shape"], where)  # integers >= 0, bounded before any product
        offs = checked_ints(e["data_offsets"], where, "data_offsets")
        if len(offs) != 2:
            raise FormatError(f"{where} declares {len(offs)} data_offsets (needs [begin, end])")
        b, end = offs
        if end < b or base + end > size:
            raise FormatError(f"{path}: tensor {name!r} claims bytes [{b}, {end}) of the data buffer, outside the file")
        bits = 8 * np.dtype(SAFETENSORS_DTYPES[dtype]).itemsize if dtype in SAFETENSORS_DTYPES else \
            _OTHER_BITS.get(dtype)
        if bits is None:
            raise FormatError(f"{path}: tensor {name[:80]!r} has dtype {dtype[:20]!r}, which the safetensors library "
                              "does not know; the file is damaged or crafted")
        if 8 * (end - b) != numel * bits:
            raise FormatError(f"{path}: tensor {name!r}: {end - b} bytes do not hold {dtype} {list(e['shape'])}")
        spans.append((b, end, name))
    at, before = 0, ""
    for b, end, name in sorted(spans):  # the library's rule: the tensors tile the data buffer, in offset order
        if b < at:
            raise FormatError(f"{path}: safetensors header claims overlapping ranges for {before[:80]!r} and "
                              f"{name[:80]!r}; the file is damaged or crafted")
        if b > at:
            raise FormatError(f"{path}: tensor {name[:80]!r} starts at byte {b} of the data buffer, not at {at} where "
                              "the tensor before it ends (the safetensors library refuses gaps); the file is damaged "
                              "or crafted")
        at, before = end, name
    if base + at != size:
        raise FormatError(f"{path}: the safetensors data buffer holds {size - base} bytes, its tensors {at} (the "
                          "safetensors library refuses a buffer they do not cover exactly); the file is damaged or "
                          "crafted")
    return base, header


def _no_constant(name: str) -> None:
    raise FormatError(f"safetensors header holds {name}, which is not JSON; the file is damaged or crafted")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict, refusing a key given twice (readers differ on which one counts)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise FormatError(f"safetensors header names {dup[:80]!r} twice; the file is damaged or crafted")
    return out


def read_safetensors_layout(path: str) -> Layout:
    """Every tensor of a safetensors file with its absolute byte offset (header only; data never read)."""
    base, header = read_safetensors_header(path)
    tensors: list[Tensor] = []
    skipped: list[Skipped] = []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        p = "/" + name
        shape = tuple(int(s) for s in e["shape"])
        if e["dtype"] not in SAFETENSORS_DTYPES:
            skipped.append(Skipped(p, f"unsupported dtype {e['dtype']}"))
            continue
        size = checked_numel(shape, p)
        if size == 0:
            skipped.append(Skipped(p, "empty"))
            continue
        dt = np.dtype(SAFETENSORS_DTYPES[e["dtype"]])
        tensors.append(Tensor(path=p, aliases=(p,), dtype=dt, shape=shape, size=size, storage="contiguous",
                              offset=base + int(e["data_offsets"][0]), nbytes=size * dt.itemsize,
                              format=_FLOAT_FORMATS.get(e["dtype"])))
    tensors.sort(key=lambda t: _natural_key(t.path))
    skipped.sort(key=lambda s: s.path)
    return Layout(file=path, tensors=label_tensors(tensors, "torch"), skipped=skipped, framework="torch",
                  format="safetensors")
