"""``fastflip revert LOG FILE``: restore the original bytes of an injected file.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

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
    p.add_argument("--force", action="store_true", help="replace an existing -o file")
    p.add_argument("--no-verify", action="store_true",
                   help="allow a log without sha256 hashes (the result cannot be verified as the original); for a "
                   "log with region evidence, write the logged original bytes of the touched ranges even where "
                   "the file fails the log's checks")
    return p


def run(args: argparse.Namespace) -> int:
    from ..files.revert import revert
    from ..files.formats.hfdir import is_checkpoint_dir  # files.sharded only for a directory

    if is_checkpoint_dir(args.file):  # a Hugging Face directory: every shard the log changed
        from ..files.sharded import revert_dir

        res = revert_dir(args.log, args.file, args.output, overwrite=args.force, verify=not args.no_verify)
    else:
        res = revert(args.log, args.file, args.output, verify=not args.no_verify, overwrite=args.force)
    algo = getattr(res, "algorithm", "sha256")
    if args.quiet:
        return 0
    if getattr(res, "evidence", "file") == "regions" and not res.verified:
        print(f"restored {res.output}: {res.sites} element(s); the logged original bytes of the touched ranges "
              "were written; NOT verified: the result is not the logged input by the log's checks (--no-verify)")
    elif getattr(res, "evidence", "file") == "regions":
        print(f"restored {res.output}: {res.sites} element(s); the touched byte ranges, size and head/tail "
              f"fingerprint ({algo}) match the log (a log with region evidence holds no whole-file hash)")
    elif res.verified:
        print(f"restored {res.output}: {res.sites} element(s); {algo} {res.digest} matches the logged input")
    else:
        print(f"restored {res.output}: {res.sites} element(s); NOT verified (the log holds no hash of the "
              f"original; only the logged words were checked); {algo} now {res.digest}")
    return 0
