"""A store's statistics: per-cell rates with Wilson intervals and stratified totals.

The counts come from one SQL aggregation (:meth:`fastflip.store.ResultStore.cell_summary`).
A trial *fails* when its outcome is not ``masked`` (SDC, critical SDC or DUE); rates of
each outcome are given as well. The stratified total is computed per (flips, fault,
epoch) over the cells that share them, with weights ``W_h = N_h / sum N`` from the
cells' populations: it estimates the failure rate of a site drawn uniformly from their
union, which is meaningful when those cells partition the sites (e.g. one cell per bit
position, or per layer) and not when their bit specs overlap.

Examples
--------
>>> import os, tempfile
>>> from fastflip.store import ResultStore, TrialRow
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

from typing import Any

from ..stats import stratified_estimate, wilson_interval
from ..store import OUTCOMES, ResultStore

__all__ = ["summarize", "format_summary"]


def summarize(store: str | ResultStore, *, confidence: float = 0.95) -> dict[str, Any]:
    """Per-cell counts, rates and Wilson intervals, and stratified failure-rate totals."""
    st = ResultStore.open(store) if isinstance(store, str) else store
    try:
        rows = st.cell_summary()
        name = st.name
    finally:
        if isinstance(store, str):
            st.close()
    cells = []
    for r in rows:
        n = int(r["trials"])
        fail = n - r["masked"]
        lo, hi = wilson_interval(fail, n, confidence)
        cell = {k: r[k] for k in ("cell_id", "key", "bits", "grp", "flips", "fault", "epoch", "population", "planned")}
        cell.update(trials=n, failures=fail, failure_rate=fail / n if n else None,
                    failure_low=float(lo), failure_high=float(hi), mean_delta=r["mean_delta"])
        for o in OUTCOMES:
            olo, ohi = wilson_interval(r[o], n, confidence)
            cell[o] = r[o]
            cell[f"{o}_rate"] = r[o] / n if n else None
            cell[f"{o}_low"], cell[f"{o}_high"] = float(olo), float(ohi)
        cells.append(cell)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["flips"], c["fault"], c["epoch"]), []).append(c)
    totals = []
    for (flips, fault, epoch), members in groups.items():
        ran = [c for c in members if c["trials"] > 0 and c["population"]]
        if not ran:
            continue
        est = stratified_estimate([c["failures"] for c in ran], [c["trials"] for c in ran],
                                  populations=[c["population"] for c in ran], confidence=confidence)
        totals.append({"flips": flips, "fault": fault, "epoch": epoch, "cells": len(ran),
                       "trials": sum(c["trials"] for c in ran), "rate": est.rate, "variance": est.variance,
                       "stderr": est.stderr, "low": est.low, "high": est.high})
    return {"campaign": name, "confidence": confidence, "cells": cells, "totals": totals}


def format_summary(summary: dict[str, Any]) -> str:
    """A plain-text table of :func:`summarize`'s result."""
    cells = summary["cells"]
    width = max([len(c["key"]) for c in cells] + [4])
    pct = int(round(summary["confidence"] * 100))
    lines = [f"campaign {summary['campaign']}: failure = sdc + critical + due; {pct}% Wilson intervals",
             f"{'cell'.ljust(width)}  {'trials':>8}  {'masked':>7}  {'sdc':>7}  {'crit':>7}  {'due':>7}  "
             f"{'failure rate':>12}  interval"]
    for c in cells:
        rate = "-" if c["failure_rate"] is None else f"{c['failure_rate']:.4f}"
        lines.append(f"{c['key'].ljust(width)}  {c['trials']:>8}  {c['masked']:>7}  {c['sdc']:>7}  {c['critical']:>7}  "
                     f"{c['due']:>7}  {rate:>12}  [{c['failure_low']:.4f}, {c['failure_high']:.4f}]")
    for t in summary["totals"]:
        what = f"flips={t['flips']} fault={t['fault']}" + (f" epoch={t['epoch']}" if t["epoch"] is not None else "")
        lines.append(f"stratified total ({what}, {t['cells']} cells, {t['trials']} trials): "
                     f"{t['rate']:.4f} ± {t['stderr']:.4f} (se), interval [{t['low']:.4f}, {t['high']:.4f}]")
    return "\n".join(lines)
