"""``make demo`` / ``python -m fastflip.demo``: a real checkpoint-alteration experiment, offline.

A small CNN learns scikit-learn's 8x8 handwritten digits for 5 epochs, once in
Keras and once in PyTorch, saving an HDF5 checkpoint after every epoch (the golden
run). From the epoch-2 checkpoint, each scenario flips 10 bits (5 repetitions,
each with its own recorded seed) and training resumes to epoch 5:

- ``weights-exp-msb``: the exponent's most significant bit of weights and biases;
- ``weights-low-mantissa``: the 8 lowest mantissa bits of weights and biases;
- ``optimizer-exp-msb``: the exponent MSB of the optimizer's moment estimates;
- ``control``: no flip at all (must reproduce the golden curve bit for bit).

It prints the outcome table per framework and writes everything (checkpoints,
logs, ``results.csv``, ``curves.csv``, ``accuracy.png``) under ``demo-out/``.
Running it again reuses what is already there. The outcomes are measured, not
chosen: nothing here is tuned to produce a particular answer.

Usage: ``python -m fastflip.demo [OUT_DIR] [--fresh] [--framework keras|torch]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["demo_config", "main"]

EPOCHS = 5
INJECT_EPOCH = 2
REPETITIONS = 5
FLIPS = 10


def demo_config(framework: str) -> dict[str, Any]:
    """The demo experiment for ``framework`` (``"keras"`` or ``"torch"``) as a configuration mapping.

    >>> cfg = demo_config("torch")
    >>> [s["name"] for s in cfg["scenarios"]]
    ['weights-exp-msb', 'weights-low-mantissa', 'optimizer-exp-msb', 'control']
    """
    model_tensors = {"roles": ["weight", "bias"]}
    return {
        "name": f"digits-{framework}",
        "epochs": EPOCHS,
        "seed": 0,
        "repetitions": REPETITIONS,
        "tolerance": 0.02,
        "trainer": {"framework": framework, "batch_size": 32},
        "scenarios": [
            {"name": "weights-exp-msb", "epoch": INJECT_EPOCH, "bits": "exponent-msb", "count": FLIPS,
             "selection": model_tensors},
            {"name": "weights-low-mantissa", "epoch": INJECT_EPOCH, "bits": "0-7", "count": FLIPS,
             "selection": model_tensors},
            {"name": "optimizer-exp-msb", "epoch": INJECT_EPOCH, "bits": "exponent-msb", "count": FLIPS,
             "selection": {"roles": ["optimizer-moment"]}},
            {"name": "control", "epoch": INJECT_EPOCH, "control": True, "repetitions": 1},
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 when every framework's experiment completed."""
    p = argparse.ArgumentParser(prog="python -m fastflip.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="demo-out", help="output directory (default demo-out)")
    p.add_argument("--fresh", action="store_true", help="delete earlier demo results first")
    p.add_argument("--framework", choices=("keras", "torch"), action="append",
                   help="run only this framework (repeatable; default both)")
    args = p.parse_args(argv)
    from .experiment import run_experiment

    root = Path(args.out)
    if args.fresh and root.exists():
        shutil.rmtree(root)
    t0 = time.perf_counter()
    for fw in args.framework or ["keras", "torch"]:
        t = time.perf_counter()
        print(f"== {fw}: golden run of {EPOCHS} epochs, then {FLIPS} flips at epoch {INJECT_EPOCH}, "
              f"{REPETITIONS} repetitions per scenario", flush=True)
        res = run_experiment(demo_config(fw), root / fw, progress=lambda s: print("  " + s, flush=True))
        print(res.table())
        control = [r for r in res.results if r["scenario"] == "control"]
        print(f"control run reproduces golden exactly: {all(r['matches_golden'] for r in control)}")
        tm = res.timings
        train = tm["golden_train_s"] + tm["run_train_s"]
        handling = tm["golden_checkpoint_s"] + tm["run_inject_s"] + tm["run_load_s"]
        if train > 0:
            print(f"time: training {train:.1f} s, checkpoint save/inject/load {handling:.2f} s "
                  f"({100 * handling / train:.1f}% of training)")
        from .report import write_report

        report = write_report(res.out, root / f"{fw}-report")
        print(f"outputs: {res.out}/results.csv, curves.csv, accuracy.png; report {report.index} "
              f"({time.perf_counter() - t:.1f} s)\n", flush=True)
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
