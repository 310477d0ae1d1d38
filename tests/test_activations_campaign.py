"""Campaigns over activation bits: a trained PyTorch digits classifier and the built-in accuracy evaluator."""

from __future__ import annotations

import os
import sqlite3
import sys

import numpy as np
import pytest

from conftest import require
from fastflip.campaign import Campaign, load_campaign
from fastflip.campaign.sweep import campaign_cells, sweep
from fastflip.campaign.trials import CRITICAL, DUE, MASKED, SDC, TrialRunner
from fastflip.errors import OptionError, SelectionError

pytestmark = pytest.mark.framework
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TOML = """
name = "digits-activations"
seed = 7
paths = ["{here}"]

[target]
factory = "act_campaign_helpers:model"
kind = "activations"

[select]
layers = ["fc1", "fc2"]

[cells]
bits = ["30", "22", "0-21"]
group_by = "layer"

[trials]
per_cell = 12

[evaluator]
builtin = "accuracy"
data = "act_campaign_helpers:heldout"
critical = 0.05
"""


def campaign(tmp_path) -> Campaign:  # noqa: ANN001
    path = tmp_path / "c.toml"
    path.write_text(TOML.format(here=HERE))
    return load_campaign(str(path))


def direct(cell, plan) -> tuple[np.ndarray, float]:  # noqa: ANN001
    """The faulted evaluation computed without fastflip's hooks: torch layers, NumPy bit operations."""
    torch = require("torch")
    import act_campaign_helpers as h

    m = h.model()
    x, y = h.heldout()
    faulted = {}
    for t, i, a, o, xr in zip(plan.tensor, plan.index, plan.and_mask, plan.or_mask, plan.xor_mask):
        faulted.setdefault(plan.tensors[int(t)].name, []).append((int(i), int(a) & 0xFFFFFFFF, int(o), int(xr)))

    def fault(name, v):  # noqa: ANN001, ANN202
        w = v.numpy().copy().view(np.uint32)
        for i, a, o, xr in faulted.get(name, []):
            w[:, i] = ((w[:, i] & np.uint32(a)) | np.uint32(o)) ^ np.uint32(xr)  # every sample, same neuron
        return torch.from_numpy(w.view(np.float32))

    with torch.no_grad():
        h1 = fault("fc1", m.fc1(torch.from_numpy(x)))
        logits = fault("fc2", m.fc2(m.act(h1))).numpy()
    return logits, float(np.mean(np.argmax(logits, axis=-1) == y))


def test_activation_cells_per_layer_and_outcomes_match_a_direct_computation(tmp_path) -> None:  # noqa: ANN001
    require("torch")
    require("sklearn")
    c = campaign(tmp_path)
    cells = campaign_cells(c)
    assert [(x.group, x.population) for x in cells[:2]] == [("fc1", 32), ("fc2", 10)]
    assert [x.population for x in cells[4:]] == [32 * 22, 10 * 22]
    runner = TrialRunner(c, cells)
    golden_logits, golden_acc = runner.golden[None].outputs, runner.golden[None].metric
    assert golden_acc > 0.85  # a real classifier
    seen = set()
    for cid, cell in enumerate(cells):
        for t in range(4):
            row = runner.run(cid, t)
            plan = runner.plan(cid, t)
            assert len(plan) == 1 and plan.tensors[int(plan.tensor[0])].name == cell.group
            logits, acc = direct(cell, plan)
            if not np.isfinite(logits).all():
                expect = DUE
            elif np.array_equal(np.argmax(logits, -1), np.argmax(golden_logits, -1)):
                expect = MASKED  # the field's definition for a classifier: no prediction changed
            else:
                expect = CRITICAL if golden_acc - acc > 0.05 else SDC
            assert row.outcome == expect, (cell.key, t)
            if expect in (SDC, CRITICAL):
                assert row.metric == pytest.approx(acc)
            seen.add(expect)
    assert MASKED in seen and (SDC in seen or CRITICAL in seen)


def test_activation_sweep_stores_and_a_bad_definition_is_refused(tmp_path) -> None:  # noqa: ANN001
    require("torch")
    require("sklearn")
    c = campaign(tmp_path)
    res = sweep(c, str(tmp_path / "s.db"), workers=0, progress=False)
    assert res.complete and res.stored == 4 * 12 + 2 * 10  # fc2 bit cells have 10 sites: run exhaustively
    con = sqlite3.connect(tmp_path / "s.db")
    sites = [r[0] for r in con.execute("SELECT sites FROM trials ORDER BY cell_id, trial")]
    con.close()
    assert all(s.startswith(("fc1[", "fc2[")) for s in sites)
    bad = c.to_dict()
    bad.pop("base_dir")
    bad["select"] = {"layers": ["fc9"]}
    with pytest.raises(SelectionError, match="matches no layer.*its layers: fc1, act, fc2"):
        campaign_cells(Campaign.from_dict(bad, base_dir=c.base_dir))
    with pytest.raises(OptionError, match="kind = 'activations' needs factory"):
        Campaign.from_dict({**bad, "target": {"checkpoint": "x.h5", "kind": "activations"}})
    with pytest.raises(OptionError, match=r"\[target\] kind must be one of weights, activations \(got 'neurons'\)"):
        Campaign.from_dict({**bad, "target": {"factory": "m:f", "kind": "neurons"}})


LM_TOML = (TOML.replace('"digits-activations"\nseed = 7', '"gpt2-attention"\nseed = 3')
           .replace(":model", ":lm").replace(":heldout", ":lm_data").replace("per_cell = 12", "per_cell = 4")
           .replace('["fc1", "fc2"]', '["gpt.transformer.h.*.attn:softmax", "gpt.transformer.h.0.attn"]')
           .replace('["30", "22", "0-21"]', '["30"]'))


def test_campaign_over_attention_targets_matches_faults_applied_by_hand(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    torch = require("torch")
    require("transformers")
    import act_campaign_helpers as h

    path = tmp_path / "lm.toml"
    path.write_text(LM_TOML.format(here=HERE))
    c = load_campaign(str(path))
    cells = campaign_cells(c)
    assert [(x.group, x.population) for x in cells] == [
        ("gpt.transformer.h.0.attn:softmax", 2 * 6 * 6), ("gpt.transformer.h.0.attn:out.0", 6 * 32),
        ("gpt.transformer.h.1.attn:softmax", 2 * 6 * 6)]
    runner = TrialRunner(c, cells)
    x, y = h.lm_data()
    m = h.lm()
    softmax = torch.nn.functional.softmax
    seen = set()
    for cid, cell in enumerate(cells):
        for t in range(4):
            row, plan = runner.run(cid, t), runner.plan(cid, t)
            name, i = plan.tensors[int(plan.tensor[0])].name, int(plan.index[0])
            a, o, xr = (int(v[0]) & 0xFFFFFFFF for v in (plan.and_mask, plan.or_mask, plan.xor_mask))

            def fault(out, n):  # noqa: ANN001, ANN202 - every sample, the plan's element, by hand
                w = out.contiguous().view(len(out), -1).view(torch.int32)
                old = w[:, i].numpy().view(np.uint32)
                w[:, i] = torch.from_numpy((((old & np.uint32(a)) | np.uint32(o)) ^ np.uint32(xr)).view(np.int32))
                return w.view(torch.float32).view(out.shape)

            calls = [0]
            which = 0 if ".h.0." in name else 1

            def patched(*args, **kw):  # noqa: ANN002, ANN003, ANN202
                out = softmax(*args, **kw)
                calls[0] += 1
                return fault(out, name) if name.endswith("softmax") and calls[0] - 1 == which else out

            monkeypatch.setattr(torch.nn.functional, "softmax", patched)
            hook = m.gpt.transformer.h[0].attn.register_forward_hook(
                lambda _m, _a, out: (fault(out[0], name), *out[1:]) if name.endswith(":out.0") else None)
            with torch.no_grad():
                logits = m(torch.from_numpy(x)).numpy()
            hook.remove()
            monkeypatch.undo()
            acc = float(np.mean(logits.argmax(-1) == y))
            expect = (DUE if not np.isfinite(logits).all() else MASKED if acc == 1.0
                      else CRITICAL if 1.0 - acc > 0.05 else SDC)
            assert (name, row.outcome) == (cell.group, expect), (cell.key, t)
            seen.add(expect)
    assert MASKED in seen and seen - {MASKED}
    res = sweep(c, str(tmp_path / "lm.db"), workers=0, progress=False)
    assert res.complete and res.stored == 3 * 4
