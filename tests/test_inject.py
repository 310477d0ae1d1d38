"""File injection: exactness against the NumPy oracle, both storage paths, logs, replay, revert, safety."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from fastflip.core import reference
from fastflip.errors import (BitRangeError, CapacityError, InputFileError, LogMismatchError, NaNPolicyError,
                             NotHDF5Error, OptionError, OutputError, SelectionError, UnsupportedStorageError)
from fastflip.files.filebytes import hash_file, sha256_file
from fastflip.files.inject import inject_file
from fastflip.files.replay import replay
from fastflip.files.revert import revert
from fastflip.files.log import InjectionLog
from fastflip.files.select import Selection
from conftest import log_hash
from h5fixtures import ALL_DTYPES, dtype_zoo, storage_zoo

MODELS = ["flip", "random-bits:2", "adjacent:2", "mask:0b11@random", "stuck-at-0", "stuck-at-1", "random-value", "zero"]
STORAGES = {"contiguous": {}, "chunked": {"chunks": (2, 2)}, "gzip": {"chunks": (2, 2), "compression": "gzip"},
            "shuffle-lzf": {"chunks": (3, 2), "compression": "lzf", "shuffle": True}}


def read_all(path: str) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out["/" + name] = obj[()]
        f.visititems(visit)
    return out


def listdir_clean(d: str) -> list[str]:
    return sorted(x for x in os.listdir(d) if ".fastflip-" in x)


@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("model", MODELS)
def test_every_dtype_matches_reference(tmp_path, storage, model):
    src, out = str(tmp_path / "in.h5"), str(tmp_path / "out.h5")
    arrays = dtype_zoo(src, shape=(4, 5), **STORAGES[storage])
    before = sha256_file(src)
    multi = model.split(":")[0] in ("random-bits", "adjacent", "mask")
    # bool has one meaningful bit (bit 0) unless more are named: multi-bit models name all 8
    res = inject_file(src, out, seed=11, count=60, model=model, bits="0-7" if multi else None)
    assert sha256_file(src) == before  # input untouched
    expect = {k: v.copy() for k, v in arrays.items()}
    old, new = reference.apply_plan(expect, res.log.plan)
    assert np.array_equal(old, res.log.old_words) and np.array_equal(new, res.log.new_words)
    got = read_all(out)
    for name, arr in expect.items():
        assert got[name].dtype == arr.dtype, name  # byte order kept
        assert got[name].tobytes() == arr.tobytes(), name
    assert {t.dtype for t in res.log.plan.tensors} == {np.dtype(d).str for d in ALL_DTYPES}
    if not multi:  # every dtype had every bit position available
        hit = {t.dtype: 0 for t in res.log.plan.tensors}
        for tid, b in zip(res.log.plan.tensor, res.log.plan.bits):
            hit[res.log.plan.tensors[tid].dtype] |= int(b)
        assert hit[np.dtype(">f8").str] >> 8 != 0 or model == "zero"


def test_scale_matches_reference(tmp_path):
    src, out = str(tmp_path / "in.h5"), str(tmp_path / "out.h5")
    arrays = dtype_zoo(src, shape=(4, 5), chunks=(2, 2), compression="gzip")
    res = inject_file(src, out, seed=2, count=40, model="scale:-3.5", selection=Selection(dtypes=["float", "int"]))
    expect = {k: v.copy() for k, v in arrays.items()}
    reference.apply_plan(expect, res.log.plan)
    got = read_all(out)
    assert all(got[k].tobytes() == v.tobytes() for k, v in expect.items())


def test_raw_and_hdf5_paths_give_identical_results(tmp_path):
    a, b = str(tmp_path / "contig.h5"), str(tmp_path / "gzip.h5")
    dtype_zoo(a, shape=(6, 6))
    dtype_zoo(b, shape=(6, 6), chunks=(4, 4), compression="gzip", shuffle=True)
    ra = inject_file(a, a + ".out", seed=9, count=300, model="random-bits:3", bits="0-7")
    rb = inject_file(b, b + ".out", plan=ra.log.plan)  # same plan through the HDF5 path
    assert np.array_equal(ra.log.new_words, rb.log.new_words)
    ga, gb = read_all(a + ".out"), read_all(b + ".out")
    assert all(ga[k].tobytes() == gb[k].tobytes() for k in ga)
    assert rb.log.undo is not None and ra.log.undo is None


def test_log_roundtrip_replay_and_revert_bit_exact(tmp_path):
    src = str(tmp_path / "zoo.h5")
    zoo = storage_zoo(src)
    sel = Selection(exclude=["/external"])
    res = inject_file(src, str(tmp_path / "o.h5"), seed=3, count=200, selection=sel)
    man = res.log.manifest
    assert man["format"] == "fastflip-log/1" and man["seed"] == 3 and man["counts"]["flips"] == 200
    assert log_hash(man["input"]) == hash_file(src) and log_hash(man["output"]) == hash_file(res.output)
    loaded = InjectionLog.load(res.log_path)
    assert np.array_equal(loaded.new_words, res.log.new_words) and loaded.manifest == man
    # replay reproduces the output bit for bit
    rp = replay(res.log_path, src, str(tmp_path / "again.h5"))
    assert hash_file(rp.output) == log_hash(man["output"])
    # revert restores the original (filtered chunks included, via the byte-level undo)
    rv = revert(res.log_path, res.output)
    assert rv.digest == log_hash(man["input"]) == hash_file(res.output)
    assert zoo["arrays"]


def test_revert_refuses_wrong_file(tmp_path):
    src = str(tmp_path / "a.h5")
    dtype_zoo(src)
    res = inject_file(src, str(tmp_path / "b.h5"), seed=1, count=5)
    before = sha256_file(src)
    with pytest.raises(LogMismatchError, match="not the output"):
        revert(res.log_path, src)
    assert sha256_file(src) == before
    with pytest.raises(LogMismatchError, match="not the input"):
        replay(res.log_path, res.output, str(tmp_path / "c.h5"))
    assert not os.path.exists(tmp_path / "c.h5")
    assert listdir_clean(str(tmp_path)) == []  # refusals leave no temporary file behind


def test_same_seed_same_output_and_in_place(tmp_path):
    src = str(tmp_path / "a.h5")
    dtype_zoo(src)
    r1 = inject_file(src, str(tmp_path / "1.h5"), seed=42, count=30, log_path=False)
    r2 = inject_file(src, str(tmp_path / "2.h5"), seed=42, count=30, log_path=False)
    assert sha256_file(r1.output) == sha256_file(r2.output) and r1.log_path is None
    r3 = inject_file(src, in_place=True, seed=42, count=30)
    assert sha256_file(src) == sha256_file(r1.output)
    assert r3.log_path == src + ".fflog"
    r4 = inject_file(src, in_place=True, seed=7, count=5)  # a second in-place injection keeps the first log
    assert r4.log_path == src + ".2.fflog" and os.path.exists(src + ".fflog")
    revert(r4.log_path, src)
    revert(r3.log_path, src)
    assert hash_file(src) == log_hash(r3.log.manifest["input"])


def test_non_atomic_in_place_and_exact_revert(tmp_path):
    src = str(tmp_path / "a.h5")
    dtype_zoo(src, shape=(20, 20))
    before = sha256_file(src)
    res = inject_file(src, in_place=True, atomic=False, seed=1, count=50, log_path=False, hash_files=False)
    assert sha256_file(src) != before
    with pytest.raises(LogMismatchError, match="no-verify"):  # no hashes: no claim of a verification
        revert(res.log, src, atomic=False)
    rv = revert(res.log, src, atomic=False, verify=False)
    assert sha256_file(src) == before and rv.verified is False


def test_nan_policy(tmp_path):
    src = str(tmp_path / "a.h5")
    with h5py.File(src, "w") as f:
        f["ones"] = np.full(100, 1.0, "<f4")  # exponent-msb flip -> Inf (1.5 would give NaN)
        f["small"] = np.full(100, 0.25, "<f4")
    allow = inject_file(src, str(tmp_path / "b.h5"), seed=1, count=60, bits="exponent-msb")
    assert allow.inf_count == int(np.sum(allow.log.plan.tensor == 0)) > 0
    avoid = inject_file(src, str(tmp_path / "c.h5"), seed=1, count=60, bits="exponent-msb", nan_policy="avoid")
    assert avoid.inf_count == 0 and avoid.nan_count == 0
    with pytest.raises(NaNPolicyError):
        inject_file(src, str(tmp_path / "d.h5"), seed=1, count=150, bits="exponent-msb", nan_policy="avoid")
    assert not os.path.exists(tmp_path / "d.h5")


def test_sign_first_numbering(tmp_path):
    src = str(tmp_path / "a.h5")
    with h5py.File(src, "w") as f:
        f["w"] = np.full(10, 2.0, "<f4")
    res = inject_file(src, str(tmp_path / "b.h5"), seed=1, count=10, bits="0", sign_first=True)
    with h5py.File(res.output) as f:
        assert (f["w"][()] == -2.0).all()


@pytest.mark.parametrize("case", ["missing", "not_hdf5", "truncated", "no_dir", "nothing_selected", "too_many",
                                  "bad_bit", "external", "only_empty", "output_is_input"])
def test_bad_input_is_refused_cleanly(tmp_path, case):
    src = str(tmp_path / "in.h5")
    zoo = storage_zoo(src)
    assert zoo
    out = str(tmp_path / "out.h5")
    before = sha256_file(src)
    kw: dict = {"seed": 1, "count": 3, "selection": Selection(exclude=["/external"])}
    errors = {"missing": InputFileError, "not_hdf5": NotHDF5Error, "truncated": NotHDF5Error, "no_dir": OutputError,
              "nothing_selected": SelectionError, "too_many": CapacityError, "bad_bit": BitRangeError,
              "external": UnsupportedStorageError, "only_empty": SelectionError, "output_is_input": OptionError}
    path = src
    if case == "missing":
        path = str(tmp_path / "nope.h5")
    elif case == "not_hdf5":
        path = str(tmp_path / "x.h5")
        open(path, "wb").write(b"hello" * 100)
    elif case == "truncated":
        path = str(tmp_path / "t.h5")
        data = open(src, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    elif case == "no_dir":
        out = str(tmp_path / "nodir" / "out.h5")
    elif case == "nothing_selected":
        kw["selection"] = Selection(include=["/no/such/*"])
    elif case == "too_many":
        kw["selection"] = Selection(include=["/compact"])
        kw["count"] = 3 * 32 + 1
    elif case == "bad_bit":
        kw["bits"] = "40"
    elif case == "external":
        kw["selection"] = None
    elif case == "only_empty":
        kw["selection"] = Selection(include=["/empty"])
    elif case == "output_is_input":
        out = src
    with pytest.raises(errors[case]) as info:
        inject_file(path, out, **kw)
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 400
    if case == "nothing_selected":
        assert "available" in msg
    assert sha256_file(src) == before
    if case != "output_is_input":
        assert not os.path.exists(out)
    assert listdir_clean(str(tmp_path)) == []


@pytest.mark.parametrize("block", [5, 13, 4096])
def test_streaming_copy_apply_matches_mapped_path_across_block_edges(tmp_path, block):
    """Words that straddle copy blocks (odd block sizes, unaligned offsets) are patched exactly."""
    from fastflip.files.copyapply import copy_apply
    from fastflip.files.h5apply import apply_plan_to_file, route_sites
    from fastflip.files.layout import read_layout

    src = str(tmp_path / "a.h5")
    dtype_zoo(src, shape=(6, 7))
    res = inject_file(src, str(tmp_path / "ref.h5"), seed=5, count=200, log_path=False)
    lay = read_layout(src)
    by = {t.path: t for t in lay.tensors}
    routes = route_sites(src, res.log.plan, by)
    h_in, h_out, old, new = copy_apply(src, str(tmp_path / "b.h5"), res.log.plan, routes, block=block)
    assert h_in == sha256_file(src) and h_out == sha256_file(str(tmp_path / "b.h5"))
    assert np.array_equal(old, res.log.old_words) and np.array_equal(new, res.log.new_words)
    mapped = str(tmp_path / "c.h5")
    open(mapped, "wb").write(open(src, "rb").read())
    apply_plan_to_file(mapped, res.log.plan, by)
    assert sha256_file(mapped) == h_out == sha256_file(str(tmp_path / "ref.h5"))
