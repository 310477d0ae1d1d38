"""The factory and data of ``cnn_campaign.toml``: the CNN that ``make demo`` trains, with its final weights.

``FASTFLIP_DEMO_OUT`` names the demo's output folder (default: ``demo-out`` in the current directory, then next to
this folder). Replace :func:`model` and :func:`heldout` with your own model and evaluation data to start a campaign of
your own; keep them deterministic (every worker process calls them).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def checkpoint() -> str:
    """The demo's final PyTorch checkpoint (epoch 4)."""
    for root in (os.environ.get("FASTFLIP_DEMO_OUT"), "demo-out", os.path.join(HERE, os.pardir, "demo-out")):
        if root:
            path = os.path.join(root, "torch", "golden", "ckpt-e004.h5")
            if os.path.exists(path):
                return path
    raise FileNotFoundError("demo-out/torch/golden/ckpt-e004.h5 not found: run `make demo` first "
                            "(or set FASTFLIP_DEMO_OUT to the demo's output folder)")


def model() -> Any:
    """The demo's CNN (``fastflip.frameworks.trainers.torch_trainer.digits_cnn``) with the checkpoint's weights."""
    from fastflip.frameworks.torch_state import load_checkpoint
    from fastflip.frameworks.trainers.torch_trainer import digits_cnn

    m = digits_cnn()
    load_checkpoint(checkpoint(), m)
    return m.eval()


def heldout() -> tuple[np.ndarray, np.ndarray]:
    """The demo's held-out digits as NCHW images and their labels."""
    from fastflip.frameworks.trainers.torch_trainer import digits_data

    _, _, x, y = digits_data()
    return x, y
