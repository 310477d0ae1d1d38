"""``fastflip report STORE_OR_EXPERIMENT -o DIR``: figures, CSV tables and an HTML page.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="write an HTML report (PNG figures, CSV tables) of a campaign store or an experiment",
        description="Write DIR/index.html with PNG figures and CSV tables beside it, from a results store "
        "(fastflip sweep) or an experiment directory (fastflip experiment). The page uses relative links "
        "only and needs no JavaScript.",
    )
    p.add_argument("source", metavar="STORE_OR_EXPERIMENT", help="results store (.db) or experiment directory")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="report directory (its parent must exist)")
    p.add_argument("--force", action="store_true", help="write into a non-empty directory that holds no earlier report")
    return p


def run(args: argparse.Namespace) -> int:
    from ..report import write_report

    rep = write_report(args.source, args.out, force=args.force)
    if not args.quiet:
        print(f"{rep.kind} report: {rep.index} ({len(rep.figures)} figures, {len(rep.tables)} tables, {rep.seconds:.1f} s)")
    return 0
