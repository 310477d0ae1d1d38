"""A campaign's target tensors and its grid of cells.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

The target's tensors are described by :class:`fastflip.files.layout.Tensor` records (an
HDF5 checkpoint through :func:`fastflip.files.layout.read_layout`; a factory's named arrays
through the same record, labelled by :func:`fastflip.files.roles.label_path`), filtered by
the campaign's :class:`fastflip.files.select.Selection`. :func:`expand_cells` then builds
the grid bits × group × flips × fault × epoch; a cell's *population* is its number of
site units: (element, bit) pairs for single-bit models (flip, single stuck-at), elements
for the others (whose bits are then chosen inside the element).

Sampling design (:func:`trial_sites`): within a cell, trial ``i`` flipping ``k`` sites
takes the positions ``i*k … i*k+k-1`` of a keyed permutation of the cell's site units
(:class:`fastflip.core.permutation.Permutation`, key ``(seed, cell, pass)``), so trials draw
distinct sites, without replacement across trials, and any trial is regenerated from
(seed, cell, trial) alone. After ``population // k`` trials a new pass starts with a new
permutation. When a trial is one deterministic site (a single-bit model, ``zero``,
``scale`` or a fixed ``mask``, one flip per trial), the trials are a simple random sample
without replacement of the population: the finite-population correction applies
(``fpc_population``), and a cell whose population is no larger than its planned trials
runs every site once (``exhaustive``: its rate is exact). With ``distribution =
'tensor'`` sites are drawn independently (``independent``: no correction).

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
>>> planned_counts(c, expand_cells(c, {None: ts}))  # per_cell = 5: cells of 3 and 4 sites run exhaustively
[3, 4, 5, 5]
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.bits import BitSpec
from ..core.dtypes import word_type
from ..core.faults import FaultModel
from ..core.permutation import Permutation
from ..core.plan import TensorRef
from ..core.spec import Sampling
from ..errors import CapacityError, OptionError
from ..files.layout import Tensor, read_layout
from ..files.roles import detect_framework, label_path
from ..files.select import Selection, select
from ..files.sharded import checkpoint_dir_sha256, is_checkpoint_dir
from ..live import targets
from ..live.activations import layer_outputs
from .config import Campaign
from .evaluate import import_object, make_evaluator
from .stats import sample_size

__all__ = [
    "Cell",
    "import_object",
    "tensors_from_refs",
    "tensors_from_arrays",
    "call_factory",
    "target_tensors",
    "activation_tensors",
    "expand_cells",
    "planned_counts",
    "cell_notes",
    "trial_sites",
    "block_trial_sites",
    "SAMPLING_DESIGNS",
    "input_hashes",
    "target_digest",
]


def tensors_from_refs(refs: Sequence[Any]) -> list[Tensor]:
    """:class:`~fastflip.files.layout.Tensor` records for live tensors' refs (layer and role guessed from names)."""
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
    """:class:`~fastflip.files.layout.Tensor` records for named in-memory arrays."""
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
    if campaign.target.kind == "activations":
        return activation_tensors(campaign, obj if obj is not None else call_factory(campaign))
    if campaign.target.checkpoint is not None:
        tensors = read_layout(campaign.checkpoint_path(epoch)).tensors
    else:
        tensors = targets(obj if obj is not None else call_factory(campaign)).records()  # names, layers, roles
    return select(tensors, Selection.from_dict(campaign.select))


def activation_tensors(campaign: Campaign, model: Any) -> list[Tensor]:
    """The selected layers' per-sample outputs, learned from one fault-free evaluation (layer = its name)."""
    evaluate = make_evaluator(campaign)
    refs = layer_outputs(model, lambda: evaluate(model), Selection.from_dict(campaign.select))
    return [Tensor(r.name, (r.name,), np.dtype(r.dtype), r.shape, r.size, "memory",
                   nbytes=r.size * np.dtype(r.dtype).itemsize, layer=r.name, role=None) for r in refs]


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
    sampling: str = "permutation"
    fpc_population: int | None = None

    @property
    def key(self) -> str:
        parts = [f"bits={self.bits}"]
        if self.group_by != "none":
            parts.append(f"{self.group_by}={self.group}")
        parts += [f"flips={self.flips}", f"fault={self.fault}"]
        if self.epoch is not None:
            parts.append(f"epoch={self.epoch}")
        return "|".join(parts)

    def sampling_spec(self, distribution: Any = "element") -> Sampling:
        """What a trial of this cell flips, as a :class:`~fastflip.core.spec.Sampling` (bits, fault, flips)."""
        return Sampling(bits=self.bits, model=self.fault, count=self.flips, distribution=distribution)

    def design(self, planned: int) -> str:
        """``exhaustive`` when ``planned`` trials run every site once, else the cell's sampling."""
        if self.fpc_population is not None and planned >= self.fpc_population:
            return "exhaustive"
        return self.sampling

    def row(self, planned: int) -> dict[str, Any]:
        """The store's ``cells`` row."""
        return {
            "key": self.key, "bits": self.bits, "grp": self.group, "group_by": self.group_by, "flips": self.flips,
            "fault": self.fault, "epoch": self.epoch, "planned": int(planned), "population": self.population,
            "sampling": self.design(planned), "fpc_population": self.fpc_population,
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

    models = {f: FaultModel.parse(f) for f in spec.faults}
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
                                nb = len(bitspec.resolve(word_type(t.dtype, t.format)))
                                population += t.size * nb if models[fault].pair_sites else (t.size if nb else 0)
                            except Exception as exc:  # a field the dtype lacks (e.g. 'exponent' of an int)
                                raise OptionError(
                                    f"[cells] bits {bits!r} does not apply to {t.path} ({t.dtype}): {exc}"
                                ) from exc
                        if population:
                            names = tuple(t.path for t in members)
                            sampling, fpc = _design(campaign, models[fault], flips, population)
                            cells.append(Cell(bits, spec.group_by, group, names, flips, fault, epoch, population,
                                              sampling, fpc))
    if not cells:
        raise OptionError("the campaign has no cell: no selected tensor has any of the requested bits")
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        raise OptionError("[cells]: two cells have the same key (a bit spec or fault listed twice?)")
    return cells


SAMPLING_DESIGNS = ("permutation", "exhaustive", "independent")


def _design(campaign: Campaign, model: Any, flips: int, population: int) -> tuple[str, int | None]:
    """A cell's sampling design and the population of its finite-population correction (see the module docs)."""
    if campaign.cells.distribution != "element":
        return "independent", None
    deterministic = model.pair_sites or model.kind in ("zero", "scale") or (
        model.kind == "mask" and model.mask_position == "fixed")
    return "permutation", (population if deterministic and flips == 1 else None)


def planned_counts(campaign: Campaign, cells: Sequence[Cell]) -> list[int]:
    """Trials to run per cell: fixed, Leveugle sample size, or the sequential cap.

    A cell whose trials are single deterministic sites never plans more trials than its
    population (it then runs every site once); the Leveugle size uses that population, and
    an unbounded one for the other cells (their trials are not a sample without replacement
    of a finite set).
    """
    tr = campaign.trials
    out = []
    for c in cells:
        if tr.per_cell is not None:
            n = int(tr.per_cell)
        elif tr.margin is not None:
            n = sample_size(c.fpc_population if c.fpc_population is not None else math.inf, margin=tr.margin,
                            confidence=tr.confidence, p=tr.p)
        else:
            n = int(tr.max_per_cell)
        out.append(min(n, c.fpc_population) if c.fpc_population is not None else n)
    return out


def cell_notes(campaign: Campaign, cells: Sequence[Cell], planned: Sequence[int]) -> list[str]:
    """One line per cell whose design differs from what the campaign asks (for ``plan`` and ``sweep``)."""
    tr = campaign.trials
    asked = tr.per_cell if tr.per_cell is not None else (tr.max_per_cell if tr.sequential else None)
    notes = []
    for c, n in zip(cells, planned):
        if c.fpc_population is not None and asked is not None and asked > c.population:
            what = "per_cell" if tr.per_cell is not None else "max_per_cell"
            notes.append(f"cell {c.key}: {what} = {asked} exceeds its population of {c.population} sites; "
                         f"it runs every site once ({n} trials, exhaustive: the exact rate)")
        elif c.fpc_population is None and c.sampling == "permutation" and n * c.flips > c.population:
            unit = "(element, bit) sites" if FaultModel.parse(c.fault).pair_sites else "elements"
            notes.append(f"cell {c.key}: {n} trials x {c.flips} sites exceed its {c.population} {unit}; after "
                         f"{c.population // c.flips} trials they are drawn again (a new pass)")
    return notes


def trial_sites(perms: dict[tuple[int, int], Any], seed: int, cell_id: int, cell: Cell, trial: int,
                n_sites: int) -> np.ndarray:
    """The site units of trial ``trial`` of a permutation-sampled cell (``perms`` caches the permutations).

    Positions ``i*k … i*k+k-1`` of pass ``i // (N // k)`` of a permutation keyed by
    ``(seed, cell, pass)`` over the ``N = n_sites`` units (see the module docstring).
    """
    k = cell.flips
    if k > n_sites:
        raise CapacityError(f"cell {cell.key}: {k} sites per trial but only {n_sites} sites in the cell")
    per_pass = n_sites // k
    pas, slot = divmod(int(trial), per_pass)
    perm = perms.get((cell_id, pas))
    if perm is None:
        if len(perms) > 4096:
            perms.clear()
        perm = perms[(cell_id, pas)] = Permutation(n_sites, (int(seed), int(cell_id), pas))
    return perm(np.arange(slot * k, slot * k + k, dtype=np.int64))


def block_trial_sites(perms: dict[tuple[int, int], Any], seed: int, cell_id: int, cell: Cell, trials: np.ndarray,
                      n_sites: int) -> np.ndarray:
    """:func:`trial_sites` of many trials at once: a ``(len(trials), flips)`` array, row ``j`` that of ``trials[j]``."""
    k = cell.flips
    if k > n_sites:
        raise CapacityError(f"cell {cell.key}: {k} sites per trial but only {n_sites} sites in the cell")
    trials = np.asarray(trials, dtype=np.int64)
    per_pass = n_sites // k
    pas, slot = np.divmod(trials, per_pass)
    pos = slot[:, None] * k + np.arange(k, dtype=np.int64)
    out = np.empty((len(trials), k), dtype=np.int64)
    for p in np.unique(pas).tolist():
        perm = perms.get((cell_id, p))
        if perm is None:
            if len(perms) > 4096:
                perms.clear()
            perm = perms[(cell_id, p)] = Permutation(n_sites, (int(seed), int(cell_id), p))
        at = pas == p
        out[at] = perm(pos[at].reshape(-1)).reshape(-1, k)
    return out


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
        if is_checkpoint_dir(path):  # a Hugging Face directory: its index and weight files
            out[os.path.basename(path) if e is None else f"epoch {e}"] = checkpoint_dir_sha256(path)
            continue
        h = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    h.update(block)
        except OSError as exc:
            raise OptionError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from exc
        out[os.path.basename(path) if e is None else f"epoch {e}"] = h.hexdigest()
    return out

