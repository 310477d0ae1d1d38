"""Campaign evaluators: the ``[evaluator]`` table made into ``f(model or checkpoint path) -> result``.

A user function (``module:function``), a built-in evaluator on ``[evaluator] data``
(:mod:`fastflip.campaign.builtins`: classification, regression, language-model, generation), or a
shell command that prints a metric. :func:`import_object` imports the
user's ``module:attribute`` specs (target factories too).

Imports: :mod:`fastflip.errors`, :mod:`fastflip.campaign.config` and :mod:`fastflip.campaign.builtins`. Imported by :mod:`fastflip.campaign.cells` and
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
from .builtins import Builtin, classification_answer, load_data

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
        x, y, loader_batch = load_data(import_object(ev.data, paths)(), ev.builtin)
        return Builtin(ev.builtin, x, y, batch_size=ev.batch_size or loader_batch, top_k=ev.top_k,
                       max_new_tokens=ev.max_new_tokens or 8)
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
