"""One builder of small checkpoints in each file format the file tests inject into.

:func:`write_checkpoint` writes named arrays as HDF5 (plain, or chunked and filtered), safetensors, ``.npz``
(stored or deflated), ``torch.save`` or a Keras 3 ``.keras`` archive; each test keeps its own data and names.
Pure NumPy/h5py, plus safetensors or torch where the format needs them (``require`` skips without them).
"""

from __future__ import annotations

import os
import zipfile
from typing import Any, Mapping

import h5py
import numpy as np

from conftest import require

__all__ = ["EXTENSION", "write_checkpoint"]

EXTENSION = {"hdf5": "h5", "safetensors": "safetensors", "npz": "npz", "torch": "pt", "keras": "keras"}


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
