"""``fastflip info``: versions, active kernel backends, GPU engines and optional extras.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
from typing import Any

from .jsonout import dumps

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("info", help="what this installation can use",
                              description="Versions, the CPU kernel backends that are active, CUDA devices "
                                          "and which optional extras are installed.")
    p.add_argument("--json", action="store_true", help="as JSON (schema_version 1; see docs/json.md)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..kernels.environment import describe, format_description

    d = describe()
    print(dumps(d) if args.json else format_description(d))
    return 0
