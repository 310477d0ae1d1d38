"""The outcome vocabulary checked against an independent computation on a real trained classifier.

A digits MLP is trained in the test (scikit-learn's bundled load_digits); every trial's outcome is recomputed
by hand: the trial's plan applied by the NumPy reference to a fresh copy of the weights, the logits by a
forward pass written here, the predictions by argmax.
"""

from __future__ import annotations

import os
import sqlite3

import numpy as np
import pytest

from conftest import require
from fastflip.campaign import Campaign
from fastflip.campaign.summary import summarize
from fastflip.campaign.sweep import campaign_cells, sweep
from fastflip.campaign.trials import CRITICAL, DUE, MASKED, SDC, TrialRunner
from fastflip.cli import main
from fastflip.errors import OptionError
from fastflip.campaign.outcomes import FAILURE_CLASSES, Answer, answer_from, failure_sql, judge, parse_failure
from fastflip.core.reference import apply_plan
from fastflip.campaign.store import ResultStore

HERE = os.path.dirname(os.path.abspath(__file__))


def digits_campaign(**over):
    d = {
        "name": "digits", "seed": 5, "paths": [HERE],
        "target": {"factory": "digits_helpers:weights"},
        "cells": {"bits": ["0", "30"]},
        "trials": {"per_cell": 150},
        "evaluator": {"function": "digits_helpers:evaluate", "returns": ["outputs", "predictions", "metric"],
                      "critical": 0.01},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    return Campaign.from_dict(d)


def _by_hand(runner, cell_id, trial):
    """(logits, predictions, accuracy) of the faulty model, computed without the campaign's evaluator."""
    import digits_helpers

    w = digits_helpers.weights()
    apply_plan(w, runner.plan(cell_id, trial))
    x, y = digits_helpers.heldout()
    with np.errstate(all="ignore"):
        h = x @ w["hidden/kernel"] + w["hidden/bias"]
        h = np.maximum(h, 0)  # ReLU (NaN propagates, as in torch)
        logits = h @ w["out/kernel"] + w["out/bias"]
    return logits, np.argmax(logits, axis=1), y


def test_sdc_is_a_changed_prediction_on_a_trained_digits_classifier(tmp_path):
    require("sklearn")
    c = digits_campaign()
    store = str(tmp_path / "d.db")
    res = sweep(c, store, workers=0, progress=False)
    assert res.complete and res.stored == 300
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    golden_logits, golden_pred, y = _by_hand(runner, 0, 0)
    golden_logits = runner.golden[None].outputs
    golden_pred = np.argmax(golden_logits, axis=1)
    golden_acc = float(np.mean(golden_pred == y))
    with ResultStore.open(store) as st:
        rows = st.conn.execute("SELECT cell_id, trial, outcome, numeric, changed FROM trials ORDER BY cell_id, trial").fetchall()
    old_failures = {0: 0, 1: 0}  # fastflip 0.1: any changed logit (or NaN) was a failure
    numeric_by_hand = {0: 0, 1: 0}
    for cid, trial, outcome, numeric, changed in rows:
        logits, pred, _ = _by_hand(runner, cid, trial)
        if not np.isfinite(logits).all():
            assert outcome == DUE
            old_failures[cid] += 1
            continue
        logits_changed = not np.array_equal(logits, golden_logits)
        old_failures[cid] += logits_changed
        frac = float(np.mean(pred != golden_pred))
        assert changed == pytest.approx(frac)
        if frac == 0:
            assert outcome == MASKED and numeric == int(logits_changed)
            numeric_by_hand[cid] += logits_changed
        else:
            acc = float(np.mean(pred == y))
            assert outcome == (CRITICAL if golden_acc - acc > 0.01 else SDC)
    s = summarize(store)
    bit0, bit30 = s["cells"]
    assert bit0["bits"] == "0" and bit30["bits"] == "30"
    # mantissa LSB: essentially never a changed prediction, while most trials change some logit
    assert bit0["failures"] <= 2 and bit0["sdc"] + bit0["critical"] <= 2
    assert old_failures[0] >= 0.5 * 150
    assert bit0["masked_numeric"] == numeric_by_hand[0] >= 0.5 * 150
    # exponent MSB: flips of weights below 2 in magnitude overflow; most trials fail
    assert bit30["failures"] >= 0.5 * 150
    # the old definition is still available, and then agrees with the by-hand count of changed logits
    old = summarize(store, failure=["masked_numeric", "sdc", "critical", "due"])
    assert [c["failures"] for c in old["cells"]] == [old_failures[0], old_failures[1]]


def test_old_style_logits_evaluator_keeps_logits_as_the_answer(tmp_path):
    require("sklearn")
    c = digits_campaign(evaluator={"function": "digits_helpers:evaluate_logits", "returns": None},
                        cells={"bits": ["0"]}, trials={"per_cell": 40})
    r = TrialRunner(c, campaign_cells(c))
    outs = [r.run(0, t).outcome for t in range(40)]
    assert sum(o == SDC for o in outs) >= 20  # what the issue measured: bit-0 'SDC' on logits


@pytest.mark.framework
def test_builtin_classification_on_a_torch_digits_model_matches_argmax(tmp_path):
    require("sklearn")
    torch = require("torch")
    for k in (1, 3):
        c = digits_campaign(target={"factory": "digits_helpers:torch_model"}, trials={"per_cell": 40},
                            evaluator={"function": None, "returns": None, "builtin": "classification",
                                       "data": "digits_helpers:heldout", "top_k": k})
        cells = campaign_cells(c)
        r = TrialRunner(c, cells)
        import digits_helpers

        x, y = digits_helpers.heldout()
        model = r.targets[None]
        with torch.no_grad():
            gl = model(torch.as_tensor(x)).numpy()
        top = lambda lg: np.sort(np.argsort(-lg, axis=1, kind="stable")[:, :k], axis=1)  # noqa: E731
        assert r.golden[None].metric == pytest.approx(float(np.mean((top(gl) == y[:, None]).any(axis=1))))
        from campaign_helpers import faulty_torch_outputs

        for cid in range(len(cells)):
            for t in range(40):
                row = r.run(cid, t)
                lg = faulty_torch_outputs(r, cid, t, x)
                if not np.isfinite(lg).all():
                    assert row.outcome == DUE
                    continue
                changed = float(np.mean((top(lg) != top(gl)).any(axis=1)))
                assert row.changed == pytest.approx(changed)
                assert (row.outcome == MASKED) == (changed == 0)


def test_regression_evaluator_tolerance():
    g = Answer(np.array([[1.0], [2.0]]), None, 0.5)
    near = Answer(np.array([[1.0 + 1e-9], [2.0]]), None, 0.5)
    far = Answer(np.array([[1.5], [2.0]]), None, 0.9)
    assert judge(g, near, critical=0.1, rtol=1e-6, greater_is_better=False)[:3] == (MASKED, True, 0.0)
    assert judge(g, far, critical=0.1, rtol=1e-6, greater_is_better=False)[:3] == (CRITICAL, True, 0.5)
    assert judge(g, far, critical=0.5, rtol=1e-6, greater_is_better=False).delta == pytest.approx(0.4)


def test_failure_sql_matches_python_on_every_combination():
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE trials(outcome INTEGER, numeric INTEGER)")
    rows = [(o, n) for o in range(4) for n in (None, 0, 1)]
    con.executemany("INSERT INTO trials VALUES (?, ?)", rows)
    names = ("masked", "sdc", "critical", "due")
    import itertools

    for r in range(1, len(FAILURE_CLASSES) + 1):
        for failure in itertools.combinations(FAILURE_CLASSES, r):
            got = [bool(v) for (v,) in con.execute(f"SELECT {failure_sql(failure)} FROM trials ORDER BY rowid")]
            want = [names[o] in failure or (o == 0 and n == 1 and "masked_numeric" in failure) for o, n in rows]
            assert got == want, failure


def test_bad_failure_classes_and_unusable_evaluators_are_one_line(tmp_path, capsys):
    for bad in (["crash"], ["masked"], []):
        with pytest.raises(OptionError, match="failure"):
            parse_failure(bad)
    toml = tmp_path / "c.toml"
    toml.write_text(f'name = "x"\nseed = 1\npaths = ["{HERE}"]\n[target]\nfactory = "campaign_helpers:weights"\n'
                    '[trials]\nper_cell = 3\n[evaluator]\nfunction = "digits_helpers:nothing"\nfailure = ["sdc", "oops"]\n')
    assert main(["plan", str(toml)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown outcome class 'oops'" in err[0]
    toml.write_text(toml.read_text().replace('failure = ["sdc", "oops"]', 'returns = "metric"'))
    assert main(["sweep", str(toml), "-o", str(tmp_path / "r.db"), "--workers", "0", "--quiet"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(err) == 1 and err[0].startswith("fastflip sweep: error:") and "returned None" in err[0]
    with pytest.raises(OptionError, match="must hold"):
        answer_from({"outputs": None, "metric": None})
    with pytest.raises(OptionError, match="lacks predictions"):
        answer_from({"metric": 1.0}, ["predictions", "metric"])
    with pytest.raises(OptionError, match="empty"):
        answer_from({"outputs": np.zeros(0)})


@pytest.mark.framework
def test_builtin_regression_on_a_torch_model_with_tolerance(tmp_path):
    require("sklearn")
    require("torch")
    c = digits_campaign(target={"factory": "digits_helpers:torch_regressor"}, cells={"bits": ["10", "22", "30"]},
                        trials={"per_cell": 30},
                        evaluator={"function": None, "returns": None, "builtin": "regression",
                                   "data": "digits_helpers:regression_data", "rtol": 1e-4, "critical": 0.5})
    assert c.evaluator.greater_is_better is False
    cells = campaign_cells(c)
    r = TrialRunner(c, cells)
    import digits_helpers
    from campaign_helpers import faulty_torch_outputs

    x, y = digits_helpers.regression_data()
    golden = r.golden[None]
    assert golden.metric == pytest.approx(float(np.mean((golden.outputs.reshape(-1) - y) ** 2)))
    seen = set()
    for cid in range(len(cells)):
        for t in range(30):
            row = r.run(cid, t)
            out = faulty_torch_outputs(r, cid, t, x).reshape(y.shape)
            if not np.isfinite(out).all():
                assert row.outcome == DUE
                continue
            close = np.isclose(out, golden.outputs.reshape(y.shape), rtol=1e-4, atol=0)
            mse = float(np.mean((out.astype(np.float64) - y) ** 2))
            if close.all():
                assert row.outcome == MASKED
                assert row.numeric == int(not np.array_equal(out, golden.outputs.reshape(y.shape)))
            else:
                assert row.changed == pytest.approx(float(np.mean(~close)))
                assert row.outcome == (CRITICAL if mse - golden.metric > 0.5 else SDC)
                assert row.delta == pytest.approx(mse - golden.metric, rel=1e-6, abs=1e-9)
            seen.add((row.outcome, row.numeric))
    assert (MASKED, 1) in seen and any(o in (SDC, CRITICAL) for o, _ in seen)  # tolerance absorbs small changes
