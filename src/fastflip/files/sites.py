"""The sites of an injection into a checkpoint: the site space of a layout's selected tensors, the Sampling of a
call, and the counts its log records.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Shared by :mod:`fastflip.files.inject` (one file) and :mod:`fastflip.files.sharded` (a checkpoint directory, whose
one site space spans every shard), so both draw and count sites alike.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping

import numpy as np

from ..core.bits import BitSpec
from ..core.plan import Plan
from ..core.sampling import SiteSpace
from ..core.spec import Sampling
from ..core.wordrule import nonfinite
from ..errors import CapacityError, SelectionError, one_line
from .h5apply import check_storage
from .layout import Layout
from .select import Selection, select

__all__ = ["site_space", "sampling_of", "PLAN_FIELDS", "injection_counts", "nonfinite_created", "random_seed"]

_LOCK = threading.Lock()  # the site-space cache is shared by the threads of a host harness


_SPACES: "dict[tuple[Any, ...], tuple[Layout, SiteSpace]]" = {}


def site_space(layout: Layout, selection: Selection | None, spec: BitSpec,
               distribution: str | Mapping[str, float]) -> SiteSpace:
    """The SiteSpace of ``layout``'s tensors that ``selection`` picks, remembered per (layout object, selection,
    bits, distribution).

    ``layout`` is a :class:`~fastflip.files.layout.Layout` or anything with its ``tensors`` and ``skipped``
    (a checkpoint directory's :class:`~fastflip.files.formats.hfdir.ShardedLayout`: one space over every shard).

    Raises
    ------
    SelectionError
        The selection matches no tensor (the entries that are not tensors are named).
    CapacityError
        The selected tensors hold 2**63 bits or more.
    """
    dist_key = distribution if isinstance(distribution, str) else tuple(sorted(distribution.items()))
    key = (id(layout), repr(selection), spec, dist_key)
    with _LOCK:
        hit = _SPACES.get(key)
    if hit is not None and hit[0] is layout:
        return hit[1]
    try:
        tensors = select(layout.tensors, selection)
    except SelectionError as exc:
        if not layout.skipped:
            raise
        shown = "; ".join(f"{k.path}: {k.reason}" for k in layout.skipped[:2])
        raise SelectionError(f"{one_line(exc)} (not tensors: {shown}"
                             f"{'; ...' if len(layout.skipped) > 2 else ''})") from None
    check_storage(tensors)
    total_bits = sum(t.size * t.itemsize * 8 for t in tensors)  # Python ints: exact whatever the shapes
    if total_bits >= 2**63:
        raise CapacityError(f"the selection holds {total_bits} bits in {len(tensors)} tensors, more than can be "
                            "addressed (2**63); select fewer tensors")
    space = SiteSpace([t.ref() for t in tensors], bits=spec, distribution=distribution)
    with _LOCK:
        while len(_SPACES) >= 16:
            _SPACES.pop(next(iter(_SPACES)))
        _SPACES[key] = (layout, space)  # the layout is held, so its id is not reused while cached
    return space


#: What a log records for a given plan when no sampling field is given (the fields of :class:`Sampling`).
PLAN_FIELDS: dict[str, Any] = {"bits": None, "sign_first": False, "model": None, "count": None, "rate": None,
                               "ber": None, "distribution": "element", "replace": False, "nan_policy": "allow"}


def random_seed() -> int:
    """A seed for a call that gave none (recorded in its log): 63 random bits from the operating system.

    >>> 0 <= random_seed() < 2**63
    True
    """
    return int.from_bytes(os.urandom(8), "big") >> 1


def sampling_of(sampling: Sampling | Mapping[str, Any] | None, plan: Plan | None,
                shorthand: Mapping[str, Any] | None = None, where: str = "inject_file") -> Sampling | None:
    """The Sampling of an inject call: ``sampling=`` or the shorthand keywords, through :meth:`Sampling.of`.

    With a given plan and no ``sampling=``, None: the plan fixes the sites, and the shorthand keywords
    (checked by name) only describe it in the log.

    >>> sampling_of({"count": 3, "bits": "sign"}, None).count
    3
    >>> sampling_of(None, None, {"count": 2}).count
    2
    >>> sampling_of(None, object(), {"bits": "31"}) is None  # a plan given: nothing to sample
    True
    """
    shorthand = dict(shorthand or {})
    if plan is not None and sampling is None:
        Sampling.of(where=where, **{k: None for k in shorthand})  # names checked, nothing built
        return None
    return Sampling.of(sampling, where=where, required=True, **shorthand)


def injection_counts(plan: Plan, old: np.ndarray, new: np.ndarray) -> dict[str, int]:
    """What an injection touched and what it changed.

    ``sites`` are the elements the plan touched and ``flips`` the bits it touched (a
    stuck-at bit already at its value is touched, not changed; ``scale`` touches no bit);
    ``elements_changed`` (also ``changed``) and ``bits_changed`` count what really differs
    between the old and the new words.

    >>> from fastflip.core.plan import TensorRef
    >>> from fastflip.core.sampling import SiteSpace
    >>> p = SiteSpace([TensorRef("w", "<u1", (2,))], bits="0").plan(Sampling(count=2, model="stuck-at-1"), seed=1)
    >>> c = injection_counts(p, np.array([0, 1], np.uint64), np.array([1, 1], np.uint64))  # bit 0 of w[1] was set
    >>> c["sites"], c["flips"], c["elements_changed"], c["bits_changed"]
    (2, 2, 1, 1)
    """
    nan_n, inf_n = nonfinite_created(plan, old, new)
    old_u, new_u = np.asarray(old, np.uint64), np.asarray(new, np.uint64)
    return {
        "sites": int(len(plan)),
        "flips": int(np.bitwise_count(plan.bits).sum()) if len(plan) else 0,
        "changed": int((old != new).sum()),
        "elements_changed": int((old_u != new_u).sum()),
        "bits_changed": int(np.bitwise_count(old_u ^ new_u).sum()) if len(plan) else 0,
        "tensors_hit": len(plan.per_tensor()),
        "nan_created": nan_n,
        "inf_created": inf_n,
        "nan_resampled": int(plan.meta.get("nan_resampled", 0)),
    }


def nonfinite_created(plan: Plan, old: np.ndarray, new: np.ndarray) -> tuple[int, int]:
    """(values that became NaN, values that became Inf) among the plan's sites."""
    nan_n = inf_n = 0
    for dt, pos in plan.per_dtype():
        on, oi = nonfinite(old[pos], dt)
        nn, ni = nonfinite(new[pos], dt)
        nan_n += int((nn & ~on).sum())
        inf_n += int((ni & ~oi).sum())
    return nan_n, inf_n
