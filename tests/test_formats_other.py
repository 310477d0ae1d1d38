"""safetensors and NumPy .npy/.npz: layouts by content, exact injection read back by each format's own library."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from conftest import require
from fastflip.cli import main
from fastflip.files.formats import FormatError, detect_format
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout
from format_contract import check_format

_WORD = {"bfloat16": "u2", "float8_e4m3fn": "u1", "float8_e5m2": "u1"}


def st_load(path):
    torch = require("torch")
    st = require("safetensors.torch")
    out = {}
    for k, v in st.load_file(path).items():
        name = str(v.dtype).replace("torch.", "")
        out["/" + k] = v.view(getattr(torch, "uint16" if _WORD.get(name) == "u2" else "uint8")).numpy() \
            if name in _WORD else v.numpy()
    return out


@pytest.mark.framework
def test_safetensors_all_dtypes(tmp_path):
    torch = require("torch")
    st = require("safetensors.torch")
    torch.manual_seed(1)
    sd = {"layer1.weight": torch.randn(6, 5), "layer1.bias": torch.randn(6), "bn.running_mean": torch.randn(6),
          "h": torch.randn(4, 4).half(), "bf": torch.randn(3, 7).to(torch.bfloat16),
          "e4": torch.randn(9).to(torch.float8_e4m3fn), "e5": torch.randn(9).to(torch.float8_e5m2),
          "d": torch.randn(3, dtype=torch.float64), "i64": torch.arange(4), "i8": torch.arange(5, dtype=torch.int8),
          "u8": torch.arange(5, dtype=torch.uint8), "i16": torch.arange(5, dtype=torch.int16), "scalar": torch.tensor(1.5)}
    p = str(tmp_path / "model")  # no extension
    st.save_file(sd, p, metadata={"format": "pt"})
    assert detect_format(p) == "safetensors"
    lay = read_layout(p)
    by = {t.path: t for t in lay.tensors}
    assert len(by) == len(sd)
    assert (by["/layer1.weight"].layer, by["/layer1.weight"].role) == ("layer1", "weight")
    assert by["/bn.running_mean"].role == "bn-statistic"
    assert by["/bf"].dtype == np.dtype("<u2") and by["/e4"].dtype == np.dtype("u1")
    check_format(p, st_load, str(tmp_path), fmt="safetensors", count=40)


def _st_file(path, header, data):
    h = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + data)


def test_safetensors_bad_headers(tmp_path, capsys):
    ok = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    good = str(tmp_path / "good.st")
    _st_file(good, ok, bytes(16))
    assert len(read_layout(good).tensors) == 2
    cases = {
        "overlap": ({**ok, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(16), "overlapping"),
        "outside": ({**ok, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, bytes(12), "outside the file"),
        "size": ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), "do not hold"),
    }
    for name, (header, data, msg) in cases.items():
        p = str(tmp_path / f"{name}.st")
        _st_file(p, header, data)
        with pytest.raises(FormatError, match=msg):
            read_layout(p)
        out = tmp_path / f"{name}.out"
        assert main(["inject", p, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1 and not out.exists()
    # a header length pointing past the end
    p = str(tmp_path / "len.st")
    with open(p, "wb") as fh:
        fh.write(struct.pack("<Q", 10) + b"{}")
    with pytest.raises(FormatError):
        read_layout(p)


def np_load(path):
    fmt = detect_format(path)
    if fmt == "npy":
        return {"/array": np.load(path)}
    with np.load(path) as z:
        return {"/" + k: z[k] for k in z.files}


@pytest.mark.parametrize("order", ["<", ">"])
def test_npy(tmp_path, order):
    p = str(tmp_path / "w.npy")
    np.save(p, np.random.default_rng(0).standard_normal((7, 5)).astype(order + "f4"))
    check_format(p, np_load, str(tmp_path), fmt="npy")


def test_npz_uncompressed_and_compressed(tmp_path):
    rng = np.random.default_rng(2)
    arrays = {"conv1.weight": rng.standard_normal((4, 3)).astype("<f4"), "fc.bias": rng.standard_normal(5).astype(">f8"),
              "steps": np.arange(6, dtype="<i8"), "h": rng.standard_normal(9).astype("<f2")}
    p = str(tmp_path / "w.npz")
    np.savez(p, **arrays)
    lay = read_layout(p)
    assert lay.format == "npz" and {t.path for t in lay.tensors} == {"/" + k for k in arrays}
    assert {t.path: t.role for t in lay.tensors}["/conv1.weight"] == "weight"
    check_format(p, np_load, str(tmp_path), fmt="npz")
    q = str(tmp_path / "c.npz")
    np.savez_compressed(q, **arrays)
    lay = read_layout(q)  # compressed members: listed, rewritten member by member (tests/test_formats_npz.py)
    assert {t.path for t in lay.tensors} == {"/" + k for k in arrays} and not lay.skipped
    assert {t.storage for t in lay.tensors} == {"filtered"}
    # object arrays are never unpickled
    r = str(tmp_path / "o.npy")
    np.save(r, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert read_layout(r).skipped[0].reason.startswith("object array")


def test_unknown_format_one_line(tmp_path, capsys):
    p = tmp_path / "x.pt"
    p.write_bytes(b"\x00\x01 garbage " * 20)
    with pytest.raises(FormatError, match="supported formats: HDF5.*torch.save.*safetensors.*NumPy"):
        read_layout(str(p))
    assert main(["inspect", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "safetensors" in err


def test_truncated_npy(tmp_path):
    p = str(tmp_path / "w.npy")
    np.save(p, np.ones(100, "f8"))
    data = open(p, "rb").read()
    open(p, "wb").write(data[:-8])
    with pytest.raises(FormatError, match="past the end"):
        inject_file(p, str(tmp_path / "o.npy"), seed=1)
    assert not os.path.exists(tmp_path / "o.npy")


def test_diff_and_log_on_raw_formats(tmp_path, capsys):
    from fastflip.files.diff import diff_files

    p = str(tmp_path / "w.npz")
    np.savez(p, a=np.ones((10, 10), "<f4"), b=np.arange(7, dtype=">i4"))
    out = str(tmp_path / "o.npz")
    res = inject_file(p, out, seed=3, count=6, bits="sign")
    r = diff_files(p, out)
    assert sum(t.n_diff for t in r.tensors) == res.counts["changed"] == 6
    assert main(["diff", p, out]) == 1
    assert main(["log", res.log_path]) == 0
    assert "/a" in capsys.readouterr().out
