"""torchao tensor subclasses in ``torch.save`` files, read as ``torch.load(weights_only=True)`` reads them.

Layer: ``files`` (may import core, kernels and files; imported by live and above). Used by
:mod:`fastflip.files.formats.torchsave`, whose restricted unpickler it extends with the names a torchao
quantized weight needs; nothing here imports torch or torchao, nor runs pickled code.

``torch.save(model.state_dict(), f)`` of a model quantized by ``torchao.quantization.quantize_`` pickles each
quantized weight as::

    torch._tensor._rebuild_from_type_v2(
        torch._utils._rebuild_wrapper_subclass,
        torchao.quantization.Int8Tensor,
        (cls, dtype, size, stride, storage_offset, layout, device, requires_grad),   # an empty wrapper
        {"qdata": <tensor>, "scale": <tensor>, "zero_point": <tensor>, "block_size": [1, 64], ...})

``torch.load`` (its ``weights_only`` unpickler accepts the class because importing torchao registers it with
``torch.serialization.add_safe_globals``) makes the empty wrapper, then the class's ``__setstate__``
(torchao's ``TorchAOBaseTensor``: ``torch._utils._set_obj_state``) sets every state entry as an attribute,
verbatim. The class's ``__tensor_flatten__`` returns the names of its tensor attributes: ``tensor_data_names``
and the ``optional_tensor_data_names`` that are not None. Each inner tensor is therefore exactly the plain
tensor record saved in the state, and fastflip lists it as ``<key>.<name>`` (``0.weight.qdata``,
``0.weight.scale``) with its own dtype, shape and storage bytes, like any other tensor of the file.

Read: the classes of :data:`READ_CLASSES` (their tensor names as torchao 0.18 declares them); the non-tensor
attribute values their state holds (granularity, enums, quantization kwargs) are inert stand-ins of the
classes of :data:`ATTRIBUTE_CLASSES`. Both are names torchao registers as safe: ``torch.load(weights_only=True)``
accepts them only where torchao is installed, so fastflip reads them only there too (found with
``importlib.util.find_spec``, without importing torchao) and refuses the file otherwise, as the framework would.

Refused in one line naming the class and the fix: any other tensor subclass (torchao's int4 packings, NF4,
optimizer states, DTensor, a user's class), a state that lacks a required tensor or holds a tensor the class
does not flatten, a tensor inside a non-tensor attribute, a nested subclass, a non-strided wrapper.

Examples
--------
>>> sorted(READ_CLASSES)[0]
'torchao.quantization.Float8Tensor'
>>> READ_CLASSES["torchao.quantization.Int8Tensor"][0]
('qdata', 'scale')
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ...errors import FormatError, UnsafeInputError
from .bounds import checked_ints

__all__ = ["READ_CLASSES", "ATTRIBUTE_CLASSES", "OTHER_SUBCLASSES", "SubclassRecord", "subclass_globals",
           "subclass_global", "from_type", "inner_records"]

# class (module.qualname as pickled) -> (tensors it always flattens, tensors it flattens when not None)
READ_CLASSES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "torchao.quantization.Int8Tensor": (("qdata", "scale"),
                                        ("zero_point", "act_quant_scale", "act_quant_zero_point", "act_pre_scale")),
    "torchao.quantization.IntxUnpackedToInt8Tensor": (("qdata", "scale", "zero_point"), ()),
    "torchao.quantization.Float8Tensor": (("qdata", "scale"), ()),
}
# non-tensor attribute values of those classes' states (configs, granularities, enums), as torchao registers them
ATTRIBUTE_CLASSES = frozenset({
    "torchao.quantization.granularity.PerBlock", "torchao.quantization.granularity.PerRow",
    "torchao.quantization.granularity.PerTensor",
    "torchao.quantization.quant_primitives.MappingType", "torchao.quantization.quant_primitives.ZeroPointDomain",
    "torchao.quantization.quantize_.common.kernel_preference.KernelPreference",
    "torchao.quantization.quantize_.workflows.int8.int8_tensor.QuantizeTensorToInt8Kwargs",
    "torchao.quantization.quantize_.workflows.float8.float8_tensor.QuantizeTensorToFloat8Kwargs",
    "torchao.quantization.quantize_.workflows.float8.float8_packing_format.Float8PackingFormat",
    "torchao.quantization.quantize_.workflows.intx.intx_packing_format.IntxPackingFormat",
    "torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor."
    "IntxUnpackedToInt8TensorActivationQuantization",
    "torchao.float8.inference.Float8MMConfig",
})
# the other tensor subclasses torch and torchao register as safe: refused by name wherever the pickle names them
OTHER_SUBCLASSES = frozenset({
    "torch.distributed.tensor.DTensor", "torch.nested._internal.nested_tensor.NestedTensor",
    "torchao.float8.float8_training_tensor.Float8TrainingTensor",
    "torchao.float8.fsdp_utils.WeightWithDynamicFloat8CastTensor",
    "torchao.optim.subclass_4bit.OptimState4bit", "torchao.optim.subclass_8bit.OptimState8bit",
    "torchao.optim.subclass_fp8.OptimStateFp8",
    "torchao.prototype.quantization.gguf.gguf_quantized_tensor.GGUFQuantizedTensor",
    "torchao.prototype.mx_formats.mx_tensor.MXTensor", "torchao.prototype.mx_formats.nvfp4_tensor.NVFP4Tensor",
    "torchao.quantization.Int4PlainInt32Tensor", "torchao.quantization.Int4PreshuffledTensor",
    "torchao.quantization.Int4Tensor", "torchao.quantization.Int4TilePackedTo4dTensor",
    "torchao.quantization.IntxOpaqueTensor",
    "torchao.quantization.quantize_.workflows.float8.float8_sparse_2x4_1d_data_1d_metadata_tensor."
    "Float8Sparse2x4_1DData1DMetadataTensor",
    "torchao.quantization.quantize_.workflows.float8.float8_sparse_2x4_2d_data_2d_metadata_tensor."
    "Float8Sparse2x4_2DData2DMetadataTensor",
    "torchao.quantization.quantize_.workflows.nf4.nf4_tensor.NF4Tensor",
})
_WRAPPER = ("torch._utils", "_rebuild_wrapper_subclass")
_FIX = "inject the loaded model with fastflip.live (docs/live.md)"
_READ_SHORT = ", ".join(sorted(c.rpartition(".")[2] for c in READ_CLASSES))


@functools.lru_cache(maxsize=1)
def _torchao_installed() -> bool:
    """Whether torchao can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec("torchao") is not None
    except (ImportError, ValueError):
        return False


class _Frozen:
    """Stand-ins are immutable: pickle's BUILD on one is refused."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise FormatError(f"the pickle sets the state of a {type(self).__name__.lstrip('_')} record; the file is "
                          "damaged or crafted")


@dataclass(frozen=True)
class _SubclassType(_Frozen):
    """Stand-in for a tensor-subclass class of :data:`READ_CLASSES`."""

    name: str


@dataclass(frozen=True)
class _Named(_Frozen):
    """Stand-in for a layout (``torch.strided``) or a device (``cpu``)."""

    kind: str
    name: str


@dataclass(frozen=True)
class _Wrapper(_Frozen):
    """The empty wrapper ``_rebuild_wrapper_subclass`` makes: its class, dtype and shape, no data."""

    cls: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class SubclassRecord(_Frozen):
    """A tensor subclass as the pickle describes it: its class, outer dtype and shape, and its inner tensor
    records in ``__tensor_flatten__``'s order."""

    cls: str
    dtype: str
    shape: tuple[int, ...]
    inner: tuple[tuple[str, Any], ...]


class _AttrValue:
    """Stand-in for a non-tensor attribute value (a config, a granularity, an enum member): its constructor
    arguments and state are kept, never read; a tensor inside one is refused (see :func:`from_type`)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "_AttrValue":
        self = super().__new__(cls)
        self.__dict__["_parts"] = [args, kwargs]
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_parts"].append(state)


def _attr_type(name: str) -> type:
    return type(name.rpartition(".")[2], (_AttrValue,), {"__module__": __name__, "fullname": name})


def _named(kind: str, allowed: Callable[[Any], bool]) -> Callable[..., _Named]:
    def make(*args: Any) -> _Named:
        if not args or not allowed(args):
            raise FormatError(f"a tensor-subclass record names a malformed {kind} {str(args)[:60]}")
        return _Named(kind, ":".join(str(a) for a in args))

    return make


def subclass_globals(dtype_type: type) -> dict[tuple[str, str], Any]:
    """``find_class`` entries for torchao subclass records: the wrapper rebuild, layout and device, and the
    sub-byte dtypes torch allows (``torch.int4``: a subclass's attribute; no tensor of them is read). The wrapper
    rebuild takes ``dtype_type`` (the reader's dtype stand-in) for its dtype."""

    def rebuild_wrapper_subclass(cls: Any, dtype: Any, size: Any, stride: Any, storage_offset: Any, layout: Any,
                                 device: Any, requires_grad: Any = False) -> _Wrapper:
        if not isinstance(cls, _SubclassType) or not isinstance(dtype, dtype_type):
            raise FormatError("a tensor-subclass record without its class and dtype")
        if layout != _Named("layout", "torch.strided") or not isinstance(device, _Named):
            raise FormatError(f"a {cls.name} record with layout {layout} (fastflip reads strided subclasses)")
        shape = checked_ints(size, f"a {cls.name} record", "shape")
        checked_ints(stride, f"a {cls.name} record", "stride")
        checked_ints((storage_offset,), f"a {cls.name} record", "storage offset")
        return _Wrapper(cls.name, dtype.name, shape)

    def device_ok(args: tuple[Any, ...]) -> bool:
        return isinstance(args[0], str) and len(args) <= 2 and all(isinstance(a, int) for a in args[1:])

    out: dict[tuple[str, str], Any] = {
        _WRAPPER: rebuild_wrapper_subclass,
        ("torch.serialization", "_get_layout"): _named("layout", lambda a: len(a) == 1 and isinstance(a[0], str)),
        ("torch", "device"): _named("device", device_ok),
    }
    out.update({("torch", f"{s}int{b}"): dtype_type(f"{s}int{b}") for s in ("", "u") for b in range(1, 8)})
    return out


def subclass_global(module: str, name: str, where: str, previous: tuple[str, str] | None) -> Any:
    """The stand-in for ``module.name`` when it is a class of :data:`READ_CLASSES` or
    :data:`ATTRIBUTE_CLASSES`; None for a name that is not a tensor subclass; a one-line refusal for a tensor
    subclass fastflip does not read (one of :data:`OTHER_SUBCLASSES`, or any class named right after
    ``_rebuild_wrapper_subclass``, as torch pickles a subclass the first time).

    Raises
    ------
    UnsafeInputError
        A tensor subclass fastflip does not read, or a torchao class where torchao is not installed
        (``torch.load(weights_only=True)`` refuses it there too).
    """
    full = f"{module}.{name}"
    if full in READ_CLASSES or full in ATTRIBUTE_CLASSES:
        if not _torchao_installed():
            raise UnsafeInputError(
                f"{where}: the pickle holds {full}, which torch.load(weights_only=True) reads only where torchao "
                "is installed (importing it registers the class as safe); install torchao to inject this file")
        return _SubclassType(full) if full in READ_CLASSES else _attr_type(full)
    if previous == _WRAPPER or full in OTHER_SUBCLASSES:
        raise UnsafeInputError(
            f"{where}: the pickle holds tensor subclass {full}, which fastflip does not read from files (it reads "
            f"torchao's {_READ_SHORT}); {_FIX}")
    return None


def _holds_tensor(value: Any, is_tensor: Callable[[Any], bool]) -> bool:
    """Whether a tensor record (or a subclass) lies anywhere inside a non-tensor attribute value (each container
    visited once)."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if is_tensor(v) or isinstance(v, (SubclassRecord, _Wrapper)):
            return True
        if not isinstance(v, (_AttrValue, dict, list, tuple, set, frozenset)) or id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, _AttrValue):
            stack.append(v.__dict__["_parts"])
        elif isinstance(v, dict):
            stack.extend((*v.keys(), *v.values()))
        else:
            stack.extend(v)
    return False


def _state_items(state: Any, cls: str) -> list[tuple[str, Any]]:
    """The attributes ``torch._utils._set_obj_state`` sets from ``state`` (a dict, or a (dict, slots) pair)."""
    parts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
    items: list[tuple[str, Any]] = []
    for part in parts:
        if part is None:
            continue
        if not isinstance(part, dict) or not all(isinstance(k, str) for k in part):
            raise FormatError(f"a {cls} record whose state is not a dictionary of attribute names")
        items.extend(part.items())
    return items


def from_type(ret: Any, new_type: Any, state: Any, is_tensor: Callable[[Any], bool]) -> Any:
    """``_rebuild_from_type_v2``'s result: a :class:`SubclassRecord` when ``ret`` is a wrapper of a class of
    :data:`READ_CLASSES` (its inner tensors: the state's tensor records), ``ret`` itself otherwise.

    Raises
    ------
    FormatError
        The state lacks a tensor the class always flattens, holds a tensor the class does not flatten, a
        quantized, nested or hidden tensor, or names another class than the wrapper.
    """
    if not isinstance(ret, _Wrapper):
        return ret
    if new_type != _SubclassType(ret.cls):
        raise FormatError(f"a {ret.cls} wrapper rebuilt as another type; the file is damaged or crafted")
    required, optional = READ_CLASSES[ret.cls]
    found: dict[str, Any] = {}
    for key, value in _state_items(state, ret.cls):
        if is_tensor(value):
            if key not in required and key not in optional:
                raise FormatError(f"a {ret.cls} record holds tensor {key!r}, which the class does not flatten; "
                                  f"{_FIX}")
            if getattr(value, "parts", ()):
                raise FormatError(f"a {ret.cls} record holds a quantized tensor {key!r}; {_FIX}")
            found[key] = value
        elif key in required or (key in optional and value is not None) or _holds_tensor(value, is_tensor):
            raise FormatError(f"a {ret.cls} record holds {type(value).__name__.lstrip('_')} in attribute {key!r} "
                              f"where fastflip reads a plain tensor or none; {_FIX}")
        else:
            found.pop(key, None)  # a later entry replaces an earlier one, as setattr does
    missing = [n for n in required if n not in found]
    if missing:
        raise FormatError(f"a {ret.cls} record lacks its tensor {missing[0]!r}; the file is damaged or crafted")
    inner = tuple((n, found[n]) for n in (*required, *optional) if n in found)
    return SubclassRecord(ret.cls, ret.dtype, ret.shape, inner)


def inner_records(found: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``found`` ([(key path, record)]) with each :class:`SubclassRecord` replaced by its inner tensors, named
    ``<key path>.<name>`` (``/0.weight.qdata``). An inner tensor's name that is also another tensor's key path is
    refused where the records become a layout (:func:`.torchsave.layout_from_records`).
    """
    out: list[tuple[str, Any]] = []
    for path, rec in found:
        if isinstance(rec, SubclassRecord):
            out.extend(((path + "." + n) if path != "/" else "/" + n, t) for n, t in rec.inner)
        else:
            out.append((path, rec))
    return out
