"""Recognise deep-learning framework layouts and label each tensor's framework, layer and role.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Roles: ``weight``, ``bias``, ``bn-statistic`` (batch-norm running mean/variance),
``optimizer-moment`` (Adam/SGD state), ``step-counter`` (iteration counters,
``num_batches_tracked``, Chainer ``N``/``t``), ``scale`` and ``zero`` (a quantized weight's
scales and zero points) and ``other``.

Quantized weights: integer weight words are ``weight`` whatever their dtype (GPTQ/AWQ ``qweight``,
compressed-tensors ``weight_packed``, torchao ``<param>.qdata``); ``scales``, ``weight_scale``,
``weight_scale_inv``, ``input_scale`` and a torch key ``<param>.scale`` below a weight or of rank 0 are
``scale`` (in a Keras 3 int8-quantized layer, the vector after its integer kernel and bias); ``qzeros``, ``zero_point(s)``, ``weight_zero_point`` are ``zero``. For ``<module>.weight.qdata``
(a tensor subclass's inner tensor) the layer is the module, as for ``<module>.weight``.

Recognised layouts (the ``framework`` label):

``keras3``
    Keras 3 ``.weights.h5``: ``layers/<class>/vars/<i>`` (the ``vars`` group's ``name``
    attribute is the layer name) and ``optimizer/vars/<i>``; or a file whose datasets are all
    ``vars/<key>`` entries (a subclassed model's ``<attr>/<attr>/vars/<i>``, its own ``vars/<i>``).
``keras-legacy``
    Keras/tf.keras HDF5 from ``model.save('x.h5')`` (``model_weights/<layer>/.../kernel:0``,
    ``optimizer_weights/...``) or legacy ``save_weights`` (same without the prefix;
    root attributes ``layer_names``/``weight_names``).
``torch``
    PyTorch state_dict written by fastflip (root attribute ``fastflip_layout =
    "torch-state-dict/1"``): ``/model/<key>``, ``/optimizer/state/<id>/<name>``.
``chainer``
    ``chainer.serializers.save_hdf5`` of a link (``/predictor/conv1/W``) or trainer
    snapshot (``/updater/model:main/...``, ``/updater/optimizer:main/...``).

Optimizer state gets its parameter's layer where the file says which parameter it
belongs to: legacy Keras (slot names), torch (parameter ids checked against shapes),
Chainer (state stored under the parameter's path). Keras 3 ``optimizer/vars/<i>``
carry no such link and get ``layer=None``.

Unrecognised files get ``framework=None``, the parent group as layer and a role guessed
from the dataset name (``weight``/``kernel``/``W``, ``bias``/``b``, ...) or ``other``.

Examples
--------
>>> label_path("/model/bn1.running_mean", "torch", 1, "f")
('bn1', 'bn-statistic')
>>> label_path("/predictor/conv1/W", "chainer", 4, "f")
('conv1', 'weight')
>>> label_path("/model_weights/dense/dense/bias:0", "keras-legacy", 1, "f")
('dense', 'bias')
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence, TypeVar

from ..core.records import Layout, Skipped, Tensor, replace
from .h5open import open_h5
from .keras_names import UNREAD_REASON, unread_paths

__all__ = ["ROLES", "ROLE_ALIASES", "FRAMEWORKS", "annotate", "detect_framework", "file_framework", "keras3_written",
           "label_path", "label_names", "alias_layers"]

ROLES = ("weight", "bias", "bn-statistic", "optimizer-moment", "step-counter", "scale", "zero", "other")
# short names accepted by selections (``--role optimizer``)
ROLE_ALIASES = {"optimizer": "optimizer-moment", "moment": "optimizer-moment", "bn": "bn-statistic",
                "batchnorm": "bn-statistic", "counter": "step-counter", "step": "step-counter",
                "weights": "weight", "biases": "bias", "scales": "scale", "zeros": "zero",
                "zero-point": "zero", "zero_point": "zero"}
FRAMEWORKS = ("keras3", "keras-legacy", "torch", "chainer")

_KERAS3_VAR = re.compile(r"^(?P<group>(?:/.*)?)/vars/(?P<i>\d+)$")
_WEIGHT_NAMES = {"kernel", "weight", "weights", "w", "gamma", "embeddings", "alpha", "recurrent_kernel",
                 "depthwise_kernel", "pointwise_kernel", "scale"}
_BIAS_NAMES = {"bias", "beta", "b", "offset"}
_BN_NAMES = {"moving_mean", "moving_variance", "running_mean", "running_var", "avg_mean", "avg_var"}
_CHAINER_PARAMS = {"W", "b", "gamma", "beta", "avg_mean", "avg_var"}
_STEP_NAMES = {"iter", "iteration", "iterations", "step", "num_batches_tracked", "n", "t", "epoch",
               "global_step"}

# quantized checkpoints (GPTQ/AWQ, compressed-tensors, FP8, torchao inner tensors): roles by name, any dtype
_QUANT_ROLES = {"qweight": "weight", "weight_packed": "weight", "qdata": "weight",
                "scales": "scale", "weight_scale": "scale", "weight_scale_inv": "scale", "input_scale": "scale",
                "qzeros": "zero", "zero_point": "zero", "zero_points": "zero", "weight_zero_point": "zero",
                "input_zero_point": "zero", "act_quant_scale": "scale", "act_pre_scale": "scale",
                "act_quant_zero_point": "zero"}
_QUANT_INNER = {"qdata", "scale", "zero_point", "act_quant_scale", "act_quant_zero_point", "act_pre_scale"}

T = TypeVar("T", Layout, list)


def _leaf(path: str) -> str:
    """Last path component without a TF ``:0`` suffix."""
    return re.sub(r":\d+$", "", path.rsplit("/", 1)[-1])


def _strip_counter(name: str) -> str:
    """Keras unique-name suffix removed: 'dense_1' → 'dense'."""
    return re.sub(r"_\d+$", "", name)


def _attr_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def keras3_written(paths: Iterable[str]) -> bool:
    """True when every dataset path is a ``vars/<key>`` entry, at any depth, root included (``/vars/0``,
    ``/l/inner/vars/1``): the only datasets Keras 3's weights writer creates (``H5IOStore`` puts each object's
    variables in a ``vars`` group below the object's path, a subclassed model's included).

    >>> keras3_written(["/vars/0", "/l/inner/vars/1"]), keras3_written(["/layers/d/vars/0", "/notes"])
    (True, False)
    """
    seen = False
    for p in paths:
        if p.rsplit("/", 2)[-2:-1] != ["vars"]:
            return False
        seen = True
    return seen


def detect_framework(paths: Iterable[str], root_attrs: dict[str, Any] | None = None) -> str | None:
    """Name the framework whose layout the dataset paths (and root attributes) follow.

    >>> detect_framework(["/layers/dense/vars/0", "/optimizer/vars/0"])
    'keras3'
    >>> detect_framework(["/a/b"]) is None
    True
    """
    attrs = root_attrs or {}
    tag = _attr_str(attrs.get("fastflip_layout"))
    if tag and tag.startswith("torch-state-dict"):
        return "torch"
    paths = list(paths)
    if "layer_names" in attrs or any(p.startswith("/model_weights/") for p in paths):
        return "keras-legacy"
    if keras3_written(paths) or any(_KERAS3_VAR.match(p) and p.startswith(("/layers/", "/optimizer/"))
                                    for p in paths):
        return "keras3"
    comps = {c for p in paths for c in p.split("/")}
    if any(c.startswith(("optimizer:", "model:")) for c in comps) or comps & {"W", "avg_mean", "avg_var"}:
        return "chainer"
    if any(re.search(r":\d+$", p) for p in paths):
        return "keras-legacy"
    if paths and all(p.startswith("/model/") or p.startswith("/optimizer/") for p in paths) and any(
        "." in p.rsplit("/", 1)[-1] for p in paths
    ):
        return "torch"
    return None


def file_framework(paths: Iterable[str], h5file: Any = None) -> str | None:
    """The framework whose layout an HDF5 file follows: :func:`detect_framework` of its dataset paths (every one,
    each alias included) and the root attributes of the open file ``h5file`` (``fastflip_layout``,
    ``layer_names``)."""
    attrs = {} if h5file is None else {k: h5file.attrs[k] for k in ("fastflip_layout", "layer_names")
                                       if k in h5file.attrs}
    return detect_framework(paths, attrs)


def _guess_role(name: str, ndim: int, kind: str) -> str:
    low = name.lower()
    if low in _QUANT_ROLES:
        return _QUANT_ROLES[low]
    if low in _BN_NAMES:
        return "bn-statistic"
    if low in _STEP_NAMES and kind in "iuf" and ndim == 0:
        return "step-counter"
    if kind != "f":
        return "other"
    if low in _WEIGHT_NAMES or low.endswith("kernel") or low.endswith("_weight"):
        return "weight"
    if low in _BIAS_NAMES or low.endswith("_bias"):
        return "bias"
    return "other"


def label_path(path: str, framework: str | None, ndim: int, kind: str) -> tuple[str | None, str]:
    """(layer, role) of one dataset from its path alone (no sibling or attribute context).

    ``kind`` is the numpy dtype kind (``'f'``, ``'i'``, ``'u'``, ``'b'``). Keras 3 files
    need sibling context for exact roles; :func:`annotate` provides it.
    """
    parts = [p for p in path.split("/") if p]
    leaf = _leaf(path)
    if framework == "torch":
        if parts[:1] == ["model"]:
            key = ".".join(parts[1:])
            layer, _, name = key.rpartition(".")
            if name == "num_batches_tracked":
                return layer or None, "step-counter"
            owner, _, param = layer.rpartition(".")
            if name in _QUANT_INNER and (param in _WEIGHT_NAMES or param in _BIAS_NAMES):
                # a tensor subclass's inner tensor (``fc.weight.qdata``): the module is the layer
                return owner or None, "scale" if name == "scale" else _guess_role(name, ndim, "f")
            if name == "scale" and ndim == 0:  # a quantized module's output scale (quantize_dynamic)
                return layer or None, "scale"
            # bfloat16 tensors are stored as uint16 words: the name decides, not the kind
            return layer or None, _guess_role(name, ndim, "f")
        if parts[:2] == ["optimizer", "state"] and len(parts) >= 4:
            return None, "step-counter" if leaf == "step" else "optimizer-moment"
        return None, "other"
    if framework == "keras-legacy":
        if parts[:1] == ["optimizer_weights"]:
            if leaf.lower() in ("iter", "iteration", "iterations"):
                return None, "step-counter"
            return None, "other" if ndim == 0 or kind != "f" else "optimizer-moment"
        body = parts[1:] if parts[:1] == ["model_weights"] else parts
        layer = body[0] if len(body) > 1 else None
        role = _guess_role(leaf, ndim, kind)
        if role == "other" and kind == "f" and ndim >= 2:
            role = "weight"
        return layer, role
    if framework == "chainer":
        def at(prefix: str) -> int | None:
            return next((k for k, p in enumerate(parts) if p.startswith(prefix)), None)

        opt_i, model_i = at("optimizer:"), at("model:")
        start = max(i for i in (opt_i, model_i, -1) if i is not None) + 1
        body = parts[start:]
        body = body[1:] if body[:1] == ["predictor"] else body
        if len(body) >= 2 and (opt_i is not None or body[-2] in _CHAINER_PARAMS):
            # an update rule's state for one parameter: .../<link path>/<param>/<m|v|t>
            param_links = [p for p in body[:-2] if p != "predictor"]
            return ("/".join(param_links) or None), ("step-counter" if leaf == "t" else "optimizer-moment")
        if opt_i is not None or (parts[:1] == ["updater"] and model_i is None) or len(body) == 1:
            counter = leaf in ("t", "epoch", "iteration") and ndim == 0
            return None, "step-counter" if counter else _guess_role(leaf, ndim, kind)
        layer = "/".join(body[:-1]) or None
        if leaf == "N":
            return layer, "step-counter"
        return layer, _guess_role(leaf, ndim, kind)
    # unknown layout: parent group as layer, role from the name
    return ("/".join(parts[:-1]) or None), _guess_role(leaf, ndim, kind)


def alias_layers(t: Tensor) -> tuple[str, ...]:
    """Every layer a tensor is reached through: its own ``layer``, then each alias's.

    A tied matrix is one tensor with several names (GPT-2's ``transformer.wte.weight`` and
    ``lm_head.weight``); a selection by layer matches it under any of them. A PyTorch key's layer
    is its dotted prefix (``/model/lm_head.weight`` → ``lm_head``); other layouts' aliases are
    labelled like the tensor's own path.

    >>> import numpy as np
    >>> t = Tensor("/transformer.wte.weight", ("/transformer.wte.weight", "/lm_head.weight"), np.dtype("<f4"),
    ...            (4, 2), 8, "contiguous", 0, framework="torch", layer="transformer.wte")
    >>> alias_layers(t)
    ('transformer.wte', 'lm_head')
    """
    out = [t.layer] if t.layer else []
    kind = "f" if t.format else t.dtype.kind
    for a in t.aliases:
        leaf = _leaf(a)
        if t.framework in ("torch", "live"):  # state_dict keys: the layer is the dotted prefix
            layer = leaf.rpartition(".")[0] or None
        else:
            layer = label_path(a, t.framework, len(t.shape), kind)[0]
        if layer and layer not in out:
            out.append(layer)
    return tuple(out)


def label_names(names: Sequence[str], ndims: Sequence[int], kinds: Sequence[str]) -> list[tuple[str | None, str]]:
    """(layer, role) of in-memory tensors from their names alone: checkpoint paths (``/model/fc.weight``,
    ``layers/dense/vars/0``) or bare PyTorch state_dict keys (``fc.weight``: layer ``fc``).

    >>> label_names(["fc.weight", "bn.num_batches_tracked"], [2, 0], ["f", "i"])
    [('fc', 'weight'), ('bn', 'step-counter')]
    """
    paths = ["/" + n.lstrip("/") for n in names]
    fw = detect_framework(paths)
    if fw is None and any("." in p.rsplit("/", 1)[-1] for p in paths) and not any("/" in p[1:] for p in paths):
        fw, paths = "torch", ["/model" + p for p in paths]  # bare state_dict keys
    return [label_path(p, fw, n, k) for p, n, k in zip(paths, ndims, kinds)]


def _kind(t: Tensor) -> str:
    """A tensor's NumPy kind, ``'f'`` for a float format held in unsigned words (a Keras bfloat16 variable)."""
    return "f" if t.format else t.dtype.kind


def _keras3_roles(tensors: Sequence[Tensor], h5file: Any) -> dict[str, tuple[str | None, str]]:
    """(layer, role) for Keras 3 ``.../vars/<i>`` tensors, using sibling shapes and group attrs."""
    groups: dict[str, list[tuple[int, Tensor]]] = {}
    for t in tensors:
        m = _KERAS3_VAR.match(t.path)
        if m:
            groups.setdefault(m.group("group"), []).append((int(m.group("i")), t))
    out: dict[str, tuple[str | None, str]] = {}
    for gpath, items in groups.items():
        items.sort(key=lambda it: it[0])
        gname = gpath.rsplit("/", 1)[-1]
        layer: str | None = gname or None  # ``/vars/<i>``: a subclassed model's own variables
        cls = _strip_counter(gname).lower()
        if h5file is not None:
            for where in (gpath + "/vars", gpath) if gpath else ("/vars",):
                obj = h5file.get(where)
                if obj is None:
                    continue
                name = _attr_str(obj.attrs.get("name"))
                if name and where.endswith("/vars"):
                    layer = name
                cname = _attr_str(obj.attrs.get("class_name"))
                if cname:
                    cls = re.sub(r"(?<!^)(?=[A-Z])", "_", cname).lower()
        is_opt = gpath == "/optimizer" or gpath.startswith("/optimizer/") or cls.endswith("optimizer")
        if is_opt:
            for i, t in items:
                if _kind(t) in "iu" and len(t.shape) == 0:
                    role = "step-counter"
                elif len(t.shape) == 0 or _kind(t) != "f":
                    role = "other"
                else:
                    role = "optimizer-moment"
                out[t.path] = (None, role)
            continue
        floats = [(i, t) for i, t in items if _kind(t) == "f" and len(t.shape) >= 1]
        roles: dict[str, str] = {}
        if "batch_norm" in cls and len(floats) >= 2:
            *affine, mean, var = floats
            roles[mean[1].path] = roles[var[1].path] = "bn-statistic"
            for (_, t), r in zip(affine, ("weight", "bias")):
                roles[t.path] = r
        elif "normalization" in cls:
            for (_, t), r in zip(floats, ("weight", "bias")):
                roles[t.path] = r
        else:
            # an integer kernel is a quantized one (Keras ``quantize("int8")``): its scale is the last vector
            quantized = [t for _, t in items if _kind(t) in "iu" and len(t.shape) >= 2]
            for t in quantized:
                roles[t.path] = "weight"
            seen_kernel = bool(quantized)
            for _, t in floats:
                if len(t.shape) >= 2:
                    roles[t.path] = "weight"
                    seen_kernel = True
                else:
                    roles[t.path] = "bias" if seen_kernel else "weight"
            if quantized and floats and len(floats[-1][1].shape) == 1:
                roles[floats[-1][1].path] = "scale"
        for _, t in items:
            out[t.path] = (layer, roles.get(t.path, "other"))
    return out


_TORCH_BUFFERS = {"running_mean", "running_var", "num_batches_tracked"}


def _torch_optimizer_layers(tensors: Sequence[Tensor], h5file: Any) -> dict[str, str]:
    """Layer of each ``/optimizer/state/<id>/...`` tensor, from the optimizer's parameter order.

    Parameter ids index the concatenated ``params`` lists of ``param_groups``; the model's
    parameters are its state_dict keys (``/model`` attribute ``fastflip_keys``) minus the
    known batch-norm buffers. The mapping is used only when the counts agree and every
    state tensor has its parameter's shape; otherwise nothing is labelled.
    """
    import json

    try:
        keys = [k for k, _ in json.loads(h5file["model"].attrs["fastflip_keys"])]
        groups = json.loads(h5file["optimizer"].attrs["param_groups"])
        ids = [str(i) for g in groups for i in g["params"]]
    except Exception:
        return {}
    params = [k for k in keys if k.rpartition(".")[2] not in _TORCH_BUFFERS]
    if len(ids) != len(params):
        return {}
    shapes = {t.path: t.shape for t in tensors}
    param_of = dict(zip(ids, params))
    out: dict[str, str] = {}
    for t in tensors:
        parts = t.path.split("/")
        if len(parts) != 5 or parts[1:3] != ["optimizer", "state"]:
            continue
        key = param_of.get(parts[3])
        if key is None:
            return {}
        if len(t.shape) > 0 and shapes.get(f"/model/{key}") != t.shape:
            return {}
        out[t.path] = key.rpartition(".")[0] or key
    return out


def _names_attr(obj: Any, name: str) -> list[str]:
    """A Keras ``layer_names``/``weight_names`` attribute as a list of str ([] when absent)."""
    if obj is None or name not in obj.attrs:
        return []
    return [_attr_str(v) or "" for v in obj.attrs[name]]


def _keras_legacy_optimizer_layers(tensors: Sequence[Tensor], h5file: Any) -> dict[str, str]:
    """Layer of each ``/optimizer_weights/...`` tensor of a legacy Keras file.

    Either a path component is a layer name (``Adam/conv1/kernel/m:0``), or the dataset name
    starts with a layer weight's path with '/' → '_' (``sequential_conv_kernel_momentum``
    for weight ``sequential/conv/kernel`` of layer ``conv``).
    """
    top = h5file.get("model_weights")
    layer_names = _names_attr(top, "layer_names")
    if not layer_names:
        return {}
    prefixes: list[tuple[str, str]] = []
    for layer in layer_names:
        for w in _names_attr(top.get(layer), "weight_names"):
            prefixes.append((re.sub(r":\d+$", "", w).replace("/", "_") + "_", layer))
    prefixes.sort(key=lambda pl: -len(pl[0]))
    known = set(layer_names)
    out: dict[str, str] = {}
    for t in tensors:
        parts = t.path.split("/")
        if parts[1:2] != ["optimizer_weights"]:
            continue
        hit = next((p for p in parts[2:-1] if p in known), None)
        if hit is None:
            leaf = _leaf(t.path)
            hit = next((layer for pre, layer in prefixes if leaf.startswith(pre)), None)
        if hit is not None:
            out[t.path] = hit
    return out


def _skip_unread(layout: Layout, h5file: Any) -> None:
    """Move the datasets of a legacy Keras file that Keras's loaders never read to ``layout.skipped``."""
    unread = unread_paths(layout.tensors, h5file)
    if unread:
        layout.tensors[:] = [t for t in layout.tensors if t.path not in unread]
        layout.skipped.extend(Skipped(p, UNREAD_REASON) for p in sorted(unread))
        layout.skipped.sort(key=lambda s: s.path)


_DETECT = "detect"


def annotate(layout_or_tensors: T, h5file: Any = None, *, framework: str | None = _DETECT) -> T:
    """Fill ``framework``, ``layer`` and ``role`` of every tensor.

    Parameters
    ----------
    layout_or_tensors : Layout or list of Tensor
        A :class:`~fastflip.files.layout.Layout` is updated in place (and returned); a list
        gives a new list of annotated tensors.
    h5file : h5py.File, optional
        The open file, for attributes (layer names, layout tags). Without it a Layout's
        file is opened; a bare list is labelled from paths alone.
    framework : str or None, optional
        The file's framework, as :func:`file_framework` names it from every dataset path of the file
        (:func:`fastflip.files.layout.read_layout` passes the one it read the file by); by default
        detected from the tensors' paths.

    Notes
    -----
    In a legacy Keras file, a Layout's datasets that no layer's ``weight_names`` names
    (:func:`fastflip.files.keras_names.unread_paths`) are moved to its ``skipped``: Keras never reads them.
    """
    if isinstance(layout_or_tensors, Layout):
        if h5file is None:
            with open_h5(layout_or_tensors.file) as f:
                return annotate(layout_or_tensors, f, framework=framework)
        tensors = layout_or_tensors.tensors
    else:
        tensors = list(layout_or_tensors)
    fw = file_framework((p for t in tensors for p in t.aliases), h5file) if framework == _DETECT else framework
    special = _keras3_roles(tensors, h5file) if fw == "keras3" else {}
    opt_layers: dict[str, str] = {}
    if h5file is not None and fw == "torch":
        opt_layers = _torch_optimizer_layers(tensors, h5file)
    elif h5file is not None and fw == "keras-legacy":
        opt_layers = _keras_legacy_optimizer_layers(tensors, h5file)
    out = []
    for t in tensors:
        if t.path in special:
            layer, role = special[t.path]
        else:
            layer, role = label_path(t.path, fw, len(t.shape), "f" if t.format else t.dtype.kind)
            layer = opt_layers.get(t.path, layer)
        out.append(replace(t, framework=fw, layer=layer, role=role))
    if isinstance(layout_or_tensors, Layout):
        layout_or_tensors.tensors[:] = out
        layout_or_tensors.framework = fw
        if fw == "keras-legacy" and h5file is not None:
            _skip_unread(layout_or_tensors, h5file)
        return layout_or_tensors
    return out  # type: ignore[return-value]
