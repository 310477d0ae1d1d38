"""Running a sweep's missing trials: rounds of chunks on an executor, rows written to the store as they come.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

:class:`Rounds` is the part of :func:`fastflip.campaign.sweep.sweep` that runs trials. Each round asks the
store which trials are still missing (so a resumed sweep simply starts with fewer), cuts them into chunks,
keeps the executor's workers busy with them and hands the finished rows to :class:`RowWriter`, the single
writer, which commits them in batched transactions. A sequential campaign (``[trials] half_width``) runs one
block per open cell per round and stops a cell once its failure rate is known well enough.

Crashes: a worker process that dies takes its chunks with it; those trials run again one at a time, and a
trial that kills its worker again is stored as a DUE (held back until some trial has succeeded, since until
then the crash may be the workers' fault, not the trial's). Interrupts: the first Ctrl-C saves the finished
trials and lets those in flight finish, a second one (or SIGTERM, see :func:`catch_sigterm`) abandons them.
"""

from __future__ import annotations

import math
import pickle
import signal
import threading
import time
from collections import deque
from typing import Any, Sequence

import numpy as np

from ..errors import StoreError
from .config import Campaign
from .executors import WorkerCrash
from .failures import TrialAborted
from .outcomes import failure_sql
from .progress import Progress
from .stats import should_stop
from .store import ResultStore, TrialRow
from .trials import DUE, get_runner, worker_error

__all__ = ["Rounds", "RowWriter", "shard_trials", "catch_sigterm", "release_sigterm", "Terminated"]


def shard_trials(cell_id: int, trials: np.ndarray, shard: tuple[int, int] | None) -> np.ndarray:
    """The trials of ``trials`` (of cell ``cell_id``) that belong to shard ``(i, N)``: ``(cell + trial) % N == i``.

    >>> shard_trials(1, np.arange(6), (0, 2)).tolist()
    [1, 3, 5]
    """
    if shard is None:
        return trials
    i, n = shard
    return trials[(trials + cell_id) % n == i]


def sequential_needs(st: ResultStore, campaign: Campaign, planned: Sequence[int],
                     stopped: set[int] | None = None) -> dict[int, np.ndarray]:
    """Per open cell of a sequential campaign, the missing trials of its next block (empty dict: every cell has
    stopped). Cells found stopped are added to ``stopped`` and skipped on later rounds."""
    tr = campaign.trials
    assert tr.half_width is not None
    failure = failure_sql(campaign.evaluator.failure)
    need: dict[int, np.ndarray] = {}
    stopped = stopped if stopped is not None else set()
    for cid, cap in enumerate(planned):
        if cid in stopped:
            continue
        rows = st.conn.execute(f"SELECT trial, {failure} FROM trials WHERE cell_id = ? AND trial < ?",
                               (cid, cap)).fetchall()
        have = np.zeros(cap, dtype=bool)
        fail = np.zeros(cap, dtype=bool)
        if rows:
            arr = np.array(rows, dtype=np.int64)
            have[arr[:, 0]] = True
            fail[arr[:, 0]] = arr[:, 1] == 1
        for lo in range(0, cap, tr.block):
            hi = min(lo + tr.block, cap)
            if not have[lo:hi].all():
                need[cid] = lo + np.flatnonzero(~have[lo:hi])
                break
            if should_stop(int(fail[:hi].sum()), hi, half_width=tr.half_width, confidence=tr.confidence,
                           min_trials=tr.min_trials, max_trials=cap):
                stopped.add(cid)
                break
    return need


def _chunks(work: dict[int, np.ndarray], size: int) -> deque:
    q: deque = deque()
    for cid, trials in work.items():
        for s in range(0, len(trials), size):
            q.append((cid, trials[s : s + size]))
    return q


def _plain(row: TrialRow) -> tuple:
    """The row as the store's writer takes it: every field but ``worker``."""
    return tuple(row[:9]) + tuple(row[10:])


def _crash_row(seed: int, cell_id: int, trial: int, message: str) -> tuple:
    """The stored row of a trial that killed its worker twice: a DUE with the crash as its message."""
    return _plain(TrialRow(cell_id, trial, seed, None, DUE, None, None, message[:400], None, None))


def run_payload(token: str, payload: Any, cell_id: int, trials: Any) -> tuple[str, list[tuple]]:
    """Worker side: unpickle the campaign once per process, then run the chunk.

    Returns the worker's label and plain 11-column rows (a :class:`TrialRow` without its worker).
    """
    if isinstance(payload, (bytes, bytearray)):
        payload = pickle.loads(payload)
    campaign_dict, cells, digest = payload
    runner = get_runner(token, campaign_dict, cells, digest)
    return runner.worker, [_plain(row) for row in runner.run_many(cell_id, trials.tolist())]


# ------------------------------------------------------------------------------ SIGTERM

class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the sweep's thread so that it saves, cleans up, then exits."""


_TERMINATED = {"flag": False, "raise": True}


def _on_sigterm(signum: int, frame: Any) -> None:
    _TERMINATED["flag"] = True
    if _TERMINATED["raise"]:  # once the sweep is cleaning up, a SIGTERM only waits for the end
        _TERMINATED["raise"] = False
        raise Terminated()


def catch_sigterm() -> Any:
    """Turn SIGTERM into :class:`Terminated` while the sweep runs (main thread, default handler only); returns
    the handler to give back to :func:`release_sigterm` (None: SIGTERM left alone)."""
    _TERMINATED.update(flag=False, **{"raise": True})
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None  # the caller handles SIGTERM itself
    return signal.signal(signal.SIGTERM, _on_sigterm)


def cleaning_up() -> None:
    """From now on a SIGTERM only waits for the sweep to end (it no longer interrupts the clean-up)."""
    _TERMINATED["raise"] = False


def release_sigterm(old: Any) -> bool:
    """Restore the SIGTERM handler; True if a SIGTERM arrived meanwhile."""
    if old is not None:
        signal.signal(signal.SIGTERM, old)
    hit = _TERMINATED["flag"]
    _TERMINATED["flag"] = False
    return hit and old is not None


# ------------------------------------------------------------------------------ the writer

class RowWriter:
    """The store's single writer: rows are queued and committed in batched transactions, at the latest every
    ``flush_rows`` rows or ``flush_seconds`` seconds. ``ran`` counts the rows committed."""

    def __init__(self, st: ResultStore, flush_rows: int = 20_000, flush_seconds: float = 1.0) -> None:
        self.st = st
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.ran = 0
        self.pending: list[tuple[str | None, list[tuple]]] = []
        self.n_pending = 0
        self.last_flush = time.monotonic()

    def add(self, worker: str | None, rows: list[tuple]) -> None:
        """Queue the rows of one chunk (``worker`` None: a crash row)."""
        self.pending.append((worker, rows))
        self.n_pending += len(rows)

    def due(self) -> bool:
        return self.n_pending >= self.flush_rows or time.monotonic() - self.last_flush >= self.flush_seconds

    def flush(self) -> None:
        """Commit the queued rows. Ctrl-C and SIGTERM wait until they are both committed and forgotten, so that no
        row is ever stored twice."""
        if self.pending:
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                self.ran += self.st.add_batches(self.pending)
                self.pending.clear()
                self.n_pending = 0
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.last_flush = time.monotonic()


# ------------------------------------------------------------------------------ the rounds

class Rounds:
    """Rounds of the missing trials of one store on one executor, until none is missing or the sweep is stopped.

    Parameters
    ----------
    st, ex
        The open store and the executor (neither is closed here).
    campaign, planned, shard
        The campaign, its trials per cell, and the shard ``(i, N)`` this store holds (None: all trials).
    token, payload
        The runner's key in the workers (the store's config hash) and what they build it from.
    prog, writer
        The progress display and the store's writer.
    chunk
        Trials per task (None: sized so that each worker gets many tasks).

    Notes
    -----
    After :meth:`run`: ``complete`` (no trial missing), ``interrupted`` (stopped by Ctrl-C or SIGTERM).
    """

    def __init__(self, st: ResultStore, ex: Any, campaign: Campaign, planned: Sequence[int],
                 shard: tuple[int, int] | None, token: str, payload: Any, prog: Progress, writer: RowWriter,
                 chunk: int | None = None) -> None:
        self.st, self.ex, self.campaign, self.planned, self.shard = st, ex, campaign, planned, shard
        self.token, self.payload, self.prog, self.writer, self.chunk = token, payload, prog, writer, chunk
        self.sequential = campaign.trials.sequential
        self.complete = self.interrupted = self.stopping = False
        self.successes = self.crash_streak = 0
        self.held: list[tuple[str | None, list[tuple]]] = []  # crash rows seen before any success
        self.stopped_cells: set[int] = set()

    def missing(self) -> dict[int, np.ndarray]:
        """The trials this round runs, per cell (the next block of each open cell when sequential)."""
        if self.sequential:
            return sequential_needs(self.st, self.campaign, self.planned, self.stopped_cells)
        work = {c: shard_trials(c, m, self.shard) for c, m in self.st.missing(dict(enumerate(self.planned))).items()}
        return {c: m for c, m in work.items() if len(m)}

    def run(self) -> None:
        """Run rounds until no trial is missing or the sweep is stopped."""
        while not self.stopping:
            work = self.missing()
            if not work:
                self.complete = True
                return
            left = self.round(work)
            if not self.stopping:  # the round ran to its end: isolated crashes are the trials' own
                self.writer.pending.extend(self.held)
                self.held.clear()
            self.writer.flush()
            if not self.sequential:
                self.complete = not self.stopping and not left
                if self.complete:
                    return

    def round(self, work: dict[int, np.ndarray]) -> bool:
        """Run one round's trials in chunks; True when some were left unrun (the sweep was stopped)."""
        ex = self.ex
        total = sum(len(v) for v in work.values())
        size = self.chunk or max(1, min(500, math.ceil(total / (ex.workers * 8))))
        tasks = _chunks(work, size)
        suspects: deque = deque()  # single trials of chunks that were in flight when a worker died
        in_flight: dict[Any, tuple[int, np.ndarray, bool]] = {}
        while (tasks or suspects or in_flight) and not (self.stopping and not in_flight):
            try:
                if not self.stopping:
                    self._submit(tasks, suspects, in_flight)
                done, _ = ex.wait(list(in_flight), 0.25)
                if self._collect(done, in_flight, suspects):  # a worker died: what it held runs again one by one
                    for fut, (cid, trials, _single) in list(in_flight.items()):
                        fut.cancel()
                        suspects.extend((cid, trials[i : i + 1]) for i in range(len(trials)))
                    in_flight.clear()
                    ex.restart()
                if self.writer.due():
                    self.writer.flush()
            except KeyboardInterrupt as exc:
                self.interrupted = True
                if self.stopping or isinstance(exc, Terminated):  # second Ctrl-C, SIGTERM: abandon what is in flight
                    self.stopping = True
                    for fut in in_flight:
                        fut.cancel()
                    in_flight.clear()
                    break
                self.stopping = True
                self.prog.message("interrupted: saving finished trials (Ctrl-C again to abandon the ones in flight)")
        return bool(tasks or suspects)

    def _submit(self, tasks: deque, suspects: deque, in_flight: dict[Any, Any]) -> None:
        """Keep the workers busy: suspects one at a time with nothing else in flight, else chunks."""
        ex = self.ex
        if suspects:
            if not in_flight:
                cid, trials = suspects.popleft()
                in_flight[ex.submit(run_payload, self.token, self.payload, cid, trials)] = (cid, trials, True)
            return
        while tasks and len(in_flight) < 2 * ex.workers + 2:
            cid, trials = tasks.popleft()
            in_flight[ex.submit(run_payload, self.token, self.payload, cid, trials)] = (cid, trials, False)

    def _collect(self, done: Any, in_flight: dict[Any, Any], suspects: deque) -> bool:
        """Hand the rows of finished tasks to the writer; True when a worker died."""
        crashed = False
        for fut in done:
            cid, trials, single = in_flight.pop(fut)
            try:
                worker, rows = self.ex.result(fut)
            except WorkerCrash as exc:
                crashed = True
                self._crashed(exc, cid, trials, single, suspects)
                continue
            except TrialAborted as exc:  # out of memory, the environment: not a fault's outcome
                raise TrialAborted(str(exc)) from None
            except Exception as exc:
                raise StoreError(f"a worker could not run trials: {worker_error(exc)}") from exc
            self.successes += 1
            if self.held:
                self.writer.pending.extend(self.held)
                self.held.clear()
            self.writer.add(worker, rows)
            self.prog.update(r[4] for r in rows)
        return crashed

    def _crashed(self, exc: WorkerCrash, cid: int, trials: np.ndarray, single: bool, suspects: deque) -> None:
        """A task whose worker died: a single trial is stored as a DUE, a chunk's trials become suspects."""
        self.crash_streak += int(single)
        if self.successes == 0 and self.crash_streak >= 3:
            raise StoreError(
                f"worker processes die before finishing any trial ({exc}); "
                "check the target factory and evaluator (run with --workers 0 to see the error)"
            ) from exc
        if not single:
            suspects.extend((cid, trials[i : i + 1]) for i in range(len(trials)))
            return
        row = _crash_row(self.campaign.seed, cid, int(trials[0]), f"WorkerCrash: {exc}")
        # until some trial has succeeded, a crash may be the workers' fault, not the trial's
        if self.successes == 0:
            self.held.append((None, [row]))
            self.writer.n_pending += 1
        else:
            self.writer.add(None, [row])
        self.prog.update([DUE])
