"""``fastflip replay LOG FILE -o OUT``: reproduce a logged injection bit for bit."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("replay", help="re-apply a logged injection to the original file",
                              description="Apply the sites of LOG to FILE (which must be the logged input); "
                              "the output equals the logged output bit for bit (checked by sha256).")
    p.add_argument("log", help="the .fflog written by inject")
    p.add_argument("file", help="the original (logged input) file")
    p.add_argument("-o", "--output", help="output file")
    p.add_argument("--in-place", action="store_true", help="change FILE itself (atomically)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inject import replay

    res = replay(args.log, args.file, args.output, in_place=args.in_place)
    print(f"wrote {res.output}: {res.counts.get('sites', len(res.log))} element(s) replayed; "
          f"sha256 {res.log.manifest['output']['sha256']} matches the log")
    return 0
