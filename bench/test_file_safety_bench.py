"""Benchmark: inspect (layout walk) of a 30-level doubling hard-link chain (2**30 paths to one dataset).

Run: ``pytest bench/test_file_safety_bench.py --benchmark-only --benchmark-columns=min,median,max,rounds``
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from fastflip.cli import main
from fastflip.files.layout import read_layout


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("chain") / "chain.h5")
    with h5py.File(path, "w") as f:
        g = f.create_group("g0")
        for i in range(30):  # g_i links a and b to g_{i+1}
            nxt = f.create_group(f"tmp{i}")
            g["a"] = nxt
            g["b"] = nxt
            del f[f"tmp{i}"]
            g = nxt
        g["w"] = np.ones(3, "f4")
    return path


def test_layout_doubling_chain_30(benchmark, chain):
    lay = benchmark(read_layout, chain)
    assert len(lay.tensors) == 1


def test_inspect_cli_doubling_chain_30(benchmark, chain, capsys):
    def run():
        rc = main(["inspect", chain])
        capsys.readouterr()
        return rc

    assert benchmark(run) == 0
