"""Trials per forward: the most that free memory allows, and the fastest per-trial rate among a few block sizes.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

On a CPU a wider forward stops paying long before memory runs out: the stacked activations leave
the caches and every block faults in fresh pages. :func:`choose_batch` therefore times one block
of each candidate size (the first of them warms up untimed), stops widening once a size is clearly
slower than the best so far, and compares the best with one serial trial: when serial is at least
as fast, trials run one at a time. The timing function is a parameter, so that the choice can be
tested without clocks. The memory bound is :func:`auto_batch` of one trial's bytes and the free memory
where the model's tensors live (:func:`free_memory`); :func:`steady_allocator` keeps the heap of a
process that runs block after block.

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

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["BatchChoice", "choose_batch", "SIZES", "auto_batch", "free_memory", "steady_allocator", "MAX_AUTO",
           "MAX_AUTO_GPU"]

#: Most trials per forward on a CPU: beyond this many the forward is not faster per trial, only bigger
MAX_AUTO = 64
#: Most trials per forward on a GPU (it keeps gaining from wider forwards long after a CPU core has stopped)
MAX_AUTO_GPU = 512

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
        The largest size memory allows (:func:`auto_batch`); sizes above it are not tried.
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


def steady_allocator() -> bool:
    """Keep freed memory in this process for reuse (glibc: no ``mmap`` per large block, no trim below 1 GiB).

    Batched forwards allocate activations of tens of MB block after block; glibc serves every allocation above
    32 MB with a fresh ``mmap``, so each block faults its pages in again (measured: half the CPU time in the kernel).
    With ``M_MMAP_MAX = 0`` and a 1 GiB trim threshold they are reused from the heap: the process keeps its peak
    memory until it ends. Off with ``FASTFLIP_MALLOC=system``; a no-op (False) where the C library is not glibc.
    """
    if os.environ.get("FASTFLIP_MALLOC") == "system" or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-4, 0)) and bool(libc.mallopt(-1, 1 << 30))  # M_MMAP_MAX, M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return False


def free_memory(device: Any) -> int:
    """Free bytes where ``device``'s tensors live (CUDA: the device's free memory; else available RAM)."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def auto_batch(per_trial_bytes: int, free: int, limit: int = MAX_AUTO) -> int:
    """Trials per forward that fit a quarter of ``free`` bytes (at least 1, at most ``limit``).

    >>> auto_batch(100 << 20, 8 << 30), auto_batch(100 << 20, 100 << 20), auto_batch(1, 1 << 40)
    (20, 1, 64)
    """
    return int(max(1, min(limit, (free // 4) // max(int(per_trial_bytes), 1))))
