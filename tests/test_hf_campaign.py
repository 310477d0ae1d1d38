"""Campaigns on Hugging Face models as they are (GPT-2 with tied embeddings, BERT, built from their configs): the
language-model and generation built-ins, mini-batches, batched trials without torch.fx equal to serial ones, the
golden pre-flight that leaves nothing behind, and evaluator errors that are not DUE outcomes."""

from __future__ import annotations

import io
import os
import sqlite3

import numpy as np
import pytest

from conftest import require
from test_campaign import make

from fastflip.campaign import batchgate
from fastflip.campaign.sweep import campaign_cells, sweep
from fastflip.campaign.trials import MASKED, TrialRunner

GPT2_LAYERS = ["transformer.wte", "transformer.wpe", "transformer.h.0.attn.c_attn", "transformer.h.1.ln_2"]


def _rows(path):
    con = sqlite3.connect(path)
    rows = con.execute("SELECT cell_id, trial, seed, sites, outcome, metric, delta, message, numeric, changed "
                       "FROM trials ORDER BY cell_id, trial").fetchall()
    con.close()
    return rows


def _gpt2(evaluator, per_cell=4, bits=("30", "22")):
    return make(target={"factory": "hf_campaign_helpers:gpt2"}, select={"layers": GPT2_LAYERS},
                evaluator={"function": None, "critical": 0.5, **evaluator}, trials={"per_cell": per_cell},
                cells={"bits": list(bits), "group_by": "layer"})


def _serial_and_batched(tmp_path, c, name):
    """The same campaign swept one trial at a time and 4 per forward: returns both stores' rows and the batched
    sweep's output."""
    serial = str(tmp_path / f"{name}-serial.db")
    assert sweep(c, serial, workers=0, progress=False, batch_trials=1).complete
    out = io.StringIO()
    assert sweep(c, str(tmp_path / f"{name}-batched.db"), workers=0, batch_trials=4, stream=out).complete
    return _rows(serial), _rows(str(tmp_path / f"{name}-batched.db")), out.getvalue()


@pytest.fixture(autouse=True)
def _fresh_notes():
    batchgate._SAID.clear()
    yield
    batchgate._SAID.clear()


@pytest.mark.framework
@pytest.mark.parametrize("evaluator", [
    {"builtin": "language-model", "data": "hf_campaign_helpers:tokens", "batch_size": 3},
    {"builtin": "language-model", "data": "hf_campaign_helpers:tokens_loader"},
    {"builtin": "generation", "data": "hf_campaign_helpers:prompts", "batch_size": 3, "max_new_tokens": 3}],
    ids=["lm", "lm-loader", "generation"])
def test_gpt2_campaign_serial_equals_batched(tmp_path, evaluator):
    """The unwrapped GPT-2 (tied embeddings; torch.fx cannot trace it): layer names are its own, and batched trials
    (faulted modules once per trial on their share of the batch) store exactly the rows of --batch-trials 1."""
    require("torch")
    require("transformers")
    c = _gpt2(evaluator)
    keys = [x.key for x in campaign_cells(c)]
    assert any("layer=transformer.h.0.attn.c_attn|" in k for k in keys) and not any("layer=m." in k for k in keys)
    serial, got, out = _serial_and_batched(tmp_path, c, evaluator["builtin"])
    assert got == serial and len(serial) == 4 * len(keys)
    assert "batched trials: 4 trials per forward (full: full forwards, the faulted modules once per trial)" in out
    outcomes = {r[4] for r in serial}
    assert MASKED in outcomes and len(outcomes) > 1  # real outcomes were compared, not all-masked
    assert any(r[8] == 1 for r in serial if r[4] == MASKED)  # masked_numeric: the raw outputs (NLL/log-probs) judged


@pytest.mark.framework
def test_bert_classification_serial_equals_batched(tmp_path):
    require("torch")
    require("transformers")
    c = make(target={"factory": "hf_campaign_helpers:bert"},
             select={"layers": ["bert.embeddings.word_embeddings", "bert.embeddings.position_embeddings",
                                "bert.encoder.layer.0.attention.self.query", "bert.pooler.dense", "classifier"]},
             evaluator={"function": None, "builtin": "classification", "data": "hf_campaign_helpers:bert_data",
                        "batch_size": 5, "critical": 0.1},
             trials={"per_cell": 4}, cells={"bits": ["30", "22"], "group_by": "layer"})
    serial, got, out = _serial_and_batched(tmp_path, c, "bert")
    assert got == serial and len(serial) == 40
    assert "batched trials: 4 trials per forward (full" in out
    assert len({r[4] for r in serial}) > 1


@pytest.mark.framework
def test_lm_evaluator_mini_batches_and_loaders_agree():
    """batch_size and a data loader's batches give the answer of one forward over everything: the same next-token
    predictions, and the perplexity within float rounding; the judgement is of the model's ModelOutput logits."""
    torch = require("torch")
    require("transformers")
    import hf_campaign_helpers as h
    from fastflip.campaign.builtins import Builtin, load_data, logits_of

    model = h.gpt2()
    whole = Builtin("language-model", h.tokens())(model)
    x, _, loader_batch = load_data(h.tokens_loader(), "language-model")
    assert loader_batch == 3 and np.array_equal(x, h.tokens())
    for ev in (Builtin("language-model", h.tokens(), batch_size=3), Builtin("language-model", x, batch_size=loader_batch)):
        a = ev(model)
        assert np.array_equal(a.predictions, whole.predictions) and a.metric == pytest.approx(whole.metric, rel=1e-6)
    with torch.no_grad():
        logits = model(torch.as_tensor(h.tokens())).logits.numpy()
    assert np.array_equal(whole.predictions, logits.argmax(-1))
    lp = logits[:, :-1] - np.log(np.exp(logits[:, :-1].astype(np.float64)).sum(-1, keepdims=True))
    nll = -np.take_along_axis(lp, h.tokens()[:, 1:, None], -1)[..., 0]
    assert whole.metric == pytest.approx(float(np.exp(nll.mean())), rel=1e-6)
    out = model(torch.as_tensor(h.tokens()[:2]))
    assert type(out).__name__ == "CausalLMOutputWithCrossAttentions" and logits_of(out) is out.logits
    assert logits_of((out.logits, None)) is out.logits and logits_of({"hidden": out.logits}) is out.logits


@pytest.mark.framework
def test_generation_is_greedy_decoding_by_hand():
    torch = require("torch")
    require("transformers")
    import hf_campaign_helpers as h
    from fastflip.campaign.builtins import Builtin

    model, prompts = h.gpt2(), h.prompts()
    a = Builtin("generation", prompts, batch_size=3, max_new_tokens=4)(model)
    ids = torch.as_tensor(prompts)
    with torch.no_grad():
        for _ in range(4):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert np.array_equal(a.predictions, ids[:, prompts.shape[1]:].numpy()) and a.metric == 1.0


@pytest.mark.framework
def test_non_finite_logits_are_due():
    torch = require("torch")
    require("transformers")
    import hf_campaign_helpers as h
    from fastflip.campaign.builtins import Builtin
    from fastflip.campaign.outcomes import DUE, judge

    model = h.gpt2()
    for kind, data in (("language-model", h.tokens()), ("generation", h.prompts())):
        ev = Builtin(kind, data, max_new_tokens=2)
        golden = ev(model)
        with torch.no_grad():
            old = model.transformer.ln_f.bias[3].item()
            model.transformer.ln_f.bias[3] = float("inf")
            try:
                got = ev(model)
            finally:
                model.transformer.ln_f.bias[3] = old
        assert judge(golden, got, critical=0.1).outcome == DUE, kind


def _errors(capsys):
    """The error lines of a failed CLI sweep (not its phase lines, like 'loading the target', nor the warnings a
    framework prints when it is first imported)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert any(x.startswith("loading the target") for x in lines)
    return [x for x in lines if x.startswith("fastflip")]


def _cli(*args):
    from fastflip.cli import main

    return main(["sweep", *map(str, args)])


@pytest.mark.framework
def test_golden_mismatch_is_one_line_and_leaves_no_store(tmp_path, capsys):
    """A model/evaluator mismatch (a language-model evaluator on a BERT classifier; prompts longer than GPT-2's
    positions) fails in the sweep's own process before any store or worker exists: one line, exit 2, no file; the
    corrected campaign then runs into the same store path."""
    require("torch")
    require("transformers")
    store = tmp_path / "s.db"
    wrong = make(target={"factory": "hf_campaign_helpers:bert"}, select={"layers": ["classifier"]},
                 evaluator={"function": None, "builtin": "language-model", "data": "hf_campaign_helpers:tokens"},
                 trials={"per_cell": 2}, cells={"bits": ["30"]})
    path = tmp_path / "wrong.toml"
    wrong.save(str(path))
    assert _cli(path, "-o", store, "-j", "2") == 2
    err = _errors(capsys)
    assert len(err) == 1 and "builtin language-model: the model's logits have shape (8, 3)" in err[0], err
    assert os.listdir(tmp_path) == ["wrong.toml"]
    long = _gpt2({"builtin": "generation", "data": "hf_campaign_helpers:prompts", "max_new_tokens": 40})
    long.save(str(path))
    assert _cli(path, "-o", store, "-j", "2") == 2
    err = _errors(capsys)
    assert len(err) == 1 and "the fault-free (golden) evaluation failed before the sweep started (IndexError" in err[0]
    assert os.listdir(tmp_path) == ["wrong.toml"]
    right = make(target={"factory": "hf_campaign_helpers:bert"}, select={"layers": ["classifier"]},
                 evaluator={"function": None, "builtin": "classification", "data": "hf_campaign_helpers:bert_data"},
                 trials={"per_cell": 2}, cells={"bits": ["30"]})
    right.save(str(path))
    assert _cli(path, "-o", store, "-j", "0", "-q") == 0 and len(_rows(str(store))) == 4  # 2 tensors x 2


def test_a_sweep_failing_before_its_first_trial_leaves_no_store(tmp_path, monkeypatch):
    """Workers that cannot run trials (here: every chunk raises) stop the sweep; the store it created holds no trial
    and is removed, so the corrected rerun starts afresh instead of "holds another campaign"."""
    from fastflip.errors import StoreError

    store = str(tmp_path / "s.db")
    c = make(trials={"per_cell": 3})

    def broken(self, cell_id, trials):
        raise RuntimeError("the worker is broken")

    monkeypatch.setattr(TrialRunner, "run_many", broken)
    with pytest.raises(StoreError, match="a worker could not run trials: RuntimeError: the worker is broken"):
        sweep(c, store, workers=0, progress=False)
    assert not os.path.exists(store) and os.listdir(tmp_path) == []
    monkeypatch.undo()
    fixed = make(trials={"per_cell": 4})
    assert sweep(fixed, store, workers=0, progress=False).complete and len(_rows(store)) > 0


@pytest.mark.parametrize("kind,why", [("memory_error", "out of memory"), ("torch_oom", "out of memory"),
                                      ("import_error", "an import failed"), ("file_error", "the environment failed")])
def test_out_of_memory_and_environment_errors_are_not_due(tmp_path, kind, why):
    """An evaluator that runs out of memory or meets a broken environment says nothing about the fault: the sweep
    stops with one line at its first faulted trial, no DUE is stored (the store, left empty, is removed); a ValueError
    of a faulted model stays a DUE."""
    if kind == "torch_oom":
        require("torch")
    from fastflip.campaign.failures import TrialAborted

    store = str(tmp_path / "s.db")
    c = make(evaluator={"function": f"hf_campaign_helpers:{kind}"}, trials={"per_cell": 3})
    with pytest.raises(TrialAborted, match=f"trial 0 of cell 0 .*: {why} in the evaluator") as info:
        sweep(c, store, workers=0, progress=False)
    assert "\n" not in str(info.value) and "run again to resume" in str(info.value)
    assert os.listdir(tmp_path) == []  # the first trial stopped the sweep: no DUE, no row, the empty store removed
    dues = make(evaluator={"function": "hf_campaign_helpers:value_error"}, trials={"per_cell": 3})
    assert sweep(dues, str(tmp_path / "v.db"), workers=0, progress=False).counts["due"] == 3 * len(campaign_cells(dues))


def test_environment_failure_classes():
    import errno

    from fastflip.campaign.failures import environment_failure

    assert environment_failure(OSError(errno.ENOSPC, "No space left on device")) == "the environment failed"
    assert environment_failure(OSError("Can't read data (inflate() failed)")) is None  # a corrupted file: a DUE
    assert environment_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory: out of memory")) == \
        "out of memory"
    assert environment_failure(KeyError("x")) is None


def test_rates_print_fractional():
    from fastflip.campaign.progress import Progress

    p = Progress(total=10, enabled=False, stream=io.StringIO(), status_every=0)
    p.t0 -= 10.0
    p.update([0] * 5)
    assert " 0.50 trials/s " in p.line()


def test_out_of_memory_in_pool_workers_stops_the_sweep(tmp_path):
    """The same through a process pool: the worker's error comes back as one line, not as DUE rows."""
    from fastflip.campaign.failures import TrialAborted

    store = str(tmp_path / "s.db")
    c = make(evaluator={"function": "hf_campaign_helpers:memory_error"}, trials={"per_cell": 3})
    with pytest.raises(TrialAborted, match="out of memory in the evaluator \\(MemoryError: no room\\)"):
        sweep(c, store, workers=2, progress=False)
    assert os.listdir(tmp_path) == []  # every trial stops its worker: no trial stored, the empty store removed
