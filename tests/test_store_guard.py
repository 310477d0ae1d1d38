"""Store guards: one writer per store *file* (symlinks, hard links), broken stores and SQLite errors in one line."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys

import pytest

from fastflip.errors import StoreError
from fastflip.campaign.store import ResultStore, TrialRow
from fastflip.campaign.store_guard import sqlite_error

CONFIG = {"name": "g", "seed": 3}
CELLS = [{"key": "bit=0", "bits": "0", "grp": "w", "group_by": "tensor", "flips": 1, "fault": "flip", "planned": 5,
          "population": 10}]

HOLD = (
    "import sys, time\nfrom fastflip.campaign.store import ResultStore\n"
    "s = ResultStore.open(sys.argv[1], writable=True)\nprint('LOCKED', flush=True)\ntime.sleep(120)\n"
)
TRY = (
    "import sys\nfrom fastflip.campaign.store import ResultStore\nfrom fastflip.errors import StoreError\n"
    "try:\n    ResultStore.open(sys.argv[1], writable=True).close()\nexcept StoreError as e:\n"
    "    print(e); sys.exit(3)\nprint('OPENED')\n"
)


def make_store(path):
    ResultStore.create(str(path), CONFIG, CELLS).close()
    return str(path)


@pytest.fixture
def holder(tmp_path):
    """A real process holding the writer lock of a store (through its plain path)."""
    path = make_store(tmp_path / "r.db")
    proc = subprocess.Popen([sys.executable, "-c", HOLD, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "LOCKED"
        yield path, proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("how", ["same-path", "symlink", "hardlink", "symlink-dir"])
def test_second_writer_is_refused_through_any_name_of_the_file(holder, tmp_path, how):
    path, proc = holder
    other_dir = tmp_path / "elsewhere"
    other_dir.mkdir()
    if how == "same-path":
        alias = path
    elif how == "symlink":
        alias = str(other_dir / "link.db")
        os.symlink(path, alias)
    elif how == "hardlink":
        alias = str(other_dir / "hard.db")
        os.link(path, alias)
    else:
        os.symlink(str(tmp_path), str(other_dir / "d"))
        alias = str(other_dir / "d" / "r.db")
    r = subprocess.run([sys.executable, "-c", TRY, alias], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    line = r.stdout.strip()
    assert "\n" not in line and "in use by another sweep" in line
    assert f"pid {proc.pid} on {socket.gethostname()}" in line and "since 20" in line and "UTC" in line
    # readers are never refused, through any name
    ro = ResultStore.open(alias)
    assert ro.n_trials() == 0
    ro.close()
    proc.kill()
    proc.wait()  # the kernel drops the lock with its holder: the next writer gets it
    r = subprocess.run([sys.executable, "-c", TRY, alias], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "OPENED" in r.stdout, r.stdout + r.stderr


def test_two_sweeps_through_a_hard_link_never_write_at_once(tmp_path):
    """Through the CLI: a sweep holding the store refuses a second sweep given a hard link to it."""
    from test_campaign_kill import start, wait_for_progress, write_campaign

    camp = write_campaign(tmp_path, per_cell=3000)
    store = str(tmp_path / "s.db")
    first = start([camp, "-o", store, "--workers", "1", "--quiet"])
    try:
        wait_for_progress(store, 0, first)
        assert first.poll() is None
        alias = str(tmp_path / "alias.db")
        os.link(store, alias)
        second = subprocess.run([sys.executable, "-m", "fastflip", "sweep", camp, "-o", alias, "--workers", "1",
                                 "--quiet"], capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        err = second.stderr.strip()
        assert "\n" not in err and "in use by another sweep" in err and f"pid {first.pid}" in err
    finally:
        first.kill()
        first.wait()


def test_a_dead_writers_record_is_not_reported_as_the_holder(tmp_path):
    path = make_store(tmp_path / "r.db")
    con = sqlite3.connect(path)
    con.execute("INSERT OR REPLACE INTO meta VALUES ('writer', ?)",
                ('{"pid": 999999999, "host": "%s", "started": 0}' % socket.gethostname(),))
    con.commit()
    con.close()
    from fastflip.campaign.store_guard import StoreLock, _read_holder

    assert _read_holder(path) is None
    lock = StoreLock.acquire(path)
    try:
        with pytest.raises(StoreError, match="has not recorded who it is yet"):
            StoreLock.acquire(path)
    finally:
        lock.release()


# ----------------------------------------------------------------------------- logically broken stores
BREAKS = {
    "missing table": ("DROP TABLE workers", "no table 'workers'"),
    "missing column": ("ALTER TABLE cells DROP COLUMN population", "lacks column"),
    "config not JSON": ("UPDATE campaign SET config = 'not json'", "configuration is not a JSON table"),
    "config a blob": ("UPDATE campaign SET config = X'7b7d'", "wrong type"),
    "outcome text": ("INSERT INTO trials (cell_id, trial, outcome) VALUES (0, 1, 'sdc')", "invalid outcome"),
    "outcome 9": ("INSERT INTO trials (cell_id, trial, outcome) VALUES (0, 1, 9)", "invalid outcome"),
    "cell gap": ("UPDATE cells SET cell_id = 4", "not numbered"),
    "planned text": ("UPDATE cells SET planned = 'many'", "not numbered"),
    "no campaign row": ("DELETE FROM campaign", "no campaign row"),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_logically_broken_store_is_refused_in_one_line(tmp_path, name):
    sql, words = BREAKS[name]
    path = make_store(tmp_path / "r.db")
    con = sqlite3.connect(path)
    con.execute(sql)
    con.commit()
    con.close()
    before = open(path, "rb").read()
    for writable in (False, True):
        with pytest.raises(StoreError, match=words) as ei:
            ResultStore.open(path, writable=writable)
        assert "\n" not in str(ei.value)
    assert open(path, "rb").read() == before
    # the CLI says it in one line, without a traceback
    r = subprocess.run([sys.executable, "-m", "fastflip", "sweep", "-o", path, "--workers", "0", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert words in r.stderr


# ----------------------------------------------------------------------------- SQLite errors
def test_disk_full_while_saving_names_the_cause_not_the_rollback(tmp_path):
    """SQLITE_FULL for real: the store may not grow past its current pages (PRAGMA max_page_count)."""
    path = make_store(tmp_path / "r.db")
    st = ResultStore.open(path, writable=True)
    try:
        pages = st.conn.execute("PRAGMA page_count").fetchone()[0]
        st.conn.execute(f"PRAGMA max_page_count = {pages}")
        rows = [TrialRow(0, t, t, "x" * 5000, 0, 1.0, 0.0, None, 0.1, "w") for t in range(5)]
        with pytest.raises(StoreError) as ei:
            st.add_trials(rows)
        msg = str(ei.value)
        assert "disk is full" in msg and "saving trials" in msg and "rollback" not in msg.lower() and "\n" not in msg
        assert not st.conn.in_transaction
        st.conn.execute("PRAGMA max_page_count = 1000000")
        assert st.add_trials(rows) == 5  # nothing half-written: the same rows go in once there is room
    finally:
        st.close()


def test_sweep_disk_full_is_one_line_through_the_cli(tmp_path, monkeypatch, capsys):
    from fastflip import cli
    from fastflip.campaign.store import ResultStore as RS
    from test_campaign_kill import write_campaign

    camp = write_campaign(tmp_path, per_cell=40)
    store = str(tmp_path / "s.db")
    real_open = RS.open.__func__

    def full_open(cls, path, **kw):
        st = real_open(cls, path, **kw)
        if kw.get("writable"):
            pages = st.conn.execute("PRAGMA page_count").fetchone()[0]
            st.conn.execute(f"PRAGMA max_page_count = {pages}")
        return st

    monkeypatch.setattr(RS, "open", classmethod(full_open))
    code = cli.main(["sweep", camp, "-o", store, "--workers", "0", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err and "rollback" not in err.lower(), err
    assert err.splitlines()[-1].startswith("fastflip sweep: error: store ") and "the disk is full while saving trials" in err
    monkeypatch.undo()
    assert cli.main(["sweep", camp, "-o", store, "--workers", "0", "--quiet"]) == 0  # resumes once there is room


@pytest.mark.parametrize("text, words", [
    ("database or disk is full", "the disk is full"),
    ("database is locked", "locked by another program"),
    ("database disk image is malformed", "the file is corrupt"),
    ("attempt to write a readonly database", "the file or its folder is read-only"),
    ("disk I/O error", "an I/O error"),
])
def test_sqlite_messages_map_to_their_cause(text, words):
    msg = str(sqlite_error("x.db", sqlite3.OperationalError(text), "saving trials"))
    assert msg.startswith("store x.db: " + words) and "\n" not in msg


def test_locked_database_is_one_line(tmp_path):
    """Another program holding an SQLite write lock (not a sweep): 'locked', not a traceback."""
    path = make_store(tmp_path / "r.db")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        st = None
        with pytest.raises(StoreError, match="locked by another program"):
            st = ResultStore.open(path, writable=True)
            st.conn.execute("PRAGMA busy_timeout = 100")
            st.add_trials([TrialRow(0, 0, 0, None, 0, None, None, None, None, None)])
        if st is not None:
            st.close()
    finally:
        other.execute("ROLLBACK")
        other.close()
