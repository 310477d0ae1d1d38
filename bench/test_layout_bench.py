"""Benchmarks: layout walk, chunk index, element byte offsets, diff throughput.

Run: ``pytest bench/test_layout_bench.py --benchmark-only --benchmark-columns=min,median,max,rounds``
"""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import h5fixtures as hf  # noqa: E402

from fastflip.files.diff import diff_files  # noqa: E402
from fastflip.files.h5offsets import chunk_index, element_byte_offsets  # noqa: E402
from fastflip.files.layout import read_layout  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("layout_bench")
    out = {}
    out["many"] = str(d / "many.h5")
    hf.many_datasets(out["many"], 2000, groups=40)
    # one 1 GiB contiguous dataset, allocated but never written (a sparse file): walk cost must not grow
    out["huge"] = str(d / "huge.h5")
    with h5py.File(out["huge"], "w") as f:
        x = f.create_dataset("x", shape=(2**28,), dtype="<f4")
        x[-1] = 1.0
    # 10^4 chunks
    out["chunked"] = str(d / "chunked.h5")
    with h5py.File(out["chunked"], "w") as f:
        f.create_dataset("c", data=np.zeros((1000, 1000), "<f4"), chunks=(10, 10))
    # diff: two 64 MiB files, 1 in 10^4 elements differing
    a, b = str(d / "a.h5"), str(d / "b.h5")
    v = np.random.default_rng(0).standard_normal(16 * 2**20).astype("<f4")
    hf.write_datasets(a, {"w": v})
    v[::10000] *= -1
    hf.write_datasets(b, {"w": v})
    out["a"], out["b"] = a, b
    return out


def test_read_layout_2000_datasets(benchmark, files):
    lay = benchmark(read_layout, files["many"])
    assert len(lay) == 2000


def test_read_layout_1gib_dataset(benchmark, files):
    lay = benchmark(read_layout, files["huge"])
    assert lay.tensors[0].size == 2**28


def test_chunk_index_10k_chunks(benchmark, files):
    t = read_layout(files["chunked"]).tensors[0]
    idx = benchmark(chunk_index, files["chunked"], t)
    assert len(idx.offsets) == 10_000


def test_byte_offsets_1m_chunked(benchmark, files):
    t = read_layout(files["chunked"]).tensors[0]
    idx = chunk_index(files["chunked"], t)
    flat = np.random.default_rng(0).integers(0, t.size, 10**6)
    offs = benchmark(idx.byte_offsets, flat)
    assert (offs >= 0).all()


def test_byte_offsets_1m_contiguous(benchmark, files):
    t = read_layout(files["huge"]).tensors[0]
    flat = np.random.default_rng(0).integers(0, t.size, 10**6)
    offs = benchmark(element_byte_offsets, files["huge"], t, flat)
    assert offs.shape == (10**6,)


def test_diff_2x64mib(benchmark, files):
    r = benchmark.pedantic(diff_files, (files["a"], files["b"]), rounds=3, iterations=1)
    assert r.tensors[0].n_diff == len(range(0, 16 * 2**20, 10000))
