"""Files read by the frameworks' own loaders, as readings for :mod:`framework_judge` ({fastflip path: array}).

Each view calls the framework alone (no fastflip reader): ``h5py``, ``np.load``, ``safetensors.numpy`` /
``safetensors.torch``, ``torch.load(weights_only=True)``, and Keras's ``load_model`` (its weights as Keras
writes them again). Names are fastflip's tensor paths: ``/`` + the framework's key (an HDF5 dataset's path, a
state-dict key path joined by ``/``). Arrays the framework returns sharing memory keep sharing it.
"""

from __future__ import annotations

import io
import os
import zipfile
from typing import Callable

import h5py
import numpy as np

from conftest import require

__all__ = ["h5_view", "np_view", "st_numpy_view", "st_torch_view", "torch_view", "keras_view", "h5_group_view",
           "keras_h5_value",
           "big_endian_archive", "state_dict_view", "assert_valid_zip", "dir_view"]


def keras_h5_value(ds: h5py.Dataset) -> np.ndarray | None:
    """A dataset as Keras 3's weights loader reads it (``H5IOStore.__getitem__``): ``np.array(ds,
    dtype=ml_dtypes.bfloat16)`` when its ``dtype`` attribute equals ``"bfloat16"`` (here as its uint16 words, as
    readings hold a format NumPy lacks); None for any other dataset (h5py's reading applies)."""
    if "dtype" in ds.attrs and ds.attrs["dtype"] == "bfloat16":
        import ml_dtypes

        return np.array(ds, dtype=ml_dtypes.bfloat16).view(np.uint16)
    return None


def h5_group_view(g: h5py.Group, prefix: str = "", out: dict | None = None, seen: dict | None = None, *,
                  keras: bool = False) -> dict:
    """Every numeric dataset under every hard link of ``g``; the names of one dataset share one array. ``keras``:
    a dataset is read as Keras 3's weights loader reads it (:func:`keras_h5_value`: bfloat16 variables)."""
    out = {} if out is None else out
    seen = {} if seen is None else seen
    for name in g:
        if not isinstance(g.get(name, getlink=True), h5py.HardLink):
            continue
        obj = g[name]
        if isinstance(obj, h5py.Group):
            h5_group_view(obj, f"{prefix}/{name}", out, seen, keras=keras)
        elif keras and obj.shape is not None and (words := keras_h5_value(obj)) is not None:
            out[f"{prefix}/{name}"] = seen.setdefault(obj.id, words)
        elif obj.dtype.kind in "fiub" and obj.shape is not None:
            if obj.id not in seen:
                seen[obj.id] = obj[()]
                if not isinstance(seen[obj.id], np.ndarray):  # a scalar dataset
                    seen[obj.id] = np.asarray(seen[obj.id])
            out[f"{prefix}/{name}"] = seen[obj.id]
    return out


def h5_view(path: str) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return h5_group_view(f)


def np_view(path: str) -> dict[str, np.ndarray]:
    """``np.load`` of an ``.npy`` (the name ``/array``) or ``.npz`` (``/`` + member name), no pickles."""
    got = np.load(path, allow_pickle=False)
    if isinstance(got, np.ndarray):
        return {"/array": got}
    with got as z:
        return {"/" + k: z[k] for k in z.files}


def st_numpy_view(path: str) -> dict[str, np.ndarray]:
    st = require("safetensors.numpy")
    return {"/" + k: v for k, v in st.load_file(path).items()}


def st_torch_view(path: str) -> dict[str, np.ndarray]:
    """``safetensors.torch.load_file``; bfloat16 and float8 as their stored words."""
    from test_formats_other import st_load

    return st_load(path)


def torch_view(path: str) -> dict[str, np.ndarray]:
    """``torch.load(weights_only=True)``, nested containers flattened (a tensor subclass as its ``__tensor_flatten__``
    inner tensors, ``/<key>.<name>``); bfloat16 and float8 as their stored words."""
    from test_formats_torch import torch_load

    return torch_load(path)


def dir_view(d: str, safetensors: Callable[[str], dict[str, np.ndarray]] = st_torch_view) -> dict[str, np.ndarray]:
    """Every weight file of a checkpoint directory (``save_pretrained``'s) read by the framework that wrote it:
    ``*.safetensors`` by ``safetensors`` (:func:`st_torch_view`, or :func:`st_numpy_view` without PyTorch),
    ``*.bin`` shards by ``torch.load(weights_only=True)``; names are unique across the files (the index's)."""
    out: dict[str, np.ndarray] = {}
    for f in sorted(os.listdir(d)):
        if f.endswith((".safetensors", ".bin")):
            part = (safetensors if f.endswith(".safetensors") else torch_view)(os.path.join(d, f))
            assert not set(part) & set(out), f"{f}: names another file holds too"
            out.update(part)
    return out


def keras_view(path: str, tmp: str) -> dict[str, np.ndarray]:
    """Keras's reading of a ``.keras`` archive: ``keras.saving.load_model``, then the weights as Keras saves them
    again (``model.save`` into ``tmp``), named by their path in ``model.weights.h5``."""
    keras = require("keras")
    model = keras.saving.load_model(path)
    again = os.path.join(tmp, "keras-view.keras")
    model.save(again)
    with zipfile.ZipFile(again) as z, h5py.File(io.BytesIO(z.read("model.weights.h5")), "r") as f:
        return h5_group_view(f, keras=True)


def big_endian_archive(little: str, big: str, itemsize: int = 4) -> None:
    """Rewrite the ``torch.save`` archive ``little`` as a big-endian machine writes it: the ``byteorder`` entry
    ``big``, every storage's words (all ``itemsize`` bytes wide) byte-swapped; ``torch.load`` swaps them back."""
    with zipfile.ZipFile(little) as zin, zipfile.ZipFile(big, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/byteorder"):
                data = b"big"
            elif "/data/" in info.filename and not info.filename.endswith("serialization_id"):
                data = np.frombuffer(data, f"<u{itemsize}").astype(f">u{itemsize}").tobytes()
            zout.writestr(info, data)


def state_dict_view(state_dict: dict) -> dict[str, np.ndarray]:
    """A live ``state_dict`` (``from_pretrained``'s, ``load_state_dict``'s) as a reading: ``/`` + key; tensors
    sharing storage (tied weights) share memory; bfloat16 and float8 as their stored words."""
    from test_formats_torch import _flat

    return _flat(state_dict)


def assert_valid_zip(path: str | os.PathLike[str]) -> None:
    """``zipfile``'s reading of a zip container (``torch.save``, ``.npz``, ``.keras``): a zip whose every entry
    matches its CRC-32 (``torch.load`` and ``np.load`` do not check them)."""
    assert zipfile.is_zipfile(path), f"{path}: not a zip archive"
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()
    assert bad is None, f"{path}: entry {bad} does not match its CRC-32"
