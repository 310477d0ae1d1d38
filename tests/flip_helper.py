"""A tiny independent bit flipper for interop tests: h5py read -> XOR one bit -> write.

It does not use fastflip's injection engine on purpose: the interop tests check that
what a framework loads is exactly the altered stored word, and the expected words are
computed here with NumPy alone.
"""

from __future__ import annotations

import h5py
import numpy as np


def flip_bits(path, names, seed: int = 0) -> dict[str, np.ndarray]:
    """Flip one random bit in one random element of each named dataset; return the new words."""
    rng = np.random.default_rng(seed)
    out = {}
    with h5py.File(path, "r+") as f:
        for name in names:
            ds = f[name]
            arr = ds[()]
            words = np.atleast_1d(arr).reshape(-1).view(f"u{arr.dtype.itemsize}").copy()
            i = int(rng.integers(words.size))
            bit = int(rng.integers(arr.dtype.itemsize * 8))
            words[i] ^= np.array(1, words.dtype) << np.array(bit, words.dtype)
            ds[()] = words.view(arr.dtype).reshape(arr.shape)
            out[name] = words.reshape(np.shape(arr))
    return out


def words_of(values) -> np.ndarray:
    """The stored words of an array (same shape)."""
    a = np.asarray(values)
    return np.atleast_1d(a).reshape(-1).view(f"u{a.dtype.itemsize}").reshape(a.shape)
