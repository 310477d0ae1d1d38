"""A malformed ``--loadInjectionSequence`` is one line and exit 2, never an internal error."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from fastflip.cli import main

BAD = {
    "float index": [[[1.5, 0], [3]]],
    "negative index": [[[-1, 0], [3]]],
    "index out of range": [[[9, 0], [3]]],
    "huge index": [[[2**70, 0], [3]]],
    "indexes nested too deep": [[[[0, 1]], [3]], [[0, 0], [1]]],
    "one index for two dimensions": [[[0], [3]]],
    "string indexes": [[["0", "1"], [3]]],
    "boolean index": [[[True, 0], [3]]],
    "string bits": [[[0, 1], ["x"]]],
    "float bits": [[[0, 1], [2.5]]],
    "bits nested too deep": [[[0, 1], [[3]]]],
    "entry without bits": [[[0, 1]]],
    "object entry": [{"index": [0, 1], "bits": [3]}],
    "string entry": ["abc"],
}


@pytest.fixture
def h5(tmp_path):
    p = tmp_path / "m.h5"
    with h5py.File(p, "w") as f:
        f["predictor/a"] = np.ones((4, 3), "f4")
        f["predictor/b"] = np.arange(6, dtype="f4")
    return p


def _load(capsys, h5, tmp_path, sequence):
    seq = tmp_path / "s.json"
    seq.write_text(json.dumps(sequence))
    # seeded: a loaded entry whose bits would make NaN/Inf has its bits redrawn at random (the older tool's rule),
    # and a redraw can flip one bit twice and leave the value as it was (about 3% of seeds for the entry below)
    rc = main(["hdf5-corrupter", "--hdf5File", str(h5), "--loadInjectionSequence", str(seq), "--floatPrecision", "32",
               "--output", str(tmp_path / "o.h5"), "--seed", "0"])
    out, err = capsys.readouterr()
    return rc, err


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_sequence_entries_are_one_line_and_exit_2(capsys, h5, tmp_path, case):
    before = h5.read_bytes()
    rc, err = _load(capsys, h5, tmp_path, {"/predictor/a": BAD[case]})
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "internal error" not in err and "Traceback" not in err, err
    assert "sequence" in lines[0] or "s.json" in lines[0], lines[0]
    assert h5.read_bytes() == before and not (tmp_path / "o.h5").exists()


def test_well_formed_sequences_of_both_forms_still_load(capsys, h5, tmp_path):
    good = {"/predictor/a": [[[1, 2], [3]], [[0, 0], [1, 2]], None, [[3, 2], None]],
            "/predictor/b": [[[], [4]], [5], [1, 2]]}
    rc, err = _load(capsys, h5, tmp_path, good)
    assert rc == 0, err
    with h5py.File(tmp_path / "o.h5") as f:
        a = f["predictor/a"][()]
    assert sorted(zip(*np.nonzero(a != 1.0))) == [(0, 0), (1, 2)]
