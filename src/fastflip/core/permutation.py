"""A keyed, counter-based permutation of ``[0, n)``: sampling without replacement, one position at a time.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

:class:`Permutation` is a bijection of ``[0, n)`` chosen by a key (a sequence of
non-negative integers, hashed through :class:`numpy.random.SeedSequence`): an 8-round
Feistel network on the smallest even number of bits that covers ``n`` (round function:
the SplitMix64 finaliser of the half-word plus a round key), restricted to ``[0, n)`` by
cycle walking (a value outside the range is permuted again until it falls inside; the
domain is below ``4 n``, so a few steps at most on average). Position ``i`` maps to
``perm[i]`` with no state: the first ``t`` positions are ``t`` distinct values, and any
one of them is computed alone. This is how a campaign cell's trials draw distinct sites
while trial ``i`` is still regenerated from (seed, cell, i) alone (see
:mod:`fastflip.campaign.cells`).

Only NumPy is used (core layer).

Examples
--------
>>> p = Permutation(10, key=[7, 0])
>>> sorted(p(np.arange(10)).tolist()) == list(range(10))
True
>>> int(p(np.array([3]))[0]) == int(p(np.arange(10))[3])
True
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import OptionError

__all__ = ["Permutation"]

_ROUNDS = 8
_FEW = 16  # out-of-range values after the first vectorised pass finished one by one
_U64 = (1 << 64) - 1
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijective 64-bit mixer), elementwise on uint64."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class Permutation:
    """A keyed bijection of ``[0, n)`` (see the module docstring).

    Parameters
    ----------
    n : int
        The size of the range (at least 1).
    key : sequence of int
        Selects the permutation (e.g. ``[seed, cell, pass]``).
    """

    def __init__(self, n: int, key: Sequence[int]) -> None:
        n = int(n)
        if n < 1:
            raise OptionError(f"a permutation needs at least one element (got n = {n})")
        if n > 1 << 62:
            raise OptionError(f"a permutation of {n} elements is beyond 2**62")
        self.n = n
        self.key = tuple(int(k) for k in key)
        bits = max(4, (n - 1).bit_length())
        bits += bits % 2
        self.half = bits // 2
        self._mask = np.uint64((1 << self.half) - 1)
        self._keys = np.random.SeedSequence(list(self.key)).generate_state(_ROUNDS, np.uint64)
        self._int_keys = [int(k) for k in self._keys]

    def value(self, i: int) -> int:
        """The value at one position (pure Python integers: the fast path for a trial's few sites)."""
        if not 0 <= i < self.n:
            raise OptionError(f"permutation positions must lie in [0, {self.n})")
        x = self._step(i)
        while x >= self.n:  # cycle walking
            x = self._step(x)
        return x

    def _step(self, x: int) -> int:
        """One pass of the Feistel network over the whole domain, on a Python integer."""
        h = self.half
        mask = (1 << h) - 1
        left, right = x >> h, x & mask
        for k in self._int_keys:
            z = (right + k) & _U64
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
            left, right = right, left ^ ((z ^ (z >> 31)) & mask)
        return (left << h) | right

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self.half)
        left = x >> h
        right = x & self._mask
        with np.errstate(over="ignore"):
            for k in self._keys:
                left, right = right, left ^ (_mix(right + k) & self._mask)
        return (left << h) | right

    def __call__(self, positions: "np.ndarray | Sequence[int]") -> np.ndarray:
        """The values at ``positions`` (int64 array of the same length, each in ``[0, n)``)."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size <= 8 and pos.ndim == 1:
            return np.array([self.value(int(i)) for i in pos], dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise OptionError(f"permutation positions must lie in [0, {self.n})")
        x = self._feistel(pos.astype(np.uint64))
        n = np.uint64(self.n)
        out = x >= n
        few = np.flatnonzero(out)
        if len(few) <= _FEW:  # a trial's few stragglers walk on in Python (a NumPy pass costs ~50 µs)
            for j in few.tolist():
                v = self._step(int(x[j]))
                while v >= self.n:
                    v = self._step(v)
                x[j] = v
            return x.astype(np.int64)
        while out.any():  # cycle walking: stays a bijection of [0, n)
            x[out] = self._feistel(x[out])
            out = x >= n
        return x.astype(np.int64)
