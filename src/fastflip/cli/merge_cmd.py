"""``fastflip merge``: combine the shard stores of one campaign into one store.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("merge", help="combine shard stores (--shard i/N runs) into one store",
                       description="Combine the stores of one campaign's shards. Sources must hold the same campaign; "
                       "a trial stored twice must agree, else nothing is written.")
    p.add_argument("sources", nargs="+", help="shard stores")
    p.add_argument("-o", "--output", required=True, help="the new merged store (must not exist)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..campaign.store import ResultStore
    from ..campaign.store_export import merge_stores

    res = merge_stores(args.output, args.sources)
    with ResultStore.open(args.output) as st:
        missing = sum(len(v) for v in st.missing().values())
    note = f"; {missing} planned trials still missing (run 'fastflip sweep -o {args.output}')" if missing else ""
    if args.quiet:
        return 0
    print(f"{args.output}: {res['trials']} trials from {len(args.sources)} stores "
          f"({res['duplicates']} agreeing duplicates dropped){note}")
    return 0
