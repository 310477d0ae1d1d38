"""``fastflip revert LOG FILE``: restore the original bytes of an injected file."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("revert", help="restore the original bytes of an injected file",
                              description="Undo the injection of LOG in FILE (which must be the logged output) "
                              "and verify the result against the logged input sha256.")
    p.add_argument("log", help="the .fflog written by inject")
    p.add_argument("file", help="the injected (logged output) file; changed in place unless -o is given")
    p.add_argument("-o", "--output", help="write the restored file here instead")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inject import revert

    res = revert(args.log, args.file, args.output)
    print(f"restored {res.output}: {res.sites} element(s); sha256 {res.sha256} matches the logged input")
    return 0
