"""The injection log: a public, documented format that replays and reverts injections bit for bit.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Format ``fastflip-log/1`` — a ZIP archive (conventionally ``*.fflog``) holding:

``manifest.json``
    ``format``, ``fastflip_version``, ``created`` (UTC, ISO 8601), ``seed``, ``stream``,
    ``options`` (every option that produced the injection), ``input`` and ``output``
    (``path``, ``sha256``, ``size``), ``in_place``, ``counts`` (``sites`` = elements
    changed, ``flips`` = bit positions touched, ``tensors_hit``, ``nan_created``,
    ``inf_created``, ``nan_resampled``), ``tensors`` (list of ``{name, dtype, shape,
    storage}``; records refer to it by position) and ``undo`` (``null`` or ``{"size": N}``).
``<column>.npy``
    One NumPy array per record column, all of the same length, one row per changed element:
    ``tensor`` (position in ``tensors``), ``index`` (flat C-order element index), ``bits``
    (mask of the bit positions the fault touched; bit 0 = LSB), ``and_mask``/``or_mask``/
    ``xor_mask`` (the word rule ``new = ((old & and) | or) ^ xor``), ``scale`` (NaN unless
    the site scaled its value), ``old_word``/``new_word`` (the stored word as an unsigned
    integer in native order), ``old_value``/``new_value`` (the values). Each column is
    stored in the narrowest type that holds it exactly (words and masks as unsigned
    integers of the widest tensor's word size, values as float32 when every tensor's
    values are exact in float32, indices as int32 below 2**31); :meth:`InjectionLog.load`
    widens them to int32/int64/uint64/float64.
``undo_offsets.npy``, ``undo_lengths.npy``, ``undo_data.bin``, ``redo_data.bin`` (optional)
    When re-encoded data were written (filtered HDF5 chunks, deflated ``.npz`` members)
    or the HDF5 read-modify-write path was used (other filters, compact data), every
    file byte range that changed, with its original bytes (``undo_data``) and its
    altered bytes (``redo_data``): revert restores the original exactly, and replay
    reproduces the output exactly, even where HDF5 re-encoded or moved chunks or wrote
    bytes it does not initialise. Ranges past the end of one file hold only the other's bytes.

Examples
--------
>>> import io, numpy as np
>>> from fastflip.core.plan import Plan, TensorRef
>>> plan = Plan.from_sites([TensorRef("/w", "<f4", (2,))], [0], [1], xor_mask=[1 << 31])
>>> log = InjectionLog.from_plan(plan, np.array([0x3F800000], np.uint64), np.array([0xBF800000], np.uint64), {})
>>> log.records()[0]["new_value"]
-1.0
"""

from __future__ import annotations

import io
import json
import os
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..errors import InputFileError, LogMismatchError
from .filebytes import ByteUndo
from .fileio import atomic_output, check_input
from .logcheck import validate_log
from ..core.plan import Plan, TensorRef
from ..core.wordrule import words_to_values

if TYPE_CHECKING:
    import zipfile

__all__ = ["LOG_FORMAT", "InjectionLog", "manifest_json", "values_of"]

LOG_FORMAT = "fastflip-log/1"
_COLUMNS = ("tensor", "index", "bits", "and_mask", "or_mask", "xor_mask", "scale", "old_word", "new_word",
            "old_value", "new_value")


def values_of(plan: Plan, words: np.ndarray) -> np.ndarray:
    """float64 values of per-site words (each decoded with its tensor's dtype)."""
    out = np.empty(len(plan), np.float64)
    for dt, pos in plan.per_dtype():
        with np.errstate(over="ignore", invalid="ignore"):
            out[pos] = words_to_values(words[pos], dt).astype(np.float64)
    return out


@dataclass
class InjectionLog:
    """Manifest plus per-site records of one injection (see the module docstring for the format)."""

    manifest: dict[str, Any]
    plan: Plan
    old_words: np.ndarray
    new_words: np.ndarray
    undo: ByteUndo | None = None
    _values: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @classmethod
    def from_plan(cls, plan: Plan, old_words: np.ndarray, new_words: np.ndarray, manifest: dict[str, Any],
                  undo: ByteUndo | None = None) -> "InjectionLog":
        m = dict(manifest)
        m.setdefault("format", LOG_FORMAT)
        m["tensors"] = [dict(t.as_dict(), **(m.get("_storage", {}).get(t.name, {}))) for t in plan.tensors]
        m.pop("_storage", None)
        m["undo"] = None if undo is None else {"size": int(undo.size), "new_size": int(undo.new_size),
                                               "ranges": int(len(undo.offsets))}
        return cls(m, plan, np.asarray(old_words, np.uint64), np.asarray(new_words, np.uint64), undo)

    def __len__(self) -> int:
        return len(self.plan)

    @property
    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """(old values, new values) as float64."""
        if self._values is None:
            self._values = (values_of(self.plan, self.old_words), values_of(self.plan, self.new_words))
        return self._values

    def columns(self) -> dict[str, np.ndarray]:
        p = self.plan
        old_v, new_v = self.values
        scale = p.scale if p.scale is not None else np.full(len(p), np.nan)
        return {"tensor": p.tensor, "index": p.index, "bits": p.bits, "and_mask": p.and_mask, "or_mask": p.or_mask,
                "xor_mask": p.xor_mask, "scale": scale, "old_word": self.old_words, "new_word": self.new_words,
                "old_value": old_v, "new_value": new_v}

    def records(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Per-site records as dicts (tensor name, index, bit positions, words, values)."""
        cols = self.columns()
        n = len(self) if limit is None else min(limit, len(self))
        out = []
        for i in range(n):
            t = self.plan.tensors[int(cols["tensor"][i])]
            bits = int(cols["bits"][i])
            out.append({
                "tensor": t.name, "index": int(cols["index"][i]),
                "bit_positions": [b for b in range(64) if bits >> b & 1],
                "old_word": int(cols["old_word"][i]), "new_word": int(cols["new_word"][i]),
                "old_value": float(cols["old_value"][i]), "new_value": float(cols["new_value"][i]),
                "and_mask": int(cols["and_mask"][i]), "or_mask": int(cols["or_mask"][i]),
                "xor_mask": int(cols["xor_mask"][i]),
                "scale": None if np.isnan(cols["scale"][i]) else float(cols["scale"][i]),
            })
        return out

    def iter_csv_rows(self) -> Iterator[list[str]]:
        """CSV rows (header first) of the records; words in hex."""
        yield ["tensor", "index", "bit_positions", "old_word", "new_word", "old_value", "new_value"]
        cols = self.columns()
        names = [t.name for t in self.plan.tensors]
        for i in range(len(self)):
            w = int(self.plan.tensors[int(cols["tensor"][i])].dtype[-1]) * 2
            bits = int(cols["bits"][i])
            yield [names[int(cols["tensor"][i])], str(int(cols["index"][i])),
                   " ".join(str(b) for b in range(64) if bits >> b & 1),
                   f"0x{int(cols['old_word'][i]):0{w}x}", f"0x{int(cols['new_word'][i]):0{w}x}",
                   repr(float(cols["old_value"][i])), repr(float(cols["new_value"][i]))]

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], *, durable: bool = True) -> str:
        """Write the log atomically to ``path`` (fsync'ed unless ``durable=False``); return the path."""
        path = os.fspath(path)
        with atomic_output(path, durable=durable) as tmp:
            self.write(tmp)
        return path

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the log's bytes to ``path`` as they are (no temporary, no fsync): see :meth:`save`."""
        import zipfile  # the log's container, imported when a log is written or read (not by inject --no-log)

        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
            z.writestr("manifest.json", manifest_json(self.manifest))
            for name, arr in _narrow(self.columns(), self.plan).items():
                _write_npy(z, f"{name}.npy", arr)
            if self.undo is not None:
                _write_npy(z, "undo_offsets.npy", self.undo.offsets)
                _write_npy(z, "undo_lengths.npy", self.undo.lengths)
                z.writestr("undo_data.bin", self.undo.data)
                z.writestr("redo_data.bin", self.undo.new_data)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "InjectionLog":
        """Read a log written by :meth:`save` (any fastflip-log/1 file)."""
        import zipfile

        p = check_input(path)
        try:
            with zipfile.ZipFile(p) as z:
                _refuse_twin_members(z)
                manifest = json.loads(_read_member(z, "manifest.json", _MAX_MANIFEST_BYTES))
                if not isinstance(manifest, dict) or manifest.get("format") != LOG_FORMAT:
                    fmt = manifest.get("format") if isinstance(manifest, dict) else None
                    raise LogMismatchError(f"{p}: not a {LOG_FORMAT} log (format {fmt!r:.40})")
                cols = {c: _read_npy(z, f"{c}.npy", wide=False) for c in _COLUMNS}
                undo_cols = blobs = None
                if manifest.get("undo"):
                    undo_cols = (_read_npy(z, "undo_offsets.npy"), _read_npy(z, "undo_lengths.npy"))
                    limit = _ranges_bytes(undo_cols[1])  # read no more than the ranges can need
                    u = manifest["undo"]
                    redo = "redo_data.bin" in z.namelist() and (not isinstance(u, dict) or u.get("new_size", -1) != -1)
                    blobs = (_read_member(z, "undo_data.bin", limit),
                             _read_member(z, "redo_data.bin", limit) if redo else b"")
        except (zipfile.BadZipFile, KeyError, ValueError, EOFError, NotImplementedError, RuntimeError, OSError,
                zlib.error, UnicodeDecodeError) as exc:
            if isinstance(exc, LogMismatchError):
                raise
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise InputFileError(f"{p}: not a readable fastflip log ({first}); give the .fflog written by inject") from None
        validate_log(p, manifest, cols, blobs, undo_cols)  # types, lengths, ranges: before anything uses it
        cols = {c: a.astype(_WIDE[c]) if a.dtype != _WIDE[c] else a for c, a in cols.items()}
        undo = None
        if undo_cols is not None and blobs is not None:
            u = manifest["undo"]
            undo = ByteUndo(undo_cols[0].astype(np.int64), undo_cols[1].astype(np.int64), blobs[0], int(u["size"]),
                            blobs[1], int(u.get("new_size", -1)))
        tensors = tuple(TensorRef(t["name"], t["dtype"], tuple(t["shape"]), t.get("format")) for t in manifest["tensors"])
        scale = cols["scale"] if not np.isnan(cols["scale"]).all() else None
        plan = Plan(tensors, cols["tensor"], cols["index"], cols["and_mask"], cols["or_mask"], cols["xor_mask"], scale,
                    cols["bits"], dict(manifest.get("plan", {})))
        log = cls(manifest, plan, cols["old_word"], cols["new_word"], undo)
        log._values = (cols["old_value"], cols["new_value"])
        return log


_WIDE = {"tensor": np.int32, "index": np.int64, "bits": np.uint64, "and_mask": np.uint64, "or_mask": np.uint64,
         "xor_mask": np.uint64, "scale": np.float64, "old_word": np.uint64, "new_word": np.uint64,
         "old_value": np.float64, "new_value": np.float64}


def _narrow(cols: dict[str, np.ndarray], plan: Plan) -> dict[str, np.ndarray]:
    """Columns in the narrowest dtype that holds them exactly (the format allows it; readers widen)."""
    width = max((np.dtype(t.dtype).itemsize for t in plan.tensors), default=8)
    word = np.dtype(f"u{width}")
    exact32 = all(np.dtype(t.dtype).kind == "f" and np.dtype(t.dtype).itemsize <= 4
                  or np.dtype(t.dtype).kind in "iub" and np.dtype(t.dtype).itemsize <= 2 for t in plan.tensors)
    out = dict(cols)
    for c in ("bits", "and_mask", "or_mask", "xor_mask", "old_word", "new_word"):
        out[c] = cols[c].astype(word, copy=False)
    if exact32:
        with np.errstate(over="ignore", invalid="ignore"):
            out["old_value"] = cols["old_value"].astype(np.float32)
            out["new_value"] = cols["new_value"].astype(np.float32)
    if len(cols["index"]) and int(cols["index"].max()) < 2**31:
        out["index"] = cols["index"].astype(np.int32)
    if np.isnan(cols["scale"]).all():
        out["scale"] = cols["scale"].astype(np.float32)
    return out


def _write_npy(z: zipfile.ZipFile, name: str, arr: np.ndarray) -> None:
    """One ``.npy`` member, its bytes handed to the archive without an intermediate copy."""
    arr = np.ascontiguousarray(arr)
    with z.open(name, "w", force_zip64=True) as fh:
        np.lib.format.write_array_header_1_0(fh, np.lib.format.header_data_from_array_1_0(arr))
        fh.write(memoryview(arr).cast("B") if arr.size else b"")


def _refuse_twin_members(z: zipfile.ZipFile) -> None:
    """Refuse (ValueError) a log archive holding two members of one name: a log fastflip writes holds each once, and
    which of the two a reader takes is the reader's choice (``zipfile`` takes the last)."""
    seen: set[str] = set()
    for name in z.namelist():
        if name in seen:
            raise ValueError(f"two members named {name}, which a log fastflip writes never holds")
        seen.add(name)


def _read_member(z: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """The bytes of member ``name``, refused (ValueError) when it declares more than ``limit`` (a log's small
    archive may inflate to gigabytes)."""
    info = z.getinfo(name)
    if info.file_size > limit:
        raise ValueError(f"{name} declares {info.file_size} bytes, more than a log fastflip writes holds")
    with z.open(info) as fh:
        return fh.read(limit + 1)


def _ranges_bytes(lengths: np.ndarray) -> int:
    """The bytes the undo ranges of ``lengths`` hold at most (the exact size is checked by
    :func:`fastflip.files.logcheck.validate_log`); negative lengths count as none."""
    if lengths.dtype.kind not in "iu" or not lengths.size:
        return 0
    return int(min(np.clip(lengths, 0, None).sum(dtype=np.float64), float(_MAX_COLUMN_BYTES)))


def _read_npy(z: zipfile.ZipFile, name: str, wide: bool = True) -> np.ndarray:
    arr = np.lib.format.read_array(io.BytesIO(_read_member(z, name, _MAX_COLUMN_BYTES)), allow_pickle=False)
    w = _WIDE.get(name[:-4])
    return arr.astype(w) if wide and w is not None and arr.dtype != w else arr


_MAX_COLUMN_BYTES = 16 << 30  # a column of 2**31 eight-byte rows; larger is not a log fastflip wrote
_MAX_MANIFEST_BYTES = 256 << 20  # a manifest lists tensors and options: a million tensors take a fraction of this


def manifest_json(manifest: dict[str, Any]) -> str:
    """The manifest as JSON text for people as well as programs: one top-level key a line, a list one item a line.

    Each value is encoded by the json module's C encoder (``json.dumps(..., indent=2)`` would run its pure-Python
    encoder over every tensor and option: milliseconds for a log of a few hundred tensors)."""
    enc = json.JSONEncoder(default=_json_default)
    lines = []
    for key, value in manifest.items():
        if isinstance(value, list) and value:
            items = ",\n".join("    " + enc.encode(v) for v in value)
            lines.append(f"  {enc.encode(str(key))}: [\n{items}\n  ]")
        else:
            lines.append(f"  {enc.encode(str(key))}: {enc.encode(value)}")
    return "{\n" + ",\n".join(lines) + "\n}" if lines else "{}"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    return str(obj)
