"""PyTorch state_dicts to and from HDF5, bit-exact, in a documented layout.

Layer: ``frameworks`` (may import live and below; imported by campaign, experiment and above).

PyTorch pickles its checkpoints; fastflip flips bits in HDF5. This module writes a
(possibly nested) state_dict to an HDF5 file whose datasets hold the tensors' stored
bits unchanged, and reads it back, so the checkpoint-alteration method works for
PyTorch models: save → :func:`fastflip.files.inject.inject_file` → load → resume.

Layout (root attribute ``fastflip_layout = "torch-state-dict/1"``)
------------------------------------------------------------------
- every mapping is an HDF5 group; its entries, in order, are listed in the group
  attribute ``fastflip_keys`` (JSON ``[[name, key type], ...]``, the key type being
  ``"str"`` or ``"int"``, e.g. the parameter ids of an optimizer's ``state``) and
  their kinds in ``fastflip_kinds`` (JSON list, same order: the torch dtype of a
  tensor such as ``"float32"``, or ``"ndarray"``, ``"group"``, ``"value"``);
- every ``torch.Tensor`` is a dataset of the same shape and dtype (0-d tensors such
  as ``num_batches_tracked`` or Adam's ``step`` are scalar datasets), stored
  contiguous and uncompressed unless asked; ``bfloat16`` and the float8 types have no
  NumPy dtype and are stored as their ``uint16``/``uint8`` words with the attribute
  ``torch_dtype`` naming them (``"bfloat16"``, ``"float8_e4m3fn"``, ...), read back by
  :func:`fastflip.files.layout.read_layout` as the tensor's ``format``;
- every NumPy array is a dataset with the attribute ``torch_dtype = "ndarray"``;
- every other value (numbers, strings, ``None``, lists, tuples, mappings inside
  lists such as an optimizer's ``param_groups``) is a JSON attribute of its
  group, named by its key.

:func:`save_checkpoint` stores ``{"model": model.state_dict(), "optimizer":
optimizer.state_dict(), **extra}``, so the model's tensors live under
``/model/<key>`` (``/model/conv1.weight``, ``/model/bn1.running_mean``) and the
optimizer's under ``/optimizer/state/<param id>/<name>`` (``exp_avg``,
``exp_avg_sq``, ``momentum_buffer``, ``step``), with ``param_groups`` an attribute
of ``/optimizer``.

Examples
--------
>>> import os, tempfile, torch
>>> from fastflip.frameworks.torch_state import save_state_dict, load_state_dict
>>> d = tempfile.mkdtemp()
>>> state = {"model": {"w": torch.arange(3.0), "n": torch.tensor(7)}, "epoch": 2}
>>> p = save_state_dict(state, os.path.join(d, "ck.h5"))
>>> back = load_state_dict(p)
>>> back["epoch"], back["model"]["w"].tolist(), back["model"]["n"].dtype
(2, [0.0, 1.0, 2.0], torch.int64)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointMismatchError, FastflipError, InputFileError, NotHDF5Error, OptionError, OutputError
from ..files.fileio import atomic_output

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "CheckpointMismatchError",
    "save_state_dict",
    "load_state_dict",
    "save_checkpoint",
    "load_checkpoint",
]

FORMAT = "torch-state-dict"
FORMAT_VERSION = 1
_KEYS_ATTR = "fastflip_keys"
_KINDS_ATTR = "fastflip_kinds"
_DTYPE_ATTR = "torch_dtype"
# torch dtypes without a NumPy dtype, stored as their unsigned words
_WORD_DTYPES = {"bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "float8_e4m3fnuz": "uint8",
                "float8_e5m2fnuz": "uint8"}


# ---------------------------------------------------------------------------- JSON values


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, where) for v in value]}
    if isinstance(value, list):
        return [_encode(v, where) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise OptionError(f"{where}: only string keys are supported in mappings inside lists")
        return {k: _encode(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, np.generic):
        return _encode(value.item(), where)
    raise OptionError(
        f"{where}: cannot store a {type(value).__name__} in HDF5 "
        "(tensors, arrays, numbers, strings, None, lists, tuples and mappings are supported)"
    )


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_decode(v) for v in value["__tuple__"])
        return {k: _decode(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------- writing


def _key_name(key: Any, where: str) -> tuple[str, str]:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise OptionError(f"{where}: keys must be str or int, got {type(key).__name__}")
    name = str(key)
    if not name or "/" in name or name in (".", ".."):
        raise OptionError(f"{where}: key {name!r} cannot be an HDF5 name (empty, '.', '..' or contains '/')")
    if name.startswith("fastflip_") or name == _DTYPE_ATTR:
        raise OptionError(f"{where}: key {name!r} is reserved by the fastflip layout")
    return name, ("int" if isinstance(key, int) else "str")


def _create_dataset(group: Any, name: str, arr: np.ndarray, compression: str | None) -> None:
    """Write one array as a dataset; uncompressed ones through h5py's low-level calls (several times faster)."""
    import h5py

    if compression and arr.ndim:
        group.create_dataset(name, data=arr, compression=compression)
        return
    arr = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
    tid = h5py.h5t.py_create(arr.dtype, logical=True)
    space = h5py.h5s.create_simple(arr.shape) if arr.ndim else h5py.h5s.create(h5py.h5s.SCALAR)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_obj_track_times(False)  # as h5py's create_dataset: identical states give identical files
    dsid = h5py.h5d.create(group.id, name.encode(), tid, space, dcpl=dcpl)
    if arr.size:
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, arr)


def _write_group(group: Any, state: Mapping, where: str, compression: str | None) -> None:
    import torch

    keys: list[list[str]] = []
    kinds: list[str] = []
    for key, value in state.items():
        name, ktype = _key_name(key, where)
        here = f"{where}/{name}"
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            kind = str(t.dtype).replace("torch.", "")
            words = _WORD_DTYPES.get(kind)  # no NumPy dtype: stored as unsigned words
            arr = t.view(getattr(torch, words)).numpy() if words else t.numpy()
        elif isinstance(value, np.ndarray):
            kind, arr = "ndarray", value
        elif isinstance(value, Mapping):
            kind = "group"
            _write_group(group.create_group(name), value, here, compression)
        else:
            kind = "value"
            group.attrs[name] = json.dumps(_encode(value, here))
        if kind not in ("group", "value"):
            _create_dataset(group, name, arr, compression)
            if kind in _WORD_DTYPES or kind == "ndarray":  # not told by the stored dtype alone
                group[name].attrs[_DTYPE_ATTR] = kind
        keys.append([name, ktype])
        kinds.append(kind)
    group.attrs[_KEYS_ATTR] = json.dumps(keys)
    group.attrs[_KINDS_ATTR] = json.dumps(kinds)


def save_state_dict(state: Mapping, path: str | os.PathLike, *, compression: str | None = None) -> Path:
    """Write a (nested) state_dict to an HDF5 file in the layout described above.

    Parameters
    ----------
    state : Mapping
        A state_dict, or a mapping of them (``{"model": ..., "optimizer": ...}``).
    path : path-like
        Output file, written atomically (a temporary file renamed into place).
    compression : str, optional
        An h5py filter for the tensors (``"gzip"``); default none, which keeps the
        tensors contiguous so injection writes them in place.

    Returns
    -------
    pathlib.Path
        The written file.
    """
    import h5py

    if not isinstance(state, Mapping):
        raise OptionError(f"state: expected a mapping (a state_dict), got {type(state).__name__}")
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path) as tmp:
            with h5py.File(tmp, "w") as f:
                f.attrs["fastflip_layout"] = f"{FORMAT}/{FORMAT_VERSION}"
                _write_group(f, state, "", compression)
    except OSError as exc:
        if isinstance(exc, FastflipError):
            raise
        raise OutputError(f"cannot write {path}: {exc}") from exc
    return path


# ---------------------------------------------------------------------------- reading


def _read_array(group: Any, name: str) -> np.ndarray:
    """One dataset as a native-order array, through h5py's low-level calls (several times faster)."""
    import h5py

    dsid = h5py.h5d.open(group.id, name.encode())
    dtype = dsid.dtype
    if dtype.kind not in "biufc" or dtype.fields is not None:
        return np.asarray(group[name][()])
    if dtype.byteorder in "<>":
        dtype = dtype.newbyteorder("=")
    arr = np.empty(dsid.shape, dtype)
    if arr.size:
        dsid.read(h5py.h5s.ALL, h5py.h5s.ALL, arr)
    return arr


def _to_tensor(arr: np.ndarray, tname: str, where: str) -> Any:
    import torch

    if tname == "ndarray":
        return arr
    if tname in _WORD_DTYPES:
        return torch.from_numpy(arr.view(_WORD_DTYPES[tname])).view(getattr(torch, tname))
    tensor = torch.from_numpy(arr)
    if tname == "tensor":
        return tensor
    want = getattr(torch, tname, None)
    if not isinstance(want, torch.dtype):
        raise InputFileError(f"{where}: unknown torch_dtype {tname!r}")
    if tensor.dtype != want:
        raise InputFileError(f"{where}: stored as {arr.dtype} but labelled torch.{tname}")
    return tensor


def _read_group(group: Any) -> dict:
    import h5py

    raw = group.attrs.get(_KEYS_ATTR)
    if raw is None:  # a group not written by fastflip: its members, then its attributes
        keys = [[name, "str", None] for name in group] + [
            [name, "str", "value"] for name in group.attrs if not name.startswith("fastflip_")
        ]
    else:
        listed = json.loads(raw)
        kinds_raw = group.attrs.get(_KINDS_ATTR)
        kinds = json.loads(kinds_raw) if kinds_raw is not None else [None] * len(listed)
        if len(kinds) != len(listed):
            raise InputFileError(f"{group.name}: fastflip_keys and fastflip_kinds disagree (damaged file?)")
        keys = [[name, ktype, kind] for (name, ktype), kind in zip(listed, kinds)]
    out: dict = {}
    prefix = group.name.rstrip("/")
    for name, ktype, kind in keys:
        key: Any = int(name) if ktype == "int" else name
        if kind is None:  # written by an older layout or another tool: look it up
            if name in group:
                obj = group.get(name)
                if isinstance(obj, h5py.Group):
                    kind = "group"
                else:
                    t = obj.attrs.get(_DTYPE_ATTR, "tensor")  # a dataset: a tensor of its own dtype
                    kind = t.decode() if isinstance(t, bytes) else str(t)
            elif name in group.attrs:
                kind = "value"
        try:
            if kind == "group":
                out[key] = _read_group(group[name])
            elif kind == "value":
                out[key] = _listed_value(group.attrs[name], name, prefix) if raw is not None else _attr_value(group.attrs[name])
            elif kind is not None:
                out[key] = _to_tensor(_read_array(group, name), kind, f"{prefix}/{name}")
            else:
                raise KeyError(name)
        except KeyError:
            raise InputFileError(f"{prefix or '/'}: entry {name!r} is listed but missing (damaged file?)") from None
    return out


def _listed_value(raw: Any, name: str, prefix: str) -> Any:
    """A value attribute that fastflip_keys lists: the JSON fastflip wrote, decoded; anything else refused."""
    try:
        return _decode(json.loads(raw))
    except ValueError as exc:
        raise InputFileError(f"{prefix or '/'}: attribute {name!r} is not a value fastflip wrote ({exc}); "
                             "damaged file?") from None


def _attr_value(value: Any) -> Any:
    """An attribute of a group fastflip did not write, as a plain Python value (text decoded, arrays as lists)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value.tolist() if hasattr(value, "tolist") else value


def load_state_dict(path: str | os.PathLike) -> dict:
    """Read a file written by :func:`save_state_dict` back into a nested state_dict.

    Tensors come back on the CPU with their stored bits unchanged (altered or not).
    """
    import h5py

    path = Path(path)
    if not path.exists():
        raise InputFileError(f"{path}: no such file")
    if not h5py.is_hdf5(path):
        raise NotHDF5Error(f"{path}: not an HDF5 file")
    with h5py.File(path, "r") as f:
        tag = f.attrs.get("fastflip_layout")
        if isinstance(tag, bytes):
            tag = tag.decode()
        if tag is not None:
            fmt, _, ver = str(tag).partition("/")
            if fmt != FORMAT:
                raise InputFileError(f"{path}: layout {tag!r} is not a torch state file")
            if not ver.isdigit() or int(ver) > FORMAT_VERSION:
                raise InputFileError(f"{path}: layout {tag!r} is newer than this fastflip reads")
        return _read_group(f)


# ---------------------------------------------------------------------------- model + optimizer


def save_checkpoint(
    path: str | os.PathLike, model: Any = None, optimizer: Any = None, *, compression: str | None = None, **extra: Any
) -> Path:
    """Save a model's and an optimizer's state (and extra values) to one HDF5 file.

    The model's tensors go under ``/model/<key>``, the optimizer's under
    ``/optimizer/...``; ``extra`` items (``epoch=3``) are stored beside them.
    """
    state: dict = {}
    if model is not None:
        state["model"] = model.state_dict()
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    for k in extra:
        if k in state:
            raise OptionError(f"extra key {k!r} collides with the model/optimizer entries")
    state.update(extra)
    return save_state_dict(state, path, compression=compression)


def _check_model(state: Mapping, model: Any, path: Path) -> None:
    expected = model.state_dict()
    for k, want in expected.items():
        got = state.get(k)
        if got is not None and tuple(getattr(got, "shape", ())) != tuple(want.shape):
            raise CheckpointMismatchError(
                f"{path}: tensor /model/{k} has shape {tuple(got.shape)} but the model expects {tuple(want.shape)}"
            )
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing:
        raise CheckpointMismatchError(f"{path}: tensor /model/{missing[0]} is missing ({len(missing)} missing)")
    if unexpected:
        raise CheckpointMismatchError(
            f"{path}: tensor /model/{unexpected[0]} is not in the model ({len(unexpected)} unexpected)"
        )


def _check_optimizer(state: Mapping, optimizer: Any, path: Path) -> None:
    params = [p for g in optimizer.param_groups for p in g["params"]]
    groups = state.get("param_groups", [])
    ids = [i for g in groups for i in g.get("params", [])]
    if len(ids) != len(params):
        raise CheckpointMismatchError(
            f"{path}: /optimizer has {len(ids)} parameters but the optimizer has {len(params)}"
        )
    where = {pid: params[n] for n, pid in enumerate(ids)}
    for pid, pstate in state.get("state", {}).items():
        if pid not in where:
            raise CheckpointMismatchError(f"{path}: /optimizer/state/{pid} belongs to no parameter")
        shape = tuple(where[pid].shape)
        for name, value in pstate.items():
            vshape = tuple(getattr(value, "shape", ()))
            if len(vshape) and vshape != shape:
                raise CheckpointMismatchError(
                    f"{path}: tensor /optimizer/state/{pid}/{name} has shape {vshape} "
                    f"but its parameter has shape {shape}"
                )


def load_checkpoint(path: str | os.PathLike, model: Any = None, optimizer: Any = None) -> dict:
    """Load a file written by :func:`save_checkpoint` into a model and an optimizer.

    Shapes and names are checked first: a checkpoint of another model raises
    :class:`CheckpointMismatchError` naming the first tensor that does not fit.

    Returns
    -------
    dict
        The whole state read from the file (``"model"``, ``"optimizer"``, extras).
    """
    path = Path(path)
    state = load_state_dict(path)
    if model is not None:
        if "model" not in state:
            raise CheckpointMismatchError(f"{path}: no /model group (not a fastflip torch checkpoint?)")
        _check_model(state["model"], model, path)
        model.load_state_dict(state["model"])
    if optimizer is not None:
        if "optimizer" not in state:
            raise CheckpointMismatchError(f"{path}: no /optimizer group: the checkpoint holds no optimizer state")
        _check_optimizer(state["optimizer"], optimizer, path)
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as exc:
            raise CheckpointMismatchError(f"{path}: optimizer state does not fit: {exc}") from exc
    return state
