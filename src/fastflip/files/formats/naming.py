"""Layers and roles of tensors named by PyTorch state_dict keys (torch.save, safetensors, npz).

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A tensor's path is its key path in the saved object, ``/``-joined:
``/conv1.weight`` (a bare state_dict), ``/model/bn1.running_mean`` (a checkpoint dict),
``/optimizer/state/0/exp_avg`` (optimizer state). The last component is a
state_dict key whose dotted prefix is the layer; optimizer state gets its parameter's
layer when the optimizer's ``param_groups`` list the parameter ids in the model's
parameter order (checked against shapes, as for fastflip's torch HDF5 layout).

Examples
--------
>>> key_label("/model/layer1.0.bn1.running_var", 1)
('layer1.0.bn1', 'bn-statistic')
>>> key_label("/optimizer/state/3/exp_avg_sq", 2)
(None, 'optimizer-moment')
>>> key_label("/fc.weight", 2)
('fc', 'weight')
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...core.records import Tensor, replace
from ..roles import label_path
from .torchquant import packed_label

__all__ = ["key_label", "label_tensors", "optimizer_layers"]

_BUFFERS = {"running_mean", "running_var", "num_batches_tracked"}


def _is_optimizer_state(parts: Sequence[str]) -> bool:
    return len(parts) >= 3 and parts[-3] == "state" and parts[-2].lstrip("-").isdigit()


def key_label(path: str, ndim: int) -> tuple[str | None, str]:
    """(layer, role) of one tensor from its key path."""
    parts = [p for p in path.split("/") if p]
    if _is_optimizer_state(parts):
        return None, "step-counter" if parts[-1] == "step" else "optimizer-moment"
    packed = packed_label(parts)  # a torch.ao quantized module's (weight, bias)
    if packed is not None:
        return packed
    return label_path("/model/" + (parts[-1] if parts else ""), "torch", ndim, "f")


def optimizer_layers(obj: Any, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
    """Layer of each optimizer-state tensor path, for a checkpoint dict holding one model state_dict
    and optimizer state_dicts (``{'state': ..., 'param_groups': [...]}``); empty when unsure."""
    if not isinstance(obj, Mapping):
        return {}
    models = [k for k, v in obj.items() if isinstance(v, Mapping) and any(f"/{k}/{kk}" in shapes for kk in v)
              and "param_groups" not in v]
    opts = [k for k, v in obj.items() if isinstance(v, Mapping) and "param_groups" in v and "state" in v]
    if len(models) != 1 or not opts:
        return {}
    mk = models[0]
    params, seen = [], set()
    for k, v in obj[mk].items():  # tied parameters: one storage view under two keys, listed once by optimizers
        ident = getattr(v, "identity", id(v))
        if str(k).rpartition(".")[2] not in _BUFFERS and ident not in seen:
            seen.add(ident)
            params.append(str(k))
    out: dict[str, str] = {}
    for ok in opts:
        try:
            ids = [str(i) for g in obj[ok]["param_groups"] for i in g["params"]]
        except (TypeError, KeyError):
            continue
        if len(ids) != len(params):
            continue
        param_of = dict(zip(ids, params))
        mine: dict[str, str] = {}
        for path, shape in shapes.items():
            parts = [p for p in path.split("/") if p]
            if len(parts) != 4 or parts[0] != ok or parts[1] != "state":
                continue
            key = param_of.get(parts[2])
            if key is None or (len(shape) > 0 and shapes.get(f"/{mk}/{key}") != shape):
                mine = {}
                break
            mine[path] = key.rpartition(".")[0] or key
        out.update(mine)
    return out


def label_tensors(tensors: Sequence[Tensor], framework: str | None,
                  layers: Mapping[str, str] | None = None) -> list[Tensor]:
    """``tensors`` with ``framework``, ``layer`` and ``role`` filled from their key paths."""
    layers = layers or {}
    out = []
    for t in tensors:
        layer, role = key_label(t.path, len(t.shape))
        out.append(replace(t, framework=framework, layer=layers.get(t.path, layer), role=role))
    return out
