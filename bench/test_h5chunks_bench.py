"""Benchmarks: 10 flips in place into a chunked HDF5 dataset against a contiguous one.

Run: ``pytest bench/test_h5chunks_bench.py --benchmark-only --benchmark-columns=min,median,max,rounds -s``

Files (h5py defaults: earliest format, so a version-1 B-tree chunk index), built once under a temporary
directory:

* 1,000,000 chunks of 64 float32 (256 MB) and a contiguous dataset of the same size;
* 97,657 chunks of 256 float32 (100 MB, the issue's figure) and a contiguous one of the same size.

``code``: ``after`` is this code (only the touched chunks looked up, the index read in C); ``before`` is
the path at 21e5375 replayed in this process — the whole chunk index walked through h5py's ``chunk_iter``
(a Python call per chunk) by ``route_sites``, the layout walk's ``h5o.get_info`` (which makes HDF5 walk
the index again) and a fresh layout walk after every write — so both run side by side on the same files; ``fallback`` is this code without the
native module (no compiler: HDF5's ``H5Dget_chunk_info_by_coord`` per touched chunk, from Python).
``mode``: ``bare`` is the campaign fast path (``atomic=False``, no hash, no log), the same file flipped
round after round (its layout remembered across the in-place writes); ``cold`` is the same with the layout
read again every round (a first run); ``default`` is ``inject_file(in_place=True)`` with its defaults
(atomic rewrite, hashes and a log).
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

from fastflip.files import h5apply, inject
from fastflip.files.inject import inject_file
from fastflip.files.h5offsets import chunk_index

ROUNDS = 15
SIZES = {"1m": (64_000_000, 64), "97k": (25_000_000, 256)}  # (float32 values, values per chunk)


def _h5(path: str, n: int, chunk: int | None) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("model/w", data=np.zeros(n, "<f4"), chunks=(chunk,) if chunk else None)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name → path, each file built on first use (``-k 97k`` builds no 1m file)."""
    d = tmp_path_factory.mktemp("h5chunks_bench")
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            size, kind = name.split("-")
            n, chunk = SIZES[size]
            t0 = time.perf_counter()
            built[name] = str(d / f"{name}.h5")
            _h5(built[name], n, chunk if kind == "chunked" else None)
            print(f"\n{name}: {os.path.getsize(built[name]) / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s")
        return built[name]

    get.dir = str(d)  # type: ignore[attr-defined]
    yield get
    shutil.rmtree(d, ignore_errors=True)


def _before(path, tensor, flat, open_dataset, base_of):
    """route_sites at 21e5375: the whole chunk index (chunk_iter, a Python call per chunk), then the offsets."""
    return chunk_index(open_dataset()).byte_offsets(flat)


@pytest.mark.parametrize("mode", ["bare", "cold", "default"])
@pytest.mark.parametrize("code", ["after", "before", "fallback"])
@pytest.mark.parametrize("name", ["1m-contiguous", "1m-chunked", "97k-contiguous", "97k-chunked"])
def test_10_flips_in_place(benchmark, files, name, code, mode, monkeypatch):
    if code != "after" and name.endswith("contiguous"):
        pytest.skip("the contiguous path has no chunk index")
    if code == "fallback" and mode != "bare":
        pytest.skip("the fallback is shown on the bare path")
    if code in ("before", "fallback"):
        monkeypatch.setenv("FASTFLIP_H5_NATIVE", "0")  # h5py's chunk_iter and h5o.get_info, as before
    if code == "before":
        monkeypatch.setattr(h5apply, "tensor_element_offsets", _before)
        monkeypatch.setattr(inject, "keep_layout", lambda *a: None)  # at 21e5375 every write made a fresh walk
    work = os.path.join(files.dir, "work.h5")
    shutil.copyfile(files(name), work)
    seeds = iter(range(1000))
    kw = dict(atomic=False, log_path=False, hash_files=False) if mode != "default" else {}
    run = lambda: inject_file(work, in_place=True, seed=next(seeds), count=10, **kw)  # noqa: E731
    run()  # warm: the file in the page cache, modules imported
    setup = inject._LAYOUTS.clear if mode == "cold" else None  # cold: the file's layout read again every round
    benchmark.pedantic(run, setup=setup, rounds=ROUNDS if code != "before" else 3, iterations=1)
    for p in (work, work + ".fflog"):
        if os.path.exists(p):
            os.unlink(p)


@pytest.mark.parametrize("mode", ["bare", "cold"])
@pytest.mark.parametrize("size", ["1m", "97k"])
def test_ratio_interleaved(benchmark, files, size, mode):
    """Chunked and contiguous alternated round by round (the machine's load hits both alike): the median of
    each and their ratio, in ``extra_info`` and printed. The benchmark's own figure is one pair of runs."""
    import statistics

    works, times = {}, {"chunked": [], "contiguous": []}
    for kind in times:
        works[kind] = os.path.join(files.dir, f"ratio-{kind}.h5")
        shutil.copyfile(files(f"{size}-{kind}"), works[kind])
    seeds = iter(range(10_000))

    def one(kind: str) -> None:
        if mode == "cold":
            inject._LAYOUTS.clear()
        t0 = time.perf_counter()
        inject_file(works[kind], in_place=True, seed=next(seeds), count=10, atomic=False, log_path=False,
                    hash_files=False)
        times[kind].append(time.perf_counter() - t0)

    def pair() -> None:
        for kind in times:
            one(kind)

    pair()
    for v in times.values():
        v.clear()
    benchmark.pedantic(pair, rounds=41, iterations=1)
    med = {k: statistics.median(v) for k, v in times.items()}
    benchmark.extra_info.update({f"median_{k}_ms": round(v * 1e3, 3) for k, v in med.items()})
    benchmark.extra_info["ratio"] = round(med["chunked"] / med["contiguous"], 3)
    print(f"\n{size} {mode}: chunked {med['chunked'] * 1e3:.2f} ms, contiguous {med['contiguous'] * 1e3:.2f} ms, "
          f"ratio {med['chunked'] / med['contiguous']:.2f}")
    for w in works.values():
        os.unlink(w)
