"""Benchmarks: chunk-level HDF5 patching and the torch.save / safetensors raw path.

Run: ``pytest bench/test_formats_bench.py --benchmark-only --benchmark-columns=min,median,max,rounds -s``

Files are built under a temporary directory by the frameworks themselves (h5py with gzip chunks,
``torch.save``, ``safetensors.torch.save_file``) and deleted when the module finishes:

* HDF5, gzip level 4, 256 KiB chunks (64 × 1024 float32): 50 MB (3 tensors) and 800 MB (48 tensors);
* a 1 GiB ``torch.save`` file and a 1 GiB safetensors file (16 float32 tensors of 4096 × 4096);
* HDF5 with lzf chunks (8 tensors, 128 MB of float32) and an ``np.savez_compressed`` archive (16 tensors,
  64 MB of float32).

Figures: 10 flips into each HDF5 file (in place, the campaign fast path; and to a new file), the
same through h5py's whole-chunk read-modify-write (chunk patching switched off) for comparison,
peak RSS of a fresh process doing it, 100k flips end to end into the 1 GiB files against ``cp``,
and the 1-flip in-place latency per format.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from fastflip.files.inject import inject_file

ROUNDS = 3
E2E_ROUNDS = 5
CHUNKS = (64, 1024)


def _h5(path: str, n_tensors: int, compression: str = "gzip", quantum: float = 0.0) -> None:
    """float32 4096 × 1024 tensors in 256 KiB chunks (gzip level 4, or lzf: then values are multiples of
    ``quantum``, so that lzf, which stores a chunk it cannot shrink raw, really compresses them)."""
    import h5py

    rng = np.random.default_rng(0)
    opts = {"compression_opts": 4} if compression == "gzip" else {}
    with h5py.File(path, "w") as f:
        for i in range(n_tensors):
            a = (rng.standard_normal((4096, 1024), dtype=np.float32) * 0.02)
            if quantum:
                a = np.round(a / 0.02 / quantum) * quantum
            f.create_dataset(f"model/layer{i}.weight", data=a, chunks=CHUNKS, compression=compression, **opts)


class _Files(dict):
    """The bench files, each built on first use (``-k "cp_baseline or 100k"`` builds no HDF5 file)."""

    def __missing__(self, name: str) -> str:
        t0 = time.perf_counter()
        if name.startswith("h5_"):
            self[name] = os.path.join(self["dir"], f"{name}.h5")
            _h5(self[name], {"h5_50": 3, "h5_800": 48}[name])
        elif name == "lzf":
            self[name] = os.path.join(self["dir"], "lzf.h5")
            _h5(self[name], 8, compression="lzf", quantum=0.25)
        elif name == "npz":
            rng = np.random.default_rng(0)
            self[name] = os.path.join(self["dir"], "model.npz")
            np.savez_compressed(self[name], **{f"layer{i}.weight": rng.standard_normal((1024, 1024), np.float32)
                                               for i in range(16)})
        else:
            torch = pytest.importorskip("torch")
            st = pytest.importorskip("safetensors.torch")
            g = torch.Generator().manual_seed(0)
            sd = {f"layer{i}.weight": torch.randn(4096, 4096, generator=g) for i in range(16)}
            self["pt"] = os.path.join(self["dir"], "model.pt")
            torch.save(sd, self["pt"])
            self["st"] = os.path.join(self["dir"], "model.safetensors")
            st.save_file(sd, self["st"])
            del sd
        print(f"\nbuilt {name} in {time.perf_counter() - t0:.0f} s: {os.path.getsize(self[name]) / 1e6:.0f} MB")
        return self[name]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("formats_bench")
    yield _Files(dir=str(d))
    shutil.rmtree(d, ignore_errors=True)


def _fresh(path: str, d: str) -> str:
    work = os.path.join(d, "work" + os.path.splitext(path)[1])
    shutil.copyfile(path, work)
    return work


@pytest.mark.parametrize("size", ["h5_50", "h5_800"])
def test_h5_10_flips_in_place(benchmark, files, size):
    work = _fresh(files[size], files["dir"])
    seeds = iter(range(1000))
    benchmark.pedantic(lambda: inject_file(work, in_place=True, atomic=False, seed=next(seeds), count=10,
                                           log_path=False, hash_files=False), rounds=ROUNDS, iterations=1)
    os.unlink(work)


@pytest.mark.parametrize("size", ["h5_50", "h5_800"])
def test_h5_10_flips_new_file(benchmark, files, size):
    out = os.path.join(files["dir"], "out.h5")
    seeds = iter(range(1000))
    benchmark.pedantic(lambda: inject_file(files[size], out, seed=next(seeds), count=10, log_path=False),
                       rounds=ROUNDS, iterations=1)
    os.unlink(out)


@pytest.mark.parametrize("size", ["h5_50", "h5_800"])
def test_h5_10_flips_new_file_h5py_path(benchmark, files, size, monkeypatch):
    """The path before chunk patching (h5py whole-chunk rewrite + byte diff of the files), for comparison."""
    from fastflip.files import h5chunks
    from fastflip.files import inject

    monkeypatch.setattr(inject, "chunk_patches", lambda *a: h5chunks.ChunkPatches())
    out = os.path.join(files["dir"], "out.h5")
    seeds = iter(range(1000))
    benchmark.pedantic(lambda: inject_file(files[size], out, seed=next(seeds), count=10, log_path=False),
                       rounds=2, iterations=1)
    os.unlink(out)


_RSS = """
import sys
from fastflip.files.inject import inject_file
src, mode = sys.argv[1], sys.argv[2]
if mode == "in-place":
    inject_file(src, in_place=True, atomic=False, seed=7, count=10, log_path=False, hash_files=False)
else:
    inject_file(src, src + ".out", seed=7, count=10)
# VmHWM, not ru_maxrss: the latter starts from the parent's high-water mark after fork
print(next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")))
"""


@pytest.mark.parametrize("mode", ["in-place", "new-file"])
def test_h5_800_peak_rss(benchmark, files, mode):
    work = _fresh(files["h5_800"], files["dir"])
    rss = []

    def run():
        r = subprocess.run([sys.executable, "-c", _RSS, work, mode], capture_output=True, text=True, check=True)
        rss.append(int(r.stdout.split()[-1]))

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info["peak_rss_mb"] = max(rss)
    print(f"\npeak RSS, 10 flips into 800 MB gzip HDF5, {mode}: {max(rss)} MB")
    for p in (work, work + ".out", work + ".out.fflog"):
        if os.path.exists(p):
            os.unlink(p)


def _cp_fsync(src: str, out: str) -> None:
    """``cp`` and then make the copy durable (fsync of the file and of its folder), as fastflip does by default."""
    subprocess.run(["cp", src, out], check=True)
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(os.path.dirname(out), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("fmt", ["pt", "st"])
@pytest.mark.parametrize("durable", [False, True], ids=["cp", "cp+fsync"])
def test_cp_baseline(benchmark, files, fmt, durable):
    out = os.path.join(files["dir"], "cp.out")
    if durable:
        benchmark.pedantic(lambda: _cp_fsync(files[fmt], out), rounds=E2E_ROUNDS, iterations=1)
    else:
        benchmark.pedantic(lambda: subprocess.run(["cp", files[fmt], out], check=True), rounds=E2E_ROUNDS,
                           iterations=1)
    os.unlink(out)


@pytest.mark.parametrize("fmt", ["pt", "st"])
@pytest.mark.parametrize("input_hash", ["cold", "cached"])
@pytest.mark.parametrize("durable", [False, True], ids=["no-fsync", "fsync"])
def test_100k_flips_new_file(benchmark, files, fmt, input_hash, durable, monkeypatch, tmp_path):
    """cold: the input is hashed in the pass (the sha256 cache off); cached: the input was injected before and is
    unchanged, so its sha256 comes from fastflip.files.hashcache (the output is always hashed). fsync: the default
    (``durable=True``: output, log and folder fsync'ed), to compare with ``cp`` + fsync; no-fsync with bare ``cp``."""
    out = os.path.join(files["dir"], "out." + fmt)
    seeds = iter(range(1000))
    if input_hash == "cold":
        monkeypatch.setenv("FASTFLIP_HASH_CACHE", "off")
    else:
        monkeypatch.setenv("FASTFLIP_HASH_CACHE", str(tmp_path / "hashcache"))
        time.sleep(max(0.0, os.stat(files[fmt]).st_ctime_ns / 1e9 + 2.5 - time.time()))  # saved before the run
        inject_file(files[fmt], out, seed=999, count=1)  # the first injection hashes and remembers the input
    benchmark.pedantic(lambda: inject_file(files[fmt], out, seed=next(seeds), count=100_000, durable=durable),
                       rounds=E2E_ROUNDS, iterations=1)
    for p in (out, out + ".fflog"):
        os.unlink(p)


@pytest.mark.parametrize("fmt", ["pt", "st", "h5_800"])
def test_1_flip_in_place_latency(benchmark, files, fmt):
    work = _fresh(files[fmt], files["dir"])
    seeds = iter(range(10_000))
    inject_file(work, in_place=True, atomic=False, seed=0, count=1, log_path=False, hash_files=False)  # layout walk
    benchmark.pedantic(lambda: inject_file(work, in_place=True, atomic=False, seed=next(seeds), count=1,
                                           log_path=False, hash_files=False), rounds=20, iterations=1)
    os.unlink(work)


@pytest.mark.parametrize("path", ["chunks", "h5py"])
def test_lzf_10_flips_new_file(benchmark, files, path, monkeypatch):
    """10 flips into 8 lzf-chunked tensors (128 MB of float32) to a new file: native lzf chunk patches, or
    (``h5py``) the whole-chunk rewrite through h5py's filter and a byte diff, as before LZF was native."""
    from fastflip.files import h5chunks, inject

    if path == "h5py":
        monkeypatch.setattr(inject, "chunk_patches", lambda *a: h5chunks.ChunkPatches())
    out = os.path.join(files["dir"], "out.h5")
    seeds = iter(range(1000))
    benchmark.pedantic(lambda: inject_file(files["lzf"], out, seed=next(seeds), count=10, log_path=False),
                       rounds=ROUNDS, iterations=1)
    os.unlink(out)


@pytest.mark.parametrize("how", ["fastflip", "np.load+savez_compressed"])
def test_npz_compressed_10_flips(benchmark, files, how):
    """10 flips into an np.savez_compressed archive of 16 float32 tensors (64 MB of data): fastflip's member
    rewrite (sha256 in and out, log, fsync), against what a user would otherwise do: load every array, flip,
    and save the archive again (no hash, no log)."""
    out = os.path.join(files["dir"], "out.npz")
    seeds = iter(range(1000))
    if how == "fastflip":
        run = lambda: inject_file(files["npz"], out, seed=next(seeds), count=10)  # noqa: E731
    else:
        def run() -> None:
            rng = np.random.default_rng(next(seeds))
            with np.load(files["npz"]) as z:
                arrays = {k: z[k] for k in z.files}
            for _ in range(10):
                a = arrays[f"layer{rng.integers(16)}.weight"].reshape(-1).view(np.uint32)
                a[rng.integers(a.size)] ^= np.uint32(1 << int(rng.integers(32)))
            np.savez_compressed(out, **arrays)
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    for p in (out, out + ".fflog"):
        if os.path.exists(p):
            os.unlink(p)
