"""The sweep's pre-flight: the golden run in the sweep's own process, the batching decision, an empty store undone.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

Before any store or worker exists, :func:`preflight` loads the target and evaluates the fault-free
(golden) run as every worker will, so a model/evaluator mismatch is one line and leaves nothing
behind; :func:`batch_line` decides there how the workers batch trials (and says so); :func:`drop_empty`
removes a store that a failed sweep created but never stored a trial in.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any, Sequence

from ..errors import FastflipError, OptionError
from .cells import Cell
from .config import Campaign
from .trials import TrialRunner

__all__ = ["preflight", "batch_line", "drop_empty"]


def preflight(campaign: Campaign, cells: Sequence[Cell], target: Any = None) -> Any:
    """Load the target and evaluate the fault-free (golden) run in this process, as every worker will: a
    model/evaluator mismatch is one line here, before any store or worker exists. Returns the
    :class:`~fastflip.campaign.trials.TrialRunner` (an in-process sweep runs its trials with it).

    ``target``: the factory's object already built in this process (the runner uses it instead of calling
    the factory again)."""
    try:
        return TrialRunner(campaign, cells, target=target)
    except FastflipError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise OptionError(f"the fault-free (golden) evaluation failed before the sweep started "
                          f"({type(exc).__name__}: {first}); check [evaluator] against the model "
                          "(nothing was created)") from None


def batch_line(runner: Any, workers: int) -> str | None:
    """Decide, in the sweep's process, how the workers batch trials: sets ``[evaluator] batch_trials`` of the
    runner's campaign to the chosen number and returns the line that says it (None: nothing to say)."""
    campaign = runner.campaign
    if campaign.evaluator.builtin is None or campaign.mode != "memory":
        return None
    batcher, why, _ = runner.batch_decision()
    runner._batcher = batcher  # decided once: a serial sweep that adopts this runner does not decide again
    if batcher is None or batcher.path() == "serial":  # the workers run serially without deciding again
        campaign.evaluator.batch_trials = 1
        return f"trials run one at a time (serial): {why if batcher is None else batcher.why}"
    path = batcher.path()
    size = batcher.size(workers)
    campaign.evaluator.batch_trials = size  # the workers use the number chosen here
    measured = f"; {batcher.choice.line()}" if batcher.choice is not None else ""
    if size == 1:
        return f"trials run one at a time (serial): measured no slower than batched{measured}"
    how = ("golden activations cached at each trial's first faulted layer, only the rest runs" if path == "prefix"
           else "full forwards, the faulted modules once per trial")
    return f"batched trials: {size} trials per forward ({path}: {how}{measured})"


def drop_empty(store: str) -> None:
    """Remove a store this sweep created if it holds no trial (with its SQLite side files)."""
    try:
        conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
        try:
            n = conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return
    if n == 0:
        for path in (store, store + "-wal", store + "-shm"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
