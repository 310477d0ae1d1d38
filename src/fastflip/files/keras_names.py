"""Which datasets of a legacy Keras HDF5 file Keras's loaders read: those its ``layer_names`` and
``weight_names`` attributes name.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A legacy Keras weights group (``model_weights`` of ``model.save('m.h5')``, or the root of tf.keras
``save_weights('w.h5')``) lists its layers in ``layer_names``, and each layer group lists its weights in
``weight_names`` (paths relative to the layer group). ``load_weights`` and ``load_model`` read exactly those
datasets, in that order, plus those ``top_level_model_weights`` names; any other dataset in the group is never
read, so a flip there would be logged but never reach the model. :func:`unread_paths` names those datasets;
:func:`fastflip.files.roles.annotate` reports them as skipped. Both attributes are read as Keras reads them: the
attribute itself, or its chunks ``<name>0``, ``<name>1``, ... (written when the list outgrows an object header).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core.records import Tensor

__all__ = ["UNREAD_REASON", "unread_paths"]

UNREAD_REASON = "named by no layer's weight_names (layer_names): Keras's loaders never read it"
_TOP_LEVEL = "top_level_model_weights"


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def names_attribute(obj: Any, name: str) -> list[str]:
    """A Keras name-list attribute as Keras reads it: ``name``, or its chunks ``name0``, ``name1``, ...

    >>> class G:
    ...     attrs = {"weight_names0": [b"d/kernel"], "weight_names1": [b"d/bias"]}
    >>> names_attribute(G(), "weight_names")
    ['d/kernel', 'd/bias']
    """
    attrs = getattr(obj, "attrs", None)
    if attrs is None:
        return []
    if name in attrs:
        return [_text(v) for v in attrs[name]]
    out: list[str] = []
    k = 0
    while f"{name}{k}" in attrs:
        out += [_text(v) for v in attrs[f"{name}{k}"]]
        k += 1
    return out


def _group(obj: Any, name: str) -> Any:
    try:
        g = obj.get(name)
    except (KeyError, ValueError, TypeError, OSError, RuntimeError):
        return None
    return g if hasattr(g, "keys") else None


def unread_paths(tensors: Sequence[Tensor], h5file: Any) -> set[str]:
    """Paths of the tensors in a legacy Keras weights group that no ``weight_names`` names (empty when the file
    has no such group, or when its attributes name no dataset: then nothing is judged unread)."""
    top = _group(h5file, "model_weights")
    if top is None or not names_attribute(top, "layer_names"):
        top = h5file if names_attribute(h5file, "layer_names") else None
    if top is None:
        return set()
    read = set()
    for layer in names_attribute(top, "layer_names") + [_TOP_LEVEL]:
        g = _group(top, layer)
        for w in names_attribute(g, "weight_names") if g is not None else []:
            try:
                ds = g.get(w)
            except (KeyError, ValueError, TypeError, OSError, RuntimeError):
                continue
            if ds is not None and hasattr(ds, "dtype"):
                read.add(ds.name)  # the path it was reached by: one of the tensor's aliases
    if not read:
        return set()
    prefix = top.name.rstrip("/") + "/"
    return {t.path for t in tensors
            if all(a.startswith(prefix) for a in t.aliases) and read.isdisjoint(t.aliases)}
