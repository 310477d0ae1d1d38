"""Benchmarks: campaign trials on an ``.npz`` checkpoint with a 100 MB member, and one flip into it.

Run (this tree, then the tree to compare with, in one session)::

    FASTFLIP_BENCH_DIR=/tmp/ffbench PYTHONPATH=$PWD/src python -m pytest bench/test_npz_bench.py --benchmark-only \\
        -p no:cacheprovider --benchmark-columns=min,median,max,rounds --benchmark-group-by=group -s

The file: ``np.savez`` of a 100 MB float32 member (25M values) and a 64-value one, stored (not deflated). Its
floor is the same array as a ``.npy`` file (no zip: no member check, no CRC fields), through the same calls.

* ``npz trials``: a checkpoint-mode campaign's :class:`~fastflip.campaign.trials.TrialRunner`, 20 trials of one
  flip each into the big member (inject in the working copy, evaluate, undo) per round; the evaluator reads
  nothing (a constant metric), so the figure is fastflip's own work per trial. The bytes the process reads per
  trial (``/proc/self/io`` ``rchar``, load-independent) are printed and kept in ``extra_info``.
* ``npz 1 flip``: ``inject_file`` of one flip into a new file (log written, not fsynced) and in place, direct
  (``in_place=True, atomic=False``, log written), with ``cp`` of the file as the copy's floor; bytes read per inject
  likewise.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest

from fastflip.files.inject import inject_file

TRIALS = 20
ROUNDS = 5
BIG = 25_000_000  # float32 values: 100 MB


def evaluate_nothing(path):  # type: ignore[no-untyped-def]
    """The trial's evaluator: a constant metric, reading nothing (the trial's cost is fastflip's alone)."""
    return 1.0


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


@pytest.fixture(scope="module")
def files():  # type: ignore[no-untyped-def]
    root = os.environ.get("FASTFLIP_BENCH_DIR") or tempfile.mkdtemp(prefix="ffnpz-")
    os.makedirs(root, exist_ok=True)
    big = np.random.default_rng(0).standard_normal(BIG, dtype=np.float32)
    out = {"dir": root, "npz": os.path.join(root, "npz100.npz"), "npy": os.path.join(root, "npz100.npy")}
    if not os.path.exists(out["npz"]):
        np.savez(out["npz"], big=big, small=np.ones(64, "f4"))
    if not os.path.exists(out["npy"]):
        np.save(out["npy"], big)
    return out


def _runner(files, kind: str):  # type: ignore[no-untyped-def]
    from fastflip.campaign import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    c = Campaign.from_dict({
        "name": f"bench-{kind}", "seed": 1, "mode": "checkpoint", "target": {"checkpoint": files[kind]},
        "paths": [os.path.dirname(__file__)], "select": {"include": ["/big", "big"]} if kind == "npz" else {},
        "cells": {"bits": ["all"], "flips": [1]}, "trials": {"per_cell": 10_000},
        "evaluator": {"function": "test_npz_bench:evaluate_nothing"}}, base_dir=files["dir"])
    return TrialRunner(c, campaign_cells(c))


@pytest.mark.benchmark(group="npz trials (20 trials of 1 flip, per round)")
@pytest.mark.parametrize("kind", ["npz", "npy"], ids=["npz 100 MB member", "floor: npy 100 MB"])
def test_npz_trials(benchmark, files, kind):
    runner = _runner(files, kind)
    copy = runner.targets[None]
    before = open(copy, "rb").read(1 << 20)
    trial = [0]
    read = [0]

    def run():  # type: ignore[no-untyped-def]
        r0 = _rchar()
        for _ in range(TRIALS):
            runner.run(0, trial[0])
            trial[0] += 1
        read[0] += _rchar() - r0

    try:
        benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
        per_trial = read[0] / ((ROUNDS + 1) * TRIALS)
        benchmark.extra_info["bytes_read_per_trial"] = per_trial
        print(f"\n{kind}: {per_trial:,.0f} bytes read per trial")
        assert open(copy, "rb").read(1 << 20) == before
    finally:
        runner.close()


MODES = {"new file": {}, "in place, direct": {"in_place": True, "atomic": False}}


@pytest.mark.benchmark(group="npz 1 flip")
@pytest.mark.parametrize("mode", list(MODES))
def test_npz_one_flip(benchmark, files, mode):
    kw = MODES[mode]
    src = os.path.join(files["dir"], "work.npz")
    shutil.copyfile(files["npz"], src)
    out = None if kw else os.path.join(files["dir"], "out.npz")
    log = os.path.join(files["dir"], "one.fflog")
    seed = [0]
    read = [0]

    def run():  # type: ignore[no-untyped-def]
        seed[0] += 1
        r0 = _rchar()
        inject_file(src, out, selection={"include": ["/big"]}, count=1, seed=seed[0], log_path=log, durable=False,
                    **kw)
        read[0] += _rchar() - r0

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    per = read[0] / (ROUNDS + 1)
    benchmark.extra_info["bytes_read_per_inject"] = per
    print(f"\n{mode}: {per / 1e6:,.1f} MB read per inject")


@pytest.mark.benchmark(group="npz 1 flip")
def test_npz_floor_cp(benchmark, files):
    out = os.path.join(files["dir"], "cp.npz")
    benchmark.pedantic(shutil.copyfile, args=(files["npz"], out), rounds=ROUNDS, iterations=1, warmup_rounds=1)
