"""10 flips into a sharded checkpoint of >= 2 GB, next to copying the shards those flips touch.

Checkpoint: ``FASTFLIP_BENCH_SHARDED_GB`` (default 2) GB of float32 in 16 safetensors shards with a
``model.safetensors.index.json`` (8 tensors a shard, random values from NumPy; no model), written once
per session under ``$FASTFLIP_BENCH_DIR`` (default: pytest's temporary directory).

Side by side, each round one seeded draw of 10 flips (element-uniform over the whole model):

- ``cp``: ``cp`` of the shards the draw touches into a fresh directory (what a user would do by hand
  before editing those shards), no hashing, no fsync;
- ``in-place``: ``inject_dir(DIR, in_place=True)``: each touched shard copied to a temporary beside it
  (input and output sha256 while streaming), log written and fsync'ed, temporaries fsync'ed and renamed;
- ``in-place, durable=False``: the same without fsyncs (atomic renames kept);
- ``in-place, atomic=False, hash_files=False``: the words written where they lie in each touched shard
  (no copy, no hashes; the path of campaign trials, undone by ``restore_dir``);
- ``-o DIR``: ``inject_dir(DIR, OUT)``: a new output directory; untouched shards reflinked where the file
  system can, else copied (``os.copy_file_range``), touched ones injected as above; fsync'ed.

Run: ``pytest bench/bench_sharded.py --benchmark-only --benchmark-columns=min,median,max,rounds``
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

from fastflip import Sampling
from fastflip.files.formats.hfdir import read_sharded_layout
from fastflip.files.sharded import inject_dir

SHARDS, PER_SHARD = 16, 8
COUNT = 10


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    gb = float(os.environ.get("FASTFLIP_BENCH_SHARDED_GB", "2"))
    base = os.environ.get("FASTFLIP_BENCH_DIR") or str(tmp_path_factory.mktemp("sharded"))
    d = os.path.join(base, f"ckpt-{gb:g}GB")
    n = int(gb * 2**30 / 4 / SHARDS / PER_SHARD)  # float32 elements per tensor
    if not os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        os.makedirs(d, exist_ok=True)
        rng = np.random.default_rng(0)
        wm = {}
        for s in range(SHARDS):
            name = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
            keys = [f"layers.{s}.block.{k}.weight" for k in range(PER_SHARD)]
            head = {k: {"dtype": "F32", "shape": [n], "data_offsets": [i * n * 4, (i + 1) * n * 4]}
                    for i, k in enumerate(keys)}
            h = json.dumps(head).encode()
            with open(os.path.join(d, name), "wb") as fh:
                fh.write(struct.pack("<Q", len(h)) + h)
                for _ in keys:
                    fh.write(rng.standard_normal(n, dtype=np.float32).tobytes())
            wm.update(dict.fromkeys(keys, name))
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": SHARDS * PER_SHARD * n * 4}, "weight_map": wm}, fh)
        with open(os.path.join(d, "config.json"), "w") as fh:
            fh.write("{}")
    return d


def _touched(d: str, seed: int) -> list[str]:
    """The shards one seeded draw of 10 flips touches (what ``cp`` copies)."""
    res = inject_dir(d, os.path.join(d + "-probe"), seed=seed, sampling=Sampling(count=COUNT), log_path=False,
                     durable=False)
    shutil.rmtree(res.output)
    return sorted(res.log.manifest["checkpoint_dir"]["shards"])


def test_cp_touched_shards(benchmark, checkpoint, tmp_path):
    shards = _touched(checkpoint, 1)
    out = str(tmp_path / "cp")

    def setup():
        shutil.rmtree(out, ignore_errors=True)
        os.mkdir(out)

    benchmark.extra_info["shards_copied"] = len(shards)
    benchmark.pedantic(lambda: subprocess.run(["cp", *[os.path.join(checkpoint, s) for s in shards], out], check=True),
                       setup=setup, rounds=3, iterations=1)


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "no-fsync"])
def test_inject_in_place(benchmark, checkpoint, tmp_path, durable):
    work = str(tmp_path / "m")
    shutil.copytree(checkpoint, work)
    seeds = iter(range(1, 100))
    touched = []

    def run():
        res = inject_dir(work, in_place=True, seed=next(seeds), sampling=Sampling(count=COUNT), durable=durable)
        touched.append(len(res.log.manifest["checkpoint_dir"]["shards"]))

    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info["shards_touched"] = touched


def test_inject_in_place_raw(benchmark, checkpoint, tmp_path):
    work = str(tmp_path / "m")
    shutil.copytree(checkpoint, work)
    seeds = iter(range(1, 1000))
    benchmark.pedantic(lambda: inject_dir(work, in_place=True, atomic=False, hash_files=False, log_path=False,
                                          seed=next(seeds), sampling=Sampling(count=COUNT)), rounds=20, iterations=1)


def test_inject_to_new_directory(benchmark, checkpoint, tmp_path):
    out = str(tmp_path / "out")
    seeds = iter(range(1, 100))
    how = []

    def setup():
        shutil.rmtree(out, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out + ".fflog")

    def run():
        res = inject_dir(checkpoint, out, seed=next(seeds), sampling=Sampling(count=COUNT))
        how.append(res.log.manifest["checkpoint_dir"]["carried"])

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    benchmark.extra_info["carried"] = how
    benchmark.extra_info["shards"] = len(read_sharded_layout(checkpoint).shards)
