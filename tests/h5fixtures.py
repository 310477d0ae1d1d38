"""Small HDF5 fixture files built in code, shared by every test module.

Each builder writes one file and returns what a test needs to check it (usually a
dict from dataset path to the exact array written). Import with
``from h5fixtures import ...`` (pytest puts ``tests/`` on ``sys.path``).

Builders
--------
``sample_values(dtype, shape, seed, specials)``  deterministic values of any supported dtype
``write_datasets(path, {name: array}, **kw)``    plain file from arrays (kw passed to create_dataset)
``dtype_zoo(path)``                               every supported dtype in both byte orders
``storage_zoo(path)``                             every storage kind, links, non-numeric datasets
``chunked_file(path, ...)``                       one chunked dataset with edge and unallocated chunks
``keras3_like / keras_legacy_like / tf_save_weights_like / torch_like / chainer_like``
                                                  hand-built mimics of framework layouts
``many_datasets(path, n)``                        ``n`` small datasets (layout-walk cost)
``not_hdf5(path)`` / ``truncated_copy(src, dst)`` broken inputs
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Mapping

import h5py
import numpy as np

__all__ = [
    "NUMERIC_DTYPES",
    "ALL_DTYPES",
    "sample_values",
    "write_datasets",
    "dtype_zoo",
    "storage_zoo",
    "chunked_file",
    "keras3_like",
    "keras_legacy_like",
    "tf_save_weights_like",
    "torch_like",
    "chainer_like",
    "many_datasets",
    "not_hdf5",
    "truncated_copy",
    "dtype_key",
    "FRAMEWORK_BUILDERS",
]

NUMERIC_DTYPES = ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")
# every supported dtype in both byte orders (one-byte types have one order), plus bool
ALL_DTYPES: tuple[np.dtype, ...] = tuple(
    dict.fromkeys(np.dtype(o + c) for c in NUMERIC_DTYPES for o in "<>")
) + (np.dtype(bool),)


def dtype_key(dtype: np.dtype) -> str:
    """A dataset-name-safe key for a dtype: 'f4_le', 'f4_be', 'i1', 'bool'."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return "bool"
    code = f"{dtype.kind}{dtype.itemsize}"
    if dtype.itemsize == 1:
        return code
    order = dtype.byteorder if dtype.byteorder != "=" else ("<" if np.little_endian else ">")
    return f"{code}_{'le' if order == '<' else 'be'}"


def sample_values(dtype: Any, shape: tuple[int, ...] = (3, 5), seed: int = 0, specials: bool = False) -> np.ndarray:
    """Deterministic, varied values of ``dtype`` (byte order kept).

    Floats are random normals with random signs; with ``specials`` the first elements are
    0, -0, inf, -inf, nan, the smallest subnormal and the largest finite value. Integers
    span the whole range of the type.
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype.kind == "f":
        vals = (rng.standard_normal(n) * 10.0).astype(dtype.newbyteorder("="))
        if specials:
            fi = np.finfo(dtype.newbyteorder("="))
            sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, fi.smallest_subnormal, fi.max], dtype=vals.dtype)
            k = min(n, len(sp))
            vals[:k] = sp[:k]
    elif dtype.kind in "iu":
        ii = np.iinfo(dtype.newbyteorder("="))
        vals = rng.integers(ii.min, ii.max, size=n, dtype=dtype.newbyteorder("="), endpoint=True)
    elif dtype.kind == "b":
        vals = rng.integers(0, 2, size=n).astype(bool)
    else:
        raise ValueError(f"no sample values for {dtype}")
    return vals.astype(dtype).reshape(shape)


def write_datasets(path: str | os.PathLike[str], datasets: Mapping[str, np.ndarray], **kwargs: Any) -> dict[str, np.ndarray]:
    """Write arrays as datasets (dtype and byte order kept); return ``{'/name': array}``."""
    out = {}
    with h5py.File(path, "w") as f:
        for name, arr in datasets.items():
            arr = np.asarray(arr)
            f.create_dataset(name, data=arr, dtype=arr.dtype, **kwargs)
            out["/" + name.lstrip("/")] = arr
    return out


def dtype_zoo(path: str | os.PathLike[str], shape: tuple[int, ...] = (3, 5), seed: int = 0,
              specials: bool = True, **kwargs: Any) -> dict[str, np.ndarray]:
    """Every supported dtype in both byte orders, one dataset each at ``/<dtype_key>``.

    ``kwargs`` go to ``create_dataset`` (e.g. ``chunks=(2, 2)`` for chunked variants).
    """
    arrays = {dtype_key(dt): sample_values(dt, shape, seed + i, specials) for i, dt in enumerate(ALL_DTYPES)}
    return write_datasets(path, arrays, **kwargs)


def chunked_file(path: str | os.PathLike[str], shape: tuple[int, ...] = (7, 10), chunks: tuple[int, ...] = (3, 4),
                 dtype: Any = "<f4", write_chunks: Any = "all", seed: int = 0, name: str = "x",
                 fillvalue: Any = None, userblock_size: int = 0) -> np.ndarray:
    """One chunked, unfiltered dataset ``/name`` (edge chunks when ``shape % chunks != 0``).

    ``write_chunks='all'`` writes every element; an int ``k`` writes only every ``k``-th
    chunk (in C order of the chunk grid), leaving the others unallocated. Returns the
    array h5py will read back (fill value where unwritten).
    """
    dtype = np.dtype(dtype)
    vals = sample_values(dtype, shape, seed)
    fill = np.zeros((), dtype=dtype) if fillvalue is None else np.asarray(fillvalue, dtype=dtype)
    expect = np.full(shape, fill, dtype=dtype)
    kw = {"userblock_size": userblock_size} if userblock_size else {}
    with h5py.File(path, "w", **kw) as f:
        d = f.create_dataset(name, shape=shape, chunks=chunks, dtype=dtype,
                             fillvalue=None if fillvalue is None else fill)
        if write_chunks == "all":
            d[...] = vals
            expect[...] = vals
        else:
            grid = tuple(-(-s // c) for s, c in zip(shape, chunks))
            for k, pos in enumerate(np.ndindex(*grid)):
                if k % int(write_chunks):
                    continue
                sl = tuple(slice(p * c, min((p + 1) * c, s)) for p, c, s in zip(pos, chunks, shape))
                d[sl] = vals[sl]
                expect[sl] = vals[sl]
    return expect


def storage_zoo(path: str | os.PathLike[str], seed: int = 0) -> dict[str, Any]:
    """One file with every storage kind, link kind and non-numeric dataset.

    Returns a dict with ``arrays`` (path → expected values of every numeric tensor, by
    canonical path), ``storage`` (canonical path → expected storage kind), ``aliases``
    (canonical path → all paths), ``skipped`` (path → reason substring) and ``side_files``
    (external raw file, external-link target).
    """
    path = os.fspath(path)
    base = os.path.splitext(path)[0]
    raw_name = base + ".raw.bin"
    target_name = base + ".target.h5"
    a = {k: sample_values(dt, shp, seed + i) for i, (k, dt, shp) in enumerate([
        ("contig", "<f4", (4, 6)), ("contig_be", ">f8", (5,)), ("chunked", "<i4", (7, 10)),
        ("chunked_be", ">f2", (9,)), ("sparse", "<f4", (6, 6)), ("gzip", "<f4", (20, 3)),
        ("shuffle_gzip", ">i2", (30,)), ("lzf", "<f8", (8, 8)), ("fletcher", "<u2", (10,)),
        ("compact", "<f4", (3,)), ("external", "<i8", (4,)), ("scalar", "<f8", ()),
        ("weights/kernel", "<f4", (3, 2)), ("flags", bool, (5,)), ("unwritten", "<f4", (4,)),
    ])}
    with h5py.File(target_name, "w") as t:
        t["remote"] = np.arange(3, dtype="<f4")
    with open(raw_name, "wb") as fh:
        fh.write(b"\x00" * 16)
        fh.write(a["external"].astype("<i8").tobytes())
    with h5py.File(path, "w") as f:
        f["contig"] = a["contig"]
        f["contig_be"] = a["contig_be"]
        f.create_dataset("chunked", data=a["chunked"], chunks=(3, 4))
        f.create_dataset("chunked_be", data=a["chunked_be"], chunks=(4,))
        sp = f.create_dataset("sparse", shape=(6, 6), chunks=(4, 4), dtype="<f4")
        sp[0:4, 0:4] = a["sparse"][0:4, 0:4]
        sp[4:6, 4:6] = a["sparse"][4:6, 4:6]
        sparse = np.zeros((6, 6), "<f4")
        sparse[0:4, 0:4] = a["sparse"][0:4, 0:4]
        sparse[4:6, 4:6] = a["sparse"][4:6, 4:6]
        a["sparse"] = sparse
        f.create_dataset("gzip", data=a["gzip"], compression="gzip", chunks=(5, 3))
        f.create_dataset("shuffle_gzip", data=a["shuffle_gzip"], compression="gzip", shuffle=True, chunks=(7,))
        f.create_dataset("lzf", data=a["lzf"], compression="lzf", chunks=(4, 4))
        f.create_dataset("fletcher", data=a["fletcher"], fletcher32=True, chunks=(10,))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        sid = h5py.h5s.create_simple((3,))
        h5py.h5d.create(f.id, b"compact", h5py.h5t.IEEE_F32LE, sid, dcpl=dcpl)
        f["compact"][...] = a["compact"]
        f.create_dataset("external", shape=(4,), dtype="<i8", external=[(raw_name, 16, 32)])
        f["scalar"] = a["scalar"]
        f.create_dataset("weights/kernel", data=a["weights/kernel"])
        f["flags"] = a["flags"]
        f.create_dataset("unwritten", shape=(4,), dtype="<f4")
        a["unwritten"] = np.zeros(4, "<f4")
        # links
        f["hard_alias"] = f["contig"]
        f["links/soft"] = h5py.SoftLink("/weights/kernel")
        f["links/dangling"] = h5py.SoftLink("/nowhere")
        f["links/ext"] = h5py.ExternalLink(os.path.basename(target_name), "/remote")
        # non-numeric
        f["text"] = np.array([b"ab", b"cd"])
        f.create_dataset("vlen_text", data=["x", "yy"], dtype=h5py.string_dtype())
        f["compound"] = np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")])
        f.create_dataset("refs", shape=(1,), dtype=h5py.ref_dtype)[0] = f["contig"].ref
        f.create_dataset("enum", data=np.array([0, 1, 2], "i1"),
                         dtype=h5py.enum_dtype({"a": 0, "b": 1, "c": 2}, basetype="i1"))
        f.create_dataset("vlen_int", shape=(2,), dtype=h5py.vlen_dtype(np.dtype("i4")))
        f.create_dataset("empty", shape=(0, 3), dtype="<f4")
        if np.dtype(np.longdouble).itemsize > 8:  # extended precision: not a supported word type
            f.create_dataset("f16x", data=np.zeros(2, np.longdouble))
    storage = {
        "/contig": "contiguous", "/contig_be": "contiguous", "/chunked": "chunked", "/chunked_be": "chunked",
        "/sparse": "chunked", "/gzip": "filtered", "/shuffle_gzip": "filtered", "/lzf": "filtered",
        "/fletcher": "filtered", "/compact": "compact", "/external": "external", "/scalar": "contiguous",
        "/weights/kernel": "contiguous", "/flags": "contiguous", "/unwritten": "unallocated",
    }
    aliases = {"/contig": ("/contig", "/hard_alias"), "/weights/kernel": ("/links/soft", "/weights/kernel")}
    canon = {"/contig": "/contig", "/weights/kernel": "/links/soft"}  # first in sorted order
    arrays = {canon.get("/" + k, "/" + k): v for k, v in a.items()}
    storage = {canon.get(k, k): v for k, v in storage.items()}
    aliases = {canon[k]: v for k, v in aliases.items()}
    skipped = {
        "/links/ext": "external link", "/links/dangling": "dangling", "/text": "string",
        "/vlen_text": "string", "/compound": "compound", "/refs": "reference", "/enum": "enum",
        "/vlen_int": "variable-length", "/empty": "empty",
    }
    if np.dtype(np.longdouble).itemsize > 8:
        skipped["/f16x"] = "dtype"
    return {"arrays": arrays, "storage": storage, "aliases": aliases, "skipped": skipped,
            "side_files": (raw_name, target_name)}


# ---------------------------------------------------------------------------------------------
# framework-layout mimics (hand-built; real framework files are generated in framework tests)


def _put(f: h5py.File, name: str, arr: np.ndarray) -> None:
    f.create_dataset(name, data=arr)


def keras3_like(path: str | os.PathLike[str], seed: int = 0) -> dict[str, str]:
    """Keras 3 ``.weights.h5`` layout: ``layers/<class>/vars/<i>`` and ``optimizer/vars/<i>``.

    Returns path → expected role.
    """
    r = np.random.default_rng(seed)
    roles = {}
    with h5py.File(path, "w") as f:
        def layer(group: str, name: str, shapes: list[tuple[int, ...]], rl: list[str]) -> None:
            g = f.require_group(f"layers/{group}/vars")
            g.attrs["name"] = name
            for i, (shp, role) in enumerate(zip(shapes, rl)):
                _put(g, str(i), r.standard_normal(shp).astype("f4"))
                roles[f"/layers/{group}/vars/{i}"] = role
        layer("conv2d", "conv", [(3, 3, 1, 4), (4,)], ["weight", "bias"])
        layer("batch_normalization", "bn", [(4,)] * 4, ["weight", "bias", "bn-statistic", "bn-statistic"])
        layer("dense", "dense", [(16, 3), (3,)], ["weight", "bias"])
        layer("dense_1", "head", [(3, 2)], ["weight"])
        f.require_group("layers/flatten/vars").attrs["name"] = "flatten"
        og = f.require_group("optimizer/vars")
        og.attrs["name"] = "adam"
        og["0"] = np.int64(7)
        roles["/optimizer/vars/0"] = "step-counter"
        og["1"] = np.float32(1e-3)
        roles["/optimizer/vars/1"] = "other"
        for i in range(2, 6):
            og[str(i)] = r.standard_normal((3, 2)).astype("f4")
            roles[f"/optimizer/vars/{i}"] = "optimizer-moment"
        f.require_group("vars").attrs["name"] = "sequential"
    return roles


def keras_legacy_like(path: str | os.PathLike[str], seed: int = 0, suffix: str = ":0",
                      prefix: str = "model_weights/") -> dict[str, str]:
    """Legacy Keras ``model.save('x.h5')`` layout (``model_weights/<l>/<l>/kernel:0`` ...).

    With ``prefix=''`` this is the tf.keras ``save_weights`` legacy layout (root attrs
    ``layer_names``/``weight_names``). Returns path → expected role.
    """
    r = np.random.default_rng(seed)
    roles = {}
    layers = {
        "conv1": [("kernel", (3, 3, 1, 4), "weight"), ("bias", (4,), "bias")],
        "bn1": [("gamma", (4,), "weight"), ("beta", (4,), "bias"), ("moving_mean", (4,), "bn-statistic"),
                ("moving_variance", (4,), "bn-statistic")],
        "dense": [("kernel", (16, 3), "weight"), ("bias", (3,), "bias")],
    }
    with h5py.File(path, "w") as f:
        top = f.require_group(prefix.rstrip("/")) if prefix else f
        top.attrs["layer_names"] = np.array([n.encode() for n in layers])
        top.attrs["backend"] = b"tensorflow"
        for lname, vs in layers.items():
            g = top.require_group(lname)
            g.attrs["weight_names"] = np.array([f"{lname}/{v}{suffix}".encode() for v, _, _ in vs])
            for v, shp, role in vs:
                name = f"{lname}/{v}{suffix}"
                _put(g, name, r.standard_normal(shp).astype("f4"))
                roles[f"/{prefix}{lname}/{name}"] = role
        if prefix:
            og = f.require_group("optimizer_weights")
            og["Adam/iterations" + suffix] = np.int64(12)
            roles["/optimizer_weights/Adam/iterations" + suffix] = "step-counter"
            og["Adam/learning_rate" + suffix] = np.float32(1e-3)
            roles["/optimizer_weights/Adam/learning_rate" + suffix] = "other"
            og["Adam/conv1/kernel/m" + suffix] = np.zeros((3, 3, 1, 4), "f4")
            roles["/optimizer_weights/Adam/conv1/kernel/m" + suffix] = "optimizer-moment"
            og["Adam/dense/bias/v" + suffix] = np.zeros((3,), "f4")
            roles["/optimizer_weights/Adam/dense/bias/v" + suffix] = "optimizer-moment"
    return roles


def tf_save_weights_like(path: str | os.PathLike[str], seed: int = 0) -> dict[str, str]:
    """tf.keras ``save_weights('x.h5')`` legacy layout (no ``model_weights`` prefix)."""
    return keras_legacy_like(path, seed, prefix="")


def torch_like(path: str | os.PathLike[str], seed: int = 0, with_attr: bool = True) -> dict[str, str]:
    """PyTorch state_dict through fastflip's layout: ``/model/<key>``, ``/optimizer/state/<id>/<name>``."""
    r = np.random.default_rng(seed)
    roles = {}
    model = {
        "conv1.weight": ((4, 1, 3, 3), "f4", "weight"), "conv1.bias": ((4,), "f4", "bias"),
        "bn1.weight": ((4,), "f4", "weight"), "bn1.bias": ((4,), "f4", "bias"),
        "bn1.running_mean": ((4,), "f4", "bn-statistic"), "bn1.running_var": ((4,), "f4", "bn-statistic"),
        "bn1.num_batches_tracked": ((), "i8", "step-counter"),
        "layer1.0.fc.weight": ((3, 16), "f4", "weight"), "layer1.0.fc.bias": ((3,), "f4", "bias"),
    }
    with h5py.File(path, "w") as f:
        if with_attr:
            f.attrs["fastflip_layout"] = "torch-state-dict/1"
        for k, (shp, dt, role) in model.items():
            _put(f, f"model/{k}", r.standard_normal(shp).astype(dt) if dt == "f4" else np.int64(5))
            roles[f"/model/{k}"] = role
        for pid in range(2):
            for name, role in (("exp_avg", "optimizer-moment"), ("exp_avg_sq", "optimizer-moment"),
                               ("step", "step-counter")):
                arr = np.float32(10) if name == "step" else r.standard_normal((4,)).astype("f4")
                _put(f, f"optimizer/state/{pid}/{name}", arr)
                roles[f"/optimizer/state/{pid}/{name}"] = role
        _put(f, "optimizer/param_groups/0/lr", np.float64(0.01))
        roles["/optimizer/param_groups/0/lr"] = "other"
    return roles


def chainer_like(path: str | os.PathLike[str], seed: int = 0, snapshot: bool = True) -> dict[str, str]:
    """Chainer ``serializers.save_hdf5`` layout (a trainer snapshot when ``snapshot``)."""
    r = np.random.default_rng(seed)
    roles = {}
    pre = "updater/model:main/predictor" if snapshot else "predictor"
    params = {
        "conv1/W": ((4, 1, 3, 3), "weight"), "conv1/b": ((4,), "bias"),
        "bn1/gamma": ((4,), "weight"), "bn1/beta": ((4,), "bias"),
        "bn1/avg_mean": ((4,), "bn-statistic"), "bn1/avg_var": ((4,), "bn-statistic"),
        "fc/W": ((3, 16), "weight"), "fc/b": ((3,), "bias"),
    }
    with h5py.File(path, "w") as f:
        for k, (shp, role) in params.items():
            _put(f, f"{pre}/{k}", r.standard_normal(shp).astype("f4"))
            roles[f"/{pre}/{k}"] = role
        _put(f, f"{pre}/bn1/N", np.int64(3))
        roles[f"/{pre}/bn1/N"] = "step-counter"
        if snapshot:
            opt = "updater/optimizer:main"
            _put(f, f"{opt}/t", np.int64(40))
            roles[f"/{opt}/t"] = "step-counter"
            _put(f, f"{opt}/epoch", np.int64(2))
            roles[f"/{opt}/epoch"] = "step-counter"
            for k in ("conv1/W", "fc/b"):
                for st in ("m", "v"):
                    _put(f, f"{opt}/predictor/{k}/{st}", np.zeros(params[k][0], "f4"))
                    roles[f"/{opt}/predictor/{k}/{st}"] = "optimizer-moment"
                _put(f, f"{opt}/predictor/{k}/t", np.int64(40))
                roles[f"/{opt}/predictor/{k}/t"] = "step-counter"
            _put(f, "updater/iterator:main/current_position", np.int64(0))
            roles["/updater/iterator:main/current_position"] = "other"
    return roles


# name → builder of a hand-built framework-layout mimic (each returns path → expected role)
FRAMEWORK_BUILDERS = {
    "keras3": keras3_like,
    "keras-legacy": keras_legacy_like,
    "tf-save-weights": tf_save_weights_like,
    "torch": torch_like,
    "chainer": chainer_like,
}


def many_datasets(path: str | os.PathLike[str], n: int, shape: tuple[int, ...] = (4,), groups: int = 10) -> None:
    """``n`` small float32 datasets spread over ``groups`` groups (for layout-walk cost)."""
    with h5py.File(path, "w") as f:
        for i in range(n):
            f.create_dataset(f"g{i % groups}/d{i}", data=np.full(shape, i, "f4"))


def not_hdf5(path: str | os.PathLike[str], content: bytes = b"this is not an HDF5 file\n" * 10) -> str:
    """A file that is not HDF5."""
    with open(path, "wb") as fh:
        fh.write(content)
    return os.fspath(path)


def truncated_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str], keep: float = 0.5) -> str:
    """A copy of ``src`` cut to ``keep`` of its size (the signature survives, the rest does not)."""
    shutil.copyfile(src, dst)
    size = os.path.getsize(dst)
    with open(dst, "r+b") as fh:
        fh.truncate(max(64, int(size * keep)))
    return os.fspath(dst)
