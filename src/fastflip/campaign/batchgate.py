"""Whether a runner's trials can batch at all, decided without the batched machinery; workers' one-time notes.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

:func:`serial_reason` holds the checks that need neither torch nor :mod:`fastflip.campaign.batched`
(``batch_trials = 1``, checkpoint mode, a function or command evaluator, a target that is not a PyTorch
module in eval mode): a sweep whose trials run one by one for one of these reasons never imports the
batched modules (:meth:`fastflip.campaign.trials.TrialRunner.batch_decision`). :func:`say_once` writes a
worker's fallback note once per process; :func:`serial_note` is the note of a runner whose trials run one
at a time although batching was asked for.
"""

from __future__ import annotations

import sys
from typing import Any

from ..live.adapters import framework_of

__all__ = ["serial_reason", "serial_note", "say_once"]

_SAID: set[str] = set()


def say_once(text: str) -> None:
    """Write ``fastflip: text`` to stderr once per process (fallback notes of workers)."""
    if text in _SAID:
        return
    _SAID.add(text)
    sys.stderr.write(f"fastflip: {text}\n")
    sys.stderr.flush()


def serial_reason(runner: Any) -> str | None:
    """Why ``runner``'s trials run one by one whatever the model does (None: they may batch; the batched
    machinery decides the rest).

    ``runner``: a :class:`fastflip.campaign.trials.TrialRunner` (its campaign, evaluator and loaded target).
    """
    campaign = runner.campaign
    if campaign.evaluator.batch_trials == 1:
        return "batch_trials = 1"
    if campaign.mode != "memory":
        return "checkpoint mode evaluates files"
    if not hasattr(runner.evaluate, "single_forward"):
        return "a function or command evaluator runs the model itself (only built-in evaluators batch)"
    model = runner.targets.get(None)
    if framework_of(model) != "torch":
        return "the target is not a PyTorch module"
    if model.training:
        return "the model is in training mode (call model.eval() in the factory)"
    return None


def serial_note(runner: Any, why: str | None, failed: bool) -> None:
    """The one-time note of a runner whose trials run one at a time: building the batcher ``failed``, or
    ``[evaluator] batch_trials`` asked for more than one trial per forward (``why``: the reason)."""
    want = runner.campaign.evaluator.batch_trials
    if failed:
        say_once(f"batched trials off: {why}; running trials one at a time")
    elif want not in (None, 1):
        say_once(f"batch_trials = {want} ignored: {why}; running trials one at a time")
