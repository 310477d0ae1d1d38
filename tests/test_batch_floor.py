"""Batched trials at the compute floor: the golden-activation cache per boundary (any group_by), B by measurement
(serial when serial is faster), reused tiles; rows always equal the serial (--batch-trials 1) ones."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require
from test_batched import _campaign, _serial_and_batched
from test_campaign import results

from fastflip.campaign import batched, batchedtorch, batchgate, batchsize
from fastflip.campaign.batchsize import choose_batch
from fastflip.campaign.sweep import sweep

pytestmark = pytest.mark.framework


@pytest.fixture(autouse=True)
def _fresh_notes():
    batchgate._SAID.clear()
    yield
    batchgate._SAID.clear()


def test_group_by_none_runs_each_trial_from_its_first_faulted_layer():
    """One cell over every tensor (group_by none): each block holds trials sharing a first faulted node and runs
    from the golden values cached there (many boundaries cached, not one full forward); rows equal serial."""
    require("torch")
    c = _campaign("batch_helpers:resnet18", "batch_helpers:images", ["30"], 24, batch=4, group_by="none")
    runner, serial, got = _serial_and_batched(c, 24)
    assert got == serial
    bt = runner._batcher.bt
    used = {key[0] for key, split in bt._suffix.items() if split is not None}
    assert len(used) >= 8, used  # trials faulting later layers ran only the rest of the network


def test_cache_is_shared_across_cells_and_group_by():
    """The cache is keyed by the boundary: a layer's cell and a cell of that layer and a later one (what group_by
    none or tensor give) reuse one entry; the golden values are not computed twice."""
    require("torch")
    import batch_helpers

    x = batch_helpers.images(8)[0]
    bt = batchedtorch.BatchedTorch(batch_helpers.resnet18(), x)
    one = bt.suffix(["layer2.0.conv1.weight"])
    assert one is not None
    assert bt.suffix(["layer2.0.conv1.weight", "layer3.1.conv2.weight"]) is one
    assert bt.suffix(["layer3.1.conv2.weight", "layer2.0.conv1.weight", "fc.weight"]) is one
    assert len(bt._suffix) == 1
    assert bt.suffix(["layer3.1.conv2.weight"]) is not one and len(bt._suffix) == 2


def test_cache_budget_evicts_oldest_and_rows_stay_equal():
    """A cache budget smaller than two boundaries keeps at most one set of golden values; rows stay serial's."""
    require("torch")
    c = _campaign("batch_helpers:resnet18", "batch_helpers:images", ["30"], 12, batch=3, group_by="none")
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    runner = TrialRunner(c, campaign_cells(c))
    serial = [tuple(runner.run(0, t)[:8]) for t in range(12)]
    bt = runner.batcher().bt
    bt.cache_budget = 1
    got = [tuple(r[:8]) for r in runner.run_many(0, range(12))]
    assert got == serial
    assert sum(split is not None for split in bt._suffix.values()) <= 1


def test_tiles_are_reused_buffers():
    """Golden values repeated B times go into one buffer per position and shape, refilled (same storage) per block."""
    require("torch")
    import torch

    bt = batchedtorch.BatchedTorch(torch.nn.Linear(2, 2).eval(), np.zeros((1, 2), np.float32))
    a, b = torch.arange(6.0).reshape(3, 2), torch.ones(3, 1)
    first = bt.tiled([a, b], 4)
    assert torch.equal(first[0], a.repeat(4, 1)) and torch.equal(first[1], b.repeat(4, 1))
    first[0].zero_()  # a suffix writing in place must not leak into the next block
    again = bt.tiled([a, b], 4)
    assert again[0].data_ptr() == first[0].data_ptr() and torch.equal(again[0], a.repeat(4, 1))


def test_choose_batch_rules():
    """The fastest size wins; sizes past the memory cap are not tried; widening stops once clearly slower; serial
    when no size beats it."""
    tried = []

    def cost(b):
        tried.append(b)
        return {1: 1.0, 2: 0.6, 4: 0.5, 8: 0.9, 16: 0.1}[b]

    c = choose_batch(cost, cap=64)
    assert c.size == 4 and tried == [1, 2, 4, 8]  # 8 is clearly slower: 16 never tried
    tried.clear()
    assert choose_batch(cost, cap=2).size == 2 and tried == [1, 2]
    assert choose_batch(lambda b: 1.0, cap=64).size == 1  # a tie: serial
    assert "serial 1e+03" in choose_batch(lambda b: 1.0, cap=2).line()


def test_automatic_batch_falls_back_to_serial_when_serial_is_faster(monkeypatch, capsys, tmp_path):
    """With the timing injected so that serial wins, the sweep says so at its start and runs trials one at a
    time (no batched forward); when B = 4 wins, it says B and the path; rows equal --batch-trials 1 either way."""
    require("torch")
    def c():
        return _campaign("batch_helpers:digits_net", "batch_helpers:digits_data", ["30"], 6)

    ref = sweep(c(), str(tmp_path / "ref.db"), workers=0, progress=False, batch_trials=1)
    assert ref.ran > 0

    def rows(name):
        return results(tmp_path / name)

    monkeypatch.setattr(batched.TrialBatcher, "measure", lambda self, b, repeat=2: 1.0 if b == 1 else 2.0)
    monkeypatch.setattr(batchedtorch.BatchedTorch, "run", lambda *a, **k: pytest.fail("a batched forward ran"))
    capsys.readouterr()
    sweep(c(), str(tmp_path / "serial.db"), workers=0, progress=True)
    err = capsys.readouterr().err
    assert "trials run one at a time (serial): measured no slower than batched" in err, err
    assert "serial 1e+03, B = 2 2e+03" in err
    assert rows("serial.db") == rows("ref.db")
    monkeypatch.undo()

    monkeypatch.setattr(batched.TrialBatcher, "measure", lambda self, b, repeat=2: 1.0 / b if b <= 4 else 1.0)
    sweep(c(), str(tmp_path / "four.db"), workers=0, progress=True)
    err = capsys.readouterr().err
    assert "batched trials: 4 trials per forward (prefix: golden activations cached" in err, err
    assert rows("four.db") == rows("ref.db")


def test_probe_runs_a_few_rows():
    """The per-cell probe runs three copies of the first PROBE_ROWS inputs, not of the whole first mini-batch (200
    digits here), and still accepts a batchable cell."""
    require("torch")
    c = _campaign("batch_helpers:digits_net", "batch_helpers:digits_data", ["30"], 4, batch=2)
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    runner = TrialRunner(c, campaign_cells(c))
    batcher = runner.batcher()
    seen = []
    hook = runner.targets[None].out.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[0]))
    try:
        assert batcher.usable(runner, 0)
    finally:
        hook.remove()
    assert len(runner.evaluate.chunks[0]) == 200 and seen and max(seen) <= 3 * batched.PROBE_ROWS, seen


def test_steady_allocator_set_on_glibc_and_opt_out(monkeypatch):
    """A batcher keeps freed blocks for reuse (glibc mallopt); FASTFLIP_MALLOC=system leaves the allocator alone."""
    import platform
    import sys

    monkeypatch.setenv("FASTFLIP_MALLOC", "system")
    assert batchsize.steady_allocator() is False
    monkeypatch.delenv("FASTFLIP_MALLOC")
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert batchsize.steady_allocator() is glibc


def test_activation_faults_group_by_none_run_from_their_layer():
    """Activation faults in one cell over four layers (group_by none): blocks hold trials of one layer output and run
    from its cached golden output (one entry per layer), rows equal one trial at a time."""
    require("torch")
    from test_campaign import make

    c = make(target={"factory": "batch_helpers:resnet18", "kind": "activations"},
             select={"layers": ["conv1", "layer1.0.conv2", "layer3.1.bn1", "fc"]},
             evaluator={"function": None, "builtin": "classification", "data": "batch_helpers:images",
                        "critical": 0.05, "batch_trials": 3},
             cells={"bits": ["30"], "group_by": "none"}, trials={"per_cell": 16})
    runner, serial, got = _serial_and_batched(c, 16)
    assert got == serial
    bt = runner._batcher.bt
    assert isinstance(bt, batchedtorch.BatchedActivations)
    assert sum(split is not None for key, split in bt._suffix.items() if key[1] != -1) >= 3, bt._suffix.keys()
