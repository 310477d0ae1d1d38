"""The tensor record: one numeric tensor, wherever it lives, and a file's list of them.

:class:`Tensor` (name, aliases, dtype and float format, shape, role, layer, framework, and where the
bytes are: ``storage`` with ``offset``/``chunks``/``filters`` in a file) is what the file layer's
:func:`fastflip.files.layout.read_layout` and the other format readers produce, what
:mod:`fastflip.files.select` selects from and what :mod:`fastflip.files.roles` labels; live tensors
give the same record (:meth:`fastflip.live.targets.Targets.records`). :class:`Layout` is the list
of one file's tensors plus the datasets skipped and why.

:class:`SiteArrays` is the one per-site type every backend consumes: columns (NumPy, or CuPy on a device)
of plan position, tensor index, byte offset (into a file, or from a tensor's base address) and the
AND/OR/XOR masks, with optional scale factors and replacement words. :class:`TensorTable` is the
per-tensor table its ``tensor`` column indexes (word size, byte order, dtype/float format, base address
or file base, extent). :class:`fastflip.files.h5apply.RawSites`, :class:`fastflip.kernels.gpu.SiteArrays`
and :class:`fastflip.live.siteaccess.Prepared` are (or hold) this type.

Imports: :mod:`fastflip.errors` and :mod:`fastflip.core.plan` only; every layer may import it.

>>> import numpy as np
>>> t = Tensor("/w", ("/w",), np.dtype("<f4"), (2, 3), 6, "contiguous", offset=2048, nbytes=24)
>>> t.name, t.itemsize, t.raw_writable, t.ref().shape
('/w', 4, True, (2, 3))
>>> replace(t, role="weight").role
'weight'
>>> t.in_file, replace(t, storage="memory").in_file
(True, False)
>>> s = SiteArrays(tensor=np.array([0, 0]), offsets=np.array([2048, 2052]), and_mask=np.full(2, ~np.uint64(0)),
...                or_mask=np.zeros(2, np.uint64), xor_mask=np.array([1, 2], np.uint64))
>>> one = s.take(np.array([1]))
>>> len(s), one.offsets.tolist(), one.positions.tolist()
(2, [2052], [1])
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from ..errors import TensorNotFoundError
from .plan import TensorRef

__all__ = ["Tensor", "Skipped", "Layout", "SiteArrays", "TensorTable", "replace", "natural_key", "STORAGE_KINDS", "FILE_STORAGE", "LIVE_STORAGE",
           "EXTERNAL_LINK_REASON"]

#: Where a tensor's bytes live in a file: the storage kinds of HDF5 (see :mod:`fastflip.files.layout`; the other
#: formats use ``contiguous`` and ``filtered``).
FILE_STORAGE = ("contiguous", "chunked", "filtered", "compact", "external", "virtual", "unallocated")
#: Tensors that are not in a file: ``memory`` (host memory: NumPy arrays, CPU framework tensors, a campaign's
#: in-memory targets) and ``device`` (accelerator memory: CUDA tensors, CuPy arrays).
LIVE_STORAGE = ("memory", "device")
STORAGE_KINDS = FILE_STORAGE + LIVE_STORAGE
EXTERNAL_LINK_REASON = "external link (fastflip never writes outside the checkpoint file)"


@dataclass(frozen=True)
class Tensor:
    """One numeric dataset of an HDF5 file.

    Attributes
    ----------
    path : str
        Canonical absolute path (first alias in sorted order).
    aliases : tuple of str
        Every in-file path that reaches this dataset (``path`` included), sorted.
    dtype : numpy.dtype
        Stored dtype, byte order preserved (``>f4`` stays big-endian).
    shape : tuple of int
    size : int
        Number of elements.
    storage : str
        Where the bytes live, one of :data:`STORAGE_KINDS`: a file's storage kind, or ``memory`` /
        ``device`` for live tensors.
    offset : int or None
        Absolute file byte offset of the data (contiguous storage only).
    chunks : tuple of int or None
        Chunk shape (chunked and filtered storage).
    filters : tuple of str
        Filter pipeline names (``gzip``, ``shuffle``, ``lzf``, ``fletcher32``, ...,
        or ``filter-<id>``).
    nbytes : int
        Logical size in bytes (``size * itemsize``).
    framework, layer, role : str or None
        Filled by :func:`fastflip.files.roles.annotate`.
    format : str or None
        A float format held in unsigned words (``bfloat16``, ``float8_e4m3fn``,
        ``float8_e5m2``), from the dataset's ``torch_dtype`` / ``fastflip_format`` attribute.
    """

    path: str
    aliases: tuple[str, ...]
    dtype: np.dtype
    shape: tuple[int, ...]
    size: int
    storage: str
    offset: int | None = None
    chunks: tuple[int, ...] | None = None
    filters: tuple[str, ...] = ()
    nbytes: int = 0
    framework: str | None = None
    layer: str | None = None
    role: str | None = None
    format: str | None = None

    @property
    def name(self) -> str:
        """Same as ``path`` (the name plans and logs use)."""
        return self.path

    @property
    def itemsize(self) -> int:
        return int(self.dtype.itemsize)

    @property
    def in_file(self) -> bool:
        """True for a tensor of a checkpoint file, False for a live one (``memory`` / ``device``)."""
        return self.storage in FILE_STORAGE

    @property
    def raw_writable(self) -> bool:
        """True when every element has a fixed file offset (contiguous or unfiltered chunked)."""
        return self.storage in ("contiguous", "chunked")

    def ref(self) -> Any:
        """The :class:`fastflip.core.plan.TensorRef` (name, dtype, shape) of this tensor."""
        return TensorRef(self.path, self.dtype.str, self.shape, self.format)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (dtype as its byte-order string, e.g. ``'>f4'``)."""
        return {
            "path": self.path,
            "aliases": list(self.aliases),
            "dtype": self.dtype.str,
            "dtype_name": self.dtype.name,
            "shape": list(self.shape),
            "size": self.size,
            "storage": self.storage,
            "offset": self.offset,
            "chunks": list(self.chunks) if self.chunks is not None else None,
            "filters": list(self.filters),
            "nbytes": self.nbytes,
            "framework": self.framework,
            "layer": self.layer,
            "role": self.role,
            **({"format": self.format} if self.format else {}),
        }


@dataclass(frozen=True)
class Skipped:
    """A dataset (or link) that is not a tensor fastflip can flip, and why."""

    path: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass
class Layout:
    """Every tensor of one HDF5 file and the skipped datasets.

    Layout order is the natural sort of canonical paths ('/vars/2' before '/vars/10').
    """

    file: str
    tensors: list[Tensor] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    framework: str | None = None
    format: str = "hdf5"

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def tensor(self, name: str) -> Tensor:
        """The tensor reached by ``name`` (canonical path or alias; leading '/' optional).

        Raises
        ------
        TensorNotFoundError
            If no tensor has that path; the message names a few that exist.
        """
        key = name if name.startswith("/") else "/" + name
        for t in self.tensors:
            if key in t.aliases:
                return t
        have = ", ".join(t.path for t in self.tensors[:5]) or "none"
        raise TensorNotFoundError(f"no tensor {name!r} in {self.file} (tensors: {have})")

    @property
    def totals(self) -> dict[str, Any]:
        """Counts: tensors, elements, bytes, per-storage tensor counts, skipped."""
        by_storage: dict[str, int] = {}
        for t in self.tensors:
            by_storage[t.storage] = by_storage.get(t.storage, 0) + 1
        return {
            "tensors": len(self.tensors),
            "elements": int(sum(t.size for t in self.tensors)),
            "bytes": int(sum(t.nbytes for t in self.tensors)),
            "storage": by_storage,
            "skipped": len(self.skipped),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "framework": self.framework,
            "format": self.format,
            "tensors": [t.as_dict() for t in self.tensors],
            "skipped": [s.as_dict() for s in self.skipped],
            "totals": self.totals,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.as_dict(), indent=indent)


@dataclass(frozen=True, eq=False, kw_only=True, init=False)
class SiteArrays:
    """The sites of a plan as columns, resolved to byte offsets: the one per-site type of every backend.

    Attributes
    ----------
    positions : array of int64 or None
        Position of each site in its plan; None when the sites are the plan's own order.
    tensor : array of int
        Index of each site's tensor in the :class:`TensorTable` (or list of tensors) it goes with.
    offsets : array of int64
        Byte offset of each site: absolute in a file, or from the tensor's base address (live
        tensors, device spans).
    and_mask, or_mask, xor_mask : array of uint64
        The word rule's masks, ``new = ((old & and) | or) ^ xor``.
    scale : array of float64 or None
        Value-level factor per site (NaN = bitwise site), when the plan scales.
    words : array of uint64 or None
        Replacement words per site (replay / revert), when given.

    Columns are NumPy arrays on the host, or CuPy (or simulator NumPy) arrays on a device.
    """

    positions: Any = None
    tensor: Any
    offsets: Any
    and_mask: Any
    or_mask: Any
    xor_mask: Any
    scale: Any = None
    words: Any = None

    def __init__(self, *, positions: Any = None, tensor: Any, offsets: Any, and_mask: Any, or_mask: Any,
                 xor_mask: Any, scale: Any = None, words: Any = None) -> None:
        # built once per trial on the live path: fill the frozen instance's dict at once (the generated
        # __init__ sets each field through object.__setattr__, ~3 us for eight columns)
        self.__dict__.update(positions=positions, tensor=tensor, offsets=offsets, and_mask=and_mask,
                             or_mask=or_mask, xor_mask=xor_mask, scale=scale, words=words)

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def take(self, idx: Any) -> "SiteArrays":
        """The sites at ``idx`` (an index array or boolean mask), every column gathered alike."""
        pick = lambda v: None if v is None else v[idx]  # noqa: E731
        pos = np.arange(len(self))[idx] if self.positions is None else self.positions[idx]
        return SiteArrays(positions=pos, tensor=self.tensor[idx], offsets=self.offsets[idx],
                          and_mask=self.and_mask[idx], or_mask=self.or_mask[idx], xor_mask=self.xor_mask[idx],
                          scale=pick(self.scale), words=pick(self.words))


@dataclass(frozen=True, eq=False)
class TensorTable:
    """The per-tensor table a :class:`SiteArrays` ``tensor`` column indexes.

    Attributes
    ----------
    itemsizes : sequence of int
        Word size in bytes.
    swaps : sequence of bool
        True where the stored byte order is not the host's.
    dtypes : sequence
        Stored dtype, or a :class:`fastflip.core.dtypes.WordType` for float formats held in words.
    bases : sequence of int
        Base address (live host tensors), 0 for a file (offsets are absolute) or a tensor not on the host.
    extents : sequence of int
        Bytes reachable from the base (bounds of the raw kernels).
    """

    itemsizes: Any
    swaps: Any
    dtypes: Any
    bases: Any
    extents: Any

    def __len__(self) -> int:
        return len(self.itemsizes)

    @classmethod
    def of_words(cls, types: Any, bases: Any = None, extents: Any = None) -> "TensorTable":
        """The table of word types ``types`` (:class:`fastflip.core.dtypes.WordType`: ``itemsize``,
        ``swapped``): ``bases`` default 0 (absolute offsets, as in a file), ``extents`` 0 (unbounded here:
        the buffer bounds the sites).

        >>> from fastflip.core.dtypes import word_type
        >>> t = TensorTable.of_words([word_type(">f4"), word_type("<u2", "bfloat16")])
        >>> t.itemsizes.tolist(), t.swaps.tolist() == [np.little_endian, not np.little_endian], t.dtypes[1].name
        ([4, 2], True, 'bfloat16')
        """
        types = list(types)
        n = len(types)
        return cls(itemsizes=np.array([t.itemsize for t in types], np.int32),
                   swaps=np.array([t.swapped for t in types], np.uint8), dtypes=types,
                   bases=np.zeros(n, np.uint64) if bases is None else np.asarray(bases, np.uint64),
                   extents=np.zeros(n, np.int64) if extents is None else np.asarray(extents, np.int64))


def natural_key(path: str) -> tuple[Any, ...]:
    """Sort key that orders '/vars/2' before '/vars/10' (the order of tensors in a :class:`Layout`)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path))


def replace(tensor: Tensor, **changes: Any) -> Tensor:
    """A copy of ``tensor`` with fields changed (``dataclasses.replace``)."""
    return dataclasses.replace(tensor, **changes)

