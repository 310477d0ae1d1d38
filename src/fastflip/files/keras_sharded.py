"""Keras 3 sharded weights (``model.save_weights("m.weights.json", max_shard_size=...)``) read as Keras reads them.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Keras 3 writes a model's weights larger than ``max_shard_size`` as a JSON index ``m.weights.json`` and HDF5 shards
beside it, ``m_00000.weights.h5``, ``m_00001.weights.h5``, ... Each shard holds datasets at the paths the unsharded
``m.weights.h5`` holds them (``/layers/dense/vars/0``); the index's ``weight_map`` maps each variables group
(``/layers/dense/vars``, ``/vars`` for the model's own) to the shard, or the list of shards, holding its datasets (a
layer's variables may be split over two shards). ``model.load_weights("m.weights.json")`` (Keras's
``ShardedH5IOStore``) opens ``<base>_00000.weights.h5`` first, then, per object, the shards the index lists for its
group, and reads each variable from the first listed shard that holds it.

:func:`read_keras_sharded` reads such a set (the index, or a directory holding exactly one ``*.weights.json``) as one
:class:`~fastflip.files.formats.hfdir.ShardedLayout`: every dataset under its path (the same names as in the
unsharded ``.weights.h5``, so a plan or seed carries over between the two saves of one model), each read from its
shard by the HDF5 reader (bfloat16 variables as Keras reads them), in the natural order of the paths. The sharded
checkpoint machinery (:mod:`fastflip.files.sharded`) then injects, replays and reverts it as one model; an output
is a directory holding the index and every shard under their names (Keras finds the shards by the names in the
index, and opens ``<base>_00000.weights.h5`` by the index's own name).

Refused in one line, because Keras would refuse the set or load other values than the shards hold: an index that is
not JSON or has no ``weight_map`` mapping; a shard named by other than a non-empty file name (or list of distinct
ones) beside the index; a missing or non-HDF5 shard, ``<base>_00000.weights.h5`` included (a missing later shard:
Keras loads without an error and leaves every layer the index places in it as it was); a dataset in two shards
(Keras counts the group's variables twice and refuses it). Refused too, though Keras loads such a set as saved,
because the index and its shards disagree: a key that is not a variables group Keras writes (``/.../vars``); a shard
holding a dataset the index does not list in that shard (Keras never reads it), or listed for a group it holds
nothing of.

Examples
--------
>>> import os, json, tempfile, numpy as np, h5py
>>> d = tempfile.mkdtemp()
>>> for k, grp in enumerate(["/layers/dense/vars", "/layers/dense_1/vars"]):
...     with h5py.File(os.path.join(d, f"m_0000{k}.weights.h5"), "w") as f:
...         _ = f.create_dataset(grp + "/0", data=np.ones(3, "<f4"))
>>> wm = {"/layers/dense/vars": ["m_00000.weights.h5"], "/layers/dense_1/vars": ["m_00001.weights.h5"]}
>>> _ = open(os.path.join(d, "m.weights.json"), "w").write(json.dumps({"weight_map": wm}))
>>> from fastflip.files.layout import read_layout
>>> lay = read_layout(os.path.join(d, "m.weights.json"))
>>> [(t.path, lay.shard_of[t.path]) for t in lay.tensors]
[('/layers/dense/vars/0', 'm_00000.weights.h5'), ('/layers/dense_1/vars/0', 'm_00001.weights.h5')]
"""

from __future__ import annotations

import contextlib
import os
from pathlib import PurePath
from typing import Any, Callable, Sequence

from ..core.records import Layout, Skipped, Tensor
from ..core.records import natural_key as _natural_key
from ..errors import FormatError
from .formats.hfdir import ShardedLayout, index_weight_map, place_tensors, plain_name
from .h5open import open_h5
from .roles import annotate

__all__ = ["KERAS_SHARDED_FORMAT", "first_shard", "read_keras_sharded"]

KERAS_SHARDED_FORMAT = "keras-sharded"


def first_shard(index: str) -> str:
    """The shard Keras opens first when it reads the index file named ``index``: ``<base>_00000.weights.h5``,
    ``<base>`` being the index's stem with every ``.weights`` removed, as Keras's ``ShardedH5IOStore`` names it.

    >>> first_shard("m.weights.json")
    'm_00000.weights.h5'
    """
    return f"{PurePath(index).stem.replace('.weights', '')}_00000.weights.h5"


def _shard_names(ip: str, key: str, value: object) -> list[str]:
    """The shards the index lists for group ``key``, as Keras reads them (one name, or a list), each a plain file name
    beside the index."""
    names = value if isinstance(value, list) else [value]
    if not names:
        raise FormatError(f"{ip}: weight_map lists no shard for {key!r}; Keras cannot load that group")
    for name in names:
        plain_name(ip, name, f" for {key!r}, not a file name beside the index; Keras reads shards beside the index "
                   "only")
    if len(set(names)) < len(names):
        raise FormatError(f"{ip}: weight_map lists a shard twice for {key!r}; Keras counts that shard's variables "
                          "twice and refuses to load the group")
    return list(names)


def _weight_map(ip: str) -> dict[str, list[str]]:
    """The index's ``weight_map``: variables group → its shards in Keras's order of reading."""
    wm = index_weight_map(ip, "give the .weights.json that Keras's save_weights(..., max_shard_size=...) wrote")
    out = {}
    for key, value in wm.items():
        if not (key == "/vars" or (key.startswith("/") and key.endswith("/vars") and "//" not in key)):
            raise FormatError(f"{ip}: weight_map key {key!r} is not a variables group Keras writes (/.../vars)")
        out[key] = _shard_names(ip, key, value)
    return out


class _Shards:
    """The shards of one set seen as one HDF5 file by :func:`fastflip.files.roles.annotate`: an object's attributes
    (a layer's ``name``, which Keras writes on the ``vars`` group of the first shard holding it) from the first
    shard that has the object with attributes."""

    def __init__(self, files: Sequence[Any]) -> None:
        self.files = files

    def get(self, path: str) -> Any:
        found = [f.get(path) for f in self.files]
        found = [o for o in found if o is not None]
        return next((o for o in found if len(o.attrs)), found[0] if found else None)


def _annotate_across(root: str, shards: Sequence[str], tensors: list[Tensor]) -> list[Tensor]:
    """``tensors`` labelled (layer, role) as in the unsharded file: a layer's variables split over two shards are
    judged together (a bias is a bias beside its kernel), its name read from whichever shard holds it."""
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open_h5(os.path.join(root, s))) for s in shards]
        return annotate(tensors, _Shards(files), framework="keras3")


def read_keras_sharded(index_path: str | os.PathLike[str], read_shard: Callable[[str], Layout]) -> ShardedLayout:
    """One :class:`~fastflip.files.formats.hfdir.ShardedLayout` of a Keras sharded save, given its index file.

    ``read_shard`` reads one HDF5 shard's :class:`~fastflip.core.records.Layout` (the HDF5 reader of
    :mod:`fastflip.files.layout`, unannotated: the set's tensors are labelled here, across its shards). See the
    module docstring for what is refused.

    Raises
    ------
    FormatError
        A set Keras would refuse or read otherwise.
    """
    ip = os.path.abspath(os.fspath(index_path))
    root, index = os.path.dirname(ip), os.path.basename(ip)
    wm = _weight_map(ip)
    first = first_shard(index)
    names = list(dict.fromkeys([first] + [n for v in wm.values() for n in v]))
    shards: dict[str, Layout] = {}
    shard_of: dict[str, str] = {}
    tensors: list[Tensor] = []
    skipped: list[Skipped] = []
    holds: dict[str, set[str]] = {}  # variables group -> the shards holding a dataset of it
    for name in names:
        sp = os.path.join(root, name)
        if not os.path.isfile(sp):
            why = "Keras opens it first when it reads the index" if name == first else f"listed by {index}"
            raise FormatError(f"{sp}: shard missing ({why}); the Keras sharded checkpoint is incomplete")
        lay = shards[name] = read_shard(sp)
        held = {a for t in lay.tensors for a in t.aliases} | {s.path for s in lay.skipped}
        for a in sorted(held, key=_natural_key):
            group = a.rsplit("/", 1)[0] or "/"
            holds.setdefault(group, set()).add(name)
            if name not in wm.get(group, ()):
                raise FormatError(f"{sp}: holds {a!r}, which {index} does not list in this shard; Keras never reads "
                                  "it (the index and its shards disagree)")
        place_tensors(lay, name, shard_of, tensors, skipped, lambda a, other: f"{sp}: variable {a!r} is also in "
                      f"{other}; Keras counts the group's variables twice and refuses to load it")
    for key, listed in wm.items():
        lacking = [n for n in listed if n not in holds.get(key, set())]
        if lacking:
            raise FormatError(f"{os.path.join(root, lacking[0])}: holds no variable of {key!r}, which {index} places "
                              "there; the index and its shards disagree")
    tensors = sorted(_annotate_across(root, names, tensors), key=lambda t: _natural_key(t.path))
    skipped.sort(key=lambda s: s.path)
    return ShardedLayout(file=root, tensors=tensors, skipped=skipped, framework="keras3",
                         format=KERAS_SHARDED_FORMAT, index=index, shards=shards, shard_of=shard_of)

