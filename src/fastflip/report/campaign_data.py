"""What a campaign report shows, aggregated in SQL from a results store.

Layer: ``report`` (may import experiment and below; imported by cli and the demo).

One query counts trials per (cell, bit position, outcome) inside SQLite; every table
of the report (per bit, per group × bit, per cell) is summed from that small result,
so a store of millions of trials is never loaded row by row into Python.

The bit position of a trial is

* the cell's bit spec when it is one plain position (``"30"``);
* otherwise the single bit of the trial's single site, read from its stored
  ``sites`` text (``"w[3]^b30"``), e.g. in an ``exponent`` or ``all`` cell;
* unknown (the trial counts in its cell but in no per-bit table) when a trial flips
  several sites or several bits of a word.

Outcome classes are the store's (:data:`fastflip.campaign.store.TRIAL_OUTCOMES`, the vocabulary of
:mod:`fastflip.campaign.outcomes`): ``masked``, ``sdc``, ``critical`` (an SDC whose metric dropped
beyond the campaign's threshold) and ``due``. They are exclusive; ``masked_numeric`` is
the part of ``masked`` whose raw outputs changed (the answer did not). The *SDC rate*
counts both SDC classes (``sdc + critical``) and the *failure rate* the classes the
campaign's ``[evaluator] failure`` names (:attr:`CampaignData.failure`; default
``sdc + critical + due``). Count arrays have the columns :data:`COUNT_COLUMNS`.

Cells are split by *condition* (fault model, flips per trial, injection epoch): per-bit
and heatmap tables hold one block per condition, and figures one panel per condition.

Examples
--------
>>> import numpy as np
>>> t = rate_columns(np.array([[90, 8, 1, 1, 30]]))
>>> t["trials"].tolist(), t["sdc_rate"].tolist(), round(float(t["sdc_high"][0]), 4), t["failure"].tolist()
([100], [0.08], 0.15, [10])
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..campaign.summary import group_vulnerability, stratified_rate
from ..errors import StoreError
from ..campaign.outcomes import DEFAULT_FAILURE, MASKED_NUMERIC, failure_count
from ..campaign.store import TRIAL_OUTCOMES, ResultStore
from ..campaign.stats import wilson_half_width, wilson_interval

__all__ = [
    "CampaignData",
    "load_campaign_data",
    "rate_columns",
    "bit_table",
    "heatmap_table",
    "cell_table",
    "margin_table",
    "group_table",
    "RATE_KINDS",
    "COUNT_COLUMNS",
]

#: Columns of every count array: the four exclusive outcomes, then the masked_numeric part of masked.
COUNT_COLUMNS = (*TRIAL_OUTCOMES, MASKED_NUMERIC)
#: Rates the tables carry: the four exclusive outcomes, masked_numeric, SDC of either kind, and failure.
RATE_KINDS = (*TRIAL_OUTCOMES, MASKED_NUMERIC, "sdc_total", "failure")

# The bit position of a trial of a cell whose bit spec is not one plain position: the
# single bit of its single site (see the module docstring); NULL when it has none.
_SITE_BIT_SQL = (
    "CASE WHEN sites IS NULL THEN NULL "
    "WHEN instr(sites, ';') > 0 THEN NULL "
    "WHEN instr(sites, '^b') = 0 THEN NULL "
    "WHEN instr(substr(sites, instr(sites, '^b') + 2), ',') > 0 THEN NULL "
    "ELSE CAST(substr(sites, instr(sites, '^b') + 2) AS INTEGER) END"
)


def _rates_of(counts: np.ndarray, failure: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Numerators per rate kind from an ``(n, 5)`` count array (:data:`COUNT_COLUMNS`)."""
    out = {o: counts[:, i] for i, o in enumerate(COUNT_COLUMNS)}
    out["sdc_total"] = counts[:, 1] + counts[:, 2]
    out["failure"] = failure_count(out, failure)
    return out


def rate_columns(counts: np.ndarray, confidence: float = 0.95,
                 failure: tuple[str, ...] = DEFAULT_FAILURE) -> dict[str, np.ndarray]:
    """Counts, rates and Wilson intervals of every :data:`RATE_KINDS` from ``(n, 5)`` counts.

    Returns columns ``trials``, the counts of :data:`COUNT_COLUMNS` and ``failure``, and
    ``{kind}_rate``, ``{kind}_low``, ``{kind}_high`` for each kind (rate 0 and interval
    (0, 1) where a row has no trial). ``failure`` names the classes that count as failure.
    """
    counts = np.asarray(counts, dtype=np.int64).reshape(-1, len(COUNT_COLUMNS))
    n = counts[:, : len(TRIAL_OUTCOMES)].sum(axis=1)
    cols: dict[str, np.ndarray] = {"trials": n}
    for i, o in enumerate(COUNT_COLUMNS):
        cols[o] = counts[:, i]
    rates = _rates_of(counts, failure)
    cols["failure"] = rates["failure"]
    for kind, k in rates.items():
        lo, hi = wilson_interval(k, n, confidence)
        with np.errstate(invalid="ignore", divide="ignore"):
            cols[f"{kind}_rate"] = np.where(n > 0, k / np.where(n > 0, n, 1), 0.0)
        cols[f"{kind}_low"] = lo
        cols[f"{kind}_high"] = hi
    return cols


@dataclass
class CampaignData:
    """A store's campaign header and its trials aggregated per (cell, bit, outcome).

    ``cells`` is :meth:`fastflip.campaign.store.ResultStore.cell_summary` plus ``condition``;
    ``by_bit`` maps ``(cell_id, bit)`` to its :data:`COUNT_COLUMNS` counts (``bit`` is None
    where a trial has no single bit position); ``failure`` the classes that count as failure.
    """

    path: str
    name: str
    seed: int | None
    config: dict[str, Any]
    config_hash: str
    fastflip_version: str
    schema_version: int
    input_hashes: dict[str, str]
    shard: str | None
    created: float
    cells: list[dict[str, Any]]
    by_bit: dict[tuple[int, int | None], np.ndarray]
    confidence: float = 0.95
    conditions: list[str] = field(default_factory=list)
    failure: tuple[str, ...] = DEFAULT_FAILURE

    @property
    def n_trials(self) -> int:
        return int(sum(c["trials"] for c in self.cells))

    @property
    def n_planned(self) -> int:
        return int(sum(c["planned"] or 0 for c in self.cells))

    @property
    def group_by(self) -> str:
        kinds = {c["group_by"] for c in self.cells}
        return kinds.pop() if len(kinds) == 1 else "group"

    def totals(self) -> dict[str, int]:
        """Trials per outcome over the whole store."""
        return {o: int(sum(c[o] for c in self.cells)) for o in TRIAL_OUTCOMES}


def _condition(cell: dict[str, Any]) -> str:
    parts = [f"fault {cell['fault']}", f"{cell['flips']} flip{'s' if cell['flips'] != 1 else ''}/trial"]
    if cell.get("epoch") is not None:
        parts.append(f"epoch {cell['epoch']}")
    return ", ".join(parts)


def load_campaign_data(path: str | os.PathLike[str], *, confidence: float | None = None) -> CampaignData:
    """Open a results store read-only and aggregate it (see the module docstring).

    Raises :class:`~fastflip.errors.StoreError` for a missing, foreign, corrupt or newer
    store, and for a store that holds no trial yet.
    """
    path = os.fspath(path)
    st = ResultStore.open(path)
    try:
        failure = st.failure
        cells = st.cell_summary(failure)
        if not any(c["trials"] for c in cells):
            raise StoreError(
                f"store {path} holds no trials yet ({len(cells)} cells planned); run 'fastflip sweep' first"
            )
        by_bit: dict[tuple[int, int | None], np.ndarray] = {}
        other: list[int] = []
        for c in cells:  # a plain-position cell: its counts are the cell's (no second scan)
            if str(c["bits"] or "").isdigit():
                if c["trials"]:
                    by_bit[(c["cell_id"], int(c["bits"]))] = np.array([c[o] for o in COUNT_COLUMNS], dtype=np.int64)
            elif c["trials"]:
                other.append(int(c["cell_id"]))
        for start in range(0, len(other), 500):  # the others: read each trial's bit from its sites
            ids = ",".join(str(i) for i in other[start:start + 500])
            q = (f"SELECT cell_id, {_SITE_BIT_SQL} AS bit, outcome, COALESCE(numeric, 0) AS num, COUNT(*) FROM trials "
                 f"WHERE cell_id IN ({ids}) GROUP BY cell_id, bit, outcome, num")
            for cell_id, bit, outcome, num, n in st.conn.execute(q):
                key = (int(cell_id), None if bit is None else int(bit))
                arr = by_bit.get(key)
                if arr is None:
                    arr = by_bit[key] = np.zeros(len(COUNT_COLUMNS), dtype=np.int64)
                arr[int(outcome)] += int(n)
                if int(outcome) == 0 and num:
                    arr[len(TRIAL_OUTCOMES)] += int(n)
        if confidence is None:
            confidence = float((st.config.get("trials") or {}).get("confidence") or 0.95)
        conditions: list[str] = []
        for c in cells:
            c["condition"] = _condition(c)
            if c["condition"] not in conditions:
                conditions.append(c["condition"])
        return CampaignData(
            path=path, name=st.name, seed=st.seed, config=st.config, config_hash=st.config_hash,
            fastflip_version=st.fastflip_version, schema_version=st.schema_version, input_hashes=st.input_hashes,
            shard=st.shard, created=st.created, cells=cells, by_bit=by_bit, confidence=confidence,
            conditions=conditions, failure=failure,
        )
    finally:
        st.close()


def _rows(keys: list[dict[str, Any]], counts: np.ndarray, confidence: float,
          failure: tuple[str, ...] = DEFAULT_FAILURE) -> list[dict[str, Any]]:
    cols = rate_columns(counts, confidence, failure)
    out = []
    for i, k in enumerate(keys):
        row = dict(k)
        for name, col in cols.items():
            v = col[i]
            row[name] = int(v) if col.dtype.kind in "iu" else float(v)
        out.append(row)
    return out


def bit_table(data: CampaignData) -> list[dict[str, Any]]:
    """Per condition and bit position: outcome counts, rates and Wilson intervals (bits ascending)."""
    acc: dict[tuple[str, int], np.ndarray] = {}
    cond = {c["cell_id"]: c["condition"] for c in data.cells}
    for (cell_id, bit), counts in data.by_bit.items():
        if bit is None:
            continue
        key = (cond[cell_id], bit)
        acc[key] = acc.get(key, 0) + counts
    order = sorted(acc, key=lambda k: (data.conditions.index(k[0]), k[1]))
    keys = [{"condition": c, "bit": b} for c, b in order]
    return _rows(keys, np.array([acc[k] for k in order]).reshape(-1, len(COUNT_COLUMNS)), data.confidence, data.failure)


def heatmap_table(data: CampaignData) -> list[dict[str, Any]]:
    """Per condition, group (the cells' ``group_by``: layer, tensor, role) and bit position.

    Groups keep the campaign's order; a campaign without grouping has the single
    group ``(all)``.
    """
    acc: dict[tuple[str, str, int], np.ndarray] = {}
    info = {c["cell_id"]: c for c in data.cells}
    groups: list[str] = []
    for c in data.cells:
        g = c["grp"] if c["grp"] is not None else "(all)"
        if g not in groups:
            groups.append(g)
    for (cell_id, bit), counts in data.by_bit.items():
        if bit is None:
            continue
        c = info[cell_id]
        key = (c["condition"], c["grp"] if c["grp"] is not None else "(all)", bit)
        acc[key] = acc.get(key, 0) + counts
    order = sorted(acc, key=lambda k: (data.conditions.index(k[0]), groups.index(k[1]), k[2]))
    keys = [{"condition": c, "group": g, "bit": b} for c, g, b in order]
    return _rows(keys, np.array([acc[k] for k in order]).reshape(-1, len(COUNT_COLUMNS)), data.confidence, data.failure)


def cell_table(data: CampaignData) -> list[dict[str, Any]]:
    """One row per cell: its columns, trials / planned, outcome counts, rates and intervals."""
    keys = [{k: c[k] for k in ("cell_id", "key", "condition", "bits", "grp", "group_by", "flips", "fault", "epoch",
                               "planned", "population")} for c in data.cells]
    counts = np.array([[c[o] for o in COUNT_COLUMNS] for c in data.cells], dtype=np.int64)
    rows = _rows(keys, counts, data.confidence, data.failure)
    for r, c in zip(rows, data.cells):
        r["mean_metric"] = c["mean_metric"]
        r["mean_delta"] = c["mean_delta"]
        r["mean_changed"] = c["mean_changed"]
        r["sampling"] = c["sampling"]
    return rows


def margin_table(data: CampaignData) -> list[dict[str, Any]]:
    """The statistical margin reached, per condition.

    Per condition: the largest and the median Wilson half-width of the cells' failure
    rates, and the failure rate over all its cells stratified by population (finite-population
    corrected where the cells drew distinct sites: :func:`fastflip.campaign.summary.stratified_rate`)
    with its half-width.
    """
    out = []
    for cond in data.conditions:
        cells = [c for c in data.cells if c["condition"] == cond]
        n = np.array([c["trials"] for c in cells], dtype=np.int64)
        k = np.array([c["failures"] for c in cells], dtype=np.int64)
        hw = wilson_half_width(k, n, data.confidence)
        ran = n > 0
        row: dict[str, Any] = {
            "condition": cond, "cells": len(cells), "cells_with_trials": int(ran.sum()),
            "trials": int(n.sum()), "planned": int(sum(c["planned"] or 0 for c in cells)),
            "max_half_width": float(hw[ran].max()) if ran.any() else math.nan,
            "median_half_width": float(np.median(hw[ran])) if ran.any() else math.nan,
        }
        est = stratified_rate(cells, data.confidence)
        row.update(failure_rate=est["rate"], failure_low=est["low"], failure_high=est["high"],
                   failure_half_width=(est["high"] - est["low"]) / 2 if math.isfinite(est["stderr"]) else math.nan)
        out.append(row)
    return out


def group_table(data: CampaignData) -> list[dict[str, Any]]:
    """Per-layer (tensor, role: the cells' ``group_by``) vulnerability, normalised by the group's share of sites.

    The rows of :func:`fastflip.campaign.summary.group_vulnerability` plus ``condition``:
    ``rate`` (expected failures per flip in the group, with ``low``/``high``), ``share`` of
    the sites, ``relative`` (rate over the condition's) and ``contribution`` (share × rate,
    with its interval). Empty when the campaign has no grouping.
    """
    rows = group_vulnerability(data.cells, data.confidence)
    for r in rows:
        r["condition"] = _condition(r)
    return rows
