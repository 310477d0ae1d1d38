"""Offline data for demos and tests: scikit-learn's handwritten digits (8x8), split once.

Layer: ``frameworks`` (may import live and below; imported by campaign, experiment and above).

Examples
--------
>>> x_train, y_train, x_test, y_test = digits()
>>> x_train.shape, x_test.shape, x_train.dtype.name, int(y_train.max())
((1438, 8, 8, 1), (359, 8, 8, 1), 'float32', 9)
"""

from __future__ import annotations

import numpy as np

__all__ = ["digits"]


def digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 1,797 scikit-learn digits as NHWC float32 images in [0, 1], shuffled once and split.

    Returns ``(x_train, y_train, x_test, y_test)``; labels are int64 in 0..9.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[..., None]
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n_test = int(round(len(y) * test_fraction))
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]
