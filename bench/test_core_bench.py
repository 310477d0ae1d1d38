"""Benchmarks of the core engine (issue: exact, fast, reproducible flips in HDF5 checkpoints).

Run: ``pytest bench/test_core_bench.py --benchmark-only --benchmark-columns=min,median,max,rounds``

The checkpoint is ResNet-50-sized in the legacy Keras layout (``resnet50.py``: 321 datasets,
25.6M values, ~98 MiB). Stages measured side by side in one run:

* ``flip_stage``: sampling + routing + the native kernel on the mapped file (``in_place=True,
  atomic=False``, no hashing, no log): the cost of the flips themselves, no copy.
* ``api_new_file``: the default API call — copy to a temporary file with the flips applied on the
  way, sha256 of input and output, log written, fsync, rename.
* ``copy_baseline``: only the hashed copy, to show what ``api_new_file`` adds to a plain copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resnet50 import write_keras_legacy_checkpoint, write_large_checkpoint  # noqa: E402

from fastflip.files.filebytes import copy_with_hash  # noqa: E402
from fastflip.files.inject import inject_file  # noqa: E402
from fastflip.files.layout import read_layout  # noqa: E402

FASTFLIP = str(Path(sys.executable).with_name("fastflip"))


@pytest.fixture(scope="module")
def r50(tmp_path_factory):
    d = tmp_path_factory.mktemp("core_bench")
    src = str(d / "resnet50.h5")
    write_keras_legacy_checkpoint(src)
    work = str(d / "work.h5")
    shutil.copyfile(src, work)
    return {"dir": d, "src": src, "work": work, "layout": read_layout(work)}


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("core_bench_big")
    path = str(d / "big.h5")
    write_large_checkpoint(path, gib=2.0)
    return path


@pytest.mark.parametrize("k", [1, 100_000, 1_000_000])
def test_flip_stage_cached_layout(benchmark, r50, k):
    """API flips into the mapped file, layout read once beforehand (a harness's repeated calls)."""
    seeds = iter(range(10**6))
    benchmark.pedantic(lambda: inject_file(r50["work"], in_place=True, atomic=False, hash_files=False, log_path=False,
                                           seed=next(seeds), count=k, layout=r50["layout"]),
                       rounds=7 if k > 1000 else 30, warmup_rounds=1)


@pytest.mark.parametrize("k", [1, 100_000])
def test_flip_stage_with_layout_walk(benchmark, r50, k):
    """Same, with the layout walk of the 321 datasets included."""
    seeds = iter(range(10**6))
    benchmark.pedantic(lambda: inject_file(r50["work"], in_place=True, atomic=False, hash_files=False, log_path=False,
                                           seed=next(seeds), count=k), rounds=7, warmup_rounds=1)


@pytest.mark.parametrize("k", [1, 100_000, 1_000_000])
def test_api_new_file(benchmark, r50, k):
    out = str(r50["dir"] / f"out{k}.h5")
    seeds = iter(range(10**6))
    benchmark.pedantic(lambda: inject_file(r50["src"], out, seed=next(seeds), count=k, layout=r50["layout"]),
                       rounds=5, warmup_rounds=1)


def test_copy_baseline(benchmark, r50):
    out = str(r50["dir"] / "copy.h5")
    benchmark.pedantic(lambda: copy_with_hash(r50["src"], out), rounds=5, warmup_rounds=1)


def test_cli_end_to_end_100k(benchmark, r50):
    out = str(r50["dir"] / "cli.h5")
    cmd = [FASTFLIP, "inject", r50["src"], "-o", out, "--count", "100000", "--seed", "1"]
    benchmark.pedantic(lambda: subprocess.run(cmd, check=True, capture_output=True), rounds=5, warmup_rounds=1)


def test_cli_help(benchmark):
    benchmark.pedantic(lambda: subprocess.run([FASTFLIP, "--help"], check=True, capture_output=True), rounds=10,
                       warmup_rounds=1)


# peak RSS from VmHWM: ru_maxrss survives execve on Linux, so a child forked from pytest would report pytest's peak
_RSS_SCRIPT = """
import sys, time
from fastflip.files.inject import inject_file
t = time.perf_counter()
inject_file(sys.argv[1], in_place=True, atomic=False, hash_files=False, log_path=False, seed=int(sys.argv[2]), count=1000)
dt = time.perf_counter() - t
hwm = [line for line in open('/proc/self/status') if line.startswith('VmHWM:')][0].split()[1]
print(dt, hwm)
"""


@pytest.mark.parametrize("which", ["100MB", "2GB"])
def test_k1000_large_file_time_and_rss(benchmark, r50, big, which):
    """K=1000 into the 2 GB file vs the 100 MB file (layout walk included), in a fresh process; peak RSS recorded."""
    path = r50["work"] if which == "100MB" else big
    results = []
    seeds = iter(range(10**6))

    def run():
        out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, path, str(next(seeds))], check=True,
                             capture_output=True, text=True).stdout.split()
        results.append((float(out[0]), int(out[1])))

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    times = sorted(r[0] for r in results)
    benchmark.extra_info["inject_s_median"] = times[len(times) // 2]
    benchmark.extra_info["peak_rss_mb_max"] = max(r[1] for r in results) / 1024
    benchmark.extra_info["file_mb"] = os.path.getsize(path) / 2**20
    print(f"\n{which}: inject median {times[len(times) // 2] * 1000:.1f} ms, "
          f"peak RSS {max(r[1] for r in results) / 1024:.0f} MB, file {os.path.getsize(path) / 2**20:.0f} MiB")
