"""Statistical fault-injection campaigns: definition, trials, executors, results store.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

See :mod:`fastflip.campaign.config` for the campaign file and
:func:`fastflip.campaign.sweep.sweep` for running one.
"""

from __future__ import annotations

from .config import Campaign, CellsSpec, EvaluatorSpec, TargetSpec, TrialsSpec, load_campaign

__all__ = ["Campaign", "CellsSpec", "EvaluatorSpec", "TargetSpec", "TrialsSpec", "load_campaign"]
