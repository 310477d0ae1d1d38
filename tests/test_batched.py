"""Batched trials (fastflip.campaign.batched): every trial's row equals the serial (--batch-trials 1) one."""

from __future__ import annotations

import io

import numpy as np
import pytest

from conftest import require
from test_campaign import make, results

from fastflip.campaign import batchedtorch, batchgate, batchsize
from fastflip.campaign.sweep import campaign_cells, sweep
from fastflip.campaign.trials import MASKED, TrialRunner

pytestmark = pytest.mark.framework

CASES = {
    "digits": ("batch_helpers:digits_net", "batch_helpers:digits_data", ["30", "mantissa"], 24),
    "resnet18": ("batch_helpers:resnet18", "batch_helpers:images", ["30", "mantissa"], 3),
    "tied": ("batch_helpers:tied_lm", "batch_helpers:tokens", ["30", "22"], 12),
}


def _campaign(factory, data, bits, per_cell, builtin="classification", batch=None, **cells):
    ev = {"function": None, "builtin": builtin, "data": data, "critical": 0.05}
    if batch is not None:
        ev["batch_trials"] = batch
    return make(target={"factory": factory}, evaluator=ev, trials={"per_cell": per_cell},
                cells={"bits": bits, "group_by": "layer", **cells})


def _serial_vs_batched_modes(c, per_cell):
    """Every trial one at a time, then batched with and without the golden prefix: the rows must agree (outcome,
    metric, sites, message, numeric, changed, delta). Returns the cells, the serial rows and (prefix, batcher)."""
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    serial = [runner.run(cid, t) for cid in range(len(cells)) for t in range(per_cell)]
    modes = []
    for prefix in (True, False):
        runner._batcher = False  # decide again: a fresh batcher per mode
        bt = runner.batcher()
        bt.prefix = prefix
        got = [r for cid in range(len(cells)) for r in runner.run_many(cid, range(per_cell))]
        assert len(got) == len(serial)
        for s, g in zip(serial, got):
            assert s[:6] == g[:6] and s.message == g.message and s.numeric == g.numeric, (prefix, s, g)
            assert s.changed == pytest.approx(g.changed) and (s.delta is None) == (g.delta is None)
            if s.delta is not None:
                assert g.delta == pytest.approx(s.delta, abs=1e-12)
        modes.append((prefix, bt))
    return cells, serial, modes


@pytest.fixture(autouse=True)
def _fresh_notes():
    batchgate._SAID.clear()
    yield
    batchgate._SAID.clear()


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_rows_equal_serial_rows(case):
    """Each trial's outcome label, metric, delta, changed fraction and sites: batched (with and without the golden
    prefix) equal to one trial at a time, on user-written models with the real built-in evaluator."""
    require("torch")
    factory, data, bits, per_cell = CASES[case]
    c = _campaign(factory, data, bits, per_cell, batch=4)
    cells, serial, modes = _serial_vs_batched_modes(c, per_cell)
    for prefix, bt in modes:
        assert bt.batch == 4 and all(bt._ok.values()) and len(bt._ok) == len({
            tuple(sorted(x.tensors)) for x in cells})  # really batched, every cell
    outcomes = {r.outcome for r in serial}
    assert len(outcomes) > 1 or case == "tied"  # the campaign is not all-masked: outcomes are really compared
    assert any(r.outcome != MASKED for r in serial)


def test_prefix_outputs_equal_full_forward():
    """For every layer of a ResNet-18 (and a tied-weight model), the suffix run on cached golden values gives the
    full forward's outputs exactly."""
    torch = require("torch")
    import batch_helpers
    from fastflip.core.blockplan import PlanBlock
    from fastflip.core.plan import Plan, TensorRef

    for model, x, least in ((batch_helpers.resnet18(), batch_helpers.images(16)[0], 50),
                            (batch_helpers.tied_lm(), batch_helpers.tokens()[0], 4)):
        bt = batchedtorch.BatchedTorch(model, x)
        split = 0
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point():
                continue
            ref = TensorRef(name, "<f4", tuple(p.shape))
            plans = [Plan.from_sites([ref], [0], [i % p.numel()], xor_mask=[1 << b]) for i, b in ((0, 30), (3, 22))]
            block = PlanBlock.from_plans(plans)
            full = bt.outputs(block, [name], prefix=False)
            part = bt.outputs(block, [name], prefix=True)
            assert np.array_equal(full, part, equal_nan=True), name
            split += bt.suffix([name]) is not None
        assert split >= least  # every layer after the first really ran from a cached prefix
    assert torch is not None


def _sweep_rows(tmp_path, c, name, batch):
    res = sweep(c, str(tmp_path / f"{name}.db"), workers=0, progress=False, batch_trials=batch)
    assert res.complete
    return results(tmp_path / f"{name}.db")


def test_sweep_batch_trials_knob_and_resume(tmp_path):
    """--batch-trials 1 (serial reference), automatic and 3 store the same rows; the knob is not part of the
    campaign's identity (a store resumes under another setting)."""
    require("torch")
    c = _campaign("batch_helpers:digits_net", "batch_helpers:digits_data", ["30", "mantissa"], 9)
    ref = _sweep_rows(tmp_path, c, "serial", 1)
    assert _sweep_rows(tmp_path, c, "auto", None) == ref
    assert _sweep_rows(tmp_path, c, "three", 3) == ref
    from fastflip.campaign.store import ResultStore

    st = ResultStore.open(str(tmp_path / "three.db"), writable=True)
    st.conn.execute("DELETE FROM trials WHERE trial >= 4")
    st.conn.commit()
    st.close()
    assert _sweep_rows(tmp_path, c, "three", 1) == ref


def test_batch_trials_config_and_cli(tmp_path):
    require("torch")  # the campaign's model is a torch module: the CLI sweep below runs it
    from fastflip.errors import OptionError

    with pytest.raises(OptionError, match=r"\[evaluator\] batch_trials"):
        _campaign("batch_helpers:digits_net", "batch_helpers:digits_data", ["30"], 3, batch=0)
    with pytest.raises(OptionError, match="batch_trial"):  # a typo is named with the nearest key
        make(evaluator={"batch_trial": 2})
    c = _campaign("batch_helpers:digits_net", "batch_helpers:digits_data", ["30"], 3, batch=8)
    assert c.definition() == _campaign("batch_helpers:digits_net", "batch_helpers:digits_data", ["30"], 3).definition()
    path = str(tmp_path / "c.toml")
    c.save(path)
    from fastflip.campaign.config import load_campaign

    assert load_campaign(path).evaluator.batch_trials == 8
    with pytest.raises(OptionError, match="--batch-trials"):
        sweep(c, str(tmp_path / "x.db"), workers=0, progress=False, batch_trials=0)
    from fastflip.cli import main

    assert main(["sweep", path, "-o", str(tmp_path / "cli.db"), "-j", "0", "-q", "--batch-trials", "2"]) == 0


@pytest.mark.parametrize("factory,why", [
    ("batch_helpers:inplace", "batched trials off for InPlace: its forward writes to a.weight in place (clamp_)")])
def test_unbatchable_models_fall_back_with_one_line(factory, why, capsys):
    require("torch")
    c = _campaign(factory, "batch_helpers:digits_data", ["30", "0"], 8, batch=4)
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    serial = [tuple(runner.run(cid, t)[:8]) for cid in range(len(cells)) for t in range(8)]
    runner2 = TrialRunner(c, cells)
    got = [tuple(r[:8]) for cid in range(len(cells)) for r in runner2.run_many(cid, range(8))]
    assert got == serial
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if why in x]
    assert len(lines) == 1 and len(err.splitlines()) == 1, err  # one line, for the whole model
    assert lines[0].endswith("running trials one at a time")


def _serial_and_batched(c, per_cell):
    """A fresh runner, its rows one trial at a time, then through run_many (first 8 columns)."""
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    serial = [tuple(runner.run(cid, t)[:8]) for cid in range(len(cells)) for t in range(per_cell)]
    got = [tuple(r[:8]) for cid in range(len(cells)) for r in runner.run_many(cid, range(per_cell))]
    return runner, serial, got


def test_untraceable_model_batches_without_a_graph(capsys):
    """torch.fx cannot trace it (control flow on the input): its faulted modules run once per trial on their share of
    the batch, no graph needed; reported once; rows equal one trial at a time."""
    require("torch")
    c = _campaign("batch_helpers:traced_off", "batch_helpers:digits_data", ["30", "0"], 6, batch=3)
    runner, serial, got = _serial_and_batched(c, 6)
    assert got == serial and runner._batcher._off is None and all(runner._batcher._ok.values())
    assert runner._batcher.path() == "full"
    err = capsys.readouterr().err
    assert err.count("TracedOff: torch.fx cannot trace it") == 1, err
    assert "its faulted modules run once per trial" in err and "batched trials off" not in err


def test_control_flow_on_faulted_values_runs_serially(capsys):
    """Branchy zeroes a layer's output when any value of it is huge: batched without a graph, one trial's fault would
    decide for all. The probe (an extreme trial between two fault-free ones) sees it; those cells run one at a time,
    the cells after the branch batch; rows equal one trial at a time."""
    require("torch")
    c = _campaign("batch_helpers:branchy", "batch_helpers:digits_data", ["30", "0"], 8, batch=4)
    runner, serial, got = _serial_and_batched(c, 8)
    assert got == serial
    ok = runner._batcher._ok
    assert ok[("a.bias", "a.weight")] is False and ok[("b.bias", "b.weight")] is True
    err = capsys.readouterr().err
    assert err.count("batched trials off for Branchy (tensors a.bias, a.weight)") == 1, err


def test_no_prefix_when_the_rest_needs_sizes(capsys):
    """A model reading its batch size before the faulted layer batches with full forwards (reported once per cell)."""
    require("torch")
    c = _campaign("batch_helpers:sizes", "batch_helpers:digits_data", ["30", "0"], 6, batch=3)
    runner, serial, got = _serial_and_batched(c, 6)
    assert got == serial and all(runner._batcher._ok.values())
    err = capsys.readouterr().err
    assert err.count("golden-prefix reuse off for Sizes") == 2, err  # one line per layer group
    assert "not batch-major tensors" in err


def test_function_evaluator_is_not_batch_safe(capsys):
    """A user function runs the model itself: asked to batch, the campaign says once why it does not."""
    require("torch")
    c = make(target={"factory": "batch_helpers:digits_net"},
             evaluator={"function": "batch_helpers:digits_eval", "batch_trials": 4},
             trials={"per_cell": 3}, cells={"bits": ["30"], "group_by": "layer"})
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    rows = [r for cid in range(len(cells)) for r in runner.run_many(cid, range(3))]
    assert runner._batcher is None and len(rows) == 3 * len(cells)
    assert capsys.readouterr().err.count("batch_trials = 4 ignored: a function or command evaluator") == 1


def test_out_of_memory_halves_the_batch(capsys, monkeypatch):
    torch = require("torch")
    c = _campaign("batch_helpers:digits_net", "batch_helpers:digits_data", ["30"], 12, batch=8)
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    serial = [tuple(runner.run(cid, t)[:8]) for cid in range(len(cells)) for t in range(12)]
    real = batchedtorch.BatchedTorch.run
    sizes = []

    def tight(self, block, names, evaluate, prefix=True):
        sizes.append(len(block))
        if len(block) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, block, names, evaluate, prefix)

    monkeypatch.setattr(batchedtorch.BatchedTorch, "run", tight)
    got = [tuple(r[:8]) for cid in range(len(cells)) for r in runner.run_many(cid, range(12))]
    assert got == serial
    assert runner._batcher.batch == 2 and 8 in sizes and 4 in sizes
    err = capsys.readouterr().err
    assert "out of memory with 8 trials per forward; continuing with 4" in err
    assert "continuing with 2" in err


def test_auto_batch_from_free_memory():
    require("torch")
    import batch_helpers

    bt = batchedtorch.BatchedTorch(batch_helpers.resnet18(), batch_helpers.images(16)[0])
    per = bt.per_trial_bytes()
    assert per > 16 * 3 * 32 * 32 * 4  # at least the inputs and the first layer's outputs
    assert batchsize.auto_batch(per, 10 * per) == 2 and batchsize.auto_batch(per, per) == 1
    assert batchsize.free_memory(bt.device) > 0


def test_gpu_workers_one_per_gpu(monkeypatch):
    """GPU targets: local workers default to one per visible GPU, each worker sees the next one (CPU-simulated:
    the initializer's environment and the sweep's device list; no GPU is needed)."""
    import multiprocessing
    import os
    import sys
    import types

    from fastflip.campaign import executors

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 2))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    assert executors.sweep_gpus() == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert executors.sweep_gpus() == ["0", "1"]
    fake.cuda.is_initialized = lambda: False
    assert executors.sweep_gpus() == []
    counter = multiprocessing.get_context("spawn").Value("i", 0)
    seen = []
    monkeypatch.setattr(executors, "watch_parent", lambda parent: None)
    monkeypatch.setattr(executors.signal, "signal", lambda *a: None)
    for _ in range(3):
        executors._init_worker(False, os.getpid(), ["0", "1"], counter)
        seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    assert seen == ["0", "1", "0"]


@pytest.mark.parametrize("factory,data,layers,bits,per_cell", [
    ("act_campaign_helpers:model", "act_campaign_helpers:heldout", ["fc1", "fc2"], ["30", "22", "0-21"], 12),
    ("batch_helpers:resnet18", "batch_helpers:images", ["conv1", "layer1.0.conv2", "layer3.1.bn1", "fc"],
     ["30", "mantissa"], 6)])
def test_activation_trials_batched_equal_serial(factory, data, layers, bits, per_cell):
    """Activation faults: B trials in one forward of B x N samples (trial j's plan in its N samples) give the rows
    of one trial at a time, on the trained digits classifier and the ResNet-18 subclass."""
    require("torch")
    c = make(target={"factory": factory, "kind": "activations"}, select={"layers": layers},
             evaluator={"function": None, "builtin": "classification", "data": data, "critical": 0.05,
                        "batch_trials": 5},
             cells={"bits": bits, "group_by": "layer"}, trials={"per_cell": per_cell})
    cells, serial, modes = _serial_vs_batched_modes(c, per_cell)
    for prefix, bt in modes:
        assert isinstance(bt.bt, batchedtorch.BatchedActivations) and all(bt._ok.values())
        if prefix:  # every layer but a first one ran from its cached golden output
            assert sum(v is not None for v in bt.bt._suffix.values()) >= len(layers) - 1
    assert len({r.outcome for r in serial}) > 1


def test_activation_block_needs_its_batch():
    torch = require("torch")
    from fastflip.core.blockplan import PlanBlock
    from fastflip.errors import OptionError
    from fastflip.live.activations import injected_activations
    from fastflip.core.plan import Plan, TensorRef

    m = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    ref = TensorRef("0", "<f4", (3,))
    block = PlanBlock.from_plans([Plan.from_sites([ref], [0], [1], xor_mask=[1 << 31])] * 2)
    x = torch.ones(3, 4)
    with torch.no_grad():
        plain = m(x)
        with injected_activations(m, 1, plan=block, samples_per_plan=3):
            out = m(x.repeat(2, 1))
        assert torch.equal(out[:, 1], -plain[:, 1].repeat(2)) and torch.equal(out[:, 0], plain[:, 0].repeat(2))
        with pytest.raises(OptionError, match="needs forwards of 6 samples, not 3"):
            with injected_activations(m, 1, plan=block, samples_per_plan=3):
                m(x)


def test_inputs_torch_cannot_take_run_serially(capsys):
    """Evaluation inputs that are not one tensor (a list of ragged arrays): the batcher steps aside, reported once."""
    require("torch")
    c = _campaign("batch_helpers:digits_net", "batch_helpers:digits_data", ["30"], 3, batch=2)
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    runner.evaluate.chunks = [[[1.0, 2.0], [3.0]]]  # ragged: not one tensor
    rows = runner.run_many(0, range(3))
    assert runner._batcher is None and len(rows) == 3
    assert capsys.readouterr().err.count("batched trials off: ValueError") == 1


def test_graph_walked_once_per_model_not_per_block(monkeypatch):
    """The traced graph's nodes are read while the first block sets up (trace, first uses, the cached split); later
    blocks of the same boundary reuse what was read and walk no node, whatever their number."""
    require("torch")
    import torch
    import torch.fx

    from fastflip.core.blockplan import PlanBlock
    from fastflip.core.plan import Plan, TensorRef

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).eval()
    bt = batchedtorch.BatchedTorch(model, np.ones((2, 4), np.float32))
    ref = TensorRef("2.weight", "<f4", (2, 3))

    def block(bit):
        return PlanBlock.from_plans([Plan.from_sites([ref], [0], [i], xor_mask=[1 << bit]) for i in range(3)])

    first = bt.outputs(block(1), ["2.weight"])
    walks = []
    real = torch.fx.Graph.nodes
    monkeypatch.setattr(torch.fx.Graph, "nodes", property(lambda g: walks.append(1) or real.fget(g)))
    later = [bt.outputs(block(b), ["2.weight"]) for b in (1, 2, 3)]
    assert len(walks) == 0, f"{len(walks)} walks of the graph for 3 blocks"
    np.testing.assert_array_equal(later[0], first)
    assert not np.array_equal(later[2], first)
