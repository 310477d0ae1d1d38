"""The built-in PyTorch trainer: any ``nn.Module`` and optimizer, checkpoints in HDF5.

Layer: ``frameworks`` (may import live and below; imported by campaign, experiment and above).

Checkpoints are written by :func:`fastflip.frameworks.torch_state.save_checkpoint` (model tensors
under ``/model/<key>``, optimizer state under ``/optimizer/state/<id>/<name>``).
The data order and torch's random seed of each epoch are derived from
``(seed, epoch)`` and deterministic algorithms are requested, so resuming from an
unaltered checkpoint reproduces the uninterrupted run exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...errors import OptionError
from ..torch_state import load_checkpoint, save_checkpoint
from .data import digits

__all__ = ["TorchTrainer", "digits_cnn", "digits_data"]

Data = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def digits_data() -> Data:
    """The digits split as NCHW images (what :func:`digits_cnn` takes)."""
    xt, yt, xv, yv = digits()
    return xt.transpose(0, 3, 1, 2).copy(), yt, xv.transpose(0, 3, 1, 2).copy(), yv


def digits_cnn() -> Any:
    """A small CNN for 8x8 digits: conv-BN-pool, conv, linear; logits out."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.BatchNorm2d(16),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )


def _adam(model: Any) -> Any:
    import torch

    return torch.optim.Adam(model.parameters(), lr=3e-3)


class TorchTrainer:
    """Train a PyTorch model epoch by epoch on the CPU; save and load HDF5 checkpoints.

    Parameters
    ----------
    build_model : callable
        ``build_model() -> torch.nn.Module`` (outputs logits).
    load_data : callable
        ``load_data() -> (x_train, y_train, x_test, y_test)`` as NumPy arrays.
    build_optimizer : callable, optional
        ``build_optimizer(model) -> torch.optim.Optimizer``; default Adam, lr 3e-3.
    loss_fn : callable, optional
        ``loss_fn(logits, targets) -> scalar``; default cross-entropy.
    batch_size, seed : int
    threads : int or None
        ``torch.set_num_threads`` for the process (default 1: small models run much
        faster single-threaded on a shared machine; ``None`` leaves torch's choice).
    """

    framework = "torch"
    checkpoint_suffix = ".h5"

    def __init__(
        self,
        build_model: Callable[[], Any] = digits_cnn,
        load_data: Callable[[], Data] = digits_data,
        build_optimizer: Callable[[Any], Any] | None = None,
        loss_fn: Callable[[Any, Any], Any] | None = None,
        *,
        batch_size: int = 32,
        seed: int = 0,
        threads: int | None = 1,
    ) -> None:
        self.threads = threads
        self.build_model, self.load_data = build_model, load_data
        self.build_optimizer = build_optimizer or _adam
        self.loss_fn = loss_fn
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.model: Any = None
        self.optimizer: Any = None
        self._data: Any = None

    def build(self) -> None:
        import torch

        torch.use_deterministic_algorithms(True)
        if self.threads:
            torch.set_num_threads(int(self.threads))
        torch.manual_seed(self.seed)
        if self._data is None:
            xt, yt, xv, yv = self.load_data()
            self._data = (torch.as_tensor(np.asarray(xt)), torch.as_tensor(np.asarray(yt)),
                          torch.as_tensor(np.asarray(xv)), torch.as_tensor(np.asarray(yv)))
        self.model = self.build_model()
        self.optimizer = self.build_optimizer(self.model)

    def _loss(self, logits: Any, y: Any) -> Any:
        import torch

        return self.loss_fn(logits, y) if self.loss_fn else torch.nn.functional.cross_entropy(logits, y)

    @property
    def chance_level(self) -> float | None:
        """Accuracy of always answering the most frequent test label (None before build)."""
        if self._data is None:
            return None
        counts = np.unique(np.asarray(self._data[3].numpy()), return_counts=True)[1]
        return float(counts.max() / counts.sum())

    @property
    def iterations_per_epoch(self) -> int:
        """Batches in one epoch (after :meth:`build`)."""
        return -(-len(self._data[1]) // self.batch_size)

    def train_epoch(self, epoch: int, start: int = 0, stop: int | None = None) -> dict[str, float]:
        """Train epoch ``epoch``, or only its batches ``start`` to ``stop`` (0-based, stop excluded).

        Returns the mean training loss and accuracy of the batches trained.
        """
        import torch

        x, y = self._data[0], self._data[1]
        torch.manual_seed((self.seed * 1_000_003 + epoch) % 2**63)
        order = torch.from_numpy(np.random.default_rng([self.seed, epoch]).permutation(len(y)))
        order = order[start * self.batch_size: None if stop is None else stop * self.batch_size]
        if len(order) == 0:
            raise OptionError(f"epoch {epoch} has {self.iterations_per_epoch} iterations; none left from {start}")
        self.model.train()
        total, correct, n = 0.0, 0, 0
        for first in range(0, len(order), self.batch_size):
            idx = order[first : first + self.batch_size]
            self.optimizer.zero_grad(set_to_none=True)
            logits = self.model(x[idx])
            loss = self._loss(logits, y[idx])
            loss.backward()
            self.optimizer.step()
            total += float(loss.detach()) * len(idx)
            correct += int((logits.detach().argmax(dim=-1) == y[idx]).sum())
            n += len(idx)
        return {"loss": total / max(n, 1), "train_accuracy": correct / max(n, 1)}

    def evaluate(self) -> dict[str, float]:
        import torch

        x, y = self._data[2], self._data[3]
        self.model.eval()
        with torch.no_grad():
            logits = self.model(x)
            val_loss = float(self._loss(logits, y))
            accuracy = float((logits.argmax(dim=-1) == y).double().mean())
        self.model.train()
        return {"val_loss": val_loss, "accuracy": accuracy}

    def save_checkpoint(self, path: Path) -> None:
        save_checkpoint(path, self.model, self.optimizer)

    def load_checkpoint(self, path: Path) -> None:
        load_checkpoint(path, self.model, self.optimizer)
