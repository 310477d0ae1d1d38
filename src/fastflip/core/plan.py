"""The injection plan: columnar arrays that every backend applies the same way.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

A plan lists *unique* elements of named tensors and, for each, the rule that turns
its old raw word into the new one. Every bitwise fault model (flip, random-bits, adjacent, mask,
stuck-at, zero, set-a-value) reduces to three word masks::

    new = ((old & and_mask) | or_mask) ^ xor_mask

Scaling is the one value-level model: where ``scale`` is not NaN the new value is
``value(old) * scale`` (floats round to nearest; integers round half away from zero
and saturate at the dtype's limits); its masks are the identity.

Masks are native-order unsigned integers in uint64 columns (only the low ``bits``
of the tensor's word width are meaningful); bit 0 is the least significant bit of
the stored value. Because elements are unique, backends may apply sites in any
order or in parallel.

Examples
--------
>>> import numpy as np
>>> from fastflip.core.plan import Plan, TensorRef
>>> p = Plan.from_sites([TensorRef("w", "<f4", (4,))], tensor=[0], index=[2], xor_mask=[1 << 30])
>>> len(p), p.tensors[0].name
(1, 'w')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from .dtypes import WordType, word_type
from .floatformats import format_name
from ..errors import OptionError

__all__ = ["TensorRef", "Plan", "compose_masks", "merge_duplicate_elements", "readonly"]

IDENTITY_AND = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class TensorRef:
    """Name, dtype (byte order included, as a numpy dtype string) and shape of a plan's tensor.

    ``format`` names a float format held in unsigned words (``bfloat16``,
    ``float8_e4m3fn``, ``float8_e5m2``; see :mod:`fastflip.core.floatformats`): ``dtype`` is then
    the storage (``<u2``) and :attr:`word` describes the bits. A format name may also be
    given as the dtype: ``TensorRef("w", "bfloat16", (4,))``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    format: str | None = None

    def __post_init__(self) -> None:
        wt = word_type(self.dtype, self.format) if self.format or format_name(str(self.dtype)) else None
        object.__setattr__(self, "dtype", wt.dtype.str if wt is not None else np.dtype(self.dtype).str)
        object.__setattr__(self, "format", wt.format if wt is not None else None)
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def word(self) -> WordType:
        """The :class:`~fastflip.core.dtypes.WordType` of the stored words (the format's fields when it has one)."""
        return word_type(self.dtype, self.format)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.format:
            d["format"] = self.format
        return d


def readonly(values: Any, dtype: Any) -> np.ndarray:
    """``values`` as a C-contiguous, read-only array of ``dtype`` that nothing else can change.

    An array that owns its data (or a fresh conversion) is made read-only in place: a plan takes
    ownership of the columns it is given. A view whose memory something else could still write (a
    writable base) is copied first.

    >>> a = np.arange(3)
    >>> r = readonly(a, np.int64)
    >>> r is a, a.flags.writeable
    (True, False)
    >>> base = np.arange(4)
    >>> v = readonly(base[1:], np.int64)
    >>> np.shares_memory(v, base), base.flags.writeable
    (False, True)
    """
    arr = np.ascontiguousarray(values, dtype=dtype)
    if arr.base is not None and not _immutable_base(arr):
        arr = arr.copy()
    arr.flags.writeable = False
    return arr


def _immutable_base(arr: np.ndarray) -> bool:
    """True when no object below the view ``arr`` can write its memory (read-only arrays down to bytes)."""
    base: Any = arr
    while isinstance(base, np.ndarray):
        if base is not arr and base.flags.writeable:
            return False
        base = base.base
    return base is None or isinstance(base, bytes)


@dataclass
class Plan:
    """Columnar injection plan (see the module docstring for the word rule).

    Its columns are read-only (:func:`readonly`): a plan that was applied stays the plan its log
    describes. Build a new plan (``select``, ``Plan(...)``, ``dataclasses.replace``) to change sites.

    Attributes
    ----------
    tensors : tuple of TensorRef
        The tensors the plan refers to; ``tensor`` indexes into it.
    tensor : int32 array
    index : int64 array
        Flat (C-order) element index inside the tensor.
    and_mask, or_mask, xor_mask : uint64 arrays
    scale : float64 array or None
        NaN where the site is bitwise; the factor where it scales.
    bits : uint64 array
        The bit positions the fault model touched (as a mask), for logs and reports.
    meta : dict
        Seed, options and anything else that produced the plan (goes into the log).
    """

    tensors: tuple[TensorRef, ...]
    tensor: np.ndarray
    index: np.ndarray
    and_mask: np.ndarray
    or_mask: np.ndarray
    xor_mask: np.ndarray
    scale: np.ndarray | None = None
    bits: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.index)
        self.tensor = readonly(self.tensor, np.int32)
        self.index = readonly(self.index, np.int64)
        for name in ("and_mask", "or_mask", "xor_mask"):
            setattr(self, name, readonly(getattr(self, name), np.uint64))
        if self.scale is not None:
            self.scale = readonly(self.scale, np.float64)
        if self.bits is None:
            self.bits = self.touched_mask()
        self.bits = readonly(self.bits, np.uint64)
        cols = [self.tensor, self.index, self.and_mask, self.or_mask, self.xor_mask, self.bits]
        if self.scale is not None:
            cols.append(self.scale)
        if any(len(c) != n for c in cols):
            raise OptionError("plan columns must all have the same length")
        self.tensors = tuple(self.tensors)

    def __len__(self) -> int:
        return len(self.index)

    @classmethod
    def from_sites(
        cls,
        tensors: Sequence[TensorRef],
        tensor: Iterable[int],
        index: Iterable[int],
        *,
        and_mask: Iterable[int] | None = None,
        or_mask: Iterable[int] | None = None,
        xor_mask: Iterable[int] | None = None,
        scale: Iterable[float] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> "Plan":
        """Build a plan from per-site columns; missing masks default to the identity."""
        tensor = np.asarray(list(tensor) if not isinstance(tensor, np.ndarray) else tensor, dtype=np.int32)
        n = len(tensor)

        def col(v: Iterable[int] | None, default: np.uint64) -> np.ndarray:
            if v is None:
                return np.full(n, default, dtype=np.uint64)
            return np.array([int(x) for x in v], dtype=np.uint64) if not isinstance(v, np.ndarray) else v.astype(np.uint64)

        return cls(
            tensors=tuple(tensors),
            tensor=tensor,
            index=np.asarray(list(index) if not isinstance(index, np.ndarray) else index, dtype=np.int64),
            and_mask=col(and_mask, IDENTITY_AND),
            or_mask=col(or_mask, np.uint64(0)),
            xor_mask=col(xor_mask, np.uint64(0)),
            scale=None if scale is None else np.asarray(list(scale), dtype=np.float64),
            meta=dict(meta or {}),
        )

    def touched_mask(self) -> np.ndarray:
        """Bits that the masks can change (forced or flipped), per site."""
        forced = ~self.and_mask  # bits forced to or_mask
        return (forced | self.xor_mask) & self.width_masks()

    def width_masks(self) -> np.ndarray:
        """All-ones mask of each site's word width."""
        widths = np.array([(1 << word_type(t.dtype).bits) - 1 for t in self.tensors] or [0], dtype=np.uint64)
        return widths[self.tensor] if len(self.tensor) else np.zeros(0, dtype=np.uint64)

    def select(self, keep: np.ndarray) -> "Plan":
        """A plan holding only the sites where ``keep`` is true (or at the given positions)."""
        return Plan(
            tensors=self.tensors,
            tensor=self.tensor[keep],
            index=self.index[keep],
            and_mask=self.and_mask[keep],
            or_mask=self.or_mask[keep],
            xor_mask=self.xor_mask[keep],
            scale=None if self.scale is None else self.scale[keep],
            bits=self.bits[keep] if self.bits is not None else None,
            meta=dict(self.meta),
        )

    def per_dtype(self) -> list[tuple[Any, np.ndarray]]:
        """Group site positions by tensor dtype: ``[(dtype string, positions), ...]``.

        A tensor with a float format is grouped under its :class:`~fastflip.core.dtypes.WordType`
        (``word_type`` and the word-rule helpers accept either form).
        """
        if not len(self):
            return []
        dts = [t.dtype + (f":{t.format}" if t.format else "") for t in self.tensors]
        kinds = sorted(set(dts))
        word = {d: t.word if t.format else t.dtype for d, t in zip(dts, self.tensors)}
        if len(kinds) == 1:
            return [(word[kinds[0]], np.arange(len(self)))]
        code = np.array([kinds.index(d) for d in dts], dtype=np.int64)[self.tensor]
        return [(word[k], np.flatnonzero(code == i)) for i, k in enumerate(kinds) if (code == i).any()]

    def per_tensor(self) -> list[tuple[int, np.ndarray]]:
        """Group site positions by tensor: ``[(tensor_id, positions), ...]`` in tensor order."""
        if not len(self):
            return []
        t = self.tensor
        if len(t) == 1 or bool((t[1:] >= t[:-1]).all()):  # plans come sorted by tensor: runs, no sort
            order = np.arange(len(t))
            st = t
        else:
            order = np.argsort(t, kind="stable")
            st = t[order]
        starts = np.concatenate([[0], np.flatnonzero(st[1:] != st[:-1]) + 1])
        bounds = np.append(starts[1:], len(st))
        return [(int(st[s]), order[s:e]) for s, e in zip(starts.tolist(), bounds.tolist())]


def compose_masks(
    first: tuple[np.ndarray, np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masks of applying rule ``first`` then rule ``second`` (both in the AND/OR/XOR form).

    Every per-bit rule is one of keep / flip / set-0 / set-1, so the composition is
    again of that form: evaluate it on an all-zeros and an all-ones word.

    >>> a = (np.array([~np.uint64(0)]), np.array([np.uint64(0)]), np.array([np.uint64(1)]))
    >>> [int(m[0]) & 3 for m in compose_masks(a, a)]  # flip twice == keep
    [3, 0, 0]
    """

    def rule(m: tuple[np.ndarray, np.ndarray, np.ndarray], x: np.ndarray) -> np.ndarray:
        return ((x & m[0]) | m[1]) ^ m[2]

    zeros = np.zeros_like(first[0])
    ones = ~zeros
    r0 = rule(second, rule(first, zeros))
    r1 = rule(second, rule(first, ones))
    keep = ~(r0 ^ r1)  # bits that do not depend on the input are constants
    and_mask = ~keep
    or_mask = r0 & keep
    xor_mask = r0 & and_mask
    return and_mask, or_mask, xor_mask


def _merge_sorted(plan: Plan, step: np.ndarray) -> Plan:
    """:func:`merge_duplicate_elements` for a plan already ordered by (tensor, index): only repeats are touched."""
    start = np.empty(len(plan), dtype=bool)
    start[0] = True
    np.not_equal(step, 0, out=start[1:])
    dpos = np.flatnonzero(~start)
    first = dpos - 1
    while True:  # walk back to each repeat's first site
        back = ~start[first]
        if not back.any():
            break
        first[back] -= 1
    # compress first, then compose the repeats into their element's (compressed) row
    a, o, x = plan.and_mask[start], plan.or_mask[start], plan.xor_mask[start]
    bits = plan.bits[start] if plan.bits is not None else None
    row = np.cumsum(start)[first] - 1
    dist = dpos - first
    for d in np.unique(dist).tolist():  # second sites first, then third, ...: plan order within each element
        at = dist == d
        f, p = row[at], dpos[at]
        a[f], o[f], x[f] = compose_masks((a[f], o[f], x[f]), (plan.and_mask[p], plan.or_mask[p], plan.xor_mask[p]))
        if bits is not None:
            bits[f] |= plan.bits[p]
    return Plan(plan.tensors, plan.tensor[start], plan.index[start], a, o, x,
                None if plan.scale is None else plan.scale[start], bits, dict(plan.meta))


def merge_duplicate_elements(plan: Plan) -> Plan:
    """Merge sites that hit the same element into one site (masks composed in plan order).

    The merged plan is ordered by (tensor, index). Scale sites cannot be merged
    with others: a plan with a duplicated scale site is refused.

    >>> p = Plan.from_sites([TensorRef("w", "<u1", (4,))], [0, 0], [3, 3], xor_mask=[1, 2])
    >>> m = merge_duplicate_elements(p)
    >>> len(m), int(m.xor_mask[0]), int(m.bits[0])
    (1, 3, 3)
    """
    if len(plan) < 2:
        return plan
    key = plan.tensor.astype(np.int64) * (1 << 40) + plan.index  # tensors hold < 2**40 elements
    step = key[1:] - key[:-1]
    if (step > 0).all():  # sorted and distinct: nothing to merge
        return plan
    if plan.scale is not None and not np.isnan(plan.scale).all():
        raise OptionError("a scale site cannot share an element with another site")
    if (step >= 0).all():
        return _merge_sorted(plan, step)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    start = np.empty(len(sk), dtype=bool)
    start[0] = True
    np.not_equal(sk[1:], sk[:-1], out=start[1:])
    first_pos = np.flatnonzero(start)
    counts = np.diff(np.append(first_pos, len(sk)))
    first = order[first_pos]
    a, o, x = plan.and_mask[first], plan.or_mask[first], plan.xor_mask[first]
    bits = plan.bits[first] if plan.bits is not None else None
    multi = np.flatnonzero(counts > 1)
    for k in range(1, int(counts.max())):
        g = multi[counts[multi] > k]
        pos = order[first_pos[g] + k]
        a[g], o[g], x[g] = compose_masks((a[g], o[g], x[g]), (plan.and_mask[pos], plan.or_mask[pos], plan.xor_mask[pos]))
        if bits is not None:
            bits[g] |= plan.bits[pos]
    return Plan(
        tensors=plan.tensors,
        tensor=plan.tensor[first],
        index=plan.index[first],
        and_mask=a,
        or_mask=o,
        xor_mask=x,
        scale=None if plan.scale is None else plan.scale[first],
        bits=bits,
        meta=dict(plan.meta),
    )
