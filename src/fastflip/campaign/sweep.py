"""Run (or resume) a campaign into its results store.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

:func:`sweep` opens the store (creating it on the first run), works out which
(cell, trial) pairs are still missing, ships them in chunks to an executor and
streams the finished rows to the single writer in batched transactions. Because
every trial derives from (seed, cell, trial) alone, a sweep stopped by Ctrl-C, a
crash or SIGKILL resumes with no trial lost, none run twice, and every outcome
equal to an uninterrupted run.

* ``shard='i/N'`` runs only the trials with ``(cell + trial) % N == i`` into a shard
  store; :func:`fastflip.campaign.store_export.merge_stores` combines the shards.
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
import os
import pickle
import signal
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import OptionError, StoreError
from .cells import (Cell, call_factory, cell_notes, expand_cells, import_object, input_hashes, planned_counts,
                    target_tensors)
from .config import Campaign
from .executors import check_main_guard, make_executor, sweep_gpus
from .lifeline import remove_workdirs, sweep_leftovers
from .preflight import batch_line, drop_empty, preflight
from .progress import Progress
from .rounds import Rounds, RowWriter, catch_sigterm, cleaning_up, release_sigterm, shard_trials
from .store import TRIAL_OUTCOMES, ResultStore, config_hash
from .store_guard import sqlite_error
from .trials import adopt_runner, close_runners

__all__ = ["SweepResult", "Expansion", "sweep", "parse_shard", "expand", "campaign_cells", "open_or_create"]


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


@dataclass
class Expansion:
    """The campaign's cells as expanded against its target in this process, and what that read: the input
    hashes stored with the campaign, each cell's dtype names (for the report) and the factory's object
    (None for checkpoints), which the pre-flight reuses instead of building the target again."""

    cells: list[Cell]
    hashes: dict[str, str]
    dtypes: dict[str, list[str]]
    target: Any = None


def expand(campaign: Campaign, *, hashes: bool = True) -> Expansion:
    """Expand the campaign's grid against its target: reads the checkpoints' layouts, or calls the factory once.

    ``hashes=False`` skips hashing the input (reading every checkpoint through).
    """
    epochs: list[int | None] = list(campaign.cells.epochs) if campaign.cells.epochs else [None]
    obj = None
    if campaign.target.factory is not None:
        obj = call_factory(campaign)
        by_epoch = {e: target_tensors(campaign, e, obj) for e in epochs}
    else:
        by_epoch = {e: target_tensors(campaign, e) for e in epochs}
    cells = expand_cells(campaign, by_epoch)
    dtype_of = {t.path: str(t.dtype) for ts in by_epoch.values() for t in ts}
    dtypes = {c.key: sorted({dtype_of[n] for n in c.tensors if n in dtype_of}) for c in cells}
    return Expansion(cells, input_hashes(campaign, obj) if hashes else {}, dtypes, obj)


def campaign_cells(campaign: Campaign, *, with_hashes: bool = False,
                   dtypes: dict[str, list[str]] | None = None) -> Any:
    """Expand the campaign's grid against its target (reads layouts or calls the factory once).

    With ``with_hashes=True`` returns ``(cells, input_hashes)`` from that same call.
    ``dtypes``, when given, is filled with each cell's key → the dtype names of its
    tensors (what the report needs to draw sign / exponent / mantissa boundaries).
    """
    exp = expand(campaign, hashes=with_hashes)
    if dtypes is not None:
        dtypes.update(exp.dtypes)
    return (exp.cells, exp.hashes) if with_hashes else exp.cells


def open_or_create(
    store_path: str, campaign: Campaign | None, shard: str | None = None, say: Any = None,
    expanded: Expansion | None = None, created: list[str] | None = None,
) -> tuple[ResultStore, Campaign, Expansion, list[int]]:
    """Open the store for writing (creating it from ``campaign`` when absent) and check it matches; returns the
    store, the campaign (``campaign`` or the store's own), its :class:`Expansion` and its trials per cell.

    ``say(text)``, when given, is told when the (possibly slow) target loading starts. ``expanded``: the
    expansion of ``campaign`` already computed in this process (for a new store, by :func:`sweep`'s load step).
    ``created``, when given, gets the path of a store created here.
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
                expanded = expand(campaign)
            cells = expanded.cells
            if expanded.hashes != st.input_hashes:
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
        return st, campaign, expanded, planned
    if campaign is None:
        raise StoreError(f"store {store_path} does not exist; give a campaign file to start it")
    if expanded is None:
        loading(campaign)
        expanded = expand(campaign)
    planned = planned_counts(campaign, expanded.cells)
    st = ResultStore.create(
        store_path, campaign.to_dict(), [c.row(n) for c, n in zip(expanded.cells, planned)],
        input_hashes=expanded.hashes, shard=shard, chash=config_hash(campaign.definition()),
    )
    if created is not None:
        created.append(store_path)
    st.set_meta("cell_dtypes", json.dumps(expanded.dtypes, sort_keys=True))
    return st, campaign, expanded, planned


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

    Notes
    -----
    The steps, in order: **load** (:func:`_load`: the campaign's imports; for a new store the target, built
    once, the cells and the pre-flight, before the store exists), open or create the store
    (:func:`open_or_create`), **pre-flight** (:func:`_preflight`, when resuming with trials left), **plan**
    (:func:`_plan`: trials in all and stored), **pool** (:func:`_pool`: the executor and the batching
    decision), **resume** (:meth:`fastflip.campaign.rounds.Rounds.run`: rounds of the trials the store is
    missing, a new store being one with every trial missing), **summarise** (:func:`_summarise`).
    """
    shard_t = _check_options(shard, chunk, batch_trials)
    say = _sayer(progress, stream)
    in_process = dask is None and (executor == "serial" or workers == 0)
    sweep_leftovers()
    if dask == "local" or (dask is None and executor == "local" and workers != 0):
        check_main_guard()  # before the store exists: a script without a main guard leaves nothing behind
    expanded, runner = _load(campaign, store, batch_trials, in_process, say)
    try:
        st, campaign, expanded, planned = open_or_create(store, campaign, shard, say=say, expanded=expanded,
                                                         created=created)
    except sqlite3.Error as exc:
        raise sqlite_error(store, exc, "opening it") from exc
    try:
        if batch_trials is not None:
            campaign.evaluator.batch_trials = int(batch_trials)  # not part of the campaign's identity
        if runner is None and st.n_trials() < sum(planned):
            runner = _preflight(campaign, expanded, in_process)
        planned_total, stored_before = _plan(st, campaign, planned, shard_t, len(expanded.cells), say)
    except BaseException:
        st.close()
        raise
    t0 = time.monotonic()
    ex = _pool(st, runner, executor, workers, dask, stored_before < planned_total, say)
    prog = Progress(planned_total, stored_before, enabled=progress, stream=stream,
                    status_every=0 if progress is False else status_every)
    result = SweepResult(store, planned_total, stored_before, 0, notes=cell_notes(campaign, expanded.cells, planned))
    rounds = Rounds(st, ex, campaign, planned, shard_t, st.config_hash, _payload(st, ex, campaign, expanded), prog,
                    RowWriter(st, flush_rows, flush_seconds), chunk=chunk)
    old_term = catch_sigterm()
    try:
        rounds.run()  # resume: the rounds of the trials the store is missing
    except KeyboardInterrupt:
        result.interrupted = True
    except sqlite3.Error as exc:
        raise sqlite_error(store, exc, "sweeping") from exc
    finally:
        cleaning_up()
        try:
            rounds.writer.flush()
        finally:
            try:
                ex.close(cancel=True)
            finally:
                try:
                    _summarise(st, rounds, result, t0)
                finally:
                    prog.close(summary=progress is not False)
                    terminated = release_sigterm(old_term)
    if terminated:  # cleaned up and saved: now let SIGTERM take its usual course
        os.kill(os.getpid(), signal.SIGTERM)
    if not rounds.sequential and not result.interrupted:
        result.complete = result.stored >= planned_total or result.complete
    return result


# ------------------------------------------------------------------------------ the steps of a sweep

def _check_options(shard: str | None, chunk: int | None, batch_trials: int | None) -> tuple[int, int] | None:
    """Check the options that need no campaign (one line each); returns the shard as ``(i, N)``."""
    shard_t = parse_shard(shard)
    if chunk is not None and (isinstance(chunk, bool) or int(chunk) != chunk or chunk < 1):
        raise OptionError(f"--chunk must be a positive integer (trials per task), got {chunk!r}")
    if batch_trials is not None and (isinstance(batch_trials, bool) or int(batch_trials) != batch_trials
                                     or batch_trials < 1):
        raise OptionError(f"--batch-trials must be a positive integer (trials per forward pass), got {batch_trials!r}")
    return shard_t


def _sayer(progress: bool | None, stream: Any) -> Any:
    """``say(text)``: one phase line on ``stream`` (default stderr), unless ``progress`` is False."""
    out = stream if stream is not None else sys.stderr

    def say(text: str) -> None:
        if progress is not False:
            out.write(text + "\n")
            out.flush()

    return say


def _load(campaign: Campaign | None, store: str, batch_trials: int | None, in_process: bool,
          say: Any) -> tuple[Expansion | None, Any]:
    """Load: import the campaign's functions; for a new store, also build the target once, expand the cells and
    run the pre-flight (:func:`_preflight`), all before the store exists, so that a mistake leaves nothing behind.

    Returns the expansion and the pre-flight's runner (both None when resuming: they come after the store is
    opened and checked, see :func:`open_or_create`).
    """
    if campaign is None:
        return None, None
    check_imports(campaign)
    if batch_trials is not None:
        campaign.evaluator.batch_trials = int(batch_trials)  # not part of the campaign's identity
    if os.path.exists(store):
        return None, None
    say(f"loading the target ({campaign.target.factory or campaign.target.checkpoint}) and evaluating the "
        f"fault-free (golden) run of campaign {campaign.name!r}")
    expanded = expand(campaign)
    return expanded, _preflight(campaign, expanded, in_process)


def _preflight(campaign: Campaign, expanded: Expansion, in_process: bool) -> Any:
    """Pre-flight: the golden run in this process (:func:`fastflip.campaign.preflight.preflight`) on the target
    the load step built. An in-process sweep runs its trials with this runner, so there the factory is called
    again: a factory that gives other tensors on a second call is refused, as every worker of a pool checks."""
    return preflight(campaign, expanded.cells, target=None if in_process else expanded.target)


def _plan(st: ResultStore, campaign: Campaign, planned: Sequence[int], shard: tuple[int, int] | None,
          n_cells: int, say: Any) -> tuple[int, int]:
    """Plan: the trials this store holds when complete and those it holds now (says which, starting or
    resuming); refuses to shard a sequential campaign (its cells stop on counts over all shards)."""
    if campaign.trials.sequential and (shard is not None and shard[1] > 1):
        raise OptionError("--shard cannot split a sequential ([trials] half_width) campaign: its cells stop on shared counts")
    planned_total = sum(planned) if shard is None else sum(
        len(shard_trials(c, np.arange(n), shard)) for c, n in enumerate(planned))
    stored_before = st.n_trials()
    if stored_before:
        say(f"resuming {st.path}: {stored_before:,} of {planned_total:,} trials stored, "
            f"{max(planned_total - stored_before, 0):,} to run ({n_cells} cells)")
    else:
        say(f"starting {st.path}: {planned_total:,} trials in {n_cells} cells")
    return planned_total, stored_before


def _pool(st: ResultStore, runner: Any, executor: str, workers: int | None, dask: str | None, to_run: bool,
          say: Any) -> Any:
    """Pool: start the executor, decide how its workers batch trials (with the pre-flight's runner), and hand
    that runner to the trials when they run in this process (else close it). Closes the store on failure."""
    try:
        ex = make_executor(executor, workers=workers, dask=dask, gpus=sweep_gpus())
    except BaseException:
        st.close()
        raise
    try:
        line = batch_line(runner, ex.workers) if runner is not None and to_run else None
    except BaseException:
        ex.close(cancel=True)
        st.close()
        raise
    if line:
        say(line)
    if runner is not None:
        if getattr(ex, "name", "") == "serial":  # the trials run in this process: with the runner built here
            adopt_runner(st.config_hash, runner)
        else:
            runner.close()
    if to_run:
        say(f"running on {ex.workers} {getattr(ex, 'name', executor)} worker(s); each loads the target and "
            "evaluates the fault-free (golden) run before its first trial")
    return ex


def _payload(st: ResultStore, ex: Any, campaign: Campaign, expanded: Expansion) -> Any:
    """What each worker builds its runner from: the campaign, its cells and the factory target's digest
    (pickled once; broadcast once to a Dask cluster)."""
    shipped = (campaign.to_dict(), expanded.cells, st.input_hashes.get("factory"))
    if hasattr(ex, "_client"):
        return ex._client.scatter(shipped, broadcast=True)
    return pickle.dumps(shipped, protocol=pickle.HIGHEST_PROTOCOL)


def _summarise(st: ResultStore, rounds: Rounds, result: SweepResult, t0: float) -> None:
    """Summarise: remove the working copies, fill ``result`` from the store (outcome counts, trials stored) and
    close the store. A store error here is dropped: the error that matters is already on its way."""
    result.ran = rounds.writer.ran
    result.interrupted = result.interrupted or rounds.interrupted
    result.complete = rounds.complete
    try:
        close_runners()  # working copies of an in-process (serial) sweep
        remove_workdirs(os.getpid())  # and of workers that could not remove their own
        counts = st.outcome_counts().sum(axis=0)
        result.counts = {name: int(n) for name, n in zip(TRIAL_OUTCOMES, counts)}
        result.masked_numeric = int(st.conn.execute(
            "SELECT COUNT(*) FROM trials WHERE outcome = 0 AND numeric = 1").fetchone()[0])
        result.stored = st.n_trials()
    except sqlite3.Error:
        pass
    finally:
        result.elapsed = time.monotonic() - t0
        st.close()
