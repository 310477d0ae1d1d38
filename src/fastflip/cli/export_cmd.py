"""``fastflip export``: a results store as CSV or Parquet (one row per trial, for pandas)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("export", help="export a results store to CSV or Parquet",
                       description="Write one row per trial (with its cell's columns) to CSV or Parquet.")
    p.add_argument("store", help="results store")
    fmt = p.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--csv", metavar="OUT", help="CSV output file")
    fmt.add_argument("--parquet", metavar="OUT", help="Parquet output file (needs pyarrow)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    return p


def run(args: argparse.Namespace) -> int:
    from ..store import ResultStore

    with ResultStore.open(args.store) as st:
        if args.csv:
            n, out = st.export_csv(args.csv, overwrite=args.force), args.csv
        else:
            n, out = st.export_parquet(args.parquet, overwrite=args.force), args.parquet
    print(f"{out}: {n} trials")
    return 0
