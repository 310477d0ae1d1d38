"""``make demo`` / ``python -m fastflip.demo``: the headline contrast of bit flips in training, measured, offline.

A small CNN learns scikit-learn's 8x8 handwritten digits for 4 epochs, once in
Keras and once in PyTorch, saving an HDF5 checkpoint after every epoch (the golden
run). From the epoch-2 checkpoint, each run flips a few dozen bits in the model's
weights and biases and training resumes to epoch 4:

- ``random-bits``: each flip at a random bit of a random float32 word;
- ``spare-exp-msb``: the same number of flips at random bits other than the
  exponent's most significant bit (bit 30);
- ``control``: no flip at all (must reproduce the golden curve bit for bit).

Every run is classified (masked, recovered, degraded, diverged, crashed; see
``docs/experiment.md``); *failure* is degraded + diverged + crashed. The demo prints,
per framework and scenario, the failure rate with its 95% Wilson interval, and
Fisher's exact test of the two scenarios against each other (and of the two
frameworks on each scenario), Holm-corrected over those four comparisons. It
writes everything (checkpoints, logs, ``results.csv``, ``summary.csv``,
``tests.csv``, ``accuracy.png``, an HTML report per framework and
``contrast.csv``) under ``demo-out/``; running it again reuses what is there. The
outcomes are measured, not chosen: nothing here is tuned to produce an answer.

Usage: ``python -m fastflip.demo [OUT_DIR] [--fresh] [--framework keras|torch] [--repetitions R]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .campaign.significance import PAIRWISE_FIELDS, pairwise_tests
from .experiment.outcomes import write_csv
from .experiment.runner import run_experiment
from .report import write_report

__all__ = ["demo_config", "contrast_tests", "format_contrast", "main"]

EPOCHS = 4
INJECT_EPOCH = 2
REPETITIONS = 12
FLIPS = 32
#: Every float32 bit but the exponent's most significant one (bit 30).
SPARE_EXP_MSB = "0-29,31"


def demo_config(framework: str, repetitions: int = REPETITIONS) -> dict[str, Any]:
    """The demo experiment for ``framework`` (``"keras"`` or ``"torch"``) as a configuration mapping.

    >>> cfg = demo_config("torch")
    >>> [(s["name"], s.get("bits"), s.get("count")) for s in cfg["scenarios"]]
    [('random-bits', 'all', 32), ('spare-exp-msb', '0-29,31', 32), ('control', None, None)]
    """
    model_tensors = {"roles": ["weight", "bias"]}
    return {
        "name": f"digits-{framework}",
        "epochs": EPOCHS,
        "seed": 0,
        "repetitions": repetitions,
        "tolerance": 0.02,
        "trainer": {"framework": framework, "batch_size": 32},
        "failure": ["degraded", "diverged", "crashed"],
        "compare": [["random-bits", "spare-exp-msb"]],
        "scenarios": [
            {"name": "random-bits", "epoch": INJECT_EPOCH, "bits": "all", "count": FLIPS,
             "selection": model_tensors},
            {"name": "spare-exp-msb", "epoch": INJECT_EPOCH, "bits": SPARE_EXP_MSB, "count": FLIPS,
             "selection": model_tensors},
            {"name": "control", "epoch": INJECT_EPOCH, "control": True, "repetitions": 1},
        ],
    }


def contrast_tests(summaries: Mapping[str, Sequence[Mapping[str, Any]]],
                   scenarios: Sequence[str] = ("random-bits", "spare-exp-msb")) -> list[dict[str, Any]]:
    """Fisher's exact tests of the failure rate: the scenarios within each framework, and the frameworks
    on each scenario, Holm-corrected together.

    ``summaries`` maps a framework to its experiment's summary rows
    (:func:`fastflip.experiment.outcomes.summarize`). Groups are named ``framework:scenario``.

    >>> s = {"keras": [{"scenario": "a", "failures": 9, "runs": 10}, {"scenario": "b", "failures": 0, "runs": 10}]}
    >>> [(r["a"], r["b"]) for r in contrast_tests(s, ("a", "b"))]
    [('keras:a', 'keras:b')]
    """
    groups = {f"{fw}:{r['scenario']}": (int(r["failures"]), int(r["runs"]))
              for fw, rows in summaries.items() for r in rows if r["scenario"] in scenarios}
    fws = list(summaries)
    pairs = [(f"{fw}:{scenarios[0]}", f"{fw}:{scenarios[1]}") for fw in fws]
    pairs += [(f"{a}:{sc}", f"{b}:{sc}") for sc in scenarios
              for i, a in enumerate(fws) for b in fws[i + 1:]]
    return pairwise_tests(groups, [p for p in pairs if p[0] in groups and p[1] in groups], what="scenario")


def format_contrast(summaries: Mapping[str, Sequence[Mapping[str, Any]]], tests: Sequence[Mapping[str, Any]],
                    scenarios: Sequence[str] = ("random-bits", "spare-exp-msb")) -> str:
    """The contrast as a Markdown table (failure rates with Wilson intervals) and the tests below it."""
    lines = ["| framework | scenario | runs | masked | recovered | degraded | diverged | crashed "
             "| failure rate [95% Wilson] |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for fw, rows in summaries.items():
        for r in rows:
            if r["scenario"] in scenarios:
                lines.append(f"| {fw} | {r['scenario']} | {r['runs']} | {r['masked']} | {r['recovered']} | "
                             f"{r['degraded']} | {r['diverged']} | {r['crashed']} | {r['failures']}/{r['runs']} = "
                             f"{r['failure_rate']:.0%} [{r['failure_low']:.0%}, {r['failure_high']:.0%}] |")
    lines += ["", "| comparison | failures | Fisher exact p | Holm-adjusted p |", "|---|---|---:|---:|"]
    for t in tests:
        lines.append(f"| {t['a']} vs {t['b']} | {t['a_failures']}/{t['a_trials']} vs {t['b_failures']}/{t['b_trials']}"
                     f" | {t['p_value']:.3g} | {t['p_holm']:.3g}{' *' if t['significant'] else ''} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 when every framework's experiment completed."""
    p = argparse.ArgumentParser(prog="python -m fastflip.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="demo-out", help="output directory (default demo-out)")
    p.add_argument("--fresh", action="store_true", help="delete earlier demo results first")
    p.add_argument("--framework", choices=("keras", "torch"), action="append",
                   help="run only this framework (repeatable; default both)")
    p.add_argument("--repetitions", type=int, default=REPETITIONS, help=f"runs per scenario (default {REPETITIONS})")
    args = p.parse_args(argv)
    root = Path(args.out)
    if args.fresh and root.exists():
        shutil.rmtree(root)
    t0 = time.perf_counter()
    summaries: dict[str, list[dict[str, Any]]] = {}
    for fw in args.framework or ["keras", "torch"]:
        t = time.perf_counter()
        print(f"== {fw}: golden run of {EPOCHS} epochs, then {FLIPS} flips in weights and biases at epoch "
              f"{INJECT_EPOCH}, {args.repetitions} runs per scenario", flush=True)
        res = run_experiment(demo_config(fw, args.repetitions), root / fw,
                             progress=lambda s: print("  " + s, flush=True))
        print(res.table())
        summaries[fw] = res.summary
        control = [r for r in res.results if r["scenario"] == "control"]
        print(f"control run reproduces golden exactly: {all(r['matches_golden'] for r in control)}")
        tm = res.timings
        train = tm["golden_train_s"] + tm["run_train_s"]
        handling = tm["golden_checkpoint_s"] + tm["run_inject_s"] + tm["run_load_s"]
        if train > 0:
            print(f"time: training {train:.1f} s, checkpoint save/inject/load {handling:.2f} s "
                  f"({100 * handling / train:.1f}% of training)")
        report = write_report(res.out, root / f"{fw}-report")
        print(f"outputs: {res.out}/results.csv, summary.csv, tests.csv, accuracy.png; report {report.index} "
              f"({time.perf_counter() - t:.1f} s)\n", flush=True)
    tests = contrast_tests(summaries)
    write_csv(root / "contrast.csv", tests, [*PAIRWISE_FIELDS, "a_low", "a_high", "b_low", "b_high"])
    print(f"== what was measured: {FLIPS} bit flips per run into the weights and biases of a digits CNN after "
          f"epoch {INJECT_EPOCH} of {EPOCHS};\n   failure = the run ends degraded (>2% accuracy below golden), "
          "diverged (NaN/Inf or chance) or crashed\n")
    print(format_contrast(summaries, tests))
    print(f"\n(* significant at 0.05 after Holm's correction; table in {os.path.join(str(root), 'contrast.csv')})")
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
