"""A store's statistics: per-cell rates with Wilson intervals, stratified totals, per-group vulnerability.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

The counts come from one SQL aggregation (:meth:`fastflip.campaign.store.ResultStore.cell_summary`).
A trial *fails* when its class is one of ``[evaluator] failure`` (default ``sdc``,
``critical``, ``due``; the vocabulary is :mod:`fastflip.campaign.outcomes`); rates of each class
(and of the ``masked_numeric`` sub-class of ``masked``) are given as well.

The stratified total is computed per (flips, fault, epoch) over the cells that share them,
with weights ``W_h = N_h / sum N`` from the cells' populations: it estimates the failure
rate of a site drawn uniformly from their union, which is meaningful when those cells
partition the sites (e.g. one cell per bit position, or per layer) and not when their bit
specs overlap. The finite-population correction uses each cell's ``fpc_population`` (its
site count where trials drew distinct single sites, none otherwise): an exhaustive cell
contributes its exact rate with variance 0.

:func:`group_vulnerability` gives, per layer (or tensor, or role: the cells' ``group_by``)
and condition, the failure rate of one flip in that group (*expected failures per flip*)
with its interval, the group's share of the sites, and its share of all failures
(*per layer as a whole*: share × rate, the expected failures per flip anywhere that land in
this group; these add up to the condition's stratified total).

Examples
--------
>>> import os, tempfile
>>> from fastflip.campaign.store import ResultStore, TrialRow
>>> p = os.path.join(tempfile.mkdtemp(), "s.db")
>>> st = ResultStore.create(p, {"name": "d"}, [{"key": "a", "bits": "31", "flips": 1, "fault": "flip",
...     "planned": 4, "population": 100}, {"key": "b", "bits": "0", "flips": 1, "fault": "flip",
...     "planned": 4, "population": 300}])
>>> _ = st.add_trials([TrialRow(0, t, 1, None, int(t < 2), None, None, None, None, None) for t in range(4)]
...                   + [TrialRow(1, t, 1, None, 0, None, None, None, None, None) for t in range(4)])
>>> st.close()
>>> s = summarize(p)
>>> s["cells"][0]["failure_rate"], s["totals"][0]["rate"]
(0.5, 0.125)
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .outcomes import MASKED_NUMERIC, parse_failure
from .stats import stratified_estimate, wilson_interval
from .store import TRIAL_OUTCOMES, ResultStore

__all__ = ["summarize", "format_summary", "group_vulnerability", "stratified_rate"]

_CELL_KEYS = ("cell_id", "key", "bits", "grp", "group_by", "flips", "fault", "epoch", "population", "planned",
              "sampling", "fpc_population")


def stratified_rate(cells: Sequence[dict[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """Failure rate over ``cells`` stratified by population (finite-population corrected per cell).

    The interval is Wilson's with Kish's effective sample size ``p(1-p)/Var`` when several
    cells are pooled (Wilson's own for one cell); it is the point itself when every cell
    was run exhaustively (the rate is then exact).
    """
    ran = [c for c in cells if c["trials"] > 0 and c["population"]]
    if not ran:
        return {"rate": math.nan, "stderr": math.nan, "low": 0.0, "high": 1.0, "trials": 0, "exact": False}
    k = np.array([c["failures"] for c in ran], dtype=np.float64)
    n = np.array([c["trials"] for c in ran], dtype=np.float64)
    est = stratified_estimate(k, n, populations=[c["population"] for c in ran], confidence=confidence,
                              fpc_populations=[c.get("fpc_population") for c in ran])
    exact = all(c.get("sampling") == "exhaustive" for c in ran)
    if exact:
        low = high = est.rate
    elif len(ran) == 1:
        lo, hi = wilson_interval(int(k[0]), int(n[0]), confidence)
        low, high = float(lo), float(hi)
    else:
        p = est.rate
        n_eff = p * (1 - p) / est.variance if est.variance > 0 and 0 < p < 1 else float(n.sum())
        lo, hi = wilson_interval(p * n_eff, n_eff, confidence)
        low, high = float(lo), float(hi)
    return {"rate": est.rate, "stderr": est.stderr, "variance": est.variance, "low": low, "high": high,
            "trials": int(n.sum()), "cells": len(ran), "exact": exact}


def _conditions(cells: Sequence[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["flips"], c["fault"], c["epoch"]), []).append(c)
    return groups


def group_vulnerability(cells: Sequence[dict[str, Any]], confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per condition (flips, fault, epoch) and group (the cells' ``group_by`` value): vulnerability.

    ``cells`` are :func:`summarize` cells (or :meth:`~fastflip.campaign.store.ResultStore.cell_summary`
    rows). Columns: ``group_by``, ``group``, the condition, ``sites`` (the group's population),
    ``share`` (of the condition's sites), ``trials``, ``failures``, ``rate`` with ``low``/``high``
    (expected failures per flip in the group), ``relative`` (rate over the condition's rate),
    ``contribution`` with ``contribution_low``/``contribution_high`` (share × rate: expected
    failures per flip anywhere, landing in this group) and ``exact`` (every cell exhaustive).
    Empty when the campaign has no grouping.

    >>> cells = [{"grp": g, "group_by": "layer", "flips": 1, "fault": "flip", "epoch": None, "population": N,
    ...           "trials": 100, "failures": k, "sampling": "permutation", "fpc_population": N}
    ...          for g, N, k in (("conv", 300, 10), ("dense", 700, 40))]
    >>> [(r["group"], r["share"], r["rate"], round(r["contribution"], 3)) for r in group_vulnerability(cells)]
    [('conv', 0.3, 0.1, 0.03), ('dense', 0.7, 0.4, 0.28)]
    """
    out = []
    for (flips, fault, epoch), members in _conditions(cells).items():
        if all(c.get("group_by", "none") == "none" for c in members):
            continue
        total_sites = sum(c["population"] or 0 for c in members)
        overall = stratified_rate(members, confidence)
        groups: dict[Any, list[dict[str, Any]]] = {}
        for c in members:
            groups.setdefault(c["grp"], []).append(c)
        for g, gc in groups.items():
            r = stratified_rate(gc, confidence)
            sites = sum(c["population"] or 0 for c in gc)
            share = sites / total_sites if total_sites else math.nan
            rel = r["rate"] / overall["rate"] if overall["rate"] and math.isfinite(overall["rate"]) else math.nan
            out.append({
                "group_by": gc[0].get("group_by"), "group": g, "flips": flips, "fault": fault, "epoch": epoch,
                "sites": sites, "share": share, "trials": r["trials"], "failures": int(sum(c["failures"] for c in gc)),
                "rate": r["rate"], "low": r["low"], "high": r["high"], "relative": rel,
                "contribution": share * r["rate"], "contribution_low": share * r["low"],
                "contribution_high": share * r["high"], "exact": r["exact"],
            })
    return out


def summarize(store: str | ResultStore, *, confidence: float = 0.95,
              failure: Sequence[str] | None = None) -> dict[str, Any]:
    """Per-cell counts, rates and Wilson intervals, stratified totals and per-group vulnerability.

    ``failure`` overrides the campaign's ``[evaluator] failure`` classes.
    """
    st = ResultStore.open(store) if isinstance(store, str) else store
    try:
        failure = st.failure if failure is None else parse_failure(failure)
        rows = st.cell_summary(failure)
        name = st.name
    finally:
        if isinstance(store, str):
            st.close()
    cells = []
    for r in rows:
        n = int(r["trials"])
        fail = int(r["failures"])
        cell = {k: r.get(k) for k in _CELL_KEYS}
        cell.update(trials=n, failures=fail, failure_rate=fail / n if n else None, mean_delta=r["mean_delta"],
                    mean_changed=r["mean_changed"])
        if cell["sampling"] == "exhaustive" and n >= (cell["population"] or 0):
            cell["failure_low"] = cell["failure_high"] = cell["failure_rate"]
        else:
            lo, hi = wilson_interval(fail, n, confidence)
            cell["failure_low"], cell["failure_high"] = float(lo), float(hi)
        for o in (*TRIAL_OUTCOMES, MASKED_NUMERIC):
            olo, ohi = wilson_interval(r[o], n, confidence)
            cell[o] = r[o]
            cell[f"{o}_rate"] = r[o] / n if n else None
            cell[f"{o}_low"], cell[f"{o}_high"] = float(olo), float(ohi)
        cells.append(cell)
    totals = []
    for (flips, fault, epoch), members in _conditions(cells).items():
        ran = [c for c in members if c["trials"] > 0 and c["population"]]
        if not ran:
            continue
        r = stratified_rate(ran, confidence)
        totals.append({"flips": flips, "fault": fault, "epoch": epoch, "cells": len(ran), "trials": r["trials"],
                       "rate": r["rate"], "variance": r["variance"], "stderr": r["stderr"], "low": r["low"],
                       "high": r["high"], "exact": r["exact"]})
    return {"campaign": name, "confidence": confidence, "failure": list(failure), "cells": cells, "totals": totals,
            "groups": group_vulnerability(cells, confidence)}


def format_summary(summary: dict[str, Any]) -> str:
    """A plain-text table of :func:`summarize`'s result."""
    cells = summary["cells"]
    width = max([len(c["key"]) for c in cells] + [4])
    pct = int(round(summary["confidence"] * 100))
    lines = [f"campaign {summary['campaign']}: failure = {' + '.join(summary['failure'])}; {pct}% Wilson intervals "
             "(masked counts masked_numeric too: answer unchanged, outputs changed)",
             f"{'cell'.ljust(width)}  {'trials':>8}  {'masked':>7}  {'numeric':>7}  {'sdc':>7}  {'crit':>7}  {'due':>7}  "
             f"{'failure rate':>12}  interval"]
    for c in cells:
        rate = "-" if c["failure_rate"] is None else f"{c['failure_rate']:.4f}"
        tag = "  exhaustive (exact)" if c["sampling"] == "exhaustive" and c["trials"] >= (c["population"] or 0) else ""
        lines.append(f"{c['key'].ljust(width)}  {c['trials']:>8}  {c['masked']:>7}  {c[MASKED_NUMERIC]:>7}  "
                     f"{c['sdc']:>7}  {c['critical']:>7}  {c['due']:>7}  {rate:>12}  "
                     f"[{c['failure_low']:.4f}, {c['failure_high']:.4f}]{tag}")
    for t in summary["totals"]:
        what = f"flips={t['flips']} fault={t['fault']}" + (f" epoch={t['epoch']}" if t["epoch"] is not None else "")
        lines.append(f"stratified total ({what}, {t['cells']} cells, {t['trials']} trials): "
                     f"{t['rate']:.4f} ± {t['stderr']:.4f} (se), interval [{t['low']:.4f}, {t['high']:.4f}]"
                     + (" (exact: every cell exhaustive)" if t["exact"] else ""))
    groups = summary.get("groups") or []
    if groups:
        gw = max(len(str(g["group"])) for g in groups)
        lines.append(f"vulnerability per {groups[0]['group_by']}: rate = expected failures per flip in it; "
                     "contribution = share of sites x rate (failures per flip anywhere, landing in it)")
        lines.append(f"{'group'.ljust(gw)}  {'condition':<18}  {'share':>7}  {'trials':>7}  {'rate':>7}  "
                     f"{'interval':<17}  {'relative':>8}  {'contribution':>12}  interval")
        for g in groups:
            cond = f"flips={g['flips']} {g['fault']}" + (f" e{g['epoch']}" if g["epoch"] is not None else "")
            lines.append(f"{str(g['group']).ljust(gw)}  {cond:<18}  {g['share']:>7.4f}  {g['trials']:>7}  "
                         f"{g['rate']:>7.4f}  [{g['low']:.4f}, {g['high']:.4f}]  {g['relative']:>8.3f}  "
                         f"{g['contribution']:>12.5f}  [{g['contribution_low']:.5f}, {g['contribution_high']:.5f}]")
    return "\n".join(lines)
