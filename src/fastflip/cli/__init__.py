"""The ``fastflip`` command line: a thin shell over the Python API.

Each subcommand lives in its own module of this package with two functions:
``add_parser(subparsers)`` (argparse only, nothing heavy imported) and
``run(args) -> int``. Heavy imports happen inside ``run`` so that
``fastflip --help`` stays fast and imports no framework.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from .. import __version__

# (subcommand, module): order is the order shown by --help
COMMANDS: tuple[tuple[str, str], ...] = (
    ("inspect", "inspect_cmd"),
    ("inject", "inject_cmd"),
    ("hdf5-corrupter", "hdf5_corrupter_cmd"),
    ("replay", "replay_cmd"),
    ("revert", "revert_cmd"),
    ("diff", "diff_cmd"),
    ("log", "log_cmd"),
    ("experiment", "experiment_cmd"),
    ("plan", "plan_cmd"),
    ("sweep", "sweep_cmd"),
    ("export", "export_cmd"),
    ("merge", "merge_cmd"),
    ("report", "report_cmd"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastflip",
        description="Exact, fast, reproducible bit flips in HDF5 checkpoints and live tensors.",
    )
    parser.add_argument("--version", action="version", version=f"fastflip {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS:
        try:
            mod = importlib.import_module(f".{modname}", __name__)
        except ModuleNotFoundError as exc:  # a command not built yet
            if exc.name and exc.name.endswith(modname):
                continue
            raise
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 ok, 1 'differs'/failed trials, 2 error)."""
    from ..errors import FastflipError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except FastflipError as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"fastflip {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastflip {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
