"""Word-kernel throughput per backend (fastflip.kernels.dispatch): 10^6 sites in a 256 MiB buffer.

Run: ``pytest bench/bench_kernels.py --benchmark-only --benchmark-columns=min,median,max,rounds``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastflip.kernels import dispatch as native

N_SITES = 1_000_000
BUF_BYTES = 256 << 20


@pytest.fixture(scope="module")
def sites() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    words = BUF_BYTES // 4
    idx = np.sort(rng.choice(words, size=N_SITES, replace=False))
    return {
        "buf": np.zeros(BUF_BYTES, dtype=np.uint8),
        "offsets": idx.astype(np.int64) * 4,
        "and": np.full(N_SITES, np.uint64(0xFFFFFFFFFFFFFFFF)),
        "or": np.zeros(N_SITES, dtype=np.uint64),
        "xor": np.uint64(1) << rng.integers(0, 32, size=N_SITES).astype(np.uint64),
    }


@pytest.mark.parametrize("backend", native.BACKENDS)
def test_apply_at_offsets_1m(benchmark, sites, backend: str) -> None:
    s = sites
    native.apply_at_offsets(s["buf"], s["offsets"][:10], 4, False, s["and"][:10], s["or"][:10], s["xor"][:10],
                            backend=backend)  # compile (numba) outside the timing
    benchmark.pedantic(native.apply_at_offsets, args=(s["buf"], s["offsets"], 4, False, s["and"], s["or"], s["xor"]),
                       kwargs={"backend": backend}, rounds=10, warmup_rounds=1)


@pytest.mark.parametrize("backend", native.BACKENDS)
def test_apply_ptrs_1m_over_321_tensors(benchmark, backend: str) -> None:
    from resnet50 import resnet50_arrays

    arrays = [a for a in resnet50_arrays().values() if a.dtype == np.float32]
    table = native.PtrTable([a.ctypes.data for a in arrays], [4] * len(arrays), [False] * len(arrays),
                            [a.nbytes for a in arrays], [a.dtype for a in arrays])
    rng = np.random.default_rng(1)
    sizes = np.array([a.size for a in arrays])
    flat = np.sort(rng.choice(int(sizes.sum()), size=N_SITES, replace=False))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    tid = (np.searchsorted(starts, flat, side="right") - 1).astype(np.int32)
    offs = (flat - starts[tid]) * 4
    ones = np.full(N_SITES, np.uint64(0xFFFFFFFFFFFFFFFF))
    zeros = np.zeros(N_SITES, dtype=np.uint64)
    xor = np.uint64(1) << rng.integers(0, 32, size=N_SITES).astype(np.uint64)
    native.apply_ptrs(table, tid[:10], offs[:10], ones[:10], zeros[:10], xor[:10], backend=backend)
    benchmark.pedantic(native.apply_ptrs, args=(table, tid, offs, ones, zeros, xor), kwargs={"backend": backend},
                       rounds=10, warmup_rounds=1)
