"""The results store of a campaign: one SQLite file, one writer, resumable.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

A store holds the campaign (its full configuration, the fastflip version that wrote
it, hashes of its inputs), its cells, and one row per finished trial. SQLite runs in
WAL mode with batched transactions: a killed sweep loses at most the batch it had not
committed, and those trials simply run again on resume because a trial's sites derive
from (seed, cell, trial index) alone.

Schema (version :data:`SCHEMA_VERSION`; ``PRAGMA application_id`` is
:data:`APPLICATION_ID` so that a foreign SQLite file is recognised and left alone)::

    meta(key TEXT PRIMARY KEY, value TEXT)
    campaign(id=1, name, config JSON, config_hash, seed, fastflip_version, schema_version,
             input_hashes JSON, shard 'i/N' or NULL, created)
    cells(cell_id INTEGER PRIMARY KEY, key TEXT UNIQUE, bits, grp, group_by, flips, fault,
          epoch, planned, population, sampling, fpc_population)
    workers(worker_id INTEGER PRIMARY KEY, label TEXT UNIQUE)
    trials(cell_id, trial, seed, sites, outcome, metric, delta, message, duration, worker,
           numeric, changed, PRIMARY KEY (cell_id, trial)) WITHOUT ROWID

``outcome`` is 0 masked, 1 SDC, 2 critical SDC, 3 DUE (:data:`TRIAL_OUTCOMES`, the vocabulary of
:mod:`fastflip.campaign.outcomes`); ``numeric`` is 1 where the raw outputs changed (a masked trial
with it is ``masked_numeric``), NULL where the evaluator gave no outputs; ``changed`` is
the fraction of inputs whose answer changed. A cell's ``sampling`` is ``permutation``
(distinct sites across trials), ``exhaustive`` (every site once) or ``independent``;
``fpc_population`` is the N of the finite-population correction (NULL: none applies).

Schema version 2 (fastflip 0.2) added ``numeric``, ``changed``, ``sampling`` and
``fpc_population``, and changed what ``sdc`` means (a changed answer, not any changed
output bit); stores of version 1 are refused with a line that says so. Only one
sweep may write a store at a time: the writer holds an exclusive ``flock`` on the
store file itself (its inode, so symlinks and hard links share it) for as long as it
is open, and records who it is (pid, host, start time) in ``meta`` under ``writer``;
the kernel drops the lock if the process dies, so a killed sweep never leaves a
stale lock. Exports to CSV or Parquet and merging shard stores are in
:mod:`fastflip.campaign.store_export`.

Examples
--------
>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> st = ResultStore.create(os.path.join(d, "r.db"), {"name": "demo", "seed": 1},
...                         [{"key": "c0", "planned": 3}])
>>> st.add_trials([TrialRow(0, 0, 11, "w[3]^b30", 0, 1.0, 0.0, None, 0.01, "w0")])
1
>>> sorted(st.missing()[0].tolist())
[1, 2]
>>> st.close()
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import tempfile
import time
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from .. import __version__
from ..errors import OutputError, StoreError
from ..files.fileio import new_file_mode
from .outcomes import DEFAULT_FAILURE, MASKED_NUMERIC, TRIAL_OUTCOMES, failure_sql
from .store_guard import SCHEMA_SQL, StoreLock, check_header, check_schema, rollback_quietly, sqlite_error

__all__ = [
    "SCHEMA_VERSION",
    "APPLICATION_ID",
    "TRIAL_OUTCOMES",
    "TrialRow",
    "ResultStore",
    "config_hash",
]

SCHEMA_VERSION = 2
APPLICATION_ID = 0x46466C70  # "FFlp"

_CELL_COLUMNS = ("key", "bits", "grp", "group_by", "flips", "fault", "epoch", "planned", "population", "sampling",
                 "fpc_population")


class TrialRow(NamedTuple):
    """One finished trial as stored (``outcome`` is an index into :data:`TRIAL_OUTCOMES`).

    ``numeric`` (1: the raw outputs changed) and ``changed`` (fraction of inputs whose
    answer changed) come last so that the first ten fields keep their places.
    """

    cell_id: int
    trial: int
    seed: int
    sites: str | None
    outcome: int
    metric: float | None
    delta: float | None
    message: str | None
    duration: float | None
    worker: str | None
    numeric: int | None = None
    changed: float | None = None


def config_hash(config: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a campaign configuration.

    >>> config_hash({"b": 1, "a": 2}) == config_hash({"a": 2, "b": 1})
    True
    """
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


class ResultStore:
    """An open results store. Use :meth:`create` or :meth:`open`; close it (or use ``with``).

    A writer (``writable=True``) holds the exclusive sweep lock until :meth:`close`.
    """

    def __init__(self, path: str, conn: sqlite3.Connection, lock: StoreLock | None) -> None:
        self.path = path
        self.conn = conn
        self._lock = lock
        self._workers: dict[str, int] = {}
        row = conn.execute(
            "SELECT name, config, config_hash, seed, fastflip_version, schema_version, input_hashes, shard, created "
            "FROM campaign WHERE id = 1"
        ).fetchone()
        if row is None:
            raise StoreError(f"store {path} holds no campaign row: it is damaged")
        self.name: str = row[0]
        self.config: dict[str, Any] = json.loads(row[1])
        self.config_hash: str = row[2]
        self.seed: int | None = row[3]
        self.fastflip_version: str = row[4]
        self.schema_version: int = row[5]
        self.input_hashes: dict[str, str] = json.loads(row[6] or "{}")
        self.shard: str | None = row[7]
        self.created: float = row[8]
        if lock is not None:
            self._workers = {label: wid for wid, label in conn.execute("SELECT worker_id, label FROM workers")}

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(
        cls,
        path: str,
        config: dict[str, Any],
        cells: Sequence[dict[str, Any]],
        *,
        input_hashes: dict[str, str] | None = None,
        shard: str | None = None,
        chash: str | None = None,
    ) -> "ResultStore":
        """Create a new store at ``path`` (which must not exist) and open it for writing.

        The file is built under a temporary name and linked into place, so a crash
        during creation never leaves a half-made store, and an existing file is never
        overwritten.
        """
        path = os.fspath(path)
        if os.path.lexists(path):
            raise StoreError(f"store {path} already exists; refusing to overwrite it")
        directory = os.path.dirname(os.path.abspath(path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=".fastflip-store-", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise OutputError(f"cannot create store in {directory}: {exc.strerror or exc}") from exc
        os.close(fd)
        os.chmod(tmp, new_file_mode())  # mkstemp makes 0600; a store is an ordinary output file
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("BEGIN")
                for stmt in SCHEMA_SQL.strip().split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                conn.execute(
                    "INSERT INTO meta VALUES ('format', 'fastflip-results'), ('created_by', ?)", (f"fastflip {__version__}",)
                )
                conn.execute(
                    "INSERT INTO campaign VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        config.get("name"),
                        json.dumps(config, sort_keys=True, default=str),
                        chash or config_hash(config),
                        config.get("seed"),
                        __version__,
                        SCHEMA_VERSION,
                        json.dumps(input_hashes or {}, sort_keys=True),
                        shard,
                        time.time(),
                    ),
                )
                for i, cell in enumerate(cells):
                    conn.execute(
                        f"INSERT INTO cells (cell_id, {', '.join(_CELL_COLUMNS)}) VALUES ({', '.join('?' * (len(_CELL_COLUMNS) + 1))})",
                        (i, *[cell.get(c) for c in _CELL_COLUMNS]),
                    )
                conn.execute("COMMIT")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()
            for suffix in ("-wal", "-shm"):
                if os.path.exists(tmp + suffix):
                    os.unlink(tmp + suffix)
            try:
                os.link(tmp, path)  # fails if path appeared meanwhile: never overwrite
            except FileExistsError:
                raise StoreError(f"store {path} already exists; refusing to overwrite it") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return cls.open(path, writable=True)

    @classmethod
    def open(cls, path: str, *, writable: bool = False, check: bool = True) -> "ResultStore":
        """Open an existing store; refuse foreign, corrupt, newer or (for writers) locked ones."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise StoreError(f"store {path} does not exist")
        check_header(path)
        lock = StoreLock.acquire(path) if writable else None
        try:
            try:
                if writable:
                    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
                else:
                    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, timeout=30)
                app_id = conn.execute("PRAGMA application_id").fetchone()[0]
                if app_id != APPLICATION_ID:
                    conn.close()
                    raise StoreError(
                        f"{path} is an SQLite database but not a fastflip results store "
                        f"(application_id {app_id:#x}); it was left untouched"
                    )
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    conn.close()
                    raise StoreError(
                        f"store {path} has schema version {version}, newer than this fastflip "
                        f"{__version__} reads ({SCHEMA_VERSION}); upgrade fastflip"
                    )
                if version < SCHEMA_VERSION:
                    conn.close()
                    raise StoreError(
                        f"store {path} has schema version {version}, written before outcomes meant a changed answer "
                        f"(its 'sdc' counts any changed output bit); fastflip {__version__} reads version "
                        f"{SCHEMA_VERSION} only: rerun the campaign into a new store"
                    )
                if check:
                    res = conn.execute("PRAGMA quick_check").fetchone()[0]
                    if res != "ok":
                        conn.close()
                        raise StoreError(f"store {path} is corrupt ({res}); it was left untouched")
                try:
                    check_schema(conn, path)
                except StoreError:
                    conn.close()
                    raise
                wrote = conn.execute("SELECT fastflip_version FROM campaign WHERE id = 1").fetchone()
                if wrote and _version_tuple(wrote[0]) > _version_tuple(__version__):
                    conn.close()
                    raise StoreError(
                        f"store {path} was written by fastflip {wrote[0]}, newer than this {__version__}; upgrade fastflip"
                    )
                if writable:
                    conn.execute("PRAGMA journal_mode = WAL")
                    conn.execute("PRAGMA synchronous = NORMAL")
                    StoreLock.record(conn)
                return cls(path, conn, lock)
            except sqlite3.Error as exc:
                raise sqlite_error(path, exc, "opening it") from exc
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    def close(self) -> None:
        """Close the connection and release the sweep lock."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None  # type: ignore[assignment]
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def writable(self) -> bool:
        return self._lock is not None

    def meta_value(self, key: str) -> str | None:
        """A value of the ``meta`` table (None when absent), e.g. ``cell_dtypes``."""
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Set a value of the ``meta`` table (``cell_dtypes``: JSON cell key → dtype names of its tensors)."""
        if not self.writable:
            raise StoreError(f"store {self.path} is open read-only; cannot set {key}")
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # ------------------------------------------------------------------ content
    def cells(self) -> list[dict[str, Any]]:
        """The campaign's cells in cell_id order (dicts of the ``cells`` columns)."""
        cols = ("cell_id",) + _CELL_COLUMNS
        return [dict(zip(cols, r)) for r in self.conn.execute(f"SELECT {', '.join(cols)} FROM cells ORDER BY cell_id")]

    def _worker_id(self, label: str | None) -> int | None:
        if label is None:
            return None
        wid = self._workers.get(label)
        if wid is None:
            wid = len(self._workers)
            while wid in self._workers.values():
                wid += 1
            self.conn.execute("INSERT INTO workers VALUES (?, ?)", (wid, label))
            self._workers[label] = wid
        return wid

    def add_trials(self, rows: Iterable[TrialRow]) -> int:
        """Insert finished trials in one transaction; return how many. A duplicate is an error."""
        batches: dict[str | None, list[tuple]] = {}
        for r in rows:
            batches.setdefault(r[9], []).append(tuple(r[:9]) + tuple(r[10:12]))
        return self.add_batches(list(batches.items()))

    def add_batches(self, batches: Sequence[tuple[str | None, Sequence[tuple]]]) -> int:
        """Insert ``[(worker label, [11-column trial tuples]), ...]`` in one transaction (the sweep's fast path).

        A tuple holds the :class:`TrialRow` fields without ``worker``.
        """
        if not self.writable:
            raise StoreError(f"store {self.path} is open read-only")
        conn = self.conn
        n = 0
        try:
            conn.execute("BEGIN IMMEDIATE")
            for worker, rows in batches:
                wid = self._worker_id(worker)
                conn.executemany("INSERT INTO trials VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
                                 f"{'NULL' if wid is None else int(wid)}, ?, ?)", rows)
                n += len(rows)
            conn.execute("COMMIT")
        except sqlite3.IntegrityError as exc:
            rollback_quietly(conn)
            self._reload_workers()
            raise StoreError(f"store {self.path}: a trial was stored twice ({exc})") from exc
        except sqlite3.Error as exc:  # disk full, I/O error, locked: name the cause, not the rollback
            rollback_quietly(conn)
            self._reload_workers()
            raise sqlite_error(self.path, exc, "saving trials") from exc
        except BaseException:
            rollback_quietly(conn)
            self._reload_workers()
            raise
        return n

    def _reload_workers(self) -> None:
        try:
            self._workers = {label: wid for wid, label in self.conn.execute("SELECT worker_id, label FROM workers")}
        except sqlite3.Error:
            self._workers = {}

    def done_trials(self, cell_id: int) -> np.ndarray:
        """Sorted trial indices stored for one cell."""
        got = self.conn.execute("SELECT trial FROM trials WHERE cell_id = ? ORDER BY trial", (cell_id,)).fetchall()
        return np.fromiter((t for (t,) in got), dtype=np.int64, count=len(got))

    def missing(self, planned: dict[int, int] | None = None) -> dict[int, np.ndarray]:
        """Trial indices not yet stored, per cell (``planned`` overrides the cells' planned counts)."""
        if planned is None:
            planned = {c["cell_id"]: c["planned"] for c in self.cells()}
        out: dict[int, np.ndarray] = {}
        for cell_id, n in planned.items():
            have = np.zeros(int(n), dtype=bool)
            done = self.done_trials(cell_id)
            have[done[done < n]] = True
            out[cell_id] = np.flatnonzero(~have)
        return out

    def n_trials(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0])

    def outcome_counts(self) -> np.ndarray:
        """Counts per (cell, outcome) by SQL aggregation: an int64 array of shape (n_cells, 4)."""
        n_cells = int(self.conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0])
        out = np.zeros((n_cells, len(TRIAL_OUTCOMES)), dtype=np.int64)
        for cell, outcome, n in self.conn.execute("SELECT cell_id, outcome, COUNT(*) FROM trials GROUP BY cell_id, outcome"):
            out[cell, outcome] = n
        return out

    @property
    def failure(self) -> tuple[str, ...]:
        """The outcome classes the campaign counts as failure (``[evaluator] failure``)."""
        return tuple((self.config.get("evaluator") or {}).get("failure") or DEFAULT_FAILURE)

    def cell_summary(self, failure: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Per cell: its columns, trials, per-outcome counts, ``masked_numeric``, ``failures``
        (of ``failure``, default the campaign's), mean metric / delta / changed fraction (one SQL query)."""
        failure = self.failure if failure is None else tuple(failure)
        q = (
            f"SELECT c.cell_id, {', '.join('c.' + k for k in _CELL_COLUMNS)}, COUNT(t.trial), "
            + ", ".join(f"SUM(t.outcome = {i})" for i in range(len(TRIAL_OUTCOMES)))
            + f", SUM(t.outcome = 0 AND t.numeric = 1), SUM({failure_sql(failure, 't.outcome', 't.numeric')})"
            ", AVG(t.metric), AVG(t.delta), AVG(t.duration), AVG(t.changed) "
            "FROM cells c LEFT JOIN trials t ON t.cell_id = c.cell_id GROUP BY c.cell_id ORDER BY c.cell_id"
        )
        names = (("cell_id",) + _CELL_COLUMNS + ("trials",) + TRIAL_OUTCOMES
                 + (MASKED_NUMERIC, "failures", "mean_metric", "mean_delta", "mean_duration", "mean_changed"))
        rows = []
        for r in self.conn.execute(q):
            d = dict(zip(names, r))
            for o in (*TRIAL_OUTCOMES, MASKED_NUMERIC, "failures"):
                d[o] = int(d[o] or 0)
            rows.append(d)
        return rows

    def iter_trials(self, batch: int = 50_000) -> Iterator[list[tuple]]:
        """Trials joined with their cell columns, in (cell, trial) order, in batches of tuples.

        Columns: :data:`fastflip.campaign.store_export.EXPORT_COLUMNS`.
        """
        q = (
            "SELECT t.cell_id, c.key, c.bits, c.grp, c.flips, c.fault, c.epoch, t.trial, t.seed, t.sites, "
            "t.outcome, t.numeric, t.changed, t.metric, t.delta, t.message, t.duration, w.label "
            "FROM trials t JOIN cells c ON c.cell_id = t.cell_id LEFT JOIN workers w ON w.worker_id = t.worker "
            "ORDER BY t.cell_id, t.trial"
        )
        cur = self.conn.execute(q)
        while True:
            rows = cur.fetchmany(batch)
            if not rows:
                return
            yield [r[:10] + (TRIAL_OUTCOMES[r[10]],) + r[11:] for r in rows]
