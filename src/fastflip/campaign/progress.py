"""Progress of a sweep: a bar on a terminal, periodic status lines in logs, phase lines in both.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

* On a terminal (``stderr.isatty()`` and not under ``CI``) it draws a bar with trials done, trials/s, ETA and
  the running outcome counts, fitted to the terminal's width: with `rich <https://rich.readthedocs.io>`_
  (the ``progress`` extra) when it is installed, else a one-line ``\\r`` bar.
* Elsewhere (Slurm logs, CI, a pipe) it writes one plain status line every ``status_every`` seconds
  (default 60; ``FASTFLIP_STATUS_SECONDS`` or ``fastflip sweep --status-every`` change it), so a job's log
  shows progress while it runs, not only at the end.
* :meth:`Progress.phase` prints a line of its own in both cases (loading the target, resuming with counts,
  starting workers); :meth:`Progress.close` prints one summary line.

Examples
--------
>>> import io
>>> p = Progress(total=10, done=2, enabled=False, stream=io.StringIO(), status_every=0)
>>> p.update([0, 0, 1, 3])
>>> p.line().split(" ")[0]
'6/10'
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any, Iterable, TextIO

from ..errors import OptionError
from .store import TRIAL_OUTCOMES

__all__ = ["Progress", "format_rate", "format_seconds", "status_seconds"]

DEFAULT_STATUS_SECONDS = 60.0


def format_seconds(s: float) -> str:
    """``h:mm:ss`` (or ``--:--`` when unknown).

    >>> format_seconds(3725.2)
    '1:02:05'
    """
    if s != s or s == float("inf") or s < 0:
        return "--:--"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_rate(rate: float) -> str:
    """Trials per second with the digits that matter (``0.49 trials/s``, never ``0 trials/s`` for a slow model).

    >>> format_rate(0.4912), format_rate(7.25), format_rate(12.34), format_rate(1234.5), format_rate(0.0)
    ('0.49 trials/s', '7.25 trials/s', '12.3 trials/s', '1,234 trials/s', '0 trials/s')
    """
    if rate != rate or rate <= 0:
        return "0 trials/s"
    if rate >= 100:
        return f"{rate:,.0f} trials/s"
    if rate >= 10:
        return f"{rate:.1f} trials/s"
    if rate >= 0.01:
        return f"{rate:.2f} trials/s"
    return f"{rate:.2g} trials/s"


def status_seconds(value: float | None = None) -> float:
    """Seconds between status lines off a terminal: ``value``, else ``FASTFLIP_STATUS_SECONDS``, else 60.

    0 turns the periodic lines off (the summary line stays).

    >>> status_seconds(5)
    5.0
    """
    if value is None:
        env = os.environ.get("FASTFLIP_STATUS_SECONDS")
        try:
            value = float(env) if env else DEFAULT_STATUS_SECONDS
        except ValueError:
            value = DEFAULT_STATUS_SECONDS
    if not value >= 0:  # also NaN
        raise OptionError(f"--status-every must be >= 0 seconds, got {value!r}")
    return float(value)


def _rich_bar(stream: TextIO, total: int, done: int) -> Any:
    """A started rich progress bar on ``stream`` (None when rich is not installed)."""
    try:  # optional extra: progress
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TaskProgressColumn, \
            TextColumn, TimeRemainingColumn
    except ImportError:
        return None
    bar = RichProgress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                       TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), TextColumn("{task.fields[counts]}"),
                       console=Console(file=stream, width=shutil.get_terminal_size((100, 24)).columns),
                       transient=False, auto_refresh=False)
    bar.start()
    bar.add_task("sweep", total=max(total, 1), completed=done, rate="", counts="")
    return bar


class Progress:
    """Progress of a sweep; :meth:`update` with the outcome codes of finished trials."""

    def __init__(self, total: int, done: int = 0, *, enabled: bool | None = None, stream: TextIO | None = None,
                 interval: float = 0.2, status_every: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)()) and not os.environ.get("CI")
        self.enabled = enabled
        self.total = int(total)
        self.start_done = int(done)
        self.done = int(done)
        self.counts = [0] * len(TRIAL_OUTCOMES)
        self.t0 = time.monotonic()
        self._last = 0.0
        self._last_status = self.t0
        self.interval = interval
        self.status_every = status_seconds(status_every)
        self._bar = _rich_bar(self.stream, self.total, self.done) if enabled else None

    def update(self, outcomes: Iterable[int]) -> None:
        for o in outcomes:
            self.counts[o] += 1
            self.done += 1
        now = time.monotonic()
        if self.enabled:
            if now - self._last >= self.interval:
                self._last = now
                self._draw()
        elif self.status_every and now - self._last_status >= self.status_every:
            self._last_status = now
            self._write(time.strftime("%H:%M:%S ") + self.line() + "\n")

    def _draw(self) -> None:
        if self._bar is not None:
            task = self._bar.task_ids[0]
            self._bar.update(task, completed=self.done, rate=format_rate(self.rate()), counts=self.counts_text())
            self._bar.refresh()
            return
        width = shutil.get_terminal_size((100, 24)).columns
        self._write("\r" + self.line()[: max(width - 1, 20)] + "\033[K")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def rate(self) -> float:
        dt = time.monotonic() - self.t0
        return (self.done - self.start_done) / dt if dt > 0 else 0.0

    def counts_text(self) -> str:
        return " ".join(f"{name} {n}" for name, n in zip(TRIAL_OUTCOMES, self.counts))

    def line(self) -> str:
        rate = self.rate()
        left = self.total - self.done
        eta = left / rate if rate > 0 else float("inf")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return f"{self.done}/{self.total} {pct:5.1f}% {format_rate(rate)} ETA {format_seconds(eta)} | {self.counts_text()}"

    def message(self, text: str) -> None:
        """A line of its own (e.g. 'finishing in-flight trials'), kept clear of the bar."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
            return
        if self.enabled:
            self.stream.write("\r\033[K")
        self._write(text + "\n")

    def phase(self, text: str) -> None:
        """A phase of the sweep (loading the target, resuming, starting workers): shown on and off a terminal."""
        self.message(text)

    def close(self, summary: bool = True) -> None:
        if self._bar is not None:
            self._draw()
            self._bar.stop()
            self._bar = None
            return
        if self.enabled:
            self._write("\r" + self.line() + "\033[K\n")
        elif summary:
            self._write(self.line() + "\n")
