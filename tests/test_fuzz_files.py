"""Seeded byte-level fuzzing of HDF5 checkpoints, .keras archives and logs through the CLI.

Every case mutates a real file (1-8 byte-level changes), runs a command on it in a worker process
and asserts the one error path: exit code 0, 1 or 2 (never an escaped exception or an "internal
error"), exactly one line on stderr when it fails, no traceback, no change to the input, and an answer within
the per-case time limit (a hung worker is killed and the case fails). The default run covers
1,100 cases; ``-m slow`` runs 6,000 more.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import zipfile

import h5py
import numpy as np
import pytest

from fastflip.files.inject import inject_file
from h5fixtures import keras_legacy_like

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
CASE_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzbase")
    h5 = str(d / "model.h5")
    keras_legacy_like(h5)
    with h5py.File(h5, "a") as f:  # every storage kind a checkpoint uses
        f.create_dataset("extra/gz", data=np.linspace(-2, 2, 96, dtype="f4").reshape(12, 8), chunks=(4, 4),
                         compression="gzip", shuffle=True)
        f.create_dataset("extra/chunked", data=np.arange(48, dtype="<i2").reshape(6, 8), chunks=(3, 4))
        f.create_dataset("extra/be", data=np.arange(4, dtype=">f8"))
    inner = str(d / "inner.h5")
    with h5py.File(inner, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.linspace(-1, 1, 64, dtype="f4").reshape(8, 8))
        f.create_dataset("optimizer/vars/1", data=np.zeros(8, "f4"), chunks=(4,), compression="gzip")
    keras = str(d / "model.keras")
    with zipfile.ZipFile(keras, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("metadata.json", '{"keras_version": "3.0"}')
        z.writestr("config.json", json.dumps({"class_name": "Sequential", "config": {"layers": []}}))
        z.write(inner, "model.weights.h5")
    out = str(d / "out.h5")
    res = inject_file(h5, out, seed=5, count=12)
    gz_out = str(d / "gz_out.h5")
    res_gz = inject_file(h5, gz_out, seed=6, count=6, selection={"include": ["extra/gz"]})
    return {"h5": h5, "keras": keras, "out": out, "log": res.log_path, "gz_out": gz_out, "gz_log": res_gz.log_path}


def commands(b):
    """(kind, base file, extension, argv templates) — {in} is the mutated file, {work} the scratch folder."""
    return [
        ("h5", b["h5"], ".h5", [["inspect", "{in}"], ["inject", "{in}", "-o", "{work}/out.h5", "--count", "4",
                                                      "--seed", "1", "--force"]]),
        ("keras", b["keras"], ".keras", [["inspect", "{in}"], ["inject", "{in}", "-o", "{work}/out.keras",
                                                               "--count", "3", "--seed", "1", "--force"]]),
        ("log", b["log"], ".fflog", [["log", "{in}"], ["revert", "{in}", b["out"], "-o", "{work}/out.h5", "--force"],
                                     ["replay", "{in}", b["h5"], "-o", "{work}/out.h5", "--force"]]),
        ("gzlog", b["gz_log"], ".fflog", [["revert", "{in}", b["gz_out"], "-o", "{work}/out.h5", "--force"],
                                          ["replay", "{in}", b["h5"], "-o", "{work}/out.h5", "--force"]]),
        ("text", b["h5"], ".yaml", [["experiment", "{in}"]]),
    ]


class Worker:
    def __init__(self, work: str) -> None:
        self.work = work
        self.p: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "fuzz_worker.py"), self.work],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=SRC + os.pathsep + HERE))

    def ask(self, case: dict) -> dict | None:
        if self.p is None or self.p.poll() is not None:
            self.start()
        assert self.p is not None and self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(json.dumps(case) + "\n")
        self.p.stdin.flush()
        ready, _, _ = select.select([self.p.stdout], [], [], CASE_TIMEOUT)
        line = self.p.stdout.readline() if ready else ""
        if not line:  # hung (timeout) or died: kill, restart for the next case
            self.p.kill()
            self.p.wait()
            self.p = None
            return None
        return json.loads(line)

    def close(self) -> None:
        if self.p is not None:
            self.p.kill()
            self.p.wait()


def fuzz(bases, tmp_path, n_per_command: int, seed0: int) -> dict:
    work = str(tmp_path / "work")
    os.mkdir(work)
    w = Worker(work)
    stats = {"cases": 0, "rc": {}, "failures": []}
    try:
        for ki, (kind, base, ext, argvs) in enumerate(commands(bases)):
            for ci, argv in enumerate(argvs):
                for k in range(n_per_command):
                    seed = seed0 + 1000 * ci + k + 100_000 * ki
                    case = {"base": base, "ext": ext, "seed": seed, "argv": argv}
                    r = w.ask(case)
                    stats["cases"] += 1
                    what = f"{kind} {argv[0]} seed={seed}"
                    if r is None:
                        stats["failures"].append(f"{what}: hung or crashed")
                        continue
                    stats["rc"][r["rc"]] = stats["rc"].get(r["rc"], 0) + 1
                    lines = [x for x in r["stderr"].splitlines() if x.strip()]
                    if r["rc"] not in (0, 1, 2) or (r["rc"] != 0 and len(lines) != 1) or "Traceback" in r["stderr"] \
                            or "internal error" in r["stderr"]:
                        stats["failures"].append(f"{what}: rc {r['rc']}: {r['stderr'][-400:]!r}")
                    if r["changed"]:
                        stats["failures"].append(f"{what}: the input changed")
    finally:
        w.close()
    return stats


def _report(stats: dict) -> str:
    return f"{len(stats['failures'])} of {stats['cases']} cases failed:\n" + "\n".join(stats["failures"][:25])


def test_fuzz_default(bases, tmp_path):
    stats = fuzz(bases, tmp_path, n_per_command=int(os.environ.get("FUZZ_N", 110)), seed0=1)
    assert stats["cases"] >= 10 * int(os.environ.get("FUZZ_N", 110))
    assert not stats["failures"], _report(stats)
    assert stats["rc"].get(2, 0) > 0  # the mutations did break things: the error path was exercised


@pytest.mark.slow
def test_fuzz_large(bases, tmp_path):
    stats = fuzz(bases, tmp_path, n_per_command=600, seed0=10_000)
    assert stats["cases"] >= 6000
    assert not stats["failures"], _report(stats)
