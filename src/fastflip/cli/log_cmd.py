"""``fastflip log LOG``: show a log's manifest and records (table, CSV or JSON).

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from .jsonout import dumps

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("log", help="show an injection log",
                              description="Print the manifest and per-flip records of a .fflog.")
    p.add_argument("log", help="the .fflog file")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="all records as CSV")
    fmt.add_argument("--json", action="store_true", help="manifest and records as JSON")
    p.add_argument("--limit", type=int, default=20, help="records shown in the table (default 20)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..files.hashing import logged_hash
    from ..files.log import InjectionLog

    log = InjectionLog.load(args.log)
    if args.csv:
        w = csv.writer(sys.stdout)
        for row in log.iter_csv_rows():
            w.writerow(row)
        return 0
    if args.json:
        print(dumps({"manifest": log.manifest, "records": log.records()}))
        return 0
    m = log.manifest
    c = m.get("counts", {})
    print(f"{args.log}: fastflip {m.get('fastflip_version')} {m.get('created')} seed {m.get('seed')}")
    for key, pad in (("input", " "), ("output", "")):
        entry = m.get(key) if isinstance(m.get(key), dict) else {}  # a log may hold none (null): shown as None
        algo, digest = logged_hash(entry)
        print(f"{key}{pad} {entry.get('path')} {algo} {digest}")
    print(f"options {json.dumps(m.get('options', {}), sort_keys=True)}")
    print(f"counts {json.dumps(c, sort_keys=True)}")
    rows = list(log.iter_csv_rows())
    head, body = rows[0], rows[1 : 1 + max(0, args.limit)]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    for r in [head, *body]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if len(log) > len(body):
        print(f"... {len(log) - len(body)} more (use --csv)")
    return 0
