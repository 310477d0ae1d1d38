"""fastflip embedded in a threaded harness: concurrent injections give exactly the serial results."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np
import pytest

from conftest import CPU_BACKENDS
import h5fixtures as hf
from fastflip import inject_file
from fastflip.live import injected


def _read_all(path: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()].tobytes()) if isinstance(obj, h5py.Dataset) else None)
    return out


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_concurrent_file_injections_equal_serial(tmp_path, backend):
    srcs = []
    for k in range(20):  # more files than the caches keep (16), so they fill and evict concurrently
        p = str(tmp_path / f"m{k}.h5")
        hf.dtype_zoo(p, shape=(8, 6), seed=k)
        srcs.append(p)
    jobs = [(srcs[i % 20], seed) for i, seed in enumerate(range(40))]

    def run(job: tuple[str, int], tag: str) -> dict[str, bytes]:
        src, seed = job
        out = str(tmp_path / f"{tag}-{seed}.h5")
        inject_file(src, out, seed=seed, count=50, backend=backend, log_path=False, durable=False)
        return _read_all(out)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up instead of hiding
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:  # threads first: kernels and caches start cold
            threaded = list(pool.map(lambda j: run(j, "thread"), jobs))
    finally:
        sys.setswitchinterval(old)
    serial = [run(j, "serial") for j in jobs]
    assert threaded == serial
    assert any(s != _read_all(jobs[i][0]) for i, s in enumerate(serial))  # the injections did change bits


def test_concurrent_live_injections_revert_exactly():
    rng = np.random.default_rng(7)
    arrays = [{"w": rng.standard_normal((64, 64)).astype(np.float32)} for _ in range(8)]
    golden = [a["w"].copy() for a in arrays]

    def run(i: int) -> bool:
        with injected(arrays[i], seed=i, count=20):
            changed = not np.array_equal(arrays[i]["w"], golden[i])
        return changed

    with ThreadPoolExecutor(max_workers=8) as pool:
        changed = list(pool.map(run, range(8)))
    assert all(changed)
    assert all(np.array_equal(a["w"], g) for a, g in zip(arrays, golden))
