"""Speed of the older-tool emulation (compat/oldtool.py): 3,000 attempts, as in the shipped config.

Run: ``pytest bench/test_oldtool_bench.py --benchmark-only --benchmark-columns=min,median,max,rounds``

``simulate``: the simulated loop alone on in-memory float32 values (picks, bit draws, float64 packing,
NaN re-draws, the XOR plan); ``file``: ``run_old_settings`` end to end on a 4-dataset HDF5 file (read the
hit values, copy with the flips applied, hashes, log).
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from fastflip.compat.oldtool import array_reader, old_tool_plan
from fastflip.compat.run import run_old_settings
from fastflip.compat.oldconfig import OldSettings
from fastflip.core.plan import TensorRef

SETTINGS = OldSettings(tries=3000, precision=64, first_bit=1, last_bit=8, burst=2, allow_nan=False)


def test_simulate(benchmark):
    vals = (np.random.default_rng(0).standard_normal(1 << 20) * 0.05).astype("<f4")
    refs = [TensorRef("/w", "<f4", vals.shape)]
    run = benchmark(lambda: old_tool_plan(SETTINGS, refs, array_reader([vals]), seed=1))
    assert run.attempts == 3000


@pytest.fixture(scope="module")
def h5file(tmp_path_factory):
    p = tmp_path_factory.mktemp("old") / "m.h5"
    rng = np.random.default_rng(0)
    with h5py.File(p, "w") as f:
        for k, n in (("a", 8), ("b", 64), ("c", 1024), ("d", 1 << 20)):
            f[f"predictor/{k}/W"] = (rng.standard_normal(n) * 0.05).astype("<f4")
    return p


def test_file(benchmark, h5file, tmp_path):
    r = benchmark(lambda: run_old_settings(SETTINGS, str(h5file), str(tmp_path / "o.h5"), seed=1))
    assert r.run.attempts == 3000
