"""``fastflip experiment CONFIG``: golden run, injected resumed runs, outcome table, curves and plot.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser(
        "experiment",
        help="checkpoint-alteration experiment: train, inject at epoch E, resume, compare with the golden run",
        description="Run the experiment described by CONFIG (YAML or JSON; see docs/experiment.md): a golden run "
        "that saves an HDF5 checkpoint every epoch, then for each scenario and repetition an injected copy of the "
        "epoch-E checkpoint resumed to the last epoch. Writes results.csv, curves.csv, accuracy.png and "
        "experiment.json to the output directory. Re-running reuses the golden run and finished runs.",
    )
    p.add_argument("config", metavar="CONFIG", help="experiment configuration (.yaml/.yml/.json)")
    p.add_argument("-o", "--out", metavar="DIR", help="output directory (default: the configuration's 'output')")
    p.add_argument("--no-plot", action="store_true", help="do not draw accuracy.png (no matplotlib needed)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the outcome table")
    return p


def run(args: argparse.Namespace) -> int:
    from ..experiment.runner import run_experiment

    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    res = run_experiment(args.config, args.out, progress=progress, plot=not args.no_plot)
    print(res.table())
    print(f"results: {res.out / 'results.csv'}  curves: {res.out / 'curves.csv'}"
          + ("" if args.no_plot else f"  plot: {res.out / 'accuracy.png'}"))
    return 0
