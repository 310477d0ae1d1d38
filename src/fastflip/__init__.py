"""fastflip: exact, fast, reproducible bit flips in HDF5 checkpoints and live tensors."""

from __future__ import annotations

__version__ = "0.1.0"
