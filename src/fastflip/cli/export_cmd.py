"""``fastflip export``: a results store as CSV or Parquet (one row per trial, for pandas), or its statistics.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
from typing import Any

from .jsonout import dumps


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("export", help="export a results store to CSV or Parquet, or print its statistics",
                       description="Write one row per trial (with its cell's columns) to CSV or Parquet, or print "
                       "per-cell rates with Wilson intervals, stratified totals and per-layer vulnerability "
                       "(--summary; the outcome classes are in docs/outcomes.md).")
    p.add_argument("store", help="results store")
    fmt = p.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--csv", metavar="OUT", help="CSV output file")
    fmt.add_argument("--parquet", metavar="OUT", help="Parquet output file (needs pyarrow)")
    fmt.add_argument("--summary", action="store_true", help="print per-cell rates, Wilson intervals, stratified totals")
    p.add_argument("--json", action="store_true", help="with --summary: print JSON")
    p.add_argument("--confidence", type=float, default=0.95, help="with --summary: confidence level (default 0.95)")
    p.add_argument("--failure", metavar="CLASSES",
                   help="with --summary: comma-separated outcome classes that count as failure, instead of the "
                   "campaign's [evaluator] failure (masked_numeric, sdc, critical, due)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    return p


def run(args: argparse.Namespace) -> int:
    from ..campaign.store import ResultStore
    from ..campaign.store_export import export_csv, export_parquet

    if args.summary:

        from ..campaign.summary import format_summary, summarize

        failure = [c.strip() for c in args.failure.split(",") if c.strip()] if args.failure else None
        s = summarize(args.store, confidence=args.confidence, failure=failure)
        print(dumps(s) if args.json else format_summary(s))
        return 0
    with ResultStore.open(args.store) as st:
        if args.csv:
            n, out = export_csv(st, args.csv, overwrite=args.force), args.csv
        else:
            n, out = export_parquet(st, args.parquet, overwrite=args.force), args.parquet
    if not args.quiet:
        print(f"{out}: {n} trials")
    return 0
