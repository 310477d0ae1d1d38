"""``fastflip plan``: what a campaign's sweep will run per cell, and sample sizes (Leveugle et al., DATE 2009).

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .jsonout import dumps


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plan",
        help="sample sizes for a margin and confidence, per cell and in total",
        description="For a campaign file: what 'fastflip sweep' will run, per cell (population, sampling design: "
        "permutation, exhaustive or independent, and trials) and in total; with --margin also the sample size "
        "n = N / (1 + e^2 (N-1) / (t^2 p (1-p))) (Leveugle et al., DATE 2009) at that margin. For --population "
        "alone: that sample size.",
    )
    p.add_argument("campaign", nargs="?", help="campaign file (.toml/.yaml); omit with --population")
    p.add_argument("--population", type=float, help="N: number of fault sites ('inf' for unbounded)")
    p.add_argument("--margin", type=float, default=None,
                   help="error margin e (--population: default 0.01; campaign: adds a column of sample sizes at e)")
    p.add_argument("--confidence", type=float, default=None, help="confidence level (default 0.95)")
    p.add_argument("-p", "--rate", dest="p", type=float, default=None, help="expected rate p (default 0.5, the safe choice)")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from ..errors import OptionError
    from ..campaign.stats import sample_size

    if (args.campaign is None) == (args.population is None):
        raise OptionError("give a campaign file or --population N (not both)")
    if args.campaign is None:
        margin = 0.01 if args.margin is None else args.margin
        conf = 0.95 if args.confidence is None else args.confidence
        p = 0.5 if args.p is None else args.p
        n = sample_size(args.population, margin=margin, confidence=conf, p=p)
        if args.json:
            print(dumps({"population": args.population, "margin": margin, "confidence": conf, "p": p, "n": n}, indent=None))
        else:
            print(f"N={_num(args.population)} e={margin} confidence={conf} p={p}: n = {n}")
        return 0

    from ..campaign.cells import cell_notes, planned_counts
    from ..campaign.config import load_campaign
    from ..campaign.sweep import campaign_cells

    campaign = load_campaign(args.campaign)
    tr = campaign.trials
    conf = args.confidence if args.confidence is not None else tr.confidence
    p = args.p if args.p is not None else tr.p
    cells = campaign_cells(campaign)
    planned = planned_counts(campaign, cells)
    what = (f"per_cell = {tr.per_cell}" if tr.per_cell is not None else f"margin = {tr.margin}" if tr.margin is not None
            else f"sequential to half_width = {tr.half_width} in blocks of {tr.block} (at most {tr.max_per_cell})")
    margin = args.margin  # a what-if column: the Leveugle size at another margin
    rows = []
    for c, n in zip(cells, planned):
        row = {"cell": c.key, "population": c.population, "sampling": c.design(n),
               "fpc_population": c.fpc_population, "trials": n}
        if margin is not None:
            row["n_margin"] = sample_size(c.fpc_population if c.fpc_population is not None else math.inf,
                                          margin=margin, confidence=conf, p=p)
        rows.append(row)
    total_pop = sum(c.population for c in cells)
    notes = cell_notes(campaign, cells, planned)
    out: dict[str, Any] = {
        "campaign": campaign.name, "trials_rule": what, "confidence": conf, "p": p, "cells": rows,
        "total": sum(planned), "sequential": tr.sequential, "population": total_pop, "notes": notes,
    }
    if margin is not None:
        out["margin"] = margin
        out["total_margin"] = sum(r["n_margin"] for r in rows)
        out["n_whole_population"] = sample_size(total_pop, margin=margin, confidence=conf, p=p)
    if args.json:
        print(dumps(out))
        return 0
    width = max([len(r["cell"]) for r in rows] + [34])
    up_to = "up to " if tr.sequential else ""
    print(f"campaign {campaign.name}: what 'fastflip sweep' runs ({what}; confidence {conf})")
    extra = f"  {'n at ±' + str(margin):>12}" if margin is not None else ""
    print(f"{'cell'.ljust(width)}  {'population':>14}  {'sampling':<11}  {'trials':>8}{extra}")
    for r in rows:
        extra = f"  {r['n_margin']:>12,}" if margin is not None else ""
        print(f"{r['cell'].ljust(width)}  {r['population']:>14,}  {r['sampling']:<11}  {r['trials']:>8,}{extra}")
    extra = f"  {out['total_margin']:>12,}" if margin is not None else ""
    print(f"{'total'.ljust(width)}  {total_pop:>14,}  {'':<11}  {up_to + format(out['total'], ','):>8}{extra}")
    if margin is not None:
        print(f"{'whole population at once (±' + str(margin) + ')'}: {out['n_whole_population']:,} trials")
    for note in notes:
        print(f"note: {note}")
    return 0


def _num(x: float) -> str:
    return "inf" if math.isinf(x) else f"{int(x):,}" if float(x).is_integer() else str(x)
