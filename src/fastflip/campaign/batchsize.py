"""Trials per forward by measurement: the fastest per-trial rate among a few block sizes, or serial.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

On a CPU a wider forward stops paying long before memory runs out: the stacked activations leave
the caches and every block faults in fresh pages. :func:`choose_batch` therefore times one block
of each candidate size (the first of them warms up untimed), stops widening once a size is clearly
slower than the best so far, and compares the best with one serial trial: when serial is at least
as fast, trials run one at a time. The timing function is a parameter, so that the choice can be
tested without clocks.

Examples
--------
>>> cost = {1: 10.0, 2: 6.0, 4: 5.0, 8: 5.5, 16: 9.0}   # seconds per trial; 1 is the serial trial
>>> c = choose_batch(lambda b: cost[b], cap=64)
>>> c.size, c.serial, sorted(c.seconds)
(4, False, [1, 2, 4, 8, 16])
>>> choose_batch(lambda b: 1.0 if b == 1 else 1.2, cap=64).size     # serial is fastest: serial
1
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = ["BatchChoice", "choose_batch", "SIZES"]

#: Block sizes tried (1 is the serial trial; a batched block of one trial is what ``--batch-trials 1`` never runs)
SIZES = (2, 4, 8, 16)
#: Stop widening once a size costs this much more per trial than the best so far
_WORSE = 1.15


@dataclass
class BatchChoice:
    """What :func:`choose_batch` decided: ``size`` (1: serial) and the seconds per trial it measured per size."""

    size: int
    seconds: dict[int, float] = field(default_factory=dict)

    @property
    def serial(self) -> bool:
        return self.size == 1

    def line(self) -> str:
        """The measurement in words: ``serial 20.1 ms/trial; B = 2: 14.0; B = 4: 12.9 …``."""
        parts = [f"{'serial' if b == 1 else f'B = {b}'} {s * 1e3:.3g}" for b, s in sorted(self.seconds.items())]
        return "measured ms per trial: " + ", ".join(parts)


def choose_batch(seconds_per_trial: Callable[[int], float], cap: int,
                 sizes: Sequence[int] = SIZES) -> BatchChoice:
    """The block size with the lowest measured seconds per trial, or 1 (serial) when no size beats serial.

    Parameters
    ----------
    seconds_per_trial : callable
        ``f(B) -> seconds per trial`` with ``B`` trials per forward (``f(1)``: one serial trial).
    cap : int
        The largest size memory allows (:func:`fastflip.campaign.batched.auto_batch`); sizes above it are not tried.
    sizes : sequence of int
        Candidate sizes, increasing.
    """
    choice = BatchChoice(1, {1: float(seconds_per_trial(1))})
    best = None
    for b in sizes:
        if b > max(int(cap), 1):
            break
        t = float(seconds_per_trial(b))
        choice.seconds[b] = t
        if best is None or t < choice.seconds[best]:
            best = b
        elif t > _WORSE * choice.seconds[best]:
            break
    if best is not None and choice.seconds[best] < choice.seconds[1]:
        choice.size = best
    return choice
