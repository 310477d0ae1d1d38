"""One builder of small checkpoints in each file format the file tests inject into.

:func:`write_checkpoint` writes named arrays as HDF5 (plain, or chunked and filtered), safetensors, ``.npz``
(stored or deflated), ``torch.save`` or a Keras 3 ``.keras`` archive; each test keeps its own data and names.
Pure NumPy/h5py, plus safetensors or torch where the format needs them (``require`` skips without them).
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from typing import Any, Mapping

import h5py
import numpy as np

from conftest import require

__all__ = ["EXTENSION", "INDEX", "write_checkpoint", "write_checkpoint_dir", "copy_checkpoint"]

EXTENSION = {"hdf5": "h5", "safetensors": "safetensors", "npz": "npz", "torch": "pt", "keras": "keras"}
INDEX = "model.safetensors.index.json"  # a sharded checkpoint directory's index


def write_checkpoint(fmt: str, path: str | os.PathLike[str], tensors: Mapping[str, np.ndarray], *,
                     compressed: bool = False, **h5_options: Any) -> str:
    """Write ``tensors`` (name → array) to ``path`` in ``fmt``; the path as a string.

    ``fmt``: ``hdf5`` (dotted names become groups; ``h5_options`` such as ``chunks``, ``compression``,
    ``shuffle`` go to ``create_dataset``), ``safetensors``, ``npz`` (``compressed``: ``np.savez_compressed``),
    ``torch`` or ``keras`` (a ``.keras`` zip whose ``model.weights.h5`` holds the arrays, in order, as
    ``layers/dense/vars/<i>``).
    """
    p = os.fspath(path)
    if fmt == "hdf5":
        with h5py.File(p, "w") as f:
            for name, a in tensors.items():
                f.create_dataset(name.replace(".", "/"), data=a, **h5_options)
    elif fmt == "safetensors":
        require("safetensors")
        from safetensors.numpy import save_file

        save_file(dict(tensors), p)
    elif fmt == "npz":
        with open(p, "wb") as fh:
            (np.savez_compressed if compressed else np.savez)(fh, **tensors)
    elif fmt == "torch":
        torch = require("torch")
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, p)
    elif fmt == "keras":
        inner = p + ".inner.h5"
        write_checkpoint("hdf5", inner, {f"layers/dense/vars/{i}": a for i, a in enumerate(tensors.values())})
        with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("metadata.json", '{"keras_version": "3"}')
            z.writestr("config.json", '{"class_name": "Sequential"}')
            z.write(inner, "model.weights.h5")
        os.unlink(inner)
    else:
        raise ValueError(f"no builder for format {fmt!r}")
    return p


def copy_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str:
    """A fresh copy of a checkpoint (a file, or a directory tree) at ``dst``; ``dst`` as a string."""
    d = os.fspath(dst)
    (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, d)
    return d


def write_checkpoint_dir(d: str | os.PathLike[str], n_shards: int = 3, rows: int = 64) -> str:
    """A ``save_pretrained``-style checkpoint directory at ``d``: ``n_shards`` safetensors shards (a ``rows`` x 32
    weight and a bias, float32, drawn from a fixed seed), the index naming each tensor's shard, and a
    ``config.json``; ``d`` as a string."""
    require("safetensors")
    from safetensors.numpy import save_file

    d = os.fspath(d)
    os.makedirs(d)
    rng = np.random.default_rng(0)
    weight_map = {}
    for k in range(1, n_shards + 1):
        shard = f"model-{k:05d}-of-{n_shards:05d}.safetensors"
        tensors = {f"layer{k}.weight": rng.standard_normal((rows, 32)).astype("f4"),
                   f"layer{k}.bias": rng.standard_normal(32).astype("f4")}
        save_file(tensors, os.path.join(d, shard))
        weight_map.update(dict.fromkeys(tensors, shard))
    with open(os.path.join(d, INDEX), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    with open(os.path.join(d, "config.json"), "w") as fh:
        fh.write('{"model_type": "tiny"}')
    return d
