"""Experiment layer: training-time fault-injection experiments (checkpoint alteration scenarios).

:mod:`~fastflip.experiment.config` reads the experiment file, :mod:`~fastflip.experiment.runner` runs the
scenarios and :mod:`~fastflip.experiment.outcomes` labels and summarises their outcomes. The runner's
public names are re-exported here: ``from fastflip.experiment import run_experiment``.

Imports: every layer below (``core`` up to ``frameworks``) and the statistics of :mod:`fastflip.campaign`
(:mod:`~fastflip.campaign.stats`, :mod:`~fastflip.campaign.significance`, :mod:`~fastflip.campaign.store`).
Imported by ``report``, ``cli`` and :mod:`fastflip.demo`.
"""

from .runner import ExperimentResult, golden_checkpoint, golden_mid_checkpoint, inject_checkpoint, run_experiment

__all__ = ["ExperimentResult", "run_experiment", "inject_checkpoint", "golden_checkpoint", "golden_mid_checkpoint"]
