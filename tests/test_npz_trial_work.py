"""Work done once, not per use, on ``.npz`` injects and campaign trials (the outputs as ``np.load`` reads them).

A campaign checks its working copy's ``.npz`` members against their CRC-32 once, when the copy is made; its trials
then only write words and CRC fields and undo them from the bytes they wrote (the CRC fields worked out once per
trial). An inject reads the zip's directory and local headers once for the member check and the CRC patches. The
counts are taken with counting wrappers; every file a trial's evaluator sees is one ``zipfile.testzip`` and
``np.load`` accept, and the working copy is the checkpoint again, byte for byte, after each trial.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

import campaign_helpers
from fastflip.errors import FormatError
from fastflip.files.formats import zipcrc, zipraw
from fastflip.files.inject import inject_file
from test_zip_member_crc import bad_crc

HERE = os.path.dirname(__file__)
TRIALS = 4


def evaluate_npz_strict(path):  # type: ignore[no-untyped-def]
    """The trial's file as zipfile and np.load read it: every member's CRC-32 checked, then the small MLP."""
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
    with np.load(path) as z:
        return campaign_helpers.evaluate({k: z[k] for k in ("dense/kernel", "dense/bias", "out/kernel")})


def _campaign(tmp_path, name: str = "model.npz"):  # type: ignore[no-untyped-def]
    from fastflip.campaign import Campaign

    return Campaign.from_dict({
        "name": "npz", "seed": 3, "mode": "checkpoint", "target": {"checkpoint": name}, "paths": [HERE],
        "cells": {"bits": ["30", "all"], "group_by": "tensor"}, "trials": {"per_cell": TRIALS},
        "evaluator": {"function": "test_npz_trial_work:evaluate_npz_strict"}}, base_dir=str(tmp_path))


class _Count:
    """Wraps ``module.name`` (each module given) in one counter: calls, and the ``int`` results summed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, *modules: object) -> None:
        self.calls = self.total = 0
        real = getattr(modules[0], name)

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls += 1
            got = real(*args, **kwargs)
            self.total += got if isinstance(got, int) else 0
            return got

        for m in modules:
            if hasattr(m, name):
                monkeypatch.setattr(m, name, counted)


def test_campaign_checks_npz_members_once_per_copy(tmp_path, monkeypatch):
    """The CRC-32 check reads the targeted members of the working copy once, when it is made; trials read none of
    them again, each computes its CRC fields once (the undo writes back the bytes the inject wrote), and every
    trial's file is accepted by zipfile and np.load, the copy restored byte for byte after each."""
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import DUE, TrialRunner

    np.savez(tmp_path / "model.npz", **campaign_helpers.weights())
    read = _Count(monkeypatch, "read_at", zipcrc)  # the bytes the member check reads
    runner = TrialRunner(_campaign(tmp_path), campaign_cells(_campaign(tmp_path)))
    try:
        copy = runner.targets[None]
        with zipfile.ZipFile(copy) as z:
            members = sum(i.file_size for i in z.infolist())
        assert read.total == members  # each targeted member once, at the copy's making
        original = open(copy, "rb").read()
        read.total = read.calls = 0
        patches = _Count(monkeypatch, "zip_crc_patches", zipcrc)
        rows = []
        for cid in range(len(runner.cells)):
            for t in range(TRIALS):
                rows.append(runner.run(cid, t))
                assert open(copy, "rb").read() == original, (cid, t)
        n = len(rows)
        assert read.total == 0, f"trials read {read.total} bytes of members already checked"
        assert patches.calls == n, f"{patches.calls} CRC-patch computations for {n} trials"
        assert not [r.message for r in rows if r.outcome == DUE and r.message], "a trial's file was refused"
        assert {r.outcome for r in rows} - {DUE}  # the trials were judged
    finally:
        runner.close()


def test_campaign_on_damaged_member_refused_before_first_trial(tmp_path):
    """A targeted member that does not match its CRC-32 is refused in one line when the working copy is made, before
    the golden evaluation and any trial."""
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    np.savez(tmp_path / "good.npz", **campaign_helpers.weights())
    data = (tmp_path / "good.npz").read_bytes()
    with zipfile.ZipFile(tmp_path / "good.npz") as z:
        info = z.getinfo("dense/bias.npy")
    (tmp_path / "bad.npz").write_bytes(bad_crc(data, info))
    c = _campaign(tmp_path, "bad.npz")
    with pytest.raises(FormatError) as exc:
        TrialRunner(c, campaign_cells(c))
    msg = str(exc.value)
    assert "dense/bias.npy" in msg and "CRC-32" in msg and "np.load refuses" in msg and "\n" not in msg, msg
    assert msg.startswith(str(tmp_path / "bad.npz")), msg  # the user's file, not the campaign's scratch copy


@pytest.mark.parametrize("mode", ["copy", "direct", "in place", "copy, regions"])
def test_inject_reads_zip_directory_once(tmp_path, monkeypatch, mode):
    """One reading of the local headers (and, besides the format's listing, one of the directory) per inject serves
    the member check and the CRC fields; the output is one zipfile and np.load accept, revert bit for bit."""
    from fastflip.files.revert import revert

    from fastflip.files.layout import read_layout

    src = str(tmp_path / "m.npz")
    a = np.arange(4096, dtype="<f4")
    np.savez(src, a=a, b=np.ones(16, "<f8"))
    original = open(src, "rb").read()
    out = src if mode in ("direct", "in place") else str(tmp_path / "out.npz")
    kw = {"copy": {}, "direct": {"in_place": True, "atomic": False}, "in place": {"in_place": True},
          "copy, regions": {"hash_files": "regions"}}[mode]
    layout = read_layout(src)  # given, as a campaign's trials give it: the counts are the inject's own
    listings = _Count(monkeypatch, "directory", zipraw, zipcrc)
    headers = _Count(monkeypatch, "stored_entries", zipraw, zipcrc)
    res = inject_file(src, None if kw.get("in_place") else out, selection={"include": ["/a"]}, count=5, seed=1,
                      layout=layout, **kw)
    assert headers.calls == 1, f"local headers read {headers.calls} times in one inject"
    assert listings.calls <= 2, f"central directory read {listings.calls} times in one inject"
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None
    with np.load(out) as z:
        got = z["a"]
    assert int((got.view("<u4") != a.view("<u4")).sum()) == 5
    revert(res.log_path, out)
    assert open(out, "rb").read() == original


@pytest.mark.parametrize("in_place", [False, True], ids=["copy", "atomic in place"])
def test_copy_checks_members_on_its_one_read(tmp_path, monkeypatch, in_place):
    """A new file (or an atomic in-place copy) checks the flipped members' CRC-32 on the bytes its copy reads anyway:
    the check reads nothing itself, and a damaged member is still refused with no output, log or temporary left."""
    from conftest import snapshot

    d = tmp_path / "d"
    d.mkdir()
    src = str(d / "m.npz")
    a = np.arange(1 << 15, dtype="<f4")
    np.savez(src, a=a, b=np.ones(16, "<f8"))
    out = None if in_place else str(d / "out.npz")
    read = _Count(monkeypatch, "read_at", zipcrc)
    inject_file(src, out, in_place=in_place, selection={"include": ["/a"]}, count=3, seed=4, log_path=False)
    assert read.total == 0, f"the member check read {read.total} bytes beside the copy"
    with zipfile.ZipFile(out or src) as z:
        assert z.testzip() is None
    with zipfile.ZipFile(src) as z:
        info = z.getinfo("a.npy")
    with open(src, "rb") as fh:
        damaged = bad_crc(fh.read(), info)
    with open(src, "wb") as fh:
        fh.write(damaged)
    before = snapshot(str(d))
    with pytest.raises(FormatError, match="a.npy does not match its recorded CRC-32"):
        inject_file(src, out, in_place=in_place, selection={"include": ["/a"]}, count=3, seed=5)
    assert snapshot(str(d)) == before


@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20])
def test_member_crcs_fed_in_any_pieces(tmp_path, piece):
    """The members' CRC-32 fed in pieces that cut them anywhere (a copy's blocks) is zipfile's: a sound archive
    passes, one with a member whose recorded CRC-32 is wrong is refused naming it, an untouched member is not read."""
    src = tmp_path / "m.npz"
    np.savez(src, a=np.arange(3000, dtype="<f4"), b=np.arange(5, dtype="<i2"), c=np.ones(700, "<f8"))
    data = src.read_bytes()
    entries = zipraw.stored_entries(str(src))
    offsets = np.array([entries["a.npy"].offset + 8, entries["c.npy"].offset], np.int64)

    def fed(path: str) -> zipcrc.MemberCrcs:
        crcs = zipcrc.MemberCrcs.holding(path, offsets)
        raw = memoryview(open(path, "rb").read())
        for at in range(0, len(raw), piece):
            crcs.feed(at, raw[at : at + piece])
        return crcs

    good = fed(str(src))
    assert [e.name for e in good.entries] == ["a.npy", "c.npy"]
    good.verify()
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bad_crc(data, entries["c.npy"].info))
    with pytest.raises(FormatError, match="c.npy does not match its recorded CRC-32"):
        fed(str(bad)).verify()
    other = tmp_path / "other.npz"
    other.write_bytes(bad_crc(data, entries["b.npy"].info))
    fed(str(other)).verify()  # b.npy holds no offset: not the check's business


def evaluate_pt(path):  # type: ignore[no-untyped-def]
    """The trial's file as zipfile (every entry's CRC-32) and torch.load (weights only) read it, then the small MLP."""
    import torch

    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
    sd = torch.load(path, weights_only=True)
    return campaign_helpers.evaluate({k: sd[k].numpy() for k in ("dense/kernel", "dense/bias", "out/kernel")})


@pytest.mark.framework
def test_campaign_trials_on_torch_save_undo_their_bytes(tmp_path):
    """A torch.save checkpoint's trials write the words and the entries' CRC-32 fields and undo exactly those bytes:
    every trial's file is one torch.load and zipfile read, the working copy byte for byte the checkpoint after each."""
    from conftest import require

    torch = require("torch")
    from fastflip.campaign import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import DUE, TrialRunner

    torch.save({k: torch.from_numpy(v) for k, v in campaign_helpers.weights().items()}, tmp_path / "model.pt")
    c = Campaign.from_dict({
        "name": "pt", "seed": 2, "mode": "checkpoint", "target": {"checkpoint": "model.pt"}, "paths": [HERE],
        "cells": {"bits": ["30", "all"], "group_by": "tensor"}, "trials": {"per_cell": TRIALS},
        "evaluator": {"function": "test_npz_trial_work:evaluate_pt"}}, base_dir=str(tmp_path))
    runner = TrialRunner(c, campaign_cells(c))
    try:
        copy = runner.targets[None]
        original = open(copy, "rb").read()
        rows = []
        for cid in range(len(runner.cells)):
            for t in range(TRIALS):
                rows.append(runner.run(cid, t))
                assert open(copy, "rb").read() == original, (cid, t)
                with zipfile.ZipFile(copy) as z:
                    assert z.testzip() is None
        assert not [r.message for r in rows if r.outcome == DUE and r.message], "torch.load refused a trial's file"
    finally:
        runner.close()


DIRECT = {"whole-file hashes": {"log_path": None}, "no hashes": {"hash_files": False, "log_path": False},
          "region evidence": {"hash_files": "regions", "log_path": None}}


@pytest.mark.parametrize("evidence", list(DIRECT))
def test_direct_in_place_checks_members_once(tmp_path, monkeypatch, evidence):
    """Direct in place, the flipped members are read for their CRC-32 once: on the whole-file hash pass where there
    is one (the check reads nothing itself), else by the check; a sound file is injected and reverts bit for bit, a
    damaged member is refused with the file and the folder as they were."""
    from conftest import snapshot
    from fastflip.files.revert import revert

    d = tmp_path / "d"
    d.mkdir()
    src = str(d / "m.npz")
    a = np.arange(1 << 15, dtype="<f4")
    np.savez(src, a=a, b=np.ones(16, "<f8"))
    original = open(src, "rb").read()
    with zipfile.ZipFile(src) as z:
        info = z.getinfo("a.npy")
    kw = DIRECT[evidence]
    read = _Count(monkeypatch, "read_at", zipcrc)
    res = inject_file(src, in_place=True, atomic=False, selection={"include": ["/a"]}, count=3, seed=4, **kw)
    assert read.total == (0 if evidence == "whole-file hashes" else a.nbytes + 128), read.total
    with zipfile.ZipFile(src) as z:
        assert z.testzip() is None
    if res.log_path:
        revert(res.log_path, src)
        assert open(src, "rb").read() == original
        os.remove(res.log_path)
    with open(src, "wb") as fh:
        fh.write(bad_crc(original, info))
    before = snapshot(str(d))
    with pytest.raises(FormatError, match="a.npy does not match its recorded CRC-32"):
        inject_file(src, in_place=True, atomic=False, selection={"include": ["/a"]}, count=3, seed=5, **kw)
    assert snapshot(str(d)) == before
