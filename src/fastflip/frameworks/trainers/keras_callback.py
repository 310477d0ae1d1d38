"""A Keras callback that checkpoints every epoch and, at epoch E, injects into that checkpoint and reloads it.

Layer: ``frameworks`` (may import live and below; imported by campaign, experiment and above).

This is the checkpoint-alteration method inside an ordinary ``model.fit``::

    from fastflip.frameworks.trainers.keras_callback import FaultInjectionCallback
    cb = FaultInjectionCallback("ckpt/e{epoch:03d}.weights.h5", inject_epoch=2, seed=7,
                                count=10, bits="exponent-msb", selection={"roles": ["weight"]})
    model.fit(x, y, epochs=5, callbacks=[cb])
    cb.result.log.records()[:3]      # what was flipped

After epoch ``inject_epoch`` (1-based) the callback saves the checkpoint, writes an
altered copy beside it (``e002.injected.weights.h5``, log ``...fflog``), and loads
the altered copy into the model (optimizer variables included), so training goes on
from the faulty state. The clean checkpoints are kept.

With ``inject_iteration=I`` it injects inside epoch ``inject_epoch`` instead, after its
``I``-th batch: the state there is saved as ``e002-i000010.weights.h5`` (the epoch's
checkpoint name with ``-i`` and the iteration), altered and reloaded the same way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import OptionError
from ...files.fileio import atomic_output
from ...files.inject import inject_checkpoint_file
from .keras_trainer import import_keras

__all__ = ["FaultInjectionCallback", "injected_name", "iteration_name"]


def iteration_name(path: str | os.PathLike, iteration: int) -> Path:
    """The mid-epoch checkpoint's name: ``e002.weights.h5`` -> ``e002-i000010.weights.h5``.

    >>> iteration_name("ck/e002.weights.h5", 10).name
    'e002-i000010.weights.h5'
    """
    p = Path(path)
    for suffix in (".weights.h5", ".keras"):
        if p.name.endswith(suffix):
            return p.with_name(f"{p.name[: -len(suffix)]}-i{int(iteration):06d}{suffix}")
    return p.with_name(f"{p.name}-i{int(iteration):06d}")


def injected_name(path: str | os.PathLike) -> Path:
    """The altered copy's name: ``e002.weights.h5`` -> ``e002.injected.weights.h5``.

    >>> injected_name("ck/e002.weights.h5").name, injected_name("m.keras").name
    ('e002.injected.weights.h5', 'm.injected.keras')
    """
    p = Path(path)
    for suffix in (".weights.h5", ".keras", ".h5"):
        if p.name.endswith(suffix):
            return p.with_name(p.name[: -len(suffix)] + ".injected" + suffix)
    return p.with_name(p.name + ".injected")


_CLASS: Any = None


def _callback_class() -> Any:
    global _CLASS
    if _CLASS is not None:
        return _CLASS

    keras = import_keras()

    class _FaultInjectionCallback(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def __init__(self, filepath: str, inject_epoch: int, *, seed: int, log_path: str | None = None,
                     reload: bool = True, inject_iteration: int | None = None, **inject_kwargs: Any) -> None:
            super().__init__()
            name = str(filepath)
            if not name.endswith((".weights.h5", ".keras")):
                raise OptionError(f"{filepath}: checkpoint names must end in .weights.h5 or .keras")
            if int(inject_epoch) < 1:
                raise OptionError(f"inject_epoch: {inject_epoch}; epochs count from 1")
            self.filepath, self.inject_epoch, self.seed = name, int(inject_epoch), int(seed)
            self.log_path, self.reload, self.inject_kwargs = log_path, reload, inject_kwargs
            if inject_iteration is not None and int(inject_iteration) < 1:
                raise OptionError(f"inject_iteration: {inject_iteration}; give the number of batches (>= 1) "
                                  "of the epoch to run before injecting")
            self.inject_iteration = None if inject_iteration is None else int(inject_iteration)
            self.result: Any = None
            self.injected_path: Path | None = None
            self._epoch = 0

        def checkpoint_path(self, epoch: int) -> Path:
            return Path(self.filepath.format(epoch=epoch))

        def _save(self, path: Path) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            suffix = ".keras" if path.name.endswith(".keras") else ".weights.h5"
            with atomic_output(path, suffix=suffix) as tmp:
                if suffix == ".keras":
                    self.model.save(tmp)
                else:
                    self.model.save_weights(tmp)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._epoch = epoch + 1

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self.inject_iteration is None or self._epoch != self.inject_epoch or batch + 1 != self.inject_iteration:
                return
            path = iteration_name(self.checkpoint_path(self._epoch), self.inject_iteration)
            self._save(path)
            self._inject(path)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            e = epoch + 1
            path = self.checkpoint_path(e)
            self._save(path)
            if e != self.inject_epoch or self.inject_iteration is not None:
                return
            self._inject(path)

        def _inject(self, path: Path) -> None:
            dst = injected_name(path)
            log = self.log_path or str(dst) + ".fflog"
            self.result = inject_checkpoint_file(path, dst, seed=self.seed, log_path=log, **self.inject_kwargs)
            self.injected_path = dst
            if self.reload:
                self.model.load_weights(dst)

    _CLASS = _FaultInjectionCallback
    return _CLASS


def FaultInjectionCallback(filepath: str | os.PathLike, inject_epoch: int, *, seed: int,
                           log_path: str | None = None, reload: bool = True, inject_iteration: int | None = None,
                           **inject_kwargs: Any) -> Any:
    """Make the callback (a ``keras.callbacks.Callback``; Keras is imported on first use).

    Parameters
    ----------
    filepath : str
        Checkpoint name pattern with ``{epoch}`` (1-based), ending in ``.weights.h5`` or ``.keras``.
    inject_epoch : int
        The epoch (1-based) after which to inject.
    seed : int
        Injection seed (recorded in the log).
    log_path : str, optional
        Where to write the injection log (default: beside the altered copy).
    reload : bool
        Load the altered checkpoint into the model (default) or only write it.
    inject_iteration : int, optional
        Inject inside epoch ``inject_epoch``, after this many of its batches (1-based).
    **inject_kwargs
        :func:`fastflip.files.inject.inject_file` options: ``count``/``rate``/``ber``, ``bits``,
        ``model``, ``selection``, ``nan_policy``, ...
    """
    return _callback_class()(str(filepath), inject_epoch, seed=seed, log_path=log_path, reload=reload,
                             inject_iteration=inject_iteration, **inject_kwargs)
