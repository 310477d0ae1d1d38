"""Batched trials at the compute floor: serial vs batched vs the floor, side by side in one run.

Campaign: a compute-bound ResNet-style CNN (stem conv 16, two basic blocks of 16, two of 32 with a stride-2
downsample, pooling, a 10-way head; BatchNorm in eval mode with statistics set), 256 CIFAR-sized images
(generated, labels = the fault-free predictions), built-in classification evaluator, one worker, one thread.
Cells over bit 30, ``group_by`` ``"layer"`` or ``"none"``; every mode runs the same trials through
``TrialRunner.run_many`` (as a sweep's worker does) and the rows are checked equal to the serial rows first.

* ``serial``: ``batch_trials = 1`` (inject, full forward, revert per trial), with the allocator a batcher sets
  (``batchsize.steady_allocator``: no fresh pages per forward; serial is faster with it too, so ratios are conservative);
* ``batched``: ``batch_trials`` automatic (B chosen by measurement; the golden-activation cache at each trial's
  first faulted layer, only the rest of the network runs);
* ``floor``: the compute floor on a CPU: for every trial, one forward of the graph after its first faulted node
  from the cached golden values (``BatchedTorch.suffix``), nothing else — no faulty copies, no evaluator, no judging.

Run: ``pytest bench/bench_batch_floor.py --benchmark-only --benchmark-columns=min,median,max,rounds``
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]
torch = pytest.importorskip("torch")

N_IMAGES = 256
PER_CELL = {"layer": 2, "none": 32}


def model() -> object:
    """The CNN (deterministic weights)."""
    from torch import nn

    import user_models

    Block = user_models.torch_classes()["BasicBlock"]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(16)
            self.layer1 = nn.Sequential(Block(16, 16, 1), Block(16, 16, 1))
            self.layer2 = nn.Sequential(Block(16, 32, 2), Block(32, 32, 1))
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = self.layer2(self.layer1(x))
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    m = Net()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
    return m.eval()


def data() -> tuple[np.ndarray, np.ndarray]:
    """256 generated 3×32×32 images, labelled with the fault-free predictions."""
    x = np.random.default_rng(0).standard_normal((N_IMAGES, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        y = model()(torch.from_numpy(x)).argmax(1).numpy()
    return x, y


def _runner(group_by: str):
    from fastflip.campaign.config import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    c = Campaign.from_dict({
        "name": "floor", "seed": 5, "paths": [HERE], "target": {"factory": "bench_batch_floor:model"},
        "evaluator": {"builtin": "classification", "data": "bench_batch_floor:data", "critical": 0.05},
        "cells": {"bits": ["30"], "group_by": group_by}, "trials": {"per_cell": PER_CELL[group_by]}})
    cells = campaign_cells(c)
    return TrialRunner(c, cells), len(cells)


_SETUPS: dict[str, tuple] = {}


def _setup(group_by: str):
    if group_by not in _SETUPS:
        from fastflip.campaign.batchsize import steady_allocator

        torch.set_num_threads(1)  # one worker on a shared machine
        steady_allocator()  # what a batcher sets: serial gets it too, so the ratios are conservative
        runner, n = _runner(group_by)
        per = PER_CELL[group_by]
        serial = [tuple(runner.run(cid, t)[:6]) for cid in range(n) for t in range(per)]
        _SETUPS[group_by] = (runner, n, per, serial)
    return _SETUPS[group_by]


def _floor(runner, n: int, per: int):
    """A function running, for every trial, the graph after its first faulted node on the cached golden values."""
    from fastflip.campaign.batchedtorch import BatchedTorch, faulted_names

    bt = BatchedTorch(runner.targets[None], runner.evaluate.chunks[0])
    chunks = runner.evaluate.chunks
    keys = [faulted_names(runner.plan(cid, t)) for cid in range(n) for t in range(per)]
    for k in set(keys):
        for c, x in enumerate(chunks):
            bt.suffix(k, c, x)

    def run() -> None:
        with torch.no_grad():
            for k in keys:
                for c, x in enumerate(chunks):
                    split = bt.suffix(k, c, x)
                    if split is None:
                        runner.targets[None](torch.from_numpy(x))
                    else:
                        split[0](*bt.tiled(split[1], 1))
    return run


@pytest.mark.parametrize("mode", ["serial", "batched", "floor"])
@pytest.mark.parametrize("group_by", ["layer", "none"])
def test_floor(benchmark, group_by, mode):
    runner, n, per, serial = _setup(group_by)
    if mode == "floor":
        benchmark.pedantic(_floor(runner, n, per), rounds=3, iterations=1)
        benchmark.extra_info["trials"] = n * per
        return
    runner.campaign.evaluator.batch_trials = 1 if mode == "serial" else None
    runner._batcher = False
    rows: list = []

    def run() -> None:
        rows[:] = [r for cid in range(n) for r in runner.run_many(cid, range(per))]

    if mode == "batched":
        run()  # builds the batcher (B measured), probes the cells, fills the cache: a worker does it once
        assert [tuple(r[:6]) for r in rows] == serial
    benchmark.pedantic(run, rounds=3, iterations=1)
    assert [tuple(r[:6]) for r in rows] == serial
    benchmark.extra_info["trials"] = len(rows)
    b = runner._batcher
    benchmark.extra_info["batch"] = b.batch if b else 1
    if b and b.choice is not None:
        benchmark.extra_info["measured"] = b.choice.line()
