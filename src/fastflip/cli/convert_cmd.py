"""``fastflip convert SRC -o OUT [--to FORMAT]``: HDF5 (torch layout) ↔ torch.save ↔ safetensors, bit for bit.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "convert", help="convert a checkpoint between HDF5, torch.save and safetensors",
        description="Read a checkpoint (format detected by content; pickles checked before torch reads them) and "
        "write it in another format with every tensor's stored bits unchanged. The output is written atomically.")
    p.add_argument("file", help="the checkpoint to convert")
    p.add_argument("-o", "--output", required=True, help="output file")
    p.add_argument("--to", choices=["hdf5", "torch", "safetensors"],
                   help="output format (default: from the output's extension .h5/.pt/.pth/.safetensors)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    return p


def run(args: argparse.Namespace) -> int:
    from ..frameworks.convert import convert

    fmt = convert(args.file, args.output, args.to, overwrite=args.force)
    if not args.quiet:
        print(f"{args.output}: written as {fmt}")
    return 0
