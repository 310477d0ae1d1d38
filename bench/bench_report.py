"""Speed and memory of ``fastflip report`` over a results store of 1,000,000 trials.

Run: ``pytest bench/bench_report.py --benchmark-only --benchmark-columns=min,median,max,rounds -s``

The store is written through the store's batch insert API with synthetic but plausible
outcomes: 20 layers × (32 single-bit cells of 781 trials + one ``all`` cell of 25,008
trials whose bit position is only in each trial's ``sites`` text), float32-like rates
(exponent MSB: mostly DUE / critical SDC; low mantissa bits: mostly masked).
The whole-command figure (wall time and peak RSS) comes from ``fastflip report`` run in
a fresh process; the benchmark times :func:`fastflip.report.write_report` in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from fastflip.report import write_report
from fastflip.campaign.store import ResultStore, TrialRow

N_LAYERS, PER_BIT, PER_ALL = 20, 781, 25_008  # 20 * (32 * 781 + 25008) = 1,000,000


def _probs(bit: np.ndarray) -> np.ndarray:
    """Outcome probabilities (masked, sdc, critical, due) per bit position of a float32."""
    p = np.empty((len(bit), 4))
    p[:] = (0.80, 0.19, 0.009, 0.001)  # mantissa
    p[bit < 8] = (0.97, 0.03, 0.0, 0.0)
    exp = (bit >= 23) & (bit <= 29)
    p[exp] = (0.30, 0.55, 0.12, 0.03)
    p[bit == 30] = (0.02, 0.08, 0.30, 0.60)
    p[bit == 31] = (0.45, 0.45, 0.09, 0.01)
    return p


def _outcomes(rng: np.random.Generator, bits: np.ndarray) -> np.ndarray:
    c = _probs(bits).cumsum(axis=1)
    u = rng.random(len(bits))[:, None]
    return (u > c).sum(axis=1).clip(0, 3)


def make_store(path: str, seed: int = 0) -> int:
    """Write the 1,000,000-trial store; return its trial count."""
    cells = []
    for g in range(N_LAYERS):
        for b in range(32):
            cells.append({"key": f"bits={b}|layer=layer{g}|flips=1|fault=flip", "bits": str(b), "grp": f"layer{g}",
                          "group_by": "layer", "flips": 1, "fault": "flip", "planned": PER_BIT, "population": 65536})
        cells.append({"key": f"bits=all|layer=layer{g}|flips=1|fault=flip", "bits": "all", "grp": f"layer{g}",
                      "group_by": "layer", "flips": 1, "fault": "flip", "planned": PER_ALL,
                      "population": 65536 * 32})
    config = {"name": "bench-1M", "seed": seed, "trials": {"per_cell": PER_BIT, "confidence": 0.95},
              "cells": {"bits": [str(b) for b in range(32)] + ["all"], "group_by": "layer"}}
    rng = np.random.default_rng(seed)
    total = 0
    with ResultStore.create(path, config, cells, input_hashes={"model.h5": "0" * 64}) as st:
        for cid, cell in enumerate(cells):
            n = cell["planned"]
            bits = rng.integers(0, 32, n) if cell["bits"] == "all" else np.full(n, int(cell["bits"]))
            idx = rng.integers(0, 65536, n)
            outc = _outcomes(rng, bits)
            metric = 0.9 - rng.random(n) * 0.1
            name = f"{cell['grp']}/kernel"
            rows = [TrialRow(cid, t, t, f"{name}[{i}]^b{b}", int(o), float(m), 0.9 - float(m), None, 0.001, "w0")
                    for t, (i, b, o, m) in enumerate(zip(idx.tolist(), bits.tolist(), outc.tolist(), metric.tolist()))]
            total += st.add_trials(rows)
    with ResultStore.open(path, writable=True) as st:  # as a sweep records them: bit classes and drops are drawn
        st.set_meta("cell_dtypes", json.dumps({c["key"]: ["float32"] for c in cells}))
    return total


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("bench-report") / "million.db")
    t = time.perf_counter()
    n = make_store(path)
    assert n == 1_000_000
    print(f"\nwrote {n:,} trials in {time.perf_counter() - t:.1f} s ({os.path.getsize(path) / 2**20:.0f} MiB)")
    return path


def test_report_cli_1m_trials(big_store, tmp_path, benchmark):
    """The whole command in a fresh process: wall time and peak RSS (ru_maxrss of the child)."""
    out = tmp_path / "cli-report"

    def once() -> tuple[float, float]:
        t = time.perf_counter()
        code = (
            "import resource, sys; from fastflip.cli import main; rc = main(sys.argv[1:]); "
            "print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)"
        )
        res = subprocess.run([sys.executable, "-c", code, "report", big_store, "-o", str(out)],
                             capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t
        rss = int(res.stdout.split("maxrss_kib")[1].split()[0]) / 1024
        return wall, rss

    results = benchmark.pedantic(once, rounds=3, iterations=1)
    wall, rss = results
    benchmark.extra_info.update(trials=1_000_000, last_wall_s=round(wall, 2), peak_rss_mib=round(rss, 1))
    print(f"\nfastflip report over 1,000,000 trials: {wall:.1f} s wall, peak RSS {rss:.0f} MiB")
    assert (out / "index.html").is_file()


def test_aggregate_1m_trials(big_store, benchmark):
    """The SQL aggregation alone (load_campaign_data)."""
    from fastflip.report import load_campaign_data

    data = benchmark.pedantic(load_campaign_data, args=(big_store,), rounds=3, iterations=1)
    assert data.n_trials == 1_000_000


def test_write_report_1m_trials(big_store, tmp_path, benchmark):
    """write_report in-process (aggregation, figures, tables, page)."""
    rep = benchmark.pedantic(write_report, args=(big_store, tmp_path / "rep"), kwargs={"force": True},
                             rounds=3, iterations=1)
    assert {"bits.png", "heatmap.png", "outcomes.png", "drops.png"} <= set(rep.figures)
