"""Walk an HDF5 file once and describe every numeric dataset as a :class:`Tensor`.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

The walk reads metadata only (link tables, object headers, the chunk index of
chunked datasets), never dataset data, so its cost grows with the number of
datasets and chunks, not with the file size. Each dataset is listed once:
hard links and soft links that reach the same object are merged, and the
canonical path is the first of its paths in sorted order (all of them are kept
in ``aliases``). External links are never followed. Datasets whose stored bytes overlap are refused
(:mod:`fastflip.files.h5overlap`); element byte offsets are in :mod:`fastflip.files.h5offsets`.

Storage kinds (``Tensor.storage``):

``contiguous``
    raw bytes at ``Tensor.offset``; element ``i`` lies at ``offset + i * itemsize``.
``chunked``
    unfiltered chunks; see :class:`~fastflip.files.h5offsets.ChunkIndex` and
    :func:`~fastflip.files.h5offsets.element_byte_offsets`.
``filtered``
    chunks pass through filters (``Tensor.filters``): only read-modify-write works.
``compact``
    bytes live in the object header; only h5py writes reach them.
``external``
    raw data in files outside the checkpoint (never written by fastflip).
``virtual``
    a virtual dataset mapping other datasets.
``unallocated``
    contiguous storage never written (reads return the fill value).

Examples
--------
>>> import os, tempfile, numpy as np, h5py
>>> path = os.path.join(tempfile.mkdtemp(), "doc.h5")
>>> with h5py.File(path, "w") as f:
...     _ = f.create_dataset("w", data=np.arange(6, dtype=">f4").reshape(2, 3))
...     f["alias"] = f["w"]
>>> lay = read_layout(path)
>>> t = lay.tensors[0]
>>> t.path, t.aliases, t.dtype.str, t.shape, t.storage
('/alias', ('/alias', '/w'), '>f4', (2, 3), 'contiguous')
>>> from fastflip.files.h5offsets import element_byte_offsets
>>> offs = element_byte_offsets(path, t, np.array([0, 5]))
>>> with open(path, "rb") as fh:
...     _ = fh.seek(int(offs[1])); np.frombuffer(fh.read(4), ">f4").tolist()
[5.0]
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Callable

import numpy as np

from ..core.dtypes import is_supported_dtype
from ..core.floatformats import FORMATS, format_name
from ..core.records import EXTERNAL_LINK_REASON, STORAGE_KINDS, Layout, Skipped, Tensor, replace
from ..core.records import natural_key as _natural_key
from .formats import detect_format, read_layout as read_other_layout
from .formats.hfdir import KERAS_INDEX_SUFFIX, ShardedLayout, find_index, is_checkpoint_dir, read_sharded_layout
from .h5index import object_info
from .h5open import open_h5
from .h5overlap import refuse_shared_bytes
from .keras_dtypes import BF16_WORDS, KerasReading, keras_reading, settle
from .roles import annotate as _annotate, file_framework, keras3_written
from ..errors import NotHDF5Error

__all__ = [
    "Tensor",
    "Skipped",
    "Layout",
    "read_layout",
    "read_checkpoint_dir",
    "open_h5",
    "STORAGE_KINDS",
    "EXTERNAL_LINK_REASON",
    "replace",
]

# HDF5 filter ids → names (h5z constants, kept here to avoid importing h5py at module import)
_FILTER_NAMES = {1: "gzip", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset", 32000: "lzf"}

# IEEE-754 bit fields as h5py reports them: (sign pos, exp pos, exp size, mant pos, mant size)
_IEEE_FIELDS = {2: (15, 10, 5, 0, 10), 4: (31, 23, 8, 0, 23), 8: (63, 52, 11, 0, 52)}
_IEEE_EBIAS = {2: 15, 4: 127, 8: 1023}


# --------------------------------------------------------------------------------------------
# the walk


def _skip_reason(tid: Any, dt: np.dtype, shape: tuple[int, ...] | None) -> str | None:
    """Why a dataset (its low-level ``TypeID``, its dtype and shape) is not a tensor (None when it is one)."""
    from h5py import h5t

    if dt.metadata is not None or dt.kind not in "biuf":  # h5py marks strings, vlen, references, enums so
        reason = _special_dtype(dt)
        if reason is not None:
            return reason
    if not is_supported_dtype(dt):
        return f"unsupported dtype {dt}"
    if tid.get_size() != dt.itemsize:
        return f"stored type of {tid.get_size()} bytes does not match {dt}"
    if dt.kind == "f" and (
        tuple(tid.get_fields()) != _IEEE_FIELDS[dt.itemsize] or tid.get_ebias() != _IEEE_EBIAS[dt.itemsize]
        or tid.get_norm() != h5t.NORM_IMPLIED
    ):
        return "non-IEEE floating-point type"
    if isinstance(tid, h5t.TypeAtomicID) and (tid.get_precision() != 8 * dt.itemsize or tid.get_offset()):
        return (f"a type of {tid.get_precision()} significant bits at bit {tid.get_offset()} of its {dt.itemsize} "
                "bytes (h5py reads values other than the stored words)")
    if shape is None:
        return "null dataspace"
    if 0 in shape:
        return "empty"
    return None


def _special_dtype(dt: np.dtype) -> str | None:
    """Why a dtype that is not plain numbers (fields, subarrays, or h5py's metadata) is not a tensor."""
    import h5py

    if dt.fields is not None:
        return "compound dtype"
    if dt.subdtype is not None:
        return f"array dtype {dt}"
    if h5py.check_string_dtype(dt) is not None or dt.kind in "SU":
        return "string dtype"
    if h5py.check_vlen_dtype(dt) is not None:
        return "variable-length dtype"
    if h5py.check_ref_dtype(dt) is not None:
        return "reference dtype"
    if dt.kind == "O":
        return "object dtype"
    if h5py.check_enum_dtype(dt) is not None:
        return "enum dtype (only the boolean enum is a tensor)"
    return None


def _lossy_reason(dsid: Any) -> str | None:
    """Why a dataset whose filters include scale-offset is not a tensor: h5py would not read back a flip written
    through it (None for the lossless kind: integers at the minimum bits, ``scaleoffset=0``)."""
    from h5py import h5z

    dcpl = dsid.get_create_plist()
    for i in range(dcpl.get_nfilters()):
        code, _flags, values = dcpl.get_filter(i)[:3]
        if code == h5z.FILTER_SCALEOFFSET and tuple(values[:2]) != (2, 0):  # (H5Z_SO_INT, minimum bits)
            return ("scale-offset filter that keeps a set number of bits or digits (lossy: a flip written through it "
                    "is rounded away)")
    return None


def _storage(dsid: Any) -> tuple[str, int | None, tuple[int, ...] | None, tuple[str, ...]]:
    """(storage kind, offset, chunks, filters) of a dataset, from its creation property list."""
    from h5py import h5d

    dcpl = dsid.get_create_plist()
    lay = dcpl.get_layout()
    filters: list[str] = []
    for i in range(dcpl.get_nfilters()):
        code = int(dcpl.get_filter(i)[0])
        filters.append(_FILTER_NAMES.get(code, f"filter-{code}"))
    if lay == h5d.VIRTUAL:
        return "virtual", None, None, tuple(filters)
    if dcpl.get_external_count() > 0:
        return "external", None, None, tuple(filters)
    if lay == h5d.COMPACT:
        return "compact", None, None, tuple(filters)
    if lay == h5d.CHUNKED:
        chunks = tuple(int(c) for c in dcpl.get_chunk())
        return ("filtered" if filters else "chunked"), None, chunks, tuple(filters)
    off = dsid.get_offset()
    if off is None:
        return "unallocated", None, None, tuple(filters)
    return "contiguous", int(off), None, tuple(filters)


def _encode(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


MAX_DEPTH = 100_000  # groups below the root; deeper groups are reported in ``skipped``, not walked


def _walk(root: Any, root_addr: int, datasets: list[tuple[str, int]], skipped: list[Skipped],
          group_links: list[tuple[str, str]], max_depth: int = MAX_DEPTH,
          describe: Callable[[Any, bytes], Any] | None = None) -> dict[int, Any]:
    """Collect (path, object address) of every dataset link below the root group (low-level h5py API); return
    ``describe(group, link name)`` of each dataset object by address (empty without ``describe``).

    Iterative (no recursion limit) and breadth-first with names in order; each group
    *object* is walked once, by address, under the first path that reaches it — a group
    reached again through another link goes to ``group_links`` as (link path, walked path)
    (aliases are derived from it afterwards, see :func:`_group_aliases`), and a link back to
    an ancestor (a cycle) is not followed. A doubling chain of hard links thus costs one
    visit per group, not one per path. External and user-defined links are recorded in
    ``skipped``, never followed. ``describe`` is called once per dataset object, for the first link found to it,
    with the group it lies in still open (the dataset opens from there, no path traversal); the other links to
    the object (hard links) are listed in ``datasets`` but not described again.
    """
    from collections import deque

    from h5py import h5g, h5l, h5o

    seen: dict[int, str] = {root_addr: "/"}
    described: dict[int, Any] = {}
    queue: deque[tuple[Any, str, int]] = deque([(root, "/", 0)])
    while queue:
        gid, prefix, depth = queue.popleft()
        entries: list[tuple[bytes, int]] = []
        gid.links.iterate(lambda name, info: entries.append((name, info.type)), info=True)
        for bname, ltype in entries:
            name = bname.decode("utf-8", "surrogateescape")
            path = f"{prefix}/{name}" if prefix != "/" else f"/{name}"
            if ltype == h5l.TYPE_EXTERNAL:
                skipped.append(Skipped(path, EXTERNAL_LINK_REASON))
                continue
            if ltype not in (h5l.TYPE_HARD, h5l.TYPE_SOFT):
                skipped.append(Skipped(path, "user-defined link (not followed)"))
                continue
            try:  # address and type only (h5o.get_info would walk a chunked dataset's whole index)
                addr, otype = object_info(gid, bname)
            except (KeyError, RuntimeError, OSError, ValueError):
                skipped.append(Skipped(path, "dangling link"))
                continue
            if otype == h5o.TYPE_DATASET:
                if describe is not None and addr not in described:
                    described[addr] = describe(gid, bname)
                datasets.append((path, addr))
            elif otype == h5o.TYPE_GROUP:
                if addr in seen:
                    first = seen[addr]
                    if not (path + "/").startswith(first.rstrip("/") + "/"):  # not a link back to an ancestor
                        group_links.append((path, first))
                elif depth + 1 > max_depth:
                    skipped.append(Skipped(path, f"group nested deeper than {max_depth} levels (not walked)"))
                else:
                    seen[addr] = path
                    queue.append((h5g.open(gid, bname), path, depth + 1))
        del gid  # close the group before the next one
    return described


MAX_ALIASES = 16  # paths listed per dataset; more (hard-link chains) are reported in ``skipped``


def _group_aliases(found: list[tuple[str, int]], group_links: list[tuple[str, str]],
                   skipped: list[Skipped]) -> list[tuple[str, int]]:
    """Add the dataset paths that go through a second link to a group, at most MAX_ALIASES per dataset."""
    if not group_links:
        return found
    paths: dict[int, list[str]] = {}
    for lp, addr in found:
        paths.setdefault(addr, []).append(lp)
    capped: set[int] = set()
    changed = True
    while changed:
        changed = False
        for link, target in group_links:
            pre = target.rstrip("/") + "/"
            for addr, lst in paths.items():
                for q in list(lst):
                    if not q.startswith(pre):
                        continue
                    alias = link + "/" + q[len(pre):]
                    if alias in lst:
                        continue
                    if len(lst) >= MAX_ALIASES:
                        capped.add(addr)
                        continue
                    lst.append(alias)
                    changed = True
    for addr in capped:
        skipped.append(Skipped(min(paths[addr]), f"more than {MAX_ALIASES} paths reach this dataset "
                               "(chained group links); only the first are listed as aliases"))
    return [(lp, addr) for addr, lst in paths.items() for lp in lst]


MAX_BYTES = 2**60  # tensors up to 1 EiB: element x bit counts stay below 2**63


def open_dataset(fid: Any, path: str) -> Any:
    """Open a dataset by path one link at a time (HDF5's path traversal has a nesting limit)."""
    from h5py import h5d, h5g

    parts = [x for x in path.split("/") if x]
    gid = fid
    for part in parts[:-1]:
        gid = h5g.open(gid, _encode(part))
    return h5d.open(gid, _encode(parts[-1]))


def read_layout(path: str | os.PathLike[str], *, annotate: bool = True, verify: bool = False) -> Layout:
    """Walk an HDF5 file and return its :class:`Layout` (metadata only, data never read).

    Parameters
    ----------
    path : str or path-like
        The HDF5 file (opened read-only).
    annotate : bool
        Fill ``framework``/``layer``/``role`` with :func:`fastflip.files.roles.annotate`.
    verify : bool
        Also read the data where the framework's loader checks it as it reads: every member of an ``.npz``,
        refused (:class:`~fastflip.errors.FormatError`) when ``np.load`` refuses one (a CRC-32 that does not
        match). A read of the whole archive: ``fastflip inspect`` asks for it; an inject checks only the
        members it flips.

    Raises
    ------
    InputFileError, NotHDF5Error
        Missing, unreadable, non-HDF5 or truncated file.
    """
    from h5py import h5d, h5o

    p = os.fspath(path)
    if is_checkpoint_dir(p):  # a Hugging Face directory or Keras sharded save (or its index): one layout
        return read_checkpoint_dir(p)
    if os.path.isfile(p):  # other checkpoint formats (torch.save, safetensors, npy/npz): detected by content

        fmt = detect_format(p)
        if fmt != "hdf5":
            return read_other_layout(p, fmt, verify=verify)
    with open_h5(p) as f:
        fsize = os.path.getsize(p)
        skipped: list[Skipped] = []
        tensors: list[Tensor] = []
        try:
            found: list[tuple[str, int]] = []
            group_links: list[tuple[str, str]] = []
            described: dict[int, dict[str, Any] | str | KerasReading] = _walk(
                f.id, int(h5o.get_info(f.id).addr), found, skipped, group_links,
                describe=lambda gid, name: _describe(h5d.open(gid, name), fsize))
            found = _group_aliases(found, group_links, skipped)
            by_addr: dict[int, list[str]] = {}
            for lpath, addr in found:
                by_addr.setdefault(addr, []).append(lpath)
            framework = file_framework([p for p, _ in found], f)
            # Keras reads the dtype attribute only in a file its weights writer could produce
            keras3 = framework == "keras3" and keras3_written(p for p, _ in found)
            for addr, paths in by_addr.items():
                aliases = tuple(sorted(set(paths)))
                d = settle(described[addr], keras3)
                if isinstance(d, str):
                    skipped.append(Skipped(aliases[0], d))
                else:
                    tensors.append(Tensor(path=aliases[0], aliases=aliases, **d))
        except (OSError, RuntimeError, KeyError, ValueError, TypeError, OverflowError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise NotHDF5Error(f"{p}: damaged HDF5 file ({first})") from None
        refuse_shared_bytes(p, f, tensors)
        tensors.sort(key=lambda t: _natural_key(t.path))
        skipped.sort(key=lambda s: s.path)
        layout = Layout(file=p, tensors=tensors, skipped=skipped)
        if annotate:
            _annotate(layout, f, framework=framework)
    return layout


def read_checkpoint_dir(path: str | os.PathLike[str]) -> ShardedLayout:
    """One layout over every shard of a checkpoint directory or its index: a Keras sharded save (``*.weights.json``
    and its ``.weights.h5`` shards, :mod:`fastflip.files.keras_sharded`, each shard read by :func:`read_layout`
    unannotated, the set annotated as one), else a Hugging Face directory
    (:func:`fastflip.files.formats.hfdir.read_sharded_layout`)."""
    found = find_index(path)
    if found is not None and found[1] is not None and found[1].endswith(KERAS_INDEX_SUFFIX):
        from .keras_sharded import read_keras_sharded  # a Keras sharded save only: not loaded for a single file

        return read_keras_sharded(os.path.join(found[0], found[1]), functools.partial(read_layout, annotate=False))
    return read_sharded_layout(path)


def _describe(dsid: Any, fsize: int) -> dict[str, Any] | str | KerasReading:
    """A dataset (low-level ``DatasetID``) as the fields of its :class:`Tensor` but its paths (the caller names
    it once every link to it is known), or why it is not a tensor; both readings (h5py's and Keras's) when its
    ``dtype`` attribute makes Keras's weights loader read it otherwise (:mod:`fastflip.files.keras_dtypes`)."""
    keras = keras_reading(dsid)
    plain = _describe_as(dsid, fsize)
    if keras != "bfloat16":
        return plain if keras is None else KerasReading(plain, keras)
    words = _describe_as(dsid, fsize, BF16_WORDS)
    return KerasReading(plain if not isinstance(plain, str) else f"{plain} (opaque words: h5py reads raw bytes; "
                        "Keras reads them as bfloat16 only in a file of its weights layout, where every "
                        "dataset is a vars/<key> entry)",
                        {**words, "format": "bfloat16"} if isinstance(words, dict) else words)


def _describe_as(dsid: Any, fsize: int, words: np.dtype | None = None) -> dict[str, Any] | str:
    """:func:`_describe` of h5py's reading, or of the dataset read as ``words`` (a dtype of its width)."""
    from h5py import h5s

    tid = dsid.get_type()
    dtype = np.dtype(tid.dtype) if words is None else words
    space = dsid.get_space()
    shape = None if space.get_simple_extent_type() == h5s.NULL else tuple(int(s) for s in space.shape)
    reason = _skip_reason(tid, dtype, shape)
    if reason is not None:
        return reason
    assert shape is not None
    storage, offset, chunks, filters = _storage(dsid)
    if "scaleoffset" in filters and (reason := _lossy_reason(dsid)) is not None:
        return reason
    size = math.prod(shape)  # Python ints: no overflow whatever the declared shape
    if size * dtype.itemsize >= MAX_BYTES:
        return f"declares {size} elements ({size * dtype.itemsize} bytes), more than can be addressed (2**60 bytes)"
    if storage == "contiguous" and offset is not None and offset + size * dtype.itemsize > fsize:
        return "data lies past the end of the file (damaged or truncated)"
    fmt = _format_attr(dsid) if dtype.kind == "u" and dtype.itemsize <= 2 else None
    return {"dtype": dtype, "shape": shape, "size": size, "storage": storage, "offset": offset, "chunks": chunks,
            "filters": filters, "nbytes": size * dtype.itemsize, "format": fmt}


_FORMAT_ATTRS = (b"fastflip_format", b"torch_dtype")


def _format_attr(dsid: Any) -> str | None:
    """The float format that unsigned words carry (``torch_dtype = "bfloat16"`` as fastflip.frameworks.torch_state writes it)."""
    from h5py import Dataset, h5a

    names = [n for n in _FORMAT_ATTRS if h5a.exists(dsid, n)]
    if not names:
        return None
    attrs = Dataset(dsid).attrs
    for name in names:
        value = attrs.get(name.decode())
        fmt = format_name(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))
        if fmt is not None and FORMATS[fmt].bits == 8 * dsid.dtype.itemsize:
            return fmt
    return None
