"""Campaign evaluators: the ``[evaluator]`` table made into ``f(model or checkpoint path) -> result``.

A user function (``module:function``), the built-in classification / regression judgements on
``[evaluator] data``, or a shell command that prints a metric. :func:`import_object` imports the
user's ``module:attribute`` specs (target factories too).

Imports: :mod:`fastflip.errors`, :mod:`fastflip.campaign.config` and :mod:`fastflip.campaign.outcomes`
(frameworks lazily, to run a model). Imported by :mod:`fastflip.campaign.cells` and
:mod:`fastflip.campaign.trials`.

>>> classification_answer(np.array([[2.0, 1.0], [0.5, 0.7]]), np.array([0, 1])).predictions.tolist()
[0, 1]
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import OptionError
from .config import Campaign
from .outcomes import Answer

__all__ = ["classification_answer", "make_evaluator", "import_object"]


def import_object(spec: str, paths: Sequence[str] = ()) -> Any:
    """Import ``module:attribute`` (``paths`` are put on ``sys.path`` first)."""
    for p in paths:
        if p not in sys.path:
            sys.path.insert(0, p)
    modname, _, attr = spec.partition(":")
    if not modname or not attr:
        raise OptionError(f"{spec!r}: expected 'module:function'")
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:
        raise OptionError(f"cannot import module {modname!r} for {spec!r}: {exc}") from exc
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise OptionError(f"module {modname!r} has no attribute {attr!r}") from None
    return obj


def _predict(model: Any, x: Any) -> np.ndarray:
    # the framework of the model's class or of a base class (user models subclass nn.Module / keras.Model)
    mods = [c.__module__ for c in type(model).__mro__]
    mod = next((m for m in mods if m.startswith(("torch", "keras", "tensorflow", "tf_keras"))), mods[0])
    if mod.startswith("torch"):
        import torch

        first = next(iter(list(model.parameters()) + list(model.buffers())), None)
        with torch.no_grad():  # the inputs go where the model lives (a CUDA model stays on its GPU)
            xt = torch.as_tensor(x) if first is None else torch.as_tensor(x).to(first.device)
            return model(xt).detach().cpu().numpy()
    if mod.startswith(("keras", "tensorflow", "tf_keras")):
        return np.asarray(model(x, training=False))
    if callable(model):
        return np.asarray(model(x))
    raise OptionError(f"builtin accuracy: cannot run a {type(model).__name__}; give [evaluator] function instead")


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Per input, its predicted class (k = 1) or its set of k best classes (sorted, so sets compare)."""
    scores = np.asarray(scores)
    if scores.ndim < 2:
        raise OptionError(f"builtin classification: the model's outputs have shape {scores.shape}; "
                          "expected (inputs, classes) scores")
    if k == 1:
        return np.argmax(scores, axis=-1)
    if k > scores.shape[-1]:
        raise OptionError(f"[evaluator] top_k = {k} exceeds the {scores.shape[-1]} classes of the model's outputs")
    return np.sort(np.argsort(-scores, axis=-1, kind="stable")[..., :k], axis=-1)


def classification_answer(scores: Any, y: np.ndarray, k: int = 1) -> Answer:
    """The built-in classifier judgement of outputs ``scores`` on labels ``y``.

    Predictions are the top-1 class (or, with ``k > 1``, the set of the k best classes);
    the metric is the top-k accuracy.

    >>> a = classification_answer(np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([1, 1]))
    >>> a.predictions.tolist(), a.metric
    ([1, 0], 0.5)
    """
    scores = np.asarray(scores)
    pred = _top_k(scores, k)
    hit = pred == y if k == 1 else (pred == np.asarray(y)[..., None]).any(axis=-1)
    return Answer(scores, pred, float(np.mean(hit)))


def make_evaluator(campaign: Campaign) -> Callable[[Any], Any]:
    """The campaign's evaluator as ``f(model or checkpoint path) -> result``."""
    ev = campaign.evaluator
    paths = [campaign.resolve(p) for p in campaign.paths]
    if ev.function is not None:
        fn = import_object(ev.function, paths)
        if not callable(fn):
            raise OptionError(f"[evaluator] function {ev.function} is not callable")
        return fn
    if ev.builtin is not None:
        assert ev.data is not None
        data = import_object(ev.data, paths)()
        if not (isinstance(data, (tuple, list)) and len(data) == 2):
            raise OptionError(f"[evaluator] data = {ev.data} must return (x, y), got a {type(data).__name__}")
        x, y = data
        y = np.asarray(y)
        if ev.builtin == "classification":
            k = ev.top_k

            def answer(out: Any) -> Answer:
                return classification_answer(out, y, k)
        else:
            def answer(out: Any) -> Answer:
                out = np.asarray(out)
                if out.shape != y.shape and out.size == y.size:
                    out = out.reshape(y.shape)
                return Answer(out, None, float(np.mean((out.astype(np.float64) - y) ** 2)))

        def builtin(model: Any) -> Answer:
            return answer(_predict(model, x))

        # what batched trials need: the inputs of the one forward, and the judgement of its outputs
        builtin.inputs, builtin.answer = x, answer  # type: ignore[attr-defined]
        builtin.__name__ = ev.builtin
        return builtin
    assert ev.command is not None
    command = ev.command

    def run_command(path: str) -> float:
        proc = subprocess.run(command.replace("{checkpoint}", path), shell=True, capture_output=True, text=True,
                              timeout=ev.timeout)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"command exited {proc.returncode}: {tail[0]}")
        lines = proc.stdout.strip().splitlines()
        if not lines:
            raise RuntimeError("command printed no metric")
        return float(lines[-1])

    return run_command
