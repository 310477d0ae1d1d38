"""One path check for every file fastflip writes: sequence JSON, report files, convert, revert.

Every writer goes through fastflip.files.paths.resolve_output: never an input (a store counts as an input of
report), never another output of the run, never a device, FIFO or socket; existing outputs need --force;
symlinks are written through. Each case failed before (the input, the log or a store was replaced).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from fastflip.cli import main

TESTS = Path(__file__).parent


def _sha(p) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


@pytest.fixture
def h5(tmp_path) -> str:
    p = str(tmp_path / "m.h5")
    with h5py.File(p, "w") as f:
        f["predictor/a/w"] = np.linspace(-1, 1, 256, dtype="f4").reshape(16, 16)
    return p


def _corrupt(h5: str, *extra: str) -> int:
    return main(["hdf5-corrupter", "--hdf5File", h5, "--injectionTries", "5", "--injectionType", "count",
                 "--firstBit", "1", "--lastBit", "8", "--floatPrecision", "32", "--useRandomLocations",
                 "--seed", "3", *extra])


# ------------------------------------------------------------------ hdf5-corrupter --saveInjectionSequence


def test_sequence_equal_to_the_input_is_refused(tmp_path, capsys):
    src = str(tmp_path / "weights.json")  # an HDF5 file with a .json name: the sequence path as given
    with h5py.File(src, "w") as f:
        f["w"] = np.ones(64, "f4")
    before = _sha(src)
    assert _corrupt(src, "--saveInjectionSequence", src, "--output", str(tmp_path / "o.h5")) == 2
    assert "sequence file is the input file" in capsys.readouterr().err
    assert _sha(src) == before and not (tmp_path / "o.h5").exists()  # refused before anything was written


def test_sequence_through_a_link_to_the_input_is_refused(h5, tmp_path, capsys):
    link = tmp_path / "seq.json"
    link.symlink_to(h5)
    before = _sha(h5)
    assert _corrupt(h5, "--saveInjectionSequence", str(link)) == 2
    assert "is the input file" in capsys.readouterr().err and _sha(h5) == before


def test_sequence_equal_to_the_log_is_refused(h5, tmp_path, capsys):
    seq = str(tmp_path / "run.json")
    assert _corrupt(h5, "--saveInjectionSequence", seq, "--log", seq, "--output", str(tmp_path / "o.h5")) == 2
    assert "is also the log of this run" in capsys.readouterr().err
    assert not os.path.exists(seq) and not (tmp_path / "o.h5").exists()


def test_sequence_onto_a_fifo_is_refused(h5, tmp_path, capsys):
    fifo = str(tmp_path / "pipe.json")
    os.mkfifo(fifo)
    assert _corrupt(h5, "--saveInjectionSequence", fifo) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert Path(fifo).is_fifo()


def test_sequence_beside_the_output_still_works(h5, tmp_path, capsys):
    assert _corrupt(h5, "--saveInjectionSequence", str(tmp_path / "seq"), "--output", str(tmp_path / "o.h5")) == 0
    assert (tmp_path / "seq.json").is_file() and (tmp_path / "o.h5.fflog").is_file()


# ------------------------------------------------------------------ report: the store is an input


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> Path:
    from fastflip.campaign import Campaign
    from fastflip.campaign.sweep import sweep

    d = tmp_path_factory.mktemp("store")
    c = Campaign.from_dict({
        "name": "paths", "seed": 1, "target": {"factory": "campaign_helpers:weights"}, "paths": [str(TESTS)],
        "cells": {"bits": ["31"], "flips": [1]}, "trials": {"per_cell": 3},
        "evaluator": {"function": "campaign_helpers:evaluate"},
    })
    assert sweep(c, str(d / "cells.csv"), workers=0, progress=False).complete  # a store named like a report file
    return d


@pytest.mark.parametrize("force", [False, True])
def test_report_never_overwrites_the_store_it_reads(store_dir, force, capsys):
    store = store_dir / "cells.csv"
    before = _sha(store)
    assert main(["report", str(store), "-o", str(store_dir), *(["--force"] if force else [])]) == 2
    assert "it is the campaign being read" in capsys.readouterr().err
    assert _sha(store) == before and sorted(os.listdir(store_dir)) == ["cells.csv"]


# ------------------------------------------------------------------ convert


@pytest.fixture
def pt_pair(tmp_path):
    from conftest import require

    torch = require("torch")
    src = str(tmp_path / "w.pt")
    torch.save({"w": torch.arange(8, dtype=torch.float32)}, src)
    return src, tmp_path


def test_convert_needs_force_to_replace(pt_pair, capsys):
    src, d = pt_pair
    out = d / "o.safetensors"
    out.write_bytes(b"keep me")
    assert main(["convert", src, "-o", str(out)]) == 2
    assert "exists; use --force" in capsys.readouterr().err and out.read_bytes() == b"keep me"
    assert main(["convert", src, "-o", str(out), "--force"]) == 0 and out.read_bytes() != b"keep me"


def test_convert_writes_through_a_symlink_and_refuses_devices(pt_pair, capsys):
    src, d = pt_pair
    real = d / "real.safetensors"
    real.write_bytes(b"old")
    link = d / "link.safetensors"
    link.symlink_to(real)
    assert main(["convert", src, "-o", str(link), "--force"]) == 0
    assert link.is_symlink() and real.read_bytes() != b"old"  # the link stays a link
    assert main(["convert", src, "-o", "/dev/null", "--to", "torch", "--force"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    fifo = str(d / "p.pt")
    os.mkfifo(fifo)
    assert main(["convert", src, "-o", fifo, "--force"]) == 2 and Path(fifo).is_fifo()


# ------------------------------------------------------------------ revert -o equal to its input


def test_revert_output_equal_to_input_names_the_right_fix(h5, tmp_path, capsys):
    out = str(tmp_path / "o.h5")
    assert main(["inject", h5, "-o", out, "--count", "2", "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["revert", out + ".fflog", out, "-o", out]) == 2
    err = capsys.readouterr().err
    assert "--in-place" not in err and "leave out -o" in err
