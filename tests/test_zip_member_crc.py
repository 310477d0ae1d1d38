"""Zip members whose bytes do not match their recorded CRC-32: fastflip flips only members the framework reads.

``np.load`` (through ``zipfile``) refuses such an ``.npz`` member, and so does Keras a ``.keras`` archive's: fastflip
refuses them in one line, writing nothing, on every write path (copy, atomic in place, direct in place, region
evidence), and ``inspect`` refuses such an ``.npz`` too. ``torch.load`` reads a ``torch.save`` archive without
checking its entries' CRC-32, and so does fastflip. A zip that is none of the archives fastflip reads is refused
naming the kind it is taken for and why.
"""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest

from conftest import assert_refused, require, snapshot
from fastflip.cli import main
from fastflip.errors import FormatError
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout

A = np.arange(64, dtype="<f4")
B = np.arange(8, dtype="<f8")


def bad_crc(data: bytes, info: zipfile.ZipInfo) -> bytes:
    """``data`` (a zip archive) with ``info``'s recorded CRC-32 changed in its local header and the directory."""
    crc, wrong = struct.pack("<I", info.CRC), struct.pack("<I", info.CRC ^ 0x10)
    assert data.count(crc) == 2  # the local header and the directory record (no other copy of these 4 bytes)
    return data.replace(crc, wrong)


def damaged_npz(tmp_path, member: str = "a.npy", compressed: bool = False) -> str:  # type: ignore[no-untyped-def]
    """An ``.npz`` of ``a`` and ``b`` whose ``member``'s recorded CRC-32 does not match its bytes."""
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, a=A, b=B)
    with zipfile.ZipFile(buf) as z:
        info = z.getinfo(member)
    p = tmp_path / "d" / "bad.npz"
    p.parent.mkdir()
    p.write_bytes(bad_crc(buf.getvalue(), info))
    with np.load(p) as z, pytest.raises(zipfile.BadZipFile, match="CRC"):
        z[member[:-4]]  # np.load refuses the member
    return str(p)


MODES = {
    "copy": ["-o", "{d}/out.npz"],
    "in place": ["--in-place"],
    "in place, direct": ["--in-place", "--direct"],
    "copy, region evidence": ["-o", "{d}/out.npz", "--evidence", "regions"],
    "in place, direct, region evidence": ["--in-place", "--direct", "--evidence", "regions"],
}


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
@pytest.mark.parametrize("mode", list(MODES))
def test_member_failing_its_crc_refused_nothing_written(tmp_path, capsys, mode, compressed):
    src = damaged_npz(tmp_path, compressed=compressed)
    d = str(tmp_path / "d")
    before = snapshot(d)
    args = [a.format(d=d) for a in MODES[mode]]
    rc = main(["inject", src, *args, "--include", "/a", "--count", "5", "--seed", "3"])
    err = assert_refused(capsys, rc, d, before)
    assert "a.npy" in err and "CRC-32" in err and "np.load refuses" in err and "re-save" in err, err


def test_api_refuses_before_writing(tmp_path):
    src = damaged_npz(tmp_path)
    before = snapshot(str(tmp_path / "d"))
    with pytest.raises(FormatError, match="a.npy does not match its recorded CRC-32"):
        inject_file(src, in_place=True, atomic=False, selection={"include": ["/a"]}, count=3, seed=1,
                    log_path=False)
    assert snapshot(str(tmp_path / "d")) == before


def test_untouched_damaged_member_left_as_it_was(tmp_path):
    """Only the members that hold a flip are checked: a damaged member elsewhere is copied as it was (np.load
    refuses it in the output as in the input) and the flipped member reads as logged."""
    src = damaged_npz(tmp_path)
    out = str(tmp_path / "out.npz")
    res = inject_file(src, out, selection={"include": ["/b"]}, count=3, seed=2)
    with np.load(out) as z:
        got = z["b"]
        with pytest.raises(zipfile.BadZipFile, match="CRC"):
            z["a"]
    want = B.copy().view("<u8")
    want[res.log.plan.index] = res.log.new_words.astype("<u8")
    assert np.array_equal(got.view("<u8"), want) and not np.array_equal(got, B)
    with open(src, "rb") as a, open(out, "rb") as b:
        sa, sb = a.read(), b.read()
    with zipfile.ZipFile(src) as z:
        ia = z.getinfo("a.npy")
    span = slice(ia.header_offset, ia.header_offset + 30 + len(ia.filename) + len(ia.extra) + ia.compress_size)
    assert sa[span] == sb[span]


def test_inspect_refuses_like_np_load(tmp_path, capsys):
    src = damaged_npz(tmp_path, member="b.npy")
    before = snapshot(str(tmp_path / "d"))
    err = assert_refused(capsys, main(["inspect", src]), str(tmp_path / "d"), before, command="inspect")
    assert "b.npy" in err and "np.load refuses" in err, err
    with pytest.raises(FormatError, match="b.npy does not match"):
        read_layout(src, verify=True)
    assert [t.path for t in read_layout(src).tensors] == ["/a", "/b"]  # metadata only: the data is not read


@pytest.mark.framework
def test_torch_entry_failing_its_crc_read_like_torch_load(tmp_path):
    """torch.load does not check an entry's CRC-32: fastflip reads and flips the entry as torch.load reads it."""
    torch = require("torch")
    from attack_check import verdict
    from framework_views import torch_view

    buf = io.BytesIO()
    torch.save({"w": torch.arange(32, dtype=torch.float32)}, buf)
    with zipfile.ZipFile(buf) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    p = tmp_path / "bad.pt"
    p.write_bytes(bad_crc(buf.getvalue(), info))
    assert torch.load(p, weights_only=True)["w"].tolist() == list(range(32))
    assert verdict(str(p), torch_view, str(tmp_path / "w"), expect="agrees") == "agrees"


def test_keras_weights_failing_their_crc_refused(tmp_path, capsys):
    """Keras reads ``model.weights.h5`` through zipfile, which checks its CRC-32: fastflip refuses it too."""
    h5py = require("h5py")
    inner = tmp_path / "w.h5"
    with h5py.File(inner, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.arange(16, dtype="f4"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("config.json", "{}")
        z.write(inner, "model.weights.h5")
    with zipfile.ZipFile(buf) as z:
        info = z.getinfo("model.weights.h5")
    d = tmp_path / "d"
    d.mkdir()
    src = d / "m.keras"
    src.write_bytes(bad_crc(buf.getvalue(), info))
    before = snapshot(str(d))
    for args in (["-o", str(d / "out.keras")], ["--in-place"]):
        rc = main(["inject", str(src), *args, "--count", "2", "--seed", "1"])
        err = assert_refused(capsys, rc, str(d), before)
        assert "model.weights.h5" in err and "CRC" in err, err


ZIPS = {  # case -> (members, words the refusal says)
    "an .npz holding a text member": ([("readme.txt", b"hello"), ("b.npy", None)], ("taken for an .npz", "'readme.txt'")),
    "an .npz member without .npy": ([("a", None), ("b.npy", None)], ("taken for an .npz", "'a'")),
    "an empty zip": ([], ("empty zip archive",)),
    "a zip of text files": ([("readme.txt", b"hello")], ("taken for a .keras archive", "model.weights.h5")),
}


@pytest.mark.parametrize("case", list(ZIPS))
def test_foreign_zip_named_as_what_it_is_taken_for(tmp_path, capsys, case):
    """A zip fastflip does not read is refused naming the kind it is taken for and why, in every command."""
    members, words = ZIPS[case]
    npy = io.BytesIO()
    np.save(npy, B)
    d = tmp_path / "d"
    d.mkdir()
    src = d / "x.npz"
    with zipfile.ZipFile(src, "w") as z:
        for name, data in members:
            z.writestr(name, npy.getvalue() if data is None else data)
    before = snapshot(str(d))
    for command, args in (("inspect", []), ("inject", ["-o", str(d / "out.npz")]), ("inject", ["--in-place"])):
        err = assert_refused(capsys, main([command, str(src), *args]), str(d), before, command=command)
        assert all(w in err for w in words), err
        if "keras" not in words[0]:
            assert "keras" not in err, err


def evaluate_npz(path):  # type: ignore[no-untyped-def]
    """Checkpoint mode on an ``.npz``: np.load reads the (faulty) file (its CRC-32 checked) and it is evaluated."""
    import campaign_helpers

    with np.load(path) as z:
        return campaign_helpers.evaluate({k: z[k] for k in ("dense/kernel", "dense/bias", "out/kernel")})


def test_campaign_trials_on_npz_restore_crc_fields(tmp_path):
    """A campaign's trial undoes its flips in its working copy with the members' CRC-32 fields: every trial's file
    is one np.load reads, and the copy is the checkpoint again, byte for byte, after every trial."""
    import hashlib
    import os

    import campaign_helpers
    from fastflip.campaign import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import DUE, TrialRunner

    np.savez(tmp_path / "model.npz", **campaign_helpers.weights())
    c = Campaign.from_dict({
        "name": "npz", "seed": 1, "mode": "checkpoint", "target": {"checkpoint": "model.npz"},
        "paths": [os.path.dirname(__file__)], "cells": {"bits": ["30", "all"], "group_by": "tensor"},
        "trials": {"per_cell": 4}, "evaluator": {"function": "test_zip_member_crc:evaluate_npz"}},
        base_dir=str(tmp_path))
    runner = TrialRunner(c, campaign_cells(c))
    copy = runner.targets[None]
    digest = hashlib.sha256(open(copy, "rb").read()).hexdigest()
    rows = [runner.run(cid, t) for cid in range(len(runner.cells)) for t in range(4)]
    assert hashlib.sha256(open(copy, "rb").read()).hexdigest() == digest
    assert not [r.message for r in rows if r.outcome == DUE and r.message], "np.load refused a trial's file"
    runner.close()
