"""Region evidence for a new file (``inject -o OUT --evidence regions``): the cost of checking the copy and
writing the touched bytes into it, at many flips, for one or more source trees side by side.

Run (each tree in its own process, the trees alternating, every process a few rounds)::

    python bench/region_redo.py --tree /work/main/src --tree $PWD/src [--flips 100000] [--mib 64]
        [--format safetensors|npz] [--procs 3] [--rounds 5] [--fallback]

Per tree: the median over all rounds of the CPU time (user + system, ``time.process_time``) and the wall time of

* ``segment``: from the end of the kernel copy to the staging of the log (the check of the copy, the writes
  into it, the input's state and the output's check), with the page faults (``ru_minflt``) in it;
* ``call``: the whole of :func:`fastflip.files.copyregions.write_copy_regions` (prediction, fingerprints,
  copy, segment, log staging);
* ``replay`` and ``revert`` (CPU): the log replayed onto the input into a third file, then the output reverted
  (region evidence: the touched ranges checked and written, the fingerprints; durable, as the defaults are).

The file (``--mib`` MiB of float32, written once under ``$FASTFLIP_BENCH_DIR`` or a temporary directory) stays
in the page cache; the outputs are written with ``durable=False`` (no fsync), so the figures are CPU work.
``--fallback`` adds, per tree that has :mod:`fastflip.files.rangeio`, a run of its NumPy pass (no native module).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, resource, sys, time
import numpy as np
src, rounds, flips = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from fastflip.files import copyregions, fingerprint
from fastflip.files.inject import inject_file
from fastflip.files.replay import replay
from fastflip.files.revert import revert
if os.environ.get("REDO_FALLBACK"):  # the NumPy pass of files/rangeio.py, as without a C compiler
    from fastflip.files import rangeio
    rangeio._NATIVE = None

marks = {}
home = copyregions if hasattr(copyregions, "kernel_copy") else fingerprint  # where this tree makes the copy
real_copy, real_call = home.kernel_copy, copyregions.write_copy_regions

def stamp(key):
    marks[key] = (time.process_time(), time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt)

def copy(*a, **kw):
    r = real_copy(*a, **kw)
    stamp("copied")
    return r

def call(src, tmp, plan, by_name, routes, cp, zipped, finish, *a, **kw):
    def fin(*fa, **fkw):
        stamp("finish")
        return finish(*fa, **fkw)
    stamp("start")
    r = real_call(src, tmp, plan, by_name, routes, cp, zipped, fin, *a, **kw)
    stamp("end")
    return r

home.kernel_copy, copyregions.write_copy_regions = copy, call  # inject imports it from there at each call
out = []
for i in range(rounds + 1):
    dst = src + f".out{os.getpid()}"
    inject_file(src, dst, hash_files="regions", seed=i, count=flips, durable=False)
    seg = [b - a for a, b in zip(marks["copied"], marks["finish"])]
    whole = [b - a for a, b in zip(marks["start"], marks["end"])]
    t = time.process_time()
    replay(dst + ".fflog", src, dst + ".again")
    t1 = time.process_time()
    revert(dst + ".fflog", dst)
    t2 = time.process_time()
    for p in (dst, dst + ".fflog", dst + ".again", dst + ".again.fflog"):
        if os.path.exists(p):
            os.unlink(p)
    if i:  # the first round warms imports and caches
        out.append({"seg_cpu": seg[0], "seg_wall": seg[1], "seg_faults": seg[2], "call_cpu": whole[0],
                    "call_wall": whole[1], "replay_cpu": t1 - t, "revert_cpu": t2 - t1})
print(json.dumps(out))
"""


def make(path: str, mib: int, fmt: str) -> str:
    import numpy as np

    w = (np.random.default_rng(0).standard_normal(mib << 18) * 0.05).astype("<f4")
    if fmt == "npz":
        np.savez(path, w=w[: len(w) // 2], v=w[len(w) // 2 :])  # stored members: CRC fields follow the words
    else:
        from safetensors.numpy import save_file

        save_file({"w": w[: len(w) // 2], "v": w[len(w) // 2 :]}, path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="a src/ directory (PYTHONPATH); repeatable")
    ap.add_argument("--flips", type=int, default=100_000)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--format", choices=["safetensors", "npz"], default="safetensors")
    ap.add_argument("--procs", type=int, default=3, help="processes per tree (alternating)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per process")
    ap.add_argument("--fallback", action="store_true", help="also each tree's NumPy pass (files/rangeio.py)")
    a = ap.parse_args()
    d = os.environ.get("FASTFLIP_BENCH_DIR") or tempfile.mkdtemp(prefix="ffredo")
    os.makedirs(d, exist_ok=True)
    src = make(os.path.join(d, f"redo-{a.mib}.{'npz' if a.format == 'npz' else 'safetensors'}"), a.mib, a.format)
    runs = [(t, "") for t in a.tree]
    runs += [(t, "1") for t in a.tree if a.fallback and os.path.exists(os.path.join(t, "fastflip/files/rangeio.py"))]
    got: dict[str, list[dict]] = {t + (" (numpy)" if fb else ""): [] for t, fb in runs}
    try:
        for _ in range(a.procs):
            for t, fb in runs:
                env = dict(os.environ, PYTHONPATH=t, REDO_FALLBACK=fb)
                r = subprocess.run([sys.executable, "-c", CHILD, src, str(a.rounds), str(a.flips)], env=env,
                                   check=True, capture_output=True, text=True)
                got[t + (" (numpy)" if fb else "")] += json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(src)
    print(f"{a.flips} flips, {a.mib} MiB {a.format}; medians of {a.procs}x{a.rounds} rounds; load "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'tree':<48} {'segment cpu':>12} {'wall':>8} {'faults':>7} {'call cpu':>9} {'wall':>8} {'replay':>7} "
          f"{'revert':>7}")
    for t, rs in got.items():
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{t:<48} {m['seg_cpu']:>12.4f} {m['seg_wall']:>8.4f} {m['seg_faults']:>7.0f} {m['call_cpu']:>9.4f} "
              f"{m['call_wall']:>8.4f} {m['replay_cpu']:>7.3f} {m['revert_cpu']:>7.3f}")


if __name__ == "__main__":
    main()
