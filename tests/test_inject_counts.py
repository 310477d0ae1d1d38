"""Inject summaries count changed bits and changed elements apart from touched sites."""

from __future__ import annotations

import json

import h5py
import numpy as np

from fastflip.cli import main
from fastflip.files.inject import inject_file


def _file(path, values):
    with h5py.File(path, "w") as f:
        f["w"] = np.asarray(values, dtype="<f4")


def test_stuck_at_no_ops_and_scale_are_counted_as_what_changed(tmp_path, capsys):
    src = str(tmp_path / "a.h5")
    # bit 30 is set in 2.0 and 3.0 (exponent 128), clear in 0.5 and 0.25: stuck-at-1 there changes 2 of 4
    _file(src, [2.0, 3.0, 0.5, 0.25])
    res = inject_file(src, str(tmp_path / "b.h5"), count=4, bits="30", model="stuck-at-1", seed=1)
    c = res.counts
    assert c["sites"] == 4 and c["flips"] == 4  # touched
    assert c["elements_changed"] == c["changed"] == 2 and c["bits_changed"] == 2
    with h5py.File(tmp_path / "b.h5") as f:
        new = f["w"][()]
    by_hand = np.bitwise_count(np.array([2.0, 3.0, 0.5, 0.25], "<f4").view("<u4") ^ new.view("<u4")).sum()
    assert by_hand == 2
    # scale touches no bit position but changes elements (and their bits)
    res = inject_file(src, str(tmp_path / "c.h5"), count=3, model="scale:2.0", seed=1)
    c = res.counts
    assert c["flips"] == 0 and c["elements_changed"] == 3 and c["bits_changed"] >= 3
    rc = main(["inject", src, "-o", str(tmp_path / "d.h5"), "--count", "4", "--bits", "30", "--model", "stuck-at-1",
               "--seed", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "changed 2 bit(s) in 2 element(s) (4 site(s) touched in 1 tensor(s))" in out
    rc = main(["inject", src, "-o", str(tmp_path / "e.h5"), "--count", "3", "--model", "scale:2.0", "--seed", "1",
               "--json"])
    j = json.loads(capsys.readouterr().out)
    assert rc == 0 and j["elements_changed"] == 3 and j["flips"] == 0
