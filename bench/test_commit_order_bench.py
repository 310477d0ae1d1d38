"""Benchmark: the cost of committing the log before the file it describes.

Run the same file against two source trees, side by side::

    git archive 715d5cd src | tar -x -C /tmp/ff-old && cp src/fastflip/kernels/*.so /tmp/ff-old/src/fastflip/kernels/
    PYTHONPATH=/tmp/ff-old/src pytest bench/test_commit_order_bench.py --benchmark-only -p no:cacheprovider \
        --benchmark-columns=min,median,max,rounds
    PYTHONPATH=$PWD/src        pytest bench/test_commit_order_bench.py --benchmark-only -p no:cacheprovider \
        --benchmark-columns=min,median,max,rounds

``FASTFLIP_BENCH_MIB`` sets the checkpoint size (default 1024: a 1 GiB safetensors file of float32 tensors of
4096 x 4096, written once per session). Figures (a fresh input each round where the input changes):

* 100k flips into a new file, default (durable), input hash from the cache (a repeated injection);
* 100k flips in place, atomic (the input is rewritten through a temporary copy);
* 1 flip in place, non-atomic, hashes and log (the evidence-first path: predicted hash, log, then the write);
* 1 flip in place, non-atomic, no hash, no log (a campaign trial's fast path).
"""

from __future__ import annotations

import itertools
import os
import shutil

import numpy as np
import pytest

from fastflip.files.inject import inject_file

MIB = int(os.environ.get("FASTFLIP_BENCH_MIB", "1024"))
ROUNDS = 3


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("commit_bench")
    n = max(1, MIB // 64)  # 64 MiB tensors
    rng = np.random.default_rng(0)
    block = (rng.standard_normal((4096, 4096), dtype=np.float32) * 0.02)
    p = str(d / "ckpt.safetensors")
    save_file({f"layer{i}.weight": block for i in range(n)}, p)
    os.utime(p, ns=(10**18, 10**18))
    yield p
    shutil.rmtree(d, ignore_errors=True)


def _fresh(src: str, name: str) -> str:
    dst = os.path.join(os.path.dirname(src), name)
    shutil.copyfile(src, dst)
    return dst


def test_new_file_100k_flips(benchmark, ckpt):
    out = os.path.join(os.path.dirname(ckpt), "out.safetensors")
    seeds = itertools.count(1)
    inject_file(ckpt, out, seed=0, count=100_000)  # warms the hash cache: a repeated injection
    benchmark.pedantic(lambda: inject_file(ckpt, out, seed=next(seeds), count=100_000), rounds=ROUNDS, iterations=1)


def test_in_place_atomic_100k_flips(benchmark, ckpt):
    seeds = itertools.count(1)

    def setup():
        p = _fresh(ckpt, "work.safetensors")
        for f in os.listdir(os.path.dirname(p)):
            if f.startswith("work.safetensors") and f.endswith(".fflog"):
                os.unlink(os.path.join(os.path.dirname(p), f))
        return (p,), {}

    benchmark.pedantic(lambda p: inject_file(p, in_place=True, seed=next(seeds), count=100_000), setup=setup,
                       rounds=ROUNDS, iterations=1)


@pytest.mark.parametrize("evidence", [True, False], ids=["hash+log", "no-hash-no-log"])
def test_in_place_non_atomic_1_flip(benchmark, ckpt, evidence):
    work = _fresh(ckpt, "nonatomic.safetensors")
    seeds = itertools.count(1)
    log = os.path.join(os.path.dirname(work), "trial.fflog")
    benchmark.pedantic(lambda: inject_file(work, in_place=True, atomic=False, seed=next(seeds), count=1,
                                           hash_files=evidence, log_path=log if evidence else False),
                       rounds=ROUNDS * 2, iterations=1)
