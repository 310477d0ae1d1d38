"""Trainers: the protocol an experiment drives, built-in Keras and PyTorch trainers, and a Keras callback.

Layer: ``frameworks`` (may import live and below; imported by campaign, experiment and above).

:func:`make_trainer` turns the ``trainer`` section of an experiment configuration
into a trainer:

- ``{"framework": "keras"}`` / ``{"framework": "torch"}``: the built-in digits CNN;
- ``{"framework": "keras", "model_file": "my_model.py"}``: the file defines
  ``build_model()`` and ``load_data()`` (PyTorch files may add
  ``build_optimizer(model)`` and ``loss_fn(logits, targets)``);
- ``{"framework": "custom", "model_file": "my_trainer.py"}``: the file defines
  ``make_trainer(seed, **options)`` returning any object that follows
  :class:`~fastflip.frameworks.trainers.protocol.Trainer`.

Other keys (``batch_size``, ``checkpoint_format``, ...) are passed to the trainer.

Examples
--------
>>> t = make_trainer({"framework": "torch", "batch_size": 64}, seed=3)
>>> type(t).__name__, t.batch_size, t.seed, t.checkpoint_suffix
('TorchTrainer', 64, 3, '.h5')
"""

from __future__ import annotations

from typing import Any, Mapping

from ...errors import OptionError
from .keras_trainer import KerasTrainer, import_keras
from .protocol import Trainer, load_user_module, user_callable
from .torch_trainer import TorchTrainer

__all__ = ["Trainer", "make_trainer", "load_user_module"]

FRAMEWORKS = ("keras", "torch", "custom")


def make_trainer(spec: Mapping[str, Any], seed: int = 0, base_dir: str | None = None) -> Trainer:
    """Build the trainer described by an experiment's ``trainer`` section.

    ``model_file`` is resolved against ``base_dir`` (the configuration file's folder).
    """
    import os

    opts = dict(spec)
    framework = str(opts.pop("framework", "keras")).lower()
    if framework not in FRAMEWORKS:
        raise OptionError(f"trainer.framework: {framework!r}; use one of {', '.join(FRAMEWORKS)}")
    model_file = opts.pop("model_file", None)
    if framework == "keras":  # quiet, deterministic TensorFlow before a user file imports Keras

        import_keras(opts.get("threads", 1))
    if model_file and base_dir and not os.path.isabs(model_file):
        model_file = os.path.join(base_dir, model_file)
    mod = load_user_module(model_file) if model_file else None
    if framework == "custom":
        if mod is None:
            raise OptionError("trainer.model_file: a custom trainer needs a file defining make_trainer()")
        trainer = user_callable(mod, "make_trainer")(seed=seed, **opts)
        if not isinstance(trainer, Trainer):
            raise OptionError(f"{model_file}: make_trainer() returned an object without the Trainer methods")
        return trainer
    if framework == "keras":
        if mod is None:
            return KerasTrainer(seed=seed, **opts)
        return KerasTrainer(user_callable(mod, "build_model"), user_callable(mod, "load_data"), seed=seed, **opts)

    if mod is None:
        return TorchTrainer(seed=seed, **opts)
    return TorchTrainer(
        user_callable(mod, "build_model"),
        user_callable(mod, "load_data"),
        user_callable(mod, "build_optimizer", required=False),
        user_callable(mod, "loss_fn", required=False),
        seed=seed,
        **opts,
    )
