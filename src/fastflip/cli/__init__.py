"""The ``fastflip`` command line: a thin shell over the Python API.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).

Each subcommand lives in its own module of this package with two functions:
``add_parser(subparsers)`` (argparse only, nothing heavy imported) and
``run(args) -> int``. Heavy imports happen inside ``run`` so that
``fastflip --help`` stays fast and imports no framework.

Every subcommand takes ``-q/--quiet`` (no progress, no informational lines or warnings: only the output asked
for, and errors; a command that only writes files prints nothing on success) and ``-v/--verbose`` (the library's ``fastflip`` log messages at INFO, ``-vv`` DEBUG); they are added
here unless the subcommand defines its own. Exit codes: 0 success, 1 "differs" (diff) or failed trials,
2 an error (one line on stderr), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM, where handled).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import warnings
from typing import Any, Sequence

from .. import __version__

# (subcommand, module): order is the order shown by --help
COMMANDS: tuple[tuple[str, str], ...] = (
    ("inspect", "inspect_cmd"),
    ("inject", "inject_cmd"),
    ("hdf5-corrupter", "hdf5_corrupter_cmd"),
    ("replay", "replay_cmd"),
    ("revert", "revert_cmd"),
    ("diff", "diff_cmd"),
    ("convert", "convert_cmd"),
    ("log", "log_cmd"),
    ("experiment", "experiment_cmd"),
    ("plan", "plan_cmd"),
    ("sweep", "sweep_cmd"),
    ("export", "export_cmd"),
    ("merge", "merge_cmd"),
    ("report", "report_cmd"),
    ("info", "info_cmd"),
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``fastflip`` parser with every subcommand, or (``only``: a command's name) with that one alone: a run
    of one command imports no other command's module."""
    parser = argparse.ArgumentParser(
        prog="fastflip",
        description="Exact, fast, reproducible bit flips in HDF5 checkpoints and live tensors.",
    )
    parser.add_argument("--version", action="version", version=f"fastflip {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS:
        if only is not None and name != only:
            continue
        try:
            mod = importlib.import_module(f".{modname}", __name__)
        except ModuleNotFoundError as exc:  # a command not built yet
            if exc.name and exc.name.endswith(modname):
                continue
            raise
        p = mod.add_parser(sub)
        _add_verbosity(p)
        p.set_defaults(_run=mod.run)
    return parser


def _add_verbosity(p: argparse.ArgumentParser) -> None:
    """``-q/--quiet`` and ``-v/--verbose`` on a subcommand that does not define them itself."""
    have = p._option_string_actions  # argparse keeps no public view of the options a parser has
    if "-q" not in have and "--quiet" not in have:
        p.add_argument("-q", "--quiet", action="store_true", help="no progress or informational output")
    if "-v" not in have and "--verbose" not in have:
        p.add_argument("-v", "--verbose", action="count", default=0,
                       help="show the library's log messages (-vv: debug)")


def _configure_logging(args: argparse.Namespace) -> None:
    """Send the ``fastflip`` logger to stderr at the level -q/-v ask for (WARNING by default)."""
    verbose = int(getattr(args, "verbose", 0) or 0)
    level = logging.ERROR if getattr(args, "quiet", False) else (
        logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    logger = logging.getLogger("fastflip")
    logger.setLevel(level)
    if not any(getattr(h, "_fastflip_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"fastflip {args.command}: %(levelname)s: %(message)s"))
        handler._fastflip_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def entry() -> int:
    """The ``fastflip`` program (``python -m fastflip`` and the installed script): :func:`main`, then the
    objects it leaves are set aside for the exit.

    The cyclic garbage collector runs after every 50,000 new objects rather than 700 (``gc.set_threshold``):
    importing NumPy, h5py and a command's modules makes some 40,000 objects that live until the exit, and
    collecting after every 700 of them walks them again and again (15-30 ms of a 0.3 s command). Cycles are
    still collected, less often. The process ends next: ``gc.freeze()`` keeps the interpreter's last garbage
    collection from walking every object NumPy, h5py and fastflip made (10-50 ms). Files are closed and committed
    by then; atexit handlers still run. Neither is in :func:`main` itself, which a host process may call again
    and again.
    """
    import gc

    gc.set_threshold(50_000)
    rc = main()
    gc.freeze()
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 ok, 1 'differs'/failed trials, 2 error)."""
    from ..errors import FastflipError

    argv = list(sys.argv[1:] if argv is None else argv)
    named = argv[0] if argv and argv[0] in dict(COMMANDS) else None
    parser = build_parser(named)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    _configure_logging(args)
    from ..errors import one_line

    previous = _catch_sigterm()
    try:
        with warnings.catch_warnings():
            if getattr(args, "quiet", False):  # the library's informational warnings ("fastflip: ...") too
                warnings.filterwarnings("ignore", message="fastflip: ")
            return int(args._run(args) or 0)
    except FastflipError as exc:
        print(f"fastflip {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # temporaries were removed on the way out
        print(f"fastflip {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:  # cleanups ran on the way out; now die of the signal as the sender expects
        print(f"fastflip {args.command}: terminated", file=sys.stderr)
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return 143
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the one error path: whatever a damaged input provokes is one line, not a traceback
        from ..files.oserrors import as_fastflip_error

        if os.environ.get("FASTFLIP_DEBUG"):
            raise
        mapped = as_fastflip_error(exc, _subject(args))
        if mapped is None:
            print(f"fastflip {args.command}: internal error ({type(exc).__name__}: {one_line(exc)}); please report "
                  "it (FASTFLIP_DEBUG=1 shows the traceback)", file=sys.stderr)
            return 3
        print(f"fastflip {args.command}: error: {one_line(mapped)}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM, so that every ``finally``/``except`` cleanup runs."""


def _catch_sigterm() -> Any:
    """Turn SIGTERM into :class:`Terminated` (main thread only); return the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    return signal.signal(signal.SIGTERM, handler)


def _subject(args: argparse.Namespace) -> str:
    """The file a command works on, for messages (its FILE or LOG argument)."""
    for name in ("file", "log", "config", "store", "source", "campaign", "path"):
        v = getattr(args, name, None)
        if isinstance(v, str):
            return v
    return args.command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
