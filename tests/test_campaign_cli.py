"""The plan / sweep / export / merge commands, and checkpoint-mode campaigns."""

from __future__ import annotations

import csv
import json
import os

import h5py
import pytest

from conftest import require
from test_campaign import HERE, results

from fastflip.cli import main
from fastflip.campaign.stats import sample_size
from fastflip.campaign.store import ResultStore

TOML = """
name = "cli"
seed = 9
paths = [{here!r}]
[target]
factory = "campaign_helpers:weights"
[cells]
bits = ["31", "exponent"]
group_by = "layer"
[trials]
per_cell = 10
[evaluator]
function = "campaign_helpers:picky"
"""


@pytest.fixture
def camp(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(TOML.format(here=HERE))
    return str(p)


def test_plan_population_and_campaign(camp, capsys):
    assert main(["plan", "--population", "1000000", "--margin", "0.01"]) == 0
    assert "n = 9513" in capsys.readouterr().out
    assert main(["plan", camp, "--margin", "0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pops = {r["cell"]: r["population"] for r in out["cells"]}
    assert pops["bits=31|layer=dense|flips=1|fault=flip"] == 16 * 8 + 8
    assert pops["bits=exponent|layer=out|flips=1|fault=flip"] == 8 * 4 * 8
    assert all(r["n_margin"] == sample_size(r["population"], margin=0.05) for r in out["cells"])
    assert out["total_margin"] == sum(r["n_margin"] for r in out["cells"])
    # what sweep runs: per_cell = 10 (the campaign as written), not the margin's sizes
    assert [r["trials"] for r in out["cells"]] == [10] * 4 and out["total"] == 40
    assert {r["sampling"] for r in out["cells"]} == {"permutation"}
    assert main(["plan", camp, "--margin", "0.05"]) == 0
    assert "whole population" in capsys.readouterr().out


def test_plan_shows_per_cell_and_exhaustive_cells(camp, capsys, tmp_path):
    p = tmp_path / "big.toml"
    p.write_text(open(camp).read().replace("per_cell = 10", "per_cell = 200"))
    assert main(["plan", str(p), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    runs = {r["cell"]: (r["trials"], r["sampling"]) for r in out["cells"]}
    # 136 sites in dense at bit 31: all of them, once; 1088 exponent sites: 200 distinct ones
    assert runs["bits=31|layer=dense|flips=1|fault=flip"] == (136, "exhaustive")
    assert runs["bits=exponent|layer=dense|flips=1|fault=flip"] == (200, "permutation")
    assert any("per_cell = 200 exceeds its population of 136" in n and "exhaustive" in n for n in out["notes"])
    assert main(["plan", str(p)]) == 0
    text = capsys.readouterr().out
    assert "note: cell bits=31|layer=dense|flips=1|fault=flip: per_cell = 200 exceeds" in text
    assert "margin" not in text.splitlines()[0]
    store = str(tmp_path / "big.db")
    assert main(["sweep", str(p), "-o", store, "--workers", "0", "--status-every", "0"]) == 0
    cap = capsys.readouterr()
    assert "fastflip sweep: note: cell bits=31|layer=dense" in cap.err and "exhaustive" in cap.err
    assert f"{136 + 32 + 200 + 200}/{136 + 32 + 200 + 200} trials stored" in cap.out
    with ResultStore.open(store) as st:
        sites = [r[0] for r in st.conn.execute("SELECT sites FROM trials WHERE cell_id = 0")]
    assert len(sites) == len(set(sites)) == 136  # every site once


def test_plan_errors_are_one_line(capsys):
    assert main(["plan"]) == 2
    assert main(["plan", "--population", "100", "--margin", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("fastflip plan: error:") for line in err)


def test_sweep_export_merge_round_trip(camp, tmp_path, capsys):
    store = str(tmp_path / "r.db")
    assert main(["sweep", camp, "-o", store, "--workers", "0", "-q"]) == 0
    assert capsys.readouterr().out == ""  # quiet: nothing but errors
    assert main(["sweep", "-o", store, "--workers", "0"]) == 0  # resume: nothing left
    out = capsys.readouterr().out
    assert "40/40 trials stored (complete)" in out and "ran 0 " in out
    assert main(["export", store, "--csv", str(tmp_path / "t.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert len(rows) == 40 and {r["outcome"] for r in rows} <= {"masked", "sdc", "critical", "due"}
    assert main(["export", store, "--csv", str(tmp_path / "t.csv")]) == 2  # exists: refused
    assert main(["export", store, "--csv", str(tmp_path / "t.csv"), "--force"]) == 0
    require("pyarrow")
    assert main(["export", store, "--parquet", str(tmp_path / "t.parquet")]) == 0
    shards = []
    for i in range(2):
        s = str(tmp_path / f"s{i}.db")
        assert main(["sweep", camp, "-o", s, "--workers", "0", "--shard", f"{i}/2", "--quiet"]) == 0
        shards.append(s)
    capsys.readouterr()
    assert main(["merge", *shards, "-o", str(tmp_path / "m.db")]) == 0
    assert "40 trials from 2 stores" in capsys.readouterr().out
    assert results(tmp_path / "m.db") == results(store)


def test_sweep_refuses_foreign_store_and_keeps_it(camp, tmp_path, capsys):
    foreign = tmp_path / "notes.txt"
    foreign.write_text("my thesis\n")
    assert main(["sweep", camp, "-o", str(foreign), "--workers", "0"]) == 2
    assert "not a fastflip results store" in capsys.readouterr().err
    assert foreign.read_text() == "my thesis\n"
    assert main(["sweep", camp, "-o", str(tmp_path / "x.db"), "--shard", "3/2"]) == 2


CKPT = """
name = "ckpt"
seed = 3
mode = "{mode}"
paths = [{here!r}]
[target]
checkpoint = "model-{{epoch}}.h5"
[cells]
bits = ["31", "30"]
group_by = "tensor"
epochs = [1, 2]
[trials]
per_cell = 6
[evaluator]
function = "{fn}"
critical = 0.05
"""


def _write_checkpoints(tmp_path):
    import campaign_helpers

    for epoch in (1, 2):
        with h5py.File(tmp_path / f"model-{epoch}.h5", "w") as f:
            for name, arr in campaign_helpers.weights().items():
                f.create_dataset(name, data=arr * epoch)


def test_checkpoint_campaign_in_file_and_memory_modes_agree(tmp_path):
    _write_checkpoints(tmp_path)
    before = {e: open(tmp_path / f"model-{e}.h5", "rb").read() for e in (1, 2)}
    (tmp_path / "file.toml").write_text(CKPT.format(mode="checkpoint", here=HERE, fn="campaign_helpers:evaluate_file"))
    (tmp_path / "mem.toml").write_text(CKPT.format(mode="memory", here=HERE, fn="campaign_helpers:evaluate_h5"))
    assert main(["sweep", str(tmp_path / "file.toml"), "-o", str(tmp_path / "f.db"), "--workers", "0", "--quiet"]) == 0
    assert main(["sweep", str(tmp_path / "mem.toml"), "-o", str(tmp_path / "m.db"), "--workers", "2", "--quiet"]) == 0
    f_rows, m_rows = results(tmp_path / "f.db"), results(tmp_path / "m.db")
    assert len(f_rows) == 2 * 3 * 2 * 6
    assert f_rows == m_rows  # same sites, same outcomes whether flipped in the file or in memory
    for e in (1, 2):  # the user's checkpoints were never touched
        assert open(tmp_path / f"model-{e}.h5", "rb").read() == before[e]
    # a changed checkpoint is noticed on resume
    with h5py.File(tmp_path / "model-2.h5", "a") as f:
        f["dense/bias"][0] = 5.0
    assert main(["sweep", "-o", str(tmp_path / "f.db"), "--workers", "0"]) == 2


def test_checkpoint_campaign_with_an_evaluator_command(tmp_path):
    import sys

    from fastflip.campaign import Campaign
    from fastflip.campaign.sweep import sweep
    from fastflip.campaign.trials import DUE, MASKED

    _write_checkpoints(tmp_path)

    def camp(cmd):
        return Campaign.from_dict({
            "name": "cmd", "seed": 5, "mode": "checkpoint", "target": {"checkpoint": "model-1.h5"},
            "cells": {"bits": ["30", "0"], "group_by": "tensor"}, "trials": {"per_cell": 3},
            "evaluator": {"command": cmd, "critical": 0.05},
        }, base_dir=str(tmp_path))

    helper = os.path.join(HERE, "campaign_helpers.py")
    res = sweep(camp(f"{sys.executable} {helper} {{checkpoint}}"), str(tmp_path / "c.db"), workers=0, progress=False)
    assert res.complete and res.stored == 18
    fn = sweep(camp(f"{sys.executable} {helper} {{checkpoint}}"), str(tmp_path / "c.db"), workers=0)  # resumable
    assert fn.ran == 0
    # the command sees only the metric: compare with the function evaluator on the same sites
    ref = (tmp_path / "ref.toml")
    ref.write_text(CKPT.format(mode="checkpoint", here=HERE, fn="campaign_helpers:evaluate_file")
                   .replace('epochs = [1, 2]', 'epochs = []').replace("model-{epoch}.h5", "model-1.h5")
                   .replace("seed = 3", "seed = 5").replace("per_cell = 6", "per_cell = 3").replace('bits = ["31", "30"]', 'bits = ["30", "0"]'))
    assert main(["sweep", str(ref), "-o", str(tmp_path / "ref.db"), "--workers", "0", "--quiet"]) == 0
    got = {(r[0], r[1]): r for r in results(tmp_path / "c.db")}
    compared = 0
    for r in results(tmp_path / "ref.db"):
        g = got[(r[0], r[1])]
        assert g[3] == r[3]  # same sites
        if r[4] == DUE:
            continue
        compared += 1
        # the command reports the accuracy only: an unchanged accuracy counts as masked
        assert g[5] == pytest.approx(r[5])
        assert g[4] == (MASKED if r[6] == 0 else r[4])
    assert compared >= 9
    from fastflip.errors import OptionError

    # the golden evaluation fails in the sweep's own process, before any store or worker exists
    with pytest.raises(OptionError, match=r"golden\) evaluation failed before the sweep started \(RuntimeError: "
                                          "command exited 3: cannot evaluate"):
        sweep(camp(f"{sys.executable} {helper} {{checkpoint}} fail"), str(tmp_path / "f.db"), workers=0)
    assert not os.path.exists(tmp_path / "f.db")


def test_summary_wilson_per_cell_and_stratified_total(camp, tmp_path, capsys):
    from fastflip.campaign.stats import stratified_estimate, wilson_interval

    store = str(tmp_path / "r.db")
    assert main(["sweep", camp, "-o", store, "--workers", "0", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["export", store, "--summary", "--json", "--confidence", "0.9"]) == 0
    s = json.loads(capsys.readouterr().out)
    rows = results(store)
    for cell in s["cells"]:
        outs = [r[4] for r in rows if r[0] == cell["cell_id"]]
        fail = sum(o != 0 for o in outs)
        lo, hi = wilson_interval(fail, len(outs), 0.9)
        assert (cell["trials"], cell["failures"]) == (len(outs), fail)
        assert (cell["failure_low"], cell["failure_high"]) == (float(lo), float(hi))
        assert cell["due"] == sum(o == 3 for o in outs)
    (tot,) = s["totals"]
    est = stratified_estimate([c["failures"] for c in s["cells"]], [c["trials"] for c in s["cells"]],
                              populations=[c["population"] for c in s["cells"]], confidence=0.9)
    assert tot["rate"] == pytest.approx(est.rate) and tot["variance"] == pytest.approx(est.variance)
    assert main(["export", store, "--summary"]) == 0
    text = capsys.readouterr().out
    assert "stratified total (flips=1 fault=flip, 4 cells, 40 trials)" in text and "Wilson" in text


def test_checkpoint_trials_restore_the_working_copy_bit_for_bit(tmp_path):
    import hashlib

    from fastflip.campaign import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    _write_checkpoints(tmp_path)
    with h5py.File(tmp_path / "gz.h5", "w") as f:  # a filtered (re-encoded chunk) dataset as well
        import campaign_helpers

        for name, arr in campaign_helpers.weights().items():
            f.create_dataset(name, data=arr, chunks=True, compression="gzip" if "kernel" in name else None)
    for ckpt in ("model-1.h5", "gz.h5"):
        c = Campaign.from_dict({
            "name": "restore", "seed": 1, "mode": "checkpoint", "target": {"checkpoint": ckpt}, "paths": [HERE],
            "cells": {"bits": ["30", "all"], "group_by": "tensor"}, "trials": {"per_cell": 5},
            "evaluator": {"function": "campaign_helpers:evaluate_file"}}, base_dir=str(tmp_path))
        runner = TrialRunner(c, campaign_cells(c))
        copy = runner.targets[None]
        digest = hashlib.sha256(open(copy, "rb").read()).hexdigest()
        rows = [runner.run(cid, t) for cid in range(len(runner.cells)) for t in range(5)]
        assert hashlib.sha256(open(copy, "rb").read()).hexdigest() == digest
        assert any(r.outcome != 0 for r in rows)
        runner.close()
        assert not os.path.exists(copy)


def test_export_summary_per_layer_vulnerability_and_failure_override(camp, tmp_path, capsys):
    store = str(tmp_path / "v.db")
    assert main(["sweep", camp, "-o", store, "--workers", "0", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["export", store, "--summary", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["failure"] == ["sdc", "critical", "due"]
    groups = {g["group"]: g for g in s["groups"]}
    assert set(groups) == {"dense", "out"} and all(g["group_by"] == "layer" for g in groups.values())
    pops = {"dense": 0, "out": 0}
    fails = {"dense": 0, "out": 0}
    for c in s["cells"]:
        pops[c["grp"]] += c["population"]
        fails[c["grp"]] += c["failures"]
    total = s["totals"][0]
    for name, g in groups.items():
        assert g["share"] == pytest.approx(pops[name] / sum(pops.values()))
        assert g["failures"] == fails[name] and g["low"] <= g["rate"] <= g["high"]
        assert g["contribution"] == pytest.approx(g["share"] * g["rate"])
    assert sum(g["contribution"] for g in groups.values()) == pytest.approx(total["rate"])
    assert main(["export", store, "--summary"]) == 0
    text = capsys.readouterr().out
    assert "vulnerability per layer" in text and "failure = sdc + critical + due" in text
    assert main(["export", store, "--summary", "--json", "--failure", "due"]) == 0
    only_due = json.loads(capsys.readouterr().out)
    assert [c["failures"] for c in only_due["cells"]] == [c["due"] for c in s["cells"]]
    assert main(["export", store, "--summary", "--failure", "crash"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown outcome class 'crash'" in err[0]
