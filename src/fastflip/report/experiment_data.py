"""What an experiment report shows, read from an experiment's output directory.

Layer: ``report`` (may import experiment and below; imported by cli and the demo).

The directory is the one :func:`fastflip.experiment.runner.run_experiment` writes:
``experiment.json`` (configuration, seeds, fastflip version, status),
``golden/metrics.csv`` (the fault-free run per epoch), ``results.csv`` (one row per
faulty run) and ``curves.csv`` (every run's metrics per epoch from its injection on).

Examples
--------
>>> is_experiment_dir(".")
False
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..campaign.significance import pairwise_tests
from ..campaign.store import _version_tuple
from ..errors import InputFileError, StoreError
from ..experiment.outcomes import RUN_OUTCOMES, check_failure, read_csv, summarize
from ..files.filebytes import sha256_file

__all__ = ["ExperimentData", "is_experiment_dir", "load_experiment_data", "summary_table", "curve_table", "tests_table",
           "failure_classes"]

_REQUIRED = ("experiment.json", "results.csv", "curves.csv", "golden/metrics.csv")


def is_experiment_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory holding an ``experiment.json``."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "experiment.json"))


@dataclass
class ExperimentData:
    """An experiment's metadata, golden curve, faulty runs and their curves.

    ``scenarios`` lists ``{name, epoch, control, repetitions}`` in configuration order;
    ``golden`` and ``curves`` rows are those of ``golden/metrics.csv`` and ``curves.csv``.
    """

    path: str
    meta: dict[str, Any]
    scenarios: list[dict[str, Any]]
    golden: list[dict[str, Any]]
    results: list[dict[str, Any]]
    curves: list[dict[str, Any]]
    input_hashes: dict[str, str]

    @property
    def name(self) -> str:
        return str((self.meta.get("config") or {}).get("name") or os.path.basename(os.path.abspath(self.path)))

    @property
    def seed(self) -> Any:
        return self.meta.get("seed")

    @property
    def fastflip_version(self) -> str:
        return str(self.meta.get("fastflip_version") or "?")


def load_experiment_data(path: str | os.PathLike[str], *, hash_inputs: bool = True) -> ExperimentData:
    """Read an experiment directory (see the module docstring).

    Raises :class:`~fastflip.errors.InputFileError` when a file is missing or damaged,
    or when the experiment has no finished run yet, and
    :class:`~fastflip.errors.StoreError` when a newer fastflip wrote it.
    ``hash_inputs`` adds the SHA-256 of the golden checkpoints the scenarios inject into.
    """
    root = Path(path)
    for name in _REQUIRED:
        if not (root / name).is_file():
            raise InputFileError(f"{root}: not a finished experiment directory ({name} is missing)")
    try:
        meta = json.loads((root / "experiment.json").read_text())
    except (OSError, ValueError) as exc:
        raise InputFileError(f"{root / 'experiment.json'}: unreadable ({exc})") from exc
    if not isinstance(meta, dict):
        raise InputFileError(f"{root / 'experiment.json'}: not an experiment description")
    wrote = str(meta.get("fastflip_version") or "0")
    if _version_tuple(wrote) > _version_tuple(__version__):
        raise StoreError(f"experiment {root} was written by fastflip {wrote}, newer than this {__version__}; upgrade fastflip")
    try:
        golden = read_csv(root / "golden" / "metrics.csv")
        results = read_csv(root / "results.csv")
        curves = read_csv(root / "curves.csv")
    except (OSError, ValueError, KeyError) as exc:
        raise InputFileError(f"{root}: damaged experiment tables ({exc})") from exc
    if not results:
        raise InputFileError(f"experiment {root} holds no finished run yet; run 'fastflip experiment' first")
    scenarios = []
    for s in (meta.get("config") or {}).get("scenarios") or []:
        scenarios.append({"name": str(s["name"]), "epoch": int(s["epoch"]), "control": bool(s.get("control")),
                          "repetitions": s.get("repetitions")})
    known = {s["name"] for s in scenarios}
    for r in results:  # scenarios the configuration no longer names still get a panel
        if str(r["scenario"]) not in known:
            known.add(str(r["scenario"]))
            scenarios.append({"name": str(r["scenario"]), "epoch": int(r["epoch"]), "control": False,
                              "repetitions": None})
    hashes: dict[str, str] = {}
    if hash_inputs:
        suffix = str(meta.get("checkpoint_suffix") or ".h5")
        for e in sorted({s["epoch"] for s in scenarios}):
            p = root / "golden" / f"ckpt-e{e:03d}{suffix}"
            if p.is_file():
                hashes[f"golden/{p.name}"] = sha256_file(str(p))
    return ExperimentData(str(root), meta, scenarios, golden, results, curves, hashes)


def _num(v: Any) -> float | None:
    """A stored number as a float (NaN and Inf kept); None where nothing was recorded."""
    if v is None or v == "":
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def failure_classes(data: ExperimentData) -> tuple[str, ...]:
    """The outcome classes the experiment counts as failure (its configuration's ``failure``)."""
    return check_failure((data.meta.get("config") or {}).get("failure"))


def summary_table(data: ExperimentData) -> list[dict[str, Any]]:
    """Per scenario: runs, each outcome's count, rate and Wilson interval, failures, accuracies.

    The same numbers as :func:`fastflip.experiment.outcomes.summarize` over ``results.csv``
    with the experiment's failure classes.
    """
    rows = summarize(data.results, failure=failure_classes(data))
    order = [s["name"] for s in data.scenarios]
    rows.sort(key=lambda r: order.index(str(r["scenario"])) if str(r["scenario"]) in order else len(order))
    return rows


def tests_table(data: ExperimentData) -> list[dict[str, Any]]:
    """Fisher's exact tests of the failure rate between scenarios, Holm-corrected.

    The configuration's ``compare`` pairs, else every pair of non-control scenarios
    with runs (:func:`fastflip.campaign.significance.pairwise_tests`).
    """
    cfg = data.meta.get("config") or {}
    wanted = cfg.get("compare")
    control = {s["name"] for s in data.scenarios if s["control"]}
    groups = {str(r["scenario"]): (int(r["failures"]), int(r["runs"])) for r in summary_table(data)
              if wanted or r["scenario"] not in control}
    if wanted:
        for s in data.scenarios:
            groups.setdefault(s["name"], (0, 0))
    return pairwise_tests(groups, [tuple(p) for p in wanted] if wanted else None, what="scenario")


def curve_table(data: ExperimentData) -> list[dict[str, Any]]:
    """Every plotted point: scenario, rep, outcome, epoch, accuracy, losses and golden's at that epoch.

    Golden rows come first (``scenario`` = ``golden``), then each run from its
    injection epoch on; ``accuracy_delta`` is the run's accuracy minus golden's.
    """
    gold = {int(r["epoch"]): r for r in data.golden}
    out = []
    for r in data.golden:
        out.append({"scenario": "golden", "rep": None, "outcome": None, "epoch": int(r["epoch"]),
                    "phase": r.get("phase"), "accuracy": _num(r.get("accuracy")), "val_loss": _num(r.get("val_loss")),
                    "loss": _num(r.get("loss")), "golden_accuracy": _num(r.get("accuracy")), "accuracy_delta": 0.0})
    for r in data.curves:
        if r.get("scenario") == "golden":
            continue
        e = int(r["epoch"])
        g = _num(gold[e].get("accuracy")) if e in gold else None
        acc = _num(r.get("accuracy"))
        out.append({"scenario": str(r["scenario"]), "rep": r.get("rep"), "outcome": r.get("outcome"), "epoch": e,
                    "phase": r.get("phase"), "accuracy": acc, "val_loss": _num(r.get("val_loss")),
                    "loss": _num(r.get("loss")), "golden_accuracy": g,
                    "accuracy_delta": None if acc is None or g is None else acc - g})
    return out


#: Outcome classes of experiment runs, in the order the report lists them.
EXPERIMENT_OUTCOMES = RUN_OUTCOMES
