"""The Philox generator of (seed, stream) without building a SeedSequence: the per-trial fast path.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

:func:`fastflip.core.sampling.generator` keys NumPy's Philox with
``SeedSequence([seed, *stream])``. Building that SeedSequence, a Philox and a Generator
costs ~10 µs a trial, more than the rest of a one-flip trial. This module computes the
same key in plain Python (NumPy's SeedSequence algorithm: the entropy as 32-bit words,
hash-mixed into a pool of four words, which ``generate_state`` turns into the key) and
reuses one Philox per thread, reset to counter 0 under the new key: the draws are the
ones ``generator(seed, stream)`` gives, bit for bit (tests/test_trialplan.py checks the
keys against SeedSequence and the draws against :func:`~fastflip.core.sampling.generator`).

Examples
--------
>>> key = seed_state([7, 0], 2)
>>> key == [int(x) for x in np.random.SeedSequence([7, 0]).generate_state(2, np.uint64)]
True

:class:`PhiloxWords` gives the same generator's raw words (``random_raw``) computed in plain Python
(Philox4x64-10 as NumPy computes it), without importing ``numpy.random``: a one-flip command draws a few
words, and importing NumPy's random package costs more than the rest of its planning (:func:`keyed_words`).

>>> words = PhiloxWords(seed_state([7, 0], 2)).random_raw(6)
>>> words == keyed_generator(7, [0]).bit_generator.random_raw(6).tolist()
True
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Sequence

import numpy as np

from ..errors import OptionError

__all__ = ["seed_state", "keyed_generator", "PhiloxWords", "keyed_words"]

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875  # NumPy's SeedSequence constants (bit_generator.pyx)
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4


def _words(entropy: Sequence[int]) -> list[int]:
    """The entropy as SeedSequence assembles it: each integer as little-endian 32-bit words (0 as one word)."""
    out: list[int] = []
    for v in entropy:
        v = int(v)
        if v < 0:
            raise OptionError(f"seed and stream values must be non-negative integers (got {v})")
        if v <= _M32:
            out.append(v)
            continue
        while v:
            out.append(v & _M32)
            v >>= 32
    return out


def _pool(words: list[int]) -> list[int]:
    """SeedSequence.mix_entropy: the pool of four 32-bit words."""
    h = _INIT_A
    pool = []
    for i in range(_POOL):
        v = (words[i] if i < len(words) else 0) ^ h
        h = (h * _MULT_A) & _M32
        v = (v * h) & _M32
        pool.append(v ^ (v >> 16))
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                v = pool[src] ^ h
                h = (h * _MULT_A) & _M32
                v = (v * h) & _M32
                r = (_MIX_L * pool[dst] - _MIX_R * (v ^ (v >> 16))) & _M32
                pool[dst] = r ^ (r >> 16)
    for src in range(_POOL, len(words)):
        for dst in range(_POOL):
            v = words[src] ^ h
            h = (h * _MULT_A) & _M32
            v = (v * h) & _M32
            r = (_MIX_L * pool[dst] - _MIX_R * (v ^ (v >> 16))) & _M32
            pool[dst] = r ^ (r >> 16)
    return pool


def _hash_consts(init: int, mult: int, n: int) -> list[int]:
    """The hash constant before each of n hash steps (it does not depend on the data), and after the last."""
    h = [init]
    for _ in range(n):
        h.append((h[-1] * mult) & _M32)
    return h


def _key4_source() -> str:
    """Straight-line source of ``_key4(w0, w1, w2, w3)``: :func:`seed_state` of at most four entropy words,
    ``n = 2`` (a Philox key). The loops of :func:`_pool` unrolled, their hash constants folded in (~3×
    faster; tests/test_trialplan.py checks it against SeedSequence)."""
    ha, hb = _hash_consts(_INIT_A, _MULT_A, 16), _hash_consts(_INIT_B, _MULT_B, 4)
    out = ["def _key4(w0, w1, w2, w3):"]
    for i in range(_POOL):
        out.append(f"    v = ((w{i} ^ {ha[i]}) * {ha[i + 1]}) & {_M32}; p{i} = v ^ (v >> 16)")
    j = _POOL
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                out.append(f"    v = ((p{src} ^ {ha[j]}) * {ha[j + 1]}) & {_M32}; "
                           f"r = ({_MIX_L} * p{dst} - {_MIX_R} * (v ^ (v >> 16))) & {_M32}; p{dst} = r ^ (r >> 16)")
                j += 1
    for i in range(_POOL):
        out.append(f"    v = ((p{i} ^ {hb[i]}) * {hb[i + 1]}) & {_M32}; o{i} = v ^ (v >> 16)")
    out.append("    return [o0 | (o1 << 32), o2 | (o3 << 32)]")
    return "\n".join(out)


_ns: dict[str, Any] = {}
exec(_key4_source(), _ns)  # noqa: S102 - generated from the constants above, no outside input
_key4 = _ns["_key4"]


def seed_state(entropy: Sequence[int], n: int) -> list[int]:
    """``SeedSequence(list(entropy)).generate_state(n, np.uint64)`` as Python integers.

    Parameters
    ----------
    entropy : sequence of non-negative int
        E.g. ``[seed, *stream]``.
    n : int
        Number of 64-bit words.
    """
    words = _words(entropy)
    if n == 2 and len(words) <= _POOL:
        return _key4(*words, *[0] * (_POOL - len(words)))
    pool = _pool(words)
    h = _INIT_B
    w = []
    for i in range(2 * n):
        v = pool[i % _POOL] ^ h
        h = (h * _MULT_B) & _M32
        v = (v * h) & _M32
        w.append(v ^ (v >> 16))
    return [w[2 * i] | (w[2 * i + 1] << 32) for i in range(n)]


_ZEROS = (0, 0, 0, 0)
_local = threading.local()


def keyed_generator(seed: int, stream: Sequence[int] = ()) -> np.random.Generator:
    """The generator :func:`fastflip.core.sampling.generator` returns for (seed, stream), in the same state.

    It is this thread's one reusable generator, re-keyed: valid until the next call in the
    same thread, so only code that calls out to nothing while drawing should use it.
    """
    if int(seed) < 0:
        raise OptionError(f"seed must be a non-negative integer (got {seed})")
    try:
        bitgen, rng = _local.pair
    except AttributeError:
        bitgen = np.random.Philox(0)
        rng = np.random.Generator(bitgen)
        _local.pair = (bitgen, rng)
    bitgen.state = {"bit_generator": "Philox", "state": {"counter": _ZEROS, "key": seed_state([seed, *stream], 2)},
                    "buffer": _ZEROS, "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}
    return rng


_PHILOX_M0, _PHILOX_M1 = 0xD2E7470EE14C6C93, 0xCA5A826395121157  # Random123's Philox4x64 multipliers
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B  # and its key increments (Weyl sequence)


class PhiloxWords:
    """The raw 64-bit words of NumPy's ``Philox`` with ``key`` (two words), counter 0 and an empty buffer, as
    its ``random_raw`` gives them: block ``i`` (from 1) is Philox4x64-10 of the counter ``(i, 0, 0, 0)``.

    Plain Python integers (a few µs a block): for the handful of words a small plan draws. Only counters below
    ``2**64`` blocks are produced (its first word; the others stay 0).
    """

    def __init__(self, key: Sequence[int]) -> None:
        self.key = (int(key[0]) & _M64, int(key[1]) & _M64)
        self.counter = 0  # blocks produced
        self.buffer: list[int] = []  # words of the last block not handed out yet

    def _block(self) -> list[int]:
        self.counter += 1
        c0, c1, c2, c3 = self.counter, 0, 0, 0
        k0, k1 = self.key
        for r in range(10):
            if r:
                k0, k1 = (k0 + _PHILOX_W0) & _M64, (k1 + _PHILOX_W1) & _M64
            p0, p1 = _PHILOX_M0 * c0, _PHILOX_M1 * c2
            c0, c1, c2, c3 = (p1 >> 64) ^ c1 ^ k0, p1 & _M64, (p0 >> 64) ^ c3 ^ k1, p0 & _M64
        return [c0, c1, c2, c3]

    def random_raw(self, n: int) -> list[int]:
        """The next ``n`` words (NumPy: ``Philox.random_raw(n).tolist()``)."""
        out = self.buffer[:n]
        self.buffer = self.buffer[n:]
        while len(out) < n:
            block = self._block()
            take = n - len(out)
            out += block[:take]
            self.buffer = block[take:]
        return out


_PLAIN_PLANS = [0]  # keyed_words answered in plain Python so far in this process
_PLAIN_MAX = 8  # after that many, NumPy's Philox (imported once) is faster for every later plan


def keyed_words(seed: int, stream: Sequence[int] = ()) -> Any:
    """The raw-word source of :func:`keyed_generator` ``(seed, stream)`` (its ``random_raw``, same words).

    The first few calls of a process that has not loaded ``numpy.random`` (a one-shot command plans once)
    get :class:`PhiloxWords`, so that the command never imports ``numpy.random`` (tens of ms) for the few words
    it draws; every other call (a campaign, a harness drawing trial after trial: about 20 µs a trial against
    some 50 µs in plain Python) gets that generator's Philox.
    """
    if "numpy.random" in sys.modules or _PLAIN_PLANS[0] >= _PLAIN_MAX:
        return keyed_generator(seed, stream).bit_generator
    if int(seed) < 0:
        raise OptionError(f"seed must be a non-negative integer (got {seed})")
    _PLAIN_PLANS[0] += 1
    return PhiloxWords(seed_state([seed, *stream], 2))
