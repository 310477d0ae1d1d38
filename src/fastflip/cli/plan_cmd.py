"""``fastflip plan``: how many trials a campaign needs (Leveugle et al., DATE 2009), per cell and in total."""

from __future__ import annotations

import argparse
import math
from typing import Any

from .jsonout import dumps


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plan",
        help="sample sizes for a margin and confidence, per cell and in total",
        description="Sample size n = N / (1 + e^2 (N-1) / (t^2 p (1-p))) (Leveugle et al., DATE 2009) for a "
        "population N (fault sites), margin e, confidence (t) and expected rate p: for a campaign file, per cell "
        "(N = its elements x allowed bits) and in total; or for --population alone.",
    )
    p.add_argument("campaign", nargs="?", help="campaign file (.toml/.yaml); omit with --population")
    p.add_argument("--population", type=float, help="N: number of fault sites ('inf' for unbounded)")
    p.add_argument("--margin", type=float, default=None, help="error margin e (default: the campaign's, else 0.01)")
    p.add_argument("--confidence", type=float, default=None, help="confidence level (default 0.95)")
    p.add_argument("-p", "--rate", dest="p", type=float, default=None, help="expected rate p (default 0.5, the safe choice)")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from ..errors import OptionError
    from ..stats import sample_size

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

    from ..campaign.config import load_campaign
    from ..campaign.sweep import campaign_cells

    campaign = load_campaign(args.campaign)
    tr = campaign.trials
    margin = args.margin if args.margin is not None else (tr.margin if tr.margin is not None else 0.01)
    conf = args.confidence if args.confidence is not None else tr.confidence
    p = args.p if args.p is not None else tr.p
    cells = campaign_cells(campaign)
    rows = [{"cell": c.key, "population": c.population,
             "n": sample_size(c.population, margin=margin, confidence=conf, p=p)} for c in cells]
    total_pop = sum(c.population for c in cells)
    out = {
        "campaign": campaign.name, "margin": margin, "confidence": conf, "p": p, "cells": rows,
        "total_per_cell": sum(r["n"] for r in rows),
        "population": total_pop,
        "n_whole_population": sample_size(total_pop, margin=margin, confidence=conf, p=p),
    }
    if args.json:
        print(dumps(out))
        return 0
    width = max(len(r["cell"]) for r in rows)
    print(f"campaign {campaign.name}: margin {margin}, confidence {conf}, p {p}")
    print(f"{'cell'.ljust(width)}  {'population':>14}  {'trials':>8}")
    for r in rows:
        print(f"{r['cell'].ljust(width)}  {r['population']:>14,}  {r['n']:>8,}")
    print(f"{'total (every cell to this margin)'.ljust(width)}  {total_pop:>14,}  {out['total_per_cell']:>8,}")
    print(f"{'whole population at once'.ljust(width)}  {total_pop:>14,}  {out['n_whole_population']:>8,}")
    return 0


def _num(x: float) -> str:
    return "inf" if math.isinf(x) else f"{int(x):,}" if float(x).is_integer() else str(x)
