"""``fastflip sweep``: run or resume a campaign into its SQLite results store.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "sweep",
        help="run or resume a statistical campaign (local processes, Dask, or a shard of a job array)",
        description="Run every missing trial of a campaign into a results store. Run it again (with or without the "
        "campaign file) to resume after Ctrl-C, a crash or pre-emption: no trial is lost or run twice.",
    )
    p.add_argument("campaign", nargs="?", help="campaign file (.toml/.yaml); omit to resume the store's campaign")
    p.add_argument("-o", "--store", required=True, help="results store (SQLite; created on the first run)")
    p.add_argument("-j", "--workers", type=int, default=None, help="worker processes (default: all cores; 0: in this process)")
    p.add_argument("--dask", metavar="local|tcp://HOST:PORT", help="run on Dask: a LocalCluster or an existing scheduler")
    p.add_argument("--shard", metavar="i/N", help="run only shard i of N (job arrays); combine with 'fastflip merge'")
    p.add_argument("--chunk", type=int, default=None, help="trials per task (default: automatic)")
    p.add_argument("--batch-trials", type=int, default=None, metavar="N",
                   help="trials per forward pass for PyTorch targets with a built-in evaluator (default: automatic, "
                   "from free memory; 1: one trial at a time, the serial reference)")
    p.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="always draw the progress bar (default: only on a terminal)")
    p.add_argument("--status-every", type=float, default=None, metavar="SECONDS",
                   help="off a terminal, a status line every SECONDS (default 60, or FASTFLIP_STATUS_SECONDS; 0: none)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..campaign.config import load_campaign
    from ..campaign.progress import format_rate
    from ..campaign.sweep import sweep
    from ..errors import OptionError

    campaign = load_campaign(args.campaign) if args.campaign else None
    if args.quiet and args.progress:
        raise OptionError("give either --progress or -q/--quiet, not both")
    res = sweep(campaign, args.store, workers=args.workers, dask=args.dask, shard=args.shard, chunk=args.chunk,
                batch_trials=args.batch_trials, progress=False if args.quiet else args.progress, status_every=args.status_every)
    if args.quiet:
        if res.interrupted:  # even quiet, say why the exit code is not 0
            print(f"fastflip sweep: interrupted: {res.stored}/{res.planned} trials stored; run again to resume",
                  file=sys.stderr)
        return 130 if res.interrupted else 0
    for note in res.notes:  # e.g. per_cell above a population: that cell ran exhaustively
        print(f"fastflip sweep: note: {note}", file=sys.stderr)
    counts = ", ".join(f"{k} {v}" + (f" (numeric only {res.masked_numeric})" if k == "masked" and res.masked_numeric
                                       else "") for k, v in res.counts.items())
    state = "complete" if res.complete else ("interrupted" if res.interrupted else "incomplete")
    print(f"{res.store}: {res.stored}/{res.planned} trials stored ({state}); ran {res.ran} in {res.elapsed:.1f} s "
          f"({format_rate(res.rate)}); {counts}")
    return 130 if res.interrupted else 0
