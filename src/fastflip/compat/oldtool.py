"""The older tool's sampling and value rules (hdf5_corrupter), reproduced and turned into a fastflip Plan.

Layer: ``compat`` (may import experiment and below; imported by cli).

Imports numpy and fastflip's core only. :func:`old_tool_plan` simulates the older tool's
injection loop with fastflip's seeded generator (the older tool seeded from the clock):

* each attempt picks a *location* uniformly from the location list (so every dataset is equally likely,
  whatever its size; a dataset listed under two prefixes twice as likely), then an element uniformly inside
  it, then passes with ``injection_probability``; picks are with replacement, so an element can be hit again
  and two flips of one bit cancel;
* floats are packed at ``float_precision`` bits (16/32/64, ``auto`` = the stored width), bits are flipped
  in that word in sign-first numbering, the NaN/Inf check runs on that word, and the value is written back
  in the stored dtype (float64 -> float32 rounds to nearest; too large becomes Inf): the float64 path;
* range mode draws ``burst`` distinct slots of ``start..end`` (with ``allow_sign_change`` the range starts
  one lower and that slot is the sign bit), in the older tool's chunks when ``burst`` exceeds the range;
  a flip that would give NaN/Inf is dropped and that many slots are drawn again (NaN re-draw);
* mask mode XORs ``bit_mask`` placed at a uniformly random offset of the word (offset re-drawn on NaN/Inf);
* integers (signed or not) flip one of the binary digits of ``|v|`` (leading zeros excluded), sign kept;
* scale mode multiplies in float64 and writes back in the stored dtype (integers truncate, saturating);
* an attempt that lands on a dataset of more than 4 dimensions (a Conv3D kernel) changes nothing: the older
  tool indexed up to 4 dimensions only, yet the attempt consumed one of its tries (logged with bits ``None``).

Every hit element's final stored word is compared with its original word: the plan holds each element
once with ``xor_mask = old ^ final`` (0 when the hits cancelled), which replays and reverts exactly.

Examples
--------
>>> import numpy as np
>>> from fastflip.compat.oldconfig import OldSettings
>>> from fastflip.core.plan import TensorRef
>>> s = OldSettings(tries=4, precision=32, first_bit=0, last_bit=0, allow_sign_change=False)
>>> ts = [TensorRef("/w", "<f4", (8,))]
>>> r = old_tool_plan(s, ts, array_reader([np.full(8, 2.0, "<f4")]), seed=1)
>>> r.attempts, sorted({hex(int(x)) for x in r.plan.xor_mask} - {'0x0'})
(4, ['0x80000000'])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..core.dtypes import from_words, to_words
from ..errors import NaNPolicyError, OptionError
from .oldconfig import OldSettings
from .sequence_check import element_of
from ..core.plan import Plan, TensorRef
from ..core.sampling import generator

__all__ = ["OldToolRun", "old_tool_plan", "array_reader", "draw_slots", "flip_float", "flip_int", "MAX_REDRAWS",
           "MAX_NDIM"]

MAX_REDRAWS = 1000  # the older tool recursed without bound (and crashed); fastflip stops and says so
MAX_NDIM = 4  # the older tool's corrupt_dataset indexed 0..4 dimensions; an attempt on more changed nothing
_FLOATS = {16: np.float16, 32: np.float32, 64: np.float64}
_UINTS = {16: np.uint16, 32: np.uint32, 64: np.uint64}
_EXP = {16: 0x7C00, 32: 0x7F800000, 64: 0x7FF0000000000000}
ReadWords = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (tensor ids, flat indices) -> uint64 words


@dataclass
class OldToolRun:
    """A simulated run: the plan and what the older tool would have logged.

    ``sequence`` is the injection sequence in the older tool's JSON shape: ``{location: [[indexes, bits],
    ...]}`` per attempt (bits ``None`` where the attempt did not pass its probability).
    """

    plan: Plan
    attempts: int
    corrupted: int
    nan_redraws: int = 0
    sequence: dict[str, list[Any]] = field(default_factory=dict)


def draw_slots(rng: np.random.Generator, start: int, end: int, length: int, sign_slot: bool) -> list[int]:
    """``length`` slots of ``start..end`` as the older tool drew them: distinct within chunks of
    ``end - start`` (so a burst longer than that may repeat a bit), the ``start`` slot meaning the sign bit
    (0) when ``sign_slot``. A one-slot range gives that slot (the older tool looped forever there)."""
    m = end - start + 1
    chunk = max(m - 1, 1)
    out: list[int] = []
    while length > 0:
        take = chunk if length > chunk else length
        out.extend((rng.choice(m, size=take, replace=False) + start).tolist() if m > 1 else [start] * take)
        length -= take
    return [0 if (sign_slot and s == start) else int(s) for s in out]


def _finite(word: int, width: int) -> bool:
    return (word & _EXP[width]) != _EXP[width]


def _pack(value: np.generic, width: int) -> int:
    with np.errstate(all="ignore"):
        return int(np.array(value).astype(_FLOATS[width]).reshape(1).view(_UINTS[width])[0])


def _unpack(word: int, width: int, dtype: np.dtype) -> np.generic:
    """The value written back: through a Python float (float64) as the older tool's ``struct.unpack`` gave it,
    which quiets a signalling NaN and, for half floats, returns the canonical NaN (payload lost)."""
    with np.errstate(all="ignore"):
        v = np.array([word], _UINTS[width]).view(_FLOATS[width]).astype(np.float64)
        if width == 16 and np.isnan(v[0]):
            v[0] = np.copysign(np.nan, -1.0 if word >> 15 else 1.0)
        return v.astype(dtype)[0]


def flip_float(value: np.generic, dtype: np.dtype, width: int, bits: Sequence[int], allow_nan: bool,
               redraw: Callable[[int], list[int]]) -> tuple[np.generic, list[int], int]:
    """Flip sign-first ``bits`` of ``value`` packed at ``width`` bits; return (stored value, bits, redraws).

    A flip whose result is NaN/Inf (at ``width`` bits) is skipped when ``allow_nan`` is false and
    ``redraw(n)`` gives the replacement bits, until every flip lands (the older tool's recursion).
    """
    word = _pack(value, width)
    pending, done, rounds = list(bits), [], 0
    while pending:
        failed = 0
        for b in pending:
            cand = word ^ (1 << (width - 1 - b))
            if not allow_nan and not _finite(cand, width):
                failed += 1
            else:
                word = cand
                done.append(b)
        if not failed:
            break
        rounds += 1
        if rounds > MAX_REDRAWS:
            raise NaNPolicyError(f"value {value!r}: no bit of the range keeps it finite after {MAX_REDRAWS} draws "
                                 "(the older tool recursed forever here); allow NaN values or change the bit range")
        pending = redraw(failed)
    return _unpack(word, width, dtype), done, rounds


def flip_mask(value: np.generic, dtype: np.dtype, width: int, mask: str, allow_nan: bool,
              rng: np.random.Generator) -> tuple[np.generic, list[int], int]:
    """XOR ``mask`` (sign-first string) at a uniformly random offset of the ``width``-bit word."""
    word, n = _pack(value, width), len(mask)
    pattern = int(mask, 2)
    for rounds in range(MAX_REDRAWS + 1):
        start = int(rng.integers(0, width - n + 1))
        cand = word ^ (pattern << (width - n - start))
        if allow_nan or _finite(cand, width):
            return _unpack(cand, width, dtype), [start + i for i, c in enumerate(mask) if c == "1"], rounds
    raise NaNPolicyError(f"value {value!r}: every offset of bit_mask {mask!r} gives NaN/Inf; allow NaN values")


def flip_int(value: np.generic, dtype: np.dtype, rng: np.random.Generator) -> tuple[np.generic, int]:
    """Flip one binary digit of ``|value|`` (sign kept); return (stored value, the digit's index from the left).

    The result wraps to the dtype in the one case it does not fit (``|min|`` of a signed type).
    """
    v = int(value)
    a = abs(v)
    digits = a.bit_length() or 1
    k = int(rng.integers(0, digits))
    new = a ^ (1 << (digits - 1 - k))
    new = -new if v < 0 else new
    bits = dtype.itemsize * 8
    if dtype.kind == "i":
        new = (new + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
    return np.array(new).astype(dtype)[()], k


def _scale(value: np.generic, dtype: np.dtype, factor: float) -> np.generic:
    with np.errstate(all="ignore"):
        x = np.float64(value) * np.float64(factor)
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            x = 0.0 if np.isnan(x) else float(np.clip(np.trunc(x), info.min, info.max))
            return np.array(int(x)).astype(dtype)[()]
        return np.array(x).astype(dtype)[()]


class _Simulator:
    """The per-value rules for one settings object (one call per attempt that passed)."""

    def __init__(self, s: OldSettings, rng: np.random.Generator, sign_slot_shift: bool = True) -> None:
        self.s, self.rng, self.shift, self.redraws = s, rng, sign_slot_shift, 0

    def width(self, dtype: np.dtype) -> int:
        if self.s.precision == "auto":
            return dtype.itemsize * 8 if dtype.kind == "f" else 64
        return int(self.s.precision)

    def slots(self, width: int) -> tuple[int, int]:
        return self.s.slots(width) if self.shift else self.s.bit_range(width)

    def hit(self, value: np.generic, dtype: np.dtype, bits: Sequence[int] | None = None) -> tuple[np.generic, Any]:
        s = self.s
        if s.mode == "scale":
            return _scale(value, dtype, float(s.scaling_factor or 1.0)), [-2]
        if dtype.kind in "iu":
            return flip_int(value, dtype, self.rng)
        w = self.width(dtype)
        if s.mode == "mask" and bits is None:
            new, done, r = flip_mask(value, dtype, w, s.bit_mask or "", s.allow_nan, self.rng)
            self.redraws += r
            return new, done
        start, end = self.slots(w)

        def redraw(n: int) -> list[int]:
            return draw_slots(self.rng, start, end, n, s.allow_sign_change)

        chosen = list(bits) if bits is not None else redraw(s.burst)
        if any(not 0 <= b < w for b in chosen):
            raise OptionError(f"bit {max(chosen)} of the injection sequence lies past the {w}-bit word")
        new, done, r = flip_float(value, dtype, w, chosen, s.allow_nan, redraw)
        self.redraws += r
        return new, done


def array_reader(arrays: Sequence[np.ndarray]) -> ReadWords:
    """A ``read_words`` for :func:`old_tool_plan` over in-memory arrays (one per tensor, in tensor order)."""

    def read(tids: np.ndarray, idx: np.ndarray) -> np.ndarray:
        out = np.zeros(len(idx), np.uint64)
        for t in np.unique(tids).tolist():
            at = tids == t
            out[at] = to_words(np.asarray(arrays[t]).reshape(-1)[idx[at]]).astype(np.uint64)
        return out

    return read


def old_tool_plan(s: OldSettings, tensors: Sequence[TensorRef], read_words: ReadWords, *, seed: int,
                  stream: Sequence[int] = (), locations: Sequence[int] | None = None,
                  bases: Sequence[str] | None = None, file_entries: int | None = None,
                  sequence: "dict[str, list[Any]] | None" = None) -> OldToolRun:
    """Simulate the older tool on ``tensors`` and return the plan (see the module docstring).

    ``locations`` lists tensor ids as the older tool's location list (default: each tensor once);
    ``bases`` the location (prefix) each entry came from, for the saved sequence. ``read_words(tensor_ids,
    flat_indices)`` returns the stored words (native-order uint64) of those elements, all in one call. ``sequence`` replays an older tool's injection sequence
    (``{prefix: [[indexes, bits], ...]}`` or ``{prefix: [bits, ...]}``) instead of drawing attempts.
    """
    rng = generator(seed, stream)
    locs = list(range(len(tensors))) if locations is None else list(locations)
    if not locs:
        raise OptionError("no datasets to corrupt")
    base_of = list(bases) if bases is not None else [tensors[t].name for t in locs]
    sizes = np.array([max(t.size, 1) for t in tensors], np.int64)
    sim = _Simulator(s, rng, sign_slot_shift=sequence is None)
    if sequence is None:
        n = s.attempts(int(file_entries if file_entries is not None else sizes.sum()))
        pick = rng.integers(0, len(locs), size=n) if len(locs) > 1 else np.zeros(n, np.int64)
        tid = np.asarray(locs, np.int64)[pick] if n else np.zeros(0, np.int64)
        elem = (rng.random(n) * sizes[tid]).astype(np.int64) if n else np.zeros(0, np.int64)
        passed = rng.random(n) < s.probability
        given: list[Any] = [None] * n
        base = [base_of[i] for i in pick.tolist()]
    else:
        tid_l, elem_l, given, base = [], [], [], []
        for prefix, entries in sequence.items():
            inner = [i for i, b in enumerate(base_of) if tensors[locs[i]].name.startswith(prefix)]
            if not inner:
                raise OptionError(f"the injection sequence names {prefix!r}, which matches no dataset")
            for e in entries:
                idx, bits = (e[0], e[1]) if (isinstance(e, list) and len(e) == 2 and isinstance(e[0], list)) else ([], e)
                if bits is None:
                    continue
                t = locs[inner[int(rng.integers(0, len(inner)))]]
                shape = tensors[t].shape
                flat = element_of(idx, shape, prefix) if idx and shape else int(rng.integers(0, sizes[t]))
                tid_l.append(t)
                elem_l.append(flat)
                given.append(None if isinstance(bits, int) or bits == [-2] else [int(b) for b in bits])
                base.append(prefix)
        n = len(tid_l)
        tid, elem, passed = np.array(tid_l, np.int64), np.array(elem_l, np.int64), np.ones(n, bool)
    deep = np.array([len(t.shape) > MAX_NDIM for t in tensors], bool)[tid] if n else np.zeros(0, bool)
    passed &= ~deep  # the attempt is spent, nothing changes (the older tool fell through its ndim cases)
    keys = np.unique(tid[passed] * (1 << 40) + elem[passed])
    ut, ue = keys >> 40, keys & ((1 << 40) - 1)
    current: dict[int, np.generic] = {}
    old_words = np.asarray(read_words(ut, ue), np.uint64) if len(keys) else np.zeros(0, np.uint64)
    for t in np.unique(ut).tolist():
        at = np.flatnonzero(ut == t)
        vals = from_words(old_words[at], tensors[t].dtype)
        for j, v in zip(at.tolist(), vals):
            current[int(keys[j])] = v
    seq: dict[str, list[Any]] = {}
    corrupted = 0
    for i in range(n):
        t, e = int(tid[i]), int(elem[i])
        bits: Any = None
        if passed[i]:
            k = t * (1 << 40) + e
            dt = np.dtype(tensors[t].dtype)
            current[k], bits = sim.hit(current[k], dt, given[i])
            corrupted += 1
        idx = [int(x) for x in np.unravel_index(e, tensors[t].shape)] if tensors[t].shape else [0]
        seq.setdefault(base[i], []).append([idx if s.save_indexes else [], bits])
    new_words = np.zeros(len(keys), np.uint64)
    for t in np.unique(ut).tolist():
        at = np.flatnonzero(ut == t)
        dt = np.dtype(tensors[t].dtype)
        new_words[at] = to_words(np.array([current[int(keys[j])] for j in at.tolist()], dt)).astype(np.uint64)
    xor = old_words ^ new_words
    plan = Plan.from_sites(tensors, ut.astype(np.int32), ue, xor_mask=xor)
    plan.meta.update({"design": "oldtool", "attempts": int(n), "corrupted": corrupted, "elements_hit": int(len(keys)),
                      "unchanged": int((xor == 0).sum()), "nan_redraws": sim.redraws, "seed": int(seed),
                      "stream": [int(x) for x in stream], "generator": "philox/seedsequence",
                      "float_precision": s.precision, "from_sequence": sequence is not None,
                      "skipped_over_4d": int(deep.sum())})
    return OldToolRun(plan, int(n), corrupted, sim.redraws, seq)
