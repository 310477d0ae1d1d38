"""``torch.save`` zip files read without running their pickle: where each tensor's bytes lie.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A ``torch.save`` file (PyTorch >= 1.6) is a zip archive: ``<name>/data.pkl`` (the
pickled object, tensors replaced by persistent ids naming storages), ``<name>/data/<key>``
(each storage's raw bytes, stored uncompressed and aligned) and ``<name>/byteorder``.

The pickle is read by :class:`RestrictedUnpickler`, whose ``find_class`` hands out
inert stand-ins for torch's tensor-rebuild functions, storage types and dtypes, plus
``collections.OrderedDict`` and a few plain builtin types; anything else (a model
class, ``os.system``, ``eval``, NumPy arrays, ...) is refused with one line before any
of it runs, and torch is never imported. Each tensor becomes a record (storage key,
dtype, element offset, shape, strides); C-contiguous tensors become
:class:`~fastflip.files.layout.Tensor` objects with the absolute byte offset of their first
element. Tensors that are the same view of one storage (tied weights, an object saved
under two keys) are listed once with all their keys as aliases; a view inside a listed
tensor's bytes (a slice) and non-contiguous views are skipped with the reason, so no
byte is counted twice.

What torch would read differently is refused, not guessed: the pickle is bounded before it is
unpickled (:mod:`.picklescan`: opcodes, memo indexes; the walk visits each container once), stand-in
records are immutable (pickle's BUILD on one is refused), every shape, stride and offset is checked one
number at a time (:mod:`.bounds`), a storage named twice with different types, a storage entry whose size
differs from its persistent id, and (legacy files) a storage saved as a view are refused; duplicate or
overlapping archive entries are refused by :mod:`.zipraw`. The archive is named as torch names it (the folder of
the directory's first entry; records found ignoring letter case, so names that differ only in case are refused),
its ``byteorder``, ``version`` and ``.storage_alignment`` records are checked as torch checks them, and a pickle
holding an opcode or global torch's weights-only unpickler refuses is refused.

bfloat16 and float8 tensors have no NumPy dtype here: they are listed as their
unsigned words (``<u2``, ``|u1``), exactly as stored (bit 0 = the word's LSB), with
their ``format`` (bfloat16, float8_e4m3fn, float8_e5m2) so that fields and values are the format's.

Examples
--------
>>> import io, pickle
>>> class Evil:
...     def __reduce__(self):
...         return (eval, ("1 + 1",))
>>> try:
...     restricted_loads(pickle.dumps(Evil(), protocol=4), "evil.pt")
... except UnsafeInputError as e:
...     print(str(e)[:58])
evil.pt: the pickle asks for builtins.eval, which fastflip
"""

from __future__ import annotations

import collections
import io
import pickle
import re
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ...core.floatformats import format_name
from ...core.records import Layout, Skipped, Tensor
from ...core.records import natural_key as _natural_key
from ...errors import FormatError, UnsafeInputError
from .bounds import checked_ints, checked_numel
from .naming import label_tensors, optimizer_layers
from .picklescan import TORCH_OPCODES, scan_pickle, walk_tensors
from .torchquant import QUANT_DTYPES, QUANT_STORAGES, quantized_globals
from .torchsub import SubclassRecord, from_type, inner_records, subclass_global, subclass_globals
from .zipraw import ZipEntry, entry_data, stored_entries

__all__ = ["RestrictedUnpickler", "TensorRecord", "StorageRef", "restricted_loads", "read_torch_layout",
           "layout_from_records", "records_of", "TORCH_DTYPES"]

# torch dtype name -> (stored word dtype, little-endian form); bf16 / fp8 as unsigned words
TORCH_DTYPES = {
    "float64": "<f8", "float32": "<f4", "float16": "<f2", "bfloat16": "<u2",
    "int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "|i1",
    "uint64": "<u8", "uint32": "<u4", "uint16": "<u2", "uint8": "|u1", "bool": "|b1",
    "float8_e4m3fn": "|u1", "float8_e5m2": "|u1", "float8_e4m3fnuz": "|u1", "float8_e5m2fnuz": "|u1",
    "float8_e8m0fnu": "|u1",
}
_STORAGE_TYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool",
}
_LOCATION = re.compile(r"(cpu|(cuda|mps|xpu)(:[0-9]+)?)\Z")  # a storage's device, as torch.load restores it
TORCH_DTYPES.update(QUANT_DTYPES)  # quantized tensors as their integer words (see .torchquant)
_STORAGE_TYPES.update(QUANT_STORAGES)


class _Sealed:
    """Stand-ins are immutable: pickle's BUILD (``__setstate__``) on one is refused, so a pickle cannot change
    the shared stand-ins (a later read would see a float32 tensor as ``<i4``) nor a record it built."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise FormatError(f"the pickle sets the state of a {type(self).__name__.lstrip('_')} (a tensor or dtype "
                          "record); the file is damaged or crafted")

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles of records rebuild from their fields
        import dataclasses

        return (type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self)))  # type: ignore[arg-type]


@dataclass(frozen=True)
class _DType(_Sealed):
    """Stand-in for a ``torch.<dtype>`` global."""

    name: str


@dataclass(frozen=True)
class _StorageType(_Sealed):
    """Stand-in for a ``torch.<X>Storage`` class (dtype None: ``UntypedStorage``, bytes)."""

    dtype: str | None
    name: str


@dataclass(frozen=True)
class StorageRef(_Sealed):
    """A storage named by a persistent id: archive key, element dtype (None: bytes), element count."""

    key: str
    dtype: str | None
    numel: int


@dataclass(frozen=True)
class TensorRecord(_Sealed):
    """A tensor as the pickle describes it (nothing of it is materialised)."""

    storage: StorageRef
    offset: int  # in elements of dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str  # torch dtype name
    parts: tuple[tuple[str, Any], ...] = ()  # a quantized tensor's stored per-channel scales / zero points

    @property
    def identity(self) -> tuple[Any, ...]:
        """Equal for records that are the same view of the same storage (tied weights)."""
        return (self.storage.key, self.offset, self.shape, self.stride, self.dtype)


def _ints(x: Any, what: str) -> tuple[int, ...]:
    """A record's shape or strides as ints (bounded: no negative or over-large value is let through)."""
    return checked_ints(x, "a tensor record", what)


def _offset(x: Any) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        raise FormatError(f"a tensor record declares a malformed storage offset ({type(x).__name__})")
    return checked_ints((x,), "a tensor record", "storage offset")[0]


def _shape_strides(size: Any, stride: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A record's shape and strides, one stride a dimension (torch refuses another count)."""
    shape, strides = _ints(size, "shape"), _ints(stride, "stride")
    if len(shape) != len(strides):
        raise FormatError(f"a tensor record declares {len(shape)} dimensions and {len(strides)} strides (torch.load "
                          "refuses it); the file is damaged or crafted")
    return shape, strides


def _rebuild_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, *rest: Any) -> TensorRecord:
    if not isinstance(storage, StorageRef) or storage.dtype is None:
        raise FormatError("tensor record without a typed storage")
    return TensorRecord(storage, _offset(storage_offset), *_shape_strides(size, stride), storage.dtype)


def _rebuild_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = None,
                hooks: Any = None, dtype: Any = None, *rest: Any) -> TensorRecord:
    if not isinstance(storage, StorageRef) or not isinstance(dtype, _DType):
        raise FormatError("tensor record (v3) without a storage and a dtype")
    return TensorRecord(storage, _offset(storage_offset), *_shape_strides(size, stride), dtype.name)


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    return data


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any = None) -> Any:
    if not callable(func) or not isinstance(args, tuple):
        raise FormatError("malformed tensor-subclass record")
    return from_type(func(*args), new_type, state, lambda v: isinstance(v, TensorRecord))  # torchao's subclasses


def _codecs_encode(text: Any, encoding: Any = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise FormatError("malformed bytes record")
    return text.encode("latin1")


class _Inert:
    """Stand-in for an allowed class whose instances carry no meaning for fastflip (nn.Parameter type)."""


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch.nn.parameter", "Parameter"): _Inert,
    ("torch", "Tensor"): _Inert,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "complex"): complex,
    ("__builtin__", "set"): set,  # protocol-2 names (find_class sees them unmapped)
    ("__builtin__", "complex"): complex,
    ("_codecs", "encode"): _codecs_encode,
    ("torch.storage", "UntypedStorage"): _StorageType(None, "UntypedStorage"),
}
_ALLOWED.update({("torch", k): _StorageType(v, k) for k, v in _STORAGE_TYPES.items()})
_ALLOWED.update({("torch", k): _DType(k) for k in TORCH_DTYPES})
_ALLOWED.update(quantized_globals(_rebuild_v2))
_ALLOWED.update(subclass_globals(_DType))


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that builds :class:`TensorRecord` objects and plain containers, and runs nothing else.

    ``find_class`` answers only the names in its allow-list (inert stand-ins, never torch's
    own functions); every other global raises :class:`~fastflip.files.formats.UnsafeInputError`.
    ``legacy`` selects the persistent ids of the legacy format (six fields, the last a storage
    view that fastflip refuses) over the zip format's five, as torch's own loaders do.
    """

    def __init__(self, data: bytes | BinaryIO, where: str, legacy: bool = False) -> None:
        super().__init__(io.BytesIO(data) if isinstance(data, bytes) else data)  # a file: read from its position
        self.where = where
        self.legacy = legacy
        self.storages: dict[str, StorageRef] = {}
        self.previous: tuple[str, str] | None = None  # the global asked for before (a subclass follows its rebuild)

    def find_class(self, module: str, name: str) -> Any:
        previous, self.previous = self.previous, (module, name)
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            pass
        found = subclass_global(module, name, self.where, previous)  # torchao's classes, or a one-line refusal
        if found is not None:
            return found
        if module == "torch" and name.endswith("Storage"):
            raise FormatError(f"{self.where}: tensors of storage type torch.{name} are not supported "
                              "(float, int, bool, bfloat16, float8 and qint8/quint8/qint32 tensors are)")
        raise UnsafeInputError(
            f"{self.where}: the pickle asks for {module}.{name}, which fastflip does not run (only tensors and plain "
            "containers are read); save a state_dict (torch.save(model.state_dict(), f)) instead")

    def persistent_load(self, pid: Any) -> StorageRef:
        fields = 6 if self.legacy else 5
        if not (isinstance(pid, tuple) and len(pid) == fields and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and isinstance(pid[4], int)
                and not isinstance(pid[4], bool)):
            raise FormatError(f"{self.where}: unexpected persistent id in the pickle: {str(pid)[:80]}")
        if not (isinstance(pid[3], str) and _LOCATION.match(pid[3])):  # torch restores no other place
            raise FormatError(f"{self.where}: storage {pid[2][:40]!r} is saved on device {str(pid[3])[:40]!r}; "
                              "fastflip reads storages saved on cpu, cuda, mps or xpu")
        if self.legacy and pid[5] is not None:  # torch's tensor would be a view into the storage: not applied here
            raise FormatError(f"{self.where}: storage {pid[2][:40]!r} is saved as a view of another storage (legacy "
                              "view metadata), which fastflip does not read; load and re-save the file with torch.save")
        numel = checked_ints((pid[4],), f"{self.where}: storage {pid[2][:40]!r}", "element count")[0]
        ref = StorageRef(pid[2], pid[1].dtype, numel)
        first = self.storages.setdefault(ref.key, ref)
        if first != ref:  # torch keeps the first one it meets: its dtype would reinterpret the later tensors
            raise FormatError(f"{self.where}: storage {ref.key[:40]!r} is named twice with different types or sizes; "
                              "the file is damaged or crafted")
        return ref


def restricted_loads(data: bytes | BinaryIO, where: str, legacy: bool = False) -> Any:
    """Unpickle ``data`` (bytes, or the next pickle of a file) with :class:`RestrictedUnpickler` (tensors become
    :class:`TensorRecord`), after :func:`~fastflip.files.formats.picklescan.scan_pickle` bounded it."""
    if not isinstance(data, bytes):  # a stream: scan the next pickle, then unpickle exactly its bytes
        start = data.tell()
        ops = scan_pickle(data, where)
        end = data.tell()
        data.seek(start)
        data = data.read(end - start)
    else:
        ops = scan_pickle(data, where)
    try:
        obj = RestrictedUnpickler(data, where, legacy).load()
    except UnsafeInputError:
        raise
    except FormatError as exc:  # a record's own check: name the file
        if str(exc).startswith(where):
            raise
        raise FormatError(f"{where}: {exc}") from None
    except Exception as exc:  # any malformed pickle (MemoryError included): one line
        raise FormatError(f"{where}: the pickle cannot be read ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not ops <= TORCH_OPCODES:  # checked after the globals, so a pickle that would run code is named for that
        raise FormatError(f"{where}: the pickle uses opcode {min(ops - TORCH_OPCODES)}, which torch.load(weights_only="
                          "True) does not read (torch.save's pickle_protocol above 2?); re-save it with the default "
                          "protocol")
    return obj


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _contiguous(rec: TensorRecord) -> bool:
    return all(s == c for s, c, n in zip(rec.stride, _c_strides(rec.shape), rec.shape) if n > 1) and \
        len(rec.stride) == len(rec.shape)


_MAX_FILE_VERSION = 10  # the newest archive version torch.load reads (kMaxSupportedFileFormatVersion)


def _archive(path: str) -> tuple[str, dict[str, ZipEntry]]:
    """(entry prefix, entries) of a torch.save archive, named as torch.load names them: the prefix is the folder of
    the directory's first entry, and a record is looked up by its name in any letter case."""
    entries = stored_entries(path)
    pkl = [n for n in entries if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkl) != 1:
        raise FormatError(f"{path}: not a torch.save archive (needs exactly one <name>/data.pkl entry)")
    first = next(iter(entries))
    prefix = pkl[0][: -len("data.pkl")]
    if "/" not in first or first[: first.index("/") + 1] != prefix:
        raise FormatError(f"{path}: the archive's first entry {first[:80]!r} is not in the folder of its data.pkl "
                          f"({prefix[:80]!r}), so torch.load reads no data.pkl there; the file is damaged or crafted")
    folded: dict[str, str] = {}
    for name in entries:  # torch (miniz) finds records by name ignoring letter case: two such names are ambiguous
        other = folded.setdefault(name.lower(), name)
        if other != name:
            raise FormatError(f"{path}: zip entries {other[:80]!r} and {name[:80]!r} differ only in letter case, and "
                              "torch.load may read either for both; the file is damaged or crafted")
    return prefix, entries


def _version_checked(path: str, prefix: str, entries: dict[str, ZipEntry], fh: BinaryIO) -> None:
    """Refuse an archive whose records torch.load refuses before reading a tensor: no ``version`` record or one it
    cannot parse (a decimal number from 1 to :data:`_MAX_FILE_VERSION`), an unparsable ``.storage_alignment``."""
    version = entries.get(prefix + "version")
    text = entry_data(path, version, fh)[1][:64] if version is not None and version.size <= 64 else b""
    m = re.match(rb"[ \t\n\v\f\r]*\+?([0-9]+)", text)
    if m is None or not 1 <= int(m.group(1)) <= _MAX_FILE_VERSION:
        raise FormatError(f"{path}: the archive's version record is missing or reads {text[:20]!r} (torch.load reads "
                          f"versions 1 to {_MAX_FILE_VERSION}); the file is damaged or crafted")
    align = entries.get(prefix + ".storage_alignment")
    if align is not None:
        try:
            int(entry_data(path, align, fh)[1][:64] if align.size <= 64 else b"")
        except ValueError:
            raise FormatError(f"{path}: the archive's .storage_alignment record is not an integer (torch.load refuses "
                              "it); the file is damaged or crafted") from None


def read_records(path: str) -> tuple[Any, list[tuple[str, TensorRecord]], dict[str, ZipEntry], str, str]:
    """(unpickled object, [(key path, record)], archive entries, entry prefix, byte order) of a torch.save file."""
    prefix, entries = _archive(path)
    pkl = entries[prefix + "data.pkl"]
    if pkl.size > 1 << 30:
        raise FormatError(f"{path}: data.pkl is larger than 1 GiB")
    if prefix + "byteorder" in entries and entries[prefix + "byteorder"].size > 16:
        raise FormatError(f"{path}: the byteorder entry holds {entries[prefix + 'byteorder'].size} bytes (expected "
                          "'little' or 'big')")
    try:  # the entries of the directory parse already made (formats/zipraw.py), checked by their CRC-32
        with open(path, "rb") as fh:
            _version_checked(path, prefix, entries, fh)  # torch.load reads the version record before data.pkl
            data = entry_data(path, pkl, fh)[1]
            order = entry_data(path, entries[prefix + "byteorder"], fh)[1].decode("ascii", "replace") \
                if prefix + "byteorder" in entries else "little"  # exactly: torch.load refuses "little\n"
    except (OSError, MemoryError) as exc:
        raise FormatError(f"{path}: damaged torch.save archive ({str(exc)[:120]}); nothing was read") from None
    if order not in ("little", "big"):
        raise FormatError(f"{path}: byteorder entry says {order!r} (expected little or big)")
    obj = restricted_loads(data, path)
    return obj, records_of(obj), entries, prefix, order


def records_of(obj: Any) -> list[tuple[str, TensorRecord]]:
    """[(key path, record)] of every tensor in an unpickled object, in walk order; a torchao tensor subclass as
    its inner tensors (``<key path>.<name>``, :mod:`.torchsub`)."""
    found = walk_tensors(obj, lambda o: isinstance(o, (TensorRecord, SubclassRecord)),
                         parts=lambda o: getattr(o, "parts", ()))
    return inner_records(found)


def read_torch_layout(path: str) -> Layout:
    """Walk a ``torch.save`` zip file (metadata and pickle only; tensor data never read).

    Raises
    ------
    FormatError
        Damaged archive, malformed pickle, storage entries missing, compressed, or too short for their tensors.
    UnsafeInputError
        The pickle asks for anything but tensor rebuilds and plain containers.
    """
    obj, recs, entries, prefix, order = read_records(path)
    storages: dict[str, tuple[int, int]] = {}
    for _, rec in recs:
        entry = entries.get(f"{prefix}data/{rec.storage.key}")
        if entry is None:
            raise FormatError(f"{path}: a tensor names storage {rec.storage.key!r}, which the archive lacks")
        if not entry.stored:
            raise FormatError(f"{path}: storage entry {entry.name} is compressed; torch.save stores storages raw")
        if entry.size != storage_nbytes(rec.storage):  # torch sizes the storage by the pickle, not by the entry
            raise FormatError(f"{path}: storage entry {entry.name} holds {entry.size} bytes but the pickle declares "
                              f"{storage_nbytes(rec.storage)}; the file is damaged or crafted")
        storages[rec.storage.key] = (entry.offset, entry.size)
    return layout_from_records(path, obj, recs, storages, order, "torch")


def storage_itemsize(ref: StorageRef) -> int:
    """The bytes of one element of a storage (1 for an untyped storage)."""
    return int(TORCH_DTYPES[ref.dtype][-1]) if ref.dtype in TORCH_DTYPES else 1


def storage_nbytes(ref: StorageRef) -> int:
    """The bytes of a storage as its persistent id declares them (element count x element size)."""
    return ref.numel * storage_itemsize(ref)


def layout_from_records(path: str, obj: Any, recs: list[tuple[str, TensorRecord]],
                        storages: dict[str, tuple[int, int]], order: str, fmt: str) -> Layout:
    """The layout of tensor records whose storages lie at ``storages[key] = (file offset, bytes)``
    (a zip entry's data, or a legacy file's raw storage)."""
    skipped: list[Skipped] = []
    groups: dict[tuple[Any, ...], list[str]] = {}
    first: dict[tuple[Any, ...], TensorRecord] = {}
    owner: dict[str, tuple[Any, ...]] = {}
    for kp, rec in recs:
        key = rec.identity
        if owner.setdefault(kp, key) != key:  # one name for two tensors: a selection, a log would name either
            raise FormatError(f"{path}: two different tensors are saved under the key path {kp[:80]!r} (keys such "
                              "as 1 and '1', 'a/b' and a['b'], or a key that is also a tensor subclass's inner "
                              "tensor '<key>.<name>'); rename one and re-save the file")
        groups.setdefault(key, []).append(kp)
        first.setdefault(key, rec)
    spans: list[tuple[str, int, int, str]] = []  # (storage key, start byte, end byte, path) of listed tensors
    cands: list[tuple[tuple[Any, ...], Tensor]] = []
    for key, paths in groups.items():
        rec = first[key]
        aliases = tuple(sorted(set(paths)))
        name = paths[0]  # the first key in the saved order (a state_dict's: the name the live model uses)
        if rec.dtype not in TORCH_DTYPES:
            skipped.append(Skipped(name, f"unsupported dtype torch.{rec.dtype}"))
            continue
        dt = np.dtype(TORCH_DTYPES[rec.dtype])
        if order == "big" and dt.itemsize > 1:
            if storage_itemsize(rec.storage) != dt.itemsize:  # torch swaps a storage's words by its own element
                raise FormatError(f"{path}: tensor {name} ({rec.dtype}) lies in a big-endian archive on a storage of "
                                  f"{storage_itemsize(rec.storage)}-byte elements, whose bytes torch.load swaps by "
                                  "that width, not the tensor's; load and re-save it on a big-endian machine")
            dt = dt.newbyteorder(">")
        if rec.storage.key not in storages:
            raise FormatError(f"{path}: tensor {name} names storage {rec.storage.key!r}, which the file lacks")
        at, nbytes = storages[rec.storage.key]
        size = checked_numel(rec.shape, f"{path}: tensor {name}")  # (offset and strides were checked when read)
        if size == 0:
            skipped.append(Skipped(name, "empty"))
            continue
        span = (rec.offset + sum((n - 1) * s for n, s in zip(rec.shape, rec.stride)) + 1) * dt.itemsize
        if span > nbytes:
            raise FormatError(f"{path}: tensor {name} reaches byte {span} of storage {rec.storage.key!r}, which holds "
                              f"{nbytes} bytes (offsets outside the file's data)")
        start = at + rec.offset * dt.itemsize
        if not _contiguous(rec):
            skipped.append(Skipped(name, f"non-contiguous view (strides {rec.stride}); save a .contiguous() copy"))
            continue
        t = Tensor(path=name, aliases=aliases, dtype=dt, shape=rec.shape, size=size, storage="contiguous",
                   offset=start, nbytes=size * dt.itemsize, format=format_name(rec.dtype))
        cands.append((key, t))
    # bytes shared by different views: keep the widest, skip views inside it
    cands.sort(key=lambda kt: (kt[1].offset, -kt[1].nbytes))
    tensors: list[Tensor] = []
    for key, t in cands:
        assert t.offset is not None
        holder = next((s for s in spans if s[0] == key[0] and t.offset < s[2] and s[1] < t.offset + t.nbytes), None)
        if holder is not None:
            how = "a view inside" if t.offset + t.nbytes <= holder[2] else "overlaps"
            skipped.append(Skipped(t.path, f"{how} {holder[3]}'s bytes (shared storage; flips there reach both)"))
            continue
        spans.append((key[0], t.offset, t.offset + t.nbytes, t.path))
        tensors.append(t)
    tensors.sort(key=lambda t: _natural_key(t.path))
    tensors = label_tensors(tensors, "torch", optimizer_layers(obj, {t.path: t.shape for t in tensors}))
    skipped.sort(key=lambda s: s.path)
    return Layout(file=path, tensors=tensors, skipped=skipped, framework="torch", format=fmt)
