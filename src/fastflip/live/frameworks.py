"""Walk PyTorch and Keras models for their tensors: names, checkpoint aliases, layers and roles.

Layer: ``live`` (may import files and below; imported by frameworks and above).

Imported by :mod:`fastflip.live.adapters` only; the frameworks themselves are only
touched through the objects passed in (nothing here imports torch or keras at
module level).

PyTorch: any ``nn.Module`` (user subclasses, nested blocks, torchvision- or HF-style)
    Parameters and buffers by their module paths (``layer4.1.conv2.weight``), tied
    parameters under every name (``named_parameters(remove_duplicate=False)``);
    alias ``model/<name>`` (the path :func:`fastflip.frameworks.torch_state.save_checkpoint` writes);
    layer = the module path; roles as for checkpoints (``num_batches_tracked`` is a
    step counter, ``running_mean``/``running_var`` batch-norm statistics).
    Optimizer state (when a ``torch.optim`` optimizer is passed):
    ``optimizer/<parameter name>/<state key>`` with alias
    ``optimizer/state/<id>/<state key>`` (the checkpoint path), layer = the
    parameter's module.
Keras 3 (Sequential, functional, subclassed)
    Variables by their public ``path`` below the model (``hidden/kernel``,
    ``block/inner/kernel``); layer = the path without the variable name; the
    ``.weights.h5`` dataset path (``layers/dense/vars/0``) as an alias when Keras's
    saving walk can tell it (without it nothing else changes). Optimizer variables
    (when asked): ``optimizer/<path below the optimizer>`` (``optimizer/iteration``,
    ``optimizer/hidden_kernel_momentum``), layer = the layer of the variable they
    belong to.

It returns :class:`Found` records (name, value, aliases, layer, role); :mod:`fastflip.live.adapters` turns
them into :class:`~fastflip.live.adapters.LiveTensor` records, so nothing here refers back to the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OptionError
from ..files.roles import label_path
from . import quantized
from .storage import attribute_source, inner_source, module_source, optimizer_source

__all__ = ["Found", "is_lazy", "torch_tensors", "torch_optimizer_tensors", "keras_tensors"]


@dataclass
class Found:
    """One named tensor of a model, before conversion to a :class:`~fastflip.live.adapters.LiveTensor`."""

    name: str
    value: Any
    aliases: tuple[str, ...] = ()
    layer: str | None = None
    role: str | None = None
    order: str | None = None
    source: Any = None  # what the model holds under this name now (:mod:`fastflip.live.storage`)
    sync: Any = None  # for a copy the model computes from (torch.ao packed weights): call around every write
    why: str | None = None  # set: not injectable, listed in the targets' ``skipped`` with this reason


def _kind(dtype_name: str) -> str:
    if dtype_name.startswith(("float", "bfloat")):
        return "f"
    if dtype_name == "bool":
        return "b"
    return "u" if dtype_name.startswith("uint") else "i"


# ---------------------------------------------------------------------------------- PyTorch


def is_lazy(t: Any) -> bool:
    """Whether ``t`` is an uninitialized parameter or buffer of a lazy module (no shape and no storage yet);
    torch is imported here, for a torch tensor only."""
    from torch.nn.parameter import is_lazy as lazy

    return bool(lazy(t))


def torch_tensors(model: Any, optimizer: Any = None) -> list[Found]:
    """Parameters and buffers of a ``torch.nn.Module`` (every name of tied ones), and optimizer state."""
    out: list[Found] = []
    names: dict[int, str] = {}
    seen: set[str] = set()
    items = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for name, t in items:
        if t is None or name in seen:
            continue
        seen.add(name)
        names.setdefault(id(t), name)
        alias = f"model/{name}"
        if is_lazy(t):  # a lazy module's parameter has no shape yet
            out.append(Found(name, t, (alias,), name.rpartition(".")[0] or None, "other", alias))
            continue
        layer, role = label_path("/" + alias, "torch", t.dim(), _kind(str(t.dtype).replace("torch.", "")))
        if name.rpartition(".")[2] == "scale" and quantized.is_quantize_stub(model, layer):
            role = "scale"  # a converted QuantStub's input scale, not a weight (its zero_point is "zero" by name)
        if quantized.is_subclass(t):  # torchao: the inner tensors (qdata, scale, zero_point) are the storage
            outer = module_source(model, name)
            out += [Found(n, v, (f"model/{n}",), layer, r, f"model/{n}", inner_source(outer, n[len(name) + 1:]))
                    for n, v, r in quantized.subclass_tensors(name, t, role)]
            continue
        out.append(Found(name, t.detach(), (alias,), layer, role, alias, module_source(model, name)))
    packed, unreached = quantized.packed(model)  # torch.ao packed modules
    out += [Found(n, v, aliases, layer, r, aliases[0], source, sync)
            for n, v, layer, r, aliases, source, sync in packed]
    out += [Found(n, None, why=why) for n, why in unreached]
    if optimizer is not None and optimizer is not False:
        if type(optimizer).__module__.split(".")[0] != "torch" and not hasattr(optimizer, "param_groups"):
            raise OptionError(f"optimizer= takes a torch.optim optimizer, not a {type(optimizer).__name__}")
        out += torch_optimizer_tensors(optimizer, names)
    return out


def torch_optimizer_tensors(optimizer: Any, param_names: dict[int, str]) -> list[Found]:
    """State tensors of a ``torch.optim`` optimizer, named by parameter when ``param_names`` knows it."""
    out: list[Found] = []
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        pname = param_names.get(id(p))
        for key, v in optimizer.state.get(p, {}).items():
            if not hasattr(v, "data_ptr"):
                continue  # a Python number: nothing to flip in place
            ckpt = f"optimizer/state/{i}/{key}"
            name = f"optimizer/{pname}/{key}" if pname else ckpt
            role = "step-counter" if key == "step" else ("optimizer-moment" if v.is_floating_point() else "other")
            layer = pname.rpartition(".")[0] or None if pname else None
            out.append(Found(name, v, (ckpt,) if ckpt != name else (), layer, role, ckpt,
                             optimizer_source(optimizer, p, key)))
    return out


# ---------------------------------------------------------------------------------- Keras


def keras_tensors(model: Any, include_optimizer: bool = False) -> list[Found]:
    """Variables of a Keras 3 model or layer by their paths below it (and its optimizer's, when asked)."""
    h5 = _weights_h5_paths(model, include_optimizer)
    out: list[Found] = []
    seen: set[int] = set()
    used: set[str] = set()
    layer_of: dict[str, str | None] = {}
    for v, path, rest in _unseen(model.weights, model.name, seen):
        name = _unique(rest, used)
        layer = name.rpartition("/")[0] or None
        _, role = label_path("/x/" + name.rpartition("/")[2], None, len(v.shape), _kind(str(v.dtype)))
        if role == "other" and _kind(str(v.dtype)) == "f" and len(v.shape) >= 2:
            role = "weight"
        layer_of[path.replace("/", "_")] = layer
        out.append(Found(name, v, (h5[id(v)],) if id(v) in h5 else (), layer, role, h5.get(id(v)),
                         attribute_source(v, "_value")))
    opt = getattr(model, "optimizer", None)
    if include_optimizer and opt is not None:
        for v, path, rest in _unseen(opt.variables, opt.name, seen):
            name = _unique(f"optimizer/{rest}", used)
            if rest in ("iteration", "iterations") and len(v.shape) == 0:
                role, layer = "step-counter", None
            elif len(v.shape) == 0 or _kind(str(v.dtype)) != "f":
                role, layer = "other", None
            else:
                role = "optimizer-moment"
                hit = max((k for k in layer_of if rest.startswith(k + "_")), key=len, default=None)
                layer = layer_of[hit] if hit else None
            out.append(Found(name, v, (h5[id(v)],) if id(v) in h5 else (), layer, role, h5.get(id(v)),
                             attribute_source(v, "_value")))
    return out


def _unseen(variables: Any, owner: str, seen: set[int]) -> Any:
    """``(variable, path, path below owner)`` of the variables not seen yet (shared layers give one)."""
    prefix = f"{owner}/"
    for v in variables:
        if id(v) in seen:
            continue
        seen.add(id(v))
        path = str(v.path)
        yield v, path, path[len(prefix):] if path.startswith(prefix) else path


def _unique(name: str, used: set[str]) -> str:
    k, out = 1, name
    while out in used:
        out = f"{name}:{k}"
        k += 1
    used.add(out)
    return out


def _weights_h5_paths(model: Any, include_optimizer: bool) -> dict[int, str]:
    """``id(variable) -> .weights.h5 dataset path``, from Keras's own saving walk; {} when it cannot tell.

    The layers' paths come from Keras's private ``saving_lib._save_state`` driven with a store that
    records instead of writing (Keras has no public API for that walk); it only supplies aliases
    (checkpoint compatibility), so a Keras whose walk changed costs the aliases and nothing else. Names
    never depend on it: they are the public ``variable.path``. The optimizer's paths come from its public
    ``save_own_variables`` (:func:`_optimizer_h5_paths`).
    """
    try:
        from keras.src.saving import saving_lib
    except ImportError:  # pragma: no cover - Keras 2 / another Keras
        return {}
    found: dict[int, str] = {}

    class _Group(dict):  # type: ignore[type-arg]
        def __init__(self, path: str) -> None:
            super().__init__()
            self.path = path

        def __setitem__(self, key: str, value: Any) -> None:
            found[id(value)] = f"{self.path}/vars/{key}" if self.path else f"vars/{key}"

    class _Recorder(saving_lib.H5IOStore):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:  # noqa: D401 - no file is opened
            pass

        def __bool__(self) -> bool:
            return True

        def make(self, path: str, metadata: Any = None) -> _Group:
            return _Group(path)

    try:
        saving_lib._save_state(model, weights_store=_Recorder(), assets_store=None, inner_path="",
                               visited_saveables=set())
    except Exception:  # a Keras whose private saving walk changed: no aliases  # noqa: BLE001
        return {}
    found = {k: v for k, v in found.items() if not v.startswith("optimizer/")}
    if include_optimizer:
        found.update(_optimizer_h5_paths(model))
    return found


def _optimizer_h5_paths(model: Any) -> dict[int, str]:
    """``id(variable) -> optimizer/vars/<i>`` by the optimizer's public ``save_own_variables`` contract.

    Keras's optimizer stores copies (``variable.numpy()``), not the variables, so a walk that recognises
    variables by identity cannot place them; its store keys follow ``optimizer.variables`` in order. The
    keys are checked against the variables (count, shape, dtype) and dropped on any mismatch.
    """
    opt = getattr(model, "optimizer", None)
    if opt is None or not hasattr(opt, "save_own_variables"):
        return {}
    store: dict[str, Any] = {}
    try:
        opt.save_own_variables(store)
    except Exception:  # an optimizer that cannot save before it is built  # noqa: BLE001
        return {}
    variables = list(opt.variables)
    if list(store) != [str(i) for i in range(len(variables))]:
        return {}
    for v, value in zip(variables, store.values()):
        a = np.asarray(value)
        if tuple(a.shape) != tuple(v.shape) or np.dtype(a.dtype) != np.dtype(str(v.dtype)):
            return {}
    return {id(v): f"optimizer/vars/{i}" for i, v in enumerate(variables)}
