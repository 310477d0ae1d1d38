"""The tensor record: one numeric tensor, wherever it lives, and a file's list of them.

:class:`Tensor` (name, aliases, dtype and float format, shape, role, layer, framework, and where the
bytes are: ``storage`` with ``offset``/``chunks``/``filters`` in a file) is what the file layer's
:func:`fastflip.files.layout.read_layout` and the other format readers produce, what
:mod:`fastflip.files.select` selects from and what :mod:`fastflip.files.roles` labels; live tensors
give the same record (:meth:`fastflip.live.targets.Targets.records`). :class:`Layout` is the list
of one file's tensors plus the datasets skipped and why.

Imports: :mod:`fastflip.errors` and :mod:`fastflip.core.plan` only; every layer may import it.

>>> import numpy as np
>>> t = Tensor("/w", ("/w",), np.dtype("<f4"), (2, 3), 6, "contiguous", offset=2048, nbytes=24)
>>> t.name, t.itemsize, t.raw_writable, t.ref().shape
('/w', 4, True, (2, 3))
>>> replace(t, role="weight").role
'weight'
>>> t.in_file, replace(t, storage="memory").in_file
(True, False)
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

__all__ = ["Tensor", "Skipped", "Layout", "replace", "natural_key", "STORAGE_KINDS", "FILE_STORAGE", "LIVE_STORAGE",
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


def natural_key(path: str) -> tuple[Any, ...]:
    """Sort key that orders '/vars/2' before '/vars/10' (the order of tensors in a :class:`Layout`)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path))


def replace(tensor: Tensor, **changes: Any) -> Tensor:
    """A copy of ``tensor`` with fields changed (``dataclasses.replace``)."""
    return dataclasses.replace(tensor, **changes)

