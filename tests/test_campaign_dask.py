"""The Dask executor: a real LocalCluster of 2 worker processes gives the local executor's results."""

from __future__ import annotations

import os
import sqlite3

from conftest import require
from test_campaign import make, results

from fastflip.campaign.sweep import sweep


def test_dask_local_cluster_equals_local_executor(tmp_path):
    require("distributed")
    c = make(trials={"per_cell": 15})
    local = sweep(c, str(tmp_path / "local.db"), workers=2, progress=False)
    dask = sweep(c, str(tmp_path / "dask.db"), workers=2, dask="local", chunk=10, progress=False)
    assert local.complete and dask.complete and dask.stored == 4 * (15 + 8 + 15)  # dense/bias: all 8 sites
    assert results(tmp_path / "dask.db") == results(tmp_path / "local.db")
    con = sqlite3.connect(tmp_path / "dask.db")
    pids = {label.rsplit(":", 1)[1] for (label,) in con.execute("SELECT label FROM workers")}
    con.close()
    assert len(pids) >= 2 and str(os.getpid()) not in pids  # ran in >= 2 worker processes, not here


def test_cli_dask_local(tmp_path, capsys):
    require("distributed")
    from test_campaign_cli import TOML

    from fastflip.cli import main
    from test_campaign import HERE

    camp = tmp_path / "c.toml"
    camp.write_text(TOML.format(here=HERE))
    assert main(["sweep", str(camp), "-o", str(tmp_path / "d.db"), "--dask", "local", "-j", "2", "--status-every", "0"]) == 0
    assert "40/40 trials stored (complete)" in capsys.readouterr().out
    assert main(["sweep", str(camp), "-o", str(tmp_path / "s.db"), "--workers", "0", "--quiet"]) == 0
    assert results(tmp_path / "d.db") == results(tmp_path / "s.db")
