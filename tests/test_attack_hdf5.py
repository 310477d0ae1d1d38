"""HDF5 files that h5py reads: fastflip agrees element by element (every hard and soft link of a dataset), or
refuses in one line (tests/attack_check.py).

Each file is written by h5py (its high-level API, or ``h5py.h5d.create`` for datatypes and layouts it does not
offer: compact storage, integers of fewer significant bits than their bytes); h5py's reading is the judge. A
dataset fastflip skips must be one whose flips h5py would not read back as written.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from attack_check import verdict
from framework_views import h5_group_view

A = np.arange(24, dtype="<f4").reshape(4, 6)
ONES = np.ones(3)


def h5_links_view(path: str) -> dict[str, np.ndarray]:
    """h5py's reading of every dataset under its hard links and the soft links that resolve to it (one array)."""
    seen: dict = {}
    with h5py.File(path, "r") as f:
        out = h5_group_view(f, seen=seen)
        soft: list[str] = []
        f.visit_links(lambda name: soft.append(name) if isinstance(f.get(name, getlink=True), h5py.SoftLink)
                      else None)
        for name in soft:
            obj = f.get(name)
            if isinstance(obj, h5py.Dataset) and obj.id in seen:
                out["/" + name] = seen[obj.id]
    return out


def _low_level(f: h5py.File, name: str, tid, data: np.ndarray, chunks: tuple | None = None,  # type: ignore[no-untyped-def]
               layout: int | None = None, nbit: bool = False) -> None:
    """A dataset of type ``tid`` made with HDF5's own calls (layouts and types h5py's API does not offer)."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    if chunks:
        dcpl.set_chunk(chunks)
    if layout is not None:
        dcpl.set_layout(layout)
    if nbit:
        dcpl.set_filter(h5py.h5z.FILTER_NBIT, 0)
    h5py.h5d.create(f.id, name.encode(), tid, h5py.h5s.create_simple(data.shape), dcpl)
    f[name][...] = data


def _precise(base, precision: int, offset: int):  # type: ignore[no-untyped-def]
    t = base.copy()
    t.set_precision(precision)
    t.set_offset(offset)
    return t


def _links(f: h5py.File) -> None:
    f.create_dataset("g/a", data=A)
    f["h"] = f["g/a"]
    f["soft"] = h5py.SoftLink("/g/a")
    f["ext"] = h5py.ExternalLink("other.h5", "/x")
    f["dangling"] = h5py.SoftLink("/nope")


def _partial(f: h5py.File, **kw) -> None:  # type: ignore[no-untyped-def]
    d = f.create_dataset("p", shape=(4, 6), dtype="<f4", chunks=(2, 3), fillvalue=-2.0, **kw)
    d[0:2, 0:3] = 7.0


def _external(f: h5py.File, tmp) -> None:  # type: ignore[no-untyped-def]
    ext = str(tmp / "raw.bin")
    A.tofile(ext)
    f.create_dataset("e", shape=A.shape, dtype="<f4", external=[(ext, 0, A.nbytes)])
    f.create_dataset("x", data=ONES)


def _virtual(f: h5py.File, tmp) -> None:  # type: ignore[no-untyped-def]
    f.create_dataset("src", data=A)
    lay = h5py.VirtualLayout(shape=A.shape, dtype="<f4")
    lay[:] = h5py.VirtualSource(f["src"])
    f.create_virtual_dataset("v", lay)


AGREE = {
    "contiguous": lambda f: f.create_dataset("a", data=A),
    "compact layout": lambda f: (_low_level(f, "c", h5py.h5t.IEEE_F32LE, A, layout=h5py.h5d.COMPACT),
                                 f.create_dataset("x", data=ONES)),
    "contiguous, never written (fill value)": lambda f: (f.create_dataset("u", shape=(4, 6), dtype="<f4",
                                                                          fillvalue=3.0),
                                                         f.create_dataset("x", data=ONES)),
    "chunked, never written (fill value)": lambda f: (f.create_dataset("u", shape=(4, 6), dtype="<f4", chunks=(2, 3),
                                                                       fillvalue=1.5),
                                                      f.create_dataset("x", data=ONES)),
    "chunks partly allocated": _partial,
    "gzip chunks partly allocated": lambda f: _partial(f, compression="gzip"),
    "gzip": lambda f: f.create_dataset("g", data=A, chunks=(2, 3), compression="gzip"),
    "shuffle and fletcher32": lambda f: f.create_dataset("g", data=A, chunks=(2, 3), shuffle=True, fletcher32=True),
    "lzf": lambda f: f.create_dataset("g", data=A, chunks=(2, 3), compression="lzf"),
    "scale-offset, integers, minimum bits (lossless)": lambda f: f.create_dataset(
        "s", data=np.arange(24, dtype="<i4").reshape(4, 6), chunks=(2, 3), scaleoffset=0),
    "big-endian float32, float64 gzip, float16": lambda f: (f.create_dataset("b", data=A.astype(">f4")),
                                                            f.create_dataset("c", data=A.astype(">f8"), chunks=(2, 3),
                                                                             compression="gzip"),
                                                            f.create_dataset("h", data=A.astype(">f2"))),
    "float16": lambda f: f.create_dataset("h", data=A.astype("<f2")),
    "integers of every width and order": lambda f: [f.create_dataset(d, data=np.arange(5, dtype=d))
                                                    for d in ["<u1", "<i2", ">u4", ">i8", "<u8"]],
    "bool": lambda f: f.create_dataset("b", data=np.array([True, False, True])),
    "bool holding the bytes 2 and 255": lambda f: f.create_dataset("b", data=np.array([True, False, True])).id.write(
        h5py.h5s.ALL, h5py.h5s.ALL, np.array([0, 2, 255], dtype="u1"), mtype=h5py.h5t.STD_U8LE),
    "a group reached by two hard links": lambda f: (f.create_dataset("g/a", data=A), f.__setitem__("g2", f["g"]),
                                                    f.create_dataset("g/sub/b", data=ONES)),
    "scalar, null and 0-element": lambda f: (f.create_dataset("s", data=np.float32(2.5)),
                                             f.create_dataset("n", data=h5py.Empty("f4")),
                                             f.create_dataset("z", shape=(0, 3), dtype="f4")),
    "enum, compound, opaque, vlen, strings, array, complex, bitfield (skipped)": lambda f: (
        f.create_dataset("e", data=np.array([0, 1], dtype="i1"), dtype=h5py.enum_dtype({"A": 0, "B": 1}, "i1")),
        f.create_dataset("c", data=np.zeros(3, dtype=[("x", "<f4"), ("y", "<i4")])),
        f.create_dataset("o", data=np.zeros(3, dtype="V4")),
        f.create_dataset("v", shape=(2,), dtype=h5py.vlen_dtype("f4")),
        f.create_dataset("t", data=["a", "bc"]),
        f.create_dataset("r", data=np.zeros(3, dtype=("<f4", (2,)))),
        f.create_dataset("j", data=np.ones(3, dtype="c8")),
        h5py.h5d.create(f.id, b"bits", h5py.h5t.STD_B32LE, h5py.h5s.create_simple((6,))),
        f.create_dataset("x", data=ONES)),
    "hard, soft, external and dangling links": _links,
    "attributes holding arrays": lambda f: (f.create_dataset("a", data=A).attrs.__setitem__("arr", np.arange(100.0)),
                                            f.attrs.__setitem__("top", np.ones((3, 3)))),
    "resizable (B-tree chunk index)": lambda f: f.create_dataset("r", data=A, maxshape=(None, 6), chunks=(2, 6)),
    "edge chunks, plain and gzip": lambda f: (
        f.create_dataset("a", data=np.arange(35, dtype="<f4").reshape(5, 7), chunks=(2, 3)),
        f.create_dataset("b", data=np.arange(35, dtype="<f4").reshape(5, 7), chunks=(2, 3), compression="gzip")),
    "torch_dtype bfloat16 on uint16 and on float32": lambda f: (
        f.create_dataset("b", data=np.arange(6, dtype="<u2")).attrs.__setitem__("torch_dtype", "bfloat16"),
        f.create_dataset("c", data=A).attrs.__setitem__("torch_dtype", "bfloat16")),
    "groups 40 deep": lambda f: f.create_dataset("/".join(f"g{i}" for i in range(40)) + "/a", data=A),
}


#: The datasets fastflip skips, by case of AGREE (every other case: none).
AGREE_SKIPPED = {"scalar, null and 0-element": ["/n", "/z"],
                 "enum, compound, opaque, vlen, strings, array, complex, bitfield (skipped)": [
                     "/c", "/e", "/j", "/o", "/t", "/v"],
                 "hard, soft, external and dangling links": ["/dangling", "/ext"]}


@pytest.mark.parametrize("case", list(AGREE))
def test_files_h5py_writes_agree(case, tmp_path):
    path = str(tmp_path / "case.h5")
    with h5py.File(path, "w") as f:
        AGREE[case](f)
    assert verdict(path, h5_links_view, str(tmp_path / "w"), expect="agrees", skipped=AGREE_SKIPPED.get(case, []))


@pytest.mark.parametrize("libver_case", ["fixed array", "extensible array", "version-2 B-tree", "userblock"])
def test_latest_format_indexes_and_userblock(libver_case, tmp_path):
    path = str(tmp_path / "case.h5")
    kw = {"userblock_size": 512} if libver_case == "userblock" else {"libver": "latest"}
    maxshape = {"fixed array": (4, 6), "extensible array": (None, 6), "version-2 B-tree": (None, None)}
    with h5py.File(path, "w", **kw) as f:
        if libver_case == "userblock":
            f.create_dataset("a", data=A)
        else:
            f.create_dataset("r", data=A, maxshape=maxshape[libver_case], chunks=(2, 3), compression="gzip")
    assert verdict(path, h5_links_view, str(tmp_path / "w"), expect="agrees")


@pytest.mark.parametrize("build", [_external, _virtual], ids=["external storage", "virtual dataset"])
def test_storage_fastflip_never_writes_refused(build, tmp_path):
    """Listed by inspect, refused where a site lands (the bytes are outside this file)."""
    path = str(tmp_path / "case.h5")
    with h5py.File(path, "w") as f:
        build(f, tmp_path)
    assert verdict(path, h5_links_view, str(tmp_path / "w"), count=40, expect="refused")


@pytest.mark.parametrize("driver", ["split", "family"])
def test_multi_file_drivers_refused(driver, tmp_path):
    """The file holding the signature is not where the data lie (split: a -r.h5 file; family: later members)."""
    stem = str(tmp_path / "m")
    if driver == "split":
        with h5py.File(stem, "w", driver="split") as f:
            f.create_dataset("a", data=A)
        path = stem + "-m.h5"
    else:
        with h5py.File(stem + "%d.h5", "w", driver="family", memb_size=1024) as f:
            f.create_dataset("a", data=np.arange(1024, dtype="<f4"))
        path = stem + "0.h5"
    assert verdict(path, h5_links_view, str(tmp_path / "w"), expect="refused")


# --------------------------------------------------------------------------------------------
# datasets whose stored words are not what h5py reads, or whose written flips h5py would not read back


LOSSY = {
    "int32 of 12 significant bits at bit 4": lambda f: _low_level(
        f, "d", _precise(h5py.h5t.STD_I32LE, 12, 4), np.arange(6, dtype="<i4")),
    "the same, chunked": lambda f: _low_level(f, "d", _precise(h5py.h5t.STD_I32LE, 12, 4), np.arange(6, dtype="<i4"),
                                              chunks=(3,)),
    "the same through the n-bit filter": lambda f: _low_level(
        f, "d", _precise(h5py.h5t.STD_I32LE, 12, 4), np.arange(6, dtype="<i4"), chunks=(3,), nbit=True),
    "uint8 of 7 significant bits": lambda f: _low_level(f, "d", _precise(h5py.h5t.STD_U8LE, 7, 0),
                                                        np.arange(6, dtype="u1")),
    "scale-offset, floats, 2 decimal digits": lambda f: f.create_dataset("d", data=A / 7, chunks=(2, 3),
                                                                         scaleoffset=2),
    "scale-offset, integers, 4 bits": lambda f: f.create_dataset("d", data=np.arange(24, dtype="<i4").reshape(4, 6),
                                                                 chunks=(2, 3), scaleoffset=4),
}


@pytest.mark.parametrize("case", list(LOSSY))
def test_datasets_h5py_reads_otherwise_skipped(case, tmp_path):
    path = str(tmp_path / "case.h5")
    with h5py.File(path, "w") as f:
        LOSSY[case](f)
        f.create_dataset("x", data=ONES)
    assert verdict(path, h5_links_view, str(tmp_path / "w"), expect="agrees", skipped=["/d"])
