"""The lean per-trial plan: a trial's few sites drawn and turned into a plan in plain Python.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

:meth:`fastflip.core.sampling.SiteSpace.plan` draws with NumPy calls whose argument
handling costs far more than a trial's handful of numbers. For fewer than 4096 sites drawn
uniformly (``Sampling(count=K)``, or the K a ``rate``/``ber`` Binomial gives: the per-trial loop of a
harness), the space hands the draw to :func:`lean_plan`, which makes the same draws with the same algorithms on the
generator's raw words (:class:`~fastflip.core.rawdraws.RawDraws`, keyed without a
SeedSequence by :func:`~fastflip.core.seedkey.keyed_generator`) and builds the plan from
Python lists: the same sites, masks, order and meta as the general path, bit for bit
(tests/test_trialplan.py compares both over many seeds, streams, counts and fault models).
When the first round of draws does not give K distinct sites (rare), it gives up and the
general path draws instead, from the start. Sweeps keep the block planner
(:mod:`fastflip.core.blockplan`).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Sequence

import numpy as np

from .plan import Plan, merge_duplicate_elements
from .rawdraws import FLOYD_MAX, RawDraws
from .seedkey import keyed_generator, keyed_words

__all__ = ["lean_plan", "pair_units_plan", "LeanTables", "draw_amount"]

_ALL = (1 << 64) - 1


class LeanTables:
    """What :func:`lean_plan` needs of a site space, as Python lists (built once per space)."""

    def __init__(self, space: Any) -> None:
        self.starts = [int(s) for s in space.starts]
        self.group_of = [int(g) for g in space.group_of]
        self.positions = [[int(p) for p in g.positions] for g in space.groups]
        self.gm = [len(p) for p in self.positions]
        self.n_elements = int(space.n_elements)
        self.pair_starts = [int(s) for s in space.pair_starts]
        self.nbits = [int(m) for m in space.nbits]

    def tensor_of(self, elem: int) -> int:
        return bisect_right(self.starts, elem) - 1


def _draw_keys(lt: LeanTables, d: RawDraws, k: int, cap: int, pairs: bool, replace: bool,
               pair_uniform: bool) -> list[int] | None:
    """The first round of :meth:`SiteSpace._sample` (sorted site keys), or None when it falls short of k."""
    n = k if replace else k + int(2.0 * k * k / max(cap, 1)) + 8
    if pair_uniform:
        keys = _unit_keys(lt, d.integers(lt.pair_starts[-1], n))
    elif pairs:
        elem = d.integers(lt.n_elements, n)
        u = d.random(n)
        if len(lt.positions) == 1:
            pos, m = lt.positions[0], lt.gm[0]
            keys = [e * 64 + pos[int(x * m)] for e, x in zip(elem, u)]
        else:
            keys = []
            for e, x in zip(elem, u):
                g = lt.group_of[lt.tensor_of(e)]
                keys.append(e * 64 + lt.positions[g][int(x * lt.gm[g])])
    else:
        keys = d.integers(lt.n_elements, n)
    if replace:
        return sorted(keys)
    keys = sorted(set(keys))
    if len(keys) < k or len(keys) > FLOYD_MAX:
        return None
    if len(keys) > k:
        drop = set(d.choice_floyd(len(keys), len(keys) - k, shuffle=not pairs))  # pair sites draw nothing after
        keys = [x for i, x in enumerate(keys) if i not in drop]
    return keys


def _pair_columns(lt: LeanTables, kind: str, keys: list[int], distinct: bool) -> tuple[list[int], ...]:
    """Tensor, index and masks of pair sites (flip / one-bit stuck-at), as :meth:`SiteSpace._build` makes them."""
    elems: list[int] = []
    bms: list[int] = []
    for key in keys:
        e, b = key >> 6, 1 << (key & 63)
        if distinct and elems and elems[-1] == e:  # distinct bits of one element combine by OR
            bms[-1] |= b
        else:
            elems.append(e)
            bms.append(b)
    tensor = [lt.tensor_of(e) for e in elems]
    index = [e - lt.starts[t] for e, t in zip(elems, tensor)]
    ones, zeros = [_ALL] * len(elems), [0] * len(elems)
    if kind == "stuck-at-0":
        return tensor, index, [_ALL ^ b for b in bms], zeros, zeros, bms
    if kind == "stuck-at-1":
        return tensor, index, ones, bms, zeros, bms
    return tensor, index, ones, zeros, bms, bms


def _pair_plan(space: Any, lt: LeanTables, kind: str, keys: list[int], distinct: bool) -> Plan:
    """The plan of sorted pair-site keys (``element * 64 + bit``) of a flip / one-bit stuck-at model."""
    tensor, index, and_m, or_m, xor_m, touched = _pair_columns(lt, kind, keys, distinct)
    masks = np.array([and_m, or_m, xor_m, touched], np.uint64)  # rows are contiguous columns
    masks.flags.writeable = False  # the plan owns it: its rows are taken as they are, not copied read-only
    return Plan(space.tensors, np.array(tensor, np.int32), np.array(index, np.int64), masks[0], masks[1], masks[2],
                None, masks[3])


def _unit_keys(lt: LeanTables, units: list[int]) -> list[int]:
    """:meth:`SiteSpace._pairs_from_index` as keys ``element * 64 + bit``: the u-th (element, bit) pair."""
    keys = []
    for u in units:
        t = bisect_right(lt.pair_starts, u) - 1
        local = u - lt.pair_starts[t]
        m = lt.nbits[t]
        keys.append((lt.starts[t] + local // m) * 64 + lt.positions[lt.group_of[t]][local % m])
    return keys


def pair_units_plan(space: Any, units: list[int], kind: str) -> Plan:
    """``space._build`` of given pair-site units (sorted, distinct, in range: checked by the caller) for a
    flip / one-bit stuck-at model, on Python integers (the units of a campaign trial)."""
    lt = space._lean_tables()
    return _pair_plan(space, lt, kind, _unit_keys(lt, units), True)


def draw_amount(space: Any, sampling: Any, rng: np.random.Generator) -> tuple[int, bool, bool, dict[str, Any]]:
    """How many sites a plan of ``sampling`` draws from ``space``, and how: (sites ``k``, drawn as (element, bit)
    pairs, every pair equally likely, the ``mode`` its meta records).

    ``count`` is ``k``; ``rate`` draws ``k`` elements from Binomial(elements, rate) and ``ber`` ``k`` pairs from
    Binomial(pairs, ber), each the first draw of ``rng``. Shared by :meth:`~fastflip.core.sampling.SiteSpace.plan`
    and :func:`lean_plan`, whose plans must agree bit for bit.
    """
    count = sampling.count
    if count is not None:
        k = int(count)
        return k, sampling.fault_model.pair_sites, False, {"count": k}
    if sampling.rate is not None:
        k = int(rng.binomial(space.n_elements, sampling.rate))
        return k, False, False, {"rate": float(sampling.rate), "drawn": k}
    k = int(rng.binomial(space.n_pairs, sampling.ber))
    return k, sampling.fault_model.pair_sites, True, {"ber": float(sampling.ber), "drawn": k}


def lean_plan(space: Any, sampling: Any, seed: int, stream: Sequence[int], limits: tuple[int, float]) -> Plan | None:
    """The plan ``space.plan(sampling, seed=, stream=)`` draws, or None to leave it to the general path (stream
    values it does not take, no site, at least ``limits[0]`` sites or more than the fraction ``limits[1]`` of
    the space without replacement, or a first round short of the sites).

    ``sampling`` is a :class:`~fastflip.core.spec.Sampling`. The caller has checked it against the space:
    a uniform element distribution, ``nan_policy='allow'``, ``ber`` only with a single-bit model.
    """
    if any(int(s) < 0 for s in stream):
        return None  # the general path raises NumPy's error
    model, replace, count = sampling.fault_model, sampling.replace, sampling.count
    # a count of (bit, element) pairs draws nothing but raw words: computed here, without numpy.random
    words_only = count is not None and model.pair_sites
    rng = None if words_only else keyed_generator(seed, stream)
    k, pairs, pair_uniform, mode = draw_amount(space, sampling, rng)
    cap = space._capacity(pairs)
    if not (1 <= k < limits[0] and (replace or k <= limits[1] * cap)):
        return None
    lt = space._lean_tables()
    d = RawDraws(keyed_words(seed, stream) if rng is None else rng.bit_generator, fresh=count is not None)
    keys = _draw_keys(lt, d, k, cap, pairs, replace, pair_uniform)
    if keys is None:
        return None
    if pairs:
        plan = _pair_plan(space, lt, model.kind, keys, not replace)
        if replace and len(plan) > 1:
            plan = merge_duplicate_elements(plan)
        bits = plan.bits.tolist()
        flips = sum(b.bit_count() for b in bits) if len(bits) < 64 else int(np.bitwise_count(plan.bits).sum())
    else:
        d.sync()  # element models draw their bits or values through NumPy, where the sites left off
        plan = space._build(rng, model, np.array(keys, np.int64), None, distinct=not replace)
        flips = int(np.bitwise_count(plan.bits).sum())
    plan.meta = space._plan_meta(flips, seed, stream, model, replace, "allow", k, mode)
    return plan
