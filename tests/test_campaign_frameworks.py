"""Campaigns on a real framework model: a PyTorch module through the live adapters, built-in accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require
from test_campaign import make, results

from fastflip.campaign.sweep import campaign_cells, sweep
from fastflip.campaign.trials import CRITICAL, DUE, MASKED, SDC, TrialRunner


@pytest.mark.framework
def test_torch_module_with_builtin_accuracy(tmp_path):
    torch = require("torch")
    c = make(target={"factory": "campaign_helpers:torch_model"},
             evaluator={"function": None, "builtin": "accuracy", "data": "campaign_helpers:heldout", "critical": 0.05},
             cells={"bits": ["30", "0"], "group_by": "layer"}, trials={"per_cell": 12})
    cells = campaign_cells(c)
    assert {x.group for x in cells} == {"0", "2"}  # Sequential's layers
    runner = TrialRunner(c, cells)
    model = runner.targets[None]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    golden = runner.golden[None]
    import campaign_helpers

    assert golden.metric == campaign_helpers.evaluate(campaign_helpers.weights())[1] == 51 / 64
    x, y = campaign_helpers.heldout()
    golden_pred = np.argmax(golden.outputs, axis=1)
    assert np.array_equal(golden.predictions, golden_pred)
    rows = [runner.run(cid, t) for cid in range(len(cells)) for t in range(12)]
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])  # every trial reverted exactly
    # each outcome against predictions recomputed from the faulty model (argmax of its logits)
    cell_of = [cid for cid in range(len(cells)) for _ in range(12)]
    for r, cid in zip(rows, cell_of):
        logits = campaign_helpers.faulty_torch_outputs(runner, cid, r.trial, x)
        if not np.isfinite(logits).all():
            assert r.outcome == DUE
            continue
        pred = np.argmax(logits, axis=1)
        changed = float(np.mean(pred != golden_pred))
        acc = float(np.mean(pred == y))
        assert r.changed == pytest.approx(changed)
        if changed == 0:
            assert r.outcome == MASKED and r.numeric == int(not np.array_equal(logits, golden.outputs))
        else:
            assert r.outcome == (CRITICAL if golden.metric - acc > 0.05 else SDC)
    by_bits = {b: [r.outcome for r, cell in zip(rows, [x for x in cells for _ in range(12)]) if cell.bits == b]
               for b in ("30", "0")}
    assert any(o != MASKED for o in by_bits["30"])  # exponent MSB flips matter
    assert DUE in by_bits["30"] or any(o != MASKED for o in by_bits["30"])
    res = sweep(c, str(tmp_path / "t.db"), workers=2, progress=False)
    assert res.complete and [r[:8] for r in results(tmp_path / "t.db")] == [tuple(r[:8]) for r in rows]


@pytest.mark.framework
def test_keras_model_with_builtin_accuracy(tmp_path):
    require("keras")
    import numpy as np

    c = make(target={"factory": "campaign_helpers:keras_model"},
             evaluator={"function": None, "builtin": "accuracy", "data": "campaign_helpers:heldout", "critical": 0.05},
             cells={"bits": ["30", "0"], "group_by": "tensor"}, trials={"per_cell": 5})
    res = sweep(c, str(tmp_path / "k.db"), workers=0, progress=False)
    assert res.complete and res.stored == 2 * 3 * 5
    rows = results(tmp_path / "k.db")
    names = {r[3].split("[")[0] for r in rows}
    assert names == {"dense/kernel", "dense/bias", "out/kernel"}  # the live adapter's names: Keras's own paths
    assert any(r[4] != MASKED for r in rows)
    # a fresh runner regenerates the same trials; weights are restored after each
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    model = runner.targets[None]
    before = [w.copy() for w in model.get_weights()]
    again = [runner.run(r[0], r[1])[:8] for r in rows]
    assert again == [tuple(r) for r in rows]
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
