"""Reliability of `fastflip sweep`: SIGKILL at random moments, Ctrl-C, two sweeps on one store."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from test_campaign import HERE, results

CAMPAIGN = """
name = "kill"
seed = 2024
paths = [{here!r}]
[target]
factory = "campaign_helpers:weights"
[cells]
bits = ["0-7", "8-15", "16-22", "23-30"]
group_by = "tensor"
[trials]
per_cell = {per_cell}
[evaluator]
function = "campaign_helpers:slow"
critical = 0.05
"""


def write_campaign(tmp_path, per_cell=600):
    p = tmp_path / "c.toml"
    p.write_text(CAMPAIGN.format(here=HERE, per_cell=per_cell))
    return str(p)


def start(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "fastflip", "sweep", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def stored(path):
    if not os.path.exists(path):
        return 0
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return con.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
        finally:
            con.close()
    except sqlite3.OperationalError:
        return 0


def planned_total(camp):
    """Trials the sweep runs (cells no larger than per_cell run all their sites once)."""
    from fastflip.campaign import load_campaign
    from fastflip.campaign.cells import planned_counts
    from fastflip.campaign.sweep import campaign_cells

    c = load_campaign(camp)
    return sum(planned_counts(c, campaign_cells(c)))


def wait_for_progress(path, above, proc, timeout=60.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if stored(path) > above or proc.poll() is not None:
            return
        time.sleep(0.05)
    raise AssertionError("the sweep made no progress")


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(tmp_path):
    camp = write_campaign(tmp_path)
    planned = planned_total(camp)
    ref = str(tmp_path / "ref.db")
    r = subprocess.run([sys.executable, "-m", "fastflip", "sweep", camp, "-o", ref, "--workers", "2", "--status-every", "0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    store = str(tmp_path / "killed.db")
    rng = random.Random(7)
    kills = 0
    runs = 0
    while kills < 3 and runs < 20:
        runs += 1
        before = stored(store)
        proc = start([camp, "-o", store, "--workers", "2", "--status-every", "0"])
        wait_for_progress(store, before, proc)
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            n = stored(store)
            if before < n < planned:
                kills += 1
        else:
            proc.communicate()
    assert kills >= 3
    final = subprocess.run([sys.executable, "-m", "fastflip", "sweep", "-o", store, "--workers", "2", "--status-every", "0"],
                           capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    assert "complete" in final.stdout
    con = sqlite3.connect(store)
    n, distinct = con.execute("SELECT COUNT(*), COUNT(DISTINCT cell_id * 100000 + trial) FROM trials").fetchone()
    con.close()
    assert n == distinct == planned
    assert results(store) == results(ref)


@pytest.mark.slow
def test_ctrl_c_saves_finished_trials_and_resume_completes(tmp_path):
    camp = write_campaign(tmp_path, per_cell=200)
    store = str(tmp_path / "int.db")
    proc = start([camp, "-o", store, "--workers", "2", "--status-every", "0"])
    wait_for_progress(store, 0, proc)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in out
    n = stored(store)
    assert 0 < n < planned_total(camp)
    ref = str(tmp_path / "ref.db")
    from fastflip.campaign import load_campaign
    from fastflip.campaign.sweep import sweep

    sweep(load_campaign(camp), ref, workers=2, progress=False)
    partial = results(store)
    full = results(ref)
    assert set(partial) <= set(full)  # everything saved is a correct, finished trial
    sweep(None, store, workers=2, progress=False)
    assert results(store) == full


def test_second_sweep_on_the_same_store_refuses(tmp_path):
    camp = write_campaign(tmp_path, per_cell=400)
    store = str(tmp_path / "busy.db")
    proc = start([camp, "-o", store, "--workers", "1", "--quiet"])
    try:
        wait_for_progress(store, 0, proc)
        second = subprocess.run([sys.executable, "-m", "fastflip", "sweep", camp, "-o", store, "--workers", "1"],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert second.stderr.strip().count("\n") == 0
        assert "in use by another sweep" in second.stderr
        assert proc.poll() is None  # the first one was not disturbed
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
