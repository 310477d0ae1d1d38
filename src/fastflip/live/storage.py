"""Where a live tensor's words are now: the storage facts a target was built on, re-checked per injection.

Layer: ``live`` (may import files and below; imported by :mod:`fastflip.live.targets` and adapters).

:class:`~fastflip.live.targets.Targets` hold raw addresses. A model can move a tensor's words
elsewhere without fastflip knowing: ``m.weight.data = torch.zeros(...)``, ``load_state_dict(assign=True)``,
``model.half()`` / ``model.to(...)``, a new array put in a mapping under the same name. Writing to the old
address then changes memory the model no longer reads (or memory the allocator already gave to another
tensor) while the log records a normal old -> new word. So every target keeps

- a *source*: a function returning the object the model holds under the target's name **now** (the
  parameter or buffer looked up again through the module tree, the mapping's current value, the
  optimizer's current state entry), and
- a *key*: the facts of the storage the target addresses (:func:`storage_key`: data pointer, dtype,
  shape, strides and, for torch, the storage's byte size; for NumPy the array object itself, which
  cannot move its data while a target holds it),

and every read, write or injection first compares ``storage_key(source())`` with the key of each tensor
it touches (a handful of attribute reads per touched torch tensor; the NumPy arrays of a mapping in one
C-level identity pass, :func:`same_objects`). A difference is refused in one line
(:class:`~fastflip.errors.StaleTargetError`): rebuild the targets.

torch's ``_version`` counter is not part of the key: it counts in-place writes (every optimizer step
moves it, and those keep the targets valid) and does not move on ``.data =`` assignment, which is the
replacement that matters. TensorFlow variables are written through the variable object
(gather/scatter), never a raw address, and have no key.

Examples
--------
>>> import numpy as np
>>> d = {"w": np.zeros(3, np.float32)}
>>> src = mapping_source(d, "w")
>>> key = storage_key(d["w"])
>>> storage_key(src()) == key
True
>>> d["w"] = np.zeros(3, np.float32)
>>> storage_key(src()) == key
False
"""

from __future__ import annotations

from operator import is_, itemgetter
from typing import Any, Callable, Mapping

import numpy as np

__all__ = ["storage_key", "key_function", "mapping_source", "module_source", "optimizer_source", "attribute_source",
           "inner_source", "same_objects", "MappingSource"]

Source = Callable[[], Any]


def _torch_key(x: Any) -> tuple[Any, ...]:
    return (x.data_ptr(), x.dtype, x.shape, x.stride(), x.untyped_storage().nbytes())


def _numpy_key(x: Any) -> tuple[Any, ...]:
    # the object itself (its id: a target holds it, so the id cannot be reused): an ndarray keeps its buffer
    # while another reference to it exists (ndarray.resize refuses), and a new shape or dtype set on the same
    # object still lies inside that buffer
    return (id(x),)


def _cupy_key(x: Any) -> tuple[Any, ...]:
    return (x.data.ptr, x.shape, x.strides, x.dtype)


def key_function(x: Any) -> Callable[[Any], tuple[Any, ...]]:
    """The :func:`storage_key` variant for objects of ``x``'s kind (chosen once per target)."""
    if isinstance(x, np.ndarray):
        return _numpy_key
    mod = type(x).__module__.split(".")[0]
    if mod == "torch" or hasattr(x, "untyped_storage"):
        return _torch_key
    if mod == "cupy":
        return _cupy_key
    return _numpy_key  # any other object: its identity


def storage_key(x: Any) -> tuple[Any, ...] | None:
    """The facts of ``x``'s storage a raw address depends on; None when ``x`` is None (the name is gone).

    >>> a = np.zeros((2, 3), "<f4")
    >>> storage_key(a) == storage_key(a), storage_key(a) == storage_key(a.copy())
    (True, False)
    """
    return None if x is None else key_function(x)(x)


class MappingSource:
    """The value ``mapping`` holds under ``key`` now (None once the key is gone), as a callable."""

    __slots__ = ("mapping", "key")

    def __init__(self, mapping: Mapping[Any, Any], key: Any) -> None:
        self.mapping, self.key = mapping, key

    def __call__(self) -> Any:
        return self.mapping.get(self.key)


def mapping_source(mapping: Mapping[Any, Any], key: Any) -> Source:
    """The value ``mapping`` holds under ``key`` now (None once the key is gone)."""
    return MappingSource(mapping, key)


def same_objects(mapping: Mapping[Any, Any], keys: list[Any], objs: list[Any]) -> Callable[[], bool]:
    """A check that ``mapping`` still holds exactly ``objs[i]`` under ``keys[i]`` (one C-level pass: the
    NumPy arrays of a mapping, compared as objects).

    >>> d = {"a": np.zeros(1), "b": np.zeros(1)}
    >>> ok = same_objects(d, ["a", "b"], [d["a"], d["b"]])
    >>> ok(), d.update(b=np.zeros(1)), ok()
    (True, None, False)
    """
    if len(keys) == 1:
        key, obj = keys[0], objs[0]
        return lambda: mapping.get(key) is obj
    get, want = itemgetter(*keys), tuple(objs)

    def check() -> bool:
        try:
            return all(map(is_, get(mapping), want))
        except (KeyError, TypeError):
            return False

    return check


def module_source(root: Any, name: str) -> Source:
    """The parameter or buffer ``name`` (``"layer1.0.conv1.weight"``) of the torch module ``root`` now,
    looked up from ``root`` each time (a replaced submodule or parameter is seen); None when it is gone."""
    *path, leaf = name.split(".")

    def source() -> Any:
        mod = root
        for part in path:
            mod = mod._modules.get(part)
            if mod is None:
                return None
        found = mod._parameters.get(leaf)
        if found is None:
            found = mod._buffers.get(leaf)
        return found

    return source


def inner_source(outer: Source, attrs: str) -> Source:
    """The inner tensor at dotted ``attrs`` (``"qdata"``) of what ``outer`` returns now: a tensor subclass's
    storage (torchao's ``Int8Tensor.qdata``); None when the outer tensor or the attribute is gone."""
    parts = attrs.split(".")

    def source() -> Any:
        obj = outer()
        for part in parts:
            obj = getattr(obj, part, None) if obj is not None else None
        return obj

    return source


def optimizer_source(optimizer: Any, param: Any, key: str) -> Source:
    """The state entry ``key`` of ``param`` in a ``torch.optim`` optimizer now (None once it is gone)."""
    return lambda: optimizer.state.get(param, {}).get(key)


def attribute_source(obj: Any, attr: str) -> Source:
    """``getattr(obj, attr, obj)`` now: the backend tensor a Keras variable wraps (``_value``)."""
    return lambda: getattr(obj, attr, obj)
