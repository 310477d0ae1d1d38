"""Long work as users see it: phase and status lines, a bar on a terminal, typos caught before anything
starts, a refused resume that says what changed, and sweep() from a script without a main guard."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from conftest import require

from fastflip.campaign import Campaign
from fastflip.campaign.progress import Progress
from fastflip.campaign.sweep import sweep
from fastflip.errors import FastflipError, OptionError, StoreError

HERE = os.path.dirname(os.path.abspath(__file__))


def make(**over):
    d = {
        "name": "m", "seed": 3, "paths": [HERE],
        "target": {"factory": "campaign_helpers:weights"},
        "cells": {"bits": ["30", "0"], "group_by": "tensor"},
        "trials": {"per_cell": 5},
        "evaluator": {"function": "campaign_helpers:evaluate"},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    return Campaign.from_dict(d)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_phase_lines_and_periodic_status_off_a_terminal(tmp_path):
    log = io.StringIO()  # a Slurm log: not a terminal
    res = sweep(make(), str(tmp_path / "r.db"), workers=0, stream=log, status_every=1e-9)
    text = log.getvalue()
    assert res.complete
    assert "loading the target (campaign_helpers:weights)" in text
    assert f"starting {tmp_path / 'r.db'}: {res.planned} trials in" in text
    assert "evaluates the fault-free (golden) run" in text
    status = [line for line in text.splitlines() if "trials/s ETA" in line]
    assert len(status) >= 2  # periodic lines while running, and the summary
    log = io.StringIO()
    sweep(make(), str(tmp_path / "r.db"), workers=0, stream=log)
    assert f"resuming {tmp_path / 'r.db'}: {res.planned} of {res.planned} trials stored, 0 to run" in log.getvalue()


def test_quiet_sweep_writes_nothing(tmp_path):
    log = io.StringIO()
    sweep(make(), str(tmp_path / "r.db"), workers=0, stream=log, progress=False, status_every=1e-9)
    assert log.getvalue() == ""


def test_bar_on_a_terminal_uses_rich_and_fits(tmp_path, monkeypatch):
    require("rich")
    monkeypatch.delenv("CI", raising=False)  # under CI the bar is off by design
    tty = _Tty()
    p = Progress(total=100, done=0, stream=tty)
    assert p.enabled and p._bar is not None
    p.update([0] * 40 + [1] * 2)
    p.message("a phase line")
    p.close()
    out = tty.getvalue()
    assert "42/100" in out and "a phase line" in out and "sdc 2" in out.lower()


def test_status_interval_is_checked():
    with pytest.raises(OptionError, match="status-every"):
        Progress(total=1, stream=io.StringIO(), enabled=False, status_every=-1)


def test_evaluator_typo_is_one_line_before_any_store(tmp_path):
    store = tmp_path / "r.db"
    with pytest.raises(FastflipError, match="campaign_helpers:evaluat_typo|evaluat_typo"):
        sweep(make(evaluator={"function": "campaign_helpers:evaluat_typo"}), str(store), workers=2)
    assert not store.exists() and os.listdir(tmp_path) == []  # no store, no lock file, nothing


def test_refused_resume_lists_the_changed_settings(tmp_path):
    store = str(tmp_path / "r.db")
    sweep(make(), store, workers=0, progress=False)
    with pytest.raises(StoreError) as err:
        sweep(make(seed=4, trials={"per_cell": 6}), store, workers=0, progress=False)
    msg = str(err.value)
    assert "seed: 3 -> 4" in msg and "per_cell: 5 -> 6" in msg


SCRIPT = """
import sys
sys.path.insert(0, {here!r})
from test_sweep_manners import make
from fastflip.campaign.sweep import sweep
res = sweep(make(), {store!r}, workers=2, progress=False)
print("stored", res.stored)
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_sweep_from_a_script(tmp_path, guarded):
    body = SCRIPT.format(here=HERE, store=str(tmp_path / "r.db"))
    if guarded:
        body = body.replace("res = sweep(", 'if __name__ == "__main__":\n    res = sweep(').replace(
            '\nprint("stored"', '\n    print("stored"')
    script = tmp_path / "run.py"
    script.write_text(body)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    if guarded:
        assert proc.returncode == 0, proc.stderr
        assert "stored 30" in proc.stdout  # 3 tensors x 2 bits x 5 trials
    else:
        assert proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1]
        assert 'if __name__ == "__main__":' in last and "run.py:" in last
        assert not (tmp_path / "r.db").exists()


def test_a_missing_extra_is_one_line_naming_the_extra(tmp_path):
    store = str(tmp_path / "r.db")
    sweep(make(), store, workers=0, progress=False)
    code = ("import sys; sys.modules['matplotlib'] = None\n"  # as if matplotlib were not installed
            "from fastflip.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "report", store, "-o", str(tmp_path / "rep")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"fastflip report: error: {store}: needs matplotlib, which is not installed: "
                                   "pip install 'fastflip[plot]'")
