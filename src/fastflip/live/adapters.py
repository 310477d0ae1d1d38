"""Adapters: turn arrays, framework tensors and whole models into named :class:`LiveTensor` records.

Layer: ``live`` (may import files and below; imported by frameworks and above).

Names are the framework's own (see :mod:`fastflip.live.frameworks`); each tensor
also carries its checkpoint path as an alias, so that a plan sampled from a
checkpoint applies to the loaded model as is:

- any PyTorch ``nn.Module`` (subclasses, nested blocks): its parameter and buffer
  names (``layer4.1.conv2.weight``; alias ``model/layer4.1.conv2.weight``, the path
  :func:`fastflip.frameworks.torch_state.save_checkpoint` writes); optimizer state when asked;
- any Keras 3 model or layer: the variable paths below the model
  (``hidden/kernel``; alias: the ``.weights.h5`` dataset path when Keras can tell);
  optimizer variables when asked;
- a mapping: its keys, as given.

Storage reached under several names (tied weights) is one tensor with aliases; a
tensor lying inside another one's memory (a view) is kept for addressing but not
sampled (``view_of``), so every physical element is one site.

Supported tensors: NumPy arrays (``np.memmap`` included), PyTorch tensors (CPU:
raw address; CUDA: device address), CuPy arrays (device address) and TensorFlow /
Keras variables (updated sparsely through ``tf.gather`` / ``scatter_nd_update``:
correct and proportional to the number of sites, but not zero-copy).

Why TensorFlow variables are not written through a raw address: a variable's
buffer can be reached (DLPack of its value), but TensorFlow replaces the buffer
(copy-on-write) whenever it is updated while another tensor still refers to it, and
holding that reference to keep the address valid is exactly what would trigger the
copy: the next training step would leave fastflip writing to a stale buffer with no
error. Gather/scatter through the variable is always exact. (A bool variable holds
0/1 only: bool words other than 0 and 1 are stored as True.)

Examples
--------
>>> import numpy as np
>>> [t.name for t in collect({"a": np.zeros(3, np.float32), "b": np.ones((2, 2), ">i2")})[0]]
['a', 'b']
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..core.dtypes import is_supported_dtype
from ..core.floatformats import FORMATS, format_name
from ..core.plan import TensorRef
from ..core.records import Tensor
from ..errors import OptionError
from ..files.roles import label_names
from . import frameworks
from .storage import mapping_source

__all__ = ["LiveTensor", "collect", "label_mapping", "merge_shared", "TORCH_DTYPES"]

# torch dtype name -> numpy dtype string (native order); bfloat16 and float8 are held as unsigned
# words with a format (see fastflip.files.formats); complex has no word type
TORCH_DTYPES = {
    "float16": "f2", "float32": "f4", "float64": "f8",
    "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8",
    "uint8": "u1", "uint16": "u2", "uint32": "u4", "uint64": "u8", "bool": "?",
    "bfloat16": "u2", "float8_e4m3fn": "u1", "float8_e5m2": "u1",
}
_SUPPORTED = "float16/32/64, bfloat16, float8_e4m3fn/e5m2, int/uint 8-64 and bool"


@dataclass
class LiveTensor:
    """One live tensor: where its words are and how to reach them.

    ``kind`` is ``'cpu'`` (raw host address), ``'cuda'`` (raw device address on
    ``device``) or ``'tf'`` (a TensorFlow variable, updated by gather/scatter).
    ``strides`` are in bytes; ``obj`` keeps the tensor alive.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    kind: str
    ptr: int = 0
    strides: tuple[int, ...] = ()
    writable: bool = True
    device: int = -1
    obj: Any = field(default=None, repr=False)
    aliases: tuple[str, ...] = ()
    layer: str | None = None
    role: str | None = None
    format: str | None = None
    order: str | None = None  # sort key (the checkpoint path when known)
    view_of: str | None = None  # name of the tensor whose memory holds this one
    # what the model holds under this name now (:mod:`fastflip.live.storage`): re-checked before each write
    source: Any = field(default=None, repr=False, compare=False)
    # for words the model copies before computing (a torch.ao packed weight): brings that copy up to date
    sync: Any = field(default=None, repr=False, compare=False)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def contiguous(self) -> bool:
        expect, ok = self.dtype.itemsize, True
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n > 1 and s != expect:
                ok = False
            expect *= n
        return ok

    @property
    def extent(self) -> int:
        """Bytes from ``ptr`` to the end of the last element (non-negative strides)."""
        if self.size == 0:
            return 0
        return sum((int(n) - 1) * int(s) for n, s in zip(self.shape, self.strides)) + self.dtype.itemsize

    def byte_offsets(self, index: np.ndarray) -> np.ndarray:
        """Byte offsets (from ``ptr``) of the flat C-order element indices ``index``."""
        index = np.asarray(index, dtype=np.int64)
        if self.contiguous:
            return index * self.dtype.itemsize
        if not self.shape:
            return np.zeros(len(index), dtype=np.int64)
        coords = np.unravel_index(index, self.shape)
        return sum(c.astype(np.int64) * s for c, s in zip(coords, self.strides)).astype(np.int64)

    def record(self) -> Tensor:
        """This tensor as the one tensor record (:class:`fastflip.core.records.Tensor`): storage ``device``
        for CUDA tensors, ``memory`` otherwise; every name and alias as ``/<name>`` (what selections match).

        >>> t = LiveTensor("fc.weight", np.dtype("<f4"), (2, 3), "cpu", aliases=("model/fc.weight",), role="weight")
        >>> r = t.record()
        >>> r.name, r.aliases, r.storage, r.nbytes, r.role
        ('fc.weight', ('/fc.weight', '/model/fc.weight'), 'memory', 24, 'weight')
        """
        names = tuple(dict.fromkeys("/" + n.lstrip("/") for n in (self.name, *self.aliases)))
        return Tensor(self.name, names, self.dtype, self.shape, self.size, "device" if self.kind == "cuda" else "memory",
                      nbytes=self.size * self.dtype.itemsize, framework="live", layer=self.layer, role=self.role,
                      format=self.format)

    def ref(self) -> TensorRef:
        """The part of this tensor a plan and a log need (:class:`fastflip.core.plan.TensorRef`)."""
        return TensorRef(self.name, self.dtype.str, self.shape, self.format)


def _module_of(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def _check_overlap(name: str, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> None:
    """Refuse a tensor whose elements share memory (an ``expand``/``broadcast_to`` view, stride 0).

    One word reached as several elements would be flipped once per element (two flips of a bit cancel) and
    could not be reverted site by site. Dimensions sorted by stride must each step past everything inside
    them (the usual sufficient test; every layout a framework makes by itself passes it).

    >>> _check_overlap("w", (4, 3), (12, 4), 4)
    >>> _check_overlap("pos", (1, 8), (0, 8), 8)  # stride 0 on a dimension of size 1: no overlap
    >>> _check_overlap("e", (4, 3), (0, 4), 4)
    Traceback (most recent call last):
    ...
    fastflip.errors.OptionError: tensor 'e' has elements that share memory (strides (0, 4) for shape (4, 3), an expanded or broadcast view): inject the tensor it expands, or store a copy (.contiguous())
    """
    reach = itemsize
    for n, s in sorted(((n, abs(s)) for n, s in zip(shape, strides) if n > 1), key=lambda d: d[1]):
        if s < reach:
            raise OptionError(f"tensor {name!r} has elements that share memory (strides {tuple(strides)} for shape "
                              f"{tuple(shape)}, an expanded or broadcast view): inject the tensor it expands, or "
                              "store a copy (.contiguous())")
        reach = s * (n - 1) + reach
    return None


def _numpy(name: str, arr: np.ndarray) -> LiveTensor:
    _check_dtype(name, arr.dtype)
    _check_overlap(name, arr.shape, arr.strides, arr.itemsize)
    return LiveTensor(name, arr.dtype, tuple(arr.shape), "cpu", int(arr.ctypes.data), tuple(arr.strides),
                      bool(arr.flags.writeable), obj=arr)


def _check_dtype(name: str, dtype: np.dtype) -> None:
    if not is_supported_dtype(dtype):
        raise OptionError(f"tensor {name!r} has dtype {dtype}: only {_SUPPORTED} can be injected")


def _torch(name: str, t: Any) -> LiveTensor:
    key = str(t.dtype).replace("torch.", "")
    if key not in TORCH_DTYPES:
        raise OptionError(f"tensor {name!r} has dtype {t.dtype}: only {_SUPPORTED} can be injected")
    _check_torch_storage(name, t)
    dtype = np.dtype(TORCH_DTYPES[key])
    fmt = format_name(key)
    strides = tuple(int(s) * dtype.itemsize for s in t.stride())
    _check_overlap(name, tuple(t.shape), strides, dtype.itemsize)
    if t.device.type == "cpu":
        return LiveTensor(name, dtype, tuple(t.shape), "cpu", int(t.data_ptr()), strides, True, obj=t, format=fmt)
    if t.device.type == "cuda":
        return LiveTensor(name, dtype, tuple(t.shape), "cuda", int(t.data_ptr()), strides, True, int(t.device.index),
                          obj=t, format=fmt)
    raise OptionError(f"tensor {name!r} is on device {t.device}: only CPU and CUDA tensors are supported")


def _check_torch_storage(name: str, t: Any) -> None:
    """Refuse a torch tensor whose words are not plain memory read as they are stored: an uninitialized
    parameter of a lazy module, a sparse (or other non-strided) layout, a lazily negated view."""
    if frameworks.is_lazy(t):  # torch.nn.parameter.UninitializedParameter / Buffer
        raise OptionError(f"tensor {name!r} is an uninitialized parameter of a lazy module: run one forward first "
                          "(it gives the parameter its shape), then build the targets")
    layout = getattr(t, "layout", None)  # (read defensively: tensor-like objects may lack these)
    if layout is not None and str(layout) != "torch.strided":
        raise OptionError(f"tensor {name!r} has layout {layout}: only dense tensors can be injected (use "
                          ".to_dense() for a sparse one)")
    if getattr(t, "is_neg", lambda: False)():
        raise OptionError(f"tensor {name!r} is a lazily negated view (its memory holds the negated values): "
                          "store .resolve_neg() instead")


def _cupy(name: str, a: Any) -> LiveTensor:
    dtype = np.dtype(a.dtype)
    _check_dtype(name, dtype)
    _check_overlap(name, a.shape, a.strides, dtype.itemsize)
    return LiveTensor(name, dtype, tuple(a.shape), "cuda", int(a.data.ptr), tuple(a.strides), True, int(a.device.id), obj=a)


def _tf(name: str, v: Any) -> LiveTensor:
    var = getattr(v, "_value", v)  # a Keras 3 Variable wraps the backend's variable
    if _module_of(var) == "torch":
        return _torch(name, var)
    if not hasattr(var, "scatter_nd_update"):
        raise OptionError(f"tensor {name!r} ({type(v).__name__}) is a TensorFlow value, not a variable: it cannot be changed in place")
    fmt = format_name(var.dtype.name)
    dtype = FORMATS[fmt].storage if fmt else np.dtype(var.dtype.as_numpy_dtype)
    _check_dtype(name, dtype)
    return LiveTensor(name, dtype, tuple(int(s) for s in var.shape), "tf", writable=True, obj=var, format=fmt)


def tensor(name: str, t: Any) -> LiveTensor:
    """The :class:`LiveTensor` of one array / tensor / variable."""
    if isinstance(t, np.ndarray):
        return _numpy(name, t)
    mod = _module_of(t)
    if mod == "torch":
        return _torch(name, t)
    if mod == "cupy":
        return _cupy(name, t)
    if mod in ("keras", "tensorflow", "tf_keras"):
        return _tf(name, t)
    raise OptionError(f"tensor {name!r}: unsupported type {type(t).__module__}.{type(t).__name__} "
                      "(use numpy, torch, cupy or tensorflow/keras variables)")


def framework_of(obj: Any) -> str | None:
    """``'torch'``, ``'torch-optim'``, ``'keras'`` or None: what kind of model ``obj`` is.

    Looks through the class hierarchy, so user subclasses defined anywhere count
    (``class Net(nn.Module)`` in ``__main__``). Frameworks are not imported here: an
    object can only be a torch module when torch is already loaded.
    """
    mods = {c.__module__.split(".")[0] for c in type(obj).__mro__}
    if "torch" in mods and "torch" in sys.modules:
        torch = sys.modules["torch"]
        if isinstance(obj, torch.nn.Module):
            return "torch"
        if isinstance(obj, torch.optim.Optimizer):
            return "torch-optim"
    if mods & {"keras", "tf_keras"} and hasattr(obj, "weights"):
        return "keras"
    return None


def collect(obj: Any, *, include_optimizer: bool = False,
            optimizer: Any = None) -> tuple[list[LiveTensor], dict[str, str]]:
    """Named live tensors of a mapping, a PyTorch module / optimizer or a Keras model/layer; and the names left
    out, each with why.

    In a mapping every tensor must be supported; in a model, tensors that cannot be
    injected (complex, on a ``meta`` device, empty; bfloat16 and float8 are supported) are left out and named in the
    second list. ``optimizer`` (a ``torch.optim`` optimizer, or ``True`` for a Keras
    model's own) / ``include_optimizer`` add optimizer state.
    """
    fw = framework_of(obj)
    if isinstance(obj, Mapping):
        out = [tensor(str(name), t) for name, t in obj.items()]
        for t, name in zip(out, obj):
            t.source = mapping_source(obj, name)
        label_mapping(out)
        return merge_shared(out), {}
    if fw == "torch":
        pairs = frameworks.torch_tensors(obj, optimizer)
    elif fw == "torch-optim":
        pairs = frameworks.torch_optimizer_tensors(obj, {})
    elif fw == "keras":
        pairs = frameworks.keras_tensors(obj, include_optimizer or optimizer is not None and optimizer is not False)
    else:
        raise OptionError(f"cannot find tensors in a {type(obj).__name__}: pass a torch.nn.Module, a Keras model "
                          "or a mapping name -> tensor")
    out, skipped, refused = [], {}, []
    for p in pairs:
        if p.why is not None:  # known to the walk and not injectable (a torch.ao engine's packed weights)
            skipped[p.name] = p.why
            refused.append(p.why)
            continue
        try:
            t = tensor(p.name, p.value)
        except OptionError as exc:
            skipped[p.name] = str(exc)
            refused.append(str(exc))
            continue
        if t.size == 0:  # nothing to flip
            skipped[p.name] = f"tensor {p.name!r} has no elements"
            continue
        t.aliases, t.layer, t.role, t.order, t.source, t.sync = p.aliases, p.layer, p.role, p.order, p.source, p.sync
        out.append(t)
    if refused and out:  # part of the model cannot be injected: say so (nothing is left out silently)
        warnings.warn(f"fastflip: {len(refused)} tensor(s) left out: {refused[0]}"
                      + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""), stacklevel=3)
    return merge_shared(out), skipped


# ---------------------------------------------------------------------------------- mappings and sharing


def label_mapping(tensors: list[LiveTensor]) -> None:
    """Fill layer and role of a mapping's tensors from their names (checkpoint-style or module paths).

    >>> ts = [tensor("conv1.weight", np.zeros((2, 2), np.float32))]
    >>> label_mapping(ts); (ts[0].layer, ts[0].role)
    ('conv1', 'weight')
    """
    labels = label_names([t.name for t in tensors], [len(t.shape) for t in tensors],
                         [t.dtype.kind if t.format is None else "f" for t in tensors])
    for t, (layer, role) in zip(tensors, labels):
        t.layer, t.role = layer, role


def merge_shared(tensors: list[LiveTensor]) -> list[LiveTensor]:
    """One tensor per physical storage: names reaching the same memory become aliases; views are marked.

    Tensors with the same address, dtype, shape and strides are one tensor (the
    first name stays, the others join its aliases). A tensor whose bytes lie inside
    a contiguous tensor is a view of it (also with another word width: a buffer
    ``w.view(torch.int16)`` of a float32 parameter): kept for plans that name it,
    marked ``view_of``, left out of sampling.
    """
    out: list[LiveTensor] = []
    by_key: dict[tuple[Any, ...], LiveTensor] = {}
    for t in tensors:
        if t.kind == "tf":
            key: tuple[Any, ...] = ("tf", id(t.obj))
        else:
            key = (t.kind, t.device, t.ptr, t.dtype.str, t.format, t.shape, t.strides)
        first = by_key.get(key)
        if first is None:
            by_key[key] = t
            out.append(t)
            continue
        extra = tuple(a for a in (t.name, *t.aliases) if a != first.name and a not in first.aliases)
        first.aliases = first.aliases + extra
    mem = sorted((t for t in out if t.kind != "tf" and t.size), key=lambda t: (t.kind, t.device, t.ptr, -t.extent))
    base: LiveTensor | None = None
    for t in mem:
        if (base is not None and base.kind == t.kind and base.device == t.device
                and t.ptr + t.extent <= base.ptr + base.extent and base.contiguous
                and min(t.strides, default=t.dtype.itemsize) >= 0):
            t.view_of = base.name
            continue
        if base is None or t.ptr + t.extent > base.ptr + base.extent or base.kind != t.kind or base.device != t.device:
            base = t
    return out
