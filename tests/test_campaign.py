"""Campaigns: definition files, cells, trials and outcomes, sweeps, resume, shards, sequential stopping."""

from __future__ import annotations

import os
import socket
import sqlite3
import sys

import math

import numpy as np
import pytest

from fastflip.campaign import Campaign, load_campaign
from fastflip.campaign.cells import planned_counts
from fastflip.campaign.sweep import campaign_cells, sweep
from fastflip.campaign.outcomes import Answer, judge
from fastflip.core.permutation import Permutation
from fastflip.campaign.trials import CRITICAL, DUE, MASKED, SDC, TrialRunner, trial_seed
from fastflip.errors import OptionError, StoreError
from fastflip.campaign.stats import sample_size, should_stop
from fastflip.campaign.store import ResultStore
from fastflip.campaign.store_export import merge_stores

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import campaign_helpers  # noqa: E402


def make(**over):
    d = {
        "name": "t", "seed": 11, "paths": [HERE],
        "target": {"factory": "campaign_helpers:weights"},
        "cells": {"bits": ["31", "30", "22", "0"], "group_by": "tensor"},
        "trials": {"per_cell": 20},
        "evaluator": {"function": "campaign_helpers:picky", "critical": 0.05},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return Campaign.from_dict(d)


def results(path):
    """Every stored trial without timing/worker columns (what must not depend on how it ran)."""
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT cell_id, trial, seed, sites, outcome, metric, delta, message FROM trials ORDER BY cell_id, trial"
    ).fetchall()
    con.close()
    return rows


# ----------------------------------------------------------------------------- definition
TOML = """
name = "demo"
seed = 42
paths = ["."]
[target]
factory = "campaign_helpers:weights"
[select]
include = ["dense/*"]
[cells]
bits = ["31", "exponent"]
group_by = "layer"
flips = [1, 2]
faults = ["flip", "stuck-at-1"]
[trials]
margin = 0.05
confidence = 0.9
[evaluator]
function = "campaign_helpers:evaluate"
critical = 0.1
"""

YAML = """
name: demo
seed: 42
paths: ["."]
target: {factory: "campaign_helpers:weights"}
select: {include: ["dense/*"]}
cells: {bits: ["31", "exponent"], group_by: layer, flips: [1, 2], faults: [flip, stuck-at-1]}
trials: {margin: 0.05, confidence: 0.9}
evaluator: {function: "campaign_helpers:evaluate", critical: 0.1}
"""


def test_toml_yaml_and_python_forms_agree(tmp_path):
    (tmp_path / "c.toml").write_text(TOML)
    (tmp_path / "c.yaml").write_text(YAML)
    a = load_campaign(str(tmp_path / "c.toml"))
    b = load_campaign(str(tmp_path / "c.yaml"))
    assert a == b
    assert a.base_dir == str(tmp_path) and a.resolve("x") == str(tmp_path / "x")
    assert Campaign.from_dict(a.to_dict()) == a
    assert a.select == {"include": ["dense/*"]}
    assert a.trials.margin == 0.05 and a.cells.faults == ["flip", "stuck-at-1"]


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"trials": {"per_cell": 5, "margin": 0.1}}, "exactly one"),
        ({"cells": {"bits": ["99x"]}}, "bit"),
        ({"cells": {"group_by": "colour"}}, "group_by"),
        ({"cells": {"faults": ["melt"]}}, "unknown"),
        ({"evaluator": {"function": "nocolon"}}, "module:function"),
        ({"select": {"roles": ["kernel-ish"]}}, "role"),
        ({"seed": -1}, "seed"),
        ({"mode": "checkpoint"}, "checkpoint"),
        ({"cells": {"epochs": [1]}}, "epochs"),
        ({"colour": 1}, "unknown key"),
    ],
)
def test_bad_definitions_are_one_clear_error(bad, match):
    with pytest.raises(OptionError, match=match):
        make(**bad)


def test_bad_files(tmp_path):
    (tmp_path / "x.toml").write_text("name = [")
    with pytest.raises(OptionError, match="TOML"):
        load_campaign(str(tmp_path / "x.toml"))
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(OptionError, match=".toml or .yaml"):
        load_campaign(str(tmp_path / "x.json"))
    with pytest.raises(OptionError, match="cannot read"):
        load_campaign(str(tmp_path / "missing.toml"))


# ----------------------------------------------------------------------------- cells
def test_cells_grid_populations_and_planned_counts():
    c = make(cells={"bits": ["31", "exponent"], "group_by": "layer", "flips": [1, 2], "faults": ["flip", "burst:2"]},
             trials={"per_cell": None, "margin": 0.05})
    cells = campaign_cells(c)
    layers = sorted({x.group for x in cells})
    assert layers == ["dense", "out"]
    assert len(cells) == 2 * 2 * 2 * 2
    dense = [x for x in cells if x.group == "dense" and x.bits == "exponent" and x.flips == 1 and x.fault == "flip"][0]
    assert dense.population == (16 * 8 + 8) * 8 and set(dense.tensors) == {"dense/kernel", "dense/bias"}
    assert len({x.key for x in cells}) == len(cells)
    burst = [x for x in cells if x.group == "dense" and x.bits == "exponent" and x.fault == "burst:2"][0]
    assert burst.population == 16 * 8 + 8  # an element model's sites are elements
    # single deterministic sites: a sample without replacement of the population; the others: unbounded
    assert planned_counts(c, cells) == [
        sample_size(x.population if x.flips == 1 and x.fault == "flip" else math.inf, margin=0.05) for x in cells]
    assert all((x.fpc_population is not None) == (x.flips == 1 and x.fault == "flip") for x in cells)
    # order: bits outermost, then group, flips, fault
    assert [x.bits for x in cells[:8]] == ["31"] * 8


def test_cells_by_role_and_selection():
    c = make(cells={"bits": ["31"], "group_by": "role"}, select={"roles": ["weight"]})
    cells = campaign_cells(c)
    assert [x.group for x in cells] == ["weight"]
    assert set(cells[0].tensors) == {"dense/kernel", "out/kernel"}
    c2 = make(cells={"bits": ["31"], "group_by": "none"})
    assert campaign_cells(c2)[0].population == 16 * 8 + 8 + 8 * 4


# ----------------------------------------------------------------------------- trials
def test_judge_outcomes_on_outputs():
    """Outputs as the answer (no predictions): exact by default, within rtol/atol when given."""
    g = np.array([[1.0, 2.0]])
    gold = Answer(g, None, 0.8)
    assert judge(gold, Answer(g.copy(), None, 0.8), critical=0.1)[:3] == (MASKED, False, 0.0)
    assert judge(gold, Answer(g + 1e-6, None, 0.8), critical=0.1)[:2] == (SDC, True)
    assert judge(gold, Answer(g + 1e-6, None, 0.8), critical=0.1, rtol=1e-3)[:2] == (MASKED, True)
    assert judge(gold, Answer(g + 1, None, 0.75), critical=0.1)[0] == SDC
    assert judge(gold, Answer(g + 1, None, 0.75), critical=0.1).delta == 0.05
    assert judge(gold, Answer(g + 1, None, 0.6), critical=0.1)[0] == CRITICAL
    assert judge(gold, Answer(g * np.inf, None, 0.8), critical=0.1)[0] == DUE
    assert judge(gold, Answer(g + 1, None, float("nan")), critical=0.1)[0] == DUE
    # lower-is-better metrics (a loss): delta is how much worse
    assert judge(Answer(None, None, 0.5), Answer(None, None, 0.9), critical=0.1, greater_is_better=False)[::4] == (
        CRITICAL, 0.4)


def test_trial_is_regenerated_from_seed_cell_and_index_and_reverts_exactly():
    c = make()
    cells = campaign_cells(c)
    r1 = TrialRunner(c, cells)
    before = {k: v.copy() for k, v in r1.targets[None].items()}
    rows = [r1.run(cid, t) for cid in range(len(cells)) for t in range(5)]
    for k, v in r1.targets[None].items():
        assert v.tobytes() == before[k].tobytes()  # every trial reverted bit for bit
    r2 = TrialRunner(c, cells)
    for row in rows[::-1]:  # any order, fresh process state: same sites and outcome
        again = r2.run(row.cell_id, row.trial)
        assert again[:8] == row[:8]
    # the site is position 4 of the permutation keyed by (seed, cell 3, pass 0) of the cell's
    # (element, bit) pairs in tensor order (one bit per cell here: pair u is element u)
    cell = cells[3]
    assert cell.fpc_population == cell.population and cell.sampling == "permutation"
    u = int(Permutation(cell.population, (c.seed, 3, 0))(np.array([4]))[0])
    sizes = [int(np.prod(campaign_helpers.weights()[n].shape)) for n in cell.tensors]
    t = 0
    while u >= sizes[t]:
        u -= sizes[t]
        t += 1
    assert rows[3 * 5 + 4].sites == f"{cell.tensors[t]}[{u}]^b{cell.bits}"
    assert rows[0].seed == c.seed
    assert trial_seed(c.seed, 3, 4).entropy == [c.seed, 3, 4]


def test_outcomes_match_a_direct_computation():
    c = make()
    cells = campaign_cells(c)
    r = TrialRunner(c, cells)
    golden_logits, golden_acc = campaign_helpers.evaluate(campaign_helpers.weights())
    for cid in range(len(cells)):
        for t in range(3):
            row = r.run(cid, t)
            w = campaign_helpers.weights()
            plan = r.plan(cid, t)
            from fastflip.core.reference import apply_plan

            apply_plan(w, plan)
            if any(np.abs(a).max() > 1e30 for a in w.values()):
                assert row.outcome == DUE and "out of range" in row.message
                continue
            logits, acc = campaign_helpers.evaluate(w)
            if not np.isfinite(logits).all():
                assert row.outcome == DUE
            elif np.array_equal(logits, golden_logits):
                assert row.outcome == MASKED
            else:
                assert row.outcome == (CRITICAL if golden_acc - acc > 0.05 else SDC)
                assert row.delta == pytest.approx(golden_acc - acc)
                assert row.metric == pytest.approx(acc)


def test_builtin_accuracy_evaluator():
    c = make(target={"factory": "campaign_helpers:Model"}, evaluator={"function": None, "builtin": "accuracy",
                                                                          "data": "campaign_helpers:heldout"})
    with pytest.raises(OptionError):  # a plain object exposes no tensors to the live adapters
        campaign_cells(c)
    c = make(evaluator={"function": None, "builtin": "accuracy", "data": "campaign_helpers:heldout"},
             target={"factory": "campaign_helpers:weights"})
    with pytest.raises(OptionError, match=r"cannot run a dict; give \[evaluator\] function instead"):
        TrialRunner(c, campaign_cells(c))


# ----------------------------------------------------------------------------- sweeps
def test_serial_and_process_pool_give_identical_stores(tmp_path):
    c = make()
    a = sweep(c, str(tmp_path / "a.db"), workers=0, progress=False)
    b = sweep(c, str(tmp_path / "b.db"), workers=2, chunk=7, progress=False)
    planned = 4 * (20 + 8 + 20)  # 4 bits x tensors of 128, 8 and 32 elements: dense/bias runs all 8 sites
    assert a.complete and b.complete and a.stored == b.stored == planned
    assert results(tmp_path / "a.db") == results(tmp_path / "b.db")
    assert sum(a.counts.values()) == planned and a.counts["due"] > 0 and a.counts["sdc"] > 0
    with ResultStore.open(str(tmp_path / "b.db")) as st:
        workers = {r[-1] for rows in st.iter_trials() for r in rows}
    # the pool's processes ran the trials, not this one (how many of the two took part depends on how fast each
    # started: under load one may take every chunk before the other is up)
    assert workers and len(workers) <= 2 and f"{socket.gethostname()}:{os.getpid()}" not in workers
    with ResultStore.open(str(tmp_path / "a.db")) as st:
        assert {r[-1] for rows in st.iter_trials() for r in rows} == {f"{socket.gethostname()}:{os.getpid()}"}


def test_resume_after_losing_trials_runs_only_the_missing_ones(tmp_path):
    c = make()
    sweep(c, str(tmp_path / "ref.db"), workers=0, progress=False)
    sweep(c, str(tmp_path / "r.db"), workers=0, progress=False)
    con = sqlite3.connect(tmp_path / "r.db")
    con.execute("DELETE FROM trials WHERE (cell_id * 7 + trial) % 3 = 0")
    con.commit()
    lost = 192 - con.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    con.close()
    res = sweep(None, str(tmp_path / "r.db"), workers=0, progress=False)  # resume from the store alone
    assert res.ran == lost and res.complete
    assert results(tmp_path / "r.db") == results(tmp_path / "ref.db")
    again = sweep(c, str(tmp_path / "r.db"), workers=0, progress=False)
    assert again.ran == 0 and again.complete


def test_store_of_another_campaign_is_refused(tmp_path):
    sweep(make(), str(tmp_path / "r.db"), workers=0, progress=False)
    with pytest.raises(StoreError, match="another campaign"):
        sweep(make(seed=12), str(tmp_path / "r.db"), workers=0, progress=False)
    with pytest.raises(StoreError, match="does not exist"):
        sweep(None, str(tmp_path / "nothing.db"), workers=0)


def test_shards_merge_to_the_full_campaign(tmp_path):
    c = make()
    sweep(c, str(tmp_path / "ref.db"), workers=0, progress=False)
    parts = []
    for i in range(3):
        p = str(tmp_path / f"s{i}.db")
        r = sweep(c, p, workers=0, shard=f"{i}/3", progress=False)
        assert r.complete and 56 <= r.stored <= 72  # 192 trials in 3 shards
        parts.append(p)
    with pytest.raises(StoreError, match="shard 0/3, not 1/3"):
        sweep(c, parts[0], workers=0, shard="1/3")
    merge_stores(str(tmp_path / "m.db"), parts)
    assert results(tmp_path / "m.db") == results(tmp_path / "ref.db")
    # merge of an incomplete set: the merged store resumes the rest
    merge_stores(str(tmp_path / "m2.db"), parts[:2])
    res = sweep(None, str(tmp_path / "m2.db"), workers=0, progress=False)
    assert res.ran == len(results(parts[2])) and results(tmp_path / "m2.db") == results(tmp_path / "ref.db")


def test_sequential_stopping_is_deterministic_and_follows_the_rule(tmp_path):
    c = make(trials={"per_cell": None, "half_width": 0.08, "block": 20, "min_trials": 40, "max_per_cell": 200})
    res = sweep(c, str(tmp_path / "s.db"), workers=0, progress=False)
    assert res.complete
    rows = results(tmp_path / "s.db")
    by_cell: dict[int, list[int]] = {}
    for cid, trial, *_rest in rows:
        by_cell.setdefault(cid, []).append(_rest[2])
    sizes = []
    with ResultStore.open(str(tmp_path / "s.db")) as st:
        caps = {x["cell_id"]: x["planned"] for x in st.cells()}
    for cid, outs in by_cell.items():
        n = len(outs)
        sizes.append(n)
        cap = caps[cid]  # never more trials than sites: 8 (dense/bias), 32 (out/kernel), 128
        if cap == 8:  # below min_trials: every site once, then stop
            assert n == 8
            continue
        assert (n % 20 == 0 or n == cap) and min(40, cap) <= n <= cap
        fails = np.cumsum(np.array(outs) != 0)
        # it stopped at the first block end where the rule held, not before
        for end in range(20, n, 20):
            assert not should_stop(int(fails[end - 1]), end, half_width=0.08, min_trials=40, max_trials=cap)
        assert should_stop(int(fails[n - 1]), n, half_width=0.08, min_trials=40, max_trials=cap)
    assert len(set(sizes)) > 1  # cells with rates near 0 stop early, others run on
    # a fresh run in a pool, and a resumed one after losing trials, decide the same
    sweep(c, str(tmp_path / "p.db"), workers=2, progress=False)
    assert results(tmp_path / "p.db") == rows
    con = sqlite3.connect(tmp_path / "p.db")
    con.execute("DELETE FROM trials WHERE trial >= 30")
    con.commit()
    con.close()
    sweep(None, str(tmp_path / "p.db"), workers=0, progress=False)
    assert results(tmp_path / "p.db") == rows


def test_sequential_campaign_cannot_be_sharded(tmp_path):
    c = make(trials={"per_cell": None, "half_width": 0.1})
    with pytest.raises(OptionError, match="shard"):
        sweep(c, str(tmp_path / "s.db"), workers=0, shard="0/2")


def test_a_trial_that_kills_its_worker_is_a_due_and_the_campaign_goes_on(tmp_path):
    c = make(cells={"bits": ["30", "0"], "group_by": "tensor"}, trials={"per_cell": 4},
             evaluator={"function": "campaign_helpers:crashing"})
    res = sweep(c, str(tmp_path / "c.db"), workers=2, chunk=4, progress=False)
    assert res.complete and res.stored == 24
    rows = results(tmp_path / "c.db")
    cells = campaign_cells(c)
    for cid, trial, seed, sites, outcome, metric, delta, message in rows:
        if cells[cid].bits == "30" and cells[cid].group == "out/kernel":
            assert outcome == DUE and message.startswith("WorkerCrash") and sites is None
        else:
            assert message is None or not message.startswith("WorkerCrash")


def test_an_evaluator_that_cannot_be_imported_stops_the_sweep_before_it_starts(tmp_path):
    c = make(evaluator={"function": "campaign_helpers:nonexistent"})
    with pytest.raises(OptionError, match="nonexistent"):
        sweep(c, str(tmp_path / "x.db"), workers=2, progress=False)
    assert os.listdir(tmp_path) == []  # checked in the sweep's process: no store, no lock, no worker started


# ----------------------------------------------------------------------------- progress
class _Tty:
    def __init__(self, tty):
        self.tty = tty
        self.text = ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_bar_on_a_terminal_and_quiet_in_logs(monkeypatch):
    from fastflip.campaign.progress import Progress

    monkeypatch.delenv("CI", raising=False)
    tty = _Tty(True)
    p = Progress(100, 10, stream=tty, interval=0.0)
    assert p.enabled
    p.update([0, 1, 3, 3])
    assert "14/100" in tty.text and "trials/s" in tty.text
    assert "masked 1 sdc 1 critical 0 due 2" in tty.text
    p.close()
    assert tty.text.replace("\x1b[?25h", "").endswith("\n")  # the bar ends its line (then shows the cursor)
    log = _Tty(False)
    q = Progress(100, stream=log)
    q.update([0] * 50)
    assert log.text == ""  # nothing while running in a log, until the first status line (60 s by default)
    q.close()
    assert log.text.count("\n") == 1 and log.text.startswith("50/100")
    monkeypatch.setenv("CI", "true")
    assert not Progress(5, stream=_Tty(True)).enabled


def test_campaign_saves_to_toml_and_yaml_and_loads_back_equal(tmp_path):
    c = make(cells={"bits": ["31", "0-22"], "flips": [1, 3], "faults": ["flip", "mask:0b101@random"]},
             select={"include": ["dense/*"], "dtypes": ["float32"]},
             trials={"per_cell": None, "half_width": 0.02, "block": 50})
    for name in ("c.toml", "c.yaml"):
        c.save(str(tmp_path / name))
        back = load_campaign(str(tmp_path / name))
        assert back.definition() == c.definition()
    with pytest.raises(OptionError):
        c.save(str(tmp_path / "c.ini"))


def test_factory_that_changes_between_calls_is_refused(tmp_path):
    c = make(target={"factory": "campaign_helpers:unseeded_weights"})
    with pytest.raises(StoreError, match="gives other tensors"):
        sweep(c, str(tmp_path / "u.db"), workers=0, progress=False)
    # and a store's factory target that changed since is refused on resume
    sweep(make(), str(tmp_path / "ok.db"), workers=0, progress=False)
    import campaign_helpers as h

    original = h._W0["out/kernel"][0, 0]
    h._W0["out/kernel"][0, 0] = original + 1
    try:
        with pytest.raises(StoreError, match="target factory's tensors changed"):
            sweep(make(), str(tmp_path / "ok.db"), workers=0, progress=False)
    finally:
        h._W0["out/kernel"][0, 0] = original


def test_the_sweep_builds_the_target_once_in_its_own_process(tmp_path):
    """Expansion, input hash and pre-flight share one call of the factory; the workers build their own."""
    import campaign_helpers as h

    c = make(target={"factory": "campaign_helpers:counted_weights"}, trials={"per_cell": 4})
    h.FACTORY_CALLS.clear()
    res = sweep(c, str(tmp_path / "pool.db"), workers=1, progress=False)
    assert res.complete and h.FACTORY_CALLS == [os.getpid()]
    h.FACTORY_CALLS.clear()
    sweep(c, str(tmp_path / "pool.db"), workers=1, progress=False)  # resume: nothing to run, no pre-flight
    assert h.FACTORY_CALLS == [os.getpid()]
    # in process, the trials' runner calls the factory a second time: a factory that gives other tensors is refused
    h.FACTORY_CALLS.clear()
    sweep(c, str(tmp_path / "serial.db"), workers=0, progress=False)
    assert h.FACTORY_CALLS == [os.getpid()] * 2
    assert results(str(tmp_path / "serial.db")) == results(str(tmp_path / "pool.db"))


def test_workers_dying_at_start_stop_the_sweep_and_store_nothing(tmp_path):
    c = make(target={"factory": "campaign_helpers:dies_in_workers"}, trials={"per_cell": 3})
    with pytest.raises(StoreError, match="die before finishing any trial"):
        sweep(c, str(tmp_path / "d.db"), workers=2, chunk=2, progress=False)
    # no false DUEs, and no store: it held no trial, so the fixed set-up starts afresh (not "holds another campaign")
    assert not os.path.exists(str(tmp_path / "d.db"))


def test_the_documented_campaign_file_is_valid():
    import re
    import tomllib

    doc = open(os.path.join(HERE, "..", "docs", "campaigns.md")).read()
    block = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)
    c = Campaign.from_dict(tomllib.loads(block))
    assert c.cells.group_by == "layer" and c.trials.per_cell == 1000
