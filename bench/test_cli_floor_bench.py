"""Benchmark: the CLI at its floor, side by side with the floors the targets name.

Run the same file against two source trees (the ``direct`` figures skip where ``--direct`` does not exist)::

    git archive e9e681d src | tar -x -C /tmp/ff-old && cp src/fastflip/kernels/*.so /tmp/ff-old/src/fastflip/kernels/
    PYTHONPATH=/tmp/ff-old/src pytest bench/test_cli_floor_bench.py --benchmark-only -p no:cacheprovider \
        --benchmark-columns=min,median,max,rounds --benchmark-group-by=group
    PYTHONPATH=$PWD/src        pytest bench/test_cli_floor_bench.py --benchmark-only -p no:cacheprovider \
        --benchmark-columns=min,median,max,rounds --benchmark-group-by=group

Every figure is one ``fastflip`` command run end to end (``python -m fastflip ... -q``: interpreter start,
imports, work, fsyncs), next to its floor in the same group:

Bytecode is compiled once, outside the source trees (``PYTHONPYCACHEPREFIX``), as for an installed package.

* ``one-flip-100MB``: 1 flip into a 100 MB HDF5 file, new file; floor: ``python -c "import numpy, h5py"`` + ``cp``
  (target ≤ 1.5×).
* ``new-file-gzip``: 10 flips from a gzip-chunked HDF5 file (``FASTFLIP_BENCH_GZ_MIB``, default 800) into a new
  file; floor: ``cp`` + ``sync`` (target ≤ 1.5×).
* ``in-place-gzip``: 10 flips in place into the same file, and into a 50 MB one (target: ≤ 2× the 50 MB figure);
  with ``--in-place`` (a copy renamed over the file) and ``--in-place --direct``.
* ``safetensors-4GB``: 10 flips in place (``--direct``) into a bf16 safetensors file (``FASTFLIP_BENCH_ST_GIB``,
  default 4; target ≤ 1 s), its revert, and a new file against ``cp`` + ``sync`` (target ≤ 1.2×): with
  whole-file hashes (the default) and with region evidence (``--evidence regions``).

``FASTFLIP_HASH`` is left to the default rule (the fastest installed algorithm), unless the environment sets it.
"""

from __future__ import annotations

import itertools
import pathlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from h5_noise import noise, write_h5_100

GZ_MIB = int(os.environ.get("FASTFLIP_BENCH_GZ_MIB", "800"))
ST_GIB = float(os.environ.get("FASTFLIP_BENCH_ST_GIB", "4"))
ROUNDS = int(os.environ.get("FASTFLIP_BENCH_ROUNDS", "3"))
ENV = {k: v for k, v in os.environ.items() if k != "FASTFLIP_HASH" or os.environ.get("FASTFLIP_BENCH_KEEP_HASH")}
# An installed package runs from compiled bytecode; a checkout under PYTHONDONTWRITEBYTECODE=1 recompiles every
# module on every start (0.1-0.3 s here). The commands run with bytecode cached outside the source trees.
ENV.pop("PYTHONDONTWRITEBYTECODE", None)
ENV.setdefault("PYTHONPYCACHEPREFIX", os.path.join(os.environ.get("TMPDIR", "/tmp"), "fastflip-bench-pycache"))


def _has_direct() -> bool:
    try:
        import fastflip.files.fingerprint  # noqa: F401
    except ImportError:
        return False
    return True


direct = pytest.mark.skipif(not _has_direct(), reason="this source tree has no inject --direct")


def ff(*argv: object) -> None:
    r = subprocess.run([sys.executable, "-m", "fastflip", *map(str, argv), "-q"], env=ENV, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True)


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    base = os.environ.get("FASTFLIP_BENCH_DIR")  # the big files' folder (default: pytest's temporary directory)
    p = tmp_path_factory.mktemp("cli_floor") if not base else pathlib.Path(base) / "cli_floor"
    p.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "fastflip", "inject", "--help"], env=ENV, capture_output=True)  # bytecode
    for cmd in ("inject", "revert"):
        subprocess.run([sys.executable, "-c", f"import fastflip.cli.{cmd}_cmd, fastflip.files.inject"], env=ENV)
    yield p
    shutil.rmtree(p, ignore_errors=True)


@pytest.fixture(scope="module")
def h5_100(d):
    return write_h5_100(str(d / "w100.h5"))  # 4 x 25 MiB


def _gzip_file(path: str, mib: int) -> str:
    import h5py

    per = 16 * 2**18  # 16 MiB datasets, 64 x 64 chunks (16 KiB)
    with h5py.File(path, "w") as f:
        for i in range(max(1, mib // 16)):
            f.create_dataset(f"layer{i}/kernel", data=noise(per, i).reshape(-1, 1024), chunks=(64, 64),
                             compression="gzip", compression_opts=1, shuffle=True)
    return path


@pytest.fixture(scope="module")
def gz(d):
    return _gzip_file(str(d / "big.gz.h5"), GZ_MIB)


@pytest.fixture(scope="module")
def gz50(d):
    return _gzip_file(str(d / "small.gz.h5"), 50)


@pytest.fixture(scope="module")
def st(d):
    """A bf16 safetensors file of ``ST_GIB`` GiB: 64 MiB tensors of random 16-bit words."""
    p = str(d / "model.safetensors")
    per = 64 << 20
    n = max(1, int(ST_GIB * 1024) // 64)
    header, off = {}, 0
    for i in range(n):
        header[f"model.layers.{i}.weight"] = {"dtype": "BF16", "shape": [per // 2 // 4096, 4096],
                                              "data_offsets": [off, off + per]}
        off += per
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    block = np.random.default_rng(0).integers(0x3000, 0x4000, per // 2, dtype=np.uint16).tobytes()
    with open(p, "wb") as fh:
        fh.write(len(hb).to_bytes(8, "little") + hb)
        for _ in range(n):
            fh.write(block)
    return p


def _bench(benchmark, fn, rounds: int = ROUNDS, setup=None) -> None:
    if setup is None:
        benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0)
    else:
        benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=0)


# ---------------------------------------------------------------------------------------- 1 flip into 100 MB

@pytest.mark.benchmark(group="one-flip-100MB")
def test_floor_python_numpy_h5py_cp(benchmark, h5_100):
    out = h5_100 + ".cp"
    _bench(benchmark, lambda: (subprocess.run([sys.executable, "-c", "import numpy, h5py"], env=ENV, check=True),
                               sh(f"cp {h5_100} {out}")), rounds=5)


@pytest.mark.benchmark(group="one-flip-100MB")
def test_inject_1_flip_100MB(benchmark, h5_100):
    seeds = itertools.count(1)
    _bench(benchmark, lambda: ff("inject", h5_100, "-o", h5_100 + ".out", "--count", 1, "--seed", next(seeds),
                                 "--force"), rounds=5)


# ------------------------------------------------------------------------------------ new file from gzip HDF5

@pytest.mark.benchmark(group="new-file-gzip")
def test_floor_cp_sync_gzip(benchmark, gz):
    _bench(benchmark, lambda: sh(f"cp {gz} {gz}.cp && sync"))


@pytest.mark.benchmark(group="new-file-gzip")
def test_inject_new_file_gzip(benchmark, gz):
    seeds = itertools.count(1)
    _bench(benchmark, lambda: ff("inject", gz, "-o", gz + ".out", "--count", 10, "--seed", next(seeds), "--force"))


# ---------------------------------------------------------------------------------- 10 flips in place, gzip

@pytest.mark.benchmark(group="in-place-gzip")
def test_in_place_50MB(benchmark, gz50):
    seeds = itertools.count(1)
    _bench(benchmark, lambda: ff("inject", gz50, "--in-place", "--count", 10, "--seed", next(seeds)))


@pytest.mark.benchmark(group="in-place-gzip")
def test_in_place_big(benchmark, gz):
    seeds = itertools.count(1)
    _bench(benchmark, lambda: ff("inject", gz, "--in-place", "--count", 10, "--seed", next(seeds)))


@direct
@pytest.mark.benchmark(group="in-place-gzip")
def test_in_place_direct_50MB(benchmark, gz50):
    seeds = itertools.count(100)
    _bench(benchmark, lambda: ff("inject", gz50, "--in-place", "--direct", "--count", 10, "--seed", next(seeds)))


@direct
@pytest.mark.benchmark(group="in-place-gzip")
def test_in_place_direct_big(benchmark, gz):
    seeds = itertools.count(100)
    _bench(benchmark, lambda: ff("inject", gz, "--in-place", "--direct", "--count", 10, "--seed", next(seeds)))


# ------------------------------------------------------------------------------------------ 4 GB safetensors

@direct
@pytest.mark.benchmark(group="safetensors-4GB")
def test_st_in_place_direct_10_flips(benchmark, st):
    seeds = itertools.count(1)
    _bench(benchmark, lambda: ff("inject", st, "--in-place", "--direct", "--count", 10, "--seed", next(seeds),
                                 "--log", st + ".fflog", "--force"), rounds=5)


@direct
@pytest.mark.benchmark(group="safetensors-4GB")
def test_st_revert_direct(benchmark, st):
    seeds = itertools.count(50)

    def setup():
        ff("inject", st, "--in-place", "--direct", "--count", 10, "--seed", next(seeds), "--log", st + ".r.fflog",
           "--force")

    _bench(benchmark, lambda: ff("revert", st + ".r.fflog", st), rounds=5, setup=setup)


@pytest.mark.benchmark(group="safetensors-4GB")
def test_st_in_place_copy_10_flips(benchmark, st):
    seeds = itertools.count(1)
    _bench(benchmark, lambda: ff("inject", st, "--in-place", "--count", 10, "--seed", next(seeds),
                                 "--log", st + ".c.fflog", "--force"), rounds=1)


@pytest.mark.benchmark(group="safetensors-4GB")
def test_st_floor_cp_sync(benchmark, st):
    _bench(benchmark, lambda: sh(f"cp {st} {st}.cp && sync && rm -f {st}.cp"), rounds=2)


@pytest.mark.benchmark(group="safetensors-4GB")
def test_st_new_file_10_flips(benchmark, st):
    seeds = itertools.count(1)
    _bench(benchmark, lambda: (ff("inject", st, "-o", st + ".out", "--count", 10, "--seed", next(seeds), "--force"),
                               os.unlink(st + ".out")), rounds=2)


def _has_copy_regions() -> bool:
    try:
        import fastflip.files.copyregions  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_copy_regions(), reason="this source tree has no inject --evidence regions")
@pytest.mark.benchmark(group="safetensors-4GB")
def test_st_new_file_10_flips_regions(benchmark, st):
    """A new file with region evidence (``--evidence regions``): a kernel copy and the touched bytes, no hash pass."""
    seeds = itertools.count(1)
    _bench(benchmark, lambda: (ff("inject", st, "-o", st + ".out", "--evidence", "regions", "--count", 10, "--seed",
                                  next(seeds), "--force"), os.unlink(st + ".out")), rounds=3)
