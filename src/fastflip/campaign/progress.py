"""A one-line progress bar for sweeps: trials done, trials/s, ETA, running outcome counts.

It draws on a terminal only (``stderr.isatty()`` and not under ``CI``); in logs and CI
it stays quiet and :meth:`Progress.close` prints one summary line.

Examples
--------
>>> import io
>>> p = Progress(total=10, done=2, enabled=False, stream=io.StringIO())
>>> p.update([0, 0, 1, 3])
>>> p.line().split(" ")[0]
'6/10'
"""

from __future__ import annotations

import os
import sys
import time
from typing import Iterable, TextIO

from ..store import OUTCOMES

__all__ = ["Progress", "format_seconds"]


def format_seconds(s: float) -> str:
    """``h:mm:ss`` (or ``--:--`` when unknown).

    >>> format_seconds(3725.2)
    '1:02:05'
    """
    if s != s or s == float("inf") or s < 0:
        return "--:--"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """Progress of a sweep; :meth:`update` with the outcome codes of finished trials."""

    def __init__(self, total: int, done: int = 0, *, enabled: bool | None = None, stream: TextIO | None = None,
                 interval: float = 0.2) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)()) and not os.environ.get("CI")
        self.enabled = enabled
        self.total = int(total)
        self.start_done = int(done)
        self.done = int(done)
        self.counts = [0] * len(OUTCOMES)
        self.t0 = time.monotonic()
        self._last = 0.0
        self.interval = interval

    def update(self, outcomes: Iterable[int]) -> None:
        for o in outcomes:
            self.counts[o] += 1
            self.done += 1
        if self.enabled:
            now = time.monotonic()
            if now - self._last >= self.interval:
                self._last = now
                self.stream.write("\r" + self.line() + "\033[K")
                self.stream.flush()

    def rate(self) -> float:
        dt = time.monotonic() - self.t0
        return (self.done - self.start_done) / dt if dt > 0 else 0.0

    def line(self) -> str:
        rate = self.rate()
        left = self.total - self.done
        eta = left / rate if rate > 0 else float("inf")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        counts = " ".join(f"{name} {n}" for name, n in zip(OUTCOMES, self.counts))
        return f"{self.done}/{self.total} {pct:5.1f}% {rate:,.0f} trials/s ETA {format_seconds(eta)} | {counts}"

    def message(self, text: str) -> None:
        """A line of its own (e.g. 'finishing in-flight trials'), kept clear of the bar."""
        if self.enabled:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, summary: bool = True) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\033[K\n")
        elif summary:
            self.stream.write(self.line() + "\n")
        self.stream.flush()
