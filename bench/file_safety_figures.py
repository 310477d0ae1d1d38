"""File-safety figures: peak RSS of the archive path on a 2 GiB-inflating member, and leftovers
in $TMPDIR / beside the output after random kills of inject (and after the next start).

Run: ``python bench/file_safety_figures.py [--quick]`` (single process; writes ~2 GiB of scratch in $TMPDIR).
The inspect time on a 30-level doubling hard-link chain is a pytest-benchmark: ``bench/test_file_safety_bench.py``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile

import h5py
import numpy as np

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
ENV = dict(os.environ, PYTHONPATH=SRC)

RSS_WRAPPER = r"""
import sys
from fastflip.cli import main
rc = main(sys.argv[1:])
with open("/proc/self/status") as fh:
    hwm = [l for l in fh if l.startswith("VmHWM")][0].split()[1]
print("VMHWM_KB", hwm, "RC", rc, file=sys.stderr)
"""


def keras_with_member(path: str, member_bytes: int, weights_mb: int = 4) -> None:
    inner = path + ".inner.h5"
    with h5py.File(inner, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.random.default_rng(0).random(weights_mb << 18).astype("f4"))
    block = bytes(8 << 20)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", "{}")
        z.write(inner, "model.weights.h5", compress_type=zipfile.ZIP_STORED)
        with z.open(zipfile.ZipInfo("assets/big.bin"), "w", force_zip64=True) as fh:
            left = member_bytes
            while left:
                n = min(left, len(block))
                fh.write(block[:n])
                left -= n
    os.unlink(inner)


def keras_deflated_member(path: str, member_bytes: int) -> None:
    inner = path + ".inner.h5"
    with h5py.File(inner, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.random.default_rng(0).random(1 << 20).astype("f4"))
    block = bytes(8 << 20)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", "{}")
        z.write(inner, "model.weights.h5")
        zi = zipfile.ZipInfo("assets/big.bin")
        zi.compress_type = zipfile.ZIP_DEFLATED
        with z.open(zi, "w", force_zip64=True) as fh:
            left = member_bytes
            while left:
                n = min(left, len(block))
                fh.write(block[:n])
                left -= n
    os.unlink(inner)


def peak_rss(d: str, gib: float) -> None:
    src = os.path.join(d, "bomb.keras")
    keras_deflated_member(src, int(gib * (1 << 30)))
    print(f"archive {os.path.getsize(src) / 1e6:.1f} MB on disk; member inflates to {gib:g} GiB")
    for argv in (["inspect", src], ["inject", src, "-o", os.path.join(d, "out.keras"), "--count", "3", "--force"]):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *argv], capture_output=True, text=True, env=ENV)
        dt = time.perf_counter() - t
        line = [x for x in r.stderr.splitlines() if x.startswith("VMHWM_KB")]
        print(f"  fastflip {argv[0]}: rc {r.returncode}, peak RSS (VmHWM) "
              f"{int(line[0].split()[1]) / 1024:.0f} MiB, {dt:.1f} s" if line else r.stderr[-500:])
    os.unlink(src)
    if os.path.exists(os.path.join(d, "out.keras")):
        os.unlink(os.path.join(d, "out.keras"))


def kills(d: str, n: int = 10) -> None:
    tmpdir = os.path.join(d, "tmpdir")
    os.mkdir(tmpdir)
    outdir = os.path.join(d, "outdir")
    os.mkdir(outdir)
    h5 = os.path.join(d, "big.h5")
    with h5py.File(h5, "w") as f:
        f.create_dataset("w", data=np.random.default_rng(1).random(25 << 20).astype("f4"))  # 100 MB
        f.create_dataset("g", data=np.random.default_rng(2).random(1 << 20).astype("f4"), chunks=(4096,),
                         compression="gzip")
    ker = os.path.join(d, "big.keras")
    keras_with_member(ker, 1 << 20, weights_mb=100)
    env = dict(ENV, TMPDIR=tmpdir)
    rng = random.Random(7)

    def leftovers() -> list[str]:
        return ([os.path.join("tmpdir", x) for x in os.listdir(tmpdir)]
                + [os.path.join("outdir", x) for x in os.listdir(outdir) if ".fastflip-" in x])

    killed = 0
    seen: list[str] = []  # leftovers right after each kill, before any later run could sweep them
    for i in range(n):
        src = h5 if i % 2 == 0 else ker
        out = os.path.join(outdir, "o" + os.path.splitext(src)[1])
        p = subprocess.Popen([sys.executable, "-m", "fastflip", "inject", src, "-o", out, "--count", "2000",
                              "--force", "--include", "**"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 2.0))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.wait()
        now = leftovers()
        seen += [x for x in now if x not in seen]
    before = leftovers()
    r = subprocess.run([sys.executable, "-m", "fastflip", "inject", h5, "-o", os.path.join(outdir, "o.h5"),
                        "--count", "1", "--force"], env=env, capture_output=True, text=True)
    r2 = subprocess.run([sys.executable, "-m", "fastflip", "inject", ker, "-o", os.path.join(outdir, "o.keras"),
                         "--count", "1", "--force"], env=env, capture_output=True, text=True)
    after = leftovers()
    print(f"{n} runs, {killed} killed by SIGKILL mid-run; {len(seen)} distinct leftovers seen right after the "
          f"kills (each later start swept the earlier ones): {', '.join(sorted(seen))[:400]}; "
          f"{len(before)} present before the next start; after the next start (HDF5 rc {r.returncode}, "
          f".keras rc {r2.returncode}): {len(after)} leftovers {after}")


def main() -> None:
    quick = "--quick" in sys.argv
    d = tempfile.mkdtemp(prefix="ff-figs-")
    try:
        peak_rss(d, 0.25 if quick else 2.0)
        kills(d, 4 if quick else 10)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
