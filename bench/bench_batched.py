"""Real trials per second: serial vs batched vs batched + golden prefix (fastflip.campaign.batched), one worker.

Campaign: a ResNet-18-shaped CNN built in code (``tests/user_models.py``'s ``ResNet18``, width 8:
~0.17 M parameters, BatchNorm in eval mode, statistics set), 3×32×32 inputs, a 256-image
evaluation set (generated, labels = the fault-free predictions), built-in classification
evaluator; cells per layer × {bit 30, mantissa}, ``PER_CELL`` trials each. Every mode runs the
same trials in this process (``TrialRunner.run_many``, as a sweep's worker does) and the rows
are checked equal to the serial ones (outcome, metric, delta, sites) before timing counts.

* ``serial``: ``batch_trials = 1`` (inject, forward, revert per trial);
* ``batched``: ``batch_trials`` automatic, full forwards;
* ``prefix``: batched, each cell's golden prefix cached;
* ``activations_serial`` / ``activations_batched`` / ``activations_batched_prefix``: the same CNN with per-sample
  activation faults (outputs of six layers, cells per layer × {bit 30, mantissa}): one trial per forward, ``B``
  trials in one forward of ``B × 256`` samples, and from the faulted layer's cached golden output on.

Peak RSS is recorded per mode (``extra_info``). Run:
``pytest bench/bench_batched.py --benchmark-only --benchmark-columns=min,median,max,rounds``
"""

from __future__ import annotations

import os
import resource
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]
torch = pytest.importorskip("torch")
import batch_helpers  # noqa: E402

PER_CELL = 4
N_IMAGES = 256


def model() -> object:
    """The CNN (deterministic weights; the tests' ``batch_helpers.resnet18``)."""
    return batch_helpers.resnet18()


def data() -> tuple[np.ndarray, np.ndarray]:
    """256 generated images, labelled with the fault-free predictions."""
    return batch_helpers.images(N_IMAGES)


ACT_LAYERS = ["conv1", "layer1.0.conv1", "layer2.0.conv2", "layer3.1.conv1", "layer4.0.conv2", "fc"]


def _runner(activations: bool = False):
    from fastflip.campaign.config import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    d = {"name": "bench", "seed": 3, "paths": [HERE], "target": {"factory": "bench_batched:model"},
         "evaluator": {"builtin": "classification", "data": "bench_batched:data", "critical": 0.05},
         "cells": {"bits": ["30", "mantissa"], "group_by": "layer"}, "trials": {"per_cell": PER_CELL}}
    if activations:  # per-sample activation faults: a fault in the outputs of one of these layers per trial
        d["target"]["kind"] = "activations"
        d["select"] = {"layers": ACT_LAYERS}
    c = Campaign.from_dict(d)
    cells = campaign_cells(c)
    return TrialRunner(c, cells), len(cells)


def _setup(activations: bool):
    torch.set_num_threads(1)  # one worker on a shared machine
    runner, n = _runner(activations)
    serial = [tuple(runner.run(cid, t)[:7]) for cid in range(n) for t in range(PER_CELL)]
    return runner, n, serial


@pytest.fixture(scope="module")
def setup():
    return _setup(False)


@pytest.fixture(scope="module")
def act_setup():
    return _setup(True)


def _mode(benchmark, setup, batch, prefix):
    from trial_modes import time_mode

    runner, n, serial = setup

    def same(rows):
        got = [tuple(r[:7]) for r in rows]
        assert [g[:6] for g in got] == [s[:6] for s in serial]  # identical outcomes, metrics, sites

    time_mode(benchmark, runner, n, PER_CELL, batch, same, prefix)
    benchmark.extra_info["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_serial(benchmark, setup):
    _mode(benchmark, setup, 1, False)


def test_batched(benchmark, setup):
    _mode(benchmark, setup, None, False)


def test_batched_prefix(benchmark, setup):
    _mode(benchmark, setup, None, True)


def test_activations_serial(benchmark, act_setup):
    _mode(benchmark, act_setup, 1, False)


def test_activations_batched(benchmark, act_setup):
    _mode(benchmark, act_setup, None, False)


def test_activations_batched_prefix(benchmark, act_setup):
    _mode(benchmark, act_setup, None, True)
