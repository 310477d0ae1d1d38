"""Hugging Face checkpoint directories: several shard files read as one model.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

``save_pretrained`` writes a model as a directory: ``config.json``, the weights either in one
file (``model.safetensors``, older ``pytorch_model.bin``) or in shards
(``model-00001-of-00003.safetensors``, ``pytorch_model-00001-of-00003.bin``) listed by an
index (``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``, whose
``weight_map`` maps every tensor name to its shard), plus tokenizer and generation files.

:func:`read_sharded_layout` reads such a directory (or its index file) as one
:class:`ShardedLayout`: every tensor of every shard under its state_dict name (``/`` +
the ``weight_map`` key, as for a single safetensors or torch.save file), in the natural
order of the names, so that a seed samples the same sites whether the model is saved in
one file or in shards. Each shard is read by its own format's reader
(:mod:`.safetensors_io`, :mod:`.torchsave`); a tensor's ``offset`` is a byte offset in
*its shard* (:meth:`ShardedLayout.file_of`), never in the directory.

What transformers would read differently is refused in one line: an index whose
``weight_map`` is not a mapping of names to plain file names in the directory (no ``/``,
``..`` or absolute paths), a missing shard, a shard holding a tensor the index does not
list there or lacking one it does, a tensor in two shards, shards of different formats.

Examples
--------
>>> import os, json, struct, tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> def shard(name, tensors):
...     head, blob = {}, b""
...     for k, v in tensors.items():
...         v = v.astype("<f4")
...         head[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [len(blob), len(blob) + v.nbytes]}
...         blob += v.tobytes()
...     h = json.dumps(head).encode()
...     _ = open(os.path.join(d, name), "wb").write(struct.pack("<Q", len(h)) + h + blob)
>>> shard("model-00001-of-00002.safetensors", {"fc.weight": np.ones((2, 2))})
>>> shard("model-00002-of-00002.safetensors", {"fc.bias": np.zeros(2)})
>>> wm = {"fc.weight": "model-00001-of-00002.safetensors", "fc.bias": "model-00002-of-00002.safetensors"}
>>> _ = open(os.path.join(d, "model.safetensors.index.json"), "w").write(json.dumps({"weight_map": wm}))
>>> lay = read_sharded_layout(d)
>>> [(t.path, lay.shard_of[t.path]) for t in lay.tensors]
[('/fc.bias', 'model-00002-of-00002.safetensors'), ('/fc.weight', 'model-00001-of-00002.safetensors')]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.records import Layout, Skipped, Tensor
from ...core.records import natural_key as _natural_key
from . import FormatError, detect_format
from . import read_layout as read_file_layout

__all__ = ["INDEX_FILES", "SINGLE_FILES", "KERAS_INDEX_SUFFIX", "keras_indexes", "index_weight_map", "plain_name",
           "place_tensors", "ShardedLayout", "is_checkpoint_dir", "find_index", "read_sharded_layout"]

INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")
# what transformers' from_pretrained looks for, in its order of preference: (file name, is an index)
_LOOKUP = (("model.safetensors", False), ("model.safetensors.index.json", True), ("pytorch_model.bin", False),
           ("pytorch_model.bin.index.json", True))
_MAX_INDEX = 64 << 20
KERAS_INDEX_SUFFIX = ".weights.json"  # Keras's load_weights reads a file so named as a sharded index
_SHARD_FORMATS = {"safetensors": "safetensors", "torch": "torch", "torch-legacy": "torch"}


@dataclass
class ShardedLayout(Layout):
    """The tensors of a checkpoint directory, each in its shard.

    Attributes
    ----------
    file : str
        The directory (``Layout.file``).
    index : str or None
        The index file name inside the directory (None for a single ``model.safetensors``).
    shards : dict of str to Layout
        Each weight file (name inside the directory) and its own layout, in index order.
    shard_of : dict of str to str
        Tensor path → the weight file holding it.
    """

    index: str | None = None
    shards: dict[str, Layout] = field(default_factory=dict)
    shard_of: dict[str, str] = field(default_factory=dict)

    def file_of(self, tensor: Tensor | str) -> str:
        """The path of the shard file holding ``tensor`` (a record or its path)."""
        name = tensor if isinstance(tensor, str) else tensor.path
        return os.path.join(self.file, self.shard_of[name])

    def as_dict(self) -> dict[str, Any]:
        """:meth:`Layout.as_dict` plus the index, the weight files and each tensor's ``shard``."""
        d = super().as_dict()
        for t in d["tensors"]:
            t["shard"] = self.shard_of.get(t["path"])
        return dict(d, index=self.index, shards=list(self.shards))

    def shard_paths(self) -> list[str]:
        """The weight files' paths, in index order."""
        return [os.path.join(self.file, s) for s in self.shards]


def find_index(path: str | os.PathLike[str]) -> tuple[str, str | None, str | None] | None:
    """``(directory, index file name or None, single weight file name or None)`` when ``path`` is a
    checkpoint directory or an index file, else None (a plain checkpoint file)."""
    p = os.fspath(path)
    if os.path.isfile(p) and p.endswith((".index.json", KERAS_INDEX_SUFFIX)):  # a Keras index: keras_sharded.py
        return os.path.dirname(os.path.abspath(p)), os.path.basename(p), None
    if not os.path.isdir(p):
        return None
    for name, is_index in _LOOKUP:
        if os.path.isfile(os.path.join(p, name)):
            return (p, name, None) if is_index else (p, None, name)
    keras = keras_indexes(p)
    return p, keras[0] if len(keras) == 1 else None, None


def keras_indexes(root: str) -> list[str]:
    """The Keras sharded indexes (``*.weights.json`` files) in the directory ``root``, in name order."""
    try:
        return sorted(e.name for e in os.scandir(root) if e.name.endswith(KERAS_INDEX_SUFFIX) and e.is_file())
    except OSError:
        return []


def is_checkpoint_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory, an ``*.index.json`` file (read by :func:`read_sharded_layout`) or a Keras
    sharded index ``*.weights.json`` (read by :mod:`fastflip.files.keras_sharded`)."""
    return find_index(path) is not None


def plain_name(ip: str, name: object, tail: str) -> str:
    """``name``, a shard named by the index file ``ip``, when it is a plain file name beside the index.

    Raises
    ------
    FormatError
        ``"{ip}: weight_map names shard {name!r}{tail}"`` when ``name`` is not a non-empty string naming a file in
        the index's directory (a path, ``.``/``..``, a NUL).
    """
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or os.path.isabs(name) or "\0" in name):
        raise FormatError(f"{ip}: weight_map names shard {name!r}{tail}")
    return name


def index_weight_map(ip: str, hint: str) -> dict[Any, Any]:
    """The non-empty ``weight_map`` mapping of the JSON index file ``ip`` (a Hugging Face or Keras sharded index),
    as ``json`` reads it; refused in one line (ending with ``hint``) when unreadable, not JSON or without one."""
    try:
        if os.path.getsize(ip) > _MAX_INDEX:
            raise FormatError(f"{ip}: index of {os.path.getsize(ip)} bytes, larger than an index can be")
        with open(ip, "rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
    except OSError as exc:
        raise FormatError(f"{ip}: cannot be read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError(f"{ip}: not a valid JSON index ({exc})") from None
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise FormatError(f"{ip}: no weight_map in the index; {hint}")
    return wm


def _weight_map(root: str, index: str) -> dict[str, str]:
    ip = os.path.join(root, index)
    wm = index_weight_map(ip, "give a Hugging Face model.safetensors.index.json or pytorch_model.bin.index.json")
    tail = ", not a file name in the checkpoint directory; fastflip reads shards beside the index only"
    return {str(k): plain_name(ip, v, tail) for k, v in wm.items() if _is_name(k, ip)}


def _is_name(key: object, ip: str) -> bool:
    if not isinstance(key, str) or not key:
        raise FormatError(f"{ip}: weight_map key {key!r} is not a tensor name")
    return True


def place_tensors(lay: Layout, shard: str, shard_of: dict[str, str], tensors: list[Tensor],
                  skipped: list[Skipped], clash: Callable[[str, str], str]) -> None:
    """Gather one shard's layout ``lay`` into a whole model's lists: every alias recorded as held by ``shard`` in
    ``shard_of``, its tensors and skipped entries appended.

    Raises
    ------
    FormatError
        ``clash(alias, other shard)`` for the first alias another shard already holds (nothing appended then).
    """
    for t in lay.tensors:
        for a in t.aliases:
            if a in shard_of:
                raise FormatError(clash(a, shard_of[a]))
            shard_of[a] = shard
    tensors += lay.tensors
    skipped += lay.skipped


def read_sharded_layout(path: str | os.PathLike[str]) -> ShardedLayout:
    """One :class:`ShardedLayout` of a checkpoint directory (or its index file).

    Raises
    ------
    FormatError
        A directory without an index or weight file, an inconsistent index (see the module docstring).
    InputFileError
        A missing or unreadable shard.
    """
    found = find_index(path)
    p = os.fspath(path)
    if found is None:
        raise FormatError(f"{p}: not a checkpoint directory nor an index file")
    root, index, single = found
    if index is not None and index.endswith(KERAS_INDEX_SUFFIX):
        raise FormatError(f"{os.path.join(root, index)}: a Keras sharded save, which inspect, inject, replay, revert "
                          "and diff read (fastflip.files.layout.read_checkpoint_dir); this reads Hugging Face "
                          "directories only")
    if index is None and single is None:
        if len(keras_indexes(root)) > 1:
            raise FormatError(f"{p}: holds several Keras sharded indexes ({', '.join(keras_indexes(root))}); "
                              "give the .weights.json to read")
        if os.path.isfile(os.path.join(root, "model.weights.h5")):  # Keras model.save(d, zipped=False)
            raise FormatError(f"{p}: a Keras model saved unzipped (zipped=False); its weights are the HDF5 file "
                              f"{os.path.join(p, 'model.weights.h5')}: give that file")
        raise FormatError(f"{p}: a directory without a Hugging Face index ({' or '.join(INDEX_FILES)}) or weight "
                          f"file ({' or '.join(SINGLE_FILES)}); give a checkpoint file or a save_pretrained directory")
    wm = _weight_map(root, index) if index is not None else None
    names = list(dict.fromkeys(wm.values())) if wm is not None else [single]
    shards: dict[str, Layout] = {}
    shard_of: dict[str, str] = {}
    tensors: list[Tensor] = []
    skipped: list[Skipped] = []
    kinds: set[str] = set()
    for name in names:
        sp = os.path.join(root, name)
        if not os.path.isfile(sp):
            raise FormatError(f"{sp}: shard listed by {index} is missing; the checkpoint directory is incomplete")
        fmt = detect_format(sp)
        if fmt not in _SHARD_FORMATS:
            raise FormatError(f"{sp}: a {fmt} file; checkpoint shards are safetensors or torch.save files")
        kinds.add(_SHARD_FORMATS[fmt])
        lay = read_file_layout(sp, fmt)
        shards[name] = lay
        held = {a.lstrip("/") for t in lay.tensors for a in t.aliases} | {s.path.lstrip("/") for s in lay.skipped}
        if wm is not None:
            listed = {k for k, v in wm.items() if v == name}
            extra, missing = sorted(held - listed), sorted(listed - held)
            if extra or missing:
                what = (f"holds {extra[0]!r}, which the index does not list there" if extra
                        else f"lacks {missing[0]!r}, which the index places there")
                raise FormatError(f"{sp}: {what}; the index and its shards disagree (fastflip reads what "
                                  "transformers reads, or refuses)")
        place_tensors(lay, name, shard_of, tensors, skipped,
                      lambda a, other: f"{sp}: tensor {a.lstrip('/')!r} is also in {other}; a tensor must be in one "
                      "shard")
    if len(kinds) > 1:
        raise FormatError(f"{p}: shards of different formats ({', '.join(sorted(kinds))}); "
                          "a checkpoint directory holds one kind")
    tensors.sort(key=lambda t: _natural_key(t.path))
    skipped.sort(key=lambda s: s.path)
    return ShardedLayout(file=root, tensors=tensors, skipped=skipped, framework="torch",
                         format=f"hf-{kinds.pop()}", index=index, shards=shards, shard_of=shard_of)
