"""CPU time (user + sys) and wall of a 1-flip inject into a 100 MB HDF5 file, next to its floor, side by side.

Each round runs the floor (``python -c "import numpy, h5py"`` + ``cp`` of the file), then ``fastflip inject ... --count
1 -q`` from each source tree given; the medians over the rounds are printed with their ratio to the floor. CPU time
(of the child processes, from ``getrusage``) varies far less with the load of a shared machine than wall time::

    python bench/one_flip_cpu.py --rounds 11 /tmp/old/src src

The file (4 float32 datasets of 25 MiB: ``h5_noise.write_h5_100``, as bench/test_cli_floor_bench.py's ``h5_100``)
is made once in ``--dir``.
Bytecode is cached outside the trees (``PYTHONPYCACHEPREFIX``); ``FASTFLIP_HASH_CACHE=off`` in the environment
makes every run hash its input too.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from h5_noise import write_h5_100


def _run(cmds: list[list[str]], env: dict[str, str]) -> tuple[float, float, float]:
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    for c in cmds:
        subprocess.run(c, env=env, check=True, capture_output=True)
    r1, t1 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    return t1 - t0, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", help="source trees (each put first on PYTHONPATH)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--dir", default="/tmp/fastflip-one-flip")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    f = os.path.join(a.dir, "m100.h5")
    if not os.path.exists(f):
        write_h5_100(f)
    env0 = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    env0.setdefault("PYTHONPYCACHEPREFIX", os.path.join(a.dir, "pycache"))
    py = sys.executable
    jobs: list[tuple[str, list[list[str]] | None, dict[str, str]]] = [
        ("floor", [[py, "-c", "import numpy, h5py"], ["cp", f, f + ".cp"]], env0)]
    jobs += [(t, None, dict(env0, PYTHONPATH=os.path.abspath(t))) for t in a.trees]
    res: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _, _ in jobs}
    for i in range(a.rounds + 1):  # round 0 warms the caches and compiles the bytecode
        for name, cmds, env in jobs:
            run = cmds or [[py, "-m", "fastflip", "inject", f, "-o", f + ".out", "--count", "1", "--seed", str(i + 1),
                            "--force", "-q"]]
            r = _run(run, env)
            if i:
                res[name].append(r)
    fw = statistics.median(x[0] for x in res["floor"])
    fc = statistics.median(x[1] + x[2] for x in res["floor"])
    for name, rows in res.items():
        w, u, s = (statistics.median(x[j] for x in rows) for j in range(3))
        c = statistics.median(x[1] + x[2] for x in rows)
        print(f"{name[-32:]:32s} wall {w:.3f} s  user {u:.3f}  sys {s:.3f}  user+sys {c:.3f}   "
              f"x floor: wall {w / fw:.2f}  cpu {c / fc:.2f}")


if __name__ == "__main__":
    main()
