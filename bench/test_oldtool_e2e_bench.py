"""20,000 flips into the ResNet-50-sized legacy Keras checkpoint: fastflip's CLI next to the older tool's loop.

The target: fastflip ≥ 50× the older tool (hdf5_corrupter) end to end. The older tool is not installed;
``bench/oldtool_baseline.py`` reproduces its loop (h5py ``r+``, per flip: pick a dataset, pick an element, read
it through h5py, pack as float64 with ``struct``, flip a bit through the bit string, unpack, write it back).
Every figure is one subprocess run end to end (interpreter start and imports included):

* ``baseline``: ``python bench/oldtool_baseline.py FILE --flips 20000`` (in place, as the older tool works);
* ``fastflip new file``: ``python -m fastflip inject FILE -o OUT --count 20000 -q`` (copy, hashes, log, fsyncs);
* ``fastflip in place --direct``: ``python -m fastflip inject FILE --in-place --direct --count 20000 -q``
  (the log committed first, fsync'ed, then the 20,000 words written where they lie);
* ``floor: python`` and ``floor: import numpy``: ``python -c pass`` and ``python -c "import numpy"``: the
  interpreter alone, and the least any tool built on NumPy pays (50× the older tool's loop must fit in its time);
* ``floor: import numpy, h5py``: ``python -c "import numpy, h5py"`` in the same environment, the start-up any
  Python tool reading HDF5 through h5py pays;
* ``floor: h5py open + list``: that, plus opening the file with h5py and listing its datasets
  (``visititems``): the least an h5py-based tool does before its first flip.

The ratios fastflip / older tool and fastflip / floor come from the same run. A separate group,
``oldtool-20000-flips-in-process``, times :func:`fastflip.files.inject.inject_file` itself (the same 20,000 flips,
in place, direct, region evidence, with a log) in this process, the layout walked afresh each round as a CLI run
walks it: what a host harness calling fastflip pays, without the interpreter start.

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
    run("-m", "fastflip", "inject", "--help")  # bytecode compiled once, outside the timings ...
    warm = os.path.join(p, "warm.h5")  # ... also of the modules the inject path imports lazily
    shutil.copyfile(src, warm)
    run("-m", "fastflip", "inject", warm, "--in-place", "--direct", "--count", 10, "--seed", 1, "-q")
    for name in os.listdir(p):
        if name.startswith("warm.h5"):
            os.remove(os.path.join(p, name))
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


_LIST = ("import sys, numpy, h5py\n"
         "names = []\n"
         "with h5py.File(sys.argv[1], 'r') as f:\n"
         "    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)\n"
         "assert names\n")


@pytest.mark.benchmark(group="oldtool-20000-flips")
def test_floor_python(benchmark):
    benchmark.pedantic(lambda: run("-c", "pass"), rounds=max(ROUNDS, 5), iterations=1, warmup_rounds=0)


@pytest.mark.benchmark(group="oldtool-20000-flips")
def test_floor_import_numpy(benchmark):
    benchmark.pedantic(lambda: run("-c", "import numpy"), rounds=max(ROUNDS, 5), iterations=1, warmup_rounds=0)


@pytest.mark.benchmark(group="oldtool-20000-flips")
def test_floor_import_numpy_h5py(benchmark):
    benchmark.pedantic(lambda: run("-c", "import numpy, h5py"), rounds=max(ROUNDS, 5), iterations=1, warmup_rounds=0)


@pytest.mark.benchmark(group="oldtool-20000-flips")
def test_floor_h5py_open_list(benchmark, d):
    f = os.path.join(d, "resnet50.h5")
    benchmark.pedantic(lambda: run("-c", _LIST, f), rounds=max(ROUNDS, 5), iterations=1, warmup_rounds=0)


@pytest.mark.benchmark(group="oldtool-20000-flips-in-process")
def test_inject_file_in_process(benchmark, d):
    from fastflip.files import inject as fi

    seeds = itertools.count(1)
    f = os.path.join(d, "inproc.h5")
    shutil.copyfile(os.path.join(d, "resnet50.h5"), f)
    fi.inject_file(f, in_place=True, atomic=False, count=10, seed=0, hash_files="regions", log_path=f"{f}.0.fflog")

    def once() -> None:
        s = next(seeds)
        fi.inject_file(f, in_place=True, atomic=False, count=FLIPS, seed=s, hash_files="regions",
                       log_path=f"{f}.{s}.fflog")

    benchmark.pedantic(once, setup=fi._LAYOUTS.clear, rounds=max(ROUNDS, 7), iterations=1, warmup_rounds=0)
