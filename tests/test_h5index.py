"""The chunk index in C (ext/_h5chunks.pyx, files/h5index.py) against h5py's own reading, differentially:
for every chunk of varied files (v1 B-tree, fixed array paged and not, extensible array, v2 B-tree, single
chunk; filters; user blocks; unwritten chunks; object-header continuations) the native lookup and walk give
``get_chunk_info``'s address, size and filter mask, and so does the pure-Python path; the inject path looks
up only the chunks it touches; the deflate routine shared with npz ends streams with valid empty blocks."""

from __future__ import annotations

import itertools
import os
import sys
import zlib

import h5py
import numpy as np
import pytest

from conftest import require
from fastflip.files import h5index, h5offsets
from fastflip.files.formats.deflatefit import deflate_exact, empty_blocks
from fastflip.files.h5index import element_offsets, lookup_chunks, object_info, walk_chunks
from fastflip.files.h5offsets import chunk_address_base, chunk_index
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout

# (shape, chunks, maxshape, filter, user block, libver) -> the index HDF5 picks
CASES = {
    "btree1-1d": ((2000,), (7,), None, None, 0, "earliest"),  # 286 chunks: a B-tree of two levels
    "btree1-2d-gzip": ((50, 60), (7, 9), None, "gzip", 0, "earliest"),
    "btree1-unlimited": ((50, 60), (7, 9), (None, 60), None, 0, "earliest"),
    "btree1-userblock-lzf": ((30, 20), (4, 5), (None, None), "lzf", 512, "earliest"),
    "btree1-3d-deep": ((40, 30, 20), (2, 3, 4), None, None, 0, "earliest"),  # 2000 chunks: three levels
    "single": ((10, 10), (10, 10), None, None, 0, "latest"),
    "single-gzip-userblock": ((10, 10), (10, 10), None, "gzip", 1024, "latest"),
    "farray": ((1000,), (7,), None, None, 0, "latest"),
    "farray-paged": ((6000,), (2,), None, None, 0, "latest"),  # 3000 chunks: pages of 1024, the middle unwritten
    "farray-paged-gzip-userblock": ((6000,), (5,), None, "gzip", 4096, "latest"),
    "farray-maxshape": ((40, 50), (7, 9), (80, 100), None, 0, "latest"),
    "farray-3d-lzf": ((6, 7, 8), (2, 3, 4), None, "lzf", 0, "latest"),
    "earray": ((50, 60), (7, 9), (None, 60), None, 0, "latest"),
    "btree2-gzip-userblock": ((30, 20), (4, 5), (None, None), "gzip", 512, "latest"),
}
NATIVE_KINDS = {"btree1", "farray", "single"}


def _build(path: str, case: tuple) -> None:
    shape, chunks, maxshape, comp, ub, libver = case
    rng = np.random.default_rng(0)
    with h5py.File(path, "w", libver=libver, userblock_size=ub) as f:
        kw = dict(chunks=chunks, maxshape=maxshape, compression=comp)
        full = f.create_dataset("g/full", shape=shape, dtype="f4", **kw)
        full[...] = rng.standard_normal(shape).astype("f4")
        sparse = f.create_dataset("g/sparse", shape=shape, dtype="f8", **kw)  # most chunks never written
        sparse[tuple(slice(0, c) for c in chunks)] = 1
        sparse[tuple(slice(s - 1, s) for s in shape)] = 2
        for i in range(40):  # attributes after the data: the object header continues in another block
            full.attrs[f"a{i}"] = np.arange(20) + i


@pytest.fixture(scope="module", params=sorted(CASES))
def h5file(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("h5index") / f"{request.param}.h5")
    _build(path, CASES[request.param])
    return path


def _truth(dsid, corners: np.ndarray) -> np.ndarray:
    """h5py's answer per corner: ``chunk_iter`` for all, checked against ``get_chunk_info_by_coord`` on a sample
    (each of those searches the index from its start)."""
    have: dict[tuple, tuple] = {}
    dsid.chunk_iter(lambda i: have.__setitem__(tuple(i.chunk_offset), (i.byte_offset, i.size, i.filter_mask)))
    rows = [have.get(tuple(c), (-1, 0, 0)) for c in corners.tolist()]
    for k in np.random.default_rng(5).permutation(len(corners))[:100].tolist():
        info = dsid.get_chunk_info_by_coord(tuple(corners[k].tolist()))
        missing = info.byte_offset is None  # (HDF5 leaves a missing chunk's mask unset: compared as 0)
        assert rows[k] == ((-1, 0, 0) if missing else (info.byte_offset, info.size, info.filter_mask))
    return np.array(rows, np.int64)


def _all_corners(ds) -> np.ndarray:
    return np.array(list(itertools.product(*(range(0, s, c) for s, c in zip(ds.shape, ds.chunks)))), np.int64)


def _datasets(path: str):
    """(name, dataset) of both datasets of a test file, the file open read-only meanwhile."""
    with h5py.File(path, "r") as f:
        for name in ("g/full", "g/sparse"):
            yield name, f[name]


@pytest.mark.parametrize("native", ["1", "0"])
def test_lookup_equals_h5py_for_every_chunk(h5file, native, monkeypatch):
    monkeypatch.setenv("FASTFLIP_H5_NATIVE", native)
    for name, ds in _datasets(h5file):
        corners = _all_corners(ds)
        got = np.stack([a.astype(np.int64) for a in lookup_chunks(ds.id, corners)], axis=1)
        np.testing.assert_array_equal(got, _truth(ds.id, corners), err_msg=f"{h5file}:{name}")


def test_native_index_reader_used_and_exact(h5file):
    require("fastflip.kernels._h5chunks")
    for name, ds in _datasets(h5file):
        fd = os.open(h5file, os.O_RDONLY)
        try:
            kind = h5index._index(fd, object_info(ds.id, b".")[0])[0]
        finally:
            os.close(fd)
        out = h5index._native_lookup(ds.id, _all_corners(ds))
        if kind not in NATIVE_KINDS:
            assert out is None  # HDF5's own lookup serves these
            continue
        assert out is not None, (h5file, name, kind)
        np.testing.assert_array_equal(np.stack([a.astype(np.int64) for a in out], axis=1),
                                      _truth(ds.id, _all_corners(ds)))


@pytest.mark.parametrize("native", ["1", "0"])
def test_walk_equals_get_chunk_info(h5file, native, monkeypatch):
    monkeypatch.setenv("FASTFLIP_H5_NATIVE", native)
    for _name, ds in _datasets(h5file):
        dsid = ds.id
        coords, addr, size, mask = walk_chunks(dsid)
        n = dsid.get_num_chunks()
        assert len(addr) == n
        for i in sorted({*range(min(n, 40)), *range(max(0, n - 40), n)}):  # get_chunk_info(i): O(i) each
            info = dsid.get_chunk_info(i)
            assert (tuple(coords[i]), addr[i], size[i], mask[i]) == (
                tuple(info.chunk_offset), info.byte_offset, info.size, info.filter_mask)
        got = np.stack([addr, size, mask.astype(np.int64)], axis=1)
        np.testing.assert_array_equal(got, _truth(dsid, coords))


def test_without_the_native_module_h5py_answers_the_same(tmp_path, monkeypatch):
    """A build without a compiler: every function goes through h5py, with the same answers."""
    p = str(tmp_path / "n.h5")
    _build(p, CASES["farray-paged-gzip-userblock"])
    with h5py.File(p, "r") as f:
        ds = f["g/sparse"]
        want_lookup = lookup_chunks(ds.id, _all_corners(ds))
        want_walk = walk_chunks(ds.id)
        want_info = object_info(f.id, b"g")
        monkeypatch.setattr(h5index, "_h5chunks", None)
        monkeypatch.setattr(h5index, "_BOUND", None)
        assert h5index.native_available() == (False, False, False)
        for got, want in [(lookup_chunks(ds.id, _all_corners(ds)), want_lookup), (walk_chunks(ds.id), want_walk)]:
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        assert object_info(f.id, b"g") == want_info


def test_object_info_equals_h5o(tmp_path):
    from h5py import h5o

    p = str(tmp_path / "o.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("a/b", data=np.zeros((100, 10)), chunks=(1, 10))
        f["soft"] = h5py.SoftLink("/a/b")
        f["dangling"] = h5py.SoftLink("/nowhere")
    with h5py.File(p, "r") as f:
        for loc, name in [(f.id, b"a"), (f["a"].id, b"b"), (f.id, b"soft"), (f.id, b".")]:
            info = h5o.get_info(loc, name) if name != b"." else h5o.get_info(loc)
            assert object_info(loc, name) == (int(info.addr), int(info.type))
        with pytest.raises(KeyError):
            object_info(f.id, b"dangling")


def test_damaged_btree_node_falls_back_to_hdf5(tmp_path):
    require("fastflip.kernels._h5chunks")
    p = str(tmp_path / "d.h5")
    _build(p, CASES["btree1-1d"])
    with h5py.File(p, "r") as f:
        corners = _all_corners(f["g/full"])
        want = _truth(f["g/full"].id, corners)
        fd = os.open(p, os.O_RDONLY)
        kind, root, _, _, _, base, _ = h5index._index(fd, object_info(f["g/full"].id, b".")[0])
        os.close(fd)
    assert kind == "btree1"
    with h5py.File(p, "r") as f:  # the native reader refuses a node it cannot read, HDF5 answers
        dsid = f["g/full"].id
        real = h5index._h5chunks.btree1_lookup
        with pytest.raises(ValueError, match="malformed version-1 B-tree node in the chunk index"):
            real(os.open(p, os.O_RDONLY), base, root + 1, 8, corners, 65535)
        np.testing.assert_array_equal(np.stack([a.astype(np.int64) for a in lookup_chunks(dsid, corners)], 1), want)


def test_element_offsets_equal_full_index(tmp_path):
    p = str(tmp_path / "e.h5")
    _build(p, CASES["btree1-3d-deep"][:3] + (None, 512, "earliest"))
    rng = np.random.default_rng(1)
    t = next(t for t in read_layout(p).tensors if t.path == "/g/sparse")
    with h5py.File(p, "r") as f:
        ds = f[t.path]
        flat = rng.integers(0, t.size, 5000)
        flat[:3] = [0, t.size - 1, 12345]
        want = chunk_index(ds).byte_offsets(flat)
        got = element_offsets(ds.id, t.shape, t.chunks, t.itemsize, flat, chunk_address_base(ds))
    np.testing.assert_array_equal(got, want)
    assert (got == -1).any() and (got >= 0).any()
    with open(p, "rb") as fh:  # the offsets are file offsets (user block included): the bytes are the values
        fh.seek(int(got[0]))
        assert np.frombuffer(fh.read(8), "<f8")[0] == 1.0


def test_tensor_offsets_equal_full_index_and_skip_hdf5_when_warm(h5file):
    """The route_sites path: equal to the whole index's offsets (user blocks, every index kind, unwritten chunks);
    the second call reads the index from the file without opening it in HDF5 where the native reader applies."""
    rng = np.random.default_rng(3)
    for t in read_layout(h5file).tensors:
        if t.storage != "chunked":
            continue
        opened = []
        with h5py.File(h5file, "r") as f:
            def open_dataset(t=t):
                opened.append(t.path)
                return f[t.path]

            flat = rng.integers(0, t.size, 300)
            want = chunk_index(f[t.path]).byte_offsets(flat)
            for _ in range(2):
                got = h5index.tensor_element_offsets(h5file, t, flat, open_dataset, chunk_address_base)
                np.testing.assert_array_equal(got, want, err_msg=f"{h5file}:{t.path}")
        native = bool(t.__dict__.get("_h5index_location"))
        assert len(opened) == (1 if native else 2), (t.path, opened)
        if h5index.native_available()[2] and not h5file.endswith(("earray.h5", "btree2-gzip-userblock.h5")):
            assert native, t.path


def test_inject_looks_up_only_touched_chunks(tmp_path, monkeypatch):
    """The layout read walks the chunk index once, for its overlap check (files/h5overlap.py, which holds its own
    ``walk_chunks``); the inject itself, with the layout known, looks up only the chunks it touches."""
    from fastflip.files import h5overlap, inject

    p = str(tmp_path / "i.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("w", data=np.arange(50000, dtype="<f4"), chunks=(16,))
    before = np.array(h5py.File(p, "r")["w"][...])
    walks = []
    real_walk = h5overlap.walk_chunks
    monkeypatch.setattr(h5overlap, "walk_chunks", lambda dsid: walks.append(1) or real_walk(dsid))
    inject.cached_layout(p)
    assert walks == [1]  # the overlap check of the layout read

    def whole_index(*a, **k):
        raise AssertionError("the whole chunk index was walked")

    monkeypatch.setattr(h5offsets, "chunk_index", whole_index)
    monkeypatch.setattr(h5index, "walk_chunks", whole_index)
    monkeypatch.setattr(h5overlap, "walk_chunks", whole_index)
    inject_file(p, in_place=True, atomic=False, seed=3, count=10, log_path=False, hash_files=False)
    after = h5py.File(p, "r")["w"][...]
    assert 1 <= int((before.view("<u4") != after.view("<u4")).sum()) <= 10


def test_filtered_chunk_patches_from_the_touched_chunks_routine_without_an_h5py_file(tmp_path, monkeypatch):
    """Filtered chunks: the touched chunks and each site's place in its chunk come from h5index's one routine
    (``touched_chunks``), the sites are grouped by chunk by one sort, and the file is opened at HDF5's low level
    (no ``h5py.File``); the patched bytes are the flips h5py reads, word for word."""
    from fastflip.core.wordrule import new_words
    from fastflip.files import h5chunks
    from fastflip.files.h5apply import route_sites

    p, out = str(tmp_path / "g.h5"), str(tmp_path / "o.h5")
    a = np.random.default_rng(5).integers(0, 4, (60, 50)).astype("<f4")  # compressible: the chunks re-encode
    with h5py.File(p, "w") as f:
        f.create_dataset("w", data=a, chunks=(7, 9), compression="gzip", compression_opts=1)
    plan = inject_file(p, out, seed=2, count=200, bits="sign", log_path=False).log.plan  # several sites a chunk
    routes = route_sites(p, plan, {t.path: t for t in read_layout(p).tensors})
    grids, files = [], []
    real_touched = h5chunks.touched_chunks
    monkeypatch.setattr(h5chunks, "touched_chunks", lambda *x: grids.append(x[:2]) or real_touched(*x))

    class Counted(h5py.File):
        def __init__(self, *x, **k):
            files.append(x[0])
            super().__init__(*x, **k)

    monkeypatch.setattr(h5py, "File", Counted)
    cp = h5chunks.chunk_patches(p, plan, routes)
    monkeypatch.undo()
    assert files == [] and grids == [((60, 50), (7, 9))]
    assert cp.chunks == len(cp.patches) >= 40 and len(set(cp.handled.tolist())) == len(cp.handled) >= 150
    want_old = a.reshape(-1).view("<u4")[plan.index[cp.handled]].astype(np.uint64)
    np.testing.assert_array_equal(cp.old, want_old)
    h = cp.handled
    np.testing.assert_array_equal(cp.new, new_words(want_old, plan.and_mask[h], plan.or_mask[h], plan.xor_mask[h],
                                                    None, np.dtype("<f4")))
    data = bytearray(open(p, "rb").read())
    for off, old, new in cp.patches:
        assert data[off:off + len(old)] == old
        data[off:off + len(new)] = new
    with open(out, "wb") as fh:
        fh.write(data)
    expect = a.reshape(-1).view("<u4").copy()
    expect[plan.index[h]] = cp.new.astype("<u4")  # (sites h5py would handle stay old in this copy)
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["w"][...].reshape(-1).view("<u4"), expect)


def test_in_place_flips_keep_the_cached_layout(tmp_path, monkeypatch):
    """In place, only tensor bytes change: the next run reuses the layout instead of walking the file again."""
    from fastflip.files import inject

    p = str(tmp_path / "k.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("w", data=np.arange(5000, dtype="<f4"), chunks=(16,))
        f.create_dataset("v", data=np.arange(100, dtype="<f8"))
    inject_file(p, in_place=True, atomic=False, seed=1, count=5, log_path=False, hash_files=False)
    os.utime(p, ns=(1, 1))  # the next write certainly changes the mtime

    def walked(*a, **k):
        raise AssertionError("the file was walked again")

    inject.cached_layout(p)  # (re-read once: the mtime was set by hand above)
    monkeypatch.setattr(inject, "read_layout", walked)
    for seed in (2, 3):
        inject_file(p, in_place=True, atomic=False, seed=seed, count=5, log_path=False, hash_files=False)
    assert inject.cached_layout(p).tensors


@pytest.mark.parametrize("wbits", [-15, 15])
def test_deflate_exact_is_one_valid_stream_of_the_size(wbits):
    rng = np.random.default_rng(2)
    data = (rng.standard_normal(4096) * 0.01).astype("<f4").tobytes()
    c = zlib.compressobj(6, zlib.DEFLATED, wbits, 8)
    smallest = len(c.compress(data) + c.flush())
    for size in range(smallest + 6, smallest + 40):  # one compression, then empty blocks: every size fits
        z = deflate_exact(data, size, 6, wbits=wbits, mem_level=8)
        assert z is not None and len(z) == size
        d = zlib.decompressobj(wbits)
        assert d.decompress(z) == data and d.eof and d.unused_data == b""  # valid blocks to the end, no zeros
    for size in range(smallest, smallest + 6):  # a few small rooms have no empty-block ending: zeros then
        z = deflate_exact(data, size, 6, wbits=wbits, mem_level=8, zero_pad=True)
        assert z is not None and len(z) == size and zlib.decompressobj(wbits).decompress(z) == data
    assert [len(empty_blocks(n)) for n in range(2, 20)] == list(range(2, 20))


def test_gzip_chunk_patch_ends_in_empty_blocks(tmp_path):
    """A patched gzip chunk keeps its size and is one complete zlib stream (no zero padding) read by h5py."""
    p = str(tmp_path / "z.h5")
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((64, 64)) * 0.01).astype("<f4")
    with h5py.File(p, "w") as f:
        f.create_dataset("w", data=a, chunks=(16, 64), compression="gzip")
    with h5py.File(p, "r") as f:
        old = {c: f["w"].id.read_direct_chunk(c)[1] for c in [(0, 0), (16, 0), (32, 0), (48, 0)]}
    inject_file(p, in_place=True, atomic=False, seed=1, count=8, log_path=False, hash_files=False)
    changed = 0
    with h5py.File(p, "r") as f:
        for c, raw in old.items():
            new = f["w"].id.read_direct_chunk(c)[1]
            assert len(new) == len(raw)
            if new != raw:
                changed += 1
                d = zlib.decompressobj()
                assert len(d.decompress(new)) == 16 * 64 * 4 and d.eof and d.unused_data == b""
        assert int((f["w"][...].view("<u4") != a.view("<u4")).sum()) >= 1
    assert changed >= 1


@pytest.mark.parametrize("route", ["native", "native-read-fails", "hdf5"])
def test_chunk_grid_computed_once_per_lookup(h5file, route, monkeypatch):
    """One lookup of a dataset's elements works out its chunk grid once, whichever way the index is read
    (the index location, remembered per tensor, holds the grid of its maximum shape, worked out when it is found)."""
    if route == "hdf5":
        monkeypatch.setenv("FASTFLIP_H5_NATIVE", "0")
    elif not h5index.native_available()[2]:
        pytest.skip("no native HDF5 index reader here")
    if route == "native-read-fails":
        def broken(*a):
            raise ValueError("malformed")

        monkeypatch.setattr(h5index, "_read_index", broken)
    t = next(t for t in read_layout(h5file).tensors if t.path == "/g/full")
    flat = np.random.default_rng(4).integers(0, t.size, 200)
    with h5py.File(h5file, "r") as f:
        want = chunk_index(f[t.path]).byte_offsets(flat)
        h5index.tensor_element_offsets(h5file, t, flat, lambda: f[t.path], chunk_address_base)  # finds the index
        grids = []
        real = h5index.chunk_grid

        def counting(*a):  # the grids of elements' chunks (not the index location's grid of the maximum shape)
            if sys._getframe(1).f_code.co_name != "_locate":
                grids.append(a)
            return real(*a)

        monkeypatch.setattr(h5index, "chunk_grid", counting)
        got = h5index.tensor_element_offsets(h5file, t, flat, lambda: f[t.path], chunk_address_base)
        np.testing.assert_array_equal(got, want)
        assert grids == [(t.shape, t.chunks)]
        grids.clear()
        got = element_offsets(f[t.path].id, t.shape, t.chunks, t.itemsize, flat, chunk_address_base(f[t.path]))
        np.testing.assert_array_equal(got, want)
        assert grids == [(t.shape, t.chunks)]
