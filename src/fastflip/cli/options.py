"""Option groups shared by several subcommands (argparse only: importing this stays light).

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_selection_arguments", "add_fault_arguments"]


def add_selection_arguments(parser: Any) -> None:
    """Add the shared ``--include/--exclude/--regex/--dtype/--role/--layer`` options to an argparse parser.

    Every option may be repeated; :func:`fastflip.files.select.selection_from_args` turns them into a
    :class:`fastflip.files.select.Selection`.
    """
    g = parser.add_argument_group("tensor selection (repeatable; a tensor matches if any alias does)")
    g.add_argument("--include", action="append", metavar="GLOB", default=[],
                   help="path glob (fnmatch, leading '/' optional, '**' ok), e.g. 'model/*conv*'")
    g.add_argument("--exclude", action="append", metavar="GLOB", default=[], help="path glob to leave out")
    g.add_argument("--regex", action="append", metavar="RE", default=[], help="regular expression on paths")
    g.add_argument("--dtype", action="append", metavar="DTYPE", default=[],
                   help="float32, f4, >f4, or a group: float, int, uint, signed, bool")
    g.add_argument("--role", action="append", metavar="ROLE", default=[],
                   help="weight, bias, bn-statistic, optimizer-moment (or: optimizer), step-counter, scale, zero, other")
    g.add_argument("--layer", action="append", metavar="GLOB", default=[],
                   help="glob on layer names (a tied tensor: the layer of any of its names)")


def add_fault_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by commands that sample injections (bits, model, mode, seed, distribution)."""
    g = p.add_argument_group("what to flip")
    g.add_argument("--bits", metavar="SPEC", help="bit positions (bit 0 = LSB): 0-22, 30,31, sign, exponent, "
                   "exponent-msb, mantissa, all (default: all bits of each dtype)")
    g.add_argument("--sign-first", action="store_true",
                   help="read --bits in the old tools' numbering where 0 is the sign (most significant) bit")
    g.add_argument("--model", default="flip", metavar="MODEL",
                   help="flip, random-bits:N, adjacent:N (alias burst:N), mask:0b101[@random], stuck-at-0[:N], stuck-at-1[:N], "
                   "scale:F, random-value, zero (default flip)")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--count", type=int, metavar="K", help="exactly K sites (default 1)")
    m.add_argument("--rate", type=float, metavar="R", help="each selected element is hit with probability R")
    m.add_argument("--ber", type=float, metavar="P", help="each allowed bit flips with probability P")
    g.add_argument("--seed", type=int, help="seed (random and recorded when omitted)")
    g.add_argument("--distribution", default="element", metavar="D",
                   help="element (default: uniform over elements), tensor (uniform over tensors, the old "
                   "tool's behaviour) or weights: name=w,name=w or @weights.json")
    g.add_argument("--replace", action="store_true", help="allow the same (element, bit) to be drawn twice")
    g.add_argument("--nan", choices=("allow", "avoid"), default="allow",
                   help="allow (default) or avoid (resample) sites whose new value is NaN/Inf")
