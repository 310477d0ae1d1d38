"""A PyTorch digits classifier (scikit-learn's bundled 8x8 digits) for activation campaigns."""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

import numpy as np


@lru_cache(maxsize=1)
def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return x[:1400], y[:1400], x[1400:], y[1400:]


@lru_cache(maxsize=1)
def _trained() -> Any:
    import torch
    from torch import nn

    class DigitsNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(64, 32)
            self.act = nn.ReLU()
            self.fc2 = nn.Linear(32, 10)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.fc2(self.act(self.fc1(x)))

    torch.manual_seed(0)
    model = DigitsNet()
    xt, yt, _, _ = _data()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.from_numpy(xt), torch.from_numpy(yt)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def model() -> Any:
    """A fresh copy of the trained classifier."""
    return copy.deepcopy(_trained())


def heldout() -> tuple[np.ndarray, np.ndarray]:
    """The 397 held-out digits (inputs, labels)."""
    return _data()[2], _data()[3]


def lm() -> Any:
    """A fresh copy of a tiny GPT-2 (from its config, eager attention) returning the last position's logits."""
    return copy.deepcopy(_lm())


@lru_cache(maxsize=1)
def _lm() -> Any:
    import torch
    import transformers
    from torch import nn

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    gpt = transformers.GPT2LMHeadModel(cfg).eval()
    gpt.set_attn_implementation("eager")

    class LastToken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt = gpt

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.gpt(x).logits[:, -1]

    return LastToken().eval()


def lm_data() -> tuple[np.ndarray, np.ndarray]:
    """24 random token sequences and the fault-free model's next tokens as labels."""
    import torch

    x = np.random.default_rng(0).integers(1, 64, (24, 6))
    with torch.no_grad():
        y = _lm()(torch.from_numpy(x)).argmax(-1).numpy()
    return x, y
