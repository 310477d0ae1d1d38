"""The selected tensors × allowed bits as index ranges, and draws of distinct sites from them.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

:class:`SiteDraws` is the base of :class:`fastflip.core.sampling.SiteSpace`: it lays the selected tensors
out as consecutive element ranges (and (element, bit) pair ranges over each dtype group's allowed bits),
checks the distribution, and draws sites under it from a generator it is given: rounds of draws with a
margin for collisions, or from :data:`BULK` sites on, uniform draws generated in sorted order from
exponential spacings; repeats are dropped and a surplus removed at uniformly drawn positions (under
'tensor' or weights, the first distinct draws in draw order are kept). A site key is
``element * BIT_SLOTS + bit`` for bit sites, the element otherwise.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .bits import BitSpec
from .dtypes import word_type
from ..errors import BitRangeError, CapacityError, OptionError
from .faults import GroupBits
from .plan import TensorRef

__all__ = ["BIT_SLOTS", "BULK", "DENSE_FRACTION", "SiteDraws", "sorted_contains", "sorted_distinct"]

BIT_SLOTS = 64  # pair key = element * 64 + bit
DENSE_FRACTION = 0.25  # above this fill ratio, draw exactly with choice(replace=False)
MAX_ROUNDS = 64
BULK = 4096  # from this many sites on, draw them already sorted (see SiteDraws._sample_bulk)


class SiteDraws:
    """The selected tensors × allowed bits as index ranges, and draws of sites from them (parameters:
    :class:`fastflip.core.sampling.SiteSpace`)."""

    def __init__(
        self,
        tensors: Sequence[TensorRef],
        bits: "BitSpec | str | Sequence[int | str] | None" = None,
        distribution: "str | Mapping[str, float]" = "element",
    ) -> None:
        self.tensors = tuple(tensors)
        if not self.tensors:
            raise OptionError("no tensors to sample from")
        self.bits = BitSpec.parse(bits)
        self.tensors, self.left_out = _with_fields(self.tensors, self.bits)
        self.sizes = np.array([t.size for t in self.tensors], dtype=np.int64)
        if (self.sizes == 0).any():
            empty = [t.name for t, s in zip(self.tensors, self.sizes) if s == 0]
            raise OptionError(f"empty tensors cannot be injected: {', '.join(empty[:5])}; exclude them")
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.n_elements = int(self.starts[-1])
        dtypes: list[tuple[str, str | None]] = []  # (storage dtype, float format): bf16 is not uint16
        gid = np.empty(len(self.tensors), dtype=np.int64)
        for i, t in enumerate(self.tensors):
            if (t.dtype, t.format) not in dtypes:
                dtypes.append((t.dtype, t.format))
            gid[i] = dtypes.index((t.dtype, t.format))
        self.group_of = gid
        self.groups = [GroupBits(np.array(self.bits.resolve(word_type(d, f)), dtype=np.int64), word_type(d).bits)
                       for d, f in dtypes]
        self.nbits = np.array([len(self.groups[g].positions) for g in gid], dtype=np.int64)
        maxm = max(len(g.positions) for g in self.groups)
        self._pos_table = np.zeros((len(self.groups), maxm), dtype=np.int64)
        for k, g in enumerate(self.groups):
            self._pos_table[k, : len(g.positions)] = g.positions
        self._gm = np.array([len(g.positions) for g in self.groups], dtype=np.int64)
        self.pair_starts = np.concatenate([[0], np.cumsum(self.sizes * self.nbits)]).astype(np.int64)
        self.n_pairs = int(self.pair_starts[-1])
        if isinstance(distribution, str):
            if distribution not in ("element", "tensor"):
                raise OptionError(f"distribution must be 'element', 'tensor' or a mapping of weights (got {distribution!r})")
            self.distribution: str | dict[str, float] = distribution
            self._weights = None
        else:
            names = {t.name for t in self.tensors}
            unknown = sorted(set(distribution) - names)
            if unknown:
                raise OptionError(f"weights name tensors that are not selected: {', '.join(unknown[:5])}")
            w = np.array([float(distribution.get(t.name, 0.0)) for t in self.tensors])
            if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
                raise OptionError("weights must be finite, non-negative and not all zero")
            self.distribution = dict(distribution)
            self._weights = w / w.sum()

    # -- drawing -------------------------------------------------------------------------
    def _tensor_of(self, element: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, element, side="right") - 1

    def _draw_elements(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Global element indices under the space's distribution (with replacement)."""
        if self._weights is None and self.distribution == "element":
            return rng.integers(0, self.n_elements, size=n, dtype=np.int64)
        if self._weights is None:
            t = rng.integers(0, len(self.tensors), size=n)
        else:
            t = rng.choice(len(self.tensors), size=n, p=self._weights)
        return self.starts[t] + rng.integers(0, self.sizes[t], dtype=np.int64)

    def _draw_bits(self, rng: np.random.Generator, elem: np.ndarray) -> np.ndarray:
        if len(self.groups) == 1:
            k = (rng.random(len(elem)) * self._gm[0]).astype(np.int64)
            return self.groups[0].positions[k]
        g = self.group_of[self._tensor_of(elem)]
        k = (rng.random(len(elem)) * self._gm[g]).astype(np.int64)
        return self._pos_table[g, k]

    def _capacity(self, pairs: bool) -> int:
        if self._weights is None:
            return self.n_pairs if pairs else self.n_elements
        mask = self._weights > 0
        return int((self.sizes * self.nbits)[mask].sum()) if pairs else int(self.sizes[mask].sum())

    def _pairs_from_index(self, pair: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map pair-space indices (uniform over all allowed bits) to (element, bit)."""
        t = np.searchsorted(self.pair_starts, pair, side="right") - 1
        local = pair - self.pair_starts[t]
        m = self.nbits[t]
        elem = self.starts[t] + local // m
        bit = self._pos_table[self.group_of[t], local % m]
        return elem, bit

    def _sample(self, rng: np.random.Generator, k: int, pairs: bool, replace: bool, pair_uniform: bool,
                taken: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """k sites as (global element, bit or None), sorted by element then bit.

        ``taken`` holds site keys (sorted) that must not be drawn again. Draws go in
        rounds: the missing number of sites plus a margin for collisions is drawn,
        repeats are dropped, and a surplus is removed at positions drawn uniformly
        (a uniform subset of uniform distinct draws stays uniform); in the sparse case
        of real checkpoints one round is the rule. Under a non-uniform distribution
        ('tensor', weights) the first k distinct draws in draw order are kept instead:
        a draw repeated is drawn again, as in successive draws without replacement (a
        uniform subset of the distinct draws would favour the sites that collide less,
        those of large tensors).
        """
        if k == 0:
            return np.zeros(0, np.int64), (np.zeros(0, np.int64) if pairs else None)
        cap = self._capacity(pairs) - (0 if taken is None else len(taken))
        if not replace and k > cap:
            unit = "(element, bit) sites" if pairs else "elements"
            raise CapacityError(f"asked for {k} distinct sites but the selection has only {cap} {unit}; "
                                f"lower the count, select more tensors or bits, or allow repeats")
        uniform = self._weights is None and (self.distribution == "element")
        if not replace and taken is None and uniform and k > DENSE_FRACTION * cap:
            if pairs:
                idx = np.sort(rng.choice(self.n_pairs, size=k, replace=False).astype(np.int64))
                return self._pairs_from_index(idx)
            return np.sort(rng.choice(self.n_elements, size=k, replace=False).astype(np.int64)), None
        keys = np.zeros(0, np.int64)
        if not replace and taken is None and uniform and k >= BULK:
            keys = self._sample_bulk(rng, k, pairs, pair_uniform)
            if len(keys) == k:
                return (keys // BIT_SLOTS, keys % BIT_SLOTS) if pairs else (keys, None)
        known = np.zeros(0, np.int64) if taken is None else np.asarray(taken, np.int64)
        in_order = np.zeros(0, np.int64)  # non-uniform: the distinct draws so far, in draw order
        for _ in range(MAX_ROUNDS):
            need = k - len(keys)
            if need <= 0:
                break
            # draw a few more than needed (the expected collisions, twice, plus a little): one round is the rule
            n = need if replace else need + int(2.0 * need * (need + len(keys) + len(known)) / max(cap, 1)) + 8
            if pairs and pair_uniform:
                elem, bit = self._pairs_from_index(rng.integers(0, self.n_pairs, size=n, dtype=np.int64))
            else:
                elem = self._draw_elements(rng, n)
                bit = self._draw_bits(rng, elem) if pairs else None
            new = elem * BIT_SLOTS + bit if pairs else elem
            if replace:
                keys = np.sort(new)
                break
            if len(known):
                new = new[~sorted_contains(known, new)]
            if not uniform:
                in_order = np.concatenate([in_order, new])
                first = np.unique(in_order, return_index=True)[1]
                in_order = in_order[np.sort(first)][:k]
                keys = np.sort(in_order)
                continue
            if len(keys):
                keys = sorted_distinct(np.concatenate([keys, np.sort(new)]), merge=True)
            else:
                keys = sorted_distinct(new)
            if len(keys) > k:  # the surplus goes at random positions: a uniform subset of uniform distinct draws
                keys = np.delete(keys, rng.choice(len(keys), len(keys) - k, replace=False))
        if len(keys) < k:
            raise CapacityError(f"could not place {k} distinct sites after {MAX_ROUNDS} rounds of draws "
                                "(the distribution concentrates on too few sites); lower the count or allow repeats")
        if pairs:
            return keys // BIT_SLOTS, keys % BIT_SLOTS
        return keys, None

    def _sample_bulk(self, rng: np.random.Generator, k: int, pairs: bool, pair_uniform: bool) -> np.ndarray:
        """Many distinct sites at once, drawn already sorted (at most k keys, rarely fewer).

        Sorted uniform draws come from the spacings of exponential variates (the order
        statistics of n uniforms are the normalised cumulative sums of n + 1 exponentials),
        so no sort is needed: linear time. A draw ``u`` in [0, N) picks element ``floor(u)``
        and, for bit sites, the bit ``floor(frac(u) * m)`` of that element's m allowed bits
        (uniform, as ``u`` is uniform inside the element). Per-bit rates draw uniformly over
        all (element, bit) pairs instead.
        """
        space = self.n_pairs if pair_uniform else self.n_elements
        n = k + int(2.0 * k * k / max(self._capacity(pairs), 1)) + 8
        spacing = np.cumsum(rng.standard_exponential(n + 1))
        u = spacing[:-1] * (space / spacing[-1])
        whole = np.minimum(u.astype(np.int64), space - 1)
        if pair_uniform:
            elem, bit = self._pairs_from_index(whole)
            keys = elem * BIT_SLOTS + bit
        elif pairs:
            t = np.repeat(np.arange(len(self.tensors)), np.diff(np.searchsorted(whole, self.starts)))
            g = self.group_of[t]
            slot = np.minimum(((u - whole) * self._gm[g]).astype(np.int64), self._gm[g] - 1)
            keys = whole * BIT_SLOTS + self._pos_table[g, slot]
        else:
            keys = whole
        keep = np.empty(len(keys), bool)
        keep[0] = True
        np.not_equal(keys[1:], keys[:-1], out=keep[1:])
        keys = keys[keep]
        if len(keys) > k:
            keys = np.delete(keys, rng.choice(len(keys), len(keys) - k, replace=False))
        return keys


def _with_fields(tensors: tuple[TensorRef, ...], bits: BitSpec) -> tuple[tuple[TensorRef, ...], dict[str, Any]]:
    """Named fields select the tensors that have them: the others are left out (and said so).

    Returns the kept tensors and ``{}`` or ``{"fields": [...], "tensors": [names]}``.

    Raises
    ------
    BitRangeError
        When no tensor has the fields (the message names the tensors and the fix).
    """
    missing: dict[tuple[str, str | None], tuple[str, ...]] = {}
    for t in tensors:
        if (t.dtype, t.format) not in missing:
            missing[(t.dtype, t.format)] = bits.missing_fields(t.word)
    if not any(missing.values()):
        return tensors, {}
    keep = tuple(t for t in tensors if not missing[(t.dtype, t.format)])
    out = [t.name for t in tensors if missing[(t.dtype, t.format)]]
    fields = sorted({f for m in missing.values() for f in m})
    if not keep:
        names = ", ".join(f"{t.name} ({t.word.name})" for t in tensors[:5])
        more = f" and {len(tensors) - 5} more" if len(tensors) > 5 else ""
        raise BitRangeError(f"bits {','.join(bits.items)}: no selected tensor has the field(s) {', '.join(fields)} "
                            f"({names}{more}); select float tensors (--dtype float) or give bit positions")
    return keep, {"fields": fields, "tensors": out}


def sorted_distinct(keys: np.ndarray, merge: bool = False) -> np.ndarray:
    """Sorted distinct values (np.unique without its slower paths).

    ``merge=True`` says ``keys`` is two sorted runs: a stable sort merges them in linear time.
    """
    s = np.sort(keys, kind="stable" if merge else None)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s if keep.all() else s[keep]


def sorted_contains(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Membership of ``keys`` in the sorted array ``sorted_keys``."""
    pos = np.searchsorted(sorted_keys, keys)
    pos[pos == len(sorted_keys)] = 0
    return sorted_keys[pos] == keys
