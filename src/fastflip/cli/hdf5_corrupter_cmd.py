"""``fastflip hdf5-corrupter`` (and the ``hdf5_corrupter`` script): a drop-in for the older tool's command line.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).

Takes the older tool's flags (``--hdf5File``, ``--injectionTries``, ``--injectionType``, ``--firstBit``,
``--lastBit``, ``--floatPrecision``, ``--useRandomLocations``, ``--locationsToCorrupt``, ``--burst``,
``--bitMask``, ``--scalingFactor``, ``--allowSignChange``, ``--allowNaNValues``, ``--injectionProbability``,
``--logFilePath``, ``--saveInjectionSequence PATH [SAVE_INDEXES]``, ``--loadInjectionSequence PATH``,
``--injectionSequencePath``, ``--configFile``, ``--onlyPrint``) and the short flags of its README (``-c -f -l
-d -e -p -t -k -a -o``) with their meaning (switches absent = false; with ``--configFile`` the value flags
override its keys, as the README said, and the others are ignored) and runs the older tool's sampling
(:mod:`fastflip.compat.oldtool`). Unlike the older tool it writes fastflip's log, so every run replays and
reverts, and it leaves the input alone unless ``--inPlace`` is given: the output is ``--output`` or
``<input stem>.corrupted<suffix>`` beside the input.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

__all__ = ["add_parser", "run", "main", "add_old_flags"]


def add_old_flags(p: argparse.ArgumentParser) -> None:
    """The older tool's flags, with its names and value types."""
    g = p.add_argument_group("the older tool's flags (hdf5_corrupter)")
    g.add_argument("-c", "--configFile", help="path/to/config.yaml; the value flags given beside it (-f, -l, -d, -e, "
                   "-p, -t, -k, -a) override its keys, as its README said; the other old flags are ignored")
    g.add_argument("-f", "--hdf5File", help="the HDF5 file to corrupt")
    g.add_argument("--locationsToCorrupt", nargs="+", help="location prefixes inside the file")
    g.add_argument("-l", "--logFilePath", help="accepted (the older tool's text log); fastflip writes its own log")
    g.add_argument("--floatPrecision", help="16, 32, 64 or auto: the width float values are packed at")
    g.add_argument("-d", "--firstBit", type=int, help="first bit, sign-first numbering (0 = sign)")
    g.add_argument("-e", "--lastBit", type=int, help="last bit, sign-first numbering")
    g.add_argument("-p", "--injectionProbability", type=float, help="probability that an attempt corrupts")
    g.add_argument("-t", "--injectionType", help="count or percentage")
    g.add_argument("-k", "--injectionTries", type=float, help="attempts (count) or percent of the file's entries")
    g.add_argument("-a", "--scalingFactor", type=float, help="multiply the value instead of flipping bits")
    g.add_argument("--bitMask", help="a 0/1 string XORed at a random offset")
    g.add_argument("--burst", type=int, help="distinct random bits flipped per value (default 1)")
    g.add_argument("--saveInjectionSequence", nargs="*", metavar="ARG",
                   help="PATH [true|false]: save the injection sequence JSON (with indexes unless false)")
    g.add_argument("--loadInjectionSequence", help="replay an injection sequence JSON")
    g.add_argument("--injectionSequencePath", help="the later tool's name for the sequence file to load")
    g.add_argument("--allowSignChange", action="store_true", help="the sign bit is one more slot of the range")
    g.add_argument("--useRandomLocations", action="store_true", help="every dataset of the file")
    g.add_argument("--allowNaNValues", action="store_true", help="allow flips that give NaN/Inf")
    g.add_argument("-o", "--onlyPrint", action="store_true",
                   help="list the file's datasets and exit (-o as in its README; the output file is --output)")
    p.add_argument("stray", nargs="*", help=argparse.SUPPRESS)  # caught in run(): `-o PATH` meant --output


def _add_fastflip_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fastflip")
    g.add_argument("--output", help="output file (default: <input stem>.corrupted<suffix>; -o is --onlyPrint here)")
    g.add_argument("--inPlace", "--in-place", dest="in_place", action="store_true",
                   help="edit --hdf5File itself, as the older tool did (atomically; the log reverts it)")
    g.add_argument("--seed", type=int, help="seed (random and recorded when omitted)")
    g.add_argument("--design", choices=("oldtool", "fastflip"), default="oldtool",
                   help="oldtool (default) or fastflip's own sampling design")
    g.add_argument("--oldtool-sequence", action="store_true",
                   help="save the injection sequence as the older tool wrote it: PATH.json (with --configFile: "
                   "<injection_sequence_path>.json in the working directory, no indexes), entries under the first "
                   "matching location")
    g.add_argument("--log", metavar="PATH", help="fastflip log path (default OUTPUT.fflog)")
    g.add_argument("--json", action="store_true", help="print the summary as JSON")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "hdf5-corrupter", help="drop-in for the older hdf5_corrupter command line (its flags, its sampling)",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    add_old_flags(p)
    _add_fastflip_flags(p)
    return p


def default_output(src: str) -> str:
    """``<stem>.corrupted<suffix>`` beside ``src``."""
    stem, ext = os.path.splitext(src)
    return f"{stem}.corrupted{ext or '.h5'}"


def run(args: argparse.Namespace) -> int:
    from ..compat.run import run_old_settings
    from ..errors import OptionError
    from ..compat.oldconfig import config_with_flags, load_old_config, settings_from_config, settings_from_flags
    from .inject_cmd import _print_summary

    if args.saveInjectionSequence is not None and not 1 <= len(args.saveInjectionSequence) <= 2:
        if args.saveInjectionSequence:
            raise OptionError("--saveInjectionSequence takes PATH and optionally true/false (save the indexes)")
    if args.stray:
        hint = "; -o is the older tool's --onlyPrint: name the output file with --output" if args.onlyPrint else ""
        raise OptionError(f"unexpected argument {args.stray[0]!r}{hint}")
    if args.configFile:
        cfg, ignored = config_with_flags(load_old_config(args.configFile), args)
        for flag in ignored:
            print(f"hdf5-corrupter: warning: {flag} is ignored with --configFile (the older tool read that setting "
                  "from the file)", file=sys.stderr)
        settings = settings_from_config(cfg, source=args.configFile)
    else:
        settings = settings_from_flags(args)
    src = settings.hdf5_file
    if not src:
        raise OptionError("give --hdf5File (or hdf5_file in --configFile)")
    if args.onlyPrint:
        from ..files.layout import read_layout

        for t in read_layout(src).tensors:
            print(f'"{t.path}" --- Type: {t.dtype} --- Dimensions: {list(t.shape)}')
        return 0
    out = src if args.in_place else (args.output or default_output(src))
    r = run_old_settings(settings, src, None if args.in_place else out, in_place=args.in_place, seed=args.seed,
                         design=args.design, log_path=args.log,
                         old_sequence=("config" if args.configFile else "flags") if args.oldtool_sequence else None)
    for w in r.warnings:
        print(f"hdf5-corrupter: warning: {w}", file=sys.stderr)
    for n in [] if args.quiet else r.notes:
        print(f"hdf5-corrupter: note: {n}", file=sys.stderr)
    if not args.in_place and not args.quiet:
        print(f"hdf5-corrupter: note: {src} is unchanged; the corrupted copy is {out} (the older tool edited its "
              "input in place: add --inPlace to do the same)", file=sys.stderr)
    extra: dict[str, Any] = {}
    if r.run is not None:
        extra = {"attempts": r.run.attempts, "corrupted": r.run.corrupted, "unchanged": r.run.plan.meta["unchanged"]}
    if r.sequence_path:
        extra["sequence"] = r.sequence_path
    _print_summary(r.result, args.json, extra, quiet=args.quiet)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``hdf5_corrupter`` console script: ``fastflip hdf5-corrupter`` under the older tool's name."""
    from . import main as fastflip_main

    return fastflip_main(["hdf5-corrupter", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
