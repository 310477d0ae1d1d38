"""Hostile checkpoints: each reader agrees with the framework or refuses in one line.

The files are built here byte by byte (tests/hostile_files.py: raw zips, torch pickles, legacy
torch files), so no framework is needed to make them; where a case is about what the framework
reads, the framework's own loader is asked when it is installed.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile

import h5py
import numpy as np
import pytest

from fastflip.cli import main
from fastflip.errors import FastflipError
from fastflip.files.formats import FormatError
from fastflip.files.formats.torchsave import restricted_loads
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout
from hostile_files import Entry, SRef, T, nested_zip, raw_zip, torch_legacy_bytes, torch_pickle, torch_zip_bytes

F32 = np.arange(16, dtype="<f4")


def _write(tmp_path, name: str, data: bytes) -> str:
    p = str(tmp_path / name)
    with open(p, "wb") as fh:
        fh.write(data)
    return p


def _refused(path: str, tmp_path, match: str = "") -> str:
    """inject refuses ``path`` with one FastflipError line, writes nothing and leaves the input as it was."""
    before = open(path, "rb").read()
    out = str(tmp_path / ("out" + os.path.splitext(path)[1]))
    with pytest.raises(FastflipError) as ei:
        inject_file(path, out, seed=1, sampling={"count": 4})
    msg = str(ei.value)
    assert "\n" not in msg and len(msg) < 600, msg
    assert match in msg, msg
    assert not os.path.exists(out) and open(path, "rb").read() == before
    return msg


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _npy_shape(shape_text: str, data: bytes) -> bytes:
    """A .npy stream whose header declares ``shape_text`` verbatim (padded to 64 bytes)."""
    h = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape_text
    h = h + " " * (63 - len(h) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + data


def _safetensors(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


# --------------------------------------------------------------------------------------------
# fastflip's view differs from the framework's: refused


def test_two_data_pkl_entries_refused(tmp_path):
    benign = torch_pickle({"a": T(SRef("0", 16), 0, (16,), (1,))})
    p = _write(tmp_path, "dup.pt", raw_zip([Entry("archive/data.pkl", pickle.dumps("code ran", protocol=2)),
                                            Entry("archive/data.pkl", benign), Entry("archive/byteorder", b"little"),
                                            Entry("archive/data/0", F32.tobytes())]))
    _refused(p, tmp_path, "more than once")


def test_two_storage_entries_refused(tmp_path):
    pkl = torch_pickle({"a": T(SRef("0", 16), 0, (16,), (1,))})
    p = _write(tmp_path, "dup0.pt", torch_zip_bytes(pkl, {"0": F32.tobytes()},
                                                    [Entry("archive/data/0", (F32 + 1).tobytes())]))
    _refused(p, tmp_path, "more than once")


@pytest.mark.parametrize("shape,stride", [((-2, -8), (8, 1)), ((-16,), (1,)), ((4, 4), (-4, 1))])
def test_negative_sizes_refused_torch_zip_and_legacy(tmp_path, shape, stride):
    rec = {"a": T(SRef("0", 16), 0, shape, stride), "b": T(SRef("1", 16), 0, (16,), (1,))}
    p = _write(tmp_path, "neg.pt", torch_zip_bytes(torch_pickle(rec), {"0": F32.tobytes(), "1": F32.tobytes()}))
    _refused(p, tmp_path, "negative")
    q = _write(tmp_path, "negl.pt", torch_legacy_bytes(rec, {"0": (F32.tobytes(), 4), "1": (F32.tobytes(), 4)}))
    _refused(q, tmp_path, "negative")


def test_negative_sizes_refused_safetensors_and_npz(tmp_path):
    st = _safetensors({"a": {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]},
                       "b": {"dtype": "F32", "shape": [12], "data_offsets": [16, 64]}}, F32.tobytes())
    _refused(_write(tmp_path, "neg.safetensors", st), tmp_path, "negative")
    npz = raw_zip([Entry("a.npy", _npy_shape("(-2, -2)", F32[:4].tobytes())), Entry("b.npy", _npy(F32))])
    _refused(_write(tmp_path, "neg.npz", npz), tmp_path, "negative")


def test_legacy_view_metadata_refused(tmp_path):
    """torch's tensor is elements 8..11 of the storage (a view); fastflip must not flip 0..3 instead."""
    rec = {"a": T(SRef("0", 16, view=("v", 8, 4)), 0, (4,), (1,))}
    p = _write(tmp_path, "view.pt", torch_legacy_bytes(rec, {"0": (F32.tobytes(), 4)}))
    _refused(p, tmp_path, "view")


def test_storage_size_other_than_declared_refused(tmp_path):
    """torch sizes a storage by its persistent id; an entry holding more bytes than that is refused."""
    rec = {"a": T(SRef("0", 4), 0, (16,), (1,))}
    p = _write(tmp_path, "short.pt", torch_zip_bytes(torch_pickle(rec), {"0": F32.tobytes()}))
    _refused(p, tmp_path, "declares")


def test_storage_named_with_two_types_refused(tmp_path):
    """torch keeps the first typed storage it meets: a later tensor of another type would be reinterpreted."""
    rec = {"a": T(SRef("0", 16), 0, (16,), (1,)), "b": T(SRef("0", 16, "IntStorage"), 0, (16,), (1,))}
    p = _write(tmp_path, "types.pt", torch_zip_bytes(torch_pickle(rec), {"0": F32.tobytes()}))
    _refused(p, tmp_path, "twice")


def test_overlapping_zip_entries_refused_torch(tmp_path):
    pkl = torch_pickle({"a": T(SRef("0", 16), 0, (16,), (1,)), "b": T(SRef("1", 4), 0, (4,), (1,))})
    z = nested_zip(Entry("archive/data/0", F32.tobytes()), Entry("archive/data/1", F32[:4].tobytes()),
                   [Entry("archive/data.pkl", pkl), Entry("archive/byteorder", b"little")])
    p = _write(tmp_path, "overlap.pt", z)
    with pytest.raises(FastflipError, match="overlap|declares"):
        inject_file(p, str(tmp_path / "o.pt"), seed=1, sampling={"count": 4})


def test_overlapping_zip_entries_refused_npz(tmp_path):
    z = nested_zip(Entry("a.npy", _npy(F32)), Entry("b.npy", _npy(F32[:4])))
    p = _write(tmp_path, "overlap.npz", z)
    assert sorted(np.load(p).files) == ["a", "b"]  # NumPy reads both, from shared bytes
    _refused(p, tmp_path, "overlap")


def test_duplicate_npz_members_refused(tmp_path):
    p = _write(tmp_path, "dup.npz", raw_zip([Entry("a.npy", _npy(F32)), Entry("a.npy", _npy(F32 + 1))]))
    _refused(p, tmp_path, "more than once")


def test_npz_crafted_data_descriptor_refused(tmp_path):
    """Flag bit 3 without a descriptor: the "descriptor" would be the next entry's local header."""
    p = _write(tmp_path, "desc.npz", raw_zip([Entry("a.npy", _npy(F32), flags=0x08), Entry("b.npy", _npy(F32))]))
    np.testing.assert_array_equal(np.load(p)["a"], F32)  # zipfile takes the sizes from the directory
    _refused(p, tmp_path, "overlap")


def test_npz_keys_that_collide_in_np_load_refused(tmp_path):
    p = _write(tmp_path, "keys.npz", raw_zip([Entry("a.npy", _npy(F32)), Entry("a.npy.npy", _npy(F32 + 1))]))
    _refused(p, tmp_path, "np.load")


def test_entry_marked_as_directory_refused(tmp_path):
    """miniz (torch's zip reader) reads no data for an entry with the DOS directory attribute."""
    pkl = torch_pickle({"a": T(SRef("0", 16), 0, (16,), (1,))})
    p = _write(tmp_path, "dir.pt", raw_zip([Entry("archive/data.pkl", pkl), Entry("archive/byteorder", b"little"),
                                            Entry("archive/data/0", F32.tobytes(), attr=0x10)]))
    _refused(p, tmp_path, "directory")


def test_central_record_lengths_that_disagree_with_zipfile_refused(tmp_path):
    """A name length running past the directory: zipfile reads the name cut short, a raw walk reads on."""
    p = str(tmp_path / "len.npz")
    np.savez(p, w=F32, s=np.float64(2.5))
    raw = bytearray(open(p, "rb").read())
    last = raw.rfind(b"PK\x01\x02")
    raw[last + 29] = 4  # name length + 1024
    open(p, "wb").write(bytes(raw))
    assert sorted(np.load(p).files) == ["s", "w"]
    _refused(p, tmp_path, "central directory")


def _shared_bytes_h5(path: str) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=F32)
        f.create_dataset("b", data=F32 + 100)
        oa, ob = f["a"].id.get_offset(), f["b"].id.get_offset()
    raw = bytearray(open(path, "rb").read())
    at = raw.find(struct.pack("<Q", ob))
    assert at > 0 and raw.find(struct.pack("<Q", ob), at + 1) < 0
    raw[at:at + 8] = struct.pack("<Q", oa)
    open(path, "wb").write(bytes(raw))


def test_overlapping_hdf5_datasets_refused_at_inject(tmp_path):
    p = str(tmp_path / "shared.h5")
    _shared_bytes_h5(p)
    with h5py.File(p, "r") as f:  # h5py reads b from a's bytes
        np.testing.assert_array_equal(f["b"][()], F32)
    _refused(p, tmp_path, "share bytes")


# --------------------------------------------------------------------------------------------
# resource exhaustion from tiny files


def test_dag_of_shared_lists_is_walked_once(tmp_path):
    node: list = [T(SRef("0", 16), 0, (16,), (1,))]
    for _ in range(40):  # 2**40 paths, 41 lists
        node = [node, node]
    pkl = torch_pickle({"m": node})
    assert len(pkl) < 2000
    p = _write(tmp_path, "dag.pt", torch_zip_bytes(pkl, {"0": F32.tobytes()}))
    lay = read_layout(p)
    assert [t.path for t in lay.tensors] == ["/m" + "/0" * 41]


def test_memo_index_bomb_refused(tmp_path):
    pkl = b"\x80\x02}r\x00\x00\x00\x08."  # an empty dict stored at memo index 2**27
    p = _write(tmp_path, "memo.pt", torch_zip_bytes(pkl, {}))
    with pytest.raises(FormatError, match="memo entry 134217728"):
        read_layout(p)


def test_huge_shapes_fail_fast_with_one_short_line(tmp_path):
    rec = {"a": T(SRef("0", 16), 0, (2**62,) * 3000, (1,) * 3000)}
    p = _write(tmp_path, "huge.pt", torch_zip_bytes(torch_pickle(rec), {"0": F32.tobytes()}))
    _refused(p, tmp_path, "entries")
    rec = {"a": T(SRef("0", 16), 0, (2**62,) * 8, (1,) * 8)}
    p = _write(tmp_path, "big.pt", torch_zip_bytes(torch_pickle(rec), {"0": F32.tobytes()}))
    _refused(p, tmp_path, "2**60 elements")
    st = _safetensors({"a": {"dtype": "F32", "shape": [2**62] * 3000, "data_offsets": [0, 64]}}, F32.tobytes())
    _refused(_write(tmp_path, "huge.safetensors", st), tmp_path, "entries")


def test_build_on_stand_ins_refused_and_harmless(tmp_path):
    """BUILD on the float32 stand-in must not turn later float32 tensors into <i4."""
    evil = b"\x80\x02ctorch\nfloat32\n}X\x04\x00\x00\x00nameX\x05\x00\x00\x00int32sb."
    with pytest.raises(FormatError, match="state"):
        restricted_loads(evil, "evil.pt")
    rec = {"a": T(SRef("0", 16), 0, (16,), (1,))}
    p = _write(tmp_path, "ok.pt", torch_zip_bytes(torch_pickle(rec), {"0": F32.tobytes()}))
    assert read_layout(p).tensors[0].dtype.str == "<f4"


# --------------------------------------------------------------------------------------------
# one-line errors (exit 2, not 3)


def _cli_one_line(argv: list[str], capsys, match: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and "internal error" not in err, err
    assert match in err, err
    return err


def _patch_filter_param(path: str, name: bytes, old: int, new: int) -> None:
    raw = bytearray(open(path, "rb").read())
    at = raw.find(name + b"\x00")
    assert at > 0
    k = raw.find(struct.pack("<I", old), at)
    assert 0 < k - at < 16
    raw[k:k + 4] = struct.pack("<I", new)
    open(path, "wb").write(bytes(raw))


@pytest.mark.parametrize("filt,old,new,match", [(b"shuffle", 4, 0, "element size of 0"),
                                                  (b"deflate", 9, 100, "level 100")])
def test_crafted_filter_params_one_line(tmp_path, capsys, filt, old, new, match):
    p = str(tmp_path / "f.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("w", data=np.linspace(-1, 1, 64, dtype="<f4"), chunks=(16,), shuffle=True,
                         compression="gzip", compression_opts=9)
    _patch_filter_param(p, filt, old, new)
    _cli_one_line(["inject", p, "-o", str(tmp_path / "o.h5"), "--count", "3", "--seed", "1"], capsys, match)


def test_safetensors_dtype_list_one_line(tmp_path, capsys):
    p = _write(tmp_path, "l.safetensors",
               _safetensors({"a": {"dtype": ["F32"], "shape": [16], "data_offsets": [0, 64]}}, F32.tobytes()))
    _cli_one_line(["inspect", p], capsys, "dtype string")


def test_npy_shape_minus_five_refused(tmp_path, capsys):
    p = _write(tmp_path, "m.npy", _npy_shape("(-5,)", F32[:5].tobytes()))
    _cli_one_line(["inspect", p], capsys, "dimension -5 (negative)")


def test_keras_weights_not_hdf5_named_by_archive(tmp_path, capsys):
    p = str(tmp_path / "m.keras")
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("metadata.json", '{"keras_version": "3.0"}')
        z.writestr("config.json", "{}")
        z.writestr("model.weights.h5", b"not an hdf5 file at all" * 4)
    err = _cli_one_line(["inject", p, "-o", str(tmp_path / "o.keras"), "--count", "1"], capsys, p)
    assert "fastflip-keras" not in err and "model.weights.h5" in err


def test_overlapping_hdf5_chunks_refused_at_inject(tmp_path):
    """A chunk index entry pointing into another dataset's data: h5py reads the chunk from those bytes."""
    p = str(tmp_path / "chunks.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("a", data=F32)
        f.create_dataset("c", data=F32 + 100, chunks=(8,))
        oa = f["a"].id.get_offset()
        second = f["c"].id.get_chunk_info(1).byte_offset
    raw = bytearray(open(p, "rb").read())
    at = raw.find(struct.pack("<Q", second))
    assert at > 0
    raw[at:at + 8] = struct.pack("<Q", oa)
    open(p, "wb").write(bytes(raw))
    with h5py.File(p, "r") as f:
        np.testing.assert_array_equal(f["c"][8:], F32[:8])
    _refused(p, tmp_path, "share bytes")
