"""Bit-level diff of two HDF5 files, its block reader, and the ``fastflip diff`` command."""

from __future__ import annotations

import json
import math
import shutil

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import h5fixtures as hf
from fastflip.cli import main
from fastflip.files.diff import diff_arrays, diff_files, iter_blocks
from fastflip.core.dtypes import from_words, to_words, word_type
from fastflip.errors import SelectionError
from fastflip.files.h5offsets import element_byte_offsets
from fastflip.files.layout import read_layout
from fastflip.files.select import Selection


def flip_raw(path, tensor, flat, bits):
    """Flip bit ``bits[i]`` of element ``flat[i]`` by raw file I/O (independent of fastflip.files.diff)."""
    offs = element_byte_offsets(path, tensor, np.asarray(flat))
    order = "little" if tensor.dtype.byteorder in "<|=" else "big"
    with open(path, "r+b") as fh:
        for off, bit in zip(offs.tolist(), bits):
            fh.seek(off)
            w = int.from_bytes(fh.read(tensor.itemsize), order)
            fh.seek(off)
            fh.write((w ^ (1 << bit)).to_bytes(tensor.itemsize, order))


def oracle(a, b):
    """n_diff and bit histogram with plain Python integers."""
    wa, wb = to_words(a).reshape(-1).tolist(), to_words(b).reshape(-1).tolist()
    hist = {}
    n = 0
    for x, y in zip(wa, wb):
        if x != y:
            n += 1
            d = x ^ y
            for bit in range(64):
                if d >> bit & 1:
                    hist[bit] = hist.get(bit, 0) + 1
    return n, dict(sorted(hist.items(), reverse=True))


def test_identical_copy(tmp_path):
    a = str(tmp_path / "a.h5")
    hf.storage_zoo(a)
    b = str(tmp_path / "b.h5")
    shutil.copyfile(a, b)
    r = diff_files(a, b)
    assert r.identical and not r.differing and not r.only_a and not r.only_b
    assert r.totals["tensors_compared"] == 15 and r.totals["elements_differing"] == 0
    assert main(["diff", a, b]) == 0


@pytest.mark.parametrize("chunked", [False, True])
def test_flips_in_every_dtype_match_oracle(tmp_path, chunked):
    a = str(tmp_path / "a.h5")
    kw = {"chunks": (2, 3)} if chunked else {}
    arrays = hf.dtype_zoo(a, shape=(5, 7), **kw)
    b = str(tmp_path / "b.h5")
    shutil.copyfile(a, b)
    rng = np.random.default_rng(1)
    lay = read_layout(b)
    for t in lay.tensors:
        flat = rng.choice(t.size, size=6, replace=False)
        bits = rng.integers(0, t.itemsize * 8 if t.dtype.kind != "b" else 1, size=6).tolist()
        flip_raw(b, t, flat, bits)
    r = diff_files(a, b, block_bytes=64)  # small blocks: many reads per tensor
    with h5py.File(b) as fb:
        for td in r.tensors:
            n, hist = oracle(arrays[td.path], fb[td.path][()])
            assert td.n_diff == n == 6, td.path
            assert td.bit_counts() == hist
            assert td.dtype == arrays[td.path].dtype.str
    assert not r.identical and r.totals["elements_differing"] == 6 * len(arrays)
    # block size does not change the answer
    r2 = diff_files(a, b)
    assert [t.as_dict() for t in r2.tensors] == [t.as_dict() for t in r.tensors]


def test_nan_payload_negative_zero_and_value_stats(tmp_path):
    a = str(tmp_path / "a.h5")
    b = str(tmp_path / "b.h5")
    base = np.array([0.0, 1.0, np.nan, 2.0, 4.0, 3.0, -8.0], dtype=">f4")
    new = base.copy()
    new[0] = -0.0  # sign bit only
    w = to_words(new)
    w[2] ^= 1  # NaN with another payload
    new = from_words(w, ">f4")
    new[3] = np.nan  # new NaN
    new[4] = np.inf  # new Inf
    new[5] = 3.5  # abs 0.5, rel 1/6
    new[6] = -2.0  # abs 6, rel 0.75
    hf.write_datasets(a, {"x": base})
    hf.write_datasets(b, {"x": new})
    (td,) = diff_files(a, b).tensors
    assert td.n_diff == 6  # every element but [1]
    assert td.new_nan == 1 and td.new_inf == 1
    assert td.max_abs == pytest.approx(6.0) and td.max_rel == pytest.approx(0.75)
    n, hist = oracle(base, new)
    assert td.bit_counts() == hist and hist[31] >= 1 and hist[0] >= 1
    # -0.0 vs 0.0 alone: differs in exactly bit 31, value change 0
    d = diff_arrays(np.zeros(3, "<f4"), -np.zeros(3, "<f4"))
    assert d.n_diff == 3 and d.bit_counts() == {31: 3} and d.max_abs == 0.0


def test_integers_and_bool(tmp_path):
    d = diff_arrays(np.array([0, 5, -128], "i1"), np.array([1, 5, 127], "i1"))
    assert d.n_diff == 2 and d.bit_counts() == {7: 1, 6: 1, 5: 1, 4: 1, 3: 1, 2: 1, 1: 1, 0: 2}
    assert d.max_abs == 255.0 and math.isnan(d.max_rel) is False and d.new_nan == 0
    b = diff_arrays(np.array([True, False]), np.array([False, False]))
    assert b.n_diff == 1 and b.bit_counts() == {0: 1}
    u = diff_arrays(np.array([2**64 - 1], "<u8"), np.array([2**64 - 1], ">u8"))
    assert u.identical  # byte order is not a difference in value or bits


def test_only_in_one_and_mismatch(tmp_path):
    a = str(tmp_path / "a.h5")
    b = str(tmp_path / "b.h5")
    hf.write_datasets(a, {"same": np.ones(3, "f4"), "gone": np.ones(2, "f4"), "shape": np.ones(4, "f4"),
                          "dt": np.ones(2, "f4")})
    hf.write_datasets(b, {"same": np.ones(3, "f4"), "new": np.ones(2, "f4"), "shape": np.ones((2, 2), "f4"),
                          "dt": np.ones(2, "f8")})
    r = diff_files(a, b)
    assert r.only_a == ["/gone"] and r.only_b == ["/new"]
    notes = {t.path: t.note for t in r.tensors}
    assert "shape differs" in notes["/shape"] and "dtype differs" in notes["/dt"] and notes["/same"] == ""
    assert not r.identical
    rs = diff_files(a, b, Selection(include=("same",)))
    assert rs.identical and [t.path for t in rs.tensors] == ["/same"]
    with pytest.raises(SelectionError):
        diff_files(a, b, Selection(include=("zzz",)))


def test_aliases_match_across_files(tmp_path):
    a = str(tmp_path / "a.h5")
    b = str(tmp_path / "b.h5")
    with h5py.File(a, "w") as f:
        f["w"] = np.arange(4, dtype="f4")
    with h5py.File(b, "w") as f:
        f["w"] = np.arange(4, dtype="f4")
        f["a_alias"] = f["w"]  # canonical path in b becomes /a_alias
    r = diff_files(a, b)
    assert r.identical and len(r.tensors) == 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=0, max_size=4), st.sampled_from([1, 2, 4, 8]), st.integers(1, 200))
def test_iter_blocks_covers_each_element_once(shape, itemsize, block):
    shape = tuple(shape)
    seen = np.zeros(shape, dtype=np.int64)
    for sl in iter_blocks(shape, itemsize, block):
        part = seen[sl]
        assert part.size * itemsize <= max(block, itemsize) or part.size == 1
        seen[sl] += 1
    assert (seen == 1).all()


def test_cli_diff(tmp_path, capsys):
    a = str(tmp_path / "a.h5")
    arrays = hf.dtype_zoo(a)
    b = str(tmp_path / "b.h5")
    shutil.copyfile(a, b)
    t = read_layout(b).tensor("/f4_be")
    flip_raw(b, t, [3], [30])
    assert main(["diff", a, b]) == 1
    out = capsys.readouterr().out
    assert "/f4_be" in out and "30:1" in out and "/f8_le" not in out
    assert "differ: 1 of 21 tensors, 1 of 315 elements" in out
    assert main(["diff", a, b, "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["identical"] is False and d["totals"]["bit_hist"] == {"30": 1}
    (td,) = [x for x in d["tensors"] if x["n_diff"]]
    assert td["path"] == "/f4_be" and td["bit_hist"] == {"30": 1}
    assert main(["diff", a, b, "--exclude", "f4_*"]) == 0
    assert "identical" in capsys.readouterr().out
    assert main(["diff", a, b, "--include", "f4*", "--all"]) == 1
    out = capsys.readouterr().out
    assert "/f4_le" in out and "/f4_be" in out and "/i1" not in out
    assert len(arrays) == 21  # 9 multi-byte dtypes x 2 byte orders + i1, u1, bool


def test_cli_diff_errors(tmp_path, capsys):
    a = str(tmp_path / "a.h5")
    hf.dtype_zoo(a)
    assert main(["diff", a, str(tmp_path / "missing.h5")]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and len(err.strip().splitlines()) == 1
    bad = hf.not_hdf5(tmp_path / "bad.h5")
    assert main(["diff", bad, a]) == 2
    assert "not an HDF5 file" in capsys.readouterr().err
    assert main(["diff", a, a, "--role", "weightz"]) == 2
    assert "unknown role" in capsys.readouterr().err
    assert main(["diff", a, a, "--include", "zz*"]) == 2
    assert "matched no tensor" in capsys.readouterr().err


def test_word_type_consistency():
    # the histogram length is the word width of each dtype
    for dt in hf.ALL_DTYPES:
        d = diff_arrays(hf.sample_values(dt, (4,), 1), hf.sample_values(dt, (4,), 2))
        assert len(d.bit_hist) == word_type(dt).bits


def test_memory_stays_bounded(tmp_path):
    import tracemalloc

    n = 4 * 2**20  # 16 MiB of float32 per file
    a = str(tmp_path / "a.h5")
    b = str(tmp_path / "b.h5")
    vals = np.arange(n, dtype="<f4")
    hf.write_datasets(a, {"big": vals})
    vals[::1000] = -vals[::1000]
    hf.write_datasets(b, {"big": vals})
    del vals
    tracemalloc.start()
    try:
        r = diff_files(a, b, block_bytes=2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (td,) = r.tensors
    # every 1000th element negated (element 0: 0.0 → -0.0 is a sign-bit difference too)
    assert td.n_diff == len(range(0, n, 1000)) and td.bit_counts() == {31: td.n_diff}
    assert peak < 8 * 2**20, f"peak traced memory {peak / 2**20:.1f} MiB for 1 MiB blocks of a 16 MiB tensor"
