"""Layout walking and exact element byte offsets (checked against raw file reads)."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import h5fixtures as hf
from fastflip.errors import InputFileError, NotHDF5Error, TensorNotFoundError, UnsupportedStorageError
from fastflip.files.h5offsets import ChunkIndex, chunk_index, element_byte_offsets
from fastflip.files.layout import Tensor, read_layout


def raw_read(path: str, offsets: np.ndarray, itemsize: int) -> list[bytes]:
    """Bytes at each offset, read with plain Python file I/O (no HDF5 involved)."""
    out = []
    with open(path, "rb") as fh:
        for off in offsets.tolist():
            fh.seek(off)
            out.append(fh.read(itemsize))
    return out


def assert_offsets_exact(path: str, t: Tensor, expect: np.ndarray) -> None:
    """Every element's computed offset holds exactly the bytes h5py reads for it."""
    flat = np.arange(t.size, dtype=np.int64)
    offs = element_byte_offsets(path, t, flat)
    assert offs.dtype == np.int64 and offs.shape == (t.size,)
    values = np.asarray(expect, dtype=t.dtype).reshape(-1)
    with h5py.File(path, "r") as f:
        read = f[t.path][()].reshape(-1)
    assert read.dtype == t.dtype
    assert read.tobytes() == values.tobytes()
    got = raw_read(path, offs, t.itemsize)
    want = [values[i : i + 1].tobytes() for i in range(t.size)]
    assert got == want


def test_dtype_zoo_contiguous_offsets_exact(tmp_path):
    path = str(tmp_path / "zoo.h5")
    arrays = hf.dtype_zoo(path)
    lay = read_layout(path)
    assert {t.path for t in lay.tensors} == set(arrays)
    assert not lay.skipped
    for t in lay.tensors:
        a = arrays[t.path]
        assert t.dtype == a.dtype and t.dtype.str == a.dtype.str, t.path  # byte order kept
        assert t.shape == a.shape and t.size == a.size and t.nbytes == a.nbytes
        assert t.storage == "contiguous" and t.offset is not None and t.chunks is None
        assert_offsets_exact(path, t, a)
    be = [t for t in lay.tensors if t.dtype.byteorder == ">"]
    assert {t.dtype.str for t in be} == {">f2", ">f4", ">f8", ">i2", ">i4", ">i8", ">u2", ">u4", ">u8"}


def test_dtype_zoo_chunked_offsets_exact(tmp_path):
    path = str(tmp_path / "zoo_chunked.h5")
    arrays = hf.dtype_zoo(path, shape=(5, 7), chunks=(2, 3))  # edge chunks on both axes
    lay = read_layout(path)
    for t in lay.tensors:
        assert t.storage == "chunked" and t.chunks == (2, 3) and t.offset is None
        assert_offsets_exact(path, t, arrays[t.path])


@pytest.mark.parametrize("shape,chunks", [((7, 10), (3, 4)), ((11,), (4,)), ((3, 4, 5), (2, 3, 2)), ((1, 9), (1, 4))])
def test_chunked_edges_and_unallocated(tmp_path, shape, chunks):
    path = str(tmp_path / "c.h5")
    expect = hf.chunked_file(path, shape=shape, chunks=chunks, dtype=">f8", write_chunks=2, fillvalue=-1.5)
    (t,) = read_layout(path).tensors
    idx = chunk_index(path, t)
    grid = idx.grid
    assert grid == tuple(-(-s // c) for s, c in zip(shape, chunks))
    # chunks written: every 2nd chunk in grid C order
    written = np.zeros(grid, dtype=bool).reshape(-1)
    written[::2] = True
    written = written.reshape(grid)
    assert len(idx.offsets) == int(written.sum())
    assert ((idx.dense >= 0) == written).all()
    flat = np.arange(t.size, dtype=np.int64)
    offs = element_byte_offsets(path, t, flat)
    coords = np.unravel_index(flat, shape)
    elem_written = written[tuple(c // k for c, k in zip(coords, chunks))]
    assert ((offs >= 0) == elem_written).all()
    # unallocated chunks read as the fill value through h5py
    assert (expect.reshape(-1)[~elem_written] == -1.5).all()
    vals = expect.reshape(-1)
    got = raw_read(path, offs[elem_written], 8)
    assert got == [vals[i : i + 1].tobytes() for i in np.flatnonzero(elem_written)]


def test_chunk_index_is_reusable_and_matches_random_indices(tmp_path):
    path = str(tmp_path / "c.h5")
    expect = hf.chunked_file(path, shape=(50, 33), chunks=(7, 5), dtype="<i2")
    lay = read_layout(path)
    t = lay.tensors[0]
    with h5py.File(path, "r") as f:
        idx = chunk_index(f, t)
        assert isinstance(idx, ChunkIndex)
        assert idx.coords.shape == (len(idx.offsets), 2)
        assert len(idx.offsets) == f[t.path].id.get_num_chunks() == 8 * 7
        also = chunk_index(f[t.path])  # from the dataset directly
    assert np.array_equal(also.offsets, idx.offsets)
    rng = np.random.default_rng(3)
    flat = rng.integers(0, t.size, 500)
    offs = idx.byte_offsets(flat)
    got = raw_read(path, offs, 2)
    assert got == [expect.reshape(-1)[i : i + 1].tobytes() for i in flat]
    assert idx.byte_offsets(np.array([], dtype=np.int64)).shape == (0,)


def test_userblock_offsets_are_absolute(tmp_path):
    path = str(tmp_path / "ub.h5")
    expect = hf.chunked_file(path, shape=(6, 5), chunks=(4, 4), dtype="<f4", userblock_size=1024)
    with h5py.File(path, "a") as f:
        f["c"] = np.arange(10, dtype=">i4")
    lay = read_layout(path)
    assert_offsets_exact(path, lay.tensor("/x"), expect)
    assert_offsets_exact(path, lay.tensor("c"), np.arange(10, dtype=">i4"))


def test_storage_zoo(tmp_path):
    path = str(tmp_path / "storage.h5")
    info = hf.storage_zoo(path)
    lay = read_layout(path)
    got = {t.path: t for t in lay.tensors}
    assert set(got) == set(info["arrays"])
    for p, kind in info["storage"].items():
        assert got[p].storage == kind, p
    for p, aliases in info["aliases"].items():
        assert got[p].aliases == aliases
    skipped = {s.path: s.reason for s in lay.skipped}
    assert set(skipped) == set(info["skipped"])
    for p, why in info["skipped"].items():
        assert why in skipped[p], (p, skipped[p])
    assert skipped["/links/ext"] == "external link (fastflip never writes outside the checkpoint file)"
    assert got["/gzip"].filters == ("gzip",)
    assert got["/shuffle_gzip"].filters == ("shuffle", "gzip")
    assert got["/lzf"].filters == ("lzf",)
    assert got["/fletcher"].filters == ("fletcher32",)
    assert got["/gzip"].chunks == (5, 3)
    assert got["/flags"].dtype == np.dtype(bool)
    assert got["/scalar"].shape == () and got["/scalar"].size == 1
    # values of every tensor as h5py reads them are what the fixture wrote
    with h5py.File(path, "r") as f:
        for p, a in info["arrays"].items():
            assert f[p][()].tobytes() == np.asarray(a, dtype=got[p].dtype).tobytes(), p
    # raw offsets exact for the contiguous and chunked ones (incl. the sparse chunk grid)
    for p, t in got.items():
        if t.storage in ("contiguous", "chunked") and p != "/sparse":
            assert_offsets_exact(path, t, info["arrays"][p])
    sp = got["/sparse"]
    offs = element_byte_offsets(path, sp, np.arange(36))
    assert (offs.reshape(6, 6)[4:6, 0:4] == -1).all() and (offs.reshape(6, 6)[0:4, 0:4] >= 0).all()
    # no fixed offsets for the rest
    for p in ("/gzip", "/compact", "/external", "/unwritten"):
        with pytest.raises(UnsupportedStorageError, match=p):
            element_byte_offsets(path, got[p], np.array([0]))
    with pytest.raises(IndexError):
        element_byte_offsets(path, got["/contig"], np.array([24]))


def test_hard_link_cycle_and_group_alias(tmp_path):
    path = str(tmp_path / "cyc.h5")
    with h5py.File(path, "w") as f:
        f["a/b/w"] = np.ones(3, "f4")
        f["a/b/loop"] = f["a"]  # group hard link to an ancestor: a cycle
        f["a/soft_grp"] = h5py.SoftLink("/a/b")
    lay = read_layout(path)
    (t,) = lay.tensors
    assert t.aliases == ("/a/b/w", "/a/soft_grp/w")
    assert t.path == "/a/b/w"


def test_hard_linked_dataset_is_described_once_and_listed_once(tmp_path, monkeypatch):
    """A dataset reached by several hard links (in other groups, and through a second link to a group) is one
    tensor whose aliases are every path, described once; a hard-linked dataset that is not a tensor is skipped
    once, under its first path."""
    import fastflip.files.layout as layout

    path = str(tmp_path / "hard.h5")
    with h5py.File(path, "w") as f:
        f["b/w"] = np.arange(6, dtype="<f4").reshape(2, 3)
        f["a/w_again"] = f["b/w"]
        f["w_top"] = f["b/w"]
        f["c"] = f["a"]  # a second link to a group: /c/w_again reaches the dataset too
        f["b/text"] = np.array([b"x"], dtype="S1")  # not a tensor
        f["a/text_again"] = f["b/text"]
        f["single"] = np.zeros(2, "<i2")
    calls = []
    describe = layout._describe
    monkeypatch.setattr(layout, "_describe", lambda dsid, fsize: calls.append(dsid.id) or describe(dsid, fsize))
    lay = read_layout(path)
    assert len(calls) == 3
    assert [(t.path, t.aliases) for t in lay.tensors] == [
        ("/a/w_again", ("/a/w_again", "/b/w", "/c/w_again", "/w_top")), ("/single", ("/single",))]
    with h5py.File(path, "r") as f:
        t = lay.tensor("/b/w")
        assert (t.shape, t.dtype, t.offset) == ((2, 3), np.dtype("<f4"), f["b/w"].id.get_offset())
    assert [s.path for s in lay.skipped] == ["/a/text_again"]


def test_layout_never_reads_data(tmp_path, monkeypatch):
    path = str(tmp_path / "z.h5")
    hf.storage_zoo(path)

    def boom(*a, **k):
        raise AssertionError("layout read dataset data")

    monkeypatch.setattr(h5py.Dataset, "__getitem__", boom)
    monkeypatch.setattr(h5py.Dataset, "read_direct", boom)
    monkeypatch.setattr(h5py.Dataset, "__array__", boom)
    lay = read_layout(path)
    assert len(lay.tensors) == 15


def test_json_totals_and_lookup(tmp_path):
    path = str(tmp_path / "z.h5")
    info = hf.storage_zoo(path)
    lay = read_layout(path)
    d = json.loads(lay.to_json())
    assert d == lay.as_dict()
    assert d["totals"]["tensors"] == len(info["arrays"])
    assert d["totals"]["elements"] == sum(a.size for a in info["arrays"].values())
    assert d["totals"]["bytes"] == sum(np.asarray(a).nbytes for a in info["arrays"].values())
    assert d["totals"]["storage"]["filtered"] == 4
    assert d["totals"]["skipped"] == len(info["skipped"])
    tj = {t["path"]: t for t in d["tensors"]}
    assert tj["/contig_be"]["dtype"] == ">f8" and tj["/contig"]["aliases"] == ["/contig", "/hard_alias"]
    assert lay.tensor("hard_alias").path == "/contig"
    assert lay.tensor("/weights/kernel").path == "/links/soft"
    with pytest.raises(TensorNotFoundError, match="nope"):
        lay.tensor("nope")
    with pytest.raises(KeyError):
        lay.tensor("nope")
    assert lay.tensor("/contig").ref().dtype == "<f4"


def test_natural_order(tmp_path):
    path = str(tmp_path / "n.h5")
    hf.write_datasets(path, {f"vars/{i}": np.zeros(2, "f4") for i in (10, 2, 1, 0)})
    assert [t.path for t in read_layout(path)] == ["/vars/0", "/vars/1", "/vars/2", "/vars/10"]


def test_many_datasets(tmp_path):
    path = str(tmp_path / "many.h5")
    hf.many_datasets(path, 300)
    lay = read_layout(path)
    assert len(lay) == 300 and lay.totals["elements"] == 1200


def test_missing_file(tmp_path):
    with pytest.raises(InputFileError, match="not found"):
        read_layout(tmp_path / "missing.h5")


def test_directory(tmp_path):
    with pytest.raises(InputFileError, match="directory"):
        read_layout(tmp_path)


def test_not_hdf5(tmp_path):
    p = hf.not_hdf5(tmp_path / "x.h5")
    with pytest.raises(NotHDF5Error) as ei:
        read_layout(p)
    msg = str(ei.value)
    assert p in msg and "not an HDF5 file" in msg and "\n" not in msg


def test_locked_file(tmp_path):
    import subprocess
    import sys

    p = str(tmp_path / "w.h5")
    hf.write_datasets(p, {"x": np.zeros(2, "f4")})
    code = f"import h5py, time; f = h5py.File({p!r}, 'a'); print('ready', flush=True); time.sleep(60)"
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        if os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE":
            assert len(read_layout(p)) == 1
        else:
            with pytest.raises(InputFileError, match="locked") as ei:
                read_layout(p)
            assert not isinstance(ei.value, NotHDF5Error) and "\n" not in str(ei.value)
    finally:
        writer.kill()
        writer.wait()


def test_zip_archive_hint(tmp_path):
    import zipfile

    p = str(tmp_path / "model.keras")
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("config.json", "{}")
    with pytest.raises(NotHDF5Error, match="zip archive"):
        read_layout(p)


@pytest.mark.parametrize("keep", [0.05, 0.3, 0.6, 0.9])
def test_truncated(tmp_path, keep):
    src = str(tmp_path / "src.h5")
    hf.dtype_zoo(src, shape=(40, 40))
    p = hf.truncated_copy(src, tmp_path / "cut.h5", keep=keep)
    with pytest.raises(NotHDF5Error) as ei:
        read_layout(p)
    assert str(p) in str(ei.value) and "\n" not in str(ei.value)


def test_empty_file(tmp_path):
    p = str(tmp_path / "e.h5")
    with h5py.File(p, "w"):
        pass
    lay = read_layout(p)
    assert lay.tensors == [] and lay.skipped == [] and lay.totals["tensors"] == 0
    assert os.path.exists(p)


# ------------------------------------------------------------------ fastflip inspect


def test_cli_inspect_table(tmp_path, capsys):
    from fastflip.cli import main

    path = str(tmp_path / "z.h5")
    hf.storage_zoo(path)
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    lay = read_layout(path)
    for t in lay.tensors:
        assert t.path in out
    contig = lay.tensor("/contig")
    assert f"contiguous@{contig.offset}" in out and "/hard_alias" in out
    assert "filtered(7) shuffle+gzip" in out and "chunked(3,4)" in out
    assert "total: 15 tensors" in out and "skipped 10 datasets" in out
    assert "/links/ext: external link (fastflip never writes outside the checkpoint file)" in out


def test_cli_inspect_json_and_selection(tmp_path, capsys):
    from fastflip.cli import main

    path = str(tmp_path / "t.h5")
    hf.torch_like(path)
    assert main(["inspect", path, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d.pop("schema_version") == 1
    assert d == json.loads(read_layout(path).to_json())
    assert d["framework"] == "torch"
    assert main(["inspect", path, "--json", "--role", "bn-statistic"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [t["path"] for t in d["tensors"]] == ["/model/bn1.running_mean", "/model/bn1.running_var"]
    assert d["totals"]["tensors"] == 2 and d["totals"]["elements"] == 8 and d["selection"]["roles"] == ["bn-statistic"]
    assert main(["inspect", path, "--role", "weight", "--layer", "conv*"]) == 0
    out = capsys.readouterr().out
    assert "/model/conv1.weight" in out and "bn1" not in out and "weight [conv1]" in out


def test_cli_inspect_errors(tmp_path, capsys):
    from fastflip.cli import main

    assert main(["inspect", str(tmp_path / "missing.h5")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastflip inspect: error:") and "not found" in err and err.count("\n") == 1
    bad = hf.not_hdf5(tmp_path / "bad.h5")
    assert main(["inspect", bad]) == 2
    assert "not an HDF5 file" in capsys.readouterr().err
    path = str(tmp_path / "t.h5")
    hf.torch_like(path)
    assert main(["inspect", path, "--include", "nothing"]) == 2
    err = capsys.readouterr().err
    assert "matched no tensor" in err and "/model/" in err


# property: for any shape, chunk shape, dtype and pattern of written chunks, the computed offsets
# hold exactly the bytes h5py reads (and -1 exactly where the chunk was never written)


@st.composite
def _chunked_case(draw):
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(nd))
    chunks = tuple(draw(st.integers(1, s)) for s in shape)
    dtype = draw(st.sampled_from(hf.ALL_DTYPES))
    every = draw(st.sampled_from(["all", 1, 2, 3]))
    return shape, chunks, dtype, every


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_chunked_case())
def test_chunked_offsets_property(tmp_path, case):
    shape, chunks, dtype, every = case
    path = str(tmp_path / "p.h5")
    expect = hf.chunked_file(path, shape=shape, chunks=chunks, dtype=dtype, write_chunks=every)
    (t,) = read_layout(path).tensors
    assert t.storage == "chunked" and t.dtype.str == np.dtype(dtype).str
    offs = element_byte_offsets(path, t, np.arange(t.size))
    grid = tuple(-(-s // c) for s, c in zip(shape, chunks))
    written = np.zeros(int(np.prod(grid)), bool)
    written[:: (1 if every == "all" else every)] = True
    coords = np.unravel_index(np.arange(t.size), shape)
    elem_written = written.reshape(grid)[tuple(c // k for c, k in zip(coords, chunks))]
    assert ((offs >= 0) == elem_written).all()
    vals = expect.reshape(-1)
    idx = np.flatnonzero(elem_written)
    assert raw_read(path, offs[idx], t.itemsize) == [vals[i : i + 1].tobytes() for i in idx]


def test_virtual_null_custom_float_and_more_filters(tmp_path):
    src = str(tmp_path / "src.h5")
    hf.write_datasets(src, {"part": np.arange(4, dtype="<f4")})
    path = str(tmp_path / "more.h5")
    with h5py.File(path, "w") as f:
        lay = h5py.VirtualLayout(shape=(4,), dtype="<f4")
        lay[:] = h5py.VirtualSource(src, "part", shape=(4,))
        f.create_virtual_dataset("vds", lay)
        f["null"] = h5py.Empty("f4")
        # a 32-bit float with a 22-bit mantissa at bit 1: h5py maps it to float32 but its bits are not IEEE
        tid = h5py.h5t.IEEE_F32LE.copy()
        tid.set_fields(31, 23, 8, 1, 22)
        h5py.h5d.create(f.id, b"oddfloat", tid, h5py.h5s.create_simple((2,)))
        # a 32-bit float with a 10-bit exponent: h5py maps it to float64
        tid = h5py.h5t.IEEE_F32LE.copy()
        tid.set_fields(31, 21, 10, 0, 21)
        tid.set_ebias(511)
        h5py.h5d.create(f.id, b"widefloat", tid, h5py.h5s.create_simple((2,)))
        f.create_dataset("scaleoff", data=np.arange(20, dtype="<i4"), scaleoffset=0, chunks=(10,))
        f.create_dataset("nbit_like", data=np.arange(20, dtype="<u2"), chunks=(10,), compression="gzip",
                         compression_opts=1, shuffle=True, fletcher32=True)
    lay = read_layout(path)
    got = {t.path: t for t in lay.tensors}
    assert got["/vds"].storage == "virtual"
    with pytest.raises(UnsupportedStorageError):
        element_byte_offsets(path, got["/vds"], np.array([0]))
    assert got["/scaleoff"].storage == "filtered" and got["/scaleoff"].filters == ("scaleoffset",)
    assert got["/nbit_like"].filters == ("shuffle", "gzip", "fletcher32")
    skipped = {s.path: s.reason for s in lay.skipped}
    assert skipped["/null"] == "null dataspace"
    assert skipped["/oddfloat"] == "non-IEEE floating-point type"
    assert skipped["/widefloat"] == "stored type of 4 bytes does not match float64"
