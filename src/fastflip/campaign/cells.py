"""A campaign's target tensors and its grid of cells.

The target's tensors are described by :class:`fastflip.layout.Tensor` records (an
HDF5 checkpoint through :func:`fastflip.layout.read_layout`; a factory's named arrays
through the same record, labelled by :func:`fastflip.roles.label_path`), filtered by
the campaign's :class:`fastflip.select.Selection`. :func:`expand_cells` then builds
the grid bits × group × flips × fault × epoch; a cell's *population* is its number of
(element, bit) sites, the ``N`` of the Leveugle sample size.

Examples
--------
>>> import numpy as np
>>> from fastflip.campaign.config import Campaign
>>> c = Campaign.from_dict({"name": "x", "seed": 1, "target": {"factory": "m:f"},
...     "cells": {"bits": ["31", "0-22"], "group_by": "tensor"}, "trials": {"per_cell": 5},
...     "evaluator": {"function": "m:e"}})
>>> ts = tensors_from_arrays({"a": np.zeros(3, "f4"), "b": np.zeros((2, 2), "f4")})
>>> [(x.key, x.population) for x in expand_cells(c, {None: ts})]
[('bits=31|tensor=a|flips=1|fault=flip', 3), ('bits=31|tensor=b|flips=1|fault=flip', 4), ('bits=0-22|tensor=a|flips=1|fault=flip', 69), ('bits=0-22|tensor=b|flips=1|fault=flip', 92)]
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import OptionError
from ..layout import Tensor
from .config import Campaign

__all__ = [
    "Cell",
    "import_object",
    "tensors_from_refs",
    "tensors_from_arrays",
    "call_factory",
    "target_tensors",
    "expand_cells",
    "planned_counts",
    "input_hashes",
    "target_digest",
]


def import_object(spec: str, paths: Sequence[str] = ()) -> Any:
    """Import ``module:attribute`` (``paths`` are put on ``sys.path`` first)."""
    for p in paths:
        if p not in sys.path:
            sys.path.insert(0, p)
    modname, _, attr = spec.partition(":")
    if not modname or not attr:
        raise OptionError(f"{spec!r}: expected 'module:function'")
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:
        raise OptionError(f"cannot import module {modname!r} for {spec!r}: {exc}") from exc
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise OptionError(f"module {modname!r} has no attribute {attr!r}") from None
    return obj


def tensors_from_refs(refs: Sequence[Any]) -> list[Tensor]:
    """:class:`~fastflip.layout.Tensor` records for live tensors' refs (layer and role guessed from names)."""
    from ..roles import detect_framework, label_path

    aliases = [r.name if r.name.startswith("/") else "/" + r.name for r in refs]
    framework = detect_framework(aliases)
    out = []
    for ref, alias in zip(refs, aliases):
        dtype = np.dtype(ref.dtype)
        layer, role = label_path(alias, framework, len(ref.shape), dtype.kind)
        out.append(Tensor(ref.name, (alias,), dtype, tuple(ref.shape), int(ref.size), "memory",
                          nbytes=int(ref.size) * dtype.itemsize, layer=layer, role=role))
    return out


def tensors_from_arrays(arrays: Mapping[str, Any]) -> list[Tensor]:
    """:class:`~fastflip.layout.Tensor` records for named in-memory arrays."""
    from ..plan import TensorRef

    return tensors_from_refs([TensorRef(n, np.asarray(a).dtype.str, np.shape(a)) for n, a in arrays.items()])


def call_factory(campaign: Campaign) -> Any:
    """Call the target factory: a dict of arrays, a PyTorch module or a Keras model."""
    assert campaign.target.factory is not None
    fn = import_object(campaign.target.factory, [campaign.resolve(p) for p in campaign.paths])
    obj = fn()
    if obj is None or (isinstance(obj, Mapping) and not obj):
        raise OptionError(f"target factory {campaign.target.factory} returned nothing to inject into")
    return obj


def target_tensors(campaign: Campaign, epoch: int | None = None, obj: Any = None) -> list[Tensor]:
    """The campaign's selected tensors (of one epoch's checkpoint, or of the factory's model)."""
    from ..select import Selection, select

    if campaign.target.checkpoint is not None:
        from ..layout import read_layout

        tensors = read_layout(campaign.checkpoint_path(epoch)).tensors
    else:
        from ..live import targets

        tensors = targets(obj if obj is not None else call_factory(campaign)).records()  # names, layers, roles
    return select(tensors, Selection.from_dict(campaign.select))


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: the sites a trial draws from and how many it flips."""

    bits: str
    group_by: str
    group: str | None
    tensors: tuple[str, ...]
    flips: int
    fault: str
    epoch: int | None
    population: int

    @property
    def key(self) -> str:
        parts = [f"bits={self.bits}"]
        if self.group_by != "none":
            parts.append(f"{self.group_by}={self.group}")
        parts += [f"flips={self.flips}", f"fault={self.fault}"]
        if self.epoch is not None:
            parts.append(f"epoch={self.epoch}")
        return "|".join(parts)

    def row(self, planned: int) -> dict[str, Any]:
        """The store's ``cells`` row."""
        return {
            "key": self.key, "bits": self.bits, "grp": self.group, "group_by": self.group_by, "flips": self.flips,
            "fault": self.fault, "epoch": self.epoch, "planned": int(planned), "population": self.population,
        }


def _group_of(t: Tensor, group_by: str) -> str | None:
    if group_by == "none":
        return None
    if group_by == "tensor":
        return t.path
    value = getattr(t, group_by)
    return value if value is not None else "(none)"


def expand_cells(campaign: Campaign, tensors_by_epoch: Mapping[int | None, Sequence[Tensor]]) -> list[Cell]:
    """The grid in a fixed order: bits, then group (first appearance), flips, fault, epoch."""
    from ..bits import BitSpec
    from ..dtypes import word_type

    spec = campaign.cells
    epochs: list[int | None] = list(spec.epochs) if spec.epochs else [None]
    grouped: dict[int | None, dict[str | None, list[Tensor]]] = {}
    order: list[str | None] = []
    for epoch in epochs:
        groups: dict[str | None, list[Tensor]] = {}
        for t in tensors_by_epoch[epoch]:
            g = _group_of(t, spec.group_by)
            groups.setdefault(g, []).append(t)
            if g not in order:
                order.append(g)
        grouped[epoch] = groups
    cells: list[Cell] = []
    for bits in spec.bits:
        bitspec = BitSpec.parse(bits)
        for group in order:
            for flips in spec.flips:
                for fault in spec.faults:
                    for epoch in epochs:
                        # named fields select the tensors that have them (no exponent in an int64 counter)
                        members = [t for t in grouped[epoch].get(group) or ()
                                   if not bitspec.missing_fields(word_type(t.dtype, t.format))]
                        if not members:
                            continue
                        population = 0
                        for t in members:
                            try:
                                population += t.size * len(bitspec.resolve(word_type(t.dtype, t.format)))
                            except Exception as exc:  # a field the dtype lacks (e.g. 'exponent' of an int)
                                raise OptionError(
                                    f"[cells] bits {bits!r} does not apply to {t.path} ({t.dtype}): {exc}"
                                ) from exc
                        if population:
                            names = tuple(t.path for t in members)
                            cells.append(Cell(bits, spec.group_by, group, names, flips, fault, epoch, population))
    if not cells:
        raise OptionError("the campaign has no cell: no selected tensor has any of the requested bits")
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        raise OptionError("[cells]: two cells have the same key (a bit spec or fault listed twice?)")
    return cells


def planned_counts(campaign: Campaign, cells: Sequence[Cell]) -> list[int]:
    """Trials to run per cell: fixed, Leveugle sample size, or the sequential cap."""
    from ..stats import sample_size

    tr = campaign.trials
    if tr.per_cell is not None:
        return [int(tr.per_cell)] * len(cells)
    if tr.margin is not None:
        return [sample_size(c.population, margin=tr.margin, confidence=tr.confidence, p=tr.p) for c in cells]
    return [int(tr.max_per_cell)] * len(cells)


def target_digest(obj: Any) -> str | None:
    """SHA-256 over a factory target's tensors (names, dtypes, shapes, bytes); None when unknown.

    Mappings of arrays and PyTorch modules are covered; for other models (Keras) None.

    >>> target_digest({"a": np.zeros(2, "f4")}) == target_digest({"a": np.zeros(2, "f4")})
    True
    """
    if isinstance(obj, Mapping):
        items = [(str(k), np.asarray(v)) for k, v in obj.items()]
    elif type(obj).__module__.startswith("torch") and hasattr(obj, "state_dict"):
        items = [(k, v.detach().cpu().numpy()) for k, v in obj.state_dict().items()]
    else:
        return None
    h = hashlib.sha256()
    for name, a in items:
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data if a.size else b"")
    return h.hexdigest()


def input_hashes(campaign: Campaign, obj: Any = None) -> dict[str, str]:
    """SHA-256 of every checkpoint the campaign reads, or of the factory's tensors (``obj``).

    Stored with the campaign: a resumed sweep (and every worker) checks that its input is
    the same, so that no store mixes results of two different targets.
    """
    if campaign.target.checkpoint is None:
        digest = target_digest(obj if obj is not None else call_factory(campaign))
        return {} if digest is None else {"factory": digest}
    epochs: list[int | None] = list(campaign.cells.epochs) if campaign.cells.epochs else [None]
    out = {}
    for e in epochs:
        path = campaign.checkpoint_path(e)
        h = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    h.update(block)
        except OSError as exc:
            raise OptionError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from exc
        out[os.path.basename(path) if e is None else f"epoch {e}"] = h.hexdigest()
    return out

