"""Noise-filled HDF5 files for the one-flip benchmarks (``bench/test_cli_floor_bench.py``, ``bench/one_flip_cpu.py``).

Float32 noise of a fixed seed per dataset, scaled like trained weights (standard deviation 0.05).
"""

from __future__ import annotations

import numpy as np


def noise(n: int, seed: int) -> np.ndarray:
    """``n`` float32 values of standard deviation 0.05 drawn from ``seed``."""
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32) * 0.05


def write_h5_100(path: str) -> str:
    """The 100 MB file: 4 contiguous float32 datasets of 25 MiB (``layer{i}/kernel``, 1024 columns); ``path``."""
    import h5py

    with h5py.File(path, "w") as f:
        for i in range(4):
            f.create_dataset(f"layer{i}/kernel", data=noise(25 * 2**18, i).reshape(-1, 1024))
    return path
