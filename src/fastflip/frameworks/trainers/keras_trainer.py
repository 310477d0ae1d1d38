"""The built-in Keras trainer: any compiled Keras 3 model, checkpoints in HDF5.

Layer: ``frameworks`` (may import live and below; imported by campaign, experiment and above).

Checkpoints are Keras 3 ``.weights.h5`` files (model and optimizer variables, the
layout ``layers/<layer>/vars/<i>``, ``optimizer/vars/<i>``) or, with
``checkpoint_format="keras"``, whole ``.keras`` archives. The data order of each
epoch and the Keras random seed are derived from ``(seed, epoch)``, and TensorFlow
op determinism is switched on, so resuming from an unaltered checkpoint
reproduces the uninterrupted run exactly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...errors import OptionError
from ...files.fileio import atomic_output
from ...files.keras_archive import is_keras_archive, read_archive
from ..torch_state import CheckpointMismatchError
from .data import digits

__all__ = ["KerasTrainer", "digits_cnn", "digits_data", "import_keras"]

Data = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def import_keras(threads: int | None = None) -> Any:
    """Import Keras quietly with deterministic TensorFlow ops.

    ``threads`` sets TensorFlow's intra- and inter-op thread pools when TensorFlow
    has not started yet (it cannot change afterwards; then it is left as it is).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
        if threads:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(int(threads))
                tf.config.threading.set_inter_op_parallelism_threads(int(threads))
            except RuntimeError:  # TensorFlow already initialised its pools
                pass
    return keras


def digits_data() -> Data:
    """The digits split as NHWC images (what :func:`digits_cnn` takes)."""
    return digits()


def digits_cnn(learning_rate: float = 3e-3) -> Any:
    """A small CNN for 8x8 digits: conv-BN-pool, conv, dense; Adam; logits out."""
    keras = import_keras()
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
            keras.layers.BatchNormalization(momentum=0.9, name="bn1"),
            keras.layers.MaxPooling2D(2, name="pool1"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(10, name="fc"),
        ],
        name="digits_cnn",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    import h5py

    def walk(p: Path | str) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        with h5py.File(p, "r") as f:
            f.visititems(lambda n, o: out.__setitem__("/" + n, o.shape) if isinstance(o, h5py.Dataset) else None)
        return out

    if is_keras_archive(path):
        with read_archive(path) as inner:
            return walk(inner)
    return walk(path)


class KerasTrainer:
    """Train a compiled Keras model epoch by epoch; save and load HDF5 checkpoints.

    Parameters
    ----------
    build_model : callable
        ``build_model() -> keras.Model``, compiled (optimizer and loss).
    load_data : callable
        ``load_data() -> (x_train, y_train, x_test, y_test)`` (integer labels).
    batch_size : int
    seed : int
        Initial weights, data order and dropout randomness derive from it.
    checkpoint_format : {"weights.h5", "keras"}
        ``.weights.h5`` files (default) or ``.keras`` archives.
    threads : int or None
        TensorFlow thread pools, when TensorFlow has not started yet (default 1:
        small models run faster single-threaded on a shared machine).
    """

    framework = "keras"

    def __init__(
        self,
        build_model: Callable[[], Any] = digits_cnn,
        load_data: Callable[[], Data] = digits_data,
        *,
        batch_size: int = 32,
        seed: int = 0,
        checkpoint_format: str = "weights.h5",
        threads: int | None = 1,
    ) -> None:
        self.threads = threads
        if checkpoint_format not in ("weights.h5", "keras"):
            raise OptionError(f"checkpoint_format: {checkpoint_format!r}; use 'weights.h5' or 'keras'")
        self.build_model, self.load_data = build_model, load_data
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.checkpoint_suffix = "." + checkpoint_format
        self.model: Any = None
        self._data: Data | None = None
        self._template: dict[str, tuple[int, ...]] = {}

    def build(self) -> None:
        keras = import_keras(self.threads)
        keras.utils.set_random_seed(self.seed)
        if self._data is None:
            self._data = tuple(np.asarray(a) for a in self.load_data())  # type: ignore[assignment]
        self.model = self.build_model()
        if getattr(self.model, "optimizer", None) is None:
            raise OptionError("build_model() must return a compiled Keras model (call model.compile)")
        x = self._data[0][:1]
        self.model(x)  # build the layers' variables
        self.model.optimizer.build(self.model.trainable_variables)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="fastflip-keras-") as tmp:
            template = Path(tmp) / f"template{self.checkpoint_suffix}"
            self.save_checkpoint(template)
            self._template = _shapes(template)

    @property
    def chance_level(self) -> float | None:
        """Accuracy of always answering the most frequent test label (None before build)."""
        if self._data is None:
            return None
        counts = np.unique(np.asarray(self._data[3]), return_counts=True)[1]
        return float(counts.max() / counts.sum())

    @property
    def iterations_per_epoch(self) -> int:
        """Batches in one epoch (after :meth:`build`)."""
        assert self._data is not None, "call build() first"
        return -(-len(self._data[1]) // self.batch_size)

    def train_epoch(self, epoch: int, start: int = 0, stop: int | None = None) -> dict[str, float]:
        """Train epoch ``epoch``, or only its batches ``start`` to ``stop`` (0-based, stop excluded).

        Returns the mean training loss (and accuracy, when the model was compiled
        with an ``accuracy`` metric) of the batches trained.
        """
        keras = import_keras()
        assert self._data is not None, "call build() first"
        x, y = self._data[0], self._data[1]
        keras.utils.set_random_seed((self.seed * 1_000_003 + epoch) % 2**31)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(y))
        order = order[start * self.batch_size: None if stop is None else stop * self.batch_size]
        if len(order) == 0:
            raise OptionError(f"epoch {epoch} has {self.iterations_per_epoch} iterations; none left from {start}")
        hist = self.model.fit(x[order], y[order], batch_size=self.batch_size, epochs=1, shuffle=False, verbose=0)
        out = {"loss": float(hist.history["loss"][-1])}
        for k in ("accuracy", "sparse_categorical_accuracy", "acc"):
            if k in hist.history:
                out["train_accuracy"] = float(hist.history[k][-1])
                break
        return out

    def evaluate(self) -> dict[str, float]:
        keras = import_keras()
        assert self._data is not None, "call build() first"
        x, y = self._data[2], self._data[3]
        logits = self.model.predict_on_batch(x) if len(x) <= 4096 else self.model.predict(x, verbose=0)
        logits = np.asarray(keras.ops.convert_to_numpy(logits))
        loss_fn = keras.losses.get(self.model.loss) if isinstance(self.model.loss, str) else self.model.loss
        val_loss = float(keras.ops.convert_to_numpy(loss_fn(y, logits))) if loss_fn is not None else float("nan")
        with np.errstate(invalid="ignore"):
            accuracy = float(np.mean(np.argmax(logits, axis=-1) == y))
        return {"val_loss": val_loss, "accuracy": accuracy}

    def save_checkpoint(self, path: Path) -> None:
        path = Path(path)
        if not path.name.endswith(self.checkpoint_suffix):
            raise OptionError(f"{path}: Keras checkpoints of this trainer must end in {self.checkpoint_suffix}")
        with atomic_output(path, suffix=self.checkpoint_suffix) as tmp:
            if self.checkpoint_suffix == ".keras":
                self.model.save(tmp)
            else:
                self.model.save_weights(tmp)

    def load_checkpoint(self, path: Path) -> None:
        path = Path(path)
        got = _shapes(path)
        for name, shape in self._template.items():
            if name in got and tuple(got[name]) != tuple(shape):
                raise CheckpointMismatchError(
                    f"{path}: tensor {name} has shape {tuple(got[name])} but the model expects {tuple(shape)}"
                )
        missing = [n for n in self._template if n not in got]
        if missing:
            raise CheckpointMismatchError(f"{path}: tensor {missing[0]} is missing ({len(missing)} missing)")
        extra = sorted(set(got) - set(self._template))
        if extra:
            raise CheckpointMismatchError(f"{path}: tensor {extra[0]} is not in the model ({len(extra)} unexpected)")
        self.model.load_weights(path)
