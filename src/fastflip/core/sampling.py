"""Seeded, counter-based sampling of injection sites, turned into a :class:`~fastflip.core.plan.Plan`.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

Reproducibility contract: the sites depend only on (seed, stream, the ordered list
of selected tensors with their dtypes and shapes, the bit spec, the fault model and
the mode). The generator is NumPy's Philox keyed by ``SeedSequence([seed, *stream])``
(platform independent), so trial ``i`` of cell ``c`` of a campaign is regenerated
from ``stream=(c, i)`` without any log.

Distributions
-------------
``'element'`` (default)
    Every selected element is equally likely: a tensor is hit in proportion to its
    number of elements; the bit is then uniform over the dtype's allowed bits.
``'tensor'``
    A tensor is chosen uniformly (the behaviour of older tools), then an element in it.
mapping ``{tensor name: weight}``
    A tensor is chosen with the given (relative) weights, then an element in it.

Modes (the amount of a :class:`~fastflip.core.spec.Sampling`)
---------------------------------------------------------------
``count=K``  exactly K sites. For ``flip`` (and single-bit stuck-at) a site is an
(element, bit) pair, otherwise an element. Without replacement (default) no site
is drawn twice; K larger than the number of distinct sites raises
:class:`~fastflip.errors.CapacityError`. With ``replace=True`` repeats are kept
(two flips of one bit cancel, as they would in memory).
``rate=R``   each selected element is hit with probability R: K ~ Binomial(N, R),
then K distinct elements.
``ber=P``    each allowed bit is flipped with probability P: K ~ Binomial(total bits, P),
then K distinct (element, bit) pairs, uniform over all pairs.

Draws happen in this order: the Binomial (rate/ber), the sites (from 4096 sites on,
uniform draws generated in sorted order from exponential spacings; below that, rounds
of draws with a margin for collisions; either way repeats are dropped and a surplus is
removed at uniformly drawn positions; under 'tensor' or weights, the first distinct draws
in draw order are kept, as in successive draws without replacement), then each dtype
group's random masks in group order; resampling for ``nan_policy='avoid'`` continues the same stream.

Examples
--------
>>> from fastflip.core.plan import TensorRef
>>> space = SiteSpace([TensorRef("a", "<f4", (100,)), TensorRef("b", "<f4", (10, 10))], bits="exponent-msb")
>>> from fastflip.core.spec import Sampling
>>> five = Sampling(count=5)
>>> p1 = space.plan(five, seed=7)
>>> p2 = space.plan(five, seed=7)
>>> bool((p1.index == p2.index).all()) and len(p1)
5
>>> {hex(int(x)) for x in p1.xor_mask}
{'0x40000000'}
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .bits import BitSpec
from ..errors import CapacityError, NaNPolicyError, OptionError
from .faults import FaultModel, site_masks
from .plan import Plan, TensorRef, merge_duplicate_elements
from .sitedraws import BIT_SLOTS, BULK, DENSE_FRACTION, SiteDraws, sorted_contains, sorted_distinct
from .trialplan import LeanTables, draw_amount, lean_plan, pair_units_plan
from .wordrule import nonfinite, rule_words, scale_words

__all__ = ["SiteSpace", "generator"]

_NEEDS_WORDS = "nan_policy='avoid' needs read_words to know the old values"


def generator(seed: int, stream: Sequence[int] = ()) -> np.random.Generator:
    """The counter-based generator of (seed, stream): Philox keyed by SeedSequence."""
    if int(seed) < 0:
        raise OptionError(f"seed must be a non-negative integer (got {seed})")
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([int(seed), *[int(s) for s in stream]])))


class _Lazy:
    """:func:`generator` of (seed, stream), built on first use (same draws)."""

    def __init__(self, seed: int, stream: Sequence[int]) -> None:
        if int(seed) < 0:
            raise OptionError(f"seed must be a non-negative integer (got {seed})")
        self._key = (seed, stream)
        self._rng: np.random.Generator | None = None

    def __getattr__(self, name: str) -> Any:
        if self._rng is None:
            self._rng = generator(*self._key)
        return getattr(self._rng, name)


class SiteSpace(SiteDraws):
    """The selected tensors × allowed bits, prepared once and sampled many times.

    Parameters
    ----------
    tensors : sequence of TensorRef
        The selected tensors, in a fixed order (it is part of the reproducibility key).
    bits : BitSpec or str, optional
        Allowed bits (default: all bits of each dtype).
    distribution : 'element', 'tensor' or mapping of tensor name to weight
    """

    _lean: LeanTables | None = None  # the per-trial path's tables, built on first use
    #: (the last Sampling checked against this space, its nan_policy is 'avoid', its plans may take the lean path);
    #: one tuple, read once per plan, so that threads sharing the space never mix two Samplings' answers
    _agreed: tuple[Any, bool, bool] = (None, False, False)

    # -- plans ---------------------------------------------------------------------------
    def plan(
        self,
        sampling: Any,
        *,
        seed: int,
        stream: Sequence[int] = (),
        read_words: Callable[[Plan], np.ndarray] | None = None,
        max_resample_rounds: int = 100,
    ) -> Plan:
        """Draw the sites of one injection under ``sampling`` and build its plan (see the module docstring).

        ``sampling`` is a :class:`fastflip.core.spec.Sampling`: it gives the amount (``count``, ``rate`` or
        ``ber``), the fault model, ``replace`` and the NaN policy. The space holds the bits and the
        distribution (:meth:`~fastflip.core.spec.Sampling.space` builds it from a Sampling); a Sampling that
        names bits or a distribution must name the space's. Loops that draw many plans (a campaign's trials)
        build the space and the Sampling once and call this with a new ``stream`` each time.

        ``read_words(plan) -> uint64 old words`` is needed for ``nan_policy='avoid'``:
        sites whose new value would be NaN/Inf are redrawn (at most
        ``max_resample_rounds`` rounds) and :class:`~fastflip.errors.NaNPolicyError`
        is raised when that is impossible.

        Raises
        ------
        OptionError
            A Sampling whose bits or distribution are not the space's, ``rate``/``ber`` on a non-uniform
            distribution, ``ber`` with a fault model that does not flip single bits, or
            ``nan_policy='avoid'`` without ``read_words``.
        """
        agreed = self._agreed
        if agreed[0] is not sampling:
            agreed = self._agree(sampling, read_words)
        elif agreed[1] and read_words is None:
            raise OptionError(_NEEDS_WORDS)
        if agreed[2]:  # a trial's few sites: the lean path, the same plan
            lean = lean_plan(self, sampling, seed, stream, (BULK, DENSE_FRACTION))
            if lean is not None:
                return lean
        model, replace, nan_policy = sampling.fault_model, sampling.replace, sampling.nan_policy
        rng = generator(seed, stream)
        k, pairs, pair_uniform, mode = draw_amount(self, sampling, rng)
        elem, bit = self._sample(rng, k, pairs, replace, pair_uniform)
        plan = self._build(rng, model, elem, bit, distinct=not replace)
        if nan_policy == "avoid" and len(plan):
            plan = self._avoid_nonfinite(plan, rng, model, pairs, replace, pair_uniform, read_words, elem, bit,
                                         max_resample_rounds)
        plan.meta = self._plan_meta(int(_popcount(plan.bits).sum()), seed, stream, model, replace, nan_policy, k, mode,
                                    plan.meta)
        return plan

    def _agree(self, sampling: Any, read_words: Callable[[Plan], np.ndarray] | None) -> tuple[Any, bool, bool]:
        """Check ``sampling`` against this space once (a loop passes the same one; :meth:`plan` re-checks per call
        only ``read_words``): refuse other bits or another distribution than the space's, ``rate``/``ber`` on a
        non-uniform distribution, ``ber`` with a model that does not flip single bits, ``nan_policy='avoid'``
        without ``read_words``. Returns (and keeps as :attr:`_agreed`) the sampling, whether its nan_policy is
        'avoid' and whether its plans may take the lean path."""
        if sampling.bits is not None and sampling.bit_spec != self.bits:
            raise OptionError(f"the sampling's bits ({','.join(sampling.bit_spec.items)}) are not the site space's "
                              f"({','.join(self.bits.items)}); build the space with Sampling.space(tensors)")
        if sampling.distribution != "element" and sampling.distribution_arg != self.distribution:
            raise OptionError(f"the sampling's distribution ({sampling.distribution_arg}) is not the site space's "
                              f"({self.distribution}); build the space with Sampling.space(tensors)")
        avoid = sampling.nan_policy == "avoid"
        if avoid and read_words is None:
            raise OptionError(_NEEDS_WORDS)
        uniform = self._weights is None and self.distribution == "element"
        if sampling.rate is not None and not uniform:
            raise OptionError("rate draws every element with the same probability: use distribution='element'")
        if sampling.ber is not None:
            if not sampling.fault_model.pair_sites:
                raise OptionError("ber flips single bits: use the flip or single-bit stuck-at model, "
                                  f"not {sampling.fault_model.describe()}")
            if not uniform:
                raise OptionError("ber draws every bit with the same probability: use distribution='element'")
        self._agreed = agreed = (sampling, avoid, uniform and not avoid)
        return agreed

    def _lean_tables(self) -> LeanTables:
        if self._lean is None:
            self._lean = LeanTables(self)
        return self._lean

    def _plan_meta(self, flips: int, seed: int, stream: Sequence[int], model: FaultModel, replace: bool,
                   nan_policy: str, k: int, mode: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """A drawn plan's meta (into ``meta`` when given): what regenerates it and what it did."""
        meta = {} if meta is None else meta
        meta["flips"] = flips
        if self.left_out:
            meta["left_out"] = dict(self.left_out)
        meta.update(seed=int(seed), stream=[int(s) for s in stream], model=model.as_dict(), bits=list(self.bits.items),
                    sign_first=self.bits.sign_first, distribution=self.distribution, replace=bool(replace),
                    nan_policy=nan_policy, requested_sites=k, generator="philox/seedsequence", **mode)
        return meta

    def n_sites(self, model: "FaultModel | str | None" = None) -> int:
        """The number of site units of ``model``: (element, bit) pairs for pair-site models, else elements."""
        return self.n_pairs if FaultModel.parse(model).pair_sites else self.n_elements

    def plan_sites(self, sites: "np.ndarray | Sequence[int]", *, seed: int, stream: Sequence[int] = (),
                   model: "FaultModel | str | None" = None) -> Plan:
        """The plan of given, distinct site units (indices in ``[0, n_sites(model))``).

        A pair-site unit ``u`` is the ``u``-th (element, bit) pair in tensor order (every
        pair equally likely when ``u`` is uniform), an element unit the ``u``-th element.
        Random parts of the fault model (which bits of an element, random values) come
        from the generator of ``(seed, stream)``. This is the entry of sampling designs
        that choose the sites themselves (:class:`fastflip.core.permutation.Permutation`).

        >>> from fastflip.core.plan import TensorRef
        >>> space = SiteSpace([TensorRef("a", "<f4", (4,))], bits="30-31")
        >>> p = space.plan_sites([5, 0], seed=1)
        >>> p.index.tolist(), [hex(int(x)) for x in p.xor_mask]
        ([0, 2], ['0x40000000', '0x80000000'])
        """
        model = FaultModel.parse(model)
        u = np.sort(np.asarray(sites, dtype=np.int64).reshape(-1))
        cap = self.n_sites(model)
        if len(u) and (u[0] < 0 or u[-1] >= cap):
            raise OptionError(f"site units must lie in [0, {cap})")
        if len(u) > 1 and (u[1:] == u[:-1]).any():
            raise OptionError("plan_sites: the sites must be distinct")
        rng = _Lazy(seed, stream)  # deterministic models never build it (the SeedSequence is most of the cost)
        if model.pair_sites and 0 < len(u) < BULK:  # a trial's sites: the lean builder, nothing drawn
            plan = pair_units_plan(self, u.tolist(), model.kind)
        else:
            elem, bit = self._pairs_from_index(u) if model.pair_sites else (u, None)
            plan = self._build(rng, model, elem, bit)
        plan.meta.update({"flips": int(_popcount(plan.bits).sum()), "seed": int(seed),
                          "stream": [int(x) for x in stream], "model": model.as_dict(), "bits": list(self.bits.items),
                          "sign_first": self.bits.sign_first, "requested_sites": int(len(u)),
                          "generator": "philox/seedsequence", "sites": "given"})
        return plan

    def _build(self, rng: np.random.Generator, model: FaultModel, elem: np.ndarray, bit: np.ndarray | None,
               distinct: bool = True) -> Plan:
        bmask = None
        if bit is not None and distinct and len(elem) > 1:
            # distinct (element, bit) sites of one bitwise model: the bits of one element combine by OR
            bmask = np.left_shift(np.uint64(1), bit.astype(np.uint64))
            first = np.empty(len(elem), bool)
            first[0] = True
            np.not_equal(elem[1:], elem[:-1], out=first[1:])
            if not first.all():
                starts = np.flatnonzero(first)
                bmask = np.bitwise_or.reduceat(bmask, starts)
                elem = elem[starts]
        n = len(elem)
        # elements come sorted: find each tensor's run with one search per tensor
        t = np.repeat(np.arange(len(self.tensors)), np.diff(np.searchsorted(elem, self.starts)))
        and_m = np.empty(n, np.uint64)
        or_m = np.empty(n, np.uint64)
        xor_m = np.empty(n, np.uint64)
        touched = np.empty(n, np.uint64)
        if len(self.groups) == 1:
            and_m, or_m, xor_m, touched = site_masks(model, self.groups[0], n, rng, bit, bmask)
        else:
            g = self.group_of[t] if n else np.zeros(0, np.int64)
            for gi, group in enumerate(self.groups):
                at = np.flatnonzero(g == gi)
                if not len(at):
                    continue
                a, o, x, b = site_masks(model, group, len(at), rng, None if bit is None else bit[at],
                                        None if bmask is None else bmask[at])
                and_m[at], or_m[at], xor_m[at], touched[at] = a, o, x, b
        scale = np.full(n, model.factor, np.float64) if model.kind == "scale" else None
        plan = Plan(self.tensors, t.astype(np.int32), elem - self.starts[t], and_m, or_m, xor_m, scale, touched)
        return merge_duplicate_elements(plan) if len(plan) > 1 else plan

    def _avoid_nonfinite(self, plan: Plan, rng: np.random.Generator, model: FaultModel, pairs: bool, replace: bool,
                         pair_uniform: bool, read_words: Callable[[Plan], np.ndarray], elem: np.ndarray,
                         bit: np.ndarray | None, rounds: int) -> Plan:
        """Redraw the drawn sites of every element whose new value would be NaN/Inf.

        The plan holds unique elements (several drawn bits of one element are one row), while
        ``elem``/``bit`` hold the drawn sites: a bad row drops every drawn site of its element, and
        as many sites are drawn again (never a site drawn before), so the number of drawn sites stays
        the requested one for every fault model.
        """
        keys = sorted_distinct(elem * BIT_SLOTS + bit if bit is not None else elem)
        bad = self._nonfinite_sites(plan, read_words)
        resampled = 0
        for _ in range(rounds):
            if not bad.any():
                break
            bad_elems = sorted_distinct(self.starts[plan.tensor[bad]] + plan.index[bad])
            drop = sorted_contains(bad_elems, elem)
            nb = int(drop.sum())
            resampled += nb
            try:
                new_elem, new_bit = self._sample(rng, nb, pairs, replace, pair_uniform, taken=keys)
            except CapacityError:
                break
            new_keys = new_elem * BIT_SLOTS + new_bit if new_bit is not None else new_elem
            keys = sorted_distinct(np.concatenate([keys, new_keys]))
            extra = self._build(rng, model, new_elem, new_bit, distinct=not replace)
            plan = _concat(plan.select(~bad), extra)
            elem = np.concatenate([elem[~drop], new_elem])
            bit = None if bit is None or new_bit is None else np.concatenate([bit[~drop], new_bit])
            bad = self._nonfinite_sites(plan, read_words)
        if bad.any():
            raise NaNPolicyError(
                f"could not place {len(plan)} sites without creating NaN/Inf ({int(bad.sum())} still would after "
                f"{rounds} rounds of resampling); allow NaN/Inf or choose other bits"
            )
        plan.meta["nan_resampled"] = resampled
        return plan

    def _nonfinite_sites(self, plan: Plan, read_words: Callable[[Plan], np.ndarray]) -> np.ndarray:
        old = np.asarray(read_words(plan), dtype=np.uint64)
        bad = np.zeros(len(plan), bool)
        for tid, at in plan.per_tensor():
            dtype = self.tensors[tid].word
            wt = dtype
            if wt.kind != "f":
                continue
            if plan.scale is not None:
                new = scale_words(old[at], plan.scale[at], dtype)
            else:
                new = rule_words(old[at], plan.and_mask[at], plan.or_mask[at], plan.xor_mask[at], wt.bits)
            nan, inf = nonfinite(new, dtype)
            bad[at] = nan | inf
        return bad


def _popcount(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(np.asarray(x, dtype=np.uint64)).astype(np.int64)


def _concat(a: Plan, b: Plan) -> Plan:
    scale = None if a.scale is None and b.scale is None else np.concatenate([
        a.scale if a.scale is not None else np.full(len(a), np.nan), b.scale if b.scale is not None else np.full(len(b), np.nan)])
    out = Plan(a.tensors, np.concatenate([a.tensor, b.tensor]), np.concatenate([a.index, b.index]),
               np.concatenate([a.and_mask, b.and_mask]), np.concatenate([a.or_mask, b.or_mask]),
               np.concatenate([a.xor_mask, b.xor_mask]), scale, np.concatenate([a.bits, b.bits]), dict(a.meta))
    return merge_duplicate_elements(out)

