"""The SQLite results store: creation, refusal of foreign/corrupt/newer/locked stores, resume, export, merge."""

from __future__ import annotations

import csv
import os
import sqlite3
import subprocess
import sys

import pytest

from conftest import require
from fastflip.errors import OutputError, StoreError
from fastflip.campaign.store import TRIAL_OUTCOMES, SCHEMA_VERSION, ResultStore, TrialRow
from fastflip.campaign.store_export import export_csv, export_parquet, merge_stores

CONFIG = {"name": "t", "seed": 7, "cells": {"bits": [0, 31]}}
CELLS = [
    {"key": "bit=0", "bits": "0", "grp": "w", "group_by": "tensor", "flips": 1, "fault": "flip", "planned": 5, "population": 100},
    {"key": "bit=31", "bits": "31", "grp": "w", "group_by": "tensor", "flips": 1, "fault": "flip", "planned": 4, "population": 100},
]


def row(cell, trial, outcome=0, worker="w0"):
    return TrialRow(cell, trial, 1000 * cell + trial, f"w[{trial}]^b{cell}", outcome, 0.5 + trial, 0.01 * trial,
                    "boom" if outcome == 3 else None, 0.001, worker)


@pytest.fixture
def store(tmp_path):
    st = ResultStore.create(str(tmp_path / "r.db"), CONFIG, CELLS, input_hashes={"ckpt": "abc"})
    yield st
    st.close()


def test_create_and_reopen_roundtrip(store, tmp_path):
    store.add_trials([row(0, 0), row(0, 3, 1), row(1, 2, 3, "w1")])
    path = store.path
    store.close()
    st = ResultStore.open(path)
    assert st.config == CONFIG and st.seed == 7 and st.input_hashes == {"ckpt": "abc"}
    assert [c["key"] for c in st.cells()] == ["bit=0", "bit=31"]
    miss = st.missing()
    assert miss[0].tolist() == [1, 2, 4] and miss[1].tolist() == [0, 1, 3]
    counts = st.outcome_counts()
    assert counts.tolist() == [[1, 1, 0, 0], [0, 0, 0, 1]]
    summ = st.cell_summary()
    assert summ[0]["trials"] == 2 and summ[0]["sdc"] == 1 and summ[1]["due"] == 1
    assert summ[0]["mean_metric"] == pytest.approx((0.5 + 3.5) / 2)
    st.close()
    # sqlite's own view: application_id and WAL
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    con.close()


def test_duplicate_trial_is_refused_and_batch_rolled_back(store):
    store.add_trials([row(0, 0)])
    with pytest.raises(StoreError, match="twice"):
        store.add_trials([row(0, 1), row(0, 0)])
    assert store.n_trials() == 1  # the whole batch rolled back
    store.add_trials([row(0, 1, worker="new")])
    assert store.n_trials() == 2


def test_create_never_overwrites(tmp_path):
    p = tmp_path / "x.db"
    p.write_bytes(b"precious")
    with pytest.raises(StoreError, match="exists"):
        ResultStore.create(str(p), CONFIG, CELLS)
    assert p.read_bytes() == b"precious"


def test_foreign_files_are_refused_untouched(tmp_path):
    text = tmp_path / "notes.db"
    text.write_bytes(b"hello, not a database at all\n" * 10)
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE x(a)")
    con.commit()
    con.close()
    before = {p: p.read_bytes() for p in (text, other)}
    with pytest.raises(StoreError, match="not an SQLite"):
        ResultStore.open(str(text), writable=True)
    with pytest.raises(StoreError, match="not a fastflip results store"):
        ResultStore.open(str(other), writable=True)
    for p, b in before.items():
        assert p.read_bytes() == b


def test_corrupt_store_is_refused_untouched(store):
    store.add_trials([row(0, t) for t in range(5)] + [row(1, t) for t in range(4)])
    path = store.path
    store.close()
    data = bytearray(open(path, "rb").read())
    assert len(data) > 4096
    for i in range(1024, len(data), 7):  # garble every page after the header
        data[i] ^= 0x5A
    open(path, "wb").write(bytes(data))
    with pytest.raises(StoreError, match="corrupt"):
        ResultStore.open(path, writable=True)
    assert open(path, "rb").read() == bytes(data)
    # truncated to its header alone
    open(path, "wb").write(bytes(data[:100]))
    with pytest.raises(StoreError):
        ResultStore.open(path)


def test_newer_store_is_refused(store):
    path = store.path
    store.close()
    con = sqlite3.connect(path)
    con.execute("UPDATE campaign SET fastflip_version = '99.0.0'")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="newer"):
        ResultStore.open(path, writable=True)
    con = sqlite3.connect(path)
    con.execute("UPDATE campaign SET fastflip_version = '0.1.0'")
    con.execute("PRAGMA user_version = 99")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="schema version 99"):
        ResultStore.open(path)
    con = sqlite3.connect(path)
    con.execute("PRAGMA user_version = 1")  # a store of fastflip 0.1: 'sdc' counted any changed output bit
    con.commit()
    con.close()
    for writable in (False, True):
        with pytest.raises(StoreError, match="schema version 1.*rerun the campaign into a new store"):
            ResultStore.open(path, writable=writable)


def test_second_writer_refuses_in_process_and_across_processes(store):
    with pytest.raises(StoreError, match="in use by another sweep"):
        ResultStore.open(store.path, writable=True)
    code = (
        "import sys\nfrom fastflip.campaign.store import ResultStore\nfrom fastflip.errors import StoreError\n"
        f"try:\n    ResultStore.open({store.path!r}, writable=True)\nexcept StoreError as e:\n    print('REFUSED', e); sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 3 and f"pid {os.getpid()}" in proc.stdout
    # readers are fine while a writer works
    r = ResultStore.open(store.path)
    assert r.n_trials() == 0
    r.close()
    store.close()
    w = ResultStore.open(store.path, writable=True)  # lock released on close
    w.close()


def test_lock_released_when_writer_is_killed(tmp_path):
    path = str(tmp_path / "k.db")
    ResultStore.create(path, CONFIG, CELLS).close()
    code = (
        "import time\nfrom fastflip.campaign.store import ResultStore\n"
        f"s = ResultStore.open({path!r}, writable=True)\nprint('LOCKED', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "LOCKED"
    with pytest.raises(StoreError, match="in use"):
        ResultStore.open(path, writable=True)
    proc.kill()
    proc.wait()
    ResultStore.open(path, writable=True).close()


def test_export_csv_and_parquet(store, tmp_path):
    rows = [row(0, t, t % 4) for t in range(5)] + [row(1, 1, 2, "w9")]
    store.add_trials(rows)
    n = export_csv(store, str(tmp_path / "t.csv"))
    assert n == 6
    with open(tmp_path / "t.csv") as fh:
        recs = list(csv.DictReader(fh))
    assert [r["outcome"] for r in recs] == [TRIAL_OUTCOMES[t % 4] for t in range(5)] + ["critical"]
    assert recs[-1]["cell"] == "bit=31" and recs[-1]["worker"] == "w9" and recs[3]["message"] == "boom"
    with pytest.raises(OutputError, match="exists"):
        export_csv(store, str(tmp_path / "t.csv"))
    pq = require("pyarrow.parquet")
    assert export_parquet(store, str(tmp_path / "t.parquet")) == 6
    tab = pq.read_table(tmp_path / "t.parquet")
    assert tab.num_rows == 6
    assert tab.column("trial").to_pylist() == [0, 1, 2, 3, 4, 1]
    assert tab.column("metric").to_pylist() == [r.metric for r in rows]


def _shard(tmp_path, name, shard, trials, outcome=lambda c, t: t % 2):
    st = ResultStore.create(str(tmp_path / name), CONFIG, CELLS, shard=shard)
    st.add_trials([row(c, t, outcome(c, t), worker=name) for c, t in trials])
    st.close()
    return str(tmp_path / name)


def test_merge_shards(tmp_path):
    all_trials = [(c, t) for c, n in ((0, 5), (1, 4)) for t in range(n)]
    a = _shard(tmp_path, "a.db", "0/2", [x for x in all_trials if (x[0] + x[1]) % 2 == 0])
    b = _shard(tmp_path, "b.db", "1/2", [x for x in all_trials if (x[0] + x[1]) % 2 == 1] + [(0, 0)])
    res = merge_stores(str(tmp_path / "m.db"), [a, b])
    assert res == {"trials": 9, "duplicates": 1}
    m = ResultStore.open(str(tmp_path / "m.db"))
    assert m.shard is None and all(len(v) == 0 for v in m.missing().values())
    assert m.outcome_counts().sum() == 9
    labels = {r[-1] for rows in m.iter_trials() for r in rows}
    assert labels == {"a.db", "b.db"}
    m.close()


def test_merge_refuses_conflicts_and_mixed_campaigns(tmp_path):
    a = _shard(tmp_path, "a.db", "0/2", [(0, 0), (0, 1)])
    b = _shard(tmp_path, "b.db", "1/2", [(0, 1)], outcome=lambda c, t: 3)
    with pytest.raises(StoreError, match="disagrees"):
        merge_stores(str(tmp_path / "m.db"), [a, b])
    assert not os.path.exists(tmp_path / "m.db")
    c = _shard(tmp_path, "c.db", "0/2", [])
    with pytest.raises(StoreError, match="same shard"):
        merge_stores(str(tmp_path / "m2.db"), [a, c])
    other = ResultStore.create(str(tmp_path / "o.db"), dict(CONFIG, seed=8), CELLS, shard="1/2")
    other.close()
    with pytest.raises(StoreError, match="another campaign"):
        merge_stores(str(tmp_path / "m3.db"), [a, str(tmp_path / "o.db")])
    with pytest.raises(StoreError, match="exists"):
        merge_stores(a, [b])
