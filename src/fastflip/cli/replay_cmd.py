"""``fastflip replay LOG FILE -o OUT``: reproduce a logged injection bit for bit.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

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
    p.add_argument("--in-place", action="store_true", help="change FILE itself (atomically, locked against other writers)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    return p


def run(args: argparse.Namespace) -> int:
    from ..files.replay import replay
    from ..files.formats.hfdir import is_checkpoint_dir  # files.sharded only for a directory

    if is_checkpoint_dir(args.file):  # a Hugging Face directory: every shard the log changed
        from ..files.sharded import replay_dir

        res = replay_dir(args.log, args.file, args.output, in_place=args.in_place, overwrite=args.force)
    else:
        res = replay(args.log, args.file, args.output, in_place=args.in_place, overwrite=args.force)
    from ..files.hashing import logged_hash

    if args.quiet:
        return 0
    algo, digest = logged_hash(res.log.manifest["output"])
    what = f"inner weights file's {algo}" if res.log.manifest.get("container") else algo
    if res.log.manifest.get("evidence") == "regions" and not digest:
        checked = f"the touched byte ranges, size and head/tail fingerprint ({algo}) match the log"
    else:
        checked = f"{what} {digest} matches the log" if digest else "the log holds no hash: words checked, file not"
    print(f"wrote {res.output}: {res.counts.get('sites', len(res.log))} element(s) replayed; {checked}")
    return 0
