"""NumPy Generator draws replayed in plain Python from a block of raw Philox words.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

A trial draws a handful of numbers; each NumPy ``Generator`` call costs 1–20 µs of
argument handling for nanoseconds of work. :class:`RawDraws` takes the bit generator's
raw 64-bit words in one call (``random_raw``) and computes the same results NumPy's
C code computes from them, with the same algorithms:

- ``integers(0, high)``: Lemire's bounded draw on 32-bit halves of the words (high half
  buffered, as ``next_uint32`` does) when ``high - 1 < 2**32``, on whole words above;
- ``random()``: ``(word >> 11) * 2**-53``;
- ``choice(n, size, replace=False)`` for ``n <= 10000``: Floyd's algorithm (NumPy keeps its set in
  an open-addressed table, a Python set here), then the Fisher–Yates shuffle of the result (both with the
  bounded draw).

:meth:`RawDraws.sync` leaves the bit generator where NumPy's calls would have left it, so later
draws go on through NumPy. tests/test_trialplan.py checks every draw against NumPy's.

Examples
--------
>>> bg = np.random.Philox(5)
>>> d = RawDraws(bg)
>>> a = d.integers(1000, 3)
>>> d.sync()
>>> b = np.random.Generator(np.random.Philox(5)).integers(0, 1000, size=3).tolist()
>>> a == b
True
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["RawDraws", "FLOYD_MAX"]

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_BLOCK = 32  # raw words fetched at a time (a multiple of Philox's 4-word block)
FLOYD_MAX = 10000  # choice(n, ..., replace=False) uses Floyd's algorithm up to this n (NumPy's cut-off)


def _lemire(rng: int, draw: Callable[[], int], mask: int, width: int) -> int:
    """Lemire's bounded draw in ``[0, rng]`` from ``width``-bit words (``mask``: their all-ones), with rejection."""
    excl = rng + 1
    m = draw() * excl
    if (m & mask) < excl:
        threshold = (mask - rng) % excl
        while (m & mask) < threshold:
            m = draw() * excl
    return m >> width


def _words(bitgen: Any, n: int) -> list[int]:
    """The next ``n`` raw words of ``bitgen`` as Python integers."""
    words = bitgen.random_raw(n)
    return words if isinstance(words, list) else words.tolist()


class RawDraws:
    """Draws of a Philox bit generator, replayed from its raw words.

    Parameters
    ----------
    bitgen : numpy.random.Philox or fastflip.core.seedkey.PhiloxWords
        (the latter, plain Python words, only ``fresh`` and without :meth:`sync`)
    fresh : bool
        True: just keyed (as :func:`fastflip.core.seedkey.keyed_generator` leaves it: counter 0, empty
        buffers), nothing drawn yet. False: draws go on from its current state (read once, ~2 µs).
    """

    def __init__(self, bitgen: Any, fresh: bool = True) -> None:
        self.bitgen = bitgen
        self.half: int | None = None  # the buffered high half of ``next_uint32``
        self.start: tuple[int, list[int], int] = (0, [0, 0, 0, 0], 4)  # counter, buffer, buffer position
        if not fresh:
            st = bitgen.state
            if any(int(c) for c in st["state"]["counter"][1:]):
                raise ValueError("RawDraws: a Philox counter beyond 2**64 blocks")
            self.start = (int(st["state"]["counter"][0]), [int(b) for b in st["buffer"]], int(st["buffer_pos"]))
            self.half = int(st["uinteger"]) if st["has_uint32"] else None
        # the rest of the buffer, then whole new blocks (sync() takes the last block used from here)
        self.raw: list[int] = _words(bitgen, 4 - self.start[2] + _BLOCK)
        self.pos = 0  # 64-bit words consumed
        self.lost = False

    def _next64(self) -> int:
        if self.pos == len(self.raw):
            self.raw += _words(self.bitgen, _BLOCK)
        v = self.raw[self.pos]
        self.pos += 1
        return v

    def _next32(self) -> int:
        if self.half is not None:
            v, self.half = self.half, None
            return v
        v = self._next64()
        self.half = v >> 32
        return v & _M32

    def bounded(self, rng: int) -> int:
        """``random_bounded_uint64(0, rng)``: uniform in ``[0, rng]`` (Lemire; no draw when rng is 0)."""
        if rng == 0:
            return 0
        if rng < _M32:
            return _lemire(rng, self._next32, _M32, 32)
        if rng == _M32:
            return self._next32()
        if rng == _M64:
            return self._next64()
        return _lemire(rng, self._next64, _M64, 64)

    def _bounded_many(self, rngs: Sequence[int]) -> list[int]:
        """``[bounded(r) for r in rngs]``, with :meth:`bounded` inlined for 32-bit ranges (most of a trial's draws)."""
        if not rngs or max(rngs) >= _M32 or self.pos + len(rngs) > len(self.raw):
            return [self.bounded(r) for r in rngs]
        raw, pos, half = self.raw, self.pos, self.half
        out = []
        for i, rng in enumerate(rngs):
            if rng == 0:
                out.append(0)
                continue
            excl = rng + 1
            if half is None:
                v = raw[pos]
                pos += 1
                half = v >> 32
                m = (v & _M32) * excl
            else:
                m, half = half * excl, None
            if (m & _M32) < excl and (m & _M32) < (_M32 - rng) % excl:
                self.pos, self.half = pos, half  # rejected: draw again as bounded() does, the rest through it
                while (m & _M32) < (_M32 - rng) % excl:
                    m = self._next32() * excl
                out.append(m >> 32)
                return out + [self.bounded(r) for r in rngs[i + 1:]]
            out.append(m >> 32)
        self.pos, self.half = pos, half
        return out

    def integers(self, high: int, size: int) -> list[int]:
        """``Generator.integers(0, high, size=size)`` (any integer dtype; ``high >= 1``)."""
        return self._bounded_many([high - 1] * size)

    def random(self, size: int) -> list[float]:
        """``Generator.random(size)``."""
        if self.pos + size > len(self.raw):
            self.raw += _words(self.bitgen, _BLOCK + 4 * (size // 4))  # whole blocks
        words = self.raw[self.pos: self.pos + size]
        self.pos += size
        return [(w >> 11) * (1.0 / 9007199254740992.0) for w in words]

    def choice_floyd(self, n: int, size: int, shuffle: bool = True) -> list[int]:
        """``Generator.choice(n, size, replace=False)`` for ``n <= FLOYD_MAX`` (Floyd, then shuffled).

        ``shuffle=False`` returns the same set unshuffled and leaves the draws of the shuffle undrawn:
        for a caller that needs only the set and draws nothing more (no :meth:`sync` after it).
        """
        if not 0 <= size <= n <= FLOYD_MAX:
            raise ValueError(f"choice_floyd covers 0 <= size <= n <= {FLOYD_MAX} (got n={n}, size={size})")
        seen: set[int] = set()  # NumPy's open-addressed hash set: only membership matters
        out = []
        steps = range(n - size, n)  # the ranges do not depend on the draws: all drawn at once
        for j, val in zip(steps, self._bounded_many(steps)):
            if val in seen:
                val = j
            seen.add(val)
            out.append(val)
        if shuffle:
            swaps = range(size - 1, 0, -1)
            for i, j in zip(swaps, self._bounded_many(swaps)):
                out[i], out[j] = out[j], out[i]
        else:
            self.lost = True  # the stream position is no longer NumPy's: sync() would be wrong
        return out

    def sync(self) -> None:
        """Leave the bit generator in the state NumPy's own calls would have left it in."""
        if self.lost:
            raise ValueError("RawDraws.sync after an unshuffled choice_floyd: the stream position is unknown")
        counter, block, at = self.start
        left = 4 - at  # words still in the buffer at the start
        if self.pos <= left:
            at += self.pos
        else:
            q = -(-(self.pos - left) // 4)  # new blocks used (the counter counts blocks)
            block = self.raw[left + 4 * (q - 1): left + 4 * q]
            counter, at = counter + q, self.pos - left - 4 * (q - 1)
        self.bitgen.state = {"bit_generator": "Philox", "state": {"counter": (counter, 0, 0, 0),
                                                                    "key": self.bitgen.state["state"]["key"]},
                             "buffer": block, "buffer_pos": at,
                             "has_uint32": int(self.half is not None), "uinteger": self.half or 0}
