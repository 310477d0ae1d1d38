"""Plans for a block of trials in one call, each equal to the trial's own plan.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

A campaign draws trial ``i`` of a cell from ``(seed, cell, i)`` alone (counter-based), so
trials can be planned one at a time anywhere. Planning them one at a time costs a Python
round per trial (a generator keyed by ``SeedSequence``, a :class:`~fastflip.core.plan.Plan`
object, its validation); once the evaluation is batched that dominates. A
:class:`PlanBlock` holds the plans of ``B`` trials as one set of columns with per-trial
row starts; :meth:`PlanBlock.plan` gives trial ``j``'s :class:`~fastflip.core.plan.Plan`, equal
column for column (and in its ``meta``) to the one drawn alone.

:func:`plan_sites_block` is the block form of :meth:`fastflip.core.sampling.SiteSpace.plan_sites`
(given site units per trial, the campaign's default permutation design). It is vectorised,
with no per-trial Python work, when the fault model's masks follow from the sites alone
(``flip``, single-bit ``stuck-at``, ``zero``, ``scale`` and a fixed ``mask``); for fault
models with random parts (``random-bits``, ``adjacent``, ``random-value``, a sliding
``mask``) each trial still takes its own generator of ``(seed, stream)``, so those are
planned trial by trial inside the call. :func:`plan_block` is the block form of
:meth:`~fastflip.core.sampling.SiteSpace.plan` (independent draws): its draws (Binomial counts,
rounds of draws with collisions, NumPy's bounded-integer rejection) are planned trial by
trial, which keeps every existing seed's meaning (no new generator scheme, nothing to version).

Examples
--------
>>> from fastflip.core.plan import TensorRef
>>> from fastflip.core.sampling import SiteSpace
>>> space = SiteSpace([TensorRef("w", "<f4", (10,))], bits="30-31")
>>> sites = np.array([[3], [17], [0]])
>>> block = plan_sites_block(space, sites, seed=1, streams=[(0, 0), (0, 1), (0, 2)], model="flip")
>>> len(block), block.plan(1).index.tolist(), [hex(int(m)) for m in block.plan(1).xor_mask]
(3, [8], ['0x80000000'])
>>> one = space.plan_sites([17], seed=1, stream=(0, 1), model="flip")
>>> same_plan(block.plan(1), one)
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import OptionError
from .faults import FaultModel, site_masks
from .plan import Plan, TensorRef, readonly

__all__ = ["PlanBlock", "plan_sites_block", "plan_block", "deterministic_model", "same_plan"]


@dataclass
class PlanBlock:
    """The plans of ``B`` trials as one set of columns (see the module docstring).

    Attributes
    ----------
    tensors : tuple of TensorRef
    starts : int64 array of length B + 1
        Trial ``j``'s sites are rows ``starts[j]:starts[j + 1]`` of every column (row numbers; ``offsets``
        in fastflip always means byte offsets, :class:`fastflip.core.records.SiteArrays`).
    tensor, index, and_mask, or_mask, xor_mask, bits, scale
        The columns of :class:`~fastflip.core.plan.Plan`, trial after trial.
    metas : list of dict, optional
        Each trial's ``meta``; when absent, built from ``common``, ``streams`` and ``flips``.
    """

    tensors: tuple[TensorRef, ...]
    starts: np.ndarray
    tensor: np.ndarray
    index: np.ndarray
    and_mask: np.ndarray
    or_mask: np.ndarray
    xor_mask: np.ndarray
    bits: np.ndarray
    scale: np.ndarray | None = None
    metas: list[dict[str, Any]] | None = None
    common: dict[str, Any] = field(default_factory=dict)
    streams: Sequence[Sequence[int]] = ()
    flips: np.ndarray | None = None

    def __post_init__(self) -> None:
        # read-only columns, as a plan's: trial plans are then views of them, not copies
        for name in ("tensor", "index", "and_mask", "or_mask", "xor_mask", "bits", "scale"):
            col = getattr(self, name)
            if col is not None:
                setattr(self, name, readonly(col, np.asarray(col).dtype))

    def __len__(self) -> int:
        return len(self.starts) - 1

    @property
    def trial_of_row(self) -> np.ndarray:
        """The trial (0 … B-1) of every row."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.starts))

    def plan(self, j: int) -> Plan:
        """Trial ``j``'s plan."""
        s, e = int(self.starts[j]), int(self.starts[j + 1])
        return Plan(self.tensors, self.tensor[s:e], self.index[s:e], self.and_mask[s:e], self.or_mask[s:e],
                    self.xor_mask[s:e], None if self.scale is None else self.scale[s:e], self.bits[s:e],
                    self.meta(j))

    def meta(self, j: int) -> dict[str, Any]:
        """Trial ``j``'s ``meta`` (the one its plan drawn alone has)."""
        if self.metas is not None:
            return dict(self.metas[j])
        c = self.common
        assert self.flips is not None
        return {"flips": int(self.flips[j]), "seed": c["seed"], "stream": [int(x) for x in self.streams[j]],
                "model": dict(c["model"]), "bits": list(c["bits"]), "sign_first": c["sign_first"],
                "requested_sites": c["requested_sites"], "generator": c["generator"], "sites": c["sites"]}

    def plans(self) -> list[Plan]:
        """Every trial's plan, in order."""
        return [self.plan(j) for j in range(len(self))]

    @classmethod
    def from_plans(cls, plans: Sequence[Plan]) -> "PlanBlock":
        """A block holding given plans (of the same tensors)."""
        if not plans:
            raise ValueError("a plan block needs at least one plan")
        lens = np.array([len(p) for p in plans], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in plans])

        scale = None
        if any(p.scale is not None for p in plans):
            scale = np.concatenate([p.scale if p.scale is not None else np.full(len(p), np.nan) for p in plans])
        return cls(plans[0].tensors, starts, cat("tensor"), cat("index"), cat("and_mask"), cat("or_mask"),
                   cat("xor_mask"), cat("bits"), scale, [dict(p.meta) for p in plans])


def deterministic_model(model: FaultModel) -> bool:
    """Whether ``model``'s masks follow from the drawn sites alone (no random parts)."""
    return (model.pair_sites or model.kind in ("zero", "scale")
            or (model.kind == "mask" and model.mask_position == "fixed"))


def plan_sites_block(space: Any, sites: np.ndarray, *, seed: int, streams: Sequence[Sequence[int]],
                     model: "FaultModel | str | None" = None) -> PlanBlock:
    """The block form of ``space.plan_sites(sites[j], seed=seed, stream=streams[j], model=model)``.

    Parameters
    ----------
    space : fastflip.core.sampling.SiteSpace
    sites : int array of shape (B, k)
        Trial ``j``'s distinct site units in row ``j``.
    seed : int
    streams : sequence of B streams
    model : FaultModel or str, optional
    """
    model = FaultModel.parse(model)
    sites = np.asarray(sites, dtype=np.int64)
    if sites.ndim != 2 or sites.shape[0] != len(streams):
        raise ValueError("sites must be a (trials, sites per trial) array with one stream per trial")
    if not deterministic_model(model) or sites.shape[1] == 0:
        return PlanBlock.from_plans([space.plan_sites(s, seed=seed, stream=st, model=model)
                                     for s, st in zip(sites, streams)])
    B, k = sites.shape
    u = np.sort(sites, axis=1)
    cap = space.n_sites(model)
    if u.size and (u[:, 0].min() < 0 or u[:, -1].max() >= cap):
        raise OptionError(f"site units must lie in [0, {cap})")
    if k > 1 and (u[:, 1:] == u[:, :-1]).any():
        raise OptionError("plan_sites: the sites must be distinct")
    flat = u.reshape(-1)
    trial = np.repeat(np.arange(B, dtype=np.int64), k)
    if model.pair_sites:
        elem, bit = space._pairs_from_index(flat)
        bmask = np.left_shift(np.uint64(1), bit.astype(np.uint64))
        if k > 1:  # several bits of one element in one trial combine by OR (as SiteSpace._build does)
            first = np.ones(len(elem), bool)
            first[1:] = (elem[1:] != elem[:-1]) | (trial[1:] != trial[:-1])
            if not first.all():
                starts = np.flatnonzero(first)
                bmask = np.bitwise_or.reduceat(bmask, starts)
                elem, trial = elem[starts], trial[starts]
    else:
        elem, bmask = flat, None
    n = len(elem)
    t = np.searchsorted(space.starts, elem, side="right") - 1
    and_m = np.empty(n, np.uint64)
    or_m = np.empty(n, np.uint64)
    xor_m = np.empty(n, np.uint64)
    touched = np.empty(n, np.uint64)
    g = space.group_of[t]
    for gi, group in enumerate(space.groups):
        at = np.flatnonzero(g == gi) if len(space.groups) > 1 else slice(None)
        m = n if isinstance(at, slice) else len(at)
        if not m:
            continue
        rng = _NoRandom() if model.kind != "mask" else _FIXED  # a fixed mask draws its one shift: always 0
        a, o, x, b = site_masks(model, group, m, rng, None, None if bmask is None else bmask[at])
        and_m[at], or_m[at], xor_m[at], touched[at] = a, o, x, b
    scale = np.full(n, model.factor, np.float64) if model.kind == "scale" else None
    starts = np.searchsorted(trial, np.arange(B + 1), side="left").astype(np.int64)
    flips = np.add.reduceat(np.bitwise_count(touched).astype(np.int64), starts[:-1]) if n else np.zeros(B, np.int64)
    flips[np.diff(starts) == 0] = 0
    common = {"seed": int(seed), "model": model.as_dict(), "bits": list(space.bits.items),
              "sign_first": space.bits.sign_first, "requested_sites": int(k), "generator": "philox/seedsequence",
              "sites": "given"}
    return PlanBlock(space.tensors, starts, t.astype(np.int32), elem - space.starts[t], and_m, or_m, xor_m,
                     touched, scale, None, common, list(streams), flips)


def plan_block(space: Any, sampling: Any, *, seed: int, streams: Sequence[Sequence[int]]) -> PlanBlock:
    """The block form of ``space.plan(sampling, seed=seed, stream=streams[j])`` (planned trial by trial;
    ``sampling`` a :class:`~fastflip.core.spec.Sampling`)."""
    return PlanBlock.from_plans([space.plan(sampling, seed=seed, stream=st) for st in streams])


_FIXED = np.random.default_rng(0)


class _NoRandom:
    """Stands for the generator where the fault model draws nothing (a use is a bug, said loudly)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a deterministic fault model asked its generator for {name}")


def same_plan(a: Plan, b: Plan) -> bool:
    """Whether two plans are equal column for column and in their ``meta``."""
    cols = ("tensor", "index", "and_mask", "or_mask", "xor_mask", "bits")
    if a.tensors != b.tensors or len(a) != len(b) or a.meta != b.meta:
        return False
    if any(not np.array_equal(getattr(a, c), getattr(b, c)) for c in cols):
        return False
    if (a.scale is None) != (b.scale is None):
        return False
    return a.scale is None or np.array_equal(a.scale, b.scale, equal_nan=True)
