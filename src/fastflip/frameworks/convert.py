"""Convert checkpoints between HDF5 (fastflip's torch layout), ``torch.save`` and safetensors, bit for bit.

Layer: ``frameworks`` (may import live and below; imported by campaign, experiment and above).

torch (and ``safetensors`` for that format) are imported lazily.
Sources are read safely — ``torch.load(weights_only=True)`` for torch.save files (after
fastflip's own restricted reader has checked the pickle), ``safetensors.torch.load_file``,
:func:`fastflip.frameworks.torch_state.load_state_dict` for HDF5 — and every tensor keeps its dtype,
shape and stored bits (bf16 and float8 included).

safetensors holds one flat mapping of tensors and string metadata, so a nested
checkpoint (``{"model": ..., "optimizer": ..., "epoch": 3}``) is flattened to
``/``-joined keys (``model/conv1.weight``, ``optimizer/state/0/exp_avg``) and its other
values (``epoch``, ``param_groups``) and integer keys are kept as JSON in the
``__metadata__`` entry ``fastflip_convert``; converting back rebuilds the nesting.
safetensors has no shared storage: tied tensors become separate equal copies there.

Examples
--------
>>> import os, tempfile, torch
>>> d = tempfile.mkdtemp()
>>> state = {"model": {"fc.weight": torch.ones(2, 2)}, "epoch": 4}
>>> torch.save(state, os.path.join(d, "a.pt"))
>>> _ = convert(os.path.join(d, "a.pt"), os.path.join(d, "a.safetensors"))
>>> _ = convert(os.path.join(d, "a.safetensors"), os.path.join(d, "b.h5"))
>>> back = load_any(os.path.join(d, "b.h5"))
>>> back["epoch"], back["model"]["fc.weight"].tolist()
(4, [[1.0, 1.0], [1.0, 1.0]])
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from ..errors import OptionError
from ..files.fileio import atomic_output, check_input, check_output_dir
from ..files.paths import resolve_output
from ..files.formats import FormatError, detect_format
from ..files.formats.hfdir import is_checkpoint_dir, read_sharded_layout
from ..files.layout import read_layout
from .torch_state import load_state_dict, save_state_dict

__all__ = ["convert", "load_any", "target_format", "CONVERT_FORMATS"]

CONVERT_FORMATS = ("hdf5", "torch", "safetensors")
_EXT = {".h5": "hdf5", ".hdf5": "hdf5", ".pt": "torch", ".pth": "torch", ".bin": "torch", ".safetensors": "safetensors"}
_META = "fastflip_convert"


def target_format(path: str, to: str | None = None) -> str:
    """The format to write: ``to`` when given, else from the output's extension."""
    if to:
        if to not in CONVERT_FORMATS:
            raise OptionError(f"--to {to!r}: choose one of {', '.join(CONVERT_FORMATS)}")
        return to
    ext = os.path.splitext(path)[1].lower()
    if ext not in _EXT:
        raise OptionError(f"{path}: cannot tell the output format from its extension; give --to "
                          f"({', '.join(CONVERT_FORMATS)})")
    return _EXT[ext]


def _flatten(obj: Any, prefix: str, tensors: dict, values: dict, int_keys: list) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj
    elif isinstance(obj, Mapping) and obj and all(isinstance(k, (str, int)) for k in obj) and any(
            isinstance(v, (torch.Tensor, Mapping)) for v in obj.values()):
        for k, v in obj.items():
            if isinstance(k, int):
                int_keys.append(f"{prefix}/{k}".lstrip("/"))
            if "/" in str(k):
                raise OptionError(f"key {k!r} holds '/', which safetensors keys use to nest; rename it first")
            _flatten(v, f"{prefix}/{k}".lstrip("/"), tensors, values, int_keys)
    else:
        try:
            json.dumps(obj)
        except TypeError:
            raise OptionError(f"{prefix or 'the checkpoint'}: value of type {type(obj).__name__} cannot be kept in "
                              "safetensors metadata") from None
        values[prefix] = obj


def _unflatten(tensors: Mapping[str, Any], meta: Mapping[str, str] | None) -> Any:
    info = json.loads(meta[_META]) if meta and _META in meta else None
    if info is None:
        return dict(tensors)  # a plain safetensors file: its flat mapping
    ints = set(info.get("int_keys", []))
    root: dict = {}
    items = list(tensors.items()) + list(info.get("values", {}).items())
    if "" in info.get("values", {}):
        return info["values"][""]
    for key, v in items:
        parts = key.split("/")
        node = root
        for i, p in enumerate(parts):
            k: Any = int(p) if "/".join(parts[: i + 1]) in ints else p
            if i == len(parts) - 1:
                node[k] = v
            else:
                node = node.setdefault(k, {})
    return root


def load_any(path: str | os.PathLike[str]) -> Any:
    """The checkpoint at ``path`` as torch objects (format detected by content; a Hugging Face checkpoint
    directory gives one state_dict of all its shards)."""
    if is_checkpoint_dir(path):
        state: dict = {}
        for shard in read_sharded_layout(path).shard_paths():
            state.update(load_any(shard))
        return state
    src = check_input(path)
    fmt = detect_format(src)
    if fmt == "hdf5":
        return load_state_dict(src)
    if fmt in ("torch", "torch-legacy"):
        import torch

        read_layout(src)  # the restricted reader refuses pickles that ask for code, before torch sees them
        return torch.load(src, map_location="cpu", weights_only=True)
    if fmt == "safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(src, "pt") as f:
            meta = f.metadata()
        return _unflatten(load_file(src), meta)
    raise FormatError(f"{src}: fastflip convert reads HDF5 (torch layout), torch.save and safetensors files, not {fmt}")


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], to: str | None = None, *,
            overwrite: bool = True) -> str:
    """Write the checkpoint ``src`` to ``dst`` in format ``to`` (default: from ``dst``'s extension), atomically.

    ``dst`` is checked like every output (:func:`fastflip.files.paths.resolve_output`): never the input,
    never a directory, device, FIFO or socket; a symlink is written through (the link stays); an existing
    file is replaced only with ``overwrite`` (default True; the CLI asks for ``--force``).
    Returns the output format.
    """
    src_p = os.fspath(src) if is_checkpoint_dir(src) else check_input(src)  # a directory: into one file
    if os.path.exists(dst) and os.path.samefile(src_p, dst):
        raise OptionError(f"{dst}: the output is the input; choose another output path")
    dst_p = check_output_dir(resolve_output(dst, inputs=[src_p], overwrite=overwrite, hint="choose another output path"))
    fmt = target_format(os.fspath(dst), to)  # the name given: a link's own extension
    state = load_any(src_p)
    if fmt == "hdf5":
        if not isinstance(state, Mapping):
            raise OptionError(f"{src_p}: holds a {type(state).__name__}, not a mapping of tensors")
        save_state_dict(state, dst_p)
        return fmt
    with atomic_output(dst_p) as tmp:
        if fmt == "torch":
            import torch

            torch.save(state, tmp)
        else:
            from safetensors.torch import save_file

            tensors: dict = {}
            values: dict = {}
            int_keys: list = []
            _flatten(state, "", tensors, values, int_keys)
            seen: set = set()
            for k, t in tensors.items():  # safetensors refuses shared storage: tied tensors become copies
                t = t.detach().contiguous()
                ptr = (t.untyped_storage().data_ptr(), t.storage_offset())
                tensors[k] = t.clone() if ptr in seen or t.untyped_storage().nbytes() != t.nbytes else t
                seen.add(ptr)
            meta = {_META: json.dumps({"values": values, "int_keys": int_keys})}
            save_file(tensors, tmp, metadata=meta)
    return fmt
