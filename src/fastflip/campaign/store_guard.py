"""Guards of the results store: the writer lock, the logical schema check, SQLite errors as one line.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

Imported by :mod:`fastflip.campaign.store` (and the sweep); it knows the store's schema but
nothing of campaigns.

* :class:`StoreLock` — one writer per store *file*: an exclusive ``flock`` on the
  store's inode, so a second sweep is refused whether it names the store by the same
  path, a symlink or a hard link, and told who holds it (pid, host, start time).
* :func:`check_header` — refuses a file that is not an SQLite database; :data:`SCHEMA_SQL` creates
  the tables :func:`check_schema` expects.
* :func:`check_schema` — refuses, in one line, a store whose tables, columns or
  values are not what fastflip wrote (a file edited or damaged by hand).
* :func:`sqlite_error` — any :class:`sqlite3.Error` as a :class:`StoreError` of one
  line that names the store and the cause first ("the disk is full", "locked by
  another program", "corrupt"), never a rollback error that hides it.

Examples
--------
>>> import sqlite3
>>> str(sqlite_error("r.db", sqlite3.OperationalError("database or disk is full"), "saving trials"))
'store r.db: the disk is full while saving trials (database or disk is full); free space and run the sweep again to resume'
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from ..errors import StoreError, one_line
from ..files.paths import pid_alive

__all__ = ["SCHEMA_SQL", "StoreLock", "check_header", "check_schema", "sqlite_error", "rollback_quietly", "pid_alive"]

SQLITE_MAGIC = b"SQLite format 3\x00"

# table -> columns, in order (the schema of fastflip.campaign.store, version 1)
TABLES = {
    "meta": ("key", "value"),
    "campaign": ("id", "name", "config", "config_hash", "seed", "fastflip_version", "schema_version",
                 "input_hashes", "shard", "created"),
    "cells": ("cell_id", "key", "bits", "grp", "group_by", "flips", "fault", "epoch", "planned", "population",
              "sampling", "fpc_population"),
    "workers": ("worker_id", "label"),
    "trials": ("cell_id", "trial", "seed", "sites", "outcome", "metric", "delta", "message", "duration", "worker",
               "numeric", "changed"),
}

#: The statements that create a store's tables (the same tables and columns as :data:`TABLES`)
SCHEMA_SQL = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE campaign(
    id INTEGER PRIMARY KEY CHECK (id = 1), name TEXT, config TEXT NOT NULL, config_hash TEXT NOT NULL,
    seed INTEGER, fastflip_version TEXT NOT NULL, schema_version INTEGER NOT NULL,
    input_hashes TEXT, shard TEXT, created REAL);
CREATE TABLE cells(
    cell_id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL, bits TEXT, grp TEXT, group_by TEXT,
    flips INTEGER, fault TEXT, epoch INTEGER, planned INTEGER NOT NULL, population INTEGER,
    sampling TEXT, fpc_population INTEGER);
CREATE TABLE workers(worker_id INTEGER PRIMARY KEY, label TEXT UNIQUE NOT NULL);
CREATE TABLE trials(
    cell_id INTEGER NOT NULL, trial INTEGER NOT NULL, seed INTEGER, sites TEXT,
    outcome INTEGER NOT NULL, metric REAL, delta REAL, message TEXT, duration REAL, worker INTEGER,
    numeric INTEGER, changed REAL, PRIMARY KEY (cell_id, trial)) WITHOUT ROWID;
"""


def _holder_text(info: dict[str, Any] | None) -> str:
    if not info:
        return "a process that has not recorded who it is yet"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info.get("started", 0) or 0)))
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}, since {when}"




def _read_holder(path: str) -> dict[str, Any] | None:
    """Who holds the writer lock, as its writer recorded in ``meta`` (None if unknown)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, timeout=2)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'writer'").fetchone()
        finally:
            conn.close()
        info = json.loads(row[0]) if row else None
    except (sqlite3.Error, ValueError, TypeError):
        return None
    if not isinstance(info, dict):
        return None
    if info.get("host") == os.uname().nodename and isinstance(info.get("pid"), int) and not pid_alive(info["pid"]):
        return None  # a dead writer's record: the new holder has not written its own yet
    return info


@dataclass
class StoreLock:
    """The writer's exclusive ``flock`` on the store file itself.

    Not :class:`fastflip.files.locks.WriterLock` (the lock of ``--in-place``, revert and
    replay): that one is an OFD record lock, and OFD locks conflict with the POSIX
    record locks SQLite itself takes on the store, whereas ``flock`` does not.

    The lock belongs to the file (its inode), not to the name it was opened by.
    ``flock`` locks do not interact with the POSIX record locks SQLite takes on the
    same file (Linux local file systems), and the kernel drops the lock when its
    holder dies, so a killed sweep never leaves a stale lock. On NFS, Linux emulates
    ``flock`` with record locks: there, readers of a store being swept may see
    "database is locked" until the sweep ends.
    """

    path: str
    fd: int

    @classmethod
    def acquire(cls, store_path: str) -> "StoreLock":
        """Take the lock or raise :class:`StoreError` naming its holder."""
        import fcntl

        try:
            fd = os.open(store_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise StoreError(f"cannot open store {store_path}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            holder = _holder_text(_read_holder(store_path))
            raise StoreError(
                f"store {store_path} is in use by another sweep ({holder}); refusing to write "
                "(wait for it to end or stop it)"
            ) from None
        return cls(store_path, fd)

    @staticmethod
    def record(conn: sqlite3.Connection) -> None:
        """Write who holds the lock into the store's ``meta`` (what a refused writer reports)."""
        info = {"pid": os.getpid(), "host": os.uname().nodename, "started": time.time()}
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('writer', ?)", (json.dumps(info),))
        # into the main file now: a reader through a hard link (another name, so another -wal) sees it too
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def sqlite_error(path: str, exc: BaseException, doing: str) -> StoreError:
    """One line for an SQLite failure while ``doing`` something with store ``path``."""
    text = one_line(exc)
    low = text.lower()
    name = getattr(exc, "sqlite_errorname", "") or ""
    if "full" in low or name == "SQLITE_FULL":
        fix = "the disk is full", "free space and run the sweep again to resume"
    elif "locked" in low or "busy" in low or name in ("SQLITE_BUSY", "SQLITE_LOCKED"):
        fix = "locked by another program", "close what holds it open (another sweep, a database browser) and retry"
    elif "malformed" in low or "not a database" in low or name in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
        fix = "the file is corrupt", "restore it from a copy or start a new store"
    elif "readonly" in low or "read-only" in low or name == "SQLITE_READONLY":
        fix = "the file or its folder is read-only", "make it writable or use another store"
    elif "i/o" in low or name == "SQLITE_IOERR" or name.startswith("SQLITE_IOERR"):
        fix = "an I/O error", "check the disk and run the sweep again to resume"
    elif "no such table" in low or "no such column" in low:
        fix = "tables are missing", "it was not written by fastflip, or was edited; use another store"
    else:
        fix = "an SQLite error", "check the file"
    return StoreError(f"store {path}: {fix[0]} while {doing} ({text}); {fix[1]}")


def rollback_quietly(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open; never raise (SQLite may already have rolled back)."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def check_schema(conn: sqlite3.Connection, path: str) -> None:
    """Refuse (one line) a store whose tables, columns or values are not fastflip's."""
    for table, cols in TABLES.items():
        have = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
        if not have:
            raise StoreError(f"store {path} has no table {table!r}: it is damaged or not a fastflip store")
        missing = [c for c in cols if c not in have]
        if missing:
            raise StoreError(f"store {path}: table {table!r} lacks column(s) {', '.join(missing)}: it is damaged")
    row = conn.execute(
        "SELECT typeof(config), typeof(config_hash), typeof(fastflip_version), typeof(input_hashes), config, "
        "input_hashes FROM campaign WHERE id = 1").fetchone()
    if row is None:
        raise StoreError(f"store {path} holds no campaign row: it is damaged")
    if row[0] != "text" or row[1] != "text" or row[2] != "text" or row[3] not in ("text", "null"):
        raise StoreError(f"store {path}: the campaign row has values of the wrong type: it is damaged")
    for what, text in (("configuration", row[4]), ("input hashes", row[5] or "{}")):
        try:
            ok = isinstance(json.loads(text), dict)
        except ValueError:
            ok = False
        if not ok:
            raise StoreError(f"store {path}: the campaign's {what} is not a JSON table: it is damaged")
    n_cells, lo, hi, bad_planned = conn.execute(
        "SELECT COUNT(*), MIN(cell_id), MAX(cell_id), "
        "SUM(typeof(planned) != 'integer' OR planned < 0 OR typeof(key) != 'text') FROM cells").fetchone()
    if n_cells and (lo != 0 or hi != n_cells - 1 or bad_planned):
        raise StoreError(f"store {path}: its cells are not numbered 0..{n_cells - 1} with integer trial counts: "
                         "it is damaged")
    bad = conn.execute(
        "SELECT cell_id, trial FROM trials WHERE typeof(outcome) != 'integer' OR outcome NOT BETWEEN 0 AND 3 "
        "OR typeof(trial) != 'integer' OR trial < 0 OR typeof(cell_id) != 'integer' OR cell_id NOT BETWEEN 0 AND ? "
        "LIMIT 1", (max(n_cells - 1, 0),)).fetchone()
    if bad is not None:
        raise StoreError(f"store {path}: trial {bad[1]!r} of cell {bad[0]!r} has an invalid outcome or index: it is damaged")


def check_header(path: str) -> None:
    """Refuse, in one line, a file that is not an SQLite database (before SQLite opens it)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise StoreError(f"cannot read store {path}: {exc.strerror or exc}") from exc
    if head != SQLITE_MAGIC:
        raise StoreError(f"{path} is not a fastflip results store (not an SQLite file); it was left untouched")
