"""The small protocol every trainer follows, and how a user's model file is loaded.

Layer: ``frameworks`` (may import live and below; imported by campaign, experiment and above).

An experiment drives any object with these five methods; the built-in Keras and
PyTorch trainers implement them, and a user's own file can provide one.

The contract that makes a faulty run comparable with the fault-free one: after
``load_checkpoint(p)`` the trainer's whole training state (model and optimizer)
is the one saved in ``p``, and ``train_epoch(e)`` depends only on that state and
on ``e`` (the data order and any randomness are derived from the trainer's seed
and the epoch number). Resuming from an unaltered checkpoint then reproduces the
golden run exactly.

Examples
--------
>>> class Counting:
...     framework, checkpoint_suffix = "none", ".h5"
...     def build(self): self.w = 0
...     def train_epoch(self, epoch): self.w += 1; return {"loss": 1.0 / self.w}
...     def evaluate(self): return {"accuracy": min(1.0, self.w / 4), "val_loss": 0.0}
...     def save_checkpoint(self, path): pass
...     def load_checkpoint(self, path): pass
>>> isinstance(Counting(), Trainer)
True
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from ...errors import InputFileError, OptionError

__all__ = ["Trainer", "load_user_module", "user_callable"]


@runtime_checkable
class Trainer(Protocol):
    """What the experiment driver needs from a training loop.

    Attributes
    ----------
    framework : str
        ``"keras"``, ``"torch"`` or any label (recorded in the results).
    checkpoint_suffix : str
        File name ending of its checkpoints (``".weights.h5"``, ``".keras"``, ``".h5"``).
    """

    framework: str
    checkpoint_suffix: str

    def build(self) -> None:
        """Create the model and optimizer in their initial state (seeded)."""

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """Train epoch ``epoch`` (1-based); return training metrics, at least ``loss``.

        Optionally ``train_accuracy`` too (checked against golden's like the validation
        accuracy). A trainer that accepts ``train_epoch(epoch, start=0, stop=None)``
        (batches ``start`` to ``stop`` of the epoch, 0-based, in the epoch's fixed order)
        supports injection at an iteration (``at: {epoch: E, iteration: I}``); an
        ``iterations_per_epoch`` attribute lets the driver check ``I`` up front.
        """

    def evaluate(self) -> dict[str, float]:
        """Evaluate on held-out data; return at least ``accuracy`` (and ``val_loss``)."""

    def save_checkpoint(self, path: Path) -> None:
        """Write the whole training state (model and optimizer) to the HDF5 file ``path``."""

    def load_checkpoint(self, path: Path) -> None:
        """Restore the whole training state from ``path``; raise on a checkpoint of another model."""


def load_user_module(path: str | os.PathLike) -> ModuleType:
    """Import a user's Python file (``examples/keras_model.py``) as a module.

    >>> load_user_module("/no/such/file.py")
    Traceback (most recent call last):
    ...
    fastflip.errors.InputFileError: /no/such/file.py: model file not found
    """
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"{p}: model file not found")
    name = f"fastflip_user_{abs(hash(str(p.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise InputFileError(f"{p}: cannot be imported as a Python module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception:
        del sys.modules[name]
        raise
    return mod


def user_callable(module: ModuleType, name: str, required: bool = True) -> Any:
    """The function ``name`` of a user module (``None`` when optional and absent)."""
    fn = getattr(module, name, None)
    if fn is None and required:
        raise OptionError(f"{getattr(module, '__file__', module)}: the model file must define {name}()")
    if fn is not None and not callable(fn):
        raise OptionError(f"{module.__file__}: {name} must be a function")
    return fn
