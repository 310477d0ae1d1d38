"""Compare two checkpoints (HDF5, torch.save, safetensors, npy/npz) tensor by tensor, bit by bit.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Tensors are matched by path (any alias). For each pair the raw stored words are
compared, so a changed NaN payload or ``0.0`` → ``-0.0`` counts as a difference.
Data are read in bounded blocks (16 MiB by default) so memory stays flat however
large the files are.

Examples
--------
>>> import os, tempfile, numpy as np, h5py
>>> d = tempfile.mkdtemp()
>>> a, b = os.path.join(d, "a.h5"), os.path.join(d, "b.h5")
>>> for p, v in ((a, 1.0), (b, -1.0)):
...     with h5py.File(p, "w") as f:
...         f["w"] = np.array([v, 2.0], dtype="<f4")
>>> r = diff_files(a, b)
>>> r.identical, r.tensors[0].n_diff, r.tensors[0].bit_counts()
(False, 1, {31: 1})
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from ..core.dtypes import to_words
from ..core.floatformats import FORMATS, decode
from .archives import is_keras_archive, read_archive
from .keras_dtypes import WordsView
from .encoded import member_array
from .layout import Layout, Tensor, open_h5, read_layout
from .oldcompare import OldComparator
from .oldcompare import json_num as _json_num
from .select import Selection, select

__all__ = ["TensorDiff", "DiffResult", "diff_files", "diff_arrays", "iter_blocks", "BLOCK_BYTES"]

BLOCK_BYTES = 16 * 2**20


@dataclass
class TensorDiff:
    """Differences between one tensor in file A and the same path in file B.

    Attributes
    ----------
    path : str
    dtype : str
        dtype of A (byte-order string).
    shape : tuple of int
    size : int
    n_diff : int
        Elements whose stored words differ.
    bit_hist : int64 array
        Per bit position (bit 0 = LSB), how many elements differ in that bit.
    max_abs, max_rel : float
        Largest ``|b - a|`` and ``|b - a| / |a|`` over differing pairs where both values are
        finite (``rel`` only where ``a != 0``); NaN when there is no such pair.
    new_nan, new_inf : int
        Elements that are NaN (Inf) in B but not in A.
    note : str
        Set when the pair cannot be compared element-wise (dtype or shape differs).
    """

    path: str
    dtype: str
    shape: tuple[int, ...]
    size: int
    n_diff: int = 0
    bit_hist: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    max_abs: float = math.nan
    max_rel: float = math.nan
    new_nan: int = 0
    new_inf: int = 0
    note: str = ""
    oldtool: dict[str, Any] | None = None

    @property
    def identical(self) -> bool:
        return self.n_diff == 0 and not self.note

    def bit_counts(self) -> dict[int, int]:
        """Non-zero entries of the bit histogram, highest bit first."""
        return {int(b): int(self.bit_hist[b]) for b in np.flatnonzero(self.bit_hist)[::-1]}

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "size": self.size,
            "n_diff": self.n_diff,
            "bit_hist": {str(k): v for k, v in self.bit_counts().items()},
            "max_abs": _json_num(self.max_abs),
            "max_rel": _json_num(self.max_rel),
            "new_nan": self.new_nan,
            "new_inf": self.new_inf,
            "note": self.note,
            **({"oldtool": self.oldtool} if self.oldtool is not None else {}),
        }


@dataclass
class DiffResult:
    """Outcome of :func:`diff_files`."""

    a: str
    b: str
    tensors: list[TensorDiff] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """True when both files hold the same selected tensors with the same stored bits."""
        return not self.only_a and not self.only_b and all(t.identical for t in self.tensors)

    @property
    def differing(self) -> list[TensorDiff]:
        return [t for t in self.tensors if not t.identical]

    @property
    def totals(self) -> dict[str, Any]:
        hist: dict[int, int] = {}
        for t in self.tensors:
            for b, n in t.bit_counts().items():
                hist[b] = hist.get(b, 0) + n
        return {
            "tensors_compared": len(self.tensors),
            "tensors_differing": len(self.differing),
            "elements_compared": int(sum(t.size for t in self.tensors)),
            "elements_differing": int(sum(t.n_diff for t in self.tensors)),
            "bit_hist": {str(b): hist[b] for b in sorted(hist, reverse=True)},
            "new_nan": int(sum(t.new_nan for t in self.tensors)),
            "new_inf": int(sum(t.new_inf for t in self.tensors)),
            "only_a": len(self.only_a),
            "only_b": len(self.only_b),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "totals": self.totals,
            "tensors": [t.as_dict() for t in self.tensors],
            "only_a": list(self.only_a),
            "only_b": list(self.only_b),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.as_dict(), indent=indent)


def iter_blocks(shape: tuple[int, ...], itemsize: int, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[Any, ...]]:
    """Index tuples (slices and ints) covering an array of ``shape`` in C order, each ≤ ``block_bytes``.

    >>> list(iter_blocks((4, 3), 4, 24))
    [(slice(0, 2, None),), (slice(2, 4, None),)]
    >>> list(iter_blocks((2, 3), 4, 8))
    [(0, slice(0, 2, None)), (0, slice(2, 3, None)), (1, slice(0, 2, None)), (1, slice(2, 3, None))]
    """
    if len(shape) == 0:
        yield ()
        return
    if 0 in shape:
        return
    ax = len(shape) - 1
    for k in range(len(shape)):
        if math.prod(shape[k + 1 :]) * itemsize <= block_bytes:
            ax = k
            break
    inner = math.prod(shape[ax + 1 :]) * itemsize
    step = max(1, block_bytes // inner)
    for outer in np.ndindex(*shape[:ax]):
        for s in range(0, shape[ax], step):
            yield tuple(int(i) for i in outer) + (slice(s, min(s + step, shape[ax])),)


class _Acc:
    """Running statistics of one tensor pair (and, with ``oldtool``, the older tool's comparator figures)."""

    def __init__(self, bits: int, oldtool: bool = False, fmt: str | None = None) -> None:
        self.old = OldComparator() if oldtool else None
        self.fmt = fmt  # bfloat16 / float8 words: values decoded by the format
        self.n_diff = 0
        self.hist = np.zeros(bits, dtype=np.int64)
        self.max_abs = -math.inf
        self.max_rel = -math.inf
        self.new_nan = 0
        self.new_inf = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            self._add(a, b)
            if self.old is not None:
                self.old.add(np.asarray(a), np.asarray(b))

    def _add(self, a: np.ndarray, b: np.ndarray) -> None:
        wa, wb = to_words(a).reshape(-1), to_words(b).reshape(-1)
        x = wa ^ wb
        nz = np.flatnonzero(x)
        if nz.size == 0:
            return
        self.n_diff += int(nz.size)
        bits = len(self.hist)
        xb = np.ascontiguousarray(x[nz]).astype(x.dtype.newbyteorder("<"), copy=False)
        self.hist += np.unpackbits(xb.view(np.uint8), bitorder="little").reshape(-1, bits).sum(axis=0, dtype=np.int64)
        av = np.asarray(a).reshape(-1)[nz]
        bv = np.asarray(b).reshape(-1)[nz]
        if self.fmt or av.dtype.kind == "f":
            if self.fmt:
                fa, fb = decode(wa[nz], FORMATS[self.fmt]), decode(wb[nz], FORMATS[self.fmt])
            else:
                fa, fb = av.astype(np.float64), bv.astype(np.float64)
            self.new_nan += int(np.count_nonzero(np.isnan(fb) & ~np.isnan(fa)))
            self.new_inf += int(np.count_nonzero(np.isinf(fb) & ~np.isinf(fa)))
            ok = np.isfinite(fa) & np.isfinite(fb)
            fa, fb = fa[ok], fb[ok]
        else:
            fa, fb = av.astype(np.float64), bv.astype(np.float64)
        if fa.size:
            d = np.abs(fb - fa)
            self.max_abs = max(self.max_abs, float(d.max()))
            nzero = fa != 0
            if nzero.any():
                self.max_rel = max(self.max_rel, float((d[nzero] / np.abs(fa[nzero])).max()))

    def result(self, t: Tensor) -> TensorDiff:
        return TensorDiff(
            path=t.path, dtype=t.format or t.dtype.str, shape=t.shape, size=t.size, n_diff=self.n_diff,
            bit_hist=self.hist, max_abs=self.max_abs if self.max_abs > -math.inf else math.nan,
            max_rel=self.max_rel if self.max_rel > -math.inf else math.nan,
            new_nan=self.new_nan, new_inf=self.new_inf,
            oldtool=None if self.old is None else self.old.result(t.size, scalar=len(t.shape) == 0),
        )


def diff_arrays(a: np.ndarray, b: np.ndarray, path: str = "") -> TensorDiff:
    """Compare two in-memory arrays of the same shape and dtype kind/width (byte order may differ).

    >>> diff_arrays(np.array([0.0], "<f8"), np.array([-0.0], ">f8")).bit_counts()
    {63: 1}
    """
    a, b = np.asarray(a), np.asarray(b)
    t = Tensor(path, (path,), a.dtype, a.shape, int(a.size), "contiguous", nbytes=a.nbytes)
    note = _incompatible(a.dtype, a.shape, b.dtype, b.shape)
    if note:
        return TensorDiff(path, a.dtype.str, a.shape, int(a.size), note=note)
    acc = _Acc(a.dtype.itemsize * 8)
    acc.add(a, b)
    return acc.result(t)


def _incompatible(da: np.dtype, sa: tuple[int, ...], db: np.dtype, sb: tuple[int, ...]) -> str:
    if da.newbyteorder("=") != db.newbyteorder("="):
        return f"dtype differs: {da.str} vs {db.str}"
    if tuple(sa) != tuple(sb):
        return f"shape differs: {tuple(sa)} vs {tuple(sb)}"
    return ""


def _selected(layout: Layout, selection: Selection | None) -> list[Tensor]:
    if selection is None or selection.is_all:
        return list(layout.tensors)
    return [t for t in layout.tensors if selection.matches(t)]


@contextlib.contextmanager
def _datasets(layout: Layout) -> Iterator[Any]:
    """A function tensor → sliceable array: h5py datasets for HDF5, read-only memory maps for raw formats
    (torch.save, safetensors, npy/npz: contiguous at a byte offset), inflated arrays for deflated .npz members."""
    if layout.format != "hdf5":
        file_of = getattr(layout, "file_of", lambda t: layout.file)  # a checkpoint directory: the tensor's shard
        yield lambda t: (np.memmap(file_of(t), dtype=t.dtype, mode="r", offset=t.offset, shape=t.shape)
                         if t.storage == "contiguous" else member_array(layout.file, t.path))  # deflated .npz member
        return
    with open_h5(layout.file) as f:
        yield lambda t: WordsView(f[t.path], t.dtype)  # opaque words (a Keras bfloat16 variable) as t.dtype


def diff_files(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    selection: Selection | None = None,
    *,
    block_bytes: int = BLOCK_BYTES,
    oldtool: bool = False,
) -> DiffResult:
    """Compare the numeric tensors of two checkpoints (any format fastflip reads, ``.keras`` archives and
    checkpoint directories included).

    Parameters
    ----------
    a, b : path-like
        The reference file and the file to compare with it.
    selection : Selection, optional
        Compare only these tensors (applied to each file's layout).
    block_bytes : int
        Upper bound of the data read at once per file.
    oldtool : bool
        Also compute what the older tool's comparator reported per dataset, in the dataset's own
        arithmetic (``TensorDiff.oldtool``: ``entries``, ``diff_count``, ``diff_percent``,
        ``euclidean_distance``, ``relative_diffs``, ``arithmetic``; :mod:`fastflip.files.oldcompare`).

    Raises
    ------
    InputFileError, NotHDF5Error
        When either file is missing or not HDF5.
    SelectionError
        When the selection matches no tensor in either file.
    """
    pa, pb = os.fspath(a), os.fspath(b)
    with contextlib.ExitStack() as inner:  # a .keras archive: the model.weights.h5 inside it
        la, lb = (read_layout(inner.enter_context(read_archive(p)) if is_keras_archive(p) else p) for p in (pa, pb))
        return _diff_layouts(pa, pb, la, lb, selection, block_bytes, oldtool)


def _diff_layouts(pa: str, pb: str, la: Layout, lb: Layout, selection: Selection | None, block_bytes: int,
                  oldtool: bool) -> DiffResult:
    ta, tb = _selected(la, selection), _selected(lb, selection)
    if not ta and not tb:
        select(la.tensors + lb.tensors, selection)  # raises SelectionError naming what exists
    b_by_alias = {alias: t for t in tb for alias in t.aliases}
    result = DiffResult(a=pa, b=pb)
    matched_b: set[str] = set()
    with _datasets(la) as fa, _datasets(lb) as fb:
        for t in ta:
            other = next((b_by_alias[x] for x in t.aliases if x in b_by_alias), None)
            if other is None:
                result.only_a.append(t.path)
                continue
            matched_b.add(other.path)
            note = _incompatible(t.dtype, t.shape, other.dtype, other.shape)
            if not note and t.format != other.format:
                note = f"dtype differs: {t.format or t.dtype.str} vs {other.format or other.dtype.str}"
            if note:
                result.tensors.append(TensorDiff(t.path, t.dtype.str, t.shape, t.size, note=note))
                continue
            acc = _Acc(t.itemsize * 8, oldtool, t.format)
            da, db = fa(t), fb(other)
            for sl in iter_blocks(t.shape, t.itemsize, max(1, block_bytes // 2)):
                acc.add(np.asarray(da[sl]), np.asarray(db[sl]))
            result.tensors.append(acc.result(t))
    result.only_b = [t.path for t in tb if t.path not in matched_b]
    return result
