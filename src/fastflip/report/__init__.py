"""Reports people look at: figures (PNG), tables (CSV) and one HTML page per campaign or experiment.

Layer: ``report`` (may import experiment and below; imported by cli and the demo).

``fastflip report STORE_OR_EXPERIMENT -o DIR`` is :func:`write_report`. The same
figures come back as matplotlib figures for notebooks::

    from fastflip import report
    data = report.load_campaign_data("results.db")   # aggregated in SQL
    report.bit_figure(data)                          # outcome rate per bit, Wilson intervals
    report.heatmap_figure(data)                      # bit × layer/tensor/role failure rate, counts, classes
    report.drop_figure(data)                         # metric drop by bit class
    report.outcome_figure(data)                      # outcome breakdown per cell
    exp = report.load_experiment_data("runs/")       # an experiment directory
    report.curve_figure(exp, "accuracy")             # per scenario, against golden

Modules: :mod:`~fastflip.report.campaign_data` (SQL aggregation and tables),
:mod:`~fastflip.report.experiment_data`, :mod:`~fastflip.report.figures`,
:mod:`~fastflip.report.html`, :mod:`~fastflip.report.build`. matplotlib is imported
only when a figure is drawn.

Examples
--------
>>> from fastflip import report
>>> sorted(report.RATE_KINDS)
['critical', 'due', 'failure', 'masked', 'masked_numeric', 'sdc', 'sdc_total']
"""

from __future__ import annotations

from .build import Report, detect_source, write_report
from .campaign_data import (
    RATE_KINDS,
    CampaignData,
    bit_table,
    cell_table,
    group_table,
    heatmap_table,
    load_campaign_data,
    margin_table,
    rate_columns,
)
from .experiment_data import ExperimentData, curve_table, load_experiment_data, summary_table, tests_table
from .figures import (
    bit_figure,
    curve_figure,
    drop_figure,
    group_figure,
    heatmap_figure,
    outcome_figure,
    run_outcome_figure,
    save_png,
)

__all__ = [
    "Report", "write_report", "detect_source",
    "CampaignData", "load_campaign_data", "bit_table", "heatmap_table", "cell_table", "margin_table", "group_table", "rate_columns",
    "RATE_KINDS",
    "ExperimentData", "load_experiment_data", "summary_table", "curve_table", "tests_table",
    "bit_figure", "heatmap_figure", "outcome_figure", "curve_figure", "drop_figure", "group_figure", "run_outcome_figure",
    "save_png",
]
