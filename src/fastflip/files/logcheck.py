"""Validation of a loaded injection log: every field checked before anything is written with it.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A log is evidence and an instruction (replay and revert write what it says), so a
damaged or tampered one must be refused with one line, never half-applied and never a
traceback. :func:`validate_log` checks the manifest's types, the record columns'
dtypes, lengths and ranges (tensor positions, element indices against each tensor's
shape, words and masks against the word width) and the undo ranges against the byte
blobs. Matching the log to the file (names, dtypes, shapes, byte offsets inside the
file) is done where the file is opened (:func:`fastflip.files.h5apply.route_sites`).

Examples
--------
>>> import numpy as np
>>> m = {"format": "fastflip-log/1", "tensors": [{"name": "/w", "dtype": "<f4", "shape": [2]}], "undo": None}
>>> cols = {c: np.zeros(1, np.uint64) for c in ("bits", "and_mask", "or_mask", "xor_mask", "old_word", "new_word")}
>>> cols.update(tensor=np.zeros(1, np.int32), index=np.array([5]), scale=np.full(1, np.nan),
...             old_value=np.zeros(1), new_value=np.zeros(1))
>>> validate_log("x.fflog", m, cols)
Traceback (most recent call last):
...
fastflip.errors.LogMismatchError: x.fflog: damaged log: record 0 indexes element 5 of /w, which has 2
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

import numpy as np

from ..core.dtypes import word_type
from ..errors import FastflipError, LogMismatchError
from . import hashing

__all__ = ["validate_log", "MAX_ELEMENTS"]

MAX_ELEMENTS = 2**62  # flat element indices are int64; larger tensors cannot be addressed
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX = re.compile(r"^[0-9a-f]{8,256}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
_KINDS = {"tensor": "iu", "index": "iu", "bits": "u", "and_mask": "u", "or_mask": "u", "xor_mask": "u", "scale": "f",
          "old_word": "u", "new_word": "u", "old_value": "f", "new_value": "f"}


def _bad(path: str, what: str) -> LogMismatchError:
    return LogMismatchError(f"{path}: damaged log: {what}")


def _int(path: str, v: Any, what: str, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise _bad(path, f"{what} must be an integer >= {lo} (got {v!r:.40})")
    return v


def _check_file_entry(path: str, m: Mapping[str, Any], key: str) -> None:
    e = m.get(key)
    if e is None:
        return
    if not isinstance(e, dict):
        raise _bad(path, f"{key} must be an object")
    h = e.get("sha256")
    if h is not None and (not isinstance(h, str) or not _HEX64.match(h)):
        raise _bad(path, f"{key}.sha256 must be 64 hex digits or null")
    if "hash_algorithm" in e:
        name, digest = e["hash_algorithm"], e.get("hash")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _bad(path, f"{key}.hash_algorithm must be an algorithm's name (got {name!r:.40})")
        if digest is not None and (not isinstance(digest, str) or not _HEX.match(digest)
                                   or (name in hashing.known() and not hashing.check_digest(name, digest))):
            raise _bad(path, f"{key}.hash must be a {name} hex digest or null")
    if e.get("path") is not None and not isinstance(e["path"], str):
        raise _bad(path, f"{key}.path must be a string")
    if e.get("size") is not None:
        _int(path, e["size"], f"{key}.size")


def _check_fingerprint(path: str, fp: Any) -> None:
    """The region evidence of a direct in-place log (:mod:`fastflip.files.fingerprint`)."""
    if not isinstance(fp, dict) or not isinstance(fp.get("algorithm"), str) or not _NAME.match(fp["algorithm"]):
        raise _bad(path, "fingerprint must be an object naming its algorithm")
    for side in ("input", "output"):
        e = fp.get(side)
        if not isinstance(e, dict):
            raise _bad(path, f"fingerprint.{side} must be an object")
        for k in ("size", "head_len", "tail_len"):
            _int(path, e.get(k), f"fingerprint.{side}.{k}")
        for k in ("head", "tail"):
            if not isinstance(e.get(k), str) or not _HEX.match(e[k]):
                raise _bad(path, f"fingerprint.{side}.{k} must be a hex digest")


def validate_tensors(path: str, m: Mapping[str, Any]) -> list[tuple[str, str, tuple[int, ...]]]:
    """The manifest's ``tensors`` as (name, dtype, shape), each field type- and range-checked."""
    ts = m.get("tensors")
    if not isinstance(ts, list):
        raise _bad(path, "tensors must be a list")
    out = []
    for i, t in enumerate(ts):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("dtype"), str):
            raise _bad(path, f"tensors[{i}] needs a string name and dtype")
        fmt = t.get("format")  # bfloat16 / float8 words (optional)
        try:
            dt = np.dtype(t["dtype"])
            if fmt is not None and not isinstance(fmt, str):
                raise TypeError
            word_type(dt, fmt)
        except (TypeError, ValueError, FastflipError):
            raise _bad(path, f"tensors[{i}] has an unsupported dtype {t['dtype']!r:.40} "
                             f"(format {fmt!r:.40})") from None
        shape = t.get("shape")
        if not isinstance(shape, list) or len(shape) > 64:
            raise _bad(path, f"tensors[{i}].shape must be a list of at most 64 sizes")
        dims = tuple(_int(path, s, f"tensors[{i}].shape") for s in shape)
        if math.prod(dims) > MAX_ELEMENTS:
            raise _bad(path, f"tensors[{i}] declares {math.prod(dims)} elements, more than can be addressed (2**62)")
        out.append((t["name"], dt.str, dims))
    return out


def validate_log(path: str, m: Any, cols: Mapping[str, np.ndarray], undo_blobs: tuple[bytes, bytes] | None = None,
                 undo_cols: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Raise :class:`~fastflip.errors.LogMismatchError` (one line) unless the log is well formed."""
    if not isinstance(m, dict):
        raise _bad(path, "manifest.json is not an object")
    tensors = validate_tensors(path, m)
    for key in ("input", "output"):
        _check_file_entry(path, m, key)
    if m.get("fingerprint") is not None:
        _check_fingerprint(path, m["fingerprint"])
    if "counts" in m and not isinstance(m["counts"], dict):
        raise _bad(path, "counts must be an object")
    if not isinstance(m.get("plan", {}), dict):
        raise _bad(path, "plan must be an object")
    n = None
    for c, kinds in _KINDS.items():
        a = cols[c]
        if a.ndim != 1 or a.dtype.kind not in kinds:
            raise _bad(path, f"column {c} must be a 1-D {'/'.join(kinds)} array (got {a.dtype} {a.shape})")
        if n is None:
            n = len(a)
        elif len(a) != n:
            raise _bad(path, f"column {c} has {len(a)} rows, not {n}")
    n = n or 0
    if not n:
        return
    tid = cols["tensor"].astype(np.int64)
    if tid.min() < 0 or tid.max() >= len(tensors):
        raise _bad(path, f"a record names tensor {int(tid.max() if tid.max() >= len(tensors) else tid.min())}; "
                   f"the log lists {len(tensors)}")
    idx = cols["index"]
    if idx.dtype.kind == "u" and idx.dtype.itemsize == 8 and int(idx.max()) >= 2**63:
        raise _bad(path, "an element index does not fit in 64 bits")
    idx = idx.astype(np.int64)
    sizes = np.array([min(math.prod(s), MAX_ELEMENTS) for _, _, s in tensors], np.int64)
    widths = np.array([np.dtype(d).itemsize * 8 for _, d, _ in tensors], np.int64)
    bad = np.flatnonzero((idx < 0) | (idx >= sizes[tid]))
    if len(bad):
        r = int(bad[0])
        name, _, s = tensors[int(tid[r])]
        raise _bad(path, f"record {r} indexes element {int(idx[r])} of {name}, which has {math.prod(s)}")
    limit = np.where(widths[tid] >= 64, np.uint64(0), np.left_shift(np.uint64(1), widths[tid].astype(np.uint64)))
    for c in ("old_word", "new_word", "xor_mask", "or_mask"):
        w = cols[c].astype(np.uint64)
        over = np.flatnonzero((limit != 0) & (w >= limit))
        if len(over):
            raise _bad(path, f"record {int(over[0])}: {c} is wider than its tensor's {int(widths[tid[over[0]]])}-bit word")
    order = np.lexsort((idx, tid))
    if bool(((np.diff(tid[order]) == 0) & (np.diff(idx[order]) == 0)).any()):
        raise _bad(path, "two records name the same element")
    u = m.get("undo")
    if u is None:
        return
    if not isinstance(u, dict):
        raise _bad(path, "undo must be an object or null")
    size = _int(path, u.get("size"), "undo.size")
    new_size = _int(path, u.get("new_size", -1), "undo.new_size", lo=-1)
    if undo_cols is None or undo_blobs is None:
        raise _bad(path, "undo ranges are missing")
    offs, lens = undo_cols
    if offs.ndim != 1 or lens.ndim != 1 or len(offs) != len(lens) or offs.dtype.kind not in "iu" \
            or lens.dtype.kind not in "iu":
        raise _bad(path, "undo offsets and lengths must be integer columns of one length")
    o, ln = offs.astype(np.int64), lens.astype(np.int64)
    if len(o) and (o.min() < 0 or ln.min() < 0 or bool((o + ln > max(size, new_size)).any())):
        raise _bad(path, "undo ranges lie outside the files they describe")
    for blob, limit_size, what in ((undo_blobs[0], size, "undo_data"), (undo_blobs[1], new_size, "redo_data")):
        if what == "redo_data" and new_size < 0:
            continue
        want = int(np.clip(np.minimum(ln, limit_size - o), 0, None).sum())
        if len(blob) != want:
            raise _bad(path, f"{what}.bin holds {len(blob)} bytes; the ranges need {want}")
