"""Campaign overhead: trials/s of a sweep whose evaluator returns a constant, RSS over time, store size.

Target: ResNet-50-sized float32 weights in memory (``resnet50.resnet50_arrays``, 25.6 M values in 320
tensors), one flip per trial anywhere in them, 2 worker processes, results into SQLite. Everything but
the evaluator is the real path: plan from (seed, cell, trial) → live inject → evaluate → exact revert →
row shipped to the single writer → batched insert.

Run: ``pytest bench/bench_campaign.py --benchmark-only -s`` (``FASTFLIP_BENCH_TRIALS=1000000`` for the
full million; default 200 000).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

import pytest

from fastflip.campaign import Campaign
from fastflip.campaign.sweep import campaign_cells, sweep
from fastflip.campaign.trials import TrialRunner

HERE = os.path.dirname(os.path.abspath(__file__))
TRIALS = int(os.environ.get("FASTFLIP_BENCH_TRIALS", "200000"))
WORKERS = int(os.environ.get("FASTFLIP_BENCH_WORKERS", "2"))


def constant(weights: object) -> float:
    """The overhead-only evaluator."""
    return 1.0


def overhead_campaign(trials: int) -> Campaign:
    return Campaign.from_dict({
        "name": "overhead", "seed": 1, "paths": [HERE],
        "target": {"factory": "resnet50:resnet50_arrays"},
        "select": {"dtypes": ["float32"]},
        "cells": {"bits": ["all"], "group_by": "none", "flips": [1]},
        "trials": {"per_cell": trials},
        "evaluator": {"function": "bench_campaign:constant"},
    })


class Monitor(threading.Thread):
    """Samples (seconds, trials stored, RSS of the sweep and of each worker) twice a second."""

    def __init__(self, store: str) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.samples: list[tuple[float, int, int, list[int]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        me = psutil.Process()
        t0 = time.monotonic()
        while not self.stop.wait(0.5):
            n = 0
            if os.path.exists(self.store):
                try:
                    con = sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=1)
                    n = con.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
                    con.close()
                except sqlite3.Error:
                    continue
            workers = []
            for c in me.children(recursive=True):
                try:
                    workers.append(c.memory_info().rss)
                except psutil.Error:
                    pass
            self.samples.append((time.monotonic() - t0, n, me.memory_info().rss, workers))


def test_trial_cost_in_process(benchmark):
    """One trial in a worker (plan + inject + evaluate + revert + row), no process boundary."""
    c = overhead_campaign(10**9)
    runner = TrialRunner(c, campaign_cells(c))
    counter = iter(range(10**9))
    benchmark(lambda: runner.run(0, next(counter)))


def test_checkpoint_trial_cost(benchmark, tmp_path):
    """One checkpoint-mode trial on a ~100 MB ResNet-50 checkpoint: inject into the worker's copy, evaluate, restore."""
    import resnet50

    ckpt = resnet50.write_keras_legacy_checkpoint(str(tmp_path / "r50.h5"))
    c = Campaign.from_dict({
        "name": "ckpt", "seed": 1, "mode": "checkpoint", "paths": [HERE], "target": {"checkpoint": ckpt},
        "select": {"dtypes": ["float32"]}, "cells": {"bits": ["all"]}, "trials": {"per_cell": 10**9},
        "evaluator": {"function": "bench_campaign:constant"},
    })
    runner = TrialRunner(c, campaign_cells(c))
    counter = iter(range(10**9))
    try:
        benchmark(lambda: runner.run(0, next(counter)))
    finally:
        runner.close()


def test_sweep_overhead(benchmark, tmp_path):
    pytest.importorskip("psutil")
    c = overhead_campaign(TRIALS)
    out: dict[str, object] = {}

    def run() -> None:
        store = str(tmp_path / f"overhead-{time.monotonic_ns()}.db")
        mon = Monitor(store)
        mon.start()
        res = sweep(c, store, workers=WORKERS, progress=False)
        mon.stop.set()
        mon.join()
        out.update(res=res, store=store, samples=mon.samples)

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = out["res"]
    samples = out["samples"]
    assert res.complete and res.stored == TRIALS
    size = os.path.getsize(out["store"])
    # worker RSS once a fifth of the trials are stored vs at the end: the trial loop must not grow memory
    busy = [s for s in samples if TRIALS // 5 <= s[1] < TRIALS and s[3]]  # workers running, not yet exiting
    first, last = busy[0], busy[-1]
    growth = max(last[3]) - max(first[3])
    info = {
        "trials": TRIALS, "workers": WORKERS, "elapsed_s": round(res.elapsed, 2), "trials_per_s": round(res.rate),
        "store_bytes": size, "store_bytes_per_trial": round(size / TRIALS, 1),
        "worker_rss_mib_at_20pct": round(max(first[3]) / 2**20, 1), "worker_rss_mib_at_end": round(max(last[3]) / 2**20, 1),
        "sweep_rss_mib_at_20pct": round(first[2] / 2**20, 1), "sweep_rss_mib_at_end": round(last[2] / 2**20, 1),
    }
    benchmark.extra_info.update(info)
    print("\n" + " ".join(f"{k}={v}" for k, v in info.items()))
    assert growth < 16 * 2**20, f"worker RSS grew by {growth / 2**20:.1f} MiB during the sweep"
    assert last[2] - first[2] < 32 * 2**20, "the sweep process's RSS grew with the trials"
