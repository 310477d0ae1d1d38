"""Evaluators for the lifeline tests (imported by worker processes through `paths`)."""

from __future__ import annotations

import time

import campaign_helpers


def slow_file(path):
    """Checkpoint mode, slowly (so that a kill lands while workers hold working copies)."""
    time.sleep(0.01)
    return campaign_helpers.evaluate_file(path)


def nan_file(path):
    """A broken evaluator: the fault-free run already gives NaN (the sweep must stop with an error)."""
    return float("nan")
