"""Run (or resume) a campaign into its results store.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

:func:`sweep` opens the store (creating it on the first run), works out which
(cell, trial) pairs are still missing, ships them in chunks to an executor and
streams the finished rows to the single writer in batched transactions. Because
every trial derives from (seed, cell, trial) alone, a sweep stopped by Ctrl-C, a
crash or SIGKILL resumes with no trial lost, none run twice, and every outcome
equal to an uninterrupted run.

* ``shard='i/N'`` runs only the trials with ``(cell + trial) % N == i`` into a shard
  store; :func:`fastflip.campaign.store.merge_stores` combines the shards.
* With ``[trials] half_width`` the sweep runs in rounds: each open cell gets its next
  block of trials, and a cell stops once the Wilson half-width of its failure rate
  (the classes ``[evaluator] failure`` names) over its complete blocks reaches the target
  (:func:`fastflip.campaign.stats.should_stop`). Decisions use whole blocks only, so a resumed
  sweep takes the same decisions.
* A worker process that dies (segfault, out of memory) does not stop the campaign:
  the chunks it held run again one trial at a time, and a trial that kills its worker
  again is stored as a DUE.
* Before any store or worker exists, the sweep imports the campaign's functions, loads the target and
  evaluates the golden run in its own process (:func:`preflight`): a model/evaluator mismatch is one
  line; a sweep that fails after creating its store but before its first trial removes that store.
* Nothing is left behind: workers exit when the sweep's process dies, even by SIGKILL
  (:mod:`fastflip.campaign.lifeline`); their working copies (checkpoint mode) are
  removed when the sweep ends by success, error, Ctrl-C or SIGTERM, and those of
  killed sweeps at the next start. SIGTERM stops the sweep like a second Ctrl-C
  (finished trials saved, those in flight abandoned), then takes its usual course.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import sqlite3
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import OptionError, StoreError
from .outcomes import failure_sql
from .store import TRIAL_OUTCOMES, ResultStore, TrialRow, config_hash
from .store_guard import sqlite_error
from .cells import (Cell, call_factory, cell_notes, expand_cells, import_object, input_hashes, planned_counts,
                    target_tensors)
from .config import Campaign
from .executors import WorkerCrash, check_main_guard, make_executor, sweep_gpus
from .lifeline import remove_workdirs, sweep_leftovers
from .preflight import batch_line, drop_empty, preflight
from .progress import Progress
from .stats import should_stop
from .failures import TrialAborted
from .trials import DUE, adopt_runner, close_runners, get_runner, worker_error

__all__ = ["SweepResult", "sweep", "parse_shard", "campaign_cells", "open_or_create"]


@dataclass
class SweepResult:
    """What a sweep did: trials run now, stored in all, outcome counts (``masked`` includes the
    ``masked_numeric`` ones, counted apart), whether it finished, and notes on the cells' design."""

    store: str
    planned: int
    stored: int
    ran: int
    counts: dict[str, int] = field(default_factory=dict)
    elapsed: float = 0.0
    interrupted: bool = False
    complete: bool = False
    notes: list[str] = field(default_factory=list)
    masked_numeric: int = 0

    @property
    def rate(self) -> float:
        return self.ran / self.elapsed if self.elapsed > 0 else 0.0


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    """``'i/N'`` → ``(i, N)`` with ``0 <= i < N``.

    >>> parse_shard("1/4")
    (1, 4)
    """
    if shard is None:
        return None
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise OptionError(f"--shard takes i/N (e.g. 0/8), got {shard!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise OptionError(f"--shard {shard}: need 0 <= i < N")
    return i, n


def campaign_cells(campaign: Campaign, *, with_hashes: bool = False,
                   dtypes: dict[str, list[str]] | None = None) -> Any:
    """Expand the campaign's grid against its target (reads layouts or calls the factory once).

    With ``with_hashes=True`` returns ``(cells, input_hashes)`` from that same call.
    ``dtypes``, when given, is filled with each cell's key → the dtype names of its
    tensors (what the report needs to draw sign / exponent / mantissa boundaries).
    """
    epochs: list[int | None] = list(campaign.cells.epochs) if campaign.cells.epochs else [None]
    obj = None
    if campaign.target.factory is not None:
        obj = call_factory(campaign)
        by_epoch = {e: target_tensors(campaign, e, obj) for e in epochs}
    else:
        by_epoch = {e: target_tensors(campaign, e) for e in epochs}
    cells = expand_cells(campaign, by_epoch)
    if dtypes is not None:
        dtype_of = {t.path: str(t.dtype) for ts in by_epoch.values() for t in ts}
        dtypes.update({c.key: sorted({dtype_of[n] for n in c.tensors if n in dtype_of}) for c in cells})
    if with_hashes:
        return cells, input_hashes(campaign, obj)
    return cells


def open_or_create(
    store_path: str, campaign: Campaign | None, shard: str | None = None, say: Any = None,
    expanded: tuple[list[Cell], dict[str, str], dict[str, list[str]]] | None = None,
    created: list[str] | None = None,
) -> tuple[ResultStore, Campaign, list[Cell], list[int]]:
    """Open the store for writing (creating it from ``campaign`` when absent) and check it matches.

    ``say(text)``, when given, is told when the (possibly slow) target loading starts. ``expanded``:
    ``(cells, input hashes, cell dtypes)`` of ``campaign`` already computed (by the pre-flight).
    """

    def loading(c: Campaign) -> None:
        if say is not None:
            say(f"loading the target ({c.target.factory or c.target.checkpoint}) and expanding the cells of "
                f"campaign {c.name!r}")

    if os.path.exists(store_path):
        st = ResultStore.open(store_path, writable=True)
        try:
            stored = Campaign.from_dict(st.config)
            if campaign is not None and config_hash(campaign.definition()) != st.config_hash:
                changed = setting_changes(stored.definition(), campaign.definition())
                raise StoreError(
                    f"store {store_path} holds another campaign ({st.name!r}); changed settings: "
                    f"{changed or 'none visible (check the file)'}; use a new store or the campaign it was made with"
                )
            campaign = campaign or stored
            if shard is not None and shard != st.shard:
                raise StoreError(f"store {store_path} is shard {st.shard or 'none'}, not {shard}")
            if expanded is None:
                loading(campaign)
                cells, hashes = campaign_cells(campaign, with_hashes=True)
            else:
                cells, hashes, _ = expanded
            if hashes != st.input_hashes:
                what = "checkpoint" if campaign.target.checkpoint else "target factory's tensors"
                raise StoreError(f"the campaign's {what} changed since store {store_path} was started; refusing to mix results")
            planned = planned_counts(campaign, cells)
            want = [c.row(n) for c, n in zip(cells, planned)]
            have = [{k: v for k, v in r.items() if k != "cell_id"} for r in st.cells()]
            if want != have:
                raise StoreError(f"the campaign's cells no longer match store {store_path} (did the target change?)")
        except BaseException:
            st.close()
            raise
        return st, campaign, cells, planned
    if campaign is None:
        raise StoreError(f"store {store_path} does not exist; give a campaign file to start it")
    if expanded is None:
        dtypes: dict[str, list[str]] = {}
        loading(campaign)
        cells, hashes = campaign_cells(campaign, with_hashes=True, dtypes=dtypes)
    else:
        cells, hashes, dtypes = expanded
    planned = planned_counts(campaign, cells)
    st = ResultStore.create(
        store_path, campaign.to_dict(), [c.row(n) for c, n in zip(cells, planned)],
        input_hashes=hashes, shard=shard, chash=config_hash(campaign.definition()),
    )
    if created is not None:
        created.append(store_path)
    st.set_meta("cell_dtypes", json.dumps(dtypes, sort_keys=True))
    return st, campaign, cells, planned


def setting_changes(old: Any, new: Any, prefix: str = "", limit: int = 6) -> str:
    """The settings that differ between two campaign definitions, as ``key: old -> new`` items.

    >>> setting_changes({"seed": 1, "cells": {"bits": [30]}}, {"seed": 1, "cells": {"bits": [30, 31]}})
    'cells.bits: [30] -> [30, 31]'
    """
    items: list[str] = []

    def walk(a: Any, b: Any, key: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k, "(unset)"), b.get(k, "(unset)"), f"{key}.{k}" if key else str(k))
        elif a != b:
            items.append(f"{key}: {json.dumps(a, default=str)} -> {json.dumps(b, default=str)}")

    walk(old, new, prefix)
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def check_imports(campaign: Campaign) -> None:
    """Import the campaign's factory, evaluator function and data loader in this process, before any store
    or worker exists, so that a typo is one clear line and leaves nothing behind."""
    paths = [campaign.resolve(p) for p in campaign.paths]
    ev = campaign.evaluator
    for what, spec in (("[target] factory", campaign.target.factory), ("[evaluator] function", getattr(ev, "function", None)),
                       ("[evaluator] data", getattr(ev, "data", None))):
        if spec:
            obj = import_object(spec, paths)
            if not callable(obj):
                raise OptionError(f"{what} {spec} is not callable")


def _shard_filter(cell_id: int, trials: np.ndarray, shard: tuple[int, int] | None) -> np.ndarray:
    if shard is None:
        return trials
    i, n = shard
    return trials[(trials + cell_id) % n == i]


def _sequential_needs(st: ResultStore, campaign: Campaign, planned: Sequence[int],
                      stopped: set[int] | None = None) -> dict[int, np.ndarray]:
    """Per open cell, the missing trials of its next block (empty dict: every cell has stopped).

    Cells found stopped are added to ``stopped`` and skipped on later rounds.
    """
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


def _crash_row(runner_seed: int, cell_id: int, trial: int, message: str) -> TrialRow:
    return TrialRow(cell_id, trial, runner_seed, None, DUE, None, None, message[:400],
                    None, None)


def _plain(row: TrialRow) -> tuple:
    """The row as the store's writer takes it: every field but ``worker``."""
    return tuple(row[:9]) + tuple(row[10:])


def _run_payload(token: str, payload: Any, cell_id: int, trials: Any) -> tuple[str, list[tuple]]:
    """Worker side: unpickle the campaign once per process, then run the chunk.

    Returns the worker's label and plain 11-column rows (a :class:`TrialRow` without its worker).
    """
    if isinstance(payload, (bytes, bytearray)):
        payload = pickle.loads(payload)
    campaign_dict, cells, digest = payload
    runner = get_runner(token, campaign_dict, cells, digest)
    return runner.worker, [_plain(row) for row in runner.run_many(cell_id, trials.tolist())]


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the sweep's thread so that it saves, cleans up, then exits."""


_TERMINATED = {"flag": False, "raise": True}


def _on_sigterm(signum: int, frame: Any) -> None:
    _TERMINATED["flag"] = True
    if _TERMINATED["raise"]:  # once the sweep is cleaning up, a SIGTERM only waits for the end
        _TERMINATED["raise"] = False
        raise _Terminated()


def _catch_sigterm() -> Any:
    """Turn SIGTERM into :class:`_Terminated` while the sweep runs (main thread, default handler only)."""
    _TERMINATED.update(flag=False, **{"raise": True})
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None  # the caller handles SIGTERM itself
    return signal.signal(signal.SIGTERM, _on_sigterm)


def _release_sigterm(old: Any) -> bool:
    """Restore the SIGTERM handler; True if a SIGTERM arrived meanwhile."""
    if old is not None:
        signal.signal(signal.SIGTERM, old)
    hit = _TERMINATED["flag"]
    _TERMINATED["flag"] = False
    return hit and old is not None


def sweep(campaign: Campaign | None, store: str, **options: Any) -> SweepResult:
    """Run every missing trial of ``campaign`` into ``store`` (see the module docstring and :func:`_sweep` for the
    options). A sweep that fails before its first trial is stored leaves no store behind (the store it created is
    removed), so the corrected campaign starts afresh."""
    created: list[str] = []
    try:
        return _sweep(campaign, store, created, **options)
    except BaseException:
        if created:
            drop_empty(created[0])
        raise


def _sweep(
    campaign: Campaign | None,
    store: str,
    created: list[str],
    *,
    workers: int | None = None,
    executor: str = "local",
    dask: str | None = None,
    shard: str | None = None,
    chunk: int | None = None,
    batch_trials: int | None = None,
    progress: bool | None = None,
    status_every: float | None = None,
    flush_rows: int = 20_000,
    flush_seconds: float = 1.0,
    stream: Any = None,
) -> SweepResult:
    """Run every missing trial of ``campaign`` into ``store`` (see the module docstring).

    Parameters
    ----------
    campaign : Campaign or None
        None resumes the campaign recorded in an existing store.
    store : str
        The SQLite results store (created if absent).
    workers : int, optional
        Worker processes (default: all cores); 0 runs in this process.
    executor : {'local', 'serial'}
    dask : str, optional
        ``'local'`` (a LocalCluster) or a scheduler address; overrides ``executor``.
    shard : str, optional
        ``'i/N'``: run this shard's trials only.
    chunk : int, optional
        Trials per task (default: sized so that each worker gets many tasks).
    batch_trials : int, optional
        Trials per forward pass (overrides ``[evaluator] batch_trials``; 1 runs them one by one; see
        :mod:`fastflip.campaign.batched`). Results do not depend on it.
    progress : bool, optional
        Draw a progress bar (default: on a terminal, not under CI); False also silences the phase and
        status lines.
    status_every : float, optional
        Seconds between status lines when no bar is drawn (default ``FASTFLIP_STATUS_SECONDS`` or 60).
    """
    shard_t = parse_shard(shard)
    if chunk is not None and (isinstance(chunk, bool) or int(chunk) != chunk or chunk < 1):
        raise OptionError(f"--chunk must be a positive integer (trials per task), got {chunk!r}")
    if batch_trials is not None and (isinstance(batch_trials, bool) or int(batch_trials) != batch_trials
                                     or batch_trials < 1):
        raise OptionError(f"--batch-trials must be a positive integer (trials per forward pass), got {batch_trials!r}")
    out = stream if stream is not None else sys.stderr

    def say(text: str) -> None:
        if progress is not False:
            out.write(text + "\n")
            out.flush()

    sweep_leftovers()
    if dask == "local" or (dask is None and executor == "local" and workers != 0):
        check_main_guard()  # before the store exists: a script without a main guard leaves nothing behind
    runner = expanded = None
    if campaign is not None:
        check_imports(campaign)
        if batch_trials is not None:
            campaign.evaluator.batch_trials = int(batch_trials)  # not part of the campaign's identity
        if not os.path.exists(store):  # a new store: the golden run first, so that a mismatch leaves nothing
            dtypes: dict[str, list[str]] = {}
            say(f"loading the target ({campaign.target.factory or campaign.target.checkpoint}) and evaluating the "
                f"fault-free (golden) run of campaign {campaign.name!r}")
            cells, hashes = campaign_cells(campaign, with_hashes=True, dtypes=dtypes)
            runner = preflight(campaign, cells)
            expanded = (cells, hashes, dtypes)
    try:
        st, campaign, cells, planned = open_or_create(store, campaign, shard, say=say, expanded=expanded,
                                                      created=created)
    except sqlite3.Error as exc:
        raise sqlite_error(store, exc, "opening it") from exc
    if batch_trials is not None:
        campaign.evaluator.batch_trials = int(batch_trials)  # not part of the campaign's identity
    if runner is None and st.n_trials() < sum(planned):
        try:
            runner = preflight(campaign, cells)
        except BaseException:
            st.close()
            raise
    sequential = campaign.trials.sequential
    if sequential and (shard_t is not None and shard_t[1] > 1):
        st.close()
        raise OptionError("--shard cannot split a sequential ([trials] half_width) campaign: its cells stop on shared counts")
    t0 = time.monotonic()
    token = st.config_hash
    planned_total = sum(planned) if shard_t is None else sum(
        len(_shard_filter(c, np.arange(n), shard_t)) for c, n in enumerate(planned))
    stored_before = st.n_trials()
    if stored_before:
        say(f"resuming {store}: {stored_before:,} of {planned_total:,} trials stored, "
            f"{max(planned_total - stored_before, 0):,} to run ({len(cells)} cells)")
    else:
        say(f"starting {store}: {planned_total:,} trials in {len(cells)} cells")
    try:
        ex = make_executor(executor, workers=workers, dask=dask, gpus=sweep_gpus())
    except BaseException:
        st.close()
        raise
    try:
        line = batch_line(runner, ex.workers) if runner is not None and stored_before < planned_total else None
    except BaseException:
        ex.close(cancel=True)
        st.close()
        raise
    if line:
        say(line)
    if runner is not None:
        if getattr(ex, "name", "") == "serial":  # the trials run in this process: with the runner built here
            adopt_runner(token, runner)
        else:
            runner.close()
        runner = None
    if stored_before < planned_total:
        say(f"running on {ex.workers} {getattr(ex, 'name', executor)} worker(s); each loads the target and "
            "evaluates the fault-free (golden) run before its first trial")
    prog = Progress(planned_total, stored_before, enabled=progress, stream=stream,
                    status_every=0 if progress is False else status_every)
    result = SweepResult(store, planned_total, stored_before, 0, notes=cell_notes(campaign, cells, planned))
    shipped = (campaign.to_dict(), cells, st.input_hashes.get("factory"))
    payload: Any = pickle.dumps(shipped, protocol=pickle.HIGHEST_PROTOCOL)
    if hasattr(ex, "_client"):
        payload = ex._client.scatter(shipped, broadcast=True)
    pending: list[tuple[str | None, list[tuple]]] = []
    n_pending = 0
    last_flush = time.monotonic()
    stopping = False
    successes = crash_streak = 0
    held: list[tuple[str | None, list[tuple]]] = []  # crash rows seen before any success
    stopped_cells: set[int] = set()
    old_term = _catch_sigterm()

    def flush() -> None:
        nonlocal last_flush, n_pending
        if pending:
            # Ctrl-C and SIGTERM wait until the rows are both committed and forgotten (never stored twice)
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                result.ran += st.add_batches(pending)
                pending.clear()
                n_pending = 0
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
        last_flush = time.monotonic()

    try:
        while not stopping:
            if sequential:
                work = _sequential_needs(st, campaign, planned, stopped_cells)
            else:
                work = {c: _shard_filter(c, m, shard_t) for c, m in st.missing(dict(enumerate(planned))).items()}
                work = {c: m for c, m in work.items() if len(m)}
            if not work:
                result.complete = True
                break
            total = sum(len(v) for v in work.values())
            size = chunk or max(1, min(500, math.ceil(total / (ex.workers * 8))))
            tasks = _chunks(work, size)
            suspects: deque = deque()  # single trials of chunks that were in flight when a worker died
            in_flight: dict[Any, tuple[int, np.ndarray, bool]] = {}
            while (tasks or suspects or in_flight) and not (stopping and not in_flight):
                try:
                    if not stopping:
                        if suspects:
                            if not in_flight:
                                cid, trials = suspects.popleft()
                                in_flight[ex.submit(_run_payload, token, payload, cid, trials)] = (cid, trials, True)
                        else:
                            while tasks and len(in_flight) < 2 * ex.workers + 2:
                                cid, trials = tasks.popleft()
                                in_flight[ex.submit(_run_payload, token, payload, cid, trials)] = (cid, trials, False)
                    done, _ = ex.wait(list(in_flight), 0.25)
                    crashed = False
                    for fut in done:
                        cid, trials, single = in_flight.pop(fut)
                        try:
                            rows = ex.result(fut)
                        except WorkerCrash as exc:
                            crashed = True
                            crash_streak += int(single)
                            if successes == 0 and crash_streak >= 3:
                                raise StoreError(
                                    f"worker processes die before finishing any trial ({exc}); "
                                    "check the target factory and evaluator (run with --workers 0 to see the error)"
                                ) from exc
                            if single:
                                row = _plain(_crash_row(campaign.seed, cid, int(trials[0]), f"WorkerCrash: {exc}"))
                                # until some trial has succeeded, a crash may be the workers' fault, not the trial's
                                (held if successes == 0 else pending).append((None, [row]))
                                n_pending += 1
                                prog.update([DUE])
                            else:
                                suspects.extend((cid, trials[i : i + 1]) for i in range(len(trials)))
                            continue
                        except TrialAborted as exc:  # out of memory, the environment: not a fault's outcome
                            raise TrialAborted(str(exc)) from None
                        except Exception as exc:
                            raise StoreError(f"a worker could not run trials: {worker_error(exc)}") from exc
                        successes += 1
                        if held:
                            pending.extend(held)
                            held.clear()
                        worker, rows = rows
                        pending.append((worker, rows))
                        n_pending += len(rows)
                        prog.update(r[4] for r in rows)
                    if crashed:
                        for fut, (cid, trials, single) in list(in_flight.items()):
                            fut.cancel()
                            suspects.extend((cid, trials[i : i + 1]) for i in range(len(trials)))
                        in_flight.clear()
                        ex.restart()
                    if n_pending >= flush_rows or time.monotonic() - last_flush >= flush_seconds:
                        flush()
                except KeyboardInterrupt as exc:
                    if stopping or isinstance(exc, _Terminated):  # second Ctrl-C, SIGTERM: abandon what is in flight
                        stopping = True
                        result.interrupted = True
                        for fut in in_flight:
                            fut.cancel()
                        in_flight.clear()
                        break
                    stopping = True
                    result.interrupted = True
                    prog.message("interrupted: saving finished trials (Ctrl-C again to abandon the ones in flight)")
            if not stopping:  # the round ran to its end: isolated crashes are the trials' own
                pending.extend(held)
                held.clear()
            flush()
            if not sequential:
                result.complete = not stopping and not tasks and not suspects
                if result.complete:
                    break
    except KeyboardInterrupt:
        result.interrupted = True
    except sqlite3.Error as exc:
        raise sqlite_error(store, exc, "sweeping") from exc
    finally:
        _TERMINATED["raise"] = False
        try:
            flush()
        finally:
            try:
                ex.close(cancel=True)
            finally:
                try:
                    close_runners()  # working copies of an in-process (serial) sweep
                    remove_workdirs(os.getpid())  # and of workers that could not remove their own
                    counts = st.outcome_counts().sum(axis=0)
                    result.counts = {name: int(n) for name, n in zip(TRIAL_OUTCOMES, counts)}
                    result.masked_numeric = int(st.conn.execute(
                        "SELECT COUNT(*) FROM trials WHERE outcome = 0 AND numeric = 1").fetchone()[0])
                    result.stored = st.n_trials()
                except sqlite3.Error:
                    pass  # the error that matters is already on its way
                finally:
                    result.elapsed = time.monotonic() - t0
                    st.close()
                    prog.close(summary=progress is not False)
                    terminated = _release_sigterm(old_term)
    if terminated:  # cleaned up and saved: now let SIGTERM take its usual course
        os.kill(os.getpid(), signal.SIGTERM)
    if not sequential and not result.interrupted:
        result.complete = result.stored >= planned_total or result.complete
    return result
