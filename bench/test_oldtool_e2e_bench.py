"""20,000 flips into the ResNet-50-sized legacy Keras checkpoint: fastflip's CLI next to the older tool's loop.

The target: fastflip ≥ 50× the older tool (hdf5_corrupter) end to end. The older tool is not installed;
``bench/oldtool_baseline.py`` reproduces its loop (h5py ``r+``, per flip: pick a dataset, pick an element, read
it through h5py, pack as float64 with ``struct``, flip a bit through the bit string, unpack, write it back).
Every figure is one subprocess run end to end (interpreter start and imports included):

* ``baseline``: ``python bench/oldtool_baseline.py FILE --flips 20000`` (in place, as the older tool works);
* ``fastflip new file``: ``python -m fastflip inject FILE -o OUT --count 20000 -q`` (copy, hashes, log, fsyncs);
* ``fastflip in place --direct``: ``python -m fastflip inject FILE --in-place --direct --count 20000 -q``
  (the log committed first, fsync'ed, then the 20,000 words written where they lie).

Run (``FASTFLIP_BENCH_DIR`` holds the ~100 MB checkpoints; default: pytest's temporary directory)::

    PYTHONPATH=$PWD/src pytest bench/test_oldtool_e2e_bench.py --benchmark-only -p no:cacheprovider \\
        --benchmark-columns=min,median,max,rounds --benchmark-group-by=group

``FASTFLIP_BENCH_OLD_ROUNDS`` (default 2) sets the baseline's rounds (about 10 s each here), ``FASTFLIP_BENCH_ROUNDS``
(default 3) fastflip's.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from resnet50 import write_keras_legacy_checkpoint  # noqa: E402

FLIPS = int(os.environ.get("FASTFLIP_BENCH_FLIPS", "20000"))
ROUNDS = int(os.environ.get("FASTFLIP_BENCH_ROUNDS", "3"))
OLD_ROUNDS = int(os.environ.get("FASTFLIP_BENCH_OLD_ROUNDS", "2"))
ENV = dict(os.environ)
ENV.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as for an installed package
ENV.setdefault("PYTHONPYCACHEPREFIX", os.path.join(os.environ.get("TMPDIR", "/tmp"), "fastflip-bench-pycache"))


def run(*argv: object) -> None:
    r = subprocess.run([sys.executable, *map(str, argv)], env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    base = os.environ.get("FASTFLIP_BENCH_DIR")
    p = os.path.join(base, "oldtool_e2e") if base else str(tmp_path_factory.mktemp("oldtool_e2e"))
    os.makedirs(p, exist_ok=True)
    src = write_keras_legacy_checkpoint(os.path.join(p, "resnet50.h5"))
    for name in ("old.h5", "direct.h5"):
        shutil.copyfile(src, os.path.join(p, name))
    run("-m", "fastflip", "inject", "--help")  # bytecode compiled once, outside the timings
    yield p
    shutil.rmtree(p, ignore_errors=True)


@pytest.mark.benchmark(group="oldtool-20000-flips")
def test_older_tool_loop(benchmark, d):
    seeds = itertools.count(1)
    f = os.path.join(d, "old.h5")
    benchmark.pedantic(lambda: run(os.path.join(HERE, "oldtool_baseline.py"), f, "--flips", FLIPS, "--seed",
                                   next(seeds)), rounds=OLD_ROUNDS, iterations=1, warmup_rounds=0)


@pytest.mark.benchmark(group="oldtool-20000-flips")
def test_fastflip_new_file(benchmark, d):
    seeds = itertools.count(1)
    src, out = os.path.join(d, "resnet50.h5"), os.path.join(d, "out.h5")
    benchmark.pedantic(lambda: run("-m", "fastflip", "inject", src, "-o", out, "--count", FLIPS, "--seed",
                                   next(seeds), "--force", "-q"), rounds=ROUNDS, iterations=1, warmup_rounds=0)


@pytest.mark.benchmark(group="oldtool-20000-flips")
def test_fastflip_in_place_direct(benchmark, d):
    seeds = itertools.count(1)
    f = os.path.join(d, "direct.h5")
    benchmark.pedantic(lambda: run("-m", "fastflip", "inject", f, "--in-place", "--direct", "--count", FLIPS,
                                   "--seed", (s := next(seeds)), "--log", f"{f}.{s}.fflog", "-q"),
                       rounds=ROUNDS, iterations=1, warmup_rounds=0)
