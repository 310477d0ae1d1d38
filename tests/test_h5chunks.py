"""Chunk-level patching of filtered HDF5 data: every storage × filter combination against the NumPy
oracle and h5py's own reading of the result; exact revert from the old chunk bytes; bad chunks refused."""

from __future__ import annotations

import os
import warnings

import h5py
import numpy as np
import pytest

from conftest import require
from fastflip.core import reference
from fastflip.errors import UnsupportedStorageError
from fastflip.files.filebytes import hash_file, sha256_file
from fastflip.files.h5chunks import fletcher32, shuffle, unshuffle
from fastflip.files.h5apply import route_sites
from fastflip.files.inject import inject_file
from fastflip.files.replay import replay
from fastflip.files.revert import revert
from fastflip.files.layout import read_layout

DTYPES = ["<f4", ">f8", "<f2", "<i8", "|u1", "|b1"]
FILTERS = {
    "gzip": dict(compression="gzip"), "gzip9": dict(compression="gzip", compression_opts=9),
    "shuffle-gzip": dict(compression="gzip", shuffle=True), "fletcher32": dict(fletcher32=True),
    "shuffle-fletcher32": dict(shuffle=True, fletcher32=True), "gzip-fletcher32": dict(compression="gzip", fletcher32=True),
    "shuffle-gzip-fletcher32": dict(compression="gzip", shuffle=True, fletcher32=True),
    "shuffle": dict(shuffle=True), "lzf": dict(compression="lzf"), "shuffle-lzf": dict(compression="lzf", shuffle=True),
    "lzf-fletcher32": dict(compression="lzf", fletcher32=True),
    "shuffle-lzf-fletcher32": dict(compression="lzf", shuffle=True, fletcher32=True),
}
ENCODABLE = set(FILTERS)  # lzf through the native encoder (ext/_lzf.pyx)


def _data(dt: str, rng) -> np.ndarray:
    shape = (37, 29)  # edge chunks on both axes
    if dt.endswith("b1"):
        return rng.random(shape) < 0.3
    if "f" in dt:
        return (rng.standard_normal(shape) * 0.1).astype(dt)
    return rng.integers(0, 100, shape).astype(dt)


def _write(path: str, kw: dict, rng) -> dict[str, np.ndarray]:
    arrays = {}
    with h5py.File(path, "w") as f:
        for dt in DTYPES:
            a = _data(dt, rng)
            name = "/t_" + dt.replace("<", "le").replace(">", "be").replace("|", "")
            f.create_dataset(name, data=a, chunks=(8, 8), **kw)
            arrays[name] = a
        f.create_dataset("/plain", data=rng.standard_normal(50).astype("<f4"))  # raw path in the same plan
        arrays["/plain"] = f["/plain"][()]
    return arrays


def _read(path: str) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {"/" + k: f[k][()] for k in f}


@pytest.mark.parametrize("filt", list(FILTERS))
@pytest.mark.parametrize("model", ["flip", "random-bits:2", "stuck-at-1", "random-value"])
def test_filters_match_reference_and_h5py(tmp_path, filt, model, monkeypatch):
    from fastflip.files import h5chunks

    monkeypatch.setattr(h5chunks, "_SAID", set())  # fallbacks are reported once per process: listen afresh
    rng = np.random.default_rng(abs(hash((filt, model))) % 2**32)
    src = str(tmp_path / "in.h5")
    arrays = _write(src, FILTERS[filt], rng)
    before = hash_file(src)
    out = str(tmp_path / "out.h5")
    kw = dict(seed=5, count=40, model=model)
    if model == "random-bits:2":
        kw["selection"] = {"dtypes": ["float16", "float32", "float64", "int64", "uint8"]}  # bool has one bit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = inject_file(src, out, **kw)
    fell_back = [w for w in caught if "go through h5py" in str(w.message)]
    want = {k: v.copy() for k, v in arrays.items()}
    old, new = reference.apply_plan(want, res.log.plan)
    assert np.array_equal(old, res.log.old_words) and np.array_equal(new, res.log.new_words)
    got = _read(out)  # h5py decodes every chunk (checksums verified by HDF5 itself)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes(), k
    assert hash_file(src) == before
    undo = res.log.undo
    assert undo is not None
    if filt in ENCODABLE and not fell_back:
        # chunk path: the file keeps its size, and only bytes of touched chunks (plus raw words) changed
        assert os.path.getsize(out) == os.path.getsize(src) and undo.new_size == undo.size
        lay = read_layout(src)
        filtered_bytes = sum(t.nbytes for t in lay.tensors if t.storage == "filtered")
        assert undo.lengths.sum() < filtered_bytes
    if filt not in ENCODABLE:
        assert fell_back or not any(t.storage == "filtered" for t in read_layout(src).tensors)
    rep = replay(res.log_path, src, str(tmp_path / "rep.h5"))
    assert sha256_file(rep.output) == sha256_file(out)
    assert revert(res.log_path, out).digest == before


@pytest.mark.parametrize("filt", ["shuffle-gzip-fletcher32", "gzip"])
def test_in_place_non_atomic_chunks(tmp_path, filt):
    rng = np.random.default_rng(3)
    src = str(tmp_path / "in.h5")
    arrays = {"/w": (rng.standard_normal((256, 256)) * 0.05).astype("<f4"), "/b": rng.standard_normal(300).astype(">f8")}
    with h5py.File(src, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v, chunks=(64, 64) if v.ndim == 2 else (100,), **FILTERS[filt])
    before = hash_file(src)
    res = inject_file(src, in_place=True, atomic=False, seed=2, count=30)
    want = {k: v.copy() for k, v in arrays.items()}
    reference.apply_plan(want, res.log.plan)
    got = _read(src)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    assert revert(res.log_path, src, atomic=False).digest == before


def test_checksum_failure_refused(tmp_path):
    src = str(tmp_path / "in.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("w", data=np.arange(64, dtype="<f4").reshape(8, 8), chunks=(4, 4), fletcher32=True)
        info = f["w"].id.get_chunk_info(0)
    data = bytearray(open(src, "rb").read())
    data[info.byte_offset + 3] ^= 0x10  # damage the first chunk
    open(src, "wb").write(bytes(data))
    out = str(tmp_path / "out.h5")
    with pytest.raises(UnsupportedStorageError, match="fletcher32 checksum fails") as ei:
        inject_file(src, out, seed=1, count=64)
    assert "\n" not in str(ei.value) and not os.path.exists(out)
    assert not [x for x in os.listdir(tmp_path) if "fastflip-tmp" in x]


def test_unavailable_filter_refused(tmp_path):
    from h5py import h5d, h5p, h5s, h5t, h5z

    src = str(tmp_path / "in.h5")
    with h5py.File(src, "w") as f:
        dcpl = h5p.create(h5p.DATASET_CREATE)
        dcpl.set_chunk((4,))
        dcpl.set_filter(32004, h5z.FLAG_OPTIONAL, (0,))  # lz4 plugin: not installed, optional so writes succeed
        ds = h5d.create(f.id, b"w", h5t.IEEE_F32LE, h5s.create_simple((16,)), dcpl=dcpl)
        ds.write(h5s.ALL, h5s.ALL, np.ones(16, "<f4"))
    assert not h5z.filter_avail(32004)
    out = str(tmp_path / "out.h5")
    with pytest.raises(UnsupportedStorageError, match="filter 32004 is not available"):
        inject_file(src, out, seed=1, count=3)
    assert not os.path.exists(out)


def test_fletcher32_matches_hdf5(tmp_path):
    p = str(tmp_path / "f.h5")
    rng = np.random.default_rng(0)
    with h5py.File(p, "w") as f:
        for n in (1, 7, 360, 1001):
            f.create_dataset(f"a{n}", data=rng.integers(0, 255, n).astype("u1"), chunks=(n,), fletcher32=True)
        f.create_dataset("z", data=np.zeros(10, "f4"), chunks=(10,), fletcher32=True)
    with h5py.File(p, "r") as f:
        for k in f:
            _, raw = f[k].id.read_direct_chunk((0,))
            assert fletcher32(raw[:-4]).to_bytes(4, "little") == raw[-4:], k


def test_shuffle_matches_hdf5(tmp_path):
    p = str(tmp_path / "s.h5")
    a = np.arange(40, dtype="<i4") * 1000003
    with h5py.File(p, "w") as f:
        f.create_dataset("s", data=a, chunks=(40,), shuffle=True)
    with h5py.File(p, "r") as f:
        _, raw = f["s"].id.read_direct_chunk((0,))
    assert raw == shuffle(a.tobytes(), 4) and unshuffle(raw, 4) == a.tobytes()


@pytest.mark.parametrize("filt", ["lzf", "shuffle-lzf", "lzf-fletcher32", "shuffle-lzf-fletcher32"])
def test_lzf_chunks_patched_natively(tmp_path, filt, monkeypatch):
    """lzf chunks take the chunk path (where the new stream fits the stored size), h5py's own lzf filter reads
    the exact values back, and revert restores the file byte for byte."""
    from fastflip.files import h5chunks

    require("fastflip.kernels._lzf")  # the native LZF codec (built from ext/_lzf.pyx)
    monkeypatch.setattr(h5chunks, "_SAID", set())
    rng = np.random.default_rng(7)
    src = str(tmp_path / "in.h5")
    # compressible data, so that HDF5 stores every chunk lzf-encoded (a chunk lzf cannot shrink is stored raw);
    # a chunk of a few bytes (a constant tensor) has no room for a flip and goes through h5py (tested above)
    arrays = {"/w": (np.round(rng.standard_normal((96, 64)) * 4) / 4).astype("<f4"),
              "/steps": np.arange(500, dtype=">i8"), "/h": (np.round(rng.standard_normal((40, 30)) * 4) / 4).astype("<f2")}
    with h5py.File(src, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v, chunks=(20, 30) if v.ndim == 2 else (100,), **FILTERS[filt])
        masks = [f[k].id.get_chunk_info(i).filter_mask for k in f for i in range(f[k].id.get_num_chunks())]
    assert not any(masks)  # every chunk really is lzf-encoded
    before = hash_file(src)
    by_name = {t.path: t for t in read_layout(src).tensors}
    for i, model in enumerate(["flip", "random-value", "adjacent:3"]):
        out = str(tmp_path / f"out{i}.h5")
        monkeypatch.setattr(h5chunks, "_SAID", set())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # a fallback to h5py is said as a warning
            res = inject_file(src, out, seed=11 + i, count=60, model=model)
        fell_back = [w for w in caught if "go through h5py" in str(w.message)]
        # most re-encoded chunks fit their stored sizes; a flip that breaks a long run of equal bytes (a
        # shuffled byte plane of small integers) may need bytes the chunk lacks: that chunk goes through h5py
        cp = h5chunks.chunk_patches(src, res.log.plan, route_sites(src, res.log.plan, by_name))
        assert len(cp.handled) >= (0.8 if model == "flip" else 0.5) * len(res.log.plan), (model, len(cp.handled))
        assert bool(fell_back) == (len(cp.handled) < len(res.log.plan))
        want = {k: v.copy() for k, v in arrays.items()}
        old, new = reference.apply_plan(want, res.log.plan)
        assert np.array_equal(old, res.log.old_words) and np.array_equal(new, res.log.new_words)
        got = _read(out)
        for k in want:
            assert got[k].tobytes() == want[k].tobytes(), (model, k)
        if not fell_back:
            assert os.path.getsize(out) == os.path.getsize(src) and res.log.undo.new_size == res.log.undo.size
        rep = replay(res.log_path, src, str(tmp_path / "rep.h5"))
        assert sha256_file(rep.output) == sha256_file(out)
        assert revert(res.log_path, out).digest == before
        assert open(out, "rb").read() == open(src, "rb").read()
    # in place without a temporary copy, then back
    res = inject_file(src, in_place=True, atomic=False, seed=3, count=20, selection={"include": ["/w"]})
    assert hash_file(src) != before
    assert revert(res.log_path, src, atomic=False).digest == before


def test_damaged_lzf_chunk_refused(tmp_path):
    require("fastflip.kernels._lzf")
    src = str(tmp_path / "in.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("w", data=np.zeros((64, 64), "<f4"), chunks=(32, 32), compression="lzf")
        info = f["w"].id.get_chunk_info(0)
    data = bytearray(open(src, "rb").read())
    data[info.byte_offset] = 0x1F  # the first literal run now swallows what follows: not a stream of this size
    open(src, "wb").write(bytes(data))
    out = str(tmp_path / "out.h5")
    with pytest.raises(UnsupportedStorageError, match="lzf") as ei:
        inject_file(src, out, seed=1, count=4096 * 4 - 1, selection={"include": ["/w"]})
    assert "\n" not in str(ei.value) and not os.path.exists(out)


def test_lzf_codec_round_trips():
    _lzf = require("fastflip.kernels._lzf")

    rng = np.random.default_rng(0)
    cases = [b"", b"a", bytes(1000), rng.integers(0, 256, 5000, dtype=np.uint8).tobytes(),
             np.arange(3000, dtype="<i4").tobytes(), (b"abcabcabd" * 500)]
    for data in cases:
        z = _lzf.compress(data)
        assert _lzf.decompress(z, len(data)) == data
        changed = bytearray(data)
        for i in rng.integers(0, max(1, len(data)), 5 if data else 0):
            changed[i] ^= 0x41
        r = _lzf.reencode(z, bytes(changed))
        assert _lzf.decompress(r, len(data)) == bytes(changed)
        assert _lzf.reencode(z, data) == z  # unchanged data keeps its encoding
        for extra in range(0, 12):
            g = _lzf.grow(z, data, extra)
            assert g is None or (len(g) == len(z) + extra and _lzf.decompress(g, len(data)) == data)
    for bad in (b"\x05ab", b"\x20\x00", b"\xe0"):  # literal past the end, reference before the start, cut short
        with pytest.raises(ValueError, match="not an LZF stream of 10 bytes"):
            _lzf.decompress(bad, 10)
